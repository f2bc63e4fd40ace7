"""gpufleet's Grafana dashboards, generated as JSON into roles/monitoring/files/dashboards/ (a
development tool; the monitoring role provisions the files into a Grafana the user names).

    python tools/dashboards.py             write the dashboards
    python tools/dashboards.py --check     write nothing; exit 1 naming every file out of date
    python tools/dashboards.py --queries   print [{"dashboard", "panel", "expr"}] as JSON: every
                                           panel's and variable's PromQL, with the dashboard
                                           variables replaced by ".*" (run each one against a
                                           real Prometheus: it must return data)

Three dashboards (Grafana schemaVersion 39): gpufleet-fleet (the fleet at a glance),
gpufleet-engine (one engine instance: throughput, latency percentiles, KV cache, queue,
preemptions, prefix cache, the watchdog's probe), gpufleet-gpu (each GPU, from the DCGM
exporter). Every panel reads the data source chosen in the `datasource` variable (type
prometheus) and filters by the `host` variable (and `engine_instance` or `gpu`), whose values
come from label_values(). Engine panels read the recording rules of
roles/monitoring/templates/gpufleet-rules.yml.j2; GPU panels read only the DCGM fields present
in the real captures of tests/fixtures/dcgm/ (dcgm-exporter's default counters), taking the max
per GPU where a GPU in MIG mode repeats a series per GPU instance. Queries that count something
that may be absent end in `or vector(0)`, so a healthy fleet shows 0 rather than "No data".

Output follows the definitions below in order, so the same code always gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = Path("roles") / "monitoring" / "files" / "dashboards"
COMMAND = "python tools/dashboards.py"
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ENGINE = 'job="gpufleet_engine"'
# The filters the dashboard variables apply (replaced by ".*" in --queries).
HOST = 'host=~"$host"'
INSTANCE = 'host=~"$host", engine_instance=~"$engine_instance"'
GPU = 'host=~"$host", gpu=~"$gpu"'


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    description: str = ""
    max: float | None = None
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    metric: str  # the series whose label values are offered: label_values(<metric>, <name>)


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = ("gpufleet",)


def stat(title: str, expr: str, description: str, unit: str = "short", legend: str = "") -> Panel:
    return Panel(title, (Target(expr, legend),), unit=unit, kind="stat", description=description, width=6, height=4)


def per_gpu(metric: str, how: str = "max") -> str:
    """One series per GPU: a GPU in MIG mode repeats most fields once per GPU instance."""
    return f'{how} by (host, gpu) ({metric}{{job="dcgm", {GPU}}})'


def per_gpu_rate(counter: str) -> str:
    return f'max by (host, gpu) (rate({counter}{{job="dcgm", {GPU}}}[5m]))'


def by_instance(record: str) -> str:
    return f"{record}{{{INSTANCE}}}"


INSTANCE_LEGEND = "{{host}}/{{engine_instance}}"
GPU_LEGEND = "{{host}} GPU {{gpu}}"

FLEET = Dashboard(
    uid="gpufleet-fleet",
    title="gpufleet / Fleet",
    description="Every engine, host and GPU gpufleet deployed: what serves, what is out, what fires.",
    variables=(Variable("host", "Host", 'up{job=~"gpufleet_engine|node|dcgm|nginx"}'),),
    panels=(
        stat(
            "Engines up",
            f"sum(up{{{ENGINE}, {HOST}}}) or vector(0)",
            "Engine instances whose /metrics answers through their host's proxy.",
        ),
        stat(
            "Engines down",
            f"count(up{{{ENGINE}, {HOST}}} == 0) or vector(0)",
            "Engine instances Prometheus cannot scrape (GpufleetEngineDown).",
        ),
        stat(
            "Quarantined instances",
            f'sum(gpufleet_instance_quarantined{{job="node", {HOST}}}) or vector(0)',
            "Instances the watchdog (or an operator) took out of service; the reason is in the alert.",
        ),
        stat(
            "Firing alerts",
            f'count(ALERTS{{alertstate="firing", {HOST}}}) or vector(0)',
            "gpufleet alerts firing now (Prometheus' ALERTS series).",
        ),
        Panel(
            "Generated tokens/s by host",
            (
                Target(
                    f"sum by (host) (gpufleet:engine_generation_tokens:rate5m{{{HOST}}})",
                    "{{host}}",
                ),
            ),
            unit="short",
            description="Output tokens per second over 5 minutes, all engine instances of the host.",
        ),
        Panel(
            "Requests running / waiting by host",
            (
                Target(f"sum by (host) (gpufleet:engine_requests_running:sum{{{HOST}}})", "{{host}} running"),
                Target(f"sum by (host) (gpufleet:engine_requests_waiting:sum{{{HOST}}})", "{{host}} waiting"),
            ),
            description="Requests in the engines' batches and in their queues.",
        ),
        Panel(
            "GPUs by host (reporting / expected)",
            (
                Target(f"gpufleet:host_gpus_reporting:count{{{HOST}}}", "{{host}} reporting to DCGM"),
                Target(
                    f'max by (host) (gpufleet_host_gpus_expected{{job="node", {HOST}}})',
                    "{{host}} expected (host facts)",
                ),
            ),
            description="GPUs the DCGM exporter sees beside those the host's facts found; fewer: GpufleetGpuMissing.",
        ),
        Panel(
            "Firing alerts by severity",
            (
                Target(
                    f'count by (severity) (ALERTS{{alertstate="firing", {HOST}}}) or on () vector(0)',
                    "{{severity}}",
                ),
            ),
            description="0 (a series without a severity) while nothing fires.",
        ),
        Panel(
            "Edge backends drained / instances restart-pending",
            (
                Target(f'sum(gpufleet_edge_backend_drained{{job="node", {HOST}}}) or vector(0)', "backends drained"),
                Target(f'sum(gpufleet_restart_pending{{job="node", {HOST}}}) or vector(0)', "restart-pending"),
            ),
            description="Left this way past a rollout: GpufleetHostDrained.",
        ),
        Panel(
            "Exporters up",
            (Target(f'sum by (job) (up{{job=~"node|dcgm|nginx", {HOST}}})', "{{job}}"),),
            description="Exporters answering, per kind: node on every host, dcgm on GPU hosts, nginx on "
            "proxies and edges.",
        ),
    ),
)

ENGINE_DASHBOARD = Dashboard(
    uid="gpufleet-engine",
    title="gpufleet / Engine",
    description="One vLLM engine instance (or several): throughput, latency percentiles, KV cache, queue.",
    variables=(
        Variable("host", "Host", f"up{{{ENGINE}}}"),
        Variable("engine_instance", "Engine instance", f"up{{{ENGINE}, {HOST}}}"),
    ),
    panels=(
        Panel(
            "Throughput (tokens/s)",
            (
                Target(by_instance("gpufleet:engine_generation_tokens:rate5m"), INSTANCE_LEGEND + " generated"),
                Target(by_instance("gpufleet:engine_prompt_tokens:rate5m"), INSTANCE_LEGEND + " prompt"),
            ),
            description="Generated and prompt tokens per second over 5 minutes.",
        ),
        Panel(
            "Time to first token (p50, p95)",
            (
                Target(by_instance("gpufleet:engine_ttft_seconds:p50_5m"), INSTANCE_LEGEND + " p50"),
                Target(by_instance("gpufleet:engine_ttft_seconds:p95_5m"), INSTANCE_LEGEND + " p95"),
            ),
            unit="s",
            description="From the engine's histogram over 5 minutes; empty while it served nothing. "
            "Alert: GpufleetTTFTSlow.",
        ),
        Panel(
            "Inter-token latency (p50, p95)",
            (
                Target(by_instance("gpufleet:engine_itl_seconds:p50_5m"), INSTANCE_LEGEND + " p50"),
                Target(by_instance("gpufleet:engine_itl_seconds:p95_5m"), INSTANCE_LEGEND + " p95"),
            ),
            unit="s",
            description="Time between streamed tokens over 5 minutes. Alert: GpufleetITLSlow.",
        ),
        Panel(
            "End-to-end request latency (p50, p95)",
            (
                Target(by_instance("gpufleet:engine_e2e_latency_seconds:p50_5m"), INSTANCE_LEGEND + " p50"),
                Target(by_instance("gpufleet:engine_e2e_latency_seconds:p95_5m"), INSTANCE_LEGEND + " p95"),
            ),
            unit="s",
            description="Arrival to last token, over 5 minutes.",
        ),
        Panel(
            "KV cache usage",
            (Target(by_instance("gpufleet:engine_kv_cache_usage:ratio"), INSTANCE_LEGEND),),
            unit="percentunit",
            max=1,
            description="The fullest of the instance's engines. Near 1 with preemptions: GpufleetKVCacheFull.",
        ),
        Panel(
            "Requests running / waiting",
            (
                Target(by_instance("gpufleet:engine_requests_running:sum"), INSTANCE_LEGEND + " running"),
                Target(by_instance("gpufleet:engine_requests_waiting:sum"), INSTANCE_LEGEND + " waiting"),
            ),
            description="In the batch, and queued. A growing queue: GpufleetQueueGrowing.",
        ),
        Panel(
            "Preemptions/s",
            (Target(by_instance("gpufleet:engine_preemptions:rate5m"), INSTANCE_LEGEND),),
            description="Requests preempted for lack of KV cache, per second over 5 minutes.",
        ),
        Panel(
            "Prefix cache hit ratio",
            (Target(by_instance("gpufleet:engine_prefix_cache_hit:ratio_rate5m"), INSTANCE_LEGEND),),
            unit="percentunit",
            max=1,
            description="Prompt tokens found in the prefix cache among those looked up, over 5 minutes.",
        ),
        Panel(
            "Watchdog probe",
            (
                Target(f'gpufleet_watchdog_probe_ok{{job="node", {INSTANCE}}}', INSTANCE_LEGEND + " probe ok"),
                Target(f'gpufleet_instance_quarantined{{job="node", {INSTANCE}}}', INSTANCE_LEGEND + " quarantined"),
            ),
            description="The host watchdog's last one-token generation probe (1 ok, 0 failed) and the "
            "instance's quarantine (1: out of service).",
        ),
        Panel(
            "Watchdog: age of the last probe",
            (
                Target(
                    f'time() - gpufleet_watchdog_last_probe_timestamp_seconds{{job="node", {INSTANCE}}}',
                    INSTANCE_LEGEND,
                ),
            ),
            unit="s",
            description="Over 5 minutes: the watchdog stopped (GpufleetWatchdogStale).",
        ),
    ),
)

GPU_DASHBOARD = Dashboard(
    uid="gpufleet-gpu",
    title="gpufleet / GPU",
    description="Each GPU, from NVIDIA's DCGM exporter (its default counters).",
    variables=(
        Variable("host", "Host", 'DCGM_FI_DEV_GPU_TEMP{job="dcgm"}'),
        Variable("gpu", "GPU", f'DCGM_FI_DEV_GPU_TEMP{{job="dcgm", {HOST}}}'),
    ),
    panels=(
        Panel(
            "GPU utilization",
            (Target(per_gpu("DCGM_FI_DEV_GPU_UTIL"), GPU_LEGEND),),
            unit="percent",
            max=100,
            description="Share of time a kernel ran (DCGM does not report it for a GPU in MIG mode).",
        ),
        Panel(
            "Framebuffer used / free",
            (
                Target(per_gpu("DCGM_FI_DEV_FB_USED", "sum"), GPU_LEGEND + " used"),
                Target(per_gpu("DCGM_FI_DEV_FB_FREE", "sum"), GPU_LEGEND + " free"),
            ),
            unit="mbytes",
            description="GPU memory in MiB (a MIG GPU: summed over its instances). vLLM takes its "
            "share at start: a full framebuffer is normal while it serves.",
        ),
        Panel(
            "Temperature",
            (
                Target(per_gpu("DCGM_FI_DEV_GPU_TEMP"), GPU_LEGEND + " GPU"),
                Target(per_gpu("DCGM_FI_DEV_MEMORY_TEMP"), GPU_LEGEND + " memory"),
            ),
            unit="celsius",
            description="Over the threshold, or thermally throttled: GpufleetGpuThermalThrottle.",
        ),
        Panel(
            "Power draw",
            (Target(per_gpu("DCGM_FI_DEV_POWER_USAGE"), GPU_LEGEND),),
            unit="watt",
        ),
        Panel(
            "Clocks (SM, memory)",
            (
                Target(per_gpu("DCGM_FI_DEV_SM_CLOCK") + " * 1e6", GPU_LEGEND + " SM"),
                Target(per_gpu("DCGM_FI_DEV_MEM_CLOCK") + " * 1e6", GPU_LEGEND + " memory"),
            ),
            unit="hertz",
            description="An SM clock that drops under load is throttling: heat or power (the "
            "throttle reasons mask is not among dcgm-exporter's default counters).",
        ),
        Panel(
            "Last XID",
            (Target(per_gpu("DCGM_FI_DEV_XID_ERRORS"), GPU_LEGEND),),
            unit="none",
            description="The code of the GPU's last XID error (0: none since the exporter started). "
            "A drain code fires GpufleetGpuXid and the watchdog quarantines the GPU's instances.",
        ),
        Panel(
            "ECC: remapped rows and remap failures",
            (
                Target(per_gpu("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), GPU_LEGEND + " uncorrectable"),
                Target(per_gpu("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), GPU_LEGEND + " correctable"),
                Target(per_gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE"), GPU_LEGEND + " remap failed"),
            ),
            description="Memory rows remapped after ECC errors, and whether a remap failed "
            "(GpufleetGpuEccUncorrectable). Not reported for a GPU in MIG mode.",
        ),
        Panel(
            "PCIe replays/s",
            (Target(per_gpu_rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), GPU_LEGEND),),
            description="PCIe transfers retried, per second over 5 minutes: a link going bad.",
        ),
        Panel(
            "NVLink bandwidth counter rate",
            (Target(per_gpu_rate("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), GPU_LEGEND),),
            description="DCGM's NVLink bandwidth counter, all lanes, per second over 5 minutes (0 on GPUs "
            "without NVLink).",
        ),
        stat(
            "GPU alerts firing",
            f'count(ALERTS{{alertstate="firing", alertname=~"GpufleetGpu.*", {HOST}}}) or vector(0)',
            "XID, ECC, thermal and missing-GPU alerts firing on the selected hosts.",
        ),
    ),
)

DASHBOARDS = (FLEET, ENGINE_DASHBOARD, GPU_DASHBOARD)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.max is not None:
        defaults["min"] = 0
        defaults["max"] = panel.max
    if panel.kind == "stat":
        options: dict[str, Any] = {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "auto",
        }
    else:
        options = {
            "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return {
        "datasource": DATASOURCE,
        "description": panel.description,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "id": panel_id,
        "options": options,
        "targets": [
            {
                "datasource": DATASOURCE,
                "editorMode": "code",
                "expr": target.expr,
                "legendFormat": target.legend or "__auto",
                "range": True,
                "refId": chr(ord("A") + index),
            }
            for index, target in enumerate(panel.targets)
        ],
        "title": panel.title,
        "type": panel.kind,
    }


def _variable_json(variable: Variable) -> dict[str, Any]:
    query = f"label_values({variable.metric}, {variable.name})"
    return {
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": DATASOURCE,
        "definition": query,
        "hide": 0,
        "includeAll": True,
        "label": variable.label,
        "multi": True,
        "name": variable.name,
        "options": [],
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    panels, x, y, row_height = [], 0, 0, 0
    for panel_id, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel_json(panel, panel_id, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    datasource = {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
        "type": "datasource",
    }
    return {
        "annotations": {"list": []},
        "description": dashboard.description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "links": [
            {"asDropdown": False, "includeVars": True, "keepTime": True, "tags": ["gpufleet"], "type": "dashboards"}
        ],
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": list(dashboard.tags),
        "templating": {"list": [datasource, *(_variable_json(v) for v in dashboard.variables)]},
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": dashboard.title,
        "uid": dashboard.uid,
        "version": 1,
    }


def rendered() -> dict[Path, str]:
    """Each dashboard's file (relative to the repository) and its bytes."""
    return {
        OUT_DIR / f"{d.uid}.json": json.dumps(dashboard_json(d), indent=2, ensure_ascii=False) + "\n"
        for d in DASHBOARDS
    }


def substitute(expr: str) -> str:
    """A panel's PromQL as a Prometheus runs it with every variable on All."""
    for name in ("$engine_instance", "$host", "$gpu"):
        expr = expr.replace(name, ".*")
    return expr


def queries() -> list[dict[str, str]]:
    found = []
    for d in DASHBOARDS:
        for variable in d.variables:
            expr = substitute(variable.metric)
            found.append({"dashboard": d.uid, "panel": f"variable {variable.name}", "expr": expr})
        for panel in d.panels:
            for target in panel.targets:
                found.append({"dashboard": d.uid, "panel": panel.title, "expr": substitute(target.expr)})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    mode.add_argument("--queries", action="store_true", help="print every PromQL query as JSON")
    args = parser.parse_args(argv)
    if args.queries:
        print(json.dumps(queries(), indent=2))
        return 0
    stale = []
    for path, text in rendered().items():
        target = ROOT / path
        current = target.read_text() if target.is_file() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run {COMMAND}): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
