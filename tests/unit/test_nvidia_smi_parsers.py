"""Parsers of nvidia-smi output, on REAL captures from public machines.

Each machine under tests/fixtures/nvidia_smi/ is a real capture (its files start with '#~ '
lines naming the source). The expected values below were read off those texts by hand.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES, read_fixture

from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts, decide_p2p
from ansible_collections.gpufleet.serving.plugins.module_utils._nvidia_smi import (
    parse_query_gpu_csv,
    parse_smi_summary,
    parse_sysfs_numa_node,
    parse_topo_matrix,
    parse_topo_p2p,
    strip_ansi,
    sysfs_pci_address,
)

MACHINES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def test_enough_distinct_machines():
    assert len(MACHINES) >= 6


@pytest.mark.parametrize("machine", MACHINES)
def test_every_fixture_names_its_source(machine):
    folder = FIXTURES / machine
    outputs = [p for p in folder.iterdir() if p.suffix in (".txt", ".csv")]
    assert outputs, "no captured output in %s" % machine
    assert (folder / "SOURCE.md").is_file()
    for path in outputs:
        head = path.read_text().splitlines()[:3]
        assert head and head[0].startswith("#~ source:"), "%s must start with '#~ source:'" % path


# machine -> (gpu count, {pair: link}, {gpu: cpu affinity}, {gpu: numa affinity}, nics)
TOPO = {
    "1x_rtx_pro6000_blackwell_ws": (1, {}, {0: "0-27"}, {0: 0}, []),
    "2x_gtx1080ti_desktop": (2, {"0,1": "PHB", "1,0": "PHB"}, {0: "0-11", 1: "0-11"}, {0: None, 1: None}, []),
    "2x_rtx3090_desktop_patched_p2p": (2, {"0,1": "PHB"}, {1: "0-31"}, {0: 0, 1: 0}, []),
    "2x_rtx4090_threadripper_pro_wrx80": (2, {"0,1": "SYS"}, {0: "0-127"}, {0: None}, []),
    "2x_rtx5090_threadripper_pro": (2, {"1,0": "PHB"}, {0: "0-63"}, {1: 0}, []),
    "4x_a10_pcie_2nic": (4, {"0,3": "SYS", "2,1": "SYS"}, {3: "0-127"}, {3: 0}, ["mlx5_0", "mlx5_1"]),
    "4x_mixed_2x_rtx4090_a6000_rtx5090_desktop": (4, {"0,3": "PHB"}, {2: "0-15"}, {2: 0}, []),
    "4x_rtx3090_nvlink_pairs": (
        4,
        {"0,1": "PHB", "0,2": "NV4", "0,3": "NODE", "1,3": "NV4", "2,3": "PHB", "3,1": "NV4"},
        {0: "0-23"},
        {3: 0},
        [],
    ),
    "5x_gpu_epyc_node_p2p_patched": (5, {"0,4": "NODE", "3,4": "PHB", "4,3": "PHB"}, {4: "0-63"}, {4: 0}, []),
    "8x_a100_sxm_nvlink_17nic": (
        8,
        {"0,7": "NV12", "5,6": "NV12"},
        {0: "0-103"},
        {0: 0},
        ["mlx5_%d" % n for n in range(2, 18)] + ["mlx5_bond_0"],
    ),
    "8x_h100_sxm_nv18_12nic_numa_off": (8, {"0,7": "NV18", "7,0": "NV18"}, {7: "0-191"}, {7: 0}, None),
    "dual_socket_8x_rtx4090": (
        8,
        {"0,4": "SYS", "6,7": "SYS"},
        {0: "0-55,112-167", 3: "0-55,112-167", 4: "56-111,168-223", 7: "56-111,168-223"},
        {0: 0, 3: 0, 4: 1, 7: 1},
        ["NIC0", "NIC1"],
    ),
}


@pytest.mark.parametrize("machine", sorted(TOPO))
def test_topo_matrix(machine):
    count, links, cpus, numa, nics = TOPO[machine]
    parsed = parse_topo_matrix(read_fixture(machine, "topo-m.txt"))
    assert parsed["gpus"] == list(range(count))
    # Every ordered pair of distinct GPUs has a link, and only those.
    assert len(parsed["links"]) == count * (count - 1)
    for pair, code in links.items():
        assert parsed["links"][pair] == code
    for gpu, value in cpus.items():
        assert parsed["cpu_affinity"][gpu] == value
    for gpu, value in numa.items():
        assert parsed["numa_affinity"][gpu] == value
    if nics is not None:
        assert parsed["nics"] == nics
    else:
        assert len(parsed["nics"]) == 12


# machine, file -> {pair: status}
P2P = {
    ("2x_rtx5090_threadripper_pro", "topo-p2p-r.txt"): {"0,1": "GNS", "1,0": "GNS"},
    ("2x_rtx3090_desktop_patched_p2p", "topo-p2p-r.txt"): {"0,1": "OK", "1,0": "OK"},
    ("2x_l4_p2p_cns_stas00", "topo-p2p-r.txt"): {"0,1": "CNS", "1,0": "CNS"},
    ("8x_h100_p2p_all_ok_stas00", "topo-p2p-r.txt"): {
        "%d,%d" % (a, b): "OK" for a in range(8) for b in range(8) if a != b
    },
    ("5x_gpu_epyc_node_p2p_patched", "topo-p2p-p.txt"): {
        "%d,%d" % (a, b): "OK" for a in range(5) for b in range(5) if a != b
    },
}


@pytest.mark.parametrize(("machine", "name"), sorted(P2P))
def test_topo_p2p(machine, name):
    assert parse_topo_p2p(read_fixture(machine, name)) == P2P[(machine, name)]


# machine -> (driver, cuda, count, first device, last device)
SUMMARY = {
    "1x_l4_thamada": ("550.90.07", "12.4", 1, ("NVIDIA L4", "00000000:01:00.0", 23034), None),
    "2x_rtx4090_threadripper_pro_wrx80": (
        "525.60.13",
        "12.0",
        2,
        ("NVIDIA GeForce ...", "00000000:41:00.0", 24564),
        ("NVIDIA GeForce ...", "00000000:61:00.0", 24564),
    ),
    "8x_h100_sxm_thamada": (
        "565.57.01",
        "12.7",
        8,
        ("NVIDIA H100 80GB HBM3", "00000000:18:00.0", 81559),
        ("NVIDIA H100 80GB HBM3", "00000000:DB:00.0", 81559),
    ),
    "8x_rtx4090_thamada": (
        "550.127.05",
        "12.4",
        8,
        ("NVIDIA GeForce RTX 4090", "00000000:01:00.0", 24564),
        ("NVIDIA GeForce RTX 4090", "00000000:E1:00.0", 24564),
    ),
    "10x_a40_thamada": (
        "550.127.05",
        "12.4",
        10,
        ("NVIDIA A40", "00000000:4F:00.0", 46068),
        ("NVIDIA A40", "00000000:D6:00.0", 46068),
    ),
}


@pytest.mark.parametrize("machine", sorted(SUMMARY))
def test_smi_summary(machine):
    driver, cuda, count, first, last = SUMMARY[machine]
    parsed = parse_smi_summary(read_fixture(machine, "nvidia-smi.txt"))
    assert (parsed["driver_version"], parsed["cuda_version"]) == (driver, cuda)
    assert [d["index"] for d in parsed["devices"]] == list(range(count))
    d0, dn = parsed["devices"][0], parsed["devices"][-1]
    assert (d0["name"], d0["pci_bus_id"], d0["memory_total_mib"]) == first
    if last:
        assert (dn["name"], dn["pci_bus_id"], dn["memory_total_mib"]) == last


def test_query_csv_with_units_by_header():
    rows = parse_query_gpu_csv(read_fixture("4x_a10_pcie_2nic", "query-gpu.csv"))
    assert len(rows) >= 4
    assert rows[0]["memory.total"] == "23028"
    assert rows[0]["utilization.gpu"] == "0"
    assert rows[0]["pstate"] == "P8"


def test_query_csv_noheader_needs_fields():
    text = "0, NVIDIA GeForce RTX 4090, GPU-1, 24564, 00000000:01:00.0, 550.54.14\n"
    fields = ("index", "name", "uuid", "memory.total", "pci.bus_id", "driver_version")
    assert parse_query_gpu_csv(text) == []
    rows = parse_query_gpu_csv(text, fields=fields)
    assert rows == [
        {
            "index": "0",
            "name": "NVIDIA GeForce RTX 4090",
            "uuid": "GPU-1",
            "memory.total": "24564",
            "pci.bus_id": "00000000:01:00.0",
            "driver_version": "550.54.14",
        }
    ]


def test_query_csv_unknown_values_are_none():
    text = "index, name, memory.total [MiB]\n0, NVIDIA A100-SXM4-80GB, [N/A]\n"
    assert parse_query_gpu_csv(text) == [{"index": "0", "name": "NVIDIA A100-SXM4-80GB", "memory.total": None}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", {"gpus": [], "links": {}}), ("garbage\nmore garbage\n", {"gpus": [], "links": {}})],
)
def test_topo_degrades_to_empty(text, expected):
    parsed = parse_topo_matrix(text)
    assert {k: parsed[k] for k in expected} == expected


def test_ansi_escapes_are_ignored():
    raw = read_fixture("2x_rtx5090_threadripper_pro", "topo-m.txt")
    underlined = raw.replace("GPU0\tGPU1", "\x1b[4mGPU0\tGPU1", 1).replace("GPU NUMA ID", "GPU NUMA ID\x1b[0m", 1)
    assert strip_ansi(underlined) == raw
    assert parse_topo_matrix(underlined) == parse_topo_matrix(raw)


@pytest.mark.parametrize(
    ("bus_id", "address"),
    [
        ("00000000:01:00.0", "0000:01:00.0"),
        ("00000000:DB:00.0", "0000:db:00.0"),
        ("00000001:4F:00.0", "0001:4f:00.0"),
        ("0000:c1:00.0", "0000:c1:00.0"),
        ("N/A", None),
        (None, None),
    ],
)
def test_sysfs_pci_address(bus_id, address):
    assert sysfs_pci_address(bus_id) == address


@pytest.mark.parametrize(("text", "node"), [("0\n", 0), ("1\n", 1), ("-1\n", None), ("", None), (None, None)])
def test_sysfs_numa_node(text, node):
    assert parse_sysfs_numa_node(text) == node


# ---------------------------------------------------------------- the P2P decision on real machines

# machine -> (recommended, source, words the reason must contain)
DECISIONS = {
    "2x_rtx4090_threadripper_pro_wrx80": (False, "topology", ["GeForce", "SYS", "GPU0", "GPU1"]),
    "2x_rtx5090_threadripper_pro": (False, "driver", ["GNS", "GPU not supported", "PHB"]),
    "2x_rtx3090_desktop_patched_p2p": (True, "driver", ["OK", "PHB"]),
    "8x_h100_sxm_nv18_12nic_numa_off": (True, "topology", ["NVLink", "NV18"]),
    "8x_a100_sxm_nvlink_17nic": (True, "topology", ["NV12"]),
    "1x_rtx_pro6000_blackwell_ws": (True, "count", ["one GPU"]),
    "1x_l4_thamada": (True, "count", ["one GPU"]),
    "dual_socket_8x_rtx4090": (True, "topology", ["unknown", "SYS"]),
    "8x_rtx4090_thamada": (True, "none", ["no GPU topology"]),
}


@pytest.mark.parametrize("machine", sorted(DECISIONS))
def test_p2p_decision_on_real_captures(machine):
    recommended, source, words = DECISIONS[machine]
    facts = build_facts(
        query_csv=read_fixture(machine, "query-gpu.csv"),
        summary=read_fixture(machine, "nvidia-smi.txt"),
        topo=read_fixture(machine, "topo-m.txt"),
        p2p=read_fixture(machine, "topo-p2p-r.txt"),
    )
    assert facts["p2p"]["recommended"] is recommended, facts["p2p"]["reason"]
    assert facts["p2p"]["source"] == source
    for word in words:
        assert word in facts["p2p"]["reason"]


def _devices(names):
    return [{"index": i, "name": n} for i, n in enumerate(names)]


def test_driver_answer_beats_topology():
    # Real matrices of two machines, combined: GeForce cards joined by NVLink, but the
    # driver refuses P2P (as on stock drivers for 4090s): the driver wins.
    links = parse_topo_matrix(read_fixture("4x_rtx3090_nvlink_pairs", "topo-m.txt"))["links"]
    status = {"%d,%d" % (a, b): "GNS" for a in range(4) for b in range(4) if a != b}
    decision = decide_p2p(_devices(["NVIDIA GeForce RTX 3090"] * 4), links, status)
    assert decision["recommended"] is False
    assert decision["source"] == "driver"
    assert "6 of 6 GPU pairs" in decision["reason"]


def test_consumer_cards_with_nvlink_pairs_and_host_pairs():
    links = parse_topo_matrix(read_fixture("4x_rtx3090_nvlink_pairs", "topo-m.txt"))["links"]
    consumer = decide_p2p(_devices(["NVIDIA GeForce RTX 3090"] * 4), links, None)
    assert consumer["recommended"] is False
    assert "PHB" in consumer["reason"] and "NODE" in consumer["reason"]
    datacenter = decide_p2p(_devices(["NVIDIA RTX A6000"] * 4), links, None)
    assert datacenter["recommended"] is True
    assert "none of them is a consumer" in datacenter["reason"]


def test_partial_driver_answer_falls_back_to_topology():
    links = {"0,1": "NV4", "1,0": "NV4", "0,2": "NV4", "2,0": "NV4", "1,2": "NV4", "2,1": "NV4"}
    decision = decide_p2p(_devices(["NVIDIA GeForce RTX 3090"] * 3), links, {"0,1": "OK", "1,0": "OK"})
    assert decision["source"] == "topology"
    assert decision["recommended"] is True


def test_no_gpu():
    facts = build_facts(problem="nvidia-smi not found (not on PATH)")
    assert facts["count"] == 0
    assert facts["devices"] == []
    assert facts["p2p"]["recommended"] is True
    assert facts["problem"] == "nvidia-smi not found (not on PATH)"


def test_sysfs_numa_beats_topo_and_query_beats_table():
    facts = build_facts(
        query_csv=(
            "index, name, uuid, memory.total [MiB], pci.bus_id, driver_version\n"
            "0, NVIDIA GeForce RTX 4090, GPU-aaaa, 24564 MiB, 00000000:41:00.0, 525.60.13\n"
            "1, NVIDIA GeForce RTX 4090, GPU-bbbb, 24564 MiB, 00000000:61:00.0, 525.60.13\n"
        ),
        summary=read_fixture("2x_rtx4090_threadripper_pro_wrx80", "nvidia-smi.txt"),
        topo=read_fixture("2x_rtx4090_threadripper_pro_wrx80", "topo-m.txt"),
        sysfs={"0000:41:00.0": {"numa_node": 0, "cpus": "0-63"}, "0000:61:00.0": {"numa_node": None, "cpus": None}},
    )
    d0, d1 = facts["devices"]
    assert d0["name"] == "NVIDIA GeForce RTX 4090"  # full name from the CSV, not the cut one from the table
    assert (d0["numa_node"], d0["numa_source"], d0["cpus"]) == (0, "sysfs", "0-63")
    assert (d1["numa_node"], d1["numa_source"], d1["cpus"]) == (None, None, "0-127")  # topo fallback
    assert facts["driver_version"] == "525.60.13"
    assert facts["cuda_version"] == "12.0"
