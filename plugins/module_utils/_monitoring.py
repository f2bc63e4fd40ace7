# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What Prometheus scrapes (private to gpufleet.serving): the fleet's targets from the inventory.

Every gpu host's engine instances through its proxy's monitoring listener (one target per
instance, /metrics/NAME, with a bearer token), node exporter on every host, the nginx exporter
where nginx runs (gpu hosts with engines, edge hosts), DCGM's exporter on gpu hosts that run it,
the router on edge hosts that run one (edge_router_policy).
Each target carries the labels the rules and dashboards group by: host, and for engines
engine_instance and model. Read by the monitoring role (its preflight and prometheus.yml).
"""

from __future__ import annotations

import ipaddress

from ansible_collections.gpufleet.serving.plugins.module_utils._firewall import _role_defaults

JOBS = ("gpufleet_engine", "node", "nginx", "dcgm", "router")


def _listen_port(listen):
    """'0.0.0.0:9091' -> (address, 9091); (address, None) when there is no port."""
    address, colon, port = str(listen or "").rpartition(":")
    return address.strip("[]"), int(port) if colon and address and port.isdigit() else None


def _is_loopback(address):
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def plan_monitoring(fleet):
    """fleet: [{name, address, gpu_host, edge, engines: [{name, served_model_name}],
    proxy_monitor_listen, exporters_node_port, exporters_nginx_port, exporters_dcgm_port,
    dcgm, edge_router_policy, edge_router_metrics_port}] (None: the role's default).

    Returns {errors, jobs: {job: [{targets: [ADDR:PORT], labels: {...}}]}}."""
    proxy = _role_defaults("proxy")
    exporters = _role_defaults("exporters")
    edge = _role_defaults("edge")
    errors, jobs = [], {job: [] for job in JOBS}

    def setting(host, key, defaults):
        value = host.get(key)
        return defaults.get(key) if value is None else value

    for host in fleet:
        name, address = host["name"], host["address"]
        target = "[%s]" % address if ":" in address else address
        engines = host.get("engines") or []
        if host.get("gpu_host") and engines:
            listen = setting(host, "proxy_monitor_listen", proxy)
            bind, port = _listen_port(listen)
            if port is None:
                errors.append("%s: proxy_monitor_listen=%r must be ADDRESS:PORT." % (name, listen))
            elif _is_loopback(bind):
                errors.append(
                    "%s: proxy_monitor_listen=%r is on loopback, so the monitoring hosts cannot scrape its engines; "
                    "set proxy_monitor_listen: 0.0.0.0:%d on the gpu hosts (the firewall opens it to the monitoring "
                    "hosts only, and scrapes carry monitoring_scrape_token)." % (name, listen, port)
                )
            else:
                for inst in engines:
                    jobs["gpufleet_engine"].append({
                        "targets": ["%s:%d" % (target, port)],
                        "labels": {"host": name, "engine_instance": inst["name"],
                                   "model": str(inst.get("served_model_name") or inst["name"]),
                                   "__metrics_path__": "/metrics/%s" % inst["name"]},
                    })  # fmt: skip
        wanted = [("node", "exporters_node_port", True),
                  ("nginx", "exporters_nginx_port", host.get("edge") or (host.get("gpu_host") and bool(engines))),
                  ("dcgm", "exporters_dcgm_port", host.get("gpu_host") and host.get("dcgm")),
                  ("router", "edge_router_metrics_port",
                   host.get("edge") and host.get("edge_router_policy"))]  # fmt: skip
        for job, key, on in wanted:
            if not on:
                continue
            port = setting(host, key, edge if job == "router" else exporters)
            labels = {"host": name}
            if job == "nginx":
                labels["role"] = "edge" if host.get("edge") else "proxy"
            jobs[job].append({"targets": ["%s:%s" % (target, port)], "labels": labels})
    return {"errors": errors, "jobs": jobs}
