# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory plan (private to gpufleet.serving): what fits on a GPU, and the engine
settings that make it fit. Pure Python, no torch.

One implementation behind `gpufleet plan`, the memory_plan filter and the engine role's
preflight. It combines the model arithmetic of _model_shape.py into the budget the engines
themselves compute at startup, then chooses the settings the user did not pin:

vLLM (V1 engine, vllm/v1/worker/gpu_worker.py determine_available_memory, v0.21+):
    KV cache = total x gpu_memory_utilization
               - weights - activation peak of the profile run - non-torch growth
               - CUDA graph memory (estimated during profiling, on by default since v0.21)
    The CUDA context and the NCCL/custom all-reduce buffers are created before vLLM's
    baseline snapshot, so they must fit in the (1 - gpu_memory_utilization) left outside:
    vLLM refuses to start when free memory is below total x gpu_memory_utilization.
SGLang (python/sglang/srt/model_executor/model_runner.py profile_max_num_token):
    KV pool = free memory after loading the weights - total x (1 - mem_fraction_static);
    activations and CUDA graphs run in the (1 - mem_fraction_static) part.
vLLM on CPU: the KV cache is VLLM_CPU_KVCACHE_SPACE, nothing else is budgeted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils import _model_shape as shape
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    ENGINE_INFO,
    OPTIONS,
    engine_flags,
    option_for,
    plan_pins,
)

GIB = 2**30
MIB = 2**20

# ---------------------------------------------------------------- constants, each with its source
#
# vLLM defaults (vllm/engine/arg_utils.py get_batch_defaults, OpenAI server): GPUs with at
# least 70 GiB that are not A100 get max_num_batched_tokens 8192 and max_num_seqs 1024;
# others 2048 and 256. gpu_memory_utilization 0.9 (vllm/config/cache.py).
VLLM_BIG_GPU_GIB = 70
VLLM_DEFAULTS_BIG = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
VLLM_DEFAULTS_SMALL = {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
VLLM_DEFAULT_UTILIZATION = 0.9
# Block (page) sizes: vLLM on CUDA 16 tokens (vllm/platforms/cuda.py), on CPU 128 (measured in
# the lab: tests/labtests/test_kv_cache_vs_engine.py); SGLang pages of 1 token by default.
BLOCK_SIZE = {("vllm", "nvidia"): 16, ("vllm", "cpu"): 128, ("sglang", "nvidia"): 1}
# What the driver keeps back from the memory nvidia-smi lists as memory.total: CUDA reports
# 79.19 GiB on an H100 80GB HBM3 (81,559 MiB in nvidia-smi; llm-d-planner's v0.19 accuracy
# report), 23.58 GiB on an RTX 3090 (24,576 MiB; vllm-project/vllm#10517): 430-470 MiB.
DRIVER_RESERVED = 512 * MIB
# Memory in use before vLLM's baseline snapshot on one GPU, outside its budget: the CUDA
# context and allocator state. "Free memory on device (78.57/79.18 GiB) on startup" for
# Llama-3.1-8B on an H100 (llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md).
CUDA_CONTEXT = 640 * MIB
# NCCL, vLLM's custom all-reduce buffers and their graph registrations per rank when TP > 1:
# non-torch memory 2.07 GiB at TP 2 and 2.13-2.17 GiB at TP 4 against 0.25-0.27 GiB at TP 1
# (Llama-3.1-8B, Qwen2.5-7B, Mixtral on H100, vLLM v0.19, llm-d-planner accuracy report).
# Newer vLLM creates them before its snapshot (outside the budget); the plan keeps room for
# them outside either way, which only errs towards a smaller KV cache on older releases.
NCCL_BASE = 1792 * MIB
NCCL_PER_PEER = 48 * MIB
# The pipeline-parallel group's NCCL communicator (send/recv with the neighbour stages, over the
# network between nodes) on every rank when PP > 1. An estimate, not a measurement: NCCL's
# default 4 MiB buffer (NCCL_BUFFSIZE) per channel and peer, up to 32 channels to each of the two
# neighbours (256 MiB), doubled for the communicator's own state and proxy buffers.
NCCL_PP = 512 * MIB
# A stage after the first receives the previous stage's hidden states and residual in persistent
# buffers of max_num_batched_tokens x hidden each (vLLM v1 gpu_model_runner.py _dummy_run:
# make_empty_intermediate_tensors, allocated in the profile run, so inside vLLM's budget). The
# plan counts them with that stage's activations.
PP_INTERMEDIATE_TENSORS = 2
# Non-torch memory that grows during vLLM's profile run on one GPU (cuBLAS workspaces, the
# attention backend's buffers): 0.25 GiB in the same report ("non-torch forward increase").
NON_TORCH_FORWARD = 256 * MIB
# Safety margin kept free on every GPU beyond what the plan counts.
MARGIN = GIB
# Upper bound on the chosen gpu_memory_utilization / mem_fraction_static.
MAX_UTILIZATION = 0.95
# The sampler's dummy run at profiling: float32 logits for max_num_seqs requests over the whole
# vocabulary plus the top-k/top-p work on them. 15 bytes per logit reproduces the activation
# peak vLLM v0.19 measured on an H100 with 1024 sequences: 1.89 GiB for Llama-3.1-8B (vocab
# 128,256), 2.21 GiB for Qwen2.5-7B (152,064), the same at TP 1, 2 and 4 (llm-d-planner report).
SAMPLER_BYTES_PER_LOGIT = 15
# CUDA graphs: vLLM captures sizes 1, 2, 4, 8..248 step 8, 256..max step 16 with max =
# min(2 x max_num_seqs, 512) (--max-cudagraph-capture-size, vllm/config/compilation.py), in
# FULL_AND_PIECEWISE mode (two graphs per size). The pool holds the activations of the largest
# captured batch; each graph adds a per-layer cost. 240 KiB per layer and graph with a 128 MiB
# base gives 0.92 GiB for Llama-3.1-8B with 1024 sequences: the report measured pools of
# 0.51-1.85 GiB (mean 1.04) on H100s and logged "CUDA graph pool memory: 0.91 GiB (actual),
# 0.84 GiB (estimated)".
GRAPH_BASE = 128 * MIB
GRAPH_PER_LAYER_PER_GRAPH = 240 * 1024
# SGLang defaults by GPU memory (python/sglang/srt/server_args.py _handle_gpu_memory_settings,
# sgl-project/sglang#10975): (below GiB, chunked_prefill_size, cuda_graph_max_bs for TP < 4, TP >= 4).
SGLANG_BY_MEMORY = (
    (20, 2048, 8, 8),
    (35, 2048, 24, 80),
    (60, 4096, 32, 160),
    (90, 8192, 256, 512),
    (160, 8192, 256, 512),
    (10**9, 16384, 512, 512),
)
# The target concurrency when neither max_num_seqs nor concurrency is given: how many
# requests at full context the plan keeps room for when it chooses max_model_len.
DEFAULT_CONCURRENCY = 8
# The context the plan will not shrink below when it chooses max_model_len itself (capped
# by the model): shorter than 8k is of little use for chat and RAG endpoints.
MIN_CONTEXT = 8192
# The shortest context a suggestion may offer (gpufleet plan's "what would fit"): below it a
# plan fits but serves no real request (issue 33: "max_model_len 208" for a 7B on 12 GiB).
USEFUL_CONTEXT = 4096

# What a plan can be pinned with: every engine option the plan knows (either engine's name
# of it: _engine_options.OPTIONS, those with a plan_key), and these, which only the planner reads.
# cross_node_tensor_parallel: true lets tensor parallelism span nodes (refused otherwise).
# tensor_parallel_from_gpus: true says the tensor_parallel_size pin is the instance's GPUs
# (_engine_plan.plan_for), not the user's: the fixes then say "more GPUs", not "raise TP".
PLANNER_PINS = ("rope_scaling", "cross_node_tensor_parallel", "tensor_parallel_from_gpus")
# Pin values only the planner takes: quantization none (refuse a quantized checkpoint).
PLANNER_CHOICES = {"quantization": ("none",)}


class PlanInputError(ValueError):
    """Input the planner cannot read (config.json, sizes): exit status 1 in the CLI."""


def _gib(n):
    return "%.2f GiB" % (n / GIB)


def model_max_len(config, rope_scaling=None):
    """The longest context the checkpoint supports: max_position_embeddings (vLLM's
    _get_and_verify_max_len reads it; Llama 3.1 and Qwen2.5 already state their scaled
    length there). A pinned rope_scaling {factor, original_max_position_embeddings} extends
    it, which is how vLLM accepts a longer max_model_len (--hf-overrides)."""
    config = shape.text_config(config)
    limit = config.get("max_position_embeddings") or config.get("max_sequence_length") or config.get("seq_length")
    if not isinstance(limit, int) or limit <= 0:
        raise PlanInputError("config.json has no max_position_embeddings")
    if isinstance(rope_scaling, dict) and rope_scaling.get("factor"):
        base = int(rope_scaling.get("original_max_position_embeddings") or limit)
        limit = max(limit, int(base * float(rope_scaling["factor"])))
    return int(limit)


def activation_peak(config, tensor_parallel_size, tokens, seqs, dtype_bytes):
    """Peak torch memory of vLLM's profile run above the weights, per GPU: the larger of
    the forward pass over `tokens` tokens and the sampler's run over `seqs` requests (the
    forward's activations are freed before the sampler runs; its hidden states stay).

    Forward (gpu_model_runner.py _dummy_run): at a dense MLP the residual and hidden states
    [T, H] live beside gate_up [T, 2I/TP] and its activation [T, I/TP]. A fused MoE layer
    holds three intermediate caches [T, top_k, 2N/TP], [T*top_k, N/TP], [T, top_k, H]
    (fused_moe.py) beside the router's and the residual's tensors; 7 H per token for those
    reproduces the 1.21 GiB measured for Mixtral 8x7B at TP 2 (llm-d-planner report, v0.19).
    Sampler (_dummy_sampler_run): SAMPLER_BYTES_PER_LOGIT per logit of [S, padded vocab].
    """
    config = shape.text_config(config)
    tp = int(tensor_parallel_size)
    hidden = int(config["hidden_size"])
    vocab = shape.padded_vocab(config["vocab_size"])
    moe = shape.moe_shape(config)
    dense = 2 * hidden + 3 * int(config.get("intermediate_size") or 0) // tp
    if moe:
        top_k = int(config.get("num_experts_per_tok") or 2)
        per_token = top_k * (3 * moe[1] // tp + hidden) + 7 * hidden
        if moe[3]:  # dense leading layers (DeepSeek V3): their MLP may be the larger one
            per_token = max(per_token, dense)
    else:
        per_token = dense
    forward = int(tokens) * per_token * dtype_bytes
    sampled = min(int(seqs), int(tokens))
    sampler = sampled * vocab * SAMPLER_BYTES_PER_LOGIT + int(tokens) * hidden * dtype_bytes
    return max(forward, sampler)


def capture_sizes(max_num_seqs, max_num_batched_tokens):
    """The batch sizes vLLM captures CUDA graphs for (vllm/config/compilation.py)."""
    largest = min(2 * int(max_num_seqs), 512, int(max_num_batched_tokens))
    return [s for s in [1, 2, 4, *list(range(8, 256, 8)), *list(range(256, 513, 16))] if s <= largest]


def cudagraph_memory(config, tensor_parallel_size, max_num_seqs, max_num_batched_tokens, dtype_bytes, layers=None):
    """CUDA graph memory per GPU, which vLLM's profiler estimates and takes from the KV
    budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default since v0.21): the pool
    for the largest captured batch plus a per-graph, per-layer cost, FULL and PIECEWISE.
    layers: the decoder layers on this GPU (its pipeline stage's; default all)."""
    config = shape.text_config(config)
    sizes = capture_sizes(max_num_seqs, max_num_batched_tokens)
    layers = int(layers or config["num_hidden_layers"])
    pool = activation_peak(config, tensor_parallel_size, sizes[-1], 0, dtype_bytes)
    return GRAPH_BASE + pool + 2 * len(sizes) * layers * GRAPH_PER_LAYER_PER_GRAPH


def nccl_memory(tensor_parallel_size, pipeline_parallel_size=1):
    """NCCL and all-reduce memory per rank: the TP group's (NCCL_BASE and a share per peer),
    and the PP group's communicator (NCCL_PP, an estimate) when there are stages to talk to."""
    tp = int(tensor_parallel_size)
    tp_part = 0 if tp <= 1 else NCCL_BASE + (tp - 1) * NCCL_PER_PEER
    return tp_part + (NCCL_PP if int(pipeline_parallel_size or 1) > 1 else 0)


def _vllm_defaults(gpu_memory_bytes, gpu_name=None, tp_guess=1):
    big = gpu_memory_bytes >= VLLM_BIG_GPU_GIB * GIB and "a100" not in (gpu_name or "").lower()
    return dict(VLLM_DEFAULTS_BIG if big else VLLM_DEFAULTS_SMALL)


def _sglang_defaults(gpu_memory_bytes, gpu_name=None, tp_guess=1):
    # SGLang sizes its request pool from the KV tokens itself; max_num_seqs here is the
    # largest CUDA-graph batch (cuda_graph_max_bs), what its activations and graphs cover.
    row = next(r for r in SGLANG_BY_MEMORY if gpu_memory_bytes < r[0] * GIB)
    return {"max_num_batched_tokens": row[1], "max_num_seqs": row[2] if tp_guess < 4 else row[3]}


def _vllm_graphs(config, tp, seqs, tokens, dbytes, layers):
    return cudagraph_memory(config, tp, seqs, tokens, dbytes, layers)


def _sglang_graphs(config, tp, seqs, tokens, dbytes, layers):
    # captures batch sizes up to cuda_graph_max_bs, one graph each
    return GRAPH_BASE + activation_peak(config, tp, seqs, 0, dbytes) + seqs // 8 * layers * GRAPH_PER_LAYER_PER_GRAPH


# Each engine's calibration, by the engine registry's names: its batch defaults by GPU memory
# and its CUDA graphs' memory. How its memory share counts is the registry's
# (Engine.share_covers_all), as is whether it sizes its request pool itself.
BATCH_DEFAULTS = {"vllm": _vllm_defaults, "sglang": _sglang_defaults}
GRAPH_MEMORY = {"vllm": _vllm_graphs, "sglang": _sglang_graphs}


def _round_down(value, step):
    return int(value) // int(step) * int(step)


def engine_neutral_pins(pins):
    """Engine-neutral pins: SGLang's names fold into vLLM's (_engine_options.plan_pins)."""
    pins = {k: v for k, v in (pins or {}).items() if v is not None}
    neutral = plan_pins({k: v for k, v in pins.items() if k in OPTIONS})
    return dict({k: v for k, v in pins.items() if k in PLANNER_PINS}, **neutral)


# Every key of a plan, whatever the case (GPU or CPU, fits or not, refused before any budget):
# a key that does not apply is None. docs/memory-plan.md says what each holds; a test checks
# that every case has exactly these.
PLAN_KEYS = (
    "accelerator", "activation_bytes_per_gpu", "advice", "block_size", "cudagraph_bytes_per_gpu", "dtype",
    "enforce_eager", "engine", "engine_args", "errors", "fits", "gpu_memory_bytes", "gpu_memory_bytes_total",
    "gpu_memory_utilization", "gpus", "kv_bytes_per_token_per_gpu", "kv_cache_bytes_per_gpu", "kv_cache_dtype",
    "kv_cache_tokens", "level", "max_concurrency", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
    "model", "nodes", "non_torch_bytes_per_gpu", "options", "outside_bytes_per_gpu", "pipeline_parallel_size",
    "pipeline_stage_layers", "quantization", "reasons", "shortfall_bytes_per_gpu", "target_concurrency",
    "tensor_parallel_size", "warnings", "weights_bytes_per_gpu", "weights_host_bytes",
)  # fmt: skip


def plan_memory(config, gpus=1, gpu_memory_bytes=None, engine="vllm", accelerator="nvidia", nodes=1, **kwargs):
    """The memory plan for one engine instance (see _plan_memory), with every key of PLAN_KEYS:
    one shape for every case, None where a key does not apply. gpus: GPUs per node; nodes:
    the hosts the instance spans (tensor parallel within a node, pipeline parallel across)."""
    plan = _plan_memory(config, gpus, gpu_memory_bytes, engine, accelerator, nodes=nodes, **kwargs)
    return _shaped(plan, accelerator, nodes)


def _shaped(plan, accelerator, nodes):
    out = dict.fromkeys(PLAN_KEYS)
    out.update(plan)
    if out["accelerator"] is None:
        out["accelerator"] = accelerator
    if out["nodes"] is None:
        out["nodes"] = int(nodes or 1)
    return out


def _plan_memory(
    config,
    gpus=1,
    gpu_memory_bytes=None,
    engine="vllm",
    accelerator="nvidia",
    pins=None,
    concurrency=None,
    kv_space_bytes=None,
    gpu_name=None,
    nodes=1,
    suggest=True,
):
    """The memory plan for one engine instance. Returns a dict with `fits`, `errors`,
    `warnings`, `reasons`, `options` (the engine options to pass) and `engine_args` (the
    same in the engine's own flags), and the figures behind them (see _budget).

    config: a config.json dict (load with _model_shape.load_model_config); gpus: how many GPUs
    the instance may use on each node; nodes: how many hosts it spans; gpu_memory_bytes: memory
    of each GPU (the smallest when they differ); pins: engine options the user fixed (either
    engine's names) and PLANNER_PINS; concurrency: how many full-length requests must fit at
    once (default: max_num_seqs when pinned, else 8); kv_space_bytes: the KV cache space of a
    CPU instance (per rank). suggest: when nothing fits, plan again with more nodes, FP8 and a
    shorter context, and name what fits (off in those plans themselves).
    """
    pins = engine_neutral_pins(pins)
    errors, warnings, reasons = [], [], []
    nodes = int(nodes or 1)
    if nodes < 1:
        raise PlanInputError("nodes=%d: an instance runs on at least 1 node" % nodes)
    if accelerator == "cpu":
        return _plan_cpu(config, pins, concurrency, kv_space_bytes, errors, warnings, reasons, nodes)
    if not gpu_memory_bytes or gpu_memory_bytes <= 0:
        raise PlanInputError("the GPU memory size is unknown; give it (gpu_memory_gib)")
    gpus = int(gpus or 1)
    try:
        quant = shape.quantization_of(config, pins.get("quantization"))
    except shape.ModelConfigError as exc:
        return _refused(config, pins, engine, ["quantization: %s." % exc], gpus, gpu_memory_bytes, nodes)
    dtype = shape.weight_dtype(config, quant, pins.get("dtype", "auto"), on_gpu=True)
    kv_dtype = pins.get("kv_cache_dtype", "auto")
    block = BLOCK_SIZE[(engine, accelerator)]
    limit = model_max_len(config, pins.get("rope_scaling"))
    pinned_len = pins.get("max_model_len")
    if pinned_len and pinned_len > limit:
        errors.append(
            "max_model_len=%d is above the model's limit of %d tokens (config.json max_position_embeddings); "
            "lower it, or pin rope_scaling to extend the context." % (pinned_len, limit)
        )
    defaults = BATCH_DEFAULTS[engine](gpu_memory_bytes, gpu_name, int(pins.get("tensor_parallel_size") or gpus or 1))
    tokens = pins.get("max_num_batched_tokens", defaults["max_num_batched_tokens"])
    seqs = pins.get("max_num_seqs", defaults["max_num_seqs"])
    target = int(concurrency or pins.get("max_num_seqs") or DEFAULT_CONCURRENCY)

    heads, _kv_heads, _head_dim = shape.attention_shape(config)
    pp = _pipeline_size(pins, nodes)
    cross = bool(pins.get("cross_node_tensor_parallel"))
    if pins.get("tensor_parallel_size"):
        candidates = [int(pins["tensor_parallel_size"])]
        errors.extend(shape.parallel_errors(config, candidates[0], pp, where="tensor_parallel_size", engine=engine))
        errors.extend(_node_errors(candidates[0], pp, nodes, gpus, cross))
    else:
        candidates = [
            n
            for n in range(1, gpus * nodes + 1)
            if not shape.parallel_errors(config, n, pp) and not _node_errors(n, pp, nodes, gpus, cross)
        ]
        if not candidates and nodes == 1 and pp == 1:
            errors.append(
                "no tensor_parallel_size from 1 to %d divides the model's %d attention heads." % (gpus, heads)
            )
        elif not candidates:
            why = shape.parallel_errors(config, 1, pp, engine=engine)
            why = why or _node_errors(min(gpus, heads), pp, nodes, gpus, cross)
            errors.append(
                "no tensor_parallel_size from 1 to %d fits pipeline_parallel_size=%d on %d x %d GPUs: %s"
                % (gpus * nodes, pp, nodes, gpus, " ".join(why) or "none divides the model's %d heads." % heads)
            )
    if errors:
        return _refused(config, pins, engine, errors, gpus, gpu_memory_bytes, nodes, pp)

    eager_options = [pins["enforce_eager"]] if "enforce_eager" in pins else [False, True]
    layout = Layout(
        config=config,
        engine=engine,
        dtype=dtype,
        kv_dtype=kv_dtype,
        quant=quant,
        block=block,
        total=gpu_memory_bytes,
        tokens=tokens,
        seqs=seqs,
        limit=limit,
        pinned_len=pinned_len,
        target=target,
        pins=pins,
        pp=pp,
    )
    tried = [_budget(layout, tp, eager) for tp in candidates for eager in eager_options]
    result, why = _choose(tried, pins, target)
    reasons.extend(why)
    _explain(result, engine, pins, limit, target, gpus, warnings, nodes)
    errors.extend(result["errors"])
    warnings.extend(result["warnings"])
    if suggest and result["level"] <= 1:
        errors.append(
            _what_would_fit(
                config, result, gpus, gpu_memory_bytes, engine, nodes, pins, concurrency=concurrency, gpu_name=gpu_name
            )
        )
    result["reasons"] = reasons + result["reasons"]
    result["errors"], result["warnings"] = errors, warnings
    result["fits"] = not errors
    result["gpus"] = gpus
    result["nodes"] = nodes
    result["gpu_memory_bytes"] = int(gpu_memory_bytes)
    result["model"] = _model_summary(config, quant, dtype, limit)
    result["options"] = _options(result, engine, pins)
    result["engine_args"] = engine_flags(result["options"], engine)
    return result


def _pipeline_size(pins, nodes):
    """Pipeline stages: the pin; else 1 where the user lets tensor parallelism span the nodes
    (a pinned TP with cross_node_tensor_parallel); else one stage per node."""
    if pins.get("pipeline_parallel_size"):
        return int(pins["pipeline_parallel_size"])
    if pins.get("cross_node_tensor_parallel") and pins.get("tensor_parallel_size"):
        return 1
    return int(nodes)


def _node_errors(tp, pp, nodes, gpus, cross):
    """The rules a TP x PP layout over `nodes` hosts of `gpus` GPUs each must meet (gpus None:
    a CPU instance, whose ranks per host the planner does not limit).

    - vLLM (vllm/config/parallel.py ParallelConfig.__post_init__, nnodes > 1): the world size
      TP x PP must divide by the node count; each node runs world / nnodes consecutive ranks,
      TP ranks first (rank = pp_rank x TP + tp_rank), and needs a GPU for each.
    - So a tensor-parallel group stays within one node when TP <= the GPUs of a node and PP
      is a multiple of the nodes; otherwise every layer's all-reduce crosses the network,
      which the plan refuses unless cross_node_tensor_parallel is pinned.
    """
    world = tp * pp
    if nodes == 1:
        if not gpus or world <= gpus:
            return []
        if pp == 1:
            return [
                "tensor_parallel_size=%d needs %d GPUs, but the instance has %d; give it more GPUs or lower TP."
                % (tp, tp, gpus)
            ]
        return [
            "tensor_parallel_size x pipeline_parallel_size = %d x %d needs %d GPUs, but the instance has %d; "
            "give it more GPUs or lower TP or PP." % (tp, pp, world, gpus)
        ]
    crosses = tp > 1 and (bool(gpus and tp > gpus) or pp % nodes != 0)
    if crosses and not cross:
        return [
            "tensor_parallel_size=%d with pipeline_parallel_size=%d on %d nodes%s puts one tensor-parallel group on "
            "more than one node: every layer's all-reduce would cross the network between them. Use "
            "tensor_parallel_size of at most %s and pipeline_parallel_size=%d (one stage per node), or pin "
            "cross_node_tensor_parallel: true to run it anyway."
            % (
                tp,
                pp,
                nodes,
                " of %d GPUs" % gpus if gpus else "",
                "%d (the GPUs of one node)" % gpus if gpus else "the ranks of one node",
                nodes,
            )
        ]
    if world % nodes:
        return [
            "tensor_parallel_size x pipeline_parallel_size = %d x %d = %d ranks do not divide over %d nodes; vLLM "
            "needs the world size to be a multiple of the node count (vllm/config/parallel.py). Use TP x PP = a "
            "multiple of %d." % (tp, pp, world, nodes, nodes)
        ]
    if gpus and world // nodes > gpus:
        return [
            "tensor_parallel_size x pipeline_parallel_size = %d x %d = %d ranks over %d nodes is %d per node, but a "
            "node has %d GPUs; lower TP or PP, or give the instance more nodes."
            % (tp, pp, world, nodes, world // nodes, gpus)
        ]
    return []


@dataclass(frozen=True)
class Layout:
    """What every budget of one plan shares; _budget tries it at each TP, with and without
    CUDA graphs."""

    config: dict
    engine: str
    dtype: str  # the weights' dtype
    kv_dtype: str
    quant: dict  # _model_shape.quantization_of
    block: int  # KV cache page size, tokens
    total: int  # CUDA-visible bytes of one GPU
    tokens: int  # max_num_batched_tokens
    seqs: int  # max_num_seqs (SGLang: the largest CUDA-graph batch)
    limit: int  # the model's longest context
    pinned_len: object  # the pinned max_model_len, or None
    target: int  # full-length requests the plan aims to fit at once
    pins: dict
    pp: int = 1  # pipeline stages


def _budget(layout, tp, eager):
    """One GPU's budget at tensor-parallel size `tp`, with CUDA graphs unless `eager`: with
    pipeline parallelism, that of the stage with the fewest KV tokens. vLLM gives every worker
    the same number of KV blocks, the fewest any of them has room for (v1/core/kv_cache_utils.py
    get_kv_cache_configs), so that stage decides; among stages with no room, the one furthest short."""
    stages = [_stage_budget(layout, tp, eager, stage) for stage in range(layout.pp)]
    return min(
        stages,
        key=lambda r: (r["kv_cache_tokens"], -r.get("shortfall_bytes_per_gpu", 0), -r["weights_bytes_per_gpu"]),
    )


def _stage_budget(layout, tp, eager, stage=0):
    """The budget of one GPU of pipeline stage `stage` (the only one without PP)."""
    config, engine, dtype, kv_dtype = layout.config, layout.engine, layout.dtype, layout.kv_dtype
    quant, block, total, tokens, seqs = layout.quant, layout.block, layout.total, layout.tokens, layout.seqs
    limit, pinned_len, target, pins, pp = layout.limit, layout.pinned_len, layout.target, layout.pins, layout.pp
    dbytes = shape.DTYPE_BYTES[dtype]
    _start, layers, first, _last = shape.pp_stage(config, pp, stage)
    weights = shape.weights_per_gpu(config, tp, dtype, quant, pp, stage)["total"]
    # The sampler's dummy run happens only on the last stage; the peak counts it on every stage,
    # which errs towards a smaller KV cache on the others.
    acts = activation_peak(config, tp, tokens, seqs, dbytes)
    if not first:  # the hidden states and residual received from the previous stage
        acts += PP_INTERMEDIATE_TENSORS * int(tokens) * int(shape.text_config(config)["hidden_size"]) * dbytes
    graphs = 0 if eager else GRAPH_MEMORY[engine](config, tp, seqs, tokens, dbytes, layers)
    outside = CUDA_CONTEXT + nccl_memory(tp, pp)
    bpt = shape.kv_bytes_per_token(config, tp, kv_dtype, dtype, pp, stage)
    label = "TP=%d" % tp if pp == 1 else "TP=%d x PP=%d (stage %d of %d, %d layers)" % (tp, pp, stage + 1, pp, layers)
    errors, warnings, reasons = [], [], []
    pinned_util = pins.get("gpu_memory_utilization")
    if ENGINE_INFO[engine].share_covers_all:
        # vLLM's budget: everything but the context and NCCL; graphs and activations inside.
        room = (total - outside - MARGIN) / float(total)
        util = pinned_util or min(MAX_UTILIZATION, _floor2(room))
        inside = NON_TORCH_FORWARD + acts + graphs
        kv = int(total * util) - weights - inside
        if pinned_util and total * (1 - pinned_util) < outside:
            errors.append(
                "gpu_memory_utilization=%s leaves %s outside vLLM's budget, less than the CUDA context and NCCL "
                "buffers need (%s): vLLM stops with 'Free memory on device ... is less than desired GPU memory "
                "utilization'. Use at most %.2f."
                % (
                    pinned_util,
                    _gib(total * (1 - pinned_util)),
                    _gib(outside),
                    _floor2((total - outside) / float(total)),
                )
            )
    else:
        # SGLang: the static part (weights + KV pool) is total x mem_fraction_static; the rest
        # holds the context, activations of a chunked-prefill step and the CUDA graphs.
        inside = 0
        room = (total - outside - NON_TORCH_FORWARD - acts - graphs - MARGIN) / float(total)
        util = pinned_util or min(MAX_UTILIZATION, _floor2(room))
        kv = int(total * util) - weights
        if pinned_util and pinned_util > _floor2(room) + 0.005:
            warnings.append(
                "mem_fraction_static=%s leaves %s for activations, CUDA graphs and the context, which need about "
                "%s; SGLang may run out of memory under load. %.2f would leave room."
                % (
                    pinned_util,
                    _gib(total * (1 - pinned_util)),
                    _gib(outside + NON_TORCH_FORWARD + acts + graphs),
                    _floor2(room),
                )
            )
    kv = max(kv, 0)
    kv_tokens = shape.kv_cache_tokens(kv, bpt, block) if kv > 0 else 0
    result = {
        "engine": engine,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "pipeline_stage_layers": shape.pp_stage_layers(shape.attention_shape(config)[2], pp),
        "enforce_eager": eager,
        "dtype": dtype,
        "kv_cache_dtype": kv_dtype,
        "quantization": quant["method"],
        "block_size": block,
        "gpu_memory_utilization": util,
        "weights_bytes_per_gpu": int(weights),
        "activation_bytes_per_gpu": int(acts),
        "non_torch_bytes_per_gpu": int(NON_TORCH_FORWARD),
        "cudagraph_bytes_per_gpu": int(graphs),
        "outside_bytes_per_gpu": int(outside),
        "kv_cache_bytes_per_gpu": int(kv),
        "gpu_memory_bytes_total": int(total),
        "kv_bytes_per_token_per_gpu": int(bpt),
        "kv_cache_tokens": int(kv_tokens),
        "max_num_batched_tokens": int(tokens),
        "max_num_seqs": int(seqs),
        "target_concurrency": target,
        "errors": errors,
        "warnings": warnings,
        "reasons": reasons,
    }
    need = weights + inside
    if kv <= 0 or kv_tokens < block:
        result["max_model_len"] = pinned_len or min(limit, MIN_CONTEXT)
        result["max_concurrency"] = 0.0
        result["level"] = 0
        shortfall = need + bpt * block - total * util
        result["shortfall_bytes_per_gpu"] = int(max(shortfall, 0))
        result["errors"].append(
            "%s: the weights (%s per GPU)%s leave no room for the KV cache in the %s budget (%s x %s); "
            "short by %s. %s"
            % (
                label,
                _gib(weights),
                " with activations and CUDA graphs (%s)" % _gib(inside) if inside else "",
                engine,
                _gib(total),
                util,
                _gib(max(shortfall, 0)),
                _more_memory_hint(config, pins),
            )
        )
        return result
    floor = min(limit, MIN_CONTEXT)
    if pinned_len:
        mml = pinned_len
    else:
        # the largest context that keeps `target` full-length requests, not below the floor,
        # not above the model's limit, and never longer than the whole cache
        by_target = _round_down(kv_tokens // max(target, 1), block)
        mml = min(limit, max(by_target, floor), kv_tokens)
    blocks_per_request = -(-mml // block)
    result["max_model_len"] = int(mml)
    # vLLM's "Maximum concurrency for N tokens per request" (kv_cache_utils.py)
    result["max_concurrency"] = round((kv_tokens // block) / float(blocks_per_request), 2)
    if kv_tokens < blocks_per_request * block:
        result["level"] = 1
        result["errors"].append(
            "%s: one request at max_model_len=%d needs %s of KV cache per GPU, but only %s is left (%d tokens); "
            "vLLM refuses to start. The longest that fits is %d tokens: lower max_model_len%s."
            % (
                label,
                mml,
                _gib(blocks_per_request * block * bpt),
                _gib(kv),
                kv_tokens,
                kv_tokens,
                ", or give the instance more GPUs"
                if not _tp_pinned_by_user(pins)
                else ", or raise tensor_parallel_size",
            )
        )
    elif mml < floor or result["max_concurrency"] < target:
        result["level"] = 2
    else:
        result["level"] = 3
    return result


def _explain(r, engine, pins, limit, target, gpus, warnings, nodes=1):
    """Reasons for the chosen values, and warnings for a plan that serves but falls short."""
    reasons = r["reasons"]
    tp, pp = r["tensor_parallel_size"], r["pipeline_parallel_size"]
    of = "%d GPUs" % gpus if nodes == 1 else "%d GPUs per node" % gpus
    if "tensor_parallel_size" not in pins:
        reasons.insert(
            0,
            "tensor_parallel_size=%d: %s."
            % (
                tp,
                "the only choice on 1 GPU"
                if gpus == 1 and nodes == 1
                else "the smallest of %s that meets the target" % of
                if r["level"] == 3
                else "the size of %s with the most KV room" % of
                if r["level"] > 0
                else "of %s the closest to fitting, and still %s short per GPU"
                % (of, _gib(r.get("shortfall_bytes_per_gpu", 0))),
            ),
        )
    if pp > 1 or nodes > 1:
        stages = "/".join(str(n) for n in r["pipeline_stage_layers"])
        reasons.insert(
            1 if "tensor_parallel_size" not in pins else 0,
            "pipeline_parallel_size=%d: %s; stages of %s layers (vLLM's split, get_pp_indices), the per-GPU figures "
            "are the stage with the fewest KV tokens."
            % (
                pp,
                "pinned"
                if "pipeline_parallel_size" in pins
                else "one stage per node: tensor parallel within a node, only the hidden states between stages "
                "cross the network"
                if pp == nodes
                else "tensor parallel spans the nodes",
                stages,
            ),
        )
    if nodes > 1 and tp > 1 and (tp > gpus or pp % nodes):
        reasons.append(
            "tensor_parallel_size=%d spans %d nodes (cross_node_tensor_parallel): every layer's all-reduce crosses "
            "the network, slower than TP within a node and PP across nodes." % (tp, nodes)
        )
    util_key = option_for("gpu_memory_utilization", engine).name
    if "gpu_memory_utilization" not in pins:
        reasons.append(
            "%s=%.2f: keeps %s per GPU outside the engine's budget for the CUDA context%s and a %s margin."
            % (
                util_key,
                r["gpu_memory_utilization"],
                _gib(r["gpu_memory_bytes_total"] * (1 - r["gpu_memory_utilization"])),
                " and NCCL buffers" if tp > 1 else "",
                _gib(MARGIN),
            )
        )
    if "max_model_len" not in pins and r["level"] >= 2:
        reasons.append("max_model_len=%d: %s." % (r["max_model_len"], _why_length(r, limit, target)))
    if r["level"] == 2:
        fixes = []
        if r["kv_cache_dtype"] in ("auto", None) and r["dtype"] in ("bfloat16", "float16"):
            fixes.append("kv_cache_dtype fp8 (twice the tokens)")
        if r["max_model_len"] > 2048:
            fixes.append("a shorter max_model_len")
        fixes.append("a larger tensor_parallel_size" if _tp_pinned_by_user(pins) else "more GPUs")
        warnings.append(
            "%d requests at max_model_len=%d need %d KV tokens; the cache holds %d: %.2f at full length at once "
            "(shorter requests share it; the rest wait in the queue). For more: %s."
            % (
                target,
                r["max_model_len"],
                target * r["max_model_len"],
                r["kv_cache_tokens"],
                r["max_concurrency"],
                ", ".join(fixes),
            )
        )
    if r["level"] >= 2 and r["kv_cache_bytes_per_gpu"] < 2 * GIB:
        warnings.append(
            "KV room is tiny: %s per GPU after %s of weights (%d tokens in all). It serves, but few requests at "
            "once; long prompts queue."
            % (_gib(r["kv_cache_bytes_per_gpu"]), _gib(r["weights_bytes_per_gpu"]), r["kv_cache_tokens"])
        )


def _why_length(r, limit, target):
    mml = r["max_model_len"]
    if mml == limit:
        return "the model's limit"
    if mml >= r["kv_cache_tokens"] - r["block_size"] and mml < min(limit, MIN_CONTEXT):
        return "the whole KV cache; one request of this length fills it"
    if mml > MIN_CONTEXT:
        return "the largest that keeps %d requests at full length" % target
    return "the %d-token floor the plan keeps, below the target concurrency" % min(limit, MIN_CONTEXT)


def _tp_pinned_by_user(pins):
    return bool(pins.get("tensor_parallel_size")) and not pins.get("tensor_parallel_from_gpus")


def _more_memory_hint(config, pins):
    hints = []
    if not _tp_pinned_by_user(pins):
        hints.append("give the instance more GPUs")
    else:
        hints.append("raise tensor_parallel_size")
    if not (config.get("quantization_config") or pins.get("quantization")):
        hints.append("use a quantized checkpoint (AWQ/GPTQ 4-bit, FP8)")
    return "Fix: %s." % " or ".join(hints)


def _what_would_fit(config, result, gpus, gpu_memory_bytes, engine, nodes, pins, **kwargs):
    """One sentence for a plan that does not fit: what does, computed by planning again with
    more nodes of the same GPUs (up to 4x as many), FP8 weights (vLLM's online quantization of a
    16-bit checkpoint), an FP8 KV cache where the weights fit but the KV cache does not, and the
    longest context that fits as it is. A way that serves no full-length request at a useful
    context (USEFUL_CONTEXT tokens, or the model's own context when that is shorter) is left out:
    it fits, but nobody could use it."""
    fixes = []
    # a context the user pinned shorter is what they asked for
    useful = min(
        USEFUL_CONTEXT,
        model_max_len(config, pins.get("rope_scaling")) or USEFUL_CONTEXT,
        pins.get("max_model_len") or USEFUL_CONTEXT,
    )

    def plan(nodes_, **more):
        again = dict(pins, **more)
        if nodes_ != nodes:
            again.pop("pipeline_parallel_size", None)
        return _plan_memory(
            config, gpus, gpu_memory_bytes, engine, "nvidia", pins=again, nodes=nodes_, suggest=False, **kwargs
        )

    def figures(p):
        return "TP %d x PP %d: %d KV tokens, max_model_len %d" % (
            p["tensor_parallel_size"],
            p["pipeline_parallel_size"],
            p["kv_cache_tokens"],
            p["max_model_len"],
        )

    most = 4 * nodes
    for n in range(nodes + 1, most + 1):
        p = plan(n)
        if p["fits"] and p["max_model_len"] >= useful:
            fixes.append("%d nodes of %d GPUs (%s)" % (n, gpus, figures(p)))
            break
    on = "on %d node%s" % (nodes, "s" if nodes > 1 else "")
    if result["quantization"] is None and pins.get("quantization") in (None, "auto"):
        p = plan(nodes, quantization="fp8")
        if p["fits"] and p["max_model_len"] >= useful:
            fixes.append("quantization fp8 %s (FP8 weights, %s)" % (on, figures(p)))
    if (
        result["level"] == 1
        and result["kv_cache_dtype"] in (None, "auto")
        and result["dtype"] in ("bfloat16", "float16")
    ):
        p = plan(nodes, kv_cache_dtype="fp8")
        if p["fits"] and p["max_model_len"] >= useful:
            fixes.append("kv_cache_dtype fp8 %s (%s)" % (on, figures(p)))
    if result["level"] == 1 and result["kv_cache_tokens"] >= max(result["block_size"], useful):
        fixes.append("max_model_len %d or less %s" % (result["kv_cache_tokens"], on))
    if fixes:
        return "What would fit: %s." % "; or ".join(fixes)
    return (
        "Nothing the plan tried fits with a context of %d tokens or more: not %d to %d nodes of %d GPUs%s; use GPUs "
        "with more memory, or a smaller or quantized model."
        % (useful, nodes, most, gpus, ", nor FP8 weights" if result["quantization"] is None else "")
    )


def _floor2(x):
    return int(x * 100) / 100.0


def _eager_pays(graphs, eager, target):
    """Eager mode only when CUDA graphs cost more than they give: without them a full-length
    request fits and with them none does, or they cut the room below 3/4 of the target that
    eager mode meets. A few percent of KV is not worth slower decoding."""
    if graphs["level"] <= 1 < eager["level"]:
        return True
    return graphs["level"] == 2 and eager["level"] == 3 and graphs["max_concurrency"] < 0.75 * target


def _choose(tried, pins, target):
    """The layout to run, and why.

    At each TP, CUDA graphs unless they cost the plan a level that eager mode reaches
    (levels: 0 no KV room, 1 not even one full-length request, 2 below the target
    concurrency or the context floor, 3 the target met). Then the smallest TP that meets
    the target; when none does, the one with the most room.
    """
    why = []
    per_tp = {}
    for r in tried:
        per_tp.setdefault(r["tensor_parallel_size"], []).append(r)
    picks = []
    for tp in sorted(per_tp):
        graphs = [r for r in per_tp[tp] if not r["enforce_eager"]]
        eager = [r for r in per_tp[tp] if r["enforce_eager"]]
        pick = graphs[0] if graphs else eager[0]
        if graphs and eager and _eager_pays(graphs[0], eager[0], target):
            pick = eager[0]
            pick["reasons"].append(
                "enforce_eager: CUDA graphs would take %s per GPU from the KV cache, leaving room for %.2f requests "
                "of %d tokens; without them %.2f fit. Eager decoding is slower at small batches, but it serves."
                % (
                    _gib(graphs[0]["cudagraph_bytes_per_gpu"]),
                    graphs[0]["max_concurrency"],
                    graphs[0]["max_model_len"],
                    pick["max_concurrency"],
                )
            )
        elif graphs and "enforce_eager" not in pins:
            pick["reasons"].append(
                "CUDA graphs on: they take %s per GPU and the plan still meets its target with them."
                % _gib(pick["cudagraph_bytes_per_gpu"])
                if pick["level"] == 3
                else "CUDA graphs on: they take %s per GPU; eager mode would not lift the plan to its target."
                % _gib(pick["cudagraph_bytes_per_gpu"])
            )
        picks.append(pick)
    met = [r for r in picks if r["level"] == 3]
    if met:
        best = met[0]
    else:
        top = max(r["level"] for r in picks)
        if top == 0:
            # nothing leaves KV room: the best it could do is the layout closest to fitting
            best = min(picks, key=lambda r: (r["shortfall_bytes_per_gpu"], r["tensor_parallel_size"]))
        else:
            best = max(
                (r for r in picks if r["level"] == top),
                key=lambda r: (r["max_concurrency"], -r["tensor_parallel_size"]),
            )
    for r in picks:
        if r["tensor_parallel_size"] < best["tensor_parallel_size"]:
            why.append(
                "tensor_parallel_size=%d is not enough: %s"
                % (
                    r["tensor_parallel_size"],
                    r["errors"][0].split(": ", 1)[1]
                    if r["errors"]
                    else "room for %.2f requests of %d tokens, below the target of %d at %d+ tokens"
                    % (r["max_concurrency"], r["max_model_len"], target, MIN_CONTEXT),
                )
            )
    return best, why


def _refused(config, pins, engine, errors, gpus, gpu_memory_bytes, nodes=1, pp=None):
    """A plan that cannot be made (its errors say why)."""
    try:
        summary = _model_summary(
            config, shape.quantization_of(config), shape.model_dtype(config), model_max_len(config)
        )
    except (shape.ModelConfigError, PlanInputError, KeyError, TypeError, ValueError):
        summary = {}
    return {
        "engine": engine,
        "gpus": gpus,
        "nodes": nodes,
        "gpu_memory_bytes": int(gpu_memory_bytes) if gpu_memory_bytes else None,
        "model": summary,
        "fits": False,
        "errors": errors,
        "warnings": [],
        "reasons": [],
        "tensor_parallel_size": pins.get("tensor_parallel_size"),
        "pipeline_parallel_size": pp or pins.get("pipeline_parallel_size"),
        "weights_bytes_per_gpu": None,
        "kv_bytes_per_token_per_gpu": None,
        "kv_cache_tokens": 0,
        "max_model_len": pins.get("max_model_len"),
        "max_concurrency": 0.0,
        "options": {},
        "engine_args": {},
    }


def _model_summary(config, quant, dtype, limit):
    config = shape.text_config(config)
    heads, kv_heads, layers = shape.attention_shape(config)
    return {
        "architecture": (config.get("architectures") or ["?"])[0],
        "parameters": shape.parameter_count(config),
        "layers": layers,
        "attention_heads": heads,
        "kv_heads": kv_heads,
        "mla": bool(config.get("kv_lora_rank")),
        "dtype": dtype,
        "quantization": quant["method"],
        "max_position_embeddings": limit,
    }


def _options(result, engine, pins):
    """The engine options the plan sets, in the engine's own option names (gpufleet_engines)."""
    if not result.get("fits"):
        return {}
    chosen = {
        "tensor_parallel_size": result["tensor_parallel_size"],
        "pipeline_parallel_size": result["pipeline_parallel_size"] if result["pipeline_parallel_size"] > 1 else None,
        "max_model_len": result["max_model_len"],
        # SGLang sizes its request pool itself: the plan's max_num_seqs there is the largest
        # CUDA-graph batch, so only a pinned value is passed on.
        "max_num_seqs": pins.get("max_num_seqs") if ENGINE_INFO[engine].sizes_request_pool else result["max_num_seqs"],
        "max_num_batched_tokens": result["max_num_batched_tokens"],
        "gpu_memory_utilization": result["gpu_memory_utilization"],
        "enforce_eager": True if result["enforce_eager"] else None,
    }
    for key in ("dtype", "quantization", "kv_cache_dtype"):
        if pins.get(key) not in (None, "auto", "none"):
            chosen[key] = pins[key]
    opts = {}
    for key, value in chosen.items():
        option = option_for(key, engine)
        if option is not None and value is not None:
            opts[option.name] = value
    return opts


def _plan_cpu(config, pins, concurrency, kv_space_bytes, errors, warnings, reasons, nodes=1):
    """vLLM's CPU backend: the KV cache is exactly VLLM_CPU_KVCACHE_SPACE on every rank, in
    128-token blocks; the weights live in host memory outside that space. A pinned
    tensor_parallel_size / pipeline_parallel_size and the nodes follow the GPU rules
    (_node_errors), without a limit on the ranks per host; each rank's KV bytes per token are
    its TP share of the KV heads over its stage's layers."""
    if not kv_space_bytes:
        raise PlanInputError("a CPU instance needs its KV cache space (kv_cache_space_gib)")
    dtype = shape.model_dtype(config, pins.get("dtype", "auto"))
    kv_dtype = pins.get("kv_cache_dtype", "auto")
    block = BLOCK_SIZE[("vllm", "cpu")]
    tp = int(pins.get("tensor_parallel_size") or 1)
    pp = _pipeline_size(pins, nodes)
    refused = shape.parallel_errors(config, tp, pp, where="tensor_parallel_size") + _node_errors(
        tp, pp, nodes, None, bool(pins.get("cross_node_tensor_parallel"))
    )
    if refused:
        plan = _refused(config, pins, "vllm", refused, None, None, nodes, pp)
        plan.update(accelerator="cpu", gpus=None, tensor_parallel_size=tp)
        return plan
    # the rank with the most KV bytes per token (the largest stage) holds the fewest tokens
    bpt = max(shape.kv_bytes_per_token(config, tp, kv_dtype, dtype, pp, s) for s in range(pp))
    if pp > 1 and nodes > 1:
        warnings.append(
            "pipeline_parallel_size=%d across %d nodes: vLLM's CPU build has failed pipeline parallelism across "
            "nodes in the lab; pin tensor_parallel_size=%d with cross_node_tensor_parallel: true instead."
            % (pp, nodes, nodes)
        )
    tokens = shape.kv_cache_tokens(kv_space_bytes, bpt, block)
    limit = model_max_len(config, pins.get("rope_scaling"))
    target = int(concurrency or pins.get("max_num_seqs") or DEFAULT_CONCURRENCY)
    mml = pins.get("max_model_len")
    if mml and mml > limit:
        errors.append(
            "max_model_len=%d is above the model's limit of %d tokens (max_position_embeddings)." % (mml, limit)
        )
    if not mml:
        mml = min(limit, max(_round_down(tokens // max(target, 1), block), min(limit, block)))
        reasons.append(
            "max_model_len=%d: the largest that keeps %d requests at full length in %d KV tokens."
            % (mml, target, tokens)
        )
    if tokens < mml:
        errors.append(
            "max_model_len=%d needs %s of KV cache, but kv_cache_space_gib gives %s (%d tokens); raise "
            "kv_cache_space_gib or lower max_model_len to %d."
            % (mml, _gib(mml * bpt), _gib(kv_space_bytes), tokens, _round_down(tokens, block))
        )
    elif tokens < mml * target:
        warnings.append(
            "%d requests at max_model_len=%d need %d KV tokens; the cache holds %d (%.2f at full length)."
            % (target, mml, mml * target, tokens, tokens / float(mml))
        )
    stages = shape.pp_stage_layers(shape.attention_shape(config)[2], pp)
    if tp * pp == 1:  # host memory the weights take beside the KV space (unquantized: parameters x dtype)
        host = shape.parameter_count(config) * shape.DTYPE_BYTES.get(dtype, 2)
    else:  # per rank: its TP share of its stage
        host = max(shape.weights_per_gpu(config, tp, dtype, None, pp, s)["total"] for s in range(pp))
    result = {
        "engine": "vllm",
        "accelerator": "cpu",
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "pipeline_stage_layers": stages,
        "nodes": nodes,
        "dtype": dtype,
        "kv_cache_dtype": kv_dtype,
        "block_size": block,
        "weights_bytes_per_gpu": None,
        "weights_host_bytes": int(host),
        "kv_cache_bytes_per_gpu": int(kv_space_bytes),
        "kv_bytes_per_token_per_gpu": int(bpt),
        "kv_cache_tokens": int(tokens),
        "max_model_len": int(mml),
        "max_concurrency": round(shape.logged_kv_tokens(tokens // block, block, mml) / float(mml), 2) if mml else 0.0,
        "target_concurrency": target,
        "errors": errors,
        "warnings": warnings,
        "reasons": reasons,
        "fits": not errors,
        "enforce_eager": pins.get("enforce_eager", False),
    }
    result["options"] = {"max_model_len": int(mml)} if not errors else {}
    if result["options"] and pp > 1:
        result["options"]["pipeline_parallel_size"] = pp
    result["engine_args"] = engine_flags(result["options"], "vllm")
    result["model"] = _model_summary(config, {"method": None}, dtype, limit)
    return result


def usable_bytes(nvidia_smi_total_mib=None, gib=None):
    """CUDA-visible memory from nvidia-smi's memory.total (MiB) or a size in GiB."""
    total = nvidia_smi_total_mib * MIB if nvidia_smi_total_mib else int(float(gib) * GIB)
    return total - DRIVER_RESERVED
