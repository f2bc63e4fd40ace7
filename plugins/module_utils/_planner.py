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
