"""A Ray group (distributed_executor_backend: ray) as the engine role renders it, run for real.

A two-node instance is planned through the role's own path (module_utils/_engine_plan.plan:
validation, group context, render) for its leader and its worker, and their rendered docker run
arguments are run from the lab's vLLM CPU image with Ray 2.60.0 (tests/lab/images/vllm-cpu-ray),
the secret file written by the role's own template (roles/engine/templates/secret.env.j2). What
differs from a real fleet, and why:
- accelerator nvidia is rendered (the role refuses Ray for accelerator cpu), so the one pair that
  needs the hardware we lack is dropped: `--gpus "device=0"`. Ray is told --num-gpus=1 all the same
  (a logical resource: it needs no device).
- `--network host` becomes a user-defined Docker network with the nodes' fixed addresses (the
  inventory addresses the plan renders), and each container gets its own name
  (gpufleet-raytest-*): both nodes run on this one machine.
- the lab's ulimits (tests/lab/lab_vars.yml: this machine's Docker cannot raise memlock), no
  NCCL env file (the nccl role writes it on a real host), and the compile cache folder in the
  test's temporary folder (not /var/cache/gpufleet/engines on this machine).
- the leader runs its rendered entry script with `"$@"` (vLLM) replaced by `sleep infinity`, so
  that the head outlives vLLM's failure on CPU and the cluster can be checked; vLLM's part of the
  rendered line then runs in that container through the same entry script, and must stop with
  vLLM's own "does not support ray" (the CPU build's platform has no Ray device key).

What only a GPU fleet can show: vLLM's Ray executor placing its workers on the worker node and
serving. Everything before that is proved here: the group forms with the token, a node without it
is refused, the dashboard is on loopback only, vLLM's driver joins the cluster.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import jinja2
import pytest
import yaml
from conftest import HARNESS, ROOT

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from engine_role import role_defaults  # the engine role's defaults, as its preflight passes them

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import groups
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan

# make test-full only: a two-node Ray group beside the fleet lab's native multi-node group
# (make test proves each central promise once; docs/testing.md).
pytestmark = pytest.mark.full

NETWORK = "gpufleet-raytest"
SUBNET = "172.30.219.0/24"
HEAD, WORKER, NO_TOKEN, WRONG_TOKEN, NO_AUTH = (
    "172.30.219.10", "172.30.219.11", "172.30.219.12", "172.30.219.13", "172.30.219.14",
)  # fmt: skip
TOKEN = "raytest-token-0123456789abcdef0123456789abcdef"
LAB_ULIMITS = yaml.safe_load((ROOT / "tests" / "lab" / "lab_vars.yml").read_text())["engine_ulimits"]
SOURCE = "set -a; . /run/gpufleet/secret.env; set +a; "
CONTAINERS = ("head", "worker", "no-token", "wrong-token", "no-auth")


def _docker(*args, timeout=120, check=True):
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode:
        raise AssertionError("docker %s: %s" % (" ".join(args[:3]), proc.stderr[-2000:]))
    return proc


def _clean():
    for name in CONTAINERS:
        _docker("rm", "-f", "gpufleet-raytest-%s" % name, check=False)
    _docker("network", "rm", NETWORK, check=False)


def _secret_file(inst, folder):
    """The instance's secret.env as the role's template writes it (Ansible's quote is shlex.quote)."""
    env = jinja2.Environment(keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    template = env.from_string((ROOT / "roles" / "engine" / "templates" / "secret.env.j2").read_text())
    path = folder / inst["name"] / "secret.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(template.render(item={"name": inst["name"]}, _engine_instances=[inst]))
    path.chmod(0o600)
    return path


def _runnable(docker_args, name, address, leader_tail=None):
    """A node's rendered docker run arguments, changed only as the module docstring says."""
    args = list(docker_args)
    at = args.index("--gpus")
    del args[at : at + 2]
    at = args.index("--network")
    assert args[at + 1] == "host"
    args[at : at + 2] = ["--network", NETWORK, "--ip", address]
    args[args.index("--name") + 1] = "gpufleet-raytest-%s" % name
    if leader_tail is not None:
        args = args[: args.index("gpufleet-engine") + 1] + leader_tail
    return args


def _alive_nodes():
    """The cluster's alive nodes, read in the head's container with the token (Ray's state API,
    which goes through the dashboard on 127.0.0.1)."""
    proc = _docker("exec", "gpufleet-raytest-head", "sh", "-c", SOURCE + "ray list nodes --format json", check=False)
    try:
        listed = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:  # "No resource in the cluster" while the head starts
        listed = None
    return None if listed is None else sorted(n["node_ip"] for n in listed if n["state"] == "ALIVE")


@pytest.fixture(scope="module")
def ray_image():
    started = time.monotonic()
    proc = subprocess.run([HARNESS, "image", "vllm-cpu-ray"], check=True, capture_output=True, text=True)
    built = [line for line in proc.stderr.splitlines() if "built" in line or "cached" in line]
    print("\nvllm-cpu-ray image: %s (%.0f s)" % ("; ".join(built), time.monotonic() - started))
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def group(ray_image, tmp_path_factory):
    """The leader and the worker, planned by the role's path and started from their rendered
    arguments; the group formed (both nodes alive, read with the token)."""
    folder = tmp_path_factory.mktemp("raytest")
    model = subprocess.run([HARNESS, "model", "tiny-llama"], check=True, capture_output=True, text=True).stdout.strip()
    (folder / "tiny").symlink_to(model)  # the role refuses a model path with a '.cache' segment
    inst = {
        "name": "raytest", "engine": "vllm", "accelerator": "nvidia", "image": ray_image,
        "model": str(folder / "tiny"), "port": 8200, "nodes": ["gpu01", "gpu02"], "gpus": [0],
        "enforce_eager": True, "max_model_len": 2048, "distributed_executor_backend": "ray", "ray_token": TOKEN,
    }  # fmt: skip
    hv = {"gpu01": {"ansible_host": HEAD, "gpufleet_engines": [inst]},
          "gpu02": {"ansible_host": WORKER, "gpufleet_engines": []}}  # fmt: skip
    config = (folder / "tiny" / "config.json").read_text()
    rendered = {}
    for me in hv:
        host = {"name": me, "hosts": list(hv), "groups": groups(list(hv), hv),
                "facts": {"interfaces": ["eth0"], "eth0": {"ipv4": {"address": hv[me]["ansible_host"]}}}}  # fmt: skip
        out = plan(
            hv[me]["gpufleet_engines"],
            gpu={"count": 1, "devices": [{"index": 0, "memory_total_mib": 24564}]},
            models={inst["model"]: {"exists": True, "config": config}},
            host=host,
            defaults=role_defaults(
                env_files=[], config_dir=str(folder), ulimits=LAB_ULIMITS, cache_dir=str(folder / "cache")
            ),
        )
        assert out["errors"] == [], out["errors"]
        rendered[me] = out["instances"][0]
    secret = _secret_file(inst, folder)
    _clean()
    _docker("network", "create", "--subnet", SUBNET, NETWORK)
    try:
        started = time.monotonic()
        lead = rendered["gpu01"]["docker_args"]
        _docker("run", "-d", *_runnable(lead, "head", HEAD, leader_tail=["sleep", "infinity"]))
        _docker("run", "-d", *_runnable(rendered["gpu02"]["docker_args"], "worker", WORKER))
        nodes, deadline = None, time.monotonic() + 90
        while nodes != [HEAD, WORKER] and time.monotonic() < deadline:
            time.sleep(2)
            nodes = _alive_nodes()
        print("\nRay group formed in %.0f s: %s" % (time.monotonic() - started, nodes))
        yield {"rendered": rendered, "nodes": nodes, "secret": secret, "folder": folder, "instance": inst}
    finally:
        _clean()


def test_the_worker_joins_the_head_with_the_token(group):
    assert group["nodes"] == [HEAD, WORKER], _docker("logs", "gpufleet-raytest-worker", check=False).stderr[-2000:]
    # the worker node holds its connection to the head's GCS on ray_port: what the watchdog's
    # group check looks for (engine-watchdog leader_connected, ss ... dst LEADER:RAY_PORT)
    tcp = _docker("exec", "gpufleet-raytest-worker", "cat", "/proc/net/tcp").stdout
    head_gcs = "%s:%04X" % ("".join("%02X" % int(b) for b in reversed(HEAD.split("."))), 6379)
    assert any(f[2] == head_gcs and f[3] == "01" for f in (line.split() for line in tcp.splitlines()[1:])), tcp
    # without the token even the head's own container cannot read the cluster
    proc = _docker("exec", "gpufleet-raytest-head", "ray", "list", "nodes", check=False)
    assert proc.returncode != 0


def test_the_token_stays_out_of_docker_inspect_and_command_lines(group):
    for name in ("head", "worker"):
        inspected = _docker("inspect", "gpufleet-raytest-%s" % name).stdout
        assert TOKEN not in inspected and "RAY_AUTH_MODE=token" in inspected
    assert all(TOKEN not in arg for out in group["rendered"].values() for arg in out["docker_args"])
    assert "RAY_AUTH_TOKEN=%s" % TOKEN in group["secret"].read_text()


@pytest.fixture(scope="module")
def refused(group):
    """Three more nodes started with the worker's rendered arguments, each at its own address
    (its --node-ip-address and --ip): without the token (RAY_AUTH_MODE=token, an empty secret
    file), with a wrong token, and with authentication off (no RAY_AUTH_MODE either). They run
    at once; Ray's GCS client retries for about 20 s before it gives up."""
    folder = group["folder"]
    (folder / "empty.env").write_text("")
    (folder / "wrong.env").write_text("RAY_AUTH_TOKEN=%s\n" % ("w" * 48))
    secret_mount = "%s:/run/gpufleet/secret.env:ro" % group["secret"]
    runs = {}
    for name, address, secret in (("no-token", NO_TOKEN, "empty.env"), ("wrong-token", WRONG_TOKEN, "wrong.env"),
                                  ("no-auth", NO_AUTH, "empty.env")):  # fmt: skip
        args = _runnable(group["rendered"]["gpu02"]["docker_args"], name, address)
        args[args.index(secret_mount)] = "%s:/run/gpufleet/secret.env:ro" % (folder / secret)
        args[args.index("--node-ip-address=%s" % WORKER)] = "--node-ip-address=%s" % address
        if name == "no-auth":
            at = args.index("RAY_AUTH_MODE=token")
            del args[at - 1 : at + 1]
        runs[name] = subprocess.Popen(["docker", "run", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)  # fmt: skip
    out = {}
    for name, proc in runs.items():
        try:
            text, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        out[name] = (proc.returncode, text)
    return out


@pytest.mark.parametrize(
    ("name", "words"),
    [
        # refused before it reaches the head: Ray will not start a node without the token
        ("no-token", "Token authentication is enabled but no authentication token was found"),
        # refused by the head's GCS
        ("wrong-token", "InvalidAuthToken: Authentication token is missing or incorrect"),
        ("no-auth", "InvalidAuthToken: Authentication token is missing or incorrect"),
    ],
)
def test_a_node_without_the_token_is_refused(refused, name, words):
    rc, text = refused[name]
    error = [line for line in text.splitlines() if words in line]
    print("\n%s: rc %s: %s" % (name, rc, error[-1][:400] if error else text[-1500:]))
    assert rc not in (0, None) and error, text[-3000:]
    assert _alive_nodes() == [HEAD, WORKER]


def test_the_dashboard_listens_on_the_heads_loopback_only(group):
    port = group["rendered"]["gpu01"]["group"]["ray_dashboard_port"]
    tcp = _docker("exec", "gpufleet-raytest-head", "cat", "/proc/net/tcp").stdout
    listening = {f[1] for f in (line.split() for line in tcp.splitlines()[1:]) if f[3] == "0A"}
    assert {a for a in listening if a.endswith(":%04X" % port)} == {"0100007F:%04X" % port}, listening
    probe = (
        "import socket, sys\n"
        "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close(); print('open')\n"
        "except OSError as exc:\n    print(type(exc).__name__)\n"
    )
    reach = _docker("exec", "gpufleet-raytest-worker", "python3", "-c", probe, HEAD, str(port)).stdout.strip()
    assert reach == "ConnectionRefusedError"
    # on the head's loopback it answers, and asks for the token
    ask = (
        "import os, urllib.request, urllib.error\n"
        "for hdr in ({}, {'Authorization': 'Bearer ' + os.environ['RAY_AUTH_TOKEN']}):\n"
        "    req = urllib.request.Request('http://127.0.0.1:%d/api/version', headers=hdr)\n"
        "    try:\n        print(urllib.request.urlopen(req, timeout=10).status)\n"
        "    except urllib.error.HTTPError as exc:\n        print(exc.code)\n" % port
    )
    codes = _docker("exec", "gpufleet-raytest-head", "sh", "-c", SOURCE + 'exec python3 -c "$0"', ask).stdout.split()
    assert codes == ["401", "200"]


def test_vllm_joins_the_cluster_and_the_cpu_build_stops_with_no_ray_support(group):
    lead = group["rendered"]["gpu01"]["docker_args"]
    at = lead.index("gpufleet-engine")
    script, command = lead[at - 1], lead[at + 1 :]
    assert script.startswith(SOURCE + "ray start --head ") and script.endswith(' && exec "$@"')
    assert command[:2] == ["vllm", "serve"] and command[-2:] == ["--distributed-executor-backend", "ray"]
    started = time.monotonic()
    proc = _docker("exec", "gpufleet-raytest-head", "/bin/sh", "-c", SOURCE + 'exec "$@"', "gpufleet-engine", *command,
                   timeout=300, check=False)  # fmt: skip
    text = proc.stdout + proc.stderr
    error = [line for line in text.splitlines() if "does not support ray" in line]
    print("\nvLLM (%.0f s): %s" % (time.monotonic() - started, error[-1] if error else text[-1500:]))
    assert proc.returncode != 0
    # its driver joined the group's head with the token (RAY_ADDRESS), then the platform check stopped it
    assert "Connected to Ray cluster" in text, text[-3000:]
    assert "ValueError: current platform cpu does not support ray." in text, text[-3000:]
