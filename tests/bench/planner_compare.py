"""gpufleet's memory planner side by side with vllm-wizard (PyPI, 0.2.0) and published truth.

Run with `make bench-planner`: it installs vllm-wizard into its own virtual environment
(.cache/bench/wizard-venv) and runs both planners on the same config.json files in one run.
It prints figures; it asserts nothing. Truth comes from vLLM's own log lines and published
totals, named per row (the sources are listed in tests/unit/test_memory_plan.py, R1-R4):

  R1  llm-d-planner accuracy report, vLLM v0.19 on one H100 (CUDA total 79.19 GiB), gmu 0.95
  R2  "Model loading took 37.09 GiB" for Llama-3.1-70B-Instruct-AWQ-INT4 on one RTX PRO 6000
  R3  "Model loading took 18.14 GiB" for Qwen2.5-32B-Instruct-AWQ on one 32 GB card
  P   the model's published parameter total (model card / technical report)
  MLA DeepSeek-V2 paper (arXiv 2405.04434): the latent cache is (d_c + d_rope) x layers
      elements per token, which vLLM keeps whole on every TP rank
  DS  vLLM's DeepSeek-V3 deployment guide serves the FP8 checkpoint on one 8 x H200 node
  TP  vLLM refuses tensor_parallel_size values that do not divide the attention heads
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan as mp  # noqa: E402
from ansible_collections.gpufleet.serving.plugins.module_utils import _model_shape as shape  # noqa: E402

CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"
GIB = 2**30

# (label, config, CUDA-visible GiB per GPU, TP, max_model_len, gmu, truth)
CASES = [
    ("Llama-3.1-8B H100 TP1", "llama-3.1-8b-instruct", 79.19, 1, 8192, 0.95,
     {"weights_gib": (14.99, "R1"), "kv_tokens": (476_016, "R1"), "valid": (True, "R1")}),
    ("Llama-3.1-8B H100 TP2", "llama-3.1-8b-instruct", 79.19, 2, 8192, 0.95,
     {"weights_gib": (7.51, "R1"), "kv_bytes_per_token": (65_536, "TP"), "valid": (True, "R1")}),
    ("Qwen2.5-7B H100 TP1", "qwen2.5-7b-instruct", 79.19, 1, 8192, 0.95,
     {"weights_gib": (14.25, "R1"), "kv_tokens": (1_096_000, "R1"), "valid": (True, "R1")}),
    ("Llama-3.1-70B AWQ 96GB TP1", "llama-3.1-70b-instruct-awq", 94.5, 1, 8192, 0.9,
     {"weights_gib": (37.09, "R2"), "params_b": (70.6, "P"), "valid": (True, "R2")}),
    ("Qwen2.5-32B AWQ 32GB TP1", "qwen2.5-32b-instruct-awq", 31.4, 1, 2048, 0.9,
     {"weights_gib": (18.14, "R3"), "params_b": (32.8, "P"), "valid": (True, "R3")}),
    ("Mixtral-8x7B H100 TP2", "mixtral-8x7b-instruct", 79.19, 2, 8192, 0.95,
     {"params_b": (46.7, "P"), "valid": (True, "R1")}),
    ("DeepSeek-V3 8xH200 TP8", "deepseek-v3", 140.0, 8, 8192, 0.9,
     {"params_b": (671.0, "P"), "kv_bytes_per_token": (70_272, "MLA"), "valid": (True, "DS")}),
    ("Llama-3.1-8B 3x24GB TP3", "llama-3.1-8b-instruct", 23.5, 3, 8192, 0.9,
     {"valid": (False, "TP")}),
]  # fmt: skip

WIZARD_RUNNER = r"""
import json, os, shutil, sys, tempfile
from vllm_wizard.schemas.inputs import PlanRequest, ModelInput, HardwareInput, WorkloadInput, PolicyInput, Quantization
from vllm_wizard.planning.planner import run_plan
from vllm_wizard.models.metadata import load_model_metadata
from vllm_wizard.planning.memory import compute_kv_cache_memory
out = []
for case in json.load(sys.stdin):
    # a neutral folder name: vllm-wizard matches the path against its own table of model
    # names ("llama-3.1-8b", "qwen-14b", ...) and then ignores config.json
    d = tempfile.mkdtemp(prefix="m")
    try:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(case["config"], f)
        q = Quantization(case["quantization"] or "none")
        req = PlanRequest(
            model=ModelInput(model=d, quantization=q, max_model_len=case["max_model_len"]),
            hardware=HardwareInput(gpu="custom", gpus=case["tp"], tensor_parallel_size=case["tp"],
                                   vram_gb=case["gib"]),
            workload=WorkloadInput(concurrency=1),
            policy=PolicyInput(gpu_memory_utilization=case["gmu"]))
        fe = run_plan(req).feasibility
        md = load_model_metadata(d)
        kv = compute_kv_cache_memory(md, context_len=1, concurrency=1, kv_dtype=req.model.kv_cache_dtype,
                                     fragmentation_factor=1.0)
        out.append({"weights_gib": fe.weights_gb, "params_b": md.num_params / 1e9, "kv_bytes_per_token": kv,
                    "kv_tokens": fe.max_context_at_concurrency, "valid": fe.fits})
    except Exception as exc:
        out.append({"error": "%s: %s" % (type(exc).__name__, exc)})
    finally:
        shutil.rmtree(d, ignore_errors=True)
print(json.dumps(out))
"""


def gpufleet_row(name, gib, tp, mml, gmu):
    config = shape.load_model_config((CONFIGS / ("%s.json" % name)).read_text())
    quant = shape.quantization_of(config)
    plan = mp.plan_memory(
        config,
        gpus=tp,
        gpu_memory_bytes=int(gib * GIB),
        pins={"tensor_parallel_size": tp, "max_model_len": mml, "gpu_memory_utilization": gmu, "enforce_eager": True},
    )
    weights = shape.weights_per_gpu(config, tp, quantization=quant)["total"]
    return {
        "weights_gib": weights / GIB,
        "params_b": shape.parameter_count(config) / 1e9,
        "kv_bytes_per_token": shape.kv_bytes_per_token(config, tp),
        "kv_tokens": plan["kv_cache_tokens"],
        "valid": plan["fits"],
    }, quant["method"]


def wizard_rows(cases, python):
    proc = subprocess.run([python, "-c", WIZARD_RUNNER], input=json.dumps(cases), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit("vllm-wizard failed:\n%s" % proc.stderr[-2000:])
    return json.loads(proc.stdout)


def fmt(value):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "fits" if value else "refused"
    if isinstance(value, float):
        return "%.2f" % value
    return "{:,}".format(value)


def error_pct(value, truth):
    if value is None or truth is None or isinstance(truth, bool):
        return ""
    return " (%+.1f%%)" % (100.0 * (value - truth) / truth)


def main():
    python = os.environ.get("WIZARD_PYTHON") or sys.argv[1]
    ours, inputs = [], []
    for _label, name, gib, tp, mml, gmu, _ in CASES:
        row, quant = gpufleet_row(name, gib, tp, mml, gmu)
        ours.append(row)
        config = json.loads((CONFIGS / ("%s.json" % name)).read_text())
        config.pop("_source", None)
        inputs.append({"config": config, "gib": gib, "tp": tp, "max_model_len": mml, "gmu": gmu,
                       "quantization": quant if quant in ("awq", "gptq", "fp8") else None})  # fmt: skip
    theirs = wizard_rows(inputs, python)
    metrics = ("weights_gib", "params_b", "kv_bytes_per_token", "kv_tokens", "valid")
    print("gpufleet plan vs vllm-wizard 0.2.0 vs published truth (per GPU; KV bytes per token per GPU)")
    print("%-28s %-18s %-22s %-24s %-24s" % ("case", "figure", "truth", "gpufleet", "vllm-wizard"))
    wins = {"gpufleet": 0, "vllm-wizard": 0, "rows": 0}
    for (label, _, _, _, _, _, truth), mine, wiz in zip(CASES, ours, theirs, strict=True):
        for metric in metrics:
            if metric not in truth:
                continue
            value, source = truth[metric]
            a, b = mine.get(metric), wiz.get(metric)
            print(
                "%-28s %-18s %-22s %-24s %-24s"
                % (
                    label,
                    metric,
                    "%s [%s]" % (fmt(value), source),
                    fmt(a) + error_pct(a, value),
                    (fmt(b) + error_pct(b, value)) if "error" not in wiz else wiz["error"][:24],
                )
            )
            wins["rows"] += 1
            for who, got in (("gpufleet", a), ("vllm-wizard", b)):
                if isinstance(value, bool):
                    wins[who] += got is value
                elif got is not None and abs(got - value) / value <= 0.01:
                    wins[who] += 1
    print(
        "within 1%% of the truth (or the same verdict): gpufleet %d/%d, vllm-wizard %d/%d"
        % (wins["gpufleet"], wins["rows"], wins["vllm-wizard"], wins["rows"])
    )


if __name__ == "__main__":
    main()
