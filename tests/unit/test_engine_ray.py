"""Multi-node instances on Ray (distributed_executor_backend: ray): the leader's and the worker's
containers, the token kept in the secret file, the checks and their messages, the probes and the
group's fingerprint. tests/labtests/test_ray_group.py runs the same rendered containers."""

from __future__ import annotations

import shlex

import jinja2
import pytest
from conftest import ROOT
from engine_role import role_defaults
from test_engine_group import MODELS, big, host, hostvars

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import groups, mismatches, peers, probes
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import SECRET_MOUNT
from ansible_collections.gpufleet.serving.plugins.module_utils._firewall import plan_firewall

TOKEN = "ray-token-0123456789abcdef0123456789abcdef"
GPU = {"count": 2, "devices": [{"index": i, "memory_total_mib": 81559} for i in range(2)]}


def ray(**over):
    """A Ray group over gpu01 and gpu02: two GPUs on each, pipeline parallel across the nodes."""
    inst = big(accelerator="nvidia", gpus=[0, 1], tensor_parallel_size=2, pipeline_parallel_size=2,
               cross_node_tensor_parallel=False, distributed_executor_backend="ray", ray_token=TOKEN)  # fmt: skip
    del inst["kv_cache_space_gib"]
    inst.update(over)
    return inst


def plan_ray(me, instances=None, hv=None, **over):
    hv = hv or hostvars(engines_a=[ray()])
    own = instances if instances is not None else hv[me]["gpufleet_engines"]
    return plan(own, gpu=GPU, models=MODELS, host=host(me, hv, **over), defaults=role_defaults())


def members():
    (lead,) = plan_ray("gpu01")["instances"]
    (work,) = plan_ray("gpu02")["instances"]
    return lead, work


def entry(out):
    """(entry script, what it execs) of a rendered container."""
    docker = out["docker_args"]
    at = docker.index("gpufleet-engine")
    assert docker[at - 2 : at] == ["-c", docker[at - 1]] and docker[docker.index("--entrypoint") + 1] == "/bin/sh"
    return docker[at - 1], docker[at + 1 :]


def env_of(out):
    docker = out["docker_args"]
    return dict(docker[i + 1].split("=", 1) for i, a in enumerate(docker) if a == "--env")


def test_the_leader_starts_the_ray_head_then_vllm_on_ray():
    lead, _ = members()
    script, command = entry(lead)
    assert script == (
        "set -a; . %s; set +a; ray start --head --port=6379 --dashboard-host=127.0.0.1 --dashboard-port=8265 "
        '--node-ip-address=10.0.0.1 --num-gpus=2 --disable-usage-stats && exec "$@"' % SECRET_MOUNT
    )
    assert command[:2] == ["vllm", "serve"] and command[2:] == lead["engine_args"]
    args = lead["engine_args"]
    assert args[-2:] == ["--distributed-executor-backend", "ray"]
    # Ray places the workers: none of the mp executor's node flags
    assert not {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"} & set(args)
    env = env_of(lead)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert env["VLLM_HOST_IP"] == "10.0.0.1" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert lead["serves"] and "--health-cmd" in lead["docker_args"]
    assert lead["ray_min_version"] == "2.52.0"
    assert lead["group"]["backend"] == "ray" and lead["deployed"]["group"]["ray_port"] == 6379


def test_a_worker_runs_a_ray_node_only_and_keeps_the_groups_vllm_line():
    lead, work = members()
    script, command = entry(work)
    assert script == 'set -a; . %s; set +a; exec "$@"' % SECRET_MOUNT
    assert command == ["ray", "start", "--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2", "--num-gpus=2",
                       "--disable-usage-stats", "--block"]  # fmt: skip
    assert "vllm" not in command
    # the record is the group's vLLM line on every node: the members compare it
    assert work["engine_args"] == lead["engine_args"]
    env = env_of(work)
    assert env["RAY_AUTH_MODE"] == "token" and "RAY_ADDRESS" not in env and env["VLLM_HOST_IP"] == "10.0.0.2"
    assert not work["serves"] and "--no-healthcheck" in work["docker_args"]


def test_the_token_is_in_the_secret_file_only():
    lead, work = members()
    for out in (lead, work):
        assert not any(TOKEN in arg for arg in out["docker_args"])
        assert TOKEN not in repr(out)  # the plan is a fact: printed at -v
    env = jinja2.Environment()
    env.filters["quote"] = shlex.quote
    template = env.from_string((ROOT / "roles" / "engine" / "templates" / "secret.env.j2").read_text())
    for inst in (ray(), ray(ray_token="it's-a-token with ; and $ 0123456789abcdef")):
        text = template.render(item={"name": "big"}, _engine_instances=[inst])
        assert "RAY_AUTH_TOKEN=%s" % shlex.quote(inst["ray_token"]) in text.splitlines()
    mp = template.render(item={"name": "big"}, _engine_instances=[big()])
    assert "RAY_AUTH_TOKEN" not in mp


def test_probes_and_the_fingerprint_use_the_ray_settings():
    lead, work = members()
    assert probes([lead]) == [["10.0.0.2", 6379]] and probes([work]) == [["10.0.0.1", 6379]]
    assert lead["fingerprint"] == work["fingerprint"]
    assert lead["fingerprint"]["executor"] == "ray (GCS port 6379, dashboard port 8265, NCCL interface eth0)"
    # a member that renders other Ray settings, or another interface name (vLLM copies the leader's
    # NCCL_* to its Ray workers), is named before anything changes
    hv = hostvars(engines_a=[ray(ray_port=6400)])
    (other,) = plan_ray("gpu02", hv=hv, group_ifname="ens5")["instances"]
    mine = {"big": {"nodes": ["gpu01", "gpu02"], "print": lead["fingerprint"]}}
    theirs = {"big": {"nodes": ["gpu01", "gpu02"], "print": other["fingerprint"]}}
    errors = mismatches(mine, {"gpu02": {"__engine_group_print": theirs}}, "gpu01")
    assert any("executor differs" in e and "GCS port 6400" in e and "ens5" in e for e in errors), errors
    # mp groups keep the rendezvous port
    (mp,) = plan([big()], models=MODELS, host=host("gpu01"), defaults=role_defaults())["instances"]
    assert probes([mp]) == [["10.0.0.2", 29501]] and mp["fingerprint"]["executor"] == "mp"


def test_ports_of_the_ray_head_are_the_instances_own():
    hv = hostvars(engines_a=[ray(ray_port=6400, ray_dashboard_port=8300)])
    (lead,) = plan_ray("gpu01", hv=hv)["instances"]
    script, _ = entry(lead)
    assert "--port=6400 " in script and "--dashboard-port=8300 " in script
    assert env_of(lead)["RAY_ADDRESS"] == "10.0.0.1:6400"
    (work,) = plan_ray("gpu02", hv=hv)["instances"]
    assert "--address=10.0.0.1:6400" in entry(work)[1]


OTHER = {"name": "chat", "engine": "vllm", "model": "/srv/models/tiny", "port": 8001, "gpus": [1],
         "tensor_parallel_size": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("instances", "words"),
    [
        # accelerator cpu: vLLM's CPU build cannot run on Ray
        ([ray(accelerator="cpu", gpus=[], tensor_parallel_size=1, pipeline_parallel_size=2)],
         ["distributed_executor_backend='ray' with accelerator cpu", "current platform cpu does not support ray",
          "use distributed_executor_backend: mp"]),
        ([ray(engine="sglang")], ["distributed_executor_backend='ray': SGLang has no such setting",
                                  "remove distributed_executor_backend"]),
        ([ray(distributed_executor_backend="dask")], ["distributed_executor_backend='dask' must be mp", "or ray"]),
        ([{k: v for k, v in ray().items() if k != "ray_token"}], ["ray_token is unset", "openssl rand -hex 32"]),
        ([ray(ray_token="short")], ["ray_token=(a secret, not shown: 5 characters) must be a string of at least 32"]),
        ([ray(ray_token="x" * 31 + "\n")], ["ray_token=(a secret, not shown: 32 characters)", "printable"]),
        ([ray(ray_token=12345)], ["ray_token=(a secret, not shown: int) must be a string"]),
        ([ray(ray_port=8200)], ["ray_port=8200 is the instance's own port or its surge copy's; give it another"]),
        ([ray(ray_port=80)], ["ray_port=80 must be an integer from 1024 to 65535", "default 6379"]),
        ([ray(ray_dashboard_port=6379)], ["ray_dashboard_port=6379 is also its ray_port"]),
        ([ray(ray_dashboard_port=52365)], ["ray_dashboard_port=52365 is a port Ray binds itself"]),
        ([ray(master_port=29600)], ["master_port=29600 is the mp executor's rendezvous port", "remove master_port"]),
        ([big(ray_port=6400)], ["ray_port=6400 applies to distributed_executor_backend: ray only"]),
        # another instance of the leader on a port its Ray node binds
        ([ray(), dict(OTHER, port=6379)], ["gpufleet_engines[1] (chat).port=6379 is gpufleet_engines[0] (big).ray_port",
                                          "give one of them another port"]),
        ([ray(), dict(OTHER, port=10001)], ["(chat).port=10001 is the Ray head's client server port"]),
        ([ray(), dict(OTHER, port=8265)], ["(chat).port=8265 is gpufleet_engines[0] (big).ray_dashboard_port"]),
    ],
)  # fmt: skip
def test_bad_ray_settings_are_named_with_value_and_fix(instances, words):
    hv = hostvars(engines_a=instances)
    errors = plan(instances, gpu=GPU, models=MODELS, host=host("gpu01", hv), defaults=role_defaults())["errors"]
    text = " ".join(errors)
    assert all(w in text for w in words), errors
    assert TOKEN not in text and "x" * 31 not in text


@pytest.mark.parametrize("key", ["distributed_executor_backend", "ray_port", "ray_dashboard_port", "ray_token"])
def test_ray_keys_on_a_single_host_instance_are_refused(key):
    value = {"distributed_executor_backend": "ray", "ray_port": 6400, "ray_dashboard_port": 8300, "ray_token": TOKEN}
    single = dict(OTHER, **{key: value[key]})
    errors = plan([single], gpu=GPU, models=MODELS, host=host("gpu03"), defaults=role_defaults())["errors"]
    assert any("(chat).%s=" % key in e and "applies to a multi-node instance only" in e and "remove it" in e
               for e in errors), errors  # fmt: skip
    assert TOKEN not in " ".join(errors)


def test_one_ray_node_per_host_and_a_workers_ports():
    # gpu02 is a worker of big (Ray) and leads another Ray group: two Ray nodes on one host
    second = ray(name="second", nodes=["gpu02", "gpu03"], port=8300)
    hv = hostvars(engines_a=[ray()], engines_b=[second])
    errors = plan_ray("gpu02", instances=[second], hv=hv)["errors"]
    assert any("both run a Ray node on this host" in e and "52365" in e and "distributed_executor_backend: mp" in e
               for e in errors), errors  # fmt: skip
    # a worker's own instance on the Ray dashboard agent's port
    clash = dict(OTHER, port=52365, gpus=[])
    clash.update(accelerator="cpu")
    del clash["tensor_parallel_size"]
    errors = plan_ray("gpu02", instances=[clash])["errors"]
    assert any("(chat).port=52365 is Ray's dashboard agent port" in e and "gpu01's multi-node instance big" in e
               for e in errors), errors  # fmt: skip


def test_groups_carry_their_backend_to_every_member():
    hv = hostvars(engines_a=[ray()])
    (group,) = groups(["gpu01", "gpu02", "gpu03"], hv)
    assert group["instance"]["distributed_executor_backend"] == "ray"
    # the worker's plan has no errors and no secrets: the leader's instance carries the token
    out = plan_ray("gpu02", hv=hv)
    assert out["errors"] == [] and TOKEN not in repr(out)


def test_the_preflight_report_says_what_each_member_runs():
    lead, work = members()
    assert any(line.startswith("ray: this node starts the group's Ray head (GCS port 6379, dashboard on "
                               "127.0.0.1:8265") for line in lead["report"])  # fmt: skip
    assert any("Ray worker node joining 10.0.0.1:6379" in line and "no vLLM process" in line for line in work["report"])


def test_the_firewall_opens_every_port_to_the_peers_and_nothing_for_the_dashboard():
    # Ray's node manager, object manager and worker ports are random: the group's peers get every
    # TCP port from each other (the rule without a port), nobody else gets any Ray port
    params = {"ssh_port": 22, "ssh_sources": [], "proxy_sources": [], "monitoring_sources": [], "allow_tcp": []}
    found = groups(["gpu01", "gpu02", "gpu03"], hostvars(engines_a=[ray()]))
    fw = plan_firewall(params, {"gpufleet_engines": [ray()], "engine_peers": peers(found, "gpu01")}, ["gpu_host"])
    (rule,) = [r for r in fw["rules"] if r["port"] is None]
    assert rule["v4"] == ["10.0.0.2/32"]
    assert not {6379, 8265, 10001, 52365} & {r["port"] for r in fw["rules"]}
