"""Attacks on gpufleet's proxy with raw HTTP (no client library that would tidy the path or the
headers), run on the lab host inside the engine image (--network host):

    python3 raw_probes.py KEY_A [ACCESS_LOG]

Each probe sends bytes exactly as written and records the status line and whether the body
holds the engine's Prometheus metrics (the "vllm:" prefix) or its model list. Prints one
JSON object; verify.yml asserts on it.
"""

import json
import re
import socket
import ssl
import sys
import time

KEY = sys.argv[1]
ACCESS_LOG = sys.argv[2] if len(sys.argv) > 2 else "/var/log/nginx/gpufleet-access.json"
PLAIN, TLS = 8080, 8443


def send(raw, port=PLAIN, tls=False, read_all=True):
    """Send raw bytes, return the whole response (the server closes: Connection: close).
    Paced below the lab's per-key rate limit (5 r/s), so no probe is answered 429."""
    time.sleep(0.3)
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    if tls:
        sock = ssl._create_unverified_context().wrap_socket(sock, server_hostname="lab-engine")
    sock.sendall(raw if isinstance(raw, bytes) else raw.encode())
    out = b""
    while read_all:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    sock.close()
    return out


def status(response):
    try:
        return int(response.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def summary(response):
    body = response.split(b"\r\n\r\n", 1)[-1]
    return {
        "status": status(response),
        "metrics": b"vllm:" in body,
        "models": b'"object":"list"' in body.replace(b" ", b"") and b"tiny-llama" in body,
    }


def get(target, headers=None, port=PLAIN, tls=False, key=KEY):
    lines = ["GET %s HTTP/1.1" % target, "Host: lab-engine"]
    if key is not None:
        lines.append("Authorization: Bearer %s" % key)
    lines += [*(headers or []), "Connection: close", "", ""]
    return summary(send("\r\n".join(lines), port=port, tls=tls))


out = {"paths": {}, "headers": {}, "smuggling": {}}

# Paths: dot-segments, encoded dots and slashes, duplicate slashes, case, absolute-form URLs.
for target in [
    "/metrics/../v1/models",
    "/v1/models/../../metrics",
    "/v1/%2e%2e/metrics",
    "/v1/%2E%2E/%2E%2E/metrics",
    "/metrics%2f..%2fv1/models",
    "/v1%2fmodels",
    "//v1//models",
    "/v1/./models",
    "/V1/MODELS",
    "/v1/models/",
    "/v1/models;/metrics",
    "/v1/models%00",
    "/v1\\models",
    "/v1/models?next=../../metrics",
    "http://evil.example/metrics",
    "http://evil.example/metrics/../v1/models",
    "/_gpufleet_auth",
    "/metrics",
    "/health",
    "/tokenize",
    "/server_info",
    "/collective_rpc",
]:
    out["paths"][target] = get(target)
for target in ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/pause", "/collective_rpc"]:
    body = '{"lora_name":"x","lora_path":"/tmp"}'
    raw = (
        "POST %s HTTP/1.1\r\nHost: lab-engine\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
        "Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (target, KEY, len(body), body)
    )
    out["paths"]["POST " + target] = summary(send(raw))
out["paths"]["TLS /metrics/../v1/models"] = get("/metrics/../v1/models", port=TLS, tls=True)
out["paths"]["TLS /metrics"] = get("/metrics", port=TLS, tls=True)
out["ready_without_key"] = get("/gpufleet/ready", key=None)["status"]

# Keys: exact match (case included), the scheme word in any case, one header only.
out["headers"]["upper_key"] = get("/v1/models", key=KEY.upper())["status"]
out["headers"]["lower_key"] = get("/v1/models", key=KEY.lower())["status"] if KEY.lower() != KEY else None
out["headers"]["prefix_of_key"] = get("/v1/models", key=KEY[:-1])["status"]
out["headers"]["key_and_more"] = get("/v1/models", key=KEY + "x")["status"]
out["headers"]["lower_scheme"] = get("/v1/models", key=None, headers=["Authorization: bearer %s" % KEY])["status"]
out["headers"]["two_spaces"] = get("/v1/models", key=None, headers=["Authorization: Bearer  %s" % KEY])["status"]
out["headers"]["tab"] = get("/v1/models", key=None, headers=["Authorization: Bearer\t%s" % KEY])["status"]
out["headers"]["basic"] = get("/v1/models", key=None, headers=["Authorization: Basic %s" % KEY])["status"]
out["headers"]["duplicate_authorization"] = get("/v1/models", headers=["Authorization: Bearer nope"])["status"]
out["headers"]["duplicate_authorization_first_bad"] = get(
    "/v1/models", key="nope", headers=["Authorization: Bearer %s" % KEY]
)["status"]

# Smuggling: Content-Length with Transfer-Encoding, a bad Transfer-Encoding, and a second
# request hidden in the first one's body (pipelined): nginx parses it as its own request.
body = '{"model":"tiny-llama","prompt":"Hi","max_tokens":1}'
POST = (
    "POST /v1/completions HTTP/1.1\r\nHost: lab-engine\r\nAuthorization: Bearer %s\r\n"
    "Content-Type: application/json\r\n"
)
both = (POST + "Content-Length: %d\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\n\r\n") % (
    KEY,
    len(body),
    len(body),
    body,
)
out["smuggling"]["content_length_and_chunked"] = status(send(both))
bad_te = (
    "POST /v1/completions HTTP/1.1\r\nHost: lab-engine\r\nAuthorization: Bearer %s\r\nTransfer-Encoding: xchunked\r\n"
    "Connection: close\r\n\r\n0\r\n\r\n" % KEY
)
out["smuggling"]["bad_transfer_encoding"] = status(send(bad_te))
inner = "GET /metrics HTTP/1.1\r\nHost: lab-engine\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % KEY
outer = (POST + "Content-Length: %d\r\n\r\n%s") % (KEY, len(body), body)
both_responses = send(outer + inner)
# every status line in the stream (a body may end without CRLF right before the next one)
statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", both_responses)]
out["smuggling"]["pipelined_statuses"] = statuses
out["smuggling"]["pipelined_metrics_leaked"] = b"vllm:num_requests" in both_responses

# X-Forwarded-For from a client that is not a trusted edge: the proxy logs (and sends on) the
# peer's own address, not the claimed one.
get("/v1/models", headers=["X-Forwarded-For: 6.6.6.6"])
time.sleep(0.5)
with open(ACCESS_LOG) as log:
    last = json.loads(log.read().splitlines()[-1])
out["xff_spoof_logged_remote"] = last["remote"]
print(json.dumps(out))
