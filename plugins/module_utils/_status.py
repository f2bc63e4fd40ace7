# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What `gpufleet status` reports for a host (private): its engine instances as deployed
(read back from the deployed.json the engine role writes beside docker-run.args), whether
each serves, and its load from /metrics (metric names: _engine_options.ENGINE_INFO).
"""

from __future__ import annotations

import json
import math

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import INSTANCE_DEFAULTS, metric_names
from ansible_collections.gpufleet.serving.plugins.module_utils._placement import same

try:  # a gpufleet dependency on the controller, where the filters that use this run
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # pragma: no cover - named when used
    text_string_to_metric_families = None
# What the report says about each instance, from deployed.json.
DEPLOYED_FIELDS = ("engine", "image", "model", "port", "tensor_parallel_size", "gpus", "max_model_len", "node",
                   "planned_cpus", "planned_mems")  # fmt: skip


def _samples(text):
    """{sample name: [values]} of a Prometheus text page, read by prometheus_client's parser.
    A page that stops being valid part-way keeps the families read before that point."""
    if text_string_to_metric_families is None:
        raise ImportError(
            "reading engine metrics needs prometheus_client on the controller (a gpufleet dependency: "
            "pip install prometheus-client)"
        )
    samples = {}
    try:
        for family in text_string_to_metric_families(text or ""):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(float(sample.value))
    except ValueError:
        pass  # not (or no longer) the text format: what was read stands
    return samples


# What status and the drain read of an engine's /metrics (those the engine exports).
STATUS_KEYS = ("running", "waiting", "kv_cache_usage", "prefix_cache_queries", "prefix_cache_hits")


def parse_metrics(text, engine="vllm"):
    """{running, waiting, kv_cache_usage, prefix_cache_queries, prefix_cache_hits} from a
    Prometheus text page; None where absent.
    Several series of one metric (engines, ranks) add up; usage is their mean."""
    samples = _samples(text)
    out = {}
    names_of = metric_names(engine)
    for key in STATUS_KEYS:
        if key not in names_of:
            continue
        names = names_of[key]
        values = next((samples[n] for n in names if n in samples), None)
        if values is None:
            out[key] = None
        elif key == "kv_cache_usage":
            out[key] = sum(values) / len(values)
        else:
            out[key] = int(sum(values))
    return out


def engine_load(text, engine="vllm"):
    """Requests an engine holds, running and waiting, from its /metrics page (0 when the
    page has neither: nothing to wait for)."""
    load = parse_metrics(text, engine)
    return (load["running"] or 0) + (load["waiting"] or 0)


def read_deployed(text):
    """An instance as deployed, from its deployed.json; every field None when there is none
    (an instance deployed by an older gpufleet) or it cannot be read."""
    try:
        record = json.loads(text) if text else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return _unknown()
    gpus = record.get("gpus")
    return {
        "engine": record.get("engine"),
        "image": record.get("image"),
        "model": record.get("served_model_name"),
        "port": record.get("port"),
        "tensor_parallel_size": record.get("tensor_parallel_size"),
        "gpus": ",".join(str(g) for g in gpus) if gpus else "cpu" if record.get("accelerator") == "cpu" else None,
        "max_model_len": record.get("max_model_len"),
        # a multi-node instance: {rank, size, leader, nodes} of this node (None: one host)
        "node": _node(record.get("group")),
        # the cpuset the plan gave it (None: not pinned, or deployed before gpufleet recorded it)
        "planned_cpus": record.get("cpuset_cpus"),
        "planned_mems": record.get("cpuset_mems"),
        "recorded": True,
    }


def _node(group):
    if not isinstance(group, dict) or not isinstance(group.get("rank"), int):
        return None
    return {k: group.get(k) for k in ("rank", "size", "leader", "nodes")}


def _unknown():
    return dict(dict.fromkeys(DEPLOYED_FIELDS), recorded=False)


def host_status(instances, gpu=None, nccl_env=None):
    """One host's report. instances: [{name, deployed (deployed.json text or None), active
    (unit state), metrics (text or None), pending (its restart-pending mark exists), quarantine
    (its quarantine mark's text or None), placement (the engine_placement module's reading of
    its container, or None), start (the engine_phase module's reading of its log, or None)}]; gpu:
    gpu_facts' gpufleet_gpu; nccl_env: the text of the NCCL env file."""
    gpu = gpu or {}
    p2p = gpu.get("p2p") or {}
    env = {}
    for line in (nccl_env or "").splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _sep, value = line.partition("=")
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
        deployed = read_deployed(inst.get("deployed"))
        load = (
            parse_metrics(inst.get("metrics"), deployed["engine"] or INSTANCE_DEFAULTS["engine"])
            if inst.get("metrics")
            else {}
        )
        active = inst.get("active") or "unknown"
        # a multi-node worker serves no HTTP: running is all it can say (its leader serves the group)
        worker = bool((deployed.get("node") or {}).get("rank"))
        serving = active == "active" and (worker or inst.get("metrics") is not None)
        entry = dict(deployed, name=inst.get("name"), unit=active, serving=serving)
        # deployed.json lands before the restart: until the mark goes, it is not what runs
        entry["restart_pending"] = bool(inst.get("pending"))
        # out of the proxy (the engine watchdog: a GPU fault or a hang; or an operator), and why
        entry["quarantine"] = _quarantine(inst.get("quarantine"))
        entry["placement"] = _placement(inst.get("placement"), deployed)
        # where its start is (loading weights, compiling, ...), read from its engine's log
        entry["start"] = _start(inst.get("start"))
        entry.update({k: load.get(k) for k in ("running", "waiting", "kv_cache_usage")})
        # the share of prompt tokens the engine found in its prefix cache since it started (what
        # the edge's cache-aware router raises)
        queries, hits = load.get("prefix_cache_queries"), load.get("prefix_cache_hits")
        entry["prefix_cache_hit_rate"] = round(hits / queries, 4) if queries and hits is not None else None
        report["engines"].append(entry)
    return report


def _placement(read, deployed):
    """Where the instance's engine runs, as the kernel holds it (its container's effective cpuset
    and the main process's allowed lists), against the plan: {cpus, mems, process_cpus,
    process_mems, cgroup_version, cgroup, planned_cpus, planned_mems, matches (True/False, None
    when nothing is pinned or nothing was read), drift (the keys that differ), problem}; None when
    the container does not run."""
    if not isinstance(read, dict) or not read.get("pid"):
        return None
    keys = ("cpus", "mems", "process_cpus", "process_mems", "cgroup_version", "cgroup", "problem")
    out = {k: read.get(k) for k in keys}
    out["planned_cpus"], out["planned_mems"] = deployed.get("planned_cpus"), deployed.get("planned_mems")
    checks = {k: same(out["planned_" + k], out[k]) for k in ("cpus", "mems")}
    known = [c for c in checks.values() if c is not None]
    out["matches"] = all(known) if known else None
    # which of the two differ from the plan
    out["drift"] = [k for k, c in checks.items() if c is False]
    return out


# What status keeps of the engine_phase module's reading (the rest is for the rollout's log).
START_KEYS = ("phase", "note", "phase_s", "elapsed_s", "ready_s", "phases", "summary", "started_at", "problem")


def _start(read):
    """The instance's start from its log ({phase, note, phase_s, elapsed_s, ready_s, phases, summary,
    started_at, problem}), or None when its container does not run or nothing was read."""
    if not isinstance(read, dict) or not read.get("running"):
        return None
    return {k: read.get(k) for k in START_KEYS}


def _quarantine(text):
    """The quarantine mark's {reason, detail, since, by}, or None (no mark)."""
    if not text:
        return None
    try:
        mark = json.loads(text)
    except ValueError:
        return {"reason": "unreadable mark", "detail": "", "since": None, "by": None}
    if not isinstance(mark, dict):
        return {"reason": "unreadable mark", "detail": "", "since": None, "by": None}
    return {k: mark.get(k) for k in ("reason", "detail", "since", "by")}


def idle_targets(deployed, plan_instances=None, override=0):
    """What the rollout waits on before a host restarts: each instance as it runs now.

    deployed: the host's deployed.json contents; plan_instances: the new plan's instances
    (for an instance without a deployed.json); override: seconds for every instance (0: each
    one's own drain time). Returns [{name, engine, base_url, timeout}] with a timeout of at
    least 2 s."""
    out, seen = [], set()
    for entry in list(deployed or []) + list(plan_instances or []):
        if not isinstance(entry, dict) or not entry.get("name") or entry["name"] in seen or not entry.get("base_url"):
            continue
        seen.add(entry["name"])
        if (entry.get("group") or {}).get("rank"):
            # a multi-node instance's worker serves nothing itself: its leader's host waits for it
            continue
        timeout = override or entry.get("drain_timeout") or 30
        out.append(
            {
                "name": entry["name"],
                "engine": entry.get("engine") or INSTANCE_DEFAULTS["engine"],
                "base_url": entry["base_url"],
                "timeout": max(int(timeout), 2),
            }
        )
    return out


def busy(results):
    """Names of the instances whose last /metrics page (uri results looped over
    idle_targets) still shows requests."""
    names = []
    for result in results or []:
        item = result.get("item") or {}
        if (
            result.get("status") == 200
            and engine_load(result.get("content"), item.get("engine") or INSTANCE_DEFAULTS["engine"]) > 0
        ):
            names.append(item.get("name"))
    return names


# What `gpufleet status` asks a monitoring host's Prometheus (playbooks/status.yml): the
# recording rules of the monitoring role, and the alerts firing.
MONITORING_QUERIES = {
    "tokens_per_s": "gpufleet:engine_generation_tokens:rate5m",
    "ttft_p50": "gpufleet:engine_ttft_seconds:p50_5m",
    "ttft_p95": "gpufleet:engine_ttft_seconds:p95_5m",
    "alerts": 'ALERTS{alertstate="firing"}',
}


def monitoring_status(answers):
    """answers: {key of MONITORING_QUERIES: Prometheus /api/v1/query JSON}. Returns
    {"instances": {"HOST/NAME": {tokens_per_s, ttft_p50, ttft_p95, alerts: [names]}},
    "hosts": {HOST: [alert names about the host, not one instance]}}; a missing or failed
    answer leaves its figures None."""
    instances, hosts = {}, {}
    for key in MONITORING_QUERIES:
        body = (answers or {}).get(key) or {}
        for sample in ((body.get("data") or {}).get("result") or []) if body.get("status") == "success" else []:
            labels = sample.get("metric") or {}
            host, name = labels.get("host"), labels.get("engine_instance")
            if not host:
                continue
            if key == "alerts":
                alert = labels.get("alertname", "?")
                if name:
                    instances.setdefault("%s/%s" % (host, name), {}).setdefault("alerts", []).append(alert)
                else:
                    hosts.setdefault(host, []).append(alert)
                continue
            if not name:
                continue
            try:
                value = float((sample.get("value") or [None, None])[1])
            except (TypeError, ValueError):
                value = None
            if value is not None and math.isnan(value):
                value = None  # no request in the window: no figure
            instances.setdefault("%s/%s" % (host, name), {})[key] = value
    for entry in instances.values():
        for key in ("tokens_per_s", "ttft_p50", "ttft_p95"):
            entry.setdefault(key, None)
        entry["alerts"] = sorted(set(entry.get("alerts") or []))
    return {"instances": instances, "hosts": {h: sorted(set(a)) for h, a in hosts.items()}}
