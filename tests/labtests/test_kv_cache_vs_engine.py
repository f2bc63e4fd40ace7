"""The planner's KV-cache arithmetic against the real engine's own count.

For tiny generated models of different shapes (layers, heads, KV heads, dtype), start the
vLLM CPU engine with a known KV space (VLLM_CPU_KVCACHE_SPACE=1 GiB) and compare the tokens
it logs ("CPU KV cache size: N tokens") with the planner's figure, exactly. vLLM's CPU
backend pages the cache in blocks of 128 tokens (vllm/platforms/cpu.py, non-MLA default).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HARNESS

from ansible_collections.gpufleet.serving.plugins.module_utils._memory_plan import plan_memory
from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import logged_kv_tokens

KV_SPACE = 2**30
CPU_BLOCK = 128
MAX_MODEL_LEN = 2048
LOGGED = re.compile(r"CPU KV cache size: ([\d,]+) tokens")


PRESETS = ("tiny-llama", "tiny-llama-mha", "tiny-llama-gqa8")


def _model(preset):
    model_dir = subprocess.run([HARNESS, "model", preset], check=True, capture_output=True, text=True).stdout.strip()
    dtype = json.loads((Path(model_dir) / "gpufleet-tiny-model.json").read_text())["dtype"]
    return model_dir, dtype


@pytest.fixture(scope="module")
def engine_kv_tokens(vllm_image):
    """The KV cache size each preset's real engine logs: the three engines start at once (each
    only until it logs the size), so the module waits for one start, not three."""
    names = {}
    for preset in PRESETS:
        model_dir, dtype = _model(preset)
        name = "gpufleet-kvcheck-%s-%d" % (preset, time.monotonic_ns())
        subprocess.run(
            ["docker", "run", "-d", "--name", name, "--network", "none", "--shm-size", "1g",
             "-e", "VLLM_CPU_KVCACHE_SPACE=1", "-e", "HF_HUB_OFFLINE=1", "-v", "%s:/m:ro" % model_dir,
             vllm_image, "--model", "/m", "--dtype", dtype, "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
             "--host", "127.0.0.1", "--port", "18123"],
            check=True, capture_output=True,
        )  # fmt: skip
        names[preset] = name
    found, logs = {}, {}
    try:
        deadline = time.monotonic() + 420
        while len(found) < len(names) and time.monotonic() < deadline:
            for preset, name in names.items():
                if preset in found:
                    continue
                out = subprocess.run(["docker", "logs", name], capture_output=True, text=True, check=False)
                logs[preset] = out.stdout + out.stderr
                match = LOGGED.search(logs[preset])
                if match:
                    found[preset] = int(match.group(1).replace(",", ""))
                    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
            time.sleep(2)
    finally:
        for name in names.values():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    return found, logs


@pytest.mark.parametrize("preset", PRESETS)
def test_planner_kv_tokens_equal_the_engine(engine_kv_tokens, preset):
    model_dir, dtype = _model(preset)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    # the same plan the engine role makes for a CPU instance (gpufleet plan --accelerator cpu)
    plan = plan_memory(
        config, accelerator="cpu", kv_space_bytes=KV_SPACE, pins={"dtype": dtype, "max_model_len": MAX_MODEL_LEN}
    )
    assert plan["fits"], plan["errors"]
    per_token, planned = plan["kv_bytes_per_token_per_gpu"], plan["kv_cache_tokens"]
    blocks = planned // CPU_BLOCK
    assert logged_kv_tokens(blocks, CPU_BLOCK, MAX_MODEL_LEN) == planned
    found, logs = engine_kv_tokens
    if preset not in found:
        pytest.fail("engine never logged its KV cache size:\n%s" % logs.get(preset, "")[-3000:])
    logged = found[preset]
    shape = "%s layers, %s heads, %s KV heads, %s" % (
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config.get("num_key_value_heads"),
        dtype,
    )
    print("%s (%s): %d B/token, planner %d tokens, engine %d tokens" % (preset, shape, per_token, planned, logged))
    assert logged == planned
