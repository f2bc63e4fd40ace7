"""The NCCL environment planner: layers, validation messages, topology layer."""

from __future__ import annotations

import pytest
from conftest import read_fixture

from ansible_collections.gpufleet.serving.plugins.filter.nccl import FilterModule
from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts
from ansible_collections.gpufleet.serving.plugins.module_utils._nccl import plan_env


def _facts(machine, rdma=None):
    return build_facts(
        summary=read_fixture(machine, "nvidia-smi.txt"),
        topo=read_fixture(machine, "topo-m.txt"),
        p2p=read_fixture(machine, "topo-p2p-r.txt"),
        rdma_devices=rdma,
    )


def test_layers_later_wins_and_origin_is_kept():
    plan = plan_env(
        gpu=_facts("2x_rtx4090_threadripper_pro_wrx80", rdma=[]),
        defaults={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_DEBUG": "VERSION"},
        group={"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "^docker,lo"},
        host={"NCCL_DEBUG": "INFO"},
    )
    assert plan["errors"] == []
    assert plan["env"] == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_DISABLE": "1",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "^docker,lo",
    }
    assert plan["origin"]["NCCL_DEBUG"] == "host (nccl_env_host)"
    assert plan["origin"]["NCCL_SOCKET_IFNAME"] == "group (nccl_env_group)"
    assert plan["origin"]["NCCL_P2P_DISABLE"] == "topology (gpu_facts)"
    assert "GeForce" in plan["notes"]["NCCL_P2P_DISABLE"]


def test_user_overrides_topology():
    plan = plan_env(gpu=_facts("2x_rtx4090_threadripper_pro_wrx80"), host={"NCCL_P2P_DISABLE": 0})
    assert plan["env"]["NCCL_P2P_DISABLE"] == "0"
    assert plan["origin"]["NCCL_P2P_DISABLE"] == "host (nccl_env_host)"


def test_nvlink_keeps_p2p_and_rdma_keeps_ib():
    plan = plan_env(gpu=_facts("8x_a100_sxm_nvlink_17nic"))
    assert plan["env"]["NCCL_P2P_DISABLE"] == "0"
    assert plan["env"]["NCCL_IB_DISABLE"] == "0"  # NICs from topo -m's NIC legend (mlx5_*)
    assert "mlx5_2" in plan["notes"]["NCCL_IB_DISABLE"]
    # the HCAs by exact name, from the same facts; a layer above still wins
    hcas = plan["env"]["NCCL_IB_HCA"]
    assert hcas.startswith("=") and "mlx5_2" in hcas.split("=", 1)[1].split(",")
    narrowed = plan_env(gpu=_facts("8x_a100_sxm_nvlink_17nic"), host={"NCCL_IB_HCA": "=mlx5_0,mlx5_1"})
    assert narrowed["env"]["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"


def test_unknown_rdma_sets_nothing():
    plan = plan_env(gpu=_facts("2x_rtx5090_threadripper_pro"))
    assert "NCCL_IB_DISABLE" not in plan["env"]
    assert "NCCL_IB_HCA" not in plan["env"]


def test_without_topology():
    plan = plan_env(gpu=_facts("2x_rtx4090_threadripper_pro_wrx80", rdma=[]), use_topology=False)
    assert "NCCL_P2P_DISABLE" not in plan["env"]


@pytest.mark.parametrize(
    ("layer", "values", "words"),
    [
        (
            "host",
            {"NCCL_P2P_DISABLE": "maybe"},
            ["nccl_env_host", "NCCL_P2P_DISABLE", "'maybe'", "0 (peer-to-peer allowed) or 1"],
        ),
        ("group", {"NCCL_P2P_DISABLE": True}, ["nccl_env_group", "NCCL_P2P_DISABLE", "not true/false"]),
        ("group", {"NCCL_DEBUG": "LOUD"}, ["NCCL_DEBUG", "'LOUD'", "VERSION, WARN, INFO or TRACE"]),
        ("host", {"nccl_debug": "WARN"}, ["'nccl_debug'", "not an NCCL/CUDA variable name"]),
        ("host", {"NCCL_SOCKET_IFNAME": "eth0 eth1"}, ["NCCL_SOCKET_IFNAME", "spaces, quotes"]),
        ("host", {"NCCL_SOCKET_IFNAME": "$(reboot)"}, ["NCCL_SOCKET_IFNAME"]),
        ("group", {"CUDA_VISIBLE_DEVICES": "0,1"}, ["must not be set host-wide", "gpus"]),
        ("group", {"NCCL_DEBUG_SUBSYS": "INIT,BOGUS"}, ["NCCL_DEBUG_SUBSYS"]),
        ("host", {"NCCL_P2P_LEVEL": "NVLINK"}, ["NCCL_P2P_LEVEL", "LOC, NVL, PIX, PXB, PHB, SYS"]),
        ("host", {"NCCL_IB_HCA": ["mlx5_0"]}, ["NCCL_IB_HCA", "not a string or number"]),
    ],
)
def test_bad_values_are_named(layer, values, words):
    plan = plan_env(gpu={}, **{layer: values})
    assert len(plan["errors"]) == 1
    for word in words:
        assert word in plan["errors"][0]
    assert not set(values) & set(plan["env"])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("NCCL_SOCKET_IFNAME", "^docker,lo"),
        ("NCCL_SOCKET_IFNAME", "=eth0"),
        ("NCCL_IB_HCA", "mlx5_0:1,mlx5_1:1"),
        ("NCCL_DEBUG_SUBSYS", "^INIT,COLL"),
        ("NCCL_P2P_LEVEL", "NVL"),
        ("NCCL_P2P_LEVEL", 3),
        ("NCCL_BUFFSIZE", 8388608),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", 1),
    ],
)
def test_good_values(key, value):
    plan = plan_env(gpu={}, host={key: value})
    assert plan["errors"] == []
    assert plan["env"][key] == str(value)


def test_layer_must_be_a_mapping():
    plan = plan_env(gpu={}, group=["NCCL_DEBUG=WARN"])
    assert plan["errors"] == ["nccl_env_group must be a mapping of NCCL_*/CUDA_* names to values, got list."]


def test_filter_plugin_is_the_same_planner():
    nccl_env = FilterModule().filters()["nccl_env"]
    gpu = _facts("2x_rtx5090_threadripper_pro")
    assert nccl_env(gpu, defaults={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == plan_env(
        gpu=gpu, defaults={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    )
