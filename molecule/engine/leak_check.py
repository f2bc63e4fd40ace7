"""Where could a local user or a log reader find a secret? Run as root on the lab host.

    python3 leak_check.py SECRET_ENV_FILE CLIENT_KEY_MAP

The secrets are read from the files that hold them (the instance's secret env file: the
engine key and every secret_env value; the proxy's client-key map: each client key), never
passed as arguments or through Ansible's `environment:` (which prefixes the remote command
line with them, visible in ps). Prints one JSON object: how many secrets were looked for
and the places any of them was found (never the secret itself).
"""

import json
import os
import re
import shlex
import stat
import subprocess
import sys

secrets = []
with open(sys.argv[1]) as handle:
    for line in handle:
        if re.match(r"^[A-Z_][A-Z0-9_]*=", line):
            secrets.append(shlex.split(line.split("=", 1)[1])[0].encode())
with open(sys.argv[2]) as handle:
    for line in handle:
        match = re.match(r'^"~\^\[Bb\]\[Ee\]\[Aa\]\[Rr\]\[Ee\]\[Rr\] \+(.*)\$" ', line)
        if match:
            secrets.append(re.sub(r"\\(.)", r"\1", match.group(1)).encode())
if not secrets:
    sys.exit("found %d secrets in %s and %s" % (len(secrets), sys.argv[1], sys.argv[2]))
found = []


def look(where, data):
    for i, secret in enumerate(secrets):
        if secret in data:
            found.append("%s (secret %d)" % (where, i))


# Every process's command line (what `ps` shows to any user).
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as handle:
            look("cmdline of pid %s" % pid, handle.read())
    except OSError:
        pass

# The journal of the engine units, Docker and nginx.
journal = subprocess.run(
    ["journalctl", "--no-pager", "-u", "gpufleet-engine@*", "-u", "gpufleet-engine-surge@*", "-u", "docker",
     "-u", "gpufleet-engine-watchdog@*", "-u", "nginx"],
    capture_output=True,
    check=False,
).stdout  # fmt: skip
look("journal", journal)

# docker inspect of every container (readable by anyone in the docker group).
ids = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True, check=False).stdout.split()
if ids:
    look("docker inspect", subprocess.run(["docker", "inspect", *ids], capture_output=True, check=False).stdout)

# Files that anyone but root can read.
for top in ("/etc", "/usr/local", "/var/log", "/run", "/srv", "/root", "/tmp", "/var/lib/gpufleet"):
    for dirpath, _, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode) or info.st_size > 10 * 2**20:
                    continue
                if info.st_mode & 0o077 or info.st_uid != 0:
                    with open(path, "rb") as handle:
                        look("%s (mode %o)" % (path, info.st_mode & 0o777), handle.read())
            except OSError:
                pass

print(json.dumps({"secrets": len(secrets), "found": found}))
