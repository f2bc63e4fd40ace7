"""The requests of test_edge_quota.py, run inside its container: two edges (8080: fail open,
8081: fail closed) share one usage store, over TLS with the fleet CA's certificates; prints one
RESULT line of JSON with what each answered, what the responders got and what the store holds.

    python3 quota_cases.py SMALL ALL BIG CUT RELOAD SHAPES BURST STORE_PASSWORD   (the keys, then the password)
"""

import concurrent.futures
import http.client
import json
import math
import os
import socket
import ssl
import subprocess
import sys
import threading
import time

SMALL, ALL, BIG, CUT, RELOAD, SHAPES, BURST, PASSWORD = sys.argv[1:9]
HEADERS = {"Content-Type": "application/json"}
FLUSH = 1.5  # each edge worker sends its counts once a second
TLS = "/bench/tls"


def req(port, key, body, path="/v1/chat/completions", ctype="application/json", keep=True):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = body.encode() if isinstance(body, str) else body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", path, data, {"Authorization": "Bearer " + key, "Content-Type": ctype})
    r = c.getresponse()
    raw = r.read()
    text = raw.decode(errors="replace")
    out = {"status": r.status, "retry_after": r.getheader("Retry-After"), "bytes": len(raw)}
    out["body"] = text if keep or r.status != 200 else text[-300:]
    return out


def form(fields, audio_bytes):
    """A multipart form: each (name, value) field, then an audio file part."""
    b = "gpufleetBoundary7MA4YWxk"
    parts = [b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (b.encode(), n.encode(),
                                                                                      v.encode())
             for n, v in fields]  # fmt: skip
    parts.append(b'--%s\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                 b"Content-Type: audio/wav\r\n\r\n%s\r\n" % (b.encode(), b"R" * audio_bytes))  # fmt: skip
    return b"".join(parts) + b"--%s--\r\n" % b.encode(), "multipart/form-data; boundary=" + b


def store_tls(cert=None, key=None, plain=False):
    """One AUTH + PING to the store as a client with CERT (none, another CA's, a fleet server
    certificate): what the store answered, or the error that stopped it."""
    try:
        sock = socket.create_connection(("127.0.0.1", 6379), timeout=5)
        if not plain:
            ctx = ssl.create_default_context(cafile=TLS + "/fleet-ca.crt")
            if cert:
                ctx.load_cert_chain(cert, key)
            sock = ctx.wrap_socket(sock, server_hostname="edge")
        with sock:
            auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(PASSWORD), PASSWORD.encode())
            sock.sendall(auth + b"*1\r\n$4\r\nPING\r\n")
            data = b""
            while b"PONG" not in data:
                more = sock.recv(100)
                if not more:
                    break
                data += more
            return "answered: " + data.decode(errors="replace").strip()
    except (OSError, ssl.SSLError) as e:
        return "refused: %s" % type(e).__name__


def seen():
    try:
        with open("/tmp/seen.jsonl") as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


def store(*args):
    env = dict(os.environ, REDISCLI_AUTH=PASSWORD)
    tls = ["--tls", "--cacert", TLS + "/fleet-ca.crt", "--cert", "/bench/conf/store-client.crt",
           "--key", "/bench/conf/store-client.key"]  # fmt: skip
    done = subprocess.run(["redis-cli", "--no-auth-warning", *tls, *args], capture_output=True, text=True, env=env)
    return done.stdout.strip()


def stats(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/_gpufleet/quota-stats")
    return json.loads(c.getresponse().read())


out = {}
# the per-minute part within one UTC minute
while time.time() % 60 > 30:
    time.sleep(1)
minute = int(time.time() // 60)
chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
# SMALL: 100 tokens a minute, 40 a request (prompt 10 + 30), alternately through both edges
small = []
for port in (8080, 8081, 8080, 8081, 8080):
    before = len(seen())
    r = req(port, SMALL, chat)
    r["reached"] = len(seen()) - before
    small.append(r)
    time.sleep(FLUSH)
out["small"] = small
out["small_minute"] = store("GET", "gq:m:small:%d" % minute)
out["minute_changed"] = int(time.time() // 60) != minute

# streams for ALL (no limit): the edge asks for usage when the client did not, and takes the chunk out
stream = {"model": "tiny-mha", "messages": [], "max_tokens": 5, "stream": True}
cases = {
    "none": stream,
    "asked": {**stream, "stream_options": {"include_usage": True}},
    "other_option": {**stream, "stream_options": {"continuous_usage_stats": False}},
    "null": {**stream, "stream_options": None},
}
streams = {}
for name, body in cases.items():
    before = len(seen())
    r = req(8081, ALL, body)
    got = seen()[before:]
    r["backend_body"] = got[0]["body"] if got else None
    streams[name] = r
# an escaped member name inside stream_options: the whole object is replaced, the backend asked for usage
before = len(seen())
streams["escaped"] = req(8080, ALL, '{"model": "tiny-mha", "messages": [], "max_tokens": 5, "stream": true,'
                                    ' "stream_options": {"include\\u005fusage": false}}')  # fmt: skip
streams["escaped"]["backend_body"] = seen()[before]["body"] if len(seen()) > before else None
# two stream_options, one spelled with an escape: refused, never guessed
streams["two_options"] = req(8080, ALL, '{"model": "tiny-mha", "max_tokens": 5, "stream": true,'
                                        ' "stream_options": {}, "stream\\u005foptions": null}')  # fmt: skip
# a stream that is not a boolean, a body cjson cannot read (a byte order mark): refused, never uncounted
streams["stream_one"] = req(8080, ALL, {**stream, "stream": 1})
streams["bom"] = req(8080, ALL, b"\xef\xbb\xbf" + json.dumps(stream).encode())
# a \u escape in the prompt and stream_options null: the edge still sets include_usage
before = len(seen())
escaped = ('{"model": "tiny-mha", "messages": [{"role": "user", "content": "caf\\u00e9"}], "max_tokens": 5,'
           ' "stream": true, "stream_options": null}')  # fmt: skip
streams["escaped_prompt"] = req(8080, ALL, escaped)
streams["escaped_prompt"]["backend_body"] = seen()[before]["body"] if len(seen()) > before else None
# Anthropic's messages: usage as input and output tokens, a stream's in two events (never injected)
messages = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
streams["messages_json"] = req(8081, ALL, messages, "/v1/messages")
before = len(seen())
streams["messages_stream"] = req(8080, ALL, {**messages, "max_tokens": 4, "stream": True}, "/v1/messages")
streams["messages_stream"]["backend_body"] = seen()[before]["body"] if len(seen()) > before else None
out["streams"] = streams

# a client that leaves a stream after its first bytes: counted, estimated (what it sent, the prompt guessed)
cut = {**chat, "max_tokens": 40, "stream": True, "pause": 0.05}
c = http.client.HTTPConnection("127.0.0.1", 8080, timeout=30)
c.request("POST", "/v1/chat/completions", json.dumps(cut).encode(), {"Authorization": "Bearer " + CUT, **HEADERS})
r = c.getresponse()
out["cut_read"] = len(r.read(200))
c.close()
out["cut_body_bytes"] = len(json.dumps(cut).encode())
# a stream across a reload of the first edge: its old worker counts it when it ends
done = {}
slow = threading.Thread(target=lambda: done.update(req(8080, RELOAD, {**chat, "max_tokens": 20, "stream": True,
                                                                       "pause": 0.1})))  # fmt: skip
slow.start()
time.sleep(0.5)
subprocess.run(["nginx", "-c", "/bench/models.conf", "-s", "reload"], check=True)
slow.join()
out["reload_stream"] = done
# a completion (JSON) for ALL through each edge
out["json_all"] = [req(p, ALL, {**chat, "max_tokens": 7}) for p in (8080, 8081)]
time.sleep(FLUSH)

# Issue 47: answers at any size and shape through both edges, each counted exactly where the engine
# reports usage (SHAPES on tiny-llama): a rerank's usage before 1.5 MB of echoed documents, a chat's
# before 1.5 MB of prompt logprobs, a completions stream whose first event is 1.5 MB, embeddings,
# a transcription's duration; a text transcription (no usage) estimated, never 0 (SHAPES on tiny-mha)
shapes = {}
docs = ["d" * 1000 for _ in range(1500)]
shapes["rerank"] = req(8080, SHAPES, {"model": "tiny-llama", "query": "q", "documents": docs}, "/v1/rerank", keep=False)
shapes["prompt_logprobs"] = req(8081, SHAPES, {**chat, "max_tokens": 3, "prompt_logprobs": 25000}, keep=False)
echo = {"model": "tiny-llama", "prompt": "p", "max_tokens": 6, "stream": True, "echo": True, "logprobs": 1,
        "first_event_bytes": 1500000}  # fmt: skip
shapes["echo_stream"] = req(8080, SHAPES, echo, "/v1/completions", keep=False)
shapes["embeddings"] = req(8081, SHAPES, {"model": "tiny-llama", "input": ["a", "b", "c"]}, "/v1/embeddings")
audio, audio_type = form([("model", "tiny-llama"), ("response_format", "json")], 32000)
shapes["audio_json"] = req(8080, SHAPES, audio, "/v1/audio/transcriptions", audio_type)
audio, audio_type = form([("model", "tiny-mha"), ("response_format", "text")], 32000)
shapes["audio_text"] = req(8081, SHAPES, audio, "/v1/audio/transcriptions", audio_type)
out["audio_text_body_bytes"] = len(audio)
# the Responses API, an answer and a stream (usage in response.completed), and answers the engine refused
responses = {"model": "tiny-llama", "input": "hi", "max_tokens": 9}
shapes["responses"] = req(8080, SHAPES, responses, "/v1/responses")
shapes["responses_stream"] = req(8081, SHAPES, {**responses, "stream": True}, "/v1/responses")
out["errors"] = [req(p, SHAPES, {**chat, "error_status": s}) for p, s in ((8080, 400), (8081, 500))]
# a body padded with 20 MB of spaces after its object: answered, and its backend asked for the usage chunk
before = len(seen())
padded = json.dumps({**stream, "model": "tiny-llama", "max_tokens": 4}) + " " * 20_000_000
shapes["padded"] = req(8080, SHAPES, padded, keep=False)
shapes["padded"]["backend_body"] = (seen()[before]["body"] if len(seen()) > before else {}).get("stream_options")
out["shapes"] = shapes
# refused before any backend: a form with two model fields (routed by one, read by the engine as the
# other), a body past its path's cap (edge_body_limits: /v1/embeddings 1m) and past nginx's (64m)
before = len(seen())
two, two_type = form([("model", "tiny-mha"), ("model", "tiny-llama")], 100)
refused = {"two_models": req(8080, SHAPES, two, "/v1/audio/transcriptions", two_type)}
refused["over_path_cap"] = req(8081, SHAPES, {"model": "tiny-llama", "input": "x" * 1_100_000}, "/v1/embeddings")
c = http.client.HTTPConnection("127.0.0.1", 8080, timeout=30)
c.putrequest("POST", "/v1/chat/completions")
for k, v in (("Authorization", "Bearer " + SHAPES), ("Content-Type", "application/json"),
             ("Content-Length", str(70 * 1024 * 1024))):  # fmt: skip
    c.putheader(k, v)
c.endheaders()
r = c.getresponse()
refused["over_nginx_cap"] = {"status": r.status, "body": r.read().decode()}
refused["reached"] = len(seen()) - before
out["refused"] = refused

# 8 clients at once on a key with 300 tokens a day, each sending 70-token completions until refused:
# each request reserves its tokens when admitted, so together they pass the limit by at most one request
burst_body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}


def burst(port):
    got = []
    for _ in range(20):
        r = req(port, BURST, burst_body)
        got.append(r["status"])
        if r["status"] == 429:
            break
    return got


with concurrent.futures.ThreadPoolExecutor(8) as pool:
    out["burst"] = list(pool.map(burst, [8080, 8081] * 4))
out["burst_reserve"] = len(json.dumps(burst_body).encode()) // 4 + 60

# the store takes edges with a client certificate from the fleet CA only (the password is then still asked)
out["store_tls"] = {
    "plain": store_tls(plain=True),
    "no_certificate": store_tls(),
    "another_ca": store_tls(TLS + "/rogue.crt", TLS + "/rogue.key"),
    "fleet_server_certificate": store_tls(TLS + "/proxy.crt", TLS + "/proxy.key"),
    "edge_client": store_tls("/bench/conf/store-client.crt", "/bench/conf/store-client.key"),
}
time.sleep(FLUSH)

# what the store counted, per key and model, against what the responders answered
counted = {}
for member in store("SMEMBERS", "gu:index").splitlines():
    key, model = member.split(" ")
    fields = store("HGETALL", "gu:%s:%s" % (key, model)).splitlines()
    counted[member] = dict(zip(fields[::2], map(int, fields[1::2]), strict=True))
out["counted"] = counted
names = {"Bearer " + k: n for k, n in ((SMALL, "small"), (ALL, "all"), (BIG, "big"), (CUT, "cut"), (RELOAD, "reload"))}
answered = {}
names.update({"Bearer " + SHAPES: "shapes", "Bearer " + BURST: "burst"})
for s in seen():
    b = s["body"]
    if names[s["auth"]] == "cut" or (s["path"].startswith("/v1/audio/") and b.get("response_format") == "text"):
        continue  # (left before its end, or answered without usage: estimated, checked on their own)
    if b.get("error_status"):
        continue  # (refused by the engine: nothing counted)
    member = "%s %s" % (names[s["auth"]], b["model"])
    n = answered.setdefault(member, {"prompt": 0, "completion": 0, "requests": 0})
    n["requests"] += 1
    # what the stand-in answered for each path (usage_responder.py)
    if s["path"] == "/v1/rerank":
        n["completion"] += 10 * len(b["documents"])
    elif s["path"] == "/v1/embeddings":
        n["prompt"] += 10 * len(b["input"])
    elif s["path"].startswith("/v1/audio/"):
        n["prompt"] += math.ceil(12.5 * 10)
    else:
        n["prompt"] += 10
        n["completion"] += int(b["max_tokens"])
out["answered"] = answered
# the same store read by gpufleet-usage (Python, its own copy of the key layout and protocol, over TLS)
usage = subprocess.run(["python3", "/bench/gpufleet-usage", "--json", "--keys", "/bench/conf/keys.json",
                        "--stats-url", "http://127.0.0.1:8080/_gpufleet/quota-stats"],
                       capture_output=True, text=True)  # fmt: skip
out["usage_cli"] = json.loads(usage.stdout) if usage.stdout.startswith("{") else {"error": usage.stderr}

# the store down: fail open (8080) lets a key with a quota through, fail closed (8081) answers 503
with open("/tmp/redis.pid") as f:
    os.kill(int(f.read().strip()), 9)
time.sleep(0.5)
out["down"] = {
    "open": req(8080, BIG, chat),
    "closed": req(8081, BIG, chat),
    "no_limit": req(8081, ALL, chat),
}
time.sleep(FLUSH)
out["stats"] = {"open": stats(8080), "closed": stats(8081)}
print("RESULT " + json.dumps(out))
