"""site.yml's serving-fleet guard (playbooks/tasks/serving_guard.yml), run by the real
ansible-playbook against three local hosts (two gpu hosts, one edge).

What each host would restart is given as the fact the guard's block sets on a real host
(`__guard_serving_restarts`, the instances that run now and whose files this run changes);
the block itself (systemctl, the engine role's check-mode compare) runs in the fleet lab,
which refuses site.yml with a restart of its serving engines. Here: the refusal stops every
host before the next play, names each host's instances and the rollout, hands the CLI a
record, and the opt-out and check mode go on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_play_then_mark

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, restarts, *extra):
    guard = {
        "name": "The guard as site.yml's preflight play runs it",
        "hosts": "gpu_hosts:edge",
        "gather_facts": False,
        "any_errors_fatal": True,
        "tasks": [
            {
                "name": "What the block found here",
                "ansible.builtin.set_fact": {"__guard_serving_restarts": "{{ __restarts }}"},
                "when": "__restarts is defined",
            },
            {
                "name": "The guard",
                "ansible.builtin.import_tasks": str(ROOT / "playbooks/tasks/serving_guard.yml"),
                "vars": {"__guard_gpu_host": "{{ inventory_hostname in groups['gpu_hosts'] }}"},
            },
        ],
    }
    found = {host: "__restarts='%s'" % json.dumps(names) for host, names in restarts.items()}
    return run_play_then_mark(tmp_path, guard, found, extra)


def test_a_restart_of_serving_engines_stops_every_host_and_names_the_rollout(tmp_path):
    proc, went_on = _run(tmp_path, {"lab-a": ["tiny", "big"], "lab-b": []}, "-v")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and went_on == []
    assert "site.yml would restart or stop engines that serve traffic" in out
    assert "lab-a (tiny, big)" in out and "lab-b (" not in out
    assert "gpufleet rollout -i" in out and "gpufleet_site_restarts=allow" in out
    # the record the CLI prints (runner.py reads gpufleet_preflight_problems)
    facts = out[out.index("TASK [Hand the refusal over as a record]") : out.index("TASK [Stop before any change")]
    assert "gpufleet_preflight_problems" in facts and re.search(r"\brole\W+site\b", facts)


@pytest.mark.parametrize(
    ("restarts", "extra"),
    [
        ({"lab-a": [], "lab-b": []}, ()),  # serving, nothing of theirs restarts
        ({}, ()),  # a bare fleet: nothing runs
        ({"lab-a": ["tiny"]}, ("-e", "gpufleet_site_restarts=allow")),  # a maintenance window
        ({"lab-a": ["tiny"]}, ("--check",)),  # check mode says so and goes on
    ],
    ids=["nothing-restarts", "bare", "allowed", "check-mode"],
)
def test_the_run_goes_on(tmp_path, restarts, extra):
    proc, went_on = _run(tmp_path, restarts, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert went_on == ([] if "--check" in extra else ["lab-a", "lab-b", "lab-edge"])
    assert ("The real run would stop here" in proc.stdout) == ("--check" in extra)


def test_a_wrong_value_names_the_variable(tmp_path):
    proc, went_on = _run(tmp_path, {}, "-e", "gpufleet_site_restarts=yes")
    assert proc.returncode != 0 and went_on == []
    assert "gpufleet_site_restarts=yes is not one of refuse" in proc.stdout
