# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over gpufleet's engine planner (logic in module_utils/_engine_plan.py and the
modules it names).

Documented in engine_plan.yml, model_inventory.yml beside this file (the sidecars ansible-doc reads)."""

from __future__ import annotations

import base64

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan


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
