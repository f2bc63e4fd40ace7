"""Engine instances: validation messages, the TP/heads rule, and the rendered command lines."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, read_fixture
from engine_role import ROLE_DEFAULTS, role_defaults

from ansible_collections.gpufleet.serving.plugins.filter.engine_plan import model_inventory
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import engine_args, ipc_mode, placement
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_surge import SURGE_PORT_OFFSET
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_validate import validate
from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts
from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import load_model_config, parallel_errors

CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"
QWEN14 = (CONFIGS / "deepseek-r1-distill-qwen-14b.json").read_text()
LLAMA8 = (CONFIGS / "llama-3.1-8b-instruct.json").read_text()
DSV3 = (CONFIGS / "deepseek-v3.json").read_text()

# A 2x RTX 4090 host, its facts replayed from a real capture, with sysfs NUMA data added.
GPU = build_facts(
    summary=read_fixture("2x_rtx4090_threadripper_pro_wrx80", "nvidia-smi.txt"),
    topo=read_fixture("2x_rtx4090_threadripper_pro_wrx80", "topo-m.txt"),
    sysfs={"0000:41:00.0": {"numa_node": 0, "cpus": "0-31"}, "0000:61:00.0": {"numa_node": 0, "cpus": "0-31"}},
)
HOST = {"numa_nodes": [{"node": 0, "cpus": "0-31"}, {"node": 1, "cpus": "32-63"}]}
MODELS = {
    "/srv/models/qwen14": {"exists": True, "config": QWEN14},
    "/srv/models/llama8": {"exists": True, "config": LLAMA8},
}


def chat(**over):
    inst = {"name": "chat", "engine": "vllm", "model": "/srv/models/qwen14", "port": 8001, "gpus": [0, 1],
            "tensor_parallel_size": 2}  # fmt: skip
    inst.update(over)
    return inst


def errors_of(*instances, gpu=GPU, models=MODELS, defaults=None):
    return validate(list(instances), gpu=gpu, models=models, host=HOST, defaults=defaults or role_defaults())


def test_valid_instance_has_no_errors():
    assert errors_of(chat()) == []


@pytest.mark.parametrize(
    ("instances", "words"),
    [
        (
            [chat(tensor_parallel_size=3, gpus=[0, 1, 2])],
            ["tensor_parallel_size=3", "40 attention heads", "1, 2, 4, 8, 40"],
        ),
        ([chat(), chat(name="b", gpus=[])], ["port=8001 is already used by gpufleet_engines[0]"]),
        (
            [chat(), chat(name="b", port=8002, gpus=[1], tensor_parallel_size=1)],
            ["GPU 1 is already given to gpufleet_engines[0]"],
        ),
        ([chat(gpus=[1, 2])], ["GPU 2 does not exist on this host", "2 GPUs: 0, 1"]),
        ([chat(model="/srv/models/missing")], ["model=/srv/models/missing does not exist on this host"]),
        ([chat(max_num_seq=8)], ["unknown key 'max_num_seq'", "did you mean", "max_num_seqs"]),
        # a letter left out in the middle (found by `gpufleet lab test`; the old check compared position by position)
        ([chat(contxt_length=8192)], ["unknown key 'contxt_length'", "did you mean context_length?"]),
        ([chat(options={"gpu_memory_utilisation": 0.9})], ["unknown engine option 'gpu_memory_utilisation'"]),
        ([chat(engine="sglang", accelerator="cpu", gpus=[])], ["sglang with accelerator cpu is not supported"]),
        ([chat(max_model_len="8k")], ["max_model_len='8k' must be an integer"]),
        ([chat(enforce_eager="yes")], ["enforce_eager='yes' must be true or false"]),
        (
            [chat(engine="sglang", gpu_memory_utilization=0.9)],
            ["gpu_memory_utilization is not a sglang option; use mem_fraction_static"],
        ),
        (
            [chat(gpus=[0], tensor_parallel_size=2)],
            ["1 GPU(s) given but tensor_parallel_size x pipeline_parallel_size = 2 x 1 = 2"],
        ),
        ([chat(name="Chat_1")], ["name='Chat_1'"]),
        ([chat(shm_size="64m")], ["shm_size='64m'", "Bus error"]),
        ([chat(extra_args=["--api-key", "x"])], ["'--api-key' is --api-key, which gpufleet sets itself"]),
        # the engines' parsers take '_' for '-' and any unambiguous prefix (argparse allow_abbrev)
        ([chat(extra_args=["--api_key=x"])], ["'--api_key=x' is --api-key"]),
        ([chat(extra_args=["--hos", "0.0.0.0"])], ["'--hos' is --host"]),
        ([chat(extra_args=["--max_model_len", "9"])], ["sets the typed option max_model_len"]),
        ([chat(extra_args=["--no-enable-prefix-caching"])], ["sets the typed option enable_prefix_caching"]),
        ([chat(extra_args=["--disable-log-stats\n--privileged"])], ["contains a line break"]),
        # a newline in the model path would put its own arguments into docker run
        ([chat(model="/srv/models/x\n--privileged\n-v\n/:/host")], ["must be a plain absolute path"]),
        ([chat(model="/srv/models/a:b")], ["no ':' or ','"]),
        ([chat(model="/srv/models/a,b")], ["no ':' or ','"]),
        ([chat(model="/srv/models/../etc")], ["no '.' or '..' segments"]),
        ([chat(served_model_name="qwen\n--privileged")], ["served_model_name="]),
        ([chat(image="vllm/vllm-openai:v1\n--privileged")], ["image=", "must be an image reference"]),
        ([chat(image="Vllm/Upper:tag")], ["must be an image reference"]),
        ([chat(reasoning_parser="deepseek_r1\n--privileged")], ["reasoning_parser=", "one word"]),
        ([chat(env={"HF_TOKEN": "hf_x"})], ["HF_TOKEN looks like a secret", "secret_env"]),
        ([chat(env={"VLLM_API_KEY": "k"})], ["VLLM_API_KEY is set by gpufleet"]),
        ([chat(env={"X": "a\rb"})], ["env must map UPPER_CASE names to one-line strings"]),
        ([chat(secret_env={"HF_TOKEN": "a", "lower": "b"})], ["secret_env must map UPPER_CASE names"]),
        ([chat(env={"A": "1"}, secret_env={"A": "2"})], ["secret_env: A is set elsewhere"]),
        ([chat(bind="0.0.0.0")], ["bind=0.0.0.0 puts the engine's port beyond this host without a key"]),
        ([chat(drain_timeout=0)], ["drain_timeout=0 must be whole seconds from 1 to 86400"]),
        ([chat(drain_timeout=True)], ["drain_timeout=True"]),
        ([chat(name="chat\n")], ["name='chat\\n'"]),
        ([chat(engine="sglang", api_key="k" * 40)], ["SGLang takes its key only on the command line"]),
        # a key rotation's retiring key (issue 32): beside a new api_key, different, header-safe, vLLM only
        ([chat(api_key_previous="o" * 40)], ["api_key_previous is set without api_key"]),
        ([chat(api_key="k" * 40, api_key_previous="k" * 40)], ["api_key_previous is the same as api_key"]),
        ([chat(api_key="k" * 40, api_key_previous="old key!")], ["api_key_previous has characters outside"]),
        ([chat(engine="sglang", api_key_previous="o" * 40)], ["api_key_previous: SGLang takes no API key"]),
        ([chat(api_key='new"key' * 5, api_key_previous="o" * 40)], ["api_key has characters outside"]),
        ([chat(bind="localhost")], ["bind='localhost' must be an IP address"]),
        ([chat(swap_space=4)], ["swap_space", "vLLM 0.32 has no --swap-space"]),
        ([chat(gpus=[], accelerator="cpu", tensor_parallel_size=1, cpus="0-3,x")], ["cpus='0-3,x'"]),
    ],
)
def test_bad_input_is_named(instances, words):
    errors = errors_of(*instances)
    assert errors, "expected an error"
    text = " ".join(errors)
    assert "gpufleet_engines[" in text
    for word in words:
        assert word in text


def test_gpu_indices_are_checked_against_the_set_nvidia_smi_lists():
    # a host whose GPUs are numbered 0 and 5 (one taken out with CUDA_VISIBLE_DEVICES-style numbering)
    gpu = dict(GPU, devices=[dict(GPU["devices"][0], index=0), dict(GPU["devices"][1], index=5)])
    assert "GPU 1 does not exist on this host (nvidia-smi lists 2 GPUs: 0, 5)" in " ".join(
        errors_of(chat(gpus=[0, 1]), gpu=gpu)
    )
    assert errors_of(chat(gpus=[0, 5]), gpu=gpu) == []


def test_a_key_makes_a_public_bind_valid():
    assert errors_of(chat(bind="0.0.0.0", api_key="k" * 40)) == []


def test_every_error_is_reported_at_once():
    errors = errors_of(chat(port=80, gpus=[5], max_model_len="x"))
    assert len(errors) >= 3


@pytest.mark.parametrize(
    ("config", "tp", "ok"),
    [
        (QWEN14, 1, True), (QWEN14, 2, True), (QWEN14, 4, True), (QWEN14, 8, True),
        (QWEN14, 3, False), (QWEN14, 16, False),
        (LLAMA8, 8, True), (LLAMA8, 16, True), (LLAMA8, 6, False),
        (DSV3, 8, True), (DSV3, 16, True), (DSV3, 3, False),
    ],
)  # fmt: skip
def test_tensor_parallel_rule(config, tp, ok):
    # Qwen 14B: 40 heads, 8 KV heads. TP=16 divides neither 40 heads nor fits 8 KV heads.
    # Llama 3.1 8B: 32 heads, 8 KV heads; TP=16 replicates KV heads (16 % 8 == 0).
    # DeepSeek V3: 128 heads, MLA (one latent KV head, replicated on every rank).
    assert (parallel_errors(load_model_config(config), tp) == []) is ok


def test_kv_heads_rule_message():
    config = {"num_attention_heads": 24, "num_key_value_heads": 8, "num_hidden_layers": 4}
    (message,) = parallel_errors(config, 6, where="x")
    assert "KV heads" in message and "Valid sizes for this model: 1, 2, 4, 8, 24" in message


def test_pipeline_more_than_layers():
    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
    assert "more than the model's 2 hidden layers" in parallel_errors(config, 1, 4)[0]


def test_vllm_args():
    args = engine_args(chat(served_model_name="qwen", max_model_len=16384, enable_prefix_caching=True,
                            enable_chunked_prefill=False, gpu_memory_utilization=0.92, enforce_eager=False,
                            reasoning_parser="deepseek_r1", extra_args=["--disable-log-stats"]))  # fmt: skip
    assert args == [
        "--model", "/models/chat", "--served-model-name", "qwen", "--host", "127.0.0.1", "--port", "8001",
        # drains for its longest generation: 16384 tokens at 20 tokens/s
        "--shutdown-timeout", "819",
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.92", "--max-model-len", "16384",
        "--no-enable-chunked-prefill", "--enable-prefix-caching", "--reasoning-parser", "deepseek_r1",
        "--disable-log-stats",
    ]  # fmt: skip


def test_sglang_args():
    inst = chat(engine="sglang", mem_fraction_static=0.85, context_length=8192, max_running_requests=32,
                chunked_prefill_size=4096, enable_prefix_caching=False, enforce_eager=True,
                quantization="awq")  # fmt: skip
    assert engine_args(inst) == [
        "--model-path", "/models/chat", "--served-model-name", "chat", "--host", "127.0.0.1", "--port", "8001",
        "--enable-metrics",  # status and the rollout read its /metrics
        "--tp-size", "2", "--mem-fraction-static", "0.85", "--context-length", "8192",
        "--max-running-requests", "32", "--chunked-prefill-size", "4096", "--disable-radix-cache",
        "--disable-cuda-graph", "--quantization", "awq",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("inst", "expected"),
    [
        (chat(), ("host", None)),
        (chat(gpus=[0], tensor_parallel_size=1), ("private", "8g")),
        (chat(gpus=[0], tensor_parallel_size=1, shm_size="16g"), ("private", "16g")),
        (chat(engine="sglang", gpus=[0], tensor_parallel_size=1), ("host", None)),
        (chat(accelerator="cpu", gpus=[], tensor_parallel_size=1), ("private", "1g")),
        (chat(ipc="private", shm_size="32g"), ("private", "32g")),
    ],
)
def test_ipc_and_shm(inst, expected):
    assert ipc_mode(inst) == expected


def test_placement_follows_the_gpus_numa_node():
    assert placement(chat(), GPU, HOST)[:2] == ("0-31", "0")
    cpu = chat(accelerator="cpu", gpus=[], tensor_parallel_size=1)
    assert placement(cpu, GPU, HOST)[:2] == ("0-31", "0")
    assert placement(dict(cpu, cpus="32-35"), GPU, HOST)[:2] == ("32-35", "1")
    # GPUs whose NUMA node is unknown (topo -m only gives CPU affinity): CPUs, no memory node.
    topo_only = build_facts(topo=read_fixture("2x_rtx4090_threadripper_pro_wrx80", "topo-m.txt"))
    assert placement(chat(), topo_only, HOST)[:2] == ("0-127", None)


def test_render_has_no_secret_and_mounts_model_read_only():
    result = plan([chat(api_key="s3cret-" * 6)], gpu=GPU, models=MODELS, host=HOST,
                  defaults=role_defaults(env_files=["/etc/gpufleet/nccl.env"]))  # fmt: skip
    assert result["errors"] == []
    (inst,) = result["instances"]
    args = inst["docker_args"]
    assert "s3cret" not in json.dumps(result)
    assert args[args.index("--gpus") + 1] == '"device=0,1"'
    assert args[args.index("--ipc") + 1] == "host"
    assert "/srv/models/qwen14:/models/chat:ro" in args
    assert "/etc/gpufleet/engines/chat/secret.env:/run/gpufleet/secret.env:ro" in args
    assert args[args.index("--cpuset-cpus") + 1] == "0-31"
    assert args[args.index("--env-file") + 1] == "/etc/gpufleet/nccl.env"
    ulimits = ROLE_DEFAULTS["engine_ulimits"]
    assert ulimits["memlock"] == "-1"  # pinned host buffers for NCCL/CUDA
    assert [args[i + 1] for i, a in enumerate(args) if a == "--ulimit"] == [
        "%s=%s" % (k, ulimits[k]) for k in sorted(ulimits)
    ]
    assert "HF_HUB_OFFLINE=1" in args
    image_at = args.index(ROLE_DEFAULTS["engine_images"]["vllm_nvidia"])
    assert args[image_at - 2 : image_at] == ["--entrypoint", "/bin/sh"]
    assert args[image_at + 4 : image_at + 7] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert inst["unit"] == "gpufleet-engine@chat.service"


def test_a_rotation_s_two_keys_reach_vllm_through_a_root_only_config_file():
    result = plan([chat(api_key="n3w-" * 10, api_key_previous="0ld-" * 10)], gpu=GPU, models=MODELS, host=HOST,
                  defaults=role_defaults())  # fmt: skip
    assert result["errors"] == []
    (inst,) = result["instances"]
    args = inst["docker_args"]
    # neither key in the plan, the arguments or docker inspect: the shell writes them from the secret file
    assert "n3w-" not in json.dumps(result) and "0ld-" not in json.dumps(result)
    script = args[args.index("-c") + 1]
    writes = '(umask 077 && printf \'api-key:\\n- "%s"\\n- "%s"\\n\' "$VLLM_API_KEY" "$GPUFLEET_API_KEY_PREVIOUS"'
    assert writes in script
    assert args[-2:] == ["--config", "/run/gpufleet/api-keys.yaml"]
    # without it: no config file, and the engine's own arguments are the same either way
    (plain,) = plan([chat(api_key="n3w-" * 10)], gpu=GPU, models=MODELS, host=HOST, defaults=role_defaults())[
        "instances"
    ]
    assert "--config" not in plain["docker_args"] and plain["engine_args"] == inst["engine_args"]


def test_plan_returns_no_instances_on_errors():
    result = plan([chat(gpus=[7])], gpu=GPU, models=MODELS, host=HOST, defaults=role_defaults())
    assert result["instances"] == [] and result["errors"]


def test_model_inventory_filter():
    import base64

    stats = [{"item": "/m/a", "stat": {"exists": True}}, {"item": "/m/b", "stat": {"exists": False}}]
    slurps = [{"item": stats[0], "content": base64.b64encode(b'{"num_attention_heads": 4}').decode()}]
    assert model_inventory(stats, slurps) == {
        "/m/a": {"exists": True, "config": '{"num_attention_heads": 4}'},
        "/m/b": {"exists": False, "config": None},
    }


def test_pending_download_defers_the_model_checks():
    stats = [{"item": "/srv/models/r1", "stat": {"exists": False}}]
    models = model_inventory(stats, [], downloads=["/srv/models/r1"])
    assert models == {"/srv/models/r1": {"exists": False, "config": None, "pending_download": True}}
    assert errors_of(chat(model="/srv/models/r1"), models=models) == []
    # Once downloaded, the same instance is checked against the model's heads.
    fetched = {"/srv/models/r1": {"exists": True, "config": QWEN14}}
    assert "tensor_parallel_size=3" in " ".join(errors_of(chat(model="/srv/models/r1", tensor_parallel_size=3,
                                                               gpus=[0, 1, 2]), models=fetched))  # fmt: skip


# KV cache per token, against published figures:
# - Llama 3.1 8B: 32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131,072 B (128 KiB) per token at
#   bf16, the figure in vLLM's and NVIDIA's KV sizing write-ups ("0.125 MiB/token").
# - DeepSeek V3 (MLA): (kv_lora_rank 512 + rope 64) x 61 layers x 2 bytes = 70,272 B per token;
#   the DeepSeek-V2 paper (arXiv 2405.04434, table 1) gives MLA's cache as (d_c + d_h^R) x l
#   elements, and vLLM keeps it whole on every TP rank.
@pytest.mark.parametrize(
    ("config", "tp", "kv_dtype", "expected"),
    [
        (LLAMA8, 1, "auto", 131072), (LLAMA8, 2, "auto", 65536), (LLAMA8, 8, "auto", 16384),
        (LLAMA8, 16, "auto", 16384),  # TP 16 > 8 KV heads: one replicated head per rank
        (LLAMA8, 1, "fp8", 65536),
        (QWEN14, 2, "auto", 98304),
        (DSV3, 1, "auto", 70272), (DSV3, 8, "auto", 70272),
    ],
)  # fmt: skip
def test_kv_bytes_per_token(config, tp, kv_dtype, expected):
    from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import kv_bytes_per_token

    assert kv_bytes_per_token(load_model_config(config), tp, kv_dtype) == expected


def test_kv_cache_tokens_round_to_whole_blocks():
    from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import kv_cache_tokens

    assert kv_cache_tokens(2**30, 1024, 16) == 1_048_576
    assert kv_cache_tokens(2**30, 3072, 16) == 349_520  # 21,845 whole blocks of 16
    assert kv_cache_tokens(10, 1024) == 0


# Parameter counts against published totals (within 0.5 %):
# Llama 3.1 8B 8.03B and 70B 70.6B (Hugging Face model pages, safetensors metadata);
# DeepSeek-R1-Distill-Qwen-14B 14.8B and Qwen2.5-32B 32.8B (same source); Mixtral 8x7B 46.7B
# total (Mistral AI's release notes); DeepSeek-V3 671B total without the MTP module
# (DeepSeek-V3 technical report, arXiv 2412.19437).
@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama-3.1-8b-instruct", 8.03e9), ("llama-3.1-70b-instruct", 70.6e9),
        ("deepseek-r1-distill-qwen-14b", 14.8e9), ("qwen2.5-32b-instruct-awq", 32.8e9),
        ("mixtral-8x7b-instruct", 46.7e9), ("deepseek-v3", 671e9),
    ],
)  # fmt: skip
def test_parameter_counts_match_published_totals(name, published):
    from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import parameter_count

    config = load_model_config((CONFIGS / ("%s.json" % name)).read_text())
    assert abs(parameter_count(config) - published) / published < 0.005


# ---------------------------------------------------------------- start-before-stop (surge copy)

H100 = build_facts(summary=read_fixture("8x_h100_sxm_thamada", "nvidia-smi.txt"))


def surge_of(instances, gpu=GPU, host=HOST, **defaults):
    result = plan(instances, gpu=gpu, models=MODELS, host=host, defaults=role_defaults(**defaults))
    assert result["errors"] == []
    return {i["name"]: i["surge"] for i in result["instances"]}


def test_surge_uses_idle_gpus_and_renames_the_copy():
    # 8 GPUs, the instance holds 0-1: the copy starts on two idle ones, on its own port
    s = surge_of([chat(gpus=[0, 1])], gpu=H100)["chat"]
    assert s["fits"] and len(s["gpus"]) == 2 and not set(s["gpus"]) & {0, 1}, s
    assert s["port"] == 8001 + SURGE_PORT_OFFSET and s["base_url"] == "http://127.0.0.1:%d" % s["port"]
    args = s["docker_args"]
    assert args[args.index("--name") + 1] == "gpufleet-chat-surge"
    assert '"device=%s"' % ",".join(map(str, s["gpus"])) in args
    assert args[args.index("--port") + 1] == str(s["port"])
    assert "io.gpufleet.surge=true" in args


def test_surge_does_not_fit_when_the_gpus_are_full():
    # both GPUs of the 2x4090 are given to the instance, and the planned budget is high
    s = surge_of([chat()])["chat"]
    assert not s["fits"] and "no 2 idle GPUs" in s["why"] and "gpu_memory_utilization" in s["why"]
    # its arguments are still written (stable from run to run), on the instance's own GPUs
    assert '"device=0,1"' in s["docker_args"] and "gpufleet-chat-surge" in s["docker_args"]


def test_surge_shares_the_gpus_when_two_budgets_fit():
    s = surge_of([chat(model="/srv/models/llama8", gpu_memory_utilization=0.45, max_model_len=2048, max_num_seqs=4)])[
        "chat"
    ]
    assert s["fits"] and s["gpus"] == [0, 1] and "0.45" in s["why"]


def test_surge_never_and_other_instances_gpus_are_not_idle():
    assert not surge_of([chat(gpus=[0, 1])], gpu=H100, surge="never")["chat"]["fits"]
    busy = [chat(name="a", gpus=[0, 1], port=8001)] + [
        chat(name=n, gpus=g, port=p) for n, g, p in (("b", [2, 3], 8002), ("c", [4, 5], 8003), ("d", [6, 7], 8004))
    ]
    assert not any(s["fits"] for s in surge_of(busy, gpu=H100).values())


def test_surge_on_cpu_follows_the_hosts_free_memory():
    cpu = chat(accelerator="cpu", gpus=[], tensor_parallel_size=None, kv_cache_space_gib=4, model="/srv/models/llama8")
    cpu.pop("tensor_parallel_size")
    roomy = surge_of([cpu], host=dict(HOST, memory_available_mib=64 * 1024))["chat"]
    # 4 GiB KV + 8.03 B parameters x 2 bytes (bfloat16) + 1 GiB runtime = about 20 GiB
    assert roomy["fits"] and "20.0 GiB" in roomy["why"], roomy
    tight = surge_of([cpu], host=dict(HOST, memory_available_mib=16 * 1024))["chat"]
    assert not tight["fits"] and "16.0 GiB is free" in tight["why"]
    assert not surge_of([cpu])["chat"]["fits"]  # free memory unknown: stop-before-start
    assert roomy["docker_args"] == tight["docker_args"]  # the file does not follow free memory


def test_surge_port_clashes_are_named():
    errors = errors_of(chat(name="a", port=8001), chat(name="b", port=9001, gpus=[]))
    assert any("gpufleet_engines[0]" in e and "9001" in e and "set surge_port" in e for e in errors), errors
    assert any("surge_port=70000" in e for e in errors_of(chat(surge_port=70000)))
    assert errors_of(chat(name="a", port=8001, surge_port=8500)) == []


# ---------------------------------------------------------------- what the preflight prints


def test_the_preflight_report_of_an_instance():
    (inst,) = plan([chat()], gpu=GPU, models=MODELS, host=HOST, defaults=role_defaults())["instances"]
    head, *memory, restart = inst["report"]
    assert head == (
        "chat: vllm on nvidia, image %s, port 8001, ipc host, cpuset 0-31 mems 0 (GPUs [0, 1] sit on NUMA node 0); "
        "args: %s" % (ROLE_DEFAULTS["engine_images"]["vllm_nvidia"], " ".join(inst["engine_args"]))
    )
    assert memory == inst["memory_plan"]
    assert memory[0].startswith("per GPU: weights ") and memory[0].endswith(" GiB")
    assert memory[1].startswith("KV cache: ") and memory[1].endswith(" requests at full length")
    assert restart.startswith("restart: stop-before-start (no 2 idle GPUs beside GPUs [0, 1], and ")
    (copy,) = plan([chat(gpus=[0, 1])], gpu=H100, models=MODELS, host=HOST, defaults=role_defaults())["instances"]
    gpus = copy["surge"]["gpus"]
    assert copy["report"][
        -1
    ] == "restart: start-before-stop, a copy on port 9001 and GPUs %s first (GPUs %s are idle)" % (
        gpus,
        gpus,
    )


def test_without_gpu_memory_sizes_the_plan_says_it_skipped():
    topo_only = build_facts(topo=read_fixture("2x_rtx4090_threadripper_pro_wrx80", "topo-m.txt"))
    (inst,) = plan([chat()], gpu=topo_only, models=MODELS, host=HOST, defaults=role_defaults())["instances"]
    assert inst["memory_plan"] == ["memory plan skipped: nvidia-smi gave no memory size for GPUs [0, 1]"]
    assert inst["report"][1] == inst["memory_plan"][0]


def test_an_instance_needs_an_image_from_somewhere():
    errors = errors_of(chat(), defaults=role_defaults(images={"vllm_cpu": "x:1"}))
    assert errors == [
        "gpufleet_engines[0] (chat).image is unset and engine_images has no vllm_nvidia entry; set either (an image "
        "with a pinned tag)."
    ]
    assert errors_of(chat(image="registry.local/vllm:1"), defaults=role_defaults(images={})) == []


def test_the_deployed_record_is_what_runs():
    (inst,) = plan([chat()], gpu=GPU, models=MODELS, host=HOST, defaults=role_defaults())["instances"]
    record = inst["deployed"]
    assert record["tensor_parallel_size"] == 2 and record["gpus"] == [0, 1] and record["port"] == 8001
    # the planned values it runs with, not only the pinned ones
    args = inst["engine_args"]
    assert record["max_model_len"] == int(args[args.index("--max-model-len") + 1])
    assert record["options"]["gpu_memory_utilization"] == float(args[args.index("--gpu-memory-utilization") + 1])


def test_an_engine_that_is_not_a_name_is_named_not_a_crash():
    """engine: [vllm] (a list where a name belongs) reaches validation when the engine_plan filter
    is called without the role's argument spec: it is named, not a TypeError."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_validate import validate

    inst = {"name": "x", "engine": ["vllm"], "model": "/srv/models/m", "port": 8001, "gpus": [0], "api_key": "k" * 32,
            "distributed_executor_backend": "mp"}  # fmt: skip
    errors = validate([inst], gpu={"count": 1, "devices": [{"index": 0, "memory_total_mib": 24564}]})
    assert "gpufleet_engines[0] (x).engine=['vllm'] must be one of vllm, sglang." in errors
