# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter behind playbooks/status.yml (logic in module_utils/_status.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: engine_status
short_description: One host's status report from what its engines and GPUs say
version_added: "0.1.0"
description:
  - Reads each engine instance as deployed (its docker-run.args), whether its unit is active,
    and its load from /metrics (running and waiting requests, KV cache usage), with the host's
    driver version and NCCL P2P setting. C(gpufleet status) prints it.
options:
  _input:
    description: The instance folders (C(files) of ansible.builtin.find in the engine config folder).
    type: list
    elements: dict
    required: true
  args:
    description: Per folder, the ansible.builtin.slurp result of its docker-run.args (same order).
    type: list
    elements: dict
  units:
    description: Per folder, the ansible.builtin.systemd_service result of its unit (same order).
    type: list
    elements: dict
  metrics:
    description: Per folder, the ansible.builtin.uri result of its /metrics (same order).
    type: list
    elements: dict
  gpu:
    description: The host's C(gpufleet_gpu) facts (gpu_facts).
    type: dict
  nccl_env:
    description: Text of the NCCL environment file, or null when there is none.
    type: str
"""

EXAMPLES = r"""
- name: Report
  ansible.builtin.set_fact:
    gpufleet_status: >-
      {{ found.files | gpufleet.serving.engine_status(args=args.results, units=units.results,
         metrics=metrics.results, gpu=ansible_facts.gpufleet_gpu) }}
"""

RETURN = r"""
_value:
  description: C(driver_version), C(gpus), C(gpu_name), C(nccl), C(nccl_p2p_recommended) and C(engines)
    (per instance C(name), C(engine), C(image), C(model), C(port), C(tensor_parallel_size), C(gpus),
    C(unit), C(serving), C(running), C(waiting), C(kv_cache_usage)).
  type: dict
"""

import base64
import posixpath

from ansible_collections.gpufleet.serving.plugins.module_utils._status import host_status


def _text(result):
    content = (result or {}).get("content")
    return base64.b64decode(content).decode("utf-8", "replace") if content else None


def engine_status(folders, args=None, units=None, metrics=None, gpu=None, nccl_env=None):
    instances = []
    for i, folder in enumerate(folders or []):
        unit = (units or [])[i] if i < len(units or []) else {}
        page = (metrics or [])[i] if i < len(metrics or []) else {}
        instances.append(
            {
                "name": posixpath.basename(folder.get("path", "").rstrip("/")),
                "args": _text((args or [])[i] if i < len(args or []) else None),
                "active": ((unit or {}).get("status") or {}).get("ActiveState"),
                "metrics": (page or {}).get("content") if (page or {}).get("status") == 200 else None,
            }
        )
    return host_status(instances, gpu=gpu, nccl_env=nccl_env)


class FilterModule:
    def filters(self):
        return {"engine_status": engine_status}
