"""The engine-option registry (module_utils/_engine_options.py): the engine role's
meta/argument_specs.yml documents it, it renders each flag the way the engines parse it,
its metric names are those a real vLLM exports, and the CLI's plan flags are taken from it."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    ENGINE_INFO,
    ENGINES,
    INSTANCE_KEYS,
    INVERSE,
    KIND_NAMES,
    METRIC_KEYS,
    OPTIONS,
    PAIR,
    REMOVED,
    engine_flags,
    option_for,
    plan_pins,
)

SPECS = yaml.safe_load((ROOT / "roles" / "engine" / "meta" / "argument_specs.yml").read_text())["argument_specs"]
DOCUMENTED = SPECS["main"]["options"]["gpufleet_engines"]["options"]


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_argument_specs_document_each_option_with_its_type_choices_and_flags(name):
    option = OPTIONS[name]
    assert name in DOCUMENTED, "roles/engine/meta/argument_specs.yml: gpufleet_engines.%s is not documented" % name
    spec = DOCUMENTED[name]
    assert spec["type"] == KIND_NAMES[option.kind], name
    assert tuple(spec.get("choices") or ()) == option.choices, name
    assert not spec.get("required") and "default" not in spec, name  # unset: the engine's or the plan's value
    for engine in option.engines:
        assert option.flag(engine).name in spec["description"], (name, engine, spec["description"])


def test_argument_specs_document_the_instance_keys_and_nothing_else():
    assert set(DOCUMENTED) == set(INSTANCE_KEYS) | set(OPTIONS)
    assert not set(REMOVED) & set(DOCUMENTED)
    assert not set(INSTANCE_KEYS) & set(OPTIONS)


def test_every_option_has_a_flag_and_counterparts_point_across_engines():
    for option in OPTIONS.values():
        assert option.engines, option.name
        if option.counterpart:
            other = OPTIONS[option.counterpart]
            assert set(other.engines) != set(option.engines), option.name


@pytest.mark.parametrize(
    ("name", "engine", "value", "argv"),
    [
        ("max_model_len", "vllm", 8192, ["--max-model-len", "8192"]),
        ("gpu_memory_utilization", "vllm", 0.9, ["--gpu-memory-utilization", "0.9"]),
        ("seed", "sglang", 7, ["--random-seed", "7"]),
        # vLLM's defaults-on switches: --no-X turns them off (argparse BooleanOptionalAction)
        ("enable_prefix_caching", "vllm", True, ["--enable-prefix-caching"]),
        ("enable_prefix_caching", "vllm", False, ["--no-enable-prefix-caching"]),
        ("enable_chunked_prefill", "vllm", False, ["--no-enable-chunked-prefill"]),
        # SGLang's radix cache is on unless --disable-radix-cache
        ("enable_prefix_caching", "sglang", True, []),
        ("enable_prefix_caching", "sglang", False, ["--disable-radix-cache"]),
        ("enforce_eager", "vllm", True, ["--enforce-eager"]),
        ("enforce_eager", "vllm", False, []),
        ("enforce_eager", "sglang", True, ["--disable-cuda-graph"]),
        ("trust_remote_code", "sglang", True, ["--trust-remote-code"]),
        # an option the engine lacks renders nothing (validation names it first)
        ("mem_fraction_static", "vllm", 0.8, []),
        ("max_model_len", "vllm", None, []),
    ],
)
def test_each_option_renders_as_the_engine_parses_it(name, engine, value, argv):
    assert OPTIONS[name].render(engine, value) == argv


def test_styles_are_used_where_the_engines_need_them():
    assert OPTIONS["enable_prefix_caching"].flag("vllm").style == PAIR
    assert OPTIONS["enable_prefix_caching"].flag("sglang").style == INVERSE


def test_bounds_are_worded_from_the_registry():
    assert OPTIONS["gpu_memory_utilization"].bounds_text() == "above 0 and at most 1"
    assert not OPTIONS["gpu_memory_utilization"].in_bounds(0) and OPTIONS["gpu_memory_utilization"].in_bounds(1)
    assert OPTIONS["max_num_seqs"].bounds_text() == "at least 1" and not OPTIONS["max_num_seqs"].in_bounds(0)
    assert OPTIONS["seed"].bounds_text() is None


def test_the_memory_plan_names_fold_sglang_into_vllm():
    assert plan_pins({"context_length": 8192, "mem_fraction_static": 0.8, "seed": 1}) == {
        "max_model_len": 8192,
        "gpu_memory_utilization": 0.8,
    }
    # the engine-neutral name wins whichever comes first
    assert plan_pins({"max_model_len": 4096, "context_length": 8192}) == {"max_model_len": 4096}
    assert plan_pins({"context_length": 8192, "max_model_len": 4096}) == {"max_model_len": 4096}
    assert option_for("max_model_len", "sglang").name == "context_length"
    assert option_for("max_num_batched_tokens", "vllm").name == "max_num_batched_tokens"
    assert option_for("max_model_len", "tgi") is None


def test_engine_flags_use_each_engines_names():
    assert engine_flags({"max_model_len": 2048, "enforce_eager": True}, "vllm") == {
        "--max-model-len": 2048,
        "--enforce-eager": True,
    }
    assert engine_flags({"context_length": 2048, "enforce_eager": True}, "sglang") == {
        "--context-length": 2048,
        "--disable-cuda-graph": True,
    }


HISTOGRAMS = ("ttft", "itl", "e2e")  # named by their base name: the page has NAME_bucket{...}


def _in_page(page: str, key: str, name: str) -> bool:
    return ("\n%s%s{" % (name, "_bucket" if key in HISTOGRAMS else "")) in page


def test_vllm_metric_names_are_in_a_real_vllm_metrics_page():
    page = (ROOT / "tests" / "fixtures" / "engine_metrics" / "vllm-0.32.0-cpu-busy.txt").read_text()
    assert set(ENGINE_INFO["vllm"].metrics) <= set(METRIC_KEYS)
    for key, names in ENGINE_INFO["vllm"].metrics.items():
        assert any(_in_page(page, key, n) for n in names), key


def test_sglang_metric_names_are_in_its_real_metrics_page():
    """SGLang's published capture (a 0.4.x server) has every series the registry names but
    inter_token_latency_seconds, which 0.4.3 added (collector.py); what it lacks is what the
    rules handle otherwise: no preemption counter, no progress counter, a hit-rate gauge."""
    (capture,) = (ROOT / "tests" / "fixtures" / "engine_metrics").glob("sglang-*.txt")
    page = capture.read_text()
    metrics = ENGINE_INFO["sglang"].metrics
    assert set(metrics) <= set(METRIC_KEYS)
    missing = {key for key, names in metrics.items() if not any(_in_page(page, key, n) for n in names)}
    assert missing == {"itl"}
    assert {"preemptions", "progress", "prefix_cache_queries", "prefix_cache_hits"}.isdisjoint(metrics)
    assert "sglang:time_per_output_token_seconds_bucket{" in page  # the per-token latency of its day


def test_engines_and_their_entrypoints():
    assert set(ENGINE_INFO) == set(ENGINES)
    assert ENGINE_INFO["vllm"].entrypoint[-1] == "vllm.entrypoints.openai.api_server"
    assert ENGINE_INFO["sglang"].accelerators == ("nvidia",)


def test_gpufleet_plan_flags_are_the_registrys(capsys):
    from gpufleet.cli import _plan_pin_options, build_parser

    pinned = _plan_pin_options()
    assert set(pinned) >= {"tensor_parallel_size", "max_model_len", "gpu_memory_utilization", "enforce_eager"}
    assert all(o.plan_key == name for name, o in pinned.items())
    parser = build_parser()
    for value in OPTIONS["kv_cache_dtype"].choices:
        assert parser.parse_args(["plan", "--model", "m", "--kv-cache-dtype", value]).kv_cache_dtype == value
    assert parser.parse_args(["plan", "--model", "m", "--quantization", "none"]).quantization == "none"
    args = parser.parse_args(["plan", "--model", "m", "--max-model-len", "4096", "--enforce-eager"])
    assert args.max_model_len == 4096 and args.enforce_eager is True and args.dtype is None
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "--model", "m", "--kv-cache-dtype", "int3"])
    assert "invalid choice" in capsys.readouterr().err


def test_the_argument_spec_is_generated_from_the_registry():
    """tools/enginespec.py writes the typed options of both entry points from OPTIONS; the
    file in the tree is what it writes (make lint runs the same check)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("enginespec", ROOT / "tools" / "enginespec.py")
    enginespec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enginespec)
    text = enginespec.SPEC.read_text()
    assert enginespec.rewrite(text) == text
    # an edited description inside the generated block is put back
    edited = text.replace("Random seed (vLLM --seed", "Seed (vLLM --seed", 1)
    assert edited != text and enginespec.rewrite(edited) == text


def test_an_instances_defaults_are_written_once():
    """INSTANCE_DEFAULTS is what every stage reads an unset key as (normalized()); the argument
    spec states the same defaults and the registry's engines and accelerators as its choices."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
        ACCELERATORS,
        INSTANCE_DEFAULTS,
        normalized,
    )
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import render

    for key, value in INSTANCE_DEFAULTS.items():
        assert DOCUMENTED[key]["default"] == value, key
    assert tuple(DOCUMENTED["engine"]["choices"]) == ENGINES
    assert tuple(DOCUMENTED["accelerator"]["choices"]) == ACCELERATORS
    raw = {"name": "chat", "model": "/srv/models/m", "port": 8001, "gpus": [0]}
    record = normalized(raw)
    assert record == dict(raw, **INSTANCE_DEFAULTS) and normalized(record) == record
    assert normalized(dict(raw, engine="sglang", bind="0.0.0.0"))["bind"] == "0.0.0.0"
    images = {"vllm_nvidia": "vllm/vllm-openai:v1", "sglang_nvidia": "lmsysorg/sglang:v1"}
    assert render(raw, defaults={"images": images}) == render(record, defaults={"images": images})
