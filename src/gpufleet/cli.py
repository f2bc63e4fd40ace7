"""The gpufleet command line. Thin: the collection holds the logic; this is the front door."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gpufleet import __version__
from gpufleet._collection import CollectionNotFoundError, ensure_importable

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
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpu_topology import build_facts

    texts = read_capture(Path(args.folder))
    facts = build_facts(
        query_csv=texts["query-gpu.csv"],
        summary=texts["nvidia-smi.txt"],
        topo=texts["topo-m.txt"],
        p2p=texts["topo-p2p-r.txt"],
    )
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
        return 0
    print("driver %s, CUDA %s, %d GPU(s)" % (facts["driver_version"], facts["cuda_version"], facts["count"]))
    for d in facts["devices"]:
        print(
            "  GPU%-2d %-32s %8s MiB  bus %-16s NUMA %-4s CPUs %s"
            % (
                d["index"],
                d["name"] or "?",
                d["memory_total_mib"] if d["memory_total_mib"] is not None else "?",
                d["pci_bus_id"] or "?",
                d["numa_node"] if d["numa_node"] is not None else "?",
                d["cpus"] or "?",
            )
        )
    p2p = facts["p2p"]
    print("NCCL P2P: %s (%s)" % ("keep enabled" if p2p["recommended"] else "disable", p2p["source"]))
    print("  " + p2p["reason"])
    return 0


PLAN_PARTS = (
    # (bar letter, label, result key)
    ("W", "weights", "weights_bytes_per_gpu"),
    ("K", "KV cache", "kv_cache_bytes_per_gpu"),
    ("A", "activations", "activation_bytes_per_gpu"),
    ("G", "CUDA graphs + non-torch", None),
    ("C", "context + NCCL", "outside_bytes_per_gpu"),
)
BAR_WIDTH = 60
GIB = 2**30


def _read_model_config(path: str) -> dict:
    from ansible_collections.gpufleet.serving.plugins.module_utils._planner import load_model_config

    target = Path(path)
    if target.is_dir():
        target = target / "config.json"
    try:
        text = target.read_text()
    except OSError as exc:
        raise ValueError(
            "cannot read %s: %s (give a model folder or its config.json)" % (target, exc.strerror)
        ) from None
    return load_model_config(text)


def _plan_parts(plan: dict) -> list[tuple[str, str, int]]:
    parts = []
    for letter, label, key in PLAN_PARTS:
        if key is None:
            value = (plan.get("cudagraph_bytes_per_gpu") or 0) + (plan.get("non_torch_bytes_per_gpu") or 0)
        else:
            value = plan.get(key) or 0
        parts.append((letter, label, int(value)))
    used = sum(p[2] for p in parts)
    parts.append((".", "headroom", max(plan["gpu_memory_bytes"] - used, 0)))
    return parts


def _bar(parts: list[tuple[str, str, int]], total: int) -> str:
    cells = []
    for letter, _, value in parts:
        cells.append(letter * round(BAR_WIDTH * value / float(total)) if value > 0 else "")
    bar = "".join(cells)
    return "[" + (bar + "." * BAR_WIDTH)[:BAR_WIDTH] + "]"


def print_plan(plan: dict) -> None:
    m = plan.get("model") or {}
    head = "%s, %.2fB parameters, %s%s" % (
        m.get("architecture", "?"),
        (m.get("parameters") or 0) / 1e9,
        m.get("dtype", "?"),
        ", %s" % m["quantization"] if m.get("quantization") else "",
    )
    print("model      %s" % head)
    if plan.get("accelerator") == "cpu":
        print("engine     vllm on CPU, KV cache space %.2f GiB" % (plan["kv_cache_bytes_per_gpu"] / GIB))
    else:
        print(
            "hardware   %d GPU(s) x %.2f GiB usable, engine %s"
            % (plan["gpus"], plan["gpu_memory_bytes"] / GIB, plan["engine"])
        )
    print("fits       %s" % ("yes" if plan["fits"] else "NO"))
    if plan.get("kv_bytes_per_token_per_gpu"):
        rows = [
            ("tensor_parallel_size", plan.get("tensor_parallel_size")),
            ("max_model_len", plan.get("max_model_len")),
            ("kv_cache_tokens", "{:,}".format(plan.get("kv_cache_tokens") or 0)),
            ("max_concurrency", "%.2f requests at full length" % (plan.get("max_concurrency") or 0)),
            ("kv bytes/token/GPU", "{:,}".format(plan["kv_bytes_per_token_per_gpu"])),
        ]
        for key in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enforce_eager"):
            if key in plan:
                rows.append((key, plan[key]))
        for key, value in rows:
            print("  %-24s %s" % (key, value))
    if plan.get("gpu_memory_bytes") and plan.get("weights_bytes_per_gpu") is not None:
        parts = _plan_parts(plan)
        print("per GPU    %s %.2f GiB" % (_bar(parts, plan["gpu_memory_bytes"]), plan["gpu_memory_bytes"] / GIB))
        print("           " + " | ".join("%s %s %.2f" % (letter, label, value / GIB) for letter, label, value in parts))
    if plan.get("engine_args"):
        print(
            "engine args  "
            + " ".join(
                flag if value is True else "%s %s" % (flag, value) for flag, value in plan["engine_args"].items()
            )
        )
    for title, key in (("why", "reasons"), ("warning", "warnings"), ("error", "errors")):
        for line in plan.get(key) or []:
            print("%-10s %s" % (title, line))


def cmd_plan(args: argparse.Namespace) -> int:
    from ansible_collections.gpufleet.serving.plugins.module_utils import _memory_plan as mp
    from ansible_collections.gpufleet.serving.plugins.module_utils._planner import ModelConfigError

    try:
        config = _read_model_config(args.model)
        if args.gpu_memory_gib is None and args.accelerator != "cpu":
            raise ValueError("--gpu-memory-gib is required (the memory of one GPU, as nvidia-smi lists it)")
        if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 1:
            raise ValueError(
                "--gpu-memory-gib=%s is too small; give one GPU's memory in GiB, e.g. 24" % args.gpu_memory_gib
            )
        pins = {
            "tensor_parallel_size": args.tensor_parallel_size,
            "quantization": args.quantization,
            "dtype": args.dtype,
            "kv_cache_dtype": args.kv_cache_dtype if args.kv_cache_dtype != "auto" else None,
            "max_model_len": args.max_model_len,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "enforce_eager": True if args.enforce_eager else None,
        }
        plan = mp.plan_memory(
            config,
            gpus=args.gpus,
            gpu_memory_bytes=mp.usable_bytes(gib=args.gpu_memory_gib) if args.gpu_memory_gib else None,
            engine=args.engine,
            accelerator=args.accelerator,
            pins=pins,
            concurrency=args.concurrency,
            kv_space_bytes=int(args.kv_cache_space_gib * GIB) if args.kv_cache_space_gib else None,
        )
    except (ValueError, ModelConfigError) as exc:
        print("gpufleet plan: %s" % exc, file=sys.stderr)
        return 1
    plan["engine_args"] = mp.engine_args(plan.get("options") or {}, args.engine)
    if args.json:
        print(json.dumps(plan, indent=2, sort_keys=True))
    else:
        print_plan(plan)
    return 0 if plan["fits"] else 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__)
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
        "does at startup; choose the settings you do not pin. Exit 0 when it fits, 2 when it does not, 1 on bad input.",
    )
    plan.add_argument("--model", required=True, help="model folder (or its config.json)")
    plan.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU in GiB, as nvidia-smi lists it (24, 80)")
    plan.add_argument("--gpus", type=int, default=1, help="GPUs the instance may use (default 1)")
    plan.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    plan.add_argument("--accelerator", choices=("nvidia", "cpu"), default="nvidia")
    plan.add_argument(
        "--kv-cache-space-gib", type=float, help="KV cache space of a CPU instance (VLLM_CPU_KVCACHE_SPACE)"
    )
    plan.add_argument("--tensor-parallel-size", type=int)
    plan.add_argument("--quantization", choices=("none", "awq", "gptq", "fp8"))
    plan.add_argument("--dtype", choices=("bfloat16", "float16"))
    plan.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    plan.add_argument("--max-model-len", type=int)
    plan.add_argument("--max-num-seqs", type=int)
    plan.add_argument("--max-num-batched-tokens", type=int)
    plan.add_argument("--gpu-memory-utilization", type=float, help="for SGLang: mem_fraction_static")
    plan.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    plan.add_argument(
        "--concurrency", type=int, help="full-length requests that must fit at once (default: max-num-seqs, else 8)"
    )
    plan.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    plan.set_defaults(func=cmd_plan)

    deploy = sub.add_parser(
        "deploy",
        help="run site.yml on an inventory (preflight everywhere first, then every layer)",
        description="Run playbooks/site.yml through ansible-runner with a live per-host view. The exit status is "
        "the run's; a failed run ends with one sentence per failed host and the path of the full log.",
    )
    _playbook_args(deploy)
    deploy.add_argument("--tags", help="only these layers (e.g. preflight,engine)")
    deploy.add_argument("--skip-tags", help="skip these layers")
    deploy.add_argument("-C", "--check", action="store_true", help="change nothing; report what would change")
    deploy.add_argument("-D", "--diff", action="store_true", help="show the changes to files")
    deploy.set_defaults(func=cmd_deploy)

    rollout = sub.add_parser(
        "rollout",
        help="roll a change across the gpu hosts, batch by batch, without dropping requests",
        description="Run playbooks/rollout.yml: per batch, drain from the edge, wait for requests to finish, apply "
        "(start-before-stop where a copy fits), readiness and smoke test, put back. The first failed host stops it.",
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
        description="Run the read-only playbooks/status.yml. Exit 0 when every engine instance serves, 1 when one "
        "does not, the run's status when a host could not be read.",
    )
    status.add_argument("-i", "--inventory", required=True, help="inventory file or folder")
    status.add_argument("-l", "--limit", help="only these hosts or groups")
    status.add_argument("--vault-password-file", action="append", default=[], metavar="FILE")
    status.add_argument("-J", "--ask-vault-pass", action="store_true", help="ask for the vault password")
    status.add_argument("--json", action="store_true", help="print the reports as one JSON object")
    status.set_defaults(func=cmd_status)

    bench = sub.add_parser(
        "bench",
        help="streaming load against an OpenAI-compatible endpoint: TTFT, TPOT, ITL percentiles, throughput",
    )
    from gpufleet import bench as _bench

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
    return parser


def _playbook_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--vault-password-file", action="append", default=[], metavar="FILE")
    p.add_argument("-J", "--ask-vault-pass", action="store_true", help="ask for the vault password")
    p.add_argument("-v", "--verbose", action="count", default=0, help="raw Ansible output (-vv and more: verbose)")
    p.add_argument("--json", action="store_true", help="print one JSON object: per-host counts, failures, rc, log")


def _request(args: argparse.Namespace, playbook: str):
    from gpufleet.runner import RunRequest, parse_extravars

    extravars, extravar_files = parse_extravars(args.extra_vars)
    return RunRequest(
        playbook=playbook,
        inventory=args.inventory,
        limit=args.limit,
        tags=getattr(args, "tags", None),
        skip_tags=getattr(args, "skip_tags", None),
        check=getattr(args, "check", False),
        diff=getattr(args, "diff", False),
        extravars=extravars,
        extravar_files=extravar_files,
        vault_password_files=args.vault_password_file,
        ask_vault_pass=args.ask_vault_pass,
        verbose=args.verbose,
        json=args.json,
    )


def cmd_deploy(args: argparse.Namespace) -> int:
    from gpufleet.runner import UsageError, run_playbook

    try:
        return run_playbook(_request(args, "site"))
    except UsageError as exc:
        print("gpufleet: %s" % exc, file=sys.stderr)
        return 2


def cmd_rollout(args: argparse.Namespace) -> int:
    from gpufleet.runner import UsageError, run_playbook

    try:
        req = _request(args, "rollout")
        if args.batch is not None:
            if not re.fullmatch(r"[1-9][0-9]*%?", args.batch) or (
                args.batch.endswith("%") and int(args.batch[:-1]) > 100
            ):
                raise UsageError("--batch %s: give a host count like 2 or a percentage like 25%%" % args.batch)
            req.extravars["gpufleet_rollout_batch"] = args.batch if args.batch.endswith("%") else int(args.batch)
        if args.driver:
            req.extravars["gpufleet_rollout_driver"] = True
        return run_playbook(req)
    except UsageError as exc:
        print("gpufleet: %s" % exc, file=sys.stderr)
        return 2


def cmd_status(args: argparse.Namespace) -> int:
    from gpufleet.runner import RunRequest, run_status

    return run_status(
        RunRequest(
            playbook="status",
            inventory=args.inventory,
            limit=args.limit,
            vault_password_files=args.vault_password_file,
            ask_vault_pass=args.ask_vault_pass,
            json=args.json,
        )
    )


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
    parser = build_parser()
    args = parser.parse_args(argv)
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
