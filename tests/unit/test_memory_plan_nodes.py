"""The memory plan across nodes: tensor parallel within a node, pipeline parallel across nodes.

The cases (GitHub issue 19): Llama 3.1 405B in bf16 and DeepSeek V3 (its FP8 checkpoint) on
nodes of 8 x 80 GiB, and DeepSeek V3 on one node of 8 x 141 GiB (H200). The stage split is
vLLM's (vllm/distributed/utils.py get_pp_indices); the world-size rules are vLLM's
(vllm/config/parallel.py, nnodes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan as mp
from ansible_collections.gpufleet.serving.plugins.module_utils import _model_shape as shape

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
H100 = mp.usable_bytes(gib=80)
H200 = mp.usable_bytes(gib=141)


def config(name):
    return shape.load_model_config((CONFIGS / ("%s.json" % name)).read_text())


def plan(name, nodes, gpu_memory_bytes=H100, gpus=8, **pins):
    return mp.plan_memory(config(name), gpus=gpus, nodes=nodes, gpu_memory_bytes=gpu_memory_bytes, pins=pins)


# ---------------------------------------------------------------- Llama 3.1 405B (bf16)


def test_405b_fits_on_two_nodes_with_tp_8_and_pp_2():
    p = plan("llama-3.1-405b-instruct", nodes=2)
    assert p["fits"], p["errors"]
    assert (p["tensor_parallel_size"], p["pipeline_parallel_size"], p["nodes"]) == (8, 2, 2)
    assert p["pipeline_stage_layers"] == [63, 63]
    # By hand, the last stage (63 layers, lm_head, final norm), one of 8 TP ranks:
    #   per layer: q, o 2 x 16384^2 + k, v 2 x 16384 x 1024 + MLP 3 x 16384 x 53248 = 3,187,671,040
    #   63 layers / 8 ranks x 2 B                                               = 50,205,818,880
    #   norms (2 per layer + the final one) 2,080,768 x 2 B, whole on every rank =      4,161,536
    #   lm_head 128,256 / 8 x 16384 x 2 B                                        =    525,336,576
    #   rotary cache 131,072 x 128 x 2 B                                         =     33,554,432
    #   total                                                                    = 50,768,871,424 (47.28 GiB)
    # against 405.85e9 parameters x 2 B / 16 = 50.73e9 for an even split
    assert p["weights_bytes_per_gpu"] == pytest.approx(50_768_871_424, rel=1e-6)
    assert 405.8e9 * 2 / 16 < p["weights_bytes_per_gpu"] < 405.9e9 * 2 / 16 + 0.6e9
    # one KV head per rank (8 over TP 8), 63 layers: K and V of 128 in bf16
    assert p["kv_bytes_per_token_per_gpu"] == 63 * 2 * 1 * 128 * 2
    assert p["engine_args"]["--tensor-parallel-size"] == 8 and p["engine_args"]["--pipeline-parallel-size"] == 2
    assert p["options"]["pipeline_parallel_size"] == 2


def test_405b_on_one_node_is_refused_and_names_two_nodes():
    p = plan("llama-3.1-405b-instruct", nodes=1)
    assert not p["fits"] and p["nodes"] == 1 and p["pipeline_parallel_size"] == 1
    fix = p["errors"][-1]
    assert fix.startswith("What would fit: ") and "2 nodes of 8 GPUs (TP 8 x PP 2" in fix
    assert "quantization fp8 on 1 node" in fix  # 405B in FP8 is ~406 GB: fits 8 x 80 GiB
    assert "tensor_parallel_size=1" not in fix


# ---------------------------------------------------------------- DeepSeek V3 (FP8 checkpoint, MLA)


def test_deepseek_v3_on_two_nodes_of_80_gib():
    p = plan("deepseek-v3", nodes=2)
    assert p["fits"], p["errors"]
    assert (p["tensor_parallel_size"], p["pipeline_parallel_size"]) == (8, 2)
    assert p["pipeline_stage_layers"] == [31, 30]  # 61 layers: the remainder goes to the first stage
    # MLA's latent (512 + 64) in bf16, not split by TP; the stage with the fewest KV tokens decides
    assert p["kv_bytes_per_token_per_gpu"] in (31 * 576 * 2, 30 * 576 * 2)


def test_deepseek_v3_on_one_node_of_141_gib_and_refused_on_80():
    h200 = plan("deepseek-v3", nodes=1, gpu_memory_bytes=H200)
    assert h200["fits"] and h200["tensor_parallel_size"] == 8 and h200["pipeline_parallel_size"] == 1
    h100 = plan("deepseek-v3", nodes=1)
    assert not h100["fits"]
    assert "2 nodes" in h100["errors"][-1] and "quantization fp8" not in h100["errors"][-1]  # already FP8


# ---------------------------------------------------------------- the rules


def test_tensor_parallel_across_nodes_is_refused_unless_pinned():
    refused = plan("llama-3.1-405b-instruct", nodes=2, tensor_parallel_size=16)
    assert not refused["fits"] and len(refused["errors"]) == 1
    (error,) = refused["errors"]
    assert "tensor_parallel_size=16" in error and "all-reduce would cross the network" in error
    assert "at most 8" in error and "pipeline_parallel_size=2" in error and "cross_node_tensor_parallel" in error
    allowed = plan("llama-3.1-405b-instruct", nodes=2, tensor_parallel_size=16, cross_node_tensor_parallel=True)
    assert allowed["fits"], allowed["errors"]
    assert (allowed["tensor_parallel_size"], allowed["pipeline_parallel_size"]) == (16, 1)
    assert any("spans 2 nodes" in r for r in allowed["reasons"])
    assert "--pipeline-parallel-size" not in allowed["engine_args"]


def test_a_pinned_pipeline_size_is_honoured_and_checked():
    four = plan("llama-3.1-405b-instruct", nodes=2, pipeline_parallel_size=4)
    assert four["fits"] and four["pipeline_parallel_size"] == 4 and four["tensor_parallel_size"] <= 4
    too_many = plan("llama-3.1-405b-instruct", nodes=2, pipeline_parallel_size=127)
    assert not too_many["fits"] and "more than the model's 126 hidden layers" in too_many["errors"][0]
    odd = plan("llama-3.1-405b-instruct", nodes=2, pipeline_parallel_size=3)  # TP would span the nodes
    assert not odd["fits"] and "cross_node_tensor_parallel" in odd["errors"][0]


@pytest.mark.parametrize(
    ("layers", "pp", "stages"),
    [
        (126, 2, [63, 63]),
        (126, 4, [31, 32, 32, 31]),  # remainder 2: the middle stages, not the first or last
        (127, 4, [32, 32, 32, 31]),  # remainder 3: every stage but the last
        (61, 2, [31, 30]),
        (4, 4, [1, 1, 1, 1]),
    ],
)
def test_stage_split_is_vllms(layers, pp, stages):
    assert shape.pp_stage_layers(layers, pp) == stages


def test_pp_more_than_layers_is_refused_by_the_split():
    with pytest.raises(shape.ModelConfigError):
        shape.pp_stage_layers(4, 5)


def test_stages_add_up_to_the_whole_model():
    c = config("deepseek-v3")
    whole = shape.parameter_groups(c)
    parts = [shape.parameter_groups(c, 4, s) for s in range(4)]
    for key in ("linear", "other", "embedding", "lm_head"):
        assert sum(p[key] for p in parts) == whole[key], key
    assert parts[0]["embedding"] and not parts[0]["lm_head"] and parts[3]["lm_head"] and not parts[3]["embedding"]


def test_a_tied_lm_head_is_its_own_copy_on_the_last_stage():
    tied = dict(config("llama-3.1-8b-instruct"), tie_word_embeddings=True)
    first, last = shape.parameter_groups(tied, 2, 0), shape.parameter_groups(tied, 2, 1)
    assert first["embedding"] == last["embedding"] == 128256 * 4096 and first["lm_head"] == last["lm_head"] == 0
    assert shape.parameter_groups(tied)["embedding"] == 128256 * 4096  # one copy without PP


# ---------------------------------------------------------------- CPU (vLLM's CPU build)

TINY = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}  # fmt: skip


def test_cpu_tensor_parallel_across_two_nodes_halves_kv_per_rank():
    one = mp.plan_memory(TINY, accelerator="cpu", kv_space_bytes=2**30)
    two = mp.plan_memory(
        TINY,
        accelerator="cpu",
        kv_space_bytes=2**30,
        nodes=2,
        pins={"tensor_parallel_size": 2, "cross_node_tensor_parallel": True},
    )
    assert two["fits"] and (two["tensor_parallel_size"], two["pipeline_parallel_size"], two["nodes"]) == (2, 1, 2)
    assert two["kv_bytes_per_token_per_gpu"] * 2 == one["kv_bytes_per_token_per_gpu"] == 4 * 2 * 2 * 64 * 4
    assert two["kv_cache_tokens"] == 2 * one["kv_cache_tokens"]  # the same space on each rank
    refused = mp.plan_memory(
        TINY,
        accelerator="cpu",
        kv_space_bytes=2**30,
        nodes=2,
        pins={"tensor_parallel_size": 2, "pipeline_parallel_size": 1},
    )
    assert not refused["fits"] and "cross_node_tensor_parallel" in refused["errors"][0]
    assert sorted(refused) == sorted(mp.PLAN_KEYS)


# ---------------------------------------------------------------- every case has every key, the CLI


@pytest.mark.parametrize(
    "case",
    [
        dict(nodes=2),
        dict(nodes=1),
        dict(nodes=2, pins={"tensor_parallel_size": 16}),
        dict(nodes=2, pins={"pipeline_parallel_size": 200}),
    ],
    ids=["fits", "refused-memory", "refused-cross-node", "refused-pp"],
)
def test_every_multi_node_plan_has_one_shape(case):
    p = mp.plan_memory(config("llama-3.1-405b-instruct"), gpus=8, gpu_memory_bytes=H100, **case)
    assert sorted(p) == sorted(mp.PLAN_KEYS) and p["nodes"] == case["nodes"]
    json.dumps(p)


def _cli(capsys, *argv):
    from gpufleet.cli import main

    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_nodes(capsys):
    model = str(CONFIGS / "llama-3.1-405b-instruct.json")
    rc, out, _ = _cli(capsys, "--nodes", "2", "--gpus", "8", "--gpu-memory-gib", "80", "--model", model, "--json")
    p = json.loads(out)
    assert rc == 0 and p["nodes"] == 2 and p["pipeline_parallel_size"] == 2 and p["pipeline_stage_layers"] == [63, 63]
    rc, out, _ = _cli(capsys, "--nodes", "2", "--gpus", "8", "--gpu-memory-gib", "80", "--model", model)
    assert rc == 0 and "2 nodes x 8 GPUs x 79.50 GiB usable, engine vllm, TP 8 x PP 2, stages of 63/63 layers" in out
    rc, out, _ = _cli(capsys, "--gpus", "8", "--gpu-memory-gib", "80", "--model", model)
    assert rc == 2 and "2 nodes of 8 GPUs" in out
    rc, _, err = _cli(capsys, "--nodes", "0", "--gpu-memory-gib", "80", "--model", model)
    assert rc == 1 and "--nodes=0 must be from 1" in err
    rc, out, _ = _cli(capsys, "--nodes", "2", "--gpus", "8", "--gpu-memory-gib", "80", "--model", model,
                      "--tensor-parallel-size", "16", "--cross-node-tensor-parallel", "--json")  # fmt: skip
    assert rc == 0 and json.loads(out)["tensor_parallel_size"] == 16
