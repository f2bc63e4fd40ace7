# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How an engine instance started, read from its log (private to gpufleet.serving): the phase it
is in (loading weights, compiling, capturing graphs, ...), since when, and how long each phase
before it took. The log lines that begin each phase are the engine registry's
(_engine_options.ENGINE_INFO[...].start_markers); the lines are those of `docker logs
--timestamps`, each led by the time Docker received it. Pure: the engine_phase module reads the
log and the container's start time on the host, `gpufleet status` and the rollout's readiness
print what this returns. Tested on real engine logs (tests/fixtures/engine_logs/).
"""

from __future__ import annotations

import calendar
import re
from typing import Iterable, List, Optional

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import (
    ENGINE_INFO,
    INSTANCE_DEFAULTS,
)

# Docker's timestamps (RFC 3339 in UTC, nanoseconds): the head of each `docker logs --timestamps`
# line and the form of `docker inspect`'s State.StartedAt.
_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?Z$")
# The phase before any marker: the container runs, the engine imports, parses and sets up its processes.
FIRST = "initializing"
LAST = "serving"
# The longest marker line kept in the answer (a vLLM config line runs to kilobytes).
LINE_CHARS = 240


def docker_time(text) -> Optional[float]:
    """Seconds since the epoch of a Docker timestamp (2026-12-07T21:24:03.479507558Z), None when
    the text is not one (Docker's zero time 0001-01-01T00:00:00Z, of a container never started,
    counts as none)."""
    match = _STAMP.match(text.strip()) if isinstance(text, str) else None
    if not match or match.group(1) == "0001":
        return None
    whole = calendar.timegm((*(int(g) for g in match.groups()[:6]), 0, 0, 0))
    fraction = match.group(7) or "0"
    return whole + int(fraction) / 10.0 ** len(fraction)


def _split(line: str):
    """(time or None, text) of one `docker logs --timestamps` line."""
    stamp, sep, rest = line.partition(" ")
    when = docker_time(stamp) if sep else None
    return (when, rest) if when is not None else (None, line)


def start_phases(lines: Iterable[str], engine: Optional[str] = None, started_at=None, now=None) -> dict:
    """The start of one engine instance from its log.

    lines: its `docker logs --timestamps` lines, in order (read lazily: reading stops at the
    line that says it serves); engine: the instance's engine (the registry's markers);
    started_at: when its container started (docker_time of State.StartedAt; None: the first
    timed line); now: the host's clock when the log was read (None: no time in the current phase).

    Returns {phase, note, phase_s (seconds in the current phase, None without `now`), elapsed_s
    (since the container started), ready_s (seconds from the start to serving, None while it
    starts), phases: [{phase, note, start_s, seconds}], line (the last marker's line), summary
    (one sentence)}. Progress bars (text after a carriage return) count as lines of their own, at
    the time of the line that holds them.
    """
    info = ENGINE_INFO.get(engine or INSTANCE_DEFAULTS["engine"]) or ENGINE_INFO[INSTANCE_DEFAULTS["engine"]]
    markers = [(m.text.lower(), m) for m in info.start_markers]
    base = started_at
    last_time = None
    entries: List[dict] = [{"phase": FIRST, "note": None, "at": base}]
    marker_line = None
    for raw in lines:
        when, text = _split(raw.rstrip("\n"))
        if when is not None:
            last_time = when
            if base is None:
                base = when
                entries[0]["at"] = when
        for segment in text.split("\r"):
            lowered = segment.lower()
            found = next((m for key, m in markers if key in lowered), None)
            if found is None:
                continue
            marker_line = segment.strip()[:LINE_CHARS]
            current = entries[-1]
            if found.phase != current["phase"]:
                entries.append({"phase": found.phase, "note": found.note or None, "at": last_time})
            elif found.note:
                current["note"] = found.note
        if entries[-1]["phase"] == LAST:
            break
    return _answer(entries, base, now, marker_line)


def _offset(at, base):
    return None if at is None or base is None else round(max(0.0, at - base), 1)


def _answer(entries, base, now, marker_line) -> dict:
    phases = []
    for i, entry in enumerate(entries):
        start = _offset(entry["at"], base)
        if i + 1 < len(entries):
            end = _offset(entries[i + 1]["at"], base)
        else:
            end = None if entry["phase"] == LAST else _offset(now, base)
        seconds = round(end - start, 1) if start is not None and end is not None else None
        phases.append({"phase": entry["phase"], "note": entry["note"], "start_s": start, "seconds": seconds})
    current = phases[-1]
    serving = current["phase"] == LAST
    out = {
        "phase": current["phase"],
        "note": current["note"],
        "phase_s": None if serving else current["seconds"],
        "elapsed_s": _offset(now, base),
        "ready_s": current["start_s"] if serving else None,
        "phases": phases,
        "line": marker_line,
    }
    out["summary"] = summary(out)
    return out


def _seconds(value) -> str:
    return "?" if value is None else "%.1f s" % value


def _part(entry) -> str:
    note = " (%s)" % entry["note"] if entry.get("note") else ""
    return "%s %s%s" % (entry["phase"], _seconds(entry["seconds"]), note)


def summary(record: dict) -> str:
    """One sentence: "serving after 43.5 s: initializing 13.6 s, loading weights 0.2 s, ..." or
    "compiling for 62.0 s (up 130.2 s): initializing 13.6 s, ... compiling 62.0 s so far"."""
    phases = record.get("phases") or []
    if record.get("phase") == LAST:
        return "serving after %s: %s" % (_seconds(record.get("ready_s")), ", ".join(_part(p) for p in phases[:-1]))
    done = ", ".join([_part(p) for p in phases[:-1]] + ["%s so far" % _part(phases[-1])] if phases else [])
    return "%s for %s (up %s): %s" % (record.get("phase"), _seconds(record.get("phase_s")),
                                      _seconds(record.get("elapsed_s")), done)  # fmt: skip
