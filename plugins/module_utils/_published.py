# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each role publishes for the others (private to gpufleet.serving).

Roles meet through these records, never through each other's files. A role's preflight sets
one cacheable fact from its own settings as they resolve on the host (inventory, extra vars,
its defaults):

| fact                          | set by (preflight) | read by                          |
|-------------------------------|--------------------|----------------------------------|
| gpufleet_engine_published     | engine             | proxy, edge, monitoring          |
| gpufleet_proxy_published      | proxy              | edge, firewall, monitoring       |
| gpufleet_edge_published       | edge               | firewall, monitoring             |
| gpufleet_exporters_published  | exporters          | firewall, monitoring             |
| gpufleet_model_store_published| model_store        | engine (its pulls), firewall     |

A consumer reads a host's fact; a host whose preflight did not run in this play and is not in
the fact cache (a first run with --limit) is read from its inventory with FALLBACK, the
producing role's own defaults (tests/unit/test_published.py checks each against the role's
defaults/main.yml). No record holds a secret: facts are cached on disk.

A host outside a --limit'ed run is read from its cached record, from its own last run, not
from what the inventory now says: the edge keeps reaching a proxy the way it is
configured until that proxy's host runs again (the inventory would have pointed it at a TLS
port the proxy does not listen on yet). Run the producing host in the same run (drop --limit,
or add the host) to move both together.
"""

from __future__ import annotations

import ipaddress
import re

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    is_type,
    normalized,
    option_for,
    options_of,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import upstream_address
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_surge import surge_port

FACTS = {
    "engine": "gpufleet_engine_published",
    "proxy": "gpufleet_proxy_published",
    "edge": "gpufleet_edge_published",
    "exporters": "gpufleet_exporters_published",
    "model_store": "gpufleet_model_store_published",
}
# the settings each record is made from, with the producing role's defaults
FALLBACK = {
    "proxy": {
        "proxy_listen_port": 8080,
        "proxy_listen_address": "0.0.0.0",
        "proxy_tls": True,
        "proxy_tls_port": 8443,
        "proxy_tls_certificate": "",
        "proxy_monitor_listen": "127.0.0.1:9091",
        "proxy_instances": [],
    },
    "edge": {
        "edge_listen_port": 8080,
        "edge_tls": True,
        "edge_tls_port": 8443,
        "edge_router_policy": "",
        "edge_router_port": 8090,
        "edge_router_backend_port": 8091,
        "edge_router_metrics_port": 9097,
        "edge_quota_store_host": "",
        "edge_quota_store_port": 6379,
    },
    "model_store": {
        "model_store_port": 8444,
    },
    "exporters": {
        "exporters_node_port": 9100,
        "exporters_nginx_port": 9113,
        "exporters_dcgm_port": 9400,
        "exporters_dcgm_enabled": "auto",
    },
}
# the router's system user (the edge role's _edge_router_user, which it publishes)
ROUTER_USER = "gpufleet-router"
# 2: the proxy record gained local_address (a cached record of format 1 lacks it)
# 3: the proxy record's self_signed became fleet_ca (its certificate from the fleet CA)
# 4: the engine record gained model and max_model_len (the edge refuses one served name for two)
# 5: the edge record gained quota_store_port (the firewall opens the usage store to the edges)
FORMAT = 5


# a DNS name (a leading *. allowed) or an IP address, as a certificate's subject alternative name
TLS_NAME = re.compile(r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")


def tls_names_errors(var, names) -> list:
    """The errors of VAR (proxy_tls_names, edge_tls_names): a list of DNS names or addresses."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return ["%s=%r must be a list of DNS names or addresses." % (var, names)]
    bad = []
    for name in names:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            if not TLS_NAME.fullmatch(name) or len(name) > 253:
                bad.append(name)
    if bad:
        return [
            "%s lists %s: not a DNS name or an IP address; give the names clients reach the host by, e.g. "
            "llm.example.com or 203.0.113.7." % (var, ", ".join(repr(b) for b in bad))
        ]
    return []


def _get(hv, key):
    return hv.get(key) if hasattr(hv, "get") else None


def _truth(value):
    """A setting's truth as the roles' `| bool` reads it (Ansible's own spellings)."""
    return boolean(value, strict=False)


def _public(settings, prefix) -> dict:
    """The public listener of a proxy or an edge: TLS, and the port clients (or the edge) reach."""
    tls = _truth(settings.get(prefix + "tls"))
    port = settings.get(prefix + ("tls_port" if tls else "listen_port"))
    return {"format": FORMAT, "tls": tls, "port": port}


def _local_address(tls, listen) -> str:
    listen = str(listen or "").strip()
    if tls or listen in ("", "*", "0.0.0.0"):
        return "127.0.0.1"
    if listen in ("::", "[::]"):
        return "[::1]"
    return "[%s]" % listen if ":" in listen and not listen.startswith("[") else listen


def publish(role, settings, engines=None, gpu_count=0) -> dict:
    """The record `role` publishes from its settings (the variables FALLBACK names, as they
    resolve on the host). engine: `engines` is the host's gpufleet_engines (or its plan's
    instances); exporters: `gpu_count` decides DCGM's auto."""
    settings = settings or {}
    if role == "engine":
        out = []
        for inst in engines or []:
            if not isinstance(inst, dict) or not inst.get("name"):
                continue
            inst = normalized(inst)
            port = inst.get("port")
            # the context length as the engine takes it (vLLM's max_model_len, SGLang's context_length;
            # at the instance's top level or under options:), None when the plan picks it
            length = option_for("max_model_len", inst["engine"])
            surge = surge_port(inst)
            ok = is_type(port, int)
            out.append(
                {
                    "name": str(inst["name"]),
                    "engine": str(inst["engine"]),
                    "served_model_name": str(inst.get("served_model_name") or inst["name"]),
                    # what it serves under that name (the edge refuses one name for two of these)
                    "model": str(inst.get("model") or ""),
                    "max_model_len": options_of(inst).get(length.name) if length else None,
                    "port": port,
                    "surge_port": surge,
                    # host:port where the host's proxy reaches it, and its surge copy
                    "upstream": upstream_address(inst) if ok else None,
                    "surge_upstream": upstream_address(inst, surge) if ok and is_type(surge, int) else None,
                }
            )
        return {"format": FORMAT, "instances": out}
    if role == "proxy":
        tls = _truth(settings.get("proxy_tls"))
        return {
            **_public(settings, "proxy_"),
            "listen_port": settings.get("proxy_listen_port"),
            # where a client on the host itself reaches the plain port (site.yml's and the
            # rollout's stream check): loopback when TLS keeps plain HTTP there or the site
            # listens on every address, else the one address it listens on
            "local_address": _local_address(tls, settings.get("proxy_listen_address")),
            # its certificate comes from the fleet CA (no proxy_tls_certificate given)
            "fleet_ca": tls and not settings.get("proxy_tls_certificate"),
            "monitor_listen": str(settings.get("proxy_monitor_listen") or ""),
            # the instances it fronts: proxy_instances, else every instance of the host
            "instances": [str(n) for n in settings.get("proxy_instances") or []]
            or [str(e.get("name")) for e in engines or [] if isinstance(e, dict) and e.get("name")],
        }
    if role == "edge":
        return {
            **_public(settings, "edge_"),
            "router_policy": str(settings.get("edge_router_policy") or ""),
            "router_metrics_port": settings.get("edge_router_metrics_port"),
            # the router's loopback listeners (its API, its way to the proxies) and its user:
            # the firewall lets that user, nginx and root reach them, no one else
            "router_port": settings.get("edge_router_port"),
            "router_backend_port": settings.get("edge_router_backend_port"),
            "router_user": str(settings.get("router_user") or ROUTER_USER),
            # the usage store's port when this edge host runs it (the firewall opens it to the edges)
            "quota_store_port": settings.get("edge_quota_store_port")
            if settings.get("edge_quota_store_host")
            and settings.get("edge_quota_store_host") == settings.get("inventory_hostname")
            else None,
        }
    if role == "exporters":
        asked = str(settings.get("exporters_dcgm_enabled")).strip().lower()
        return {
            "format": FORMAT,
            "node_port": settings.get("exporters_node_port"),
            "nginx_port": settings.get("exporters_nginx_port"),
            "dcgm_port": settings.get("exporters_dcgm_port"),
            "dcgm": asked == "true" or (asked == "auto" and int(gpu_count or 0) > 0),
        }
    if role == "model_store":
        # the port the gpu hosts pull from (the firewall opens it to them)
        return {"format": FORMAT, "port": settings.get("model_store_port")}
    raise ValueError("no published record for role %r" % (role,))


def published(role, hv) -> dict:
    """A host's record from `role`: the fact its preflight published when present, else its
    inventory variables with the role's defaults (FALLBACK). hv: the host's variables
    (hostvars[host])."""
    fact = _get(hv, FACTS[role])
    if isinstance(fact, dict) and fact.get("format") == FORMAT:
        return fact
    if role == "engine":
        return publish("engine", {}, engines=_get(hv, "gpufleet_engines") or [])
    settings = dict(FALLBACK[role])
    settings.update({k: _get(hv, k) for k in FALLBACK[role] if _get(hv, k) is not None})
    if role == "edge":
        # whether this host is edge_quota_store_host
        settings["inventory_hostname"] = _get(hv, "inventory_hostname") or ""
    gpu = ((_get(hv, "ansible_facts") or {}).get("gpufleet_gpu") or {}) if role == "exporters" else {}
    return publish(role, settings, engines=_get(hv, "gpufleet_engines") or [], gpu_count=gpu.get("count") or 0)
