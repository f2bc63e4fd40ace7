# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where an engine's processes may run, read back from the kernel (not from gpufleet's plan):
the container's cpuset cgroup (its effective CPUs and memory nodes) and its main process's
allowed lists. Used by the engine_placement module (gpufleet status).

cgroup v1 (a `cpuset` line in /proc/PID/cgroup): /sys/fs/cgroup/cpuset/PATH/cpuset.effective_cpus
and cpuset.effective_mems. cgroup v2 (only the `0::PATH` line): /sys/fs/cgroup/PATH/
cpuset.cpus.effective and cpuset.mems.effective (the kernel's cgroup-v1/cpusets.rst and
cgroup-v2.rst name these files)."""

from __future__ import annotations

import json
import os

from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE


def parse_proc_cgroup(text: str) -> dict:
    """/proc/PID/cgroup as {controller: path}; the v2 line ("0::PATH") under "" (its empty
    controller list). Comment lines (fixtures) are skipped."""
    out = {}
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            out[controller] = parts[2]
    return out


def cpuset_files(text: str, cgroup_root: str = "/sys/fs/cgroup") -> dict:
    """Which files hold the effective cpuset of the process whose /proc/PID/cgroup is `text`:
    {version (1 or 2), path (the cgroup, as /proc shows it), cpus, mems (file paths)}; None when
    the text names no cgroup."""
    groups = parse_proc_cgroup(text)
    if "cpuset" in groups:
        where = os.path.join(cgroup_root, "cpuset", groups["cpuset"].lstrip("/"))
        return {
            "version": 1,
            "path": groups["cpuset"],
            "cpus": os.path.join(where, "cpuset.effective_cpus"),
            "mems": os.path.join(where, "cpuset.effective_mems"),
        }
    if "" in groups:
        where = os.path.join(cgroup_root, groups[""].lstrip("/"))
        return {
            "version": 2,
            "path": groups[""],
            "cpus": os.path.join(where, "cpuset.cpus.effective"),
            "mems": os.path.join(where, "cpuset.mems.effective"),
        }
    return None


def allowed_lists(status_text: str) -> dict:
    """Cpus_allowed_list and Mems_allowed_list of /proc/PID/status: {cpus, mems} (None if absent)."""
    found = {}
    for line in (status_text or "").splitlines():
        key, _sep, value = line.partition(":")
        if key in ("Cpus_allowed_list", "Mems_allowed_list"):
            found["cpus" if key.startswith("Cpus") else "mems"] = value.strip()
    return {"cpus": found.get("cpus"), "mems": found.get("mems")}


def cpu_set(text):
    """'0-3,8' -> {0, 1, 2, 3, 8}; None for None or text that is not a list."""
    if text is None:
        return None
    out = set()
    try:
        for part in str(text).strip().split(","):
            part = part.strip()
            if not part:
                continue
            lo, _sep, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return out


def node_cpu_sets(nodes) -> dict:
    """{node: its CPUs as a set} of gpu_facts' numa_nodes ([{node, cpus}]); nodes without a
    readable list are left out."""
    out = {}
    for node in nodes if isinstance(nodes, list) else []:
        listed = cpu_set(node.get("cpus")) if isinstance(node, dict) else None
        if listed and isinstance(node.get("node"), int) and not isinstance(node.get("node"), bool):
            out[node["node"]] = listed
    return out


def cpu_list(ids) -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8' (the kernel's own list format)."""
    ids = sorted(ids or [])
    runs = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in runs)


def same(planned, effective):
    """True when a planned list and an effective one name the same CPUs (or nodes); None when
    either is unknown (nothing planned: no pinning; or nothing read)."""
    a, b = cpu_set(planned), cpu_set(effective)
    if a is None or b is None:
        return None
    return a == b


def read(pid, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> dict:
    """The placement of process `pid` as the kernel holds it: {pid, cgroup_version, cgroup, cpus,
    mems (the cgroup's effective sets), process_cpus, process_mems (its allowed lists),
    problem (None, or what could not be read)}."""
    out = {"pid": pid, "cgroup_version": None, "cgroup": None, "cpus": None, "mems": None,
           "process_cpus": None, "process_mems": None, "problem": None}  # fmt: skip
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "status")) as f:
            lists = allowed_lists(f.read())
        with open(os.path.join(base, "cgroup")) as f:
            files = cpuset_files(f.read(), cgroup_root)
    except OSError as exc:
        out["problem"] = "cannot read %s: %s" % (base, exc.strerror or exc)
        return out
    out["process_cpus"], out["process_mems"] = lists["cpus"], lists["mems"]
    if files is None:
        out["problem"] = "%s/cgroup names no cgroup" % base
        return out
    out["cgroup_version"], out["cgroup"] = files["version"], files["path"]
    for key in ("cpus", "mems"):
        try:
            with open(files[key]) as f:
                out[key] = f.read().strip()
        except OSError as exc:
            out["problem"] = "cannot read %s: %s" % (files[key], exc.strerror or exc)
    return out


# ------------------------------------------------------------------ systemd slices (engine_cgroup_slices)


def slices_setting(setting, host=None) -> dict:
    """engine_cgroup_slices as this host runs it: {on, why, error}. true and false are the
    operator's (Ansible's boolean spellings: yes, on, 1, ...); auto is on where Docker uses the
    systemd cgroup driver, so it never costs a dockerd restart: the driver this run sets
    (container_runtime_cgroup_driver), else the one Docker reports, else (no Docker running yet)
    Docker's own default, systemd on a cgroup v2 host that boots with systemd and cgroupfs on v1
    (moby/moby#40846, Docker 20.10). error: a sentence when the setting is none of these, or is
    true where Docker will not use the systemd driver (it would refuse --cgroup-parent X.slice).
    host: name, docker_cgroup_driver ("" when Docker does not answer), cgroup_unified
    (/sys/fs/cgroup is v2), runtime_cgroup_driver."""
    host = host or {}
    name = host.get("name") or "this host"
    ours = host.get("runtime_cgroup_driver") or ""
    reported = host.get("docker_cgroup_driver") or ""
    word = setting.strip().lower() if isinstance(setting, str) else setting
    if word == "auto":
        if ours:
            driver, source = ours, "container_runtime_cgroup_driver sets"
        elif reported:
            driver, source = reported, "Docker reports"
        else:
            driver = "systemd" if host.get("cgroup_unified") else "cgroupfs"
            source = "Docker is not running yet; its default on a cgroup %s host is" % (
                "v2" if host.get("cgroup_unified") else "v1"
            )
        why = "engine_cgroup_slices is auto, and on %s %s the %s cgroup driver" % (name, source, driver)
        return {"on": driver == "systemd", "why": why, "error": None}
    plain = isinstance(word, (str, int))  # bool is an int; a list or a mapping is neither
    if plain and word in BOOLEANS_FALSE:
        return {"on": False, "why": "engine_cgroup_slices is false", "error": None}
    if not plain or word not in BOOLEANS_TRUE:
        return {
            "on": False,
            "why": "engine_cgroup_slices is not valid",
            "error": "engine_cgroup_slices=%r must be true, false or auto (the default: on where Docker uses the "
            "systemd cgroup driver)." % (setting,),
        }
    error = None
    if (ours or reported) != "systemd":
        error = (
            "engine_cgroup_slices is true, but Docker on %s uses the %s cgroup driver and "
            "container_runtime_cgroup_driver=%s. Set container_runtime_cgroup_driver: systemd for this host (the "
            "container_runtime role then restarts dockerd, which stops every container on it once), or set "
            "engine_cgroup_slices: auto (on only where Docker already uses systemd) or false."
            % (name, reported or "unknown (no Docker yet)", json.dumps(ours))
        )
    return {"on": True, "why": "engine_cgroup_slices is true", "error": error}


def slice_name(name: str, copy: bool = False) -> str:
    """The slice of instance `name` (copy: of its surge copy, a sibling, not a child: the copy may
    run on other GPUs, hence another node). The name is escaped as systemd-escape does: a dash
    in a slice name is a level of nesting, so unescaped, instance `llama-70b` would be a child of
    instance `llama`'s slice and held to its CPUs. Instance names are [a-z0-9-]."""
    return "gpufleet-%s-%s.slice" % ("surge" if copy else "engine", name.replace("-", "\\x2d"))


# The instance keys that become the slice's resource settings (engine_cgroup_slices), in the
# slice file's order: systemd's own names. On cgroup v1 systemd maps CPUWeight to cpu.shares and
# MemoryMax to memory.limit_in_bytes (both held, see docs/notes/numa-slices-findings.md F1); it
# has no v1 form of MemoryLow, and IOWeight reaches v1's blkio only where the blkio hierarchy
# follows the slice.
SLICE_RESOURCES = (
    ("cpu_weight", "CPUWeight"),
    ("io_weight", "IOWeight"),
    ("memory_low", "MemoryLow"),
    ("memory_max", "MemoryMax"),
)


def slice_unit(name: str, cpus, mems, copy: bool = False, resources=None) -> str:
    """The slice file: the placement the plan gives the instance (or its surge copy), and the
    resource settings the instance asks for (SLICE_RESOURCES keys of `resources`)."""
    what = "the surge copy of engine instance %s" % name if copy else "engine instance %s" % name
    lines = [
        "# gpufleet: where %s runs (its container and its unit's docker client)." % what,
        "# systemd enforces AllowedCPUs/AllowedMemoryNodes on cgroup v2. On cgroup v1 it cannot hold a",
        "# cpuset: the container's own --cpuset-cpus/--cpuset-mems (the same sets) enforce them there.",
        "[Unit]",
        "Description=gpufleet %s" % what,
        "",
        "[Slice]",
    ]
    if cpus:
        lines.append("AllowedCPUs=%s" % cpus)
    if mems:
        lines.append("AllowedMemoryNodes=%s" % mems)
    if not cpus and not mems:
        lines.append("# no pinning: the plan found no NUMA placement for it")
    for key, setting in SLICE_RESOURCES:
        value = (resources or {}).get(key)
        if value is not None:
            lines.append("%s=%s" % (setting, value))
    return "\n".join(lines) + "\n"


def housekeeping_dropin(cpus) -> str:
    """The drop-in that keeps one of the host's own services (nginx, the exporters, the
    watchdog) on the housekeeping CPUs, off the engines' (engine_housekeeping_cpus).
    CPUAffinity= is set when the service starts, on cgroup v1 and v2; AllowedCPUs= is the
    cgroup v2 cpuset, which systemd holds for every process of the service."""
    return (
        "\n".join(
            [
                "# gpufleet: this service runs on the host's housekeeping CPUs, off the engines'",
                "# (engine_housekeeping_cpus)",
                "[Service]",
                "CPUAffinity=%s" % cpus,
                "AllowedCPUs=%s" % cpus,
            ]
        )
        + "\n"
    )
