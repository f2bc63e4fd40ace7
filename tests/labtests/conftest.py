"""Lab-tier tests: need the Docker engine and the lab images (tests/lab/harness.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
HARNESS = ROOT / "tests" / "lab" / "harness.sh"


@pytest.fixture(scope="session")
def vllm_image():
    return subprocess.run([HARNESS, "image", "vllm-cpu"], check=True, capture_output=True, text=True).stdout.strip()


def start_systemd_host(prefix):
    """A lab host container running systemd as PID 1 (ENVIRONMENT.md's recipe), ready: its name.
    The caller removes it (remove_host)."""
    import uuid

    image = subprocess.run([HARNESS, "image", "host"], check=True, capture_output=True, text=True).stdout.strip()
    name = prefix + uuid.uuid4().hex[:8]
    argv = ["docker", "run", "-d", "--name", name, "--hostname", name, "--cap-add", "SYS_ADMIN"]
    argv += ["--security-opt", "seccomp=unconfined", "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw"]
    argv += ["--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp", "--stop-signal", "SIGRTMIN+3"]
    argv += ["--label", "io.gpufleet.lab=host", image, "/lib/systemd/systemd"]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    state = subprocess.run(
        ["docker", "exec", name, "sh", "-c", "for i in $(seq 60); do s=$(systemctl is-system-running --wait"
         " 2>/dev/null); case $s in running|degraded) echo $s; exit 0;; esac; sleep 1; done; echo $s"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if state.stdout.strip() not in ("running", "degraded"):
        remove_host(name)
        raise AssertionError("systemd in %s: %s %s" % (name, state.stdout, state.stderr))
    return name


def remove_host(name):
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
