"""The engine watchdog's GPU-fault loop, end to end on this machine: the real watchdog script
(roles/engine/files/engine-watchdog, with the real _gpu_health parser beside it, as the engine
role installs them) reading the lab's DCGM exporter HARDWARE STAND-IN, which replays a captured
real dcgm-exporter output and reports the faults a test writes. No systemd here, so the
instance counts as not running: no generation probe, the GPU checks alone (the fleet lab runs
the whole loop on real engines, proxies and systemd)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

CAPTURE = ROOT / "tests" / "fixtures" / "dcgm" / "8x_a800_sxm4_80gb_mig.txt"


@pytest.fixture
def host(tmp_path, standin):
    """A host's folders, the watchdog installed with its parser, tiny watching GPU 0."""
    _proc, port, fault_file = standin(CAPTURE)
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    shutil.copy(ROOT / "roles" / "engine" / "files" / "engine-watchdog", libexec / "engine-watchdog")
    shutil.copy(ROOT / "plugins" / "module_utils" / "_gpu_health.py", libexec / "_gpu_health.py")
    for name in ("engines/tiny", "run", "quarantine", "textfile"):
        (tmp_path / name).mkdir(parents=True)
    cfg = {"base_url": "http://127.0.0.1:9", "model": "m", "prompt": "Hello", "timeout": 5, "failures": 3,
           "probe_interval": 60, "quarantine_after": 1, "server": "127.0.0.1:8001", "watch_gpus": [0],
           "dcgm_url": "http://127.0.0.1:%d/metrics" % port, "proxy_hold": "",
           "metrics_dir": str(tmp_path / "textfile")}  # fmt: skip
    (tmp_path / "engines" / "tiny" / "watchdog.json").write_text(json.dumps(cfg))
    env = dict(os.environ, GPUFLEET_ENGINE_DIR=str(tmp_path / "engines"), GPUFLEET_STATE_DIR=str(tmp_path / "run"),
               GPUFLEET_QUARANTINE_DIR=str(tmp_path / "quarantine"), PATH="/usr/bin:/bin")  # fmt: skip

    def run(*args):
        done = subprocess.run([sys.executable, str(libexec / "engine-watchdog"), *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    def mark():
        path = tmp_path / "quarantine" / "tiny.json"
        return json.loads(path.read_text()) if path.exists() else None

    def series():
        return (tmp_path / "textfile" / "gpufleet-watchdog-tiny.prom").read_text()

    return run, fault_file, mark, series


def test_a_drain_worthy_xid_on_its_gpu_takes_the_instance_out_until_it_clears(host):
    run, fault_file, mark, series = host
    assert run("tiny") == (0, "") and mark() is None
    assert 'gpufleet_instance_quarantined{engine_instance="tiny"} 0' in series()
    # an application XID (13) on its GPU, and a drain-worthy one on another GPU: nothing
    fault_file.write_text("xid 0 13\nxid 3 79\n")
    assert run("tiny")[0] == 0 and mark() is None
    fault_file.write_text("xid 0 79\n")
    rc, out = run("tiny")
    held = mark()
    assert rc == 0 and held["reason"] == "xid_79" and held["by"] == "watchdog" and held["server"] == "127.0.0.1:8001"
    assert "tiny: out of service (xid_79" in out
    assert 'gpufleet_instance_quarantined{engine_instance="tiny"} 1' in series()
    assert 'gpufleet_instance_quarantine_info{engine_instance="tiny",reason="xid_79"} 1' in series()
    # still there: no change; an uncorrectable ECC error too: the mark follows the first reason
    assert run("tiny")[1] == "" and mark()["since"] == held["since"]
    fault_file.write_text("")
    rc, out = run("tiny")
    assert rc == 0 and mark() is None and "tiny: back in service (the fault cleared)" in out
    fault_file.write_text("ecc_dbe 0 2\n")
    run("tiny")
    assert mark()["reason"] == "ecc_dbe"


def test_the_exporter_not_answering_takes_nothing_out(host, tmp_path):
    run, fault_file, mark, _series = host
    fault_file.write_text("xid 0 79\n")
    cfg_path = tmp_path / "engines" / "tiny" / "watchdog.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, dcgm_url="http://127.0.0.1:9/metrics")))
    rc, out = run("tiny")
    assert rc == 0 and mark() is None and "does not answer" in out


def test_an_operator_quarantines_and_releases(host):
    run, fault_file, mark, series = host
    assert run("quarantine", "tiny", "bad", "node")[0] == 0
    assert mark()["reason"] == "operator" and mark()["detail"] == "bad node" and mark()["by"] == "operator"
    # the watchdog never releases an operator's mark, even with healthy GPUs
    run("tiny")
    assert mark()["by"] == "operator"
    assert run("release", "tiny")[0] == 0 and mark() is None
    assert 'gpufleet_instance_quarantined{engine_instance="tiny"} 0' in series()
    # released while the fault is still there: the next check takes it out again
    fault_file.write_text("xid 0 79\n")
    run("tiny")
    run("release", "tiny")
    run("tiny")
    assert mark()["reason"] == "xid_79"
    # unknown instance, bad usage
    rc, out = run("release", "nope")
    assert rc == 1 and "no engine instance 'nope'" in out
    assert run("quarantine", "tiny")[0] == 2


# --- hang means no progress: the probe's verdict with the engine's own load around it ---------


def _watchdog_module():
    """The installed script as a module (it has no .py extension), its parser beside it."""
    import importlib.machinery
    import importlib.util

    sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
    try:
        loader = importlib.machinery.SourceFileLoader(
            "gpufleet_engine_watchdog", str(ROOT / "roles" / "engine" / "files" / "engine-watchdog")
        )
        spec = importlib.util.spec_from_loader(loader.name, loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "plugins" / "module_utils"))


def test_a_busy_engine_whose_probe_times_out_is_not_hung():
    """The issue's case: under saturation the one-token probe waits in the engine's queue past
    its timeout while the engine streams. Tokens advanced during the probe while it held
    requests: busy, served. No advance while holding requests, or nothing held: the probe's
    failure stands. Unknown load (no progress counter, /metrics silent): the probe decides."""
    judge = _watchdog_module().judge
    served, why = judge(False, (4.0, 1000.0), (5.0, 1180.0))
    assert served is True and "180 tokens generated for 5 requests" in why
    assert judge(False, (4.0, 1000.0), (5.0, 1000.0)) == (False, "")  # stuck: hung
    assert judge(False, (0.0, 1000.0), (0.0, 1000.0)) == (False, "")  # idle and unserved: hung
    assert judge(False, None, (5.0, 1180.0)) == (False, "")
    assert judge(False, (4.0, 1000.0), None) == (False, "")
    assert judge(True, None, None) == (True, "") and judge(None, None, None) == (None, "")


def test_the_engine_load_is_read_from_a_real_metrics_page(tmp_path):
    """engine_load() on vLLM 0.32's busy capture, served over HTTP as the engine serves it: the
    registry's series (two running, none waiting; the generated-token counter)."""
    import http.server
    import threading

    page = (ROOT / "tests" / "fixtures" / "engine_metrics" / "vllm-0.32.0-cpu-busy.txt").read_bytes()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(page if self.path == "/metrics" else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        watchdog = _watchdog_module()
        from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import ENGINE_INFO

        series = {k: ENGINE_INFO["vllm"].metrics[k][0] for k in ("running", "waiting", "progress")}
        cfg = {"base_url": "http://127.0.0.1:%d" % server.server_address[1], "load_series": series}
        expected = sum(
            float(line.rsplit(" ", 1)[1])
            for line in page.decode().splitlines()
            if line.startswith("vllm:generation_tokens_total{")
        )
        assert watchdog.engine_load(cfg) == (2.0, expected) and expected > 0
        # an engine without a progress counter (SGLang): no load, the probe decides
        assert watchdog.engine_load(dict(cfg, load_series=dict(series, progress=None))) is None
        # /metrics not answering: unknown
        assert watchdog.engine_load(dict(cfg, base_url="http://127.0.0.1:9")) is None
    finally:
        server.shutdown()


def test_a_restart_left_pending_stops_the_watch_only_for_its_window(tmp_path, monkeypatch):
    """A restart in progress is no hang; a restart that failed and waits for the next run (its
    mark older than the longest restart) no longer stops hang detection."""
    watchdog = _watchdog_module()
    monkeypatch.setattr(watchdog, "CONFIG_DIR", str(tmp_path))
    cfg = {"restart_window": 1900}
    assert watchdog.restarting("tiny", cfg) is False  # no mark
    mark = tmp_path / "tiny" / "restart-pending"
    mark.parent.mkdir()
    mark.write_text("settings changed\n")
    touched = mark.stat().st_mtime
    assert watchdog.restarting("tiny", cfg, now=touched + 60) is True
    assert watchdog.restarting("tiny", cfg, now=touched + 1899) is True
    assert watchdog.restarting("tiny", cfg, now=touched + 1901) is False
    # the engine role's window: both readiness waits, the drain and the unit's margin, a minute more
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import render

    inst = {"name": "tiny", "engine": "vllm", "model": "/m", "port": 8001, "accelerator": "cpu",
            "readiness_timeout": 600, "drain_timeout": 120}  # fmt: skip
    assert render(inst)["restart_window"] == 2 * 600 + 120 + 30 + 60
