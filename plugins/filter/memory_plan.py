# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory planner as a filter (logic in module_utils/_memory_plan.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: memory_plan
short_description: What fits on the GPUs for a model, and the engine settings that make it fit
version_added: "0.1.0"
description:
  - The same planner as C(gpufleet plan) and the engine role's preflight. It computes, per GPU,
    the weights, KV cache, activation peak, CUDA graph memory and the context/NCCL memory the
    engine keeps outside its budget, and chooses the settings not pinned.
  - Returns C(fits), C(errors), C(warnings), C(reasons), C(tensor_parallel_size),
    C(weights_bytes_per_gpu), C(kv_bytes_per_token_per_gpu), C(kv_cache_tokens),
    C(max_model_len), C(max_concurrency), C(options) (engine option names) and
    C(engine_args) (engine flags).
options:
  _input:
    description: The model's config.json, as text or as a mapping.
    type: raw
    required: true
  gpus:
    description: GPUs the instance may use.
    type: int
    default: 1
  gpu_memory_mib:
    description: Memory of one GPU as nvidia-smi lists it (C(memory_total_mib) in C(gpufleet_gpu) facts).
    type: int
  gpu_memory_gib:
    description: Memory of one GPU in GiB, when C(gpu_memory_mib) is not given.
    type: float
  engine:
    description: The engine.
    type: str
    choices: [vllm, sglang]
    default: vllm
  pins:
    description: Engine options to keep as given (tensor_parallel_size, max_model_len, max_num_seqs, ...).
    type: dict
  concurrency:
    description: Full-length requests that must fit at once (default max_num_seqs when pinned, else 8).
    type: int
"""

EXAMPLES = r"""
- name: Plan Qwen2.5-14B-Instruct-AWQ on this host's first GPU
  ansible.builtin.set_fact:
    plan: >-
      {{ lookup('ansible.builtin.file', '/models/qwen14b-awq/config.json')
         | gpufleet.serving.memory_plan(gpu_memory_mib=ansible_facts.gpufleet_gpu.devices[0].memory_total_mib,
                                        pins={'max_model_len': 8192, 'max_num_seqs': 32}) }}
"""

RETURN = r"""
_value:
  description: The plan (see description).
  type: dict
"""

import json

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan
from ansible_collections.gpufleet.serving.plugins.module_utils._planner import ModelConfigError, load_model_config


def memory_plan(config, gpus=1, gpu_memory_mib=None, gpu_memory_gib=None, engine="vllm", pins=None, concurrency=None):
    try:
        parsed = load_model_config(config if isinstance(config, str) else json.dumps(dict(config)))
        if not gpu_memory_mib and not gpu_memory_gib:
            raise _memory_plan.PlanInputError("give gpu_memory_mib or gpu_memory_gib")
        plan = _memory_plan.plan_memory(
            parsed,
            gpus=gpus,
            gpu_memory_bytes=_memory_plan.usable_bytes(gpu_memory_mib, gpu_memory_gib),
            engine=engine,
            pins=pins,
            concurrency=concurrency,
        )
    except (ModelConfigError, _memory_plan.PlanInputError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("memory_plan: %s" % exc) from None
    plan["engine_args"] = _memory_plan.engine_args(plan.get("options") or {}, engine)
    return plan


class FilterModule:
    def filters(self):
        return {"memory_plan": memory_plan}
