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
package opens. On loopback, the engines' ports and the router's take connections only from
the users of firewall_loopback_users (root, nginx's www-data) and the router's own user.
Read by the firewall role (its preflight and its nftables table).
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.gpufleet.serving.plugins.module_utils._published import published


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


# a POSIX user name as useradd takes it
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def plan_firewall(params, host_vars, roles):
    """params: the firewall_* settings without the prefix (ssh_port, ssh_sources, allow_tcp,
    monitoring_sources, proxy_sources, edge_sources, gpu_sources); host_vars: the host's variables
    (the records its proxy, edge, exporters and model_store roles published, else their proxy_*,
    edge_*, exporters_* and model_store_* settings;
    gpufleet_engines, engine_peers); roles: which of gpu_host, edge, exporters, model_store the host runs.

    Returns {errors, rules: [{port, sources (empty: anyone), v4, v6 (the sources by family),
    why}], ports: [int]}."""
    errors, rules = [], []
    # what this host's proxy, edge and exporters published (_published)
    proxy = published("proxy", host_vars or {})
    edge = published("edge", host_vars or {})

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
        public = proxy["port"]
        if _port(public) is not None:
            rules.append({"port": public, "sources": _sources(params.get("proxy_sources"), "firewall_proxy_sources",
                                                              errors),
                          "why": "the proxy (%s)" % ("TLS" if proxy["tls"] else "plain HTTP")})  # fmt: skip
        monitor = proxy["monitor_listen"]
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
        exporters = published("exporters", host_vars or {})
        sources = monitoring_sources()
        nginx = "edge" in roles or bool((host_vars or {}).get("gpufleet_engines"))
        wanted = [("node_port", "node exporter", True), ("nginx_port", "nginx exporter", nginx),
                  ("dcgm_port", "DCGM exporter", "gpu_host" in roles)]  # fmt: skip
        for key, why, on in wanted:
            if not on or not sources:
                continue
            if _port(exporters.get(key)) is None:
                errors.append("exporters_%s=%r must be a port number." % (key, exporters.get(key)))
                continue
            rules.append({"port": exporters[key], "sources": sources, "why": why})
    if "edge" in roles:
        public = edge["port"]
        if _port(public) is not None:
            rules.append({"port": public, "sources": [], "why": "the edge (%s)" % (
                "TLS" if edge["tls"] else "plain HTTP")})  # fmt: skip
        # the router's metrics (every interface when there are monitoring hosts): to them only
        sources = monitoring_sources()
        if edge["router_policy"] and sources and _port(edge["router_metrics_port"]) is not None:
            rules.append({"port": edge["router_metrics_port"], "sources": sources, "why": "router metrics"})
        # the usage store (edge_quota_store_host): to the edge hosts only (each counts there)
        if edge.get("quota_store_port") is not None and _port(edge["quota_store_port"]) is not None:
            edges = _sources(params.get("edge_sources"), "firewall_edge_sources", errors)
            if edges:
                rules.append({"port": edge["quota_store_port"], "sources": edges, "why": "the usage store"})
    # the model store (its host in the model_store group): to the gpu hosts only (they pull from it)
    if "model_store" in roles:
        store = published("model_store", host_vars or {})
        if _port(store.get("port")) is None:
            errors.append("model_store_port=%r must be a port number." % (store.get("port"),))
        else:
            gpus = _sources(params.get("gpu_sources"), "firewall_gpu_sources", errors)
            if gpus:
                rules.append({"port": store["port"], "sources": gpus, "why": "the model store"})
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
    return {"errors": errors, "rules": rules, "ports": sorted({r["port"] for r in rules if r["port"] is not None}),
            "loopback": _loopback(params, host_vars or {}, roles, edge, errors)}  # fmt: skip


def _loopback(params, host_vars, roles, edge, errors):
    """The control planes on loopback and who may connect to them (issue 32): the engines' own
    ports (/pause, /abort_requests, /collective_rpc; SGLang's have no key) and, on an edge host,
    the router's API (/add_worker redirects client traffic, keys included) and the router's way
    to the proxies (it trusts X-Forwarded-For). Only their services connect: root (Ansible, the
    watchdog), nginx (www-data) and the router's own user; firewall_loopback_users lists them.

    Returns {users: [name], router_user: name or None, guards: [{ports, why}]} (no guards with
    firewall_loopback_guard false)."""
    users = params.get("loopback_users")
    if users is None:
        users = ["root", "www-data"]
    if not isinstance(users, list) or not all(isinstance(u, str) and USER_NAME.fullmatch(u) for u in users):
        errors.append(
            "firewall_loopback_users=%r must be a list of user names (the services that may connect to the "
            "engines' and the router's loopback ports, e.g. [root, www-data])." % (users,)
        )
        users = []
    guards, router_user = [], None
    if "gpu_host" in roles and host_vars.get("gpufleet_engines"):
        engine = published("engine", host_vars)
        ports = sorted({p for i in engine["instances"] for p in (i["port"], i["surge_port"]) if _port(p) is not None})
        if ports:
            guards.append({"ports": ports, "why": "the engines' own ports: their proxy, the watchdog and Ansible"})
    if "edge" in roles and edge.get("router_policy"):
        ports = sorted({p for p in (edge.get("router_port"), edge.get("router_backend_port")) if _port(p) is not None})
        router_user = edge.get("router_user") or None
        if ports:
            why = "the router's API and its way to the proxies: nginx, the router, Ansible"
            guards.append({"ports": ports, "why": why})
    if params.get("loopback_guard") is False:
        guards = []
    return {"users": users + ([router_user] if router_user and guards and router_user not in users else []),
            "router_user": router_user if guards else None, "guards": guards}  # fmt: skip
