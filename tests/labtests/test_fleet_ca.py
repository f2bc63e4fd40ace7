"""The fleet CA's certificates on a real systemd host (a container of the lab host image): the
common role's host_certificate entry point issues a server and a client certificate, with
monitoring hosts in the inventory, and its expiry timer (gpufleet-tls-expiry.timer, its units
checked by systemd-analyze before they land) writes each certificate's end for node exporter's
textfile collector - the series GpufleetTLSCertificateExpiring reads. The CA lives on the same
host (the first gpu host without edge hosts); its own certificate is listed too. A second run
changes nothing.

The signing rules themselves (forged facts, extra usages, name constraints, renewal) are
tests/unit/test_fleet_ca_plays.py's, on local hosts without systemd."""

from __future__ import annotations

import datetime
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
TEXTFILE = "/var/lib/prometheus/node-exporter/gpufleet-tls.prom"


def _include(purpose, basename):
    return {
        "name": "A %s certificate" % purpose,
        "ansible.builtin.include_role": {"name": "gpufleet.serving.common", "tasks_from": "host_certificate"},
        "vars": {
            "common_tls_dir": "/etc/gpufleet-test-tls",
            "common_tls_names": [],
            "common_tls_purpose": purpose,
            "common_tls_basename": basename,
        },
    }


@pytest.fixture(scope="module")
def host():
    name = start_systemd_host("lab-fleetca-")
    try:
        yield name
    finally:
        remove_host(name)


def _converge(tmp_path, host):
    play = {
        "name": "Certificates from the fleet CA",
        "hosts": "gpu_hosts",
        "gather_facts": False,
        "tasks": [
            {"name": "The folder", "ansible.builtin.file": {"path": "/etc/gpufleet-test-tls", "state": "directory",
                                                            "mode": "0700"}},
            _include("server", "host"),
            _include("client", "store-client"),
        ],
    }  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    # a monitoring host that is never reached: the timer is wanted
    (tmp_path / "hosts.ini").write_text(
        "[gpu_hosts]\n%s ansible_connection=community.docker.docker ansible_python_interpreter=/usr/bin/python3\n"
        "[monitoring]\nlab-monitoring-unreached ansible_host=192.0.2.1\n" % host
    )
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
         str(tmp_path / "play.yml"), "-e", json.dumps({"gpufleet_tls_ca_copy": str(tmp_path / "ca.crt")})],
        cwd=ROOT, env=dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts")),
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def test_the_expiry_timer_publishes_every_certificates_end(tmp_path, host):
    first = _converge(tmp_path, host)
    assert first.returncode == 0, first.stdout + first.stderr
    timer = subprocess.run(["docker", "exec", host, "systemctl", "is-active", "gpufleet-tls-expiry.timer"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert timer.stdout.strip() == "active", timer.stdout + timer.stderr
    text = subprocess.run(["docker", "exec", host, "cat", TEXTFILE], capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r'gpufleet_tls_certificate_expiry_timestamp_seconds\{path="([^"]+)",purpose="\w+"\} (\d+)',
                            text))  # fmt: skip
    assert sorted(found) == [
        "/etc/gpufleet-test-tls/host.crt",
        "/etc/gpufleet-test-tls/store-client.crt",
        "/var/lib/gpufleet/ca/fleet-ca.crt",
    ], text
    assert 'path="/etc/gpufleet-test-tls/store-client.crt",purpose="client"' in text
    now = datetime.datetime.now(datetime.UTC).timestamp()
    days = {path: (int(end) - now) / 86400 for path, end in found.items()}
    assert 824 < days["/etc/gpufleet-test-tls/host.crt"] <= 825, days
    assert 3649 < days["/var/lib/gpufleet/ca/fleet-ca.crt"] <= 3650, days
    assert "gpufleet_tls_certificate_readable" in text and " 0\n" not in text

    second = _converge(tmp_path, host)
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r"%s\s*: ok=\d+\s+changed=0 " % re.escape(host), second.stdout), second.stdout
