# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Engine instances: validation and rendering (private to gpufleet.serving).

One implementation behind the engine role's preflight, its templates and the CLI: it takes
the user's ``gpufleet_engines`` list, the host's facts and the models' config.json texts,
and returns either every error (each naming ``gpufleet_engines[i] (name).field``, the value
and the fix) or, per instance, the exact engine command line and ``docker run`` arguments.
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan
from ansible_collections.gpufleet.serving.plugins.module_utils._planner import (
    ModelConfigError,
    load_model_config,
    parallel_errors,
)

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
ENGINES = ("vllm", "sglang")
ACCELERATORS = ("nvidia", "cpu")

# Typed engine options: name -> (type, engines it applies to, vLLM flag, SGLang flag).
# Flags are the engines' own CLI names (vLLM: vllm/engine/arg_utils.py EngineArgs;
# SGLang: python/sglang/srt/server_args.py ServerArgs). A bool maps to a switch; for the
# two defaults-on vLLM switches the --no- form turns them off (argparse BooleanOptionalAction).
OPTIONS = {
    "tensor_parallel_size": (int, ENGINES, "--tensor-parallel-size", "--tp-size"),
    "pipeline_parallel_size": (int, ENGINES, "--pipeline-parallel-size", "--pp-size"),
    "gpu_memory_utilization": (float, ("vllm",), "--gpu-memory-utilization", None),
    "mem_fraction_static": (float, ("sglang",), None, "--mem-fraction-static"),
    "max_model_len": (int, ("vllm",), "--max-model-len", None),
    "context_length": (int, ("sglang",), None, "--context-length"),
    "max_num_seqs": (int, ("vllm",), "--max-num-seqs", None),
    "max_running_requests": (int, ("sglang",), None, "--max-running-requests"),
    "max_num_batched_tokens": (int, ("vllm",), "--max-num-batched-tokens", None),
    "chunked_prefill_size": (int, ("sglang",), None, "--chunked-prefill-size"),
    "enable_chunked_prefill": (bool, ("vllm",), "--enable-chunked-prefill", None),
    "enable_prefix_caching": (bool, ENGINES, "--enable-prefix-caching", None),
    "enforce_eager": (bool, ENGINES, "--enforce-eager", "--disable-cuda-graph"),
    "quantization": (str, ENGINES, "--quantization", "--quantization"),
    "dtype": (str, ENGINES, "--dtype", "--dtype"),
    "kv_cache_dtype": (str, ENGINES, "--kv-cache-dtype", "--kv-cache-dtype"),
    "reasoning_parser": (str, ENGINES, "--reasoning-parser", "--reasoning-parser"),
    "trust_remote_code": (bool, ENGINES, "--trust-remote-code", "--trust-remote-code"),
    "seed": (int, ENGINES, "--seed", "--random-seed"),
}
# The option the other engine calls by another name, for error messages.
COUNTERPART = {
    "gpu_memory_utilization": "mem_fraction_static",
    "mem_fraction_static": "gpu_memory_utilization",
    "max_model_len": "context_length",
    "context_length": "max_model_len",
    "max_num_seqs": "max_running_requests",
    "max_running_requests": "max_num_seqs",
    "max_num_batched_tokens": "chunked_prefill_size",
    "chunked_prefill_size": "max_num_batched_tokens",
    "enable_chunked_prefill": "chunked_prefill_size",
}
# Options the pinned engines no longer have, with what to do instead. vLLM 0.32's own
# parser rejects --swap-space (tests/labtests/test_engine_argparse.py shows it).
REMOVED = {
    "swap_space": "vLLM 0.32 has no --swap-space (its V1 engine recomputes preempted requests instead of "
    "swapping); remove it",
}
CHOICES = {
    "quantization": (
        "awq",
        "awq_marlin",
        "gptq",
        "gptq_marlin",
        "fp8",
        "bitsandbytes",
        "compressed-tensors",
        "modelopt",
    ),
    "dtype": ("auto", "bfloat16", "float16", "float32", "half"),
    "kv_cache_dtype": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"),
}
# Instance keys that are not engine options.
INSTANCE_KEYS = {
    "name", "engine", "accelerator", "image", "model", "served_model_name", "port", "bind", "gpus", "cpus",
    "api_key", "ipc", "shm_size", "kv_cache_space_gib", "extra_args", "env", "readiness_timeout", "options",
    "surge_port",
}  # fmt: skip
# A restart that fits starts a copy of the instance with its new settings first (the surge
# copy, on port + SURGE_PORT_OFFSET unless surge_port says otherwise), so the proxy has a
# ready backup while the instance itself restarts.
SURGE_PORT_OFFSET = 1000
# Two vLLM copies share a GPU only when both budgets fit with room for a second CUDA context.
SURGE_SHARED_LIMIT = 0.9
# vLLM drains on SIGTERM for up to this long (--shutdown-timeout, vllm-project/vllm#36666;
# checked in vLLM 0.32): requests in flight finish, new ones get HTTP 500, which the proxy
# retries on another server. Docker's stop timeout (30 s) stays above it.
VLLM_SHUTDOWN_TIMEOUT = 25

# Official images, pinned. vLLM's CUDA image and its CPU build (x86_64) are published per
# release (docs.vllm.ai, "Using Docker"); SGLang's on Docker Hub (lmsysorg/sglang).
DEFAULT_IMAGES = {
    ("vllm", "nvidia"): "vllm/vllm-openai:v0.32.0",
    ("vllm", "cpu"): "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0",
    ("sglang", "nvidia"): "lmsysorg/sglang:v0.5.23",
}
ENTRYPOINT = {
    "vllm": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
    "sglang": ["python3", "-m", "sglang.launch_server"],
}
MODEL_MOUNT = "/models/%s"
SECRET_MOUNT = "/run/gpufleet/secret.env"
DEFAULT_ULIMITS = {"memlock": "-1", "stack": "67108864", "nofile": "1048576:1048576"}


def _where(i, inst):
    name = inst.get("name") if isinstance(inst, dict) else None
    return "gpufleet_engines[%d]%s" % (i, " (%s)" % name if name else "")


def _typed(value, kind):
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str) and value != ""
    return False


def _cpu_count(cpulist):
    total = 0
    for part in (cpulist or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            total += int(hi) - int(lo) + 1
        else:
            total += 1
    return total


def _options_of(inst):
    """Engine options may sit at the top of the instance or under `options:`."""
    options = (
        {k: v for k, v in (inst.get("options") or {}).items() if k in OPTIONS}
        if isinstance(inst.get("options"), dict)
        else {}
    )
    for key, value in inst.items():
        if key in OPTIONS:
            options[key] = value
    return options


def validate(instances, gpu=None, models=None, host=None):
    """All errors in the instance list, as sentences. Empty list = every instance is valid.

    gpu: gpufleet_gpu facts; models: {path: {"exists": bool, "config": text|None}};
    host: {"numa_nodes": [{"node": n, "cpus": "0-15"}]}.
    """
    errors = []
    gpu = gpu or {}
    models = models or {}
    if not isinstance(instances, list):
        return ["gpufleet_engines must be a list of engine instances, got %s." % type(instances).__name__]
    gpu_count = gpu.get("count") or 0
    seen_names, seen_ports, seen_gpus = {}, {}, {}
    for i, inst in enumerate(instances):
        where = _where(i, inst)
        if not isinstance(inst, dict):
            errors.append("%s must be a mapping with at least name, engine and model." % where)
            continue
        unknown = sorted(set(inst) - INSTANCE_KEYS - set(OPTIONS))
        for key in [k for k in unknown if k in REMOVED]:
            errors.append("%s.%s: %s." % (where, key, REMOVED[key]))
        unknown = [k for k in unknown if k not in REMOVED]
        for key in unknown:
            close = [k for k in sorted(INSTANCE_KEYS | set(OPTIONS)) if _similar(key, k)]
            errors.append(
                "%s: unknown key %r%s. Engine flags without a typed option go in extra_args."
                % (where, key, "; did you mean %s?" % " or ".join(close) if close else "")
            )
        if isinstance(inst.get("options"), dict):
            for key in sorted(set(inst["options"]) - set(OPTIONS)):
                errors.append("%s.options: unknown engine option %r. Use extra_args for other flags." % (where, key))
        elif inst.get("options") is not None:
            errors.append("%s.options must be a mapping of engine options." % where)
        name = inst.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            errors.append(
                "%s.name=%r must be 1-31 lower-case letters, digits or '-' (it names the unit "
                "gpufleet-engine@NAME and the container)." % (where, name)
            )
        elif name in seen_names:
            errors.append("%s.name=%r is already used by gpufleet_engines[%d]." % (where, name, seen_names[name]))
        else:
            seen_names[name] = i
        engine = inst.get("engine", "vllm")
        accelerator = inst.get("accelerator", "nvidia")
        if engine not in ENGINES:
            errors.append("%s.engine=%r must be one of %s." % (where, engine, ", ".join(ENGINES)))
        if accelerator not in ACCELERATORS:
            errors.append("%s.accelerator=%r must be one of %s." % (where, accelerator, ", ".join(ACCELERATORS)))
        if engine == "sglang" and accelerator == "cpu":
            errors.append(
                "%s: engine sglang with accelerator cpu is not supported (SGLang's published builds are CUDA-only); "
                "use engine vllm for CPU instances." % where
            )
        if engine == "sglang" and inst.get("api_key"):
            errors.append(
                "%s.api_key: SGLang takes its key only on the command line, where every local user can read it "
                "(ps); leave api_key unset: the engine binds to loopback and the proxy checks client keys." % where
            )
        # port / bind
        port = inst.get("port")
        if not _typed(port, int) or not 1024 <= port <= 65535:
            errors.append("%s.port=%r must be an integer from 1024 to 65535." % (where, port))
        elif port in seen_ports:
            errors.append(
                "%s.port=%d is already used by gpufleet_engines[%d]; give each instance its own port."
                % (where, port, seen_ports[port])
            )
        else:
            seen_ports[port] = i
        bind = inst.get("bind", "127.0.0.1")
        try:
            ipaddress.ip_address(bind)
        except (TypeError, ValueError):
            errors.append(
                "%s.bind=%r must be an IP address (default 127.0.0.1: only the proxy faces the network)."
                % (where, bind)
            )
        # options: types and engine applicability
        options = _options_of(inst)
        for key, value in sorted(options.items()):
            kind, engines, _, _ = OPTIONS[key]
            if engine in ENGINES and engine not in engines:
                other = COUNTERPART.get(key)
                errors.append("%s.%s is not a %s option%s." % (where, key, engine, "; use %s" % other if other else ""))
                continue
            if value is None:
                continue
            if not _typed(value, kind):
                errors.append(
                    "%s.%s=%r must be %s."
                    % (
                        where,
                        key,
                        value,
                        {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind],
                    )
                )
                continue
            if key in CHOICES and value not in CHOICES[key]:
                errors.append("%s.%s=%r must be one of %s." % (where, key, value, ", ".join(CHOICES[key])))
            if key in ("gpu_memory_utilization", "mem_fraction_static") and not 0 < value <= 1:
                errors.append("%s.%s=%r must be above 0 and at most 1." % (where, key, value))
            if kind is int and key not in ("seed",) and value < 1:
                errors.append("%s.%s=%r must be at least 1." % (where, key, value))
        extra = inst.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            errors.append("%s.extra_args must be a list of strings (one flag or value each)." % where)
        elif any("\n" in a for a in extra):
            errors.append("%s.extra_args: an argument contains a newline." % where)
        elif any(a.split("=", 1)[0] in ("--api-key", "--host", "--port", "--model", "--model-path") for a in extra):
            errors.append(
                "%s.extra_args must not set --api-key, --host, --port or --model: gpufleet sets them "
                "(api_key, bind, port, model)." % where
            )
        env = inst.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str)
            and re.match(r"^[A-Z_][A-Z0-9_]*$", k)
            and isinstance(v, (str, int, float))
            and not isinstance(v, bool)
            and "\n" not in str(v)
            for k, v in env.items()
        ):
            errors.append("%s.env must map UPPER_CASE names to one-line strings or numbers." % where)
        pp = options.get("pipeline_parallel_size") or 1
        # GPUs
        gpus = inst.get("gpus", [])
        if not isinstance(gpus, list) or not all(_typed(g, int) for g in gpus):
            errors.append("%s.gpus=%r must be a list of GPU indices, e.g. [0, 1]." % (where, gpus))
            gpus = []
        # Unpinned TP spreads the model over all the instance's GPUs.
        tp = options.get("tensor_parallel_size") or _default_tp(inst, gpus, pp)
        if accelerator == "nvidia":
            if not gpus:
                errors.append("%s.gpus is required for accelerator nvidia (the device indices it runs on)." % where)
            for g in gpus:
                if g < 0 or g >= gpu_count:
                    errors.append(
                        "%s.gpus: GPU %d does not exist on this host (nvidia-smi lists %d GPU%s%s)."
                        % (
                            where,
                            g,
                            gpu_count,
                            "" if gpu_count == 1 else "s",
                            ": 0-%d" % (gpu_count - 1) if gpu_count else "",
                        )
                    )
                elif g in seen_gpus:
                    errors.append(
                        "%s.gpus: GPU %d is already given to gpufleet_engines[%d]; an engine needs its GPUs to itself."
                        % (where, g, seen_gpus[g])
                    )
                else:
                    seen_gpus[g] = i
            if len(set(gpus)) != len(gpus):
                errors.append("%s.gpus=%r lists a GPU twice." % (where, gpus))
            if _typed(tp, int) and _typed(pp, int) and gpus and len(gpus) != tp * pp:
                errors.append(
                    "%s: %d GPU(s) given but tensor_parallel_size x pipeline_parallel_size = %d x %d = %d; "
                    "they must match." % (where, len(gpus), tp, pp, tp * pp)
                )
        elif gpus:
            errors.append("%s.gpus must be empty for accelerator cpu." % where)
        if accelerator == "cpu":
            space = inst.get("kv_cache_space_gib", 1)
            if not _typed(space, int) or space < 1:
                errors.append(
                    "%s.kv_cache_space_gib=%r must be an integer of at least 1 (VLLM_CPU_KVCACHE_SPACE)."
                    % (where, space)
                )
            cpus = inst.get("cpus")
            if cpus is not None and (not isinstance(cpus, str) or not re.match(r"^\d+(-\d+)?(,\d+(-\d+)?)*$", cpus)):
                errors.append("%s.cpus=%r must be a CPU list like '0-7' or '0-3,8-11'." % (where, cpus))
        ipc = inst.get("ipc", "auto")
        if ipc not in ("auto", "host", "private"):
            errors.append("%s.ipc=%r must be auto, host or private." % (where, ipc))
        shm = inst.get("shm_size")
        if shm is not None and (
            not isinstance(shm, str) or not re.match(r"^\d+[kmg]$", shm) or _bytes(shm) <= 64 * 2**20
        ):
            errors.append(
                "%s.shm_size=%r must be like '8g' and above Docker's 64m default (multi-process engines die with "
                "'Bus error' in 64 MB)." % (where, shm)
            )
        rt = inst.get("readiness_timeout", 900)
        if not _typed(rt, int) or rt < 10:
            errors.append("%s.readiness_timeout=%r must be an integer number of seconds, at least 10." % (where, rt))
        # model: present on the host, and the parallel layout fits its shape
        model = inst.get("model")
        if not isinstance(model, str) or not model.startswith("/"):
            errors.append(
                "%s.model=%r must be the absolute path of a model folder on the host (hub ids are downloaded "
                "there first with engine_model_downloads)." % (where, model)
            )
        else:
            info = models.get(model) or {}
            if info.get("pending_download"):
                pass  # checked again right after engine_model_downloads fetched it
            elif not info.get("exists"):
                errors.append(
                    "%s.model=%s does not exist on this host; download or copy it there first." % (where, model)
                )
            elif info.get("config") is None:
                errors.append(
                    "%s.model=%s has no readable config.json; is it a Hugging Face model folder?" % (where, model)
                )
            elif _typed(tp, int) and _typed(pp, int):
                try:
                    config = load_model_config(info["config"])
                    errors.extend(
                        parallel_errors(config, tp, pp, where="%s (model %s)" % (where, model), engine=engine)
                    )
                except ModelConfigError as exc:
                    errors.append("%s.model=%s: %s" % (where, model, exc))
    errors.extend(_surge_port_errors(instances))

    return errors


def surge_port(inst):
    """The port of the instance's surge copy: surge_port, else port + SURGE_PORT_OFFSET."""
    if inst.get("surge_port") is not None or not _typed(inst.get("port"), int):
        return inst.get("surge_port")
    return inst["port"] + SURGE_PORT_OFFSET


def _surge_port_errors(instances):
    taken = {}
    for i, inst in enumerate(instances):
        if isinstance(inst, dict) and _typed(inst.get("port"), int):
            taken.setdefault(inst["port"], "the port of gpufleet_engines[%d]" % i)
    errors = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict) or not _typed(inst.get("port"), int):
            continue
        where, port = _where(i, inst), surge_port(inst)
        if not _typed(port, int) or not 1024 <= port <= 65535:
            errors.append(
                "%s.surge_port=%r must be an integer from 1024 to 65535 (the port of the copy started beside the "
                "instance while it restarts; default port + %d)." % (where, port, SURGE_PORT_OFFSET)
            )
        elif port in taken:
            errors.append(
                "%s: its surge copy's port %d (surge_port, default port + %d) is already %s; set surge_port to a "
                "free port." % (where, port, SURGE_PORT_OFFSET, taken[port])
            )
        else:
            taken[port] = "the surge port of gpufleet_engines[%d]" % i
    return errors


def _default_tp(inst, gpus, pp):
    if inst.get("accelerator", "nvidia") == "cpu" or not gpus or not _typed(pp, int) or pp < 1:
        return 1
    return max(1, len(gpus) // pp)


def _similar(a, b):
    a, b = a.lower(), b.lower()
    if a == b:
        return False
    if a.replace("-", "_") == b or a in b or (b in a and len(b) > 3):
        return True
    if abs(len(a) - len(b)) > 2:
        return False
    # at most two edits apart (Levenshtein: a letter left out, added or changed)
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1] <= 2


def _bytes(size):
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    return int(size[:-1]) * units[size[-1]]


def _flag_value(value):
    if isinstance(value, float):
        return repr(value)
    return str(value)


def engine_args(inst):
    """The engine's own command line (after the entrypoint) for a validated instance."""
    engine = inst.get("engine", "vllm")
    name = inst["name"]
    served = inst.get("served_model_name") or name
    model = MODEL_MOUNT % name
    if engine == "vllm":
        args = ["--model", model, "--served-model-name", served]
    else:
        args = ["--model-path", model, "--served-model-name", served]
    args += ["--host", inst.get("bind", "127.0.0.1"), "--port", str(inst["port"])]
    if engine == "vllm":
        args += ["--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT)]
    options = _options_of(inst)
    for key in OPTIONS:
        value = options.get(key)
        if value is None:
            continue
        _, _, vflag, sflag = OPTIONS[key]
        if engine == "vllm":
            if key in ("enable_prefix_caching", "enable_chunked_prefill"):
                args.append(vflag if value else vflag.replace("--enable-", "--no-enable-"))
            elif isinstance(value, bool):
                if value:
                    args.append(vflag)
            else:
                args += [vflag, _flag_value(value)]
        else:
            if key == "enable_prefix_caching":
                if not value:
                    args.append("--disable-radix-cache")
            elif isinstance(value, bool):
                if value:
                    args.append(sflag)
            else:
                args += [sflag, _flag_value(value)]
    return args + list(inst.get("extra_args") or [])


def ipc_mode(inst):
    """('host', None) or ('private', shm size).

    Docker's 64 MB /dev/shm kills multi-process engines with "Bus error" (NCCL's SHM
    transport, PyTorch's shared tensors, vLLM's shared-memory message queues). SGLang's and
    vLLM's docs run with --ipc=host; gpufleet does that whenever several GPUs (TP/PP > 1)
    share memory or the engine is SGLang, and otherwise gives the container its own sized
    /dev/shm so it does not see the host's IPC namespace.
    """
    ipc = inst.get("ipc", "auto")
    options = _options_of(inst)
    ranks = (options.get("tensor_parallel_size") or 1) * (options.get("pipeline_parallel_size") or 1)
    if ipc == "host" or (ipc == "auto" and (inst.get("engine", "vllm") == "sglang" or ranks > 1)):
        return "host", None
    default = "1g" if inst.get("accelerator", "nvidia") == "cpu" else "8g"
    return "private", inst.get("shm_size") or default


def placement(inst, gpu=None, host=None):
    """(cpuset_cpus, cpuset_mems, reason) for an instance: the CPUs and memory node next
    to its GPUs; for accelerator cpu, its `cpus` or the host's first NUMA node."""
    gpu = gpu or {}
    host = host or {}
    nodes = host.get("numa_nodes") or []
    node_cpus = {n["node"]: n["cpus"] for n in nodes if n.get("cpus")}
    if inst.get("accelerator", "nvidia") == "cpu":
        if inst.get("cpus"):
            mems = sorted(n for n, c in node_cpus.items() if _overlaps(c, inst["cpus"]))
            return inst["cpus"], ",".join(map(str, mems)) or None, "cpus given for the instance"
        if node_cpus:
            first = sorted(node_cpus)[0]
            return node_cpus[first], str(first), "CPU instance on NUMA node %d" % first
        return None, None, "host NUMA layout unknown: no pinning"
    devices = {d["index"]: d for d in gpu.get("devices") or []}
    mine = [devices[g] for g in inst.get("gpus") or [] if g in devices]
    numa = sorted({d["numa_node"] for d in mine if d.get("numa_node") is not None})
    cpus = sorted({d["cpus"] for d in mine if d.get("cpus")})
    if len(numa) == 1 and numa[0] in node_cpus:
        return node_cpus[numa[0]], str(numa[0]), "GPUs %s sit on NUMA node %d" % (inst.get("gpus"), numa[0])
    if len(cpus) == 1:
        return (
            cpus[0],
            (str(numa[0]) if len(numa) == 1 else None),
            "GPUs %s are local to CPUs %s" % (inst.get("gpus"), cpus[0]),
        )
    if len(numa) > 1:
        return (
            None,
            None,
            "GPUs %s span NUMA nodes %s: no pinning (place an instance's GPUs on one node)" % (inst.get("gpus"), numa),
        )
    return None, None, "GPU NUMA placement unknown: no pinning"


def _overlaps(a, b):
    def expand(s):
        out = set()
        for part in s.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                out.update(range(int(lo), int(hi) + 1))
            elif part:
                out.add(int(part))
        return out

    return bool(expand(a) & expand(b))


def local_address(bind):
    """Where a client on the same host reaches an engine bound to `bind` (wildcards: loopback)."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::", None) else bind


def render(inst, gpu=None, host=None, defaults=None):
    """Everything the role writes for one validated instance."""
    defaults = defaults or {}
    engine = inst.get("engine", "vllm")
    accelerator = inst.get("accelerator", "nvidia")
    name = inst["name"]
    image = (
        inst.get("image")
        or (defaults.get("images") or {}).get("%s_%s" % (engine, accelerator))
        or DEFAULT_IMAGES[(engine, accelerator)]
    )
    ipc, shm = ipc_mode(inst)
    cpus, mems, why = placement(inst, gpu, host)
    port = inst["port"]
    health_host = local_address(inst.get("bind", "127.0.0.1"))
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if accelerator == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(inst.get("kv_cache_space_gib", 1))
        if cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    env.update({k: str(v) for k, v in (inst.get("env") or {}).items()})
    docker = [
        "--rm", "--init", "--name", "gpufleet-%s" % name,
        "--label", "io.gpufleet.engine=%s" % name,
        "--network", "host",
        "--stop-timeout", "30",
    ]  # fmt: skip
    # memlock unlimited (pinned host buffers for NCCL/CUDA), a 64 MB stack (SGLang's own
    # docker compose), many open files (vLLM warns below 65536).
    ulimits = dict(DEFAULT_ULIMITS, **(defaults.get("ulimits") or {}))
    for key in sorted(ulimits):
        docker += ["--ulimit", "%s=%s" % (key, ulimits[key])]
    docker += ["--ipc", "host"] if ipc == "host" else ["--ipc", "private", "--shm-size", shm]
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
    probe = "import urllib.request; urllib.request.urlopen('http://%s:%d/health', timeout=5)" % (health_host, port)
    docker += [
        "--health-cmd", "python3 -c \"%s\"" % probe,
        "--health-interval", "30s", "--health-timeout", "10s", "--health-retries", "3",
        "--health-start-period", "%ds" % inst.get("readiness_timeout", 900),
    ]  # fmt: skip
    entry = ["/bin/sh", "-c", 'set -a; . %s; set +a; exec "$@"' % SECRET_MOUNT, "gpufleet-engine", *ENTRYPOINT[engine]]
    args = engine_args(inst)
    docker += ["--entrypoint", entry[0], image, *entry[1:], *args]
    return {
        "name": name,
        "engine": engine,
        "accelerator": accelerator,
        "image": image,
        "unit": "gpufleet-engine@%s.service" % name,
        "container": "gpufleet-%s" % name,
        "docker_args": docker,
        "engine_args": args,
        "ipc": ipc,
        "shm_size": shm,
        "cpuset_cpus": cpus,
        "cpuset_mems": mems,
        "placement": why,
        "port": port,
        "base_url": "http://%s:%d" % (health_host if ":" not in health_host else "[%s]" % health_host, port),
        "served_model_name": inst.get("served_model_name") or name,
        "model": inst["model"],
        "readiness_timeout": inst.get("readiness_timeout", 900),
        "has_api_key": bool(inst.get("api_key")),
    }


def surge(inst, instances, plan_=None, gpu=None, host=None, defaults=None):
    """Can a copy of the instance, with its new settings, run beside the running one while it
    restarts (start-before-stop)? {fits, why, port, gpus, need_mib (CPU), docker_args, container,
    base_url}. `inst` carries the planned options."""
    defaults, host, gpu = defaults or {}, host or {}, gpu or {}
    port = surge_port(inst)
    out = {"fits": False, "port": port, "gpus": []}
    accelerator = inst.get("accelerator", "nvidia")
    gib = 2.0**30
    if defaults.get("surge", "auto") == "never":
        out["why"] = "engine_surge is never"
    elif accelerator == "cpu":
        available = host.get("memory_available_mib")
        weights = (plan_ or {}).get("weights_host_bytes")
        # KV space + weights + 1 GiB for the runtime (torch, the server, the tokenizer)
        need = int(inst.get("kv_cache_space_gib", 1)) * 2**30 + (weights or 0) + 2**30
        out["need_mib"] = int(need / 2**20)
        if not available or weights is None:
            out["why"] = "the host's free memory or the model's size is unknown"
        elif need > available * 2**20:
            out["why"] = "a copy needs %.1f GiB of host memory, %.1f GiB is free" % (need / gib, available / 1024.0)
        else:
            out.update(fits=True, why="a copy needs %.1f GiB, %.1f GiB is free" % (need / gib, available / 1024.0))
    else:
        devices = {d.get("index"): d for d in gpu.get("devices") or []}
        mine = list(inst.get("gpus") or [])
        given = {g for other in instances if isinstance(other, dict) for g in other.get("gpus") or []}
        size = min([devices[g].get("memory_total_mib") or 0 for g in mine if g in devices] or [0])
        idle = [g for g in sorted(devices) if g not in given and (devices[g].get("memory_total_mib") or 0) >= size]
        options = _options_of(inst)
        share = options.get("gpu_memory_utilization") if inst.get("engine", "vllm") == "vllm" else None
        if size and len(idle) >= len(mine):
            # idle GPUs on the instance's NUMA node(s) first
            nodes = {devices[g].get("numa_node") for g in mine}
            idle.sort(key=lambda g: devices[g].get("numa_node") not in nodes)
            out.update(fits=True, gpus=sorted(idle[: len(mine)]))
            out["why"] = "GPUs %s are idle" % out["gpus"]
        elif share and 2 * share <= SURGE_SHARED_LIMIT:
            out.update(fits=True, gpus=mine)
            out["why"] = "two copies at gpu_memory_utilization %.2f fit on GPUs %s" % (share, mine)
        else:
            out["why"] = "no %d idle GPU%s beside GPUs %s, and %s" % (
                len(mine),
                "" if len(mine) == 1 else "s",
                mine,
                "gpu_memory_utilization %.2f leaves no room for a second copy" % share
                if share
                else "without a planned gpu_memory_utilization no second copy is planned on them",
            )
    # The copy's arguments are written whether or not it fits now (a CPU host's free memory
    # changes from run to run; the file must not): where it would run, else the instance's GPUs.
    copy = render(
        dict(inst, port=port, gpus=out["gpus"] or inst.get("gpus") or []), gpu=gpu, host=host, defaults=defaults
    )
    name = inst["name"]
    args = list(copy["docker_args"])
    args[args.index("gpufleet-%s" % name)] = "gpufleet-%s-surge" % name
    at = args.index("--label")
    args[at : at + 2] = ["--label", "io.gpufleet.engine=%s" % name, "--label", "io.gpufleet.surge=true"]
    out.update(docker_args=args, container="gpufleet-%s-surge" % name, base_url=copy["base_url"])
    return out


def memory_plans(instances, gpu=None, models=None):
    """The memory plan of every validated instance whose model config is at hand:
    ({name: plan}, errors). A plan's options fill in what the instance does not pin."""
    gpu = gpu or {}
    devices = {d.get("index"): d for d in gpu.get("devices") or []}
    plans, errors, skipped = {}, [], {}
    for i, inst in enumerate(instances):
        where = _where(i, inst)
        info = (models or {}).get(inst.get("model")) or {}
        if not info.get("config"):
            continue
        options = _options_of(inst)
        pp = options.get("pipeline_parallel_size") or 1
        pins = {k: options.get(k) for k in _memory_plan.PIN_KEYS if options.get(k) is not None}
        accelerator = inst.get("accelerator", "nvidia")
        try:
            config = load_model_config(info["config"])
            if accelerator == "cpu":
                space = int(inst.get("kv_cache_space_gib", 1)) * 2**30
                plan_ = _memory_plan.plan_memory(config, accelerator="cpu", pins=pins, kv_space_bytes=space)
            else:
                mine = [devices[g] for g in inst.get("gpus") or [] if g in devices]
                sizes = [d.get("memory_total_mib") for d in mine if d.get("memory_total_mib")]
                if not sizes or pp != 1:
                    skipped[inst["name"]] = (
                        "memory plan skipped: nvidia-smi gave no memory size for GPUs %s" % inst.get("gpus")
                        if not sizes
                        else "memory plan skipped: pipeline parallelism is not planned"
                    )
                    continue
                pins.setdefault("tensor_parallel_size", len(inst["gpus"]))
                plan_ = _memory_plan.plan_memory(
                    config,
                    gpus=len(inst["gpus"]),
                    gpu_memory_bytes=_memory_plan.usable_bytes(min(sizes)),
                    engine=inst.get("engine", "vllm"),
                    pins=pins,
                    gpu_name=mine[0].get("name"),
                )
        except (ModelConfigError, _memory_plan.PlanInputError, KeyError, TypeError, ValueError) as exc:
            errors.append("%s.model=%s: the memory plan cannot read it: %s" % (where, inst.get("model"), exc))
            continue
        for message in plan_["errors"]:
            errors.append("%s (memory plan): %s" % (where, message))
        plans[inst["name"]] = plan_
    return plans, errors, skipped


def _with_plan(inst, plan_):
    """The instance with the plan's values for every option it does not pin (and, without a
    plan, tensor_parallel_size spread over the instance's GPUs)."""
    pinned = _options_of(inst)
    merged = dict(inst)
    if not plan_:
        if pinned.get("tensor_parallel_size") is None and inst.get("accelerator", "nvidia") != "cpu":
            tp = _default_tp(inst, inst.get("gpus") or [], pinned.get("pipeline_parallel_size") or 1)
            if tp > 1:
                merged["tensor_parallel_size"] = tp
        return merged
    for key, value in (plan_.get("options") or {}).items():
        if pinned.get(key) is None:
            merged[key] = value
    return merged


def memory_summary(plan_):
    """One diff-friendly line per figure, for the role's output."""
    if not plan_:
        return []
    gib = 2.0**30
    lines = []
    if plan_.get("weights_bytes_per_gpu") is not None:
        lines.append(
            "per GPU: weights %.2f GiB, KV cache %.2f GiB, activations %.2f GiB, CUDA graphs %.2f GiB, "
            "context+NCCL %.2f GiB of %.2f GiB"
            % (
                plan_["weights_bytes_per_gpu"] / gib,
                plan_["kv_cache_bytes_per_gpu"] / gib,
                plan_["activation_bytes_per_gpu"] / gib,
                plan_["cudagraph_bytes_per_gpu"] / gib,
                plan_["outside_bytes_per_gpu"] / gib,
                plan_["gpu_memory_bytes"] / gib,
            )
        )
    lines.append(
        "KV cache: %d tokens (%d B/token/GPU), max_model_len %d, %.2f requests at full length"
        % (
            plan_["kv_cache_tokens"],
            plan_["kv_bytes_per_token_per_gpu"],
            plan_["max_model_len"],
            plan_["max_concurrency"],
        )
    )
    lines.extend("why: %s" % r for r in plan_.get("reasons") or [])
    lines.extend("warning: %s" % w for w in plan_.get("warnings") or [])
    return lines


def plan(instances, gpu=None, models=None, host=None, defaults=None):
    """validate + memory plan + render: {errors: [...], instances: [...]} (instances empty on
    errors). Each rendered instance carries its memory plan's summary lines."""
    errors = validate(instances, gpu=gpu, models=models, host=host)
    if errors:
        return {"errors": errors, "instances": []}
    plans, errors, skipped = memory_plans(instances, gpu=gpu, models=models)
    if errors:
        return {"errors": errors, "instances": []}
    rendered = []
    for inst in instances:
        planned = _with_plan(inst, plans.get(inst["name"]))
        out = render(planned, gpu=gpu, host=host, defaults=defaults)
        out["surge"] = surge(planned, instances, plans.get(inst["name"]), gpu=gpu, host=host, defaults=defaults)
        out["memory_plan"] = memory_summary(plans.get(inst["name"])) or (
            [skipped[inst["name"]]] if inst["name"] in skipped else []
        )
        rendered.append(out)
    return {"errors": [], "instances": rendered}
