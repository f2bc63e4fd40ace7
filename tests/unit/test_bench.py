"""gpufleet bench: percentile math, argument checks, and whole runs against an engine stand-in.

The end-to-end tests drive the real `openai` client against `EngineStandIn`, a TEST STAND-IN FOR AN ENGINE:
a stdlib HTTP server that answers GET /v1/models and streams POST /v1/completions as Server-Sent Events the
way vLLM does (one `data: {...}` chunk per token, a usage chunk when asked, `data: [DONE]`), with sleeps we
control. Timing assertions are loose on purpose: they check what the stand-in guarantees (the first chunk
cannot arrive before its delay) and that gaps are of the right size, not exact figures.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet import bench, cli

# --------------------------------------------------------------------------------------------------------------
# The engine stand-in


class EngineStandIn:
    """A TEST STAND-IN FOR AN ENGINE (vLLM's OpenAI server behind nginx), not an engine.

    - Streams `max_tokens` text chunks: the first after `first_delay` seconds, then one every `gap` seconds.
    - Sends a usage chunk (prompt tokens = words in the prompt) when the request asks for it and
      `send_usage` is true.
    - `fail_every=k` answers HTTP 500 to every k-th request of more than one token (the bench's one-token
      probe is not counted), so the number of failures is exact at any concurrency.
    - `accept_ignore_eos=False` answers HTTP 400 to requests that carry `ignore_eos`.
    - `api_key` makes every route require `Authorization: Bearer <api_key>`.
    Every completion request body is kept in `bodies`.
    """

    def __init__(
        self,
        *,
        first_delay: float = 0.05,
        gap: float = 0.02,
        fail_every: int = 0,
        accept_ignore_eos: bool = True,
        send_usage: bool = True,
        api_key: str | None = None,
        model: str = "stand-in-model",
        tls=None,
    ) -> None:
        self.first_delay = first_delay
        self.gap = gap
        self.fail_every = fail_every
        self.accept_ignore_eos = accept_ignore_eos
        self.send_usage = send_usage
        self.api_key = api_key
        self.model = model
        self.bodies: list[dict] = []
        self.sessions: list[str | None] = []
        self.lock = threading.Lock()
        self.counted = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.scheme = "http"
        if tls is not None:  # an ssl.SSLContext for the server side: the stand-in speaks HTTPS
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return "%s://127.0.0.1:%d" % (self.scheme, self.server.server_address[1])

    def __enter__(self) -> EngineStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def bench_prompts(self) -> list[str]:
        return [b["prompt"] for b in self.bodies if b.get("max_tokens", 0) > 1]

    def _handler(self):
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                # Each chunk leaves at once, as nginx and vLLM send them (no Nagle coalescing).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args):
                pass

            def _json(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if engine.api_key and self.headers.get("Authorization") != "Bearer " + engine.api_key:
                    self._json(401, {"error": {"message": "Unauthorized", "type": "invalid_request_error"}})
                    return False
                return True

            def _chunk(self, payload: dict | str) -> None:
                text = payload if isinstance(payload, str) else json.dumps(payload)
                data = ("data: %s\n\n" % text).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

            def do_GET(self):
                if not self._authorized():
                    return
                if self.path != "/v1/models":
                    self._json(404, {"error": {"message": "no route %s" % self.path}})
                    return
                self._json(200, {"object": "list", "data": [{"id": engine.model, "object": "model", "created": 0}]})

            def do_POST(self):
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions":
                    self._json(404, {"error": {"message": "no route %s" % self.path}})
                    return
                with engine.lock:
                    engine.bodies.append(body)
                    engine.sessions.append(self.headers.get("X-Session-ID"))
                    if body.get("max_tokens", 16) > 1:
                        engine.counted += 1
                        number = engine.counted
                    else:
                        number = 0
                if "ignore_eos" in body and not engine.accept_ignore_eos:
                    self._json(400, {"error": {"message": "unknown field ignore_eos", "code": 400}})
                    return
                if engine.fail_every and number and number % engine.fail_every == 0:
                    self._json(500, {"error": {"message": "stand-in engine failure", "code": 500}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                tokens = body.get("max_tokens", 16)
                base = {"id": "cmpl-standin", "object": "text_completion", "created": 0, "model": engine.model}
                time.sleep(engine.first_delay)
                for i in range(tokens):
                    if i:
                        time.sleep(engine.gap)
                    finish = "length" if i == tokens - 1 else None
                    self._chunk({**base, "choices": [{"index": 0, "text": " t%d" % i, "finish_reason": finish}]})
                if engine.send_usage and (body.get("stream_options") or {}).get("include_usage"):
                    prompt_tokens = len(body["prompt"].split())
                    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
                    usage["total_tokens"] = prompt_tokens + tokens
                    self._chunk({**base, "choices": [], "usage": usage})
                self._chunk("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

        return Handler


def parse(argv: list[str]) -> argparse.Namespace:
    parser = cli.Parser(prog="gpufleet bench")  # gpufleet's parser: a usage error exits 1
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def run_json(argv: list[str], capsys, monkeypatch) -> tuple[int, dict | None, str]:
    for name in ("GPUFLEET_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    rc = bench.run(parse([*argv, "--json"]))
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else None), err


# --------------------------------------------------------------------------------------------------------------
# Percentiles


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        # sorted 15 20 35 40 50, n=5: rank h = 4q/100
        ([50, 15, 40, 20, 35], 50, 35.0),  # h=2
        ([50, 15, 40, 20, 35], 90, 46.0),  # h=3.6: 40 + 0.6 * (50 - 40)
        ([50, 15, 40, 20, 35], 99, 49.6),  # h=3.96: 40 + 0.96 * 10
        ([50, 15, 40, 20, 35], 0, 15.0),
        ([50, 15, 40, 20, 35], 100, 50.0),
        ([1, 2, 3, 4], 50, 2.5),  # h=1.5
        ([1, 2, 3, 4], 90, 3.7),  # h=2.7
        ([7], 99, 7.0),
        ([10, 20], 99, 19.9),  # h=0.99
    ],
)
def test_percentile_hand_worked(values, q, expected):
    assert bench.percentile(values, q) == pytest.approx(expected)


def test_percentile_matches_statistics_inclusive_quantiles():
    rng = random.Random(7)
    values = [rng.uniform(0, 100) for _ in range(37)]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for q in range(1, 100):
        assert bench.percentile(values, q) == pytest.approx(cuts[q - 1])


def test_percentile_rejects_nothing_and_out_of_range():
    with pytest.raises(ValueError):
        bench.percentile([], 50)
    with pytest.raises(ValueError):
        bench.percentile([1.0], 101)
    assert bench.Summary.of([]) is None
    s = bench.Summary.of([1.0, 2.0, 3.0, 10.0])
    assert (s.count, s.mean, s.p50) == (4, 4.0, 2.5)


# --------------------------------------------------------------------------------------------------------------
# Arguments


def test_arguments_defaults_and_lists():
    args = parse(["http://h:8080"])
    assert (args.concurrency, args.requests, args.duration, args.shared_prefix) == ((1,), None, None, 0)
    assert parse(["u", "--concurrency", "1,8, 32"]).concurrency == (1, 8, 32)
    settings = bench.settings_from_args(parse(["http://h:8080", "--concurrency", "2,8"]), environ={})
    assert [settings.requests_for(c) for c in settings.concurrency] == [16, 32]
    assert bench.settings_from_args(parse(["http://h", "--duration", "3"]), environ={}).requests_for(8) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["u", "--concurrency", "0"],
        ["u", "--concurrency", "1,,8"],
        ["u", "--concurrency", "eight"],
        ["u", "--concurrency", "1001"],
        ["u", "--requests", "0"],
        ["u", "--duration", "-1"],
        ["u", "--timeout", "inf"],
        ["u", "--prompt-tokens", "0"],
        ["u", "--shared-prefix", "-1"],
        ["u", "--requests", "5", "--duration", "10"],
    ],
)
def test_bad_options_exit_1(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 1


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1"),
        ("https://llm.example/team-a", "https://llm.example/team-a/v1"),
    ],
)
def test_base_url_with_or_without_v1(url, base):
    assert bench.api_base_url(url) == base


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["127.0.0.1:8080"], "not an http(s) URL"),
        (["http://h:port"], "port that is not a number"),
        (["http://h:8080", "--prompt-tokens", "10", "--shared-prefix", "11"], "--shared-prefix 11 is longer"),
    ],
)
def test_bad_input_returns_1_with_the_fix(argv, words, capsys):
    assert bench.run(parse(argv)) == 1
    err = capsys.readouterr().err
    assert words in err
    assert err.count("\n") == 1


def test_api_key_order():
    env = {"GPUFLEET_API_KEY": "g", "OPENAI_API_KEY": "o"}
    assert bench.resolve_api_key("flag", env) == "flag"
    assert bench.resolve_api_key(None, env) == "g"
    assert bench.resolve_api_key(None, {"OPENAI_API_KEY": "o"}) == "o"
    assert bench.resolve_api_key(None, {}) is None


def test_prompts_share_exactly_the_prefix():
    builder = bench.PromptBuilder(prompt_tokens=40, shared_prefix=10, seed=3)
    prompts = [builder.prompt(n).split() for n in range(20)]
    assert all(len(p) == 40 for p in prompts)
    assert all(p[:10] == prompts[0][:10] for p in prompts)
    assert len({" ".join(p[10:]) for p in prompts}) == 20
    assert builder.prompt(5) == bench.PromptBuilder(40, 10, 3).prompt(5)  # the seed fixes the prompts
    assert builder.prompt(5) != bench.PromptBuilder(40, 10, 4).prompt(5)


# --------------------------------------------------------------------------------------------------------------
# Whole runs against the engine stand-in


def test_sweep_measures_what_the_stand_in_streams(capsys, monkeypatch):
    first_delay, gap, tokens = 0.05, 0.02, 5
    with EngineStandIn(first_delay=first_delay, gap=gap) as engine:
        argv = [engine.url, "--concurrency", "1,4", "--requests", "8", "--prompt-tokens", "12"]
        argv += ["--shared-prefix", "5", "--output-tokens", str(tokens)]
        rc, report, _ = run_json(argv, capsys, monkeypatch)
    assert rc == 0
    assert report["model"] == "stand-in-model"
    assert report["server"] == {"ignore_eos": True, "include_usage": True}
    assert [level["concurrency"] for level in report["levels"]] == [1, 4]
    for level in report["levels"]:
        assert (level["requests"], level["ok"], level["failed"]) == (8, 8, 0)
        assert level["output_tokens"] == 8 * tokens
        assert level["output_tokens_from"] == "usage"
        assert level["prompt_tokens_mean"] == 12
        assert level["ttft_ms"]["n"] == 8
        assert min(level["ttft_ms"][k] for k in ("mean", "p50", "p90", "p99")) >= first_delay * 1000
        assert level["itl_ms"]["n"] == 8 * (tokens - 1)
        assert gap * 1000 * 0.5 <= level["itl_ms"]["p50"] <= gap * 1000 * 5
        assert gap * 1000 * 0.5 <= level["tpot_ms"]["mean"] <= gap * 1000 * 5
        assert level["e2e_ms"]["p50"] >= (first_delay + (tokens - 1) * gap) * 1000
        assert level["output_token_throughput"] == pytest.approx(level["output_tokens"] / level["duration_s"])
    serial, parallel = report["levels"]
    assert parallel["duration_s"] < serial["duration_s"]  # 4 in flight beat 1 in flight
    # What the engine received: every bench request asked for ignore_eos and usage, and shares the prefix.
    prompts = [p.split() for p in engine.bench_prompts()]
    assert len(prompts) == 16
    assert all(len(p) == 12 for p in prompts)
    assert all(p[:5] == prompts[0][:5] for p in prompts)
    assert len({" ".join(p) for p in prompts}) == 16  # no prompt repeats, across levels too
    for body in engine.bodies:
        assert body["stream"] is True
        assert body["ignore_eos"] is True
        assert body["stream_options"] == {"include_usage": True}


def test_turns_resend_each_conversations_history_with_its_session(capsys, monkeypatch):
    with EngineStandIn(first_delay=0.01, gap=0.005) as engine:
        argv = [engine.url, "--concurrency", "2", "--requests", "5", "--turns", "3", "--turn-tokens", "4"]
        argv += ["--prompt-tokens", "10", "--shared-prefix", "3", "--output-tokens", "2"]
        rc, report, _ = run_json(argv, capsys, monkeypatch)
    assert rc == 0 and report["settings"]["turns"] == 3 and report["settings"]["turn_tokens"] == 4
    # 5 requests round up to 2 whole conversations of 3 turns
    level = report["levels"][0]
    assert (level["requests"], level["ok"]) == (6, 6)
    pairs = zip(engine.sessions, engine.bodies, strict=True)
    turns = [(s, b["prompt"]) for s, b in pairs if b.get("max_tokens", 0) > 1]
    by_session = {}
    for session, prompt in turns:
        by_session.setdefault(session, []).append(prompt)
    assert len(by_session) == 2 and all(len(p) == 3 for p in by_session.values())
    for prompts in by_session.values():
        first, second, third = prompts
        # each turn is the previous turn, the stand-in's reply to it (" t0 t1") and 4 new words
        assert second.startswith(first + " t0 t1\nUser: ") and third.startswith(second + " t0 t1\nUser: ")
        assert len(second[len(first + " t0 t1\nUser: ") :].split()) == 5  # 4 words and "Assistant:"
        assert first.split("\n")[0].split()[:3] == turns[0][1].split()[:3]  # the shared prefix
    # the one-token probe carries no session
    assert engine.sessions[0] is None


def test_failures_are_counted_and_exit_2(capsys, monkeypatch):
    with EngineStandIn(first_delay=0.01, gap=0.005, fail_every=3) as engine:
        argv = [engine.url + "/v1", "--concurrency", "4", "--requests", "12", "--prompt-tokens", "8"]
        rc, report, _ = run_json([*argv, "--output-tokens", "3"], capsys, monkeypatch)
    assert rc == 2  # the load ran and did not pass
    (level,) = report["levels"]
    assert (level["requests"], level["ok"], level["failed"]) == (12, 8, 4)
    assert level["output_tokens"] == 8 * 3
    assert level["ttft_ms"]["n"] == 8
    (error,) = level["errors"]
    assert error["count"] == 4
    assert error["error"].startswith("HTTP 500:") and "stand-in engine failure" in error["error"]


def test_refused_ignore_eos_and_no_usage_fall_back_to_chunks(capsys, monkeypatch):
    with EngineStandIn(first_delay=0.01, gap=0.005, accept_ignore_eos=False, send_usage=False) as engine:
        argv = [engine.url, "--requests", "4", "--prompt-tokens", "6", "--output-tokens", "7"]
        rc, report, _ = run_json(argv, capsys, monkeypatch)
    assert rc == 0
    assert report["server"]["ignore_eos"] is False
    (level,) = report["levels"]
    assert level["output_tokens"] == 4 * 7  # one token per text chunk
    assert level["output_tokens_from"] == "text chunks"
    assert level["prompt_tokens_mean"] is None
    assert all("ignore_eos" not in b for b in engine.bodies[-4:])


def test_duration_mode_runs_until_the_deadline(capsys, monkeypatch):
    with EngineStandIn(first_delay=0.01, gap=0.005) as engine:
        argv = [engine.url, "--concurrency", "2", "--duration", "0.4", "--prompt-tokens", "4", "--output-tokens", "2"]
        rc, report, _ = run_json(argv, capsys, monkeypatch)
    assert rc == 0
    (level,) = report["levels"]
    assert level["requests"] >= 4 and level["failed"] == 0
    assert level["duration_s"] >= 0.4


def _ca_and_server_context(tmp_path):
    """A CA and a certificate it signed for 127.0.0.1 (made with cryptography, as the fleet CA
    is, with the extensions community.crypto gives it: key usage and a subject key identifier on
    the CA, an authority key identifier on the host's; Python 3.13's default context verifies
    strictly and refuses a chain without them): the CA's PEM path and the server's ssl context."""
    import datetime
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(2).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(pem))
    (tmp_path / "host.crt").write_bytes(cert.public_bytes(pem))
    (tmp_path / "host.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "host.crt", tmp_path / "host.key")
    return tmp_path / "ca.crt", server


def test_cacert_trusts_the_fleet_ca_for_an_https_endpoint(capsys, monkeypatch, tmp_path):
    ca, server = _ca_and_server_context(tmp_path)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with EngineStandIn(first_delay=0.0, gap=0.0, tls=server) as engine:
        assert engine.url.startswith("https://")
        argv = [engine.url, "--requests", "2", "--output-tokens", "3"]
        rc, report, _ = run_json([*argv, "--cacert", str(ca)], capsys, monkeypatch)
        assert rc == 0 and report["levels"][0]["ok"] == 2
        # without it the certificate is not trusted: the run stops, naming the URL
        rc, report, err = run_json(argv, capsys, monkeypatch)
        assert (
            rc == 1 and report is None and "cannot reach %s/v1: its TLS certificate is not trusted" % engine.url in err
        )
        assert "--cacert" in err and "gpufleet-ca.crt" in err
    # a file that is not PEM is named before any request
    (tmp_path / "junk.crt").write_text("not a certificate\n")
    rc, _, err = run_json([engine.url, "--cacert", str(tmp_path / "junk.crt")], capsys, monkeypatch)
    assert rc == 1 and "--cacert %s cannot be read as PEM certificates" % (tmp_path / "junk.crt") in err


def test_unreachable_url_exits_1_naming_it(capsys, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    rc, report, err = run_json(["http://127.0.0.1:%d" % port], capsys, monkeypatch)
    assert rc == 1 and report is None
    assert "cannot reach http://127.0.0.1:%d/v1" % port in err
    assert "check the URL" in err


def test_api_key_from_env_is_used_and_never_printed(capsys, monkeypatch):
    with EngineStandIn(first_delay=0.0, gap=0.0, api_key="s3cret-key") as engine:
        rc, _, err = run_json([engine.url, "--api-key", "wrong-key"], capsys, monkeypatch)
        assert rc == 1
        assert "refused the API key (HTTP 401)" in err and "--api-key" in err
        assert "wrong-key" not in err
        monkeypatch.setenv("GPUFLEET_API_KEY", "s3cret-key")
        rc = bench.run(parse([engine.url, "--requests", "2", "--prompt-tokens", "3", "--output-tokens", "2"]))
        out, err = capsys.readouterr()
    assert rc == 0
    assert "s3cret-key" not in out + err


def test_unknown_model_exits_1_listing_the_served_ones(capsys, monkeypatch):
    with EngineStandIn() as engine:
        rc, _, err = run_json([engine.url, "--model", "other"], capsys, monkeypatch)
    assert rc == 1
    assert "does not serve 'other' (it lists stand-in-model)" in err


def test_text_table(capsys, monkeypatch):
    monkeypatch.delenv("GPUFLEET_API_KEY", raising=False)
    with EngineStandIn(first_delay=0.02, gap=0.01, fail_every=4) as engine:
        argv = [engine.url, "--concurrency", "1,4", "--requests", "8", "--prompt-tokens", "16"]
        rc = bench.run(parse([*argv, "--shared-prefix", "8", "--output-tokens", "4"]))
    out = capsys.readouterr().out
    print(out)  # shown with pytest -s: the example in the report
    assert rc == 2
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("conc  requests"))
    assert re.split(r"\s{2,}", header.strip()) == [
        *("conc", "requests", "ok", "failed", "time s", "ok req/s", "out tok/s", "prompt tok")
    ]
    rows = [line.split() for line in lines if line.split()[:2] in (["1", "8"], ["4", "8"])]
    assert [(r[0], r[2], r[3]) for r in rows] == [("1", "6", "2"), ("4", "6", "2")]
    metric_rows = [line.split() for line in lines if len(line.split()) == 6 and line.split()[1] in ("TTFT", "E2E")]
    assert len(metric_rows) == 4
    assert "failed at concurrency 1: 2 x HTTP 500" in out


# --------------------------------------------------------------------------------------------------------------
# Without the OpenAI client (gpufleet installed without its bench extra)

# `import openai` raises ImportError when sys.modules holds None for it: a Python without the package.
_WITHOUT_OPENAI = (
    "import sys; sys.modules['openai'] = None; from gpufleet.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _gpufleet_without_openai(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENAI, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_bench_without_the_client_names_the_install_command_and_fails():
    proc = _gpufleet_without_openai("bench", "http://127.0.0.1:9", "--requests", "1")
    assert proc.returncode == 1, proc.stderr
    assert "gpufleet bench: the OpenAI client (the openai package) is not installed" in proc.stderr
    assert bench.BENCH_EXTRA == "pip install 'gpufleet[bench]'" and bench.BENCH_EXTRA in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_other_commands_and_the_help_work_without_the_client():
    from conftest import FIXTURES

    for args in (["--help"], ["bench", "--help"], ["--version"]):
        proc = _gpufleet_without_openai(*args)
        assert proc.returncode == 0, (args, proc.stderr)
    assert "pip install 'gpufleet[bench]'" in " ".join(_gpufleet_without_openai("bench", "--help").stdout.split())
    shown = _gpufleet_without_openai("gpu", "show", str(FIXTURES / "8x_h100_sxm_nv18_12nic_numa_off"))
    assert shown.returncode == 0 and "8 GPU(s)" in shown.stdout, shown.stderr


def test_the_client_is_found_when_installed():
    bench.require_openai()  # the test environment installs the bench extra (the test extra pulls it in)
