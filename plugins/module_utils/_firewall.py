# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host firewall (private to gpufleet.serving): which TCP ports a host opens, to whom.

A gpu host opens SSH and its proxy's public port (the TLS port when proxy_tls is on, else
the plain one), and its monitoring listener only to the monitoring hosts when that listener
is not on loopback; an edge host opens SSH and its edge's public port. With monitoring hosts,
the exporters' ports (node, nginx, DCGM) open to them only. A node of a multi-node engine
instance opens to the instance's other nodes. Everything else that
arrives is dropped: engine ports, the engines' internal sockets, Docker's, anything a later
package opens. Read by the firewall role (its preflight and its nftables table).
"""

from __future__ import annotations

import ipaddress
import os
import re


def _role_defaults(role):
    """A role's defaults/main.yml, the one place its defaults are written."""
    import yaml  # controller side only (filters); ansible-core depends on PyYAML

    path = os.path.join(os.path.dirname(__file__), "..", "..", "roles", role, "defaults", "main.yml")
    with open(path) as f:
        return yaml.safe_load(f) or {}


def _port(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535 else None


def _sources(values, var, errors):
    """Addresses and networks (ipaddress); names are refused: nftables needs addresses."""
    out = []
    for value in values or []:
        try:
            out.append(str(ipaddress.ip_network(str(value), strict=False)))
        except ValueError:
            errors.append(
                "%s: %r is not an address or network (10.0.0.5, 10.0.0.0/24); the firewall matches addresses, so "
                "give the host's address (ansible_host) rather than its name." % (var, value)
            )
    return out


def plan_firewall(params, host_vars, roles):
    """params: the firewall_* settings without the prefix (ssh_port, ssh_sources, allow_tcp,
    monitoring_sources, proxy_sources); host_vars: the host's variables (proxy_*, edge_*,
    gpufleet_engines); roles: which of gpu_host, edge the host is.

    Returns {errors, rules: [{port, sources (empty: anyone), v4, v6 (the sources by family),
    why}], ports: [int]}."""
    errors, rules = [], []
    # the host's own proxy_* and edge_* settings; None (not set) leaves the role's default
    given = {k: v for k, v in (host_vars or {}).items() if v is not None}
    proxy = dict(_role_defaults("proxy"))
    proxy.update({k: v for k, v in given.items() if str(k).startswith("proxy_")})
    edge = dict(_role_defaults("edge"))
    edge.update({k: v for k, v in given.items() if str(k).startswith("edge_")})

    # the monitoring hosts' addresses, read (and a bad one named) once, where a rule needs them
    monitoring = []

    def monitoring_sources():
        if not monitoring:
            monitoring.append(_sources(params.get("monitoring_sources"), "firewall_monitoring_sources", errors))
        return monitoring[0]

    ssh = _port(params.get("ssh_port"))
    if ssh is None:
        errors.append(
            "firewall_ssh_port=%r must be a port number (the port Ansible reaches the host on)."
            % (params.get("ssh_port"),)
        )
    else:
        rules.append({"port": ssh, "sources": _sources(params.get("ssh_sources"), "firewall_ssh_sources", errors),
                      "why": "SSH"})  # fmt: skip

    if "gpu_host" in roles and (host_vars or {}).get("gpufleet_engines"):
        public = proxy.get("proxy_tls_port") if proxy.get("proxy_tls") else proxy.get("proxy_listen_port")
        if _port(public) is not None:
            rules.append({"port": public, "sources": _sources(params.get("proxy_sources"), "firewall_proxy_sources",
                                                              errors),
                          "why": "the proxy (%s)" % ("TLS" if proxy.get("proxy_tls") else "plain HTTP")})  # fmt: skip
        monitor = str(proxy.get("proxy_monitor_listen") or "")
        address, _colon, port = monitor.rpartition(":")
        address = address.strip("[]")
        try:
            loopback = ipaddress.ip_address(address).is_loopback
        except ValueError:
            loopback = False
        if port.isdigit() and not loopback:
            sources = monitoring_sources()
            if sources:
                rules.append({"port": int(port), "sources": sources, "why": "the monitoring listener"})
    if "exporters" in roles and ("gpu_host" in roles or "edge" in roles):
        # node exporter everywhere, the nginx exporter where nginx runs, DCGM's on gpu hosts:
        # to the monitoring hosts only (none open without them)
        exporters = dict(_role_defaults("exporters"))
        exporters.update({k: v for k, v in given.items() if str(k).startswith("exporters_")})
        sources = monitoring_sources()
        nginx = "edge" in roles or bool((host_vars or {}).get("gpufleet_engines"))
        wanted = [("exporters_node_port", "node exporter", True), ("exporters_nginx_port", "nginx exporter", nginx),
                  ("exporters_dcgm_port", "DCGM exporter", "gpu_host" in roles)]  # fmt: skip
        for var, why, on in wanted:
            if not on or not sources:
                continue
            if _port(exporters.get(var)) is None:
                errors.append("%s=%r must be a port number." % (var, exporters.get(var)))
                continue
            rules.append({"port": exporters[var], "sources": sources, "why": why})
    if "edge" in roles:
        public = edge.get("edge_tls_port") if edge.get("edge_tls") else edge.get("edge_listen_port")
        if _port(public) is not None:
            rules.append({"port": public, "sources": [], "why": "the edge (%s)" % (
                "TLS" if edge.get("edge_tls") else "plain HTTP")})  # fmt: skip
        # the router's metrics (every interface when there are monitoring hosts): to them only
        sources = monitoring_sources()
        if edge.get("edge_router_policy") and sources and _port(edge.get("edge_router_metrics_port")) is not None:
            rules.append({"port": edge["edge_router_metrics_port"], "sources": sources, "why": "router metrics"})
    # a multi-node engine instance's nodes: NCCL, Gloo and torch.distributed pick their own ports
    # (and vLLM's message queues), so a node opens every TCP port, to the group's other nodes only
    peers = (host_vars or {}).get("engine_peers") or []
    if "gpu_host" in roles and peers:
        rules.append({"port": None, "sources": _sources(peers, "the addresses of this host's multi-node engine peers",
                                                        errors),
                      "why": "multi-node engine peers (every TCP port: NCCL, Gloo, the engine's queues)"})  # fmt: skip
    for i, entry in enumerate(params.get("allow_tcp") or []):
        where = "firewall_allow_tcp[%d]" % i
        if not isinstance(entry, dict) or _port(entry.get("port")) is None:
            errors.append("%s=%r must be {port: N, sources: [ADDRESS/NETWORK, ...], why: TEXT}." % (where, entry))
            continue
        why = str(entry.get("why") or "firewall_allow_tcp")
        if not re.match(r"^[A-Za-z0-9 ._,()/:-]{1,80}$", why):
            errors.append("%s.why=%r: letters, digits, spaces and . _ , ( ) / : - only." % (where, why))
            continue
        rules.append({"port": entry["port"], "sources": _sources(entry.get("sources"), where + ".sources", errors),
                      "why": why})  # fmt: skip
    for rule in rules:
        rule["v4"] = [n for n in rule["sources"] if ipaddress.ip_network(n).version == 4]
        rule["v6"] = [n for n in rule["sources"] if ipaddress.ip_network(n).version == 6]
    return {"errors": errors, "rules": rules, "ports": sorted({r["port"] for r in rules if r["port"] is not None})}
