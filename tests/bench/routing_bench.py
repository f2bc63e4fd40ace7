"""make bench-routing's measurements, run by molecule/fleet/bench_routing.yml on the fleet lab
(three vLLM CPU replicas behind the edge's router). For each policy in GPUFLEET_BENCH_POLICIES:
switch the router's policy (its unit on the edge host), run `gpufleet bench --turns` through the
edge, and read the engines' own prefix cache counters and the router's per-instance counts before
and after. Then the router's added latency at concurrency 1: one-token completions sent in turn
to the router and to the edge's nginx loopback path it uses (nginx alone), on the edge host.
Prints a table and writes it to OUT.

    routing_bench.py EDGE_URL OUT        (GPUFLEET_API_KEY, SSL_CERT_FILE in the environment)
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

# the collection from this checkout (status's metric reader)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "collections"))
from ansible_collections.gpufleet.serving.plugins.module_utils._status import parse_metrics

EDGE = "lab-fleet-edge"
ROUTER = "http://127.0.0.1:8090"
# The workload: conversations of 6 turns, each resending the history: a 240-word opening prompt
# whose first 80 words every conversation shares, then 30 new words and an 8-token reply per
# turn; 6 conversations at once, 24 per policy. The tiny model's tokenizer makes about 3.6
# tokens of each bench word, so the opening is about 870 tokens and the last turn about 1650,
# under its 2048-token context; prefill of the history dominates each turn.
BENCH = ["--concurrency", "6", "--requests", "144", "--turns", "6", "--turn-tokens", "30", "--prompt-tokens", "240",
         "--shared-prefix", "80", "--output-tokens", "8", "--timeout", "600"]  # fmt: skip


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True).stdout


def edge(cmd):
    return sh("docker", "exec", EDGE, "sh", "-c", cmd)


def workers():
    return json.loads(edge("curl -fsS %s/workers" % ROUTER))["workers"]


def counters(instances):
    """{instance: (prefix cache queries, hits)} from each engine's /metrics (tokens), read as
    `gpufleet status` reads them."""
    out = {}
    for host, name in instances:
        load = parse_metrics(sh("docker", "exec", host, "curl", "-fsS", "http://127.0.0.1:9091/metrics/%s" % name))
        out[(host, name)] = (load["prefix_cache_queries"] or 0, load["prefix_cache_hits"] or 0)
    return out


def routed():
    """{worker URL: requests the router sent it} from the router's metrics."""
    page = edge("curl -fsS http://127.0.0.1:9097/metrics")
    found = re.findall(r'^vllm_router_processed_requests_total\{worker="([^"]+)"\} (\S+)$', page, re.M)
    return {w: float(n) for w, n in found}


def switch(policy):
    unit = "/etc/systemd/system/gpufleet-router.service"
    edge("sed -i 's/--policy [a-z_]*/--policy %s/' %s && systemctl daemon-reload && systemctl restart gpufleet-router"
         % (policy, unit))  # fmt: skip
    for _ in range(60):
        time.sleep(1)
        try:
            ws = workers()
        except (subprocess.CalledProcessError, ValueError):
            continue
        if len(ws) == 3 and all(w["is_healthy"] for w in ws):
            return
    raise SystemExit("the router did not come back with 3 healthy workers under %s" % policy)


# One-token completions in turn to the router and to nginx's loopback path, on the edge host.
OVERHEAD = r"""
import http.client, json, statistics, sys, time
key, pairs = sys.argv[1], int(sys.argv[2])
body = json.dumps({"model": "tiny-llama", "prompt": "Hello there", "max_tokens": 1}).encode()
head = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
paths = {"router": (8090, "/v1/completions"), "nginx": (8091, "/gpufleet/b/lab-fleet-a/tiny/v1/completions")}
conns = {k: http.client.HTTPConnection("127.0.0.1", p) for k, (p, _) in paths.items()}
times = {k: [] for k in paths}
for i in range(pairs + 5):
    for k in (("router", "nginx") if i % 2 else ("nginx", "router")):
        for attempt in (1, 2):
            t = time.perf_counter()
            try:
                conns[k].request("POST", paths[k][1], body, head)
                r = conns[k].getresponse(); r.read()
                break
            except (http.client.HTTPException, OSError):
                # a keepalive connection the server closed: a new one, and this sample is not kept
                conns[k].close(); conns[k] = http.client.HTTPConnection("127.0.0.1", paths[k][0]); i = min(i, 4)
        assert r.status == 200, (k, r.status, r.read())
        if i >= 5:
            times[k].append(time.perf_counter() - t)
    time.sleep(0.1)  # under the proxy's per-key rate limit (proxy_rate_limit, 20 r/s)
print(json.dumps(times))
"""


def main(argv):
    url, out_file = argv[1], argv[2]
    policies = os.environ.get("GPUFLEET_BENCH_POLICIES", "round_robin,cache_aware,consistent_hash").split(",")
    instances = [tuple(w["url"].rsplit("/", 2)[-2:]) for w in workers()]
    if len(instances) < 3:
        raise SystemExit("the router has %d workers; make bench-routing needs three replicas" % len(instances))
    rows = []
    # fresh prompts in every run and every round: no round finds an earlier one's in a cache
    base_seed = int(time.time()) % 100000 * 10
    for seed, policy in enumerate(policies, base_seed + 1):
        switch(policy)
        before, sent_before = counters(instances), routed()
        report = json.loads(sh("gpufleet", "bench", url, "--json", "--seed", str(seed), *BENCH, check=False))
        after, sent_after = counters(instances), routed()
        queries = sum(after[i][0] - before[i][0] for i in instances)
        hits = sum(after[i][1] - before[i][1] for i in instances)
        level = report["levels"][0]
        if not level["ok"]:
            raise SystemExit("%s: no request succeeded: %s" % (policy, level["errors"]))
        spread = [int(sent_after.get(w, 0) - sent_before.get(w, 0)) for w in sorted(sent_after)]
        rows.append({
            "policy": policy, "ok": level["ok"], "failed": level["failed"],
            "ttft_p50_ms": level["ttft_ms"]["p50"], "ttft_p90_ms": level["ttft_ms"]["p90"],
            "output_tok_s": level["output_token_throughput"], "prompt_tokens_mean": level["prompt_tokens_mean"],
            "hit_rate": hits / queries if queries else None, "per_instance": spread,
        })  # fmt: skip
    # The router's own cost, with the engine's time taken out: cache_aware (the default policy,
    # which asks the instance for /render and /tokenize first), one worker left (lab-fleet-a's
    # tiny, which the nginx-alone path reaches too), one-token completions in turn on both paths.
    switch("cache_aware")
    others = [w["url"] for w in workers() if not w["url"].endswith("/lab-fleet-a/tiny")]
    for url in others:
        edge("curl -fsS -X POST '%s/remove_worker?url=%s'" % (ROUTER, quote(url, safe="")))
    subprocess.run(["docker", "exec", "-i", EDGE, "sh", "-c", "cat > /tmp/gpufleet-overhead.py"],
                   input=OVERHEAD, text=True, check=True)  # fmt: skip
    times = json.loads(edge("python3 /tmp/gpufleet-overhead.py %s 200" % os.environ["GPUFLEET_API_KEY"]))
    for url in others:
        edge("curl -fsS -X POST '%s/add_worker?url=%s'" % (ROUTER, quote(url, safe="")))
    diffs = [a - b for a, b in zip(times["router"], times["nginx"], strict=True)]
    lines = ["make bench-routing: %d conversations x 6 turns per policy, 6 at once, through the edge" % 24,
             "(3 vLLM CPU replicas of the tiny model; mean prompt %.0f tokens)" % (rows[0]["prompt_tokens_mean"] or 0),
             "", "%-16s %4s %6s %13s %13s %12s %14s  %s" % (
                 "policy", "ok", "failed", "TTFT p50 ms", "TTFT p90 ms", "output tok/s", "prefix hits",
                 "requests per instance")]  # fmt: skip
    for r in rows:
        lines.append("%-16s %4d %6d %13.1f %13.1f %12.1f %13.1f%%  %s" % (
            r["policy"], r["ok"], r["failed"], r["ttft_p50_ms"], r["ttft_p90_ms"], r["output_tok_s"],
            100 * (r["hit_rate"] or 0), r["per_instance"]))  # fmt: skip
    base = rows[0]
    lines.append("")
    for r in rows[1:]:
        lines.append("%s against %s: TTFT p50 %.2fx better, prefix hit rate %.2fx" % (
            r["policy"], base["policy"], base["ttft_p50_ms"] / r["ttft_p50_ms"],
            (r["hit_rate"] / base["hit_rate"]) if base["hit_rate"] else float("nan")))  # fmt: skip
    lines.append("")
    lines.append("router's added latency at concurrency 1 (cache_aware, one worker; one-token completions, %d pairs"
                 " in turn, on the edge host):" % len(diffs))  # fmt: skip
    lines.append("  nginx alone p50 %.2f ms, through the router p50 %.2f ms, median difference %.2f ms" % (
        1000 * statistics.median(times["nginx"]), 1000 * statistics.median(times["router"]),
        1000 * statistics.median(diffs)))  # fmt: skip
    text = "\n".join(lines) + "\n"
    with open(out_file, "w") as f:
        f.write(text)
    print(text + json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
