# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a changed engine instance restarts (private to gpufleet.serving).

A restart that fits starts a copy of the instance with its new settings first (the surge
copy, on port + SURGE_PORT_OFFSET unless surge_port says otherwise), so the proxy has a
ready backup while the instance itself restarts (start-before-stop); otherwise the
instance is stopped, then started. roles/engine/tasks/restart.yml carries it out.
"""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    ENGINE_INFO,
    is_type,
    normalized,
    option_for,
    options_of,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import render
from ansible_collections.gpufleet.serving.plugins.module_utils._placement import slice_name, slice_unit

SURGE_PORT_OFFSET = 1000
# Two vLLM copies share a GPU only when both budgets fit with room for a second CUDA context.
SURGE_SHARED_LIMIT = 0.9
GIB = 2.0**30


def surge_port(inst: dict):
    """The port of the instance's surge copy: surge_port, else port + SURGE_PORT_OFFSET."""
    if inst.get("surge_port") is not None or not is_type(inst.get("port"), int):
        return inst.get("surge_port")
    return inst["port"] + SURGE_PORT_OFFSET


def _cpu_room(inst, memory_plan, host, out):
    available = host.get("memory_available_mib")
    weights = (memory_plan or {}).get("weights_host_bytes")
    # KV space + weights + 1 GiB for the runtime (torch, the server, the tokenizer)
    need = int(inst.get("kv_cache_space_gib", 1)) * 2**30 + (weights or 0) + 2**30
    out["need_mib"] = int(need / 2**20)
    if not available or weights is None:
        out["why"] = "the host's free memory or the model's size is unknown"
    elif need > available * 2**20:
        out["why"] = "a copy needs %.1f GiB of host memory, %.1f GiB is free" % (need / GIB, available / 1024.0)
    else:
        out.update(fits=True, why="a copy needs %.1f GiB, %.1f GiB is free" % (need / GIB, available / 1024.0))


def _gpu_room(inst, instances, gpu, out):
    devices = {d.get("index"): d for d in gpu.get("devices") or []}
    mine = list(inst.get("gpus") or [])
    given = {g for other in instances if isinstance(other, dict) for g in other.get("gpus") or []}
    size = min([devices[g].get("memory_total_mib") or 0 for g in mine if g in devices] or [0])
    idle = [g for g in sorted(devices) if g not in given and (devices[g].get("memory_total_mib") or 0) >= size]
    engine = inst["engine"]
    share = options_of(inst).get(option_for("gpu_memory_utilization", engine).name)
    if not ENGINE_INFO[engine].share_covers_all:
        share = None  # its share leaves activations and graphs out: two copies' shares do not add up
    if size and len(idle) >= len(mine):
        # idle GPUs on the instance's NUMA node(s) first
        nodes = {devices[g].get("numa_node") for g in mine}
        idle.sort(key=lambda g: devices[g].get("numa_node") not in nodes)
        out.update(fits=True, gpus=sorted(idle[: len(mine)]))
        out["why"] = "GPUs %s are idle" % out["gpus"]
    elif share and 2 * share <= SURGE_SHARED_LIMIT:
        out.update(fits=True, gpus=mine)
        out["why"] = "two copies at gpu_memory_utilization %.2f fit on GPUs %s" % (share, mine)
    else:
        out["why"] = "no %d idle GPU%s beside GPUs %s, and %s" % (
            len(mine),
            "" if len(mine) == 1 else "s",
            mine,
            "gpu_memory_utilization %.2f leaves no room for a second copy" % share
            if share
            else "without a planned gpu_memory_utilization no second copy is planned on them",
        )


def surge(inst: dict, instances, memory_plan=None, gpu=None, host=None, defaults=None) -> dict:
    """Can a copy of the instance, with its new settings, run beside the running one while it
    restarts (start-before-stop)? {fits, why, port, gpus, need_mib (CPU), docker_args, container,
    base_url, address}. `inst` carries the planned options."""
    inst = normalized(inst)
    defaults, host, gpu = defaults or {}, host or {}, gpu or {}
    out = {"fits": False, "port": surge_port(inst), "gpus": []}
    if defaults.get("surge", "auto") == "never":
        out["why"] = "engine_surge is never"
    elif inst.get("_group"):
        # its members restart together (a copy would need a copy on every node); a second
        # replica behind the edge carries the traffic meanwhile
        out["why"] = "a multi-node instance restarts as a whole group"
    elif inst["accelerator"] == "cpu":
        _cpu_room(inst, memory_plan, host, out)
    else:
        _gpu_room(inst, instances, gpu, out)
    # The copy's arguments are written whether or not it fits now (a CPU host's free memory
    # changes from run to run; the file must not): where it would run, else the instance's GPUs.
    moved = dict(inst, port=out["port"], gpus=out["gpus"] or inst.get("gpus") or [])
    if moved["gpus"] != (inst.get("gpus") or []):
        # a copy on other GPUs runs next to them, not on the instance's own `cpus`
        moved.pop("cpus", None)
    copy = render(moved, gpu=gpu, host=host, defaults=defaults)
    name = inst["name"]
    args = list(copy["docker_args"])
    args[args.index("gpufleet-%s" % name)] = "gpufleet-%s-surge" % name
    at = args.index("--label")
    args[at : at + 2] = ["--label", "io.gpufleet.engine=%s" % name, "--label", "io.gpufleet.surge=true"]
    out["slice"] = None
    if copy["slice"]:
        # its own slice, with the copy's placement (a sibling of the instance's)
        text = slice_unit(name, copy["cpuset_cpus"], copy["cpuset_mems"], copy=True, resources=inst)
        out["slice"] = {"name": slice_name(name, copy=True), "text": text}
        args[args.index(copy["slice"]["name"])] = out["slice"]["name"]
    out.update(
        docker_args=args, container="gpufleet-%s-surge" % name, base_url=copy["base_url"], address=copy["address"]
    )
    return out
