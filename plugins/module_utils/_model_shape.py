# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model shape arithmetic (private to gpufleet.serving). Pure Python, no torch.

What a model's config.json says about its size: the shape rules that decide whether a
parallel layout can load at all, KV cache bytes per token, parameter counts, the dtype the
engine runs it in, and the bytes each GPU holds for weights. The budget that combines them,
and the choices made from it, live in _memory_plan.py.
"""

from __future__ import annotations

import json


class ModelConfigError(ValueError):
    pass


def text_config(config):
    """The language model's part of a config: multimodal and some newer configs nest it
    under text_config."""
    if isinstance(config.get("text_config"), dict) and "num_attention_heads" not in config:
        merged = dict(config["text_config"])
        merged.setdefault("architectures", config.get("architectures"))
        return merged
    return config


# The shape numbers the arithmetic reads: each one, when present, a whole number from 1 (0
# for the counts that may be absent in effect) up to DIMENSION_MAX; anything else (a float,
# a string, true, Infinity, 1e18) is refused by name before any arithmetic runs.
DIMENSIONS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
    "vocab_size", "max_position_embeddings", "head_dim", "n_head", "n_head_kv", "n_layer", "num_layers", "num_heads",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "moe_intermediate_size", "num_experts_per_tok",
    "num_experts", "num_local_experts", "n_routed_experts", "seq_length", "max_sequence_length",
)  # fmt: skip
MAY_BE_ZERO = ("kv_lora_rank", "q_lora_rank", "n_shared_experts", "first_k_dense_replace")
DIMENSION_MAX = 2**31  # above any real model's dimension, and far from float/overflow trouble
CONFIG_MAX_BYTES = 4 * 2**20  # real config.json files are a few KB


def load_model_config(text):
    """Parse a model's config.json text into a dict (raises ModelConfigError)."""
    if len(text) > CONFIG_MAX_BYTES:
        raise ModelConfigError("config.json is larger than %d MiB; is it a model's config?" % (CONFIG_MAX_BYTES >> 20))
    try:
        config = json.loads(text)
    except RecursionError:
        raise ModelConfigError("config.json is nested too deeply to be a model's config") from None
    except ValueError as exc:
        raise ModelConfigError("config.json is not valid JSON: %s" % exc) from None
    if not isinstance(config, dict):
        raise ModelConfigError("config.json is not a JSON object")
    config = text_config(config)
    for key in DIMENSIONS + MAY_BE_ZERO:
        value = config.get(key)
        if value is None:
            continue
        low = 0 if key in MAY_BE_ZERO else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= DIMENSION_MAX:
            raise ModelConfigError(
                "config.json: %s=%r must be a whole number from %d to %d" % (key, value, low, DIMENSION_MAX)
            )
    return config


def attention_shape(config):
    """(attention heads, KV heads, layers) of a Hugging Face config dict.

    KV heads default to the attention heads (plain multi-head attention) when the config
    has no num_key_value_heads, as transformers and vLLM do; MLA models (DeepSeek V2/V3)
    keep one latent KV "head" shared by all heads.
    """
    config = text_config(config)
    heads = config.get("num_attention_heads") or config.get("n_head") or config.get("num_heads")
    if not isinstance(heads, int) or heads <= 0:
        raise ModelConfigError("config.json has no num_attention_heads")
    if config.get("kv_lora_rank"):  # MLA: DeepSeek-V2/V3 (vllm/config: is_deepseek_mla)
        kv_heads = 1
    else:
        kv_heads = config.get("num_key_value_heads") or config.get("n_head_kv") or heads
    layers = config.get("num_hidden_layers") or config.get("n_layer") or config.get("num_layers")
    return heads, kv_heads, layers


def parallel_errors(config, tensor_parallel_size=1, pipeline_parallel_size=1, where="", engine="vllm"):
    """Rules a parallel layout must meet to load at all, as the engines enforce them.

    - vLLM ModelConfig.verify_with_parallel_config (vllm/config/model.py): the attention
      heads must divide by tensor_parallel_size, and the hidden layers must be at least
      pipeline_parallel_size.
    - vLLM QKVParallelLinear (vllm/model_executor/layers/linear.py): KV heads are split when
      there are at least as many as TP ranks (then they must divide by TP), else replicated
      (then TP must divide by them). MLA's single latent head is replicated on every rank.
    - SGLang checks the same head divisibility (python/sglang/srt/layers/linear.py).
    Returns a list of sentences naming `where` (the variable) and the fix.
    """
    errors = []
    heads, kv_heads, layers = attention_shape(config)
    tp, pp = int(tensor_parallel_size or 1), int(pipeline_parallel_size or 1)
    prefix = "%s: " % where if where else ""
    valid_tp = [n for n in range(1, heads + 1) if heads % n == 0 and _kv_ok(kv_heads, n, config)]
    if heads % tp:
        errors.append(
            "%stensor_parallel_size=%d does not divide the model's %d attention heads; %s needs heads %% TP == 0. "
            "Valid sizes for this model: %s." % (prefix, tp, heads, engine, ", ".join(map(str, valid_tp[:8])))
        )
    elif not _kv_ok(kv_heads, tp, config):
        errors.append(
            "%stensor_parallel_size=%d does not fit the model's %d KV heads (KV heads must divide by TP, or TP by "
            "the KV heads). Valid sizes for this model: %s." % (prefix, tp, kv_heads, ", ".join(map(str, valid_tp[:8])))
        )
    if isinstance(layers, int) and pp > layers:
        errors.append("%spipeline_parallel_size=%d is more than the model's %d hidden layers." % (prefix, pp, layers))
    return errors


def _kv_ok(kv_heads, tp, config):
    if config.get("kv_lora_rank"):
        return True
    if kv_heads >= tp:
        return kv_heads % tp == 0
    return tp % kv_heads == 0


def kv_heads_per_gpu(config, tensor_parallel_size):
    """KV heads each TP rank holds: split when KV heads >= TP, else one replicated head."""
    _heads, kv_heads, _head_dim = attention_shape(config)
    if config.get("kv_lora_rank"):
        return 1
    return max(1, kv_heads // int(tensor_parallel_size))


def pp_stage_layers(layers, pipeline_parallel_size=1):
    """Decoder layers per pipeline stage, first stage first, as vLLM splits them
    (vllm/distributed/utils.py get_pp_indices, without VLLM_PP_LAYER_PARTITION): every stage
    gets layers // PP; the remainder goes one each to the stages before the last, from the
    second-to-last backwards (the last stage already holds the final norm and lm_head, the
    first the embedding). 126 layers over 4 stages: [31, 32, 32, 31]; 61 over 2: [31, 30].
    Raises ModelConfigError when PP exceeds the layers (a stage would be empty)."""
    layers, pp = int(layers), int(pipeline_parallel_size or 1)
    if pp < 1 or pp > layers:
        raise ModelConfigError("pipeline_parallel_size=%d is more than the model's %d hidden layers" % (pp, layers))
    stages = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        stages[-i] += 1
    return stages


def pp_stage(config, pipeline_parallel_size=1, stage=0):
    """One pipeline stage of a model: (first layer, layers, is first stage, is last stage)."""
    _heads, _kv_heads, layers = attention_shape(config)
    stages = pp_stage_layers(layers, pipeline_parallel_size)
    stage = int(stage)
    if not 0 <= stage < len(stages):
        raise ModelConfigError("stage %d of %d pipeline stages" % (stage, len(stages)))
    return sum(stages[:stage]), stages[stage], stage == 0, stage == len(stages) - 1


# ---------------------------------------------------------------- KV cache

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def weight_dtype(config, quantization=None, dtype="auto", on_gpu=False):
    """The dtype the engine runs the weights in: the pin when there is one (not 'auto');
    else the checkpoint's (model_dtype), which vLLM on a GPU runs in bfloat16 when it is
    float32, and AWQ/GPTQ checkpoints in float16 (their kernels' supported activation dtype).
    quantization: what quantization_of returned, or None."""
    if dtype and dtype != "auto":
        return dtype
    chosen = model_dtype(config)
    if on_gpu and chosen == "float32":
        chosen = "bfloat16"
    if quantization and quantization.get("method") in ("awq", "gptq") and chosen == "bfloat16":
        chosen = "float16"
    return chosen


def model_dtype(config, dtype="auto"):
    """The dtype weights and the 'auto' KV cache use: the pin, else config.json's
    torch_dtype (newer configs: dtype), else bfloat16. vLLM's 'auto' keeps float32
    checkpoints in float32 on CPU and casts them to bfloat16 on GPU (vllm/config/model.py
    _get_and_verify_dtype): pass the platform's choice as `dtype` when it differs."""
    if dtype and dtype != "auto":
        return dtype
    config = text_config(config)
    return config.get("torch_dtype") or config.get("dtype") or "bfloat16"


def head_dim(config):
    config = text_config(config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    return int(config["hidden_size"]) // int(config["num_attention_heads"])


def kv_bytes_per_token(
    config, tensor_parallel_size=1, kv_cache_dtype="auto", dtype="auto", pipeline_parallel_size=1, stage=0
):
    """KV cache bytes one token takes on one GPU (all the layers of its pipeline stage: every
    layer without pipeline parallelism; pp_stage_layers otherwise).

    - MHA/GQA: 2 (K and V) x KV heads on this rank x head_dim x bytes, per layer. KV heads
      split over TP ranks, or one replicated head per rank when TP exceeds them
      (vllm/model_executor/layers/linear.py QKVParallelLinear).
    - MLA (DeepSeek V2/V3): one latent vector of kv_lora_rank + qk_rope_head_dim per layer,
      the same on every rank: TP does not split it (vllm/attention/backends/mla, "MLA
      caches the compressed latent, replicated across TP").
    - kv_cache_dtype fp8 stores 1 byte per element; 'auto' uses the model dtype.
    """
    config = text_config(config)
    layers = pp_stage(config, pipeline_parallel_size, stage)[1]
    kv_dtype = model_dtype(config, dtype) if kv_cache_dtype in (None, "auto") else kv_cache_dtype
    size = DTYPE_BYTES[kv_dtype]
    if config.get("kv_lora_rank"):
        return layers * (int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim", 0))) * size
    return layers * 2 * kv_heads_per_gpu(config, tensor_parallel_size) * head_dim(config) * size


def kv_cache_tokens(kv_bytes, bytes_per_token, block_size=16):
    """Tokens a KV budget holds: whole blocks only (the engine allocates block_size-token pages)."""
    if bytes_per_token <= 0:
        return 0
    blocks = int(kv_bytes) // (int(bytes_per_token) * int(block_size))
    return blocks * int(block_size)


def logged_kv_tokens(num_blocks, block_size, max_model_len):
    """The token count vLLM logs as "KV cache size: N tokens" (v1/core/kv_cache_utils.py
    get_kv_cache_capacity): max concurrency (blocks / blocks per full-length request) times
    max_model_len. Equal to num_blocks x block_size when max_model_len is a whole number of
    blocks."""
    per_request = -(-int(max_model_len) // int(block_size))
    return int(num_blocks / per_request * int(max_model_len))


# ---------------------------------------------------------------- parameters and weights


def moe_shape(config):
    """A mixture-of-experts model's shape: (experts, expert intermediate size, shared
    experts, dense leading layers), or None for a dense model."""
    experts = config.get("num_local_experts") or config.get("n_routed_experts") or config.get("num_experts")
    if not experts:
        return None
    inter = config.get("moe_intermediate_size") or config.get("intermediate_size")
    return (
        int(experts),
        int(inter),
        int(config.get("n_shared_experts") or 0),
        int(config.get("first_k_dense_replace") or 0),
    )


def parameter_groups(config, pipeline_parallel_size=1, stage=0):
    """Parameter counts by how engines store them: {'embedding', 'lm_head', 'linear', 'other'},
    of the whole model, or of one pipeline stage (pp_stage_layers): its decoder layers (a
    MoE model's dense leading layers fall in the first stages), the embedding on the first
    stage, the final norm and lm_head on the last. A tied lm_head is its own copy of the
    embedding on the last stage when PP > 1 (vLLM models/llama.py LlamaModel builds
    embed_tokens on the first rank, and on the last when tie_word_embeddings, for the lm_head
    to share); it counts under 'embedding' there.

    Llama-style decoder layers: attention projections (q, k, v, o; MLA's low-rank q/kv
    projections for DeepSeek V2/V3), a SwiGLU MLP of three matrices, or a mixture of experts
    (each expert a SwiGLU MLP, plus shared experts and a router), two norms per layer. Biases
    on q/k/v for Qwen2. 'linear' are the matrices quantization applies to; embeddings and
    lm_head stay in 16-bit under AWQ/GPTQ/FP8 checkpoints.
    """
    config = text_config(config)
    hidden = int(config["hidden_size"])
    start, layers, first, last = pp_stage(config, pipeline_parallel_size, stage)
    heads = int(config["num_attention_heads"])
    vocab = int(config["vocab_size"])
    if config.get("kv_lora_rank"):
        q_rank = int(config.get("q_lora_rank") or 0)
        nope, rope = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"])
        v_dim = int(config["v_head_dim"])
        kv_rank = int(config["kv_lora_rank"])
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        attention = q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
        attn_other = (q_rank + kv_rank) if q_rank else kv_rank  # the low-rank norms
    else:
        dim = head_dim(config)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        attention = hidden * heads * dim * 2 + hidden * kv_heads * dim * 2
        attn_other = (heads + 2 * kv_heads) * dim if config.get("model_type") == "qwen2" else 0
    dense_mlp = 3 * hidden * int(config["intermediate_size"])
    moe = moe_shape(config)
    if moe:
        experts, inter, shared, dense_layers = moe
        dense_here = max(0, min(start + layers, dense_layers) - start)  # this stage's dense leading layers
        expert_layers = layers - dense_here
        mlp = dense_here * dense_mlp + expert_layers * (experts + shared) * 3 * hidden * inter
        router = expert_layers * hidden * experts
    else:
        mlp, router = layers * dense_mlp, 0
    tied = bool(config.get("tie_word_embeddings"))
    embedding = vocab * hidden if first or (tied and last) else 0
    lm_head = vocab * hidden if last and not tied else 0
    return {
        "embedding": embedding,
        "lm_head": lm_head,
        "linear": layers * attention + mlp,
        "other": layers * (2 * hidden + attn_other) + (hidden if last else 0) + router,
    }


def parameter_count(config):
    return sum(parameter_groups(config).values())


# ---------------------------------------------------------------- quantization and weights per GPU

# vLLM pads the vocabulary of VocabParallelEmbedding and ParallelLMHead to a multiple of 64
# before splitting it over TP ranks (DEFAULT_VOCAB_PADDING_SIZE,
# vllm/model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64
# Engine spellings of the same checkpoint formats (vLLM picks the Marlin kernels itself).
_QUANT_FAMILY = {
    "awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq", "fp8": "fp8",
    "compressed-tensors": "compressed-tensors", "none": None,
}  # fmt: skip


def quantization_of(config, pin=None):
    """How the engine stores the linear weights: {'method', 'bits', 'group_size', 'block'}.

    Read from config.json's quantization_config (AutoAWQ and GPTQ write quant_method, bits
    or w_bit, group_size or q_group_size; FP8 checkpoints write quant_method fp8 and, for
    DeepSeek V3, weight_block_size; llm-compressor writes compressed-tensors config_groups).
    A pin must match the checkpoint: vLLM refuses --quantization awq on a checkpoint that is
    not AWQ. A pinned fp8 on a 16-bit checkpoint is vLLM's online FP8 quantization. Raises
    ModelConfigError with the fix when the pin and the checkpoint disagree.
    """
    config = text_config(config)
    qc = config.get("quantization_config") or {}
    ckpt_raw = str(qc.get("quant_method") or "").lower() or None
    ckpt = _QUANT_FAMILY.get(ckpt_raw, ckpt_raw)
    pinned = _QUANT_FAMILY.get(pin, pin) if pin not in (None, "auto") else "auto"
    if pinned != "auto" and pinned is None and ckpt:
        raise ModelConfigError(
            "quantization=none, but the checkpoint is quantized (config.json quantization_config.quant_method=%s); "
            "drop the pin or use the 16-bit checkpoint" % ckpt_raw
        )
    if pinned not in ("auto", None, "fp8") and pinned != ckpt:
        raise ModelConfigError(
            "quantization=%s, but the checkpoint's config.json %s; use a %s checkpoint or drop the pin"
            % (pin, "says quant_method=%s" % ckpt_raw if ckpt else "has no quantization_config", pin.upper())
        )
    if pinned == "fp8" and ckpt not in (None, "fp8"):
        raise ModelConfigError(
            "quantization=fp8, but the checkpoint is already quantized with %s; drop the pin" % ckpt_raw
        )
    method = ckpt if pinned == "auto" else (pinned or None)
    if method is None:
        return {"method": None, "bits": None, "group_size": None, "block": None}
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "fp8":
        block = qc.get("weight_block_size")
        return {"method": "fp8", "bits": 8, "group_size": None, "block": list(block) if block else None}
    if method in ("awq", "gptq"):
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        return {"method": method, "bits": bits, "group_size": group, "block": None}
    raise ModelConfigError(
        "quantization %s is not one the planner can size (it knows AWQ, GPTQ, FP8 and compressed-tensors "
        "int4/int8/fp8); pin the memory options by hand" % ckpt_raw
    )


def _compressed_tensors(qc):
    for group in (qc.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        bits = int(weights.get("num_bits") or 8)
        if weights.get("type") == "float":
            return {"method": "fp8", "bits": 8, "group_size": None, "block": weights.get("block_structure")}
        size = weights.get("group_size")
        return {"method": "int%d" % bits, "bits": bits, "group_size": int(size) if size else None, "block": None}
    raise ModelConfigError("compressed-tensors quantization_config has no config_groups with weights")


def linear_bytes_per_parameter(quant, dtype_bytes):
    """Bytes one quantized-layer parameter takes, scales and zero points included.

    - AWQ/GPTQ b-bit with group g: the packed weight b/8 bytes, one fp16 scale (2 bytes) and one
      packed b-bit zero point per group of g inputs: b/8 + 2/g + b/(8 g). 4-bit, g=128 gives
      0.5195 bytes per parameter (AutoAWQ qweight/qzeros/scales tensor shapes; GPTQ's
      qweight/qzeros/scales are the same sizes, its g_idx is one int32 per input row).
    - FP8: 1 byte, plus one fp32 scale per 128x128 block for block-quantized checkpoints
      (DeepSeek V3's weight_block_size) or one per tensor.
    """
    if not quant or not quant.get("method"):
        return float(dtype_bytes)
    if quant["method"] == "fp8":
        block = quant.get("block")
        return 1.0 + (4.0 / (block[0] * block[1]) if block and len(block) == 2 else 0.0)
    bits = quant.get("bits") or 4
    group = quant.get("group_size")
    per = bits / 8.0
    if group and group > 0:
        per += 2.0 / group + bits / 8.0 / group
    return per


def padded_vocab(vocab):
    """The vocabulary as vLLM allocates it: rounded up to a multiple of VOCAB_PADDING."""
    return -(-int(vocab) // VOCAB_PADDING) * VOCAB_PADDING


def weights_per_gpu(config, tensor_parallel_size=1, dtype="auto", quantization=None, pipeline_parallel_size=1, stage=0):
    """Bytes of weights one TP rank holds, by part: {'linear', 'embedding', 'lm_head', 'other',
    'rotary', 'total'}; with pipeline parallelism, a rank of pipeline stage `stage`
    (parameter_groups: its layers, the embedding on the first stage, lm_head and final norm
    on the last; every stage builds the rotary cache for its attention layers).

    How vLLM stores them (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py,
    fused_moe/layer.py, models/llama.py, models/deepseek_v2.py):
    - column/row-parallel matrices (q, o, MLP, experts: FusedMoE splits every expert's
      intermediate size over TP by default) hold 1/TP each; K and V hold their KV heads'
      share, or one replicated head when TP exceeds the KV heads (QKVParallelLinear);
    - MLA's down-projections (q_a_proj, kv_a_proj_with_mqa) and the MoE router are
      ReplicatedLinear: every rank holds them whole;
    - embedding and lm_head are vocab-parallel over the vocabulary padded to 64, in the
      model dtype even in AWQ/GPTQ/FP8 checkpoints; a tied lm_head shares the embedding;
    - norms are replicated; the rotary cos/sin cache is one [max_position, rotary_dim] tensor
      in the model dtype (rotary_embedding.py; 32 MiB for Llama 3.1's 131072 positions).
    The 8B check: 8.030e9 x 2 B + 32 MiB = 14.99 GiB, the "Model loading took 14.99 GiB"
    vLLM logs for Llama-3.1-8B-Instruct on one GPU.
    """
    config = text_config(config)
    tp = int(tensor_parallel_size or 1)
    dbytes = DTYPE_BYTES[weight_dtype(config, quantization, dtype)]
    hidden = int(config["hidden_size"])
    layers = pp_stage(config, pipeline_parallel_size, stage)[1]
    heads = int(config["num_attention_heads"])
    groups = parameter_groups(config, pipeline_parallel_size, stage)
    if config.get("kv_lora_rank"):
        # q_a_proj and kv_a_proj_with_mqa: ReplicatedLinear, whole on every rank
        q_rank = int(config.get("q_lora_rank") or 0)
        whole = layers * hidden * (q_rank + int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"]))
        split_linear = (groups["linear"] - whole) / tp + whole
    else:
        # K and V: this rank's KV heads (split, or one replicated head)
        dim = head_dim(config)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        kv_all = layers * 2 * hidden * kv_heads * dim
        kv_rank = layers * 2 * hidden * kv_heads_per_gpu(config, tp) * dim
        split_linear = (groups["linear"] - kv_all) / tp + kv_rank
    linear = split_linear * linear_bytes_per_parameter(quantization, dbytes)
    vocab_rank = padded_vocab(config["vocab_size"]) // tp
    embedding = vocab_rank * hidden * dbytes if groups["embedding"] else 0
    lm_head = vocab_rank * hidden * dbytes if groups["lm_head"] else 0
    other = groups["other"] * dbytes
    rotary_dim = int(config.get("qk_rope_head_dim") or 0) or head_dim(config)
    rotary = int(config.get("max_position_embeddings") or 0) * rotary_dim * dbytes
    parts = {
        "linear": int(linear),
        "embedding": int(embedding),
        "lm_head": int(lm_head),
        "other": int(other),
        "rotary": int(rotary),
    }
    parts["total"] = sum(parts.values())
    return parts
