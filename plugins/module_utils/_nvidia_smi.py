# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parsers for ``nvidia-smi`` output and sysfs PCI data (private to gpufleet.serving).

Every parser takes the text a command printed and returns plain data; nothing here runs a
command, so the parsers are tested on captured real output (tests/fixtures/nvidia_smi/).
Anything a parser cannot read degrades to ``None`` or an empty result, never to an
exception: a host whose ``nvidia-smi`` is old, partial or broken still gets facts.

Formats, as printed by the NVIDIA driver's ``nvidia-smi`` (R470 .. R580 seen in fixtures):
- ``nvidia-smi --query-gpu=FIELDS --format=csv``: CSV with a header naming each field,
  units in brackets (``memory.total [MiB]``) and values with units (``24564 MiB``);
  ``[N/A]`` / ``N/A`` for unknown values.
- ``nvidia-smi``: a banner with ``Driver Version: X  CUDA Version: Y`` and a table with one
  two-line block per GPU (index, name, persistence mode | bus id ... / memory use).
- ``nvidia-smi topo -m``: a matrix whose header names devices (GPU0.., NIC0.. or
  mlx5_0..) followed by ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID`` columns;
  link codes X, NV<n>, PIX, PXB, PHB, NODE, SYS (SOC on drivers before CUDA 10 meant SYS).
- ``nvidia-smi topo -p2p r``: the same matrix shape with P2P read status codes
  OK, CNS, GNS, TNS, NS, U (legend printed by nvidia-smi itself).
"""

from __future__ import annotations

import csv
import io
import re

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
GPU_NAME = re.compile(r"^GPU(\d+)$")
TOPO_EXTRA_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")

# Link codes of `nvidia-smi topo -m`, from the legend nvidia-smi prints under the matrix.
LINK_MEANING = {
    "X": "self",
    "SYS": "PCIe and the interconnect between NUMA nodes (QPI/UPI, Infinity Fabric)",
    "SOC": "PCIe and the interconnect between CPU sockets",
    "NODE": "PCIe and the interconnect between PCIe host bridges within one NUMA node",
    "PHB": "PCIe and a PCIe host bridge (typically the CPU)",
    "PXB": "multiple PCIe bridges, without the PCIe host bridge",
    "PIX": "at most a single PCIe bridge",
    "NV": "a bonded set of NVLinks",
}

# P2P status codes of `nvidia-smi topo -p2p r|w|n|a|p`, from nvidia-smi's own legend.
P2P_MEANING = {
    "X": "self",
    "OK": "OK",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
}


def strip_ansi(text):
    """Remove terminal escape sequences (newer nvidia-smi underlines the matrix header)."""
    return ANSI_ESCAPE.sub("", text or "")


def _int_or_none(value):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _na(value):
    """Normalise nvidia-smi's ways of saying 'unknown' to None."""
    if value is None:
        return None
    value = value.strip()
    if value in ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"):
        return None
    return value


# ---------------------------------------------------------------- --query-gpu CSV


def parse_query_gpu_csv(text, fields=None):
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Columns are mapped by their header (``memory.total [MiB]`` -> ``memory.total``), so
    any field list parses. Output printed with ``noheader`` needs ``fields``: the list
    that was passed to ``--query-gpu`` in order. Returns a list of dicts keyed by field
    name; numeric units are stripped (``24564 MiB`` -> ``24564``); unknown -> None.
    """
    # Line ends as nvidia-smi or a terminal left them (CRLF, a bare CR): csv refuses a bare CR
    # inside a row ("new-line character seen in unquoted field").
    text = strip_ansi(text).replace("\r\n", "\n").replace("\r", "\n")
    try:
        rows = [r for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
    except csv.Error:
        return []
    if not rows:
        return []
    header = [c.strip() for c in rows[0]]
    looks_like_header = any(re.match(r"^[a-z_]+(\.[a-z_]+)*( \[.*\])?$", h) for h in header) and not any(
        re.match(r"^\d+$", h) for h in header
    )
    if looks_like_header:
        keys = [re.sub(r"\s*\[.*\]$", "", h) for h in header]
        body = rows[1:]
    elif fields:
        keys = list(fields)
        body = rows
    else:
        return []
    result = []
    for row in body:
        cells = [c.strip() for c in row]
        if len(cells) != len(keys):
            continue
        entry = {}
        for key, cell in zip(keys, cells):
            value = _na(cell)
            if value is not None:
                value = re.sub(r"\s*(MiB|W|%|MHz|C)$", "", value)
            entry[key] = value
        result.append(entry)
    return result


# ---------------------------------------------------------------- plain `nvidia-smi`

_BANNER_DRIVER = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_BANNER_CUDA = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")
_TABLE_GPU_LINE = re.compile(
    r"^\|\s*(\d+)\s+(.*?)\s+(?:On|Off)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\b"
)
_TABLE_MEMORY = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")


def parse_smi_summary(text):
    """Parse the plain ``nvidia-smi`` table.

    Returns {driver_version, cuda_version, devices: [{index, name, pci_bus_id,
    memory_total_mib}]}. Names may be cut short by nvidia-smi's fixed column width; the
    --query-gpu CSV, when available, has the full name and wins.
    """
    text = strip_ansi(text)
    driver = _BANNER_DRIVER.search(text)
    cuda = _BANNER_CUDA.search(text)
    devices = []
    lines = text.splitlines()
    for n, line in enumerate(lines):
        m = _TABLE_GPU_LINE.match(line.strip())
        if not m:
            continue
        memory = None
        for follow in lines[n + 1 : n + 3]:
            mem = _TABLE_MEMORY.search(follow)
            if mem:
                memory = int(mem.group(2))
                break
        devices.append(
            {
                "index": int(m.group(1)),
                "name": m.group(2).strip(),
                "pci_bus_id": m.group(3),
                "memory_total_mib": memory,
            }
        )
    return {
        "driver_version": driver.group(1) if driver else None,
        "cuda_version": cuda.group(1) if cuda else None,
        "devices": devices,
    }


# ---------------------------------------------------------------- topo matrices


def _parse_matrix(text):
    """Shared reader for `topo -m` and `topo -p2p X`.

    Returns (columns, rows, extra_names) where columns are the device names of the header,
    rows maps a GPU index to (cells for each column, extra tokens after them).
    """
    lines = [strip_ansi(line).rstrip() for line in (text or "").splitlines()]
    header = None
    start = 0
    for n, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X"):
            header, start = line, n + 1
            break
    if header is None:
        return [], {}, []
    # Device columns are the header tokens before the first of the named extra columns.
    device_part = header
    extra_names = []
    cut = len(header)
    for name in TOPO_EXTRA_COLUMNS:
        pos = header.find(name)
        if pos != -1:
            cut = min(cut, pos)
            extra_names.append((pos, name))
    device_part = header[:cut]
    extra_names = [name for _pos, name in sorted(extra_names)]
    columns = device_part.split()
    rows = {}
    for line in lines[start:]:
        tokens = line.split()
        if not tokens:
            if rows:
                break
            continue
        m = GPU_NAME.match(tokens[0])
        if not m:
            if tokens[0].startswith("Legend"):
                break
            continue
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) < len(columns):
            continue
        rows[int(m.group(1))] = (cells, tokens[1 + len(columns) :])
    return columns, rows, extra_names


def parse_topo_matrix(text):
    """Parse ``nvidia-smi topo -m``.

    Returns {gpus: [index..], links: {"i,j": code} for i != j, nics: [names],
    cpu_affinity: {i: "0-15,32-47" | None}, numa_affinity: {i: int | None}}.
    NIC columns are reported by their real names where nvidia-smi prints a NIC legend
    (``NIC0: mlx5_0``), else by the column name.
    """
    text = strip_ansi(text)
    columns, rows, extra_names = _parse_matrix(text)
    gpu_cols = {}
    nic_cols = []
    for pos, col in enumerate(columns):
        m = GPU_NAME.match(col)
        if m:
            gpu_cols[pos] = int(m.group(1))
        else:
            nic_cols.append(col)
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, flags=re.MULTILINE))
    result = {
        "gpus": sorted(rows),
        "links": {},
        "nics": [legend.get(c, c) for c in nic_cols],
        "cpu_affinity": {},
        "numa_affinity": {},
    }
    for i, (cells, extra) in sorted(rows.items()):
        for pos, code in enumerate(cells):
            j = gpu_cols.get(pos)
            if j is None or j == i:
                continue
            result["links"]["%d,%d" % (i, j)] = code
        values = dict(zip(extra_names, extra))
        result["cpu_affinity"][i] = _na(values.get("CPU Affinity"))
        numa = _na(values.get("NUMA Affinity"))
        result["numa_affinity"][i] = _int_or_none(numa) if numa is not None else None
    return result


def parse_topo_p2p(text):
    """Parse ``nvidia-smi topo -p2p r`` (or w/n/a/p): {"i,j": status} for i != j."""
    columns, rows, _extra_names = _parse_matrix(strip_ansi(text))
    gpu_cols = {pos: int(GPU_NAME.match(c).group(1)) for pos, c in enumerate(columns) if GPU_NAME.match(c)}
    status = {}
    for i, (cells, _extra_tokens) in sorted(rows.items()):
        for pos, code in enumerate(cells):
            j = gpu_cols.get(pos)
            if j is None or j == i:
                continue
            status["%d,%d" % (i, j)] = code
    return status


# ---------------------------------------------------------------- sysfs


def sysfs_pci_address(bus_id):
    """nvidia-smi's ``00000000:01:00.0`` -> sysfs's ``0000:01:00.0`` (None if unparsable)."""
    m = re.match(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-9A-Fa-f])$", (bus_id or "").strip())
    if not m:
        return None
    domain = m.group(1)[-4:]
    return ("%s:%s:%s.%s" % (domain, m.group(2), m.group(3), m.group(4))).lower()


def parse_sysfs_numa_node(text):
    """sysfs ``numa_node``: -1 means the platform did not say (single node, or no ACPI SRAT)."""
    value = _int_or_none(text)
    if value is None or value < 0:
        return None
    return value


def parse_sysfs_cpulist(text):
    value = (text or "").strip()
    return value or None
