"""`gpufleet lab test -i INVENTORY`: users' own CI for their fleet, on lab hosts without GPUs.

- The example inventory passes its preflight on the captured hardware of each host.
- A copy with three mistakes fails before any change, naming each host and the fix:
  a plan that does not fit, a port clash and a typo'd key.
- A small user inventory converges on CPU, is idempotent and streams through its proxy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GPUFLEET = Path(sys.executable).parent / "gpufleet"


def lab_test(inventory: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(GPUFLEET), "lab", "test", "-i", str(inventory), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"ANSIBLE_FORCE_COLOR": "0", "PATH": "%s:/usr/sbin:/usr/bin:/sbin:/bin" % GPUFLEET.parent},
    )
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    return proc


def _containers() -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", "label=io.gpufleet.lab.scenario=lab_test", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def test_the_example_inventory_passes_preflight_on_its_captured_hardware():
    proc = lab_test(ROOT / "inventories" / "lab")
    assert proc.returncode == 0
    hosts = ("ws-4090-r1-70b", "ws-4090-r1-32b", "ws-3090-r1-14b", "ws-4090-sglang", "h100-node-01")
    for host in hosts:
        assert f"{host}" in proc.stdout and f"changed=0" in proc.stdout
    # the plans were made on the replayed GPUs: the 70B AWQ host's KV line, the H100's two replicas
    assert "ws-4090-r1-70b" in proc.stdout and "KV cache: " in proc.stdout
    assert proc.stdout.count("placement") >= 1 or "cpuset" in proc.stdout
    assert _containers() == [], "lab hosts left behind"


def test_mistakes_fail_before_any_change_and_name_host_and_fix(tmp_path):
    inventory = tmp_path / "lab"
    shutil.copytree(ROOT / "inventories" / "lab", inventory)
    # 1. the 70B AWQ model on one 24 GB card: does not fit
    path = inventory / "host_vars" / "ws-4090-r1-70b.yml"
    hv = yaml.safe_load(path.read_text())
    hv["gpufleet_engines"][0]["gpus"] = [0]
    hv["gpufleet_engines"][0].pop("tensor_parallel_size", None)
    path.write_text(yaml.safe_dump(hv))
    # 2. a second instance on the port of the first
    path = inventory / "host_vars" / "ws-4090-r1-32b.yml"
    hv = yaml.safe_load(path.read_text())
    twin = dict(hv["gpufleet_engines"][0], name="r1-32b-twin")
    hv["gpufleet_engines"].append(twin)
    path.write_text(yaml.safe_dump(hv))
    # 3. a typo'd key
    path = inventory / "host_vars" / "ws-4090-sglang.yml"
    hv = yaml.safe_load(path.read_text())
    hv["gpufleet_engines"][0]["contxt_length"] = hv["gpufleet_engines"][0].pop("context_length")
    path.write_text(yaml.safe_dump(hv))

    proc = lab_test(inventory)
    out = proc.stdout
    assert proc.returncode != 0
    failures = [line for line in out.splitlines() if line.startswith("fatal: [")]
    assert {f.split("]")[0][len("fatal: [") :] for f in failures} >= {"ws-4090-r1-70b", "ws-4090-r1-32b", "ws-4090-sglang"}
    assert "short by" in out and "Fix:" in out
    assert "port 8001" in out or "same port" in out or "port" in out.split("ws-4090-r1-32b")[-1]
    assert "contxt_length" in out and "context_length" in out
    # preflight is where it stopped: no later play started
    assert "PLAY [GPU stack]" not in out
    assert _containers() == []


def test_a_small_inventory_converges_on_cpu_and_streams(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_hosts": {
                            "hosts": {
                                "gpu-01": {
                                    "gpufleet_lab_gpu_fixture": "2x_rtx4090_threadripper_pro_wrx80",
                                    "gpufleet_lab_model_configs": {"/srv/models/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct"},
                                    "gpufleet_engines": [
                                        {
                                            "name": "qwen7b",
                                            "engine": "vllm",
                                            "model": "/srv/models/Qwen2.5-7B-Instruct",
                                            "served_model_name": "qwen2.5-7b",
                                            "port": 8001,
                                            "gpus": [0],
                                            "max_model_len": 8192,
                                        }
                                    ],
                                    "proxy_api_keys": [{"name": "ci", "key": "ci-key-0123456789abcdef0123456789ab"}],
                                }
                            },
                            "vars": {"nvidia_driver_source": "cuda_repo", "nvidia_driver_branch": "580"},
                        }
                    }
                }
            }
        )
    )
    proc = lab_test(inventory, "--converge")
    assert proc.returncode == 0
    assert "converged, idempotent and streaming on 1 hosts" in proc.stderr
    assert "Stream one short completion through the host's proxy" in proc.stdout
    assert _containers() == []
