"""The fleet CA's signing path as the proxy role runs it (its task "A certificate for this host from
the fleet CA", copied from roles/proxy/tasks/configure.yml, which includes the common role's
host_certificate entry point), by the real ansible-playbook against local hosts: lab-a (a gpu
host) asks, lab-edge (the first edge host) holds the CA. Checked with the real openssl binary.

Everything lands in tmp_path: the CA's folder and the host's folder (the role's vars, overridden
with -e), the controller's copy of the CA (beside the inventory), the fact cache. The CA host's
package install is skipped (-e _common_tls_packages=[]): python3-cryptography is in the venv the
hosts run. Without monitoring hosts the expiry timer's tasks only look for a timer to remove.

A forged fact is a module that returns it, as a host would (tmp_path/library/forge_facts.py). A
forged request replaces the registered result of the host's request task (-e beats register), as a
host that answers the request task with a request of its own would.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASK = "A certificate for this host from the fleet CA"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the role makes root-owned keys (CI runs as root)"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl binary"),
]

FORGE = """#!/usr/bin/python
# WANT_JSON
# A host that reports a default address of its choosing (what a tampered host can do).
import json
import sys

with open(sys.argv[1]) as f:
    args = json.load(f)
print(json.dumps({"changed": False, "ansible_facts": {"default_ipv4": {"address": args["address"]}}}))
"""


def _proxy_task():
    tasks = yaml.safe_load((ROOT / "roles" / "proxy" / "tasks" / "configure.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == TASK]
    return task


def _run(tmp_path, forge=None, extra=None, args=(), task=None):
    """Run the proxy's certificate task (or `task`) on lab-a; returns (process, host folder, CA folder)."""
    host_dir, ca_dir = tmp_path / "host", tmp_path / "ca"
    host_dir.mkdir(exist_ok=True)
    (tmp_path / "library").mkdir(exist_ok=True)
    (tmp_path / "library" / "forge_facts.py").write_text(FORGE)
    tasks = [{"name": "Report a forged default address", "forge_facts": {"address": forge}}] if forge else []
    play = {
        "name": "The proxy's certificate",
        "hosts": "lab-a",
        "gather_facts": False,
        # as configure.yml has them when the task runs (its folder made before: here by the test)
        "vars": {
            "proxy_tls": True,
            "proxy_tls_certificate": "",
            "proxy_tls_names": [],
            "_proxy_conf_dir": str(host_dir),
            "__proxy_conf_dir_state": {"changed": False},
        },
        "tasks": [*tasks, task or _proxy_task()],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    local = "ansible_connection=local ansible_python_interpreter=%s" % sys.executable
    (tmp_path / "hosts.ini").write_text(
        "[gpu_hosts]\nlab-a ansible_host=127.0.0.1 %s\n[edge]\nlab-edge %s\n" % (local, local)
    )
    extra_vars = {"_common_fleet_ca_dir": str(ca_dir), "_common_tls_packages": [], **(extra or {})}
    env = dict(
        os.environ,
        ANSIBLE_LIBRARY=str(tmp_path / "library"),
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
        ANSIBLE_NOCOLOR="1",
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
         str(tmp_path / "play.yml"), "-e", json.dumps(extra_vars), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc, host_dir, ca_dir


def _openssl(*args):
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)


def _verify(ca, cert):
    return _openssl("verify", "-CAfile", str(ca), str(cert))


def _text(cert):
    return _openssl("x509", "-in", str(cert), "-noout", "-text").stdout


def _load(path):
    from cryptography import x509

    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def _leaf_from_ca(ca_dir, tmp_path, name, sans):
    """A certificate for `sans` signed with the CA's own key, as if the CA had been made to sign it."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = serialization.load_pem_private_key((ca_dir / "fleet-ca.key").read_bytes(), None)
    ca = _load(ca_dir / "fleet-ca.crt")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    general = [
        x509.IPAddress(ipaddress.ip_address(s[3:])) if s.startswith("IP:") else x509.DNSName(s[4:]) for s in sans
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lab-a")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(general), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    path = tmp_path / ("%s.crt" % name)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _forged_request(ekus):
    """A request for exactly lab-a's planned names, with the extended key usages `ekus`."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lab-a")]))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("lab-a"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("gpufleet-proxy"),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage(ekus), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def test_check_mode_on_a_new_fleet_changes_nothing(tmp_path):
    proc, host_dir, ca_dir = _run(tmp_path, args=["--check"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not ca_dir.exists() and list(host_dir.iterdir()) == []
    assert not (tmp_path / ".gpufleet-ca.crt").exists()


@pytest.mark.parametrize("forged", ["llm.example.com"])
def test_a_forged_default_address_stops_the_signing_naming_it(tmp_path, forged):
    proc, host_dir, _ = _run(tmp_path, forge=forged)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "does not sign lab-a's server certificate" in out, out
    assert "ansible_facts.default_ipv4.address='%s', which is not an IP address" % forged in out, out
    assert "remove its cached facts" in out, out
    # before the fix the name went into the request and the CA signed it
    assert not (host_dir / "host.crt").exists()


def test_a_request_with_more_usages_than_its_purpose_is_refused(tmp_path):
    from cryptography.x509.oid import ExtendedKeyUsageOID as EKU

    request = _forged_request([EKU.SERVER_AUTH, EKU.CLIENT_AUTH, EKU.CODE_SIGNING])
    proc, host_dir, _ = _run(tmp_path, extra={"__common_tls_csr": {"csr": request}})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "a server certificate from the fleet CA carries exactly serverAuth (refused: clientAuth, codeSigning)" in out
    # before the fix only the names and CA rights were compared, and the CA signed it
    assert not (host_dir / "host.crt").exists()


def test_the_ca_signs_the_plan_only_inside_its_constraints_renews_and_reissues(tmp_path):
    # 1. a good request: signed, verified by openssl against the CA, server usage only
    proc, host_dir, ca_dir = _run(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    ca, cert = ca_dir / "fleet-ca.crt", host_dir / "host.crt"
    assert _verify(ca, cert).returncode == 0, _verify(ca, cert).stderr
    text = _text(cert)
    assert "TLS Web Server Authentication" in text and "Client Authentication" not in text, text
    assert "DNS:lab-a, IP Address:127.0.0.1, DNS:gpufleet-proxy" in text, text
    ca_text = _text(ca)
    assert "X509v3 Name Constraints: critical" in ca_text, ca_text
    for subtree in ("DNS:lab-a", "DNS:lab-edge", "DNS:gpufleet-proxy", "IP:127.0.0.1/255.255.255.255"):
        assert subtree in ca_text, ca_text
    assert (tmp_path / ".gpufleet-ca.crt").read_text() == ca.read_text()
    # the CA's constraints hold in openssl even for a certificate its own key signed
    outside = _leaf_from_ca(ca_dir, tmp_path, "outside", ["DNS:llm.example.com"])
    inside = _leaf_from_ca(ca_dir, tmp_path, "inside", ["DNS:lab-edge", "IP:127.0.0.1"])
    other_ip = _leaf_from_ca(ca_dir, tmp_path, "other-ip", ["DNS:lab-a", "IP:10.9.9.9"])
    assert "permitted subtree violation" in _verify(ca, outside).stdout + _verify(ca, outside).stderr
    assert _verify(ca, inside).returncode == 0
    assert _verify(ca, other_ip).returncode != 0
    first_serial, first_ca = _load(cert).serial_number, _load(ca)

    # 2. again, in check mode and for real: nothing changes, nothing is signed anew
    for args in (["--check", "--diff"], []):
        proc = _run(tmp_path, args=args)[0]
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert re.search(r"lab-a\s*: ok=\d+\s+changed=0 ", proc.stdout), proc.stdout
    assert _load(cert).serial_number == first_serial
    assert "CLIENTS MUST TAKE" not in proc.stdout

    # 3. the inventory gives the proxies a new name: the CA's certificate is re-issued with the same key
    # and name, the old host certificate verifies under it, the run tells the clients to take it. The
    # host's certificate is signed anew, for a lab's short lifetime.
    old_cert = tmp_path / "old-host.crt"
    shutil.copy(cert, old_cert)
    short = {"proxy_tls_names": ["llm.example.com"], "gpufleet_tls_certificate_days": 5}
    proc = _run(tmp_path, extra=short)[0]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "CLIENTS MUST TAKE THE NEW CA CERTIFICATE" in out and "DNS:llm.example.com" in out, out
    new_ca = _load(ca)
    assert new_ca.public_key().public_numbers() == first_ca.public_key().public_numbers()
    assert new_ca.subject == first_ca.subject and new_ca.serial_number != first_ca.serial_number
    assert _verify(ca, old_cert).returncode == 0
    assert _verify(ca, cert).returncode == 0 and "DNS:llm.example.com" in _text(cert)
    assert _verify(ca, outside).returncode == 0  # now inside its constraints
    assert (tmp_path / ".gpufleet-ca.crt").read_text() == ca.read_text()
    _assert_lifetime(cert, 5)

    # 4. that certificate ends within the renewal window (30 days): the next run signs it anew
    serial = _load(cert).serial_number
    proc = _run(tmp_path, extra=short)[0]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert _load(cert).serial_number != serial
    assert "CLIENTS MUST TAKE" not in out
    _assert_lifetime(cert, 5)

    # 5. a CA with another key (its host's folder lost, or another CA host): the run stops, the host's
    # certificate stays as it was
    shutil.rmtree(ca_dir)
    before = cert.read_bytes()
    proc = _run(tmp_path, extra=short)[0]
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "lab-a's certificate (%s) came from another fleet CA" % host_dir in out, out
    assert cert.read_bytes() == before


def _assert_lifetime(cert, days):
    left = _load(cert).not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=days - 1) < left <= datetime.timedelta(days=days), left


def test_a_client_certificate_for_another_service_proves_the_client_only(tmp_path):
    """The profile the edge uses towards the usage store: clientAuth only, its own file names, a key
    the service's group reads, no fleet name."""
    task = {
        "name": "A client certificate for the store",
        "ansible.builtin.include_role": {"name": "gpufleet.serving.common", "tasks_from": "host_certificate"},
        "vars": {
            "common_tls_dir": str(tmp_path / "host"),
            "common_tls_names": [],
            "common_tls_purpose": "client",
            "common_tls_basename": "store-client",
            "common_tls_key_group": "daemon",
        },
    }
    proc, host_dir, ca_dir = _run(tmp_path, task=task)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cert, ca = host_dir / "store-client.crt", ca_dir / "fleet-ca.crt"
    text = _text(cert)
    assert "TLS Web Client Authentication" in text and "Server Authentication" not in text, text
    assert "DNS:lab-a, IP Address:127.0.0.1" in text and "gpufleet-proxy" not in text, text
    key = host_dir / "store-client.key"
    assert oct(key.stat().st_mode & 0o777) == "0o640" and key.group() == "daemon"
    assert _openssl("verify", "-purpose", "sslclient", "-CAfile", str(ca), str(cert)).returncode == 0
    server = _openssl("verify", "-purpose", "sslserver", "-CAfile", str(ca), str(cert))
    assert server.returncode != 0, server.stdout
