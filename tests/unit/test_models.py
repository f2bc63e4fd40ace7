"""The fleet's model catalog and each gpu host's pulls (plugins/module_utils/_models.py): every bad
input named with its fix before any host changes, and a pull that does not fit its disk refused
with the host, the folder, the free space and the fix."""

from __future__ import annotations

import base64
import json

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._models import plan_pulls, plan_store, pull_facts

STORE = {"dir": "/srv/gpufleet/store", "port": 8444}
COMMIT = "a09a35458c702b33eeacc393d103063234e8bc28"


def test_a_catalog_from_the_hub_and_from_the_store_host():
    plan = plan_store(
        [{"name": "qwen-7b", "repo_id": "Qwen/Qwen2.5-7B-Instruct", "revision": COMMIT},
         {"name": "tiny", "source": "/srv/incoming/tiny.tar.gz", "revision": "v1"}],
        STORE,
    )  # fmt: skip
    assert plan["errors"] == [] and plan["warnings"] == [] and plan["hub"] is True
    assert plan["models"] == [
        {"name": "qwen-7b", "kind": "hub", "repo_id": "Qwen/Qwen2.5-7B-Instruct", "revision": COMMIT, "source": "",
         "folder": "/srv/gpufleet/store/qwen-7b", "path": "/models/qwen-7b/"},
        {"name": "tiny", "kind": "source", "repo_id": "", "revision": "v1", "source": "/srv/incoming/tiny.tar.gz",
         "folder": "/srv/gpufleet/store/tiny", "path": "/models/tiny/"},
    ]  # fmt: skip


def test_a_branch_is_warned_about():
    plan = plan_store([{"name": "q", "repo_id": "Qwen/Qwen2.5-7B-Instruct", "revision": "main"}], STORE)
    assert plan["errors"] == [] and "revision main is a branch or tag, which moves" in plan["warnings"][0]


@pytest.mark.parametrize(
    "catalog, words",
    [
        ({"name": "x"}, ["gpufleet_models={'name': 'x'} must be a list"]),
        ([{"name": "a", "repo": "x/y"}], ["gpufleet_models[0]", "(it also has repo: check the spelling)"]),
        ([{"name": "../up", "source": "/x"}], ["gpufleet_models[0].name='../up'"]),
        ([{"name": "a", "source": "/x"}, {"name": "a", "source": "/y"}], ["the name a is given twice"]),
        ([{"name": "a", "repo_id": "x/y", "revision": COMMIT, "source": "/x"}], ["not both"]),
        ([{"name": "a"}], ["not neither"]),
        ([{"name": "a", "repo_id": "x/y"}], ["repo_id x/y needs a revision", "40 hex digits"]),
        ([{"name": "a", "repo_id": "not a repo", "revision": COMMIT}], ["repo_id='not a repo'"]),
        ([{"name": "a", "source": "relative/dir"}], ["source='relative/dir' must be an absolute folder"]),
        ([{"name": "a", "source": "/x", "revision": "a b"}], ["revision='a b'"]),
    ],
)  # fmt: skip
def test_bad_catalogs_are_named(catalog, words):
    text = " ".join(plan_store(catalog, STORE)["errors"])
    for word in words:
        assert word in text, text


@pytest.mark.parametrize(
    "params, words",
    [({"dir": "srv", "port": 8444}, ["model_store_dir='srv'"]), ({"dir": "/", "port": 8444}, ["model_store_dir='/'"]),
     ({"dir": "/srv/x/../y", "port": 8444}, ["model_store_dir='/srv/x/../y'"]),
     ({"dir": "/srv", "port": 0}, ["model_store_port=0"]), ({"dir": "/srv", "port": True}, ["model_store_port=True"])],
)  # fmt: skip
def test_bad_store_settings_are_named(params, words):
    text = " ".join(plan_store([], params)["errors"])
    for word in words:
        assert word in text, text


STORE_HOST = {"host": "edge-01", "address": "10.0.0.9", "port": 8444}


def test_pulls_get_their_store_url():
    plan = plan_pulls([{"name": "tiny", "path": "/srv/models/tiny/"}], ["tiny"], STORE_HOST, "gpu-01")
    assert plan == {"errors": [], "pulls": [{"name": "tiny", "path": "/srv/models/tiny", "server_name": "edge-01",
                                             "url": "https://10.0.0.9:8444/models/tiny/"}]}  # fmt: skip
    v6 = plan_pulls([{"name": "tiny", "path": "/m"}], ["tiny"], dict(STORE_HOST, address="fd00::9"), "g")
    assert v6["pulls"][0]["url"] == "https://[fd00::9]:8444/models/tiny/"


@pytest.mark.parametrize(
    "pulls, store, words",
    [
        ([{"name": "tiny", "path": "/m"}], None, ["the inventory has no model_store host"]),
        ([{"name": "big", "path": "/m"}], STORE_HOST, ["big is not in gpufleet_models (tiny)"]),
        ([{"name": "tiny", "path": "m"}], STORE_HOST, ["engine_model_pulls[0].path='m'"]),
        ([{"name": "tiny"}], STORE_HOST, ["engine_model_pulls[0]={'name': 'tiny'} must be a mapping"]),
        ([{"name": "tiny", "path": "/m"}, {"name": "tiny", "path": "/m/"}], STORE_HOST, ["the path /m is given twice"]),
        ({"tiny": "/m"}, STORE_HOST, ["engine_model_pulls={'tiny': '/m'} must be a list"]),
    ],
)  # fmt: skip
def test_bad_pulls_are_named(pulls, store, words):
    text = " ".join(plan_pulls(pulls, ["tiny"], store, "gpu-01")["errors"])
    for word in words:
        assert word in text, text


def test_a_pull_that_does_not_fit_is_named_with_the_host_folder_and_free_space():
    facts = {"/srv/models/big": {"total_size": 140 * 2**30, "free": 100 * 2**30, "have": 20 * 2**30,
                                 "margin": 2**30}}  # fmt: skip
    plan = plan_pulls([{"name": "big", "path": "/srv/models/big"}], ["big"], STORE_HOST, "gpu-07", facts)
    (error,) = plan["errors"]
    assert error.startswith("gpu-07 cannot take big at /srv/models/big: it needs 121.0 GiB more")
    assert "the model's 140.0 GiB, less 20.0 GiB already there, plus a margin of 1.0 GiB" in error
    assert "/srv/models has 100.0 GiB free" in error and "Free space there" in error
    # what is already there counts: the same pull fits once most of it is
    facts["/srv/models/big"]["have"] = 60 * 2**30
    assert (
        plan_pulls([{"name": "big", "path": "/srv/models/big"}], ["big"], STORE_HOST, "gpu-07", facts)["errors"] == []
    )


def test_pull_facts_from_the_roles_reads():
    manifest = base64.b64encode(json.dumps({"total_size": 5000}).encode()).decode()
    manifests = [
        {"item": {"name": "a", "path": "/m/a"}, "content": manifest},
        {"item": {"name": "b", "path": "/m/b"}, "failed": True, "msg": "file not found"},  # not filled yet
        {"item": {"name": "c", "path": "/m/c"}, "content": manifest},
    ]
    spaces = [{"item": {"path": "/m/a"}, "stdout": "1000 200"}, {"item": {"path": "/m/b"}, "stdout": "9 0"},
              {"item": {"path": "/m/c"}, "stdout": "df: no"}]  # fmt: skip
    assert pull_facts(manifests, spaces, 7) == {"/m/a": {"total_size": 5000, "free": 1000, "have": 200, "margin": 7}}


def test_the_model_store_client_folder_is_not_an_engine_instance():
    """Every folder in engine_config_dir is an instance to the engine role (an unlisted one is
    stopped and removed): the client certificate's folder must sit elsewhere. Under
    /etc/gpufleet/engines/tls the fleet lab's second run recreated and removed it (changed=8)."""
    from pathlib import Path

    import yaml

    role = Path(__file__).resolve().parents[2] / "roles" / "engine"
    config_dir = yaml.safe_load((role / "defaults" / "main.yml").read_text())["engine_config_dir"]
    tls_dir = yaml.safe_load((role / "vars" / "main.yml").read_text())["_engine_model_tls_dir"]
    assert not (tls_dir + "/").startswith(config_dir.rstrip("/") + "/"), (tls_dir, config_dir)
    pull = (role / "tasks" / "pull.yml").read_text()
    assert "engine_config_dir" not in pull
