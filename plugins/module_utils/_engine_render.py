# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Engine instances rendered for the host (private to gpufleet.serving): the engine's own
command line, the ``docker run`` arguments, shared memory, NUMA placement, and the record
of what was deployed that `gpufleet status` reads back.

Takes an instance that _engine_validate.validate accepted. Option flags come from
_engine_options; images and ulimits come from the role (its defaults/main.yml, passed in
`defaults`).
"""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import (
    RAY_MIN_VERSION,
    ray_address,
    ray_start,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    DRAIN_STOP_MARGIN,
    DRAIN_UNIT_MARGIN,
    ENGINE_INFO,
    OPTIONS,
    drain_timeout,
    normalized,
    option_for,
    options_of,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._placement import (
    cpu_list,
    cpu_set,
    slice_name,
    slice_unit,
)

MODEL_MOUNT = "/models/%s"
# engine_compile_cache: where the instance's cache folder (CACHE_DIR/NAME on the host) is mounted in its
# container; the engine's cache variables point into it (ENGINE_INFO[...].cache_env)
CACHE_MOUNT = "/var/cache/gpufleet"
SECRET_MOUNT = "/run/gpufleet/secret.env"
# during a key rotation (api_key_previous), vLLM's --config file with both keys, written by the
# container's shell from the secret file's variables
API_KEYS_FILE = "/run/gpufleet/api-keys.yaml"
# The version of the deployed.json layout (status reads older ones as unknown).
DEPLOYED_FORMAT = 1


def image_key(inst: dict) -> str:
    """The engine_images key of an instance: ENGINE_ACCELERATOR, e.g. vllm_nvidia."""
    inst = normalized(inst)
    return "%s_%s" % (inst["engine"], inst["accelerator"])


def image_of(inst: dict, defaults=None):
    """The instance's image: its own, else the role's engine_images entry (None when neither)."""
    return inst.get("image") or ((defaults or {}).get("images") or {}).get(image_key(inst))


def drain_of(inst: dict) -> int:
    """Seconds the instance drains when it stops (_engine_options.drain_timeout)."""
    inst = normalized(inst)
    length = option_for("max_model_len", inst["engine"])
    return drain_timeout(inst, options_of(inst).get(length.name) if length else None)


def cache_folder(inst: dict, defaults=None):
    """The instance's compile cache folder on the host (the role's cache_dir, engine_cache_dir when
    engine_compile_cache is on, and the instance's name), None when caches are off."""
    root = (defaults or {}).get("cache_dir")
    return "%s/%s" % (root.rstrip("/"), inst["name"]) if root else None


def cache_env(inst: dict, defaults=None) -> dict:
    """The engine's cache variables, each pointing into CACHE_MOUNT ({} when caches are off)."""
    if not cache_folder(inst, defaults):
        return {}
    engine = normalized(inst)["engine"]
    return {name: "%s/%s" % (CACHE_MOUNT, sub) for name, sub in ENGINE_INFO[engine].cache_env}


def engine_args(inst: dict) -> list:
    """The engine's own command line (after the entrypoint) for a validated instance."""
    inst = normalized(inst)
    engine = inst["engine"]
    name = inst["name"]
    args = [ENGINE_INFO[engine].model_flag, MODEL_MOUNT % name, "--served-model-name", served_name(inst)]
    args += ["--host", inst["bind"], "--port", str(inst["port"])]
    args += ENGINE_INFO[engine].server_flags
    if ENGINE_INFO[engine].drain_flag:
        args += [ENGINE_INFO[engine].drain_flag, str(drain_of(inst))]
    options = options_of(inst)
    for key, option in OPTIONS.items():
        args += option.render(engine, options.get(key))
    if inst.get("_group"):
        args += ENGINE_INFO[engine].group_flags(inst["_group"])
    return args + list(inst.get("extra_args") or [])


def served_name(inst: dict) -> str:
    return inst.get("served_model_name") or inst["name"]


def ipc_mode(inst: dict):
    """('host', None) or ('private', shm size).

    Docker's 64 MB /dev/shm kills multi-process engines with "Bus error" (NCCL's SHM
    transport, PyTorch's shared tensors, vLLM's shared-memory message queues). SGLang's and
    vLLM's docs run with --ipc=host; gpufleet does that whenever several GPUs (TP/PP > 1)
    share memory or the engine is SGLang, and otherwise gives the container its own sized
    /dev/shm so it does not see the host's IPC namespace.
    """
    inst = normalized(inst)
    ipc = inst.get("ipc", "auto")
    options = options_of(inst)
    ranks = (options.get("tensor_parallel_size") or 1) * (options.get("pipeline_parallel_size") or 1)
    if ipc == "host" or (ipc == "auto" and (ENGINE_INFO[inst["engine"]].host_ipc or ranks > 1)):
        return "host", None
    default = "1g" if inst["accelerator"] == "cpu" else "8g"
    return "private", inst.get("shm_size") or default


def placement(inst: dict, gpu=None, host=None):
    """(cpuset_cpus, cpuset_mems, reason) for an instance: the CPUs and memory node next
    to its GPUs; for accelerator cpu, the host's first NUMA node. An instance's own `cpus`
    wins (validation keeps a GPU instance's within its GPUs' node); a default set leaves out
    the host's housekeeping CPUs (engine_housekeeping_cpus: nginx, the exporters, the watchdog)."""
    inst = normalized(inst)
    gpu = gpu or {}
    host = host or {}
    nodes = host.get("numa_nodes") or []
    node_cpus = {n["node"]: n["cpus"] for n in nodes if n.get("cpus")}
    keep = cpu_set(host.get("housekeeping_cpus")) or set()

    def rest(cpus):
        """A default CPU list less the housekeeping CPUs."""
        left = (cpu_set(cpus) or set()) - keep
        return cpu_list(left) if keep and left else cpus

    spared = ", less the housekeeping CPUs %s" % cpu_list(keep) if keep else ""

    def mems_of(cpus):
        return ",".join(str(n) for n, c in sorted(node_cpus.items()) if cpu_set(c) & cpu_set(cpus)) or None

    if inst.get("cpus"):
        return inst["cpus"], mems_of(inst["cpus"]), "cpus given for the instance"
    if inst["accelerator"] == "cpu":
        if node_cpus:
            first = sorted(node_cpus)[0]
            return rest(node_cpus[first]), str(first), "CPU instance on NUMA node %d%s" % (first, spared)
        return None, None, "host NUMA layout unknown: no pinning"
    devices = {d["index"]: d for d in gpu.get("devices") or []}
    mine = [devices[g] for g in inst.get("gpus") or [] if g in devices]
    numa = sorted({d["numa_node"] for d in mine if d.get("numa_node") is not None})
    cpus = sorted({d["cpus"] for d in mine if d.get("cpus")})
    if len(numa) == 1 and numa[0] in node_cpus:
        return (
            rest(node_cpus[numa[0]]),
            str(numa[0]),
            "GPUs %s sit on NUMA node %d%s" % (inst.get("gpus"), numa[0], spared),
        )
    if len(cpus) == 1:
        return (
            rest(cpus[0]),
            (str(numa[0]) if len(numa) == 1 else None),
            "GPUs %s are local to CPUs %s%s" % (inst.get("gpus"), cpus[0], spared),
        )
    if len(numa) > 1:
        return (
            None,
            None,
            "GPUs %s span NUMA nodes %s: no pinning (place an instance's GPUs on one node)" % (inst.get("gpus"), numa),
        )
    return None, None, "GPU NUMA placement unknown: no pinning"


def local_address(bind):
    """Where a client on the same host reaches an engine bound to `bind` (wildcards: loopback)."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::", None) else bind


def upstream_address(inst: dict, port=None) -> str:
    """host:port at which the host's proxy lists the instance (or its copy on `port`)."""
    inst = normalized(inst)
    return "%s:%d" % (local_address(inst["bind"]), inst["port"] if port is None else port)


def base_url(inst: dict) -> str:
    inst = normalized(inst)
    host = local_address(inst["bind"])
    return "http://%s:%d" % (host if ":" not in host else "[%s]" % host, inst["port"])


def deployed(inst: dict, image: str, placed=(None, None)) -> dict:
    """What the role records beside docker-run.args (deployed.json) for `gpufleet status`:
    the instance's settings as it runs, no secrets (no api_key, env or extra_args)."""
    inst = normalized(inst)
    engine = inst["engine"]
    options = {k: v for k, v in sorted(options_of(inst).items()) if v is not None}
    length = option_for("max_model_len", engine)
    return {
        "format": DEPLOYED_FORMAT,
        "name": inst["name"],
        "engine": engine,
        "accelerator": inst["accelerator"],
        "image": image,
        "model": inst["model"],
        "served_model_name": served_name(inst),
        "port": inst["port"],
        "base_url": base_url(inst),
        "gpus": list(inst.get("gpus") or []),
        "tensor_parallel_size": options.get("tensor_parallel_size") or 1,
        "max_model_len": options.get(length.name) if length else None,
        "drain_timeout": drain_of(inst),
        "options": options,
        # a multi-node instance: this node's rank and the group (status shows each member)
        "group": _group_record(inst.get("_group")),
        # where the plan pins it (placement()): status compares it with what the cgroup holds
        "cpuset_cpus": placed[0],
        "cpuset_mems": placed[1],
    }


def _group_record(group):
    if not group:
        return None
    keys = ("rank", "size", "leader", "nodes", "addresses", "master_addr", "master_port", "address", "ifname",
            "backend", "ray_port", "ray_dashboard_port")  # fmt: skip
    return {k: group.get(k) for k in keys}


def render(inst: dict, gpu=None, host=None, defaults=None) -> dict:
    """Everything the role writes for one validated instance.

    defaults: the role's settings: images (engine_images), ulimits (engine_ulimits),
    env_files, config_dir, cache_dir (engine_cache_dir when engine_compile_cache is on, else "").
    """
    inst = normalized(inst)
    defaults = defaults or {}
    engine = inst["engine"]
    accelerator = inst["accelerator"]
    name = inst["name"]
    image = image_of(inst, defaults)
    ipc, shm = ipc_mode(inst)
    cpus, mems, why = placement(inst, gpu, host)
    port = inst["port"]
    health_host = local_address(inst["bind"])
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    # A single-host instance's own sockets stay on loopback, so with --network host they are
    # not reachable from other machines (only --host/--port faces the proxy): the address vLLM
    # takes for this host (VLLM_HOST_IP: the engine core's queues), the interface of Gloo's
    # CPU-side process groups (GLOO_SOCKET_IFNAME; otherwise it binds the host name's address:
    # the lab saw 10 VLLM::Worker listeners on the host's network address) and of NCCL's
    # bootstrap (NCCL_SOCKET_IFNAME; its data goes over NVLink/PCIe/shared memory within a
    # host). They override the host's nccl.env for the instance (--env comes after --env-file).
    group = inst.get("_group")
    # A multi-node instance's sockets face its peers instead: this node's address on the group's
    # network and the interface that holds it (_engine_group.context); the firewall opens them
    # to the group's other members only.
    env["GLOO_SOCKET_IFNAME"] = group["ifname"] if group else "lo"
    if ENGINE_INFO[engine].host_ip_env:
        env[ENGINE_INFO[engine].host_ip_env] = group["address"] if group else "127.0.0.1"
    if accelerator == "nvidia":
        env["NCCL_SOCKET_IFNAME"] = group["ifname"] if group else "lo"
    ray = bool(group) and group.get("backend") == "ray"
    if ray:
        # Ray's token authentication on every node and every process (the head, the worker nodes,
        # vLLM's driver and its actors); the token itself only in the 0600 secret file
        env["RAY_AUTH_MODE"] = "token"
        if group["rank"] == 0:
            # vLLM's ray.init() joins the head this container started (vllm/v1/executor/ray_utils.py)
            env["RAY_ADDRESS"] = ray_address(group)
    # engine_compile_cache: what the engine compiles (torch.compile, Triton, FlashInfer) lands in the
    # instance's own host folder, kept across restarts; the engine's own keys decide what is reused
    cache = cache_folder(inst, defaults)
    env.update(cache_env(inst, defaults))
    if accelerator == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(inst.get("kv_cache_space_gib", 1))
        if cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    env.update({k: str(v) for k, v in (inst.get("env") or {}).items()})
    drain = drain_of(inst)
    docker = [
        "--rm", "--init", "--name", "gpufleet-%s" % name,
        "--label", "io.gpufleet.engine=%s" % name,
        "--network", "host",
        # docker stop (the unit's ExecStop) waits this long for the drain before it kills
        "--stop-timeout", str(drain + DRAIN_STOP_MARGIN),
    ]  # fmt: skip
    # The role's engine_ulimits: memlock unlimited (pinned host buffers for NCCL/CUDA), a
    # 64 MB stack (SGLang's own docker compose), many open files (vLLM warns below 65536).
    ulimits = defaults.get("ulimits") or {}
    for key in sorted(ulimits):
        docker += ["--ulimit", "%s=%s" % (key, ulimits[key])]
    docker += ["--ipc", "host"] if ipc == "host" else ["--ipc", "private", "--shm-size", shm]
    # engine_cgroup_slices: the container's cgroup goes under the instance's systemd slice (Docker's
    # systemd cgroup driver), which holds the same placement where operators look for it
    # its weights and memory settings: the instance's SLICE_RESOURCES keys
    slice_ = (
        {"name": slice_name(name), "text": slice_unit(name, cpus, mems, resources=inst)}
        if defaults.get("slices")
        else None
    )
    if slice_:
        docker += ["--cgroup-parent", slice_["name"]]
    if cpus:
        docker += ["--cpuset-cpus", cpus]
    if mems:
        docker += ["--cpuset-mems", mems]
    if accelerator == "nvidia":
        docker += ["--gpus", '"device=%s"' % ",".join(str(g) for g in inst["gpus"])]
    for path in defaults.get("env_files") or []:
        docker += ["--env-file", path]
    # The API key stays out of `docker inspect` and every command line: the 0600 file is
    # mounted read-only and sourced by the entrypoint into the engine's own environment.
    docker += [
        "--volume",
        "%s/%s/secret.env:%s:ro" % (defaults.get("config_dir", "/etc/gpufleet/engines"), name, SECRET_MOUNT),
    ]
    for key in sorted(env):
        docker += ["--env", "%s=%s" % (key, env[key])]
    docker += ["--volume", "%s:%s:ro" % (inst["model"], MODEL_MOUNT % name)]
    if cache:
        docker += ["--volume", "%s:%s:rw" % (cache, CACHE_MOUNT)]
    serves = not group or group["rank"] == 0
    if serves:
        probe = "import urllib.request; urllib.request.urlopen('http://%s:%d/health', timeout=5)" % (health_host, port)
        docker += [
            "--health-cmd", "python3 -c \"%s\"" % probe,
            "--health-interval", "30s", "--health-timeout", "10s", "--health-retries", "3",
            "--health-start-period", "%ds" % inst["readiness_timeout"],
        ]  # fmt: skip
    else:
        # a headless worker serves no HTTP: the leader's readiness speaks for the group
        docker += ["--no-healthcheck"]
    # the secret file's variables into the environment, then the command
    source = "set -a; . %s; set +a; " % SECRET_MOUNT
    args = engine_args(inst)
    command = [*((ENGINE_INFO[engine].group_entrypoint if group else None) or ENGINE_INFO[engine].entrypoint), *args]
    if inst.get("api_key_previous") and serves:
        # A key rotation (issue 32): the engine accepts the new key and the one being retired.
        # vLLM reads one key from its environment but a list from --api-key; the list goes
        # through its --config file, which the shell writes (printf is a builtin: no process
        # carries a key on its command line) into the container, readable by root only.
        source += (
            '(umask 077 && printf \'api-key:\\n- "%%s"\\n- "%%s"\\n\' '
            '"$VLLM_API_KEY" "$GPUFLEET_API_KEY_PREVIOUS" > %s); ' % API_KEYS_FILE
        )
        command += ["--config", API_KEYS_FILE]
    script = source + 'exec "$@"'
    if ray:
        # A Ray group: the leader starts the head (it returns once the head runs), then vLLM; a
        # worker runs a Ray node only (vLLM's Ray executor starts its workers there). Every word
        # is a validated port, count or address.
        start = ray_start(group, len(inst.get("gpus") or []))
        if group["rank"] == 0:
            script = source + '%s && exec "$@"' % " ".join(start)
        else:
            command = start
    docker += ["--entrypoint", "/bin/sh", image, "-c", script, "gpufleet-engine", *command]
    return {
        "name": name,
        "engine": engine,
        "accelerator": accelerator,
        "image": image,
        "unit": "gpufleet-engine@%s.service" % name,
        "container": "gpufleet-%s" % name,
        "docker_args": docker,
        # the engine's own command line; a Ray group's worker runs `ray start` instead, and keeps
        # the group's vLLM line here (what the group's members compare: _engine_group.fingerprint)
        "engine_args": args,
        "ipc": ipc,
        "shm_size": shm,
        "cpuset_cpus": cpus,
        "cpuset_mems": mems,
        "placement": why,
        "exclusive_cpus": bool(inst.get("exclusive_cpus")),
        # engine_cgroup_slices: {name, text} of its slice file; None when off
        "slice": slice_,
        "port": port,
        "base_url": base_url(inst),
        "address": upstream_address(inst),
        "served_model_name": served_name(inst),
        "model": inst["model"],
        # engine_compile_cache: its host folder (the role creates it), None when off
        "cache_dir": cache,
        "readiness_timeout": inst["readiness_timeout"],
        "drain_timeout": drain,
        # systemd's TimeoutStopSec for the unit (a drop-in per instance): above docker's stop timeout
        "stop_timeout": drain + DRAIN_UNIT_MARGIN,
        # the longest a restart takes (its surge copy's readiness, the drain, the instance's own
        # readiness, a minute's margin): the watchdog leaves a restarting instance alone that long
        "restart_window": 2 * inst["readiness_timeout"] + drain + DRAIN_UNIT_MARGIN + 60,
        # the GPUs whose faults the watchdog acts on (DCGM): its own unless watch_gpus says
        "watch_gpus": list(inst["watch_gpus"] if "watch_gpus" in inst else inst.get("gpus") or []),
        # the series the watchdog reads the engine's load and progress from (the registry's;
        # None: the engine has none, the probe alone decides)
        "load_series": {
            key: (ENGINE_INFO[engine].metrics.get(key) or (None,))[0] for key in ("running", "waiting", "progress")
        },
        "has_api_key": bool(inst.get("api_key")),
        # False on a multi-node instance's workers: no API, no proxy, no readiness of their own
        "serves": serves,
        "group": _group_record(group),
        # a Ray group's member: the Ray its image must have (the role checks it before the unit starts)
        "ray_min_version": RAY_MIN_VERSION if ray else None,
        "secret_env_names": sorted(inst.get("secret_env") or {}),
        "deployed": deployed(inst, image, (cpus, mems)),
    }
