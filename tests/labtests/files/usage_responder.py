"""A stand-in for the proxies behind the edge in test_edge_quota.py: answers each POST at once
with a completion whose usage the request decides (prompt_tokens 10, completion_tokens its
max_tokens), as vLLM 0.32 frames it: a JSON answer with `usage`, or an SSE stream of max_tokens
content chunks, then, when the request asks for it (stream_options.include_usage), vLLM's usage
chunk (`choices: []`), then `data: [DONE]`. /v1/messages answers in Anthropic's shape (usage as
input_tokens and output_tokens; a stream's in its message_start and message_delta events). A
request with "pause" waits that many seconds between its stream's chunks. Each request it got is
appended to /tmp/seen.jsonl: its port, its Authorization header, its path and its body.
The shapes issue 47 found uncounted, in vLLM 0.32's field order, sized by the request:
- /v1/rerank: `usage` (total_tokens = 10 per document) before the results, which echo each
  document (a request's "documents" of any size);
- chat with "prompt_logprobs": N: N prompt logprob entries after `usage` (N * ~60 bytes);
- a completions stream with "echo": its first event carries the prompt's logprobs, padded to the
  request's "first_event_bytes";
- /v1/embeddings: one vector per input, usage prompt_tokens = total_tokens = 10 per input;
- /v1/audio/transcriptions (a multipart form): response_format json answers {"text", "usage":
  {"type": "duration", "seconds": 12.5}}, text answers the text alone (no usage at all);
- /v1/responses: usage as input_tokens/output_tokens; a stream's `usage` null in response.created
  and whole in response.completed;
- "error_status": N: vLLM's error body with that status (no usage).
Forms are recorded with their fields (the file part's size only).

    python3 usage_responder.py PORT [PORT ...]
"""

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROMPT = 10
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # (headers and body are two writes: without this, Nagle and the peer's delayed ACK add 40 ms)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def answer(self, value, ctype="application/json"):
        out = value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ctype = self.headers.get("Content-Type") or ""
        doc = form(body, ctype) if ctype.startswith("multipart/form-data") else json.loads(body)
        port = self.server.server_address[1]
        with LOCK, open("/tmp/seen.jsonl", "a") as f:
            f.write(json.dumps({"port": port, "auth": self.headers.get("Authorization"), "path": self.path,
                                "body": doc}) + "\n")  # fmt: skip
        n = int(doc.get("max_tokens") or 1)
        usage = {"prompt_tokens": PROMPT, "total_tokens": PROMPT + n, "completion_tokens": n}
        head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": doc.get("model")}
        messages = self.path == "/v1/messages"
        if doc.get("error_status"):
            # vLLM's error body (a request it refused: no usage)
            out = json.dumps({"error": {"message": "refused by the stand-in", "type": "BadRequestError",
                                        "param": None, "code": int(doc["error_status"])}}).encode()  # fmt: skip
            self.send_response(int(doc["error_status"]))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        if self.path == "/v1/responses":
            answer = {"id": "resp_1", "object": "response", "model": doc.get("model"), "status": "completed",
                      "output": [{"type": "message", "content": [{"type": "output_text", "text": "t" * n}]}],
                      "usage": {"input_tokens": PROMPT, "output_tokens": n, "total_tokens": PROMPT + n}}  # fmt: skip
            if not doc.get("stream"):
                return self.answer(answer)
            # (the Responses API's stream: usage null when it starts, whole in response.completed)
            events = [("response.created", {"type": "response.created", "response": {**answer, "usage": None}})]
            events += [("response.output_text.delta", {"type": "response.output_text.delta", "delta": "t"})] * n
            events += [("response.completed", {"type": "response.completed", "response": answer})]
            out = "".join("event: %s\ndata: %s\n\n" % (e, json.dumps(d, separators=(",", ":"))) for e, d in events)
            return self.answer(out.encode(), "text/event-stream")
        if self.path == "/v1/rerank":
            docs = doc.get("documents") or []
            results = [{"index": i, "document": {"text": d}, "relevance_score": 0.5} for i, d in enumerate(docs)]
            return self.answer({"id": "rerank-1", "model": doc.get("model"),
                                "usage": {"total_tokens": PROMPT * len(docs)}, "results": results})  # fmt: skip
        if self.path == "/v1/embeddings":
            inputs = doc.get("input") if isinstance(doc.get("input"), list) else [doc.get("input")]
            data = [{"index": i, "object": "embedding", "embedding": [0.125] * 64} for i in range(len(inputs))]
            tokens = PROMPT * len(inputs)
            return self.answer({"id": "embd-1", "object": "list", "created": 1, "model": doc.get("model"), "data": data,
                                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                          "prompt_tokens_details": None}})  # fmt: skip
        if self.path == "/v1/audio/transcriptions":
            text = "one two three four five six seven eight nine ten"
            if doc.get("response_format") == "text":
                return self.answer(text.encode(), "text/plain; charset=utf-8")
            return self.answer({"text": text, "usage": {"type": "duration", "seconds": 12.5}})
        if not doc.get("stream") and doc.get("prompt_logprobs"):
            entries = [None] + [{str(i): {"logprob": -1.5, "rank": 1, "decoded_token": "tok"}}
                                for i in range(int(doc["prompt_logprobs"]))]  # fmt: skip
            return self.answer({**head, "object": "chat.completion", "served_by": port,
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": "t" * n}}],
                                "usage": usage, "prompt_logprobs": entries})  # fmt: skip
        if not doc.get("stream"):
            if messages:
                answer = {"id": "msg_1", "type": "message", "role": "assistant", "served_by": port,
                          "content": [{"type": "text", "text": "t" * n}],
                          "usage": {"input_tokens": PROMPT, "output_tokens": n}}  # fmt: skip
            else:
                answer = {**head, "object": "chat.completion", "served_by": port,
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "t" * n}}],
                          "usage": usage}  # fmt: skip
            out = json.dumps(answer, separators=(",", ":")).encode()
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

        def compact(value):
            return json.dumps(value, separators=(",", ":"))

        if messages:
            start = {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": PROMPT,
                                                                                   "output_tokens": 1}}}  # fmt: skip
            send("event: message_start\ndata: %s\n\n" % compact(start))
            for _ in range(n):
                delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "t"}}
                send("event: content_block_delta\ndata: %s\n\n" % compact(delta))
            end = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": n}}
            send("event: message_delta\ndata: %s\n\n" % compact(end))
            send('event: message_stop\ndata: {"type":"message_stop"}\n\n')
            self.wfile.write(b"0\r\n\r\n")
            return
        if doc.get("echo"):
            # (vLLM: the prompt and all its logprobs in the first event)
            pad = int(doc.get("first_event_bytes") or 0)
            first = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": doc.get("model"),
                     "choices": [{"index": 0, "text": doc.get("prompt"),
                                  "logprobs": {"tokens": ["p"] * (pad // 4)}, "finish_reason": None}]}  # fmt: skip
            send("data: %s\n\n" % compact(first))
        for i in range(n):
            chunk = {**head, "choices": [{"index": 0, "delta": {"content": "t"}, "logprobs": None,
                                          "finish_reason": "length" if i == n - 1 else None}]}  # fmt: skip
            try:
                send("data: %s\n\n" % compact(chunk))
            except OSError:
                return  # the edge closed it (the client left)
            time.sleep(float(doc.get("pause") or 0))
        if (doc.get("stream_options") or {}).get("include_usage"):
            send("data: %s\n\n" % json.dumps({**head, "choices": [], "usage": usage}, separators=(",", ":")))
        send("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


def form(body, ctype):
    """A multipart form's fields (a file part: its size), enough for the stand-in's answers."""
    boundary = ctype.split("boundary=", 1)[1].strip('"').encode()
    fields = {}
    for part in body.split(b"--" + boundary)[1:]:
        if part.startswith(b"--"):
            break
        head, _, value = part.partition(b"\r\n\r\n")
        name = head.split(b'name="', 1)[1].split(b'"', 1)[0].decode()
        value = value[:-2] if value.endswith(b"\r\n") else value
        fields[name] = len(value) if b"filename=" in head else value.decode()
    return fields


if __name__ == "__main__":
    for p in sys.argv[1:]:
        server = ThreadingHTTPServer(("127.0.0.1", int(p)), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()
