"""A long stream through the proxy, written to a JSON file when it ends (verify.yml starts it,
rotates a key meanwhile, and reads the file)."""

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
        {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    ).encode(),
    headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
)
start = time.time()
events, finish = 0, None
with urllib.request.urlopen(req, timeout=600) as resp:
    for line in resp:
        if line.startswith(b"data: {"):
            events += 1
            choice = json.loads(line[6:])["choices"][0]
            finish = choice.get("finish_reason") or finish
with open(out + ".tmp", "w") as handle:
    json.dump(
        {
            "events": events,
            "finish_reason": finish,
            "seconds": round(time.time() - start, 2),
            "started_before_reload": True,
        },
        handle,
    )
os.rename(out + ".tmp", out)
