# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation of the engine role's ``gpufleet_engines`` (private to gpufleet.serving).

One small check per field, each returning sentences that name
``gpufleet_engines[i] (name).field``, the value and the fix; the engine options are checked
against _engine_options. validate() runs them all and reports every error at once.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import (
    BACKENDS,
    DEFAULT_MASTER_PORT,
    DEFAULT_RAY_DASHBOARD_PORT,
    DEFAULT_RAY_PORT,
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_PORT,
    RAY_TOKEN_MIN_LENGTH,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    ACCELERATORS,
    ENGINE_INFO,
    ENGINES,
    INSTANCE_KEYS,
    KIND_WORDS,
    OPTIONS,
    OWN_ENV,
    OWN_FLAGS,
    REMOVED,
    SECRET_ENV_HINTS,
    default_pipeline_parallel_size,
    default_tensor_parallel_size,
    is_type,
    label,
    normalized,
    options_of,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import image_key, image_of, placement
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_surge import SURGE_PORT_OFFSET, surge_port
from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import (
    ModelConfigError,
    load_model_config,
    parallel_errors,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._placement import (
    SLICE_RESOURCES,
    cpu_list,
    cpu_set,
    node_cpu_sets,
)

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# A model folder: an absolute path of plain segments. No ':' or ',' (docker's --volume
# separators), no control characters (the run file holds one argument per line), no '.' or
# '..' segments and no '//' (the path is the one the host and the container agree on).
MODEL_PATH = re.compile(r"^(/[A-Za-z0-9_@+=~][A-Za-z0-9._@+=~ -]*)+/?$")
SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
# A docker image reference: [registry[:port]/]path[:tag][@sha256:digest] (docker's grammar,
# distribution/reference), lower-case path components.
IMAGE_REF = re.compile(
    r"^(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
# A free-text engine option's value (reasoning_parser ...): a word, no spaces or control characters.
OPTION_WORD = re.compile(r"^[A-Za-z0-9_.:/+-]{1,128}$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
LOOPBACK = ("127.0.0.1", "::1")
CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
SHM_SIZE = re.compile(r"^\d+[kmg]$")
IPC_MODES = ("auto", "host", "private")


@dataclass
class Host:
    """What the checks know about the host, and what earlier instances took."""

    gpu_count: int = 0
    # the GPUs' own indices (nvidia-smi's), None when only the count is known
    gpu_indices: Optional[List[int]] = None
    models: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)
    names: Dict[str, int] = field(default_factory=dict)
    ports: Dict[int, int] = field(default_factory=dict)
    gpus: Dict[int, int] = field(default_factory=dict)
    # the CPUs of the host's NUMA nodes (gpu_facts' numa_nodes), None when unknown
    cpus: Optional[set] = None
    # {node: its CPUs} and {GPU index: its NUMA node}, where gpu_facts knows them
    node_cpus: Dict[int, set] = field(default_factory=dict)
    gpu_nodes: Dict[int, int] = field(default_factory=dict)
    # engine_housekeeping_cpus, as a set (empty: none kept for the host's services)
    housekeeping: set = field(default_factory=set)
    # engine_cgroup_slices: each instance's slice holds its resource settings
    slices: bool = False
    # why slices are on or off on this host (the plan's slices_setting)
    slices_why: str = "engine_cgroup_slices is false"


@dataclass
class Instance:
    """One instance as the checks see it."""

    index: int
    where: str
    raw: dict
    engine: str
    accelerator: str
    options: dict
    gpus: List[int]  # [] when gpus is not a list of integers
    tp: object
    pp: object
    # hosts the instance spans (1: a single-host instance; `nodes` of a multi-node one)
    nodes: int = 1

    @classmethod
    def of(cls, i: int, inst: dict, where: Optional[str] = None) -> "Instance":
        options = options_of(inst)
        record = normalized(inst)
        gpus = inst.get("gpus", [])
        if not isinstance(gpus, list) or not all(is_type(g, int) for g in gpus):
            gpus = []
        nodes = inst.get("nodes")
        count = len(nodes) if isinstance(nodes, list) and len(nodes) > 1 else 1
        # a multi-node instance: pipeline parallel across its nodes unless pinned
        pp = options.get("pipeline_parallel_size") or default_pipeline_parallel_size(inst, count)
        return cls(
            index=i,
            where=where or label(i, inst),
            raw=inst,
            engine=record["engine"],
            accelerator=record["accelerator"],
            options=options,
            gpus=gpus,
            tp=options.get("tensor_parallel_size") or default_tensor_parallel_size(inst, gpus, pp, count),
            pp=pp,
            nodes=count,
        )


def validate(instances, gpu=None, models=None, host=None, defaults=None, members=None) -> List[str]:
    """All errors in the instance list, as sentences. Empty list = every instance is valid.

    gpu: gpufleet_gpu facts; models: {path: {"exists": bool, "config": text|None}};
    host: {"name": inventory name, "hosts": the gpu hosts} for multi-node instances;
    defaults: the role's settings, of which `images` (engine_images) is checked;
    members: the multi-node instances this host joins as a worker (_engine_group.memberships):
    checked for what they take on this host (a name, GPUs).
    """
    if not isinstance(instances, list):
        return ["gpufleet_engines must be a list of engine instances, got %s." % type(instances).__name__]
    devices = (gpu or {}).get("devices")
    nodes = node_cpu_sets((host or {}).get("numa_nodes"))
    seen = Host(
        gpu_count=(gpu or {}).get("count") or 0,
        gpu_indices=[d.get("index") for d in devices if isinstance(d, dict)] if isinstance(devices, list) else None,
        models=models or {},
        images=(defaults or {}).get("images") or {},
        cpus=set().union(*nodes.values()) or None,
        node_cpus=nodes,
        gpu_nodes={
            d["index"]: d["numa_node"]
            for d in (devices if isinstance(devices, list) else [])
            if isinstance(d, dict) and is_type(d.get("index"), int) and is_type(d.get("numa_node"), int)
        },
        housekeeping=cpu_set((host or {}).get("housekeeping_cpus")) or set(),
        slices=(defaults or {}).get("slices") is True,
        slices_why=(defaults or {}).get("slices_why") or Host.slices_why,
    )
    errors = _housekeeping((host or {}).get("housekeeping_cpus"), seen)
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict):
            errors.append("%s must be a mapping with at least name, engine and model." % label(i, inst))
            continue
        one = Instance.of(i, inst)
        for check in CHECKS:
            errors.extend(check(one, seen))
        errors.extend(_group(one, host or {}))
    for j, member in enumerate(members or []):
        inst = member["instance"]
        where = "%s's multi-node instance %s (node rank %d here)" % (member["group"]["leader"], inst.get("name"),
                                                                     member["rank"])  # fmt: skip
        one = Instance.of(len(instances) + j, inst, where=where)
        for check in (_name, _gpus):
            errors.extend(check(one, seen))
    errors.extend(_surge_ports(instances))
    if not errors:
        # where each instance lands needs valid instances: checked once they are
        errors.extend(_cpu_split(instances, members, gpu, host))
    errors.extend(_ray_hosts(instances, members))
    errors.extend(_downloads((defaults or {}).get("downloads") or []))
    errors.extend(_cache_dir((defaults or {}).get("cache_dir")))
    return errors


HUB_REPO = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HUB_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


def plain_path(path) -> bool:
    """An absolute path of plain segments (MODEL_PATH), without '.' or '..' segments."""
    return isinstance(path, str) and bool(MODEL_PATH.fullmatch(path)) and not re.search(r"/\.\.?(/|$)", path)


def _downloads(downloads) -> List[str]:
    """engine_model_downloads: each entry's repo_id, path and revision reach a command line."""
    if not isinstance(downloads, list):
        return ["engine_model_downloads must be a list of {repo_id, path, revision}."]
    errors = []
    for i, entry in enumerate(downloads):
        where = "engine_model_downloads[%d]" % i
        if not isinstance(entry, dict):
            errors.append("%s must be a mapping with repo_id and path." % where)
            continue
        repo, path, rev = entry.get("repo_id"), entry.get("path"), entry.get("revision", "main")
        if not (isinstance(repo, str) and HUB_REPO.fullmatch(repo)):
            errors.append("%s.repo_id=%r must be a hub repository id like Qwen/Qwen2.5-7B-Instruct." % (where, repo))
        if not plain_path(path):
            errors.append(
                "%s.path=%r must be a plain absolute folder path on the host (no ':' or ',', no line breaks, no '..')."
                % (where, path)
            )
        if not (isinstance(rev, str) and HUB_REVISION.fullmatch(rev)):
            errors.append("%s.revision=%r must be a branch, tag or commit id like main." % (where, rev))
    return errors


def _cache_dir(root) -> List[str]:
    """engine_cache_dir (when engine_compile_cache is on): the host side of a docker --volume."""
    if root in (None, "") or plain_path(root):
        return []
    return [
        "engine_cache_dir=%r must be a plain absolute folder path on the host (no ':' or ',', no line breaks, no "
        "'..'): each instance's compile caches go in a folder of its own under it; or set engine_compile_cache: "
        "false." % (root,)
    ]


# ---------------------------------------------------------------- keys


def _keys(one: Instance, seen: Host) -> List[str]:
    unknown = sorted(set(one.raw) - set(INSTANCE_KEYS) - set(OPTIONS))
    errors = ["%s.%s: %s." % (one.where, key, REMOVED[key]) for key in unknown if key in REMOVED]
    for key in [k for k in unknown if k not in REMOVED]:
        close = [k for k in sorted(set(INSTANCE_KEYS) | set(OPTIONS)) if _similar(key, k)]
        errors.append(
            "%s: unknown key %r%s. Engine flags without a typed option go in extra_args."
            % (one.where, key, "; did you mean %s?" % " or ".join(close) if close else "")
        )
    return errors


def _options_mapping(one: Instance, seen: Host) -> List[str]:
    nested = one.raw.get("options")
    if isinstance(nested, dict):
        return [
            "%s.options: unknown engine option %r. Use extra_args for other flags." % (one.where, key)
            for key in sorted(set(nested) - set(OPTIONS))
        ]
    if nested is not None:
        return ["%s.options must be a mapping of engine options." % one.where]
    return []


# ---------------------------------------------------------------- identity and engine


def _name(one: Instance, seen: Host) -> List[str]:
    name = one.raw.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return [
            "%s.name=%r must be 1-31 lower-case letters, digits or '-' (it names the unit "
            "gpufleet-engine@NAME and the container)." % (one.where, name)
        ]
    if name in seen.names:
        return ["%s.name=%r is already used by gpufleet_engines[%d]." % (one.where, name, seen.names[name])]
    seen.names[name] = one.index
    return []


def _engine(one: Instance, seen: Host) -> List[str]:
    errors = []
    if one.engine not in ENGINES:
        errors.append("%s.engine=%r must be one of %s." % (one.where, one.engine, ", ".join(ENGINES)))
    if one.accelerator not in ACCELERATORS:
        errors.append("%s.accelerator=%r must be one of %s." % (one.where, one.accelerator, ", ".join(ACCELERATORS)))
    info = _engine_info(one)
    if info and one.accelerator in ACCELERATORS and one.accelerator not in info.accelerators:
        others = [e for e in ENGINES if one.accelerator in ENGINE_INFO[e].accelerators]
        errors.append(
            "%s: engine %s with accelerator %s is not supported (%s); use engine %s for %s instances."
            % (
                one.where,
                one.engine,
                one.accelerator,
                info.accelerator_note,
                " or ".join(others),
                one.accelerator.upper(),
            )
        )
    return errors


def _served_model_name(one: Instance, seen: Host) -> List[str]:
    served = one.raw.get("served_model_name")
    if served is not None and not (isinstance(served, str) and SERVED_NAME.fullmatch(served)):
        return [
            "%s.served_model_name=%r must be 1-128 letters, digits and . _ : / @ + - , starting with a letter or "
            "digit (clients send it as the model's name)." % (one.where, served)
        ]
    return []


def _drain_timeout(one: Instance, seen: Host) -> List[str]:
    value = one.raw.get("drain_timeout")
    if value is not None and not (is_type(value, int) and 1 <= value <= 86400):
        return [
            "%s.drain_timeout=%r must be whole seconds from 1 to 86400: how long a stopping instance lets its "
            "requests finish (unset: its longest generation at 20 tokens/s)." % (one.where, value)
        ]
    return []


def _engine_info(one: Instance):
    """The registry's entry for the instance's engine; None for a name it does not know (or a
    value that is not a name: its own check names it)."""
    return ENGINE_INFO.get(one.engine) if isinstance(one.engine, str) else None


# the characters an engine key may hold: the proxy writes it into an nginx header, and the
# previous key goes into a YAML list the container's shell writes (_engine_render)
ENGINE_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]+$")


def _api_key(one: Instance, seen: Host) -> List[str]:
    info = _engine_info(one)
    if info is not None and not info.api_key_from_env and one.raw.get("api_key"):
        return [
            "%s.api_key: %s takes its key only on the command line, where every local user can read it "
            "(ps); leave api_key unset: the engine binds to loopback and the proxy checks client keys."
            % (one.where, info.label)
        ]
    previous = one.raw.get("api_key_previous")
    if previous in (None, ""):
        return []
    # A key rotation without a 401 window (issue 32): the instance accepts the key being
    # retired beside the new one while the proxies switch; a second rollout without it
    # retires it.
    if info is not None and not info.api_key_from_env:
        return ["%s.api_key_previous: %s takes no API key here (see api_key); remove it." % (one.where, info.label)]
    if not one.raw.get("api_key"):
        return [
            "%s.api_key_previous is set without api_key: it is the key being retired while api_key is the new one; "
            "set api_key to the new key, or remove api_key_previous." % one.where
        ]
    if not isinstance(previous, str) or not ENGINE_KEY.fullmatch(previous):
        return [
            "%s.api_key_previous has characters outside A-Z a-z 0-9 . _ ~ + / = - (or is not text): give the key "
            "api_key had, as it was." % one.where
        ]
    if not isinstance(one.raw.get("api_key"), str) or not ENGINE_KEY.fullmatch(one.raw["api_key"]):
        return [
            "%s.api_key has characters outside A-Z a-z 0-9 . _ ~ + / = - while api_key_previous is set: both keys "
            "go into the engine's key list, so keep to those." % one.where
        ]
    if previous == one.raw.get("api_key"):
        return [
            "%s.api_key_previous is the same as api_key: during a rotation api_key is the new key and "
            "api_key_previous the one being retired; once every proxy uses the new key, remove api_key_previous."
            % one.where
        ]
    return []


def _image(one: Instance, seen: Host) -> List[str]:
    image = one.raw.get("image")
    if image is not None and not (is_type(image, str) and IMAGE_REF.fullmatch(image)):
        return [
            "%s.image=%r must be an image reference like registry.example.com/vllm/vllm-openai:v0.32.0 (lower-case "
            "name, a pinned tag or @sha256 digest, nothing else)." % (one.where, image)
        ]
    if one.engine not in ENGINES or one.accelerator not in ACCELERATORS:
        return []
    resolved = image_of(one.raw, {"images": seen.images})
    if not resolved:
        key = image_key(one.raw)
        return [
            "%s.image is unset and engine_images has no %s entry; set either (an image with a pinned tag)."
            % (one.where, key)
        ]
    if image is None and not (isinstance(resolved, str) and IMAGE_REF.fullmatch(resolved)):
        return [
            "engine_images.%s=%r must be an image reference like vllm/vllm-openai:v0.32.0 (lower-case name, a pinned "
            "tag or @sha256 digest)." % (image_key(one.raw), resolved)
        ]
    return []


# ---------------------------------------------------------------- network


def _port(one: Instance, seen: Host) -> List[str]:
    port = one.raw.get("port")
    if not is_type(port, int) or not 1024 <= port <= 65535:
        return ["%s.port=%r must be an integer from 1024 to 65535." % (one.where, port)]
    if port in seen.ports:
        return [
            "%s.port=%d is already used by gpufleet_engines[%d]; give each instance its own port."
            % (one.where, port, seen.ports[port])
        ]
    seen.ports[port] = one.index
    return []


def _bind(one: Instance, seen: Host) -> List[str]:
    bind = normalized(one.raw)["bind"]
    try:
        address = ipaddress.ip_address(bind)
    except (TypeError, ValueError):
        return [
            "%s.bind=%r must be an IP address (default 127.0.0.1: only the proxy faces the network)."
            % (one.where, bind)
        ]
    if not address.is_loopback and not one.raw.get("api_key"):
        return [
            "%s.bind=%s puts the engine's port beyond this host without a key: anyone who reaches the port could "
            "use it. Set api_key (vLLM), or keep bind 127.0.0.1 and let clients in through the proxy."
            % (one.where, bind)
        ]
    return []


# ---------------------------------------------------------------- engine options


def _option(one: Instance, key: str, value) -> List[str]:
    option = OPTIONS[key]
    if one.engine in ENGINES and one.engine not in option.engines:
        hint = "; use %s" % option.counterpart if option.counterpart else ""
        return ["%s.%s is not a %s option%s." % (one.where, key, one.engine, hint)]
    if value is None:
        return []
    if not is_type(value, option.kind):
        return ["%s.%s=%r must be %s." % (one.where, key, value, KIND_WORDS[option.kind])]
    errors = []
    if option.kind is str and not option.choices and not OPTION_WORD.fullmatch(value):
        errors.append(
            "%s.%s=%r must be one word of letters, digits and . _ : / + - (it becomes an engine argument)."
            % (one.where, key, value)
        )
    if option.choices and value not in option.choices:
        errors.append("%s.%s=%r must be one of %s." % (one.where, key, value, ", ".join(option.choices)))
    if option.bounds_text() and not option.in_bounds(value):
        errors.append("%s.%s=%r must be %s." % (one.where, key, value, option.bounds_text()))
    return errors


def _options(one: Instance, seen: Host) -> List[str]:
    return [e for key, value in sorted(one.options.items()) for e in _option(one, key, value)]


def _extra_args(one: Instance, seen: Host) -> List[str]:
    extra = one.raw.get("extra_args", [])
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        return ["%s.extra_args must be a list of strings (one flag or value each)." % one.where]
    errors = []
    for arg in extra:
        if CONTROL.search(arg):
            errors.append(
                "%s.extra_args: %r contains a line break or another control character; give each flag and value "
                "as its own list item." % (one.where, arg)
            )
            continue
        flag = _flag_name(arg)
        if flag is None:
            continue
        own = [f for f in OWN_FLAGS if f.startswith(flag)]
        typed = [
            key for key, option in OPTIONS.items()
            if option.flag(one.engine) is not None and _flag_forms(option.flag(one.engine)).intersection(
                f for f in _flag_forms(option.flag(one.engine)) if f.startswith(flag))
        ]  # fmt: skip
        if own:
            errors.append(
                "%s.extra_args: %r is %s, which gpufleet sets itself (from api_key, bind, port, model, "
                "served_model_name, drain_timeout); the engine reads '_' as '-' and accepts a flag's prefix, so it "
                "would override them. Use those instance keys instead." % (one.where, arg, " or ".join(own))
            )
        elif typed:
            errors.append(
                "%s.extra_args: %r sets the typed option %s, which the memory plan must know: set "
                "gpufleet_engines[%d].%s instead." % (one.where, arg, typed[0], one.index, typed[0])
            )
    return errors


def _flag_name(arg: str):
    """'--api_key=x' -> '--api-key', '-tp' -> None: the long flag an argument names, as the
    engine's parser reads it ('_' as '-'), or None for a value or a short option."""
    if not arg.startswith("--") or arg == "--":
        return None
    return arg.split("=", 1)[0].replace("_", "-").lower()


def _flag_forms(flag) -> set:
    """The long flags an option's Flag renders ('--x' and, for PAIR, '--no-x')."""
    forms = {flag.name}
    if flag.style == "pair":
        forms.add("--no-" + flag.name[2:])
    return forms


def _env_mapping(one: Instance, key: str) -> List[str]:
    env = one.raw.get(key, {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str)
        and ENV_NAME.fullmatch(k)
        and isinstance(v, (str, int, float))
        and not isinstance(v, bool)
        and not CONTROL.search(str(v))
        for k, v in env.items()
    ):
        return ["%s.%s must map UPPER_CASE names to one-line strings or numbers." % (one.where, key)]
    return []


def _env(one: Instance, seen: Host) -> List[str]:
    errors = _env_mapping(one, "env")
    if errors:
        return errors
    for name in sorted(one.raw.get("env") or {}):
        if name in OWN_ENV:
            errors.append(
                "%s.env: %s is set by gpufleet (from bind, api_key, kv_cache_space_gib, cpus or its offline "
                "settings); remove it from env." % (one.where, name)
            )
        elif any(hint in name for hint in SECRET_ENV_HINTS):
            errors.append(
                "%s.env: %s looks like a secret, and env lands in docker-run.args, `docker inspect` and the "
                "process list: move it to secret_env (kept in the instance's 0600 secret file)." % (one.where, name)
            )
    return errors


def _secret_env(one: Instance, seen: Host) -> List[str]:
    errors = _env_mapping(one, "secret_env")
    if errors:
        return errors
    clash = sorted(set(one.raw.get("secret_env") or {}) & (set(one.raw.get("env") or {}) | set(OWN_ENV)))
    if clash:
        errors.append(
            "%s.secret_env: %s %s set elsewhere (env, or by gpufleet: the engine key is api_key); set each name once."
            % (one.where, ", ".join(clash), "is" if len(clash) == 1 else "are")
        )
    return errors


# ---------------------------------------------------------------- GPUs and CPUs


def _gpus(one: Instance, seen: Host) -> List[str]:
    gpus = one.raw.get("gpus", [])
    if not isinstance(gpus, list) or not all(is_type(g, int) for g in gpus):
        errors = ["%s.gpus=%r must be a list of GPU indices, e.g. [0, 1]." % (one.where, gpus)]
    else:
        errors = []
    errors.extend(_watch_gpus(one, seen))
    if one.accelerator != "nvidia":
        if one.gpus and one.accelerator == "cpu":
            errors.append("%s.gpus must be empty for accelerator cpu." % one.where)
        return errors
    if not one.gpus:
        errors.append("%s.gpus is required for accelerator nvidia (the device indices it runs on)." % one.where)
    for g in one.gpus:
        errors.extend(_gpu(one, seen, g))
    if len(set(one.gpus)) != len(one.gpus):
        errors.append("%s.gpus=%r lists a GPU twice." % (one.where, one.gpus))
    tp, pp = one.tp, one.pp
    if is_type(tp, int) and is_type(pp, int) and one.gpus and len(one.gpus) * one.nodes != tp * pp:
        if one.nodes > 1:
            errors.append(
                "%s: %d GPU(s) on each of its %d nodes (%d in all) but tensor_parallel_size x pipeline_parallel_size "
                "= %d x %d = %d; they must match (the usual layout: tensor_parallel_size %d within a node, "
                "pipeline_parallel_size %d across the nodes)."
                % (one.where, len(one.gpus), one.nodes, len(one.gpus) * one.nodes, tp, pp, tp * pp,
                   len(one.gpus), one.nodes)
            )  # fmt: skip
        else:
            errors.append(
                "%s: %d GPU(s) given but tensor_parallel_size x pipeline_parallel_size = %d x %d = %d; "
                "they must match." % (one.where, len(one.gpus), tp, pp, tp * pp)
            )
    return errors


def _watch_gpus(one: Instance, seen: Host) -> List[str]:
    """watch_gpus: the GPUs whose faults (DCGM) take the instance out of service; its own
    gpus when not given. Checked against the host's GPUs when its facts list any."""
    if "watch_gpus" not in one.raw:
        return []
    watch = one.raw["watch_gpus"]
    if not isinstance(watch, list) or not all(is_type(g, int) and g >= 0 for g in watch):
        return ["%s.watch_gpus=%r must be a list of GPU indices, e.g. [0, 1] ([] watches none)." % (one.where, watch)]
    indices = seen.gpu_indices if seen.gpu_indices is not None else list(range(seen.gpu_count))
    missing = [g for g in watch if g not in indices]
    if seen.gpu_count and missing:
        return [
            "%s.watch_gpus: GPU %s not on this host (nvidia-smi lists %s)."
            % (one.where, ", ".join(map(str, missing)), ", ".join(map(str, sorted(indices))))
        ]
    return []


def _gpu(one: Instance, seen: Host, g: int) -> List[str]:
    count = seen.gpu_count
    indices = seen.gpu_indices if seen.gpu_indices is not None else list(range(count))
    if g not in indices:
        return [
            "%s.gpus: GPU %d does not exist on this host (nvidia-smi lists %d GPU%s%s)."
            % (
                one.where, g, len(indices), "" if len(indices) == 1 else "s",
                ": %s" % ", ".join(map(str, sorted(indices))) if indices else "",
            )
        ]  # fmt: skip
    if g in seen.gpus:
        return [
            "%s.gpus: GPU %d is already given to gpufleet_engines[%d]; an engine needs its GPUs to itself."
            % (one.where, g, seen.gpus[g])
        ]
    seen.gpus[g] = one.index
    return []


def _cpu_instance(one: Instance, seen: Host) -> List[str]:
    if one.accelerator != "cpu":
        return []
    space = one.raw.get("kv_cache_space_gib", 1)
    if not is_type(space, int) or space < 1:
        return [
            "%s.kv_cache_space_gib=%r must be an integer of at least 1 (VLLM_CPU_KVCACHE_SPACE)." % (one.where, space)
        ]
    return []


def _cpus(one: Instance, seen: Host) -> List[str]:
    """An instance's own `cpus`: CPUs the host has, next to its GPUs, off the housekeeping CPUs."""
    cpus = one.raw.get("cpus")
    if cpus is None:
        return []
    if not isinstance(cpus, str) or not CPU_LIST.fullmatch(cpus):
        return ["%s.cpus=%r must be a CPU list like '0-7' or '0-3,8-11'." % (one.where, cpus)]
    wanted = cpu_set(cpus)
    if seen.cpus and wanted - seen.cpus:
        return [
            "%s.cpus=%r names CPU %s, which this host does not have (its NUMA nodes hold CPUs %s); "
            "docker would refuse to start the engine. Pick CPUs from that list."
            % (one.where, cpus, cpu_list(wanted - seen.cpus), cpu_list(seen.cpus))
        ]
    errors = []
    nodes = sorted({seen.gpu_nodes[g] for g in one.gpus if g in seen.gpu_nodes})
    if one.accelerator != "cpu" and len(nodes) == 1 and nodes[0] in seen.node_cpus:
        local = seen.node_cpus[nodes[0]]
        if wanted - local:
            errors.append(
                "%s.cpus=%r names CPU %s, away from its GPUs %s on NUMA node %d: every copy to and from those GPUs "
                "would cross the sockets. Pick CPUs from NUMA node %d's %s, or leave cpus out (the whole node)."
                % (one.where, cpus, cpu_list(wanted - local), one.gpus, nodes[0], nodes[0], cpu_list(local))
            )
    if wanted & seen.housekeeping:
        errors.append(
            "%s.cpus=%r takes CPU %s, which engine_housekeeping_cpus=%r keeps for the host's own services (nginx, "
            "the exporters, the watchdog). Pick other CPUs, or take them out of engine_housekeeping_cpus."
            % (one.where, cpus, cpu_list(wanted & seen.housekeeping), cpu_list(seen.housekeeping))
        )
    return errors


MEMORY_SIZE = re.compile(r"^[1-9][0-9]*[KMGT]?$")


def _slice_resources(one: Instance, seen: Host) -> List[str]:
    """exclusive_cpus, and the slice's weights and memory settings (engine_cgroup_slices)."""
    raw = one.raw
    errors = []
    if "exclusive_cpus" in raw and not isinstance(raw["exclusive_cpus"], bool):
        errors.append("%s.exclusive_cpus=%r must be true or false." % (one.where, raw["exclusive_cpus"]))
    given = [key for key, _setting in SLICE_RESOURCES if raw.get(key) is not None]
    for key in ("cpu_weight", "io_weight"):
        value = raw.get(key)
        if value is not None and (not is_type(value, int) or not 1 <= value <= 10000):
            errors.append(
                "%s.%s=%r must be an integer from 1 to 10000 (systemd's %s; 100 is every service's default)."
                % (one.where, key, value, dict(SLICE_RESOURCES)[key])
            )
    sizes = {}
    for key in ("memory_low", "memory_max"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not MEMORY_SIZE.fullmatch(value):
            errors.append(
                "%s.%s=%r must be a size like '64G' or '512M' (bytes, or K, M, G, T: powers of 1024)."
                % (one.where, key, value)
            )
        else:
            sizes[key] = _bytes(value)
    if "memory_low" in sizes and "memory_max" in sizes and sizes["memory_low"] > sizes["memory_max"]:
        errors.append(
            "%s.memory_low=%r is above its memory_max=%r: the protection cannot exceed the ceiling; lower memory_low."
            % (one.where, raw["memory_low"], raw["memory_max"])
        )
    space = raw.get("kv_cache_space_gib", 1)
    if (
        one.accelerator == "cpu"
        and "memory_max" in sizes
        and is_type(space, int)
        and sizes["memory_max"] <= space * 2**30
    ):
        errors.append(
            "%s.memory_max=%r leaves no room beyond its KV cache (kv_cache_space_gib=%d GiB, held in host memory) for "
            "the model's weights and the engine: the kernel would kill it while it loads. Raise memory_max above "
            "%d GiB plus the model's size." % (one.where, raw["memory_max"], space, space)
        )
    if given and not seen.slices:
        errors.append(
            "%s sets %s, settings of the instance's systemd slice, but slices are off (%s): set "
            "engine_cgroup_slices: true (with container_runtime_cgroup_driver: systemd), or remove %s."
            % (one.where, ", ".join(given), seen.slices_why, "it" if len(given) == 1 else "them")
        )
    return errors


def _housekeeping(cpus, seen: Host) -> List[str]:
    """engine_housekeeping_cpus: a CPU list of this host, leaving each NUMA node CPUs for engines."""
    if cpus in (None, ""):
        return []
    if not isinstance(cpus, str) or not CPU_LIST.fullmatch(cpus):
        return [
            "engine_housekeeping_cpus=%r must be a CPU list like '0-1' or '0,32' (the CPUs the host's own services "
            'run on), or "" for none.' % (cpus,)
        ]
    wanted = cpu_set(cpus)
    if seen.cpus and wanted - seen.cpus:
        return [
            "engine_housekeeping_cpus=%r names CPU %s, which this host does not have (its NUMA nodes hold CPUs %s). "
            "Pick CPUs from that list." % (cpus, cpu_list(wanted - seen.cpus), cpu_list(seen.cpus))
        ]
    return [
        "engine_housekeeping_cpus=%r takes every CPU of NUMA node %d (%s), leaving none there for the engines. "
        "Keep a few CPUs of each node, e.g. the first core of each." % (cpus, node, cpu_list(listed))
        for node, listed in sorted(seen.node_cpus.items())
        if listed <= wanted
    ]


def _cpu_split(instances, members, gpu, host) -> List[str]:
    """An instance with exclusive_cpus shares none of its CPUs with another instance on this host
    (a multi-node instance's worker here included) as placement() lands them."""
    placed = [(label(i, inst), inst, placement(inst, gpu, host)) for i, inst in enumerate(instances)]
    for member in members or []:
        inst = member["instance"]
        where = "%s's multi-node instance %s" % (member["group"]["leader"], inst.get("name"))
        placed.append((where, inst, placement(inst, gpu, host)))
    # an instance the plan does not pin runs on every CPU of the host
    every = set().union(*node_cpu_sets((host or {}).get("numa_nodes")).values())
    errors = []
    for i, (where, inst, (cpus, _mems, why)) in enumerate(placed):
        if not inst.get("exclusive_cpus"):
            continue
        if not cpus:
            errors.append(
                "%s.exclusive_cpus is true, but the plan pins it to no CPUs (%s): give it cpus." % (where, why)
            )
            continue
        for j, (other_where, _other, (other_cpus, _m, _w)) in enumerate(placed):
            both = cpu_set(cpus) & (cpu_set(other_cpus) if other_cpus else every)
            # a pair of exclusive instances is told once, at the first of the two
            if j != i and both and not (j < i and placed[j][1].get("exclusive_cpus")):
                errors.append(
                    "%s.exclusive_cpus is true, but %s runs on its CPU %s too (%s on %s, %s on %s): give the two "
                    "disjoint cpus (e.g. split the NUMA node's CPUs between them)."
                    % (where, other_where, cpu_list(both), where, cpus, other_where, other_cpus or "every CPU")
                )
    return errors


# ---------------------------------------------------------------- multi-node


def _group(one: Instance, host: dict) -> List[str]:
    """nodes, master_port and cross_node_tensor_parallel of a multi-node instance (one written
    in this host's gpufleet_engines: this host is its leader)."""
    raw = one.raw
    errors = []
    if "cross_node_tensor_parallel" in raw and not isinstance(raw["cross_node_tensor_parallel"], bool):
        errors.append(
            "%s.cross_node_tensor_parallel=%r must be true or false." % (one.where, raw["cross_node_tensor_parallel"])
        )
    if "nodes" not in raw:
        for key in ("master_port", "cross_node_tensor_parallel"):
            if key in raw:
                errors.append("%s.%s applies to a multi-node instance only (one with nodes)." % (one.where, key))
        for key in RAY_KEYS:
            if key in raw:
                errors.append(
                    "%s.%s=%s applies to a multi-node instance only (one with nodes: [LEADER, WORKER, ...]); a "
                    "single-host instance runs the engine's own executor: remove it."
                    % (one.where, key, _shown(key, raw[key]))
                )
        return errors
    errors.extend(_ray(one))
    nodes = raw["nodes"]
    me = host.get("name")
    if (
        not isinstance(nodes, list)
        or len(nodes) < 2
        or not all(isinstance(n, str) and n for n in nodes)
        or len(set(nodes)) != len(nodes)
    ):
        errors.append(
            "%s.nodes=%r must list two or more different inventory hosts, the leader (this host) first, e.g. "
            "[%s, gpu02]." % (one.where, nodes, me or "gpu01")
        )
        return errors
    if me and nodes[0] != me:
        errors.append(
            "%s.nodes=%r starts with %s, but the instance is written in %s's gpufleet_engines: write a multi-node "
            "instance in its leader's gpufleet_engines and list the leader first." % (one.where, nodes, nodes[0], me)
        )
    known = host.get("hosts")
    missing = [n for n in nodes if known is not None and n not in known]
    if missing:
        errors.append(
            "%s.nodes: %s %s not in the gpu_hosts group of the inventory; every node of a multi-node instance is a "
            "gpu host." % (one.where, ", ".join(missing), "is" if len(missing) == 1 else "are")
        )
    port = raw.get("master_port", DEFAULT_MASTER_PORT)
    if raw.get("distributed_executor_backend") == "ray":
        pass  # no rendezvous port: _ray refuses master_port
    elif not is_type(port, int) or not 1024 <= port <= 65535:
        errors.append(
            "%s.master_port=%r must be an integer from 1024 to 65535 (the leader's rendezvous port, default %d)."
            % (one.where, port, DEFAULT_MASTER_PORT)
        )
    elif port in (raw.get("port"), surge_port(raw)):
        errors.append("%s.master_port=%d is the instance's own port or its surge copy's; give it another."
                      % (one.where, port))  # fmt: skip
    tp, pp = one.tp, one.pp
    if is_type(tp, int) and is_type(pp, int) and (tp * pp) % one.nodes:
        errors.append(
            "%s: tensor_parallel_size x pipeline_parallel_size = %d x %d = %d ranks cannot be spread evenly over %d "
            "nodes; the engine needs the same number of ranks on every node." % (one.where, tp, pp, tp * pp,
                                                                                 one.nodes)
        )  # fmt: skip
    elif (
        is_type(tp, int)
        and is_type(pp, int)
        and tp > tp * pp // one.nodes
        and not raw.get("cross_node_tensor_parallel")
    ):
        errors.append(
            "%s: tensor_parallel_size=%d spans nodes (%d rank(s) per node): every layer's all-reduce would cross the "
            "network. Keep tensor_parallel_size within a node and set pipeline_parallel_size to the node count "
            "(%d), or set cross_node_tensor_parallel: true if the network is made for it (NVLink across nodes, "
            "or a CPU lab)." % (one.where, tp, tp * pp // one.nodes, one.nodes)
        )
    return errors


# The instance keys of distributed_executor_backend: ray (the first also takes mp).
RAY_KEYS = ("distributed_executor_backend", "ray_port", "ray_dashboard_port", "ray_token")


def _shown(key, value) -> str:
    """A value as messages show it: the token's length only."""
    if key == "ray_token":
        return "(a secret, not shown: %s)" % (
            "%d characters" % len(value) if isinstance(value, str) else type(value).__name__
        )
    return repr(value)


def _ray(one: Instance) -> List[str]:
    """distributed_executor_backend and the Ray keys of a multi-node instance."""
    raw = one.raw
    backend = raw.get("distributed_executor_backend", "mp")
    where = one.where
    info = _engine_info(one)
    if "distributed_executor_backend" in raw and info is not None and not info.executor_backends:
        return [
            "%s.distributed_executor_backend=%r: %s has no such setting (its own multi-node runtime carries the "
            "instance); remove distributed_executor_backend and the ray_ keys." % (where, backend, info.label)
        ]
    if backend not in BACKENDS:
        return ["%s.distributed_executor_backend=%r must be mp (vLLM's own executor across nodes, the default) or "
                "ray (a Ray cluster in the nodes' containers)." % (where, backend)]  # fmt: skip
    if backend != "ray":
        return [
            "%s.%s=%s applies to distributed_executor_backend: ray only; set that, or remove %s."
            % (where, key, _shown(key, raw[key]), key)
            for key in RAY_KEYS[1:]
            if key in raw
        ]
    errors = []
    if one.accelerator == "cpu":
        errors.append(
            "%s.distributed_executor_backend='ray' with accelerator cpu: vLLM's CPU build cannot run on Ray (its "
            'CpuPlatform has no ray_device_key, and vllm/v1/executor/ray_utils.py stops with "current platform cpu '
            'does not support ray."); use distributed_executor_backend: mp for CPU instances.' % where
        )
    if "master_port" in raw:
        errors.append(
            "%s.master_port=%r is the mp executor's rendezvous port; with distributed_executor_backend: ray the "
            "workers join the leader's Ray head on ray_port (default %d): remove master_port."
            % (where, raw["master_port"], DEFAULT_RAY_PORT)
        )
    ports = {}
    for key, default, what in (("ray_port", DEFAULT_RAY_PORT, "the leader's Ray head (GCS) port"),
                               ("ray_dashboard_port", DEFAULT_RAY_DASHBOARD_PORT,
                                "the Ray dashboard's port, on the leader's loopback")):  # fmt: skip
        value = raw.get(key, default)
        if not is_type(value, int) or not 1024 <= value <= 65535:
            errors.append("%s.%s=%r must be an integer from 1024 to 65535 (%s, default %d)."
                          % (where, key, value, what, default))  # fmt: skip
            continue
        if value in (raw.get("port"), surge_port(raw)):
            errors.append("%s.%s=%d is the instance's own port or its surge copy's; give it another."
                          % (where, key, value))  # fmt: skip
        elif value in ports.values():
            errors.append("%s.%s=%d is also its ray_port; give each its own port." % (where, key, value))
        elif value in (RAY_CLIENT_SERVER_PORT, RAY_DASHBOARD_AGENT_PORT):
            errors.append(
                "%s.%s=%d is a port Ray binds itself on the node (its client server %d, its dashboard agent %d); "
                "give it another." % (where, key, value, RAY_CLIENT_SERVER_PORT, RAY_DASHBOARD_AGENT_PORT)
            )
        ports[key] = value
    token = raw.get("ray_token")
    fix = ("set ray_token to a random secret of at least %d characters (e.g. `openssl rand -hex 32`), kept in a "
           "vault; every node and process of the Ray cluster authenticates with it" % RAY_TOKEN_MIN_LENGTH)  # fmt: skip
    if token is None:
        errors.append("%s.ray_token is unset, and a Ray group runs with Ray's token authentication on: %s."
                      % (where, fix))  # fmt: skip
    elif not isinstance(token, str) or len(token) < RAY_TOKEN_MIN_LENGTH or not token.isprintable() or " " in token:
        errors.append(
            "%s.ray_token=%s must be a string of at least %d printable characters without spaces: %s."
            % (where, _shown("ray_token", token), RAY_TOKEN_MIN_LENGTH, fix)
        )
    return errors


def _ray_hosts(instances, members) -> List[str]:
    """What Ray takes on this host: at most one Ray node (a Ray group led here or joined here),
    since every Ray node binds the dashboard agent's port and the head Ray's client server port
    whatever gpufleet asks (both on the host's network); and no instance of the host on a port
    its Ray node binds (the head's ray_port, dashboard port, client server port; the agent's)."""
    rays = []  # (where, instance, leads here)
    for i, inst in enumerate(instances):
        if isinstance(inst, dict) and inst.get("nodes") and inst.get("distributed_executor_backend") == "ray":
            rays.append((label(i, inst), inst, True))
    for member in members or []:
        if member["instance"].get("distributed_executor_backend") == "ray":
            rays.append(
                (
                    "%s's multi-node instance %s (node rank %d here)"
                    % (member["group"]["leader"], member["instance"].get("name"), member["rank"]),
                    member["instance"],
                    False,
                )
            )
    if len(rays) > 1:
        return [
            "%s and %s both run a Ray node on this host, and two Ray nodes on one host take the same ports (the "
            "dashboard agent's %d, the head's client server %d): put their nodes on different hosts, or set "
            "distributed_executor_backend: mp on one of them." % (rays[0][0], rays[1][0], RAY_DASHBOARD_AGENT_PORT,
                                                                  RAY_CLIENT_SERVER_PORT)
        ]  # fmt: skip
    if not rays:
        return []
    where, inst, leads = rays[0]
    taken = {RAY_DASHBOARD_AGENT_PORT: "Ray's dashboard agent port"}
    if leads:
        taken[RAY_CLIENT_SERVER_PORT] = "the Ray head's client server port"
        for key, default in (("ray_port", DEFAULT_RAY_PORT), ("ray_dashboard_port", DEFAULT_RAY_DASHBOARD_PORT)):
            if is_type(inst.get(key, default), int):
                taken[inst.get(key, default)] = "%s.%s" % (where, key)
    errors = []
    for i, other in enumerate(instances):
        if not isinstance(other, dict) or other is inst:
            continue
        for key, value in (("port", other.get("port")), ("surge_port", surge_port(other)),
                           ("master_port", other.get("master_port") if other.get("nodes") else None)):  # fmt: skip
            if is_type(value, int) and value in taken:
                errors.append(
                    "%s.%s=%d is %s (%s runs a Ray node on this host); give one of them another port."
                    % (label(i, other), key, value, taken[value], where)
                )
    return errors


# ---------------------------------------------------------------- container


def _ipc(one: Instance, seen: Host) -> List[str]:
    ipc = one.raw.get("ipc", "auto")
    if ipc not in IPC_MODES:
        return ["%s.ipc=%r must be auto, host or private." % (one.where, ipc)]
    return []


def _shm_size(one: Instance, seen: Host) -> List[str]:
    shm = one.raw.get("shm_size")
    if shm is not None and (not isinstance(shm, str) or not SHM_SIZE.fullmatch(shm) or _bytes(shm) <= 64 * 2**20):
        return [
            "%s.shm_size=%r must be like '8g' and above Docker's 64m default (multi-process engines die with "
            "'Bus error' in 64 MB)." % (one.where, shm)
        ]
    return []


def _readiness_timeout(one: Instance, seen: Host) -> List[str]:
    rt = normalized(one.raw)["readiness_timeout"]
    if not is_type(rt, int) or rt < 10:
        return ["%s.readiness_timeout=%r must be an integer number of seconds, at least 10." % (one.where, rt)]
    return []


# ---------------------------------------------------------------- model


def _model(one: Instance, seen: Host) -> List[str]:
    """The model is on the host, and the parallel layout fits its shape."""
    model = one.raw.get("model")
    if not isinstance(model, str) or not model.startswith("/"):
        return [
            "%s.model=%r must be the absolute path of a model folder on the host (hub ids are downloaded "
            "there first with engine_model_downloads)." % (one.where, model)
        ]
    if not plain_path(model):
        return [
            "%s.model=%r must be a plain absolute path: letters, digits, spaces and . _ @ + = ~ - between slashes; "
            "no ':' or ',' (Docker's --volume separators), no line breaks, no '.' or '..' segments. Rename or "
            "link the folder." % (one.where, model)
        ]
    info = seen.models.get(model) or {}
    if info.get("pending_download"):
        return []  # checked again right after engine_model_downloads fetched it
    if not info.get("exists"):
        return ["%s.model=%s does not exist on this host; download or copy it there first." % (one.where, model)]
    if info.get("config") is None:
        return ["%s.model=%s has no readable config.json; is it a Hugging Face model folder?" % (one.where, model)]
    if not (is_type(one.tp, int) and is_type(one.pp, int)):
        return []
    try:
        config = load_model_config(info["config"])
    except ModelConfigError as exc:
        return ["%s.model=%s: %s" % (one.where, model, exc)]
    return parallel_errors(config, one.tp, one.pp, where="%s (model %s)" % (one.where, model), engine=one.engine)


# In the order their messages appear.
CHECKS = (
    _keys,
    _options_mapping,
    _name,
    _engine,
    _served_model_name,
    _api_key,
    _port,
    _bind,
    _options,
    _extra_args,
    _env,
    _secret_env,
    _gpus,
    _cpu_instance,
    _cpus,
    _slice_resources,
    _ipc,
    _shm_size,
    _readiness_timeout,
    _drain_timeout,
    _image,
    _model,
)


def _surge_ports(instances) -> List[str]:
    """Each surge copy's port is free: not an instance's port nor another copy's."""
    taken = {}
    for i, inst in enumerate(instances):
        if isinstance(inst, dict) and is_type(inst.get("port"), int):
            taken.setdefault(inst["port"], "the port of gpufleet_engines[%d]" % i)
    errors = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict) or not is_type(inst.get("port"), int):
            continue
        where, port = label(i, inst), surge_port(inst)
        if not is_type(port, int) or not 1024 <= port <= 65535:
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


def _similar(a: str, b: str) -> bool:
    """Whether key `a` looks like a typo of `b`."""
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


def _bytes(size: str) -> int:
    """'64m' (Docker's shm_size) or '48G' (systemd's sizes) -> bytes: base-1024 suffixes, or none."""
    unit = size[-1].lower() if size[-1].isalpha() else ""
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    return int(size[: len(size) - len(unit)]) * units[unit]
