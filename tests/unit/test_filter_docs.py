"""Every filter the collection exposes has documentation that ansible-doc loads, and it
documents the filter's real parameters.

ansible-doc reads a filter's docs from the .py file that defines it when that file has a
DOCUMENTATION string (for every filter in the file), else from the sidecar NAME.yml beside
it. gpufleet keeps every filter's docs in its sidecar, so a file with several filters cannot
give one filter's docs to another."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILTER_DIR = ROOT / "plugins" / "filter"
PREFIX = "gpufleet.serving."


def _exposed() -> dict[str, tuple[str, object]]:
    """{filter name: (defining file, function)} from every FilterModule in plugins/filter."""
    found = {}
    for path in sorted(FILTER_DIR.glob("*.py")):
        module = importlib.import_module("ansible_collections.gpufleet.serving.plugins.filter." + path.stem)
        for name, func in module.FilterModule().filters().items():
            assert name not in found, "filter %s is defined in %s and %s" % (name, found[name][0], path.name)
            found[name] = (path.name, func)
    return found


FILTERS = _exposed()


@pytest.fixture(scope="module")
def ansible_doc_run() -> subprocess.CompletedProcess:
    """ansible-doc --json for every exposed filter, run once, as a user runs it from the checkout."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), "-t", "filter", "--json"]
        + [PREFIX + name for name in sorted(FILTERS)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ansible_doc(ansible_doc_run) -> dict:
    """{fqcn: {doc, examples, return, metadata}} of the filters ansible-doc could document."""
    try:
        return json.loads(ansible_doc_run.stdout)
    except ValueError:
        return {}


def test_ansible_doc_documents_every_filter_cleanly(ansible_doc_run):
    assert ansible_doc_run.returncode == 0, ansible_doc_run.stderr
    assert "[WARNING]" not in ansible_doc_run.stderr, ansible_doc_run.stderr


def test_the_collection_exposes_filters():
    assert {"engine_plan", "model_inventory", "nccl_env", "nvidia_driver_plan", "engine_load"} <= set(FILTERS)


def test_filter_files_keep_docs_in_sidecars():
    """A DOCUMENTATION string in a .py file would shadow the sidecars of every filter in it."""
    for path in sorted(FILTER_DIR.glob("*.py")):
        text = path.read_text()
        assert "DOCUMENTATION" not in text, "%s: move its docs to the filters' sidecar .yml files" % path.name


def test_every_sidecar_belongs_to_a_filter():
    orphans = sorted(p.name for p in FILTER_DIR.glob("*.yml") if p.stem not in FILTERS)
    assert not orphans, "sidecars without a filter of that name: %s" % orphans


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_sidecar_has_every_section(name):
    path = FILTER_DIR / (name + ".yml")
    assert path.is_file(), "filter %s (in %s) has no sidecar docs %s" % (name, FILTERS[name][0], path.name)
    data = yaml.safe_load(path.read_text())
    assert set(data) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, path.name
    doc = data["DOCUMENTATION"]
    assert doc["name"] == name
    for key in ("short_description", "description", "version_added", "options"):
        assert doc.get(key), "%s: DOCUMENTATION.%s is empty" % (path.name, key)
    assert "gpufleet.serving.%s" % name in data["EXAMPLES"], "%s: EXAMPLES never uses the filter" % path.name
    assert data["RETURN"].get("_value", {}).get("type"), "%s: RETURN._value needs a type" % path.name


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_ansible_doc_loads_the_filters_own_docs(name, ansible_doc):
    entry = ansible_doc.get(PREFIX + name)
    assert entry, "ansible-doc cannot document %s%s" % (PREFIX, name)
    doc = entry["doc"]
    assert doc["name"] == name, "ansible-doc shows %s's docs for %s" % (doc["name"], name)
    assert Path(doc["filename"]).name == name + ".yml"
    assert entry["examples"] and entry["return"].get("_value")


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_docs_name_the_filters_parameters(name, ansible_doc):
    """The documented options are the function's parameters: _input for the first, the rest by name."""
    func = FILTERS[name][1]
    params = list(inspect.signature(func).parameters)
    assert PREFIX + name in ansible_doc, "ansible-doc cannot document %s%s" % (PREFIX, name)
    doc = ansible_doc[PREFIX + name]["doc"]
    assert sorted(doc["options"]) == sorted(["_input", *params[1:]]), "%s documents %s, the function takes %s" % (
        name,
        sorted(doc["options"]),
        params,
    )
    positional = doc.get("positional") or []
    if isinstance(positional, str):
        positional = [p.strip() for p in positional.split(",")]
    assert positional == ["_input", *params[1 : len(positional)]], "%s: positional must follow the signature" % name
    for option, spec in doc["options"].items():
        if option == "_input":
            continue
        default = inspect.signature(func).parameters[option].default
        if default is not inspect.Parameter.empty and default is not None:
            assert spec.get("default") == default, "%s: option %s defaults to %r in the code" % (name, option, default)
