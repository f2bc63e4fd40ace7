"""Where could a local user or a log reader find the engine key? Run as root on the lab host.

    python3 leak_check.py SECRET_ENV_FILE

The key is read from the instance's secret env file, never passed as an argument or through
Ansible's `environment:` (which prefixes the remote command line with it, visible in ps).
Prints one JSON object: the key's length and the places it was found.
"""

import json
import os
import shlex
import stat
import subprocess
import sys

key = None
with open(sys.argv[1]) as secret:
    for line in secret:
        if line.startswith("VLLM_API_KEY="):
            key = shlex.split(line.split("=", 1)[1])[0].encode()
if not key:
    sys.exit("no VLLM_API_KEY in %s" % sys.argv[1])
found = []

# Every process's command line (what `ps` shows to any user).
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as handle:
            if key in handle.read():
                found.append("cmdline of pid %s" % pid)
    except OSError:
        pass

# The journal of the engine units and Docker.
journal = subprocess.run(
    ["journalctl", "--no-pager", "-u", "gpufleet-engine@*", "-u", "docker", "-u", "gpufleet-engine-watchdog@*"],
    capture_output=True,
    check=False,
).stdout
if key in journal:
    found.append("journal")

# docker inspect of every container (readable by anyone in the docker group).
ids = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True, check=False).stdout.split()
if ids and key in subprocess.run(["docker", "inspect", *ids], capture_output=True, check=False).stdout:
    found.append("docker inspect")

# Files that anyone but root can read.
for top in ("/etc", "/usr/local", "/var/log", "/run", "/srv"):
    for dirpath, _, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode) or info.st_size > 10 * 2**20:
                    continue
                with open(path, "rb") as handle:
                    if key in handle.read() and (info.st_mode & 0o077 or info.st_uid != 0):
                        found.append("%s (mode %o)" % (path, info.st_mode & 0o777))
            except OSError:
                pass

print(json.dumps({"key_length": len(key), "found": found}))
