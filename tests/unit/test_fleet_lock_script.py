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
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no scratch file left


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
