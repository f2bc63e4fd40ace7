"""Stock nginx vs gpufleet's proxy: what a client gets in the cases where they differ.
Runs on the lab host next to stream_bench.py.   python3 outcomes.py ENGINE_KEY CLIENT_KEY"""

import json
import sys
import urllib.error
import urllib.request

ENGINE_KEY, CLIENT_KEY = sys.argv[1:3]
STOCK, STOCK_SHORT, GPUFLEET = "http://127.0.0.1:8090", "http://127.0.0.1:8091", "http://127.0.0.1:8080"


def status(url, key, body=None, method=None):
    req = urllib.request.Request(url, data=body, method=method or ("POST" if body is not None else "GET"))
    req.add_header("Authorization", "Bearer " + key)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


long_answer = json.dumps({"model": "tiny-llama", "prompt": "Hi", "max_tokens": 2500, "ignore_eos": True}).encode()
big_prompt = json.dumps({"model": "tiny-llama", "prompt": "word " * 400_000, "max_tokens": 1}).encode()
rows = [
    (
        "non-streamed answer longer than the read timeout (stock 60 s scaled to 3 s; gpufleet 600 s)",
        status(STOCK_SHORT + "/v1/completions", ENGINE_KEY, long_answer),
        status(GPUFLEET + "/v1/completions", CLIENT_KEY, long_answer),
    ),
    (
        "2 MB prompt (stock client_max_body_size 1m; gpufleet 64m: the engine judges it)",
        status(STOCK + "/v1/completions", ENGINE_KEY, big_prompt),
        status(GPUFLEET + "/v1/completions", CLIENT_KEY, big_prompt),
    ),
    (
        "request without the engine key (stock passes the engine's own auth through)",
        status(STOCK + "/v1/models", "wrong"),
        status(GPUFLEET + "/v1/models", "wrong"),
    ),
]
for path, method in [("/metrics", "GET"), ("/tokenize", "POST"), ("/health", "GET"), ("/pause", "POST"),
                     ("/server_info", "GET")]:  # fmt: skip
    body = json.dumps({"model": "tiny-llama", "prompt": "x"}).encode() if method == "POST" else None
    rows.append((
        "engine path %s from outside" % path,
        status(STOCK + path, ENGINE_KEY, body, method),
        status(GPUFLEET + path, CLIENT_KEY, body, method),
    ))  # fmt: skip
print("%-88s %6s %9s" % ("case", "stock", "gpufleet"))
for case, stock, ours in rows:
    print("%-88s %6s %9s" % (case, stock, ours))
print("OUTCOMES_JSON " + json.dumps(rows))
