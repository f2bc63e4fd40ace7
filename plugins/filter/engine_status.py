# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter behind playbooks/status.yml (logic in module_utils/_status.py).

Documented in engine_status.yml beside this file (the sidecar ansible-doc reads)."""

from __future__ import annotations

import base64
import posixpath

from ansible_collections.gpufleet.serving.plugins.module_utils._status import (
    MONITORING_QUERIES,
    host_status,
    monitoring_status,
)


def _text(result):
    content = (result or {}).get("content")
    return base64.b64decode(content).decode("utf-8", "replace") if content else None


def engine_status(
    folders,
    deployed=None,
    units=None,
    metrics=None,
    gpu=None,
    nccl_env=None,
    pending=None,
    quarantine=None,
    placement=None,
    phases=None,
):
    """placement: the engine_placement module's `placement` (per instance name); phases: the
    engine_phase module's `phases` (per instance name)."""
    instances = []
    for i, folder in enumerate(folders or []):
        unit = (units or [])[i] if i < len(units or []) else {}
        page = (metrics or [])[i] if i < len(metrics or []) else {}
        mark = (pending or [])[i] if i < len(pending or []) else {}
        held = (quarantine or [])[i] if i < len(quarantine or []) else {}
        name = posixpath.basename(folder.get("path", "").rstrip("/"))
        instances.append(
            {
                "name": name,
                "deployed": _text((deployed or [])[i] if i < len(deployed or []) else None),
                "active": ((unit or {}).get("status") or {}).get("ActiveState"),
                "metrics": (page or {}).get("content") if (page or {}).get("status") == 200 else None,
                "pending": bool(((mark or {}).get("stat") or {}).get("exists")),
                "quarantine": _text(held),
                "placement": (placement or {}).get(name),
                "start": (phases or {}).get(name),
            }
        )
    return host_status(instances, gpu=gpu, nccl_env=nccl_env)


def monitoring_queries(_ignored=None):
    return dict(MONITORING_QUERIES)


def monitoring_answers(results):
    """The uri results of status.yml's queries (loop over monitoring_queries | dict2items)."""
    return monitoring_status({r["item"]["key"]: r.get("json") for r in results or [] if r.get("status") == 200})


class FilterModule:
    def filters(self):
        return {"engine_status": engine_status, "monitoring_queries": monitoring_queries,
                "monitoring_answers": monitoring_answers}  # fmt: skip
