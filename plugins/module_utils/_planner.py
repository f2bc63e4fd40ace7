# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The capacity planner (private to gpufleet.serving). Pure Python, no torch.

This first piece holds the model-shape rules that decide whether a parallel layout can
load at all; the memory budget grows here next (weights, KV cache, activations).
"""

from __future__ import annotations

import json


class ModelConfigError(ValueError):
    pass


def _text_config(config):
    """Multimodal and some newer configs nest the language model under text_config."""
    if isinstance(config.get("text_config"), dict) and "num_attention_heads" not in config:
        merged = dict(config["text_config"])
        merged.setdefault("architectures", config.get("architectures"))
        return merged
    return config


def load_model_config(text):
    """Parse a model's config.json text into a dict (raises ModelConfigError)."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ModelConfigError("config.json is not valid JSON: %s" % exc) from None
    if not isinstance(config, dict):
        raise ModelConfigError("config.json is not a JSON object")
    return _text_config(config)


def attention_shape(config):
    """(attention heads, KV heads, layers) of a Hugging Face config dict.

    KV heads default to the attention heads (plain multi-head attention) when the config
    has no num_key_value_heads, as transformers and vLLM do; MLA models (DeepSeek V2/V3)
    keep one latent KV "head" shared by all heads.
    """
    config = _text_config(config)
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
    _, kv_heads, _ = attention_shape(config)
    if config.get("kv_lora_rank"):
        return 1
    return max(1, kv_heads // int(tensor_parallel_size))


# ---------------------------------------------------------------- KV cache

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def model_dtype(config, dtype="auto"):
    """The dtype weights and the 'auto' KV cache use: the pin, else config.json's
    torch_dtype (newer configs: dtype), else bfloat16. vLLM's 'auto' keeps float32
    checkpoints in float32 on CPU and casts them to bfloat16 on GPU (vllm/config/model.py
    _get_and_verify_dtype): pass the platform's choice as `dtype` when it differs."""
    if dtype and dtype != "auto":
        return dtype
    config = _text_config(config)
    return config.get("torch_dtype") or config.get("dtype") or "bfloat16"


def head_dim(config):
    config = _text_config(config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    return int(config["hidden_size"]) // int(config["num_attention_heads"])


def kv_bytes_per_token(config, tensor_parallel_size=1, kv_cache_dtype="auto", dtype="auto"):
    """KV cache bytes one token takes on one GPU (all layers).

    - MHA/GQA: 2 (K and V) x KV heads on this rank x head_dim x bytes, per layer. KV heads
      split over TP ranks, or one replicated head per rank when TP exceeds them
      (vllm/model_executor/layers/linear.py QKVParallelLinear).
    - MLA (DeepSeek V2/V3): one latent vector of kv_lora_rank + qk_rope_head_dim per layer,
      the same on every rank: TP does not split it (vllm/attention/backends/mla, "MLA
      caches the compressed latent, replicated across TP").
    - kv_cache_dtype fp8 stores 1 byte per element; 'auto' uses the model dtype.
    """
    config = _text_config(config)
    layers = int(config.get("num_hidden_layers"))
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


def _moe(config):
    """(experts, expert intermediate size, shared experts, dense leading layers) or None."""
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


def parameter_groups(config):
    """Parameter counts by how engines store them: {'embedding', 'lm_head', 'linear', 'other'}.

    Llama-style decoder layers: attention projections (q, k, v, o; MLA's low-rank q/kv
    projections for DeepSeek V2/V3), a SwiGLU MLP of three matrices, or a mixture of experts
    (each expert a SwiGLU MLP, plus shared experts and a router), two norms per layer. Biases
    on q/k/v for Qwen2. 'linear' are the matrices quantization applies to; embeddings and
    lm_head stay in 16-bit under AWQ/GPTQ/FP8 checkpoints.
    """
    config = _text_config(config)
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
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
    moe = _moe(config)
    if moe:
        experts, inter, shared, dense_layers = moe
        expert_layers = layers - dense_layers
        mlp = dense_layers * dense_mlp + expert_layers * (experts + shared) * 3 * hidden * inter
        router = expert_layers * hidden * experts
    else:
        mlp, router = layers * dense_mlp, 0
    embedding = vocab * hidden
    lm_head = 0 if config.get("tie_word_embeddings") else vocab * hidden
    return {
        "embedding": embedding,
        "lm_head": lm_head,
        "linear": layers * attention + mlp,
        "other": layers * (2 * hidden + attn_other) + hidden + router,
    }


def parameter_count(config):
    return sum(parameter_groups(config).values())
