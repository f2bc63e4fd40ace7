# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of gpufleet's monitoring (logic in module_utils/_monitoring.py and _gpu_health.py).

Documented in monitoring_plan.yml, gpu_drain_xids.yml and engine_series.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import engine_series as _engine_series
from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_health import DRAIN_XIDS
from ansible_collections.gpufleet.serving.plugins.module_utils._monitoring import plan_monitoring


def monitoring_plan(fleet):
    return plan_monitoring(fleet or [])


def gpu_drain_xids(_ignored=None):
    return list(DRAIN_XIDS)


def engine_series(_ignored=None):
    return _engine_series()


class FilterModule:
    def filters(self):
        return {"monitoring_plan": monitoring_plan, "gpu_drain_xids": gpu_drain_xids, "engine_series": engine_series}
