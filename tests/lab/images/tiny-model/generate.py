"""Generate a tiny Llama-architecture model offline, for the lab's real vLLM engine.

Usage (inside the lab's vLLM image, which carries torch, transformers and tokenizers):
    python3 generate.py NAME OUT_DIR

The tokenizer is a byte-level BPE trained here on a few lines of text; the weights are
random (seeded, so the same NAME gives the same files). Nothing is downloaded. Shapes are
chosen so vLLM's CPU attention accepts them: head_dim 64 (head_dim 16 fails with
"Unsupported CPU attention configuration").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# name -> shape. Different layers / heads / KV heads / dtypes let tests check the
# planner's KV-cache arithmetic against the engine's own log line.
# hidden is 512, not less: with hidden 256 in bfloat16, vLLM CPU 0.32.0's worker dies of
# SIGILL (exit code -4) on the first forward pass on this lab's Xeon (AVX-512 + AMX); 512 runs
# (seen 2026-12-02: one-token and 8 concurrent 64-token streams).
PRESETS = {
    "tiny-llama": dict(layers=2, hidden=512, heads=8, kv_heads=2, head_dim=64, dtype="bfloat16"),
    "tiny-llama-mha": dict(layers=3, hidden=512, heads=8, kv_heads=8, head_dim=64, dtype="bfloat16"),
    "tiny-llama-gqa8": dict(layers=4, hidden=512, heads=8, kv_heads=1, head_dim=64, dtype="float32"),
    # the fleet lab's model store (issue 48): a few hundred MB of real safetensors in 100 MB shards,
    # pulled and verified by the gpu hosts (not served)
    "store-llama": dict(layers=8, hidden=1536, heads=24, kv_heads=8, head_dim=64, dtype="bfloat16", shard="100MB"),
}

CORPUS = [
    "gpufleet takes bare GPU hosts to fast, safe LLM endpoints.",
    "The quick brown fox jumps over the lazy dog.",
    "Tokens stream to the client one server-sent event at a time.",
    "NCCL, NUMA and memory plans are code, not blog posts.",
    "Hello! How can I help you today? Let me think step by step.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ' \" ! ?",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def main(name: str, out_dir: str) -> None:
    shape = PRESETS[name]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden"],
        intermediate_size=shape["hidden"] * 2,
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype=shape["dtype"],
    )
    model = LlamaForCausalLM(config).to(getattr(torch, shape["dtype"]))
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shape.get("shard", "5GB"))
    (out / "gpufleet-tiny-model.json").write_text(json.dumps({"name": name, **shape}, indent=2) + "\n")
    print("wrote %s: %s" % (out, json.dumps(shape)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
