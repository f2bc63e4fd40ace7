# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What `gpufleet status` reports for a host (private): its engine instances as deployed
(read back from their docker-run.args), whether each serves, and its load from /metrics.

Metric names: vLLM v1 exports vllm:num_requests_running, vllm:num_requests_waiting and
vllm:kv_cache_usage_perc (0-1; older releases: vllm:gpu_cache_usage_perc), checked against a
capture of vLLM 0.32.0 in tests/fixtures/engine_metrics/. SGLang exports
sglang:num_running_reqs, sglang:num_queue_reqs and sglang:token_usage (0-1) (SGLang docs,
"Production Metrics"); gpufleet has no SGLang capture, so those are read by name only.
"""

from __future__ import annotations

import re

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEnaNInf]+)")
METRICS = {
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_cache_usage": ("sglang:token_usage",),
    },
}


def parse_metrics(text, engine="vllm"):
    """{running, waiting, kv_cache_usage} from a Prometheus text page; None where absent.
    Several series of one metric (engines, ranks) add up; usage is their mean."""
    samples = {}
    for line in (text or "").splitlines():
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if match:
            try:
                samples.setdefault(match.group(1), []).append(float(match.group(3)))
            except ValueError:
                continue
    out = {}
    for key, names in METRICS.get(engine, METRICS["vllm"]).items():
        values = next((samples[n] for n in names if n in samples), None)
        if values is None:
            out[key] = None
        elif key == "kv_cache_usage":
            out[key] = sum(values) / len(values)
        else:
            out[key] = int(sum(values))
    return out


def _flag(args, *flags):
    for flag in flags:
        if flag in args:
            at = args.index(flag)
            if at + 1 < len(args):
                return args[at + 1]
    return None


def read_args(text):
    """An instance as deployed, from its docker-run.args (one argument per line)."""
    args = [a for a in (text or "").splitlines() if a]
    engine = "sglang" if "sglang.launch_server" in args else "vllm"
    gpus = _flag(args, "--gpus")
    port = _flag(args, "--port")
    tp = _flag(args, "--tensor-parallel-size", "--tp-size", "--tp")
    return {
        "engine": engine,
        # docker run ... --entrypoint ENTRYPOINT IMAGE ARGS (gpufleet.serving.engine writes it so)
        "image": args[args.index("--entrypoint") + 2] if "--entrypoint" in args[:-2] else None,
        "model": _flag(args, "--served-model-name"),
        "port": int(port) if port and port.isdigit() else None,
        "tensor_parallel_size": int(tp) if tp and tp.isdigit() else 1,
        "gpus": gpus.strip('"').split("=", 1)[-1] if gpus else "cpu",
        "max_model_len": _flag(args, "--max-model-len", "--context-length"),
    }


def host_status(instances, gpu=None, nccl_env=None):
    """One host's report. instances: [{name, args (text), active (unit state), metrics (text or
    None)}]; gpu: gpu_facts' gpufleet_gpu; nccl_env: the text of the NCCL env file."""
    gpu = gpu or {}
    p2p = gpu.get("p2p") or {}
    env = {}
    for line in (nccl_env or "").splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    if env.get("NCCL_P2P_DISABLE") == "1":
        nccl = "P2P disabled (NCCL_P2P_DISABLE=1)"
    elif "NCCL_P2P_LEVEL" in env:
        nccl = "P2P up to %s (NCCL_P2P_LEVEL)" % env["NCCL_P2P_LEVEL"]
    elif "NCCL_P2P_DISABLE" in env:
        nccl = "P2P enabled (NCCL_P2P_DISABLE=%s)" % env["NCCL_P2P_DISABLE"]
    elif nccl_env is not None:
        nccl = "P2P left to NCCL"
    else:
        nccl = "no NCCL env file"
    report = {
        "driver_version": gpu.get("driver_version"),
        "gpus": gpu.get("count") or 0,
        "gpu_name": ((gpu.get("devices") or [{}])[0] or {}).get("name"),
        "nccl": nccl,
        "nccl_p2p_recommended": p2p.get("recommended"),
        "engines": [],
    }
    for inst in instances or []:
        deployed = read_args(inst.get("args"))
        load = parse_metrics(inst.get("metrics"), deployed["engine"]) if inst.get("metrics") else {}
        active = inst.get("active") or "unknown"
        serving = active == "active" and inst.get("metrics") is not None
        entry = dict(deployed, name=inst.get("name"), unit=active, serving=serving)
        entry.update({k: load.get(k) for k in ("running", "waiting", "kv_cache_usage")})
        report["engines"].append(entry)
    return report
