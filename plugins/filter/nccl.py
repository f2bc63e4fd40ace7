# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over gpufleet's NCCL environment planner (logic lives in module_utils/_nccl.py).

Documented in nccl_env.yml beside this file (the sidecar ansible-doc reads)."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._nccl import plan_env


def nccl_env(gpu, defaults=None, group=None, host=None, use_topology=True):
    return plan_env(gpu=gpu or {}, defaults=defaults, group=group, host=host, use_topology=use_topology)


class FilterModule:
    def filters(self):
        return {"nccl_env": nccl_env}
