# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpu_facts reads from sysfs (private to gpufleet.serving): each GPU's NUMA node and local
CPUs by its PCI address, the host's NUMA nodes and their CPUs, the NVIDIA GPUs on the PCI bus,
and the RDMA devices. Imports nothing from Ansible: the gpu_facts module and tools/gpu-check.py
(a bare GPU machine, plain python3) share it.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.serving.plugins.module_utils._nvidia_smi import (
    parse_sysfs_cpulist,
    parse_sysfs_numa_node,
    sysfs_pci_address,
)


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def numa_nodes(sysfs_root):
    """The host's NUMA nodes and their CPUs (/sys/devices/system/node/nodeN/cpulist)."""
    base = os.path.join(sysfs_root, "devices", "system", "node")
    nodes = []
    for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if entry.startswith("node") and entry[4:].isdigit():
            cpus = parse_sysfs_cpulist(_read(os.path.join(base, entry, "cpulist")))
            if cpus:
                nodes.append({"node": int(entry[4:]), "cpus": cpus})
    return sorted(nodes, key=lambda n: n["node"])


def pci_gpus(sysfs_root):
    """NVIDIA GPUs on the PCI bus: vendor 0x10de, class 0x0300 (VGA) or 0x0302 (3D)."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    found = []
    for address in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        vendor = (_read(os.path.join(base, address, "vendor")) or "").strip().lower()
        klass = (_read(os.path.join(base, address, "class")) or "").strip().lower()
        if vendor != "0x10de" or not klass.startswith(("0x0300", "0x0302")):
            continue
        driver = os.path.join(base, address, "driver")
        found.append(
            {
                "address": address,
                "device_id": (_read(os.path.join(base, address, "device")) or "").strip().lower() or None,
                "driver": os.path.basename(os.path.realpath(driver)) if os.path.exists(driver) else None,
            }
        )
    return found


def rdma_devices(sysfs_root):
    """/sys/class/infiniband's devices; [] without any, None without a sysfs at all."""
    infiniband = os.path.join(sysfs_root, "class", "infiniband")
    if os.path.isdir(infiniband):
        return sorted(os.listdir(infiniband))
    return [] if os.path.isdir(sysfs_root) else None


def gpu_placement(sysfs_root, bus_ids):
    """{PCI address: {numa_node, cpus}} for each GPU bus id nvidia-smi named."""
    placement = {}
    for bus_id in bus_ids:
        address = sysfs_pci_address(bus_id)
        if not address or address in placement:
            continue
        device_dir = os.path.join(sysfs_root, "bus", "pci", "devices", address)
        placement[address] = {
            "numa_node": parse_sysfs_numa_node(_read(os.path.join(device_dir, "numa_node"))),
            "cpus": parse_sysfs_cpulist(_read(os.path.join(device_dir, "local_cpulist"))),
        }
    return placement
