"""Streams chat completions through the edge with the real OpenAI client until a stop file
appears, then writes what happened: requests made, failed (no answer or an HTTP error) and
cut (a stream that started but ended without a finish reason).
    load.py BASE_URL KEY STOP_FILE RESULT_FILE [WORKERS [MAX_TOKENS [PAUSE [MODEL]]]]
Short streams (16 tokens, a 0.25 s pause) by default. MAX_TOKENS over 16 asks for exactly that
many (vLLM's ignore_eos), the long streams of production: PAUSE 0 sends the next at once.
"""

import json
import os
import sys
import threading
import time

from openai import OpenAI

base_url, key, stop_file, result_file = sys.argv[1:5]
workers = int(sys.argv[5]) if len(sys.argv) > 5 else 2
max_tokens = int(sys.argv[6]) if len(sys.argv) > 6 else 16
pause = float(sys.argv[7]) if len(sys.argv) > 7 else 0.25
model = sys.argv[8] if len(sys.argv) > 8 else "tiny-llama"
# tokens: completion tokens of the whole long streams, as the engine's own usage counts them
# (the chunks are fewer: the detokenizer holds back partial words)
counts = {"made": 0, "completed": 0, "failed": 0, "cut": 0, "tokens": 0}
errors = []
lock = threading.Lock()


def worker():
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    while not os.path.exists(stop_file):
        started, finished, tokens = False, None, 0
        try:
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Count from one to twenty."}],
                max_tokens=max_tokens,
                stream=True,
                extra_body={"ignore_eos": True} if max_tokens > 16 else None,
                stream_options={"include_usage": True} if max_tokens > 16 else None,
            )
            for chunk in stream:
                if chunk.choices:
                    started = True
                    finished = chunk.choices[0].finish_reason or finished
                if getattr(chunk, "usage", None):
                    tokens = chunk.usage.completion_tokens
            outcome = "completed" if finished else "cut"
        except Exception as exc:
            outcome = "cut" if started else "failed"
            with lock:
                errors.append("%s: %s" % (type(exc).__name__, str(exc)[:200]))
        with lock:
            counts["made"] += 1
            counts[outcome] += 1
            counts["tokens"] += tokens if outcome == "completed" else 0
        if pause:
            time.sleep(pause)  # steady traffic that leaves this 2-core lab room to restart engines


threads = [threading.Thread(target=worker) for _ in range(workers)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(result_file, "w") as f:
    json.dump(dict(counts, errors=errors[:20]), f)
