"""gpufleet's Prometheus rules (roles/monitoring/templates/gpufleet-rules.yml.j2), rendered with
the role's defaults by tests/monitoring/render_rules.py and checked by Prometheus' own promtool
(Debian's package, fetched by tests/promtools.sh): the file loads, every promtool unit test in
tests/monitoring/ passes, every alert has a case that fires it and one that stays quiet, and the
rules behave on the real captures' series (tests/fixtures/dcgm, tests/fixtures/engine_metrics)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

MONITORING = ROOT / "tests" / "monitoring"
TEMPLATE = ROOT / "roles" / "monitoring" / "templates" / "gpufleet-rules.yml.j2"
DEFAULTS = ROOT / "roles" / "monitoring" / "defaults" / "main.yml"
RULES_FILE = "gpufleet-rules.yml"  # the name the test files' rule_files give
TEST_FILES = sorted(MONITORING.glob("*.test.yml"))


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


render_rules = _load("gpufleet_render_rules", MONITORING / "render_rules.py")
promtest = _load("gpufleet_promtest", MONITORING / "promtest.py")


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory) -> Path:
    """The rendered rules with the unit test files beside them (their rule_files is relative)."""
    folder = tmp_path_factory.mktemp("rules")
    (folder / RULES_FILE).write_text(render_rules.render())
    for test_file in TEST_FILES:
        shutil.copy(test_file, folder / test_file.name)
    return folder


def rendered() -> dict:
    return yaml.safe_load(render_rules.render())


def rules_of(kind: str) -> dict[str, dict]:
    return {rule[kind]: rule for group in rendered()["groups"] for rule in group["rules"] if kind in rule}


def alert_cases() -> list[tuple[str, str, bool]]:
    """(test file, alert name, whether the case expects it firing) for every alert_rule_test."""
    return [
        (path.name, case["alertname"], bool(case.get("exp_alerts")))
        for path in TEST_FILES
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def test_rules_load_in_promtool(promtool, rules_dir):
    run = promtest.run_promtool(promtool, "check", "rules", RULES_FILE, cwd=rules_dir)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


@pytest.mark.parametrize("test_file", [p.name for p in TEST_FILES])
def test_promtool_unit_tests_pass(promtool, rules_dir, test_file):
    run = promtest.run_promtool(promtool, "test", "rules", test_file, cwd=rules_dir)
    assert run.returncode == 0, run.stdout + run.stderr


def test_there_are_unit_tests_and_rules():
    assert {"engine.test.yml", "gpu.test.yml", "hosts.test.yml", "records.test.yml"} <= {p.name for p in TEST_FILES}
    assert [group["name"] for group in rendered()["groups"]] == ["gpufleet.records", "gpufleet.alerts"]


def test_every_alert_has_a_firing_and_a_quiet_case():
    """A new alert without tests fails here; so does a test of an alert that no longer exists."""
    alerts = set(rules_of("alert"))
    cases = alert_cases()
    firing = {name for _, name, fires in cases if fires}
    quiet = {name for _, name, fires in cases if not fires}
    assert sorted(alerts - firing) == [], "alerts no test case fires (add an alert_rule_test with exp_alerts)"
    assert sorted(alerts - quiet) == [], "alerts without a case that expects them quiet (exp_alerts: [])"
    assert sorted({name for _, name, _ in cases} - alerts) == [], "test cases of alerts the rules do not have"


def test_every_recording_rule_value_is_tested():
    tested = " ".join(
        case["expr"]
        for path in TEST_FILES
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("promql_expr_test", [])
        if case.get("exp_samples")
    )
    untested = [name for name in rules_of("record") if not re.search(re.escape(name) + r"(?![\w:])", tested)]
    assert untested == [], "recording rules without a promql_expr_test of their value"


# alerts about the fleet as a whole, aggregated by model (no one host is at fault): they name the model
FLEET_ALERTS = {"GpufleetModelUnserved": "$labels.model"}


def test_alerts_carry_severity_and_annotations_naming_the_host():
    for name, rule in rules_of("alert").items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        for text in rule["annotations"].values():
            names = FLEET_ALERTS.get(name, "$labels.host")
            assert names in text, f"{name}: the annotation names no {names[8:]}: {text}"
        assert name.startswith("Gpufleet"), name


def test_every_alert_threshold_variable_is_used():
    defaults = yaml.safe_load(DEFAULTS.read_text())
    thresholds = sorted(key for key in defaults if key.startswith("monitoring_alert_"))
    assert thresholds, "roles/monitoring/defaults/main.yml defines no monitoring_alert_* variable"
    expressions = " ".join(re.findall(r"\{\{(.*?)\}\}", TEMPLATE.read_text()))
    unused = [key for key in thresholds if not re.search(r"\b%s\b" % re.escape(key), expressions)]
    assert unused == [], "threshold variables the rules template does not use"


def test_the_xid_alert_matches_the_watchdogs_drain_list():
    xids = render_rules.drain_xids()
    expr = rules_of("alert")["GpufleetGpuXid"]["expr"]
    assert sorted(int(x) for x in re.findall(r"DCGM_FI_DEV_XID_ERRORS\{[^}]*\} == (\d+)", expr)) == xids
    (regex,) = re.findall(r'xid=~"([^"]*)"', expr)
    assert sorted(int(x) for x in regex.split("|")) == xids
    if render_rules.GPU_HEALTH.is_file():  # the watchdog's list is the one rendered
        health = _load("gpufleet_gpu_health_for_rules", render_rules.GPU_HEALTH)
        assert xids == sorted(health.DRAIN_XIDS)


def test_ansible_renders_the_template_as_the_tests_do(tmp_path):
    """render_rules.py stands in for the role's template task: Ansible itself gives the same file."""
    ansible = Path(sys.executable).with_name("ansible")
    if not ansible.exists():
        pytest.skip("no ansible next to this Python")
    dest = tmp_path / RULES_FILE
    extra = tmp_path / "extra.json"
    # the engines' series through the role's own filter, as configure.yml passes them
    engines = "{{ none | gpufleet.serving.engine_series }}"
    extra.write_text(
        json.dumps({"__monitoring_drain_xids": render_rules.drain_xids(), "__monitoring_engines": engines})
    )
    argv = [str(ansible), "localhost", "-c", "local", "-m", "ansible.builtin.template"]
    argv += ["-a", f"src={TEMPLATE} dest={dest}", "-e", f"@{DEFAULTS}", "-e", f"@{extra}"]
    run = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={
            "PATH": str(ansible.parent) + ":/usr/bin:/bin",
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "HOME": str(tmp_path),
        },
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ours = render_rules.render().splitlines()
    theirs = dest.read_text().splitlines()
    assert theirs[0].startswith("# ") and ours[0].startswith("# ")  # the ansible_managed line differs
    assert theirs[1:] == ours[1:]


# --- the rules on real captured series ------------------------------------------------------------


@pytest.mark.skipif(not promtest.GPU_HEALTH.is_file(), reason="needs plugins/module_utils/_gpu_health.py")
def test_rules_on_the_real_captures(promtool, rules_dir):
    """The DCGM captures (one with a GPU in MIG mode: its series three times) and the busy vLLM
    capture, as a Prometheus would hold them: no GPU alert on these healthy GPUs, the MIG GPU
    counted once, a GPU missing only where the host's facts expect more, and the engine's
    records computed from its real series."""
    inputs = promtest.dcgm_series() + promtest.engine_series() + promtest.sglang_series()
    # the host's facts: 8 GPUs on the A800 host (all seen), 2 on the RTX 4000 host (one seen)
    for host, expected in (("a800", 8), ("rtx4000", 2)):
        labels = {"job": "node", "instance": f"{host}:9100", "host": host}
        inputs.append({"series": promtest.series("gpufleet_host_gpus_expected", labels), "values": f"{expected}x40"})

    def case(expr: str, *samples: tuple[str, dict, float]) -> dict:
        exp = [{"labels": promtest.series(name, labels), "value": value} for name, labels, value in samples]
        return {"expr": expr, "eval_time": "5m", "exp_samples": exp}

    def firing(alert: str) -> str:
        return f'ALERTS{{alertname="{alert}", alertstate="firing"}}'

    missing = {"alertname": "GpufleetGpuMissing", "alertstate": "firing", "severity": "critical", "host": "rtx4000"}
    reporting = "gpufleet:host_gpus_reporting:count"
    cases = [
        case(firing("GpufleetGpuXid")),
        case(firing("GpufleetGpuEccUncorrectable")),
        case(firing("GpufleetGpuThermalThrottle")),
        case(firing("GpufleetGpuMissing"), ("ALERTS", missing, 1)),
        case(reporting, (reporting, {"host": "a800"}, 8), (reporting, {"host": "rtx4000"}, 1)),
    ]
    # the engine records, per instance: vLLM's busy capture as a800/tiny, and SGLang's own busy
    # capture beside it as a800/sg, each read through the registry's names for its engine
    for name, values in (
        ("tiny", (("gpufleet:engine_kv_cache_usage:ratio", 0.0002441704309608106),
                  ("gpufleet:engine_requests_running:sum", 2),
                  ("gpufleet:engine_requests_waiting:sum", 0),
                  ("gpufleet:engine_generation_tokens:rate5m", 0))),  # a constant counter: no token in the window
        ("sg", (("gpufleet:engine_kv_cache_usage:ratio", 0.28),
                ("gpufleet:engine_requests_running:sum", 162),
                ("gpufleet:engine_requests_waiting:sum", 2826),
                ("gpufleet:engine_generation_tokens:rate5m", 0),
                ("gpufleet:engine_prefix_cache_hit:ratio_rate5m", 0.007507552643049313))),
    ):  # fmt: skip
        instance = {"host": "a800", "engine_instance": name}
        for record, value in values:
            cases.append(case('%s{engine_instance="%s"}' % (record, name), (record, instance, value)))
    # SGLang's capture is full of waiting requests but its token pool is 28 % used: no KV alert,
    # not even pending
    cases.append(case('ALERTS{alertname="GpufleetKVCacheFull"}'))
    test = {
        "rule_files": [RULES_FILE],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": inputs, "promql_expr_test": cases}],
    }
    (rules_dir / "captures.generated.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    run = promtest.run_promtool(promtool, "test", "rules", "captures.generated.yml", cwd=rules_dir)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
