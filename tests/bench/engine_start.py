"""How long the lab's vLLM CPU engine takes from `docker run` to its first 200 on /health,
with the image's compiled bytecode and without it (figures, not assertions).

Both starts use the same image, model and CPU (one core, as each fleet lab engine has).
"without bytecode" points PYTHONPYCACHEPREFIX at an empty folder, so every module is compiled
from source in memory, as the lab image did on every start before its bytecode was compiled
at build time (it runs with PYTHONDONTWRITEBYTECODE=1). Each variant runs RUNS times,
alternating; the table shows each start and the medians' ratio.

    python tests/bench/engine_start.py [RUNS]     (make bench-engine-start)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "lab" / "harness.sh"
PORT = 18431


def _out(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def start_seconds(image, model_dir, env):
    name = "gpufleet-bench-start-%d" % time.monotonic_ns()
    argv = ["docker", "run", "-d", "--name", name, "--network", "host", "--cpuset-cpus", "0", "--shm-size", "1g",
            "-e", "VLLM_CPU_KVCACHE_SPACE=1", "-v", "%s:/m:ro" % model_dir]  # fmt: skip
    for key, value in env.items():
        argv += ["-e", "%s=%s" % (key, value)]
    argv += [image, "--model", "/m", "--max-model-len", "2048", "--enforce-eager", "--host", "127.0.0.1",
             "--port", str(PORT)]  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    try:
        while time.monotonic() - t0 < 900:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % PORT, timeout=2) as resp:
                    if resp.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            if _out("docker", "inspect", "-f", "{{.State.Running}}", name) != "true":
                raise SystemExit("engine exited:\n" + _out("docker", "logs", "--tail", "30", name))
            time.sleep(0.5)
        raise SystemExit("engine not healthy within 900 s")
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    image = _out(str(HARNESS), "image", "vllm-cpu")
    model_dir = _out(str(HARNESS), "model", "tiny-llama")
    variants = {
        "compiled bytecode (the image)": {},
        "without bytecode (before)": {"PYTHONPYCACHEPREFIX": "/nonexistent"},
    }
    seconds = {label: [] for label in variants}
    for _ in range(runs):
        for label, env in variants.items():
            seconds[label].append(start_seconds(image, model_dir, env))
    print("vLLM CPU engine start to /health 200 (%s, tiny-llama, one core), %d runs each" % (image, runs))
    for label, values in seconds.items():
        print("  %-32s median %6.1f s   runs %s" % (label, statistics.median(values),
                                                    " ".join("%.1f" % v for v in values)))  # fmt: skip
    before, after = (statistics.median(v) for v in (seconds["without bytecode (before)"],
                                                     seconds["compiled bytecode (the image)"]))  # fmt: skip
    print("  ratio before/after: %.2fx" % (before / after))


if __name__ == "__main__":
    main()
