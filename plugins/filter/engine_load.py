# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The requests an engine holds, from its /metrics (logic in module_utils/_status.py).

Documented in engine_load.yml beside this file (the sidecar ansible-doc reads)."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._status import engine_load


class FilterModule:
    def filters(self):
        return {"engine_load": engine_load}
