# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts assembly and the NCCL peer-to-peer decision (private to gpufleet.serving).

One implementation, used by the gpu_facts module and the CLI: the module only runs the
commands and reads sysfs, then hands the texts to ``build_facts``.

The P2P decision (``decide_p2p``), in order:
1. The driver's own answer: ``nvidia-smi topo -p2p r`` gives a status per GPU pair. If
   every pair is OK, P2P stays on. If any pair is CNS / GNS / TNS / NS, P2P is disabled
   for the host: GeForce cards report GNS on stock drivers (peer access is not supported
   on them), and NCCL over a path the driver refuses either falls back or, on consumer
   boards with older drivers, hangs (vLLM troubleshooting guide, "NCCL hangs with
   consumer GPUs": set NCCL_P2P_DISABLE=1).
2. Without the driver's answer, the links of ``nvidia-smi topo -m``: NVLink (NV<n>) or a
   shared PCIe switch (PIX / PXB) between every pair keeps P2P; a pair of GeForce/TITAN
   cards meeting only through the CPU's host bridge or the inter-socket link (PHB / NODE /
   SYS) disables it; data-centre and workstation cards over those paths keep it and
   NCCL's own topology search decides per path (NCCL_P2P_LEVEL).
3. Nothing known (no topology, fewer than two GPUs): P2P stays at NCCL's default.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.serving.plugins.module_utils._nvidia_smi import (
    LINK_MEANING,
    P2P_MEANING,
    parse_query_gpu_csv,
    parse_smi_summary,
    parse_topo_matrix,
    parse_topo_p2p,
    sysfs_pci_address,
)

# The fields gpu_facts asks --query-gpu for. The CSV parser maps columns by header, so a
# capture with another field list (a fixture) parses too.
QUERY_GPU_FIELDS = ("index", "name", "uuid", "memory.total", "pci.bus_id", "driver_version")

CONSUMER_NAME = re.compile(r"GeForce|TITAN", re.IGNORECASE)


def link_class(code):
    """'nvlink' | 'switch' | 'host' | 'self' | None for a `topo -m` link code."""
    if code is None:
        return None
    code = code.strip().upper()
    if code == "X":
        return "self"
    if re.match(r"^NV\d+$", code):
        return "nvlink"
    if code in ("PIX", "PXB"):
        return "switch"
    if code in ("PHB", "NODE", "SYS", "SOC"):
        return "host"
    return None


def describe_link(code):
    if code is None:
        return "an unknown path"
    if re.match(r"^NV\d+$", code):
        return "%s (%s NVLinks)" % (code, code[2:])
    return "%s (%s)" % (code, LINK_MEANING.get(code, "unknown link"))


def _gpu_label(devices_by_index, i):
    name = (devices_by_index.get(i) or {}).get("name")
    return "GPU%d (%s)" % (i, name) if name else "GPU%d" % i


def _pairs(indices):
    indices = sorted(indices)
    return [(a, b) for n, a in enumerate(indices) for b in indices[n + 1 :]]


def decide_p2p(devices, links, p2p_status):
    """Decide whether NCCL peer-to-peer should stay enabled.

    devices: list of device dicts (index, name); links: {"i,j": code};
    p2p_status: {"i,j": status} or None. Returns {recommended, reason, source}.
    """
    by_index = {d["index"]: d for d in devices}
    indices = sorted(by_index)
    if len(indices) < 2:
        return {
            "recommended": True,
            "source": "count",
            "reason": "%s: no GPU pair on this host, so no peer-to-peer traffic; NCCL P2P left at its default."
            % ("one GPU" if indices else "no NVIDIA GPU found"),
        }
    pairs = _pairs(indices)

    def pair_status(a, b):
        if not p2p_status:
            return None
        return p2p_status.get("%d,%d" % (a, b)) or p2p_status.get("%d,%d" % (b, a))

    statuses = {p: pair_status(*p) for p in pairs}
    if p2p_status and all(s is not None for s in statuses.values()):
        refused = [(p, s) for p, s in statuses.items() if s.upper() != "OK"]
        if not refused:
            return {
                "recommended": True,
                "source": "driver",
                "reason": "nvidia-smi topo -p2p r reports P2P read OK for all %d GPU pairs (%s); "
                "NCCL P2P stays enabled." % (len(pairs), _link_summary(pairs, links)),
            }
        shown = "; ".join(
            "%s-%s: %s (%s) over %s"
            % (
                _gpu_label(by_index, a),
                _gpu_label(by_index, b),
                s,
                P2P_MEANING.get(s.upper(), "unknown status"),
                describe_link(links.get("%d,%d" % (a, b))),
            )
            for (a, b), s in refused[:4]
        )
        more = "" if len(refused) <= 4 else " and %d more pairs" % (len(refused) - 4)
        return {
            "recommended": False,
            "source": "driver",
            "reason": "the driver refuses peer-to-peer for %d of %d GPU pairs (%s%s): NCCL_P2P_DISABLE=1 so NCCL "
            "uses shared memory instead of a P2P path that hangs or fails." % (len(refused), len(pairs), shown, more),
        }

    codes = {p: links.get("%d,%d" % p) or links.get("%d,%d" % (p[1], p[0])) for p in pairs}
    if not any(codes.values()):
        return {
            "recommended": True,
            "source": "none",
            "reason": "no GPU topology available (nvidia-smi topo printed nothing usable); "
            "NCCL P2P left at its default.",
        }
    consumer = {i for i, d in by_index.items() if CONSUMER_NAME.search(d.get("name") or "")}
    host_pairs = [p for p in pairs if link_class(codes[p]) == "host"]
    consumer_host = [p for p in host_pairs if p[0] in consumer and p[1] in consumer]
    if consumer_host:
        shown = "; ".join(
            "%s-%s over %s" % (_gpu_label(by_index, a), _gpu_label(by_index, b), describe_link(codes[(a, b)]))
            for a, b in consumer_host[:4]
        )
        more = "" if len(consumer_host) <= 4 else " and %d more pairs" % (len(consumer_host) - 4)
        return {
            "recommended": False,
            "source": "topology",
            "reason": "consumer GPUs meet only through the CPU (%s%s) and the driver's P2P status is not available: "
            "NCCL_P2P_DISABLE=1, as P2P between GeForce cards over the host bridge hangs NCCL." % (shown, more),
        }
    if not host_pairs:
        return {
            "recommended": True,
            "source": "topology",
            "reason": "every GPU pair is joined by NVLink or a shared PCIe switch (%s); NCCL P2P stays enabled."
            % _link_summary(pairs, links),
        }
    unknown_names = [i for i in indices if not by_index[i].get("name")]
    return {
        "recommended": True,
        "source": "topology",
        "reason": "%d of %d GPU pairs cross the CPU (%s) but %s; NCCL P2P stays enabled and NCCL's own topology "
        "search picks the path per pair."
        % (
            len(host_pairs),
            len(pairs),
            _link_summary(host_pairs, links),
            "the GPU models are unknown" if unknown_names else "none of them is a consumer (GeForce/TITAN) pair",
        ),
    }


def _link_summary(pairs, links):
    seen = {}
    for a, b in pairs:
        code = links.get("%d,%d" % (a, b)) or links.get("%d,%d" % (b, a)) or "?"
        seen.setdefault(code, []).append("%d-%d" % (a, b))
    parts = []
    for code, where in sorted(seen.items()):
        shown = ", ".join(where[:3]) + (", ..." if len(where) > 3 else "")
        parts.append("%s: GPU %s" % (code, shown))
    return "; ".join(parts)


def build_facts(query_csv=None, summary=None, topo=None, p2p=None, sysfs=None, rdma_devices=None, problem=None):
    """Assemble ansible_facts.gpufleet_gpu from command outputs (None = not available).

    sysfs: {pci_address: {"numa_node": int|None, "cpus": str|None}} read by the module.
    rdma_devices: names under /sys/class/infiniband, or None when that was not readable.
    """
    rows = parse_query_gpu_csv(query_csv, fields=QUERY_GPU_FIELDS) if query_csv else []
    table = parse_smi_summary(summary) if summary else {"driver_version": None, "cuda_version": None, "devices": []}
    matrix = (
        parse_topo_matrix(topo)
        if topo
        else {"gpus": [], "links": {}, "nics": [], "cpu_affinity": {}, "numa_affinity": {}}
    )
    p2p_status = parse_topo_p2p(p2p) if p2p else {}
    sysfs = sysfs or {}

    devices = {}
    for i in matrix["gpus"]:
        devices[i] = {"index": i}
    for d in table["devices"]:
        devices.setdefault(d["index"], {"index": d["index"]}).update({k: v for k, v in d.items() if v is not None})
    driver_version = None
    for row in rows:
        i = _to_int(row.get("index"))
        if i is None:
            continue
        entry = devices.setdefault(i, {"index": i})
        for src, dst in (("name", "name"), ("uuid", "uuid"), ("pci.bus_id", "pci_bus_id")):
            if row.get(src):
                entry[dst] = row[src]
        mem = _to_int(row.get("memory.total"))
        if mem is not None:
            entry["memory_total_mib"] = mem
        driver_version = driver_version or row.get("driver_version")

    result_devices = []
    for i in sorted(devices):
        d = devices[i]
        local = sysfs.get(sysfs_pci_address(d.get("pci_bus_id")) or "", {})
        numa = local.get("numa_node")
        cpus = local.get("cpus")
        numa_source = "sysfs" if numa is not None else None
        if numa is None:
            numa = matrix["numa_affinity"].get(i)
            numa_source = "topo" if numa is not None else None
        if cpus is None:
            cpus = matrix["cpu_affinity"].get(i)
        result_devices.append(
            {
                "index": i,
                "name": d.get("name"),
                "uuid": d.get("uuid"),
                "memory_total_mib": d.get("memory_total_mib"),
                "pci_bus_id": d.get("pci_bus_id"),
                "numa_node": numa,
                "numa_source": numa_source,
                "cpus": cpus,
            }
        )
    links = {k: v for k, v in matrix["links"].items() if _pair_in(k, devices)}
    p2p_status = {k: v for k, v in p2p_status.items() if _pair_in(k, devices)}
    if rdma_devices is None:
        rdma = sorted(n for n in matrix["nics"] if n.startswith(("mlx", "bnxt_re", "irdma", "efa", "rdma")))
        rdma_source = "topo" if matrix["nics"] else None
    else:
        rdma, rdma_source = sorted(rdma_devices), "sysfs"
    return {
        "driver_version": driver_version or table["driver_version"],
        "cuda_version": table["cuda_version"],
        "count": len(result_devices),
        "devices": result_devices,
        "links": links,
        "p2p": dict(decide_p2p(result_devices, links, p2p_status), status=p2p_status or None),
        "rdma_devices": rdma,
        "rdma_source": rdma_source,
        "problem": problem,
    }


def _to_int(value):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _pair_in(key, devices):
    a, b = (int(x) for x in key.split(","))
    return a in devices and b in devices


def facts_lines(facts):
    """gpu_facts' answer (build_facts' dict), as a person reads it: `gpufleet gpu show` and
    tools/gpu-check.py print it."""
    lines = [
        "driver %s, CUDA %s, %d GPU(s)%s"
        % (
            facts["driver_version"],
            facts["cuda_version"],
            facts["count"],
            "; problem: %s" % facts["problem"] if facts.get("problem") else "",
        )
    ]
    for d in facts["devices"]:
        lines.append(
            "  GPU%-2d %-28s %7s MiB  bus %-16s NUMA %s%s  CPUs %s"
            % (
                d["index"],
                d["name"] or "?",
                d["memory_total_mib"] if d["memory_total_mib"] is not None else "?",
                d["pci_bus_id"] or "?",
                d["numa_node"] if d["numa_node"] is not None else "?",
                " (%s)" % d["numa_source"] if d.get("numa_source") else "",
                d["cpus"] or "?",
            )
        )
    pairs = sorted({tuple(sorted(int(i) for i in key.split(","))) for key in facts["links"]})
    shown = [
        "%d-%d %s" % (a, b, facts["links"].get("%d,%d" % (a, b)) or facts["links"].get("%d,%d" % (b, a)))
        for a, b in pairs
    ]
    lines.append("links: %s" % (", ".join(shown) if shown else "none (fewer than two GPUs, or no topo -m)"))
    if facts.get("numa_nodes") is not None:
        nodes = ", ".join("node%d CPUs %s" % (n["node"], n["cpus"]) for n in facts["numa_nodes"])
        lines.append("host NUMA nodes: %s" % (nodes or "none in sysfs"))
    lines.append(
        "RDMA devices: %s (%s)" % (", ".join(facts["rdma_devices"]) or "none", facts["rdma_source"] or "unknown")
    )
    p2p = facts["p2p"]
    lines.append("NCCL P2P: %s (source: %s)" % ("keep enabled" if p2p["recommended"] else "DISABLE", p2p["source"]))
    lines.append("  " + p2p["reason"])
    return lines
