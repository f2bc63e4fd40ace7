# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The edge in front of the gpu hosts' proxies: its backends, what is drained, TLS (private).

Used by the edge role (its preflight, configuration and the rollout's drain) through the
edge_plan and edge_backends filters. Every error names the variable, the value and the fix.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re

from ansible_collections.gpufleet.serving.plugins.module_utils._proxy import (
    ENDPOINTS,
    check_key,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._published import published, tls_names_errors

DURATION_UNITS = ("ms", "s", "m", "h", "d")
# vllm-router's load balancing policies that route a request to one replica on its own (its PD
# and kv_aware modes need engine-side KV events, which gpufleet does not wire).
ROUTER_POLICIES = ("cache_aware", "consistent_hash", "round_robin", "power_of_two", "random")
# inventory and instance names as they appear in the router's worker paths and nginx locations
PATH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def backends(names, hostvars) -> list:
    """Each backend host as the edge reaches it: {name, address, tls, port, fleet_ca,
    certificate, instances: [{name, model}]} from what its roles published (_published: its
    proxy's port and TLS, the instances that proxy fronts, their served names), its address
    (edge_address, else ansible_host, else its name) and the fleet CA's certificate its proxy
    role published (gpufleet_proxy_tls) when that CA issued the proxy's."""
    out = []
    for name in names or []:
        hv = hostvars.get(name, {})
        if not hasattr(hv, "get"):
            hv = {}
        proxy = published("proxy", hv)
        fronted = proxy["instances"]
        certificate = (hv.get("gpufleet_proxy_tls") or {}).get("certificate") or ""
        out.append(
            {
                "name": name,
                "address": str(hv.get("edge_address") or hv.get("ansible_host") or name),
                "tls": proxy["tls"],
                "port": proxy["port"],
                "fleet_ca": proxy["fleet_ca"],
                "certificate": certificate,
                # the instances its proxy fronts (names and served model names only: never a key),
                # with what each serves under that name (its model and context length)
                "instances": [
                    {
                        "name": e["name"],
                        "model": e["served_model_name"],
                        "source": e.get("model") or "",
                        "max_model_len": e.get("max_model_len"),
                    }
                    for e in published("engine", hv)["instances"]
                    if e["name"] in fronted
                ],
            }
        )
    return out


def _for_model(model, groups):
    """ " for the model M" in a message when the fleet serves several (" without a model" for hosts
    that publish none), else ""."""
    if len(groups) < 2:
        return ""
    return " for the model %s" % model if model is not None else " without a model"


def _host_model(host):
    """The model a backend's proxy serves (its site balances replicas of one model), or None."""
    models = sorted({i["model"] for i in host.get("instances") or []})
    return models[0] if models else None


def plan_edge(params, hosts, batch=None, held=None) -> dict:
    """params: the edge_* settings (without the prefix); hosts: backends() of edge_backend_group;
    batch: the rollout's hosts to drain now (None outside a rollout); held: the hosts a failed
    rollout left out of this edge (its edge-rollout-held file), which stay out until a rollout
    passes them, so that draining another host never brings a broken one back.

    Returns {errors, warnings, servers: [{name, address, port, down}], backend_tls,
    drained, in_service, held (the rollout's hosts out of service now: what the edge keeps in
    its file), trust: [the fleet CA's PEM], untrusted: [names of proxies whose fleet CA is not
    known yet], listen_address (plain), public_port}.
    """
    errors, warnings = [], []
    group = params.get("backend_group")
    names = [h["name"] for h in hosts]
    if not names:
        errors.append(
            "edge_backend_group=%s names no inventory group with hosts: set it to the group of the gpu hosts "
            "whose proxies the edge balances (e.g. gpu_hosts)." % group
        )
    drained = params.get("drained") or []
    if not isinstance(drained, list):
        errors.append("edge_drained=%r must be a list of inventory names." % (drained,))
        drained = []
    strangers = [d for d in drained if d not in names]
    if names and strangers:
        errors.append(
            "edge_drained=%s lists %s, not in edge_backend_group=%s: list hosts of that group only."
            % (drained, ", ".join(map(str, strangers)), group)
        )
    if names and not [n for n in names if n not in drained]:
        errors.append(
            "edge_drained=%s takes every host of edge_backend_group=%s out of service: leave at least one in service."
            % (drained, group)
        )
    # each model the fleet serves, with the hosts that serve it (a host's proxy serves one model)
    model_hosts = {}
    for h in hosts:
        model = _host_model(h)
        if model is not None:
            model_hosts.setdefault(model, []).append(h["name"])
    for model, serving in sorted(model_hosts.items()):
        if len(model_hosts) > 1 and not [n for n in serving if n not in drained]:
            errors.append(
                "edge_drained=%s takes every host serving the model %s (%s) out of service: leave one of them in "
                "service, or the edge answers 404 for that model." % (drained, model, ", ".join(serving))
            )
    down = [n for n in names if n in drained]
    # left out by a failed rollout: out of service too, unless that would leave none in service
    held = [n for n in names if n in (held or []) and n not in down]
    kept = []  # held, but kept in service: the edge would have none otherwise (still in the record)
    # per model: a model whose every host in service was left out by a failed rollout keeps them
    groups = sorted(model_hosts.items())
    unmodelled = [n for n in names if n not in [x for group_hosts in model_hosts.values() for x in group_hosts]]
    if unmodelled:
        groups.append((None, unmodelled))
    for model, serving in groups:
        mine = [n for n in serving if n in held]
        if mine and not [n for n in serving if n not in down and n not in held]:
            warnings.append(
                "every backend still in service behind the edge%s was left out by a failed rollout (%s): they stay in "
                "service rather than none; fix them and run the rollout again."
                % (_for_model(model, groups), ", ".join(mine))
            )
            kept += mine
            held = [n for n in held if n not in mine]
    down += held
    if batch is not None:
        batch = [b for b in batch if b in names]
        leaving = []
        for model, serving in groups:
            in_service = [n for n in serving if n not in down]
            mine = [n for n in in_service if n in batch]
            rest = [n for n in in_service if n not in batch]
            what = _for_model(model, groups)
            if not rest and in_service and len(in_service) > 1:
                errors.append(
                    "the rollout batch %s would drain every backend still in service behind the edge%s (%s): clients "
                    "would get %s. Lower gpufleet_rollout_batch (or --batch) so at least one stays in service."
                    % (", ".join(batch), what, ", ".join(in_service), "404s" if what else "502s")
                )
            elif not rest and in_service:
                warnings.append(
                    "%s is the only backend in service behind the edge%s: it stays in service while it changes (its "
                    "proxy keeps answering, through its surge copy where one fits)." % (in_service[0], what)
                )
            else:
                leaving += mine
        down += [b for b in leaving if b not in down]
    # TLS between the edge and the proxies follows the proxies' proxy_tls
    kinds = sorted({h["tls"] for h in hosts})
    if len(kinds) > 1:
        on = ", ".join(h["name"] for h in hosts if h["tls"])
        off = ", ".join(h["name"] for h in hosts if not h["tls"])
        errors.append(
            "edge_backend_group=%s mixes proxies with and without TLS (proxy_tls on %s, off on %s): set proxy_tls the "
            "same on every host of the group." % (group, on, off)
        )
    backend_tls = kinds == [True]
    tls = bool(params.get("tls"))
    if backend_tls and not tls:
        errors.append(
            "edge_tls=false while the proxies of edge_backend_group=%s use TLS (proxy_tls): clients' keys and prompts "
            "would reach the edge in clear. Remove edge_tls: false (TLS is the default, with a certificate from the "
            "fleet CA)." % group
        )
    elif not tls:
        warnings.append(
            "edge_tls is false: clients' keys and prompts reach the edge on port %s in clear. Remove edge_tls: false "
            "(TLS is the default, with a certificate from the fleet CA) unless only a trusted network reaches it."
            % params.get("listen_port")
        )
    if tls and bool(params.get("tls_certificate")) != bool(params.get("tls_certificate_key")):
        errors.append(
            "edge_tls_certificate=%r and edge_tls_certificate_key=%r: set both (paths on the edge host), or leave both "
            '"" for a certificate from the fleet CA.'
            % (params.get("tls_certificate"), params.get("tls_certificate_key"))
        )
    errors += tls_names_errors("edge_tls_names", params.get("tls_names", []))
    for var in ("listen_port", "tls_port"):
        port = params.get(var)
        if var in params and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
            errors.append("edge_%s=%r must be a port number." % (var, port))
    if tls and params.get("listen_port") == params.get("tls_port"):
        errors.append("edge_tls_port=%r is also edge_listen_port: give TLS its own port." % params.get("tls_port"))
    address = params.get("listen_address", "0.0.0.0")
    try:
        ipaddress.ip_address(address)
    except (TypeError, ValueError):
        errors.append("edge_listen_address=%r must be an IP address (0.0.0.0 for every interface)." % (address,))
    # The fleet CA the edge verifies the proxies by (their proxy role publishes its certificate
    # in the fact gpufleet_proxy_tls): none on a fresh fleet before the proxies ran, so a missing
    # one is not a preflight error; the edge's configuration stops on it (untrusted).
    trust, untrusted = [], []
    fleet = [h["name"] for h in hosts if h["fleet_ca"]]
    if backend_tls and not params.get("backend_tls_ca") and fleet and len(fleet) < len(hosts):
        errors.append(
            "edge_backend_group=%s mixes proxies with certificates from the fleet CA (%s) and their own "
            "(proxy_tls_certificate on %s): the edge verifies them against one bundle. Set edge_backend_tls_ca to a "
            "file on the edge host holding both CAs, or give every proxy the same kind."
            % (group, ", ".join(fleet), ", ".join(h["name"] for h in hosts if not h["fleet_ca"]))
        )
    if backend_tls and not params.get("backend_tls_ca") and not [h for h in hosts if not h["fleet_ca"]]:
        trust = sorted({h["certificate"].strip() for h in hosts if h["certificate"]})
        untrusted = [h["name"] for h in hosts if not h["certificate"]]
    servers = [
        {"name": h["name"], "address": h["address"], "port": h["port"], "down": h["name"] in down} for h in hosts
    ]
    models = _plan_models(params, hosts, model_hosts, down, errors)
    router = _plan_router(params, hosts, down, errors)
    if router is not None:
        # several models behind one router: its multi-model mode (a prefix tree per model)
        router["igw"] = len(models) > 1
    keys = _plan_keys(params.get("api_keys"), [m["name"] for m in models], errors)
    quota = _plan_quota(params, keys, errors)
    limits = _plan_limits(params, errors)
    return {
        "errors": errors,
        "warnings": warnings,
        "servers": servers,
        "backend_tls": backend_tls,
        "drained": [n for n in names if n in down],
        "in_service": [n for n in names if n not in down],
        "held": [n for n in names if (n in down and n not in drained) or n in kept],
        "trust": trust,
        "untrusted": untrusted,
        # With TLS on, plain HTTP stays on loopback (local checks); clients use TLS.
        "listen_address": "127.0.0.1" if tls else address,
        "public_port": params.get("tls_port") if tls else params.get("listen_port"),
        "router": router,
        # each model: {name, upstream (its nginx upstream, named by a hash of the model's name: stable
        # when models come and go), hosts, servers, in_service}
        "models": models,
        # the edge's own key check (edge_api_keys): names, models and token limits only, never a key
        "keys": keys,
        # the usage store and the keys' token quotas (None: nothing counted); never its password
        "quota": quota,
        # the inference paths a request may take (the proxies' allow-list, every path any proxy may
        # enable): anything else is answered 404 by the edge, before a body is read
        "paths": list(ENDPOINTS),
        # each path's body cap in bytes ("default": the others'), answered 413 by the edge
        "limits": limits,
    }


# served model names the edge routes by (written into its nginx and JSON files as they are)
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$")


def _plan_models(params, hosts, model_hosts, down, errors):
    """The models behind the edge, each with its own backend list: the edge reads a request's
    `model` and balances it over the hosts serving that model only."""
    out = []
    seen = {}
    for h in hosts:
        for i in h.get("instances") or []:
            what = (i.get("source") or "", i.get("max_model_len"))
            seen.setdefault(i["model"], {}).setdefault(what, []).append("%s/%s" % (h["name"], i["name"]))
    for model, kinds in sorted(seen.items()):
        if len(kinds) > 1:
            errors.append(
                "the model name %s is served with different settings (%s): a client would get different answers "
                "depending on the host. Give each its own served_model_name, or the same model and max_model_len."
                % (
                    model,
                    "; ".join(
                        "%s on %s" % ("model=%s max_model_len=%s" % k, ", ".join(v))
                        for k, v in sorted(kinds.items(), key=str)
                    ),
                )
            )
        if not MODEL_NAME.fullmatch(model):
            errors.append(
                "served_model_name=%r: the edge routes by it; use 1-256 letters, digits and . _ : / @ + -, "
                "starting with a letter or digit (e.g. meta-llama/Llama-3.1-8B-Instruct)." % model
            )
    for model, serving in sorted(model_hosts.items()):
        out.append(
            {
                "name": model,
                "upstream": "gpufleet_m_" + hashlib.sha256(model.encode("utf-8")).hexdigest()[:16],
                "hosts": serving,
                "servers": [
                    {"name": h["name"], "address": h["address"], "port": h["port"], "down": h["name"] in down}
                    for h in hosts
                    if h["name"] in serving
                ],
                "in_service": [n for n in serving if n not in down],
            }
        )
    return out


def _plan_keys(keys, models, errors):
    """edge_api_keys: [{name, key, models}] checked (never a key's value in an error); returns
    [{name, models}] (models [] = every model)."""
    out = []
    if keys in (None, ""):
        return out
    if not isinstance(keys, list):
        errors.append("edge_api_keys must be a list of {name, key, models}, not %s." % type(keys).__name__)
        return out
    names, values = set(), set()
    for n, k in enumerate(keys):
        checked = check_key("edge_api_keys", n, k, names, values, errors)
        if checked is None:
            continue
        label, scope = checked
        name = k.get("name")
        unknown = [m for m in scope if m not in models]
        if unknown and models:
            errors.append(
                "%s.models lists %s, which no backend of the edge serves (%s): correct the name or remove it."
                % (label, ", ".join(unknown), ", ".join(models))
            )
        limits = {}
        for field in ("tokens_per_minute", "tokens_per_day"):
            value = k.get(field, 0)
            if value is None:
                value = 0
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                errors.append(
                    "%s.%s=%r must be a whole number of tokens (0 or absent: no limit)." % (label, field, value)
                )
                value = 0
            limits[field] = value
        out.append({"name": str(name), "models": [str(m) for m in scope], **limits})
    return out


# the usage store's password, as it is written into redis.conf (requirepass) and the edge's key file
STORE_PASSWORD = re.compile(r"^[A-Za-z0-9._~+/=-]{16,128}$")


# The body caps the edge answers 413 past, per path (edge_body_limits is merged over these):
# JSON paths 32 MiB (a long prompt, or images as base64), audio 25 MiB (OpenAI's own limit on an
# audio file). nginx refuses anything past edge_client_max_body_size before the edge reads it.
BODY_LIMITS = {"default": "32m", "/v1/audio/transcriptions": "25m", "/v1/audio/translations": "25m"}
SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def size_bytes(value):
    """An nginx size (64m, 512k, 1048576) in bytes, or None when it is not one."""
    m = re.fullmatch(r"(\d+)([kmgKMG]?)", str(value)) if isinstance(value, (str, int)) else None
    if not m or isinstance(value, bool):
        return None
    return int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]


def _plan_limits(params, errors):
    """Each inference path's body cap in bytes ({"default": N, PATH: N}): BODY_LIMITS with
    edge_body_limits over it, none past edge_client_max_body_size (nginx's own cap)."""
    cap_value = params.get("client_max_body_size", "64m")
    cap = size_bytes(cap_value)
    if cap is None or cap == 0:
        errors.append(
            "edge_client_max_body_size=%r must be an nginx size like 64m (the largest body any path takes)."
            % (cap_value,)
        )
    given = params.get("body_limits") or {}
    if not isinstance(given, dict):
        errors.append(
            "edge_body_limits=%r must be a mapping of an inference path (or default) to a size, e.g. "
            "{default: 32m, /v1/audio/transcriptions: 25m}." % (given,)
        )
        given = {}
    limits = {}
    for path, value in {**BODY_LIMITS, **given}.items():
        if path != "default" and path not in ENDPOINTS:
            errors.append(
                "edge_body_limits has %r: use default or one of the inference paths (%s)."
                % (path, ", ".join(ENDPOINTS))
            )
            continue
        n = size_bytes(value)
        if n is None or n == 0:
            errors.append("edge_body_limits[%s]=%r must be an nginx size like 32m." % (path, value))
            continue
        if cap and n > cap:
            if path in given:
                errors.append(
                    "edge_body_limits[%s]=%s is over edge_client_max_body_size=%s, which nginx refuses first: raise "
                    "edge_client_max_body_size or lower the limit." % (path, value, cap_value)
                )
            n = cap
        limits[path] = n
    return limits


def _plan_quota(params, keys, errors):
    """The usage store (Redis on edge_quota_store_host, one of the edge hosts) that every edge
    counts the keys' tokens in and checks their quotas against: None when no store is set. The
    password is checked, never returned."""
    host = params.get("quota_store_host") or ""
    limited = [k["name"] for k in keys if k.get("tokens_per_minute") or k.get("tokens_per_day")]
    if not host:
        if limited:
            errors.append(
                "edge_api_keys (%s) set tokens_per_minute or tokens_per_day, and edge_quota_store_host is empty: "
                "name the edge host that keeps the usage counters (one of the edge group) or remove the limits."
                % ", ".join(limited)
            )
        return None
    where = []
    if not isinstance(host, str) or host not in (params.get("edge_hosts") or []):
        errors.append(
            "edge_quota_store_host=%r must be one of the edge hosts (%s): the edge role runs the usage store there."
            % (host, ", ".join(params.get("edge_hosts") or []) or "none")
        )
        where.append("host")
    if not keys:
        errors.append(
            "edge_quota_store_host=%s counts the tokens of each edge key, and edge_api_keys is empty: "
            "set edge_api_keys or leave edge_quota_store_host empty." % host
        )
    port = params.get("quota_store_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        errors.append("edge_quota_store_port=%r must be a TCP port number (1-65535)." % (port,))
    password = params.get("quota_store_password")
    if not isinstance(password, str) or not STORE_PASSWORD.fullmatch(password):
        errors.append(
            "edge_quota_store_password must be 16-128 characters of A-Z a-z 0-9 . _ ~ + / = - "
            "(the value is not shown): the usage store refuses every client without it."
        )
    fail_open = params.get("quota_fail_open")
    if not isinstance(fail_open, bool):
        errors.append(
            "edge_quota_fail_open=%r must be true (the store unreachable: requests pass, unchecked) or false "
            "(they get 503)." % (fail_open,)
        )
    audio = params.get("quota_audio_tokens_per_second", 10)
    if isinstance(audio, bool) or not isinstance(audio, (int, float)) or not 0 < audio <= 10000:
        errors.append(
            "edge_quota_audio_tokens_per_second=%r must be a number above 0 (the tokens an audio answer's second "
            "counts as; 10 is OpenAI's rate for audio input, one token per 100 ms)." % (audio,)
        )
    reserve = params.get("quota_reserve_tokens", 1024)
    if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        errors.append(
            "edge_quota_reserve_tokens=%r must be a whole number of tokens (0 or more): what a request that names no "
            "max_tokens reserves of its key's quota until it ends." % (reserve,)
        )
    edges = params.get("edge_hosts") or []
    return {
        "store_host": str(host),
        "address": str(params.get("quota_store_address") or host),
        "port": port,
        "fail_open": fail_open is not False,
        "limited": limited,
        # several edges reach the store over the network: TLS with the fleet CA's certificates
        # (the store's by its inventory name, each edge's client certificate); one edge: loopback
        "tls": len(edges) > 1,
        "audio_tokens_per_second": audio,
        "reserve_tokens": reserve,
    }


def _plan_router(params, hosts, down, errors):
    """The routing tier (vllm-router on the edge host, behind its nginx): None when
    edge_router_policy is "", else {policy, model, workers: [URL], backends: [{name, address,
    port, down}]}. The router reaches every instance through the edge's nginx on loopback
    (edge_router_backend_port, /gpufleet/b/HOST/INSTANCE/...), which holds the TLS to the
    proxies; a drained host's instances are not workers."""
    policy = params.get("router_policy") or ""
    if not policy:
        return None
    if policy not in ROUTER_POLICIES:
        errors.append(
            'edge_router_policy=%r is not a routing policy; choose from %s, or "" for none (nginx balances the '
            "proxies itself)." % (policy, ", ".join(ROUTER_POLICIES))
        )
    taken = {"edge_listen_port": params.get("listen_port")}
    if params.get("tls"):
        taken["edge_tls_port"] = params.get("tls_port")
    for var in ("router_port", "router_backend_port", "router_metrics_port"):
        port = params.get(var)
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            errors.append("edge_%s=%r must be a port number." % (var, port))
            continue
        clash = [k for k, v in taken.items() if v == port]
        if clash:
            errors.append("edge_%s=%d is also %s: give each listener its own port." % (var, port, clash[0]))
        taken["edge_" + var] = port
    models = sorted({i["model"] for h in hosts for i in h.get("instances") or []})
    for h in hosts:
        if not PATH_NAME.fullmatch(h["name"]) or not all(PATH_NAME.fullmatch(i["name"]) for i in h["instances"]):
            errors.append(
                "edge_router_policy=%s: %s or one of its instances has a name the router's worker paths cannot carry "
                "(letters, digits, '.', '_', '-')." % (policy, h["name"])
            )
        if not h["instances"]:
            errors.append(
                "edge_router_policy=%s: %s has no engine instance behind its proxy (gpufleet_engines, "
                "proxy_instances); the router routes to instances." % (policy, h["name"])
            )
    base = "http://127.0.0.1:%s/gpufleet/b" % params.get("router_backend_port")
    return {
        "policy": policy,
        "model": models[0] if models else None,
        "workers": [
            "%s/%s/%s" % (base, h["name"], i["name"]) for h in hosts if h["name"] not in down for i in h["instances"]
        ],
        # each worker's served model, in the same order (the multi-model mode adds them with it)
        "worker_models": [i["model"] for h in hosts if h["name"] not in down for i in h["instances"]],
        # down: a drained host's way from the router is closed too (a stale worker list answers 502)
        "backends": [
            {
                "name": h["name"],
                "address": h["address"],
                "port": h["port"],
                "down": h["name"] in down,
                "instances": [{"name": i["name"], "model": i["model"]} for i in h["instances"]],
            }
            for h in hosts
        ],
    }
