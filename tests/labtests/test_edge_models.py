"""The edge's routing by model and its key scopes (issue 34) against raw requests: real nginx
(Debian's, with its Lua module, in a container of the lab host image) runs the edge role's own
site for two models (tiny-llama on hosts a and b, tiny-mha on c) with edge keys, in front of
fixed responders on loopback that stand in for the three proxies and answer with their port.
Each request's answer says which backend got it, or that the edge answered itself (its access
log then names no upstream). The fleet lab proves the same with real engines and the router;
this one tries the bodies and headers a client could get wrong or craft."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap

import pytest
from conftest import HARNESS, ROOT

sys.path.insert(0, str(ROOT / "tests" / "bench"))
from models_bench import render

ALL = "edge-test-all-models-0123456789abcdef0123"
MHA = "edge-test-mha-only-0123456789abcdef012345"
KEYS = [{"name": "all", "key": ALL}, {"name": "mha", "key": MHA, "models": ["tiny-mha"]}]
A, B, C = 9301, 9302, 9303
JSON = "application/json"
LONG = "x" * 1_500_000  # past client_body_buffer_size (1m): the body is read back from its file

# (name, method, path, headers, body, status, where): where is a set of backend ports, or None
# for an answer from the edge itself.
CASES = [
    ("scoped key, its model", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"model": "tiny-mha", "prompt": "x"}', 200, {C}),
    ("scoped key, another model", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"model": "tiny-llama", "prompt": "x"}', 404, None),
    ("key of every model", "POST", "/v1/chat/completions", {"Authorization": "Bearer " + ALL},
     '{"messages": [], "model": "tiny-llama"}', 200, {A, B}),
    ("lower-case scheme", "POST", "/v1/completions", {"Authorization": "bearer " + ALL},
     '{"model": "tiny-llama"}', 200, {A, B}),
    ("no key", "POST", "/v1/completions", {}, '{"model": "tiny-mha"}', 401, None),
    ("a key and more", "POST", "/v1/completions", {"Authorization": "Bearer %s x" % ALL},
     '{"model": "tiny-mha"}', 401, None),
    ("Basic scheme", "POST", "/v1/completions", {"Authorization": "Basic " + ALL}, '{"model": "tiny-mha"}', 401, None),
    ("a prefix of a key", "POST", "/v1/completions", {"Authorization": "Bearer " + ALL[:-1]},
     '{"model": "tiny-mha"}', 401, None),
    ("unknown model", "POST", "/v1/completions", {"Authorization": "Bearer " + ALL},
     '{"model": "tiny-mha2"}', 404, None),
    ("model as a number", "POST", "/v1/completions", {"Authorization": "Bearer " + ALL}, '{"model": 7}', 404, None),
    ("no model, two models served", "POST", "/v1/completions", {"Authorization": "Bearer " + ALL},
     '{"prompt": "x"}', 400, None),
    ("not JSON", "POST", "/v1/completions", {"Authorization": "Bearer " + ALL}, '{"model": ', 400, None),
    # the top-level model wins over a nested one, the last of two (as the engine's parser reads it)
    ("a nested model key", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"metadata": {"model": "tiny-llama"}, "model": "tiny-mha"}', 200, {C}),
    ("the same model nested and at the top, out of scope", "POST", "/v1/completions",
     {"Authorization": "Bearer " + MHA}, '{"metadata": {"model": "tiny-llama"}, "model": "tiny-llama"}', 404, None),
    ("a nested key only: the hosts of that model (their engine serves only it)", "POST", "/v1/completions",
     {"Authorization": "Bearer " + MHA}, '{"metadata": {"model": "tiny-mha"}, "prompt": "x"}', 200, {C}),
    ("two model keys", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"model": "tiny-mha", "model": "tiny-llama"}', 404, None),
    ("an escaped key name", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"mod\\u0065l": "tiny-llama"}', 404, None),
    # the scan would see only the nested key: with a \u anywhere the body is decoded whole
    ("an escaped key name and a nested raw one", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"mod\\u0065l": "tiny-llama", "response_format": {"schema": {"model": "tiny-mha"}}}', 404, None),
    ("an escaped value", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"model": "tiny\\u002dmha"}', 200, {C}),
    ("the model's text inside the prompt", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"prompt": "\\"model\\": \\"tiny-llama\\"", "model": "tiny-mha"}', 200, {C}),
    ("a body past the memory buffer", "POST", "/v1/completions", {"Authorization": "Bearer " + MHA},
     '{"prompt": "%s", "model": "tiny-mha"}' % LONG, 200, {C}),
    ("a multipart form (audio)", "POST", "/v1/audio/transcriptions", {"Authorization": "Bearer " + MHA},
     "FORM", 200, {C}),
    ("a GET with no model", "GET", "/v1/completions", {"Authorization": "Bearer " + ALL}, None, 400, None),
    ("the proxies' own paths", "GET", "/gpufleet/instance/tiny/v1/models", {"Authorization": "Bearer " + ALL},
     None, 404, None),
    ("a control path", "POST", "/add_worker?url=http://10.9.9.9:80", {"Authorization": "Bearer " + ALL},
     '{"model": "tiny-mha"}', 404, None),
    ("an engine's own path", "GET", "/metrics", {}, None, 404, None),
    ("dot-segments to a control path", "POST", "/v1/../flush_cache", {"Authorization": "Bearer " + ALL},
     '{"model": "tiny-mha"}', 404, None),
]  # fmt: skip


def curl(i, method, path, headers, body):
    args = ["curl", "-s", "--path-as-is", "-o", "/tmp/out.%d" % i, "-w", "%{http_code}", "-X", method]
    for k, v in headers.items():
        args += ["-H", "%s: %s" % (k, v)]
    if body == "FORM":
        args += ["-F", "model=tiny-mha", "-F", "file=@/etc/hostname"]
    elif body is not None:
        args += ["-H", "Content-Type: " + JSON, "--data-binary", "@/tmp/body.%d" % i]
    return " ".join(shlex.quote(a) for a in [*args, "http://127.0.0.1:8080" + path])


@pytest.fixture(scope="module")
def host_image():
    return subprocess.run([HARNESS, "image", "host"], check=True, capture_output=True, text=True).stdout.strip()


def test_each_request_reaches_its_models_backends_or_the_edge_answers(host_image, tmp_path):
    render(tmp_path, keys=KEYS)
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    lines = []
    for i, (_, method, path, headers, body, _, _) in enumerate(CASES):
        if body not in (None, "FORM"):
            (bodies / ("body.%d" % i)).write_text(body)
        lines.append('echo "CASE %d $(%s) $(head -c 400 /tmp/out.%d | tr -d "\\n")"' % (
            i, curl(i, method, path, headers, body), i))  # fmt: skip
    for key in (ALL, MHA):
        lines.append("echo \"LIST $(curl -s -H 'Authorization: Bearer %s' http://127.0.0.1:8080/v1/models)\"" % key)
    # the edge checks keys (models.json says so) but its key file is gone: nginx refuses to start (init_by_lua,
    # which `nginx -t` does not run), never fails open
    lines.append(
        "cp -r /bench /tmp/b2 && rm /tmp/b2/conf/keys.json"
        " && sed -i 's#/bench/conf#/tmp/b2/conf#g; s#/tmp/models#/tmp/b2m#g' /tmp/b2/models.conf"
        " /tmp/b2/conf/models-site.conf; if nginx -c /tmp/b2/models.conf 2>/tmp/b2.err; then r=0; else r=$?; fi;"
        ' echo "KEYS_MISSING $r $(grep -c "cannot be read" /tmp/b2.err) $(head -c 300 /tmp/b2.err)"'
    )
    lines.append('echo "LOG"; cat /tmp/models-access.log')
    script = (
        textwrap.dedent("""
        set -e
        apt-get update -qq >/dev/null 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light \\
          libnginx-mod-http-lua lua-cjson curl >/dev/null 2>&1
        for c in backends models; do nginx -c /bench/$c.conf; done
        sleep 0.5
        cp /bench/bodies/* /tmp/ 2>/dev/null || true
        """)
        + "\n".join(lines)
        + "\n"
    )
    (tmp_path / "cases.sh").write_text(script)
    done = subprocess.run(
        ["docker", "run", "--rm", "-v", "%s:/bench:ro" % tmp_path, host_image, "sh", "/bench/cases.sh"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    got = {}
    for line in out:
        if line.startswith("CASE "):
            _, i, code, text = [*line.split(" ", 3), ""][:4]
            got[int(i)] = (int(code), text)
    log = [json.loads(line) for line in out[out.index("LOG") + 1 :] if line.startswith("{")]
    problems = []
    for i, (name, _, _, _, _, status, where) in enumerate(CASES):
        code, text = got.get(i, (0, ""))
        if code != status:
            problems.append("%s: %d, wanted %d (%s)" % (name, code, status, text[:200]))
            continue
        if where is None:
            if '"error"' not in text:
                problems.append("%s: no OpenAI-style error: %s" % (name, text[:200]))
        elif json.loads(text)["served_by"] not in where:
            problems.append("%s: reached %s, wanted %s" % (name, json.loads(text)["served_by"], sorted(where)))
    assert problems == [], "\n".join(problems)
    # the edge answered every refusal itself: no upstream in its access log for those
    refused = [e for e in log if e["status"] >= 400]
    assert len(refused) == sum(1 for c in CASES if c[6] is None), log
    assert {e["upstream"] for e in refused} == {""}, refused
    served = [e for e in log if e["status"] == 200 and e["uri"] != "/v1/models"]
    assert {e["key"] for e in served} == {"all", "mha"} and {e["model"] for e in served} == {"tiny-llama", "tiny-mha"}
    # the not-found messages are OpenAI's, and a wrong key is told so
    assert "The model `tiny-mha2` does not exist or you do not have access to it." in got[8][1]
    assert json.loads(got[4][1])["error"]["code"] == "invalid_api_key"
    assert [line.split()[1:3] for line in out if line.startswith("KEYS_MISSING ")] == [["1", "1"]], [
        line for line in out if line.startswith("KEYS_MISSING ")]  # fmt: skip
    # /v1/models: each model once for the key of every model, only its own for the scoped key
    lists = [json.loads(line.split(" ", 1)[1]) for line in out if line.startswith("LIST ")]
    assert [[m["id"] for m in x["data"]] for x in lists] == [["tiny-llama", "tiny-mha"], ["tiny-mha"]]
