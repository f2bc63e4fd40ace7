# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter over gpufleet's proxy planner (logic in module_utils/_proxy.py).

Documented in proxy_plan.yml beside this file (the sidecar ansible-doc reads)."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._proxy import plan_proxy


def proxy_plan(params, engines=None, published=None):
    return plan_proxy(params, engines, published)


class FilterModule:
    def filters(self):
        return {"proxy_plan": proxy_plan}
