"""`gpufleet demo up`: the screen it ends with, and its early stop without the OpenAI client (the demo
itself runs in tests/labtests/test_demo.py)."""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from gpufleet import demo


def test_ready_screen_gives_a_curl_line_that_parses_and_commands_that_run(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)  # a fresh clone: .venv not activated
    screen = demo.ready_screen("https://172.18.0.2:8443", "k-123", 53.4)
    lines = {line.split()[0]: line.split(None, 1)[1] for line in screen.strip().splitlines()[1:]}
    curl = shlex.split(lines["try"])
    ca = str(tmp_path / "gpufleet" / "demo" / "ca.crt")
    # TLS verified against the demo fleet's CA, which site.yml copied beside the key
    assert curl[:5] == ["curl", "-N", "--cacert", ca, "https://172.18.0.2:8443/v1/chat/completions"]
    assert "Authorization: Bearer k-123" in curl and '"stream": true' in curl[-1]
    bench = shlex.split(lines["bench"])
    assert bench[-4:] == ["bench", "--cacert", ca, "https://172.18.0.2:8443"] and lines["ca"].startswith(ca)
    cli = str(Path(sys.executable).parent / "gpufleet")
    assert lines["status"] == "%s demo status" % cli and lines["remove"] == "%s demo down" % cli
    assert str(tmp_path / "gpufleet" / "demo" / "key") in lines["key"] and "(53 s)" in screen


def test_demo_up_without_the_openai_client_stops_before_building_anything(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "openai", None)  # a Python without the package

    def no_docker(*args):
        raise AssertionError("the demo started building: %s" % (args,))

    monkeypatch.setattr(demo.lab, "harness", no_docker)
    with pytest.raises(demo.lab.LabError, match=r"pip install 'gpufleet\[bench\]'.*the demo streams its answer"):
        demo.up()


def test_phases_report_progress_while_they_run_and_time_each_one():
    """A phase says when it starts, every `every` seconds while it runs (with the elapsed
    time), and when it ends past 5 s; two at once from two threads are both timed."""
    import threading
    import time

    from gpufleet.demo import Phases

    said: list[str] = []
    phases = Phases(say=said.append, every=0.05)
    with phases.phase("engine image"):
        time.sleep(0.5)

    def other() -> None:
        with phases.phase("host image"):
            time.sleep(0.01)

    worker = threading.Thread(target=other)
    worker.start()
    with phases.phase("tiny model"):
        time.sleep(0.06)
    worker.join()
    assert said[0] == "engine image ..."
    beats = [s for s in said if s.startswith("engine image ... ")]
    assert len(beats) >= 3 and all(s.endswith(" s") for s in beats), said
    assert phases.times[0][0] == "engine image"
    assert sorted(n for n, _ in phases.times) == ["engine image", "host image", "tiny model"]
    assert 0.45 < dict(phases.times)["engine image"] < 5
    table = phases.table(1.5).splitlines()
    assert table[0].split() == ["phase", "seconds"]
    assert table[-1].split()[-1] == "1.5" and table[-1].startswith("total (wall clock)")
    assert any(line.startswith("engine image") and line.split()[-1] == "%.1f" % dict(phases.times)["engine image"]
               for line in table)  # fmt: skip
    assert not any("done in" in s for s in said)  # none took over 5 s


@pytest.mark.parametrize("depth", [1, 12])
def test_the_demo_hosts_control_sockets_fit_a_unix_socket_path_under_any_cache_folder(monkeypatch, tmp_path, depth):
    """ssh binds ControlPath plus 17 characters first, and a Unix socket's path holds at most 107 bytes: under
    a deep XDG_CACHE_HOME the sockets go to a private folder of their own, removed again by the next write."""
    # pytest's tmp_path is itself long: the shallow case takes a short folder of its own
    base = Path(tempfile.mkdtemp(prefix="gd-")) if depth == 1 else tmp_path
    cache = base.joinpath(*["deep-folder"] * depth)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    calls = []

    def harness(*args):  # harness.sh ssh writes the ssh folder and its cp/
        calls.append(args)
        (Path(args[1]) / "cp").mkdir(parents=True, exist_ok=True)
        (Path(args[1]) / "ssh_config").write_text("Host *\n")
        return str(Path(args[1]) / "ssh_config")

    monkeypatch.setattr(demo.lab, "harness", harness)
    first = demo.connection()
    assert calls == [("ssh", str(cache / "gpufleet" / "demo" / "ssh"), "gpufleet-demo-demo-gpu")]
    assert first["gpufleet_demo_ssh_dir"] == str(cache / "gpufleet" / "demo" / "ssh")
    control = Path(first["gpufleet_demo_control_path_dir"])
    # Ansible's socket name: 10 characters of a hash after the folder
    assert len(str(control / ("x" * 10))) + 17 <= 107 and control.is_dir()
    if depth == 1:
        assert control == cache / "gpufleet" / "demo" / "ssh" / "cp"
    else:
        assert control.stat().st_mode & 0o777 == 0o700 and control.name.startswith("gpufleet-demo-cp-")
    assert demo.connection() == first and len(calls) == 1  # kept while the ssh_config is there
    again = demo.connection(refresh=True)  # status: written again, a fresh socket folder
    assert len(calls) == 2 and not (depth > 1 and control.exists())
    assert Path(again["gpufleet_demo_control_path_dir"]).is_dir()
    demo._drop_control_dir()  # what down does before it removes the ssh folder
    assert depth == 1 or not Path(again["gpufleet_demo_control_path_dir"]).exists()
    if depth == 1:
        shutil.rmtree(base)
