"""make bench-ready, the fan-out: one model to the fleet lab's three gpu hosts from the model store,
against each host fetching it from a bandwidth-limited upstream (tests/lab/upstream-standin, a
STAND-IN for the hub serving its file layout from lab-fleet-edge, every connection sharing one
uplink), the same bytes (store-llama: 330 MB of safetensors in four shards), the same run. Figures,
not assertions. Run on a converged fleet lab (molecule/fleet/bench_ready.yml runs it):
- upstream, 3 hosts at once: each host's gpufleet-model pull from the stand-in;
- store fill: the store fetching the model once from the stand-in;
- store, 1 host: one host's pull from the store (the copy time the target is set against);
- store, 3 hosts at once: the fan-out;
- the same two, each host's pull capped at the uplink's rate (--rate, engine_model_pull_rate): each
  host's own link the limit, as in a fleet, rather than this machine's two cores, which the three
  pulls' TLS and sha256 share.
The target (issue 48): the fan-out within 1.3 times one host's copy from the store.

    python tests/bench/ready_bench.py OUT_FILE [--uplink BYTES_A_SECOND]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["lab-fleet-a", "lab-fleet-b", "lab-fleet-c"]
STORE = "lab-fleet-edge"
MODEL = "store-llama"
HELPER = "/usr/local/libexec/gpufleet/gpufleet-model"
TLS = "/etc/gpufleet/model-client"
DEST = "/srv/models/bench-ready"


def sh(host, *argv, check=True):
    done = subprocess.run(["docker", "exec", host, *argv], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SystemExit("%s: %s failed: %s %s" % (host, " ".join(argv), done.stdout, done.stderr))
    return done.stdout.strip()


def address(host):
    return subprocess.run(
        ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", host],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def timed(jobs):
    """Runs each (host, argv) at once; the wall time until the last ends, and each one's."""
    each = {}

    def one(job):
        host, argv = job
        t = time.monotonic()
        sh(host, *argv)
        each[host] = time.monotonic() - t

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(one, jobs))
    return time.monotonic() - t0, each


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--uplink", type=int, default=50_000_000, help="the upstream's bytes a second, all hosts together")
    args = ap.parse_args()
    edge = address(STORE)
    folder = "/srv/gpufleet/store/%s" % MODEL
    size = int(sh(STORE, "python3", "-c", "import json; print(json.load(open('%s/.gpufleet/manifest.json'))"
                  "['total_size'])" % folder))  # fmt: skip
    # the stand-in on the edge host, serving the store's copy under the hub's layout
    subprocess.run(["docker", "cp", str(ROOT / "tests" / "lab" / "upstream-standin"), "%s:/usr/local/bin/" % STORE],
                   check=True)  # fmt: skip
    sh(STORE, "sh", "-c", "pkill -f upstream-standin; true", check=False)
    subprocess.run(["docker", "exec", "-d", STORE, "python3", "/usr/local/bin/upstream-standin", folder, "9300",
                    str(args.uplink), "org/%s" % MODEL], check=True)  # fmt: skip
    # the firewall role lets the gpu hosts reach the store's port only: the stand-in's port is opened
    # for the bench (a handle to delete it after); the hub is outside the fleet's firewall
    rule = sh(STORE, "nft", "--echo", "--handle", "insert", "rule", "inet", "gpufleet", "input", "tcp", "dport", "9300",
              "accept", check=False)  # fmt: skip
    handle = rule.split("# handle", 1)[1].split()[0] if "# handle" in rule else None
    time.sleep(1)
    upstream = "http://%s:9300/org/%s/resolve/main/" % (edge, MODEL)
    store = "https://%s:8444/models/%s/" % (edge, MODEL)
    tls = ["--ca", TLS + "/fleet-ca.crt", "--cert", TLS + "/model-client.crt", "--key", TLS + "/model-client.key",
           "--server-name", STORE]  # fmt: skip

    def clean(hosts):
        for h in hosts:
            sh(h, "rm", "-rf", DEST, DEST + ".gpufleet-partial")

    rows = []
    try:
        clean(HOSTS)
        wall, each = timed([(h, [HELPER, "pull", upstream, DEST]) for h in HOSTS])
        rows.append(("upstream, 3 hosts at once", wall, each))
        sh(STORE, "rm", "-rf", "/srv/gpufleet/bench-fill", "/srv/gpufleet/bench-fill.gpufleet-partial")
        fill, _ = timed([(STORE, [HELPER, "pull", upstream, "/srv/gpufleet/bench-fill"])])
        rows.append(("store fill, once", fill, {}))
        clean(HOSTS)
        one, each = timed([(HOSTS[0], [HELPER, "pull", store, DEST, *tls])])
        rows.append(("store, 1 host", one, each))
        clean(HOSTS)
        fan, each = timed([(h, [HELPER, "pull", store, DEST, *tls]) for h in HOSTS])
        rows.append(("store, 3 hosts at once", fan, each))
        # each host's own link the limit (engine_model_pull_rate; here the uplink's rate per host), not
        # this machine's two cores, which the three pulls' TLS and sha256 share in the rows above
        cap = ["--rate", str(args.uplink)]
        clean(HOSTS)
        one_cap, each = timed([(HOSTS[0], [HELPER, "pull", store, DEST, *tls, *cap])])
        rows.append(("store, 1 host, capped", one_cap, each))
        clean(HOSTS)
        fan_cap, each = timed([(h, [HELPER, "pull", store, DEST, *tls, *cap]) for h in HOSTS])
        rows.append(("store, 3 at once, capped", fan_cap, each))
    finally:
        clean(HOSTS)
        sh(STORE, "rm", "-rf", "/srv/gpufleet/bench-fill", check=False)
        sh(STORE, "sh", "-c", "pkill -f upstream-standin; true", check=False)
        if handle:
            sh(STORE, "nft", "delete", "rule", "inet", "gpufleet", "input", "handle", handle, check=False)
    lines = [
        "make bench-ready, fan-out: %s (%.0f MB) to the fleet lab's %d gpu hosts; upstream: a stand-in for the hub,"
        % (MODEL, size / 1e6, len(HOSTS)),
        "%.0f MB/s shared by every connection; the store: lab-fleet-edge over the fleet's TLS; every file verified"
        % (args.uplink / 1e6),
        "%-26s %9s %9s   %s" % ("", "wall s", "MB/s", "each host (s)"),
    ]
    for name, wall, each in rows:
        n = max(len(each), 1)
        hosts = " ".join("%s %.2f" % (h, t) for h, t in sorted(each.items()))
        lines.append("%-26s %9.2f %9.1f   %s" % (name, wall, n * size / wall / 1e6, hosts))
    up, fill, one, fan, one_cap, fan_cap = (r[1] for r in rows)
    lines.append("fan-out / one host from the store: %.2fx (target <= 1.3x)" % (fan / one))
    lines.append("fan-out / one host, each host capped at %.0f MB/s: %.2fx" % (args.uplink / 1e6, fan_cap / one_cap))
    lines.append("store (fill once + fan-out) / every host from upstream: %.2fx" % ((fill + fan) / up))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
