#!/usr/bin/env python3
"""gpufleet on a real GPU (`make gpu-check`): capture fixtures, run gpu_facts' parsers, check GPU health.

For a bare machine with one or more NVIDIA GPUs: the driver, Python 3.8+ and this repository, no
network, no Ansible, no pip packages (standard library only). Under 8 minutes: every external call
has a timeout (60 s) and the whole capture a budget (420 s), so a hung driver cannot stall it.

    python3 tools/gpu-check.py                 capture, analyse, check (exit status below)
    python3 tools/gpu-check.py --out DIR       write the capture to DIR instead
    python3 tools/gpu-check.py --from DIR      no capture: analyse and check a folder written before

1. Captures, into tests/fixtures/nvidia_smi/<count>x_<model>_<memory>gb/ (a new folder), the
   nvidia-smi outputs the fixtures hold, under the names the lab's nvidia-smi stand-in replays
   (tests/lab/nvidia-smi-standin): query-gpu.csv (gpu_facts' own --query-gpu field list),
   nvidia-smi.txt, topo-m.txt, topo-p2p-r.txt, topo-p2p-p.txt, L.txt; plus q-x.xml
   (`nvidia-smi -q -x`) and nvml.json (NVML read through ctypes on libnvidia-ml.so.1). Each file
   starts with '#~ ' provenance lines, as every fixture does; SOURCE.md describes the machine.
   A command that fails leaves no file (the stand-in then fails that command, as the real one did).
2. Runs gpufleet's own parsers on the files it wrote, the code gpu_facts runs (module_utils
   _nvidia_smi and _gpu_topology, imported from this checkout without Ansible), and prints what
   gpu_facts would report: GPUs, memory, NUMA placement, links, the NCCL P2P decision and the NCCL
   environment the nccl role derives from it; then compares the parsers' answers with NVML's.
3. Health checks, from `nvidia-smi -q -x` (NVML when the XML is missing): uncorrectable ECC
   errors, retired pages, row remapping, resets the driver asks for, thermal and power slowdowns
   active, and the GPU count NVML reports against nvidia-smi's. Prints PASS / WARN / FAIL lines.
4. A summary, the fixture folder, and how to add it to the repository.

Exit status: 0 healthy (WARN lines allowed); 2 a health check failed; 1 nvidia-smi or the NVML
library is missing (nothing is captured then), or bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"

EXIT_OK, EXIT_MISSING, EXIT_UNHEALTHY = 0, 1, 2
COMMAND_TIMEOUT = 60  # seconds, each nvidia-smi call and the NVML reading
TOTAL_BUDGET = 420  # seconds for all of them together: the run stays under 8 minutes
SMI_DIRS = ("/usr/bin", "/usr/local/nvidia/bin")  # where gpu_facts looks besides PATH
NVML_LIBRARY = "libnvidia-ml.so.1"

# (file, nvidia-smi arguments): the names the fixtures and tests/lab/nvidia-smi-standin use.
# None: gpu_facts' own --query-gpu call (its field list, QUERY_GPU_FIELDS).
CAPTURES = (
    ("query-gpu.csv", None),
    ("nvidia-smi.txt", []),
    ("topo-m.txt", ["topo", "-m"]),
    ("topo-p2p-r.txt", ["topo", "-p2p", "r"]),
    ("topo-p2p-p.txt", ["topo", "-p2p", "p"]),
    ("L.txt", ["-L"]),
    ("q-x.xml", ["-q", "-x"]),
)
NVML_FILE = "nvml.json"
# A host where these fail cannot be trusted with work; the topology calls may be missing on old drivers.
ESSENTIAL = ("query-gpu.csv", "nvidia-smi.txt", "L.txt", "q-x.xml")

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"

# Clock event (throttle) reasons, as nvidia-smi -q -x names them after the clocks_event_reason_ /
# clocks_throttle_reason_ prefix, with NVML's bit for each (nvml.h nvmlClocksEventReason*).
CLOCK_REASON_BITS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clocks_setting", 0x100),
)
# Active on a GPU = it is being slowed by heat or by its board/power supply: FAIL.
SLOWDOWN_FAIL = {
    "hw_slowdown": "hardware slowdown (HW thermal or power brake signal)",
    "hw_thermal_slowdown": "hardware thermal slowdown (the GPU is too hot)",
    "hw_power_brake_slowdown": "hardware power brake (an external power signal, e.g. the power supply)",
    "sw_thermal_slowdown": "software thermal slowdown (above its slowdown temperature)",
}
# Active = held at its power limit: normal under full load, odd on an idle GPU: WARN.
SLOWDOWN_WARN = {"sw_power_cap": "software power cap (held at its power limit)"}
# Dynamic page retirement (GPUs before Ampere) keeps at most 64 retired pages; at that limit the
# GPU cannot retire another failing page and NVIDIA's guidance is to replace it.
RETIRED_PAGES_LIMIT = 64

NA = ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "[Unknown Error]")


@dataclass
class Check:
    level: str  # PASS, WARN or FAIL
    subject: str
    message: str

    def line(self) -> str:
        return "%s  %s: %s" % (self.level, self.subject, self.message)


@dataclass
class Captured:
    name: str  # file name in the fixture folder
    command: str  # as a person would type it
    text: str | None  # stdout, when the command succeeded
    problem: str | None  # why not
    seconds: float


# ------------------------------------------------------------------ gpufleet's own code


def gpufleet_modules():
    """gpufleet's module_utils, the code the gpu_facts module runs, from this checkout.

    collections/ansible_collections/gpufleet/serving links back to the repository root; these
    modules import nothing from Ansible, so plain python3 imports them.
    """
    if _MODULES:
        return _MODULES[0]
    path = str(ROOT / "collections")
    if path not in sys.path:
        sys.path.insert(0, path)
    if not (ROOT / "collections" / "ansible_collections" / "gpufleet" / "serving" / "plugins").is_dir():
        # A copy of the repository that lost the link (an archive without symlinks): make one.
        link = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "ansible_collections" / "gpufleet" / "serving"
        link.parent.mkdir(parents=True)
        link.symlink_to(ROOT, target_is_directory=True)
        sys.path.insert(0, str(link.parents[2]))
    from ansible_collections.gpufleet.serving.plugins.module_utils import _gpu_topology, _nccl, _nvidia_smi, _sysfs

    _MODULES.append((_gpu_topology, _nccl, _nvidia_smi, _sysfs))
    return _MODULES[0]


_MODULES: list = []


# ------------------------------------------------------------------ running commands


def find_nvidia_smi() -> str | None:
    """nvidia-smi on PATH, else where gpu_facts also looks (/usr/bin, /usr/local/nvidia/bin)."""
    found = shutil.which("nvidia-smi")
    if found:
        return found
    for folder in SMI_DIRS:
        path = os.path.join(folder, "nvidia-smi")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def nvml_loadable(library: str = NVML_LIBRARY) -> str | None:
    """None when the NVML library loads (loading calls nothing in the driver), else why not."""
    try:
        ctypes.CDLL(library)
    except OSError as exc:
        return str(exc)
    return None


def run_command(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit status or None when it was stopped, stdout, stderr); LC_ALL=C as gpu_facts runs it."""
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            env=dict(os.environ, LC_ALL="C"),
        )
    except OSError as exc:
        return None, "", str(exc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel (a hung driver): leave it
            proc.communicate(timeout=5)
        return None, "", "no answer within %d s (a hung driver or GPU?)" % timeout
    return proc.returncode, out, err


class Budget:
    """Each call gets COMMAND_TIMEOUT seconds, or what is left of the run's budget if less."""

    def __init__(self, total: float = TOTAL_BUDGET, each: float = COMMAND_TIMEOUT):
        self.deadline = time.monotonic() + total
        self.each = each

    def next_timeout(self) -> float:
        return min(self.each, self.deadline - time.monotonic())


def _shown(item: Captured) -> str:
    state = item.command if item.text is not None else "FAILED %s: %s" % (item.command, item.problem)
    return "  %-15s %5.1f s  %s" % (item.name, item.seconds, state)


def capture_smi(smi: str, budget: Budget, query_fields, echo=None) -> list[Captured]:
    """Run every nvidia-smi call of CAPTURES; failures are kept with their message.
    `echo` (print) is given each result's line as it comes."""
    results = []
    for name, args in CAPTURES:
        args = ["--query-gpu=" + ",".join(query_fields), "--format=csv"] if args is None else args
        command = " ".join(["nvidia-smi", *args])
        timeout = budget.next_timeout()
        if timeout < 1:
            results.append(Captured(name, command, None, "skipped: the run's %d s budget is spent" % TOTAL_BUDGET, 0))
            continue
        started = time.monotonic()
        rc, out, err = run_command([smi, *args], timeout)
        took = time.monotonic() - started
        if rc == 0:
            results.append(Captured(name, command, out, None, took))
        else:
            said = (err.strip() or out.strip() or "no output").splitlines()[-1]
            why = said if rc is None else "exit status %d: %s" % (rc, said)
            results.append(Captured(name, command, None, why, took))
        if echo:
            echo(_shown(results[-1]))
    return results


def capture_nvml(budget: Budget) -> dict:
    """NVML readings, taken in a child python3 so that a hung driver is stopped by the timeout."""
    timeout = budget.next_timeout()
    if timeout < 1:
        return {"problem": "skipped: the run's %d s budget is spent" % TOTAL_BUDGET}
    rc, out, err = run_command([sys.executable, str(Path(__file__).resolve()), "--nvml-json"], timeout)
    if rc != 0:
        said = (err.strip() or "no output").splitlines()[-1]
        return {"problem": "reading NVML failed: %s" % (said if rc is None else "exit status %d: %s" % (rc, said))}
    try:
        return json.loads(out)
    except ValueError:
        return {"problem": "reading NVML printed no JSON: %s" % out.strip()[:200]}


# ------------------------------------------------------------------ NVML through ctypes

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT = 0, 1


class _NvmlMemory(ctypes.Structure):
    _fields_ = (("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong))


class _NvmlPciInfo(ctypes.Structure):  # nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it
    _fields_ = (
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    )


class _Nvml:
    def __init__(self, lib):
        self.lib = lib
        text = getattr(lib, "nvmlErrorString", None)
        if text is not None:
            text.restype = ctypes.c_char_p
        self._text = text

    def error(self, rc: int) -> str:
        said = self._text(rc) if self._text is not None else None
        return "%s (NVML error %d)" % (said.decode() if said else "unknown", rc)

    def call(self, name: str, *args) -> int | None:
        """The return code of NVML function `name`, or None when this driver's NVML lacks it."""
        fn = getattr(self.lib, name, None)
        return None if fn is None else fn(*args)


def nvml_readings(library: str = NVML_LIBRARY) -> dict:
    """Driver version, device count and, per device, the readings the health checks use.

    A reading NVML cannot give (NVML_ERROR_NOT_SUPPORTED on consumer GPUs, a function this driver
    lacks) is null, with the reason under the device's "errors".
    """
    result: dict = {"library": library}
    try:
        nv = _Nvml(ctypes.CDLL(library))
    except OSError as exc:
        result["problem"] = "cannot load %s: %s" % (library, exc)
        return result
    rc = nv.call("nvmlInit_v2")
    rc = nv.call("nvmlInit") if rc is None else rc
    if rc != NVML_SUCCESS:
        result["problem"] = "nvmlInit failed: %s" % (nv.error(rc) if rc is not None else "no nvmlInit in the library")
        return result
    try:
        for key, name in (
            ("driver_version", "nvmlSystemGetDriverVersion"),
            ("nvml_version", "nvmlSystemGetNVMLVersion"),
        ):
            buf = ctypes.create_string_buffer(96)
            result[key] = buf.value.decode() if nv.call(name, buf, 96) == NVML_SUCCESS else None
        cuda = ctypes.c_int()
        ok = nv.call("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(cuda)) == NVML_SUCCESS
        result["cuda_driver_version"] = "%d.%d" % (cuda.value // 1000, cuda.value % 1000 // 10) if ok else None
        count = ctypes.c_uint()
        rc = nv.call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        if rc != NVML_SUCCESS:
            result["problem"] = "nvmlDeviceGetCount failed: %s" % (nv.error(rc) if rc is not None else "missing")
            return result
        result["device_count"] = count.value
        result["devices"] = [_nvml_device(nv, index) for index in range(count.value)]
    finally:
        nv.call("nvmlShutdown")
    return result


def _nvml_device(nv: _Nvml, index: int) -> dict:
    device: dict = {"index": index}
    errors: dict = {}
    handle = ctypes.c_void_p()
    rc = nv.call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
    if rc != NVML_SUCCESS:
        device["problem"] = "nvmlDeviceGetHandleByIndex: %s" % (nv.error(rc) if rc is not None else "missing")
        device["lost"] = rc == NVML_ERROR_GPU_IS_LOST
        return device

    def read(fields, function, *args, ok=(NVML_SUCCESS,)):
        """Call function(handle, *args); on failure set `fields` to None and say why."""
        rc = nv.call(function, handle, *args)
        if rc in ok:
            return True
        why = "%s is not in this driver's NVML" % function if rc is None else "%s: %s" % (function, nv.error(rc))
        for field in fields:
            device[field] = None
            errors[field] = why
        if rc == NVML_ERROR_GPU_IS_LOST:
            device["lost"] = True
        return False

    for field, function in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
        buf = ctypes.create_string_buffer(96)
        if read([field], function, buf, 96):
            device[field] = buf.value.decode(errors="replace")
    memory = _NvmlMemory()
    if read(["memory_total_mib", "memory_used_mib"], "nvmlDeviceGetMemoryInfo", ctypes.byref(memory)):
        device["memory_total_mib"] = memory.total // 2**20
        device["memory_used_mib"] = memory.used // 2**20
    value = ctypes.c_uint()
    if read(["temperature_c"], "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU, ctypes.byref(value)):
        device["temperature_c"] = value.value
    if read(["power_w"], "nvmlDeviceGetPowerUsage", ctypes.byref(value)):
        device["power_w"] = value.value / 1000.0
    if read(["power_limit_w"], "nvmlDeviceGetEnforcedPowerLimit", ctypes.byref(value)):
        device["power_limit_w"] = value.value / 1000.0
    pci = _NvmlPciInfo()
    if read(["pci_bus_id"], "nvmlDeviceGetPciInfo_v3", ctypes.byref(pci)):
        device["pci_bus_id"] = pci.busId.decode(errors="replace")
    current, pending = ctypes.c_int(), ctypes.c_int()
    if read(["ecc_mode", "ecc_pending_mode"], "nvmlDeviceGetEccMode", ctypes.byref(current), ctypes.byref(pending)):
        device["ecc_mode"] = "Enabled" if current.value else "Disabled"
        device["ecc_pending_mode"] = "Enabled" if pending.value else "Disabled"
    for field, counter in (
        ("ecc_volatile_uncorrectable", NVML_VOLATILE_ECC),
        ("ecc_aggregate_uncorrectable", NVML_AGGREGATE_ECC),
    ):
        errors_seen = ctypes.c_ulonglong()
        args = (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter, ctypes.byref(errors_seen))
        if read([field], "nvmlDeviceGetTotalEccErrors", *args):
            device[field] = errors_seen.value
    for field, cause in (
        ("retired_pages_sbe", NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT),
        ("retired_pages_dbe", NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT),
    ):
        pages = ctypes.c_uint(0)  # 0: ask for the count only
        ok = (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE)
        if read([field], "nvmlDeviceGetRetiredPages", cause, ctypes.byref(pages), None, ok=ok):
            device[field] = pages.value
    state = ctypes.c_int()
    if read(["retired_pages_pending"], "nvmlDeviceGetRetiredPagesPendingStatus", ctypes.byref(state)):
        device["retired_pages_pending"] = bool(state.value)
    rows = [ctypes.c_uint() for _ in range(4)]
    fields = ["remapped_rows_corr", "remapped_rows_unc", "remapped_rows_pending", "remapped_rows_failure"]
    if read(fields, "nvmlDeviceGetRemappedRows", *(ctypes.byref(r) for r in rows)):
        device["remapped_rows_corr"], device["remapped_rows_unc"] = rows[0].value, rows[1].value
        device["remapped_rows_pending"], device["remapped_rows_failure"] = bool(rows[2].value), bool(rows[3].value)
    reasons = ctypes.c_ulonglong()
    function = "nvmlDeviceGetCurrentClocksEventReasons"  # R535+; drivers before have only the old name
    if getattr(nv.lib, function, None) is None:
        function = "nvmlDeviceGetCurrentClocksThrottleReasons"
    if read(["clock_event_reasons_active"], function, ctypes.byref(reasons)):
        device["clock_event_reasons_active"] = [name for name, bit in CLOCK_REASON_BITS if reasons.value & bit]
    device["errors"] = errors
    return device


# ------------------------------------------------------------------ nvidia-smi -q -x


def _na(value: str | None) -> str | None:
    value = value.strip() if value is not None else None
    return None if value is None or value in NA else value


def _text(element, path: str) -> str | None:
    node = element.find(path) if element is not None else None
    return _na(node.text) if node is not None else None


def _number(value: str | None):
    """'45 C' -> 45, '27.22 W' -> 27.22, 'N/A' -> None."""
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value or "")
    if not match:
        return None
    return float(match.group(1)) if "." in match.group(1) else int(match.group(1))


def _yes_no(value: str | None) -> bool | None:
    return {"yes": True, "no": False}.get((value or "").strip().lower())


def _uncorrectable(section) -> int | None:
    """Uncorrectable ECC errors in an ecc_errors/volatile or /aggregate block, None if not reported.

    R470+ print sram_uncorrectable (R550+: _parity and _secded) and dram_uncorrectable; older
    drivers a double_bit block with a total.
    """
    if section is None:
        return None
    values = []
    for child in section:
        if "uncorrectable" in child.tag:
            values.append(_number(_na(child.text)))
        elif child.tag == "double_bit":
            total = _number(_text(child, "total"))
            parts = [_number(_na(part.text)) for part in child if part.tag != "total"]
            values.append(total if total is not None else sum(p for p in parts if p is not None))
    numbers = [v for v in values if v is not None]
    return int(sum(numbers)) if numbers else None


def parse_smi_xml(text: str | None) -> dict:
    """`nvidia-smi -q -x` -> {driver_version, cuda_version, attached_gpus, gpus: [record], problem}.

    Each record has the keys nvml_readings() gives a device, so one set of health checks reads
    either source. GPUs are numbered in the order nvidia-smi lists them (its index order).
    """
    try:
        root = ET.fromstring((text or "").strip())
    except ET.ParseError as exc:
        return {"problem": "nvidia-smi -q -x printed no readable XML (%s)" % exc, "gpus": []}
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        record: dict = {
            "index": index,
            "name": _text(gpu, "product_name"),
            "uuid": _text(gpu, "uuid"),
            "pci_bus_id": _text(gpu, "pci/pci_bus_id") or _na(gpu.get("id")),
            "memory_total_mib": _number(_text(gpu, "fb_memory_usage/total")),
            "memory_used_mib": _number(_text(gpu, "fb_memory_usage/used")),
            "temperature_c": _number(_text(gpu, "temperature/gpu_temp")),
            "ecc_mode": _text(gpu, "ecc_mode/current_ecc"),
            "ecc_pending_mode": _text(gpu, "ecc_mode/pending_ecc"),
            "ecc_volatile_uncorrectable": _uncorrectable(gpu.find("ecc_errors/volatile")),
            "ecc_aggregate_uncorrectable": _uncorrectable(gpu.find("ecc_errors/aggregate")),
            "sram_threshold_exceeded": _yes_no(_text(gpu, "ecc_errors/aggregate/sram_threshold_exceeded")),
            "retired_pages_sbe": _number(_text(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")),
            "retired_pages_dbe": _number(_text(gpu, "retired_pages/double_bit_retirement/retired_count")),
            "retired_pages_pending": _yes_no(
                _text(gpu, "retired_pages/pending_retirement") or _text(gpu, "retired_pages/pending_blacklist")
            ),
            "remapped_rows_corr": _number(_text(gpu, "remapped_rows/remapped_row_corr")),
            "remapped_rows_unc": _number(_text(gpu, "remapped_rows/remapped_row_unc")),
            "remapped_rows_pending": _yes_no(_text(gpu, "remapped_rows/remapped_row_pending")),
            "remapped_rows_failure": _yes_no(_text(gpu, "remapped_rows/remapped_row_failure")),
            "reset_required": _yes_no(_text(gpu, "gpu_reset_status/reset_required")),
            "drain_and_reset_recommended": _yes_no(_text(gpu, "gpu_reset_status/drain_and_reset_recommended")),
        }
        power = None
        for path in ("gpu_power_readings", "power_readings"):  # R535+ renamed power_readings
            for field in ("power_draw", "instant_power_draw", "average_power_draw"):
                power = power if power is not None else _number(_text(gpu, "%s/%s" % (path, field)))
        record["power_w"] = power
        reasons = gpu.find("clocks_event_reasons")  # R535+; clocks_throttle_reasons before
        reasons = gpu.find("clocks_throttle_reasons") if reasons is None else reasons
        if reasons is None:
            record["clock_event_reasons_active"] = None
        else:
            record["clock_event_reasons_active"] = [
                re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag)
                for child in reasons
                if (_na(child.text) or "").lower() == "active"
            ]
        gpus.append(record)
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": _number(_text(root, "attached_gpus")),
        "gpus": gpus,
        "problem": None,
    }


# ------------------------------------------------------------------ health checks


def _subject(gpu: dict) -> str:
    name = gpu.get("name")
    return "GPU%s%s" % (gpu.get("index"), " (%s)" % name if name else "")


def gpu_health(gpu: dict) -> list[Check]:
    """Health checks of one GPU record (from parse_smi_xml or nvml_readings)."""
    subject = _subject(gpu)
    checks = []
    if gpu.get("reset_required") or gpu.get("drain_and_reset_recommended"):
        checks.append(
            Check(FAIL, subject + " reset", "the driver asks for a GPU reset: drain it, then reset or reboot")
        )
    elif gpu.get("reset_required") is not None:
        checks.append(Check(PASS, subject + " reset", "the driver asks for no reset"))

    volatile, aggregate = gpu.get("ecc_volatile_uncorrectable"), gpu.get("ecc_aggregate_uncorrectable")
    mode = gpu.get("ecc_mode")
    if volatile:
        checks.append(
            Check(
                FAIL,
                subject + " ECC",
                "%d uncorrectable ECC error(s) since the driver loaded (volatile): drain the GPU and reset it; "
                "replace it if they come back" % volatile,
            )
        )
    elif gpu.get("sram_threshold_exceeded"):
        checks.append(
            Check(
                FAIL, subject + " ECC", "uncorrectable SRAM errors passed NVIDIA's threshold: the GPU needs replacing"
            )
        )
    elif aggregate:
        checks.append(
            Check(
                WARN,
                subject + " ECC",
                "none since the driver loaded, %d uncorrectable in the GPU's lifetime (aggregate)" % aggregate,
            )
        )
    elif mode == "Disabled":
        checks.append(Check(WARN, subject + " ECC", "ECC is off on a GPU that has it (nvidia-smi -e 1, then reboot)"))
    elif volatile is None:
        said = "not reported (no ECC on this GPU)" if mode is None else "%s, error counts not reported" % mode.lower()
        checks.append(Check(PASS, subject + " ECC", said))
    else:
        checks.append(Check(PASS, subject + " ECC", "%s, 0 uncorrectable errors" % (mode or "on").lower()))

    sbe, dbe, pending = gpu.get("retired_pages_sbe"), gpu.get("retired_pages_dbe"), gpu.get("retired_pages_pending")
    if sbe is not None or dbe is not None or pending is not None:
        total = (sbe or 0) + (dbe or 0)
        counts = "%d retired page(s) (%d single-bit, %d double-bit)" % (total, sbe or 0, dbe or 0)
        if total >= RETIRED_PAGES_LIMIT:
            checks.append(
                Check(FAIL, subject + " retired pages", counts + ": the retirement table is full, replace it")
            )
        elif pending:
            checks.append(Check(WARN, subject + " retired pages", counts + ", a retirement pending: reset the GPU"))
        elif total:
            checks.append(Check(WARN, subject + " retired pages", counts + "; none pending"))
        else:
            checks.append(Check(PASS, subject + " retired pages", "none retired, none pending"))

    unc, failure, remap_pending = (
        gpu.get("remapped_rows_unc"),
        gpu.get("remapped_rows_failure"),
        gpu.get("remapped_rows_pending"),
    )
    if failure is not None or remap_pending is not None:
        rows = "%s row(s) remapped after uncorrectable errors" % (unc if unc is not None else "?")
        if failure:
            checks.append(
                Check(FAIL, subject + " row remapping", "a row remapping FAILED (%s): replace the GPU" % rows)
            )
        elif remap_pending:
            checks.append(Check(WARN, subject + " row remapping", "a remapping is pending (%s): reset the GPU" % rows))
        else:
            checks.append(Check(PASS, subject + " row remapping", "no failure, none pending; %s" % rows))

    active = gpu.get("clock_event_reasons_active")
    reading = ", ".join(
        part
        for part in (
            "%s C" % gpu["temperature_c"] if gpu.get("temperature_c") is not None else "",
            "%.0f W" % gpu["power_w"] if gpu.get("power_w") is not None else "",
        )
        if part
    )
    reading = " (%s)" % reading if reading else ""
    if active is None:
        checks.append(Check(PASS, subject + " clocks", "throttle reasons not reported%s" % reading))
    else:
        hot = [SLOWDOWN_FAIL[r] for r in active if r in SLOWDOWN_FAIL]
        capped = [SLOWDOWN_WARN[r] for r in active if r in SLOWDOWN_WARN]
        if hot:
            checks.append(Check(FAIL, subject + " clocks", "slowed down now%s: %s" % (reading, "; ".join(hot))))
        elif capped:
            checks.append(
                Check(WARN, subject + " clocks", "%s%s (normal under full load)" % ("; ".join(capped), reading))
            )
        else:
            checks.append(Check(PASS, subject + " clocks", "no thermal or power slowdown active%s" % reading))
    return checks


def lost_checks(nvml: dict | None) -> list[Check]:
    """NVML devices that could not be read at all, or that NVML reports lost."""
    checks = []
    for gpu in (nvml or {}).get("devices") or []:
        if gpu.get("lost") or gpu.get("problem"):
            what = "NVML reports the GPU lost (fallen off the bus)" if gpu.get("lost") else gpu["problem"]
            checks.append(Check(FAIL, _subject(gpu), "%s: drain the host, then check `dmesg | grep -i xid`" % what))
    return checks


def count_checks(nvml: dict | None, smi_counts: dict, sysfs_gpus: list | None = None) -> list[Check]:
    """NVML's GPU count against each nvidia-smi count (source -> count; None = not available)."""
    checks = []
    nvml_count = (nvml or {}).get("device_count")
    known = {source: n for source, n in smi_counts.items() if n is not None}
    if nvml is None:
        checks.append(Check(WARN, "GPU count", "no NVML readings to compare with nvidia-smi (%s)" % _counts(known)))
    elif nvml_count is None:
        checks.append(Check(FAIL, "NVML", "%s" % (nvml.get("problem") or "no device count")))
    elif not known:
        checks.append(Check(FAIL, "GPU count", "NVML sees %d GPU(s); nvidia-smi listed none" % nvml_count))
    elif any(n != nvml_count for n in known.values()):
        checks.append(
            Check(
                FAIL,
                "GPU count",
                "NVML sees %d GPU(s) but nvidia-smi %s: a GPU is failing or has fallen off the bus "
                "(dmesg | grep -i xid)" % (nvml_count, _counts(known)),
            )
        )
    elif nvml_count == 0:
        checks.append(Check(FAIL, "GPU count", "no GPU found (NVML and nvidia-smi agree on 0)"))
    else:
        checks.append(Check(PASS, "GPU count", "NVML %d = nvidia-smi %s" % (nvml_count, _counts(known))))
    if sysfs_gpus is not None and nvml_count is not None:
        bound = [g for g in sysfs_gpus if g.get("driver") == "nvidia"]
        other = [g for g in sysfs_gpus if g.get("driver") != "nvidia"]
        if len(bound) > nvml_count:
            checks.append(
                Check(
                    WARN,
                    "PCI bus",
                    "%d NVIDIA GPU(s) bound to the nvidia driver in sysfs, NVML sees %d: expected in a container or "
                    "with GPUs given to VMs, else a GPU failed to initialise (dmesg | grep -i xid)"
                    % (len(bound), nvml_count),
                )
            )
        if other:
            shown = ", ".join("%s (%s)" % (g["address"], g.get("driver") or "no driver") for g in other)
            checks.append(Check(WARN, "PCI bus", "NVIDIA GPU(s) not bound to the nvidia driver: %s" % shown))
    return checks


def _counts(counts: dict) -> str:
    return ", ".join("%d (%s)" % (n, source) for source, n in counts.items()) or "nothing"


def driver_checks(nvml: dict | None, smi_driver: str | None) -> list[Check]:
    nvml_driver = (nvml or {}).get("driver_version")
    if not nvml_driver or not smi_driver:
        return []
    if nvml_driver != smi_driver:
        return [
            Check(
                FAIL, "driver", "NVML reports %s, nvidia-smi %s (a half-upgraded driver?)" % (nvml_driver, smi_driver)
            )
        ]
    return [Check(PASS, "driver", "%s (NVML and nvidia-smi agree)" % nvml_driver)]


def capture_checks(captured: list[Captured]) -> list[Check]:
    """A failed essential nvidia-smi call is a FAIL; a failed topology call a WARN."""
    checks = []
    for item in captured:
        if item.problem:
            level = FAIL if item.name in ESSENTIAL else WARN
            checks.append(Check(level, "`%s`" % item.command, item.problem))
    return checks


def smi_gpu_counts(texts: dict, xml: dict | None, facts: dict | None) -> dict:
    """GPU counts by nvidia-smi source (None where that output is missing)."""
    listed = texts.get("L.txt")
    return {
        "-L": len(re.findall(r"^GPU \d+:", listed, flags=re.MULTILINE)) if listed is not None else None,
        "-q -x": len(xml["gpus"]) if xml and not xml.get("problem") else None,
        "gpu_facts": facts["count"] if facts and not facts.get("problem") else None,
    }


# ------------------------------------------------------------------ gpu_facts on the capture


def read_folder(folder: Path) -> dict:
    """Every capture file of a fixture folder, '#~ ' provenance lines removed (None if absent)."""
    texts: dict = {}
    for name in [n for n, _ in CAPTURES] + [NVML_FILE]:
        path = folder / name
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines(keepends=True)
            texts[name] = "".join(line for line in lines if not line.startswith("#~ "))
        else:
            texts[name] = None
    return texts


def gpu_facts_view(texts: dict, sysfs_root: str | None = None) -> dict:
    """ansible_facts.gpufleet_gpu as gpu_facts builds it from these outputs (module_utils build_facts).

    With sysfs_root (a live run) the sysfs readings are added as the module adds them; without
    (a folder analysed elsewhere) they stay null, as in `gpufleet gpu show`.
    """
    topology, _nccl, smi, sysfs = gpufleet_modules()
    query, summary = texts.get("query-gpu.csv"), texts.get("nvidia-smi.txt")
    topo, p2p = texts.get("topo-m.txt"), texts.get("topo-p2p-r.txt")
    problem = None
    if query is None and summary is None and topo is None:
        problem = "nvidia-smi failed: no query, summary or topology output"
    if sysfs_root is None:
        facts = topology.build_facts(query_csv=query, summary=summary, topo=topo, p2p=p2p, problem=problem)
        facts["numa_nodes"], facts["pci_devices"] = None, None
        return facts
    bus_ids = [row.get("pci.bus_id") for row in smi.parse_query_gpu_csv(query or "", fields=topology.QUERY_GPU_FIELDS)]
    bus_ids += [d["pci_bus_id"] for d in smi.parse_smi_summary(summary or "")["devices"]]
    facts = topology.build_facts(
        query_csv=query,
        summary=summary,
        topo=topo,
        p2p=p2p,
        sysfs=sysfs.gpu_placement(sysfs_root, bus_ids),
        rdma_devices=sysfs.rdma_devices(sysfs_root),
        problem=problem,
    )
    facts["numa_nodes"], facts["pci_devices"] = sysfs.numa_nodes(sysfs_root), sysfs.pci_gpus(sysfs_root)
    return facts


def facts_lines(facts: dict) -> list[str]:
    """gpu_facts' answer, as a person reads it (the lines `gpufleet gpu show` prints), and the
    NCCL environment gpufleet would write from it."""
    topology, nccl, _smi, _sysfs = gpufleet_modules()
    lines = topology.facts_lines(facts)
    env = nccl.plan_env(gpu=facts)
    for key, value in env["env"].items():
        note = env["notes"].get(key)
        lines.append("NCCL env from %s: %s=%s%s" % (env["origin"][key], key, value, " (%s)" % note if note else ""))
    return lines


def parser_checks(facts: dict, nvml: dict | None, xml: dict | None) -> list[Check]:
    """gpufleet's parsers against NVML (and -q -x): a disagreement is a gpufleet bug to report."""
    reference = (nvml or {}).get("devices") or (xml or {}).get("gpus") or []
    source = "NVML" if (nvml or {}).get("devices") else "-q -x"
    if not reference:
        return []
    checks = []
    ours = {d["index"]: d for d in facts["devices"]}
    for ref in reference:
        mine = ours.get(ref["index"])
        subject = "parse GPU%d" % ref["index"]
        if mine is None:
            checks.append(Check(WARN, subject, "in %s but not in gpu_facts' answer" % source))
            continue
        wrong = []
        name = mine.get("name") or ""
        cut = name.endswith("...") and (ref.get("name") or "").startswith(name[:-3].rstrip())  # the table's cut name
        if ref.get("name") and name and ref["name"] != name and not cut:
            wrong.append("name %r, %s %r" % (mine["name"], source, ref["name"]))
        bus_ours, bus_ref = (mine.get("pci_bus_id") or "").lower(), (ref.get("pci_bus_id") or "").lower()
        if bus_ours and bus_ref and bus_ours[-12:] != bus_ref[-12:]:
            wrong.append("bus %s, %s %s" % (mine["pci_bus_id"], source, ref["pci_bus_id"]))
        mem_ours, mem_ref = mine.get("memory_total_mib"), ref.get("memory_total_mib")
        if mem_ours and mem_ref and abs(mem_ours - mem_ref) > max(2, mem_ref * 0.01):
            wrong.append("memory %s MiB, %s %s MiB" % (mem_ours, source, mem_ref))
        if wrong:
            checks.append(Check(WARN, subject, "gpufleet's parsers disagree with %s: %s" % (source, "; ".join(wrong))))
        else:
            checks.append(Check(PASS, subject, "name, bus id and memory agree with %s" % source))
    return checks


# ------------------------------------------------------------------ the fixture folder


def _slug(name: str) -> str:
    text = re.sub(r"\b(nvidia|geforce)\b", " ", name.lower())
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_")


def fixture_name(names: list, memory_mib: list) -> str:
    """'1x_h200_140gb', '8x_h100_80gb_hbm3', '4x_mixed_rtx_4090_rtx_a6000': count, model, memory."""
    if not names:
        return "0x_no_gpu"
    models = []
    for name in names:
        if (name or "gpu") not in models:
            models.append(name or "gpu")
    if len(models) == 1:
        base = _slug(models[0]) or "gpu"
        memory = next((m for m in memory_mib if m), None)
        if memory and not re.search(r"\d+gb", base):
            base += "_%dgb" % round(memory / 1024)
    else:
        base = "mixed_" + "_".join(_slug(m) or "gpu" for m in models)
    return "%dx_%s" % (len(names), base)


def new_folder(base: Path, name: str) -> Path:
    folder = base / name
    n = 2
    while folder.exists():
        folder = base / ("%s_%d" % (name, n))
        n += 1
    return folder


def header(command: str, machine: str, when: str, note: str | None = None) -> str:
    lines = [
        "#~ source: real output captured by tools/gpu-check.py (make gpu-check) on the machine below",
        "#~ machine: %s" % machine,
        "#~ date: %s" % when,
        "#~ command: %s" % command,
    ]
    if note:
        lines.append("#~ note: %s" % note)
    return "\n".join(lines) + "\n"


def write_capture(folder: Path, captured: list[Captured], nvml: dict, machine: str, when: str) -> list[str]:
    """Write each successful output under its fixture name; returns the names written."""
    folder.mkdir(parents=True, exist_ok=False)
    written = []
    for item in captured:
        if item.text is None:
            continue
        (folder / item.name).write_text(header(item.command, machine, when) + item.text)
        written.append(item.name)
    note = "NVML through ctypes on %s, null where NVML cannot say (errors per device)" % NVML_LIBRARY
    body = json.dumps(nvml, indent=2, sort_keys=True) + "\n"
    (folder / NVML_FILE).write_text(header("python3 tools/gpu-check.py --nvml-json", machine, when, note) + body)
    written.append(NVML_FILE)
    return written


def write_source(folder: Path, machine: str, when: str, captured: list[Captured], facts: dict, checks: list) -> None:
    """SOURCE.md, as every fixture folder has: the machine, the files, what failed, the health."""
    devices = "; ".join(
        "GPU%d %s, %s MiB, bus %s" % (d["index"], d["name"], d["memory_total_mib"], d["pci_bus_id"])
        for d in facts["devices"]
    )
    files = ", ".join("%s (`%s`)" % (c.name, c.command) for c in captured if c.text is not None)
    problems = [c.line() for c in checks if c.level != PASS]
    text = [
        "# %s (captured with make gpu-check)" % machine,
        "- GPUs: %s." % (devices or "none found"),
        "- Driver %s, CUDA %s. Host: %s, Linux %s, Python %s."
        % (
            facts["driver_version"],
            facts["cuda_version"],
            platform.machine(),
            platform.release(),
            platform.python_version(),
        ),
        "- NCCL P2P decision at capture: %s (%s)."
        % ("keep enabled" if facts["p2p"]["recommended"] else "disable", facts["p2p"]["source"]),
        "- Files: %s, %s (NVML readings through ctypes)." % (files or "none", NVML_FILE),
    ]
    text += [
        "- `%s` failed: %s (no file: the stand-in fails it too)." % (c.command, c.problem)
        for c in captured
        if c.problem
    ]
    text += [
        "- Health at capture: %s." % ("; ".join(problems) if problems else "every check passed"),
        "- Captured %s by tools/gpu-check.py. q-x.xml and nvml.json hold serial numbers and UUIDs: "
        "review them before publishing." % when,
        "- Source: TODO say where this machine is (cloud instance type, lab, owner) before committing.",
    ]
    (folder / "SOURCE.md").write_text("\n".join(text) + "\n")


@dataclass
class Analysis:
    facts: dict  # ansible_facts.gpufleet_gpu as gpu_facts reports it
    parsed: list  # gpufleet's parsers against NVML / -q -x
    health: list  # the health checks
    source: str  # where the per-GPU health readings came from


def analyse(texts: dict, nvml: dict | None, captured: list | None = None, sysfs_root: str | None = None) -> Analysis:
    """gpu_facts' answer and every check, from a capture's texts and its NVML readings."""
    facts = gpu_facts_view(texts, sysfs_root)
    xml = parse_smi_xml(texts["q-x.xml"]) if texts.get("q-x.xml") else None
    health = capture_checks(captured or [])
    if xml and xml.get("problem"):
        health.append(Check(FAIL, "`nvidia-smi -q -x`", xml["problem"]))
    health += count_checks(nvml, smi_gpu_counts(texts, xml, facts), facts.get("pci_devices"))
    health += driver_checks(nvml, (xml or {}).get("driver_version") or facts["driver_version"])
    if nvml is not None and nvml.get("problem") and nvml.get("device_count") is not None:
        health.append(Check(FAIL, "NVML", nvml["problem"]))
    health += lost_checks(nvml)
    if (xml or {}).get("gpus"):
        source, records = "nvidia-smi -q -x", xml["gpus"]
    else:
        source = "NVML"
        records = [d for d in (nvml or {}).get("devices") or [] if not (d.get("lost") or d.get("problem"))]
    if not records:
        source = "nothing"
        health.append(Check(WARN, "per-GPU health", "no readings: neither nvidia-smi -q -x nor NVML answered"))
    for gpu in records:
        health += gpu_health(gpu)
    return Analysis(facts, parser_checks(facts, nvml, xml), health, source)


# ------------------------------------------------------------------ main


def _folder_text(folder: Path) -> str:
    try:
        return str(folder.resolve().relative_to(ROOT))
    except ValueError:
        return str(folder.resolve())


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", metavar="DIR", help="write the capture here (default: a new folder under %s)" % FIXTURES
    )
    parser.add_argument("--from", dest="source", metavar="DIR", help="analyse a folder captured before; no capture")
    parser.add_argument("--nvml-json", action="store_true", help=argparse.SUPPRESS)  # the child that reads NVML
    args = parser.parse_args(argv)
    if args.nvml_json:
        print(json.dumps(nvml_readings(), sort_keys=True))
        return EXIT_OK
    started = time.monotonic()
    if args.source:
        return check_folder(Path(args.source), started)
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        print("gpu-check: --out %s exists and is not an empty folder; give a new one" % out, file=sys.stderr)
        return EXIT_MISSING
    smi = find_nvidia_smi()
    nvml_missing = nvml_loadable()
    if smi is None:
        print(
            "gpu-check: nvidia-smi not found on PATH or in %s: install the NVIDIA driver "
            "(the nvidia_driver role does), or add its folder to PATH" % ", ".join(SMI_DIRS),
            file=sys.stderr,
        )
    if nvml_missing:
        print(
            "gpu-check: the NVML library %s cannot be loaded (%s): the NVIDIA driver's user-space "
            "libraries are not installed" % (NVML_LIBRARY, nvml_missing),
            file=sys.stderr,
        )
    if smi is None or nvml_missing:
        print("gpu-check: nothing captured, nothing checked (exit 1)", file=sys.stderr)
        return EXIT_MISSING
    return capture_and_check(smi, out, started)


def capture_and_check(smi: str, out: Path | None, started: float) -> int:
    print("gpufleet gpu-check: capturing from this machine (%s)" % smi)
    print("== capture (each call stopped after %d s, all of them after %d s)" % (COMMAND_TIMEOUT, TOTAL_BUDGET))
    topology, _nccl, _smi, _sysfs = gpufleet_modules()
    budget = Budget()
    captured = capture_smi(smi, budget, topology.QUERY_GPU_FIELDS, echo=print)
    nvml = capture_nvml(budget)
    state = "FAILED: %s" % nvml["problem"] if nvml.get("problem") else "NVML through ctypes on %s" % NVML_LIBRARY
    print("  %-15s          %s" % (NVML_FILE, state))
    early = gpu_facts_view({c.name: c.text for c in captured})
    by_nvml = {d.get("index"): d for d in nvml.get("devices") or []}
    devices = [
        {key: d.get(key) or by_nvml.get(d["index"], {}).get(key) for key in ("name", "memory_total_mib")}
        for d in early["devices"] or list(by_nvml.values())
    ]
    names = [d["name"] for d in devices]
    folder = out or new_folder(FIXTURES, fixture_name(names, [d["memory_total_mib"] for d in devices]))
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    machine = "%dx %s, driver %s" % (
        len(names),
        " + ".join(sorted({n or "?" for n in names})) or "no GPU",
        early["driver_version"] or nvml.get("driver_version"),
    )
    if folder.is_dir():
        folder.rmdir()  # an empty --out folder
    write_capture(folder, captured, nvml, machine, when)
    print("  written to %s" % _folder_text(folder))
    # From here on: the files as written, as the lab's stand-in replays them to gpu_facts.
    result = analyse(read_folder(folder), nvml, captured, sysfs_root="/sys")
    write_source(folder, machine, when, captured, result.facts, result.health)
    status = report(result, started)
    shown = _folder_text(folder)
    print("  fixture: %s" % folder.resolve())
    print("  to add it to gpufleet: fill in the Source line of %s/SOURCE.md (and look at the serials), then" % shown)
    print("    here:           tar czf /tmp/%s.tgz -C %s %s" % (folder.name, folder.resolve().parent, folder.name))
    print(
        "    in a checkout:  tar xzf %s.tgz -C tests/fixtures/nvidia_smi && git add tests/fixtures/nvidia_smi/%s"
        % (folder.name, folder.name)
    )
    print("    and give its expected values to tests/unit/test_nvidia_smi_parsers.py (TOPO, SUMMARY, DECISIONS)")
    print("  check it again anywhere: python3 tools/gpu-check.py --from %s" % shown)
    return status


def check_folder(folder: Path, started: float) -> int:
    """--from: the analysis and the checks of a folder captured before (no sysfs: not this host's)."""
    if not folder.is_dir():
        print("gpu-check: --from %s is not a folder" % folder, file=sys.stderr)
        return EXIT_MISSING
    print("gpufleet gpu-check: analysing %s" % _folder_text(folder))
    texts = read_folder(folder)
    try:
        nvml = json.loads(texts[NVML_FILE]) if texts.get(NVML_FILE) else None
    except ValueError as exc:
        print("gpu-check: %s/%s is not JSON (%s)" % (folder, NVML_FILE, exc), file=sys.stderr)
        return EXIT_MISSING
    return report(analyse(texts, nvml), started)


def report(result: Analysis, started: float) -> int:
    """Print gpu_facts' answer, the checks and the summary; the exit status."""
    print("== what gpu_facts reports (gpufleet's parsers on the captured files)")
    for line in facts_lines(result.facts):
        print("  " + line)
    for check in result.parsed:
        print("  " + check.line())
    print("== health (per GPU from %s)" % result.source)
    for check in result.health:
        print("  " + check.line())
    fails = [c for c in result.health if c.level == FAIL]
    warns = [c for c in result.health + result.parsed if c.level == WARN]
    facts = result.facts
    print("== summary")
    print(
        "  %d GPU(s): %s; driver %s; %s (%d FAIL, %d WARN); %.0f s"
        % (
            facts["count"],
            ", ".join(sorted({d["name"] or "?" for d in facts["devices"]})) or "none",
            facts["driver_version"],
            "UNHEALTHY" if fails else "healthy",
            len(fails),
            len(warns),
            time.monotonic() - started,
        )
    )
    return EXIT_UNHEALTHY if fails else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
