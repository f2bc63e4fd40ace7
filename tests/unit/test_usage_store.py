"""gpufleet-usage's copy of the usage store's key layout and protocol (roles/edge/files/gpufleet-usage)
against the fixture the edge's Lua specs read too (tests/fixtures/usage_store.json,
tests/lua/store_spec.lua): the two sides name the same keys and speak the same bytes."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json

import pytest
from conftest import ROOT

SHARED = json.loads((ROOT / "tests" / "fixtures" / "usage_store.json").read_text())


def _usage_module():
    path = str(ROOT / "roles" / "edge" / "files" / "gpufleet-usage")
    loader = importlib.machinery.SourceFileLoader("gpufleet_usage_script", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


usage = _usage_module()


@pytest.mark.parametrize("k", SHARED["keys"], ids=lambda k: k["key"])
def test_keys_as_the_lua_names_them(k):
    assert usage.minute_key(k["key"], k["minute"]) == k["minute_key"]
    assert usage.day_key(k["key"], k["day"]) == k["day_key"]
    assert usage.usage_key(k["key"], k["model"]) == k["usage_key"]
    assert SHARED["index"] == usage.INDEX
    assert list(usage.USAGE_FIELDS) == SHARED["usage_fields"]


@pytest.mark.parametrize("c", SHARED["commands"], ids=lambda c: c["args"][0])
def test_commands_as_the_lua_encodes_them(c):
    assert usage.encode(*c["args"]) == c["bytes"].encode()


@pytest.mark.parametrize("r", SHARED["replies"], ids=lambda r: r["bytes"][:8])
def test_replies_read_as_the_lua_reads_them(r):
    assert usage.reply(io.BytesIO(r["bytes"].encode())) == r["value"]


@pytest.mark.parametrize("r", SHARED["errors"], ids=lambda r: r["bytes"][:8])
def test_error_replies(r):
    with pytest.raises(OSError, match="^" + r["message"].replace("(", r"\(") + "$"):
        usage.reply(io.BytesIO(r["bytes"].encode()))
