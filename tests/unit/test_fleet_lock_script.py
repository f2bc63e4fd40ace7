"""The fleet lock's helper (roles/common/files/fleet-lock) run as the common role installs it:
the lock is created with its owner's line or not at all, the wait's deadline holds even over an
empty lock file, which is never taken over, and two runs at once get it exactly once."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import ROOT

HELPER = ROOT / "roles" / "common" / "files" / "fleet-lock"


def lock(*args, timeout=60):
    done = subprocess.run(["bash", str(HELPER), *args], capture_output=True, text=True, timeout=timeout, check=False)
    return done.returncode, done.stdout.strip()


def test_taken_with_its_owner_and_released(tmp_path):
    file = tmp_path / "fleet.lock"
    assert lock("acquire", str(file), "run-a", "0") == (0, "acquired")
    assert file.read_text() == "run-a\n"
    assert lock("acquire", str(file), "run-a", "0") == (0, "held")
    assert lock("acquire", str(file), "run-b", "0") == (3, "held by: run-a")
    assert lock("release", str(file), "run-b") == (0, "not held") and file.exists()
    assert lock("release", str(file), "run-a") == (0, "released") and not file.exists()
    # no scratch file left: only the guard that check-then-act steps lock (never removed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.lock.guard"]


def test_an_empty_lock_file_stops_at_the_deadline_and_is_not_taken_over(tmp_path):
    """Before: an empty file made every later run wait forever (the empty holder was retried
    before the deadline was checked)."""
    file = tmp_path / "fleet.lock"
    file.write_text("")
    start = time.monotonic()
    rc, out = lock("acquire", str(file), "run-b", "2", "", timeout=30)
    assert rc == 3 and out.startswith("held by: an empty lock file %s" % file), out
    assert time.monotonic() - start < 10
    # a stale holder named as empty does not make an empty file stale
    assert lock("acquire", str(file), "run-b", "0", "")[0] == 3
    assert file.read_text() == ""


def test_two_runs_at_once_get_it_once(tmp_path):
    file = tmp_path / "fleet.lock"
    for _ in range(10):
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda who: lock("acquire", str(file), who, "0"), ["run-a", "run-b"]))
        assert sorted(rc for rc, _ in results) == [0, 3], results
        winner = "run-a" if results[0][0] == 0 else "run-b"
        assert file.read_text() == winner + "\n"
        assert lock("release", str(file), winner) == (0, "released")


def test_two_runs_taking_over_one_stale_lock_get_it_once(tmp_path):
    """Issue 47: the takeover was check-then-move, and both runs said "acquired" in 54 of 300
    rounds. Each round: a lock left by a dead run, two runs taking it over at once."""
    file = tmp_path / "fleet.lock"
    dead = "controller=ci pid=1 start=1 user=ops playbook=site.yml"
    both = []
    for round_ in range(300):
        file.write_text(dead + "\n")
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda who: lock("acquire", str(file), who, "0", dead), ["run-a", "run-b"]))
        won = [who for who, (rc, _) in zip(["run-a", "run-b"], results, strict=True) if rc == 0]
        # exactly one says acquired, the lock names it, the other is told who holds it
        if len(won) != 1 or file.read_text() != won[0] + "\n" or (3, "held by: " + won[0]) not in results:
            both.append((round_, results, file.read_text()))
    assert both == [], "%d of 300 rounds did not end with exactly one holder: %s" % (len(both), both[:3])
    # the guard is the only file left beside the lock (no scratch copies)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.lock", "fleet.lock.guard"]
