"""The bad-input table's CLI cases (tests/bad_inputs.yml, section cli): each wrong command
line ends with a non-zero exit before any run starts, and stderr names the flag or
variable, the value and the fix. The table's role cases run in the lab
(molecule/nccl/gate.yml), against a fresh host that must not change."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT

from gpufleet import cli

TABLE = yaml.safe_load((ROOT / "tests" / "bad_inputs.yml").read_text())
MODEL = ROOT / "tests" / "fixtures" / "model_configs" / "llama-3.1-8b-instruct.json"


def test_the_table_has_at_least_forty_cases_with_unique_ids():
    ids = [c["id"] for c in TABLE["roles"] + TABLE["cli"]]
    assert len(ids) >= 40
    assert len(set(ids)) == len(ids)
    for case in TABLE["roles"]:
        assert case["roles"] and case["vars"] and case["expect"], case["id"]


def _write(tmp_path, name, content):
    path = tmp_path / name
    if content == "deep":
        path.write_text("[" * 100000 + "]" * 100000)
    else:
        path.write_text(json.dumps(content))


@pytest.mark.parametrize("case", TABLE["cli"], ids=[c["id"] for c in TABLE["cli"]])
def test_a_wrong_command_line_is_refused_by_name(case, tmp_path, capsys, monkeypatch):
    import ansible_runner

    def no_run(**kwargs):
        raise AssertionError("a run started for bad input")

    monkeypatch.setattr(ansible_runner, "run", no_run)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name, content in (case.get("files") or {}).items():
        _write(tmp_path, name, content)
    argv = [a.format(model=MODEL, tmp=tmp_path) for a in case["argv"]]
    rc = cli.main(argv)
    err = " ".join(capsys.readouterr().err.split())
    assert rc != 0, err
    for text in case["expect"]:
        assert text in err, (text, err)
    assert "Traceback" not in err
