# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet lock's owner line, and whether a holder is a dead run on this controller.

Documented in fleet_lock_owner.yml and fleet_lock_stale.yml beside this file. A run is the
ansible-playbook process on the controller: its host name, machine id (/etc/machine-id), PID
and start time (from /proc) name it, so a lock left by a run that was killed or failed here is
recognised as stale, while a lock held from another controller is never broken without the
operator: not one with the same host name (its machine id differs), and not when this
controller cannot read its processes' start times (no /proc: a live run would look dead)."""

from __future__ import annotations

import getpass
import os
import re
import socket

OWNER = re.compile(r"controller=(?P<controller>\S+) pid=(?P<pid>\d+) start=(?P<start>\d+)")
MACHINE = re.compile(r"(?:^| )machine=(?P<machine>[0-9a-f]*)(?: |$)")
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def _machine_id():
    """This machine's id (systemd's machine-id(5): 32 hex digits), or "" when there is none."""
    for path in MACHINE_ID_FILES:
        try:
            with open(path) as f:
                value = f.read().strip().lower()
        except OSError:
            continue
        if re.fullmatch(r"[0-9a-f]{32}", value):
            return value
    return ""


def _start_time(pid):
    """The process's start time in clock ticks after boot (/proc/PID/stat field 22), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces
    return stat.rsplit(")", 1)[1].split()[19]


def _playbook_process():
    """(pid, start) of the ansible-playbook process this filter runs under, found by walking up
    the process tree. Tasks are templated in worker processes forked from it, whose command
    line is the same: the topmost of the chain is the run (a worker's PID would change from one
    task to the next, and the run that took the lock could not release it)."""
    pid, found = os.getpid(), None
    for _level in range(8):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%d/status" % pid) as f:
                ppid = int(re.search(r"^PPid:\s*(\d+)", f.read(), re.M).group(1))
        except (OSError, AttributeError):
            break
        if any(os.path.basename(a) == b"ansible-playbook" for a in argv[:3]):
            found = pid
        elif found is not None:
            break
        if ppid <= 1:
            break
        pid = ppid
    if found is None:
        found = os.getpid()
    return found, _start_time(found)


def fleet_lock_owner(playbook):
    """The line a run writes into the lock: who holds it, from where, since when."""
    pid, start = _playbook_process()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    # the same line every time one run asks (the lock file's own time says since when)
    return "controller=%s pid=%d start=%s user=%s playbook=%s machine=%s" % (
        socket.gethostname(),
        pid,
        start or 0,
        user,
        os.path.basename(str(playbook)),
        _machine_id(),
    )


def fleet_lock_stale(holder):
    """True when the holder line names a run on this controller that no longer runs."""
    line = str(holder or "")
    match = OWNER.search(line)
    if not match or match.group("controller") != socket.gethostname():
        return False
    # another machine of the same name: never ours to break (a line without an id is older)
    machine = MACHINE.search(line)
    if machine and machine.group("machine") != _machine_id():
        return False
    # without /proc no start time can be read, and every run would look dead
    if _start_time(os.getpid()) is None:
        return False
    return _start_time(int(match.group("pid"))) != match.group("start")


class FilterModule:
    def filters(self):
        return {"fleet_lock_owner": fleet_lock_owner, "fleet_lock_stale": fleet_lock_stale}
