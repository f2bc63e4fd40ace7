"""Per-key token quotas shared by every edge (issue 34): two edges (two nginx processes running
the edge role's own site, with its Lua module) count each key's tokens in one usage store, the
role's own redis.conf in Debian's redis-server, in front of stand-in proxies that answer at once
with the usage each request decides (files/usage_responder.py, vLLM 0.32's framing). Checks:
- a key with 100 tokens a minute, 40 a request through alternating edges: the third request
  crosses it, the fourth and fifth are answered 429 (rate_limit_exceeded, Retry-After) by either
  edge without reaching a backend;
- the counted tokens, per key and model, equal what the stand-ins answered, exactly;
- a stream's backend hop asks for usage (stream_options.include_usage), and the client that did
  not ask gets no usage chunk; a client that asked keeps it; other stream options are kept;
- the store down: the fail-open edge lets a key with a quota through unchecked, the fail-closed
  one answers 503; both say so in their counters.
The second edge's site routes chat and completions through a router that is not running, so each
of its requests takes the router's fallback (an internal redirect to the model's upstream): its
counts and the usage chunk's removal hold there too.
Issue 47 (the edge's accounting at any size, its quota within one request, its store over TLS):
- answers far over 1 MB counted exactly (a rerank's usage before its echoed documents, a chat's
  before its prompt logprobs, a completions stream whose first event is 1.5 MB), embeddings, a
  transcription's duration; a text transcription, which has no usage, estimated and never 0;
- a body padded with 20 MB of spaces answered (the usage option added in linear time);
- a form with two model fields, a body past its path's cap and past nginx's: refused before any
  backend, with an OpenAI error (400, 413);
- 8 clients at once on a key with a small daily limit pass it by at most one request's reservation;
- the store, with two edges, over TLS only: a client without a certificate from the fleet CA (none,
  another CA's, a fleet server certificate) is refused; gpufleet-usage (Python) reads over TLS the
  same keys the Lua wrote.
The fleet lab proves the count against the real engines' usage."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

from conftest import HARNESS, ROOT
from fleet_certs import store_certificates

sys.path.insert(0, str(ROOT / "tests" / "bench"))
from models_bench import redis_conf, render

SMALL = "quota-test-small-0123456789abcdef0123456"
ALL = "quota-test-all-0123456789abcdef012345678"
BIG = "quota-test-big-0123456789abcdef012345678"
CUT = "quota-test-cut-0123456789abcdef012345678"
RELOAD = "quota-test-reload-0123456789abcdef012345"
SHAPES = "quota-test-shapes-0123456789abcdef012345"
BURST = "quota-test-burst-0123456789abcdef0123456"
PASSWORD = "quota-store-test-password-0123"
BURST_LIMIT = 300
KEYS = [
    {"name": "small", "key": SMALL, "tokens_per_minute": 100},
    {"name": "all", "key": ALL},
    {"name": "big", "key": BIG, "tokens_per_day": 1_000_000},
    {"name": "cut", "key": CUT},
    {"name": "reload", "key": RELOAD},
    # (a limit it never reaches: every shape also takes a reservation and its settlement)
    {"name": "shapes", "key": SHAPES, "tokens_per_day": 10**9},
    {"name": "burst", "key": BURST, "tokens_per_day": BURST_LIMIT},
]
FILES = ROOT / "tests" / "labtests" / "files"

SCRIPT = """
set -e
apt-get update -qq >/dev/null 2>&1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light \\
  libnginx-mod-http-lua lua-cjson redis-server >/dev/null 2>&1
redis-server /bench/redis.conf --supervised no --daemonize yes --pidfile /tmp/redis.pid \\
  --logfile /tmp/redis.log --dir /tmp
python3 /bench/usage_responder.py 9301 9302 9303 &
nginx -c /bench/models.conf
# a second edge on 8081, failing closed while the store is down, whose site sends chat and
# completions through a router that is not there: every one takes the router's fallback
cp -r /bench/e2 /tmp/e2
sed -i 's#/tmp/models#/tmp/e2m#g' /tmp/e2/models.conf /tmp/e2/conf/models-site.conf
sed -i 's#"fail_open": true#"fail_open": false#' /tmp/e2/conf/keys.json
nginx -c /tmp/e2/models.conf
sleep 0.5
python3 /bench/quota_cases.py %s %s %s %s %s %s %s %s
echo LOG
cat /tmp/models-access.log /tmp/e2m-access.log
""" % (SMALL, ALL, BIG, CUT, RELOAD, SHAPES, BURST, PASSWORD)


def test_quotas_shared_by_two_edges(tmp_path):
    image = subprocess.run([HARNESS, "image", "host"], check=True, capture_output=True, text=True).stdout.strip()
    quota = {"port": 6379, "password": PASSWORD, "fail_open": True}
    edges, limits = ["edge", "edge2"], {"/v1/embeddings": "1m"}
    render(tmp_path, keys=KEYS, quota=quota, backends_conf=None, edges=edges, body_limits=limits)
    render(tmp_path / "e2", keys=KEYS, quota=quota, backends_conf=None, listen=8081, conf_dir="/tmp/e2/conf",
           router="cache_aware", edges=edges, body_limits=limits)  # fmt: skip
    # two edges: the store on TLS only, with the fleet CA's certificates (the store's is named "edge")
    redis_conf(tmp_path / "redis.conf", PASSWORD, edges=edges, by="test_edge_quota", tls_dir="/bench/tls")
    store_certificates(tmp_path / "tls", {"edge": tmp_path / "conf", "edge2": tmp_path / "e2" / "conf"}, "edge")
    for name in ("usage_responder.py", "quota_cases.py"):
        (tmp_path / name).write_text((FILES / name).read_text())
    (tmp_path / "gpufleet-usage").write_text((ROOT / "roles" / "edge" / "files" / "gpufleet-usage").read_text())
    (tmp_path / "run.sh").write_text(textwrap.dedent(SCRIPT))
    # (nginx's workers read the store's CA, as from /etc/nginx on a host)
    tmp_path.chmod(0o755)
    done = subprocess.run(
        ["docker", "run", "--rm", "-v", "%s:/bench:ro" % tmp_path, image, "sh", "/bench/run.sh"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check(done.stdout.splitlines())


def check(lines):
    """The checks on the container's output (its RESULT line and the two access logs)."""
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT ") :])
    log = [json.loads(line) for line in lines[lines.index("LOG") + 1 :] if line.startswith("{")]

    # 100 tokens a minute, 40 a request: 40, 80, 120 pass (the third crosses it), then 429 on both edges
    small = result["small"]
    assert not result["minute_changed"], "the minute changed during the check: run it again"
    assert [r["status"] for r in small] == [200, 200, 200, 429, 429], small
    assert [r["reached"] for r in small] == [1, 1, 1, 0, 0], small
    assert result["small_minute"] == "120"
    for r in small[3:]:
        error = json.loads(r["body"])["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "tokens", error
        assert "Limit 100, Used 120" in error["message"], error
        assert 1 <= int(r["retry_after"]) <= 60, r

    # streams: the backend was asked for usage; the client sees the chunk only when it asked
    s = result["streams"]
    for name in ("none", "other_option", "null"):
        assert s[name]["status"] == 200 and s[name]["body"].endswith("data: [DONE]\n\n"), s[name]
        assert '"usage"' not in s[name]["body"], s[name]
        assert s[name]["body"].count('"delta"') == 5, s[name]
        assert s[name]["backend_body"]["stream_options"]["include_usage"] is True, s[name]
    assert s["other_option"]["backend_body"]["stream_options"] == {"continuous_usage_stats": False,
                                                                    "include_usage": True}  # fmt: skip
    assert s["asked"]["status"] == 200 and '"choices":[],"usage":{"prompt_tokens":10' in s["asked"]["body"], s["asked"]
    assert s["escaped"]["status"] == 200 and '"usage"' not in s["escaped"]["body"], s["escaped"]
    assert s["escaped"]["backend_body"]["stream_options"] == {"include_usage": True}, s["escaped"]
    assert s["two_options"]["status"] == 400 and '"param": "stream_options"' in s["two_options"]["body"].replace(
        '"param":"', '"param": "'), s["two_options"]  # fmt: skip

    # not a boolean stream, or a body cjson cannot read: refused (an engine would take them, uncounted)
    assert s["stream_one"]["status"] == 400 and '"stream"' in s["stream_one"]["body"], s["stream_one"]
    assert s["bom"]["status"] == 400, s["bom"]
    # a \u in the prompt does not stop the edge setting include_usage in the client's null stream_options
    assert s["escaped_prompt"]["status"] == 200 and '"usage"' not in s["escaped_prompt"]["body"], s["escaped_prompt"]
    assert s["escaped_prompt"]["backend_body"]["stream_options"] == {"include_usage": True}, s["escaped_prompt"]
    # Anthropic's messages: counted from input and output tokens; their streams carry usage, none injected
    assert s["messages_json"]["status"] == 200 and s["messages_stream"]["status"] == 200, s
    assert "stream_options" not in s["messages_stream"]["backend_body"], s["messages_stream"]
    assert s["messages_stream"]["body"].count("content_block_delta") == 8, s["messages_stream"]
    # a stream across a reload, whole
    assert result["reload_stream"]["status"] == 200 and result["reload_stream"]["body"].endswith("data: [DONE]\n\n")

    # counted exactly what the stand-ins answered, per key and model (every key, with a limit or not)
    answered = result["answered"]
    counted = {k: {f: v[f] for f in ("prompt", "completion", "requests")} for k, v in result["counted"].items()
               if not k.startswith("cut ") and k != "shapes tiny-mha"}  # fmt: skip
    assert counted == answered, (counted, answered)
    assert set(answered) == {"small tiny-llama", "all tiny-mha", "all tiny-llama", "reload tiny-llama",
                             "shapes tiny-llama", "burst tiny-llama"}, answered  # fmt: skip
    assert result["counted"]["reload tiny-llama"] == {"prompt": 10, "completion": 20, "requests": 1, "estimated": 0}
    # the stream the client left: counted as estimated, its prompt guessed from the body (4 bytes a token)
    cut = result["counted"]["cut tiny-llama"]
    assert cut["requests"] == 1 and cut["estimated"] == 1, cut
    assert cut["prompt"] == result["cut_body_bytes"] // 4 and 1 <= cut["completion"] < 40, (cut, result["cut_read"])

    check_issue_47(result, log)

    # the store down: open lets the limited key through, closed answers 503; a key without a limit passes both
    down = result["down"]
    assert down["open"]["status"] == 200, down["open"]
    assert (
        down["closed"]["status"] == 503 and json.loads(down["closed"]["body"])["error"]["code"] == "quota_unavailable"
    )
    assert down["closed"]["retry_after"] == "5"
    assert down["no_limit"]["status"] == 200
    st = result["stats"]
    assert st["open"]["store_up"] is False and st["closed"]["store_up"] is False, st
    assert st["open"]["unchecked_requests"] == 1 and st["closed"]["unchecked_requests"] == 0, st
    # both requests that passed while it was down went uncounted (50 and 40 tokens), each on its own edge
    assert st["open"]["uncounted_tokens"] == 40 and st["closed"]["uncounted_tokens"] == 40, st
    # (small's two and the burst's eight)
    assert st["open"]["refused_requests"] + st["closed"]["refused_requests"] == 2 + 8, st

    # the access logs: each refusal without an upstream, the tokens of each answer
    refused = [e for e in log if e["status"] == 429 and e["key"] == "small"]
    assert (
        len(refused) == 2 and {e["upstream"] for e in refused} == {""} and {e["quota"] for e in refused} == {"refused"}
    )
    assert [e["tokens"] for e in log if e["key"] == "small" and e["status"] == 200] == ["40", "40", "40"], log
    assert sorted(e["quota"] for e in log if e["key"] == "big") == ["unavailable", "unchecked"], log
    # the second edge's answers came through the router's fallback (the router's address first), each counted
    fallback = [e for e in log if e["upstream"].startswith("127.0.0.1:8090 : ") and e["status"] == 200]
    assert len(fallback) >= 7 and all(e["tokens"] for e in fallback), log


def check_issue_47(result, log):
    """Answers at any size and shape, refusals before any backend, the burst, the store's TLS."""
    shapes = result["shapes"]
    assert {k: v["status"] for k, v in shapes.items()} == dict.fromkeys(shapes, 200), shapes
    for name in ("rerank", "prompt_logprobs", "echo_stream"):
        assert shapes[name]["bytes"] > 1024 * 1024, (name, shapes[name]["bytes"])
    # (counted exactly: the shapes are in `answered`, compared with the store in the caller; the Responses
    # API's stream keeps its events, its usage read from response.completed)
    assert shapes["responses_stream"]["body"].count("response.output_text.delta") == 2 * 9, shapes["responses_stream"]
    # answers the engine refused: passed on as they were, nothing counted (not in `answered`), and what
    # they reserved of the key's day given back: the day's counter holds what the others used
    assert [e["status"] for e in result["errors"]] == [400, 500], result["errors"]
    assert all(json.loads(e["body"])["error"]["message"] == "refused by the stand-in" for e in result["errors"])
    assert result["counted"]["shapes tiny-llama"]["estimated"] == 0, result["counted"]
    # the text transcription has no usage: estimated from the form's size (16,000 bytes a second, 10 tokens
    # a second) and the text's bytes (4 a token), never 0
    text = "one two three four five six seven eight nine ten"
    assert result["counted"]["shapes tiny-mha"] == {
        "prompt": math.ceil(result["audio_text_body_bytes"] / 16000 * 10), "completion": math.ceil(len(text) / 4),
        "requests": 1, "estimated": 1}, result["counted"]  # fmt: skip
    # the padded body: its backend asked for the usage chunk, which the client did not get
    assert shapes["padded"]["backend_body"] == {"include_usage": True}, shapes["padded"]
    assert '"usage"' not in shapes["padded"]["body"] and shapes["padded"]["body"].endswith("data: [DONE]\n\n")

    refused = result["refused"]
    assert refused["reached"] == 0, refused
    two = json.loads(refused["two_models"]["body"])["error"]
    assert refused["two_models"]["status"] == 400 and two["param"] == "model" and "2 model fields" in two["message"]
    for name in ("over_path_cap", "over_nginx_cap"):
        assert refused[name]["status"] == 413, refused[name]
        assert json.loads(refused[name]["body"])["error"]["code"] == "request_too_large", refused[name]
    message = json.loads(refused["over_path_cap"]["body"])["error"]["message"]
    assert "over the 1048576 this endpoint (/v1/embeddings) accepts" in message, message

    # 8 clients at once: each ran until refused, and together they passed the limit by at most one request's
    # reservation (before issue 47: 12 times the limit, as counts reached the store once a second)
    burst = result["burst"]
    assert all(statuses[-1] == 429 for statuses in burst), burst
    passed = sum(statuses.count(200) for statuses in burst)
    counted = result["counted"]["burst tiny-llama"]
    assert counted["requests"] == passed and counted["prompt"] + counted["completion"] == passed * 70, counted
    assert passed * 70 <= BURST_LIMIT + result["burst_reserve"], (passed, burst, result["burst_reserve"])
    assert passed * 70 >= BURST_LIMIT - 8 * result["burst_reserve"], (passed, burst)

    # the store's TLS: only an edge's client certificate from the fleet CA gets to the password
    tls = result["store_tls"]
    assert "PONG" in tls["edge_client"], tls
    for name in ("plain", "no_certificate", "another_ca", "fleet_server_certificate"):
        assert "PONG" not in tls[name] and "+OK" not in tls[name], (name, tls)

    # gpufleet-usage (Python) read the keys the Lua wrote, over TLS: the same counts
    cli = result["usage_cli"]
    assert cli.get("store_up") is True, cli
    assert {"%s %s" % (u["key"], u["model"]): {k: u[k] for k in ("prompt", "completion", "requests", "estimated")}
            for u in cli["usage"]} == result["counted"], cli  # fmt: skip
    days = {k["name"]: k["day"] for k in cli["keys"]}
    assert days["burst"] == passed * 70, cli["keys"]
    shapes_used = sum(v for k, v in result["counted"]["shapes tiny-llama"].items() if k in ("prompt", "completion"))
    mha = result["counted"]["shapes tiny-mha"]
    assert days["shapes"] == shapes_used + mha["prompt"] + mha["completion"], (days, result["counted"])
