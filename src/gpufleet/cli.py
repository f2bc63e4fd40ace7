"""The gpufleet command line. Thin: the collection holds the logic; this is the front door."""

from __future__ import annotations

import argparse
import json
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
    return parser


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
