"""The gpufleet CLI skeleton: version, and GPU facts from a capture folder."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import FIXTURES, ROOT

from gpufleet import __version__, cli


def test_version_via_console_script_module():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from gpufleet.cli import main; sys.exit(main(['--version']))"],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("gpufleet %s (collection gpufleet.serving" % __version__)


def test_gpu_show_json_matches_module_facts(capsys):
    assert cli.main(["gpu", "show", str(FIXTURES / "2x_rtx5090_threadripper_pro"), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["count"] == 2
    assert facts["p2p"]["recommended"] is False
    assert facts["p2p"]["status"] == {"0,1": "GNS", "1,0": "GNS"}


def test_gpu_show_text(capsys):
    assert cli.main(["gpu", "show", str(FIXTURES / "8x_h100_sxm_nv18_12nic_numa_off")]) == 0
    out = capsys.readouterr().out
    assert "8 GPU(s)" in out
    assert "NCCL P2P: keep enabled (source: topology)" in out


def test_gpu_capture_roundtrip(tmp_path, capsys, monkeypatch):
    # nvidia-smi is hardware we lack: capture from the lab's stand-in, which replays a
    # real machine, and check the capture reads back to the same facts.
    standin = ROOT / "tests" / "lab" / "nvidia-smi-standin"
    machine = FIXTURES / "2x_rtx4090_threadripper_pro_wrx80"
    monkeypatch.setenv("GPUFLEET_NVIDIA_SMI_FIXTURE", str(machine))
    assert cli.main(["gpu", "capture", str(tmp_path), "--nvidia-smi", str(standin)]) == 0
    capsys.readouterr()
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["nvidia-smi.txt", "topo-m.txt"]  # that machine's capture has no CSV or p2p output
    assert cli.main(["gpu", "show", str(tmp_path), "--json"]) == 0
    from_capture = json.loads(capsys.readouterr().out)
    assert cli.main(["gpu", "show", str(machine), "--json"]) == 0
    from_fixture = json.loads(capsys.readouterr().out)
    assert from_capture == from_fixture
    assert from_capture["count"] == 2


def test_gpu_show_without_a_capture_is_bad_input(tmp_path, capsys):
    assert cli.main(["gpu", "show", str(tmp_path / "nonexistent")]) == 1
    assert "is not a folder; give a folder written by `gpufleet gpu capture`" in capsys.readouterr().err
    assert cli.main(["gpu", "show", str(tmp_path)]) == 1  # a folder, but no capture in it
    err = capsys.readouterr().err
    assert "holds none of the capture's files" in err and "query-gpu.csv" in err


def test_a_reader_that_goes_away_ends_the_output_quietly():
    # `gpufleet gpu show ... | head -c 0`: the reader is gone before the CLI (half a second of
    # imports) writes its first line
    script = "set -o pipefail; %s -m gpufleet.cli gpu show %s --json | head -c 0" % (
        sys.executable, FIXTURES / "8x_h100_sxm_nv18_12nic_numa_off",
    )  # fmt: skip
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=False,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell tool that meets a closed pipe ends
