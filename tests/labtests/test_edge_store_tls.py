"""The usage store over TLS with two edge hosts, as the edge role makes it (issue 47): two systemd
lab hosts, the store's host running the role's quota_store.yml (Debian's redis-server, its
certificate from the fleet CA, redis.conf with TLS only) and both the role's store_client.yml
(each edge's client certificate, the CA its workers check the store by), with the real
ansible-playbook; the plan is the edge plan's own (the edge_plan filter) for two edge hosts. Then,
from the other edge host: a client with that edge's certificate, checking the store's by the fleet
CA and the store host's inventory name, gets to the password and PONG; one without a certificate,
and one with the store host's own server certificate, are refused; plain TCP is not answered. The
key is root:redis 0640 and redis-server runs as redis; a second run changes nothing.

test_edge_quota.py covers what nginx's Lua and gpufleet-usage do over such a store; the fleet lab
has one edge (the store on loopback)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, remove_host, start_systemd_host

pytestmark = pytest.mark.full

PASSWORD = "store-tls-test-password-0123"
CHECK = r"""
import socket, ssl, sys
host, password, mode = sys.argv[1:4]
try:
    sock = socket.create_connection((host, 6379), timeout=5)
    if mode != "plain":
        ctx = ssl.create_default_context(cafile="/etc/nginx/gpufleet-store-ca.crt")
        if mode == "client":
            d = "/etc/nginx/gpufleet-edge/"
            ctx.load_cert_chain(d + "store-client.crt", d + "store-client.key")
        elif mode == "server":
            ctx.load_cert_chain("/etc/redis/tls/store.crt", "/etc/redis/tls/store.key")
        sock = ctx.wrap_socket(sock, server_hostname=sys.argv[4])
    sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n*1\r\n$4\r\nPING\r\n" % (len(password), password.encode()))
    data = b""
    while b"PONG" not in data:
        more = sock.recv(100)
        if not more:
            break
        data += more
    print("answered:", data.decode(errors="replace").split())
except (OSError, ssl.SSLError) as e:
    print("refused:", type(e).__name__)
"""


@pytest.fixture(scope="module")
def edges():
    names = []
    try:
        names.append(start_systemd_host("lab-store-a-"))
        names.append(start_systemd_host("lab-store-b-"))
        yield names
    finally:
        for name in names:
            remove_host(name)


def _converge(tmp_path, store, other):
    # the edge plan's own settings for two edge hosts (the role's plan.yml passes the same)
    settings = {
        "backend_group": "gpu_hosts", "quota_store_host": store, "quota_store_port": 6379,
        "api_keys": [{"name": "k", "key": "store-tls-test-key-0123456789abcdef0123", "tokens_per_day": 100}],
        "quota_store_password": "{{ edge_quota_store_password }}", "quota_fail_open": True,
        "edge_hosts": "{{ groups['edge'] }}",
        "quota_store_address": "{{ '127.0.0.1' if inventory_hostname == '%s' else '%s' }}" % (store, store),
    }  # fmt: skip
    play = {
        "name": "The usage store over TLS (the edge role's tasks)",
        "hosts": "edge",
        "gather_facts": False,
        "tasks": [
            {"name": "nginx (the edge role installs it first; its handlers reload it)",
             "ansible.builtin.apt": {"name": ["nginx-light", "python3-cryptography"], "update_cache": True,
                                     "cache_valid_time": 3600, "install_recommends": False}},
            {"name": "The edge's plan for two edges",
             "ansible.builtin.set_fact": {"__edge_plan": "{{ __settings | gpufleet.serving.edge_plan([]) }}"},
             "vars": {"__settings": settings}},
            {"name": "The edge's folder",
             "ansible.builtin.file": {"path": "/etc/nginx/gpufleet-edge", "state": "directory", "mode": "0700"}},
            {"name": "The store", "ansible.builtin.include_role": {"name": "gpufleet.serving.edge",
                                                                   "tasks_from": "quota_store"},
             "when": "inventory_hostname == '%s'" % store},
            {"name": "The store's clients", "ansible.builtin.include_role": {"name": "gpufleet.serving.edge",
                                                                             "tasks_from": "store_client"}},
        ],
    }  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    line = "%s ansible_connection=community.docker.docker ansible_python_interpreter=/usr/bin/python3\n"
    (tmp_path / "hosts.ini").write_text(
        "[edge]\n" + line % store + line % other + "[edge:vars]\nedge_quota_store_password=%s\n" % PASSWORD
    )
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
         str(tmp_path / "play.yml"), "-e", json.dumps({"gpufleet_tls_ca_copy": str(tmp_path / "ca.crt")})],
        cwd=ROOT, env=dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts")),
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip


def _in(host, *argv):
    return subprocess.run(["docker", "exec", host, *argv], capture_output=True, text=True, check=False)


def test_the_store_takes_edges_with_a_fleet_client_certificate_only(tmp_path, edges):
    store, other = edges
    first = _converge(tmp_path, store, other)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    address = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                              store], capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / "check.py").write_text(CHECK)
    subprocess.run(["docker", "cp", str(tmp_path / "check.py"), "%s:/root/check.py" % other], check=True)
    subprocess.run(["docker", "cp", str(tmp_path / "check.py"), "%s:/root/check.py" % store], check=True)

    def check(host, mode, name):
        return _in(host, "python3", "/root/check.py", address, PASSWORD, mode, name).stdout.strip()

    # the other edge, with its client certificate, checking the store's by its inventory name
    assert check(other, "client", store) == "answered: ['+OK', '+PONG']"
    # the store's own edge too (over TLS on its address, as the workers reach it on loopback)
    assert check(store, "client", store) == "answered: ['+OK', '+PONG']"
    # the same certificate checked by another name: the client refuses the store
    assert check(other, "client", "llm.example.com").startswith("refused:")
    # no certificate, or a fleet certificate for serving (serverAuth only): the store refuses them
    assert check(other, "none", store).startswith("refused:")
    assert check(store, "server", store).startswith("refused:")
    # plain TCP: no answer
    assert "PONG" not in check(other, "plain", store)

    key = _in(store, "stat", "-c", "%U:%G %a", "/etc/redis/tls/store.key").stdout.strip()
    assert key == "root:redis 640", key
    client_key = _in(other, "stat", "-c", "%U:%G %a", "/etc/nginx/gpufleet-edge/store-client.key").stdout.strip()
    assert client_key == "root:root 600", client_key
    user = _in(store, "ps", "-o", "user=", "-C", "redis-server").stdout.split()
    assert user == ["redis"], user
    conf = _in(store, "cat", "/etc/redis/redis.conf").stdout
    assert re.search(r"^port 0$", conf, re.M) and re.search(r"^tls-auth-clients yes$", conf, re.M), conf

    second = _converge(tmp_path, store, other)
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-3000:]
    for host in edges:
        assert re.search(r"%s\s*: ok=\d+\s+changed=0 " % re.escape(host), second.stdout), second.stdout[-4000:]
