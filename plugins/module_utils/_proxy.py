# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proxy site in front of a host's engines: validation and the upstream (private).

Used by the proxy role's preflight and templates. Every error names the variable, the
value (never a key's value) and the fix.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import local_address
from ansible_collections.gpufleet.serving.plugins.module_utils._published import FORMAT, publish, tls_names_errors

KEY_CHARS = re.compile(r"^[A-Za-z0-9._~+/=-]+$")
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# The inference paths of the OpenAI-compatible servers that clients may be given: an allow-list,
# so an engine's control path (vLLM 0.32 serves /v1/load_lora_adapter, /pause, /collective_rpc,
# /tokenize ... beside these) can never be enabled by a typo or a deny-list that fell behind.
# The engine only ever sees one of these paths: each location passes its own path upstream.
ENDPOINTS = (
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/v1/responses",
    "/v1/rerank", "/v1/score", "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/messages",
)  # fmt: skip
MIN_KEY_LENGTH = 32
RATE = re.compile(r"^[1-9]\d*r/[sm]$")
SIZE = re.compile(r"^\d+[kmg]?$")
DURATION = re.compile(r"^\d+(ms|s|m|h)?$")
# an address, a network or a host name (nginx's set_real_ip_from resolves names when it loads)
TRUSTED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]*(/\d{1,3})?$")


# the fields of a client key: the proxies check name and key (and the scope, which they enforce
# too); the edge also reads the token quotas
KEY_FIELDS = ("name", "key", "models", "tokens_per_minute", "tokens_per_day")


def check_key(var, index, entry, names, values, errors):
    """One client key of VAR (proxy_api_keys or edge_api_keys) at INDEX: its fields, its name
    (KEY_NAME, once in NAMES) and its value (MIN_KEY_LENGTH of KEY_CHARS, once in VALUES; never
    shown in an error), and its models. Appends to ERRORS; returns None for an entry that is not
    a mapping of KEY_FIELDS, else (label, models) with models [] (every model) where absent or
    wrong."""
    where = "%s[%d]" % (var, index)
    if not isinstance(entry, dict) or set(entry) - set(KEY_FIELDS):
        extra = sorted(map(str, set(entry) - set(KEY_FIELDS))) if isinstance(entry, dict) else []
        errors.append(
            "%s must be a mapping of name, key and optionally models, tokens_per_minute and tokens_per_day%s."
            % (where, " (it also has %s: check the spelling)" % ", ".join(extra) if extra else "")
        )
        return None
    name, key = entry.get("name"), entry.get("key")
    if not isinstance(name, str) or not KEY_NAME.fullmatch(name):
        errors.append(
            "%s.name=%r must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit." % (where, name)
        )
    elif name in names:
        errors.append(
            "%s.name=%r is used twice: give each key its own name (names identify keys in logs, limits and usage)."
            % (where, name)
        )
    else:
        names.add(name)
    label = "%s (%s)" % (where, name)
    if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH:
        got = "missing" if key in (None, "") else "%d characters" % len(key) if isinstance(key, str) else "not a string"
        errors.append(
            "%s.key is %s (the value is not shown); client keys need at least %d characters of "
            "A-Z a-z 0-9 . _ ~ + / = - (e.g. `openssl rand -hex 24`)." % (label, got, MIN_KEY_LENGTH)
        )
    elif not KEY_CHARS.fullmatch(key):
        errors.append(
            "%s.key has characters outside A-Z a-z 0-9 . _ ~ + / = - (nginx matches it literally; the value is not "
            "shown)." % label
        )
    elif key in values:
        errors.append("%s.key is the same as another entry's key: give each entry its own key." % label)
    else:
        values.add(key)
    models = entry.get("models")
    if models is None:
        models = []
    if not (isinstance(models, list) and all(isinstance(m, str) and m for m in models)):
        errors.append("%s.models=%r must be a list of served model names ([] for every model)." % (label, models))
        models = []
    return label, models


def plan_proxy(params, engines, published=None):
    """params: the proxy_* variables (without the prefix); engines: gpufleet_engines, read for
    the engine key only (keys are never published); published: the engine role's record
    (gpufleet_engine_published: names, served names, ports, upstream addresses), else made
    from engines.

    Returns {errors, upstream: [host:port], backup: [host:port] (the surge copies),
    engine_key: str|None, model: served name, instances: [names], monitor: [{name, port}],
    by_instance: [{name, server, backup}] (each instance with its own surge copy: the edge's router
    addresses one instance at /gpufleet/instance/NAME/...)}.
    """
    errors = []
    engines = [e for e in engines or [] if isinstance(e, dict)]
    if not (isinstance(published, dict) and published.get("format") == FORMAT):
        published = publish("engine", {}, engines=engines)
    records = published["instances"]
    key_of = {str(e.get("name")): e.get("api_key") for e in engines}
    by_name = {r["name"]: r for r in records}
    wanted = params.get("instances") or [r["name"] for r in records]
    chosen = []
    for name in wanted:
        if name not in by_name:
            errors.append(
                "proxy_instances: %r is not an instance in gpufleet_engines (%s)."
                % (name, ", ".join(map(str, by_name)))
            )
        else:
            chosen.append(by_name[name])
    if not chosen and not errors:
        errors.append("proxy: no engine instance to front; define gpufleet_engines or proxy_instances.")
    models = sorted({r["served_model_name"] for r in chosen})
    if len(models) > 1:
        errors.append(
            "proxy_instances: the instances serve different models (%s); one site balances replicas of one "
            "model. List the replicas of one model in proxy_instances." % ", ".join(models)
        )
    engine_keys = {key_of.get(r["name"]) or "" for r in chosen}
    for r in chosen:
        if key_of.get(r["name"]) and not KEY_CHARS.fullmatch(str(key_of[r["name"]])):
            errors.append(
                "gpufleet_engines (%s).api_key has characters outside A-Z a-z 0-9 . _ ~ + / = - ; the proxy writes "
                "it into an nginx header, so keep to those." % r["name"]
            )
    if len(engine_keys) > 1:
        errors.append(
            "gpufleet_engines: the instances behind the proxy (%s) have different api_key values; the proxy "
            "injects one engine key upstream, so give the replicas the same key." % ", ".join(r["name"] for r in chosen)
        )
    # ports
    taken = {r["port"]: r["name"] for r in records}
    for r in records:
        taken.setdefault(r["surge_port"], "%s's surge copy" % r["name"])
    listen_ports = [("proxy_listen_port", params.get("listen_port"))]
    if params.get("tls"):
        listen_ports.append(("proxy_tls_port", params.get("tls_port")))
    monitor = str(params.get("monitor_listen") or "")
    mport = monitor.rsplit(":", 1)[-1] if ":" in monitor else ""
    if not mport.isdigit():
        errors.append("proxy_monitor_listen=%r must be ADDRESS:PORT, e.g. 127.0.0.1:9091." % monitor)
    else:
        listen_ports.append(("proxy_monitor_listen", int(mport)))
    seen = {}
    for var, port in listen_ports:
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            errors.append("%s=%r must be a port number." % (var, port))
        elif port in taken:
            errors.append(
                "%s=%d is the port of engine instance %s; pick a free port for the proxy." % (var, port, taken[port])
            )
        elif port in seen:
            errors.append("%s=%d is also %s." % (var, port, seen[port]))
        else:
            seen[port] = var
    # client keys
    keys = params.get("api_keys") or []
    if not isinstance(keys, list):
        errors.append("proxy_api_keys must be a list of {name, key}.")
        keys = []
    names = set()
    values = set()
    for i, entry in enumerate(keys):
        check_key("proxy_api_keys", i, entry, names, values, errors)
    if not keys:
        errors.append("proxy_api_keys is empty: every client would get 401. Add at least one {name, key}.")
    elif len(models) == 1 and not [
        k for k in keys if isinstance(k, dict) and (not k.get("models") or models[0] in (k.get("models") or []))
    ]:
        errors.append(
            "proxy_api_keys: no key may use %s, the model this host serves (each key's models leave it out), so "
            "every client would get 401 here. Add %s to a key's models, or serve another model here." % (
                models[0], models[0])
        )  # fmt: skip
    # endpoints
    endpoints = params.get("endpoints") or []
    if not isinstance(endpoints, list):
        errors.append("proxy_endpoints=%r must be a list of paths, e.g. [/v1/chat/completions]." % (endpoints,))
        endpoints = []
    for path in endpoints:
        if path not in ENDPOINTS:
            errors.append(
                "proxy_endpoints: %r is not an inference path clients may reach; choose from %s (engine control "
                "paths such as /metrics, /tokenize or /v1/load_lora_adapter are never exposed)."
                % (path, ", ".join(ENDPOINTS))
            )
    if len(set(map(str, endpoints))) != len(endpoints):
        errors.append("proxy_endpoints lists a path twice: %s." % ", ".join(map(str, endpoints)))
    for var in ("read_timeout", "send_timeout", "upstream_keepalive_timeout"):
        value = params.get(var)
        if not isinstance(value, str) or not DURATION.fullmatch(value):
            errors.append("proxy_%s=%r must be an nginx duration like 600s." % (var, value))
    for var in ("rate_limit", "auth_fail_rate"):
        if var in params and not RATE.fullmatch(str(params.get(var))):
            errors.append("proxy_%s=%r must be like 20r/s or 600r/m." % (var, params.get(var)))
    for var in ("rate_burst", "auth_fail_burst", "max_streams_per_key"):
        value = params.get(var)
        if var in params and (not isinstance(value, int) or isinstance(value, bool) or value < (var != "rate_burst")):
            least = "" if var == "rate_burst" else " of at least 1"
            errors.append("proxy_%s=%r must be a whole number%s." % (var, value, least))
    trusted = params.get("trusted_proxies") or []
    if not isinstance(trusted, list) or not all(isinstance(t, str) and TRUSTED.fullmatch(t) for t in trusted):
        errors.append(
            "proxy_trusted_proxies=%r must be a list of addresses, networks (10.0.0.0/24) or host names: the edge "
            "hosts whose X-Forwarded-For the proxy believes." % (trusted,)
        )
    if not SIZE.fullmatch(str(params.get("client_max_body_size"))):
        errors.append("proxy_client_max_body_size=%r must be like 64m." % params.get("client_max_body_size"))
    if params.get("tls") and bool(params.get("tls_certificate")) != bool(params.get("tls_certificate_key")):
        errors.append(
            "proxy_tls_certificate=%r and proxy_tls_certificate_key=%r: set both (paths on the host), or leave both "
            '"" for a certificate from the fleet CA.'
            % (params.get("tls_certificate"), params.get("tls_certificate_key"))
        )
    errors += tls_names_errors("proxy_tls_names", params.get("tls_names", []))
    tls = bool(params.get("tls"))
    warnings = []
    if not tls:
        warnings.append(
            "proxy_tls is false: clients' keys and prompts reach this proxy on port %s in clear. Remove "
            "proxy_tls: false (TLS is the default, with a certificate from the fleet CA) unless only loopback or a "
            "trusted network reaches it." % params.get("listen_port")
        )
    return {
        "errors": errors,
        "warnings": warnings,
        # With TLS on, plain HTTP stays on loopback (local checks); clients and the edge use TLS.
        "plain_listen_address": "127.0.0.1" if tls else params.get("listen_address", "0.0.0.0"),
        "public_ports": [params.get("tls_port")] if tls else [params.get("listen_port")],
        # where a check on the host itself reaches the plain listener
        "local_address": local_address("127.0.0.1" if tls else params.get("listen_address", "0.0.0.0")),
        "upstream": [r["upstream"] for r in chosen if r["upstream"]],
        # the surge copies: used only while no instance answers (one of them restarting)
        "backup": [r["surge_upstream"] for r in chosen if r["surge_upstream"]],
        "engine_key": (key_of.get(chosen[0]["name"]) or None) if chosen else None,
        "model": models[0] if models else None,
        "instances": [r["name"] for r in chosen],
        "monitor": [{"name": r["name"], "port": r["port"]} for r in chosen],
        "by_instance": [
            {"name": r["name"], "server": r["upstream"], "backup": r["surge_upstream"]} for r in chosen if r["upstream"]
        ],
    }
