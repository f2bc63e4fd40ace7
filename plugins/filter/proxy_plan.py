# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter over gpufleet's proxy planner (logic in module_utils/_proxy.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: proxy_plan
short_description: Validate the proxy settings against the host's engines and pick its upstream
version_added: "0.1.0"
description:
  - Takes the C(proxy_*) settings (without the prefix) and C(gpufleet_engines), and returns
    C(errors) (sentences naming the variable and the fix, never a key's value), the upstream
    servers, the engine key to inject, the served model name and the monitored instances.
options:
  _input:
    description: The proxy settings, keys without the C(proxy_) prefix.
    type: dict
    required: true
  engines:
    description: The host's C(gpufleet_engines).
    type: list
    elements: dict
"""

EXAMPLES = r"""
- name: Plan the proxy
  ansible.builtin.set_fact:
    plan: "{{ {'listen_port': 8080, 'api_keys': keys} | gpufleet.serving.proxy_plan(gpufleet_engines) }}"
"""

RETURN = r"""
_value:
  description: C(errors), C(upstream), C(engine_key), C(model), C(instances), C(monitor).
  type: dict
"""

from ansible_collections.gpufleet.serving.plugins.module_utils._proxy import plan_proxy


def proxy_plan(params, engines=None):
    return plan_proxy(params, engines)


class FilterModule:
    def filters(self):
        return {"proxy_plan": proxy_plan}
