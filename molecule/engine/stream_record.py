"""One stream, recorded to a JSON file when it ends. verify.yml starts it in the background,
changes something meanwhile (a key rotation and an nginx reload, or an instance restart),
then reads the file:

    python3 stream_record.py BASE_URL MODEL KEY MAX_TOKENS OUT [READ_DELAY]

READ_DELAY (seconds, default 0) is slept after each event: a slow reader keeps the stream open
for minutes. Records the SSE events, the completion tokens, the finish reason (None: the stream
was cut), the error if any, and when it started and ended.
"""

import json
import os
import sys
import time
import urllib.request

base, model, key, max_tokens, out = sys.argv[1:6]
read_delay = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
req = urllib.request.Request(
    base + "/v1/completions",
    method="POST",
    data=json.dumps(
        {"model": model, "prompt": "Hello", "max_tokens": int(max_tokens), "stream": True, "ignore_eos": True,
         "stream_options": {"include_usage": True}}
    ).encode(),
    headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
)  # fmt: skip
start = time.time()
events, finish, tokens, error = 0, None, None, None
try:
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                events += 1
                data = json.loads(line[6:])
                if data.get("choices"):
                    finish = data["choices"][0].get("finish_reason") or finish
                if data.get("usage"):
                    tokens = data["usage"]["completion_tokens"]
                if read_delay:
                    time.sleep(read_delay)
except Exception as exc:  # a cut stream: say how it ended
    error = "%s: %s" % (type(exc).__name__, str(exc)[:200])
with open(out + ".tmp", "w") as handle:
    json.dump({"events": events, "finish_reason": finish, "completion_tokens": tokens, "error": error,
               "start": start, "end": time.time()}, handle)  # fmt: skip
os.rename(out + ".tmp", out)
