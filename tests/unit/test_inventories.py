"""The example inventories: they load, site.yml parses against them, and every host's engines
plan cleanly against the captured nvidia-smi output of a machine of that kind.

Each host names its hardware fixture (gpufleet_lab_gpu_fixture, tests/fixtures/nvidia_smi/)
and maps its model folders to config.json fixtures (gpufleet_lab_model_configs). The plan is
the engine role's own preflight (validation + memory plan), fed from those files instead of
a live host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from engine_role import role_defaults

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "lab"
FIXTURES = ROOT / "tests" / "fixtures"


def _hostvars():
    from gpufleet.lab import load_inventory

    return load_inventory(INVENTORY)[0]


HOSTVARS = _hostvars()


def _facts(fixture):
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts
    from gpufleet.cli import read_capture

    texts = read_capture(FIXTURES / "nvidia_smi" / fixture)
    return build_facts(
        query_csv=texts["query-gpu.csv"], summary=texts["nvidia-smi.txt"], topo=texts["topo-m.txt"],
        p2p=texts["topo-p2p-r.txt"],
    )  # fmt: skip


def _pasted_plan(host):
    """The plan lines pasted in the comment of a host's file ('#   ' starts one, '#       '
    continues it, wrapped at spaces or after hyphens)."""
    lines = []
    for text in (INVENTORY / "host_vars" / ("%s.yml" % host)).read_text().splitlines():
        if text.startswith("#       "):
            lines[-1] += ("" if lines[-1].endswith("-") else " ") + text[8:]
        elif text.startswith("#   "):
            lines.append(text[4:])
    return lines


def test_inventory_groups():
    assert set(HOSTVARS) == {"ws-4090-r1-70b", "ws-4090-r1-32b", "ws-3090-r1-14b", "ws-4090-sglang", "h100-node-01",
                             "h100-node-02", "h100-node-03"}  # fmt: skip
    assert all("gpu_hosts" in v["group_names"] for v in HOSTVARS.values())


@pytest.mark.parametrize("host", sorted(HOSTVARS))
def test_every_host_plans_against_its_hardware(host, capsys):
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import groups
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan
    from ansible_collections.gpufleet.serving.plugins.module_utils._proxy import plan_proxy

    hv = HOSTVARS[host]
    gpu = _facts(hv["gpufleet_lab_gpu_fixture"])
    for device in gpu["devices"]:
        device["memory_total_mib"] = device["memory_total_mib"] or hv.get("gpufleet_lab_gpu_memory_mib")
    models = {
        path: {"exists": True, "config": (FIXTURES / "model_configs" / ("%s.json" % name)).read_text()}
        for path, name in hv["gpufleet_lab_model_configs"].items()
    }
    # the host's place in the fleet's multi-node instances, as the role's preflight passes it
    # (its network facts: the interface holding its inventory address)
    host_info = {"name": host, "hosts": sorted(HOSTVARS), "groups": groups(sorted(HOSTVARS), HOSTVARS),
                 "facts": {"interfaces": ["eth0"], "eth0": {"ipv4": {"address": hv["ansible_host"]}}}}  # fmt: skip
    result = plan(hv["gpufleet_engines"], gpu=gpu, models=models, defaults=role_defaults(), host=host_info)
    assert result["errors"] == [], result["errors"]
    assert result["instances"], "%s runs no instance" % host
    for inst in result["instances"]:
        assert inst["memory_plan"] and not inst["memory_plan"][0].startswith("memory plan skipped"), inst["memory_plan"]
        print("%s %s: %s" % (host, inst["name"], " ".join(inst["engine_args"][6:])))
        for line in inst["memory_plan"]:
            print("  " + line)
        # the plan pasted in the host's file is the one the engine role makes, line for line
        pasted = _pasted_plan(host)
        assert "%s: %s" % (inst["name"], " ".join(inst["engine_args"][6:])) in pasted, (host, pasted)
        for line in inst["memory_plan"]:
            assert line in pasted, (host, line)
    # the proxy role's preflight settings: its defaults under the host's variables
    pv = dict(yaml.safe_load((ROOT / "roles" / "proxy" / "defaults" / "main.yml").read_text()), **hv)
    keys = ("listen_port", "instances", "endpoints", "api_keys", "rate_limit", "client_max_body_size", "read_timeout",
            "send_timeout", "upstream_keepalive_timeout", "tls", "tls_port", "tls_certificate", "tls_certificate_key",
            "monitor_listen")  # fmt: skip
    if hv["gpufleet_engines"]:  # a multi-node worker alone has no proxy (site.yml gives it none)
        proxy = plan_proxy({k: pv["proxy_" + k] for k in keys}, hv["gpufleet_engines"])
        assert proxy["errors"] == [], proxy["errors"]


def test_a_typo_in_the_inventory_is_named():
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_validate import validate

    inst = dict(HOSTVARS["ws-4090-r1-32b"]["gpufleet_engines"][0])
    inst["max_model_length"] = inst.pop("max_model_len")
    errors = validate([inst], gpu=_facts("2x_rtx4090_threadripper_pro_wrx80"), models={})
    assert any("unknown key 'max_model_length'" in e and "did you mean max_model_len" in e for e in errors), errors


@pytest.mark.parametrize("playbook", ["site.yml", "playbooks/rollout.yml"])
def test_playbooks_parse_against_the_inventory(playbook):
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "--syntax-check", "-i", str(INVENTORY),
         str(ROOT / playbook)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
