"""gpufleet status: the report a host gives (module_utils/_status.py and the engine_status
filter) read from a real vLLM /metrics capture and the deployed.json the engine role renders,
and the table the CLI prints from it; the engine_load filter the rollout waits on."""

from __future__ import annotations

import base64
import json

from conftest import ROOT
from engine_role import role_defaults

from ansible_collections.gpufleet.serving.plugins.filter.engine_load import FilterModule as LoadFilters
from ansible_collections.gpufleet.serving.plugins.filter.engine_status import engine_status
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import render
from ansible_collections.gpufleet.serving.plugins.module_utils._status import engine_load, parse_metrics, read_deployed
from gpufleet.runner import status_rows

METRICS = ROOT / "tests" / "fixtures" / "engine_metrics"
BUSY = (METRICS / "vllm-0.32.0-cpu-busy.txt").read_text()
IDLE = (METRICS / "vllm-0.32.0-cpu-idle.txt").read_text()


def _deployed(**over):
    """deployed.json as roles/engine/tasks/configure.yml writes it (to_nice_json)."""
    inst = {"name": "chat", "engine": "vllm", "model": "/srv/models/qwen", "served_model_name": "qwen", "port": 8001,
            "gpus": [0, 1], "tensor_parallel_size": 2}  # fmt: skip
    inst.update(over)
    return json.dumps(render(inst, defaults=role_defaults())["deployed"], indent=2, sort_keys=True)


def test_metrics_of_a_busy_and_an_idle_vllm():
    # the capture: the last two of six long completions still running, none waiting
    busy = parse_metrics(BUSY)
    assert busy["running"] == 2 and busy["waiting"] == 0
    assert 0 < busy["kv_cache_usage"] < 0.05
    # the capture's prefix cache counters (prompt tokens): 6 looked up, none found
    assert parse_metrics(IDLE) == {"running": 0, "waiting": 0, "kv_cache_usage": 0.0, "prefix_cache_queries": 6,
                                   "prefix_cache_hits": 0}  # fmt: skip
    assert parse_metrics("", "sglang") == {"running": None, "waiting": None, "kv_cache_usage": None}
    sglang = 'sglang:num_running_reqs{tp_rank="0"} 3\nsglang:num_queue_reqs{tp_rank="0"} 1\nsglang:token_usage 0.5\n'
    assert parse_metrics(sglang, "sglang") == {"running": 3, "waiting": 1, "kv_cache_usage": 0.5}


def test_metrics_of_a_busy_sglang_from_its_real_capture():
    """SGLang's own published /metrics capture (tests/fixtures/engine_metrics/sglang-*.txt): the
    registry's names find its running and queued requests and its token pool usage."""
    (capture,) = METRICS.glob("sglang-*.txt")
    load = parse_metrics(capture.read_text(), "sglang")
    assert load == {"running": 162, "waiting": 2826, "kv_cache_usage": 0.28}
    assert engine_load(capture.read_text(), "sglang") == 162 + 2826


def test_metrics_are_read_by_prometheus_own_parser():
    # label values may hold any character: '}' and ',' in a served model's name, an escaped quote
    page = (
        'vllm:num_requests_running{engine="0",model_name="team}a,\\"b\\""} 3\n'
        'vllm:num_requests_waiting{engine="0",model_name="team}a,\\"b\\""} 2\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="x"} 0.25\n'
    )
    assert parse_metrics(page) == {"running": 3, "waiting": 2, "kv_cache_usage": 0.25, "prefix_cache_queries": None,
                                   "prefix_cache_hits": None}  # fmt: skip
    # a page cut short keeps what came before the break
    assert parse_metrics(page.splitlines()[0] + "\nvllm:num_requests_wai")["running"] == 3


def test_instance_as_deployed_from_its_record():
    got = read_deployed(_deployed(max_model_len=16384))
    assert got["model"] == "qwen" and got["port"] == 8001 and got["tensor_parallel_size"] == 2
    assert got["gpus"] == "0,1" and got["engine"] == "vllm" and got["max_model_len"] == 16384 and got["recorded"]
    assert got["image"] == role_defaults()["images"]["vllm_nvidia"]
    cpu = read_deployed(_deployed(accelerator="cpu", gpus=[], tensor_parallel_size=None, port=8002))
    assert cpu["gpus"] == "cpu" and cpu["tensor_parallel_size"] == 1 and cpu["port"] == 8002
    # SGLang calls the context length context_length
    sglang = read_deployed(_deployed(engine="sglang", context_length=8192))
    assert sglang["engine"] == "sglang" and sglang["max_model_len"] == 8192


def test_the_record_holds_no_secret():
    text = _deployed(api_key="s3cret-key-" * 4, env={"HF_TOKEN": "hf_s3cret"}, extra_args=["--x", "s3cret"])
    assert "s3cret" not in text
    assert json.loads(text)["base_url"] == "http://127.0.0.1:8001"


def test_an_instance_without_a_record_is_unknown_not_a_crash():
    # deployed by an older gpufleet: no deployed.json (slurp failed), or a file that is not JSON
    for text in (None, "", "not json", "[1, 2]"):
        got = read_deployed(text)
        assert not got["recorded"] and got["engine"] is None and got["port"] is None, got
    report = engine_status(
        [{"path": "/etc/gpufleet/engines/old"}],
        deployed=[{"failed": True, "msg": "file not found"}],
        units=[{"status": {"ActiveState": "active"}}],
        metrics=[{"skipped": True}],
    )
    (old,) = report["engines"]
    assert old["name"] == "old" and old["unit"] == "active" and not old["recorded"] and old["model"] is None
    assert not old["serving"]  # its port is unknown: nothing says it serves
    row = status_rows({"gpu-01": report})[1]
    assert row[3] == "old ?:?" and row[4] == "unknown (unit active; no deployed.json: run site.yml)"


def test_engine_load_counts_running_and_waiting_by_each_engines_names():
    engine_load = LoadFilters().filters()["engine_load"]
    assert engine_load(BUSY) == 2  # the capture: two running, none waiting
    assert engine_load(IDLE) == 0
    sglang = 'sglang:num_running_reqs{tp_rank="0"} 3\nsglang:num_queue_reqs{tp_rank="0"} 1\n'
    assert engine_load(sglang, "sglang") == 4
    assert engine_load(sglang, "vllm") == 0  # vLLM's names are not SGLang's
    assert engine_load(BUSY, "sglang") == 0


def _b64(text):
    return base64.b64encode(text.encode()).decode()


def test_filter_joins_folders_units_and_metrics_and_the_table_flags_what_does_not_serve():
    folders = [{"path": "/etc/gpufleet/engines/chat"}, {"path": "/etc/gpufleet/engines/spare"}]
    report = engine_status(
        folders,
        deployed=[{"content": _b64(_deployed())}, {"content": _b64(_deployed(name="spare", port=8002, gpus=[2]))}],
        units=[{"status": {"ActiveState": "active"}}, {"status": {"ActiveState": "failed"}}],
        metrics=[{"status": 200, "content": BUSY}, {"status": -1, "msg": "connection refused"}],
        gpu={"driver_version": "580.95.05", "count": 4, "devices": [{"name": "NVIDIA H100"}], "p2p": {}},
        nccl_env="# written by gpufleet\nNCCL_P2P_DISABLE=1\n",
    )
    chat, spare = report["engines"]
    assert chat["serving"] and chat["running"] == 2 and chat["waiting"] == 0
    assert not spare["serving"] and spare["unit"] == "failed" and spare["running"] is None
    assert report["nccl"] == "P2P disabled (NCCL_P2P_DISABLE=1)" and report["driver_version"] == "580.95.05"
    assert engine_status([], nccl_env="NCCL_P2P_DISABLE=0\n")["nccl"] == "P2P enabled (NCCL_P2P_DISABLE=0)"
    assert engine_status([], nccl_env="NCCL_P2P_LEVEL=NVL\n")["nccl"] == "P2P up to NVL (NCCL_P2P_LEVEL)"
    assert engine_status([])["nccl"] == "no NCCL env file"
    rows = status_rows({"gpu-01": report, "gpu-02": dict(report, engines=[])})
    assert rows[0][:5] == ["HOST", "DRIVER", "NCCL", "ENGINE", "STATE"]
    assert rows[1][3:8] == ["chat vllm:8001", "serving", "qwen", "2", "0,1"] and rows[1][12:] == ["2", "0"]
    # no placement read (engine_placement not given): CPUS and MEMS unknown
    assert rows[0][8:10] == ["CPUS", "MEMS"] and rows[1][8:10] == ["-", "-"] and chat["placement"] is None
    # the busy capture's prefix cache: 24 prompt tokens looked up, none found
    assert chat["prefix_cache_hit_rate"] == 0.0 and rows[0][11] == "PREFIX HITS" and rows[1][11] == "0.0%"
    assert spare["prefix_cache_hit_rate"] is None and rows[2][11] == "-"
    assert rows[2][4] == "NOT SERVING (unit failed)"
    assert rows[3][0] == "gpu-02" and rows[3][4] == "no engine"


def test_an_instance_whose_restart_is_pending_is_not_reported_as_running_its_new_settings():
    # configure.yml wrote deployed.json and the restart-pending mark; the restart failed (or the
    # controller died) before the instance restarted: the old container still serves
    report = engine_status(
        [{"path": "/etc/gpufleet/engines/chat"}],
        deployed=[{"content": _b64(_deployed(max_model_len=16384))}],
        units=[{"status": {"ActiveState": "active"}}],
        metrics=[{"status": 200, "content": IDLE}],
        pending=[{"stat": {"exists": True}}],
    )
    (chat,) = report["engines"]
    assert chat["serving"] and chat["restart_pending"] is True
    row = status_rows({"gpu-01": report})[1]
    assert row[4].startswith("RESTART PENDING (unit active; these settings are not running yet")
    done = engine_status(
        [{"path": "/etc/gpufleet/engines/chat"}], deployed=[{"content": _b64(_deployed())}],
        units=[{"status": {"ActiveState": "active"}}], metrics=[{"status": 200, "content": IDLE}],
        pending=[{"stat": {"exists": False}}],
    )  # fmt: skip
    assert done["engines"][0]["restart_pending"] is False and status_rows({"h": done})[1][4] == "serving"


def test_a_multi_node_instance_shows_on_each_node_with_its_rank():
    group = {"rank": 0, "size": 2, "leader": "gpu-01", "nodes": ["gpu-01", "gpu-02"],
             "addresses": ["10.0.0.1", "10.0.0.2"], "master_addr": "10.0.0.1", "master_port": 29501,
             "address": "10.0.0.1", "ifname": "eth0"}  # fmt: skip
    leader = engine_status(
        [{"path": "/etc/gpufleet/engines/big"}], deployed=[{"content": _b64(_deployed(name="big", _group=group))}],
        units=[{"status": {"ActiveState": "active"}}], metrics=[{"status": 200, "content": IDLE}],
    )  # fmt: skip
    worker_group = dict(group, rank=1, address="10.0.0.2")
    # a headless worker has no /metrics: running is what it can say
    worker = engine_status(
        [{"path": "/etc/gpufleet/engines/big"}],
        deployed=[{"content": _b64(_deployed(name="big", _group=worker_group))}],
        units=[{"status": {"ActiveState": "active"}}], metrics=[{"status": -1, "msg": "connection refused"}],
    )  # fmt: skip
    stopped = engine_status(
        [{"path": "/etc/gpufleet/engines/big"}],
        deployed=[{"content": _b64(_deployed(name="big", _group=worker_group))}],
        units=[{"status": {"ActiveState": "failed"}}], metrics=[{"status": -1, "msg": "connection refused"}],
    )  # fmt: skip
    rows = status_rows({"gpu-01": leader, "gpu-02": worker, "gpu-03": stopped})
    assert rows[1][4] == "serving, node 0 of 2 (gpu-02)"
    assert rows[2][4] == "running, node 1 of 2 (leader gpu-01)"
    assert rows[3][4] == "NOT RUNNING (unit failed), node 1 of 2 (leader gpu-01)"
    assert worker["engines"][0]["serving"] and not stopped["engines"][0]["serving"]


def test_usage_tables_read_the_store_once_and_name_each_edges_view():
    from gpufleet.runner import usage_rows

    up = {"store": "127.0.0.1:6379", "store_up": True, "edge": {"refused_requests": 2, "unchecked_requests": 0,
                                                               "uncounted_tokens": 0},
          "usage": [{"key": "team", "model": "tiny", "prompt": 10, "completion": 30, "requests": 1}],
          "keys": [{"name": "team", "minute": 40, "day": 40, "limit_minute": 100, "limit_day": 0}]}  # fmt: skip
    down = {"store": "10.0.0.5:6379", "store_up": False, "error": "connect: refused", "edge": None}
    by_model, quotas, edges = usage_rows({"edge-b": down, "edge-a": up})
    assert by_model == [["KEY", "MODEL", "PROMPT", "COMPLETION", "REQUESTS"], ["team", "tiny", "10", "30", "1"]]
    assert quotas[1] == ["team", "40/100", "40/-"]
    assert edges[1] == ["edge-a", "127.0.0.1:6379", "yes", "2", "0", "0"]
    assert edges[2] == ["edge-b", "10.0.0.5:6379", "NO: connect: refused", "-", "-", "-"]


def test_an_instance_still_starting_shows_its_phase_read_from_its_log():
    """The engine_phase module's reading (a real vLLM CPU log, cut while it compiled) joins the
    report; the table says STARTING with the phase and for how long, where it said NOT SERVING."""
    from test_engine_phase import COLD, _log

    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_phase import docker_time, start_phases

    lines, started = _log(COLD)
    begin = next(i for i, line in enumerate(lines) if "Warming up model for the compilation" in line)
    now = docker_time(lines[begin].split(" ")[0]) + 62.0
    reading = dict(start_phases(lines[: begin + 1], "vllm", started_at=started, now=now), running=True)
    served = dict(start_phases(lines, "vllm", started_at=started, now=now + 600), running=True)
    report = engine_status(
        [{"path": "/etc/gpufleet/engines/chat"}, {"path": "/etc/gpufleet/engines/done"}],
        deployed=[{"content": _b64(_deployed())}, {"content": _b64(_deployed(name="done", port=8002, gpus=[2]))}],
        units=[{"status": {"ActiveState": "active"}}, {"status": {"ActiveState": "active"}}],
        metrics=[{"status": -1, "msg": "connection refused"}, {"status": 200, "content": IDLE}],
        phases={"chat": reading, "done": served},
    )
    chat, done = report["engines"]
    assert chat["start"]["phase"] == "compiling" and chat["start"]["phase_s"] == 62.0
    assert chat["start"]["phases"][0] == {"phase": "initializing", "note": None, "start_s": 0.0,
                                          "seconds": reading["phases"][0]["seconds"]}  # fmt: skip
    rows = status_rows({"gpu-01": report})
    up = round(reading["elapsed_s"])
    assert rows[1][4] == "STARTING: compiling for 1m02s, up %dm%02ds" % divmod(up, 60)
    # once it serves, the log says how long the start took; the state is what /metrics says
    assert rows[2][4] == "serving" and done["start"]["ready_s"] == served["ready_s"] > 0
    # its container does not run (the unit failed, or has not started it): as before
    absent = {"running": False, "problem": "container gpufleet-chat does not run"}
    gone = engine_status([{"path": "/etc/gpufleet/engines/chat"}], deployed=[{"content": _b64(_deployed())}],
                         units=[{"status": {"ActiveState": "active"}}], metrics=[{"status": -1}],
                         phases={"chat": absent})  # fmt: skip
    assert gone["engines"][0]["start"] is None
    assert status_rows({"gpu-01": gone})[1][4] == "NOT SERVING (unit active)"
