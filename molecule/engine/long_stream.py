"""A long stream through the proxy, read slowly so it stays open for over a minute; written
to a JSON file when it ends (verify.yml starts it, rotates a key meanwhile, reads the file)."""

import json
import os
import sys
import time
import urllib.request

key, out = sys.argv[1:3]
req = urllib.request.Request(
    "http://127.0.0.1:8080/v1/completions",
    method="POST",
    data=json.dumps(
        {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 3000, "stream": True, "ignore_eos": True,
         "stream_options": {"include_usage": True}}
    ).encode(),
    headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
)  # fmt: skip
start = time.time()
events, finish, tokens = 0, None, None
with urllib.request.urlopen(req, timeout=600) as resp:
    for line in resp:
        if line.startswith(b"data: {"):
            events += 1
            data = json.loads(line[6:])
            if data.get("choices"):
                finish = data["choices"][0].get("finish_reason") or finish
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
            time.sleep(0.025)  # a slow reader: the stream (over a minute) stays open across the reload
with open(out + ".tmp", "w") as handle:
    json.dump({"events": events, "finish_reason": finish, "completion_tokens": tokens,
               "start": start, "end": time.time()}, handle)  # fmt: skip
os.rename(out + ".tmp", out)
