"""The edge's backend list under the failure that took requests down in the fleet lab: one host
quarantined (its proxy answers 503) and a single connection error on the other. Real nginx
(Debian's, in the lab host image) runs the edge role's servers.conf template and the edge's own
retry settings in front of two stand-in proxies on loopback.

With the backends listed once (the old list), both are then out for fail_timeout and every
request meets nginx's "no live upstreams" (502); with the never-failed backup lines the
template now adds, they reach the healthy host."""

from __future__ import annotations

import re
import subprocess
import textwrap

import jinja2
import pytest
from ansible.plugins.filter.core import comment
from conftest import HARNESS, ROOT

# make test-full only: the edge's failover lines in real nginx, beside the fleet lab's edge
# (make test proves each central promise once; docs/testing.md).
pytestmark = pytest.mark.full

TEMPLATES = ROOT / "roles" / "edge" / "templates"
# The edge's retry settings, read from its site template (the direct() macro), so this test
# follows them.
RETRY = re.findall(r"^\s*(proxy_next_upstream[ _].*;)$", (TEMPLATES / "edge.conf.j2").read_text(), re.M)[:2]

# 9001: the quarantined host's proxy (503 to everything). 9002: a healthy host whose /drop
# closes the connection without an answer (the one error that marks it failed).
SITE = """
events {}
http {
  access_log off;
  error_log /tmp/edge-error.log;
  upstream gpufleet_edge { least_conn; include /tmp/servers.conf; }
  server { listen 127.0.0.1:9001; location / { return 503 "quarantined\\n"; } }
  server { listen 127.0.0.1:9002; location /drop { return 444; } location / { return 200 "served\\n"; } }
  server { listen 127.0.0.1:8080; location / { proxy_pass http://gpufleet_edge; %s } }
}
""" % " ".join(RETRY)

SCRIPT = (
    """
set -e
apt-get update -qq >/dev/null 2>&1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light curl >/dev/null 2>&1
cat > /tmp/edge.conf <<'EOF'
%s
EOF
for list in old new; do
  cp /tmp/$list.servers /tmp/servers.conf
  nginx -c /tmp/edge.conf -g 'pid /tmp/edge.pid;'
  sleep 0.5
  codes=$(curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:8080/drop)
  for i in 1 2 3 4 5; do
    codes="$codes $(curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:8080/v1/chat/completions)"
  done
  echo "$list $codes no-live-upstreams=$(grep -c 'no live upstreams' /tmp/edge-error.log || true)"
  nginx -c /tmp/edge.conf -g 'pid /tmp/edge.pid;' -s stop
  sleep 0.5
  rm -f /tmp/edge-error.log
done
"""
    % SITE
)


def render(servers):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), trim_blocks=True)
    env.filters["comment"] = comment
    plan = {"drained": [], "servers": servers}
    return env.get_template("servers.conf.j2").render(
        __edge_plan=plan, edge_max_fails=1, edge_fail_timeout="10s", ansible_managed="gpufleet test"
    )


@pytest.fixture(scope="module")
def host_image():
    return subprocess.run([HARNESS, "image", "host"], check=True, capture_output=True, text=True).stdout.strip()


def test_one_quarantined_host_and_one_error_elsewhere_still_serve(host_image, tmp_path):
    assert len(RETRY) == 2 and "http_503" in RETRY[0], RETRY
    servers = [
        {"address": "127.0.0.1", "port": 9001, "down": False},
        {"address": "127.0.0.1", "port": 9002, "down": False},
    ]
    new = render(servers)
    old = "\n".join(line for line in new.splitlines() if " backup " not in line) + "\n"
    assert new.count(" backup max_fails=0;") == 2 and old.count("server ") == 2
    (tmp_path / "new.servers").write_text(new)
    (tmp_path / "old.servers").write_text(old)
    (tmp_path / "run.sh").write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        ["docker", "run", "--rm", "-v", "%s:/t:ro" % tmp_path, host_image,
         "sh", "-c", "cp /t/*.servers /tmp/ && sh /t/run.sh"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    print(done.stdout, done.stderr)
    lines = {
        line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if line.startswith(("old ", "new "))
    }
    # the dropped request itself fails either way (the healthy host closed it without an answer)
    assert lines["old"][0] in ("502", "503") and lines["new"][0] in ("502", "503"), done.stdout + done.stderr
    assert lines["old"][1:] == ["502"] * 5 + ["no-live-upstreams=5"], done.stdout + done.stderr
    assert lines["new"][1:] == ["200"] * 5 + ["no-live-upstreams=0"], done.stdout + done.stderr


def test_a_drained_host_gets_no_backup_line():
    text = render(
        [
            {"address": "10.0.0.1", "port": 8443, "down": False},
            {"address": "10.0.0.2", "port": 8443, "down": True},
        ]
    )
    servers = [line for line in text.splitlines() if line.startswith("server ")]
    assert servers == [
        "server 10.0.0.1:8443 max_fails=1 fail_timeout=10s;",
        "server 10.0.0.2:8443 max_fails=1 fail_timeout=10s down;",
        "server 10.0.0.1:8443 backup max_fails=0;",
    ]
