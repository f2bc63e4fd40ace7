# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over gpufleet's engine planner (logic in module_utils/_engines.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: engine_plan
short_description: Validate engine instances and render their container and engine command lines
version_added: "0.1.0"
description:
  - Takes C(gpufleet_engines) and returns C(errors) (sentences naming
    C(gpufleet_engines[i] (name\).field), the value and the fix) or, per instance, the
    C(docker run) arguments, the engine's own arguments, the NUMA placement and the
    shared-memory decision.
options:
  _input:
    description: The C(gpufleet_engines) list.
    type: list
    elements: dict
    required: true
  gpu:
    description: The host's C(gpufleet_gpu) facts.
    type: dict
  models:
    description: "Per model path: C(exists) (bool) and C(config) (config.json text or null)."
    type: dict
  host:
    description: "Host facts: C(numa_nodes) (list of C(node), C(cpus))."
    type: dict
  defaults:
    description: "Role settings: C(images) (engine_accelerator -> image), C(env_files), C(config_dir)."
    type: dict
"""

EXAMPLES = r"""
- name: Plan the engines
  ansible.builtin.set_fact:
    plan: "{{ gpufleet_engines | gpufleet.serving.engine_plan(gpu=ansible_facts.gpufleet_gpu, models=models) }}"
"""

RETURN = r"""
_value:
  description: C(errors) (list of sentences) and C(instances) (rendered, empty when there are errors).
  type: dict
"""
# model_inventory (same file) is documented in plugins/filter/model_inventory.yml

import base64

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import plan


def engine_plan(instances, gpu=None, models=None, host=None, defaults=None):
    return plan(instances, gpu=gpu, models=models, host=host, defaults=defaults)


def model_inventory(stat_results, slurp_results=None, downloads=None):
    """{path: {exists, config, pending_download}} from a stat loop over model folders and a
    slurp loop over their config.json files (each slurp item is a stat result). Paths in
    `downloads` without a config.json yet are marked pending_download."""
    models = {}
    for result in stat_results or []:
        models[result["item"]] = {"exists": bool((result.get("stat") or {}).get("exists")), "config": None}
    for result in slurp_results or []:
        path = (result.get("item") or {}).get("item")
        if path in models and result.get("content"):
            try:
                models[path]["config"] = base64.b64decode(result["content"]).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                models[path]["config"] = None
    for path in downloads or []:
        entry = models.setdefault(path, {"exists": False, "config": None})
        if entry["config"] is None:
            entry["pending_download"] = True
    return models


class FilterModule:
    def filters(self):
        return {"engine_plan": engine_plan, "model_inventory": model_inventory}
