# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's NCCL/CUDA environment: layers, validation and explanation (private).

Layers, later wins (debops style): role defaults (``nccl_env_defaults``) < the topology
decision from ``gpufleet_gpu`` facts < group (``nccl_env_group``) < host
(``nccl_env_host``). Every value is validated before anything is written, and every key
remembers the layer it came from so the rendered file can say so.

The file is read by systemd (``EnvironmentFile=``), by Docker (``--env-file``, which takes
values literally: no quotes, no expansion) and by shells; values are therefore limited to
characters that mean the same in all three.

Variable meanings and allowed values: NCCL's environment variable documentation
(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html) and the CUDA programming
guide (CUDA_DEVICE_ORDER).
"""

from __future__ import annotations

import re

KEY_PATTERN = re.compile(r"^(NCCL|CUDA|TORCH_NCCL)_[A-Z0-9_]+$")
# Characters that systemd, docker --env-file and sh all read the same way.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:/=^+@%-]*$")
BOOL01 = ("0", "1")
IFNAME_LIST = re.compile(r"^[=^]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")
DEBUG_SUBSYS = {
    "INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL", "PROXY",
    "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL",
}  # fmt: skip

# key -> (check(value) -> bool, what the key accepts)
RULES = {
    "NCCL_P2P_DISABLE": (lambda v: v in BOOL01, "0 (peer-to-peer allowed) or 1 (disabled)"),
    "NCCL_IB_DISABLE": (lambda v: v in BOOL01, "0 (use InfiniBand/RoCE) or 1 (sockets only)"),
    "NCCL_SHM_DISABLE": (lambda v: v in BOOL01, "0 or 1"),
    "NCCL_NVLS_ENABLE": (lambda v: v in BOOL01, "0 or 1"),
    "NCCL_CUMEM_ENABLE": (lambda v: v in BOOL01, "0 or 1"),
    "NCCL_NET_GDR_READ": (lambda v: v in BOOL01, "0 or 1"),
    "NCCL_DEBUG": (lambda v: v in ("VERSION", "WARN", "INFO", "TRACE"), "VERSION, WARN, INFO or TRACE"),
    "NCCL_DEBUG_SUBSYS": (
        lambda v: all(p.lstrip("^") in DEBUG_SUBSYS for p in v.split(",")),
        "a comma list of %s (a leading ^ excludes)" % ", ".join(sorted(DEBUG_SUBSYS)),
    ),
    "NCCL_P2P_LEVEL": (
        lambda v: v in ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS") or v.isdigit(),
        "LOC, NVL, PIX, PXB, PHB, SYS or a number",
    ),
    "NCCL_SOCKET_IFNAME": (
        lambda v: bool(IFNAME_LIST.fullmatch(v)),
        "interface names or prefixes, e.g. eth0 or ^docker,lo",
    ),
    "NCCL_IB_HCA": (lambda v: bool(IFNAME_LIST.fullmatch(v)), "HCA names, e.g. mlx5_0:1,mlx5_1:1 or ^mlx5_2"),
    "CUDA_DEVICE_ORDER": (lambda v: v in ("PCI_BUS_ID", "FASTEST_FIRST"), "PCI_BUS_ID or FASTEST_FIRST"),
}
# Keys a host-wide file must not set: they belong to each engine instance.
PER_INSTANCE = {
    "CUDA_VISIBLE_DEVICES": "set the instance's `gpus` in gpufleet_engines instead",
    "NCCL_COMM_ID": "it names one job's rendezvous, not a host setting",
}

LAYER_HELP = {
    "nccl_env_defaults": "role defaults (nccl_env_defaults)",
    "topology": "topology (gpu_facts)",
    "nccl_env_group": "group (nccl_env_group)",
    "nccl_env_host": "host (nccl_env_host)",
}


def _as_text(value):
    """YAML scalars to the text the file will hold; None for types we refuse."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return value
    return None


def validate_pair(layer, key, value):
    """Return an error sentence, or None when key=value is acceptable."""
    where = "%s%s" % (
        layer,
        " (host_vars)" if layer == "nccl_env_host" else " (group_vars)" if layer == "nccl_env_group" else "",
    )
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        return (
            "%s: key %r is not an NCCL/CUDA variable name (expected NCCL_*, CUDA_* or TORCH_NCCL_*, "
            "upper case). Fix or remove it in %s." % (layer, key, where)
        )
    if key in PER_INSTANCE:
        return "%s: %s must not be set host-wide: %s. Remove it from %s." % (layer, key, PER_INSTANCE[key], where)
    text = _as_text(value)
    if text is None:
        hint = " (write 0 or 1, not true/false)" if isinstance(value, bool) else ""
        return "%s: %s = %r is not a string or number%s. Fix it in %s." % (layer, key, value, hint, where)
    if not SAFE_VALUE.fullmatch(text):
        return (
            "%s: %s = %r contains characters that systemd, docker --env-file and sh read differently "
            "(spaces, quotes, $, ;, newlines). Fix it in %s." % (layer, key, text, where)
        )
    rule = RULES.get(key)
    if rule and not rule[0](text):
        return "%s: %s = %r is not valid; %s takes %s. Fix it in %s." % (layer, key, text, key, rule[1], where)
    return None


def topology_layer(gpu):
    """The topology decision as an env layer: (values, notes) from gpufleet_gpu facts."""
    values, notes = {}, {}
    if not gpu:
        return values, notes
    p2p = gpu.get("p2p") or {}
    if "recommended" in p2p:
        values["NCCL_P2P_DISABLE"] = "0" if p2p["recommended"] else "1"
        notes["NCCL_P2P_DISABLE"] = p2p.get("reason") or ""
    rdma = gpu.get("rdma_devices")
    if gpu.get("rdma_source") and rdma is not None:
        if rdma:
            values["NCCL_IB_DISABLE"] = "0"
            notes["NCCL_IB_DISABLE"] = "RDMA devices present: %s" % ", ".join(rdma)
            # the host's own HCAs by exact name ('=': NCCL otherwise matches prefixes, mlx5_1
            # would take mlx5_10 too); a layer above narrows them (to the GPU-local rails, say)
            values["NCCL_IB_HCA"] = "=" + ",".join(rdma)
            notes["NCCL_IB_HCA"] = "the InfiniBand/RoCE devices of this host (%s), by exact name" % gpu["rdma_source"]
        else:
            values["NCCL_IB_DISABLE"] = "1"
            notes["NCCL_IB_DISABLE"] = "no InfiniBand/RoCE device (%s): NCCL uses sockets" % gpu["rdma_source"]
    return values, notes


def plan_env(gpu=None, defaults=None, group=None, host=None, use_topology=True):
    """Merge and validate the layers. Returns {env, origin, notes, errors}."""
    errors = []
    layers = [("nccl_env_defaults", defaults or {}, {})]
    if use_topology:
        topo_values, topo_notes = topology_layer(gpu)
        layers.append(("topology", topo_values, topo_notes))
    layers += [("nccl_env_group", group or {}, {}), ("nccl_env_host", host or {}, {})]
    env, origin, notes = {}, {}, {}
    for name, values, layer_notes in layers:
        if not isinstance(values, dict):
            errors.append(
                "%s must be a mapping of NCCL_*/CUDA_* names to values, got %s." % (name, type(values).__name__)
            )
            continue
        for key in values:
            problem = validate_pair(name, key, values[key])
            if problem:
                errors.append(problem)
                continue
            env[key] = _as_text(values[key])
            origin[key] = LAYER_HELP[name]
            notes[key] = " ".join((layer_notes.get(key) or "").split())
    ordered = {k: env[k] for k in sorted(env)}
    return {"env": ordered, "origin": origin, "notes": notes, "errors": errors}
