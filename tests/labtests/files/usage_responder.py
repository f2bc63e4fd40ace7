"""A stand-in for the proxies behind the edge in test_edge_quota.py: answers each POST at once
with a completion whose usage the request decides (prompt_tokens 10, completion_tokens its
max_tokens), as vLLM 0.32 frames it: a JSON answer with `usage`, or an SSE stream of max_tokens
content chunks, then, when the request asks for it (stream_options.include_usage), vLLM's usage
chunk (`choices: []`), then `data: [DONE]`. Each request it got is appended to /tmp/seen.jsonl:
its port, its Authorization header and its body.

    python3 usage_responder.py PORT [PORT ...]
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROMPT = 10
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        doc = json.loads(body)
        port = self.server.server_address[1]
        with LOCK, open("/tmp/seen.jsonl", "a") as f:
            f.write(json.dumps({"port": port, "auth": self.headers.get("Authorization"), "body": doc}) + "\n")
        n = int(doc.get("max_tokens") or 1)
        usage = {"prompt_tokens": PROMPT, "total_tokens": PROMPT + n, "completion_tokens": n}
        head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": doc.get("model")}
        if not doc.get("stream"):
            out = json.dumps({**head, "object": "chat.completion", "served_by": port,
                              "choices": [{"index": 0, "message": {"role": "assistant", "content": "t" * n}}],
                              "usage": usage}, separators=(",", ":")).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(text):
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        for i in range(n):
            chunk = {**head, "choices": [{"index": 0, "delta": {"content": "t"}, "logprobs": None,
                                          "finish_reason": "length" if i == n - 1 else None}]}  # fmt: skip
            send("data: %s\n\n" % json.dumps(chunk, separators=(",", ":")))
        if (doc.get("stream_options") or {}).get("include_usage"):
            send("data: %s\n\n" % json.dumps({**head, "choices": [], "usage": usage}, separators=(",", ":")))
        send("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        server = ThreadingHTTPServer(("127.0.0.1", int(p)), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()
