# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over what each role publishes for the others (logic in module_utils/_published.py).

Documented in publish.yml and published.yml beside this file (the sidecars ansible-doc reads)."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._published import publish as _publish
from ansible_collections.gpufleet.serving.plugins.module_utils._published import published as _published


def publish(settings, role, engines=None, gpu_count=0):
    return _publish(role, settings or {}, engines=engines or [], gpu_count=gpu_count)


def published(hv, role):
    return _published(role, hv or {})


class FilterModule:
    def filters(self):
        return {"publish": publish, "published": published}
