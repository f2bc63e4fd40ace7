"""tools/gpu-check.py (`make gpu-check`) without a GPU: its parsing, its health checks, its capture.

The script is meant for a real GPU machine; here it runs on the REAL captures of
tests/fixtures/nvidia_smi/ (replayed by the lab's nvidia-smi hardware stand-in where a command is
run) and, for `nvidia-smi -q -x` and NVML, on SYNTHETIC data labelled as such below: no fixture
holds a real `-q -x` capture or NVML reading yet (make gpu-check on a GPU machine adds one).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES, ROOT, read_fixture

from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts
from ansible_collections.gpufleet.serving.plugins.module_utils._nvidia_smi import parse_smi_summary

SCRIPT = ROOT / "tools" / "gpu-check.py"
STANDIN = ROOT / "tests" / "lab" / "nvidia-smi-standin"
MACHINES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


gc = _load()


# ---------------------------------------------------------------- SYNTHETIC nvidia-smi -q -x
# SYNTHETIC, not a capture: element names, nesting and value formats follow `nvidia-smi -q -x`
# of R535+ drivers (nvsmi_device_v12.dtd: clocks_event_reasons, gpu_power_readings,
# sram_uncorrectable_parity/_secded, remapped_rows, gpu_reset_status); the values are made up.
# Fault cases are this text with one value changed.

SYNTHETIC_GPU = """
    <gpu id="{bus}">
        <product_name>{name}</product_name>
        <uuid>GPU-00000000-0000-0000-0000-00000000000{index}</uuid>
        <gpu_reset_status>
            <reset_required>No</reset_required>
            <drain_and_reset_recommended>No</drain_and_reset_recommended>
        </gpu_reset_status>
        <pci>
            <pci_bus_id>{bus}</pci_bus_id>
        </pci>
        <clocks_event_reasons>
            <clocks_event_reason_gpu_idle>Active</clocks_event_reason_gpu_idle>
            <clocks_event_reason_applications_clocks_setting>Not Active
            </clocks_event_reason_applications_clocks_setting>
            <clocks_event_reason_sw_power_cap>Not Active</clocks_event_reason_sw_power_cap>
            <clocks_event_reason_hw_slowdown>Not Active</clocks_event_reason_hw_slowdown>
            <clocks_event_reason_hw_thermal_slowdown>Not Active</clocks_event_reason_hw_thermal_slowdown>
            <clocks_event_reason_hw_power_brake_slowdown>Not Active</clocks_event_reason_hw_power_brake_slowdown>
            <clocks_event_reason_sync_boost>Not Active</clocks_event_reason_sync_boost>
            <clocks_event_reason_sw_thermal_slowdown>Not Active</clocks_event_reason_sw_thermal_slowdown>
            <clocks_event_reason_display_clocks_setting>Not Active</clocks_event_reason_display_clocks_setting>
        </clocks_event_reasons>
        <fb_memory_usage>
            <total>{memory} MiB</total>
            <reserved>551 MiB</reserved>
            <used>1 MiB</used>
            <free>{free} MiB</free>
        </fb_memory_usage>
        <ecc_mode>
            <current_ecc>Enabled</current_ecc>
            <pending_ecc>Enabled</pending_ecc>
        </ecc_mode>
        <ecc_errors>
            <volatile>
                <sram_correctable>0</sram_correctable>
                <sram_uncorrectable_parity>0</sram_uncorrectable_parity>
                <sram_uncorrectable_secded>0</sram_uncorrectable_secded>
                <dram_correctable>0</dram_correctable>
                <dram_uncorrectable>0</dram_uncorrectable>
            </volatile>
            <aggregate>
                <sram_correctable>0</sram_correctable>
                <sram_uncorrectable_parity>0</sram_uncorrectable_parity>
                <sram_uncorrectable_secded>0</sram_uncorrectable_secded>
                <dram_correctable>0</dram_correctable>
                <dram_uncorrectable>0</dram_uncorrectable>
                <sram_threshold_exceeded>No</sram_threshold_exceeded>
            </aggregate>
        </ecc_errors>
        <retired_pages>
            <multiple_single_bit_retirement>
                <retired_count>N/A</retired_count>
                <retired_pagelist>N/A</retired_pagelist>
            </multiple_single_bit_retirement>
            <double_bit_retirement>
                <retired_count>N/A</retired_count>
                <retired_pagelist>N/A</retired_pagelist>
            </double_bit_retirement>
            <pending_blacklist>N/A</pending_blacklist>
            <pending_retirement>N/A</pending_retirement>
        </retired_pages>
        <remapped_rows>
            <remapped_row_corr>0</remapped_row_corr>
            <remapped_row_unc>0</remapped_row_unc>
            <remapped_row_pending>No</remapped_row_pending>
            <remapped_row_failure>No</remapped_row_failure>
        </remapped_rows>
        <temperature>
            <gpu_temp>30 C</gpu_temp>
        </temperature>
        <gpu_power_readings>
            <power_draw>100.25 W</power_draw>
        </gpu_power_readings>
    </gpu>"""


def synthetic_xml(devices, driver="565.57.01"):
    """SYNTHETIC `nvidia-smi -q -x` for these devices (index, name, pci_bus_id, memory_total_mib)."""
    gpus = "".join(
        SYNTHETIC_GPU.format(
            bus=d["pci_bus_id"],
            name=d["name"],
            index=d["index"],
            memory=d["memory_total_mib"],
            free=d["memory_total_mib"] - 552,
        )
        for d in devices
    )
    return (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n<nvidia_smi_log>\n'
        "    <driver_version>%s</driver_version>\n    <cuda_version>12.7</cuda_version>\n"
        "    <attached_gpus>%d</attached_gpus>%s\n</nvidia_smi_log>\n" % (driver, len(devices), gpus)
    )


def synthetic_nvml(devices, driver="565.57.01"):
    """SYNTHETIC nvml.json, shaped as nvml_readings() writes it, agreeing with the devices given."""
    return {
        "library": "libnvidia-ml.so.1",
        "driver_version": driver,
        "device_count": len(devices),
        "devices": [
            {
                "index": d["index"],
                "name": d["name"],
                "pci_bus_id": d["pci_bus_id"],
                "memory_total_mib": d["memory_total_mib"],
                "errors": {},
            }
            for d in devices
        ],
    }


H100 = parse_smi_summary(read_fixture("8x_h100_sxm_thamada", "nvidia-smi.txt"))["devices"]  # REAL capture
HEALTHY = synthetic_xml(H100)


def change_gpu(xml, index, old, new):
    """The synthetic XML with one value of GPU `index` changed (a fault injected)."""
    head, *gpus = xml.split("    <gpu id=")
    assert old in gpus[index], old
    gpus[index] = gpus[index].replace(old, new, 1)
    return "    <gpu id=".join([head, *gpus])


def levels(checks, subject_part=""):
    return [c.level for c in checks if subject_part in c.subject]


# ---------------------------------------------------------------- gpu_facts' parsers on the REAL fixtures


@pytest.mark.parametrize("machine", MACHINES)
def test_gpu_facts_view_is_what_the_module_builds(machine):
    """The script answers with gpu_facts' own code: the same facts build_facts gives the module."""
    texts = gc.read_folder(FIXTURES / machine)
    facts = gc.gpu_facts_view(texts)
    expected = build_facts(
        query_csv=texts["query-gpu.csv"],
        summary=texts["nvidia-smi.txt"],
        topo=texts["topo-m.txt"],
        p2p=texts["topo-p2p-r.txt"],
    )
    assert {k: facts[k] for k in expected if k != "problem"} == {k: v for k, v in expected.items() if k != "problem"}
    # Like the module: a problem only when query, table and topology all failed (a p2p-only capture).
    only_p2p = not any(texts[name] for name in ("query-gpu.csv", "nvidia-smi.txt", "topo-m.txt"))
    assert bool(facts["problem"]) == only_p2p
    assert (facts["count"] == 0) == only_p2p
    lines = gc.facts_lines(facts)
    assert "%d GPU(s)" % facts["count"] in lines[0]
    assert any(line.startswith("NCCL P2P: ") for line in lines)


def test_facts_lines_of_a_consumer_pair_say_disable_p2p():
    facts = gc.gpu_facts_view(gc.read_folder(FIXTURES / "2x_rtx4090_threadripper_pro_wrx80"))
    text = "\n".join(gc.facts_lines(facts))
    assert "driver 525.60.13, CUDA 12.0, 2 GPU(s)" in text
    assert "links: 0-1 SYS" in text
    assert "NCCL P2P: DISABLE (source: topology)" in text
    assert "NCCL_P2P_DISABLE=1" in text


def test_counts_from_the_real_list_gpus_capture():
    machine = "2x_rtx4090_threadripper_pro_wrx80"  # L.txt: `nvidia-smi -L`, 2 GPUs
    texts = gc.read_folder(FIXTURES / machine)
    counts = gc.smi_gpu_counts(texts, None, gc.gpu_facts_view(texts))
    assert counts == {"-L": 2, "-q -x": None, "gpu_facts": 2}
    nvml = {"device_count": 2, "devices": []}
    assert levels(gc.count_checks(nvml, counts)) == ["PASS"]
    one_lost = {"device_count": 1, "devices": []}
    [check] = gc.count_checks(one_lost, counts)
    assert check.level == "FAIL"
    assert "NVML sees 1 GPU(s) but nvidia-smi 2 (-L), 2 (gpu_facts)" in check.message


def test_sysfs_gpus_bound_to_nvidia_beyond_nvml_count_are_named():
    sysfs = [{"address": "0000:41:00.0", "driver": "nvidia"}, {"address": "0000:61:00.0", "driver": "nvidia"}]
    sysfs.append({"address": "0000:81:00.0", "driver": "vfio-pci"})
    checks = gc.count_checks({"device_count": 1, "devices": []}, {"-L": 1}, sysfs)
    assert [c.level for c in checks] == ["PASS", "WARN", "WARN"]
    assert "2 NVIDIA GPU(s) bound to the nvidia driver in sysfs, NVML sees 1" in checks[1].message
    assert "0000:81:00.0 (vfio-pci)" in checks[2].message


# ---------------------------------------------------------------- -q -x parsing and health


def test_parse_synthetic_xml_on_real_device_list():
    parsed = gc.parse_smi_xml(HEALTHY)
    assert parsed["problem"] is None
    assert (parsed["driver_version"], parsed["attached_gpus"], len(parsed["gpus"])) == ("565.57.01", 8, 8)
    gpu = parsed["gpus"][3]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["pci_bus_id"] == H100[3]["pci_bus_id"] == "00000000:5D:00.0"
    assert (gpu["memory_total_mib"], gpu["temperature_c"], gpu["power_w"]) == (81559, 30, 100.25)
    assert (gpu["ecc_mode"], gpu["ecc_volatile_uncorrectable"], gpu["ecc_aggregate_uncorrectable"]) == ("Enabled", 0, 0)
    assert (gpu["retired_pages_sbe"], gpu["retired_pages_pending"]) == (None, None)  # N/A on Hopper
    assert (gpu["remapped_rows_failure"], gpu["remapped_rows_pending"]) == (False, False)
    assert gpu["clock_event_reasons_active"] == ["gpu_idle"]


def test_healthy_synthetic_xml_passes_every_check():
    for gpu in gc.parse_smi_xml(HEALTHY)["gpus"]:
        checks = gc.gpu_health(gpu)
        assert [c.level for c in checks] == ["PASS"] * 4, [c.line() for c in checks]  # reset, ECC, rows, clocks


FAULTS = [
    # (what, old text, new text, expected level of the check whose subject holds `part`, part, words)
    (
        "volatile DRAM uncorrectable",
        "<dram_uncorrectable>0</dram_uncorrectable>",
        "<dram_uncorrectable>3</dram_uncorrectable>",
        "FAIL",
        "ECC",
        "3 uncorrectable ECC error(s) since the driver loaded",
    ),
    (
        "volatile SRAM parity",
        "<sram_uncorrectable_parity>0</sram_uncorrectable_parity>",
        "<sram_uncorrectable_parity>1</sram_uncorrectable_parity>",
        "FAIL",
        "ECC",
        "1 uncorrectable",
    ),
    (
        "SRAM threshold exceeded",
        "<sram_threshold_exceeded>No</sram_threshold_exceeded>",
        "<sram_threshold_exceeded>Yes</sram_threshold_exceeded>",
        "FAIL",
        "ECC",
        "threshold",
    ),
    (
        "row remapping failure",
        "<remapped_row_failure>No</remapped_row_failure>",
        "<remapped_row_failure>Yes</remapped_row_failure>",
        "FAIL",
        "row remapping",
        "FAILED",
    ),
    (
        "row remapping pending",
        "<remapped_row_pending>No</remapped_row_pending>",
        "<remapped_row_pending>Yes</remapped_row_pending>",
        "WARN",
        "row remapping",
        "reset the GPU",
    ),
    (
        "hardware thermal slowdown",
        "<clocks_event_reason_hw_thermal_slowdown>Not Active",
        "<clocks_event_reason_hw_thermal_slowdown>Active",
        "FAIL",
        "clocks",
        "hardware thermal slowdown",
    ),
    (
        "power brake",
        "<clocks_event_reason_hw_power_brake_slowdown>Not Active",
        "<clocks_event_reason_hw_power_brake_slowdown>Active",
        "FAIL",
        "clocks",
        "power brake",
    ),
    (
        "software power cap",
        "<clocks_event_reason_sw_power_cap>Not Active",
        "<clocks_event_reason_sw_power_cap>Active",
        "WARN",
        "clocks",
        "power cap",
    ),
    (
        "reset required",
        "<reset_required>No</reset_required>",
        "<reset_required>Yes</reset_required>",
        "FAIL",
        "reset",
        "reset",
    ),
]


@pytest.mark.parametrize(("what", "old", "new", "level", "part", "words"), FAULTS, ids=[f[0] for f in FAULTS])
def test_one_fault_on_one_gpu_is_found_there(what, old, new, level, part, words):
    parsed = gc.parse_smi_xml(change_gpu(HEALTHY, 5, old, new))
    for gpu in parsed["gpus"]:
        checks = [c for c in gc.gpu_health(gpu) if c.subject.endswith(" " + part)]
        assert len(checks) == 1
        if gpu["index"] == 5:
            assert checks[0].level == level, checks[0].line()
            assert words in checks[0].message
            assert checks[0].subject == "GPU5 (NVIDIA H100 80GB HBM3) %s" % part
        else:
            assert checks[0].level == "PASS", checks[0].line()


def test_lifetime_only_errors_and_ecc_off_warn():
    threshold = "<sram_threshold_exceeded>No</sram_threshold_exceeded>"  # only in the aggregate block
    lifetime = change_gpu(HEALTHY, 0, threshold, "<dram_uncorrectable>2</dram_uncorrectable>" + threshold)
    gpu = gc.parse_smi_xml(lifetime)["gpus"][0]
    assert (gpu["ecc_volatile_uncorrectable"], gpu["ecc_aggregate_uncorrectable"]) == (0, 2)
    [ecc] = [c for c in gc.gpu_health(gpu) if c.subject.endswith("ECC")]
    assert (ecc.level, ecc.message) == (
        "WARN",
        "none since the driver loaded, 2 uncorrectable in the GPU's lifetime (aggregate)",
    )
    off = change_gpu(HEALTHY, 0, "<current_ecc>Enabled</current_ecc>", "<current_ecc>Disabled</current_ecc>")
    [ecc] = [c for c in gc.gpu_health(gc.parse_smi_xml(off)["gpus"][0]) if c.subject.endswith("ECC")]
    assert ecc.level == "WARN"
    assert "ECC is off" in ecc.message


def test_pre_ampere_layout_double_bit_and_retired_pages():
    """SYNTHETIC, in the layout drivers print for GPUs before Ampere (single_bit/double_bit blocks,
    clocks_throttle_reasons, power_readings, page retirement instead of row remapping)."""
    xml = """<?xml version="1.0" ?>
<nvidia_smi_log><driver_version>470.199.02</driver_version><attached_gpus>1</attached_gpus>
<gpu id="00000000:3B:00.0"><product_name>Tesla V100-SXM2-32GB</product_name>
<fb_memory_usage><total>32510 MiB</total><used>0 MiB</used></fb_memory_usage>
<clocks_throttle_reasons><clocks_throttle_reason_gpu_idle>Active</clocks_throttle_reason_gpu_idle>
<clocks_throttle_reason_sw_thermal_slowdown>Not Active</clocks_throttle_reason_sw_thermal_slowdown>
</clocks_throttle_reasons>
<ecc_mode><current_ecc>Enabled</current_ecc><pending_ecc>Enabled</pending_ecc></ecc_mode>
<ecc_errors><volatile>
<single_bit><device_memory>4</device_memory><register_file>0</register_file><total>4</total></single_bit>
<double_bit><device_memory>DBE</device_memory><register_file>0</register_file><total>DBE</total></double_bit>
</volatile><aggregate><double_bit><device_memory>1</device_memory><total>1</total></double_bit></aggregate></ecc_errors>
<retired_pages><multiple_single_bit_retirement><retired_count>2</retired_count></multiple_single_bit_retirement>
<double_bit_retirement><retired_count>1</retired_count></double_bit_retirement>
<pending_retirement>PENDING</pending_retirement></retired_pages>
<temperature><gpu_temp>35 C</gpu_temp></temperature>
<power_readings><power_draw>43.10 W</power_draw></power_readings></gpu></nvidia_smi_log>
"""
    healthy = xml.replace("DBE", "0").replace("PENDING", "No")
    gpu = gc.parse_smi_xml(healthy)["gpus"][0]
    assert (gpu["ecc_volatile_uncorrectable"], gpu["ecc_aggregate_uncorrectable"]) == (0, 1)
    assert (gpu["retired_pages_sbe"], gpu["retired_pages_dbe"], gpu["retired_pages_pending"]) == (2, 1, False)
    assert (gpu["power_w"], gpu["clock_event_reasons_active"]) == (43.1, ["gpu_idle"])
    assert [c.level for c in gc.gpu_health(gpu)] == ["WARN", "WARN", "PASS"]  # lifetime DBE, 3 retired pages
    broken = gc.parse_smi_xml(xml.replace("DBE", "2").replace("PENDING", "Yes"))["gpus"][0]
    checks = gc.gpu_health(broken)
    assert [c.level for c in checks] == ["FAIL", "WARN", "PASS"]
    assert "2 uncorrectable" in checks[0].message
    assert "pending" in checks[1].message
    full = gc.parse_smi_xml(healthy.replace("<retired_count>2<", "<retired_count>63<"))["gpus"][0]
    assert [c.level for c in gc.gpu_health(full)][1] == "FAIL"  # 64 retired pages: the table is full


def test_unreadable_xml_is_a_problem_not_a_crash():
    parsed = gc.parse_smi_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert parsed["gpus"] == []
    assert "no readable XML" in parsed["problem"]


# ---------------------------------------------------------------- the whole check on a folder (--from)


def _folder(tmp_path, xml, nvml):
    """A capture folder: the REAL 8x H100 table, with SYNTHETIC -q -x and NVML readings beside it."""
    folder = tmp_path / "8x_h100_synthetic_health"
    folder.mkdir()
    (folder / "nvidia-smi.txt").write_text((FIXTURES / "8x_h100_sxm_thamada" / "nvidia-smi.txt").read_text())
    (folder / "q-x.xml").write_text("#~ source: SYNTHETIC (tests/unit/test_gpu_check.py)\n" + xml)
    (folder / "nvml.json").write_text("#~ source: SYNTHETIC (tests/unit/test_gpu_check.py)\n" + json.dumps(nvml))
    return folder


def test_from_folder_healthy_exits_0(tmp_path, capsys):
    folder = _folder(tmp_path, HEALTHY, synthetic_nvml(H100))
    assert gc.main(["--from", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "PASS  GPU count: NVML 8 = nvidia-smi 8 (-q -x), 8 (gpu_facts)" in out
    assert "PASS  driver: 565.57.01 (NVML and nvidia-smi agree)" in out
    assert "PASS  parse GPU7: name, bus id and memory agree with NVML" in out
    assert "8 GPU(s): NVIDIA H100 80GB HBM3; driver 565.57.01; healthy (0 FAIL, 0 WARN)" in out
    assert "FAIL  " not in out


def test_from_folder_with_uncorrectable_ecc_exits_2(tmp_path, capsys):
    xml = change_gpu(
        HEALTHY, 3, "<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>"
    )
    assert gc.main(["--from", str(_folder(tmp_path, xml, synthetic_nvml(H100)))]) == 2
    out = capsys.readouterr().out
    assert "FAIL  GPU3 (NVIDIA H100 80GB HBM3) ECC: 2 uncorrectable ECC error(s)" in out
    assert "UNHEALTHY (1 FAIL, 0 WARN)" in out


def test_from_folder_gpu_missing_from_nvidia_smi_exits_2(tmp_path, capsys):
    nvml = synthetic_nvml([*H100, dict(H100[0], index=8, pci_bus_id="00000000:DB:00.0")])
    assert gc.main(["--from", str(_folder(tmp_path, HEALTHY, nvml))]) == 2
    assert "FAIL  GPU count: NVML sees 9 GPU(s) but nvidia-smi 8 (-q -x), 8 (gpu_facts)" in capsys.readouterr().out


def test_nvml_health_when_there_is_no_xml():
    nvml = synthetic_nvml(H100[:2])
    nvml["devices"][0].update(ecc_mode="Enabled", ecc_volatile_uncorrectable=0, clock_event_reasons_active=["gpu_idle"])
    nvml["devices"][1].update(ecc_mode=None, ecc_volatile_uncorrectable=None, lost=True)
    texts = {
        "nvidia-smi.txt": None,
        "L.txt": "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n",
    }
    result = gc.analyse(texts, nvml)
    assert result.source == "NVML"
    lines = [c.line() for c in result.health]
    lost = "FAIL  GPU1 (NVIDIA H100 80GB HBM3): NVML reports the GPU lost (fallen off the bus): drain the host"
    assert any(line.startswith(lost) for line in lines)
    assert "PASS  GPU0 (NVIDIA H100 80GB HBM3) ECC: enabled, 0 uncorrectable errors" in lines


# ---------------------------------------------------------------- capture (through the lab's stand-in)


def test_capture_through_the_standin_writes_replayable_fixtures(tmp_path, monkeypatch):
    machine = "2x_rtx4090_threadripper_pro_wrx80"  # REAL: nvidia-smi.txt, topo-m.txt, L.txt
    monkeypatch.setenv("GPUFLEET_NVIDIA_SMI_FIXTURE", str(FIXTURES / machine))
    topology, _nccl, _smi, _sysfs = gc.gpufleet_modules()
    captured = gc.capture_smi(str(STANDIN), gc.Budget(), topology.QUERY_GPU_FIELDS)
    got = {c.name: c.problem is None for c in captured}
    assert got == {
        "query-gpu.csv": False,
        "nvidia-smi.txt": True,
        "topo-m.txt": True,
        "topo-p2p-r.txt": False,
        "topo-p2p-p.txt": False,
        "L.txt": True,
        "q-x.xml": False,
    }
    folder = tmp_path / gc.fixture_name(["NVIDIA GeForce RTX 4090"] * 2, [24564, 24564])
    nvml = synthetic_nvml(parse_smi_summary(read_fixture(machine, "nvidia-smi.txt"))["devices"], "525.60.13")
    written = gc.write_capture(folder, captured, nvml, "2x NVIDIA GeForce RTX 4090, driver 525.60.13", "now")
    assert sorted(written) == ["L.txt", "nvidia-smi.txt", "nvml.json", "topo-m.txt"]
    for name in written:  # the provenance header every fixture has (test_nvidia_smi_parsers checks it)
        assert (folder / name).read_text().startswith("#~ source: real output captured by tools/gpu-check.py")
    again = gc.read_folder(folder)
    original = gc.read_folder(FIXTURES / machine)
    for name in ("nvidia-smi.txt", "topo-m.txt", "L.txt"):
        assert again[name] == original[name]
    assert json.loads(again["nvml.json"]) == nvml
    assert gc.gpu_facts_view(again) == gc.gpu_facts_view(original)
    result = gc.analyse(again, nvml, captured)
    failed = {c.subject: c.level for c in result.health if c.level != "PASS"}
    assert failed["`nvidia-smi -q -x`"] == "FAIL"  # the stand-in has no -q -x: an essential call failed
    assert failed["`nvidia-smi topo -p2p r`"] == "WARN"
    gc.write_source(folder, "2x NVIDIA GeForce RTX 4090", "now", captured, result.facts, result.health)
    source = (folder / "SOURCE.md").read_text()
    assert source.startswith("# 2x NVIDIA GeForce RTX 4090 (captured with make gpu-check)")
    assert "`nvidia-smi -q -x` failed: exit status 2" in source


@pytest.mark.parametrize(
    ("names", "memory", "expected"),
    [
        (["NVIDIA H200"], [143771], "1x_h200_140gb"),
        (["NVIDIA H100 80GB HBM3"] * 8, [81559] * 8, "8x_h100_80gb_hbm3"),
        (["NVIDIA GeForce RTX 4090"] * 2, [24564] * 2, "2x_rtx_4090_24gb"),
        (["NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000"], [24564, 49140], "2x_mixed_rtx_4090_rtx_a6000"),
        ([None], [None], "1x_gpu"),
    ],
)
def test_fixture_names(names, memory, expected):
    assert gc.fixture_name(names, memory) == expected


def test_new_folder_never_reuses_one(tmp_path):
    (tmp_path / "1x_h200_140gb").mkdir()
    assert gc.new_folder(tmp_path, "1x_h200_140gb").name == "1x_h200_140gb_2"


def test_a_hung_command_is_stopped():
    rc, _out, err = gc.run_command([sys.executable, "-c", "import time; time.sleep(30)"], 1)
    assert rc is None
    assert "no answer within 1 s" in err


# ---------------------------------------------------------------- NVML through ctypes (a FAKE library)


class FakeNvml:
    """HARDWARE STAND-IN for libnvidia-ml.so.1 (no GPU here): answers the ctypes calls that
    nvml_readings() makes, writing through the pointers it passes, like one A100 on driver 550
    would; page retirement is NOT_SUPPORTED as on Ampere, and nvmlDeviceGetCurrentClocksEventReasons
    is absent as on drivers before R535."""

    def __init__(self):
        self.nvmlErrorString = lambda rc: {3: b"Not Supported"}.get(rc, b"Unknown Error")
        self.shutdown = 0

    def __getattr__(self, name):
        raise AttributeError(name)  # a function this NVML lacks

    def nvmlInit_v2(self):
        return 0

    def nvmlShutdown(self):
        self.shutdown += 1
        return 0

    def nvmlSystemGetDriverVersion(self, buf, size):
        buf.value = b"550.90.07"
        return 0

    def nvmlSystemGetNVMLVersion(self, buf, size):
        buf.value = b"12.550.90.07"
        return 0

    def nvmlSystemGetCudaDriverVersion_v2(self, ref):
        ref._obj.value = 12040
        return 0

    def nvmlDeviceGetCount_v2(self, ref):
        ref._obj.value = 1
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, ref):
        ref._obj.value = 0x1000 + index
        return 0

    def nvmlDeviceGetName(self, handle, buf, size):
        buf.value = b"NVIDIA A100-SXM4-80GB"
        return 0

    def nvmlDeviceGetUUID(self, handle, buf, size):
        buf.value = b"GPU-fake"
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle, ref):
        ref._obj.total, ref._obj.used = 81920 * 2**20, 4 * 2**20
        return 0

    def nvmlDeviceGetTemperature(self, handle, sensor, ref):
        ref._obj.value = 33
        return 0

    def nvmlDeviceGetPowerUsage(self, handle, ref):
        ref._obj.value = 61234
        return 0

    def nvmlDeviceGetEnforcedPowerLimit(self, handle, ref):
        ref._obj.value = 400000
        return 0

    def nvmlDeviceGetPciInfo_v3(self, handle, ref):
        ref._obj.busId = b"00000000:07:00.0"
        return 0

    def nvmlDeviceGetEccMode(self, handle, current, pending):
        current._obj.value, pending._obj.value = 1, 1
        return 0

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter, ref):
        ref._obj.value = 0 if counter == 0 else 5
        return 0

    def nvmlDeviceGetRetiredPages(self, handle, cause, count, addresses):
        return 3

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle, ref):
        return 3

    def nvmlDeviceGetRemappedRows(self, handle, corr, unc, pending, failure):
        corr._obj.value, unc._obj.value, pending._obj.value, failure._obj.value = 0, 1, 0, 1
        return 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, ref):
        ref._obj.value = 0x1 | 0x40
        return 0


def test_nvml_readings_through_ctypes(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setattr(gc.ctypes, "CDLL", lambda name: fake)
    got = gc.nvml_readings()
    assert fake.shutdown == 1
    assert (got["driver_version"], got["cuda_driver_version"], got["device_count"]) == ("550.90.07", "12.4", 1)
    [device] = got["devices"]
    assert device["name"] == "NVIDIA A100-SXM4-80GB"
    assert (device["memory_total_mib"], device["memory_used_mib"], device["pci_bus_id"]) == (
        81920,
        4,
        "00000000:07:00.0",
    )
    assert (device["temperature_c"], device["power_w"], device["power_limit_w"]) == (33, 61.234, 400.0)
    assert (device["ecc_volatile_uncorrectable"], device["ecc_aggregate_uncorrectable"]) == (0, 5)
    assert device["retired_pages_dbe"] is None
    assert "Not Supported" in device["errors"]["retired_pages_dbe"]
    assert (device["remapped_rows_unc"], device["remapped_rows_failure"]) == (1, True)
    assert device["clock_event_reasons_active"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert json.loads(json.dumps(got)) == got
    checks = {c.subject.split(") ")[-1]: c.level for c in gc.gpu_health(device)}
    assert checks == {"ECC": "WARN", "row remapping": "FAIL", "clocks": "FAIL"}


def test_nvml_library_missing():
    assert "cannot load" in gc.nvml_readings("libnvidia-ml-does-not-exist.so.1")["problem"]
    assert gc.nvml_loadable("libnvidia-ml-does-not-exist.so.1")


def test_struct_layouts_match_nvml_h():
    assert ctypes.sizeof(gc._NvmlMemory) == 24
    assert ctypes.sizeof(gc._NvmlPciInfo) == 16 + 5 * 4 + 32


# ---------------------------------------------------------------- no nvidia-smi: exit 1


def test_without_nvidia_smi_the_script_exits_1_and_says_why(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty))
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in gc.SMI_DIRS):
        pytest.skip("this host has nvidia-smi in %s" % ", ".join(gc.SMI_DIRS))
    before = sorted(p.name for p in FIXTURES.iterdir())
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "gpu-check: nvidia-smi not found on PATH or in /usr/bin, /usr/local/nvidia/bin" in proc.stderr
    assert "nothing captured, nothing checked (exit 1)" in proc.stderr
    assert sorted(p.name for p in FIXTURES.iterdir()) == before  # no folder left behind
