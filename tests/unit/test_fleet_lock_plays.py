"""The fleet lock's plays as site.yml and the rollout write them, run by the real
ansible-playbook against three local hosts (two gpu hosts, one edge): a lock held by another
controller stops every host, not only the one that ran the lock's tasks.

The play under test is copied from the playbook itself; a marker play after it records each
host that went on. The lock file and its helper live in tmp_path (the role's vars, overridden
with -e), so nothing on this machine outside it is touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import run_play_then_mark

ROOT = Path(__file__).resolve().parents[2]
HOLDER = "controller=ci-runner-7 pid=4242 start=99 user=ops playbook=rollout.yml"


def _lock_play(playbook):
    plays = yaml.safe_load((ROOT / playbook).read_text())
    (play,) = [p for p in plays if p.get("name") == "Take the fleet lock"]
    return play


def _run(tmp_path, playbook, holder):
    lock = tmp_path / "lib" / "fleet.lock"
    lock.parent.mkdir()
    if holder:
        lock.write_text(holder + "\n")
    proc, went_on = run_play_then_mark(
        tmp_path, _lock_play(playbook),
        extra=("-e", "_common_libexec=%s" % (tmp_path / "libexec"), "-e", "_common_fleet_lock_file=%s" % lock),
    )  # fmt: skip
    return proc, went_on, lock


@pytest.mark.parametrize("playbook", ["playbooks/site.yml", "playbooks/rollout.yml"])
def test_a_held_lock_stops_every_host(tmp_path, playbook):
    proc, went_on, lock = _run(tmp_path, playbook, HOLDER)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Another run holds the fleet lock" in out and "pid=4242" in out, out
    # before the fix the first host stopped and the two others went on to change
    assert went_on == [], out
    assert lock.read_text() == HOLDER + "\n"


@pytest.mark.parametrize("playbook", ["playbooks/site.yml", "playbooks/rollout.yml"])
def test_a_free_lock_is_taken_and_every_host_goes_on(tmp_path, playbook):
    proc, went_on, lock = _run(tmp_path, playbook, None)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert went_on == ["lab-a", "lab-b", "lab-edge"], out
    assert "playbook=%s" % Path(playbook).name in lock.read_text()
