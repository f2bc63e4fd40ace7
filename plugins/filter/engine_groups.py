# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over gpufleet's multi-node engine instances (logic in module_utils/_engine_group.py).

Documented in engine_groups.yml and engine_group_peers.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import (
    group_restarts,
    groups,
    mismatches,
    peers,
    probes,
    rollout_batches,
)


def engine_groups(hosts, hostvars):
    return groups(hosts, hostvars)


def engine_group_peers(all_groups, me):
    return peers(all_groups, me)


def engine_group_prints(instances, files):
    """instances: this host's planned multi-node instances (gpufleet_engine_plan); files: a find
    loop's results over their model folders (weight files' names and sizes). Returns
    {NAME: {nodes, print}}: what must be the same on every member."""
    by_model = {}
    for result in files or []:
        listed = sorted(
            ("%s %d" % (f["path"].rsplit("/", 1)[-1], f.get("size", 0)) for f in result.get("files") or []),
        )
        by_model[result.get("item")] = listed
    prints = {}
    for inst in instances or []:
        prints[inst["name"]] = {
            "nodes": inst["group"]["nodes"],
            "print": dict(inst["fingerprint"], model_files=by_model.get(inst["model"], [])),
        }
    return prints


def engine_group_mismatches(prints, hostvars, me):
    """Every difference between this host's prints and the other members' (their
    __engine_group_print in hostvars), and every member missing from the run."""
    return mismatches(prints, hostvars, me)


def engine_rollout_batches(hosts, all_groups, batch=1):
    return rollout_batches(hosts, all_groups, batch)


def engine_group_restarts(restarts, instances, hostvars):
    return group_restarts(restarts, instances, hostvars)


def engine_group_probes(instances):
    return probes(instances)


class FilterModule:
    def filters(self):
        return {
            "engine_groups": engine_groups,
            "engine_group_peers": engine_group_peers,
            "engine_group_prints": engine_group_prints,
            "engine_group_mismatches": engine_group_mismatches,
            "engine_rollout_batches": engine_rollout_batches,
            "engine_group_restarts": engine_group_restarts,
            "engine_group_probes": engine_group_probes,
        }
