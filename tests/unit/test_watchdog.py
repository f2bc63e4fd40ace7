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
