"""Checks of gpufleet's proxy with real HTTP clients, run on the lab host (inside the engine
image with --network host, so both the proxy and the engine's loopback port are reachable).

    python3 proxy_check.py KEY_A

Prints one JSON object of observations; verify.yml asserts on them.
"""

import http.client
import json
import socket
import ssl
import sys
import threading
import time
import urllib.request

KEY = sys.argv[1]
# the engine's series names, from the registry (the engine_series filter, passed by verify.yml)
SERIES = json.loads(sys.argv[2])
PROXY = ("127.0.0.1", 8080)
ENGINE_METRICS = "http://127.0.0.1:9091/metrics/tiny"


def request(method, path, key=KEY, body=None, port=8080, tls=False, headers=None):
    if tls:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=ssl._create_unverified_context())
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    hdrs = {"Content-Type": "application/json"}
    if key:
        hdrs["Authorization"] = "Bearer " + key
    hdrs.update(headers or {})
    conn.request(method, path, body=body, headers=hdrs)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def stream(max_tokens, stop_after=None):
    """Stream a completion through the proxy; stamp every SSE event on arrival."""
    sock = socket.create_connection(PROXY, timeout=60)
    body = json.dumps(
        {"model": "tiny-llama", "prompt": "Hello", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    )
    sock.sendall(
        (
            "POST /v1/completions HTTP/1.1\r\nHost: lab\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (KEY, len(body), body)
        ).encode()
    )
    start = time.perf_counter()
    stamps, buf, headers_done, headers = [], b"", False, b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        now = time.perf_counter() - start
        buf += chunk
        if not headers_done and b"\r\n\r\n" in buf:
            headers, buf = buf.split(b"\r\n\r\n", 1)
            headers_done = True
            if b" 200 " not in headers.split(b"\r\n", 1)[0]:
                raise RuntimeError("stream refused: %r" % (headers + buf)[:300])
        if headers_done:
            events = buf.count(b"data: ")
            stamps.extend([now] * events)
            buf = buf.replace(b"data: ", b"")
            if b"[DONE]" in buf:
                break
        if stop_after and len(stamps) >= stop_after:
            break
    sock.close()
    return stamps, headers.decode(errors="replace")


def metric(name):
    text = urllib.request.urlopen(ENGINE_METRICS, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


out = {}
out["no_key"] = request("GET", "/v1/models", key=None)[0]
out["wrong_key"] = request("GET", "/v1/models", key="x" * 40)[0]
status, body = request("GET", "/v1/models")
out["models"] = status, [m["id"] for m in json.loads(body)["data"]] if status == 200 else body.decode()
out["tls_models"] = request("GET", "/v1/models", port=8443, tls=True)[0]
blocked = [
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/invocations",
    "/pause",
    "/update_weights",
    "/server_info",
    "/get_server_info",
    "/health",
    "/v1/embeddings",
    "/",
    "/v1/models/../metrics",
]
out["blocked"] = {p: request("POST" if p in ("/tokenize", "/pause") else "GET", p)[0] for p in blocked}
out["too_big"] = request("POST", "/v1/completions", body=b"x" * (65 * 2**20))[0]

# A long stream arrives event by event: the first event long before the last.
stamps, headers = stream(300)
out["stream_events"] = len(stamps)
out["stream_first_s"] = round(stamps[0], 4) if stamps else None
out["stream_last_s"] = round(stamps[-1], 4) if stamps else None
out["stream_distinct_times"] = len(set(stamps))
out["stream_headers_accel"] = "x-accel-buffering: no" in headers.lower()

# Disconnect: drop a long stream after a few events; the engine must stop generating.
time.sleep(1)
before_tokens = metric(SERIES["generation_tokens"])
stream(3500, stop_after=5)
drop = time.perf_counter()
running = None
while time.perf_counter() - drop < 10:
    running = metric(SERIES["running"])
    if running == 0:
        break
    time.sleep(0.2)
out["running_after_drop"] = running
out["seconds_to_stop"] = round(time.perf_counter() - drop, 2)
tokens_at_stop = metric(SERIES["generation_tokens"])
time.sleep(2)
out["tokens_generated_for_dropped_stream"] = tokens_at_stop - before_tokens
out["tokens_after_stop"] = metric(SERIES["generation_tokens"]) - tokens_at_stop

# Limits: a burst above the rate gets 429; more concurrent streams than allowed get 429.
time.sleep(2)
codes = []
threads = [threading.Thread(target=lambda: codes.append(request("GET", "/v1/models")[0])) for _ in range(20)]
[t.start() for t in threads]
[t.join() for t in threads]
out["burst_codes"] = sorted(set(codes))
out["burst_429"] = codes.count(429)
time.sleep(3)
stream_codes = []


def long_stream():
    status, _ = request(
        "POST",
        "/v1/completions",
        # long enough (several seconds at the tiny model's ~700 tokens/s) that the first two are
        # still open when the third arrives, however fast the engine is on the day
        body=json.dumps({"model": "tiny-llama", "prompt": "Hi", "max_tokens": 2000, "ignore_eos": True}),
    )
    stream_codes.append(status)


threads = [threading.Thread(target=long_stream) for _ in range(3)]
for t in threads:
    t.start()
    time.sleep(0.1)
[t.join() for t in threads]
out["concurrent_codes"] = sorted(stream_codes)
print(json.dumps(out))
