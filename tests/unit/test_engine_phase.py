"""An engine's start phases read from its log (module_utils/_engine_phase.py, the registry's markers),
on real logs: vLLM 0.32's CPU engine started by the lab from the docker run arguments gpufleet renders
(compilation on, with a cold and a warm compile cache, and --enforce-eager), real vLLM GPU lines posted
on GitHub, and SGLang's startup log as its docs print it (tests/fixtures/engine_logs/README.md)."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import ENGINE_INFO, PHASES
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_phase import (
    docker_time,
    start_phases,
    summary,
)

LOGS = ROOT / "tests" / "fixtures" / "engine_logs"


def _log(name):
    """(log lines, the container's start time) of a fixture (its '#~ ' header holds started_at)."""
    text = (LOGS / name).read_text()
    started = re.search(r"^#~ started_at: (\S+)", text, re.M).group(1)
    return [line for line in text.splitlines() if not line.startswith("#~")], docker_time(started)


def _names(record):
    return [p["phase"] for p in record["phases"]]


def _seconds(record, phase):
    return sum(p["seconds"] for p in record["phases"] if p["phase"] == phase)


COLD = "vllm-0.32.0-cpu-compile-cold.log"
WARM = "vllm-0.32.0-cpu-compile-warm.log"
EAGER = "vllm-0.32.0-cpu-eager.log"


def test_docker_times():
    assert docker_time("2026-12-07T21:24:03.479507558Z") == pytest.approx(1796678643.479507558)
    assert docker_time("2026-12-07T21:24:03Z") == 1796678643
    # a container never started: Docker's zero time; and what is not a timestamp
    assert docker_time("0001-01-01T00:00:00Z") is None
    assert docker_time("(APIServer") is None and docker_time(None) is None


def test_a_cold_start_with_compilation_on():
    lines, started = _log(COLD)
    record = start_phases(lines, "vllm", started_at=started)
    assert _names(record) == ["initializing", "loading weights", "profiling memory", "compiling", "warming up",
                              "starting server", "serving"]  # fmt: skip
    assert record["phase"] == "serving" and record["phase_s"] is None
    # the phases add up to the start, and the start is the log's "Application startup complete"
    assert sum(p["seconds"] for p in record["phases"][:-1]) == pytest.approx(record["ready_s"], abs=0.3)
    complete = next(line for line in lines if "Application startup complete" in line)
    assert record["ready_s"] == pytest.approx(docker_time(complete.split(" ")[0]) - started, abs=0.1)
    # the compile is the biggest part of this start: vLLM's CPU runner logs its start and the saved artefact
    assert _seconds(record, "compiling") > 10
    assert not any(p["note"] for p in record["phases"])  # nothing loaded from a cache: it was empty
    assert record["summary"].startswith("serving after %.1f s: initializing " % record["ready_s"])


def test_a_warm_start_uses_the_cache_and_says_so():
    cold_lines, cold_start = _log(COLD)
    lines, started = _log(WARM)
    cold = start_phases(cold_lines, "vllm", started_at=cold_start)
    warm = start_phases(lines, "vllm", started_at=started)
    (compiling,) = [p for p in warm["phases"] if p["phase"] == "compiling"]
    # vLLM 0.32's CPU build cannot load its own AOT artefact (its compiled function has no
    # finalize_loading) and compiles again, from the Inductor cache in the same folder: faster
    assert "did not load" in compiling["note"]
    assert any("torch_compile_cache/torch_aot_compile/" in line and "/var/cache/gpufleet/vllm/" in line
               for line in lines)  # fmt: skip
    assert compiling["seconds"] < 0.7 * _seconds(cold, "compiling")


def test_an_eager_start_compiles_nothing():
    lines, started = _log(EAGER)
    record = start_phases(lines, "vllm", started_at=started)
    assert "compiling" not in _names(record)
    assert _names(record)[-1] == "serving"


def test_a_start_read_half_way_is_in_its_phase_for_so_long():
    lines, started = _log(COLD)
    begin = next(i for i, line in enumerate(lines) if "Warming up model for the compilation" in line)
    at = docker_time(lines[begin].split(" ")[0])
    record = start_phases(lines[: begin + 1], "vllm", started_at=started, now=at + 12.0)
    assert record["phase"] == "compiling" and record["phase_s"] == pytest.approx(12.0, abs=0.1)
    assert record["elapsed_s"] == pytest.approx(at + 12.0 - started, abs=0.1)
    assert record["ready_s"] is None
    assert "Warming up model for the compilation" in record["line"]
    assert summary(record).startswith("compiling for 12.0 s (up ")
    assert summary(record).endswith("compiling 12.0 s so far")
    # before any line that begins a phase: initializing, since the container started
    assert start_phases([], "vllm", started_at=started, now=started + 3)["phase_s"] == 3.0


def test_reading_stops_where_it_serves():
    lines, started = _log(EAGER)
    # what a serving engine logs on (requests) is never read
    lines += ['2026-12-07T23:00:00.000000000Z INFO:     127.0.0.1:35458 - "GET /health HTTP/1.1" 200 OK'] * 3
    served = next(i for i, line in enumerate(lines) if "Application startup complete" in line)
    read = []

    def log():
        for line in lines:
            read.append(line)
            yield line

    start_phases(log(), "vllm", started_at=started)
    assert len(read) == served + 1 < len(lines)


def test_sglang_from_the_log_its_docs_print():
    lines, _ = _log("sglang-docs-lora-llama-3.1-8b.log")
    record = start_phases(lines, "sglang")
    assert _names(record) == ["initializing", "loading weights", "profiling memory", "capturing graphs",
                              "starting server", "warming up", "serving"]  # fmt: skip
    # 15:24:15 (its first line here) to 15:24:41 ("fired up and ready to roll", after its warm-up request)
    assert record["ready_s"] == 26.0
    assert _seconds(record, "capturing graphs") == 1.0


def _gpu_lines():
    for line in (LOGS / "vllm-gpu-lines-from-issues.txt").read_text().splitlines():
        if not line.startswith("#~"):
            text, phase = line.rsplit(" => ", 1)
            yield pytest.param(text, phase, id=text[:60])


@pytest.mark.parametrize(("line", "phase"), list(_gpu_lines()))
def test_real_vllm_gpu_lines_begin_their_phase(line, phase):
    assert start_phases([line], "vllm")["phase"] == phase


def test_progress_bars_count_at_their_line():
    # tqdm redraws with carriage returns: Docker stores the redraws as one line or several
    bar = "2026-12-07T10:00:05.000000000Z \rCapturing CUDA graphs (decode, FULL):   6%|▌   | 2/35\rCapturing ..."
    record = start_phases(["2026-12-07T10:00:00.000000000Z start", bar], "vllm")
    assert _names(record) == ["initializing", "capturing graphs"]
    assert record["phases"][1]["start_s"] == 5.0


def test_the_registry_markers_name_known_phases_and_end_in_serving():
    for name, info in ENGINE_INFO.items():
        assert info.start_markers, name
        assert {m.phase for m in info.start_markers} <= set(PHASES), name
        assert "serving" in {m.phase for m in info.start_markers}, name
        assert "initializing" not in {m.phase for m in info.start_markers}, name  # the phase before any marker
