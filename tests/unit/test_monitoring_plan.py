"""What the monitoring hosts' Prometheus scrapes, planned from the inventory
(plugins/module_utils/_monitoring.py), and what status shows for a quarantined instance."""

from __future__ import annotations

import json

from ansible_collections.gpufleet.serving.plugins.filter.monitoring_plan import gpu_drain_xids, monitoring_plan
from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_health import DRAIN_XIDS
from ansible_collections.gpufleet.serving.plugins.module_utils._published import FALLBACK, publish, published
from ansible_collections.gpufleet.serving.plugins.module_utils._status import host_status
from gpufleet.runner import status_rows


def entry(name, address, hv, gpu_host=True, edge=False):
    """One host as the monitoring preflight gathers it: what its roles published (here the
    inventory fallback: the host's variables with the roles' defaults)."""
    return {"name": name, "address": address, "gpu_host": gpu_host, "edge": edge,
            "engine": published("engine", hv), "proxy": published("proxy", hv),
            "exporters": published("exporters", hv), "edge_published": published("edge", hv)}  # fmt: skip


def gpu(name, address, engines=({"name": "tiny", "served_model_name": "tiny-llama"},), dcgm=True, **more):
    hv = dict({"gpufleet_engines": [dict(e, model="/m", port=8001) for e in engines],
               "exporters_dcgm_enabled": dcgm, "proxy_monitor_listen": "0.0.0.0:9091"}, **more)  # fmt: skip
    return entry(name, address, hv)


def edge(name, address, **more):
    return entry(name, address, dict(more), gpu_host=False, edge=True)


def test_every_instance_and_exporter_is_a_target_with_its_labels():
    fleet = [
        gpu("g1", "10.0.0.5", engines=[{"name": "a", "served_model_name": "m"}, {"name": "b"}]),
        gpu("g2", "fd00::7", dcgm=False, exporters_node_port=9200),
        edge("edge1", "10.0.0.9"),
    ]
    plan = monitoring_plan(fleet)
    assert plan["errors"] == []
    engines = plan["jobs"]["gpufleet_engine"]
    assert [(e["targets"], e["labels"]["engine_instance"], e["labels"]["__metrics_path__"]) for e in engines] == [
        (["10.0.0.5:9091"], "a", "/metrics/a"),
        (["10.0.0.5:9091"], "b", "/metrics/b"),
        (["[fd00::7]:9091"], "tiny", "/metrics/tiny"),
    ]
    # the served name labels the model; an instance without one is its own name
    assert [e["labels"]["model"] for e in engines] == ["m", "b", "tiny-llama"]
    assert [t["targets"][0] for t in plan["jobs"]["node"]] == ["10.0.0.5:9100", "[fd00::7]:9200", "10.0.0.9:9100"]
    assert [(t["targets"][0], t["labels"]["role"]) for t in plan["jobs"]["nginx"]] == [
        ("10.0.0.5:9113", "proxy"), ("[fd00::7]:9113", "proxy"), ("10.0.0.9:9113", "edge")]  # fmt: skip
    # DCGM only where it runs
    assert [t["labels"]["host"] for t in plan["jobs"]["dcgm"]] == ["g1"]
    # no router on that edge
    assert plan["jobs"]["router"] == []


def test_only_the_instances_the_proxy_fronts_are_scraped():
    # its monitoring listener serves /metrics/NAME for the instances in proxy_instances only
    fleet = [gpu("g1", "10.0.0.5", engines=[{"name": "a"}, {"name": "b"}], proxy_instances=["b"])]
    assert [e["labels"]["engine_instance"] for e in monitoring_plan(fleet)["jobs"]["gpufleet_engine"]] == ["b"]


def test_the_dcgm_decision_is_the_exporters_role_s_own():
    # auto: the host's GPUs decide (its gpu_facts, cached); what the role published wins
    auto = {"gpufleet_engines": [], "ansible_facts": {"gpufleet_gpu": {"count": 2}}}
    assert published("exporters", auto)["dcgm"] is True
    assert published("exporters", dict(auto, ansible_facts={"gpufleet_gpu": {"count": 0}}))["dcgm"] is False
    assert published("exporters", dict(auto, exporters_dcgm_enabled="false"))["dcgm"] is False
    said = publish("exporters", dict(FALLBACK["exporters"], exporters_dcgm_port=9500), gpu_count=1)
    fleet = [entry("g1", "10.0.0.5", dict(auto, gpufleet_exporters_published=said, exporters_dcgm_port=1))]
    assert [t["targets"] for t in monitoring_plan(fleet)["jobs"]["dcgm"]] == [["10.0.0.5:9500"]]


def test_an_edge_with_a_router_is_scraped_at_its_metrics_port():
    edges = [edge("e1", "10.0.0.9", edge_router_policy="cache_aware"),
             edge("e2", "10.0.0.10", edge_router_policy="consistent_hash", edge_router_metrics_port=9300),
             edge("e3", "10.0.0.11", edge_router_policy="")]  # fmt: skip
    plan = monitoring_plan(edges)
    assert [(t["targets"], t["labels"]) for t in plan["jobs"]["router"]] == [
        (["10.0.0.9:9097"], {"host": "e1"}), (["10.0.0.10:9300"], {"host": "e2"})]  # fmt: skip


def test_a_monitoring_listener_on_loopback_is_named_with_the_fix():
    plan = monitoring_plan([gpu("g1", "10.0.0.5", proxy_monitor_listen=None)])
    assert plan["jobs"]["gpufleet_engine"] == []
    (error,) = plan["errors"]
    assert "g1: proxy_monitor_listen='127.0.0.1:9091' is on loopback" in error
    assert "set proxy_monitor_listen: 0.0.0.0:9091" in error
    assert "must be ADDRESS:PORT" in monitoring_plan([gpu("g1", "h", proxy_monitor_listen="9091")])["errors"][0]
    # a gpu host without engines has nothing to scrape there, and no error
    assert monitoring_plan([gpu("g1", "10.0.0.5", engines=[], proxy_monitor_listen=None)])["errors"] == []


def test_the_drain_list_is_one_list():
    assert gpu_drain_xids() == list(DRAIN_XIDS)
    assert 79 in DRAIN_XIDS and 13 not in DRAIN_XIDS


def test_a_quarantined_instance_is_shown_with_its_reason_and_who():
    mark = json.dumps({"reason": "xid_79", "detail": "GPU 0: XID 79", "since": 1, "by": "watchdog", "server": "x"})
    report = host_status([
        {"name": "tiny", "deployed": None, "active": "active", "metrics": None, "quarantine": mark},
        {"name": "other", "deployed": None, "active": "active", "metrics": None, "quarantine": None},
        {"name": "odd", "deployed": None, "active": "active", "metrics": None, "quarantine": "{not json"},
    ])  # fmt: skip
    tiny, other, odd = report["engines"]
    assert tiny["quarantine"] == {"reason": "xid_79", "detail": "GPU 0: XID 79", "since": 1, "by": "watchdog"}
    assert other["quarantine"] is None and odd["quarantine"]["reason"] == "unreadable mark"
    rows = status_rows({"g1": report})
    assert rows[1][4].startswith("QUARANTINED (xid_79: GPU 0: XID 79; by watchdog)")
    assert not rows[2][4].startswith("QUARANTINED")


def _answer(*samples):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1796277000.0, value]} for labels, value in samples]}}  # fmt: skip


def test_status_shows_prometheus_figures_and_firing_alerts_per_instance():
    from ansible_collections.gpufleet.serving.plugins.module_utils._status import monitoring_status

    tiny = {"host": "g1", "engine_instance": "tiny"}
    answers = {
        "tokens_per_s": _answer((dict(tiny, __name__="gpufleet:engine_generation_tokens:rate5m"), "412.5")),
        "ttft_p50": _answer((tiny, "0.012")),
        "ttft_p95": _answer((tiny, "NaN")),  # no request in the window
        "alerts": _answer(
            (dict(tiny, alertname="GpufleetEngineHung"), "1"),
            ({"host": "g1", "gpu": "0", "alertname": "GpufleetGpuXid"}, "1"),
            ({"alertname": "Watchdog"}, "1"),
        ),
    }
    seen = monitoring_status(answers)
    assert seen["instances"] == {"g1/tiny": {"tokens_per_s": 412.5, "ttft_p50": 0.012, "ttft_p95": None,
                                             "alerts": ["GpufleetEngineHung"]}}  # fmt: skip
    assert seen["hosts"] == {"g1": ["GpufleetGpuXid"]}
    report = host_status([{"name": "tiny", "deployed": None, "active": "active", "metrics": None}])
    rows = status_rows({"g1": report}, seen)
    assert rows[0][-3:] == ["TOK/S", "TTFT P50/P95", "ALERTS"]
    assert rows[1][-3:] == ["412.5", "0.012s/-", "GpufleetEngineHung,GpufleetGpuXid"]
    # no monitoring host: no such columns; a Prometheus that failed: figures unknown
    assert len(status_rows({"g1": report})[0]) == 14
    assert monitoring_status({"tokens_per_s": {"status": "error"}}) == {"instances": {}, "hosts": {}}
