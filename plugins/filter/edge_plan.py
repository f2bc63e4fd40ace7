# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over gpufleet's edge planner (logic in module_utils/_edge.py).

Documented in edge_plan.yml and edge_backends.yml beside this file (the sidecars ansible-doc reads)."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._edge import backends, plan_edge


def edge_plan(params, hosts, batch=None, held=None):
    return plan_edge(params, hosts, batch, held)


def edge_backends(names, hostvars):
    return backends(names, hostvars)


class FilterModule:
    def filters(self):
        return {"edge_plan": edge_plan, "edge_backends": edge_backends}
