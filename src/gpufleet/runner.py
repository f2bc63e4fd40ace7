"""`gpufleet deploy` and `gpufleet rollout`: site.yml and rollout.yml through ansible-runner.

Thin on purpose: the playbooks hold every decision. This module turns the CLI's options into
one ansible-runner call, shows the run as a live per-host view built from runner events (or
the raw Ansible output with -v, or one JSON object with --json), and ends a failed run with
one sentence per failed host: what failed, why, what to do, and where the full log is.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpufleet._collection import Collection, locate_collection

# What a run gets when nothing else says otherwise (a checkout's ansible.cfg or the user's
# own ANSIBLE_* settings win; these match that ansible.cfg for an installed copy).
DEFAULT_SETTINGS = {
    "ANSIBLE_FORKS": "20",
    "ANSIBLE_GATHERING": "smart",
    "ANSIBLE_CACHE_PLUGIN": "jsonfile",
    "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
    "ANSIBLE_PIPELINING": "true",
    "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=120s -o PreferredAuthentications=publickey",
    "ANSIBLE_RETRY_FILES_ENABLED": "false",
    "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml",
}
# Tasks whose failure means "the engine never became ready" (roles/engine/tasks/readiness.yml).
READINESS_TASKS = ("Wait for /health of ", "Generate one token with ", "Check the one-token generation of ")
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


def _config_value(name: str, config_file: str | None) -> Any:
    from ansible.config.manager import ConfigManager

    if config_file and not Path(config_file).is_file():
        config_file = None  # Ansible ignores a missing ANSIBLE_CONFIG file too
    return ConfigManager(config_file).get_config_value(name)


def settings_env(coll: Collection, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the run: the collection first on the collections path, the venv's
    ansible-playbook on PATH, the checkout's ansible.cfg or gpufleet's defaults, and every
    ANSIBLE_* variable the user set left as it is."""
    environ = dict(os.environ if environ is None else environ)
    env = coll.envvars()
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, environ.get("PATH", "")])
    if "ANSIBLE_CONFIG" not in environ:
        if coll.ansible_cfg is not None:
            env["ANSIBLE_CONFIG"] = str(coll.ansible_cfg)
            # ansible.cfg's fact cache path is relative to the working folder; pin it to the checkout
            env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(coll.root / ".cache" / "facts")
        else:
            env.update({k: v for k, v in DEFAULT_SETTINGS.items() if k not in environ})
            env.setdefault("ANSIBLE_CACHE_PLUGIN_CONNECTION", str(cache_dir() / "facts"))
    for key in list(env):
        if key in environ and key.startswith("ANSIBLE_") and key != "ANSIBLE_COLLECTIONS_PATH":
            del env[key]  # the user's own setting wins
    if "ANSIBLE_HOST_KEY_CHECKING" not in environ:
        # ansible-runner sets it to False when the environment does not say: keep what the
        # configuration in use says (gpufleet's ansible.cfg and Ansible's default: True)
        config = environ.get("ANSIBLE_CONFIG") or env.get("ANSIBLE_CONFIG")
        env["ANSIBLE_HOST_KEY_CHECKING"] = str(bool(_config_value("HOST_KEY_CHECKING", config)))
    return env


@dataclass
class HostState:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    task: str = ""
    status: str = "waiting"


@dataclass
class Failure:
    host: str
    task: str
    message: str
    kind: str  # unreachable | preflight | readiness | task
    instance: str = ""

    def sentence(self) -> str:
        msg = self.message
        if self.kind == "unreachable":
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


def _message(res: dict[str, Any]) -> str:
    for key in ("msg", "stderr", "reason", "stdout"):
        value = res.get(key)
        if isinstance(value, str) and value.strip():
            text = " ".join(value.split())
            return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
    if res.get("results"):
        for item in res["results"]:
            if isinstance(item, dict) and item.get("failed"):
                return _message(item)
    return "no message (see the log)"


@dataclass
class RunView:
    """Folds ansible-runner events into per-host counts, the current task and the failures."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    live: bool = False
    quiet: bool = False
    hosts: dict[str, HostState] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    reports: dict[str, Any] = field(default_factory=dict)  # gpufleet_status facts (status.yml)
    play: str = ""
    task: str = ""
    _task_path: str = ""
    _drawn: int = 0
    _last_draw: float = 0.0

    def host(self, name: str) -> HostState:
        return self.hosts.setdefault(name, HostState())

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
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
            state.ok += 1
            if (data.get("res") or {}).get("changed"):
                state.changed += 1
            state.status = "ok"
            report = ((data.get("res") or {}).get("ansible_facts") or {}).get("gpufleet_status")
            if report is not None:
                self.reports[data.get("host", "?")] = report
        elif kind == "runner_on_skipped":
            self.host(data.get("host", "?")).skipped += 1
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self._failed(data, "failed")
        elif kind == "runner_on_unreachable":
            self._failed(data, "unreachable")
        elif kind == "playbook_on_stats":
            for key, attr in (("ok", "ok"), ("changed", "changed"), ("failures", "failed"), ("dark", "unreachable")):
                for name, count in (data.get(key) or {}).items():
                    setattr(self.host(name), attr, count)
            for name in data.get("skipped") or {}:
                self.host(name).skipped = data["skipped"][name]
        self.draw()
        return True

    def _failed(self, data: dict[str, Any], how: str) -> None:
        name = data.get("host", "?")
        state = self.host(name)
        res = data.get("res") or {}
        task = data.get("task") or self.task
        if how == "unreachable":
            state.unreachable += 1
            state.status = "unreachable"
            kind = "unreachable"
        else:
            state.failed += 1
            state.status = "failed"
            path = data.get("task_path") or self._task_path
            if task.startswith(READINESS_TASKS):
                kind = "readiness"
            elif ("preflight" in path or "preflight" in self.play.lower()) and not any(
                h.changed for h in self.hosts.values()
            ):
                kind = "preflight"
            else:
                kind = "task"
        instance = ""
        if kind == "readiness":
            for prefix in READINESS_TASKS:
                if task.startswith(prefix):
                    instance = task[len(prefix) :].split()[0]
        failure = Failure(host=name, task=task, message=_message(res), kind=kind, instance=instance)
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
                {"host": f.host, "task": f.task, "kind": f.kind, "message": f.message, "sentence": f.sentence()}
                for f in self.failures
            ],
        }


@dataclass
class RunRequest:
    playbook: str  # "site" or "rollout"
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
    verbose: int = 0
    json: bool = False


def runner_kwargs(req: RunRequest, coll: Collection, private_dir: Path) -> dict[str, Any]:
    """The one ansible_runner.run() call a request makes (its keyword arguments)."""
    inventory = Path(req.inventory).expanduser()
    if not inventory.exists():
        raise UsageError(
            "-i %s: no such inventory file or folder; give the path of your inventory (e.g. inventories/lab)"
            % req.inventory
        )
    playbook = {
        "site": coll.site_playbook,
        "rollout": coll.rollout_playbook,
        "status": coll.root / "playbooks" / "status.yml",
    }[req.playbook]
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
    if req.verbose > 1:
        cmdline.append("-" + "v" * (req.verbose - 1))
    kwargs: dict[str, Any] = {
        "private_data_dir": str(private_dir),
        "playbook": str(playbook),
        "inventory": str(inventory.resolve()),
        "envvars": settings_env(coll),
        "extravars": req.extravars,
        "quiet": req.verbose == 0,
        # keep the fact cache of the configuration in use (ansible-runner would point it into the run)
        "fact_cache_type": "",
    }
    if cmdline:
        kwargs["cmdline"] = shlex.join(cmdline)
    for key in ("limit", "tags", "skip_tags"):
        if getattr(req, key):
            kwargs[key] = getattr(req, key)
    return kwargs


def _execute(req: RunRequest, view: RunView, err: TextIO) -> tuple[Any, Path] | int:
    """One ansible-runner run for the request: (result, log path), or 2 on bad input."""
    import ansible_runner

    coll = locate_collection()
    # A folder per run: ansible-runner keeps a run's inputs (env/cmdline, env/extravars) in its
    # private data folder and would hand them to the next run that gives none.
    runs = cache_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    private_dir = runs / ("%s-%s-%s" % (time.strftime("%Y%m%d-%H%M%S"), req.playbook, uuid.uuid4().hex[:8]))
    private_dir.mkdir(mode=0o700)
    for old in sorted(p for p in runs.iterdir() if p.is_dir())[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    try:
        kwargs = runner_kwargs(req, coll, private_dir)
    except UsageError as exc:
        print("gpufleet: %s" % exc, file=err)
        return 2
    if req.ask_vault_pass:
        secret = getpass.getpass("Vault password: ")
        kwargs["passwords"] = {r"^Vault password:\s*?$": secret}
    try:
        result = ansible_runner.run(event_handler=view.handle, **kwargs)
    finally:
        # the extra vars may hold secrets (keys), and ansible-runner writes the whole environment
        # (tokens included) into artifacts/ID/command: neither outlives the run
        shutil.rmtree(private_dir / "env", ignore_errors=True)
        for command in private_dir.glob("artifacts/*/command"):
            command.unlink()
    return result, private_dir / "artifacts" / str(result.config.ident) / "stdout"


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


def run_playbook(req: RunRequest, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the request; print the live view (or raw output, or JSON) and the ending. Returns the rc."""
    out, err = out or sys.stdout, err or sys.stderr
    live = not req.json and req.verbose == 0 and out.isatty()
    view = RunView(out=out, live=live, quiet=req.json or req.verbose > 0)
    if not req.json and req.verbose == 0:
        print("gpufleet: %s on %s" % (req.playbook, req.inventory), file=out)
    done = _execute(req, view, err)
    if isinstance(done, int):
        return done
    result, log = done
    view.draw(force=True)
    rc = result.rc if isinstance(result.rc, int) else 1
    summary = dict(view.summary(), rc=rc, status=result.status, log=str(log), playbook=req.playbook)
    if req.json:
        print(json.dumps(summary, indent=2, sort_keys=True), file=out)
        return rc
    if not live:
        for line in view.lines()[1:]:
            print(line, file=out)
    if rc == 0:
        print("gpufleet: %s finished (%s); full log: %s" % (req.playbook, result.status, log), file=out)
    else:
        _print_failures(view, req.playbook, rc, result.status, log, err)
    return rc


def _pct(value: Any) -> str:
    return "-" if value is None else "%.1f%%" % (100.0 * value)


def status_rows(reports: dict[str, Any]) -> list[list[str]]:
    """The status table: one row per engine instance (one per host without any)."""
    rows = [["HOST", "DRIVER", "NCCL", "ENGINE", "STATE", "MODEL", "TP", "GPUS", "KV CACHE", "RUNNING", "WAITING"]]
    for host in sorted(reports):
        r = reports[host]
        head = [host, r.get("driver_version") or "-", r.get("nccl") or "-"]
        if not r.get("engines"):
            rows.append([*head, "-", "no engine", "-", "-", "-", "-", "-", "-"])
        for e in r.get("engines") or []:
            state = "serving" if e.get("serving") else "NOT SERVING (unit %s)" % e.get("unit")
            rows.append(
                [
                    *head,
                    "%s %s:%s" % (e.get("name"), e.get("engine"), e.get("port")),
                    state,
                    str(e.get("model") or "-"),
                    str(e.get("tensor_parallel_size") or "-"),
                    str(e.get("gpus") or "-"),
                    _pct(e.get("kv_cache_usage")),
                    "-" if e.get("running") is None else str(e["running"]),
                    "-" if e.get("waiting") is None else str(e["waiting"]),
                ]
            )
    return rows


def run_status(req: RunRequest, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """gpufleet status: the read-only status.yml, printed as a table (or JSON). Exit 0 when every
    instance serves, 1 when one does not, the run's rc when a host could not be read."""
    out, err = out or sys.stdout, err or sys.stderr
    view = RunView(out=out, live=False, quiet=True)
    done = _execute(req, view, err)
    if isinstance(done, int):
        return done
    result, log = done
    rc = result.rc if isinstance(result.rc, int) else 1
    down = [
        "%s/%s" % (host, e.get("name"))
        for host, r in view.reports.items()
        for e in r.get("engines") or []
        if not e.get("serving")
    ]
    if req.json:
        print(json.dumps({"hosts": view.reports, "rc": rc, "log": str(log)}, indent=2, sort_keys=True), file=out)
    else:
        rows = status_rows(view.reports)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out)
    if rc != 0:
        _print_failures(view, "status", rc, result.status, log, err)
        return rc
    if down:
        print("gpufleet: not serving: %s" % ", ".join(down), file=err)
        return 1
    return 0
