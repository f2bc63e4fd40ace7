#!/usr/bin/python
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU, topology and NCCL peer-to-peer facts
version_added: "0.1.0"
description:
  - Reads the host's NVIDIA GPUs, their PCIe/NVLink topology and NUMA placement into
    C(ansible_facts.gpufleet_gpu), and decides whether NCCL peer-to-peer should stay
    enabled on this host, with the reason.
  - Sources are C(nvidia-smi --query-gpu=... --format=csv), plain C(nvidia-smi) (driver
    and CUDA version), C(nvidia-smi topo -m), C(nvidia-smi topo -p2p r) and sysfs
    (C(/sys/bus/pci/devices/<bus id>/numa_node) and C(local_cpulist),
    C(/sys/class/infiniband)). Anything missing degrades to null, never to an error.
  - A host with no NVIDIA GPU, no C(nvidia-smi) or no loaded driver returns C(count=0)
    and no error; C(problem) says why. Later layers decide whether that is fatal.
  - Read-only; runs the same in check mode.
author:
  - gpufleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.actiongroups
  - ansible.builtin.action_common_attributes.facts
options:
  nvidia_smi_path:
    description:
      - Path of C(nvidia-smi). Default is the one found on C(PATH) (and
        C(/usr/bin), C(/usr/local/nvidia/bin)).
    type: path
  sysfs_root:
    description:
      - Root of the sysfs tree to read NUMA and RDMA data from. Only changed for
        tests or chroots.
    type: path
    default: /sys
  timeout:
    description:
      - Seconds each C(nvidia-smi) call may take before it is stopped (with coreutils
        C(timeout), when the host has it). A hung driver then gives facts with a
        C(problem) instead of a hung play. After the first call that had to be
        stopped the module makes no other, so it returns within O(timeout) + 5 s.
        V(0) waits as long as it takes.
    type: int
    default: 30
attributes:
  action_group:
    support: full
    membership:
      - gpufleet.serving.gpufleet
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - The P2P decision puts the driver's own answer (C(topo -p2p r)) first, then the
    link types; see RETURN C(p2p) and the nccl role, which turns it into
    C(NCCL_P2P_DISABLE).
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpufleet.serving.gpu_facts:

- name: Show the NCCL P2P decision
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpufleet_gpu.p2p.reason }}"

- name: Use an nvidia-smi outside PATH
  gpufleet.serving.gpu_facts:
    nvidia_smi_path: /usr/local/nvidia/bin/nvidia-smi
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    gpufleet_gpu:
      description: The host's NVIDIA GPUs and topology.
      returned: always
      type: dict
      contains:
        driver_version:
          description: Driver version as nvidia-smi reports it, or null.
          type: str
          sample: "550.54.14"
        cuda_version:
          description: Highest CUDA version the driver supports (nvidia-smi banner), or null.
          type: str
          sample: "12.4"
        count:
          description: Number of GPUs found.
          type: int
          sample: 2
        devices:
          description: One entry per GPU, ordered by index.
          type: list
          elements: dict
          sample:
            - index: 0
              name: NVIDIA GeForce RTX 4090
              uuid: GPU-6f2a...
              memory_total_mib: 24564
              pci_bus_id: "00000000:01:00.0"
              numa_node: 0
              numa_source: sysfs
              cpus: "0-15"
        links:
          description: Link type between GPU i and GPU j from C(nvidia-smi topo -m), keyed "i,j" (both orders).
          type: dict
          sample: {"0,1": "PHB", "1,0": "PHB"}
        p2p:
          description: Whether NCCL peer-to-peer should stay enabled, why, and from which source.
          type: dict
          sample:
            recommended: false
            source: driver
            reason: "the driver refuses peer-to-peer for 1 of 1 GPU pairs (GPU0-GPU1: GNS ...)"
            status: {"0,1": "GNS", "1,0": "GNS"}
        rdma_devices:
          description: InfiniBand/RoCE devices (sysfs, else the NICs of C(topo -m)).
          type: list
          elements: str
          sample: ["mlx5_0"]
        rdma_source:
          description: Where rdma_devices came from (sysfs, topo) or null when unknown.
          type: str
        numa_nodes:
          description: The host's NUMA nodes and their CPU lists (sysfs); engines are pinned to them.
          type: list
          elements: dict
          sample: [{"node": 0, "cpus": "0-15,32-47"}, {"node": 1, "cpus": "16-31,48-63"}]
        pci_devices:
          description: >-
            NVIDIA display and 3D controllers on the PCI bus (sysfs), found with or without a
            driver: the driver role reads the GPU generation from their device ids.
          type: list
          elements: dict
          sample: [{"address": "0000:01:00.0", "device_id": "0x2684", "driver": "nvidia"}]
        problem:
          description: Why no GPU was found (no nvidia-smi, driver not loaded), or null.
          type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import (
    QUERY_GPU_FIELDS,
    build_facts,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._nvidia_smi import (
    parse_query_gpu_csv,
    parse_smi_summary,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._sysfs import (
    gpu_placement,
    numa_nodes,
    pci_gpus,
    rdma_devices,
)

_HUNG = "within %d s (a hung driver or GPU?)"


def _run(module, argv, limit=None):
    """One nvidia-smi call, killed after `limit` seconds (coreutils timeout: a hung driver
    must not hang the play). (stdout, None) or (None, [what it said])."""
    if limit:
        argv = [limit[0], "--kill-after=5", "%ds" % limit[1], *argv]
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    if limit and rc in (124, 137):
        return None, ["%s did not answer %s" % (argv[3], _HUNG % limit[1])]
    if rc != 0:
        return None, (err or out or "exit status %d" % rc).strip().splitlines()[-1:]
    return out, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi_path=dict(type="path"),
            sysfs_root=dict(type="path", default="/sys"),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    sysfs_root = module.params["sysfs_root"]
    smi = module.params["nvidia_smi_path"] or module.get_bin_path(
        "nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/nvidia/bin"]
    )
    rdma = rdma_devices(sysfs_root)

    if not smi or not os.access(smi, os.X_OK):
        problem = "nvidia-smi not found (%s)" % (module.params["nvidia_smi_path"] or "not on PATH")
        facts = build_facts(rdma_devices=rdma, problem=problem)
        facts["numa_nodes"] = numa_nodes(sysfs_root)
        facts["pci_devices"] = pci_gpus(sysfs_root)
        module.exit_json(changed=False, ansible_facts={"gpufleet_gpu": facts})

    timeout_bin = module.get_bin_path("timeout")
    limit = (timeout_bin, module.params["timeout"]) if timeout_bin and module.params["timeout"] > 0 else None
    # Four calls; after the first that had to be stopped the rest are skipped: a hung driver
    # answers none of them, and four waits were 4 x 30 s per host (issue 32). One wait, with
    # its kill grace, bounds the module at timeout + 5 s.
    calls = {
        "query": [smi, "--query-gpu=" + ",".join(QUERY_GPU_FIELDS), "--format=csv"],
        "summary": [smi],
        "topo": [smi, "topo", "-m"],
        "p2p": [smi, "topo", "-p2p", "r"],
    }
    out, err, hung = {}, {}, None
    for name, argv in calls.items():
        if hung:
            out[name], err[name] = None, hung
            continue
        out[name], err[name] = _run(module, argv, limit)
        if err[name] and limit and err[name][0].endswith(_HUNG % limit[1]):
            hung = err[name]
    query, summary, topo, p2p = out["query"], out["summary"], out["topo"], out["p2p"]
    query_err, summary_err, topo_err = err["query"], err["summary"], err["topo"]
    problem = None
    if query is None and summary is None and topo is None:
        # The driver is not loaded or the GPUs are gone: say what nvidia-smi said.
        problem = "nvidia-smi failed: %s" % " ".join(query_err or summary_err or topo_err or ["no output"])

    bus_ids = [row.get("pci.bus_id") for row in parse_query_gpu_csv(query or "", fields=QUERY_GPU_FIELDS)]
    bus_ids += [d["pci_bus_id"] for d in parse_smi_summary(summary or "")["devices"]]
    sysfs = gpu_placement(sysfs_root, bus_ids)
    facts = build_facts(
        query_csv=query, summary=summary, topo=topo, p2p=p2p, sysfs=sysfs, rdma_devices=rdma, problem=problem
    )
    facts["numa_nodes"] = numa_nodes(sysfs_root)
    facts["pci_devices"] = pci_gpus(sysfs_root)
    module.exit_json(changed=False, ansible_facts={"gpufleet_gpu": facts})


if __name__ == "__main__":
    main()
