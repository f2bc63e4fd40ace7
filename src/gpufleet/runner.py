"""Every playbook gpufleet runs goes through here, over ansible-runner: `gpufleet deploy`,
`rollout`, `status`, the demo, `gpufleet lab test` and the fleet benchmark.

Thin on purpose: the playbooks hold every decision. This module turns a request into one
ansible-runner call, shows the run as a live per-host view built from runner events (or
Ansible's own output, which the events carry, with -v, or one JSON object with --json), and
ends a failed run with one sentence per failed host: what failed, why, what to do, and where
the full log is.

Failures are classified by the records the playbooks hand over, never by task names or by
reading a message back:
- readiness: roles/engine/tasks/readiness.yml sets the fact ``gpufleet_readiness`` ({instance,
  ready, message}) just before its check; a not-ready record followed by that host's failure
  is "the instance never became ready";
- preflight: playbooks/tasks/preflight.yml sets ``gpufleet_preflight_problems`` ([{role,
  message}], every problem of the host) just before it stops the host (they replace the single
  checks noted before them, and ``--json`` prints them as records), or Ansible's validation
  of a role's ``preflight`` argument-spec entry point failed (its result names the entry
  point), or a task of the entry point itself failed (its task path is a
  role's tasks/preflight.yml, or a preflight_*.yml it includes), while no host has changed
  yet in the run;
- unreachable: ansible-runner's own event.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import io
import json
import os
import re
import shlex
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpufleet._collection import Collection, locate_collection, missing_dependencies

# What a run gets where nothing else says otherwise: the user's own ANSIBLE_* variables win,
# then the user's ansible.cfg (found as ansible-playbook finds it: user_config()), setting by
# setting; a checkout without a user's file uses its own ansible.cfg (these match it).
# ssh_args leaves the authentication to Ansible's ssh plugin: it asks for keys only unless a
# password is given (-k), so a password login and a bastion's ssh_args of the user's work.
DEFAULT_SETTINGS = {
    "ANSIBLE_FORKS": "20",
    "ANSIBLE_GATHERING": "smart",
    "ANSIBLE_CACHE_PLUGIN": "jsonfile",
    "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
    "ANSIBLE_PIPELINING": "true",
    "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=120s",
    "ANSIBLE_RETRY_FILES_ENABLED": "false",
    "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml",
}
# Where an ansible.cfg sets each of them (ansible-core's configuration reference; the ssh and
# default-callback plugins' documented ini entries): a user's file that sets one keeps its value.
SETTING_INI = {
    "ANSIBLE_FORKS": [("defaults", "forks")],
    "ANSIBLE_GATHERING": [("defaults", "gathering")],
    "ANSIBLE_CACHE_PLUGIN": [("defaults", "fact_caching")],
    "ANSIBLE_CACHE_PLUGIN_TIMEOUT": [("defaults", "fact_caching_timeout")],
    "ANSIBLE_CACHE_PLUGIN_CONNECTION": [("defaults", "fact_caching_connection")],
    "ANSIBLE_PIPELINING": [("defaults", "pipelining"), ("connection", "pipelining"), ("ssh_connection", "pipelining")],
    "ANSIBLE_SSH_ARGS": [("ssh_connection", "ssh_args")],
    "ANSIBLE_RETRY_FILES_ENABLED": [("defaults", "retry_files_enabled")],
    "ANSIBLE_CALLBACK_RESULT_FORMAT": [("defaults", "callback_result_format")],
    # not a default of gpufleet's: a file that sets it keeps its paths after gpufleet's own copy
    "ANSIBLE_COLLECTIONS_PATH": [("defaults", "collections_path")],
}
# The records the playbooks hand the CLI, as facts set just before the check that fails on them
# (read from the set_fact's event, never from a message): roles/engine/tasks/readiness.yml's
# {instance, ready, message}, and playbooks/tasks/preflight.yml's [{host, role, message}], every
# problem of the host.
READINESS_FACT = "gpufleet_readiness"
PREFLIGHT_FACT = "gpufleet_preflight_problems"
# A role's preflight: the argument-spec entry point, and its task files (the event's task path).
PREFLIGHT_ENTRY_POINT = "preflight"
PREFLIGHT_TASK_FILE = re.compile(r"/roles/[^/]+/tasks/preflight(?:\.ya?ml|[_/][^:]*):\d+$")
MAX_MESSAGE = 400
KEEP_RUNS = 20  # run folders (logs) kept in the cache


class UsageError(ValueError):
    """Bad CLI input, raised before any run starts."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpufleet"


def parse_extravars(values: list[str] | None) -> tuple[dict[str, Any], list[str]]:
    """-e as ansible-playbook takes it: ({variables given as data}, [files]). A JSON/YAML mapping
    and KEY=VALUE pairs (Ansible's own parser, quotes kept) become data; @FILE stays a file that
    ansible-playbook reads itself, so a vault-encrypted file works."""
    from ansible.errors import AnsibleError
    from ansible.parsing.splitter import parse_kv

    data: dict[str, Any] = {}
    files: list[str] = []
    for value in values or []:
        if value.startswith("@"):
            path = Path(value[1:]).expanduser()
            if not path.is_file():
                raise UsageError("-e %s: no such file %s" % (value, path))
            files.append(str(path.resolve()))
        elif value.lstrip().startswith("{"):
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise UsageError("-e %r is not a JSON/YAML mapping (%s)" % (value, exc)) from None
            if not isinstance(parsed, dict):
                raise UsageError("-e %r: give a mapping" % value)
            data.update(parsed)
        else:
            try:
                pairs = parse_kv(value)
            except AnsibleError as exc:
                raise UsageError("-e %r: %s" % (value, exc)) from None
            if not pairs or "_raw_params" in pairs:
                raise UsageError("-e %r: give KEY=VALUE, @FILE or a JSON mapping" % value)
            data.update(pairs)
    return data, files


# The playbook name ansible-playbook's parser is given while it reads the passed-through options.
_PLAYBOOK_MARK = "gpufleet-runs-its-own-playbook.yml"


def ansible_options(args: list[str]) -> argparse.Namespace:
    """The options gpufleet passes through to ansible-playbook, read by ansible-playbook's own
    parser: a misspelt or incomplete option fails before any run, in Ansible's words, and
    gpufleet learns what the run will ask for (-K, -k, -J, --vault-id ID@prompt) and show
    (-v, --list-hosts, --list-tasks, --list-tags, --syntax-check)."""
    from ansible.cli.playbook import PlaybookCLI

    cli = PlaybookCLI(["ansible-playbook", _PLAYBOOK_MARK])
    cli.init_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            options = cli.parser.parse_args([_PLAYBOOK_MARK, *args])
    except SystemExit:
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        reason = lines[-1] if lines else "not accepted"
        raise UsageError(
            "ansible-playbook refuses the options %s: %s" % (shlex.join(args), reason.replace(_PLAYBOOK_MARK, ""))
        ) from None
    others = [a for a in options.args if a != _PLAYBOOK_MARK]
    if others:
        raise UsageError(
            "%s: gpufleet runs its own playbook; give options only (a value that starts with '-' goes as "
            "--option=VALUE)" % shlex.join(others)
        )
    owned = [
        flag for flag, value in (("-i", options.inventory), ("-l", options.subset), ("-e", options.extra_vars)) if value
    ]
    if owned:
        raise UsageError(
            "%s inside %s: give %s as gpufleet's own option%s, on its own"
            % (", ".join(owned), shlex.join(args), " and ".join(owned), "s" if len(owned) > 1 else "")
        )
    return options


def prompt_answers(options: argparse.Namespace, ask=None) -> dict[str, str]:
    """The passwords the run will ask for, asked here first and answered on ansible-playbook's
    terminal by ansible-runner: {prompt pattern: answer}. The prompts are ansible-core's own
    (ansible/cli/__init__.py: ask_passwords, setup_vault_secrets)."""
    ask = ask or getpass.getpass
    answers: dict[str, str] = {}
    if options.ask_pass:
        answers[r"^SSH password:\s*?$"] = ask("SSH password: ")
    if options.become_ask_pass:
        if options.ask_pass:
            answers[r"^[A-Z]+ password\[defaults to SSH password\]:\s*?$"] = (
                ask("BECOME password[defaults to SSH password]: ") or answers[r"^SSH password:\s*?$"]
            )
        else:
            answers[r"^[A-Z]+ password:\s*?$"] = ask("BECOME password: ")
    if options.ask_vault_pass:
        answers[r"^Vault password:\s*?$"] = ask("Vault password: ")
    for vault_id in options.vault_ids or []:
        label, _, source = vault_id.rpartition("@")
        if source == "prompt":
            prompt = "Vault password (%s): " % (label or "default")
            answers["^" + re.escape(prompt.rstrip()) + r"\s*?$"] = ask(prompt)
    return answers


def _config_value(name: str, config_file: str | None) -> Any:
    from ansible.config.manager import ConfigManager

    if config_file and not Path(config_file).is_file():
        config_file = None  # Ansible ignores a missing ANSIBLE_CONFIG file too
    return ConfigManager(config_file).get_config_value(name)


def user_config(environ: dict[str, str] | None = None, cwd: str | None = None, system: bool = True) -> str | None:
    """The ansible.cfg ansible-playbook would read when started here, in its order: ANSIBLE_CONFIG
    (a folder means its ansible.cfg; relative to here), ./ansible.cfg unless the folder is
    world-writable, ~/.ansible.cfg, /etc/ansible/ansible.cfg (unless not `system`); the first
    readable one as an absolute path (links not followed, as Ansible reads them), else None.
    (ansible-runner starts ansible-playbook in a folder of its own, where it would find none.)"""
    import stat

    environ = os.environ if environ is None else environ
    here = Path(cwd or os.getcwd())
    candidates = []
    if "ANSIBLE_CONFIG" in environ:
        given = here / Path(os.path.expandvars(environ["ANSIBLE_CONFIG"])).expanduser()
        candidates.append(given / "ansible.cfg" if given.is_dir() else given)
    try:
        if not here.stat().st_mode & stat.S_IWOTH:
            candidates.append(here / "ansible.cfg")
    except OSError:
        pass
    home = environ.get("HOME")
    if home:
        candidates.append(Path(home) / ".ansible.cfg")
    if system:
        candidates.append(Path("/etc/ansible/ansible.cfg"))
    for path in candidates:
        if path.is_file() and os.access(path, os.R_OK):
            return os.path.abspath(path)
    return None


def settings_in(config: str) -> set[str]:
    """The settings of SETTING_INI (DEFAULT_SETTINGS, the fact cache's folder, the collections
    path) the ansible.cfg `config` sets itself."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(config)
    except configparser.Error:
        return set()  # ansible-playbook names a broken file itself
    return {k for k, places in SETTING_INI.items() if any(parser.has_option(s, o) for s, o in places)}


def settings_env(
    coll: Collection, environ: dict[str, str] | None = None, colour: bool = True, cwd: str | None = None
) -> dict[str, str]:
    """Environment for the run: the collection first on the collections path, the venv's
    ansible-playbook on PATH, and the configuration: every ANSIBLE_* variable the user set left
    as it is; the user's ansible.cfg (user_config) in force, with gpufleet's defaults only for
    what it leaves unset; else a checkout's ansible.cfg, else gpufleet's defaults. Without
    colour, Ansible's output has no colour codes (ansible-runner runs it on a terminal of its
    own, where it would colour) unless the user's environment asks for them."""
    environ = dict(os.environ if environ is None else environ)
    env = coll.envvars()
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, environ.get("PATH", "")])
    # a checkout's own ansible.cfg wins over a system-wide /etc/ansible/ansible.cfg
    config = user_config(environ, cwd, system=coll.ansible_cfg is None)
    if config is not None and (coll.ansible_cfg is None or Path(config) != coll.ansible_cfg.resolve()):
        # the user's file, named by its absolute path for ansible-playbook (it starts elsewhere);
        # gpufleet fills what it leaves unset
        env["ANSIBLE_CONFIG"] = config
        own = settings_in(config)
        env.update({k: v for k, v in DEFAULT_SETTINGS.items() if k not in own and k not in environ})
        cache = environ.get("ANSIBLE_CACHE_PLUGIN") or (
            _config_value("CACHE_PLUGIN", config) if "ANSIBLE_CACHE_PLUGIN" in own else "jsonfile"
        )
        if "ANSIBLE_CACHE_PLUGIN_CONNECTION" not in own and cache in ("jsonfile", "ansible.builtin.jsonfile"):
            env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(cache_dir() / "facts")
        if "ANSIBLE_COLLECTIONS_PATH" not in environ and "ANSIBLE_COLLECTIONS_PATH" in own:
            # the file's collections paths (resolved against its folder) after gpufleet's own
            own_paths = [str(p) for p in _config_value("COLLECTIONS_PATHS", config) or []]
            first = env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)[0]
            env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join([first, *(p for p in own_paths if p != first)])
    elif coll.ansible_cfg is not None:
        env["ANSIBLE_CONFIG"] = str(coll.ansible_cfg)
        # ansible.cfg's fact cache path is relative to the working folder; pin it to the checkout
        env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(coll.root / ".cache" / "facts")
    else:
        env.update(DEFAULT_SETTINGS)
        env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(cache_dir() / "facts")
    for key in list(env):
        # the user's own setting wins (ANSIBLE_CONFIG: the file it names, made absolute above)
        if key in environ and key.startswith("ANSIBLE_") and key not in ("ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_CONFIG"):
            del env[key]
    if "ANSIBLE_HOST_KEY_CHECKING" not in environ:
        # ansible-runner sets it to False when the environment does not say: keep what the
        # configuration in use says (gpufleet's ansible.cfg and Ansible's default: True)
        config = environ.get("ANSIBLE_CONFIG") or env.get("ANSIBLE_CONFIG")
        env["ANSIBLE_HOST_KEY_CHECKING"] = str(bool(_config_value("HOST_KEY_CHECKING", config)))
    if not colour and not _user_colour_choice(environ):
        env["ANSIBLE_NOCOLOR"] = "1"
    return env


def describe_config(env: dict[str, str], environ: dict[str, str] | None = None) -> str:
    """One line for -v: the ansible.cfg in force and what gpufleet sets beside it."""
    environ = dict(os.environ if environ is None else environ)
    config = environ.get("ANSIBLE_CONFIG") or env.get("ANSIBLE_CONFIG")
    keys = [
        *DEFAULT_SETTINGS,
        "ANSIBLE_CACHE_PLUGIN_CONNECTION",
        "ANSIBLE_COLLECTIONS_PATH",
        "ANSIBLE_HOST_KEY_CHECKING",
    ]
    filled = ["%s=%s" % (k[len("ANSIBLE_") :].lower(), env[k]) for k in keys if k in env]
    return "gpufleet: Ansible configuration %s; gpufleet sets beside it: %s" % (
        config or "(none: Ansible's defaults)",
        ", ".join(filled) or "nothing (the file and your ANSIBLE_* variables set it all)",
    )


def _user_colour_choice(environ: dict[str, str]) -> bool:
    """Whether the user's environment already decides Ansible's colour."""
    from ansible.module_utils.parsing.convert_bool import boolean

    force = environ.get("ANSIBLE_FORCE_COLOR")
    return "ANSIBLE_NOCOLOR" in environ or "NO_COLOR" in environ or bool(force and boolean(force, strict=False))


@dataclass
class HostState:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    task: str = ""
    status: str = "waiting"


@dataclass
class Failure:
    host: str
    task: str
    message: str
    kind: str  # unreachable | preflight | readiness | task
    instance: str = ""
    # the host a delegated task ran on (the edge, for a rollout's drain), when not `host`
    delegated_to: str = ""
    # the preflight's problems as records ({host, role, message}), one per role that refused
    problems: list[dict[str, Any]] = field(default_factory=list)

    def sentence(self) -> str:
        msg = self.message
        if self.kind == "unreachable":
            if self.delegated_to:
                return (
                    "%s is unreachable (task '%s' of %s runs there): %s. Fix: check ansible_host and ansible_user "
                    "for %s in the inventory, and that `ssh` to it works with your key."
                    % (self.delegated_to, self.task, self.host, msg, self.delegated_to)
                )
            return (
                "%s is unreachable: %s. Fix: check ansible_host and ansible_user for it in the inventory, and "
                "that `ssh` to it works with your key." % (self.host, msg)
            )
        if self.kind == "preflight":
            return "%s failed the preflight (before any change in this run): %s" % (self.host, msg)
        if self.kind == "readiness":
            name = self.instance or "its engine"
            return (
                "%s: engine instance %s never became ready (%s): %s. Fix: read "
                "`journalctl -u gpufleet-engine@%s` on %s, correct the instance, and run again."
                % (self.host, name, self.task, msg, self.instance or "NAME", self.host)
            )
        return "%s: task '%s' failed: %s" % (self.host, self.task, msg)


def _full_message(res: dict[str, Any]) -> str:
    for key in ("msg", "stderr", "reason", "stdout"):
        value = res.get(key)
        if isinstance(value, str) and value.strip():
            return " ".join(value.split())
    if res.get("results"):
        for item in res["results"]:
            if isinstance(item, dict) and item.get("failed"):
                return _full_message(item)
    return "no message (see the log)"


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def _message(res: dict[str, Any]) -> str:
    return _short(_full_message(res))


def is_preflight(res: dict[str, Any], task_path: str) -> bool:
    """A failure of a role's preflight: its argument-spec entry point, or a task of it."""
    context = res.get("validate_args_context") or {}
    if context.get("argument_spec_name") == PREFLIGHT_ENTRY_POINT:
        return True
    return bool(PREFLIGHT_TASK_FILE.search(task_path))


@dataclass
class RunView:
    """Folds ansible-runner events into per-host counts, the current task and the failures."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    live: bool = False
    quiet: bool = False
    echo: bool = False  # write Ansible's own output, as the events carry it, to out
    hosts: dict[str, HostState] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    reports: dict[str, Any] = field(default_factory=dict)  # gpufleet_status facts (status.yml)
    monitoring: dict[str, Any] | None = None  # the gpufleet_monitoring fact (status.yml, a monitoring host)
    usage: dict[str, Any] = field(default_factory=dict)  # gpufleet_usage facts (usage.yml), per edge host
    models: dict[str, Any] = field(default_factory=dict)  # gpufleet_models_report facts (models.yml), per host
    play: str = ""
    task: str = ""
    _task_path: str = ""
    # per host, a record a playbook set for the result that follows it (READINESS_FACT, PREFLIGHT_FACT)
    _pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    _drawn: int = 0
    _last_draw: float = 0.0

    def host(self, name: str) -> HostState:
        return self.hosts.setdefault(name, HostState())

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if self.echo and event.get("stdout"):
            # Ansible's lines as it printed them on ansible-runner's terminal (CRLF there)
            self.out.write(event["stdout"].replace("\r\n", "\n") + "\n")
            self.out.flush()
        if kind == "runner_on_failed" and data.get("ignore_errors"):
            # an ignored failure: a record set before it was not for it
            self._pending.pop(data.get("host", "?"), None)
        if kind == "playbook_on_play_start":
            self.play = data.get("play") or data.get("name") or ""
        elif kind == "playbook_on_task_start":
            self.task = data.get("task") or data.get("name") or ""
            self._task_path = data.get("task_path") or ""
            if not self.live and not self.quiet:
                print("  %s | %s" % (self.play, self.task), file=self.out)
        elif kind == "runner_on_start":
            state = self.host(data.get("host", "?"))
            state.task, state.status = data.get("task") or self.task, "running"
        elif kind == "runner_on_ok":
            state = self.host(data.get("host", "?"))
            self._pending.pop(data.get("host", "?"), None)
            facts = (data.get("res") or {}).get("ansible_facts") or {}
            ready = facts.get(READINESS_FACT)
            if isinstance(ready, dict) and str(ready.get("ready")).lower() != "true":
                self._pending[data.get("host", "?")] = {"readiness": ready}
            problems = facts.get(PREFLIGHT_FACT)
            if isinstance(problems, list) and problems:
                self._pending[data.get("host", "?")] = {"preflight": [p for p in problems if isinstance(p, dict)]}
            state.ok += 1
            if (data.get("res") or {}).get("changed"):
                state.changed += 1
            state.status = "ok"
            report = ((data.get("res") or {}).get("ansible_facts") or {}).get("gpufleet_status")
            if report is not None:
                self.reports[data.get("host", "?")] = report
            watched = ((data.get("res") or {}).get("ansible_facts") or {}).get("gpufleet_monitoring")
            if watched is not None:
                self.monitoring = watched
            usage = ((data.get("res") or {}).get("ansible_facts") or {}).get("gpufleet_usage")
            if usage is not None:
                self.usage[data.get("host", "?")] = usage
            held = ((data.get("res") or {}).get("ansible_facts") or {}).get("gpufleet_models_report")
            if held is not None:
                self.models[data.get("host", "?")] = held
        elif kind == "runner_on_skipped":
            self._pending.pop(data.get("host", "?"), None)
            self.host(data.get("host", "?")).skipped += 1
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self._failed(data, "failed")
        elif kind == "runner_on_unreachable":
            self._failed(data, "unreachable")
        elif kind == "playbook_on_stats":
            for key, attr in (
                ("ok", "ok"),
                ("changed", "changed"),
                ("failures", "failed"),
                ("dark", "unreachable"),
                ("skipped", "skipped"),
                ("rescued", "rescued"),
                ("ignored", "ignored"),
            ):
                for name, count in (data.get(key) or {}).items():
                    setattr(self.host(name), attr, count)
        self.draw()
        return True

    def _failed(self, data: dict[str, Any], how: str) -> None:
        name = data.get("host", "?")
        state = self.host(name)
        res = data.get("res") or {}
        task = data.get("task") or self.task
        message, instance, problems = _full_message(res), "", []
        delegated = str((res.get("_ansible_delegated_vars") or {}).get("ansible_delegated_host") or "")
        delegated = delegated if delegated and delegated != name else ""
        # the record the playbook set just before this check (a fact, not the message's words)
        pending = self._pending.pop(name, {})
        if how == "unreachable":
            state.unreachable += 1
            state.status = "unreachable"
            kind = "unreachable"
        else:
            state.failed += 1
            state.status = "failed"
            problems = pending.get("preflight") or []
            ready = pending.get("readiness") or {}
            nothing_changed = not any(h.changed for h in self.hosts.values())
            if ready:
                # the failure's own words: the check's are the record's, a rescue's add what it did
                kind, instance = "readiness", str(ready.get("instance") or "")
            elif problems and nothing_changed:
                # every problem of the host in one record list: it replaces the single checks noted before it
                kind = "preflight"
                message = " ".join(" ".join(str(p.get("message") or "").split()) for p in problems)
                self.failures = [f for f in self.failures if not (f.host == name and f.kind == "preflight")]
            elif is_preflight(res, data.get("task_path") or self._task_path) and nothing_changed:
                kind = "preflight"
            else:
                kind = "task"
        failure = Failure(
            host=name, task=task, message=_short(message), kind=kind, instance=instance, delegated_to=delegated,
            problems=[dict(p, host=name) for p in problems] if kind == "preflight" else [],
        )  # fmt: skip
        self.failures.append(failure)
        if not self.live and not self.quiet:
            print("  %s %s (%s)" % (kind.upper() if kind == "unreachable" else "FAILED", name, task), file=self.out)

    def lines(self) -> list[str]:
        out = ["%s | %s" % (self.play, self.task)]
        width = max([len(h) for h in self.hosts] + [4])
        for name, s in self.hosts.items():
            out.append(
                "  %-*s  ok %3d  changed %3d  failed %d  unreachable %d  %s"
                % (width, name, s.ok, s.changed, s.failed, s.unreachable, s.status)
            )
        return out

    def draw(self, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.2:
            return
        self._last_draw = now
        lines = self.lines()
        if self._drawn:
            self.out.write("\x1b[%dF" % self._drawn)
        for line in lines:
            self.out.write("\x1b[2K" + line[:200] + "\n")
        self.out.write("\x1b[J")
        self.out.flush()
        self._drawn = len(lines)

    def summary(self) -> dict[str, Any]:
        return {
            "hosts": {
                n: {"ok": s.ok, "changed": s.changed, "failed": s.failed, "unreachable": s.unreachable}
                for n, s in self.hosts.items()
            },
            "failures": [
                {
                    "host": f.host,
                    "task": f.task,
                    "kind": f.kind,
                    "message": f.message,
                    "sentence": f.sentence(),
                    "instance": f.instance or None,
                    "problems": f.problems,
                }
                for f in self.failures
            ],
        }


@dataclass
class RunRequest:
    playbook: str  # "site", "rollout", "status", or the path of a playbook file
    inventory: str
    limit: str | None = None
    tags: str | None = None
    skip_tags: str | None = None
    check: bool = False
    diff: bool = False
    extravars: dict[str, Any] = field(default_factory=dict)
    extravar_files: list[str] = field(default_factory=list)
    vault_password_files: list[str] = field(default_factory=list)
    ask_vault_pass: bool = False
    verbose: int = 0  # ansible-playbook's -v count
    json: bool = False
    # anything else for ansible-playbook, unchanged (gpufleet deploy/rollout/status pass through
    # every option they do not own: -u, -b, -K, -t, -C, --private-key, --list-hosts, ...)
    ansible_args: list[str] = field(default_factory=list)
    # show Ansible's own output (None: with -v, or when an option lists instead of running)
    echo: bool | None = None
    _options: argparse.Namespace | None = field(default=None, init=False, repr=False, compare=False)

    def options(self) -> argparse.Namespace:
        """ansible_args as ansible-playbook's parser reads them (read once per request)."""
        if self._options is None:
            self._options = ansible_options(self.ansible_args)
        return self._options

    def shows_output(self) -> bool:
        if self.echo is not None:
            return self.echo
        o = self.options()
        return bool(self.verbose or o.verbosity or o.listhosts or o.listtasks or o.listtags or o.syntax)


def runner_kwargs(req: RunRequest, coll: Collection, private_dir: Path, colour: bool = False) -> dict[str, Any]:
    """The one ansible_runner.run() call a request makes (its keyword arguments). Ansible's
    output reaches the user through the events (RunView.echo), never ansible-runner's own echo."""
    inventory = Path(req.inventory).expanduser()
    if not inventory.exists():
        raise UsageError(
            "-i %s: no such inventory file or folder; give the path of your inventory (e.g. inventories/lab)"
            % req.inventory
        )
    named = {
        "site": coll.site_playbook,
        "rollout": coll.rollout_playbook,
        "status": coll.root / "playbooks" / "status.yml",
        "usage": coll.root / "playbooks" / "usage.yml",
        "models": coll.root / "playbooks" / "models.yml",
    }
    playbook = named.get(req.playbook) or Path(req.playbook).expanduser().resolve()
    if not playbook.is_file():
        raise UsageError("playbook %s: no such file" % req.playbook)
    cmdline = []
    if req.check:
        cmdline.append("--check")
    if req.diff:
        cmdline.append("--diff")
    for path in req.vault_password_files:
        if not Path(path).expanduser().exists():
            raise UsageError("--vault-password-file %s: no such file" % path)
        cmdline += ["--vault-password-file", str(Path(path).expanduser().resolve())]
    if req.ask_vault_pass:
        cmdline.append("--ask-vault-pass")
    for path in req.extravar_files:
        cmdline += ["-e", "@" + path]
    if req.verbose > 0:
        cmdline.append("-" + "v" * req.verbose)
    req.options()  # ansible-playbook's parser reads the passed-through options before the run
    cmdline += req.ansible_args
    kwargs: dict[str, Any] = {
        "private_data_dir": str(private_dir),
        "playbook": str(playbook),
        "inventory": str(inventory.resolve()),
        "envvars": settings_env(coll, colour=colour),
        "extravars": req.extravars,
        "quiet": True,
        # keep the fact cache of the configuration in use (ansible-runner would point it into the run)
        "fact_cache_type": "",
        # ansible-runner asks the cancel callback each time its wait for output ends: every second
        "settings": {"pexpect_timeout": 1},
    }
    if cmdline:
        kwargs["cmdline"] = shlex.join(cmdline)
    for key in ("limit", "tags", "skip_tags"):
        if getattr(req, key):
            kwargs[key] = getattr(req, key)
    return kwargs


@dataclass
class Outcome:
    """What a run ended with: ansible-runner's rc and status, the log, and the view of its events."""

    rc: int
    status: str
    log: Path | None  # None: the run did not start (bad input, rc 1)
    view: RunView


def execute(req: RunRequest, view: RunView, err: TextIO | None = None) -> Outcome:
    """One ansible-runner run for the request, its events fed to the view (rc 1 on bad input)."""
    import ansible_runner

    err = err or sys.stderr
    coll = locate_collection()
    # A folder per run: ansible-runner keeps a run's inputs (env/cmdline, env/extravars) in its
    # private data folder and would hand them to the next run that gives none.
    runs = cache_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    label = Path(req.playbook).stem
    private_dir = runs / ("%s-%s-%s" % (time.strftime("%Y%m%d-%H%M%S"), label, uuid.uuid4().hex[:8]))
    private_dir.mkdir(mode=0o700)
    for old in sorted(p for p in runs.iterdir() if p.is_dir())[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    try:
        kwargs = runner_kwargs(req, coll, private_dir, colour=view.echo and view.out.isatty())
        # the community collections the roles use, named before any run (ansible-playbook resolves
        # their modules even for --list-hosts)
        missing = missing_dependencies(coll, kwargs["envvars"]["ANSIBLE_COLLECTIONS_PATH"])
        if missing:
            raise UsageError(
                "the roles need %s, which Ansible does not find (collections path %s, and Python's path). Install "
                "them: `gpufleet collection install` (from Galaxy, with gpufleet.serving), `ansible-galaxy "
                "collection install -r %s`, or `pip install 'gpufleet[collections]'` (PyPI's ansible package)"
                % (
                    ", ".join(missing),
                    kwargs["envvars"]["ANSIBLE_COLLECTIONS_PATH"],
                    coll.root / "collections" / "requirements.yml",
                )
            )
    except UsageError as exc:
        print("gpufleet: %s" % exc, file=err)
        return Outcome(rc=1, status="not started", log=None, view=view)
    if req.verbose > 0 or req.options().verbosity:  # -v given to gpufleet, or passed through to ansible-playbook
        print(describe_config(kwargs["envvars"]), file=err)
    options = argparse.Namespace(**vars(req.options()))  # a copy: the request keeps what was given
    options.ask_vault_pass = options.ask_vault_pass or req.ask_vault_pass
    try:
        answers = prompt_answers(options)
    except (EOFError, KeyboardInterrupt):
        print("\ngpufleet: no password given; nothing ran", file=err)
        return Outcome(rc=1, status="not started", log=None, view=view)
    if answers:
        kwargs["passwords"] = answers
    cancel = Cancel()
    try:
        with cancel:
            result = ansible_runner.run(event_handler=view.handle, cancel_callback=cancel, **kwargs)
    finally:
        # the extra vars may hold secrets (keys), and ansible-runner writes the whole environment
        # (tokens included) into artifacts/ID/command: neither outlives the run
        shutil.rmtree(private_dir / "env", ignore_errors=True)
        for command in private_dir.glob("artifacts/*/command"):
            command.unlink()
    rc = result.rc if isinstance(result.rc, int) else 1
    log = private_dir / "artifacts" / str(result.config.ident) / "stdout"
    if cancel.signal_name:
        print(
            "gpufleet: %s: ansible-playbook was stopped at once (the run's process group killed). A fleet lock it "
            "held is taken over by the next run from this machine. Full log: %s" % (cancel.signal_name, log),
            file=err,
        )
        return Outcome(128 + cancel.signum, "canceled", log, view)
    return Outcome(rc, result.status, log, view)


class Cancel:
    """SIGTERM, SIGINT or SIGHUP during a run: every process the run started is killed at
    once (ansible-playbook and its workers: Ansible's workers run in sessions of their own,
    so killing ansible-playbook's process group, as ansible-runner does, leaves a worker to
    finish its task alone), and ansible-runner's cancel callback says the run was cancelled.
    Used as a context manager around the run; the previous handlers come back after it."""

    SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")

    def __init__(self) -> None:
        self.signum = 0
        self.signal_name = ""
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        return bool(self.signum)

    def _handle(self, signum, frame) -> None:
        import signal

        self.signum, self.signal_name = signum, signal.Signals(signum).name
        for pid in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> Cancel:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name)
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for number, handler in self._previous.items():
            signal.signal(number, handler)


def descendants(root: int) -> list[int]:
    """Every process below `root` in the process tree (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _print_failures(view: RunView, what: str, rc: int, status: str, log: Path, err: TextIO) -> None:
    print("gpufleet: %s failed (rc %d)." % (what, rc), file=err)
    seen = set()
    for failure in view.failures:
        sentence = failure.sentence()
        if sentence not in seen:
            seen.add(sentence)
            print("  - " + sentence, file=err)
    if not view.failures:
        print("  - no host reported a failed task; the run itself failed (%s)." % status, file=err)
    print("Full log: %s" % log, file=err)


def play(req: RunRequest, out: TextIO | None = None, err: TextIO | None = None) -> Outcome:
    """Run the request; print the live view (or Ansible's output with -v, or JSON) and the ending."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        echo = req.shows_output() and not req.json
    except UsageError as exc:
        print("gpufleet: %s" % exc, file=err)
        return Outcome(rc=1, status="not started", log=None, view=RunView(out=out))
    live = not req.json and not echo and out.isatty()
    view = RunView(out=out, live=live, quiet=req.json or echo, echo=echo)
    if not req.json and not echo:
        print("gpufleet: %s on %s" % (req.playbook, req.inventory), file=out)
    outcome = execute(req, view, err)
    if outcome.log is None:
        return outcome
    view.draw(force=True)
    rc, log = outcome.rc, outcome.log
    summary = dict(view.summary(), rc=rc, status=outcome.status, log=str(log), playbook=req.playbook)
    if req.json:
        print(json.dumps(summary, indent=2, sort_keys=True), file=out)
        return outcome
    if not live:
        for line in view.lines()[1:]:
            print(line, file=out)
    if rc == 0:
        print("gpufleet: %s finished (%s); full log: %s" % (req.playbook, outcome.status, log), file=out)
    elif outcome.status == "canceled":
        pass  # execute() said what happened
    else:
        _print_failures(view, req.playbook, rc, outcome.status, log, err)
    return outcome


def run_playbook(req: RunRequest, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """`gpufleet deploy` / `rollout`: play() and its rc."""
    return play(req, out, err).rc


def _pct(value: Any) -> str:
    return "-" if value is None else "%.1f%%" % (100.0 * value)


def _figure(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt % value


def _placed(p: dict | None) -> list[str]:
    """CPUS and MEMS: the container cgroup's effective sets as the kernel holds them, with the
    plan's beside them where they differ."""
    if not p:
        return ["-", "-"]
    cells = []
    for key in ("cpus", "mems"):
        cell = p.get(key) or "?"
        if key in (p.get("drift") or []):
            cell += " (PLAN %s)" % p.get("planned_" + key)
        cells.append(cell)
    return cells


def _duration(seconds: Any) -> str:
    """62.4 -> 1m02s, 7.9 -> 8s."""
    if seconds is None:
        return "?"
    whole = round(seconds)
    return "%ds" % whole if whole < 60 else "%dm%02ds" % divmod(whole, 60)


def _starting(start: dict | None) -> str | None:
    """An instance still starting, from its engine's log: "compiling for 1m02s (...), up 2m10s";
    None when it is not read or its log says it serves."""
    if not start or not start.get("phase") or start["phase"] == "serving":
        return None
    note = " (%s)" % start["note"] if start.get("note") else ""
    return "%s for %s%s, up %s" % (start["phase"], _duration(start.get("phase_s")), note,
                                   _duration(start.get("elapsed_s")))  # fmt: skip


def status_rows(reports: dict[str, Any], monitoring: dict[str, Any] | None = None) -> list[list[str]]:
    """The status table: one row per engine instance (one per host without any). With a
    monitoring host's answers, each instance's last 5 minutes too: generated tokens/s, time to
    first token p50/p95, and the alerts firing about it or its host."""
    rows = [["HOST", "DRIVER", "NCCL", "ENGINE", "STATE", "MODEL", "TP", "GPUS", "CPUS", "MEMS", "KV CACHE",
             "PREFIX HITS", "RUNNING", "WAITING"]]  # fmt: skip
    if monitoring is not None:
        rows[0] += ["TOK/S", "TTFT P50/P95", "ALERTS"]
    watched = (monitoring or {}).get("instances") or {}
    host_alerts = (monitoring or {}).get("hosts") or {}
    for host in sorted(reports):
        r = reports[host]
        head = [host, r.get("driver_version") or "-", r.get("nccl") or "-"]
        if not r.get("engines"):
            rows.append([*head, "-", "no engine", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
            if monitoring is not None:
                rows[-1] += ["-", "-", ",".join(host_alerts.get(host) or []) or "-"]
        for e in r.get("engines") or []:
            starting = None if e.get("serving") else _starting(e.get("start"))
            state = "serving" if e.get("serving") else "NOT SERVING (unit %s)" % e.get("unit")
            if starting:
                # its container runs and its engine's log says where its start is (the registry's phase lines)
                state = "STARTING: %s" % starting
            node = e.get("node")
            if node and node.get("rank"):
                # a multi-node instance's worker: it runs its part; the leader's row says whether the group serves
                running = "running" if e.get("serving") else "NOT RUNNING (unit %s)" % e.get("unit")
                state = "%s, node %d of %d (leader %s)" % (running, node["rank"], node["size"], node["leader"])
            elif node:
                state += ", node 0 of %d (%s)" % (node["size"], ", ".join(node["nodes"][1:]))
            if e.get("recorded") is False:
                state = "unknown (unit %s; no deployed.json: run site.yml)" % e.get("unit")
            elif e.get("restart_pending"):
                state = "RESTART PENDING (unit %s; these settings are not running yet: run site.yml)" % e.get("unit")
            if e.get("quarantine"):
                q = e["quarantine"]
                state = "QUARANTINED (%s: %s; by %s) %s" % (q.get("reason"), q.get("detail"), q.get("by"), state)
            rows.append(
                [
                    *head,
                    "%s %s:%s" % (e.get("name"), e.get("engine") or "?", e.get("port") or "?"),
                    state,
                    str(e.get("model") or "-"),
                    str(e.get("tensor_parallel_size") or "-"),
                    str(e.get("gpus") or "-"),
                    *_placed(e.get("placement")),
                    _pct(e.get("kv_cache_usage")),
                    _pct(e.get("prefix_cache_hit_rate")),
                    "-" if e.get("running") is None else str(e["running"]),
                    "-" if e.get("waiting") is None else str(e["waiting"]),
                ]
            )
            if monitoring is not None:
                m = watched.get("%s/%s" % (host, e.get("name"))) or {}
                ttft = "-" if m.get("ttft_p50") is None and m.get("ttft_p95") is None else "%s/%s" % (
                    _figure(m.get("ttft_p50"), "%.3fs"), _figure(m.get("ttft_p95"), "%.3fs"))  # fmt: skip
                alerts = sorted(set((m.get("alerts") or []) + (host_alerts.get(host) or [])))
                rows[-1] += [_figure(m.get("tokens_per_s"), "%.1f"), ttft, ",".join(alerts) or "-"]
    return rows


def _read_only(req: RunRequest, out: TextIO, err: TextIO) -> tuple[RunView | None, Any]:
    """Runs a read-only playbook (status.yml, usage.yml) quietly: (its view, its outcome), or (None,
    the exit status) when it did not run (1 on bad input)."""
    try:
        echo = req.shows_output() and not req.json
    except UsageError as exc:
        print("gpufleet: %s" % exc, file=err)
        return None, 1
    view = RunView(out=out, live=False, quiet=True, echo=echo)
    outcome = execute(req, view, err)
    if outcome.log is None:
        return None, outcome.rc
    return view, outcome


def _print_table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out)


def run_status(req: RunRequest, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """gpufleet status: the read-only status.yml, printed as a table (or JSON). Exit 0 when every
    instance serves as deployed, 2 when one does not serve or still waits for its restart, the run's rc when a
    host could not be read, 1 on bad input."""
    out, err = out or sys.stdout, err or sys.stderr
    view, outcome = _read_only(req, out, err)
    if view is None:
        return outcome
    rc, log = outcome.rc, outcome.log
    down = [
        "%s/%s" % (host, e.get("name")) + (" (%s)" % _starting(e.get("start")) if _starting(e.get("start")) else "")
        for host, r in view.reports.items()
        for e in r.get("engines") or []
        if not e.get("serving")
    ]
    pending = [
        "%s/%s" % (host, e.get("name"))
        for host, r in view.reports.items()
        for e in r.get("engines") or []
        if e.get("restart_pending")
    ]
    held = [
        "%s/%s (%s)" % (host, e.get("name"), e["quarantine"].get("reason"))
        for host, r in view.reports.items()
        for e in r.get("engines") or []
        if e.get("quarantine")
    ]
    if req.json:
        answer = {"hosts": view.reports, "rc": rc, "log": str(log)}
        if view.monitoring is not None:
            answer["monitoring"] = view.monitoring
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    else:
        _print_table(status_rows(view.reports, view.monitoring), out)
    if rc != 0:
        _print_failures(view, "status", rc, outcome.status, log, err)
        return rc
    if down:
        print("gpufleet: not serving: %s" % ", ".join(down), file=err)
    if pending:
        print(
            "gpufleet: restart pending (the settings shown are written, not running): %s; run site.yml or the "
            "rollout to restart them" % ", ".join(pending),
            file=err,
        )
    if held:
        print(
            "gpufleet: out of service (quarantined; the watchdog returns each when its fault clears, or on the host: "
            "%s/engine-watchdog release NAME): %s" % ("/usr/local/libexec/gpufleet", ", ".join(held)),
            file=err,
        )
    if down or pending or held:
        return 2
    return 0


def usage_rows(usage: dict[str, Any]) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """gpufleet usage's tables from each edge host's gpufleet_usage fact: per key and model (the
    store's counts, from the first edge that read it), each key's minute and day against its
    limits, and each edge's view of the store."""
    first = next((usage[h] for h in sorted(usage) if usage[h].get("store_up")), None) or {}
    by_model = [["KEY", "MODEL", "PROMPT", "COMPLETION", "REQUESTS"]]
    for u in first.get("usage") or []:
        by_model.append([str(u.get("key")), str(u.get("model")), str(u.get("prompt", 0)),
                         str(u.get("completion", 0)), str(u.get("requests", 0))])  # fmt: skip
    quotas = [["KEY", "THIS MINUTE", "TODAY (UTC)"]]
    for k in first.get("keys") or []:
        quotas.append([str(k.get("name")), "%s/%s" % (k.get("minute", 0), k.get("limit_minute") or "-"),
                       "%s/%s" % (k.get("day", 0), k.get("limit_day") or "-")])  # fmt: skip
    edges = [["EDGE", "STORE", "REACHED", "REFUSED", "UNCHECKED", "UNCOUNTED TOKENS"]]
    for host in sorted(usage):
        u = usage[host]
        stats = u.get("edge") or {}
        reached = "yes" if u.get("store_up") else "NO: %s" % (u.get("error") or "?")
        edges.append([host, str(u.get("store") or "-"), reached, str(stats.get("refused_requests", "-")),
                      str(stats.get("unchecked_requests", "-")), str(stats.get("uncounted_tokens", "-"))])  # fmt: skip
    return by_model, quotas, edges


def run_usage(req: RunRequest, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """gpufleet usage: the read-only usage.yml, printed as tables (or JSON). Exit 0 when every edge
    reads the usage store, 2 when one does not, the run's rc when a host could not be read, 1 on
    bad input."""
    out, err = out or sys.stdout, err or sys.stderr
    view, outcome = _read_only(req, out, err)
    if view is None:
        return outcome
    rc, log = outcome.rc, outcome.log
    if req.json:
        print(json.dumps({"edges": view.usage, "rc": rc, "log": str(log)}, indent=2, sort_keys=True), file=out)
    else:
        for n, rows in enumerate(usage_rows(view.usage)):
            if n:
                print("", file=out)
            _print_table(rows, out)
    if rc != 0:
        _print_failures(view, "usage", rc, outcome.status, log, err)
        return rc
    unread = sorted(h for h, u in view.usage.items() if not u.get("store_up"))
    if not view.usage:
        print("gpufleet: no edge host answered (the inventory's edge group is empty?)", file=err)
        return 2
    if unread:
        print("gpufleet: the usage store is not read from: %s" % ", ".join(unread), file=err)
        return 2
    return 0


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d B" % n


def models_rows(models: dict[str, Any]) -> list[list[str]]:
    """gpufleet models' table from each host's gpufleet_models_report: one row per model folder."""
    rows = [["host", "path", "model", "revision", "size", "verified", "used by"]]
    for host in sorted(models):
        report = models[host] or {}
        for m in report.get("models") or []:
            if not m.get("exists", True) and not m.get("partial_bytes"):
                state = "missing"
            elif m.get("pruned"):
                state = "would be pruned (check mode)" if report.get("check") else "pruned"
            elif not m.get("managed"):
                state = "not fetched by gpufleet"
            else:
                state = "yes" if m.get("verified") else "NO"
            if m.get("partial_bytes"):
                state += " (%s staged)" % _size(m["partial_bytes"])
            who = ", ".join(m.get("used_by") or []) or ("(the store)" if report.get("role") == "store" else "-")
            rows.append([host, str(m.get("path", "")), str(m.get("name") or "-"), str(m.get("revision") or "-")[:12],
                         _size(m.get("total_size")), state, who])  # fmt: skip
    return rows


def run_models(req: RunRequest, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """gpufleet models: models.yml (list, pull or prune), printed as a table (or JSON). Exit 0 when
    every model gpufleet fetched is whole, 2 when one is not (or a host answered nothing), the
    run's rc when a host could not be read or a pull failed, 1 on bad input."""
    out, err = out or sys.stdout, err or sys.stderr
    view, outcome = _read_only(req, out, err)
    if view is None:
        return outcome
    rc, log = outcome.rc, outcome.log
    if req.json:
        print(json.dumps({"hosts": view.models, "rc": rc, "log": str(log)}, indent=2, sort_keys=True), file=out)
    elif view.models:
        _print_table(models_rows(view.models), out)
    if rc != 0:
        _print_failures(view, "models", rc, outcome.status, log, err)
        return rc
    if not view.models:
        print("gpufleet: no host answered (the inventory's gpu_hosts and model_store groups are empty?)", file=err)
        return 2
    broken = sorted(
        "%s:%s" % (host, m.get("path"))
        for host, r in view.models.items()
        for m in (r or {}).get("models") or []
        if m.get("managed") and not m.get("verified") and not m.get("pruned")
    )
    if broken:
        print("gpufleet: not whole: %s (gpufleet models pull fetches what is missing or wrong)" % ", ".join(broken),
              file=err)  # fmt: skip
        return 2
    return 0
