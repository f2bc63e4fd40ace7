"""make bench-models: what routing by model and the token quota add at the edge (issue 34).

Real nginx (Debian's, with its Lua module, installed in a container of the lab host image) runs
the edge role's own site three times, each in its own nginx with one worker:
- `models`: the site as the role writes it for two models and edge keys: gpufleet_edge.lua reads
  each request's model and key in the access phase, checks the key's scope and picks the model's
  upstream;
- `baseline`: the same rendered site with the Lua step taken out (one upstream of every backend,
  `proxy_pass` to it), which is the edge before issue 34: measured in the same run;
- `quota`: `models` with a usage store (Debian's redis-server in the same container, the role's
  redis.conf) and a daily token limit on the key: each request also reads the key's counters
  from the store in the access phase (one round trip), its answer's usage is read as it passes
  and counted (each worker sends its counts once a second).
Behind them, fixed responders on loopback (a fourth nginx answering each request at once with a
small completion and its usage) stand in for the proxies, so the difference is the edge's own
work, not an engine's. Requests rotate over the three edges round by round, over keepalive
connections, at concurrency 1 and 16, with 2 KB and 200 KB bodies. Prints p50 and p99 of each,
the p50 routing adds to the baseline and the p50 the quota adds to routing; writes
.cache/bench-models.txt.

    python tests/bench/models_bench.py [--rounds N] [--requests N]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import jinja2
from ansible.plugins.filter.core import comment, to_json, to_nice_json

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.gpufleet.serving.plugins.module_utils._edge import backends, plan_edge  # noqa: E402

TEMPLATES = ROOT / "roles" / "edge" / "templates"
HARNESS = ROOT / "tests" / "lab" / "harness.sh"
KEY = "bench-key-0123456789abcdef0123456789abcdef"
CONF = "/bench/conf"

# Runs inside the container: nginx for the responders and each edge, then the client.
CLIENT = (
    r"""
import http.client, json, statistics, sys, threading, time
rounds, per, out = int(sys.argv[1]), int(sys.argv[2]), {}
bodies = {"2KB": json.dumps({"model": "tiny-mha", "prompt": "x" * 2000, "max_tokens": 16}),
          "200KB": json.dumps({"model": "tiny-mha", "prompt": "x" * 200000, "max_tokens": 16})}
headers = {"Content-Type": "application/json", "Authorization": "Bearer %s"}
def run(port, body, conc, n, into):
    def worker():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(n):
            t = time.perf_counter()
            c.request("POST", "/v1/completions", body, headers)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit("port %%d answered %%d" %% (port, r.status))
            into.append((time.perf_counter() - t) * 1000)
    ts = [threading.Thread(target=worker) for _ in range(conc)]
    [t.start() for t in ts]
    [t.join() for t in ts]
for size, body in bodies.items():
    for conc in (1, 16):
        order = [("models", 8080), ("baseline", 8081), ("quota", 8082)]
        got = {name: [] for name, _ in order}
        for _, port in order:
            run(port, body, conc, 20, [])  # warm each (connections, caches)
        for i in range(rounds):
            for name, port in order[i %% 3:] + order[:i %% 3]:
                run(port, body, conc, max(1, per // conc), got[name])
        q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]
        out["%%s c=%%d" %% (size, conc)] = {k: {"n": len(v), "p50": statistics.median(v), "p99": q(v, 99)}
                                      for k, v in got.items()}
print("RESULT " + json.dumps(out))
"""
    % KEY
)

SCRIPT = """
set -e
apt-get update -qq >/dev/null 2>&1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light libnginx-mod-http-lua \
  lua-cjson redis-server >/dev/null 2>&1
nginx -v 2>&1
redis-server /bench/redis.conf --supervised no --daemonize yes --pidfile /tmp/redis.pid --logfile /tmp/redis.log \
  --dir /tmp
for c in backends models baseline; do nginx -c /bench/$c.conf; done
# the quota site: its own pid, logs and body folder
cp -r /bench/q /tmp/q && sed -i 's#/tmp/models#/tmp/quota#g' /tmp/q/models.conf /tmp/q/conf/models-site.conf
nginx -c /tmp/q/models.conf
sleep 0.5
python3 /bench/client.py "$@"
"""

# (the responders' answer: a small completion with its usage)
BACKENDS = """
worker_processes 1;
pid /tmp/backends.pid;
error_log /tmp/backends-error.log;
events {}
http {
  access_log off;
  server {
    listen 127.0.0.1:9301;
    listen 127.0.0.1:9302;
    listen 127.0.0.1:9303;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    location / {
      default_type application/json;
      return 200 '%s';
    }
  }
}
""" % (
    '{"id":"cmpl-1","object":"text_completion","served_by":$server_port,"choices":[{"text":"ok"}],'
    '"usage":{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16}}'
)

EDGE = """
%(modules)s
worker_processes 1;
pid /tmp/%(name)s.pid;
error_log /tmp/%(name)s-error.log;
events {}
http {
  client_body_temp_path /tmp/%(name)s-body;
  include %(conf)s/%(name)s-site.conf;
}
"""


def render(
    out: Path,
    keys=None,
    quota=None,
    backends_conf=BACKENDS,
    listen=8080,
    conf_dir=CONF,
    router="",
    edges=("edge",),
    body_limits=None,
) -> None:
    """The edge role's templates for two models (tiny-llama on a and b, tiny-mha on c), TLS off,
    the proxies at the responders, with edge keys (default: one key scoped to tiny-mha); then the
    baseline site without the Lua step. Writes the nginx configurations, client.py and run.sh.
    quota: {port, password, fail_open} for a usage store on loopback (edge_quota_store_host);
    backends_conf: the responders' nginx configuration (None: none written); listen: the edge's port;
    conf_dir: where the files are read from when nginx runs; router: edge_router_policy (the router
    on loopback 8090, its way to the proxies on 8091; not started here); edges: the edge group (more
    than one: the store over TLS, with the client certificate and CA files in conf_dir)."""

    def engines(name, model):
        return [{"name": name, "served_model_name": model, "port": 8001}]

    def host(port, name, model):
        return {"ansible_host": "127.0.0.1", "proxy_tls": False, "proxy_listen_port": port,
                "gpufleet_engines": engines(name, model)}  # fmt: skip

    hv = {
        "a": host(9301, "tiny", "tiny-llama"),
        "b": host(9302, "tiny", "tiny-llama"),
        "c": host(9303, "mha", "tiny-mha"),
    }  # fmt: skip
    keys = keys or [{"name": "bench", "key": KEY, "models": ["tiny-mha"]}]
    params = {"backend_group": "gpu_hosts", "drained": [], "listen_port": listen, "listen_address": "127.0.0.1",
              "tls": False, "tls_port": 8443, "router_policy": router, "router_port": 8090,
              "router_backend_port": 8091, "router_metrics_port": 9097, "api_keys": keys}  # fmt: skip
    if body_limits:
        params["body_limits"] = body_limits
    if quota:
        params.update(quota_store_host="edge", edge_hosts=list(edges), quota_store_address="127.0.0.1",
                      quota_store_port=quota["port"], quota_store_password=quota["password"],
                      quota_fail_open=quota.get("fail_open", True))  # fmt: skip
    plan = plan_edge(params, backends(list(hv), hv))
    assert not plan["errors"], plan["errors"]
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)), trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    )
    env.filters.update(comment=comment, to_json=to_json, to_nice_json=to_nice_json)
    ctx = {
        "__edge_plan": plan, "_edge_conf_dir": conf_dir, "edge_tls": False, "edge_listen_address": "127.0.0.1",
        "edge_router_port": 8090, "edge_router_backend_port": 8091,
        "edge_client_max_body_size": "64m", "edge_read_timeout": "600s",
        "edge_max_fails": 1, "edge_fail_timeout": "10s", "__edge_scheme": "http", "edge_api_keys": keys,
        "ansible_managed": "make bench-models", "edge_listen_port": listen,
        "edge_quota_store_password": (quota or {}).get("password", ""),
        "_edge_store_ca_file": conf_dir + "/store-client-ca.crt",
    }  # fmt: skip
    conf = out / "conf"
    (conf / "lua").mkdir(parents=True)
    files = [("models.conf.j2", "models.conf"), ("servers.conf.j2", "servers.conf"),
             ("models.json.j2", "models.json"), ("keys.json.j2", "keys.json")]  # fmt: skip
    if router:
        files.append(("router-backends.conf.j2", "router-backends.conf"))
    for src, dst in files:
        (conf / dst).write_text(env.get_template(src).render(ctx))
    (conf / "upstream.conf").write_text('proxy_http_version 1.1;\nproxy_set_header Connection "";\n')
    for lua in sorted((ROOT / "roles" / "edge" / "files" / "lua").glob("*.lua")):
        (conf / "lua" / lua.name).write_text(lua.read_text())
    site = env.get_template("edge.conf.j2").render(ctx)
    site = site.replace("/etc/nginx/gpufleet-edge/upstream.conf", conf_dir + "/upstream.conf")
    site = site.replace("/var/log/nginx/gpufleet-edge-access.log", "/tmp/models-access.log")
    (conf / "models-site.conf").write_text(site)
    # The baseline: the same site, the Lua step out, every request to the one upstream of every backend.
    base = re.sub(r"lua_package_path[^\n]*\n", "", site)
    base = re.sub(r"init_by_lua_block \{.*?\n\}\n", "", base, flags=re.S)
    base = re.sub(r"lua_shared_dict[^\n]*\n", "", base)
    base = re.sub(r"\n\s*\w+_by_lua_block \{[^\n]*\}", "", base)
    base = re.sub(r"\n\s*location = /_gpufleet/quota-stats \{.*?\n    \}", "", base, flags=re.S)
    base = re.sub(r"\n\s*location[^{\n]*\{\s*content_by_lua_block \{[^\n]*\}\s*\}", "", base)
    base = base.replace('    set $gpufleet_upstream "";\n', "")
    base = base.replace("$gpufleet_upstream", "gpufleet_edge").replace("listen 127.0.0.1:8080", "listen 127.0.0.1:8081")
    base = base.replace("/tmp/models-access.log", "/tmp/baseline-access.log")
    assert "_by_lua" not in base and "lua_package_path" not in base and "gpufleet_upstream" not in base, base
    (conf / "baseline-site.conf").write_text(base)
    modules = "include /etc/nginx/modules-enabled/*.conf;"
    (out / "models.conf").write_text(EDGE % {"name": "models", "conf": conf_dir, "modules": modules})
    (out / "baseline.conf").write_text(EDGE % {"name": "baseline", "conf": conf_dir, "modules": ""})
    if backends_conf:
        (out / "backends.conf").write_text(backends_conf)
    (out / "client.py").write_text(CLIENT)
    (out / "run.sh").write_text(textwrap.dedent(SCRIPT))


STORE_PASSWORD = "bench-usage-store-0123456789"


def quota_site(out: Path) -> None:
    """The `quota` edge (port 8082, files in q/): the models site with a usage store on loopback
    and a daily limit on the bench key that the bench never reaches; and the store's redis.conf."""
    keys = [{"name": "bench", "key": KEY, "models": ["tiny-mha"], "tokens_per_day": 10**12}]
    render(out / "q", keys=keys, quota={"port": 6379, "password": STORE_PASSWORD}, backends_conf=None, listen=8082,
           conf_dir="/tmp/q/conf")  # fmt: skip
    redis_conf(out / "redis.conf", STORE_PASSWORD, edges=["edge"], by="make bench-models")


def redis_conf(path: Path, password: str, edges: list, by: str, tls_dir: str = "/etc/redis/tls") -> None:
    """The edge role's redis.conf (the usage store) for the edge hosts `edges`, on port 6379 (more
    than one edge: TLS only, its files in tls_dir)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)))
    path.write_text(env.get_template("redis.conf.j2").render(
        ansible_managed=by, groups={"edge": edges}, edge_quota_store_port=6379,
        edge_quota_store_password=password, _edge_store_tls_dir=tls_dir))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=200, help="requests per edge per round (split over the clients)")
    args = ap.parse_args()
    image = subprocess.run([str(HARNESS), "image", "host"], check=True, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        render(Path(tmp))
        quota_site(Path(tmp))
        done = subprocess.run(
            ["docker", "run", "--rm", "-v", "%s:/bench:ro" % tmp, image,
             "sh", "/bench/run.sh", str(args.rounds), str(args.requests)],
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not result:
        print(done.stdout, done.stderr, file=sys.stderr)
        return 1
    data = json.loads(result[0][len("RESULT ") :])
    nginx = next((line for line in done.stdout.splitlines() if "nginx version" in line), "nginx")
    lines = [
        "make bench-models: the edge's routing by model and its token quota against the same site without them",
        "(%s, one worker each; fixed responders behind them; %d rounds rotating; ms)" % (nginx.strip(), args.rounds),
        "%-14s %9s %9s %9s %9s %9s %9s %10s %10s %8s" % ("body, clients", "base p50", "model p50", "quota p50",
                                                        "base p99", "model p99", "quota p99", "model+p50",
                                                        "quota+p50", "requests"),
    ]  # fmt: skip
    for case, got in data.items():
        b, m, q = got["baseline"], got["models"], got["quota"]
        lines.append(
            "%-14s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %+10.3f %+10.3f %8d"
            % (case, b["p50"], m["p50"], q["p50"], b["p99"], m["p99"], q["p99"], m["p50"] - b["p50"],
               q["p50"] - m["p50"], m["n"])
        )  # fmt: skip
    lines.append("model+p50: what routing by model adds to the baseline; quota+p50: what the quota adds to routing")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (ROOT / ".cache").mkdir(exist_ok=True)
    (ROOT / ".cache" / "bench-models.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
