"""Roles meet through published records (plugins/module_utils/_published.py), never through
each other's files: the fallback defaults are the producing roles' own, each record is what
its role's settings say, and no role or plugin opens a role's files by path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.serving.plugins.module_utils._edge import backends
from ansible_collections.gpufleet.serving.plugins.module_utils._firewall import plan_firewall
from ansible_collections.gpufleet.serving.plugins.module_utils._published import (
    FACTS,
    FALLBACK,
    FORMAT,
    publish,
    published,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("role", sorted(FALLBACK))
def test_the_fallback_is_the_producing_role_s_own_defaults(role):
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    assert {k: defaults[k] for k in FALLBACK[role]} == FALLBACK[role]


@pytest.mark.parametrize("role", sorted(FACTS))
def test_each_fact_is_set_by_its_role_s_preflight_and_cacheable(role):
    tasks = yaml.safe_load((ROOT / "roles" / role / "tasks" / "publish.yml").read_text())
    (task,) = [t for t in tasks if FACTS[role] in (t.get("ansible.builtin.set_fact") or {})]
    preflight = yaml.safe_load((ROOT / "roles" / role / "tasks" / "preflight.yml").read_text())
    assert preflight[0].get("ansible.builtin.import_tasks") == "publish.yml"
    assert task["ansible.builtin.set_fact"]["cacheable"] is True
    # every setting the record is made from is passed, under its own name
    for key in FALLBACK.get(role, ()):
        assert "'%s': %s" % (key, key) in task["ansible.builtin.set_fact"][FACTS[role]]


def test_a_published_record_wins_over_the_inventory():
    hv = {"proxy_tls": False, "proxy_listen_port": 8080, "gpufleet_engines": [{"name": "a", "port": 8001}]}
    assert published("proxy", hv)["port"] == 8080
    said = publish("proxy", dict(FALLBACK["proxy"], proxy_tls=True, proxy_tls_port=9443), engines=[{"name": "a"}])
    hv["gpufleet_proxy_published"] = said
    assert published("proxy", hv) == said
    assert (said["tls"], said["port"], said["instances"]) == (True, 9443, ["a"])
    # what the firewall opens and where the edge connects follow the record
    rules = plan_firewall({"ssh_port": 22}, hv, ["gpu_host"])["rules"]
    assert [r["port"] for r in rules if r["why"].startswith("the proxy")] == [9443]
    (backend,) = backends(["g1"], {"g1": hv})
    assert (backend["tls"], backend["port"], backend["instances"]) == (
        True,
        9443,
        [{"name": "a", "model": "a", "source": "", "max_model_len": None}],
    )
    # a record of another format is not trusted: the inventory is read instead
    hv["gpufleet_proxy_published"] = dict(said, format=0)
    assert published("proxy", hv)["port"] == 8080


def test_the_engine_record_has_the_registry_s_defaults_and_no_secret():
    record = publish("engine", {}, engines=[{"name": "a", "model": "/m", "port": 8001, "api_key": "k" * 40,
                                             "env": {"HF_TOKEN": "t"}}, "not an instance"])  # fmt: skip
    assert record["instances"] == [{"name": "a", "engine": "vllm", "served_model_name": "a", "model": "/m",
                                    "max_model_len": None, "port": 8001, "surge_port": 9001,
                                    "upstream": "127.0.0.1:8001", "surge_upstream": "127.0.0.1:9001"}]  # fmt: skip
    assert "k" * 40 not in repr(record) and "HF_TOKEN" not in repr(record)


def test_the_proxy_site_is_made_from_the_engine_record():
    from ansible_collections.gpufleet.serving.plugins.module_utils._proxy import plan_proxy

    engines = [{"name": "a", "model": "/m", "port": 8001, "bind": "0.0.0.0", "api_key": "k" * 32}]
    record = publish("engine", {}, engines=engines)
    params = {"listen_port": 8080, "client_max_body_size": "1m"}
    assert plan_proxy(params, engines) == plan_proxy(params, engines, record)
    # the upstream is the record's: what the engine role published is what the proxy balances
    moved = {"format": FORMAT, "instances": [dict(record["instances"][0], upstream="127.0.0.1:7001")]}
    got = plan_proxy(params, engines, moved)
    assert (got["upstream"], got["engine_key"]) == (["127.0.0.1:7001"], "k" * 32)


def test_the_proxy_fronts_what_proxy_instances_names():
    engines = [{"name": "a"}, {"name": "b"}]
    assert publish("proxy", FALLBACK["proxy"], engines=engines)["instances"] == ["a", "b"]
    only = dict(FALLBACK["proxy"], proxy_instances=["b"])
    assert publish("proxy", only, engines=engines)["instances"] == ["b"]
    (backend,) = backends(["g"], {"g": {"gpufleet_engines": engines, "proxy_instances": ["b"]}})
    assert backend["instances"] == [{"name": "b", "model": "b", "source": "", "max_model_len": None}]


# a path into another role's folder: roles/NAME/..., role_path }}/.., or ../../plugins
_BY_PATH = re.compile(r"""["'/]roles["'/,]|role_path\s*}}\s*/\.\.|\.\./\.\./(roles|plugins)""")


def test_no_role_or_plugin_opens_another_role_s_files():
    found = []
    for path in sorted(list((ROOT / "roles").rglob("*")) + list((ROOT / "plugins").rglob("*.py"))):
        if not path.is_file() or path.suffix not in (".py", ".yml", ".j2", "") or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("#", 1)[0] if path.suffix in (".py", ".yml", "") else line
            if _BY_PATH.search(code):
                found.append("%s:%d: %s" % (path.relative_to(ROOT), number, line.strip()))
    assert found == []


@pytest.mark.parametrize(
    ("tls", "listen", "local"),
    [
        (False, "0.0.0.0", "127.0.0.1"),
        (False, "10.0.0.5", "10.0.0.5"),  # the stream check called 127.0.0.1 here and failed (issue 32)
        (False, "::", "[::1]"),
        (False, "fd00::5", "[fd00::5]"),
        (True, "10.0.0.5", "127.0.0.1"),  # with TLS the plain port listens on loopback
    ],
)
def test_the_stream_check_calls_the_address_the_proxy_listens_on(tls, listen, local):
    record = publish("proxy", dict(FALLBACK["proxy"], proxy_tls=tls, proxy_listen_address=listen), engines=[])
    assert record["local_address"] == local
