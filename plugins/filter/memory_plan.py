# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory planner as a filter: the plan the engine role makes for an instance given these
GPUs (module_utils/_engine_plan.plan_for, also behind `gpufleet plan`).

Documented in memory_plan.yml beside this file (the sidecar ansible-doc reads)."""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan_for
from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import ModelConfigError, load_model_config


def memory_plan(
    config, gpus=1, gpu_memory_mib=None, gpu_memory_gib=None, engine="vllm", pins=None, concurrency=None, nodes=1
):
    try:
        parsed = load_model_config(config if isinstance(config, str) else json.dumps(dict(config)))
        if not gpu_memory_mib and not gpu_memory_gib:
            raise _memory_plan.PlanInputError("give gpu_memory_mib or gpu_memory_gib")
        plan = plan_for(
            parsed,
            gpus=gpus,
            gpu_memory_bytes=_memory_plan.usable_bytes(gpu_memory_mib, gpu_memory_gib),
            engine=engine,
            pins=pins,
            concurrency=concurrency,
            nodes=nodes,
        )
    except (ModelConfigError, _memory_plan.PlanInputError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("memory_plan: %s" % exc) from None
    return plan


class FilterModule:
    def filters(self):
        return {"memory_plan": memory_plan}
