"""The edge's plan (backends, drains, TLS), the host firewall's open ports, the fleet lock's
owner line, and what a draining host waits on: the decisions behind the edge, firewall and
common roles and the rollout, on inputs shaped like an inventory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.filter.fleet_lock import fleet_lock_owner, fleet_lock_stale
from ansible_collections.gpufleet.serving.plugins.filter.network import inventory_addresses, tls_subject_alt_names
from ansible_collections.gpufleet.serving.plugins.module_utils._edge import backends, plan_edge
from ansible_collections.gpufleet.serving.plugins.module_utils._firewall import plan_firewall
from ansible_collections.gpufleet.serving.plugins.module_utils._published import FORMAT
from ansible_collections.gpufleet.serving.plugins.module_utils._status import busy, idle_targets

ROOT = Path(__file__).resolve().parents[2]

# the edge role's defaults: TLS on, the certificate from the fleet CA
EDGE = {"backend_group": "gpu_hosts", "drained": [], "listen_port": 8080, "listen_address": "0.0.0.0", "tls": True,
        "tls_port": 8443, "tls_certificate": "", "tls_certificate_key": ""}  # fmt: skip
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"


def hosts(*names, **over):
    return backends(list(names), {n: dict(over, ansible_host="10.0.0.%d" % i) for i, n in enumerate(names, 1)})


def test_backends_read_each_hosts_proxy_settings_with_the_proxy_roles_defaults():
    b = {"edge_address": "b.lan", "gpufleet_proxy_tls": {"certificate": PEM}}
    c = {"proxy_tls": False}
    got = backends(["a", "b", "c", "d"], {"a": {"ansible_host": "10.0.0.1"}, "b": b, "c": c,
                                          "d": {"proxy_tls_certificate": "/etc/ssl/d.pem"}})  # fmt: skip
    # TLS by default, with a certificate from the fleet CA (its CA not published yet)
    assert got[0] == {"name": "a", "address": "10.0.0.1", "tls": True, "port": 8443, "fleet_ca": True,
                      "certificate": "", "instances": []}  # fmt: skip
    assert got[1]["address"] == "b.lan" and got[1]["port"] == 8443 and got[1]["certificate"] == PEM
    # the explicit opt-out, and an operator's own certificate
    assert (got[2]["tls"], got[2]["port"], got[2]["fleet_ca"]) == (False, 8080, False)
    assert (got[3]["tls"], got[3]["port"], got[3]["fleet_ca"]) == (True, 8443, False)


def test_the_rollout_batch_is_drained_beside_the_edges_own_drained_hosts():
    plan = plan_edge(dict(EDGE, drained=["c"]), hosts("a", "b", "c"), batch=["a"])
    assert plan["errors"] == []
    assert plan["drained"] == ["a", "c"] and plan["in_service"] == ["b"]
    assert [s["down"] for s in plan["servers"]] == [True, False, True]
    # putting the batch back keeps the host the inventory drained for maintenance
    back = plan_edge(dict(EDGE, drained=["c"]), hosts("a", "b", "c"), batch=[])
    assert back["drained"] == ["c"]


def test_a_host_a_failed_rollout_left_out_stays_out_until_a_rollout_passes_it():
    # the issue's case: gpu2's rollout failed and left it drained; draining gpu1 must not bring it back
    three = hosts("gpu1", "gpu2", "gpu3")
    plan = plan_edge(EDGE, three, batch=["gpu1"], held=["gpu2"])
    assert plan["errors"] == [] and plan["drained"] == ["gpu1", "gpu2"] and plan["in_service"] == ["gpu3"]
    # what the edge keeps in its record: the batch drained now and the held host
    assert plan["held"] == ["gpu1", "gpu2"]
    # the guard counts the held host as out: a batch of the last one in service is refused
    refused = plan_edge(EDGE, three, batch=["gpu1", "gpu3"], held=["gpu2"])
    assert "would drain every backend still in service behind the edge (gpu1, gpu3)" in " ".join(refused["errors"])
    # the batch put back (its hosts passed, so the drain leaves them out of held): gpu2 stays out
    back = plan_edge(EDGE, three, batch=[], held=["gpu2"])
    assert back["drained"] == ["gpu2"] and back["held"] == ["gpu2"]
    # outside a rollout too (site.yml's edge run): still out, and the inventory's own drain is not the record's
    site = plan_edge(dict(EDGE, drained=["gpu3"]), three, held=["gpu2", "gpu3", "gone"])
    assert site["drained"] == ["gpu2", "gpu3"] and site["held"] == ["gpu2"]
    # every host in service held: they stay in service rather than none, and the run says so
    alone = plan_edge(EDGE, hosts("gpu1", "gpu2"), held=["gpu1", "gpu2"])
    assert alone["drained"] == [] and "left out by a failed rollout" in alone["warnings"][0]
    # ... and stay in the record: the next drain of another host must not forget them
    assert alone["held"] == ["gpu1", "gpu2"]
    kept = plan_edge(dict(EDGE, drained=["b"]), hosts("a", "b"), held=["a"])
    assert kept["in_service"] == ["a"] and kept["held"] == ["a"]


def test_the_last_backend_in_service_is_never_drained():
    # a batch that takes every host in service out of several: refused before anything changes
    plan = plan_edge(EDGE, hosts("a", "b"), batch=["a", "b"])
    assert "would drain every backend still in service behind the edge (a, b)" in " ".join(plan["errors"])
    assert "Lower gpufleet_rollout_batch" in " ".join(plan["errors"])
    # a one-host group: the host stays in service while it changes, and the run says so
    one = plan_edge(EDGE, hosts("a"), batch=["a"])
    assert one["errors"] == [] and one["drained"] == [] and "only backend in service" in one["warnings"][0]
    # the other in service, the rest drained by the inventory: same rule
    two = plan_edge(dict(EDGE, drained=["b"]), hosts("a", "b"), batch=["a"])
    assert two["drained"] == ["b"] and two["warnings"]


@pytest.mark.parametrize(
    ("over", "backend", "words"),
    [
        ({"drained": ["x"]}, {}, ["edge_drained=['x'] lists x, not in edge_backend_group=gpu_hosts"]),
        ({"drained": ["a", "b"]}, {}, ["takes every host of edge_backend_group=gpu_hosts out of service"]),
        ({"tls": False}, {}, ["edge_tls=false while the proxies", "in clear", "Remove edge_tls: false"]),
        ({"tls_certificate": "/c.pem"}, {}, ["edge_tls_certificate='/c.pem' and edge_tls_certificate_key=''"]),
        ({"tls_port": 8080}, {}, ["edge_tls_port=8080 is also edge_listen_port"]),
        ({"tls_names": ["llm.example.com", "bad name;"]}, {}, ["edge_tls_names lists 'bad name;': not a DNS name"]),
        ({"tls_names": "llm.example.com"}, {}, ["edge_tls_names='llm.example.com' must be a list"]),
        ({"listen_address": "every"}, {}, ["edge_listen_address='every' must be an IP address"]),
    ],
)  # fmt: skip
def test_bad_edge_settings_are_named(over, backend, words):
    text = " ".join(plan_edge(dict(EDGE, **over), hosts("a", "b", **backend))["errors"])
    for word in words:
        assert word in text


def test_mixed_tls_behind_one_edge_is_refused():
    mixed = backends(["a", "b"], {"a": {}, "b": {"proxy_tls": False}})
    text = " ".join(plan_edge(EDGE, mixed)["errors"])
    assert "mixes proxies with and without TLS (proxy_tls on a, off on b)" in text


def test_a_proxy_whose_fleet_ca_is_not_seen_yet_is_named_not_refused_at_preflight():
    # a fresh fleet: the fleet CA does not exist before the proxies' role runs
    plan = plan_edge(EDGE, hosts("a", "b"))
    assert plan["errors"] == [] and plan["untrusted"] == ["a", "b"] and plan["trust"] == []


def test_tls_backends_are_verified_by_the_fleet_ca_their_proxies_published():
    tls = hosts("a", "b", gpufleet_proxy_tls={"certificate": PEM + "\n"})
    plan = plan_edge(EDGE, tls)
    assert plan["errors"] == [] and plan["warnings"] == [] and plan["backend_tls"] is True
    # one CA for the fleet: trusted once
    assert plan["trust"] == [PEM] and [s["port"] for s in plan["servers"]] == [8443, 8443]
    assert plan["listen_address"] == "127.0.0.1" and plan["public_port"] == 8443
    # proxies with operator certificates: the edge trusts edge_backend_tls_ca or the system's bundle, not the record
    own = plan_edge(
        EDGE, hosts("a", "b", proxy_tls_certificate="/etc/ssl/p.pem", gpufleet_proxy_tls={"certificate": ""})
    )
    assert own["errors"] == [] and own["trust"] == [] and own["untrusted"] == []
    # a mix would be verified against the system's bundle alone, and the fleet CA's proxies would fail: refused
    mixed = backends(["a", "b"], {"a": {"gpufleet_proxy_tls": {"certificate": PEM}},
                                  "b": {"proxy_tls_certificate": "/etc/ssl/b.pem"}})  # fmt: skip
    text = " ".join(plan_edge(EDGE, mixed)["errors"])
    assert "mixes proxies with certificates from the fleet CA (a) and their own (proxy_tls_certificate on b)" in text
    assert plan_edge(dict(EDGE, backend_tls_ca="/etc/ssl/both.pem"), mixed)["errors"] == []


def test_plain_http_is_an_explicit_opt_out_with_a_warning():
    plain = plan_edge(dict(EDGE, tls=False), hosts("a", "b", proxy_tls=False))
    assert plain["errors"] == [] and plain["backend_tls"] is False and plain["public_port"] == 8080
    assert "edge_tls is false: clients' keys and prompts reach the edge on port 8080 in clear" in plain["warnings"][0]


ROUTER = dict(EDGE, router_policy="cache_aware", router_port=8090, router_backend_port=8091, router_metrics_port=9097)


def engines(*names, model="m"):
    return [{"name": n, "served_model_name": model, "port": 8001 + i, "api_key": "secret"} for i, n in enumerate(names)]


def test_the_router_addresses_every_instance_of_every_backend_in_service():
    hv = {"a": {"gpufleet_engines": engines("x", "y")}, "b": {"gpufleet_engines": engines("z")}}
    fleet = backends(["a", "b"], hv)
    # no key (or anything but names) reaches the plan
    assert [{k: i[k] for k in ("name", "model")} for i in fleet[0]["instances"]] == [
        {"name": "x", "model": "m"}, {"name": "y", "model": "m"}]  # fmt: skip
    assert not [i for h in fleet for i in h["instances"] if "secret" in str(i)]
    plan = plan_edge(ROUTER, fleet)
    assert plan["errors"] == [] and plan["router"]["policy"] == "cache_aware" and plan["router"]["model"] == "m"
    base = "http://127.0.0.1:8091/gpufleet/b/"
    assert plan["router"]["workers"] == [base + "a/x", base + "a/y", base + "b/z"]
    assert [b["name"] for b in plan["router"]["backends"]] == ["a", "b"]
    # the rollout drains b: its instance leaves the router's list, and its way from the router
    # (8091's upstream) is down too, so a stale list cannot reach it (issue 32)
    drained = plan_edge(ROUTER, fleet, batch=["b"])
    assert drained["router"]["workers"] == [base + "a/x", base + "a/y"]
    assert [(b["name"], b["down"]) for b in drained["router"]["backends"]] == [("a", False), ("b", True)]
    assert [b["down"] for b in plan["router"]["backends"]] == [False, False]
    # proxy_instances: only the instances the proxy fronts
    only = backends(["a"], {"a": {"gpufleet_engines": engines("x", "y"), "proxy_instances": ["y"]}})
    assert plan_edge(ROUTER, only)["router"]["workers"] == [base + "a/y"]
    # no policy: no router
    assert plan_edge(EDGE, fleet)["router"] is None


@pytest.mark.parametrize(
    ("over", "fleet", "words"),
    [
        ({"router_policy": "prefix"}, {}, ["edge_router_policy='prefix' is not a routing policy", "cache_aware"]),
        ({"router_port": 8080}, {}, ["edge_router_port=8080 is also edge_listen_port"]),
        ({"router_backend_port": 8090}, {}, ["edge_router_backend_port=8090 is also edge_router_port"]),
        ({"router_metrics_port": "x"}, {}, ["edge_router_metrics_port='x' must be a port number"]),
        ({}, {"b": {}}, ["b has no engine instance behind its proxy"]),
        ({}, {"b": {"gpufleet_engines": engines("z/../x")}}, ["b or one of its instances has a name"]),
    ],
)  # fmt: skip
def test_bad_router_settings_are_named(over, fleet, words):
    hv = {"a": {"gpufleet_engines": engines("x")}, "b": {"gpufleet_engines": engines("z")}}
    hv.update(fleet)
    text = " ".join(plan_edge(dict(ROUTER, **over), backends(["a", "b"], hv))["errors"])
    for word in words:
        assert word in text


def test_the_router_metrics_open_to_the_monitoring_hosts_only():
    routed = firewall(("edge",), {"edge_router_policy": "cache_aware"}, monitoring_sources=["10.0.0.9"])
    assert [r for r in routed["rules"] if r["why"] == "router metrics"] == [
        {"port": 9097, "sources": ["10.0.0.9/32"], "why": "router metrics", "v4": ["10.0.0.9/32"], "v6": []}
    ]
    # no monitoring hosts (the router binds loopback), or no router: nothing opens
    assert 9097 not in firewall(("edge",), {"edge_router_policy": "cache_aware"})["ports"]
    assert 9097 not in firewall(("edge",), {}, monitoring_sources=["10.0.0.9"])["ports"]


def firewall(roles=("gpu_host",), host=None, **params):
    base = {"ssh_port": 22, "ssh_sources": [], "proxy_sources": [], "monitoring_sources": [], "allow_tcp": []}
    base.update(params)
    return plan_firewall(base, dict({"gpufleet_engines": [{"name": "x"}]}, **(host or {})), list(roles))


def test_a_gpu_host_opens_ssh_and_its_proxys_public_port_only():
    # TLS on (the default): the plain port stays on loopback, only the TLS port is open
    assert firewall()["ports"] == [22, 8443]
    # the explicit opt-out: the plain port
    assert firewall(host={"proxy_tls": False})["ports"] == [22, 8080]
    # a host without engines runs no proxy
    assert firewall(host={"gpufleet_engines": []})["ports"] == [22]
    # an edge host opens the edge's port
    assert firewall(roles=("edge",), host={"gpufleet_engines": []})["ports"] == [22, 8443]
    assert firewall(roles=("edge",), host={"gpufleet_engines": [], "edge_tls": False})["ports"] == [22, 8080]


def test_the_monitoring_listener_opens_to_the_monitoring_hosts_only():
    # on loopback (the default): nothing to open
    assert firewall(monitoring_sources=["10.0.9.1"])["ports"] == [22, 8443]
    plan = firewall(host={"proxy_monitor_listen": "0.0.0.0:9091"}, monitoring_sources=["10.0.9.1", "fd00::1"])
    rule = next(r for r in plan["rules"] if r["port"] == 9091)
    assert rule["v4"] == ["10.0.9.1/32"] and rule["v6"] == ["fd00::1/128"]
    # and not at all without monitoring hosts
    assert 9091 not in firewall(host={"proxy_monitor_listen": "0.0.0.0:9091"})["ports"]


def test_the_exporters_open_to_the_monitoring_hosts_only():
    mon = ["10.0.9.1"]
    # a gpu host with engines: node, nginx and DCGM exporters, each to the monitoring host only
    plan = firewall(roles=("gpu_host", "exporters"), monitoring_sources=mon)
    assert plan["ports"] == [22, 8443, 9100, 9113, 9400]
    assert all(r["sources"] == ["10.0.9.1/32"] for r in plan["rules"] if r["port"] in (9100, 9113, 9400))
    # an edge host: no DCGM; a gpu host without engines: no nginx
    assert firewall(roles=("edge", "exporters"), host={"gpufleet_engines": []}, monitoring_sources=mon)["ports"] == [
        22, 8443, 9100, 9113]  # fmt: skip
    assert firewall(roles=("gpu_host", "exporters"), host={"gpufleet_engines": []}, monitoring_sources=mon)[
        "ports"] == [22, 9100, 9400]  # fmt: skip
    # the host's own ports; none at all without monitoring hosts
    plan = firewall(roles=("gpu_host", "exporters"), host={"exporters_node_port": 9200}, monitoring_sources=mon)
    assert 9200 in plan["ports"] and 9100 not in plan["ports"]
    assert firewall(roles=("gpu_host", "exporters"))["ports"] == [22, 8443]
    bad = firewall(roles=("gpu_host", "exporters"), host={"exporters_dcgm_port": "x"}, monitoring_sources=mon)
    assert "exporters_dcgm_port='x' must be a port number." in bad["errors"]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"ssh_port": 0}, ["firewall_ssh_port=0 must be a port number"]),
        ({"ssh_sources": ["office.example.com"]}, ["firewall_ssh_sources: 'office.example.com' is not an address"]),
        ({"allow_tcp": [{"port": 70000}]}, ["firewall_allow_tcp[0]="]),
        ({"allow_tcp": [{"port": 9100, "why": "x; drop"}]}, ["firewall_allow_tcp[0].why="]),
    ],
)
def test_bad_firewall_settings_are_named(params, words):
    text = " ".join(firewall(**params)["errors"])
    for word in words:
        assert word in text


def test_fleet_lock_owner_names_this_run_and_is_not_stale_while_it_runs():
    line = fleet_lock_owner("/x/playbooks/rollout.yml")
    assert "playbook=rollout.yml" in line and "controller=" in line
    assert fleet_lock_owner("rollout.yml") == line  # the same line each time one run asks
    assert fleet_lock_stale(line) is False


def test_a_worker_forked_from_the_run_names_the_run_itself(tmp_path):
    # Ansible templates tasks in worker processes forked from ansible-playbook (same command
    # line): the lock taken in one worker must be released from another, so both name the run.
    script = tmp_path / "ansible-playbook"
    script.write_text(
        "import os, sys\n"
        "from ansible_collections.gpufleet.serving.plugins.filter.fleet_lock import fleet_lock_owner\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.write(w, fleet_lock_owner('rollout.yml').encode()); os._exit(0)\n"
        "os.wait(); print(os.getpid()); print(fleet_lock_owner('rollout.yml')); print(os.read(r, 4096).decode())\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    ).stdout.splitlines()  # fmt: skip
    pid, main, worker = out
    assert worker == main and " pid=%s " % pid in main


def _dead_owner():
    """The owner line of a process that ran here and ended: its PID (and start time) no longer
    name a live process."""
    child = subprocess.run(
        [sys.executable, "-c", "from ansible_collections.gpufleet.serving.plugins.filter.fleet_lock import "
         "fleet_lock_owner; print(fleet_lock_owner('site.yml'))"],
        capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )  # fmt: skip
    return child.stdout.strip()


def test_a_lock_of_a_dead_run_here_is_stale_and_one_from_elsewhere_never_is():
    # a process that ran and ended: its PID (and start time) no longer name a live process
    dead = _dead_owner()
    assert fleet_lock_stale(dead) is True
    assert fleet_lock_stale(dead.replace("controller=", "controller=other-")) is False
    assert fleet_lock_stale("garbage") is False


def test_a_live_lock_is_never_taken_by_a_controller_of_the_same_name_or_one_without_proc(monkeypatch):
    from ansible_collections.gpufleet.serving.plugins.filter import fleet_lock

    dead = _dead_owner()
    assert fleet_lock_stale(dead) is True
    # the line names the machine; a controller with the same host name but another machine id
    # (a clone, a second VM named alike) does not take the lock of a run it cannot see
    assert " machine=%s" % fleet_lock._machine_id() in dead
    monkeypatch.setattr(fleet_lock, "_machine_id", lambda: "f" * 32)
    assert fleet_lock_stale(dead) is False
    # a line written before machine ids (the fleet lab's stand-in for a killed run): host name decides
    assert fleet_lock_stale(dead.rsplit(" machine=", 1)[0]) is True
    # no /proc: this run's own start time cannot be read, so no holder is judged dead
    monkeypatch.setattr(fleet_lock, "_start_time", lambda pid: None)
    assert fleet_lock_stale(dead.rsplit(" machine=", 1)[0]) is False


def test_inventory_addresses_and_subject_alt_names():
    hv = {"a": {"ansible_host": "10.0.0.1"}, "b": {"ansible_facts": {"default_ipv4": {"address": "10.0.0.2"}}}, "c": {}}
    assert inventory_addresses(["a", "b", "c"], hv) == ["10.0.0.1", "10.0.0.2", "c"]
    # an ansible_host that is a name gives way to the facts' address (the firewall needs addresses)
    named = {"d": {"ansible_host": "d.lab", "ansible_facts": {"default_ipv4": {"address": "10.0.0.4"}}},
             "e": {"ansible_host": "e.lab"}}  # fmt: skip
    assert inventory_addresses(["d", "e"], named) == ["10.0.0.4", "e.lab"]
    assert tls_subject_alt_names(["gpu01", "10.0.0.5", "fd00::5"]) == ["DNS:gpu01", "IP:10.0.0.5", "IP:fd00::5"]


def test_a_draining_host_waits_on_what_runs_now_for_each_drain_time():
    deployed = [{"name": "chat", "engine": "vllm", "base_url": "http://127.0.0.1:8001", "drain_timeout": 819}]
    plan = [{"name": "chat", "engine": "vllm", "base_url": "http://127.0.0.1:9999", "drain_timeout": 30},
            {"name": "new", "engine": "sglang", "base_url": "http://127.0.0.1:8002", "drain_timeout": 40}]  # fmt: skip
    targets = idle_targets(deployed, plan)
    # the running instance's own port and drain time, not the new plan's; a new one from the plan
    assert targets == [
        {"name": "chat", "engine": "vllm", "base_url": "http://127.0.0.1:8001", "timeout": 819},
        {"name": "new", "engine": "sglang", "base_url": "http://127.0.0.1:8002", "timeout": 40},
    ]
    assert [t["timeout"] for t in idle_targets(deployed, plan, override=5)] == [5, 5]
    page = 'vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_waiting{engine="0"} 0.0\n'
    results = [{"status": 200, "content": page, "item": targets[0]},
               {"status": 200, "content": "sglang:num_running_reqs 0\n", "item": targets[1]},
               {"status": -1, "item": {"name": "gone"}}]  # fmt: skip
    assert busy(results) == ["chat"]


def test_a_bad_monitoring_source_is_named_once_whatever_needs_it():
    # the monitoring listener, the exporters and the router's metrics all open to these sources
    gpu = firewall(("gpu_host", "exporters"), {"proxy_monitor_listen": "0.0.0.0:9091"}, monitoring_sources=["mon.lan"])
    edge = firewall(("edge", "exporters"), {"edge_router_policy": "cache_aware"}, monitoring_sources=["mon.lan"])
    for plan in (gpu, edge):
        assert [e for e in plan["errors"] if "firewall_monitoring_sources" in e] == [
            "firewall_monitoring_sources: 'mon.lan' is not an address or network (10.0.0.5, 10.0.0.0/24); the firewall "
            "matches addresses, so give the host's address (ansible_host) rather than its name."
        ]


def test_the_router_helper_fails_when_the_router_does_not_answer(tmp_path):
    """gpufleet-router-workers against a router that does not answer: exit 4 with the reason (it
    exited 0 before, so a drained instance stayed in a running router's list unnoticed)."""
    import json

    from conftest import ROOT

    workers = tmp_path / "workers.env"
    workers.write_text('GPUFLEET_ROUTER_WORKERS="http://10.0.0.5:8443/gpufleet/instance/tiny"\n')
    helper = ROOT / "roles" / "edge" / "files" / "gpufleet-router-workers"
    done = subprocess.run([sys.executable, str(helper), str(workers), "http://127.0.0.1:9"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["unreachable"] and answer["added"] == [] and answer["removed"] == []


def test_loopback_control_planes_take_only_their_services_users():
    # a gpu host: each instance's port and its surge copy's, for root and nginx (issue 32)
    host = {"gpufleet_engines": [{"name": "a", "port": 8001}, {"name": "b", "port": 8002, "surge_port": 9102}]}
    loop = firewall(host=host)["loopback"]
    (guard,) = loop["guards"]
    assert guard["ports"] == [8001, 8002, 9001, 9102]
    assert loop["users"] == ["root", "www-data"] and loop["router_user"] is None
    # an edge host with the router: its API and its way to the proxies, for its user too
    loop = firewall(roles=("edge",), host={"gpufleet_engines": [], "edge_router_policy": "cache_aware"})["loopback"]
    assert [g["ports"] for g in loop["guards"]] == [[8090, 8091]]
    assert loop["users"] == ["root", "www-data", "gpufleet-router"] and loop["router_user"] == "gpufleet-router"
    # without the router nothing listens there; the guard off: no rule
    assert firewall(roles=("edge",), host={"gpufleet_engines": []})["loopback"]["guards"] == []
    assert firewall(host=host, loopback_guard=False)["loopback"]["guards"] == []
    # a wrong user list is named
    assert "firewall_loopback_users=" in " ".join(firewall(loopback_users="root")["errors"])
    assert "firewall_loopback_users=" in " ".join(firewall(loopback_users=["Root user"])["errors"])


def test_the_loopback_rule_renders_by_user_id():
    from jinja2 import Environment, FileSystemLoader

    env = Environment(loader=FileSystemLoader(str(ROOT / "roles" / "firewall" / "templates")), trim_blocks=True)
    env.filters["comment"] = lambda text: "# " + text
    plan = firewall(host={"gpufleet_engines": [{"name": "a", "port": 8001}]})
    text = env.get_template("gpufleet.nft.j2").render(
        ansible_managed="managed", inventory_hostname="gpu1", __firewall_plan=plan, firewall_log_drops=False,
        __firewall_loopback_uids=[0, 33],
    )  # fmt: skip
    assert "type filter hook output priority filter; policy accept;" in text
    assert 'oifname "lo" tcp dport { 8001, 9001 } meta skuid != { 0, 33 } counter reject with tcp reset' in text
    # no user ID known (check mode on a bare host): no output chain at all, never an empty set
    assert "chain output" not in env.get_template("gpufleet.nft.j2").render(
        ansible_managed="managed", inventory_hostname="gpu1", __firewall_plan=plan, firewall_log_drops=False,
        __firewall_loopback_uids=[],
    )  # fmt: skip


def two_models(**over):
    """a and b serve m, c serves other (a second model of another shape)."""
    hv = {"a": {"gpufleet_engines": engines("x")}, "b": {"gpufleet_engines": engines("y")},
          "c": {"gpufleet_engines": engines("z", model="other")}}  # fmt: skip
    for name, extra in over.items():
        hv[name] = dict(hv[name], **extra)
    for i, name in enumerate(hv, 1):
        hv[name]["ansible_host"] = "10.0.0.%d" % i
    return backends(["a", "b", "c"], hv)


def test_each_model_gets_its_own_backends_and_the_router_its_multi_model_mode():
    plan = plan_edge(ROUTER, two_models())
    assert plan["errors"] == []
    assert [(m["name"], m["hosts"], m["in_service"]) for m in plan["models"]] == [
        ("m", ["a", "b"], ["a", "b"]), ("other", ["c"], ["c"])]  # fmt: skip
    # each model's upstream is named by its name alone: another model added or gone leaves it as it is
    assert plan["models"][1]["upstream"] == plan_edge(ROUTER, two_models()[2:])["models"][0]["upstream"]
    assert len({m["upstream"] for m in plan["models"]}) == 2
    assert all(re.fullmatch(r"gpufleet_m_[0-9a-f]{16}", m["upstream"]) for m in plan["models"])
    # the multi-model mode adds each worker with its model
    assert plan["router"]["worker_models"] == ["m", "m", "other"]
    assert [s["address"] for s in plan["models"][1]["servers"]] == ["10.0.0.3"]
    # several models behind one router: its multi-model mode; one model: the single-model mode as before
    assert plan["router"]["igw"] is True
    one = plan_edge(ROUTER, hosts("a", "b"))
    assert one["router"] is None or one["router"]["igw"] is False


def test_a_rollout_never_takes_the_last_host_of_a_model_out():
    # c is the only host serving `other`: it stays in service while it changes (its surge copy), a is drained
    plan = plan_edge(EDGE, two_models(), batch=["a", "c"])
    assert plan["errors"] == [] and plan["drained"] == ["a"]
    assert "c is the only backend in service behind the edge for the model other" in " ".join(plan["warnings"])
    # every host of a model with two: refused, naming the model
    both = plan_edge(EDGE, two_models(), batch=["a", "b"])
    assert "would drain every backend still in service behind the edge for the model m (a, b)" in " ".join(
        both["errors"]
    )
    # the edge's own drained list may not empty a model either
    text = " ".join(plan_edge(dict(EDGE, drained=["c"]), two_models())["errors"])
    assert "takes every host serving the model other (c) out of service" in text
    # a failed rollout's held host that is its model's last stays in service, the other model's is out
    held = plan_edge(EDGE, two_models(), held=["a", "c"])
    assert held["drained"] == ["a"] and held["held"] == ["a", "c"]
    assert [m["in_service"] for m in held["models"]] == [["b"], ["c"]]


def test_one_served_name_for_two_different_models_is_named():
    fleet = two_models(b={"gpufleet_engines": [dict(engines("y")[0], model="/models/big", max_model_len=4096)]})
    text = " ".join(plan_edge(EDGE, fleet)["errors"])
    assert "the model name m is served with different settings" in text
    assert "model=/models/big max_model_len=4096 on b/y" in text and "on a/x" in text


KEY = "k" * 32


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ([{"name": "team", "key": KEY, "models": ["nope"]}], ["edge_api_keys[0] (team).models lists nope, which no "
                                                             "backend of the edge serves (m, other)"]),
        ([{"name": "team", "key": "short"}], ["edge_api_keys[0] (team).key is 5 characters",
                                                         "client keys need at least 32"]),
        ([{"name": "a", "key": KEY}, {"name": "a", "key": KEY + "x"}], ["edge_api_keys[1].name='a' is used twice"]),
        ([{"name": "a", "key": KEY}, {"name": "b", "key": KEY}], ["edge_api_keys[1] (b).key is the same as another"]),
        ([{"name": "bad name", "key": KEY}], ["edge_api_keys[0].name='bad name'"]),
        ([{"name": "a", "key": KEY, "models": "m"}], ["edge_api_keys[0] (a).models='m' must be a list"]),
        ([{"name": "a", "key": KEY, "token_per_minute": 5}], ["edge_api_keys[0] must be a mapping of name, key",
                                                              "(it also has token_per_minute: check the spelling)"]),
        ([{"name": "a", "key": 123456789}], ["edge_api_keys[0] (a).key is not a string"]),
        (["a"], ["edge_api_keys[0] must be a mapping of name, key"]),
        ({"name": "a"}, ["edge_api_keys must be a list"]),
    ],
)  # fmt: skip
def test_bad_edge_keys_are_named_without_their_values(keys, words):
    plan = plan_edge(dict(EDGE, api_keys=keys), two_models())
    text = " ".join(plan["errors"])
    for word in words:
        assert word in text
    assert KEY not in text


def test_edge_keys_reach_the_plan_as_names_and_models_only():
    plan = plan_edge(dict(EDGE, api_keys=[{"name": "team", "key": KEY, "models": ["other"]},
                                          {"name": "all", "key": KEY + "y"}]), two_models())  # fmt: skip
    assert plan["errors"] == [] and plan["keys"] == [
        {"name": "team", "models": ["other"], "tokens_per_minute": 0, "tokens_per_day": 0},
        {"name": "all", "models": [], "tokens_per_minute": 0, "tokens_per_day": 0},
    ]
    assert KEY not in str(plan)


def test_edge_keys_carry_their_token_limits():
    plan = plan_edge(dict(EDGE, api_keys=[{"name": "team", "key": KEY, "tokens_per_minute": 1000},
                                          {"name": "all", "key": KEY + "y", "tokens_per_day": None}],
                          quota_store_host="edge1", edge_hosts=["edge1"], quota_store_port=6379,
                          quota_store_password="p" * 16, quota_fail_open=True, quota_store_address="127.0.0.1"),
                     two_models())  # fmt: skip
    assert plan["errors"] == []
    assert plan["keys"] == [
        {"name": "team", "models": [], "tokens_per_minute": 1000, "tokens_per_day": 0},
        {"name": "all", "models": [], "tokens_per_minute": 0, "tokens_per_day": 0},
    ]
    assert plan["quota"] == {"store_host": "edge1", "address": "127.0.0.1", "port": 6379, "fail_open": True,
                             "limited": ["team"], "tls": False, "audio_tokens_per_second": 10,
                             "reserve_tokens": 1024}  # fmt: skip
    assert "p" * 16 not in str(plan) and KEY not in str(plan)
    # no store: nothing counted
    assert plan_edge(dict(EDGE, api_keys=[{"name": "a", "key": KEY}]), two_models())["quota"] is None


STORE = {"quota_store_host": "edge1", "edge_hosts": ["edge1", "edge2"], "quota_store_port": 6379,
         "quota_store_password": "p" * 20, "quota_fail_open": True}  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "over", "words"),
    [
        ([{"name": "a", "key": KEY, "tokens_per_minute": "1000"}], STORE,
         ["edge_api_keys[0] (a).tokens_per_minute='1000' must be a whole number of tokens"]),
        ([{"name": "a", "key": KEY, "tokens_per_day": -5}], STORE,
         ["edge_api_keys[0] (a).tokens_per_day=-5 must be a whole number"]),
        ([{"name": "a", "key": KEY, "tokens_per_day": 1.5}], STORE, ["tokens_per_day=1.5 must be a whole number"]),
        ([{"name": "a", "key": KEY, "tokens_per_minute": True}], STORE, ["tokens_per_minute=True must be"]),
        ([{"name": "a", "key": KEY, "tokens_per_minute": 10}], {},
         ["edge_api_keys (a) set tokens_per_minute or tokens_per_day, and edge_quota_store_host is empty"]),
        ([{"name": "a", "key": KEY}], dict(STORE, quota_store_host="gpu1"),
         ["edge_quota_store_host='gpu1' must be one of the edge hosts (edge1, edge2)"]),
        ([], STORE, ["edge_quota_store_host=edge1 counts the tokens of each edge key, and edge_api_keys is empty"]),
        ([{"name": "a", "key": KEY}], dict(STORE, quota_store_port="6379x"), ["edge_quota_store_port='6379x' must"]),
        ([{"name": "a", "key": KEY}], dict(STORE, quota_store_password="short"),
         ["edge_quota_store_password must be 16-128 characters"]),
        ([{"name": "a", "key": KEY}], dict(STORE, quota_store_password="has space in it 0123"),
         ["edge_quota_store_password must be"]),
        ([{"name": "a", "key": KEY}], dict(STORE, quota_fail_open="yes"), ["edge_quota_fail_open='yes' must be true"]),
    ],
)  # fmt: skip
def test_bad_quota_settings_are_named_before_any_change(keys, over, words):
    plan = plan_edge(dict(EDGE, api_keys=keys, **over), two_models())
    text = " ".join(plan["errors"])
    for word in words:
        assert word in text, text
    assert "short" not in text and "has space" not in text


def test_the_usage_store_opens_to_the_edge_hosts_only():
    store = {"gpufleet_engines": [], "edge_quota_store_host": "edge1", "inventory_hostname": "edge1"}
    plan = firewall(("edge",), store, edge_sources=["10.0.0.5", "10.0.0.6"])
    assert [r for r in plan["rules"] if r["why"] == "the usage store"] == [
        {"port": 6379, "sources": ["10.0.0.5/32", "10.0.0.6/32"], "why": "the usage store",
         "v4": ["10.0.0.5/32", "10.0.0.6/32"], "v6": []}]  # fmt: skip
    # the other edge hosts run no store; the store's own port setting is used
    assert 6379 not in firewall(("edge",), dict(store, inventory_hostname="edge2"), edge_sources=["10.0.0.5"])["ports"]
    assert 6400 in firewall(("edge",), dict(store, edge_quota_store_port=6400), edge_sources=["10.0.0.5"])["ports"]
    assert "firewall_edge_sources" in " ".join(firewall(("edge",), store, edge_sources=["edge-a"])["errors"])


QUOTA = dict(quota_store_host="edge1", edge_hosts=["edge1"], quota_store_port=6379, quota_store_password="p" * 16,
             quota_fail_open=True, quota_store_address="127.0.0.1",
             api_keys=[{"name": "team", "key": KEY, "tokens_per_day": 100}])  # fmt: skip


def test_several_edges_reach_the_store_over_tls():
    """Issue 47: with more than one edge the store crosses the network, so it is on the fleet's TLS."""
    one = plan_edge(dict(EDGE, **QUOTA), two_models())
    two = plan_edge(dict(EDGE, **dict(QUOTA, edge_hosts=["edge1", "edge2"])), two_models())
    assert one["errors"] == two["errors"] == []
    assert one["quota"]["tls"] is False and two["quota"]["tls"] is True


@pytest.mark.parametrize(
    "over, words",
    [
        ({"quota_reserve_tokens": -1}, ["edge_quota_reserve_tokens=-1", "whole number"]),
        ({"quota_reserve_tokens": "lots"}, ["edge_quota_reserve_tokens='lots'"]),
        ({"quota_audio_tokens_per_second": 0}, ["edge_quota_audio_tokens_per_second=0", "above 0"]),
        ({"quota_audio_tokens_per_second": True}, ["edge_quota_audio_tokens_per_second=True"]),
    ],
)  # fmt: skip
def test_bad_quota_settings_are_named(over, words):
    plan = plan_edge(dict(EDGE, **dict(QUOTA, **over)), two_models())
    text = " ".join(plan["errors"])
    for word in words:
        assert word in text, text
    assert "p" * 16 not in text


def test_body_limits_per_path_under_nginx_cap():
    plan = plan_edge(dict(EDGE, client_max_body_size="64m", body_limits={"/v1/embeddings": "1m"}), two_models())
    assert plan["errors"] == []
    assert plan["limits"] == {"default": 32 * 2**20, "/v1/audio/transcriptions": 25 * 2**20,
                              "/v1/audio/translations": 25 * 2**20, "/v1/embeddings": 2**20}  # fmt: skip
    # nginx's cap lower than a built-in one: the built-in is cut to it, no error (the user set only the cap)
    small = plan_edge(dict(EDGE, client_max_body_size="8m"), two_models())
    assert small["errors"] == [] and set(small["limits"].values()) == {8 * 2**20}


@pytest.mark.parametrize(
    "over, words",
    [
        ({"body_limits": {"/v1/chat": "1m"}}, ["edge_body_limits has '/v1/chat'", "/v1/chat/completions"]),
        ({"body_limits": {"default": "lots"}}, ["edge_body_limits[default]='lots'", "like 32m"]),
        ({"body_limits": {"default": "128m"}}, ["edge_body_limits[default]=128m is over edge_client_max_body_size"]),
        ({"body_limits": ["1m"]}, ["edge_body_limits=['1m'] must be a mapping"]),
        ({"client_max_body_size": "big"}, ["edge_client_max_body_size='big'"]),
    ],
)  # fmt: skip
def test_bad_body_limits_are_named(over, words):
    plan = plan_edge(dict(EDGE, **dict({"client_max_body_size": "64m"}, **over)), two_models())
    text = " ".join(plan["errors"])
    for word in words:
        assert word in text, text


def test_the_model_store_opens_to_the_gpu_hosts_only():
    """Issue 48: the store host (the first of the model_store group) opens its port to the gpu hosts,
    from its published record, else its inventory and the role's default (8444)."""
    store = {"gpufleet_engines": []}
    plan = firewall(("edge", "model_store"), store, gpu_sources=["10.0.0.21", "10.0.0.22"])
    assert [r for r in plan["rules"] if r["why"] == "the model store"] == [
        {"port": 8444, "sources": ["10.0.0.21/32", "10.0.0.22/32"], "why": "the model store",
         "v4": ["10.0.0.21/32", "10.0.0.22/32"], "v6": []}]  # fmt: skip
    record = {"gpufleet_model_store_published": {"format": FORMAT, "port": 9444}}
    assert 9444 in firewall(("model_store",), dict(store, **record), gpu_sources=["10.0.0.21"])["ports"]
    assert 8444 in firewall(("model_store",), dict(store, model_store_port=8444), gpu_sources=["10.0.0.21"])["ports"]
    # not the store: nothing opened for it
    assert 8444 not in firewall(("edge",), store, gpu_sources=["10.0.0.21"])["ports"]
    assert "firewall_gpu_sources" in " ".join(firewall(("model_store",), store, gpu_sources=["gpu-a"])["errors"])
    assert "model_store_port='x'" in " ".join(firewall(("model_store",), dict(store, model_store_port="x"))["errors"])
