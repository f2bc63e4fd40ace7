# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine role's plan (private to gpufleet.serving): validate the instances, make each
one's memory plan, fill in the options it does not pin, render it and choose how it
restarts. Behind the engine_plan filter, which the role's preflight publishes as the fact
gpufleet_engine_plan.
"""

from __future__ import annotations

import ipaddress

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import context, fingerprint, memberships
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    default_pipeline_parallel_size,
    default_tensor_parallel_size,
    label,
    normalized,
    options_of,
    plan_pins,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import render
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_surge import surge
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_validate import CONTROL, validate
from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import ModelConfigError, load_model_config
from ansible_collections.gpufleet.serving.plugins.module_utils._placement import (
    cpu_list,
    cpu_set,
    housekeeping_dropin,
    node_cpu_sets,
    slices_setting,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._plan_text import (
    instance_lines,
    plan_lines,
    skipped_line,
)


def memory_plan_of(inst: dict, config: dict, gpu=None):
    """The memory plan of one validated instance: (plan, None), or (None, why it is skipped).
    Raises what the planner raises on input it cannot read. A multi-node instance is planned
    for all its nodes (`gpus` on each). The plan is plan_for's, the one `gpufleet plan` makes."""
    inst = normalized(inst)
    options = options_of(inst)
    pins = plan_pins(options)
    nodes = len(inst["nodes"]) if inst.get("nodes") else 1
    if inst.get("cross_node_tensor_parallel"):
        pins["cross_node_tensor_parallel"] = True
    if inst["accelerator"] == "cpu":
        space = int(inst.get("kv_cache_space_gib", 1)) * 2**30
        return plan_for(config, nodes=nodes, accelerator="cpu", pins=pins, kv_space_bytes=space), None
    devices = {d.get("index"): d for d in (gpu or {}).get("devices") or []}
    mine = [devices[g] for g in inst.get("gpus") or [] if g in devices]
    sizes = [d.get("memory_total_mib") for d in mine if d.get("memory_total_mib")]
    if not sizes:
        return None, skipped_line(inst.get("gpus"))
    if nodes == 1 and (options.get("pipeline_parallel_size") or 1) != 1:
        return None, skipped_line(inst.get("gpus"), pipeline_parallel=True)
    plan = plan_for(
        config,
        gpus=len(inst["gpus"]),
        nodes=nodes,
        gpu_memory_bytes=_memory_plan.usable_bytes(min(sizes)),
        engine=inst["engine"],
        pins=pins,
        gpu_name=mine[0].get("name"),
    )
    return plan, None


def plan_for(
    config,
    gpus=1,
    nodes=1,
    gpu_memory_bytes=None,
    engine="vllm",
    accelerator="nvidia",
    pins=None,
    gpu_name=None,
    concurrency=None,
    kv_space_bytes=None,
):
    """The memory plan of an instance given `gpus` GPUs on each of its `nodes` hosts, as the
    engine role deploys it: the one plan behind the role's preflight and `gpufleet plan`.

    An instance uses every GPU it is given: without a pin, tensor_parallel_size is its GPUs
    per node (pipeline parallel across the nodes), unless pipeline_parallel_size is pinned on
    a multi-node instance. Where fewer GPUs meet the same target, the plan's `advice` says so;
    the plan itself stays the one deployed. pins: engine options by either engine's names,
    and _memory_plan.PLANNER_PINS; None (and a false cross_node_tensor_parallel) is no pin."""
    pins = _memory_plan.engine_neutral_pins(pins)
    if not pins.get("cross_node_tensor_parallel"):
        pins.pop("cross_node_tensor_parallel", None)
    if accelerator == "cpu":
        plan = _memory_plan.plan_memory(
            config, accelerator="cpu", pins=pins, kv_space_bytes=kv_space_bytes, nodes=nodes, concurrency=concurrency
        )
        plan["advice"] = []
        return plan
    gpus = int(gpus or 1)
    chosen = "tensor_parallel_size" not in pins
    if chosen:
        # every GPU of every node: tensor parallel within a node, one pipeline stage per node
        # (unless pinned, or tensor parallel may span the nodes) -- the rule the role renders by
        cross = {"cross_node_tensor_parallel": bool(pins.get("cross_node_tensor_parallel"))}
        pp = pins.get("pipeline_parallel_size") or default_pipeline_parallel_size(cross, nodes)
        pins["tensor_parallel_size"] = default_tensor_parallel_size({}, range(gpus), pp, nodes)
        pins["tensor_parallel_from_gpus"] = True
    kwargs = dict(
        gpus=gpus,
        nodes=nodes,
        gpu_memory_bytes=gpu_memory_bytes,
        engine=engine,
        gpu_name=gpu_name,
        concurrency=concurrency,
    )
    plan = _memory_plan.plan_memory(config, pins=pins, **kwargs)
    plan["advice"] = []
    if not chosen or plan["tensor_parallel_size"] is None:
        return plan
    tp = pins["tensor_parallel_size"]
    if tp > 1:
        plan["reasons"].insert(
            0,
            "tensor_parallel_size=%d: the instance's %s (an instance uses every GPU it is given; give it fewer, or "
            "pin tensor_parallel_size, to use fewer)."
            % (tp, "%d GPUs" % gpus if nodes == 1 else "%d GPUs on each of %d nodes" % (gpus, nodes)),
        )
    if nodes == 1 and gpus > 1 and plan["fits"]:
        free = {k: v for k, v in pins.items() if k not in ("tensor_parallel_size", "tensor_parallel_from_gpus")}
        fewer = _memory_plan.plan_memory(config, pins=free, suggest=False, **kwargs)
        tp = fewer["tensor_parallel_size"]
        if fewer["fits"] and fewer["level"] == 3 and tp and tp < gpus:
            plan["advice"].append(
                "tensor_parallel_size=%d meets the plan's target of %d requests at full length on %d of these %d GPUs "
                "(max_model_len %d, %.2f requests at full length): give the instance %d GPU%s to free the rest%s."
                % (
                    tp,
                    int(fewer["target_concurrency"] or 0),
                    tp,
                    gpus,
                    int(fewer["max_model_len"] or 0),
                    float(fewer["max_concurrency"] or 0),
                    tp,
                    "" if tp == 1 else "s",
                    ", or run %d instances of TP %d on them, each with that room" % (gpus // tp, tp)
                    if gpus // tp > 1
                    else "",
                )
            )
    return plan


def memory_plans(instances, gpu=None, models=None, wheres=None):
    """The memory plan of every validated instance whose model config is at hand:
    ({name: plan}, errors, {name: why skipped}). A plan's options fill in what the instance
    does not pin. wheres: how messages name each instance (default gpufleet_engines[i])."""
    plans, errors, skipped = {}, [], {}
    for i, inst in enumerate(instances):
        where = wheres[i] if wheres else label(i, inst)
        info = (models or {}).get(inst.get("model")) or {}
        if not info.get("config"):
            continue
        try:
            plan, why = memory_plan_of(inst, load_model_config(info["config"]), gpu)
        except (ModelConfigError, _memory_plan.PlanInputError, KeyError, TypeError, ValueError) as exc:
            errors.append("%s.model=%s: the memory plan cannot read it: %s" % (where, inst.get("model"), exc))
            continue
        if plan is None:
            skipped[inst["name"]] = why
            continue
        errors.extend("%s (memory plan): %s" % (where, message) for message in plan["errors"])
        plans[inst["name"]] = plan
    return plans, errors, skipped


def with_plan(inst: dict, plan=None) -> dict:
    """The instance with the plan's values for every option it does not pin (and, without a
    plan, tensor_parallel_size spread over the instance's GPUs)."""
    inst = normalized(inst)
    pinned = options_of(inst)
    merged = dict(inst)
    nodes = len(inst["nodes"]) if inst.get("nodes") else 1
    if not plan:
        pp = pinned.get("pipeline_parallel_size") or default_pipeline_parallel_size(inst, nodes)
        if pinned.get("pipeline_parallel_size") is None and pp > 1:
            merged["pipeline_parallel_size"] = pp
        if pinned.get("tensor_parallel_size") is None and inst["accelerator"] != "cpu":
            gpus = inst.get("gpus") or []
            tp = default_tensor_parallel_size(inst, gpus, pp, nodes)
            if tp > 1:
                merged["tensor_parallel_size"] = tp
        return merged
    for key, value in (plan.get("options") or {}).items():
        if pinned.get(key) is None:
            merged[key] = value
    return merged


def plan(instances, gpu=None, models=None, host=None, defaults=None) -> dict:
    """validate + memory plans + render + restart strategy: {errors: [...], instances: [...]}
    (instances empty on errors). Each rendered instance carries its memory plan's lines
    (memory_plan), its restart strategy (surge) and what the preflight prints (report).

    host: {numa_nodes, memory_available_mib} and, for multi-node instances, name (this host's
    inventory name), hosts (the gpu hosts), groups (the engine_groups filter's answer), facts
    (Ansible's network facts) and group_ifname (engine_group_ifname). The multi-node instances
    this host joins as a worker are planned and rendered after its own."""
    host = host or {}
    # engine_cgroup_slices (true, false or auto) as this host runs it, for every step below
    slices = slices_setting((defaults or {}).get("slices", False), host)
    defaults = dict(defaults or {}, slices=slices["on"], slices_why=slices["why"])
    members = memberships(host.get("groups"), host.get("name"))
    errors = ([slices["error"]] if slices["error"] else []) + validate(
        instances, gpu=gpu, models=models, host=host, defaults=defaults, members=members
    )
    if errors:
        return {"errors": errors, "instances": []}
    # every default applied once, from the registry (INSTANCE_DEFAULTS): what every step below reads
    everything = [normalized(i) for i in list(instances) + [m["instance"] for m in members]]
    # a worker's instance is written in its leader's gpufleet_engines, not this host's
    wheres = [label(i, inst) for i, inst in enumerate(instances)] + [
        "%s's multi-node instance %s" % (m["group"]["leader"], m["instance"].get("name")) for m in members
    ]
    plans, errors, skipped = memory_plans(everything, gpu=gpu, models=models, wheres=wheres)
    if errors:
        return {"errors": errors, "instances": []}
    rendered, errors = [], []
    for i, inst in enumerate(everything):
        name = inst["name"]
        planned = with_plan(inst, plans.get(name))
        group = context(inst, host.get("name"), host.get("groups"), host.get("facts"), host.get("group_ifname"))
        if group:
            errors.extend(_group_errors(wheres[i], group, host.get("name")))
            planned["_group"] = group
        out = render(planned, gpu=gpu, host=host, defaults=defaults)
        out["surge"] = surge(planned, instances, plans.get(name), gpu=gpu, host=host, defaults=defaults)
        out["memory_plan"] = plan_lines(plans.get(name)) or ([skipped[name]] if name in skipped else [])
        out["report"] = instance_lines(out)
        if group:
            config = ((models or {}).get(inst.get("model")) or {}).get("config")
            # compared with the other members' (group_preflight.yml) with the model's weight files
            out["fingerprint"] = fingerprint(out, config)
        # The run files hold one argument per line: a value with a line break would add
        # arguments. validate() refuses every such input; this is the last guard.
        broken = [a for a in out["docker_args"] + (out["surge"].get("docker_args") or []) if CONTROL.search(a)]
        if broken:
            errors.append(
                "%s: an argument of its docker run has a line break or a control character (%r); fix the value it "
                "comes from (an image in engine_images, an option, extra_args)." % (wheres[i], broken[0][:80])
            )
        rendered.append(out)
    if errors:
        return {"errors": errors, "instances": []}
    return {
        "errors": [],
        "instances": rendered,
        "cpu_split": split_lines(host, rendered, defaults, slices),
        "housekeeping": housekeeping(host),
        "slices": {"on": slices["on"], "why": slices["why"]},
    }


def housekeeping(host) -> dict:
    """engine_housekeeping_cpus as the role applies it: {cpus: the kernel's own list form (what
    /proc/PID/status shows, "" for none), all: every CPU of the host's NUMA nodes, dropin: the
    services' drop-in (None for none)}."""
    keep = cpu_set((host or {}).get("housekeeping_cpus")) or set()
    every = set().union(*node_cpu_sets((host or {}).get("numa_nodes")).values())
    return {
        "cpus": cpu_list(keep),
        "all": cpu_list(every),
        "dropin": housekeeping_dropin(cpu_list(keep)) if keep else None,
    }


def split_lines(host, rendered, defaults, slices) -> list:
    """The host's CPUs as the plan shares them (what the preflight prints): each NUMA node, the
    housekeeping CPUs and the services pinned there, whether the instances run in systemd slices
    (slices: slices_setting's answer) and why, and each instance's CPUs."""
    nodes = [n for n in (host or {}).get("numa_nodes") or [] if isinstance(n, dict) and n.get("cpus")]
    lines = []
    if nodes:
        lines.append("NUMA nodes: %s" % "; ".join("%s: CPUs %s" % (n.get("node"), n["cpus"]) for n in nodes))
    keep = (host or {}).get("housekeeping_cpus")
    units = (defaults or {}).get("housekeeping_units") or []
    if keep:
        lines.append("housekeeping CPUs %s: %s" % (keep, ", ".join(units) or "no service listed"))
    else:
        lines.append("housekeeping CPUs: none kept (engine_housekeeping_cpus); the host's services run anywhere")
    lines.append("systemd slices: %s (%s)" % ("on, one per instance" if slices["on"] else "off", slices["why"]))
    for out in rendered:
        where = out["cpuset_cpus"] or "any CPU"
        mems = " memory node %s" % out["cpuset_mems"] if out["cpuset_mems"] else ""
        lines.append(
            "%s: CPUs %s%s%s (%s)"
            % (out["name"], where, mems, ", exclusive" if out.get("exclusive_cpus") else "", out["placement"])
        )
    return lines


def _group_errors(where, group, me) -> list:
    """What a multi-node member needs from this host: an address its peers reach and the
    interface that holds it."""
    errors = []
    for node, address in zip(group["nodes"], group["addresses"]):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            errors.append(
                "%s: node %s has no address but %r; the group's sockets and the firewall need one: set %s's "
                "ansible_host to its address on the group's network." % (where, node, address, node)
            )
    if not errors and not group["ifname"]:
        errors.append(
            "%s: no network interface on %s holds its address %s (Ansible's network facts), so NCCL and Gloo "
            "cannot be told which one to use: gather network facts, or set engine_group_ifname on %s."
            % (where, me, group["address"], me)
        )
    return errors
