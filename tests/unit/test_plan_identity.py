"""`gpufleet plan --gpus N` and the engine role plan the same instance the same way.

Every instance of inventories/lab (against its host's captured nvidia-smi output and its
model's config.json fixture), and every model config fixture on every captured GPU model at
1, 2, 4 and 8 GPUs, goes through both paths: the role's (_engine_plan.memory_plan_of, what
its preflight prints) and the CLI's (`gpufleet plan ... --json`, run through its argument
parser). The two JSON objects must be equal, key for key.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest
from engine_role import role_defaults
from test_inventories import HOSTVARS, _facts

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CONFIGS = sorted((FIXTURES / "model_configs").glob("*.json"))


def _role_plan(inst, config_path, gpu, refused=None):
    """The role's plan; or, where its validation refuses the instance, the errors (refused: a
    list to put them in, else the refusal fails the test)."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import memory_plan_of
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_validate import validate
    from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import load_model_config

    models = {inst["model"]: {"exists": True, "config": config_path.read_text()}}
    errors = validate([inst], gpu=gpu, models=models, defaults=role_defaults())
    if refused is not None and errors:
        refused.extend(errors)
        return None
    assert errors == []
    plan, why = memory_plan_of(inst, load_model_config(config_path.read_text()), gpu)
    assert plan is not None, why
    return json.loads(json.dumps(plan))


def _cli_plan(inst, config_path, gpu, capsys):
    """`gpufleet plan --json` with the flags that describe the instance and its GPUs."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import options_of, plan_pins
    from gpufleet.cli import _plan_pin_options, main

    devices = {d["index"]: d for d in gpu["devices"]}
    mine = [devices[g] for g in inst["gpus"]]
    argv = ["plan", "--json", "--model", str(config_path), "--engine", inst.get("engine", "vllm")]
    argv += ["--gpus", str(len(inst["gpus"])), "--nodes", str(len(inst.get("nodes") or [1]))]
    argv += ["--gpu-memory-gib", repr(min(d["memory_total_mib"] for d in mine) / 1024)]
    argv += ["--gpu-name", mine[0]["name"]]
    if inst.get("cross_node_tensor_parallel"):
        argv.append("--cross-node-tensor-parallel")
    flags = _plan_pin_options()
    for name, value in plan_pins(options_of(inst)).items():
        assert name in flags, "the CLI cannot pin %s" % name
        if value is True:
            argv.append("--" + name.replace("_", "-"))
        else:
            assert value is not False, "the CLI cannot pin %s false" % name
            argv += ["--" + name.replace("_", "-"), str(value)]
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc in (0, 2), out
    got = json.loads(out)
    # the JSON says its schema, and is what the shipped schema describes; the rest is the plan itself
    _valid(got)
    assert got.pop("schema_version") == 1
    return got


def _valid(got):
    import jsonschema

    from gpufleet.plan_schema import plan_schema

    jsonschema.validate(got, plan_schema())


def _lab_instances():
    cases = []
    for host, hv in sorted(HOSTVARS.items()):
        for inst in hv["gpufleet_engines"]:
            config = FIXTURES / "model_configs" / ("%s.json" % hv["gpufleet_lab_model_configs"][inst["model"]])
            cases.append(pytest.param(host, inst, config, id="%s-%s" % (host, inst["name"])))
    return cases


@pytest.mark.parametrize("host,inst,config", _lab_instances())
def test_the_lab_inventory_plans_the_same_both_ways(host, inst, config, capsys):
    gpu = _facts(HOSTVARS[host]["gpufleet_lab_gpu_fixture"])
    for device in gpu["devices"]:
        device["memory_total_mib"] = device["memory_total_mib"] or HOSTVARS[host].get("gpufleet_lab_gpu_memory_mib")
    role = _role_plan(inst, config, gpu)
    assert role["tensor_parallel_size"] or inst.get("pipeline_parallel_size"), role
    assert _cli_plan(inst, config, gpu, capsys) == role


def _hardware():
    """One capture per GPU model and memory size among the nvidia-smi fixtures."""
    seen, out = set(), []
    for folder in sorted(p.name for p in (FIXTURES / "nvidia_smi").iterdir() if p.is_dir()):
        devices = _facts(folder)["devices"]
        if not devices or not devices[0]["memory_total_mib"]:
            continue  # a capture without a memory size (nvidia-smi's query failed there)
        key = (devices[0]["name"], devices[0]["memory_total_mib"])
        if key not in seen:
            seen.add(key)
            out.append(folder)
    return out


HARDWARE = _hardware()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_fixture_plans_the_same_both_ways(config, capsys):
    for folder in HARDWARE:
        gpu = _facts(folder)
        for n in (1, 2, 4, 8):
            if n > len(gpu["devices"]):
                continue
            inst = {"name": "x", "engine": "vllm", "model": "/srv/models/x", "port": 8001, "gpus": list(range(n))}
            refused = []
            role = _role_plan(inst, config, gpu, refused)
            cli = _cli_plan(inst, config, gpu, capsys)
            if role is None:
                # the role refuses before planning (TP must divide the heads); the CLI's plan does not fit, for
                # the same reason
                assert "attention heads" in refused[0] and "does not divide" in refused[0], refused
                assert not cli["fits"] and any("does not divide" in e for e in cli["errors"]), cli["errors"]
                continue
            assert cli == role, (folder, n)
            # the instance uses the GPUs it is given (a model whose heads do not divide is refused)
            assert role["tensor_parallel_size"] == n or not role["fits"], (folder, n, role["errors"])


def test_advice_names_the_fewer_gpus_and_the_plan_stays_the_deployed_one(capsys):
    """Llama-3.1-8B on two 80 GiB GPUs: the role and the CLI both plan TP 2 at the model's full
    context, and say that TP 1 meets the same target on one GPU."""
    config = FIXTURES / "model_configs" / "llama-3.1-8b-instruct.json"
    gpu = _facts("8x_h100_sxm_thamada")
    inst = {"name": "x", "engine": "vllm", "model": "/srv/models/x", "port": 8001, "gpus": [0, 1]}
    role = _role_plan(inst, config, gpu)
    assert (role["tensor_parallel_size"], role["max_model_len"]) == (2, 131072)
    assert len(role["advice"]) == 1 and role["advice"][0].startswith("tensor_parallel_size=1 meets"), role["advice"]
    assert "run 2 instances of TP 1" in role["advice"][0]
    # a pinned TP is the user's choice: no advice
    pinned = dict(inst, tensor_parallel_size=2)
    assert _role_plan(pinned, config, gpu)["advice"] == []
    assert _cli_plan(pinned, config, gpu, capsys)["advice"] == []


def test_the_readme_quickstart_shows_the_plan_the_role_deploys(capsys):
    """README's quickstart prints lines of `gpufleet plan --gpus 2` for Qwen2.5-32B-AWQ on 24 GiB
    GPUs: they are the CLI's lines today, and the role's plan of `gpus: [0, 1]` on two GPUs that
    nvidia-smi lists at 24576 MiB (24 GiB, as the flag says; an RTX 4090 lists 24564)."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._plan_text import plan_lines
    from gpufleet.cli import main

    readme = (ROOT / "README.md").read_text()
    block = readme.split("--gpu-memory-gib 24 --gpus 2\n```", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    shown = [line for line in block.splitlines() if line]
    config = FIXTURES / "model_configs" / "qwen2.5-32b-instruct-awq.json"
    capsys.readouterr()
    assert main(["plan", "--model", str(config), "--gpu-memory-gib", "24", "--gpus", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert shown and all(line in printed for line in shown), (shown, printed)
    gpu = _facts("2x_rtx4090_threadripper_pro_wrx80")
    for device in gpu["devices"]:
        device["memory_total_mib"] = 24 * 1024
    inst = {"name": "chat", "engine": "vllm", "model": "/srv/models/Qwen2.5-32B-Instruct-AWQ", "port": 8001,
            "gpus": [0, 1]}  # fmt: skip
    role = plan_lines(_role_plan(inst, config, gpu))
    assert all(line in role for line in shown if not line.startswith("engine args")), role


def test_bad_input_gives_json_records_on_stdout(tmp_path, capsys):
    from gpufleet.cli import main

    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 64}')
    rc = main(["plan", "--json", "--model", str(config), "--gpus", "0", "--nodes", "2000", "--gpu-memory-gib", "24"])
    captured = capsys.readouterr()
    assert rc == 1
    got = json.loads(captured.out)
    _valid(got)
    assert got["schema_version"] == 1 and got["fits"] is False
    assert [(e["variable"], e["value"]) for e in got["input_errors"]] == [("--gpus", 0), ("--nodes", 2000)]
    assert all(e["message"] and "fix" in e for e in got["input_errors"])
    assert got["errors"][0] == "--gpus=0 must be from 1 to 1024 (the GPUs the instance may use on each node)"
    # the same problems in words on stderr
    assert "gpufleet plan: --gpus=0 must be from 1 to 1024 (the GPUs the instance may use on each node)" in captured.err
    # a model the planner cannot read is a record too, naming --model
    rc = main(["plan", "--json", "--model", str(tmp_path / "missing"), "--gpu-memory-gib", "24"])
    (error,) = json.loads(capsys.readouterr().out)["input_errors"]
    assert rc == 1 and error["variable"] == "--model" and error["value"] == str(tmp_path / "missing")
    # without --gpu-memory-gib on a GPU
    rc = main(["plan", "--json", "--model", str(config)])
    (error,) = json.loads(capsys.readouterr().out)["input_errors"]
    assert (rc, error["variable"], error["value"], error["message"]) == (1, "--gpu-memory-gib", None, "is required")
    # a value JSON cannot hold is given as the text it was typed as: the output stays JSON
    rc = main(["plan", "--json", "--model", str(config), "--gpu-memory-gib", "nan"])
    (error,) = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail("not JSON: " + c))[
        "input_errors"
    ]
    assert (rc, error["variable"], error["value"]) == (1, "--gpu-memory-gib", "nan")


def test_the_schema_ships_and_describes_every_outcome(tmp_path, capsys):
    """`gpufleet plan --json-schema` prints the schema the package ships; a plan that fits, one
    that does not and bad input (no --model at all included) each validate against it, and a
    plan missing one of the memory plan's keys does not."""
    import jsonschema

    from gpufleet.cli import main

    assert main(["plan", "--json-schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    root = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
    outcomes = {}
    for name, argv in {
        "fits": ["--model", str(root / "qwen2.5-7b-instruct.json"), "--gpu-memory-gib", "80"],
        "short": ["--model", str(root / "qwen2.5-7b-instruct.json"), "--gpu-memory-gib", "8"],
        "bad": ["--gpus", "0"],
    }.items():
        rc = main(["plan", "--json", *argv])
        outcomes[name] = (rc, json.loads(capsys.readouterr().out))
        jsonschema.validate(outcomes[name][1], schema)
    assert [outcomes[n][0] for n in ("fits", "short", "bad")] == [0, 2, 1]
    assert outcomes["bad"][1]["input_errors"][0]["variable"] == "--model"
    # an option argparse itself refuses: JSON too, exit 1
    argv = ["gpufleet", "plan", "--json", "--gpus", "abc"]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as stop:
        main(argv[1:])
    refused = json.loads(capsys.readouterr().out)
    jsonschema.validate(refused, schema)
    assert stop.value.code == 1 and "--gpus" in refused["errors"][0] and "abc" in refused["errors"][0]
    # the retired key is not this version's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(outcomes["fits"][1], schema=1), schema)
    plan = dict(outcomes["fits"][1])
    del plan["max_model_len"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(plan, schema)
