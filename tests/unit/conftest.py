"""Shared helpers for unit tests: the collection resolves in place, fixtures are real captures."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"
# ansible.cfg's fact cache folder, made once here: modules that load an inventory at import make it
# otherwise, and two pytest-xdist workers doing so at once in a fresh clone met FileExistsError
# (ansible's jsonfile cache calls makedirs without exist_ok)
(ROOT / ".cache" / "facts").mkdir(parents=True, exist_ok=True)
sys.path.insert(0, str(ROOT / "collections"))
sys.path.insert(0, str(ROOT / "src"))


def read_fixture(machine: str, name: str) -> str | None:
    """A captured output with its '#~ ' provenance header removed (None if not captured)."""
    path = FIXTURES / machine / name
    if not path.is_file():
        return None
    return "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#~ "))


@pytest.fixture
def fixture_text():
    return read_fixture


# The lab's DCGM exporter HARDWARE STAND-IN (tests/lab/dcgm-exporter-standin), started on a free port.
DCGM_STANDIN = ROOT / "tests" / "lab" / "dcgm-exporter-standin"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch(port, path="/metrics"):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as response:
        return response.read().decode()


@pytest.fixture
def standin(tmp_path):
    started = []

    def start(fixture, *extra):
        port = free_port()
        fault_file = tmp_path / "dcgm-fault"
        cmd = [
            sys.executable,
            str(DCGM_STANDIN),
            "--address",
            "127.0.0.1:%d" % port,
            "--fixture",
            str(fixture),
        ]
        cmd += ["--fault-file", str(fault_file), "-c", "1000", "-f", "/etc/dcgm-exporter/default-counters.csv", *extra]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(proc)
        deadline = time.monotonic() + 15
        while True:
            try:
                fetch(port)
                return proc, port, fault_file
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "stand-in did not answer"
                time.sleep(0.05)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool from Debian's prometheus package, unpacked by tests/promtools.sh (the tests of the
    alert rules and the dashboards)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpufleet_promtest_fixture", ROOT / "tests" / "monitoring" / "promtest.py"
    )
    promtest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(promtest)
    folder = promtest.promtool_dir()
    if folder is None:
        pytest.skip("promtool comes from Debian's prometheus package (tests/promtools.sh needs apt-get, dpkg-deb)")
    return folder / "promtool"


def run_play_then_mark(tmp_path, play, host_vars=None, extra=()):
    """Run `play` with the real ansible-playbook against three local hosts (lab-a and lab-b in
    gpu_hosts, lab-edge in edge; host_vars: {host: "k=v ..."} inventory variables), followed by
    a play that marks each host that went on. Returns (the process, the marked hosts)."""
    import yaml

    marks = tmp_path / "went-on"
    marks.mkdir()
    went_on = {
        "name": "What comes after it",
        "hosts": "gpu_hosts:edge",
        "gather_facts": False,
        "tasks": [{"name": "Mark this host", "ansible.builtin.file": {"path": str(marks) + "/{{ inventory_hostname }}",
                                                                        "state": "touch", "mode": "0644"}}],
    }  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play, went_on], sort_keys=False))
    local = "ansible_connection=local ansible_python_interpreter=%s" % sys.executable
    line = {h: ("%s %s %s" % (h, local, (host_vars or {}).get(h, ""))).rstrip() for h in ("lab-a", "lab-b", "lab-edge")}
    (tmp_path / "hosts.ini").write_text(
        "[gpu_hosts]\n%s\n%s\n[edge]\n%s\n" % (line["lab-a"], line["lab-b"], line["lab-edge"])
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
         str(tmp_path / "play.yml"), *extra],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc, sorted(p.name for p in marks.iterdir())
