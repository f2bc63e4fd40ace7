"""The fleet lab's token quota probe (molecule/fleet/tasks/quota.yml), from the controller through
the edge with the fleet CA: completions of 40 tokens (ignore_eos) for a key with a daily limit, one
at a time with a pause longer than the edges' count interval (1 s), until the edge refuses it; then
two streams for another key, one that asks for the usage chunk and one that does not. Then (issue
47) answers over 1 MB for that key: a chat with 20 prompt logprobs per token of a ~1,900-token
prompt (vLLM writes them after `usage`), and twice a completions stream with echo and 20 logprobs
of a ~3,900-token prompt (vLLM sends the prompt's logprobs in its first event, over 1 MB), once
asking for the usage chunk and once not. Prints one JSON object: each completion's usage (the
engine's own), the refusal, and what each stream and large answer carried.

    python3 quota_probe.py EDGE_URL CA_FILE QUOTA_KEY OTHER_KEY MODEL
"""

import json
import ssl
import sys
import time
import urllib.error
import urllib.request

URL, CA, QUOTA_KEY, OTHER_KEY, MODEL = sys.argv[1:6]
CONTEXT = ssl.create_default_context(cafile=CA)


def post(key, body, path="/v1/completions"):
    req = urllib.request.Request(
        URL + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, context=CONTEXT, timeout=120) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


out = {"answers": [], "refusal": None}
body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True}
for _ in range(20):
    status, headers, text = post(QUOTA_KEY, body)
    if status == 429:
        out["refusal"] = {"status": status, "retry_after": headers.get("Retry-After"), "body": json.loads(text)}
        break
    if status != 200:
        out["refusal"] = {"status": status, "body": text[:500]}
        break
    out["answers"].append(json.loads(text)["usage"])
    time.sleep(1.3)
streams = {}
for name, extra in (("not_asked", {}), ("asked", {"stream_options": {"include_usage": True}})):
    status, _, text = post(OTHER_KEY, dict(body, stream=True, max_tokens=12, **extra))
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    streams[name] = {
        "status": status,
        "done": events[-1:] == ["[DONE]"],
        "content_chunks": sum(1 for c in chunks if c.get("choices")),
        "usage": [c["usage"] for c in chunks if c.get("usage")],
    }
out["streams"] = streams

big = {}
# (a CJK character is about three of the tiny model's tokens)
chat = {"model": MODEL, "messages": [{"role": "user", "content": "\u6f22" * 640}], "max_tokens": 4, "ignore_eos": True,
        "prompt_logprobs": 20}  # fmt: skip
status, _, text = post(OTHER_KEY, chat, "/v1/chat/completions")
big["chat"] = {"status": status, "bytes": len(text.encode()), "usage": json.loads(text).get("usage")}
echo = {"model": MODEL, "prompt": "\u6f22" * 1300, "max_tokens": 8, "ignore_eos": True, "stream": True, "echo": True,
        "logprobs": 20}  # fmt: skip
for name, extra in (("echo_asked", {"stream_options": {"include_usage": True}}), ("echo_not_asked", {})):
    status, _, text = post(OTHER_KEY, dict(echo, **extra))
    events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    big[name] = {
        "status": status,
        "bytes": len(text.encode()),
        "first_event_bytes": len(events[0].encode()) if events else 0,
        "done": events[-1:] == ["[DONE]"],
        "usage": [c["usage"] for c in chunks if c.get("usage")],
    }
out["big"] = big
print(json.dumps(out))
