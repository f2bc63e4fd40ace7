"""Certificates for the labtests' usage store over TLS, as the fleet CA issues them (the common
role's host_certificate.yml: EC P-256, the CA may sign end certificates only, each host
certificate carries exactly its names and one extended key usage): the store's server
certificate, each edge's client certificate, and the ones the store must refuse (a fleet server
certificate used as a client, a client certificate from another CA)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return key, cert


def _leaf(ca, cn, names, usage):
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    sans = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    cert = (
        x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    return key, cert


def _write(folder: Path, stem: str, key, cert):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / (stem + ".crt")).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / (stem + ".key")).write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def store_certificates(tls: Path, edges: dict[str, Path], store_name: str) -> None:
    """tls/: the store's store.crt/.key and fleet-ca.crt (redis.conf's files), and for the checks
    proxy.crt/.key (a fleet server certificate), rogue.crt/.key (a client certificate from another
    CA); each edge's conf folder: store-client.crt/.key and store-client-ca.crt (keys.json's)."""
    ca = _ca("gpufleet fleet CA (labtest)")
    pem = ca[1].public_bytes(serialization.Encoding.PEM)
    tls.mkdir(parents=True, exist_ok=True)
    (tls / "fleet-ca.crt").write_bytes(pem)
    _write(tls, "store", *_leaf(ca, store_name, [store_name, "127.0.0.1"], ExtendedKeyUsageOID.SERVER_AUTH))
    _write(tls, "proxy", *_leaf(ca, "gpu-host", ["gpu-host", "gpufleet-proxy"], ExtendedKeyUsageOID.SERVER_AUTH))
    _write(tls, "rogue", *_leaf(_ca("not the fleet CA"), "edge", ["edge"], ExtendedKeyUsageOID.CLIENT_AUTH))
    for name, conf in edges.items():
        _write(conf, "store-client", *_leaf(ca, name, [name], ExtendedKeyUsageOID.CLIENT_AUTH))
        (conf / "store-client-ca.crt").write_bytes(pem)
