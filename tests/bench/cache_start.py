"""make bench-ready, the restart: the lab's vLLM CPU engine with compilation on (not eager), from
`docker run` to its first generated token, on a compile cache folder kept from its last start
(engine_compile_cache, what gpufleet does now) against an empty one (what every restart met
before: the caches lived inside the container and went with it). Figures, not assertions.

Both variants run the same image, model, settings and CPU (one core, as each fleet lab engine
has), with the engine registry's cache variables (_engine_options.ENGINE_INFO["vllm"].cache_env)
pointing into the folder mounted where the engine role mounts it (_engine_render.CACHE_MOUNT).
One start fills the kept folder first (not counted); then RUNS starts of each variant,
alternating. Each start's phases are read from its log by the same code as `gpufleet status`
(_engine_phase.start_phases). A last start on the kept folder with one setting changed (dtype)
shows the cache following the engine's own keys: it compiles again.

    python tests/bench/cache_start.py OUT_FILE [RUNS]
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import ENGINE_INFO  # noqa: E402
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_phase import (  # noqa: E402
    docker_time,
    start_phases,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import CACHE_MOUNT  # noqa: E402

HARNESS = ROOT / "tests" / "lab" / "harness.sh"
PORT = 18432
LIMIT = 1200


def _out(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def _first_token(t0):
    """Seconds from t0 to the answer of a one-token completion (the first generated token)."""
    body = json.dumps({"model": "/m", "prompt": "The capital of France is", "max_tokens": 1}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % PORT, data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=300) as resp:
        answer = json.load(resp)
    assert answer["choices"], answer
    return time.monotonic() - t0


def start(image, model_dir, cache_dir, dtype="bfloat16"):
    """One start: (seconds to /health 200, seconds to the first token, phases record)."""
    name = "gpufleet-bench-cache-%d" % time.monotonic_ns()
    argv = ["docker", "run", "-d", "--name", name, "--network", "host", "--cpuset-cpus", "0", "--shm-size", "1g",
            "-e", "VLLM_CPU_KVCACHE_SPACE=1", "-v", "%s:/m:ro" % model_dir,
            "-v", "%s:%s:rw" % (cache_dir, CACHE_MOUNT)]  # fmt: skip
    for variable, sub in ENGINE_INFO["vllm"].cache_env:
        argv += ["-e", "%s=%s/%s" % (variable, CACHE_MOUNT, sub)]
    argv += [image, "--model", "/m", "--max-model-len", "2048", "--dtype", dtype, "--host", "127.0.0.1",
             "--port", str(PORT)]  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    try:
        healthy = None
        while time.monotonic() - t0 < LIMIT:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % PORT, timeout=2) as resp:
                    if resp.status == 200:
                        healthy = time.monotonic() - t0
                        break
            except OSError:
                pass
            if _out("docker", "inspect", "-f", "{{.State.Running}}", name) != "true":
                raise SystemExit("engine exited:\n" + _out("docker", "logs", "--tail", "30", name))
            time.sleep(0.5)
        if healthy is None:
            raise SystemExit("engine not healthy within %d s" % LIMIT)
        token = _first_token(t0)
        started = _out("docker", "inspect", "-f", "{{.State.StartedAt}}", name)
        log = subprocess.run(["docker", "logs", "--timestamps", name], capture_output=True, text=True, check=True)
        phases = start_phases((log.stdout + log.stderr).splitlines(), "vllm", started_at=docker_time(started))
        return healthy, token, phases
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def _phase_line(record):
    return ", ".join("%s %.1f" % (p["phase"], p["seconds"] or 0) for p in record["phases"][:-1])


def main():
    out_file = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".cache" / "bench-cache-start.txt"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    image = _out(str(HARNESS), "image", "vllm-cpu")
    model_dir = _out(str(HARNESS), "model", "tiny-llama")
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-cache-"))
    lines = []
    try:
        kept = work / "kept"
        kept.mkdir()
        fill = start(image, model_dir, kept)
        results = {"kept": [], "empty": []}
        for i in range(runs):
            results["kept"].append(start(image, model_dir, kept))
            empty = work / ("empty-%d" % i)
            empty.mkdir()
            results["empty"].append(start(image, model_dir, empty))
        changed = start(image, model_dir, kept, dtype="float32")
        lines.append("vLLM CPU engine (%s, tiny-llama, one core, compilation on), docker run to the first generated "
                     "token; %d starts of each variant, alternating" % (image, runs))  # fmt: skip
        lines.append("  %-44s %10s %12s   phases of the median start (s)" % ("", "/health", "first token"))
        lines.append("  %-44s %9.1fs %11.1fs   %s" % ("first start, filling the kept folder", fill[0], fill[1],
                                                       _phase_line(fill[2])))  # fmt: skip
        labels = {
            "kept": "cache kept from the last start (gpufleet)",
            "empty": "empty cache (before: in the container)",
        }
        medians = {}
        for key, label in labels.items():
            starts = sorted(results[key], key=lambda r: r[1])
            middle = starts[len(starts) // 2]
            medians[key] = statistics.median(r[1] for r in starts)
            lines.append("  %-44s %9.1fs %11.1fs   %s" % (label, statistics.median(r[0] for r in starts), medians[key],
                                                          _phase_line(middle[2])))  # fmt: skip
            lines.append("  %-44s %s" % ("", "runs (first token): " + " ".join("%.1f" % r[1] for r in results[key])))
        lines.append("  %-44s %9.1fs %11.1fs   %s" % ("kept folder, one setting changed (dtype)", changed[0],
                                                       changed[1], _phase_line(changed[2])))  # fmt: skip
        lines.append("  ratio empty/kept (first token, medians): %.2fx" % (medians["empty"] / medians["kept"]))
    finally:
        # the engine wrote its cache as root; the bench runs as root (make bench-ready)
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(text)


if __name__ == "__main__":
    main()
