# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over gpufleet's NCCL environment planner (logic lives in module_utils/_nccl.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: nccl_env
short_description: Merge and validate the NCCL/CUDA environment layers of a host
version_added: "0.1.0"
description:
  - Layers, later wins - role defaults, the topology decision from C(gpufleet_gpu) facts,
    group values, host values. Returns the merged environment, where each key came from,
    the topology's reasons, and a list of errors (empty when every value is valid).
options:
  _input:
    description: The host's C(gpufleet_gpu) facts (may be empty).
    type: dict
    required: true
  defaults:
    description: Role defaults layer.
    type: dict
  group:
    description: Group layer.
    type: dict
  host:
    description: Host layer.
    type: dict
  use_topology:
    description: Whether the topology layer takes part.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Plan the NCCL environment
  ansible.builtin.set_fact:
    plan: >-
      {{ ansible_facts.gpufleet_gpu | gpufleet.serving.nccl_env(
           defaults=nccl_env_defaults, group=nccl_env_group, host=nccl_env_host) }}
"""

RETURN = r"""
_value:
  description: >-
    C(env) (name to value), C(origin) (name to layer), C(notes) (name to reason) and
    C(errors) (list of sentences).
  type: dict
"""

from ansible_collections.gpufleet.serving.plugins.module_utils._nccl import plan_env


def nccl_env(gpu, defaults=None, group=None, host=None, use_topology=True):
    return plan_env(gpu=gpu or {}, defaults=defaults, group=group, host=host, use_topology=use_topology)


class FilterModule:
    def filters(self):
        return {"nccl_env": nccl_env}
