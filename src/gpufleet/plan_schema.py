"""The JSON Schema of `gpufleet plan --json` (draft 2020-12), shipped with the package for
scripts that read the plan: `gpufleet plan --json-schema` prints it.

Every outcome is one object with `schema_version`, `fits` and `errors` (sentences): a plan
(exit 0 when it fits, 2 when it does not) has every key of the memory plan
(module_utils/_memory_plan.PLAN_KEYS, documented in docs/memory-plan.md); bad input (exit 1)
has `input_errors` instead, one record per problem, naming the flag, its value and the fix.
`schema_version` goes up when a key changes meaning or goes away.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

_BYTES = {"type": ["integer", "null"], "minimum": 0}
_TEXTS = {"type": "array", "items": {"type": "string"}}
# a figure the plan leaves to the engine (SGLang's own choice, a CPU instance) is null
_COUNT = {"type": ["integer", "null"], "minimum": 0}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://gpufleet.invalid/schemas/plan-%d.json" % SCHEMA_VERSION,
    "title": "gpufleet plan --json",
    "type": "object",
    "required": ["schema_version", "fits", "errors"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "fits": {"type": "boolean"},
        "errors": _TEXTS,
        "warnings": _TEXTS,
        "reasons": _TEXTS,
        "advice": {"type": ["array", "null"], "items": {"type": "string"}},
        "input_errors": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["variable", "value", "message", "fix"],
                "properties": {
                    "variable": {"type": ["string", "null"]},
                    "message": {"type": "string", "minLength": 1},
                    "fix": {"type": "string"},
                },
            },
        },
        "engine": {"enum": ["vllm", "sglang"]},
        "accelerator": {"type": "string"},
        "gpus": {"type": "integer", "minimum": 1},
        "nodes": {"type": "integer", "minimum": 1},
        "tensor_parallel_size": {"type": "integer", "minimum": 1},
        "pipeline_parallel_size": _COUNT,
        "pipeline_stage_layers": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}},
        "max_model_len": _COUNT,
        "max_num_seqs": _COUNT,
        "max_num_batched_tokens": _COUNT,
        "kv_cache_tokens": _COUNT,
        "max_concurrency": {"type": ["number", "null"], "minimum": 0},
        "level": _COUNT,
        "gpu_memory_utilization": {"type": ["number", "null"]},
        "weights_bytes_per_gpu": _BYTES,
        "kv_cache_bytes_per_gpu": _BYTES,
        "shortfall_bytes_per_gpu": _BYTES,
        "engine_args": {"type": "object"},
        "options": {"type": "object"},
    },
    # a plan carries every key of the memory plan; bad input carries its records instead
    "oneOf": [
        {"required": ["input_errors"], "properties": {"fits": {"const": False}, "errors": {"minItems": 1}}},
        {"not": {"required": ["input_errors"]}, "required": []},
    ],
}


def plan_schema(plan_keys=None) -> dict:
    """The schema, with the memory plan's keys (PLAN_KEYS) required of a plan."""
    if plan_keys is None:
        from gpufleet._collection import ensure_importable

        ensure_importable()
        from ansible_collections.gpufleet.serving.plugins.module_utils._memory_plan import PLAN_KEYS

        plan_keys = PLAN_KEYS
    schema = dict(SCHEMA)
    schema["oneOf"] = [SCHEMA["oneOf"][0], {"not": {"required": ["input_errors"]}, "required": sorted(plan_keys)}]
    # a key that is neither the plan's nor the envelope's (the retired "schema") is not this version
    schema["additionalProperties"] = False
    schema["properties"] = dict(SCHEMA["properties"], **{k: {} for k in plan_keys if k not in SCHEMA["properties"]})
    return schema
