"""The requests of test_edge_quota.py, run inside its container: two edges (8080: fail open,
8081: fail closed) share one usage store; prints one RESULT line of JSON with what each
answered, what the responders got and what the store holds.

    python3 quota_cases.py SMALL_KEY ALL_KEY BIG_KEY STORE_PASSWORD
"""

import http.client
import json
import os
import subprocess
import sys
import time

SMALL, ALL, BIG, PASSWORD = sys.argv[1:5]
FLUSH = 1.5  # each edge worker sends its counts once a second


def req(port, key, body, path="/v1/chat/completions"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", path, body if isinstance(body, str) else json.dumps(body),
              {"Authorization": "Bearer " + key, "Content-Type": "application/json"})  # fmt: skip
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
# an escaped member name the edge cannot place exactly: refused, never guessed
streams["escaped"] = req(
    8080, ALL, '{"model": "tiny-mha", "stream": true, "stream_options": {"include\\u005fusage": false}}'
)
out["streams"] = streams
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
names = {"Bearer " + SMALL: "small", "Bearer " + ALL: "all", "Bearer " + BIG: "big"}
answered = {}
for s in seen():
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
