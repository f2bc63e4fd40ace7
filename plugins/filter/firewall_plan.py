# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter over gpufleet's firewall planner (logic in module_utils/_firewall.py).

Documented in firewall_plan.yml beside this file (the sidecar ansible-doc reads)."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._firewall import plan_firewall


def firewall_plan(params, host_vars=None, roles=None):
    return plan_firewall(params, host_vars or {}, roles or [])


class FilterModule:
    def filters(self):
        return {"firewall_plan": firewall_plan}
