# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet knows about the engines, written once (private to gpufleet.serving).

The typed engine options of a ``gpufleet_engines`` instance (name, type, choices, bounds,
the engines that have it, each engine's flag and how it renders, its counterpart on the
other engine, and the memory plan's name for it), the options the pinned engines removed,
the instance keys that are not options, and per engine its entrypoint, model flag,
accelerators, metric names, compile caches and the log lines that mark its start phases.
Validation, rendering, the memory plan, the status reader, the CLI and the playbooks' filters
all read this table; a unit test checks the engine role's meta/argument_specs.yml against it.

Flags are the engines' own CLI names (vLLM: vllm/engine/arg_utils.py EngineArgs; SGLang:
python/sglang/srt/server_args.py ServerArgs), checked by their own parsers in
tests/labtests/test_engine_argparse.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import host_port

# How an option's value becomes arguments.
VALUE = "value"  # --flag VALUE
SWITCH = "switch"  # --flag when true, nothing when false
PAIR = "pair"  # --flag when true, --no-flag when false (argparse BooleanOptionalAction)
INVERSE = "inverse"  # nothing when true, --flag when false (SGLang's --disable-radix-cache)

KIND_NAMES = {int: "int", float: "float", bool: "bool", str: "str"}
KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclass(frozen=True)
class Flag:
    """One engine's flag for an option, and how the value renders."""

    name: str
    style: str = VALUE

    def render(self, value) -> list:
        if self.style == VALUE:
            return [self.name, _flag_value(value)]
        if self.style == SWITCH:
            return [self.name] if value else []
        if self.style == PAIR:
            return [self.name] if value else ["--no-" + self.name[2:]]
        if self.style == INVERSE:
            return [] if value else [self.name]
        raise ValueError("unknown flag style %r" % self.style)


@dataclass(frozen=True)
class Option:
    """A typed engine option of a gpufleet_engines instance."""

    name: str
    kind: type
    vllm: Optional[Flag] = None
    sglang: Optional[Flag] = None
    choices: Tuple[str, ...] = ()
    # numeric bounds: at least `minimum` (above it when `above`), at most `maximum`
    minimum: Optional[float] = None
    above: bool = False
    maximum: Optional[float] = None
    # the option the other engine calls by another name (named in error messages)
    counterpart: Optional[str] = None
    # the memory plan's engine-neutral name (vLLM's) when the plan pins or sets this option
    plan_key: Optional[str] = None
    # what it is, for the argument spec (tools/enginespec.py adds the flags, type and choices)
    doc: str = ""

    @property
    def engines(self) -> Tuple[str, ...]:
        return tuple(e for e in ENGINES if self.flag(e) is not None)

    def flag(self, engine: str) -> Optional[Flag]:
        return self.vllm if engine == "vllm" else self.sglang if engine == "sglang" else None

    def render(self, engine: str, value) -> list:
        """The engine's arguments for this option's value ([] when the engine lacks it)."""
        flag = self.flag(engine)
        return flag.render(value) if flag is not None and value is not None else []

    def flags_text(self) -> str:
        """Each engine's flag as the argument spec names it: "vLLM --a, SGLang --b", or
        "vLLM and SGLang --a" when both spell it the same."""
        texts = [(ENGINE_INFO[e].label, _flag_text(self.flag(e))) for e in self.engines]
        if len(texts) == 2 and texts[0][1] == texts[1][1]:
            return "%s and %s %s" % (texts[0][0], texts[1][0], texts[0][1])
        return ", ".join("%s %s" % pair for pair in texts)

    def bounds_text(self) -> Optional[str]:
        """'above 0 and at most 1', 'at least 1', or None without bounds."""
        parts = []
        if self.minimum is not None:
            parts.append(("above %s" if self.above else "at least %s") % _number(self.minimum))
        if self.maximum is not None:
            parts.append("at most %s" % _number(self.maximum))
        return " and ".join(parts) or None

    def in_bounds(self, value) -> bool:
        if self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum):
            return False
        return self.maximum is None or value <= self.maximum


ENGINES = ("vllm", "sglang")
ACCELERATORS = ("nvidia", "cpu")


def _number(x):
    return "%d" % x if float(x).is_integer() else "%s" % x


def _flag_text(flag: Flag) -> str:
    if flag.style == PAIR:
        return "%s / --no-%s" % (flag.name, flag.name[2:])
    if flag.style == INVERSE:
        return "%s when false" % flag.name
    return flag.name


def _flag_value(value):
    return repr(value) if isinstance(value, float) else str(value)


def _count(name, vllm=None, sglang=None, counterpart=None, plan_key=None, doc=""):
    """A count option: an integer of at least 1."""
    return Option(name, int, vllm=vllm, sglang=sglang, minimum=1, counterpart=counterpart, plan_key=plan_key, doc=doc)


def _share(name, vllm=None, sglang=None, counterpart=None, plan_key=None, doc=""):
    """A share of GPU memory: above 0 and at most 1."""
    return Option(
        name, float, vllm=vllm, sglang=sglang, minimum=0, above=True, maximum=1, counterpart=counterpart,
        plan_key=plan_key, doc=doc,
    )  # fmt: skip


# In the order their flags follow each other on the command line.
_TP = "Tensor-parallel size; unset, the instance's GPUs on each node"
_SHARE = "Share of each GPU's memory the engine may use; unset, the memory plan's"
_LEN = "Longest request in tokens, prompt and output; unset, the memory plan's"
_STEP = "Tokens per scheduler step (the prefill chunk); unset, the memory plan's"
_OPTIONS = (
    _count("tensor_parallel_size", Flag("--tensor-parallel-size"), Flag("--tp-size"), plan_key="tensor_parallel_size",
           doc=_TP),
    _count("pipeline_parallel_size", Flag("--pipeline-parallel-size"), Flag("--pp-size"),
           plan_key="pipeline_parallel_size",
           doc="Pipeline-parallel size; unset, one stage per node of a multi-node instance"),
    _share("gpu_memory_utilization", vllm=Flag("--gpu-memory-utilization"), counterpart="mem_fraction_static",
           plan_key="gpu_memory_utilization", doc=_SHARE),
    _share("mem_fraction_static", sglang=Flag("--mem-fraction-static"), counterpart="gpu_memory_utilization",
           plan_key="gpu_memory_utilization", doc=_SHARE),
    _count("max_model_len", vllm=Flag("--max-model-len"), counterpart="context_length", plan_key="max_model_len",
           doc=_LEN),
    _count("context_length", sglang=Flag("--context-length"), counterpart="max_model_len", plan_key="max_model_len",
           doc=_LEN),
    _count("max_num_seqs", vllm=Flag("--max-num-seqs"), counterpart="max_running_requests", plan_key="max_num_seqs",
           doc="Requests scheduled at once; unset, the memory plan's"),
    _count("max_running_requests", sglang=Flag("--max-running-requests"), counterpart="max_num_seqs",
           plan_key="max_num_seqs", doc="Requests run at once; unset, SGLang sizes it from its KV cache"),
    _count("max_num_batched_tokens", vllm=Flag("--max-num-batched-tokens"), counterpart="chunked_prefill_size",
           plan_key="max_num_batched_tokens", doc=_STEP),
    _count("chunked_prefill_size", sglang=Flag("--chunked-prefill-size"), counterpart="max_num_batched_tokens",
           plan_key="max_num_batched_tokens", doc=_STEP),
    Option("enable_chunked_prefill", bool, vllm=Flag("--enable-chunked-prefill", PAIR),
           counterpart="chunked_prefill_size", doc="Chunked prefill"),
    Option("enable_prefix_caching", bool, vllm=Flag("--enable-prefix-caching", PAIR),
           sglang=Flag("--disable-radix-cache", INVERSE), doc="Prefix caching (SGLang's radix cache)"),
    Option("enforce_eager", bool, vllm=Flag("--enforce-eager", SWITCH), sglang=Flag("--disable-cuda-graph", SWITCH),
           plan_key="enforce_eager", doc="CUDA graphs off; unset, the memory plan's choice"),
    Option("quantization", str, vllm=Flag("--quantization"), sglang=Flag("--quantization"), plan_key="quantization",
           choices=("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "bitsandbytes", "compressed-tensors",
                    "modelopt"), doc="Quantization method; must match the checkpoint"),
    Option("dtype", str, vllm=Flag("--dtype"), sglang=Flag("--dtype"), plan_key="dtype",
           choices=("auto", "bfloat16", "float16", "float32", "half"), doc="Weights and activation dtype"),
    Option("kv_cache_dtype", str, vllm=Flag("--kv-cache-dtype"), sglang=Flag("--kv-cache-dtype"),
           plan_key="kv_cache_dtype", choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"),
           doc="KV cache dtype; fp8 holds twice the tokens"),
    Option("reasoning_parser", str, vllm=Flag("--reasoning-parser"), sglang=Flag("--reasoning-parser"),
           doc="Reasoning parser, e.g. deepseek_r1"),
    Option("trust_remote_code", bool, vllm=Flag("--trust-remote-code", SWITCH),
           sglang=Flag("--trust-remote-code", SWITCH), doc="Run the model repository's own code"),
    Option("seed", int, vllm=Flag("--seed"), sglang=Flag("--random-seed"), doc="Random seed"),
)  # fmt: skip
OPTIONS: Dict[str, Option] = {o.name: o for o in _OPTIONS}

# Options the pinned engines no longer have, with what to do instead. vLLM 0.32's own
# parser rejects --swap-space (tests/labtests/test_engine_argparse.py shows it).
REMOVED = {
    "swap_space": "vLLM 0.32 has no --swap-space (its V1 engine recomputes preempted requests instead of "
    "swapping); remove it",
}
# Instance keys that are not engine options.
INSTANCE_KEYS = (
    "name", "engine", "accelerator", "image", "model", "served_model_name", "port", "bind", "gpus", "cpus",
    "api_key", "api_key_previous", "ipc", "shm_size", "kv_cache_space_gib", "extra_args", "env", "secret_env",
    "readiness_timeout", "drain_timeout", "options", "surge_port", "watch_gpus", "nodes", "master_port",
    "cross_node_tensor_parallel", "distributed_executor_backend", "ray_port", "ray_dashboard_port", "ray_token",
    "exclusive_cpus", "cpu_weight", "io_weight", "memory_low", "memory_max",
)  # fmt: skip


# The phases an engine goes through while it starts, in order of a typical start (an engine may
# go back and forth between some: vLLM compiles inside its memory profiling run). `gpufleet status`
# and the rollout's readiness read them from the engine's log (module_utils/_engine_phase.py).
PHASES = ("initializing", "loading weights", "profiling memory", "compiling", "capturing graphs", "warming up",
          "starting server", "serving")  # fmt: skip


@dataclass(frozen=True)
class Marker:
    """A log line that begins a start phase: a line that holds `text` (case-insensitive) puts the
    engine in `phase`; `note` says more about it (e.g. compiled artefacts loaded from the cache)."""

    text: str
    phase: str
    note: str = ""


@dataclass(frozen=True)
class Engine:
    """One serving engine: how it starts, what it runs on, what its /metrics call things."""

    name: str
    entrypoint: Tuple[str, ...]
    model_flag: str
    accelerators: Tuple[str, ...]
    # how people write its name
    label: str = ""
    # why an accelerator is missing, for the error message
    accelerator_note: str = ""
    # Prometheus names of METRIC_KEYS (those it exports); where several are given, the first one
    # present counts (gpufleet status, the drain). The alert and recording rules take the first.
    metrics: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    # flags every instance of the engine gets, after --host and --port
    server_flags: Tuple[str, ...] = ()
    # the flag that takes the instance's drain time in seconds (None: the engine has none)
    drain_flag: Optional[str] = None
    # --ipc=host for every instance, not only multi-GPU ones (SGLang's launcher runs its
    # tokenizer, scheduler and detokenizer as processes that share tensors through /dev/shm)
    host_ipc: bool = False
    # the environment variable that names the address its workers bind (None: it has none)
    host_ip_env: Optional[str] = None
    # True: it reads its API key from the environment (VLLM_API_KEY), which gpufleet puts in the
    # 0600 secret file; False: only on the command line, where every local user can read it
    api_key_from_env: bool = False
    # distributed executors a multi-node instance may choose (distributed_executor_backend);
    # empty: the engine has its own multi-node runtime and no such setting
    executor_backends: Tuple[str, ...] = ()
    # True: its memory share (gpu_memory_utilization) bounds everything it allocates on the GPU
    # (weights, KV cache, activations, CUDA graphs), so two copies at shares adding up to less
    # than 1 fit side by side; False: the share bounds the weights and the KV pool only
    # (SGLang's mem_fraction_static), activations and graphs come on top
    share_covers_all: bool = False
    # True: it sizes its request pool from its KV cache itself; the plan's max_num_seqs is then
    # only the largest CUDA-graph batch and is passed on only when pinned
    sizes_request_pool: bool = False
    # A multi-node instance: the entrypoint its members run (vLLM's workers exist only on the
    # `vllm serve` path: started through the API server module, a follower asserts "collective_rpc
    # should not be called on follower node", checked in vLLM 0.32), and its flags.
    group_entrypoint: Optional[Tuple[str, ...]] = None
    # Its compile caches (engine_compile_cache): (environment variable, folder under the instance's
    # cache mount) for each cache the engine writes, so that what it compiled survives a restart.
    cache_env: Tuple[Tuple[str, str], ...] = ()
    # The log lines that begin its start phases (PHASES), tried in this order on each line: the
    # first that matches counts. "serving" ends the start.
    start_markers: Tuple[Marker, ...] = ()

    def group_flags(self, group: dict) -> List[str]:
        """The engine's multi-node flags for one member (_engine_group.context)."""
        if not self.executor_backends:
            # SGLang's ServerArgs: --nnodes, --node-rank, --dist-init-addr HOST:PORT
            return ["--nnodes", str(group["size"]), "--node-rank", str(group["rank"]),
                    "--dist-init-addr", host_port(group["master_addr"], group["master_port"])]  # fmt: skip
        if group.get("backend") == "ray":
            # vLLM's Ray executor: it joins the Ray cluster (RAY_ADDRESS) and places every worker
            # on its nodes itself, so no node flags (_engine_group.ray_start runs the nodes)
            return ["--distributed-executor-backend", "ray"]
        # vLLM's multiprocessing executor across nodes (vllm/config/parallel.py nnodes, node_rank,
        # master_addr, master_port; workers --headless serve no API)
        flags = ["--nnodes", str(group["size"]), "--node-rank", str(group["rank"]),
                 "--master-addr", group["master_addr"], "--master-port", str(group["master_port"]),
                 "--distributed-executor-backend", "mp"]  # fmt: skip
        return flags + (["--headless"] if group["rank"] else [])


# How long a stopping instance drains (its requests in flight finish) unless it says
# (drain_timeout): its longest generation (max_model_len tokens, the model's context when the
# plan knows no other) at DRAIN_SECONDS_PER_TOKEN (20 tokens/s, a slow reasoning stream on a
# busy GPU), between DRAIN_MIN and DRAIN_MAX seconds. vLLM drains on SIGTERM for up to that
# long (--shutdown-timeout, vllm-project/vllm#36666; checked in vLLM 0.32): requests in flight
# finish, new ones get HTTP 500, which the proxy retries on another server. Docker's stop
# timeout and the unit's TimeoutStopSec follow it (DRAIN_STOP_MARGIN and DRAIN_UNIT_MARGIN
# above it), and the rollout waits as long before it gives up.
DRAIN_SECONDS_PER_TOKEN = 0.05
DRAIN_MIN = 30
DRAIN_MAX = 3600
DRAIN_STOP_MARGIN = 10
DRAIN_UNIT_MARGIN = 30
# Metric names: vLLM v1 exports vllm:num_requests_running, vllm:num_requests_waiting and
# vllm:kv_cache_usage_perc (0-1; older releases: vllm:gpu_cache_usage_perc), checked against a
# capture of vLLM 0.32.0 in tests/fixtures/engine_metrics/, as are its prefix cache counters
# vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total (tokens). SGLang exports
# sglang:num_running_reqs, sglang:num_queue_reqs and sglang:token_usage (0-1), checked against
# the capture SGLang's docs publish ("Production Metrics"; tests/fixtures/engine_metrics/).
# SGLang serves /metrics only with --enable-metrics: status and the rollout's drain read it.
# The rules' series (histograms by their base name; counters with _total) are vLLM 0.32's in the
# same capture, and SGLang's in tests/fixtures/engine_metrics/sglang-*.txt (a real capture from
# SGLang's own docs, of a 0.4.x server) and its source (python/sglang/srt/metrics/collector.py):
# SGLang adds its token counters when a request finishes, so they are no sign of progress
# (no `progress`: its hangs are the watchdog's one-token probe's); it counts no preemptions
# (full: requests wait while its token pool is full instead); its prefix cache hit rate is a
# gauge; inter_token_latency_seconds is 0.4.3's and later (the 0.4.x capture predates it).
METRIC_KEYS = (
    "running",  # requests in the batch (gauge)
    "waiting",  # requests queued (gauge)
    "kv_cache_usage",  # KV cache in use, 0-1 (gauge)
    "prefix_cache_queries",  # prompt tokens looked up in the prefix cache (counter)
    "prefix_cache_hits",  # of those, found there (counter)
    "prefix_cache_hit_ratio",  # the engine's own hit ratio, 0-1 (gauge), where it has no counters
    "generation_tokens",  # tokens generated (counter)
    "prompt_tokens",  # prompt tokens processed (counter)
    "progress",  # a counter that moves while tokens are generated (the hang signal)
    "preemptions",  # requests preempted for KV room (counter)
    "ttft",  # time to first token (histogram)
    "itl",  # time between output tokens (histogram)
    "e2e",  # request latency (histogram)
)
ENGINE_INFO: Dict[str, Engine] = {
    "vllm": Engine(
        "vllm",
        label="vLLM",
        entrypoint=("python3", "-m", "vllm.entrypoints.openai.api_server"),
        model_flag="--model",
        accelerators=("nvidia", "cpu"),
        metrics={
            "running": ("vllm:num_requests_running",),
            "waiting": ("vllm:num_requests_waiting",),
            "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            # prompt tokens looked up in, and found in, the prefix cache since the engine started
            "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
            "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
            "generation_tokens": ("vllm:generation_tokens_total",),
            "prompt_tokens": ("vllm:prompt_tokens_total",),
            "progress": ("vllm:generation_tokens_total",),
            "preemptions": ("vllm:num_preemptions_total",),
            "ttft": ("vllm:time_to_first_token_seconds",),
            "itl": ("vllm:inter_token_latency_seconds",),
            "e2e": ("vllm:e2e_request_latency_seconds",),
        },
        drain_flag="--shutdown-timeout",
        group_entrypoint=("vllm", "serve"),
        host_ip_env="VLLM_HOST_IP",
        api_key_from_env=True,
        executor_backends=("mp", "ray"),
        share_covers_all=True,
        # Checked in vLLM 0.32's source (the lab image) and its CPU engine in the lab (docs/engines.md).
        # VLLM_CACHE_ROOT (vllm/envs.py; default ~/.cache/vllm): its torch.compile cache,
        # torch_compile_cache/torch_aot_compile/HASH (vllm/compilation/decorators.py) and
        # torch_compile_cache/HASH (vllm/compilation/backends.py), HASH from its config and code, so a
        # changed setting compiles again into a folder of its own; vLLM points TORCHINDUCTOR_CACHE_DIR at
        # HASH/inductor_cache itself, whatever the environment says (compiler_interface.py
        # InductorAdaptor.initialize_cache, decorators.py), so gpufleet sets none; its FlashInfer autotune
        # results go under it too (model_executor/warmup/flashinfer_autotune_cache.py). VLLM_CACHE_ROOT is
        # left out of the key (envs.compile_factors: a moved folder keeps its entries).
        # TRITON_CACHE_DIR: vLLM keeps a caller's (compiler_interface.py; else HASH/triton_cache), and its
        # own Triton kernels outside torch.compile compile there too (Triton's default: ~/.triton/cache).
        # Triton keys each kernel by its source and options.
        # FLASHINFER_WORKSPACE_BASE: FlashInfer's JIT kernels, in .cache/flashinfer/VERSION/ARCH under it
        # (flashinfer/jit/env.py; default the home folder).
        cache_env=(
            ("VLLM_CACHE_ROOT", "vllm"),
            ("TRITON_CACHE_DIR", "triton"),
            ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
        ),
        # vLLM 0.32's log lines (file in vllm/): v1/worker/gpu_model_runner.py and cpu_model_runner.py
        # "Starting to load model", model_executor/model_loader/default_loader.py "Loading weights
        # took", gpu_model_runner.py "Model loading took" (then the profile run, which compiles),
        # compilation/decorators.py "Directly load AOT compilation from path" and "Compiling model
        # again due to a load failure", compilation/backends.py "Directly load the compiled graph(s)",
        # "Using cache directory: ... for vLLM's torch.compile", "Dynamo bytecode transform time" and
        # "Compiling a graph for compile range", v1/worker/cpu_model_runner.py "Warming up model for
        # the compilation" and "Warming up done", v1/worker/gpu_worker.py "Compile and warming up
        # model for size", v1/core/kv_cache_utils.py "GPU/CPU KV cache size", gpu_model_runner.py
        # "Capturing CUDA graphs" (its progress bar) and "Graph capturing finished", v1/engine/core.py
        # "init engine (profile, create kv cache, warmup model) took", entrypoints/launchers/api_server/
        # entry.py "Starting vLLM server on" (before 0.32 "Starting vLLM API server on"), then uvicorn's
        # "Application startup complete" (/health answers). Real logs in tests/fixtures/engine_logs/.
        start_markers=(
            Marker("Starting to load model", "loading weights"),
            Marker("Loading weights took", "profiling memory"),
            Marker("Model loading took", "profiling memory"),
            Marker("Directly load AOT compilation", "compiling", "compiled artefacts loaded from the cache"),
            Marker("Directly load the compiled graph", "compiling", "compiled artefacts loaded from the cache"),
            Marker(
                "Compiling model again due to a load failure",
                "compiling",
                "the cached artefact did not load: compiling again",
            ),
            Marker("Warming up model for the compilation", "compiling"),
            Marker("for vLLM's torch.compile", "compiling"),
            Marker("Dynamo bytecode transform time", "compiling"),
            Marker("Compiling a graph for", "compiling"),
            Marker("Compile and warming up model for size", "compiling"),
            Marker("Warming up done", "warming up"),
            Marker("KV cache size:", "warming up"),
            Marker("Capturing CUDA graphs", "capturing graphs"),
            Marker("Graph capturing finished", "warming up"),
            Marker("init engine (profile, create kv cache, warmup model) took", "starting server"),
            Marker("Starting vLLM server on", "starting server"),
            Marker("Starting vLLM API server on", "starting server"),
            Marker("Application startup complete", "serving"),
        ),
    ),
    "sglang": Engine(
        "sglang",
        label="SGLang",
        entrypoint=("python3", "-m", "sglang.launch_server"),
        model_flag="--model-path",
        accelerators=("nvidia",),
        accelerator_note="SGLang's published builds are CUDA-only",
        metrics={
            "running": ("sglang:num_running_reqs",),
            "waiting": ("sglang:num_queue_reqs",),
            "kv_cache_usage": ("sglang:token_usage",),
            "prefix_cache_hit_ratio": ("sglang:cache_hit_rate",),
            "generation_tokens": ("sglang:generation_tokens_total",),
            "prompt_tokens": ("sglang:prompt_tokens_total",),
            "ttft": ("sglang:time_to_first_token_seconds",),
            "itl": ("sglang:inter_token_latency_seconds",),
            "e2e": ("sglang:e2e_request_latency_seconds",),
        },
        server_flags=("--enable-metrics",),
        group_entrypoint=("python3", "-m", "sglang.launch_server"),
        host_ipc=True,
        sizes_request_pool=True,
        # SGLang's caches (python/sglang/srt/environ.py): SGLANG_CACHE_DIR (default ~/.cache/sglang), under
        # which DeepGEMM's kernels (SGLANG_DG_CACHE_DIR), its JIT kernel builds (SGLANG_JIT_CACHE_DIR) and
        # CuTe DSL AOT objects go by default; TORCHINDUCTOR_CACHE_DIR for --enable-torch-compile (SGLang's
        # docs, "Enabling cache for torch.compile": set it, run once, start again with it); Triton's and
        # FlashInfer's as for vLLM. Each keys its entries by what it compiled (Inductor: the graph, its
        # inputs' shapes, the config and the torch version).
        cache_env=(
            ("SGLANG_CACHE_DIR", "sglang"),
            ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
            ("TRITON_CACHE_DIR", "triton"),
            ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
        ),
        # SGLang's log lines (python/sglang/srt/model_executor/model_runner.py "Load weight begin", "Load
        # weight end", "KV Cache is allocated"; cuda_graph_runner.py "Capture cuda graph begin" and
        # later releases' "Capture piecewise CUDA graph begin" / "Capture target decode CUDA graph
        # begin" (its torch.compile runs inside the capture), "Capture cuda graph end";
        # managers/scheduler.py "max_total_num_tokens="; entrypoints/http_server.py: uvicorn up, then
        # its warm-up request, then "The server is fired up and ready to roll!"). SGLang cannot run
        # here: the lines are from real logs that SGLang's docs print (tests/fixtures/engine_logs/).
        start_markers=(
            Marker("Load weight begin", "loading weights"),
            Marker("Load weight end", "profiling memory"),
            Marker("KV Cache is allocated", "profiling memory"),
            Marker("graph begin", "capturing graphs"),
            Marker("graph end", "starting server"),
            Marker("max_total_num_tokens=", "starting server"),
            Marker("Application startup complete", "warming up"),
            Marker("Uvicorn running on", "warming up"),
            Marker("The server is fired up and ready to roll", "serving"),
        ),
    ),
}
# Flags gpufleet sets itself from the instance (api_key, bind, port, model, its name, drain
# time and metrics): not in extra_args. The engines' parsers take "_" for "-" and any
# unambiguous prefix of a flag (argparse allow_abbrev), so extra_args are compared after
# both (_engine_validate).
OWN_FLAGS = (
    "--api-key", "--host", "--port", "--model", "--model-path", "--served-model-name", "--shutdown-timeout",
    "--enable-metrics", "--uds", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
    "--dist-init-addr", "--distributed-executor-backend",
)  # fmt: skip
# Environment names gpufleet sets or that carry secrets: not in env (secrets go in secret_env,
# which lands in the 0600 file the container sources, never on a command line).
OWN_ENV = ("VLLM_HOST_IP", "VLLM_API_KEY", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "HF_HUB_OFFLINE",
           "TRANSFORMERS_OFFLINE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RAY_ADDRESS", "RAY_AUTH_MODE",
           "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # fmt: skip
SECRET_ENV_HINTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL")


# What an instance that does not say gets, written once: validation, the plan, rendering, the
# restart strategy and the status reader read an instance through normalized().
INSTANCE_DEFAULTS = {"engine": "vllm", "accelerator": "nvidia", "bind": "127.0.0.1", "readiness_timeout": 900}


def normalized(inst: dict) -> dict:
    """The instance with INSTANCE_DEFAULTS for what it leaves unset (a copy; idempotent)."""
    out = dict(inst)
    for key, value in INSTANCE_DEFAULTS.items():
        out.setdefault(key, value)
    return out


def engine_series() -> List[dict]:
    """Per engine, the one Prometheus name of each METRIC_KEYS entry (None where it exports none):
    what the monitoring role's rules read, through the engine_series filter."""
    out = []
    for name, info in ENGINE_INFO.items():
        names = {key: (info.metrics.get(key) or (None,))[0] for key in METRIC_KEYS}
        out.append(dict(names, engine=name, label=info.label))
    return out


def options_of(inst: dict) -> dict:
    """The instance's engine options: at its top level or under `options:` (the top wins)."""
    nested = inst.get("options")
    options = {k: v for k, v in nested.items() if k in OPTIONS} if isinstance(nested, dict) else {}
    options.update({k: v for k, v in inst.items() if k in OPTIONS})
    return options


def option_for(plan_key: str, engine: str) -> Optional[Option]:
    """The engine's option that the memory plan calls `plan_key` (None when it has none)."""
    for option in _OPTIONS:
        if option.plan_key == plan_key and engine in option.engines:
            return option
    return None


def plan_pins(options: dict) -> dict:
    """The memory plan's pins from engine options: every option the plan knows, under its
    engine-neutral name (SGLang's names fold into vLLM's; the instance's own name wins)."""
    pins = {}
    for key, value in options.items():
        option = OPTIONS.get(key)
        if option is None or option.plan_key is None or value is None:
            continue
        if option.plan_key == key or option.plan_key not in pins:
            pins[option.plan_key] = value
    return pins


def engine_flags(options: dict, engine: str) -> dict:
    """{flag: value} for engine options, in the engine's own flag names (switches: True)."""
    flags = {}
    for key, value in options.items():
        flag = OPTIONS[key].flag(engine)
        if flag is None or value is None:
            continue
        if flag.style == VALUE:
            flags[flag.name] = value
        else:
            flags.update(dict.fromkeys(flag.render(value), True))
    return flags


def drain_timeout(inst: dict, max_model_len=None) -> int:
    """Seconds a stopping instance drains: its drain_timeout, else its longest generation
    (max_model_len tokens) at DRAIN_SECONDS_PER_TOKEN, within DRAIN_MIN..DRAIN_MAX."""
    if is_type(inst.get("drain_timeout"), int):
        return inst["drain_timeout"]
    if not is_type(max_model_len, int):
        return DRAIN_MIN
    return int(min(DRAIN_MAX, max(DRAIN_MIN, round(max_model_len * DRAIN_SECONDS_PER_TOKEN))))


def metric_names(engine: str) -> Dict[str, Tuple[str, ...]]:
    return ENGINE_INFO.get(engine, ENGINE_INFO["vllm"]).metrics


def is_type(value, kind) -> bool:
    """Whether `value` is of an option kind (bool is not an int; an int is a number; a
    string is not empty)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str) and value != ""
    return False


def label(i: int, inst) -> str:
    """How messages name an instance: gpufleet_engines[i] (name)."""
    name = inst.get("name") if isinstance(inst, dict) else None
    return "gpufleet_engines[%d]%s" % (i, " (%s)" % name if name else "")


def default_pipeline_parallel_size(inst: dict, nodes: int) -> int:
    """An unpinned pipeline_parallel_size: one stage per node of a multi-node instance, or 1
    when its tensor parallel may span the nodes (cross_node_tensor_parallel; the memory plan
    chooses the same)."""
    return 1 if nodes <= 1 or inst.get("cross_node_tensor_parallel") is True else nodes


def default_tensor_parallel_size(inst: dict, gpus, pp, nodes: int = 1) -> int:
    """An unpinned tensor_parallel_size spreads the model over all the instance's GPUs (on each
    of its `nodes`: pipeline parallel crosses the nodes, tensor parallel stays within one)."""
    if normalized(inst)["accelerator"] == "cpu" or not gpus or not is_type(pp, int) or pp < 1:
        return 1
    return max(1, len(gpus) * nodes // pp)
