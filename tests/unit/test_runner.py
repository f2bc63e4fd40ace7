"""gpufleet deploy / rollout: the ansible-runner call a command makes, the live view built from
runner events, and the sentences a failed run ends with. ansible_runner.run is replaced by a
fake that replays event sequences shaped like ansible-runner 2.4's (the real runs are covered
by the fleet scenario, molecule/fleet, and the lab tests in tests/labtests)."""

from __future__ import annotations

import io
import json
import re
import sys
import types
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from gpufleet import cli, runner
from gpufleet._collection import locate_collection


def _task(name, path="/x/roles/engine/tasks/main.yml:1"):
    return {"event": "playbook_on_task_start", "event_data": {"task": name, "task_path": path}}


def _play(name):
    return {"event": "playbook_on_play_start", "event_data": {"play": name}}


def _ok(host, changed=False):
    return {"event": "runner_on_ok", "event_data": {"host": host, "res": {"changed": changed}}}


def _failed(host, task, msg, path="/x/roles/engine/tasks/main.yml:1", **res):
    return {
        "event": "runner_on_failed",
        "event_data": {"host": host, "task": task, "task_path": path, "res": {"failed": True, "msg": msg, **res}},
    }


NOT_READY = (
    "/health at http://127.0.0.1:8001 did not answer 200 within 600 s "
    "(last: Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>). "
    "See journalctl -u gpufleet-engine@chat."
)


def _record(host, fact, value):
    """The event of a set_fact that hands the CLI a record (readiness.yml, preflight.yml)."""
    return {"event": "runner_on_ok", "event_data": {"host": host, "res": {"ansible_facts": {fact: value}}}}


def _not_ready(host, instance, message=NOT_READY):
    return _record(host, "gpufleet_readiness", {"instance": instance, "ready": False, "message": message})


def _stats(**per_host):
    data = {"ok": {}, "changed": {}, "failures": {}, "dark": {}, "skipped": {}}
    for host, (ok, changed, failed) in per_host.items():
        data["ok"][host], data["changed"][host], data["failures"][host] = ok, changed, failed
    return {"event": "playbook_on_stats", "event_data": data}


class FakeRunner:
    """Stands in for ansible_runner.run: records its arguments, replays events, returns rc."""

    def __init__(self, events, rc=0, status="successful"):
        self.events, self.rc, self.status, self.kwargs = events, rc, status, None

    def __call__(self, event_handler=None, **kwargs):
        self.kwargs = kwargs
        for event in self.events:
            event_handler(event)
        return types.SimpleNamespace(rc=self.rc, status=self.status, config=types.SimpleNamespace(ident="run-1"))


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    import ansible_runner

    def install(events, rc=0, status="successful"):
        f = FakeRunner(events, rc, status)
        monkeypatch.setattr(ansible_runner, "run", f)
        return f

    return install


def test_extravars_pairs_files_and_json(tmp_path):
    f = tmp_path / "vars.yml"
    f.write_text("$ANSIBLE_VAULT;1.1;AES256\n6161\n")  # handed to ansible-playbook, never parsed here
    data, files = runner.parse_extravars(["a=1 b=two", "msg='a b'", "@%s" % f, '{"c": {"d": true}}'])
    assert data == {"a": "1", "b": "two", "msg": "a b", "c": {"d": True}}
    assert files == [str(f)]
    with pytest.raises(runner.UsageError, match="KEY=VALUE"):
        runner.parse_extravars(["novalue"])
    with pytest.raises(runner.UsageError, match="no such file"):
        runner.parse_extravars(["@%s" % (tmp_path / "missing.yml")])


def test_runner_call_for_deploy_check_diff_and_vault(tmp_path):
    coll = locate_collection()
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    vault = tmp_path / "vault.txt"
    vault.write_text("pw\n")
    req = runner.RunRequest(
        playbook="site", inventory=str(inv), limit="gpu_hosts", tags="preflight", check=True, diff=True,
        extravars={"x": 1}, extravar_files=[str(vault)], vault_password_files=[str(vault)],
    )  # fmt: skip
    kw = runner.runner_kwargs(req, coll, tmp_path / "runs")
    assert kw["playbook"] == str(coll.root / "playbooks" / "site.yml")
    assert kw["inventory"] == str(inv) and kw["limit"] == "gpu_hosts" and kw["tags"] == "preflight"
    assert kw["cmdline"] == "--check --diff --vault-password-file %s -e @%s" % (vault, vault)
    assert kw["extravars"] == {"x": 1} and kw["quiet"] is True
    env = kw["envvars"]
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(":")[0] == str(coll.collections_path)
    with pytest.raises(runner.UsageError, match="no such inventory"):
        runner.runner_kwargs(runner.RunRequest(playbook="site", inventory=str(tmp_path / "nope")), coll, tmp_path)


def test_user_ansible_settings_win(tmp_path):
    coll = locate_collection()
    cfg = tmp_path / "my.cfg"
    cfg.write_text("[defaults]\nhost_key_checking = false\n")
    env = runner.settings_env(coll, {"PATH": "/bin", "ANSIBLE_FORKS": "3", "ANSIBLE_CONFIG": str(cfg)})
    assert "ANSIBLE_FORKS" not in env  # inherited unchanged
    assert env["ANSIBLE_CONFIG"] == str(cfg)  # their file, by its absolute path
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "False"  # what their configuration says
    # named relative to where gpufleet runs: still their file (ansible-playbook starts elsewhere)
    env = runner.settings_env(coll, {"PATH": "/bin", "ANSIBLE_CONFIG": "my.cfg"}, cwd=str(tmp_path))
    assert env["ANSIBLE_CONFIG"] == str(cfg)
    env = runner.settings_env(coll, {"PATH": "/bin", "HOME": str(tmp_path)}, cwd=str(tmp_path))
    assert env["ANSIBLE_CONFIG"] == str(coll.root / "ansible.cfg")  # a checkout's own settings


def test_the_users_ansible_cfg_is_in_force_and_gpufleet_fills_only_what_it_leaves_unset(tmp_path):
    """A folder with the user's ansible.cfg (forks 3, a bastion in ssh_args): ansible-playbook
    started by ansible-runner elsewhere still reads it, its settings stand, gpufleet's defaults
    fill the rest; ansible-config (real) reports the result. -v names it."""
    import subprocess

    coll = locate_collection()
    project = tmp_path / "project"
    project.mkdir()
    cfg = project / "ansible.cfg"
    cfg.write_text(
        "[defaults]\nforks = 3\ncollections_path = ./colls\n\n"
        "[ssh_connection]\nssh_args = -o ProxyJump=admin@bastion.lan\n"
    )
    env = runner.settings_env(coll, {"PATH": "/bin", "HOME": str(tmp_path)}, cwd=str(project))
    assert env["ANSIBLE_CONFIG"] == str(cfg.resolve())
    assert "ANSIBLE_FORKS" not in env and "ANSIBLE_SSH_ARGS" not in env  # theirs
    assert env["ANSIBLE_PIPELINING"] == "true" and env["ANSIBLE_GATHERING"] == "smart"  # unset there: gpufleet's
    # its collections path (resolved against its folder) after gpufleet's own copy
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(":") == [str(coll.collections_path), str(project / "colls")]
    dump = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-config"), "dump", "--only-changed", "-t", "all"],
        env={**env, "HOME": str(tmp_path), "ANSIBLE_NOCOLOR": "1"}, cwd=str(tmp_path), capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
    assert re.search(r"DEFAULT_FORKS\(%s\) = 3" % re.escape(str(cfg.resolve())), dump), dump
    assert "ProxyJump=admin@bastion.lan" in dump and "PreferredAuthentications" not in dump
    assert re.search(r"pipelining\(env: ANSIBLE_PIPELINING\) = True", dump, re.I), dump
    line = runner.describe_config(env, {"PATH": "/bin"})
    assert line.startswith("gpufleet: Ansible configuration %s;" % cfg.resolve()) and "pipelining=true" in line
    assert "forks=" not in line
    # ~/.ansible.cfg when the folder has none; a world-writable folder's file is skipped, as Ansible does
    (tmp_path / ".ansible.cfg").write_text("[defaults]\ngathering = explicit\n")
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "ansible.cfg").write_text("[defaults]\nforks = 1\n")
    env = runner.settings_env(coll, {"PATH": "/bin", "HOME": str(tmp_path)}, cwd=str(open_dir))
    assert env["ANSIBLE_CONFIG"] == str((tmp_path / ".ansible.cfg").resolve())
    assert "ANSIBLE_GATHERING" not in env and env["ANSIBLE_FORKS"] == "20"
    # gpufleet's own defaults never force key-only logins: -k passwords work
    assert "PreferredAuthentications" not in runner.DEFAULT_SETTINGS["ANSIBLE_SSH_ARGS"]
    assert "PreferredAuthentications" not in (coll.root / "ansible.cfg").read_text()


def test_the_environment_ansible_runner_builds_keeps_host_keys_checked_and_our_fact_cache(tmp_path):
    # ansible-runner turns host key checking off and moves the fact cache into the run unless told
    from ansible_runner.config.runner import RunnerConfig

    coll = locate_collection()
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    (tmp_path / "run").mkdir()
    kw = runner.runner_kwargs(runner.RunRequest(playbook="site", inventory=str(inv)), coll, tmp_path / "run")
    config = RunnerConfig(**{k: v for k, v in kw.items() if k != "quiet"})
    config.prepare()
    assert config.env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert config.env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] == str(coll.root / ".cache" / "facts")


def test_deploy_success_prints_per_host_counts(fake, tmp_path, capsys):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    f = fake(
        [
            _play("Engines"),
            _task("Install"),
            _ok("gpu-a", True),
            _ok("gpu-b"),
            _stats(**{"gpu-a": (9, 2, 0), "gpu-b": (9, 0, 0)}),
        ]
    )
    rc = cli.main(["deploy", "-i", str(inv), "-e", "engine_surge=never"])
    out = capsys.readouterr().out
    assert rc == 0 and f.kwargs["extravars"] == {"engine_surge": "never"}
    assert "Engines | Install" in out
    assert [line.split() for line in out.splitlines() if line.strip().startswith("gpu-a")][-1][:5] == [
        "gpu-a", "ok", "9", "changed", "2",
    ]  # fmt: skip
    assert "site finished (successful); full log: " in out and out.rstrip().endswith("run-1/stdout")


def test_failures_end_in_sentences_with_cause_fix_and_log(fake, tmp_path, capsys):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    events = [
        _play("Preflight every host before any change"),
        _task("Check the engine instances", "/c/roles/engine/tasks/preflight.yml:40"),
        _failed(
            "gpu-a",
            "Check the engine instances",
            "gpufleet_engines[0].port=8001 is already used; give each its own port",
            "/c/roles/engine/tasks/preflight.yml:40",
        ),
        {
            "event": "runner_on_unreachable",
            "event_data": {
                "host": "gpu-b",
                "task": "Gathering Facts",
                "res": {"unreachable": True, "msg": "ssh: timed out"},
            },
        },
        _play("Engines"),
        _not_ready("gpu-c", "chat"),
        _failed("gpu-c", "Check the readiness of chat", NOT_READY, "/c/roles/engine/tasks/readiness.yml:39"),
        _stats(**{"gpu-a": (3, 0, 1), "gpu-c": (20, 3, 1)}),
    ]
    fake(events, rc=2, status="failed")
    rc = cli.main(["deploy", "-i", str(inv)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "gpu-a failed the preflight (before any change in this run): gpufleet_engines[0].port=8001" in err
    assert "gpu-b is unreachable: ssh: timed out. Fix: check ansible_host" in err
    assert "gpu-c: engine instance chat never became ready (Check the readiness of chat): /health at " in err
    assert "journalctl -u gpufleet-engine@chat" in err
    assert "Full log: " in err and err.rstrip().endswith("run-1/stdout")


def _kinds(events):
    view = runner.RunView(out=io.StringIO(), quiet=True)
    for event in events:
        view.handle(event)
    return [(f.host, f.kind, f.instance) for f in view.failures]


def test_readiness_is_the_record_the_engine_role_hands_over_not_a_task_name():
    assert _kinds(
        [
            _play("Engines"),
            _ok("gpu-a", True),
            _not_ready("gpu-a", "chat"),
            _failed("gpu-a", "Check the readiness of chat", NOT_READY),
            # a ready record is no failure; the failure after it is a failed task
            _record("gpu-b", "gpufleet_readiness", {"instance": "chat", "ready": True, "message": ""}),
            _failed("gpu-b", "Check the readiness of chat", "something else"),
            # a record is read by the result that follows it only: a later failure is its own
            _not_ready("gpu-c", "chat"),
            _ok("gpu-c"),
            _failed("gpu-c", "Fail with what happened chat", "The restart of chat failed", "/c/r/restart.yml:101"),
            # the restart's rescue hands the record over again before its own failure
            _not_ready("gpu-e", "chat"),
            _failed("gpu-e", "Check the readiness of chat", NOT_READY),
            _ok("gpu-e"),
            _not_ready("gpu-e", "chat"),
            _failed("gpu-e", "Fail with what happened chat", "The restart of chat failed at ...", "/c/r/restart.yml:1"),
            # a task named like the readiness tasks, without the record, is just a failed task
            _failed("gpu-d", "Wait for /health of chat", "retries exhausted", "/c/roles/engine/tasks/readiness.yml:6"),
        ]
    ) == [("gpu-a", "readiness", "chat"), ("gpu-b", "task", ""), ("gpu-c", "task", ""),
          ("gpu-e", "readiness", "chat"), ("gpu-e", "readiness", "chat"), ("gpu-d", "task", "")]  # fmt: skip


def test_readiness_tasks_fail_only_in_the_check_after_the_record():
    tasks = yaml.safe_load((ROOT / "roles" / "engine" / "tasks" / "readiness.yml").read_text())
    *probes, record, check = tasks
    assert probes and all(task["failed_when"] is False for task in probes)
    assert probes[0]["until"] and probes[0]["retries"]  # the wait still retries
    fact = record["ansible.builtin.set_fact"][runner.READINESS_FACT]
    assert fact["instance"] == "{{ __engine_instance.name }}" and "did not answer 200" in fact["message"]
    # the check says in words what the record says
    assert check["ansible.builtin.assert"]["fail_msg"] == "{{ %s.message }}" % runner.READINESS_FACT
    assert check["ansible.builtin.assert"]["that"] == "%s.ready | bool" % runner.READINESS_FACT


def test_preflight_is_the_entry_point_not_the_play_name():
    spec_failed = _failed(
        "gpu-a",
        "Validating arguments against arg spec 'preflight' - Read-only checks of the NCCL layers",
        "Validation of arguments failed: argument 'nccl_env_host' is of type str",
        "/c/playbooks/site.yml:10",  # Ansible's own validation task: its path is the play's
        validate_args_context={"type": "role", "name": "nccl", "argument_spec_name": "preflight", "path": "/c/r"},
    )
    main_spec_failed = _failed(
        "gpu-b",
        "Validating arguments against arg spec 'main'",
        "Validation of arguments failed",
        "/c/playbooks/site.yml:60",
        validate_args_context={"type": "role", "name": "nccl", "argument_spec_name": "main", "path": "/c/r"},
    )
    assert _kinds(
        [
            _play("Anything"),
            spec_failed,
            main_spec_failed,
            _failed("gpu-c", "Check the instances", "port clash", "/c/roles/engine/tasks/preflight.yml:40"),
            _failed("gpu-d", "Check the layers", "bad", "/c/roles/common/tasks/preflight_nccl.yml:4"),
            _play("Preflight every host before any change"),
            _failed("gpu-e", "Gathering Facts", "no python"),  # the play's name does not make it preflight
        ]
    ) == [
        ("gpu-a", "preflight", ""),
        ("gpu-b", "task", ""),
        ("gpu-c", "preflight", ""),
        ("gpu-d", "preflight", ""),
        ("gpu-e", "task", ""),
    ]
    # after a host changed, the sentence "before any change" would be wrong: a plain failed task
    assert _kinds([_ok("gpu-a", True), spec_failed]) == [("gpu-a", "task", "")]


def test_ansible_output_is_echoed_from_the_events_with_plain_newlines():
    out = io.StringIO()
    view = runner.RunView(out=out, quiet=True, echo=True)
    for event in [
        {"event": "playbook_on_task_start", "stdout": "\r\nTASK [Show] ****", "event_data": {"task": "Show"}},
        {"event": "runner_on_start", "stdout": "", "event_data": {"host": "gpu-a"}},
        {"event": "runner_on_ok", "stdout": "ok: [gpu-a] => \r\n    msg: hi", "event_data": {"host": "gpu-a"}},
        {
            "event": "playbook_on_stats",
            "stdout": "\r\nPLAY RECAP ****\r\ngpu-a : ok=1    changed=0",
            "event_data": {"ok": {"gpu-a": 1}, "ignored": {"gpu-a": 2}, "rescued": {"gpu-a": 3}, "skipped": {}},
        },
    ]:
        view.handle(event)
    assert out.getvalue() == (
        "\nTASK [Show] ****\nok: [gpu-a] => \n    msg: hi\n\nPLAY RECAP ****\ngpu-a : ok=1    changed=0\n"
    )
    state = view.hosts["gpu-a"]
    assert (state.ok, state.ignored, state.rescued, state.skipped) == (1, 2, 3, 0)


def test_colour_is_off_unless_a_terminal_or_the_user_asks():
    coll = locate_collection()

    def nocolor(colour, **user):
        return runner.settings_env(coll, {"PATH": "/bin", **user}, colour=colour).get("ANSIBLE_NOCOLOR")

    assert nocolor(False) == "1" and nocolor(False, ANSIBLE_FORCE_COLOR="0") == "1"
    assert nocolor(False, ANSIBLE_FORCE_COLOR="1") is None and nocolor(False, NO_COLOR="1") is None
    assert nocolor(True) is None


def test_a_playbook_file_by_path(tmp_path):
    coll = locate_collection()
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    book = tmp_path / "floor.yml"
    book.write_text("[]\n")
    kw = runner.runner_kwargs(runner.RunRequest(playbook=str(book), inventory=str(inv)), coll, tmp_path)
    assert kw["playbook"] == str(book)
    with pytest.raises(runner.UsageError, match="no such file"):
        runner.runner_kwargs(runner.RunRequest(playbook=str(tmp_path / "x.yml"), inventory=str(inv)), coll, tmp_path)


def test_json_output_and_rollout_batch(fake, tmp_path, capsys):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    f = fake([_play("Roll"), _failed("gpu-a", "Apply the engines", "boom"), _stats(**{"gpu-a": (1, 0, 1)})], rc=2)
    rc = cli.main(["rollout", "-i", str(inv), "--batch", "25%", "--driver", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 2 and data["rc"] == 2 and data["playbook"] == "rollout"
    assert data["hosts"]["gpu-a"]["failed"] == 1
    assert data["failures"][0]["sentence"] == "gpu-a: task 'Apply the engines' failed: boom"
    assert f.kwargs["playbook"].endswith("playbooks/rollout.yml")
    assert f.kwargs["extravars"] == {"gpufleet_rollout_batch": "25%", "gpufleet_rollout_driver": True}
    assert cli.main(["rollout", "-i", str(inv), "--batch", "0"]) == 1  # bad input
    assert "--batch 0: give a host count" in capsys.readouterr().err


# --- ansible-playbook's options, passed through ---------------------------------------------


def _echoed(host):
    # a runner event as ansible-runner 2.4 gives it for --list-hosts output: Ansible's text in "stdout"
    return {"event": "verbose", "stdout": "    hosts (1):\r\n      %s" % host, "event_data": {}}


def test_options_gpufleet_does_not_own_reach_ansible_playbook_unchanged(fake, tmp_path, capsys):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    key = tmp_path / "id_ed25519"
    key.write_text("k")
    f = fake([_echoed("gpu-a")])
    argv = ["-u", "admin", "-b", "--private-key", str(key), "-f", "5", "-t", "engine", "--check", "-D",
            "--start-at-task", "Install Docker", "--list-hosts"]  # fmt: skip
    assert cli.main(["deploy", "-i", str(inv), *argv, "-l", "gpu-a"]) == 0
    out = capsys.readouterr().out
    assert f.kwargs["cmdline"] == " ".join(argv[:-3]) + " --start-at-task 'Install Docker' --list-hosts"
    assert f.kwargs["limit"] == "gpu-a"  # gpufleet's own option, wherever it stands
    assert "      gpu-a" in out.splitlines()  # a listing shows Ansible's own output, as ansible-playbook would
    # rollout and status take them too (rollout: --check, --tags; status: -e)
    fake([])
    assert cli.main(["rollout", "-i", str(inv), "--check", "--tags", "engine", "--batch", "2"]) == 0
    fake([])
    assert cli.main(["status", "-i", str(inv), "-e", "a=1", "-u", "admin", "-b"]) == 0


def test_v_is_ansibles_verbosity_and_shows_its_output(fake, tmp_path, capsys):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    f = fake([_echoed("gpu-a")])
    assert cli.main(["deploy", "-i", str(inv), "-v"]) == 0
    assert f.kwargs["cmdline"] == "-v"
    assert "      gpu-a" in capsys.readouterr().out.splitlines()
    f = fake([_echoed("gpu-a")])
    assert cli.main(["deploy", "-i", str(inv), "-bvvv"]) == 0
    assert f.kwargs["cmdline"] == "-bvvv"
    assert "      gpu-a" in capsys.readouterr().out.splitlines()
    f = fake([_echoed("gpu-a")])
    assert cli.main(["deploy", "-i", str(inv)]) == 0
    said = capsys.readouterr()
    assert "cmdline" not in f.kwargs and "      gpu-a" not in said.out.splitlines()
    assert "Ansible configuration" not in said.err
    # -v also names the configuration in force, on stderr: with --json too (status, deploy)
    fake([])
    assert cli.main(["status", "-i", str(inv), "--json", "-v"]) == 0
    assert "gpufleet: Ansible configuration " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["-u"], "argument -u/--user: expected one argument"),
        (["-f", "many"], "argument -f/--forks: invalid"),
        (["other.yml"], "other.yml: gpufleet runs its own playbook"),
        (["-bi", "x"], "-i inside -bi x: give -i as gpufleet's own option"),
    ],
)
def test_a_bad_passed_through_option_stops_before_the_run(fake, tmp_path, capsys, argv, said):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    f = fake([])
    assert cli.main(["deploy", "-i", str(inv), *argv]) == 1
    assert said in capsys.readouterr().err
    assert f.kwargs is None  # nothing ran


def test_passwords_asked_here_answer_ansible_playbooks_own_prompts(fake, tmp_path, monkeypatch):
    import re

    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    asked = []
    monkeypatch.setattr(runner.getpass, "getpass", lambda prompt: asked.append(prompt) or "pw-%d" % len(asked))
    f = fake([])
    assert cli.main(["deploy", "-i", str(inv), "-bK", "-J", "--vault-id", "prod@prompt"]) == 0
    assert asked == ["BECOME password: ", "Vault password: ", "Vault password (prod): "]
    passwords = f.kwargs["passwords"]
    # the prompts as ansible-core 2.19 prints them (ansible/cli/__init__.py)
    for prompt, answer in (
        ("BECOME password: ", "pw-1"), ("Vault password: ", "pw-2"), ("Vault password (prod): ", "pw-3"),
    ):  # fmt: skip
        matched = [a for pattern, a in passwords.items() if re.search(pattern, prompt.rstrip())]
        assert matched == [answer], (prompt, passwords)
    asked.clear()
    f = fake([])
    assert cli.main(["deploy", "-i", str(inv), "-k", "--ask-become-pass"]) == 0
    assert asked == ["SSH password: ", "BECOME password[defaults to SSH password]: "]
    assert sorted(f.kwargs["passwords"].values()) == ["pw-1", "pw-2"]


def test_no_password_at_the_prompt_runs_nothing(fake, tmp_path, monkeypatch, capsys):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")

    def closed(prompt):
        raise EOFError  # Ctrl-D, or no terminal and nothing on stdin

    monkeypatch.setattr(runner.getpass, "getpass", closed)
    f = fake([])
    assert cli.main(["deploy", "-i", str(inv), "-K"]) == 1
    assert "no password given; nothing ran" in capsys.readouterr().err and f.kwargs is None


def test_commands_that_run_no_playbook_refuse_unknown_options(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["plan", "--model", "x", "--gpu-memory-gib", "24", "--become"])
    assert exited.value.code == 1 and "unrecognized arguments: --become" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["gpu", "show"])  # argparse's own usage error is bad input too: 1
    assert exited.value.code == 1 and "the following arguments are required: folder" in capsys.readouterr().err


def test_live_view_redraws_in_place():
    out = io.StringIO()
    view = runner.RunView(out=out, live=True)
    view.handle(_play("Engines"))
    view.draw(force=True)
    view.handle(_ok("gpu-a", True))
    view.draw(force=True)
    text = out.getvalue()
    assert "\x1b[" in text and "F" in text  # cursor moved up to redraw
    assert view.lines()[1].split()[:5] == ["gpu-a", "ok", "1", "changed", "1"]


def test_each_run_gets_its_own_private_folder_and_its_inputs_are_removed(fake, tmp_path, monkeypatch):
    # ansible-runner reads env/cmdline and env/extravars of its private folder when a run gives
    # none: a --check run must not turn the next run into a check run
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    f = fake([])
    seen = []

    def record(event_handler=None, **kwargs):
        env = Path(kwargs["private_data_dir"]) / "env"
        env.mkdir()
        (env / "cmdline").write_text(kwargs.get("cmdline", ""))
        seen.append(kwargs)
        return f(event_handler=event_handler, **kwargs)

    import ansible_runner

    monkeypatch.setattr(ansible_runner, "run", record)
    assert cli.main(["deploy", "-i", str(inv), "--check", "-e", "k=secret"]) == 0
    assert cli.main(["deploy", "-i", str(inv)]) == 0
    first, second = (Path(k["private_data_dir"]) for k in seen)
    assert first != second and "cmdline" not in seen[1]
    assert not (first / "env").exists() and not (second / "env").exists()


def test_the_defaults_for_an_installed_copy_are_settings_ansible_knows(tmp_path):
    # an installed copy has no ansible.cfg: these environment variables stand in for it
    from ansible.config.manager import ConfigManager

    manager = ConfigManager()
    core = {e["name"] for d in manager._base_defs.values() for e in (d.get("env") or [])}
    plugin_options = {"ANSIBLE_SSH_ARGS", "ANSIBLE_PIPELINING", "ANSIBLE_CALLBACK_RESULT_FORMAT"}
    assert set(runner.DEFAULT_SETTINGS) - plugin_options <= core
    coll = locate_collection()
    installed = type(coll)(root=coll.root, collections_path=coll.collections_path, packaged=True)
    # run from a folder without an ansible.cfg of the user's
    env = runner.settings_env(installed, {"PATH": "/bin"}, cwd=str(tmp_path))
    assert env["ANSIBLE_CACHE_PLUGIN"] == "jsonfile" and "ANSIBLE_CONFIG" not in env
    # where a user's ansible.cfg sets each default: as ansible-core's own configuration says
    for name, places in runner.SETTING_INI.items():
        defs = [d for d in manager._base_defs.values() if name in [e["name"] for e in d.get("env") or []]]
        if name not in plugin_options:
            assert len(defs) == 1 and set(places) == {(i["section"], i["key"]) for i in defs[0].get("ini") or []}, name


def test_an_unreachable_delegated_host_is_named_not_the_play_host():
    # the rollout's drain runs on the edge (delegate_to) from a gpu host's play: the edge is the
    # host that could not be reached
    events = [
        _play("Roll host by host"),
        {
            "event": "runner_on_unreachable",
            "event_data": {
                "host": "gpu-a",
                "task": "Write the backend list with the drained hosts down",
                "res": {
                    "unreachable": True,
                    "msg": "ssh: connect to host edge-1 port 22: Connection refused",
                    "_ansible_delegated_vars": {"ansible_delegated_host": "edge-1", "ansible_host": "10.0.0.9"},
                },
            },
        },
    ]
    view = runner.RunView(out=io.StringIO(), quiet=True)
    for event in events:
        view.handle(event)
    sentence = view.failures[0].sentence()
    assert sentence.startswith(
        "edge-1 is unreachable (task 'Write the backend list with the drained hosts down' of gpu-a"
    )
    assert "for edge-1 in the inventory" in sentence and "gpu-a is unreachable" not in sentence


SLOW_PLAYBOOK = """\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Mark that the play runs
      ansible.builtin.copy: {content: "{{ lookup('ansible.builtin.pipe', 'echo $PPID') }}", dest: "%s"}
    - name: A long task
      ansible.builtin.command: sleep 120
"""


def test_sigterm_stops_ansible_playbook_at_once(tmp_path):
    """`gpufleet` cancelled with SIGTERM: its ansible-playbook (a real one, on localhost) is gone
    within seconds, not left to run on its own; the exit status says which signal."""
    import os
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "playing"
    book = tmp_path / "slow.yml"
    book.write_text(SLOW_PLAYBOOK % marker)
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    localhost: {ansible_python_interpreter: %s}\n" % sys.executable)
    script = (
        "import sys; from gpufleet import runner; "
        "req = runner.RunRequest(playbook=%r, inventory=%r); "
        "sys.exit(runner.play(req).rc)" % (str(book), str(inv))
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 90
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), proc.communicate(timeout=30)
    time.sleep(1)  # the sleep task is running now

    def playbooks():
        out = subprocess.run(["pgrep", "-f", "ansible-playbook.*%s" % book], capture_output=True, text=True)
        return out.stdout.split()

    assert playbooks(), "ansible-playbook should be running"
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    while playbooks() and time.time() - sent < 10:
        time.sleep(0.2)
    gone_after = time.time() - sent
    assert not playbooks(), "ansible-playbook still runs %.0f s after SIGTERM" % gone_after
    assert gone_after < 5
    assert proc.returncode == 128 + signal.SIGTERM
    assert "SIGTERM: ansible-playbook was stopped at once" in err.decode()


def test_a_hosts_collected_preflight_problems_are_one_sentence():
    # playbooks/tasks/preflight.yml notes each role's problem (rescued), then fails the host once
    events = [
        _play("Preflight every host before any change"),
        _failed("gpu-a", "Validating arguments against arg spec preflight", "unknown key 'contxt_length'",
                "/c/roles/engine/tasks/preflight.yml:1", validate_args_context={"argument_spec_name": "preflight"}),
        _failed("gpu-a", "Check the proxy settings", "proxy_rate_limit='20/s' must be like 20r/s",
                "/c/roles/proxy/tasks/preflight.yml:14"),
        _record("gpu-a", "gpufleet_preflight_problems", [
            {"role": "engine", "message": "unknown key 'contxt_length'"},
            {"role": "proxy", "message": "proxy_rate_limit='20/s' must be like 20r/s"}]),
        _failed("gpu-a", "Stop before any change when an input is wrong",
                "unknown key 'contxt_length' proxy_rate_limit='20/s' must be like 20r/s",
                "/c/playbooks/tasks/preflight.yml:16"),
    ]  # fmt: skip
    view = runner.RunView(out=io.StringIO(), quiet=True)
    for event in events:
        view.handle(event)
    assert [(f.host, f.kind) for f in view.failures] == [("gpu-a", "preflight")]
    # the records reach --json as they were handed over, with their host
    assert view.failures[0].problems == [
        {"host": "gpu-a", "role": "engine", "message": "unknown key 'contxt_length'"},
        {"host": "gpu-a", "role": "proxy", "message": "proxy_rate_limit='20/s' must be like 20r/s"}]  # fmt: skip
    assert view.summary()["failures"][0]["problems"] == view.failures[0].problems
    assert view.failures[0].sentence() == (
        "gpu-a failed the preflight (before any change in this run): unknown key 'contxt_length' "
        "proxy_rate_limit='20/s' must be like 20r/s"
    )


def test_a_run_without_the_community_collections_says_how_to_install_them(fake, tmp_path, monkeypatch, capsys):
    from gpufleet import _collection

    coll = locate_collection()
    assert _collection.dependencies(coll) == ["community.crypto", "community.docker", "community.general"]
    found = tmp_path / "cols"
    (found / "ansible_collections" / "community" / "docker").mkdir(parents=True)
    assert _collection.missing_dependencies(coll, str(found), search=[]) == ["community.crypto", "community.general"]
    assert _collection.missing_dependencies(coll, "", search=[str(found)]) == ["community.crypto", "community.general"]
    assert _collection.missing_dependencies(coll, "") == []  # this venv has them (the test extra)
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    monkeypatch.setattr(runner, "missing_dependencies", lambda *a: ["community.docker"])
    f = fake([])
    assert cli.main(["deploy", "-i", str(inv)]) == 1
    err = capsys.readouterr().err
    assert "the roles need community.docker, which Ansible does not find" in err
    assert "gpufleet collection install" in err and "pip install 'gpufleet[collections]'" in err
    assert f.kwargs is None  # nothing ran


def test_status_exits_2_while_a_restart_is_pending(fake, tmp_path, capsys):
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    engine = {"name": "chat", "engine": "vllm", "port": 8001, "serving": True, "unit": "active", "recorded": True}
    report = {"driver_version": "580.95.05", "nccl": "-", "engines": [dict(engine, restart_pending=True)]}
    event = {
        "event": "runner_on_ok",
        "event_data": {"host": "gpu-a", "res": {"ansible_facts": {"gpufleet_status": report}}},
    }
    fake([event])
    assert cli.main(["status", "-i", str(inv)]) == 2
    captured = capsys.readouterr()
    assert "RESTART PENDING" in captured.out and "restart pending (the settings shown are written" in captured.err
    report["engines"] = [dict(engine, restart_pending=False)]
    fake([event])
    assert cli.main(["status", "-i", str(inv)]) == 0


def test_models_takes_ansible_playbooks_options_as_its_help_says(fake, tmp_path):
    """`gpufleet models prune --check` says what would go (docs/models.md); before, the parser
    refused --check as an unrecognized argument (the fleet lab's full tier failed there)."""
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    f = fake([])
    cli.main(["models", "prune", "-i", str(inv), "--check", "-l", "gpu-a"])
    assert f.kwargs["playbook"].endswith("playbooks/models.yml")
    assert f.kwargs["cmdline"] == "--check" and f.kwargs["limit"] == "gpu-a"
    assert f.kwargs["extravars"]["gpufleet_models_action"] == "prune"
