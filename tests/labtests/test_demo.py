"""`gpufleet demo up | status | down` as a new user runs it (through the CLI, in processes), plus
`gpufleet bench` against the demo: up streams an answer through the real proxy and vLLM, a
second up changes nothing, an up after an edit of the demo's settings applies it (the engine
restarted), down leaves Docker's containers, volumes and images as they were."""

from __future__ import annotations

import contextlib
import json
import os
import re
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import HARNESS

# make test-full only: the demo builds and converges its own host from bare
# (make test proves each central promise once; docs/testing.md).
pytestmark = pytest.mark.full

GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
DEMO_INVENTORY = Path(__file__).resolve().parents[2] / "inventories" / "demo"
# the first line of the settings the test writes for a while (a later run removes a leftover)
EDIT_MARK = "# written by tests/labtests/test_demo.py while it runs; removed when it ends\n"


def _docker_lists():
    lists = {}
    for what, argv in {
        "containers": ["ps", "-a", "--format", "{{.Names}}"],
        "volumes": ["volume", "ls", "--format", "{{.Name}}"],
        "images": ["images", "--format", "{{.Repository}}:{{.Tag}}"],
    }.items():
        out = subprocess.run(["docker", *argv], check=True, capture_output=True, text=True).stdout
        lists[what] = sorted(out.split())
    return lists


def _gpufleet(*args, env=None, timeout=1500):
    proc = subprocess.run(
        [GPUFLEET, *args], cwd="/", capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")
    return proc


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    # the demo's own state (its key, its state file) in a folder of this test; the lab's archive and
    # models stay in the machine's cache (harness.sh), which would follow XDG_CACHE_HOME otherwise
    machine = subprocess.run([HARNESS, "cache-dir"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.setenv("GPUFLEET_CACHE", machine)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _max_model_len(url, key, ca):
    """The context length the engine serves now, from /v1/models through the proxy."""
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=str(ca))) as resp:
        (model,) = json.load(resp)["data"]
    return model["max_model_len"]


def test_demo_up_status_bench_up_again_and_down(cache_home, vllm_image):
    edit = DEMO_INVENTORY / "host_vars" / "demo-gpu.yml"
    if edit.is_file() and edit.read_text().startswith(EDIT_MARK):
        edit.unlink()  # left by a run of this test that was killed
    own = [p for p in (DEMO_INVENTORY / "host_vars").glob("demo-gpu*")] if edit.parent.is_dir() else []
    assert not own, "%s are a user's own settings for the demo: the test does not run over them" % own
    subprocess.run([HARNESS, "image", "host"], check=True, capture_output=True)
    subprocess.run([HARNESS, "model", "tiny-llama"], check=True, capture_output=True)
    before = _docker_lists()
    try:
        up = _gpufleet("demo", "up")
        assert up.returncode == 0
        assert "A streamed answer through the proxy" in up.stdout
        answer = re.search(r"^> (.*)$", up.stdout.split("A streamed answer through the proxy", 1)[1], re.M)
        assert answer and answer.group(1).strip(), "the streamed answer is empty"
        # TLS by default, verified against the demo fleet's CA, which site.yml copied beside the key
        url = re.search(r"^  endpoint  (https://[0-9.]+:8443)/v1", up.stdout, re.M).group(1)
        ca = cache_home / "gpufleet" / "demo" / "ca.crt"
        assert "BEGIN CERTIFICATE" in ca.read_text() and "--cacert %s" % ca in up.stdout
        key = (cache_home / "gpufleet" / "demo" / "key").read_text().strip()
        assert oct((cache_home / "gpufleet" / "demo" / "key").stat().st_mode & 0o777) == "0o600"
        assert "Bearer %s" % key in up.stdout  # the ready-made curl line
        # the live view's per-host line of the converge (no TTY here: printed once at the end)
        assert re.search(r"^  demo-gpu\s+ok\s+\d+\s+changed\s+[1-9]", up.stdout, re.M)

        status = _gpufleet("demo", "status", "--json")
        assert status.returncode == 0
        (engine,) = json.loads(status.stdout)["hosts"]["demo-gpu"]["engines"]
        assert engine["serving"] and engine["model"] == "tiny-llama" and engine["port"] == 8001
        assert isinstance(engine["kv_cache_usage"], float) and engine["running"] == 0
        # where it runs, read back from its container's cgroup: the CPUs the plan gave it
        assert engine["placement"]["matches"] is True and engine["placement"]["cpus"], engine["placement"]

        bench = _gpufleet(
            "bench", url, "--cacert", str(ca), "--concurrency", "1,2", "--requests", "4", "--output-tokens", "8",
            "--json",
            env=dict(os.environ, GPUFLEET_API_KEY=key),
        )  # fmt: skip
        assert bench.returncode == 0
        levels = json.loads(bench.stdout)["levels"]
        assert [lv["ok"] for lv in levels] == [4, 4] and [lv["output_tokens"] for lv in levels] == [32, 32]

        # Ansible reached the host over SSH as the unprivileged login, with the lab's key
        ssh_dir = cache_home / "gpufleet" / "demo" / "ssh"
        assert (ssh_dir / "ssh_config").is_file() and (ssh_dir / "known_hosts").is_file()
        journal = subprocess.run(
            ["docker", "exec", "gpufleet-demo-demo-gpu", "journalctl", "-u", "ssh", "--no-pager"],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        assert "Accepted publickey for admin" in journal, journal[-2000:]

        again = _gpufleet("demo", "up")
        assert again.returncode == 0
        assert re.search(r"^  demo-gpu\s+ok\s+\d+\s+changed\s+0\s", again.stdout, re.M), "second up changed something"
        assert "A streamed answer through the proxy" in again.stdout
        # each phase timed, in a table at the end (on stderr); printed for the note's figures
        for run in (up, again):
            table = run.stderr.split("Where the time went", 1)[1].splitlines()[1:]
            timed = {line.rsplit(None, 1)[0].strip(): float(line.rsplit(None, 1)[1]) for line in table[1:] if line}
            assert {"host image", "engine image (vLLM CPU)", "tiny model", "site.yml on inventories/demo",
                    "streamed answer", "total (wall clock)"} <= timed.keys(), table  # fmt: skip
            print("demo up phases:", json.dumps(timed))

        # an edit of the demo's settings, then `make demo` again: applied at once, the engine restarted
        # (gpufleet_site_restarts: allow in inventories/demo; one host, nothing to roll to)
        engines = yaml.safe_load((DEMO_INVENTORY / "group_vars" / "gpu_hosts.yml").read_text())["gpufleet_engines"]
        assert _max_model_len(url, key, ca) == engines[0]["max_model_len"] != 1536
        engines[0]["max_model_len"] = 1536
        edit.parent.mkdir(exist_ok=True)
        edit.write_text(EDIT_MARK + yaml.safe_dump({"gpufleet_engines": engines}))
        edited = _gpufleet("demo", "up")
        assert edited.returncode == 0
        assert re.search(r"^  demo-gpu\s+ok\s+\d+\s+changed\s+[1-9]", edited.stdout, re.M)
        assert _max_model_len(url, key, ca) == 1536
    finally:
        edit.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            edit.parent.rmdir()
        down = _gpufleet("demo", "down")
    assert down.returncode == 0
    assert _docker_lists() == before
    assert not (cache_home / "gpufleet" / "demo" / "key").exists()
    assert not (cache_home / "gpufleet" / "demo" / "ca.crt").exists()
    assert not (cache_home / "gpufleet" / "demo" / "ssh").exists()
