"""Helpers shared by the unit tests that drive promtool (tests/unit/test_monitoring_rules.py,
tests/unit/test_dashboards.py): promtool itself, and real captured /metrics pages turned into
promtool input series, labelled as the monitoring role's scrape config labels them."""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_HEALTH = ROOT / "plugins" / "module_utils" / "_gpu_health.py"
DCGM_CAPTURES = {
    "a800": ROOT / "tests" / "fixtures" / "dcgm" / "8x_a800_sxm4_80gb_mig.txt",  # GPU 0 in MIG mode
    "rtx4000": ROOT / "tests" / "fixtures" / "dcgm" / "1x_rtx4000_ada_k8s.txt",
}
ENGINE_CAPTURES = sorted((ROOT / "tests" / "fixtures" / "engine_metrics").glob("*.txt"))
ENGINE_BUSY = ROOT / "tests" / "fixtures" / "engine_metrics" / "vllm-0.32.0-cpu-busy.txt"


def promtool_dir() -> Path | None:
    """The folder holding promtool and amtool (tests/promtools.sh); None without apt-get/dpkg-deb.
    Raises RuntimeError when the script fails on a machine that has them."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    run = subprocess.run([str(ROOT / "tests" / "promtools.sh")], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"tests/promtools.sh failed:\n{run.stderr}")
    return Path(run.stdout.strip().splitlines()[-1])


def run_promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=300)


def series(name: str, labels: dict[str, str]) -> str:
    """promtool's series notation: name{label="value", ...} with PromQL string escapes."""

    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    return name + "{" + ", ".join(f"{key}={quoted(value)}" for key, value in sorted(labels.items())) + "}"


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample, by the collection's own exposition parser (it skips
    the A800 capture's "ERROR - FAILED TO CONVERT TO STRING" samples)."""
    spec = importlib.util.spec_from_file_location("gpufleet_gpu_health_promtest", GPU_HEALTH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_metrics(text, skip_bad_values=True)


def metric_names(path: Path) -> set[str]:
    return {name for name, _, _ in parse_metrics(path.read_text())}


def captured_series(path: Path, target: dict[str, str], steps: int = 40) -> list[dict]:
    """Every finite sample of a capture as a constant input series with the scrape's labels."""
    return [
        {"series": series(name, {**labels, **target}), "values": f"{value!r}x{steps}"}
        for name, labels, value in parse_metrics(path.read_text())
        if math.isfinite(value)
    ]


def dcgm_series(steps: int = 40) -> list[dict]:
    """Both DCGM captures, as job="dcgm" on hosts a800 and rtx4000."""
    found = []
    for host, path in DCGM_CAPTURES.items():
        found += captured_series(path, {"job": "dcgm", "instance": f"{host}:9400", "host": host}, steps)
    return found


ENGINE_TARGET = {
    "job": "gpufleet_engine",
    "instance": "a800:8443",
    "host": "a800",
    "engine_instance": "tiny",
    "model": "tiny-llama",
}


def engine_series(steps: int = 40) -> list[dict]:
    """The busy vLLM capture as one engine instance (a800/tiny)."""
    return captured_series(ENGINE_BUSY, ENGINE_TARGET, steps)


SGLANG_BUSY = next((ROOT / "tests" / "fixtures" / "engine_metrics").glob("sglang-*.txt"))
SGLANG_TARGET = dict(ENGINE_TARGET, engine_instance="sg", model="llama-3.1-8b")


def sglang_series(steps: int = 40) -> list[dict]:
    """SGLang's busy capture as a second engine instance on the same host (a800/sg)."""
    return captured_series(SGLANG_BUSY, SGLANG_TARGET, steps)
