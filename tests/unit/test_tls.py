"""The fleet CA's rules (plugins/module_utils/_tls.py): the names a host's certificate gets come from
the inventory, a forged fact never becomes one, the CA's name constraints follow the inventory, and
the CA signs only a request that matches the plan and its purpose. The request dicts are shaped as
community.crypto.openssl_csr_info returns them (its long names for usages, checked against the
real module by tests/unit/test_fleet_ca_plays.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from ansible_collections.gpufleet.serving.plugins.filter import tls as tls_filters
from ansible_collections.gpufleet.serving.plugins.module_utils import _tls

FLEET = "gpufleet-proxy"


def hostvars(**facts):
    """gpu01 at 10.0.0.5 (ansible_host) with proxy_tls_names, its facts as given; edge01 by name."""
    return {
        "gpu01": {
            "ansible_host": "10.0.0.5",
            "proxy_tls_names": ["llm.example.com"],
            "ansible_facts": {key: {"address": value} for key, value in facts.items()},
        },
        "edge01": {"ansible_host": "edge01.fleet.example.com", "edge_tls_names": ["203.0.113.7"]},
    }


# --- which names a host gets -----------------------------------------------------------------


def test_names_come_from_the_inventory_in_order():
    plan = _tls.host_plan(hostvars(), "gpu01", ["llm.example.com"], [], FLEET)
    assert plan["names"] == ["gpu01", "10.0.0.5", "llm.example.com", FLEET]
    assert plan["subject_alt_names"] == ["DNS:gpu01", "IP:10.0.0.5", "DNS:llm.example.com", "DNS:" + FLEET]
    assert plan["common_name"] == "gpu01" and plan["extended_key_usage"] == "serverAuth"
    assert plan["refused"] == [] and plan["left_out"] == []


def test_without_declared_networks_no_reported_address_is_a_name():
    plan = _tls.host_plan(hostvars(default_ipv4="10.0.0.9", default_ipv6="fd00::9"), "gpu01", [], [], FLEET)
    assert plan["names"] == ["gpu01", "10.0.0.5", FLEET]
    assert plan["left_out"] == [
        {"source": "ansible_facts.default_ipv4.address", "value": "10.0.0.9"},
        {"source": "ansible_facts.default_ipv6.address", "value": "fd00::9"},
    ]


def test_a_reported_address_inside_the_declared_networks_is_a_name():
    plan = _tls.host_plan(
        hostvars(default_ipv4="10.0.0.9", default_ipv6="FD00:0::9"), "gpu01", [], ["10.0.0.0/24", "fd00::/64"], FLEET
    )
    assert plan["names"] == ["gpu01", "10.0.0.5", "10.0.0.9", "fd00::9", FLEET]


@pytest.mark.parametrize(
    "forged",
    ["llm.example.com", "*.example.com", "10.0.0.0/8", "10.0.0.9 llm.example.com", "gpu01"],
)
def test_a_reported_value_that_is_not_an_address_is_never_a_name(forged):
    plan = _tls.host_plan(hostvars(default_ipv4=forged), "gpu01", [], ["0.0.0.0/0"], FLEET)
    assert plan["refused"] == [{"source": "ansible_facts.default_ipv4.address", "value": forged}]
    assert forged not in plan["names"][1:] or forged == "gpu01"
    assert "DNS:" + forged not in plan["subject_alt_names"][1:]


def test_an_address_outside_the_declared_networks_is_left_out():
    plan = _tls.host_plan(hostvars(default_ipv4="192.0.2.10"), "gpu01", [], ["10.0.0.0/24"], FLEET)
    assert "192.0.2.10" not in plan["names"]
    assert plan["left_out"] == [{"source": "ansible_facts.default_ipv4.address", "value": "192.0.2.10"}]
    assert plan["refused"] == []


def test_names_are_kept_once_whatever_their_spelling():
    hv = {"h": {"ansible_host": "fd00:0:0::1", "ansible_facts": {"default_ipv6": {"address": "fd00::1"}}}}
    plan = _tls.host_plan(hv, "h", ["H", "fd00::1"], ["fd00::/64"], "")
    assert plan["names"] == ["h", "fd00::1"]


def test_a_client_certificate_and_one_named_by_addresses_only():
    plan = _tls.host_plan({"10.0.0.5": {}}, "10.0.0.5", [], [], "", "client")
    assert plan["extended_key_usage"] == "clientAuth"
    # an address as the common name would be checked as a DNS name against the constraints: none
    assert plan["common_name"] == "" and plan["subject_alt_names"] == ["IP:10.0.0.5"]


def test_the_filter_takes_hostvars_and_leaves_out_unset_lists():
    assert tls_filters.tls_host_plan(hostvars(), "gpu01")["names"] == ["gpu01", "10.0.0.5"]


# --- the CA's name constraints ------------------------------------------------------------------

NAME_VARS = ["proxy_tls_names", "edge_tls_names"]


def test_without_declared_domains_and_networks_the_ca_permits_exactly_the_inventorys_names():
    got = _tls.name_constraints(hostvars(), ["gpu01", "edge01"], [], [], FLEET, NAME_VARS)
    assert got["permitted"] == [
        "DNS:edge01",
        "DNS:edge01.fleet.example.com",
        "DNS:gpu01",
        "DNS:gpufleet-proxy",
        "DNS:llm.example.com",
        "IP:10.0.0.5/32",
        "IP:203.0.113.7/32",
    ]
    assert got["excluded"] == []


def test_declared_domains_and_networks_cover_the_names_below_them():
    got = _tls.name_constraints(hostvars(), ["gpu01", "edge01"], [".Example.com"], ["10.0.0.0/24"], FLEET, NAME_VARS)
    assert got["permitted"] == [
        "DNS:edge01",
        "DNS:example.com",
        "DNS:gpu01",
        "DNS:gpufleet-proxy",
        "IP:10.0.0.0/24",
        "IP:203.0.113.7/32",
    ]


def test_a_wildcard_is_permitted_as_its_domain_and_covers_the_names_below():
    hv = {"gpu01": {"proxy_tls_names": ["*.fleet.example.com", "a.fleet.example.com", "fd00::1"]}}
    got = _tls.name_constraints(hv, ["gpu01"], [], [], FLEET, NAME_VARS)
    assert got["permitted"] == ["DNS:fleet.example.com", "DNS:gpu01", "DNS:gpufleet-proxy", "IP:fd00::1/128"]


def test_without_any_address_every_address_is_excluded():
    # RFC 5280: a name type without a permitted subtree is not constrained at all
    got = _tls.name_constraints({"gpu01": {}}, ["gpu01"], [], [], FLEET, NAME_VARS)
    assert got["permitted"] == ["DNS:gpu01", "DNS:gpufleet-proxy"]
    assert got["excluded"] == ["IP:0.0.0.0/0", "IP:::/0"]


def test_the_hosts_facts_play_no_part_in_the_constraints():
    plain = _tls.name_constraints(hostvars(), ["gpu01", "edge01"], [], [], FLEET, NAME_VARS)
    forged = _tls.name_constraints(
        hostvars(default_ipv4="*.example.com", default_ipv6="fd00::66"), ["gpu01", "edge01"], [], [], FLEET, NAME_VARS
    )
    assert forged == plain


def test_a_new_host_under_a_declared_domain_keeps_the_constraints_and_one_outside_widens_them():
    dom = ["fleet.example.com"]
    hv = {"gpu01.fleet.example.com": {}, "gpu02.fleet.example.com": {}, "gpu03.other.org": {}}
    before = _tls.name_constraints(hv, ["gpu01.fleet.example.com"], dom, [], FLEET, NAME_VARS)["permitted"]
    assert before == ["DNS:fleet.example.com", "DNS:gpufleet-proxy"]
    grown = ["gpu01.fleet.example.com", "gpu02.fleet.example.com"]
    assert _tls.name_constraints(hv, grown, dom, [], FLEET, NAME_VARS)["permitted"] == before
    other = _tls.name_constraints(hv, [*grown, "gpu03.other.org"], dom, [], FLEET, NAME_VARS)["permitted"]
    assert other == ["DNS:fleet.example.com", "DNS:gpu03.other.org", "DNS:gpufleet-proxy"]


# --- the CA's check of a request ------------------------------------------------------------


def info(sans, ekus=("TLS Web Server Authentication",), kus=("Digital Signature",), cn="gpu01", extra_oids=()):
    """openssl_csr_info's answer for a request like the role's."""
    oids = {"2.5.29.17": {}, "2.5.29.37": {}, "2.5.29.15": {}, "2.5.29.19": {}}
    oids.update({oid: {"critical": False, "value": ""} for oid in extra_oids})
    return {
        "subject_alt_name": list(sans),
        "extended_key_usage": list(ekus),
        "key_usage": list(kus),
        "basic_constraints": ["CA:FALSE"],
        "subject_ordered": [["commonName", cn]] if cn else [],
        "extensions_by_oid": oids,
        "signature_valid": True,
    }


PLAN = _tls.host_plan(hostvars(), "gpu01", ["llm.example.com"], [], FLEET)
PERMITTED = _tls.name_constraints(hostvars(), ["gpu01", "edge01"], [], [], FLEET, NAME_VARS)["permitted"]
GOOD = ["DNS:gpu01", "IP:10.0.0.5", "DNS:llm.example.com", "DNS:gpufleet-proxy"]


def test_a_request_that_matches_the_plan_is_signed():
    assert _tls.csr_errors(info(GOOD), "gpu01", PLAN, PERMITTED) == []
    # order and an address's spelling do not matter
    assert _tls.csr_errors(info(list(reversed(GOOD))), "gpu01", PLAN, PERMITTED) == []


def test_a_request_for_a_name_not_planned_is_refused_naming_it():
    (error,) = _tls.csr_errors(info([*GOOD, "DNS:*.example.com"]), "gpu01", PLAN, PERMITTED)
    assert error.startswith("gpu01's certificate request asks for DNS:*.example.com, which the inventory does not")
    assert "Add the name there if clients really use it" in error


def test_a_request_that_leaves_a_planned_name_out_is_refused():
    (error,) = _tls.csr_errors(info(GOOD[:-1]), "gpu01", PLAN, PERMITTED)
    assert "leaves out DNS:gpufleet-proxy" in error


def test_a_plan_with_a_forged_fact_is_refused_at_signing():
    plan = _tls.host_plan(hostvars(default_ipv4="llm.evil.example"), "gpu01", ["llm.example.com"], [], FLEET)
    (error,) = _tls.csr_errors(info(GOOD), "gpu01", plan, PERMITTED)
    assert "gpu01 reports ansible_facts.default_ipv4.address='llm.evil.example', which is not an IP address" in error
    assert "remove its cached facts" in error


@pytest.mark.parametrize(
    ("ekus", "refused"),
    [
        (["TLS Web Server Authentication", "TLS Web Client Authentication"], "clientAuth"),
        (["Code Signing", "TLS Web Server Authentication"], "codeSigning"),
        (["TLS Web Server Authentication", "1.2.3.4"], "1.2.3.4"),
        (["Any Extended Key Usage"], "anyExtendedKeyUsage"),
    ],
)
def test_more_usages_than_the_purpose_are_refused_by_name(ekus, refused):
    (error,) = _tls.csr_errors(info(GOOD, ekus=ekus), "gpu01", PLAN, PERMITTED)
    assert "a server certificate from the fleet CA carries exactly serverAuth (refused: %s" % refused in error


def test_no_usage_or_the_other_purposes_usage_is_refused():
    (error,) = _tls.csr_errors(info(GOOD, ekus=()), "gpu01", PLAN, PERMITTED)
    assert "asks for the extended key usage(s) (none)" in error
    client = dict(PLAN, extended_key_usage="clientAuth")
    assert _tls.csr_errors(info(GOOD, ekus=["TLS Web Client Authentication"]), "gpu01", client, PERMITTED) == []
    (error,) = _tls.csr_errors(info(GOOD), "gpu01", client, PERMITTED)
    assert "a client certificate from the fleet CA carries exactly clientAuth (refused: serverAuth)" in error


def test_key_usages_beyond_the_usual_are_refused():
    usual = ["Digital Signature", "Key Encipherment", "Key Agreement"]
    assert _tls.csr_errors(info(GOOD, kus=usual), "gpu01", PLAN, PERMITTED) == []
    (error,) = _tls.csr_errors(info(GOOD, kus=["Digital Signature", "Certificate Sign"]), "gpu01", PLAN, PERMITTED)
    assert "asks for the key usage(s) keyCertSign" in error


def test_ca_rights_are_refused():
    request = dict(info(GOOD), basic_constraints=["CA:TRUE", "pathlen:0"])
    (error,) = _tls.csr_errors(request, "gpu01", PLAN, PERMITTED)
    assert "asks for CA rights (basicConstraints CA:TRUE, pathlen:0)" in error


def test_other_extensions_are_refused_by_name():
    request = info(GOOD, extra_oids=["1.3.6.1.5.5.7.1.24", "2.5.29.14", "1.2.3.4.5"])
    (error,) = _tls.csr_errors(request, "gpu01", PLAN, PERMITTED)
    assert "carries the extension(s) 1.2.3.4.5, subjectKeyIdentifier, tlsFeature (OCSP must-staple)" in error


def test_another_subject_is_refused():
    (error,) = _tls.csr_errors(info(GOOD, cn="llm.example.com"), "gpu01", PLAN, PERMITTED)
    assert "has the subject commonName=llm.example.com, not CN=gpu01" in error


def test_a_planned_name_outside_the_constraints_is_refused_with_the_fix():
    plan = _tls.host_plan(hostvars(), "gpu01", ["store.internal"], [], FLEET)
    sans = ["DNS:gpu01", "IP:10.0.0.5", "DNS:store.internal", "DNS:gpufleet-proxy"]
    (error,) = _tls.csr_errors(info(sans), "gpu01", plan, PERMITTED)
    assert "gpu01's names DNS:store.internal are outside the fleet CA's name constraints" in error
    assert "gpufleet_tls_domains" in error and "gpufleet_tls_networks" in error


def test_a_request_not_signed_by_its_key_is_refused():
    (error,) = _tls.csr_errors(dict(info(GOOD), signature_valid=False), "gpu01", PLAN, PERMITTED)
    assert "not signed by its own key" in error


# --- the fleet's TLS variables --------------------------------------------------------------


def test_good_settings_have_no_errors():
    good = {
        "gpufleet_tls_networks": ["10.0.0.0/24", "fd00::/64"],
        "gpufleet_tls_domains": ["fleet.example.com", ".example.org"],
        "gpufleet_tls_certificate_days": "825",
        "gpufleet_tls_renew_days": 0,
    }
    assert _tls.settings_errors(good) == []
    assert _tls.settings_errors({}) == []


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"gpufleet_tls_networks": ["10.0.0.5/24"]}, "gpufleet_tls_networks lists '10.0.0.5/24': not a network in "
                                                      "CIDR form with its host bits zero (did you mean 10.0.0.0/24?)"),
        ({"gpufleet_tls_networks": ["lab"]}, "gpufleet_tls_networks lists 'lab'"),
        ({"gpufleet_tls_networks": "10.0.0.0/8"}, "gpufleet_tls_networks='10.0.0.0/8' must be a list of networks"),
        ({"gpufleet_tls_domains": ["*.example.com"]}, "gpufleet_tls_domains lists '*.example.com': not a DNS suffix"),
        ({"gpufleet_tls_domains": ["10.0.0.1"]}, "addresses go in gpufleet_tls_networks"),
        ({"gpufleet_tls_certificate_days": 0}, "gpufleet_tls_certificate_days=0 must be a whole number"),
        ({"gpufleet_tls_certificate_days": True}, "gpufleet_tls_certificate_days=True must be"),
        ({"gpufleet_tls_renew_days": "-1"}, "gpufleet_tls_renew_days='-1' must be a whole number of days"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_variable_the_value_and_the_fix(settings, words):
    errors = _tls.settings_errors(settings)
    assert len(errors) == 1 and words in errors[0], errors


def test_subject_alt_names_write_addresses_compressed():
    assert _tls.subject_alt_names(["gpu01", "10.0.0.5", "FD00:0::5"]) == ["DNS:gpu01", "IP:10.0.0.5", "IP:fd00::5"]


# --- the expiry reader (roles/common/files/gpufleet-tls-expiry) ---------------------------------


def test_the_expiry_reader_writes_each_certificates_end(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    end = datetime.datetime(2031, 5, 4, 3, 2, 1, tzinfo=datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu01")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(end - datetime.timedelta(days=825))
        .not_valid_after(end)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "host.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    listing = tmp_path / "list"
    listing.write_text("# PURPOSE PATH\nserver %s/host.crt\nclient %s/missing.crt\n\n" % (tmp_path, tmp_path))
    out = tmp_path / "gpufleet-tls.prom"
    run = subprocess.run(
        [sys.executable, str(ROOT / "roles" / "common" / "files" / "gpufleet-tls-expiry"), str(listing), str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 1 and "missing.crt" in run.stderr, run.stderr
    text = out.read_text()
    assert (
        'gpufleet_tls_certificate_expiry_timestamp_seconds{path="%s/host.crt",purpose="server"} %d\n'
        % (tmp_path, int(end.timestamp()))
    ) in text
    assert 'gpufleet_tls_certificate_readable{path="%s/missing.crt",purpose="client"} 0\n' % tmp_path in text
    assert "# TYPE gpufleet_tls_certificate_expiry_timestamp_seconds gauge" in text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gpufleet-tls-")] == []
