"""gpu_facts module: cases as data (the run_command calls it makes, what each returns, the result).

nvidia-smi is the hardware we do not have: each case replays REAL captured output
(tests/fixtures/nvidia_smi/) as the stdout of the matching call.
"""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes
from conftest import read_fixture

from ansible_collections.gpufleet.serving.plugins.modules import gpu_facts

SMI = "/usr/bin/nvidia-smi"
QUERY = (SMI, "--query-gpu=index,name,uuid,memory.total,pci.bus_id,driver_version", "--format=csv")
PLAIN = (SMI,)
TOPO = (SMI, "topo", "-m")
P2P = (SMI, "topo", "-p2p", "r")
TIMEOUT_PREFIX = ("/usr/bin/timeout", "--kill-after=5", "30s")
DRIVER_DOWN = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def _ok(text):
    return (0, text, "")


def _fail(rc, out="", err=""):
    return (rc, out, err)


CASES = [
    pytest.param(
        {"machine": "2x_rtx4090_threadripper_pro_wrx80"},
        {
            QUERY: _fail(2, err="no query output captured for this machine"),
            PLAIN: _ok(read_fixture("2x_rtx4090_threadripper_pro_wrx80", "nvidia-smi.txt")),
            TOPO: _ok(read_fixture("2x_rtx4090_threadripper_pro_wrx80", "topo-m.txt")),
            P2P: _fail(2, err="not captured"),
        },
        {"count": 2, "driver_version": "525.60.13", "cuda_version": "12.0", "p2p.recommended": False, "problem": None},
        id="2x4090-table-and-topo",
    ),
    pytest.param(
        {"machine": "2x_rtx5090_threadripper_pro"},
        {
            QUERY: _fail(2),
            PLAIN: _fail(2),
            TOPO: _ok(read_fixture("2x_rtx5090_threadripper_pro", "topo-m.txt")),
            P2P: _ok(read_fixture("2x_rtx5090_threadripper_pro", "topo-p2p-r.txt")),
        },
        {"count": 2, "driver_version": None, "p2p.recommended": False, "p2p.source": "driver", "problem": None},
        id="2x5090-driver-says-GNS",
    ),
    pytest.param(
        {"machine": "driver-down"},
        {
            QUERY: _fail(9, out=DRIVER_DOWN),
            PLAIN: _fail(9, out=DRIVER_DOWN),
            TOPO: _fail(9, out=DRIVER_DOWN),
            P2P: _fail(9),
        },
        {"count": 0, "p2p.recommended": True, "problem": "nvidia-smi failed: " + DRIVER_DOWN.strip()},
        id="driver-not-loaded",
    ),
    pytest.param(
        {"machine": "hung-driver"},
        # coreutils timeout exits 124 when it had to stop the command
        {QUERY: _fail(124), PLAIN: _fail(124), TOPO: _fail(124), P2P: _fail(124)},
        {"count": 0, "problem": "nvidia-smi failed: %s did not answer within 30 s (a hung driver or GPU?)" % SMI},
        id="nvidia-smi-hangs",
    ),
    pytest.param(
        {"machine": "bare-carriage-return"},
        {
            # a bare CR inside a row: csv.reader raised csv.Error out of the parser before
            QUERY: _ok(
                "index, name, uuid, memory.total [MiB], pci.bus_id, driver_version\r"
                "0, NVIDIA L4, GPU-x, 23034 MiB, 00000000:01:00.0, 550.54.15\r\n"
            ),
            PLAIN: _fail(2),
            TOPO: _fail(2),
            P2P: _fail(2),
        },
        {"count": 1, "devices.0.name": "NVIDIA L4", "problem": None},
        id="csv-with-bare-cr",
    ),
]


class _Exit(Exception):
    pass


def _run_module(monkeypatch, tmp_path, params, calls, check_mode=False):
    made = []

    def run_command(self, argv, **kwargs):
        # every call runs under coreutils timeout (a hung nvidia-smi must not hang the play)
        assert tuple(argv[:3]) == TIMEOUT_PREFIX, argv
        argv = tuple(argv[3:])
        made.append(argv)
        assert kwargs.get("environ_update") == {"LC_ALL": "C"}
        return calls[argv]

    real_bin_path = basic.AnsibleModule.get_bin_path

    def get_bin_path(self, name, *a, **k):
        return "/usr/bin/timeout" if name == "timeout" else real_bin_path(self, name, *a, **k)

    def exit_json(self, **result):
        raise _Exit(result)

    def fail_json(self, **result):
        raise AssertionError("module failed: %s" % result)

    args = dict(params, _ansible_check_mode=check_mode)
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args})))
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    if basic.AnsibleModule.get_bin_path.__name__ != "<lambda>":
        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", get_bin_path)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(os, "access", lambda path, mode: path == SMI or os.path.exists(path))
    with pytest.raises(_Exit) as done:
        gpu_facts.main()
    return made, done.value.args[0]


def _get(facts, dotted):
    for part in dotted.split("."):
        facts = facts[int(part)] if isinstance(facts, list) else facts[part]
    return facts


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
@pytest.mark.parametrize(("case", "calls", "expected"), CASES)
def test_gpu_facts_cases(monkeypatch, tmp_path, case, calls, expected, check_mode):
    params = {"nvidia_smi_path": SMI, "sysfs_root": str(tmp_path)}
    made, result = _run_module(monkeypatch, tmp_path, params, calls, check_mode)
    # read-only: the same calls in check mode; after a call that had to be stopped, none
    # (a hung driver cost 4 x 30 s per host before, issue 32)
    assert made == ([QUERY] if case["machine"] == "hung-driver" else [QUERY, PLAIN, TOPO, P2P])
    assert result["changed"] is False
    facts = result["ansible_facts"]["gpufleet_gpu"]
    for key, value in expected.items():
        assert _get(facts, key) == value, key
    assert facts["rdma_devices"] == []  # an empty sysfs tree: no /sys/class/infiniband


def test_sysfs_numa_and_rdma(monkeypatch, tmp_path):
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:41:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    (dev / "local_cpulist").write_text("16-31,48-63\n")
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    calls = {
        QUERY: _ok(
            "index, name, uuid, memory.total [MiB], pci.bus_id, driver_version\n"
            "0, NVIDIA H100 80GB HBM3, GPU-x, 81559 MiB, 00000000:41:00.0, 565.57.01\n"
        ),
        PLAIN: _ok(read_fixture("8x_h100_sxm_thamada", "nvidia-smi.txt")),
        TOPO: _fail(2),
        P2P: _fail(2),
    }
    _, result = _run_module(monkeypatch, tmp_path, {"nvidia_smi_path": SMI, "sysfs_root": str(tmp_path)}, calls)
    facts = result["ansible_facts"]["gpufleet_gpu"]
    d0 = facts["devices"][0]
    assert (d0["numa_node"], d0["numa_source"], d0["cpus"]) == (1, "sysfs", "16-31,48-63")
    assert facts["rdma_devices"] == ["mlx5_0"]
    assert facts["rdma_source"] == "sysfs"
    # The table lists 8 GPUs and the CSV one: all 8 are known, the CSV enriches GPU 0.
    assert facts["count"] == 8
    assert facts["devices"][0]["uuid"] == "GPU-x"


def test_no_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, *a, **k: None)
    _, result = _run_module(monkeypatch, tmp_path, {"sysfs_root": str(tmp_path)}, {})
    facts = result["ansible_facts"]["gpufleet_gpu"]
    assert facts["count"] == 0
    assert "nvidia-smi not found" in facts["problem"]


def test_hung_stand_in_is_called_once(monkeypatch, tmp_path):
    """A stand-in for a hung driver's nvidia-smi (it logs each call, then sleeps), run for real
    under coreutils timeout: the module stops it once and calls it no more."""
    calls = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$*" >> %s\nexec sleep 30\n' % calls)
    smi.chmod(0o755)
    args = {"nvidia_smi_path": str(smi), "sysfs_root": str(tmp_path), "timeout": 1, "_ansible_check_mode": False}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args})))
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", lambda self, **r: (_ for _ in ()).throw(_Exit(r)))
    with pytest.raises(_Exit) as done:
        gpu_facts.main()
    facts = done.value.args[0]["ansible_facts"]["gpufleet_gpu"]
    assert calls.read_text().splitlines() == ["--query-gpu=" + QUERY[1].split("=", 1)[1] + " --format=csv"]
    assert facts["count"] == 0 and "did not answer within 1 s" in facts["problem"]
