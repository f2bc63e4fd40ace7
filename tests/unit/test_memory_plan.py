"""The memory plan against published engine figures, the seed setups, and the rules.

Published figures (vLLM's own log lines), each with where it was published:
- R1  llm-d-planner "Capacity Planner Accuracy Report" (vLLM v0.19.0, one H100 80GB whose
      CUDA total is 79.19 GiB, gpu_memory_utilization 0.95, max_model_len 8192, OpenAI server
      defaults max_num_batched_tokens 8192 / max_num_seqs 1024, CUDA graph estimate off):
      Llama-3.1-8B-Instruct weights 14.99 GiB (TP 1), 7.51 (TP 2), 3.77 (TP 4), torch activation
      peak 1.89 GiB, KV cache 58.11 GiB = "GPU KV cache size: 476,016 tokens"; Qwen2.5-7B-Instruct
      weights 14.25 / 7.12 / 3.55 GiB, activation peak 2.21 GiB, 1,096,000 tokens; Mixtral-8x7B-Instruct
      at TP 2 activation peak 1.21 GiB.
- R2  "Model loading took 37.09 GiB memory": hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4 with
      awq_marlin on one RTX PRO 6000 (vLLM 0.14.0rc2), in a public AWQ Marlin crash investigation log;
      its "Available KV cache memory: 38.71 GiB" / "GPU KV cache size: 126,832 tokens" pair.
- R3  "Model loading took 18.14 GiB memory": Qwen2.5-32B-Instruct-AWQ on one 32 GB-class card, in a
      public model-size frontier write-up that also logged "Estimated CUDA graph memory: 1.59 GiB".
- R4  Llama-3.1-8B-Instruct on an A100 40GB (vLLM v0.15.1): "Available KV cache memory: 19.28 GiB",
      "GPU KV cache size: 157,936 tokens" (public GCE deployment notes, ilseokoh/vllm-gce).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from engine_role import role_defaults

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan as mp
from ansible_collections.gpufleet.serving.plugins.module_utils import _model_shape as shape

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
GIB = 2**30
H100_CUDA_TOTAL = int(79.19 * GIB)  # R1


def config(name):
    return shape.load_model_config((CONFIGS / ("%s.json" % name)).read_text())


def plan24(name, gpus=1, **pins):
    """A plan on RTX 4090-class cards: 24 GiB as nvidia-smi lists it."""
    concurrency = pins.pop("concurrency", None)
    return mp.plan_memory(
        config(name), gpus=gpus, gpu_memory_bytes=mp.usable_bytes(gib=24), pins=pins, concurrency=concurrency
    )


# ---------------------------------------------------------------- weights, activations, KV against R1-R4


@pytest.mark.parametrize(
    ("name", "tp", "published_gib", "tolerance"),
    [
        ("llama-3.1-8b-instruct", 1, 14.99, 0.002),
        ("llama-3.1-8b-instruct", 2, 7.51, 0.002),
        ("llama-3.1-8b-instruct", 4, 3.77, 0.003),
        ("qwen2.5-7b-instruct", 1, 14.25, 0.006),
        ("qwen2.5-7b-instruct", 2, 7.12, 0.006),
        ("qwen2.5-7b-instruct", 4, 3.55, 0.006),
        ("llama-3.1-70b-instruct-awq", 1, 37.09, 0.002),  # R2: AWQ 4-bit, group 128, fp16 embeddings
        ("qwen2.5-32b-instruct-awq", 1, 18.14, 0.01),  # R3
    ],
)
def test_weights_per_gpu_match_logged_model_loading(name, tp, published_gib, tolerance):
    c = config(name)
    got = shape.weights_per_gpu(c, tp, quantization=shape.quantization_of(c))["total"] / GIB
    assert abs(got - published_gib) / published_gib <= tolerance, got


def test_awq_is_about_a_quarter_of_bf16_and_not_a_flat_factor():
    awq = config("llama-3.1-70b-instruct-awq")
    bf16 = config("llama-3.1-70b-instruct")
    w_awq = shape.weights_per_gpu(awq, 1, quantization=shape.quantization_of(awq))
    w_bf16 = shape.weights_per_gpu(bf16, 1)
    # the quantized matrices shrink to 0.5195 B/param; embeddings and lm_head stay 16-bit
    assert w_awq["embedding"] == w_bf16["embedding"] and w_awq["lm_head"] == w_bf16["lm_head"]
    assert w_awq["linear"] / w_bf16["linear"] == pytest.approx((0.5 + 2 / 128 + 0.5 / 128) / 2, rel=1e-6)


def test_kv_heads_replicate_when_tp_exceeds_them():
    c = config("llama-3.1-70b-instruct")  # 8 KV heads
    w8 = shape.weights_per_gpu(c, 8)["linear"]
    w16 = shape.weights_per_gpu(c, 16)["linear"]
    # at TP 16 every rank still holds one whole K and V head: more than half the TP 8 share
    assert w16 > w8 / 2


@pytest.mark.parametrize(
    ("name", "tp", "published_gib"),
    [("llama-3.1-8b-instruct", 1, 1.89), ("llama-3.1-8b-instruct", 4, 1.89), ("qwen2.5-7b-instruct", 1, 2.21),
     ("mixtral-8x7b-instruct", 2, 1.21)],
)  # fmt: skip
def test_activation_peak_matches_the_profiled_peak(name, tp, published_gib):
    got = mp.activation_peak(config(name), tp, 8192, 1024, 2) / GIB
    assert abs(got - published_gib) / published_gib < 0.03, got


@pytest.mark.parametrize(
    ("name", "published_tokens"), [("llama-3.1-8b-instruct", 476_016), ("qwen2.5-7b-instruct", 1_096_000)]
)
def test_kv_cache_tokens_match_the_engine_on_an_h100(name, published_tokens):
    # R1's setting: gmu 0.95, the CUDA graph estimate off (v0.19's default) = no graphs in the budget.
    plan = mp.plan_memory(
        config(name),
        gpu_memory_bytes=H100_CUDA_TOTAL,
        pins={"gpu_memory_utilization": 0.95, "enforce_eager": True, "max_model_len": 8192},
    )
    assert plan["fits"]
    assert plan["max_num_batched_tokens"] == 8192 and plan["max_num_seqs"] == 1024  # vLLM's big-GPU defaults
    assert abs(plan["kv_cache_tokens"] - published_tokens) / published_tokens < 0.001, plan["kv_cache_tokens"]


def test_kv_tokens_from_the_logged_kv_memory():
    # R4 and R2: the engine's token count from its own "Available KV cache memory", in 16-token blocks
    assert shape.kv_cache_tokens(int(19.28 * GIB), 131072, 16) == 157_936
    per_token = shape.kv_bytes_per_token(config("llama-3.1-70b-instruct-awq"), 1)
    assert per_token == 327_680
    assert abs(shape.kv_cache_tokens(int(38.71 * GIB), per_token, 16) - 126_832) <= 16


def test_cuda_graph_estimate_is_in_the_published_range():
    # R3 logged 1.59 GiB for Qwen2.5-32B-AWQ at the small-GPU defaults; R1 0.84-0.91 GiB for 8B.
    c = config("qwen2.5-32b-instruct-awq")
    assert abs(mp.cudagraph_memory(c, 1, 256, 2048, 2) / GIB - 1.59) / 1.59 < 0.1
    assert 0.8 < mp.cudagraph_memory(config("llama-3.1-8b-instruct"), 1, 1024, 8192, 2) / GIB < 1.0


# ---------------------------------------------------------------- the seed setups


def test_seed_70b_awq_on_two_24gb_fits_and_warns_kv_room_is_tiny():
    plan = plan24("llama-3.1-70b-instruct-awq", gpus=2)
    assert plan["fits"] and plan["tensor_parallel_size"] == 2
    assert plan["kv_cache_bytes_per_gpu"] < 2 * GIB
    assert any("KV room is tiny" in w for w in plan["warnings"])
    assert any("tensor_parallel_size=1 is not enough" in r for r in plan["reasons"])
    # graphs would leave no room for one request: the plan runs eager and says why
    assert plan["enforce_eager"] and any(r.startswith("enforce_eager:") for r in plan["reasons"])


def test_seed_32b_awq_tp2_at_16k():
    plan = plan24("qwen2.5-32b-instruct-awq", gpus=2, tensor_parallel_size=2, max_model_len=16384)
    assert plan["fits"] and plan["max_model_len"] == 16384
    assert plan["kv_bytes_per_token_per_gpu"] == 64 * 2 * 4 * 128 * 2  # 8 KV heads split over 2 ranks
    assert plan["max_concurrency"] >= 2
    assert plan["options"]["tensor_parallel_size"] == 2 and plan["options"]["max_model_len"] == 16384


def test_seed_14b_bf16_needs_tp2():
    alone = plan24("deepseek-r1-distill-qwen-14b", gpus=1)
    assert not alone["fits"]
    assert "27.54 GiB" in alone["errors"][0] and "quantized checkpoint" in alone["errors"][0]
    pair = plan24("deepseek-r1-distill-qwen-14b", gpus=2)
    assert pair["fits"] and pair["tensor_parallel_size"] == 2


def test_seed_14b_awq_on_one_24gb_at_8k_with_32_sequences():
    plan = plan24("qwen2.5-14b-instruct-awq", max_model_len=8192, max_num_seqs=32)
    assert plan["fits"] and plan["max_model_len"] == 8192 and plan["options"]["max_num_seqs"] == 32
    assert 5 < plan["max_concurrency"] < 32
    assert any(
        w.startswith("32 requests at max_model_len=8192") and "kv_cache_dtype fp8" in w for w in plan["warnings"]
    )
    fp8 = plan24("qwen2.5-14b-instruct-awq", max_model_len=8192, max_num_seqs=32, kv_cache_dtype="fp8")
    assert fp8["kv_cache_tokens"] >= 2 * plan["kv_cache_tokens"] - 16


# ---------------------------------------------------------------- rules and choices


def test_smallest_tp_meeting_the_target_and_context_from_the_room():
    plan = mp.plan_memory(config("llama-3.1-70b-instruct"), gpus=8, gpu_memory_bytes=mp.usable_bytes(gib=80))
    assert plan["tensor_parallel_size"] == 4  # TP 2 fits the weights but not 8 requests of 8k
    assert plan["max_concurrency"] >= 8 and plan["max_model_len"] > 8192
    assert plan["max_model_len"] % 16 == 0


def test_model_limit_caps_the_chosen_context():
    plan = mp.plan_memory(config("mixtral-8x7b-instruct"), gpus=2, gpu_memory_bytes=mp.usable_bytes(gib=80))
    assert plan["max_model_len"] == 32768 and any("the model's limit" in r for r in plan["reasons"])


@pytest.mark.parametrize(
    ("name", "pins", "words"),
    [
        ("llama-3.1-8b-instruct", {"tensor_parallel_size": 3}, ["tensor_parallel_size=3", "32 attention heads"]),
        ("llama-3.1-8b-instruct", {"max_model_len": 200000}, ["max_model_len=200000", "131072", "rope_scaling"]),
        ("llama-3.1-8b-instruct", {"max_model_len": 131072}, ["one request at max_model_len=131072", "longest"]),
        ("llama-3.1-8b-instruct", {"quantization": "awq"}, ["quantization=awq", "no quantization_config"]),
        ("qwen2.5-32b-instruct-awq", {"quantization": "none"}, ["quantization=none", "quant_method=awq"]),
        ("qwen2.5-32b-instruct-awq", {"quantization": "fp8"}, ["quantization=fp8", "already quantized"]),
        ("llama-3.1-8b-instruct", {"tensor_parallel_size": 2}, ["needs 2 GPUs"]),
    ],
)  # fmt: skip
def test_refusals_name_the_value_and_the_fix(name, pins, words):
    plan = plan24(name, **pins)
    assert not plan["fits"] and plan["options"] == {}
    text = " ".join(plan["errors"])
    for word in words:
        assert word in text, text


def test_utilization_too_high_for_nccl_is_refused():
    plan = plan24("llama-3.1-8b-instruct", gpus=2, tensor_parallel_size=2, gpu_memory_utilization=0.99)
    assert not plan["fits"]
    assert any("gpu_memory_utilization=0.99" in e and "Free memory on device" in e for e in plan["errors"])


def test_rope_scaling_pin_allows_a_longer_context():
    c = config("qwen2.5-7b-instruct")
    assert mp.model_max_len(c) == 32768
    assert mp.model_max_len(c, {"factor": 4.0, "original_max_position_embeddings": 32768}) == 131072


def test_mla_cache_is_not_split_by_tp():
    plan = mp.plan_memory(config("deepseek-v3"), gpus=8, gpu_memory_bytes=mp.usable_bytes(gib=141))
    assert plan["fits"] and plan["tensor_parallel_size"] == 8
    assert plan["kv_bytes_per_token_per_gpu"] == 61 * (512 + 64) * 2
    assert plan["quantization"] == "fp8"


def test_sglang_plan_uses_sglang_options_and_token_pages():
    plan = mp.plan_memory(
        config("qwen2.5-14b-instruct-awq"),
        gpu_memory_bytes=mp.usable_bytes(gib=24),
        engine="sglang",
        pins={"context_length": 8192},
    )
    assert plan["fits"] and plan["block_size"] == 1
    assert set(plan["options"]) >= {"context_length", "mem_fraction_static", "chunked_prefill_size"}
    assert "max_model_len" not in plan["options"] and "gpu_memory_utilization" not in plan["options"]
    args = plan["engine_args"]
    assert args["--context-length"] == 8192 and "--mem-fraction-static" in args
    assert "--max-model-len" not in args and "--gpu-memory-utilization" not in args


def test_cpu_plan_is_the_kv_space_in_128_token_blocks():
    tiny = {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float32",
    }
    plan = mp.plan_memory(tiny, accelerator="cpu", kv_space_bytes=GIB, pins={"max_model_len": 2048})
    per_token = 4 * 2 * 2 * 64 * 4
    assert plan["kv_bytes_per_token_per_gpu"] == per_token
    assert plan["kv_cache_tokens"] == GIB // (per_token * 128) * 128
    refused = mp.plan_memory(tiny, accelerator="cpu", kv_space_bytes=2**20, pins={"max_model_len": 4096})
    assert not refused["fits"] and "kv_cache_space_gib" in refused["errors"][0]


# ---------------------------------------------------------------- the filter and the engine role's preflight


def test_memory_plan_filter_returns_engine_flags():
    from ansible_collections.gpufleet.serving.plugins.filter.memory_plan import memory_plan

    text = (CONFIGS / "deepseek-r1-distill-qwen-14b.json").read_text()
    plan = memory_plan(text, gpus=2, gpu_memory_mib=24564)
    assert plan["engine_args"]["--tensor-parallel-size"] == 2
    assert plan["engine_args"]["--max-model-len"] == plan["max_model_len"]


def _facts(mib=24564, count=2):
    return {"count": count, "devices": [{"index": i, "name": "NVIDIA GeForce RTX 4090", "memory_total_mib": mib}
                                        for i in range(count)]}  # fmt: skip


def test_engine_preflight_takes_planned_values_for_unpinned_options():
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan

    models = {"/m/14b": {"exists": True, "config": (CONFIGS / "deepseek-r1-distill-qwen-14b.json").read_text()}}
    inst = {"name": "r1", "engine": "vllm", "model": "/m/14b", "port": 8000, "gpus": [0, 1], "max_num_seqs": 16}
    out = plan([inst], gpu=_facts(), models=models, defaults=role_defaults())
    assert out["errors"] == []
    args = out["instances"][0]["engine_args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--max-num-seqs") + 1] == "16"  # pinned: kept
    assert "--max-model-len" in args and "--gpu-memory-utilization" in args  # planned
    assert any(line.startswith("KV cache:") for line in out["instances"][0]["memory_plan"])


def test_engine_preflight_refuses_what_will_not_fit_before_any_change():
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan

    models = {"/m/14b": {"exists": True, "config": (CONFIGS / "deepseek-r1-distill-qwen-14b.json").read_text()}}
    inst = {"name": "r1", "engine": "vllm", "model": "/m/14b", "port": 8000, "gpus": [0]}
    out = plan([inst], gpu=_facts(), models=models, defaults=role_defaults())
    assert out["instances"] == []
    assert out["errors"][0].startswith("gpufleet_engines[0] (r1) (memory plan): TP=1: the weights (27.54 GiB")


# ---------------------------------------------------------------- the CLI


def _cli(capsys, *argv):
    from gpufleet.cli import main

    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_fields_and_exit_status(capsys):
    model = str(CONFIGS / "qwen2.5-14b-instruct-awq.json")
    rc, out, _ = _cli(capsys, "--model", model, "--gpu-memory-gib", "24", "--max-model-len", "8192",
                      "--max-num-seqs", "32", "--json")  # fmt: skip
    plan = json.loads(out)
    assert rc == 0
    for key in ("tensor_parallel_size", "weights_bytes_per_gpu", "kv_bytes_per_token_per_gpu", "kv_cache_tokens",
                "max_model_len", "max_concurrency", "fits", "errors", "warnings", "engine_args"):  # fmt: skip
        assert key in plan, key
    assert plan["engine_args"]["--max-num-seqs"] == 32
    assert plan["max_concurrency"] == pytest.approx(plan["kv_cache_tokens"] / 8192, abs=0.01)
    rc, out, _ = _cli(capsys, "--model", str(CONFIGS / "deepseek-r1-distill-qwen-14b.json"), "--gpu-memory-gib", "24",
                      "--json")  # fmt: skip
    assert rc == 2 and json.loads(out)["fits"] is False


def test_cli_table_has_a_bar_per_gpu(capsys):
    rc, out, _ = _cli(capsys, "--model", str(CONFIGS / "llama-3.1-8b-instruct.json"), "--gpu-memory-gib", "24")
    assert rc == 0
    bar = next(line for line in out.splitlines() if line.startswith("per GPU"))
    assert bar.count("W") > bar.count("K") > 0 and "engine args  --tensor-parallel-size 1" in out


def test_cli_unreadable_input_exits_1(capsys, tmp_path):
    rc, _, err = _cli(capsys, "--model", str(tmp_path), "--gpu-memory-gib", "24")
    assert rc == 1 and "config.json" in err
    (tmp_path / "config.json").write_text("{not json")
    rc, _, err = _cli(capsys, "--model", str(tmp_path), "--gpu-memory-gib", "24")
    assert rc == 1 and "not valid JSON" in err
    rc, _, err = _cli(capsys, "--model", str(CONFIGS / "llama-3.1-8b-instruct.json"))
    assert rc == 1 and "--gpu-memory-gib" in err


def test_cli_refusal_prints_the_table_and_exits_2(capsys):
    rc, out, _ = _cli(capsys, "--model", str(CONFIGS / "llama-3.1-8b-instruct.json"), "--gpu-memory-gib", "24",
                      "--gpus", "4", "--tensor-parallel-size", "3")  # fmt: skip
    assert rc == 2
    assert "fits       NO" in out and "tensor_parallel_size=3 does not divide the model's 32 attention heads" in out


def test_awq_and_gptq_run_in_float16_unless_pinned():
    # an AWQ checkpoint whose config.json says bfloat16 (AutoAWQ writes float16; some exports do not)
    awq = dict(config("qwen2.5-32b-instruct-awq"), torch_dtype="bfloat16")
    quant = shape.quantization_of(awq)
    assert quant["method"] == "awq"
    assert shape.weight_dtype(awq, quant) == "float16"
    assert shape.weight_dtype(awq, quant, "auto") == "float16"  # 'auto' is no pin
    assert shape.weight_dtype(awq, quant, "bfloat16") == "bfloat16"
    dense = config("llama-3.1-8b-instruct")
    assert shape.weight_dtype(dense, shape.quantization_of(dense)) == "bfloat16"
    # the plan follows the same rule, also when an instance pins dtype auto
    for pins in ({}, {"dtype": "auto"}):
        got = mp.plan_memory(awq, gpus=2, gpu_memory_bytes=mp.usable_bytes(gib=24), pins=pins)
        assert got["model"]["dtype"] == "float16" and got["dtype"] == "float16", pins
    # vLLM runs a float32 checkpoint in bfloat16 on a GPU, in float32 on a CPU
    f32 = dict(dense, torch_dtype="float32")
    assert shape.weight_dtype(f32, on_gpu=True) == "bfloat16" and shape.weight_dtype(f32) == "float32"


@pytest.mark.parametrize(
    "case",
    [
        dict(gpus=1, gpu_memory_bytes=24 * GIB),  # does not fit: no room for the KV cache
        dict(gpus=2, gpu_memory_bytes=80 * GIB),  # fits
        dict(gpus=2, gpu_memory_bytes=24 * GIB, engine="sglang"),
        dict(accelerator="cpu", kv_space_bytes=4 * GIB),
        dict(gpus=1, gpu_memory_bytes=24 * GIB, pins={"tensor_parallel_size": 3}),  # refused before any budget
        dict(gpus=1, gpu_memory_bytes=24 * GIB, pins={"max_model_len": 10**7}),  # refused: above the limit
    ],
    ids=["no-kv-room", "fits", "sglang", "cpu", "refused-tp", "refused-len"],
)
def test_every_plan_has_one_shape(case):
    root = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
    config = shape.load_model_config((root / "llama-3.1-70b-instruct-awq.json").read_text())
    plan = mp.plan_memory(config, **case)
    assert sorted(plan) == sorted(mp.PLAN_KEYS)  # every key, always; None where it does not apply
    assert plan["accelerator"] == case.get("accelerator", "nvidia")
    assert isinstance(plan["fits"], bool) and isinstance(plan["errors"], list)
    json.dumps(plan)  # what `gpufleet plan --json` prints


def test_the_plan_keys_are_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "memory-plan.md").read_text()
    table = doc[doc.index("## The plan's keys") :]
    assert [k for k in mp.PLAN_KEYS if "| `%s` |" % k not in table] == []


def test_the_bar_shows_what_overflows_the_gpu_instead_of_clipping_it():
    from ansible_collections.gpufleet.serving.plugins.module_utils._plan_text import BAR_WIDTH, plan_lines

    root = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
    config = shape.load_model_config((root / "llama-3.1-70b-instruct.json").read_text())
    plan = mp.plan_memory(config, gpus=1, gpu_memory_bytes=24 * GIB)  # 131 GiB of weights on one 24 GiB GPU
    (line,) = [x for x in plan_lines(plan, detail=True) if x.startswith("per GPU    [")]
    bar = line[line.index("[") + 1 : line.index("]")]
    assert len(bar) == BAR_WIDTH + 1 and bar.count("|") == 1
    edge = bar.index("|")
    assert 0 < edge < BAR_WIDTH // 4  # 24 of about 130 GiB: the GPU ends early in the bar
    assert set(bar[edge + 1 :]) - {"."} and "short by" in line  # the weights past the GPU's end are drawn
    # one word and one figure for what is missing: the bar's is the error's (issue 33 saw "over by 4.97 GiB"
    # beside "short by 6.07 GiB")
    figure = re.search(r"short by ([0-9.]+) GiB", line).group(1)
    assert "short by %s GiB" % figure in plan["errors"][0]
    fits = mp.plan_memory(config, gpus=8, gpu_memory_bytes=80 * GIB)
    (line,) = [x for x in plan_lines(fits, detail=True) if x.startswith("per GPU    [")]
    assert "|" not in line and "short by" not in line


def test_what_would_fit_leaves_out_what_serves_no_useful_context():
    # Qwen2.5-7B on one 11.5 GiB GPU: FP8 weights fit, with 208 KV tokens (max_model_len 208): no request of use
    root = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
    config = shape.load_model_config((root / "qwen2.5-7b-instruct.json").read_text())
    plan = mp.plan_memory(config, gpus=1, gpu_memory_bytes=int(11.5 * GIB))
    fix = plan["errors"][-1]
    assert fix.startswith("What would fit: 2 nodes of 1 GPUs") and "quantization fp8" not in fix
    assert min(int(n) for n in re.findall(r"max_model_len (\d+)", fix)) >= mp.USEFUL_CONTEXT
    # a context pinned shorter is the user's own: what fits at it is offered
    pinned = mp.plan_memory(config, gpus=1, gpu_memory_bytes=int(11.5 * GIB), pins={"max_model_len": 2048})
    assert pinned["errors"][-1].startswith("What would fit: ")
    # the same way with a useful context is still offered (11 GiB: FP8 weights, 7984 tokens)
    assert "quantization fp8 on 1 node" in mp.plan_memory(config, gpus=1, gpu_memory_bytes=11 * GIB)["errors"][-1]


def test_when_nothing_fits_the_plan_is_the_layout_closest_to_fitting():
    # DeepSeek-V3 on 8 x 24 GiB: no TP fits; the plan reports TP=8 (short by the least per GPU),
    # not TP=1's shortfall as "the size of 8 GPUs"
    root = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
    config = shape.load_model_config((root / "deepseek-v3.json").read_text())
    plan = mp.plan_memory(config, gpus=8, gpu_memory_bytes=24 * GIB)
    assert not plan["fits"] and plan["tensor_parallel_size"] == 8
    short = {
        tp: mp.plan_memory(config, gpus=8, gpu_memory_bytes=24 * GIB, pins={"tensor_parallel_size": tp})[
            "shortfall_bytes_per_gpu"
        ]
        for tp in (1, 2, 4, 8)
    }
    assert plan["shortfall_bytes_per_gpu"] == min(short.values()) == short[8] < short[1]
    assert plan["errors"][0].startswith("TP=8: ")
