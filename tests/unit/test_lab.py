"""gpufleet lab test: reading a user's inventory into lab hosts (the parts that need no Docker)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufleet import lab, runner

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_inventory_names_its_hardware_and_models():
    hostvars, groups = lab.load_inventory(ROOT / "inventories" / "lab")
    inputs, errors = lab.hardware_inputs(ROOT / "inventories" / "lab", hostvars, groups["gpu_hosts"])
    assert errors == []
    assert inputs["ws-4090-r1-70b"]["capture"] == ROOT / "tests/fixtures/nvidia_smi/2x_rtx4090_threadripper_pro_wrx80"
    assert inputs["ws-4090-r1-70b"]["configs"] == {
        "/srv/models/DeepSeek-R1-Distill-Llama-70B-AWQ": ROOT
        / "tests/fixtures/model_configs/deepseek-r1-distill-llama-70b-awq.json"
    }
    assert (inputs["h100-node-01"]["capture"] / "nvidia-smi.txt").is_file()


def test_a_users_own_capture_folder_and_config_are_found_next_to_the_inventory(tmp_path):
    (tmp_path / "captures" / "gpu-01").mkdir(parents=True)
    (tmp_path / "captures" / "gpu-01" / "nvidia-smi.txt").write_text("captured\n")
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    hv = {"gpufleet_lab_gpu_fixture": "captures/gpu-01", "gpufleet_lab_model_configs": {"/srv/m": "models/m"}}
    inputs, errors = lab.hardware_inputs(tmp_path / "hosts.yml", {"gpu-01": hv}, ["gpu-01"])
    assert errors == []
    assert inputs["gpu-01"] == {
        "capture": tmp_path / "captures" / "gpu-01",
        "configs": {"/srv/m": tmp_path / "models" / "m" / "config.json"},
    }


def test_missing_captures_are_named_with_host_variable_and_fix(tmp_path):
    hostvars = {
        "gpu-01": {},
        "gpu-02": {"gpufleet_lab_gpu_fixture": "captures/nope", "gpufleet_lab_model_configs": {"/srv/m": "no.json"}},
    }
    _, errors = lab.hardware_inputs(tmp_path, hostvars, ["gpu-01", "gpu-02"])
    assert len(errors) == 3
    assert errors[0].startswith("gpu-01: gpufleet_lab_gpu_fixture is not set")
    assert "gpufleet gpu capture FOLDER" in errors[0]
    assert errors[1].startswith("gpu-02: gpufleet_lab_gpu_fixture=captures/nope is not a folder")
    assert errors[2].startswith("gpu-02: gpufleet_lab_model_configs[/srv/m]=no.json is not a config.json")


def test_lab_engines_keep_names_ports_and_served_names_and_run_the_tiny_model_on_cpu():
    hv = yaml.safe_load((ROOT / "inventories/lab/host_vars/ws-4090-sglang.yml").read_text())
    engines = lab.lab_engines(hv["gpufleet_engines"], "gpufleet-lab/vllm-cpu:abc", "/srv/gpufleet-lab/models/tiny")
    assert engines == [
        {
            "name": "r1-14b-sglang",
            "port": 30000,
            "served_model_name": "deepseek-r1-14b",
            "engine": "vllm",
            "accelerator": "cpu",
            "image": "gpufleet-lab/vllm-cpu:abc",
            "model": "/srv/gpufleet-lab/models/tiny",
            **lab.LAB_ENGINE,
        }
    ]
    assert lab.lab_engines([{"name": "x", "model": "m"}], "i", "t")[0]["served_model_name"] == "x"


def test_the_lab_needs_a_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(lab, "collection_root", lambda: tmp_path)  # an installed copy: no tests/lab
    with pytest.raises(lab.LabError, match="from a clone of gpufleet"):
        lab.harness("image", "host")


class FakePlay:
    """Stands in for runner.play: records each request, returns the next outcome (rc, changed per host)."""

    def __init__(self, *results: tuple[int, dict[str, int]]):
        self.results, self.requests = list(results), []

    def __call__(self, req):
        self.requests.append(req)
        rc, changed = self.results.pop(0)
        view = runner.RunView(quiet=True)
        for host, count in changed.items():
            view.host(host).changed = count
        return runner.Outcome(rc=rc, status="successful" if rc == 0 else "failed", log=Path("/log"), view=view)


@pytest.fixture
def no_docker(monkeypatch):
    """The lab's Docker steps replaced: the stages and what they hand to the runner are what is tested."""
    removed = []
    monkeypatch.setattr(lab, "harness", lambda *args: "/x/%s" % "-".join(args))
    monkeypatch.setattr(lab, "start_hosts", lambda *a, **kw: None)
    monkeypatch.setattr(lab, "stage_hardware", lambda *a: None)
    monkeypatch.setattr(lab, "remove_hosts", removed.extend)
    return removed


def _inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    host = {
        "gpufleet_lab_gpu_fixture": "2x_rtx4090_threadripper_pro_wrx80",
        "gpufleet_engines": [{"name": "qwen", "model": "/srv/m", "port": 8001}],
    }
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"hosts": {"gpu-01": host}}}}}))
    return path


def test_lab_test_runs_site_yml_through_the_runner_stage_by_stage(no_docker, monkeypatch, tmp_path, capsys):
    fake = FakePlay((0, {}), (0, {"gpu-01": 14}), (0, {"gpu-01": 14}), (0, {}))
    monkeypatch.setattr(runner, "play", fake)
    assert lab.lab_test(_inventory(tmp_path), converge=True) == 0
    preflight, check, converge, again = fake.requests
    assert all(r.playbook == "site" and r.inventory == str(tmp_path / "hosts.yml") for r in fake.requests)
    assert all(r.echo and r.verbose == 0 for r in fake.requests)  # Ansible's own output, without -v
    assert (preflight.check, preflight.diff, preflight.tags) == (True, True, "preflight")
    assert preflight.extravars["ansible_connection"] == "ssh"
    assert preflight.extravars["ansible_ssh_common_args"].startswith("-F /x/ssh-")
    assert "gpufleet_engines" not in preflight.extravars  # the user's own variables, unchanged
    assert (check.check, check.diff, converge.check, again.check) == (True, True, False, False)
    engines = converge.extravars["gpufleet_lab_engines"]["gpu-01"]
    assert [(e["name"], e["port"], e["accelerator"]) for e in engines] == [("qwen", 8001, "cpu")]
    assert "converged, idempotent and streaming on 1 hosts" in capsys.readouterr().err
    assert no_docker == ["gpufleet-labtest-gpu-01"]


def test_lab_test_fails_when_the_second_run_changes_something(no_docker, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runner, "play", FakePlay((0, {}), (0, {}), (0, {"gpu-01": 14}), (0, {"gpu-01": 1})))
    assert lab.lab_test(_inventory(tmp_path), converge=True) == 2  # ran, did not pass
    assert "not idempotent: changed on {'gpu-01': 1}" in capsys.readouterr().err


def test_lab_test_stops_at_a_failed_preflight(no_docker, monkeypatch, tmp_path, capsys):
    fake = FakePlay((2, {}))
    monkeypatch.setattr(runner, "play", fake)
    assert lab.lab_test(_inventory(tmp_path), converge=True) == 2
    assert len(fake.requests) == 1
    assert "gpufleet lab: preflight failed (exit 2)" in capsys.readouterr().err
    assert no_docker == ["gpufleet-labtest-gpu-01"]
