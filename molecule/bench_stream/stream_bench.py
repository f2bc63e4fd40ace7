"""Streaming benchmark: the same workload direct to the engine, through gpufleet's proxy and
through a stock nginx proxy_pass site, in one run. Runs on the lab host inside the engine
image (aiohttp comes with vLLM), so all three targets are on the host's loopback.

    python3 stream_bench.py ENGINE_KEY CLIENT_KEY

Every SSE event is timestamped on arrival. Greedy decoding (temperature 0) makes every
request produce the same text, so the SSE events the engine sends are the same count on
every path: a proxy that coalesced events would show fewer. Prints a table and one JSON line.
"""

import asyncio
import itertools
import json
import sys
import time

import aiohttp

ENGINE_KEY, CLIENT_KEY = sys.argv[1:3]
TARGETS = [
    ("direct", "http://127.0.0.1:8001", ENGINE_KEY),
    ("gpufleet", "http://127.0.0.1:8080", CLIENT_KEY),
    ("stock", "http://127.0.0.1:8090", ENGINE_KEY),
]
CONCURRENCY = [1, 8, 32]
MAX_TOKENS = 128


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def one(session, base, key):
    body = {
        "model": "tiny-llama", "prompt": "Tell me about the lab.", "max_tokens": MAX_TOKENS, "stream": True,
        "ignore_eos": True, "temperature": 0, "stream_options": {"include_usage": True},
    }  # fmt: skip
    start = time.perf_counter()
    stamps, tokens, events, together = [], 0, 0, 0
    async with session.post(base + "/v1/completions", json=body, headers={"Authorization": "Bearer " + key}) as resp:
        resp.raise_for_status()
        buf = b""
        async for chunk in resp.content.iter_any():
            now = time.perf_counter() - start
            buf += chunk
            in_this_read = 0
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                data = json.loads(event[6:])
                events += 1
                in_this_read += 1
                if data.get("usage"):
                    tokens = data["usage"]["completion_tokens"]
                if data.get("choices") and data["choices"][0].get("text"):
                    stamps.append(now)
            together += max(0, in_this_read - 1)
    return stamps, tokens, events, together


async def level(base, key, concurrency):
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        requests = max(2 * concurrency, 16)
        queue = list(range(requests))
        results = []

        async def worker():
            while queue:
                queue.pop()
                results.append(await one(session, base, key))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ttft = [r[0][0] for r in results if r[0]]
    gaps = [b - a for r in results for a, b in itertools.pairwise(r[0])]
    events = sum(r[2] for r in results)
    tokens = sum(r[1] for r in results)
    together = sum(r[3] for r in results)
    return {
        "requests": len(results), "ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p95_ms": pct(ttft, 0.95) * 1e3,
        "gap_p50_ms": pct(gaps, 0.5) * 1e3, "gap_p95_ms": pct(gaps, 0.95) * 1e3, "events": events, "tokens": tokens,
        "together_pct": 100.0 * together / max(events, 1),
        "tokens_per_s": tokens / wall,
    }  # fmt: skip


async def main():
    figures = {}
    async with aiohttp.ClientSession() as warm:  # load the engine's first-request paths
        for _, base, key in TARGETS:
            await one(warm, base, key)
    for n, concurrency in enumerate(CONCURRENCY):
        # Each level runs the three paths back to back, starting with a different one each time.
        for name, base, key in TARGETS[n % 3 :] + TARGETS[: n % 3]:
            figures["%s@%d" % (name, concurrency)] = await level(base, key, concurrency)
    header = "%-10s %4s %9s %9s %9s %9s %8s %8s %9s %9s" % (
        "path",
        "conc",
        "TTFT p50",
        "TTFT p95",
        "gap p50",
        "gap p95",
        "events",
        "tokens",
        "tok/s",
        "together",
    )
    print(header)
    print("-" * len(header))
    for concurrency in CONCURRENCY:
        for name, _, _ in TARGETS:
            f = figures["%s@%d" % (name, concurrency)]
            print("%-10s %4d %7.1fms %7.1fms %7.2fms %7.2fms %8d %8d %9.1f %8.1f%%" % (
                name, concurrency, f["ttft_p50_ms"], f["ttft_p95_ms"], f["gap_p50_ms"], f["gap_p95_ms"],
                f["events"], f["tokens"], f["tokens_per_s"], f["together_pct"]))  # fmt: skip
    print()
    print("%-6s %22s %22s %20s %20s" % ("conc", "TTFT p50 proxy-direct", "TTFT p50 stock-direct",
                                         "tok/s proxy/direct", "tok/s stock/direct"))  # fmt: skip
    for concurrency in CONCURRENCY:
        d, g, s = (figures["%s@%d" % (n, concurrency)] for n in ("direct", "gpufleet", "stock"))
        print("%-6d %19.2fms %19.2fms %20.3f %20.3f" % (
            concurrency, g["ttft_p50_ms"] - d["ttft_p50_ms"], s["ttft_p50_ms"] - d["ttft_p50_ms"],
            g["tokens_per_s"] / d["tokens_per_s"], s["tokens_per_s"] / d["tokens_per_s"]))  # fmt: skip
    print("BENCH_JSON " + json.dumps(figures))


asyncio.run(main())
