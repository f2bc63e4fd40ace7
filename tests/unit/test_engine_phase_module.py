"""engine_phase module: cases as data (the calls it makes, what each returns, the result), on the real
vLLM CPU log in tests/fixtures/engine_logs/; and once through its real shell pipeline with a
stand-in for the docker CLI (a test double: it prints the captured log), which shows the byte cap."""

from __future__ import annotations

import json
import re
import time

import pytest
from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes
from test_engine_phase import EAGER, LOGS

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_phase import docker_time
from ansible_collections.gpufleet.serving.plugins.modules import engine_phase

DOCKER = "/usr/bin/docker"
TEXT = (LOGS / EAGER).read_text()
# the container's start, as `docker inspect` gave it when the log was captured (the fixture's header)
STARTED = re.search(r"^#~ started_at: (\S+)", TEXT, re.M).group(1)
LOG = "".join(line for line in TEXT.splitlines(keepends=True) if not line.startswith("#~"))


def _later(seconds):
    """A Docker timestamp `seconds` after STARTED."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(int(docker_time(STARTED)) + seconds))


def _inspect(container):
    return (DOCKER, "inspect", "-f", "{{.State.Running}} {{.State.StartedAt}}", container)


def _logs(container, cap=4194304):
    return ("/bin/sh", "-c", engine_phase.READ_LOG, "engine_phase", DOCKER, container, str(cap))


class _Exit(Exception):
    pass


def _run(monkeypatch, params, calls, check_mode=False):
    made = []

    def run_command(self, argv, **kwargs):
        made.append(tuple(argv))
        return calls[tuple(argv)]

    def exit_json(self, **result):
        raise _Exit(result)

    def fail_json(self, **result):
        raise AssertionError("module failed: %s" % result)

    args = dict(params, _ansible_check_mode=check_mode)
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args})))
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: DOCKER)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    with pytest.raises(_Exit) as done:
        engine_phase.main()
    return made, done.value.args[0]


def _deployed(tmp_path, name, engine):
    (tmp_path / name).mkdir()
    (tmp_path / name / "deployed.json").write_text(json.dumps({"name": name, "engine": engine}))


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
def test_a_running_instance_a_stopped_one_and_a_missing_one(monkeypatch, tmp_path, check_mode):
    _deployed(tmp_path, "chat", "vllm")
    calls = {
        _inspect("gpufleet-chat"): (0, "true %s\n" % STARTED, ""),
        _logs("gpufleet-chat"): (0, LOG, ""),
        _inspect("gpufleet-old"): (0, "false 0001-01-01T00:00:00Z\n", ""),
        _inspect("gpufleet-gone"): (1, "", "Error: No such object: gpufleet-gone\n"),
    }
    params = {"names": ["chat", "old", "gone"], "config_dir": str(tmp_path)}
    made, result = _run(monkeypatch, params, calls, check_mode)
    # read-only, the same in check mode; a container that does not run has no log read
    assert made == [_inspect("gpufleet-chat"), _logs("gpufleet-chat"), _inspect("gpufleet-old"),
                    _inspect("gpufleet-gone")]  # fmt: skip
    assert result["changed"] is False
    chat, old, gone = (result["phases"][n] for n in ("chat", "old", "gone"))
    assert chat["running"] is True and chat["engine"] == "vllm" and chat["problem"] is None
    assert chat["phase"] == "serving" and chat["ready_s"] > 0 and chat["started_at"] == STARTED
    assert chat["summary"].startswith("serving after ")
    assert old["running"] is False and old["phase"] is None and old["problem"] == "container gpufleet-old does not run"
    assert gone["running"] is False and "No such object" in gone["problem"]
    # without a deployed.json: the registry's default engine
    assert old["engine"] == "vllm"


def test_the_surge_copy_and_the_engine_from_deployed_json(monkeypatch, tmp_path):
    _deployed(tmp_path, "chat", "sglang")
    calls = {
        _inspect("gpufleet-chat-surge"): (0, "true %s\n" % STARTED, ""),
        _logs("gpufleet-chat-surge", 1000): (0, "%s [x] Load weight begin.\n" % _later(5), ""),
    }
    params = {"names": ["chat"], "config_dir": str(tmp_path), "surge": True, "max_bytes": 1000}
    _, result = _run(monkeypatch, params, calls)
    chat = result["phases"]["chat"]
    assert chat["engine"] == "sglang" and chat["container"] == "gpufleet-chat-surge"
    assert chat["phase"] == "loading weights"
    assert chat["phases"][1]["start_s"] == pytest.approx(5.0 - (docker_time(STARTED) % 1), abs=0.05)


def test_through_the_real_shell_with_a_docker_stand_in(monkeypatch, tmp_path):
    """The module's own pipeline (sh, docker logs | head -c) runs for real; docker is a STAND-IN
    (test double) that prints the captured log on `logs` and the start time on `inspect`."""
    log = tmp_path / "engine.log"
    log.write_text(LOG)
    docker = tmp_path / "docker"
    docker.write_text(
        '#!/bin/sh\ncase "$1" in\n  inspect) echo "true %s" ;;\n  logs) cat %s ;;\nesac\n' % (STARTED, log)
    )
    docker.chmod(0o755)
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "names": ["chat"], "config_dir": str(tmp_path), "max_bytes": 4000}})))  # fmt: skip
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: str(docker))

    def exit_json(self, **result):
        raise _Exit(result)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    with pytest.raises(_Exit) as done:
        engine_phase.main()
    chat = done.value.args[0]["phases"]["chat"]
    # 4000 bytes of a 30 kB log: the banner and the first lines, no phase line yet
    assert chat["running"] is True and chat["phase"] == "initializing"
    assert chat["line"] is None and chat["elapsed_s"] > 0
