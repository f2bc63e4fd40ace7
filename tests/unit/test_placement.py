"""Placement read back from the kernel (gpufleet status's CPUS and MEMS), against the plan; and the
preflight's refusal of CPUs the host does not have.

The v1 fixture is a capture from this project's build machine (a container started with
--cpuset-cpus=1 --cpuset-mems=0, Docker's cgroupfs driver); the v2 one is written by hand in
the kernel's documented format and says so in its header (no cgroup v2 host here)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.filter.engine_status import engine_status
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import render
from ansible_collections.gpufleet.serving.plugins.module_utils._placement import (
    allowed_lists,
    cpu_list,
    cpu_set,
    cpuset_files,
    parse_proc_cgroup,
    read,
    same,
    slice_name,
    slices_setting,
)
from gpufleet.runner import status_rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"
V1_ID = "7e0331653a0ef3f0f4734f941d058cce1c502d424f2a25ea913af7ad68c0ff1d"


def _fixture(version, name):
    return (FIXTURES / version / name).read_text()


def _files(version):
    """NAME=VALUE lines of a fixture's cpuset-files."""
    lines = [line for line in _fixture(version, "cpuset-files").splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_the_captured_v1_cgroup_names_the_cpuset_hierarchy_and_its_effective_files():
    text = _fixture("v1-cgroupfs", "proc-pid-cgroup")
    groups = parse_proc_cgroup(text)
    assert groups["cpuset"] == groups["memory"] == groups[""] == "/docker/" + V1_ID
    assert groups["name=systemd"] == "/docker/" + V1_ID
    assert cpuset_files(text) == {
        "version": 1,
        "path": "/docker/" + V1_ID,
        "cpus": "/sys/fs/cgroup/cpuset/docker/%s/cpuset.effective_cpus" % V1_ID,
        "mems": "/sys/fs/cgroup/cpuset/docker/%s/cpuset.effective_mems" % V1_ID,
    }
    assert allowed_lists(_fixture("v1-cgroupfs", "proc-pid-status")) == {"cpus": "1", "mems": "0"}


def test_a_v2_cgroup_reads_the_unified_trees_effective_files():
    text = _fixture("v2-systemd", "proc-pid-cgroup")
    files = cpuset_files(text, "/sys/fs/cgroup")
    assert files["version"] == 2 and files["path"].startswith("/system.slice/docker-")
    assert files["cpus"] == "/sys/fs/cgroup%s/cpuset.cpus.effective" % files["path"]
    assert files["mems"] == "/sys/fs/cgroup%s/cpuset.mems.effective" % files["path"]
    assert cpuset_files("") is None and cpuset_files("# nothing\n") is None


@pytest.mark.parametrize("version", ["v1-cgroupfs", "v2-systemd"])
def test_read_follows_proc_to_the_cgroups_effective_sets(tmp_path, version):
    # the fixtures laid out as /proc/PID and /sys/fs/cgroup would hold them
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(_fixture(version, "proc-pid-cgroup"))
    status = _fixture("v1-cgroupfs", "proc-pid-status") if version.startswith("v1") else (
        "Cpus_allowed_list:\t16-31,48-63\nMems_allowed_list:\t1\n")  # fmt: skip
    (proc / "status").write_text(status)
    root = tmp_path / "cgroup"
    files = cpuset_files(_fixture(version, "proc-pid-cgroup"), str(root))
    values = _files(version)
    for key, name in (("cpus", "effective_cpus"), ("mems", "effective_mems")):
        Path(files[key]).parent.mkdir(parents=True, exist_ok=True)
        v2_name = "cpuset.%s.effective" % key
        Path(files[key]).write_text(values["cpuset." + name if version.startswith("v1") else v2_name] + "\n")
    got = read(4242, proc_root=str(tmp_path / "proc"), cgroup_root=str(root))
    want = {"1": ("1", "0"), "2": ("16-31,48-63", "1")}[str(files["version"])]
    assert (got["cpus"], got["mems"]) == want and (got["process_cpus"], got["process_mems"]) == want
    assert got["cgroup_version"] == files["version"] and got["problem"] is None
    # a process that is gone: said, not raised
    gone = read(999999, proc_root=str(tmp_path / "proc"), cgroup_root=str(root))
    assert gone["cpus"] is None and "cannot read" in gone["problem"]


def test_cpu_lists_compare_as_sets():
    assert cpu_set("0-3,8") == {0, 1, 2, 3, 8} and cpu_list({8, 0, 1, 2, 3}) == "0-3,8"
    assert cpu_list(cpu_set("16-31,48-63")) == "16-31,48-63" and cpu_list(set()) == ""
    assert same("0,1", "0-1") is True and same("0-1", "1") is False
    assert same(None, "0-1") is None and cpu_set("x-y") is None


def _placed_report(cpus_read):
    """A CPU instance pinned to CPU 1 by its plan, and the kernel's reading of its container."""
    inst = {"name": "tiny", "engine": "vllm", "accelerator": "cpu", "model": "/srv/models/tiny", "port": 8001,
            "cpus": "1"}  # fmt: skip
    host = {"numa_nodes": [{"node": 0, "cpus": "0-1"}]}
    deployed = render(inst, host=host)["deployed"]
    assert (deployed["cpuset_cpus"], deployed["cpuset_mems"]) == ("1", "0")
    reading = {"pid": 4242, "cgroup_version": 1, "cgroup": "/docker/x", "cpus": cpus_read, "mems": "0",
               "process_cpus": cpus_read, "process_mems": "0", "problem": None}  # fmt: skip
    return engine_status(
        [{"path": "/etc/gpufleet/engines/tiny"}],
        deployed=[{"content": base64.b64encode(json.dumps(deployed).encode()).decode()}],
        units=[{"status": {"ActiveState": "active"}}],
        placement={"tiny": reading},
    )


def test_status_shows_the_kernels_sets_and_marks_a_drift_from_the_plan():
    (tiny,) = _placed_report("1")["engines"]
    assert tiny["placement"]["matches"] is True and tiny["placement"]["drift"] == []
    assert tiny["placement"]["planned_cpus"] == "1" and tiny["placement"]["cpus"] == "1"
    rows = status_rows({"h": _placed_report("1")})
    assert rows[0][8:10] == ["CPUS", "MEMS"] and rows[1][8:10] == ["1", "0"]
    # someone widened the container's cpuset by hand (docker update --cpuset-cpus 0-1)
    drifted = _placed_report("0-1")
    assert drifted["engines"][0]["placement"]["matches"] is False
    assert drifted["engines"][0]["placement"]["drift"] == ["cpus"]
    assert status_rows({"h": drifted})[1][8:10] == ["0-1 (PLAN 1)", "0"]
    # a container that does not run: nothing read
    stopped = engine_status([{"path": "/etc/gpufleet/engines/tiny"}], placement={"tiny": {"pid": None}})
    assert stopped["engines"][0]["placement"] is None


def test_preflight_refuses_cpus_the_host_does_not_have():
    inst = {"name": "tiny", "engine": "vllm", "accelerator": "cpu", "model": "/srv/models/tiny", "port": 8001,
            "cpus": "1-5"}  # fmt: skip
    host = {"numa_nodes": [{"node": 0, "cpus": "0-1"}]}
    errors = plan([inst], host=host, models={"/srv/models/tiny": {"exists": True, "config": None}})["errors"]
    assert any(
        "gpufleet_engines[0] (tiny).cpus='1-5' names CPU 2-5, which this host does not have "
        "(its NUMA nodes hold CPUs 0-1)"
        in e
        and "Pick CPUs from that list" in e
        for e in errors
    ), errors
    # on the host's CPUs, or with the layout unknown: no such error
    for ok_host, cpus in ((host, "1"), ({}, "1-5")):
        errors = plan(
            [dict(inst, cpus=cpus)], host=ok_host, models={"/srv/models/tiny": {"exists": True, "config": None}}
        )["errors"]
        assert not [e for e in errors if ".cpus=" in e], errors


def test_slices_escape_names_and_hold_the_placement_of_the_instance_and_its_copy():
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_surge import surge

    # a dash in a slice name nests it: llama-70b's slice would sit under llama's and share its CPUs
    assert slice_name("llama-70b") == "gpufleet-engine-llama\\x2d70b.slice"
    assert slice_name("qwen", copy=True) == "gpufleet-surge-qwen.slice"
    inst = {"name": "tiny-b", "engine": "vllm", "accelerator": "cpu", "model": "/m", "port": 8002, "cpus": "1",
            "image": "vllm-cpu:1"}  # fmt: skip
    host = {"numa_nodes": [{"node": 0, "cpus": "0-1"}]}
    on = render(inst, host=host, defaults={"slices": True})
    args = on["docker_args"]
    assert args[args.index("--cgroup-parent") + 1] == "gpufleet-engine-tiny\\x2db.slice" == on["slice"]["name"]
    # the container's own cpuset stays (cgroup v1 cannot enforce a slice's)
    assert args[args.index("--cpuset-cpus") + 1] == "1" and args[args.index("--cpuset-mems") + 1] == "0"
    unit = on["slice"]["text"].splitlines()
    assert unit[unit.index("[Slice]") + 1 :] == ["AllowedCPUs=1", "AllowedMemoryNodes=0"]
    copy = surge(inst, [inst], None, host=host, defaults={"slices": True})
    assert copy["slice"]["name"] == "gpufleet-surge-tiny\\x2db.slice"
    assert copy["docker_args"][copy["docker_args"].index("--cgroup-parent") + 1] == copy["slice"]["name"]
    assert "AllowedCPUs=1" in copy["slice"]["text"].splitlines()
    # off (the default): no slice, no --cgroup-parent; the rest of the command line is the same
    off = render(inst, host=host, defaults={})
    assert off["slice"] is None and "--cgroup-parent" not in off["docker_args"]
    assert [a for a in args if a not in ("--cgroup-parent", on["slice"]["name"])] == off["docker_args"]
    assert surge(inst, [inst], None, host=host, defaults={})["slice"] is None
    # no placement known: the slice says so and sets nothing
    bare = render(dict(inst, cpus=None), host={}, defaults={"slices": True})
    assert "AllowedCPUs=" not in bare["slice"]["text"] and "no pinning" in bare["slice"]["text"]


@pytest.mark.parametrize(
    "setting, host, on, words",
    [
        # the operator's own answer (Ansible's boolean spellings: -e gives strings), whatever Docker runs
        (True, {"docker_cgroup_driver": "systemd"}, True, "engine_cgroup_slices is true"),
        ("yes", {"runtime_cgroup_driver": "systemd"}, True, "engine_cgroup_slices is true"),
        (False, {"docker_cgroup_driver": "systemd"}, False, "engine_cgroup_slices is false"),
        ("false", {"docker_cgroup_driver": "systemd", "cgroup_unified": True}, False, "engine_cgroup_slices is false"),
        (0, {}, False, "engine_cgroup_slices is false"),
        # auto: the driver this run sets wins over the one Docker reports
        ("auto", {"name": "gpu-a", "runtime_cgroup_driver": "systemd", "docker_cgroup_driver": "cgroupfs"}, True,
         "engine_cgroup_slices is auto, and on gpu-a container_runtime_cgroup_driver sets the systemd cgroup driver"),
        ("auto", {"name": "gpu-a", "runtime_cgroup_driver": "cgroupfs", "docker_cgroup_driver": "systemd"}, False,
         "container_runtime_cgroup_driver sets the cgroupfs cgroup driver"),
        # then what Docker reports, whatever the hierarchy
        ("Auto", {"name": "gpu-a", "docker_cgroup_driver": "systemd"}, True, "on gpu-a Docker reports the systemd"),
        ("auto", {"name": "gpu-a", "docker_cgroup_driver": "cgroupfs", "cgroup_unified": True}, False,
         "Docker reports the cgroupfs cgroup driver"),
        # no Docker yet: Docker's own default follows the hierarchy (moby/moby#40846)
        ("auto", {"name": "gpu-a", "docker_cgroup_driver": "", "cgroup_unified": True}, True,
         "Docker is not running yet; its default on a cgroup v2 host is the systemd cgroup driver"),
        ("auto", {"name": "gpu-a", "cgroup_unified": False}, False,
         "its default on a cgroup v1 host is the cgroupfs cgroup driver"),
    ],
)  # fmt: skip
def test_slices_auto_follows_the_driver_docker_uses_and_never_switches_it(setting, host, on, words):
    got = slices_setting(setting, host)
    assert got["on"] is on and words in got["why"] and got["error"] is None, got


@pytest.mark.parametrize(
    "setting, host, words",
    [
        # true where Docker will not run the systemd driver: Docker would refuse --cgroup-parent X.slice
        (True, {"name": "gpu-a", "docker_cgroup_driver": "cgroupfs"},
         'engine_cgroup_slices is true, but Docker on gpu-a uses the cgroupfs cgroup driver and '
         'container_runtime_cgroup_driver="". Set container_runtime_cgroup_driver: systemd for this host'),
        ("on", {"name": "gpu-a"}, "Docker on gpu-a uses the unknown (no Docker yet) cgroup driver"),
        # this run switches the driver away from systemd: what Docker reports now does not count
        (True, {"name": "gpu-a", "docker_cgroup_driver": "systemd", "runtime_cgroup_driver": "cgroupfs"},
         'container_runtime_cgroup_driver="cgroupfs"'),
        # none of true, false or auto
        ("automatic", {}, "engine_cgroup_slices='automatic' must be true, false or auto"),
        (2, {}, "engine_cgroup_slices=2 must be true, false or auto"),
        ({"on": True}, {}, "engine_cgroup_slices={'on': True} must be true, false or auto"),
        (None, {}, "engine_cgroup_slices=None must be true, false or auto"),
    ],
)  # fmt: skip
def test_slices_that_cannot_be_had_are_refused_by_name(setting, host, words):
    error = slices_setting(setting, host)["error"]
    assert error and words in error, error
