"""make bench-models, second part: large answers and bodies through the edge's token accounting
(issue 47). Figures, not assertions.

Real nginx (Debian's, with its Lua module) runs the edge role's own site with a usage store
(Debian's redis-server, the role's redis.conf) and ONE worker, so every request shares the worker
that reads the payload; behind it the labtests' stand-in proxies (tests/labtests/files/
usage_responder.py) answer in vLLM 0.32's framing with the usage each request decides. For each
payload, a probe (a small completion on another key and model, whose stand-in runs in a process
of its own) is sent every 20 ms on the same edge while the payload passes; the table gives the
probes' p50 and max against the same probes with nothing passing (measured in the same run), the
payload's own time, and the tokens the edge counted against those the stand-in answered:
- rerank-8MB: a rerank whose `usage` comes before 8 MB of echoed documents (and an 8 MB request);
- logprobs-8MB: a chat answer with 8 MB of prompt logprobs after its `usage`;
- echo-stream-8MB: a completions stream whose first event is 8 MB (echo with logprobs);
- padded-30MB: a stream request padded with 30 MB of spaces (the edge adds stream_options).
Then 8 clients at once on a key with 100 tokens a day, each sending 210-token completions until
refused: the tokens that passed against the limit (the overshoot).
With --before REV the same payloads also run through the edge's Lua as it was at REV (git show),
in a second nginx of the same container, so the table shows both in one run.

    python tests/bench/edge_payloads.py [--before REV]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models_bench import HARNESS, ROOT, redis_conf, render

PASSWORD = "bench-payload-store-0123456789"
PROBE = "bench-probe-key-0123456789abcdef012345678"
KEYS = [{"name": "probe", "key": PROBE}] + [
    {"name": n, "key": "bench-%s-key-0123456789abcdef0123456789" % n}
    for n in ("rerank", "logprobs", "echo", "padded")
] + [{"name": "burst", "key": "bench-burst-key-0123456789abcdef012345678", "tokens_per_day": 100}]  # fmt: skip

CLIENT = r"""
import concurrent.futures, http.client, json, os, statistics, subprocess, sys, threading, time
keys = json.loads(sys.argv[1])
ports = json.loads(sys.argv[2])
def post(port, key, body, path="/v1/chat/completions", timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(),
              {"Authorization": "Bearer " + keys[key], "Content-Type": "application/json"})
    r = c.getresponse()
    n = len(r.read())
    return r.status, n
probe_body = {"model": "tiny-mha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
def probes(port, stop, into):
    while not stop.is_set():
        t = time.perf_counter()
        post(port, "probe", probe_body)
        into.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)
payloads = {
    "rerank-8MB": ({"model": "tiny-llama", "query": "q", "documents": ["d" * 1000] * 8000}, "/v1/rerank",
                   {"prompt": 0, "completion": 80000}),
    "logprobs-8MB": ({"model": "tiny-llama", "messages": [], "max_tokens": 3, "prompt_logprobs": 140000},
                     "/v1/chat/completions", {"prompt": 10, "completion": 3}),
    "echo-stream-8MB": ({"model": "tiny-llama", "prompt": "p", "max_tokens": 6, "stream": True, "echo": True,
                         "logprobs": 1, "first_event_bytes": 8000000}, "/v1/completions",
                        {"prompt": 10, "completion": 6}),
    "padded-30MB": ((json.dumps({"model": "tiny-llama", "messages": [], "max_tokens": 4, "stream": True})
                     + " " * 30000000).encode(), "/v1/chat/completions", {"prompt": 10, "completion": 4}),
}
owner = {"rerank-8MB": "rerank", "logprobs-8MB": "logprobs", "echo-stream-8MB": "echo", "padded-30MB": "padded"}
def store(port_name, *args):
    env = dict(os.environ, REDISCLI_AUTH=sys.argv[3])
    out = subprocess.run(["redis-cli", "-p", str({"after": 6379, "before": 6380}[port_name]), "--no-auth-warning",
                          *args], capture_output=True, text=True, env=env).stdout.split()
    return dict(zip(out[::2], map(int, out[1::2])))
result = {}
for name, port in ports.items():
    rows = {}
    idle = []
    stop = threading.Event()
    t = threading.Thread(target=probes, args=(port, stop, idle)); t.start(); time.sleep(2); stop.set(); t.join()
    rows["idle"] = {"p50": statistics.median(idle), "max": max(idle), "n": len(idle)}
    for what, (body, path, usage) in payloads.items():
        got = []
        stop = threading.Event()
        t = threading.Thread(target=probes, args=(port, stop, got)); t.start()
        time.sleep(0.1)
        t0 = time.perf_counter()
        status, size = post(port, owner[what], body, path)
        took = time.perf_counter() - t0
        stop.set(); t.join()
        time.sleep(1.5)
        counted = store(name, "HGETALL", "gu:%s:tiny-llama" % owner[what])
        rows[what] = {"status": status, "bytes": size, "seconds": took, "p50": statistics.median(got),
                      "max": max(got), "n": len(got), "counted": counted, "answered": usage}
    # 8 clients at once on 100 tokens a day, 210-token completions until refused
    burst = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    def client(_):
        n = 0
        for _ in range(40):
            status, _size = post(port, "burst", burst)
            if status != 200:
                break
            n += 1
        return n
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        passed = sum(pool.map(client, range(8)))
    rows["burst"] = {"passed": passed, "tokens": passed * 210, "limit": 100}
    result[name] = rows
print("RESULT " + json.dumps(result))
"""

SCRIPT = """
set -e
apt-get update -qq >/dev/null 2>&1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light libnginx-mod-http-lua \\
  lua-cjson redis-server >/dev/null 2>&1
nginx -v 2>&1
redis-server /bench/redis.conf --supervised no --daemonize yes --pidfile /tmp/redis.pid --logfile /tmp/redis.log \\
  --dir /tmp
# one process each: the probe's stand-in (tiny-mha, 9303) never waits on a payload's (Python's GIL)
for port in 9301 9302 9303; do python3 /bench/usage_responder.py $port & done
nginx -c /bench/models.conf
if [ -d /bench/before ]; then
  # (its own store: the counts of each edge apart)
  mkdir -p /tmp/r2
  redis-server /bench/redis.conf --port 6380 --supervised no --daemonize yes --pidfile /tmp/redis2.pid \\
    --logfile /tmp/redis2.log --dir /tmp/r2
  cp -r /bench/before /tmp/before
  sed -i 's#/tmp/models#/tmp/bmodels#g' /tmp/before/models.conf /tmp/before/conf/models-site.conf
  nginx -c /tmp/before/models.conf
fi
sleep 0.5
python3 /bench/client.py "$@"
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", metavar="REV", help="also run the edge's Lua as it was at git revision REV")
    args = ap.parse_args()
    image = subprocess.run([str(HARNESS), "image", "host"], check=True, capture_output=True, text=True).stdout.strip()
    quota = {"port": 6379, "password": PASSWORD, "fail_open": True}
    ports = {"after": 8080}
    with tempfile.TemporaryDirectory(prefix="bench-payloads-") as tmp:
        out = Path(tmp)
        out.chmod(0o755)
        render(out, keys=KEYS, quota=quota, backends_conf=None)
        redis_conf(out / "redis.conf", PASSWORD, edges=["edge"], by="make bench-models")
        if args.before:
            quota_before = dict(quota, port=6380)
            render(out / "before", keys=KEYS, quota=quota_before, backends_conf=None, listen=8083,
                   conf_dir="/tmp/before/conf")  # fmt: skip
            lua = out / "before" / "conf" / "lua"
            for p in lua.iterdir():
                p.unlink()
            for name in ("gpufleet_edge.lua", "gpufleet_quota.lua"):
                text = subprocess.run(["git", "-C", str(ROOT), "show", "%s:roles/edge/files/%s" % (args.before, name)],
                                      check=True, capture_output=True, text=True).stdout  # fmt: skip
                (lua / name).write_text(text)
            ports["before"] = 8083
        (out / "usage_responder.py").write_text((ROOT / "tests/labtests/files/usage_responder.py").read_text())
        (out / "client.py").write_text(CLIENT)
        (out / "run.sh").write_text(textwrap.dedent(SCRIPT))
        keys = {k["name"]: k["key"] for k in KEYS}
        done = subprocess.run(
            ["docker", "run", "--rm", "-v", "%s:/bench:ro" % tmp, image, "sh", "/bench/run.sh", json.dumps(keys),
             json.dumps(ports), PASSWORD],
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not result:
        print(done.stdout[-5000:], done.stderr[-5000:], file=sys.stderr)
        return 1
    data = json.loads(result[0][len("RESULT ") :])
    nginx = next((line for line in done.stdout.splitlines() if "nginx version" in line), "nginx").strip()
    lines = [
        "make bench-models, payloads: a probe's latency on the edge's one worker while each payload passes, and the",
        "tokens counted (%s with its Lua module, one worker, the usage store on loopback; stand-in proxies)" % nginx,
        "%-8s %-16s %7s %9s %8s %9s %9s %9s %-22s %-22s"
        % ("Lua", "payload", "status", "bytes", "seconds", "probe p50", "probe max", "max-idle", "counted p/c",
           "answered p/c"),
    ]  # fmt: skip
    for name, rows in data.items():
        idle = rows["idle"]
        lines.append("%-8s %-16s %7s %9s %8s %9.1f %9.1f %9s %-22s %-22s" % (name, "(nothing)", "", "", "", idle["p50"],
                                                                           idle["max"], "", "", ""))  # fmt: skip
        for what, r in rows.items():
            if what in ("idle", "burst"):
                continue
            c = r["counted"]
            lines.append(
                "%-8s %-16s %7d %9d %8.2f %9.1f %9.1f %+9.1f %-22s %-22s"
                % (name, what, r["status"], r["bytes"], r["seconds"], r["p50"], r["max"], r["max"] - idle["max"],
                   "%s/%s" % (c.get("prompt", 0), c.get("completion", 0)),
                   "%d/%d" % (r["answered"]["prompt"], r["answered"]["completion"]))
            )  # fmt: skip
        b = rows["burst"]
        lines.append(
            "%-8s burst: 8 clients at once on %d tokens a day passed %d requests, %d tokens (%.1fx the limit)"
            % (name, b["limit"], b["passed"], b["tokens"], b["tokens"] / b["limit"])
        )
    lines.append("probe: a 4-token chat on another key every 20 ms on the same worker; max-idle: its max less the")
    lines.append("max with nothing passing; counted p/c: the usage store's prompt/completion for the payload's key")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (ROOT / ".cache").mkdir(exist_ok=True)
    (ROOT / ".cache" / "bench-edge-payloads.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
