# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the fleet's model catalog and pulls (logic in module_utils/_models.py).

Documented in model_store_plan.yml, model_pull_plan.yml and model_pull_facts.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._models import plan_pulls, plan_store, pull_facts


def model_store_plan(catalog, params=None):
    return plan_store(catalog, params or {})


def model_pull_plan(pulls, catalog_names=None, store=None, host="", facts=None):
    return plan_pulls(pulls, list(catalog_names or []), store or None, host, facts or {})


def model_pull_facts(manifests, spaces=None, margin=0):
    return pull_facts(manifests, spaces or [], margin)


class FilterModule:
    def filters(self):
        return {"model_store_plan": model_store_plan, "model_pull_plan": model_pull_plan,
                "model_pull_facts": model_pull_facts}  # fmt: skip
