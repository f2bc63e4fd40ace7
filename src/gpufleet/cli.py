"""The gpufleet command line. Thin: the collection holds the logic; this is the front door."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet._collection import CollectionNotFoundError, ensure_importable
from gpufleet.plan_schema import SCHEMA_VERSION as PLAN_SCHEMA

# The files `gpufleet gpu capture` writes, and the nvidia-smi command behind each one.
# The same names are used by the lab's nvidia-smi hardware stand-in and the test fixtures.
CAPTURE_FILES = {
    "query-gpu.csv": None,  # filled from the module's own field list at run time
    "nvidia-smi.txt": [],
    "topo-m.txt": ["topo", "-m"],
    "topo-p2p-r.txt": ["topo", "-p2p", "r"],
}


def _version_text() -> str:
    try:
        from ansible.release import __version__ as core
    except ImportError:  # pragma: no cover - ansible-core is a dependency
        core = "not installed"
    return "gpufleet %s (collection gpufleet.serving %s, ansible-core %s)" % (__version__, __version__, core)


def read_capture(folder: Path) -> dict[str, str | None]:
    """Read a capture folder; lines starting with '#~ ' (fixture provenance) are dropped."""
    texts: dict[str, str | None] = {}
    for name in CAPTURE_FILES:
        path = folder / name
        if path.is_file():
            lines = path.read_text().splitlines(keepends=True)
            texts[name] = "".join(line for line in lines if not line.startswith("#~ "))
        else:
            texts[name] = None
    return texts


def _query_argv() -> list[str]:
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import QUERY_GPU_FIELDS

    return ["--query-gpu=" + ",".join(QUERY_GPU_FIELDS), "--format=csv"]


def cmd_gpu_capture(args: argparse.Namespace) -> int:
    smi = args.nvidia_smi or shutil.which("nvidia-smi")
    if not smi:
        print("gpufleet: nvidia-smi not found on PATH; pass --nvidia-smi PATH", file=sys.stderr)
        return 1
    out = Path(args.folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, argv in CAPTURE_FILES.items():
        argv = _query_argv() if argv is None else argv
        proc = subprocess.run([smi, *argv], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print("gpufleet: `nvidia-smi %s` failed (%s); %s not written" % (" ".join(argv), proc.returncode, name))
            continue
        header = "#~ captured by: gpufleet gpu capture\n#~ command: nvidia-smi %s\n" % " ".join(argv)
        (out / name).write_text(header + proc.stdout)
        print("wrote %s" % (out / name))
    return 0


def cmd_gpu_show(args: argparse.Namespace) -> int:
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts, facts_lines

    folder = Path(args.folder)
    texts = read_capture(folder)
    if not folder.is_dir() or not any(texts.values()):
        print(
            "gpufleet gpu show: %s %s; give a folder written by `gpufleet gpu capture` (it holds %s)"
            % (
                folder,
                "holds none of the capture's files" if folder.is_dir() else "is not a folder",
                ", ".join(CAPTURE_FILES),
            ),
            file=sys.stderr,
        )
        return 1
    facts = build_facts(
        query_csv=texts["query-gpu.csv"],
        summary=texts["nvidia-smi.txt"],
        topo=texts["topo-m.txt"],
        p2p=texts["topo-p2p-r.txt"],
    )
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
        return 0
    print("\n".join(facts_lines(facts)))
    return 0


GIB = 2**30


def _read_model_config(path: str) -> dict:
    from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import (
        CONFIG_MAX_BYTES,
        load_model_config,
    )

    target = Path(path)
    if target.is_dir():
        target = target / "config.json"
    try:
        if not target.is_file():
            raise ValueError(
                "--model %s: %s %s (give a model folder or its config.json)"
                % (path, target, "is not a regular file" if target.exists() else "does not exist")
            )
        # at most one byte past the limit: /dev/zero or a weights file is never read whole
        with target.open("rb") as handle:
            raw = handle.read(CONFIG_MAX_BYTES + 1)
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ValueError(
            "cannot read %s: %s (give a model folder or its config.json)" % (target, exc.strerror)
        ) from None
    except UnicodeDecodeError:
        raise ValueError("--model %s: %s is not UTF-8 text; give a model's config.json" % (path, target)) from None
    return load_model_config(text)


# PLAN_SCHEMA: the schema version of `gpufleet plan --json` (src/gpufleet/plan_schema.py).


class PlanInputError(ValueError):
    """A bad input to `gpufleet plan`, as one record: the flag, its value, what is wrong, the fix."""

    def __init__(self, variable: str, value: Any, message: str, fix: str = ""):
        self.record = {"variable": variable, "value": value, "message": message, "fix": fix}
        super().__init__(problem_text(self.record))


def problem_text(record: dict) -> str:
    """A record as one sentence: FLAG=VALUE MESSAGE; FIX."""
    message = str(record.get("message") or "")
    variable = record.get("variable")
    # a message that names its flag itself (the model reader's) is not prefixed again
    if not variable or message.startswith(variable):
        text = message
    elif record.get("value") is None:  # not given at all
        text = "%s %s" % (variable, message)
    else:
        text = "%s=%s %s" % (variable, record["value"], message)
    return "%s (%s)" % (text, record["fix"]) if record.get("fix") else text


def _plan_input_errors(args: argparse.Namespace) -> list[dict]:
    """Every bad number given to `gpufleet plan`, named by its flag, before any arithmetic: one
    record per problem ({variable, value, message, fix})."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import OPTIONS

    errors = []

    def bad(flag, value, message, fix=""):
        # JSON has no NaN or infinity: such a value is given as the text it was typed as
        shown = str(value) if isinstance(value, float) and not math.isfinite(value) else value
        errors.append({"variable": flag, "value": shown, "message": message, "fix": fix})

    if args.gpus < 1 or args.gpus > 1024:
        bad("--gpus", args.gpus, "must be from 1 to 1024", "the GPUs the instance may use on each node")
    if args.nodes < 1 or args.nodes > 1024:
        bad("--nodes", args.nodes, "must be from 1 to 1024", "the hosts the instance spans")
    if args.gpu_memory_gib is not None and not (math.isfinite(args.gpu_memory_gib) and 1 < args.gpu_memory_gib <= 4096):
        bad("--gpu-memory-gib", args.gpu_memory_gib, "must be one GPU's memory in GiB", "e.g. 24 or 80")
    if args.concurrency is not None and args.concurrency < 1:
        bad("--concurrency", args.concurrency, "must be at least 1", "full-length requests at once")
    space = args.kv_cache_space_gib
    if space is not None and not (math.isfinite(space) and 0 < space <= 65536):
        bad("--kv-cache-space-gib", space, "must be a size in GiB above 0", "e.g. 4")
    for name in _plan_pin_options():
        value = getattr(args, name)
        option = OPTIONS[name]
        if value is None or option.kind is bool:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            bad(flag, value, "must be a finite number")
        elif option.bounds_text() and not option.in_bounds(value):
            bad(flag, value, "must be %s" % option.bounds_text())
    return errors


def _plan_failed(args: argparse.Namespace, records: list[dict]) -> int:
    """Bad input: each record as a sentence on stderr, and with --json one object on stdout
    (plan_schema.py): fits false, the sentences in errors, the records in input_errors."""
    for record in records:
        print("gpufleet plan: %s" % problem_text(record), file=sys.stderr)
    if args.json:
        out = {"schema_version": PLAN_SCHEMA, "fits": False, "errors": [problem_text(r) for r in records],
               "input_errors": records}  # fmt: skip
        print(json.dumps(out, indent=2, sort_keys=True, allow_nan=False))
    return 1


def print_plan(plan: dict) -> None:
    """The plan as the engine role prints it, with the CLI's detail (one formatter:
    module_utils/_plan_text.py)."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._plan_text import plan_lines

    for line in plan_lines(plan, detail=True):
        print(line)


def cmd_plan(args: argparse.Namespace) -> int:
    from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan as mp
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan_for
    from ansible_collections.gpufleet.serving.plugins.module_utils._model_shape import ModelConfigError

    if args.json_schema:
        from gpufleet.plan_schema import plan_schema

        print(json.dumps(plan_schema(), indent=2, sort_keys=True))
        return 0
    if not args.model:
        return _plan_failed(args, [{"variable": "--model", "value": None, "message": "is required",
                                    "fix": "the model's folder or its config.json"}])  # fmt: skip
    problems = _plan_input_errors(args)
    if problems:
        return _plan_failed(args, problems)
    try:
        config = _read_model_config(args.model)
        if args.gpu_memory_gib is None and args.accelerator != "cpu":
            raise PlanInputError(
                "--gpu-memory-gib", None, "is required", "the memory of one GPU, as nvidia-smi lists it"
            )
        pins = {name: getattr(args, name) for name in _plan_pin_options()}
        pins["cross_node_tensor_parallel"] = args.cross_node_tensor_parallel
        # the engine role's own plan for an instance given these GPUs (one function for both)
        plan = plan_for(
            config,
            gpus=args.gpus,
            nodes=args.nodes,
            gpu_memory_bytes=mp.usable_bytes(gib=args.gpu_memory_gib) if args.gpu_memory_gib else None,
            engine=args.engine,
            accelerator=args.accelerator,
            pins=pins,
            gpu_name=args.gpu_name,
            concurrency=args.concurrency,
            kv_space_bytes=int((args.kv_cache_space_gib or 1) * GIB) if args.accelerator == "cpu" else None,
        )
    except PlanInputError as exc:
        return _plan_failed(args, [exc.record])
    except ModelConfigError as exc:
        # the model's config.json
        return _plan_failed(args, [{"variable": "--model", "value": args.model, "message": str(exc), "fix": ""}])
    except ValueError as exc:
        # reading --model (its message names it), or a pin the planner refuses (its message names the pin)
        named = str(exc).startswith("--model")
        return _plan_failed(
            args,
            [{"variable": "--model" if named else None, "value": args.model if named else None,
              "message": str(exc), "fix": ""}],
        )  # fmt: skip
    except (ArithmeticError, RecursionError, KeyError, TypeError) as exc:
        # the config passed the checks above but the arithmetic still could not use it
        return _plan_failed(
            args,
            [{"variable": "--model", "value": args.model,
              "message": "cannot be planned: %s: %s" % (type(exc).__name__, exc), "fix": ""}],
        )  # fmt: skip
    if args.json:
        print(json.dumps(dict(plan, schema_version=PLAN_SCHEMA), indent=2, sort_keys=True))
    else:
        print_plan(plan)
    return 0 if plan["fits"] else 2


class Parser(argparse.ArgumentParser):
    """argparse with gpufleet's exit codes: a usage error is bad input, exit 1 (2 means a check
    ran and did not pass: a plan that does not fit, an instance not serving)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        if self.prog.endswith(" plan") and "--json" in sys.argv[1:]:
            # `plan --json` answers every outcome with one object, an option argparse refused too
            record = {"variable": None, "value": None, "message": message, "fix": "gpufleet plan --help"}
            out = {"schema_version": PLAN_SCHEMA, "fits": False, "errors": [problem_text(record)],
                   "input_errors": [record]}  # fmt: skip
            print(json.dumps(out, indent=2, sort_keys=True))
        self.exit(1, "%s: error: %s\n" % (self.prog, message))


# The commands that run a playbook: any option they do not own goes to ansible-playbook unchanged.
PASSTHROUGH = ("deploy", "rollout", "status", "models")
PASSTHROUGH_HELP = (
    "Any other option goes to ansible-playbook unchanged and is checked by its own parser first: "
    "-u USER, -b, -K, -k, --private-key FILE, -c, -f, -t/--tags, --skip-tags, -C/--check, -D/--diff, "
    "--vault-id, --vault-password-file, -J, --list-hosts, --list-tasks, --syntax-check, --start-at-task, "
    "-v (Ansible's verbosity; its output is shown). Passwords asked for (-K, -k, -J, --vault-id ID@prompt) "
    "are asked here and given to ansible-playbook's prompt."
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gpufleet", description=__doc__)
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gpu = sub.add_parser("gpu", help="capture a host's nvidia-smi outputs, or show the facts gpufleet reads from them")
    gpu_sub = gpu.add_subparsers(dest="gpu_command", metavar="ACTION", required=True)
    cap = gpu_sub.add_parser("capture", help="run nvidia-smi here and save its outputs to FOLDER")
    cap.add_argument("folder")
    cap.add_argument("--nvidia-smi", help="path of nvidia-smi (default: found on PATH)")
    cap.set_defaults(func=cmd_gpu_capture)
    show = gpu_sub.add_parser("show", help="GPU facts and the NCCL P2P decision from a capture FOLDER")
    show.add_argument("folder")
    show.add_argument("--json", action="store_true", help="print the facts as gpu_facts returns them")
    show.set_defaults(func=cmd_gpu_show)

    plan = sub.add_parser(
        "plan",
        help="the memory plan for a model on GPUs: what fits, the engine settings, and why",
        description="Compute weights, KV cache, activations, CUDA graphs and context per GPU the way the engine "
        "does at startup; choose the settings you do not pin. The plan is the engine role's for an instance given "
        "these GPUs (the role prints the same at preflight). Exit 0 when it fits, 2 when it does not, 1 on bad input.",
    )
    plan.add_argument("--model", help="model folder (or its config.json); required")
    plan.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU in GiB, as nvidia-smi lists it (24, 80)")
    plan.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="GPUs the instance is given on each node, its `gpus` list (default 1). As the engine role deploys it, "
        "tensor_parallel_size is this unless pinned; where fewer GPUs would do, the plan's advice says so",
    )
    plan.add_argument(
        "--gpu-name",
        help="the GPU's name as nvidia-smi lists it (e.g. 'NVIDIA A100-SXM4-80GB'): vLLM's batch defaults depend on it",
    )
    plan.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="hosts the instance spans (default 1): tensor parallel within a node, pipeline parallel across nodes",
    )
    plan.add_argument(
        "--cross-node-tensor-parallel",
        action="store_true",
        default=None,
        help="let a pinned --tensor-parallel-size span nodes (refused otherwise: every layer's all-reduce would "
        "cross the network)",
    )
    # --engine and --accelerator: their choices are the registry's (_add_plan_pins)
    plan.add_argument(
        "--kv-cache-space-gib",
        type=float,
        help="KV cache space of a CPU instance (VLLM_CPU_KVCACHE_SPACE; default 1, as the engine role's "
        "kv_cache_space_gib)",
    )
    _add_plan_pins(plan)
    plan.add_argument(
        "--concurrency", type=int, help="full-length requests that must fit at once (default: max-num-seqs, else 8)"
    )
    plan.add_argument(
        "--json",
        action="store_true",
        help="print the plan as one JSON object, bad input too (its schema: gpufleet plan --json-schema)",
    )
    plan.add_argument(
        "--json-schema", action="store_true", help="print the JSON Schema of --json's output and stop (no --model)"
    )
    plan.set_defaults(func=cmd_plan)

    deploy = sub.add_parser(
        "deploy",
        help="run site.yml on an inventory (preflight everywhere first, then every layer)",
        description="Run playbooks/site.yml through ansible-runner with a live per-host view. The exit status is "
        "the run's; a failed run ends with one sentence per failed host and the path of the full log. "
        "Layers: --tags preflight,engine (ansible-playbook's option).",
        epilog=PASSTHROUGH_HELP,
        allow_abbrev=False,
    )
    _playbook_args(deploy)
    deploy.set_defaults(func=cmd_deploy)

    rollout = sub.add_parser(
        "rollout",
        help="roll a change across the gpu hosts, batch by batch, without dropping requests",
        description="Run playbooks/rollout.yml: per batch, drain from the edge, wait for requests to finish, apply "
        "(start-before-stop where a copy fits), readiness and smoke test, put back. The first failed host stops it.",
        epilog=PASSTHROUGH_HELP,
        allow_abbrev=False,
    )
    _playbook_args(rollout)
    rollout.add_argument("--batch", help="hosts per batch: a number or a percentage like 25%% (default 1)")
    rollout.add_argument(
        "--driver", action="store_true", help="also upgrade the NVIDIA driver on each drained host (hold kept)"
    )
    rollout.set_defaults(func=cmd_rollout)

    status = sub.add_parser(
        "status",
        help="what each gpu host serves now: engines, model, TP, KV cache use, requests, driver, NCCL P2P",
        description="Run the read-only playbooks/status.yml. Exit 0 when every engine instance serves, 2 when one "
        "does not, the run's status when a host could not be read, 1 on bad input.",
        epilog=PASSTHROUGH_HELP,
        allow_abbrev=False,
    )
    _playbook_args(status, json_help="print the reports as one JSON object")
    status.set_defaults(func=cmd_status)

    usage = sub.add_parser(
        "usage",
        help="token usage per key and model, each key's quota now, and each edge's view of the usage store",
        description="Run the read-only playbooks/usage.yml on the edge hosts (edge_quota_store_host keeps the "
        "counts). Exit 0 when every edge reads the store, 2 when one does not, the run's status when a host could "
        "not be read, 1 on bad input.",
        epilog=PASSTHROUGH_HELP,
        allow_abbrev=False,
    )
    _playbook_args(usage, json_help="print each edge's answer as one JSON object")
    usage.set_defaults(func=cmd_usage)

    models = sub.add_parser(
        "models",
        help="each host's models (revision, size, verified, used by which instance); pull ahead of a rollout; prune",
        description="Run playbooks/models.yml. ACTION: list (the default, read-only); pull (each gpu host's "
        "engine_model_pulls from the model store, verified, without touching an engine: stage models before a "
        "rollout); prune (remove the model folders gpufleet fetched under engine_models_dir that no instance, pull "
        "or download uses; with --check, say which). Exit 0 when every model gpufleet fetched is whole, 2 when one is "
        "not, the run's status when a host could not be read or a pull failed, 1 on bad input.",
        epilog=PASSTHROUGH_HELP,
        allow_abbrev=False,
    )
    models.add_argument("action", nargs="?", choices=["list", "pull", "prune"], default="list")
    _playbook_args(models, json_help="print each host's models as one JSON object")
    models.set_defaults(func=cmd_models)

    from gpufleet import bench as _bench

    bench = sub.add_parser(
        "bench",
        help="streaming load against an OpenAI-compatible endpoint: TTFT, TPOT, ITL percentiles, throughput",
        description="Streaming load against an OpenAI-compatible endpoint. Needs the OpenAI client, gpufleet's "
        "optional bench extra: %s." % _bench.BENCH_EXTRA,
    )

    _bench.add_arguments(bench)
    bench.set_defaults(func=_bench.run)

    demo = sub.add_parser("demo", help="the whole stack on this machine, without a GPU: up, status, down")
    demo_sub = demo.add_subparsers(dest="demo_command", metavar="ACTION", required=True)
    demo_up = demo_sub.add_parser(
        "up",
        help="build and start the demo host, run site.yml on inventories/demo, stream an answer",
        description="Installs what it needs (Docker engine, lab images, tiny model; cached), starts one lab host, "
        "runs the real site.yml against inventories/demo and streams an answer through the proxy. Run it again: "
        "it is fast and changes nothing.",
    )
    demo_up.add_argument("-v", "--verbose", action="count", default=0, help="raw Ansible output")
    demo_up.set_defaults(func=cmd_demo)
    demo_status = demo_sub.add_parser("status", help="gpufleet status on the demo")
    demo_status.add_argument("--json", action="store_true")
    demo_status.set_defaults(func=cmd_demo)
    demo_down = demo_sub.add_parser("down", help="remove the containers, volumes and images demo up made")
    demo_down.set_defaults(func=cmd_demo)

    lab = sub.add_parser("lab", help="rehearse an inventory on lab hosts (containers), without GPUs")
    lab_sub = lab.add_subparsers(dest="lab_command", metavar="ACTION", required=True)
    test = lab_sub.add_parser(
        "test",
        help="preflight every gpu host on its captured nvidia-smi output; with --converge, run site.yml on CPU",
        description="Give each host of INVENTORY a lab host whose nvidia-smi stand-in replays the host's capture "
        "(gpufleet_lab_gpu_fixture) and whose model folders hold their config.json (gpufleet_lab_model_configs), "
        "then run site.yml's preflight in check mode. Exit 0 when it passes; otherwise the run's own exit status.",
    )
    test.add_argument("-i", "--inventory", required=True, help="the inventory (file or folder) to rehearse")
    test.add_argument(
        "--converge",
        action="store_true",
        help="also converge site.yml (engines on vLLM's CPU build) and check idempotence",
    )
    test.add_argument("--keep", action="store_true", help="leave the lab hosts running afterwards")
    test.set_defaults(func=cmd_lab_test)

    coll = sub.add_parser(
        "collection",
        help="make the gpufleet.serving collection this CLI carries usable by plain ansible-playbook and ansible-doc",
    )
    coll_sub = coll.add_subparsers(dest="collection_command", metavar="ACTION", required=True)
    cpath = coll_sub.add_parser(
        "path",
        help="print the collections path that holds gpufleet.serving",
        description="Print a folder that holds ansible_collections/gpufleet/serving, for Ansible's collections "
        'path: export ANSIBLE_COLLECTIONS_PATH="$(gpufleet collection path)"',
    )
    cpath.set_defaults(func=cmd_collection)
    cinstall = coll_sub.add_parser(
        "install",
        help="install gpufleet.serving where Ansible looks (ansible-galaxy collection install)",
        description="Build the carried collection and install it with ansible-galaxy into DIR (default: the first "
        "entry of Ansible's collections path, ~/.ansible/collections), with the community collections it uses "
        "from Galaxy (--no-deps: they come from pip install 'gpufleet[collections]').",
    )
    cinstall.add_argument("-p", "--collections-path", metavar="DIR", help="install into DIR")
    cinstall.add_argument("--force", action="store_true", help="replace an installed copy of the same version")
    cinstall.add_argument(
        "--no-deps", action="store_true", help="do not fetch community.docker, .general, .crypto from Galaxy"
    )
    cinstall.set_defaults(func=cmd_collection)
    return parser


def _plan_pin_options() -> dict:
    """The engine options `gpufleet plan` pins, by their engine-neutral (vLLM) names: those the
    memory plan knows (_engine_options.OPTIONS with a plan_key of their own name)."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import OPTIONS

    return {name: o for name, o in OPTIONS.items() if o.plan_key == name}


def _add_plan_pins(plan: argparse.ArgumentParser) -> None:
    """A flag per option the plan can pin, typed and limited to the choices the engine role takes."""
    try:
        ensure_importable()
        options = _plan_pin_options()
    except CollectionNotFoundError:
        return  # main() says so before any command runs
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
        ACCELERATORS,
        ENGINE_INFO,
        ENGINES,
        INSTANCE_DEFAULTS,
        option_for,
    )
    from ansible_collections.gpufleet.serving.plugins.module_utils._memory_plan import PLANNER_CHOICES

    plan.add_argument("--engine", choices=ENGINES, default=INSTANCE_DEFAULTS["engine"])
    plan.add_argument("--accelerator", choices=ACCELERATORS, default=INSTANCE_DEFAULTS["accelerator"])

    for name, option in options.items():
        each = [(engine, option_for(name, engine)) for engine in ENGINES]
        flags = ", ".join("%s %s" % (ENGINE_INFO[e].label, o.flag(e).name) for e, o in each if o is not None)
        help_text = "pin %s (%s)" % (name, flags)
        if option.kind is bool:
            plan.add_argument("--" + name.replace("_", "-"), action="store_true", default=None, help=help_text)
        else:
            choices = option.choices + PLANNER_CHOICES.get(name, ())
            plan.add_argument("--" + name.replace("_", "-"), type=option.kind, choices=choices or None, help=help_text)


def _playbook_args(p: argparse.ArgumentParser, json_help: str | None = None) -> None:
    p.add_argument("-i", "--inventory", required=True, help="inventory file or folder")
    p.add_argument("-l", "--limit", help="only these hosts or groups (Ansible's --limit pattern)")
    p.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        metavar="VARS",
        help="KEY=VALUE, @FILE (YAML/JSON) or a JSON mapping; may be repeated",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help=json_help or "print one JSON object: per-host counts, failures, rc, log",
    )


def _request(args: argparse.Namespace, playbook: str):
    from gpufleet.runner import RunRequest, parse_extravars

    extravars, extravar_files = parse_extravars(args.extra_vars)
    req = RunRequest(
        playbook=playbook,
        inventory=args.inventory,
        limit=args.limit,
        extravars=extravars,
        extravar_files=extravar_files,
        json=args.json,
        ansible_args=list(getattr(args, "ansible_args", [])),
    )
    req.options()  # ansible-playbook's parser reads the passed-through options now (UsageError)
    return req


def _bad_input_is_1(command):
    """A command that runs a playbook: bad input (runner.UsageError) is said and exits 1."""

    def run(args: argparse.Namespace) -> int:
        from gpufleet.runner import UsageError

        try:
            return command(args)
        except UsageError as exc:
            print("gpufleet: %s" % exc, file=sys.stderr)
            return 1

    return run


@_bad_input_is_1
def cmd_deploy(args: argparse.Namespace) -> int:
    from gpufleet.runner import run_playbook

    return run_playbook(_request(args, "site"))


@_bad_input_is_1
def cmd_rollout(args: argparse.Namespace) -> int:
    from gpufleet.runner import UsageError, run_playbook

    req = _request(args, "rollout")
    if args.batch is not None:
        if not re.fullmatch(r"[1-9][0-9]*%?", args.batch) or (args.batch.endswith("%") and int(args.batch[:-1]) > 100):
            raise UsageError("--batch %s: give a host count like 2 or a percentage like 25%%" % args.batch)
        req.extravars["gpufleet_rollout_batch"] = args.batch if args.batch.endswith("%") else int(args.batch)
    if args.driver:
        req.extravars["gpufleet_rollout_driver"] = True
    return run_playbook(req)


@_bad_input_is_1
def cmd_status(args: argparse.Namespace) -> int:
    from gpufleet.runner import run_status

    return run_status(_request(args, "status"))


@_bad_input_is_1
def cmd_usage(args: argparse.Namespace) -> int:
    from gpufleet.runner import run_usage

    return run_usage(_request(args, "usage"))


@_bad_input_is_1
def cmd_models(args: argparse.Namespace) -> int:
    from gpufleet.runner import run_models

    req = _request(args, "models")
    req.extravars["gpufleet_models_action"] = args.action
    return run_models(req)


def cmd_collection(args: argparse.Namespace) -> int:
    from gpufleet._collection import install_collection, locate_collection

    if args.collection_command == "path":
        print(locate_collection().collections_path)
        return 0
    return install_collection(args.collections_path, force=args.force, deps=not args.no_deps)


def cmd_demo(args: argparse.Namespace) -> int:
    from gpufleet import demo
    from gpufleet.lab import LabError

    try:
        if args.demo_command == "up":
            return demo.up(verbose=args.verbose)
        if args.demo_command == "status":
            return demo.status(as_json=args.json)
        return demo.down()
    except LabError as exc:
        print("gpufleet demo: %s" % exc, file=sys.stderr)
        return 1


def cmd_lab_test(args: argparse.Namespace) -> int:
    from gpufleet.lab import LabError, lab_test

    try:
        return lab_test(Path(args.inventory), converge=args.converge, keep=args.keep)
    except LabError as exc:
        print("gpufleet lab: %s" % exc, file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    try:
        rc = _main(argv)
        sys.stdout.flush()  # a closed pipe (`gpufleet ... | head`) shows here, not at exit
        return rc
    except BrokenPipeError:
        # the reader went away: stop quietly, as `cat` does (128 + SIGPIPE)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and getattr(args, "command", None) not in PASSTHROUGH:
        parser.error("unrecognized arguments: %s" % " ".join(rest))
    args.ansible_args = rest
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        ensure_importable()
    except CollectionNotFoundError as exc:
        print("gpufleet: %s" % exc, file=sys.stderr)
        return 1
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
