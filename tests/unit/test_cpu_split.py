"""How the plan shares a host's CPUs (issue 20): on a dual-socket capture, an instance moves
with its GPUs between the NUMA nodes; the housekeeping CPUs are left out of every engine's
default and pinned for the host's own services; exclusive CPU sets are refused when two
instances would share one; the slice carries the instance's weights and memory ceiling."""

from __future__ import annotations

import pytest
from conftest import ROOT, read_fixture
from engine_role import role_defaults

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import placement, render
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_validate import validate
from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts
from ansible_collections.gpufleet.serving.plugins.module_utils._placement import housekeeping_dropin

# A real dual-socket capture (tests/fixtures/nvidia_smi/dual_socket_8x_rtx4090/SOURCE.md): GPUs 0-3
# on NUMA node 0 (CPUs 0-55,112-167), GPUs 4-7 on node 1 (CPUs 56-111,168-223).
DUAL = build_facts(topo=read_fixture("dual_socket_8x_rtx4090", "topo-m.txt"))
NODES = [{"node": 0, "cpus": "0-55,112-167"}, {"node": 1, "cpus": "56-111,168-223"}]
LLAMA8 = (ROOT / "tests" / "fixtures" / "model_configs" / "llama-3.1-8b-instruct.json").read_text()
MODELS = {"/srv/models/llama8": {"exists": True, "config": LLAMA8}}


def inst(name="chat", port=8001, **over):
    out = {"name": name, "engine": "vllm", "model": "/srv/models/llama8", "port": port, "gpus": [0],
           "max_model_len": 4096}  # fmt: skip
    out.update(over)
    return out


def host(keep=""):
    return {"numa_nodes": NODES, "housekeeping_cpus": keep}


def errors_of(*instances, keep="", slices=False):
    return validate(list(instances), gpu=DUAL, models=MODELS, host=host(keep), defaults=role_defaults(slices=slices))


def test_the_capture_gives_each_gpu_its_numa_node():
    assert {d["index"]: d.get("numa_node") for d in DUAL["devices"]} == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_changing_an_instances_gpus_moves_it_to_the_other_socket_and_its_slice_with_it():
    defaults = role_defaults(slices=True)
    before = render(inst(gpus=[0, 1], tensor_parallel_size=2), gpu=DUAL, host=host("0,56"), defaults=defaults)
    after = render(inst(gpus=[4, 5], tensor_parallel_size=2), gpu=DUAL, host=host("0,56"), defaults=defaults)
    # node 0's CPUs less the housekeeping CPU 0; then node 1's less 56
    assert (before["cpuset_cpus"], before["cpuset_mems"]) == ("1-55,112-167", "0")
    assert (after["cpuset_cpus"], after["cpuset_mems"]) == ("57-111,168-223", "1")
    assert "AllowedCPUs=1-55,112-167\nAllowedMemoryNodes=0\n" in before["slice"]["text"]
    assert "AllowedCPUs=57-111,168-223\nAllowedMemoryNodes=1\n" in after["slice"]["text"]
    for out, cpus, mems in ((before, "1-55,112-167", "0"), (after, "57-111,168-223", "1")):
        args = out["docker_args"]
        assert args[args.index("--cpuset-cpus") + 1] == cpus and args[args.index("--cpuset-mems") + 1] == mems
    # the command line changed, so the unit restarts it (through the readiness-gated path)
    assert before["docker_args"] != after["docker_args"]
    assert "less the housekeeping CPUs 0,56" in after["placement"]


def test_an_instances_own_cpus_win_and_must_sit_on_its_gpus_node():
    assert placement(inst(gpus=[4], cpus="60-63"), DUAL, host())[:2] == ("60-63", "1")
    assert errors_of(inst(gpus=[4], cpus="60-63")) == []
    [error] = errors_of(inst(gpus=[4], cpus="50-63"))
    assert "gpufleet_engines[0] (chat).cpus='50-63' names CPU 50-55, away from its GPUs [4] on NUMA node 1" in error
    assert "Pick CPUs from NUMA node 1's 56-111,168-223" in error
    [error] = errors_of(inst(gpus=[4], cpus="56-63"), keep="0,56")
    assert "takes CPU 56, which engine_housekeeping_cpus='0,56' keeps for the host's own services" in error
    [error] = errors_of(inst(cpus="0-300"))
    assert "names CPU 224-300, which this host does not have" in error


@pytest.mark.parametrize(
    ("keep", "words"),
    [
        ("0-1,x", "engine_housekeeping_cpus='0-1,x' must be a CPU list like '0-1' or '0,32'"),
        ("0,300", "engine_housekeeping_cpus='0,300' names CPU 300, which this host does not have"),
        ("0-55,112-167", "takes every CPU of NUMA node 0 (0-55,112-167), leaving none there for the engines"),
    ],
)
def test_housekeeping_cpus_the_host_cannot_give_are_refused(keep, words):
    errors = errors_of(inst(), keep=keep)
    assert len(errors) == 1 and words in errors[0], errors


def test_exclusive_instances_may_not_share_a_cpu():
    a = inst(name="a", gpus=[0], exclusive_cpus=True)
    b = inst(name="b", port=8002, gpus=[1])
    # both default to node 0's CPUs
    [error] = errors_of(a, b)
    assert "gpufleet_engines[0] (a).exclusive_cpus is true, but gpufleet_engines[1] (b) runs on its CPU" in error
    assert "0-55,112-167" in error and "give the two disjoint cpus" in error
    # split between them: accepted; the other socket's instance never overlaps
    assert errors_of(dict(a, cpus="0-27,112-139"), dict(b, cpus="28-55,140-167")) == []
    assert errors_of(a, dict(b, gpus=[4])) == []
    # two exclusive instances on one set: told once
    assert len(errors_of(a, dict(b, exclusive_cpus=True))) == 1
    assert "exclusive_cpus='yes' must be true or false" in errors_of(inst(exclusive_cpus="yes"))[0]


def test_the_slice_carries_weights_and_a_memory_ceiling():
    out = render(inst(cpu_weight=400, io_weight=200, memory_low="16G", memory_max="96G"), gpu=DUAL, host=host(),
                 defaults=role_defaults(slices=True))  # fmt: skip
    lines = out["slice"]["text"].splitlines()
    assert lines[lines.index("[Slice]") + 1 :] == [
        "AllowedCPUs=0-55,112-167", "AllowedMemoryNodes=0",
        "CPUWeight=400", "IOWeight=200", "MemoryLow=16G", "MemoryMax=96G",
    ]  # fmt: skip
    assert errors_of(inst(cpu_weight=400, memory_max="96G"), slices=True) == []


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"cpu_weight": 0}, "cpu_weight=0 must be an integer from 1 to 10000 (systemd's CPUWeight"),
        ({"io_weight": "high"}, "io_weight='high' must be an integer from 1 to 10000"),
        ({"memory_max": "96GB"}, "memory_max='96GB' must be a size like '64G' or '512M'"),
        ({"memory_low": "64G", "memory_max": "32G"}, "memory_low='64G' is above its memory_max='32G'"),
        (
            {"accelerator": "cpu", "gpus": [], "kv_cache_space_gib": 4, "memory_max": "4G"},
            "memory_max='4G' leaves no room beyond its KV cache (kv_cache_space_gib=4 GiB",
        ),
    ],
)
def test_bad_slice_settings_are_refused(over, words):
    errors = errors_of(inst(**over), slices=True)
    assert len(errors) == 1 and words in errors[0], errors


def test_slice_settings_without_slices_are_refused():
    [error] = errors_of(inst(cpu_weight=400, memory_max="96G"))
    assert "sets cpu_weight, memory_max, settings of the instance's systemd slice" in error
    assert "set engine_cgroup_slices: true (with container_runtime_cgroup_driver: systemd)" in error


def test_the_plan_prints_the_split_and_the_housekeeping_dropin_pins_a_service():
    out = plan(
        [inst(name="a", gpus=[0], exclusive_cpus=True, cpus="1-27"), inst(name="b", port=8002, gpus=[4])],
        gpu=DUAL, models=MODELS, host=host("0,56"),
        defaults=role_defaults(housekeeping_units=["nginx.service", "gpufleet-engine-watchdog@.service"]),
    )  # fmt: skip
    assert out["errors"] == [], out["errors"]
    assert out["cpu_split"] == [
        "NUMA nodes: 0: CPUs 0-55,112-167; 1: CPUs 56-111,168-223",
        "housekeeping CPUs 0,56: nginx.service, gpufleet-engine-watchdog@.service",
        "systemd slices: off (engine_cgroup_slices is auto, and on this host Docker is not running yet; its default on"
        " a cgroup v1 host is the cgroupfs cgroup driver)",
        "a: CPUs 1-27 memory node 0, exclusive (cpus given for the instance)",
        "b: CPUs 57-111,168-223 memory node 1 (GPUs [4] sit on NUMA node 1, less the housekeeping CPUs 0,56)",
    ]
    assert housekeeping_dropin("0,56").splitlines()[-3:] == ["[Service]", "CPUAffinity=0,56", "AllowedCPUs=0,56"]


def test_the_role_default_auto_runs_slices_where_docker_uses_systemd_and_says_why_in_the_split():
    assert role_defaults()["slices"] == "auto"
    v2 = plan([inst()], gpu=DUAL, models=MODELS, host=dict(host(), name="gpu-a", cgroup_unified=True),
              defaults=role_defaults())  # fmt: skip
    v1 = plan([inst()], gpu=DUAL, models=MODELS, host=dict(host(), name="gpu-a", docker_cgroup_driver="cgroupfs"),
              defaults=role_defaults())  # fmt: skip
    assert v2["errors"] == [] and v1["errors"] == []
    on, off = v2["instances"][0], v1["instances"][0]
    assert v2["slices"]["on"] is True and on["slice"]["name"] == "gpufleet-engine-chat.slice"
    assert on["docker_args"][on["docker_args"].index("--cgroup-parent") + 1] == "gpufleet-engine-chat.slice"
    assert v1["slices"]["on"] is False and off["slice"] is None and "--cgroup-parent" not in off["docker_args"]
    assert (
        "systemd slices: off (engine_cgroup_slices is auto, and on gpu-a Docker reports the cgroupfs cgroup driver)"
        in v1["cpu_split"]
    )
    assert any(line.startswith("systemd slices: on, one per instance (") for line in v2["cpu_split"]), v2["cpu_split"]
    # a slice setting where auto leaves slices off: refused, saying why they are off
    cgroupfs = dict(host(), name="gpu-a", docker_cgroup_driver="cgroupfs")
    [error] = plan([inst(memory_max="96G")], gpu=DUAL, models=MODELS, host=cgroupfs, defaults=role_defaults())["errors"]
    assert (
        "sets memory_max, settings of the instance's systemd slice, but slices are off (engine_cgroup_slices is auto,"
        " and on gpu-a Docker reports the cgroupfs cgroup driver)" in error
    )
