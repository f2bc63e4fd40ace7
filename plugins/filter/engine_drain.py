# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a draining host waits on (logic in module_utils/_status.py).

Documented in engine_idle_targets.yml and engine_busy.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._status import busy, idle_targets


def engine_idle_targets(deployed, plan_instances=None, override=0):
    return idle_targets(deployed, plan_instances, override)


def engine_busy(results):
    return busy(results)


class FilterModule:
    def filters(self):
        return {"engine_idle_targets": engine_idle_targets, "engine_busy": engine_busy}
