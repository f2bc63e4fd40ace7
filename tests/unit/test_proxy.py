"""The proxy planner: every bad setting named before any change, never echoing a key."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.filter.proxy_plan import proxy_plan
from ansible_collections.gpufleet.serving.plugins.module_utils._proxy import plan_proxy

KEY_A = "a" * 32
ENGINES = [
    {"name": "r1", "port": 8001, "served_model_name": "qwen", "api_key": "e" * 40},
    {"name": "r2", "port": 8002, "served_model_name": "qwen", "api_key": "e" * 40},
]


def params(**over):
    base = {
        "listen_port": 8080, "instances": [], "endpoints": ["/v1/chat/completions", "/v1/models"],
        "api_keys": [{"name": "team-a", "key": KEY_A}], "rate_limit": "20r/s", "client_max_body_size": "64m",
        "read_timeout": "600s", "send_timeout": "600s", "upstream_keepalive_timeout": "4s", "tls": False,
        "tls_port": 8443, "monitor_listen": "127.0.0.1:9091",
    }  # fmt: skip
    base.update(over)
    return base


def test_replicas_balance_with_one_engine_key():
    plan = plan_proxy(params(), ENGINES)
    assert plan["errors"] == []
    assert plan["upstream"] == ["127.0.0.1:8001", "127.0.0.1:8002"]
    # the surge copies (port + 1000 unless surge_port is set) stand behind them as backups
    assert plan["backup"] == ["127.0.0.1:9001", "127.0.0.1:9002"]
    assert plan_proxy(params(), [dict(ENGINES[0], surge_port=8500)])["backup"] == ["127.0.0.1:8500"]
    assert plan["model"] == "qwen"
    assert plan["engine_key"] == "e" * 40
    # each instance alone (the edge's router addresses one), with its own surge copy
    assert plan["by_instance"] == [
        {"name": "r1", "server": "127.0.0.1:8001", "backup": "127.0.0.1:9001"},
        {"name": "r2", "server": "127.0.0.1:8002", "backup": "127.0.0.1:9002"},
    ]


@pytest.mark.parametrize(
    ("over", "engines", "words"),
    [
        ({"listen_port": 8001}, ENGINES, ["proxy_listen_port=8001 is the port of engine instance r1"]),
        ({"listen_port": 9002}, ENGINES, ["proxy_listen_port=9002 is the port of engine instance r2's surge copy"]),
        (
            {"monitor_listen": "127.0.0.1:8002"},
            ENGINES,
            ["proxy_monitor_listen=8002 is the port of engine instance r2"],
        ),
        (
            {"api_keys": [{"name": "t", "key": "short-key"}]},
            ENGINES,
            ["proxy_api_keys[0] (t).key is 9 characters", "32"],
        ),
        ({"api_keys": []}, ENGINES, ["proxy_api_keys is empty"]),
        ({"api_keys": [{"name": "t", "key": KEY_A}, {"name": "t", "key": "b" * 32}]}, ENGINES, ["used twice"]),
        ({"api_keys": [{"name": "t", "key": "has space" + "x" * 30}]}, ENGINES, ["characters outside"]),
        # a key that YAML read as a number: named, not a crash
        ({"api_keys": [{"name": "t", "key": 123456789}]}, ENGINES, ["proxy_api_keys[0] (t).key is not a string"]),
        ({"api_keys": [{"name": "t", "key": KEY_A, "modles": ["m"]}]}, ENGINES, ["it also has modles"]),
        ({"endpoints": ["/v1/models", "/metrics"]}, ENGINES, ["'/metrics' is not an inference path clients may reach"]),
        # vLLM serves LoRA loading under /v1: a control path, never an endpoint
        ({"endpoints": ["/v1/load_lora_adapter"]}, ENGINES, ["'/v1/load_lora_adapter' is not an inference path"]),
        ({"endpoints": ["/v1/unload_lora_adapter"]}, ENGINES, ["'/v1/unload_lora_adapter' is not an inference path"]),
        ({"endpoints": ["/v1/models", "/v1/models"]}, ENGINES, ["lists a path twice"]),
        ({"auth_fail_rate": "10 per minute"}, ENGINES, ["proxy_auth_fail_rate='10 per minute'"]),
        ({"auth_fail_burst": -1}, ENGINES, ["proxy_auth_fail_burst=-1 must be a whole number of at least 1"]),
        ({"trusted_proxies": ["10.0.0.0/8 ; deny"]}, ENGINES, ["proxy_trusted_proxies="]),
        # a key with a line break would add lines to the nginx map
        ({"api_keys": [{"name": "t", "key": "k" * 40 + "\n"}]}, ENGINES, ["characters outside"]),
        ({"instances": ["r3"]}, ENGINES, ["proxy_instances: 'r3' is not an instance"]),
        ({}, [dict(ENGINES[0]), dict(ENGINES[1], served_model_name="llama")], ["serve different models"]),
        ({}, [dict(ENGINES[0]), dict(ENGINES[1], api_key="f" * 40)], ["different api_key values"]),
        (
            {"tls": True, "tls_certificate": "/c.pem", "tls_certificate_key": ""},
            ENGINES,
            ["proxy_tls_certificate='/c.pem' and proxy_tls_certificate_key='': set both"],
        ),
        ({"rate_limit": "20/s"}, ENGINES, ["proxy_rate_limit='20/s'"]),
        (
            {"tls_names": ["gpu.example.com", "10.0.0.5", "*.gpu.example.com", "-x-"]},
            ENGINES,
            ["proxy_tls_names lists '-x-': not a DNS name or an IP address"],
        ),
        ({"read_timeout": "ten minutes"}, ENGINES, ["proxy_read_timeout='ten minutes'"]),
    ],
)
def test_bad_settings_are_named(over, engines, words):
    plan = plan_proxy(params(**over), engines)
    text = " ".join(plan["errors"])
    for word in words:
        assert word in text
    for entry in params(**over)["api_keys"]:
        assert str(entry["key"]) not in text  # a key is never echoed


def test_plain_http_is_an_explicit_opt_out_with_a_warning():
    assert plan_proxy(params(tls=True), ENGINES)["warnings"] == []
    plain = plan_proxy(params(tls=False), ENGINES)
    assert plain["errors"] == [] and plain["public_ports"] == [8080]
    assert (
        "proxy_tls is false: clients' keys and prompts reach this proxy on port 8080 in clear" in plain["warnings"][0]
    )


def test_filter_is_the_planner():
    assert proxy_plan(params(), ENGINES) == plan_proxy(params(), ENGINES)


def test_keys_differing_only_in_case_are_two_keys_each_matched_exactly():
    """Two keys that differ only in case: the plan takes both, the map nginx reads holds one
    case-sensitive regular expression per key (an nginx `map` without `~` compares without
    case, so they were one key and `nginx -t` refused the duplicate), and each Authorization
    header matches its own key's line only. The scheme word matches in any case."""
    import re
    from pathlib import Path

    import jinja2
    from ansible.plugins.filter.core import regex_escape

    upper, lower = "lab-Case-Key-0123456789abcdef0123456", "lab-case-key-0123456789abcdef0123456"
    keys = [{"name": "upper", "key": upper}, {"name": "lower", "key": lower}]
    assert plan_proxy(params(api_keys=keys), ENGINES)["errors"] == []
    folder = Path(__file__).resolve().parents[2] / "roles" / "proxy" / "templates"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)))
    env.filters.update(regex_escape=regex_escape, comment=lambda text: "# " + text)
    # a key scoped to another model (edge_api_keys' list given to the proxies too) is left out of this host's map
    scoped = [
        *keys,
        {"name": "other", "key": "lab-other-key-0123456789abcdef012345", "models": ["elsewhere"]},
        {"name": "mine", "key": "lab-mine-key-0123456789abcdef0123456", "models": ["qwen", "elsewhere"]},
    ]
    rendered = env.get_template("client-keys.map.j2").render(
        proxy_api_keys=scoped, ansible_managed="managed", __proxy_plan={"model": "qwen"}
    )
    assert "other" not in rendered and '"mine";' in rendered
    rendered = "\n".join(line for line in rendered.splitlines() if '"mine"' not in line)
    lines = [line for line in rendered.splitlines() if line.startswith('"~')]
    assert len(lines) == 2 and lines[0] != lines[1]
    patterns = {
        name[1:-1]: re.compile(regex[2:-1]) for regex, name in (line.rstrip(";").rsplit(" ", 1) for line in lines)
    }

    def matches(header):
        return [name for name, pattern in patterns.items() if pattern.search(header)]

    assert matches("Bearer " + upper) == ["upper"]
    assert matches("bearer  " + lower) == ["lower"]  # the scheme word in any case, one or more spaces
    assert matches("Bearer " + upper.upper()) == [] and matches("Bearer " + upper + "x") == []


def test_key_scopes_are_checked_and_a_host_no_key_may_use_is_named():
    other = {"name": "b", "key": KEY_A + "b", "models": ["elsewhere"]}
    text = " ".join(plan_proxy(params(api_keys=[dict(other, name="a", key=KEY_A)]), ENGINES)["errors"])
    assert "no key may use qwen, the model this host serves" in text
    assert (
        plan_proxy(params(api_keys=[{"name": "a", "key": KEY_A, "models": ["qwen"]}, other]), ENGINES)["errors"] == []
    )
    text = " ".join(plan_proxy(params(api_keys=[{"name": "a", "key": KEY_A, "models": "qwen"}]), ENGINES)["errors"])
    assert "proxy_api_keys[0] (a).models='qwen' must be a list" in text
