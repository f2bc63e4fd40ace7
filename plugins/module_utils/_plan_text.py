# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan as people read it (private to gpufleet.serving): one formatter behind
`gpufleet plan` and the engine role's preflight output.

plan_lines() formats a memory plan (what _memory_plan.plan_memory returns): the per-GPU
figures, the KV cache line, the reasons, the warnings and the advice; with detail=True (the CLI) also
the model, the hardware, whether it fits, a bar of one GPU's memory, the engine flags and
the errors. instance_lines() adds what the role decided for one instance: image, port,
shared memory, placement, the command line and how a change restarts it.

Lab tests and the comments pasted in inventories/lab/host_vars/*.yml match these lines:
change them together.
"""

from __future__ import annotations

from typing import List

GIB = 2**30
BAR_WIDTH = 60
# One GPU's memory, part by part: (bar letter, label, plan keys summed)
PARTS = (
    ("W", "weights", ("weights_bytes_per_gpu",)),
    ("K", "KV cache", ("kv_cache_bytes_per_gpu",)),
    ("A", "activations", ("activation_bytes_per_gpu",)),
    ("G", "CUDA graphs + non-torch", ("cudagraph_bytes_per_gpu", "non_torch_bytes_per_gpu")),
    ("C", "context + NCCL", ("outside_bytes_per_gpu",)),
)


def plan_lines(plan, detail: bool = False) -> List[str]:
    """The plan's lines: the role prints them under each instance, `gpufleet plan` with
    detail (its header, the memory bar, the engine flags and the errors)."""
    if not plan:
        return []
    lines = _header(plan) if detail else _per_gpu(plan)
    if plan.get("kv_bytes_per_token_per_gpu"):
        lines.append(
            "KV cache: %d tokens (%d B/token/GPU), max_model_len %d, %.2f requests at full length"
            % (
                plan["kv_cache_tokens"],
                plan["kv_bytes_per_token_per_gpu"],
                plan["max_model_len"],
                plan["max_concurrency"],
            )
        )
    lines.extend("why: %s" % r for r in plan.get("reasons") or [])
    lines.extend("warning: %s" % w for w in plan.get("warnings") or [])
    lines.extend("advice: %s" % a for a in plan.get("advice") or [])
    if detail:
        lines.extend("error: %s" % e for e in plan.get("errors") or [])
    return lines


def skipped_line(gpus, pipeline_parallel: bool = False) -> str:
    """Why an instance has no memory plan."""
    if pipeline_parallel:
        return "memory plan skipped: pipeline parallelism is not planned"
    return "memory plan skipped: nvidia-smi gave no memory size for GPUs %s" % gpus


def instance_lines(rendered: dict) -> List[str]:
    """One instance as the role's preflight shows it: what runs where, its memory plan (or
    why there is none), and how a change restarts it."""
    head = "%s: %s on %s, image %s, port %s, ipc %s%s, cpuset %s mems %s (%s); args: %s" % (
        rendered["name"],
        rendered["engine"],
        rendered["accelerator"],
        rendered["image"],
        rendered["port"],
        rendered["ipc"],
        " shm %s" % rendered["shm_size"] if rendered.get("shm_size") else "",
        rendered.get("cpuset_cpus") or "none",
        rendered.get("cpuset_mems") or "none",
        rendered["placement"],
        " ".join(rendered["engine_args"]),
    )
    return [head, *_ray_lines(rendered), *rendered.get("memory_plan", []), restart_line(rendered["surge"])]


def _ray_lines(rendered: dict) -> List[str]:
    """What a Ray group's member runs besides (or instead of) the args above."""
    group = rendered.get("group") or {}
    if group.get("backend") != "ray":
        return []
    if group["rank"] == 0:
        return [
            "ray: this node starts the group's Ray head (GCS port %s, dashboard on 127.0.0.1:%s, token "
            "authentication) and then vLLM with the args above" % (group["ray_port"], group["ray_dashboard_port"])
        ]
    return [
        "ray: this node runs a Ray worker node joining %s:%s (token authentication), no vLLM process: the args "
        "above are the group's, run on the leader" % (group["master_addr"], group["ray_port"])
    ]


def restart_line(surge: dict) -> str:
    """restart: start-before-stop, a copy on port P[ and GPUs [..]] first (why) |
    restart: stop-before-start (why)."""
    if surge["fits"]:
        how = "start-before-stop, a copy on port %s%s first" % (
            surge["port"],
            " and GPUs %s" % surge["gpus"] if surge.get("gpus") else "",
        )
    else:
        how = "stop-before-start"
    return "restart: %s (%s)" % (how, surge["why"])


def _per_gpu(plan) -> List[str]:
    if plan.get("weights_bytes_per_gpu") is None:
        return []
    return [
        "per GPU: weights %.2f GiB, KV cache %.2f GiB, activations %.2f GiB, CUDA graphs %.2f GiB, "
        "context+NCCL %.2f GiB of %.2f GiB"
        % (
            plan["weights_bytes_per_gpu"] / GIB,
            plan["kv_cache_bytes_per_gpu"] / GIB,
            plan["activation_bytes_per_gpu"] / GIB,
            plan["cudagraph_bytes_per_gpu"] / GIB,
            plan["outside_bytes_per_gpu"] / GIB,
            plan["gpu_memory_bytes"] / GIB,
        )
    ]


def _header(plan) -> List[str]:
    m = plan.get("model") or {}
    lines = [
        "model      %s, %.2fB parameters, %s%s"
        % (
            m.get("architecture", "?"),
            (m.get("parameters") or 0) / 1e9,
            m.get("dtype", "?"),
            ", %s" % m["quantization"] if m.get("quantization") else "",
        )
    ]
    layout = _layout(plan)
    if plan.get("accelerator") == "cpu":
        lines.append(
            "engine     vllm on CPU, %sKV cache space %.2f GiB%s"
            % (
                "%d nodes, " % plan["nodes"] if (plan.get("nodes") or 1) > 1 else "",
                (plan.get("kv_cache_bytes_per_gpu") or 0) / GIB,
                " per rank, " + layout if layout else "",
            )
        )
    elif (plan.get("nodes") or 1) > 1 or layout:
        lines.append(
            "hardware   %d nodes x %d GPUs x %.2f GiB usable, engine %s%s"
            % (
                plan.get("nodes") or 1,
                plan["gpus"],
                plan["gpu_memory_bytes"] / GIB,
                plan["engine"],
                ", " + layout if layout else "",
            )
        )
    else:
        lines.append(
            "hardware   %d GPU(s) x %.2f GiB usable, engine %s"
            % (plan["gpus"], plan["gpu_memory_bytes"] / GIB, plan["engine"])
        )
    lines.append("fits       %s" % ("yes" if plan["fits"] else "NO"))
    if plan.get("gpu_memory_bytes") and plan.get("weights_bytes_per_gpu") is not None:
        parts = memory_parts(plan)
        total = plan["gpu_memory_bytes"]
        # one figure for what is missing, the plan's own where it has one (its errors say the same)
        short = plan.get("shortfall_bytes_per_gpu") or (
            sum(value for letter, _name, value in parts if letter != ".") - total
        )
        lines.append(
            "per GPU    %s %.2f GiB%s"
            % (
                memory_bar(parts, total),
                total / GIB,
                ", short by %.2f GiB ('|' is the GPU's end)" % (short / GIB) if short > 0 else "",
            )
        )
        lines.append("           " + " | ".join("%s %s %.2f" % (c, name, value / GIB) for c, name, value in parts))
    if plan.get("engine_args"):
        flags = plan["engine_args"].items()
        lines.append("engine args  " + " ".join(f if v is True else "%s %s" % (f, v) for f, v in flags))
    return lines


def _layout(plan) -> str:
    """'TP 8 x PP 2, stages of 63/63 layers' for a plan with pipeline stages or over several
    nodes; '' for one stage on one node."""
    pp = plan.get("pipeline_parallel_size") or 1
    if pp == 1 and (plan.get("nodes") or 1) == 1:
        return ""
    text = "TP %s x PP %d" % (plan.get("tensor_parallel_size") or "?", pp)
    stages = plan.get("pipeline_stage_layers")
    if stages and pp > 1:
        text += ", stages of %s layers" % "/".join(str(n) for n in stages)
    return text


def memory_parts(plan) -> List[tuple]:
    """[(bar letter, label, bytes)] of one GPU, headroom last."""
    parts = [(letter, name, int(sum(plan.get(k) or 0 for k in keys))) for letter, name, keys in PARTS]
    used = sum(p[2] for p in parts)
    parts.append((".", "headroom", max(plan["gpu_memory_bytes"] - used, 0)))
    return parts


def memory_bar(parts, total: int) -> str:
    """One GPU's memory as BAR_WIDTH cells, a letter per part. When the parts need more than
    the GPU has, the bar is drawn to their sum (nothing clipped) and '|' marks the GPU's end."""
    used = sum(value for letter, _name, value in parts if letter != ".")
    scale = float(max(total, used, 1))
    cells = "".join(letter * round(BAR_WIDTH * value / scale) if value > 0 else "" for letter, _name, value in parts)
    row = (cells + "." * BAR_WIDTH)[:BAR_WIDTH]
    if used > total:
        edge = round(BAR_WIDTH * total / scale)
        row = row[:edge] + "|" + row[edge:]
    return "[" + row + "]"
