"""Lab check with the real OpenAI client: run inside the engine image on the lab host
(docker run --network host), so it reaches the engine on the host's loopback.

    python3 stream_check.py BASE_URL SECRET_ENV_FILE MODEL

Prints one JSON object: models listed, SSE chunks with content and their arrival times,
whether /metrics answers, and the status of a request without the key.
"""

import json
import shlex
import sys
import time
import urllib.error
import urllib.request

from openai import OpenAI

base, secret_file, model = sys.argv[1:4]
key = None
with open(secret_file) as handle:
    for line in handle:
        if line.startswith("VLLM_API_KEY="):
            key = shlex.split(line.split("=", 1)[1])[0]

client = OpenAI(base_url=base + "/v1", api_key=key or "none")
models = [m.id for m in client.models.list().data]

start = time.perf_counter()
arrivals = []
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Say hello to the lab."}],
    max_tokens=48,
    stream=True,
    extra_body={"ignore_eos": True, "min_tokens": 48},
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        arrivals.append(round(time.perf_counter() - start, 4))

metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
try:
    urllib.request.urlopen(base + "/v1/models", timeout=10)
    unauthorized = 200
except urllib.error.HTTPError as exc:
    unauthorized = exc.code

print(
    json.dumps(
        {
            "models": models,
            "chunks": len(arrivals),
            "first_chunk_s": arrivals[0] if arrivals else None,
            "last_chunk_s": arrivals[-1] if arrivals else None,
            "distinct_arrival_times": len(set(arrivals)),
            "metrics_has_vllm": "vllm:" in metrics,
            "status_without_key": unauthorized,
        }
    )
)
