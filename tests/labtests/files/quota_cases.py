"""The requests of test_edge_quota.py, run inside its container: two edges (8080: fail open,
8081: fail closed) share one usage store; prints one RESULT line of JSON with what each
answered, what the responders got and what the store holds.

    python3 quota_cases.py SMALL_KEY ALL_KEY BIG_KEY CUT_KEY RELOAD_KEY STORE_PASSWORD
"""

import http.client
import json
import os
import subprocess
import sys
import threading
import time

SMALL, ALL, BIG, CUT, RELOAD, PASSWORD = sys.argv[1:7]
HEADERS = {"Content-Type": "application/json"}
FLUSH = 1.5  # each edge worker sends its counts once a second


def req(port, key, body, path="/v1/chat/completions"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body.encode() if isinstance(body, str) else body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", path, data, {"Authorization": "Bearer " + key, **HEADERS})
    r = c.getresponse()
    text = r.read().decode()
    return {"status": r.status, "retry_after": r.getheader("Retry-After"), "body": text}


def seen():
    try:
        with open("/tmp/seen.jsonl") as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


def store(*args):
    env = dict(os.environ, REDISCLI_AUTH=PASSWORD)
    done = subprocess.run(["redis-cli", "--no-auth-warning", *args], capture_output=True, text=True, env=env)
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

# what the store counted, per key and model, against what the responders answered
counted = {}
for member in store("SMEMBERS", "gu:index").splitlines():
    key, model = member.split(" ")
    fields = store("HGETALL", "gu:%s:%s" % (key, model)).splitlines()
    counted[member] = dict(zip(fields[::2], map(int, fields[1::2]), strict=True))
out["counted"] = counted
names = {"Bearer " + k: n for k, n in ((SMALL, "small"), (ALL, "all"), (BIG, "big"), (CUT, "cut"), (RELOAD, "reload"))}
answered = {}
for s in seen():
    if names[s["auth"]] == "cut":
        continue  # (left before its end: estimated, checked on its own)
    member = "%s %s" % (names[s["auth"]], s["body"]["model"])
    n = answered.setdefault(member, {"prompt": 0, "completion": 0, "requests": 0})
    n["prompt"] += 10
    n["completion"] += int(s["body"]["max_tokens"])
    n["requests"] += 1
out["answered"] = answered

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
