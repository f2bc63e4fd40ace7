"""Streams chat completions through the edge with the real OpenAI client until a stop file
appears, then writes what happened: requests made, failed (no answer or an HTTP error) and
cut (a stream that started but ended without a finish reason).
    load.py BASE_URL KEY STOP_FILE RESULT_FILE [WORKERS]
"""

import json
import os
import sys
import threading
import time

from openai import OpenAI

base_url, key, stop_file, result_file = sys.argv[1:5]
workers = int(sys.argv[5]) if len(sys.argv) > 5 else 2
counts = {"made": 0, "completed": 0, "failed": 0, "cut": 0}
errors = []
lock = threading.Lock()


def worker():
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    while not os.path.exists(stop_file):
        started, finished = False, None
        try:
            stream = client.chat.completions.create(
                model="tiny-llama",
                messages=[{"role": "user", "content": "Count from one to twenty."}],
                max_tokens=16,
                stream=True,
            )
            for chunk in stream:
                if chunk.choices:
                    started = True
                    finished = chunk.choices[0].finish_reason or finished
            outcome = "completed" if finished else "cut"
        except Exception as exc:
            outcome = "cut" if started else "failed"
            with lock:
                errors.append("%s: %s" % (type(exc).__name__, str(exc)[:200]))
        with lock:
            counts["made"] += 1
            counts[outcome] += 1
        time.sleep(0.25)  # steady traffic that leaves this 2-core lab room to restart engines


threads = [threading.Thread(target=worker) for _ in range(workers)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(result_file, "w") as f:
    json.dump(dict(counts, errors=errors[:20]), f)
