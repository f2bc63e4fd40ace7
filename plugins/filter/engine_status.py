# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter behind playbooks/status.yml (logic in module_utils/_status.py).

Documented in engine_status.yml beside this file (the sidecar ansible-doc reads)."""

from __future__ import annotations

import base64
import posixpath

from ansible_collections.gpufleet.serving.plugins.module_utils._status import host_status


def _text(result):
    content = (result or {}).get("content")
    return base64.b64decode(content).decode("utf-8", "replace") if content else None


def engine_status(folders, deployed=None, units=None, metrics=None, gpu=None, nccl_env=None, pending=None):
    instances = []
    for i, folder in enumerate(folders or []):
        unit = (units or [])[i] if i < len(units or []) else {}
        page = (metrics or [])[i] if i < len(metrics or []) else {}
        mark = (pending or [])[i] if i < len(pending or []) else {}
        instances.append(
            {
                "name": posixpath.basename(folder.get("path", "").rstrip("/")),
                "deployed": _text((deployed or [])[i] if i < len(deployed or []) else None),
                "active": ((unit or {}).get("status") or {}).get("ActiveState"),
                "metrics": (page or {}).get("content") if (page or {}).get("status") == 200 else None,
                "pending": bool(((mark or {}).get("stat") or {}).get("exists")),
            }
        )
    return host_status(instances, gpu=gpu, nccl_env=nccl_env)


class FilterModule:
    def filters(self):
        return {"engine_status": engine_status}
