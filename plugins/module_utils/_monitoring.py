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
    """fleet: [{name, address, gpu_host, edge, engine, proxy, exporters, edge_published}]: each
    host's records from its roles (module_utils/_published.py, the published filter).

    Returns {errors, jobs: {job: [{targets: [ADDR:PORT], labels: {...}}]}}."""
    errors, jobs = [], {job: [] for job in JOBS}

    for host in fleet:
        name, address = host["name"], host["address"]
        target = "[%s]" % address if ":" in address else address
        proxy = host.get("proxy") or {}
        # the instances its proxy fronts: its monitoring listener serves /metrics/NAME for those
        fronted = proxy.get("instances")
        engines = [
            e for e in (host.get("engine") or {}).get("instances") or [] if fronted is None or e["name"] in fronted
        ]
        exporters = host.get("exporters") or {}
        edge = host.get("edge_published") or {}
        if host.get("gpu_host") and engines:
            listen = proxy.get("monitor_listen")
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
        wanted = [("node", exporters.get("node_port"), True),
                  ("nginx", exporters.get("nginx_port"), host.get("edge") or (host.get("gpu_host") and bool(engines))),
                  ("dcgm", exporters.get("dcgm_port"), host.get("gpu_host") and exporters.get("dcgm")),
                  ("router", edge.get("router_metrics_port"),
                   host.get("edge") and edge.get("router_policy"))]  # fmt: skip
        for job, port, on in wanted:
            if not on:
                continue
            labels = {"host": name}
            if job == "nginx":
                labels["role"] = "edge" if host.get("edge") else "proxy"
            jobs[job].append({"targets": ["%s:%s" % (target, port)], "labels": labels})
    return {"errors": errors, "jobs": jobs}
