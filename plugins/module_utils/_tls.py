# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet CA's rules (private to gpufleet.serving): which names a host's certificate gets,
which names the CA may sign at all (its name constraints), and whether a request is one the CA
signs. Pure functions over the inventory's values; the common role's host_certificate entry point
applies them (plugins/filter/tls.py).

The names come from the inventory, read on the controller: the host's inventory name, its
``ansible_host``, and the names its role adds (proxy_tls_names, edge_tls_names). An address the
host itself reports (its facts' default IPv4 and IPv6 addresses) becomes a name only when it is
an IP address inside the networks the operator declares (gpufleet_tls_networks); a reported value
that is not an IP address at all (a host name, a wildcard) is never a name, and the CA signs
nothing for that host until it is explained.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re

# A certificate's purpose and the one extended key usage it carries.
PURPOSES = {"server": "serverAuth", "client": "clientAuth"}
# The key usages a host certificate may carry (ECDSA signs the handshake: digitalSignature; an RSA or
# static-ECDH request may ask for the other two). The CA's request asks for digitalSignature only.
KEY_USAGES = ("digitalSignature", "keyEncipherment", "keyAgreement")
# The host facts that may name an address (only inside gpufleet_tls_networks).
FACT_ADDRESSES = ("default_ipv4", "default_ipv6")
# The extensions a request may carry, by OID; every other one is refused by name.
ALLOWED_EXTENSIONS = {
    "2.5.29.17": "subjectAltName",
    "2.5.29.37": "extendedKeyUsage",
    "2.5.29.15": "keyUsage",
    "2.5.29.19": "basicConstraints",
}
EXTENSION_NAMES = {
    "2.5.29.14": "subjectKeyIdentifier",
    "2.5.29.35": "authorityKeyIdentifier",
    "2.5.29.30": "nameConstraints",
    "2.5.29.31": "cRLDistributionPoints",
    "2.5.29.32": "certificatePolicies",
    "2.5.29.18": "issuerAltName",
    "2.5.29.9": "subjectDirectoryAttributes",
    "1.3.6.1.5.5.7.1.1": "authorityInfoAccess",
    "1.3.6.1.5.5.7.1.24": "tlsFeature (OCSP must-staple)",
    "2.16.840.1.113730.1.1": "nsCertType",
}
# community.crypto's openssl_csr_info names usages by cryptography's long names (an unknown one by
# its dotted OID); the short names and OIDs are accepted too.
_EKU = {
    "TLS Web Server Authentication": "serverAuth",
    "1.3.6.1.5.5.7.3.1": "serverAuth",
    "TLS Web Client Authentication": "clientAuth",
    "1.3.6.1.5.5.7.3.2": "clientAuth",
    "Code Signing": "codeSigning",
    "1.3.6.1.5.5.7.3.3": "codeSigning",
    "E-mail Protection": "emailProtection",
    "1.3.6.1.5.5.7.3.4": "emailProtection",
    "Time Stamping": "timeStamping",
    "1.3.6.1.5.5.7.3.8": "timeStamping",
    "OCSP Signing": "OCSPSigning",
    "1.3.6.1.5.5.7.3.9": "OCSPSigning",
    "Any Extended Key Usage": "anyExtendedKeyUsage",
    "2.5.29.37.0": "anyExtendedKeyUsage",
}
_KU = {
    "Digital Signature": "digitalSignature",
    "Non Repudiation": "nonRepudiation",
    "Content Commitment": "nonRepudiation",
    "Key Encipherment": "keyEncipherment",
    "Data Encipherment": "dataEncipherment",
    "Key Agreement": "keyAgreement",
    "Certificate Sign": "keyCertSign",
    "CRL Sign": "cRLSign",
    "Encipher Only": "encipherOnly",
    "Decipher Only": "decipherOnly",
}
# A DNS name (a leading *. allowed, as proxy_tls_names takes it) and a DNS suffix (no wildcard).
DNS_NAME = re.compile(r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?)*$")
DNS_SUFFIX = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")
# What the role's variables take, named in the messages.
NETWORKS_VAR = "gpufleet_tls_networks"
DOMAINS_VAR = "gpufleet_tls_domains"
DAYS_VAR = "gpufleet_tls_certificate_days"
RENEW_VAR = "gpufleet_tls_renew_days"


def _ip(value):
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def _get(mapping, key, default=None):
    return mapping.get(key, default) if hasattr(mapping, "get") else default


def _networks(networks):
    """The valid entries of gpufleet_tls_networks (the invalid ones are tls_settings_errors')."""
    out = []
    for net in networks if isinstance(networks, (list, tuple)) else []:
        try:
            out.append(ipaddress.ip_network(str(net), strict=True))
        except ValueError:
            continue
    return out


def _domains(domains):
    out = []
    for dom in domains if isinstance(domains, (list, tuple)) else []:
        dom = str(dom).strip().lower().lstrip(".")
        if DNS_SUFFIX.fullmatch(dom):
            out.append(dom)
    return out


def subject_alt_names(names):
    """['gpu01', '10.0.0.5'] -> ['DNS:gpu01', 'IP:10.0.0.5'] (an address in its compressed form)."""
    out = []
    for name in names or []:
        address = _ip(name)
        out.append("IP:%s" % address.compressed if address is not None else "DNS:%s" % name)
    return out


def _whole(value, minimum):
    """A whole number of at least `minimum`, as an int or its digits (an extra var is a string)."""
    return not isinstance(value, bool) and str(value).strip().isdigit() and int(str(value).strip()) >= minimum


def settings_errors(settings):
    """The errors of the fleet's TLS variables (a dict of gpufleet_tls_networks, gpufleet_tls_domains,
    gpufleet_tls_certificate_days and gpufleet_tls_renew_days as the inventory sets them), each naming
    the variable, the value and the fix."""
    settings = settings if hasattr(settings, "get") else {}
    errors = []
    networks = settings.get(NETWORKS_VAR, [])
    if networks is None:
        networks = []
    if not isinstance(networks, (list, tuple)):
        errors.append(
            "%s=%r must be a list of networks (CIDR), e.g. [10.0.0.0/24, fd00:1::/64], or [] (no address a host "
            "reports becomes a certificate name)." % (NETWORKS_VAR, networks)
        )
    else:
        for net in networks:
            try:
                ipaddress.ip_network(str(net), strict=True)
            except ValueError:
                fix = ""
                with contextlib.suppress(ValueError):
                    fix = " (did you mean %s?)" % ipaddress.ip_network(str(net), strict=False)
                errors.append(
                    "%s lists %r: not a network in CIDR form with its host bits zero%s; give the networks clients "
                    "reach the hosts' own addresses on, e.g. 10.0.0.0/24." % (NETWORKS_VAR, net, fix)
                )
    domains = settings.get(DOMAINS_VAR, [])
    if domains is None:
        domains = []
    if not isinstance(domains, (list, tuple)):
        errors.append(
            "%s=%r must be a list of DNS suffixes, e.g. [fleet.example.com], or [] (the CA then permits exactly the "
            "inventory's names)." % (DOMAINS_VAR, domains)
        )
    else:
        for dom in domains:
            text = str(dom).strip().lstrip(".")
            if _ip(text) is not None or not DNS_SUFFIX.fullmatch(text) or len(text) > 253:
                errors.append(
                    "%s lists %r: not a DNS suffix; give a domain the fleet's names end in, e.g. fleet.example.com "
                    "(no wildcard, no address: addresses go in %s)." % (DOMAINS_VAR, dom, NETWORKS_VAR)
                )
    days, renew = settings.get(DAYS_VAR, 825), settings.get(RENEW_VAR, 30)
    if not _whole(days, 1):
        errors.append(
            "%s=%r must be a whole number of days of at least 1 (default 825, the most clients accept); a lab may "
            "give a few days to see a certificate renewed." % (DAYS_VAR, days)
        )
    if not _whole(renew, 0):
        errors.append(
            "%s=%r must be a whole number of days of at least 0: site.yml re-issues a certificate that expires within "
            "it (default 30)." % (RENEW_VAR, renew)
        )
    return errors


def host_plan(hostvars, host, names=(), networks=(), fleet_name="", purpose="server"):
    """The names one host's certificate is for, planned on the controller from the inventory:
    {names, subject_alt_names, common_name, extended_key_usage, refused, left_out}.

    names: the inventory name, hostvars[host].ansible_host, the role's `names`, the host's
    reported default addresses that are IP addresses inside `networks`, and `fleet_name` ("" for
    none), in that order, once each. refused: [{source, value}] for a reported address that is not
    an IP address (a forged or broken fact: the CA signs nothing for the host while there is one);
    left_out: the same for reported addresses outside `networks` (not names, not errors)."""
    hv = _get(hostvars, host, {}) or {}
    ordered = [str(host)]
    given = _get(hv, "ansible_host")
    if isinstance(given, str) and given.strip():
        ordered.append(given.strip())
    ordered += [str(n) for n in (names or []) if isinstance(n, str) and n.strip()]
    nets = _networks(networks)
    facts = _get(hv, "ansible_facts", {}) or {}
    refused, left_out = [], []
    for key in FACT_ADDRESSES:
        value = _get(_get(facts, key, {}) or {}, "address")
        if value in (None, ""):
            continue
        source = "ansible_facts.%s.address" % key
        address = _ip(value)
        if address is None:
            refused.append({"source": source, "value": str(value)})
        elif any(address.version == net.version and address in net for net in nets):
            ordered.append(address.compressed)
        else:
            left_out.append({"source": source, "value": address.compressed})
    if fleet_name:
        ordered.append(str(fleet_name))
    unique, seen = [], set()
    for name in ordered:
        address = _ip(name)
        key = address.compressed if address is not None else name.lower()
        if key not in seen:
            seen.add(key)
            unique.append(address.compressed if address is not None else name)
    dns = [n for n in unique if _ip(n) is None]
    return {
        "names": unique,
        "subject_alt_names": subject_alt_names(unique),
        # an IP address as the common name would be checked as a DNS name against the CA's constraints
        # (OpenSSL does that when a certificate has no DNS name): no common name then
        "common_name": dns[0] if dns else "",
        "extended_key_usage": PURPOSES.get(purpose, purpose),
        "refused": refused,
        "left_out": left_out,
    }


def _dns_covered(name, subtree):
    """RFC 5280's DNS subtree: the name itself, or any name below it."""
    return name == subtree or name.endswith("." + subtree)


def name_constraints(hostvars, hosts, domains=(), networks=(), fleet_name="", name_vars=()):
    """The fleet CA's name constraints: {permitted, excluded, names}.

    Permitted DNS subtrees: the declared `domains`, the fleet name, and every DNS name the inventory
    plans for `hosts` (inventory names, ansible_host, each variable of `name_vars` such as
    proxy_tls_names) that no domain covers (a wildcard *.x as x). Permitted IP ranges: the declared
    `networks`, and every address the inventory names outside them as a /32 or /128; without any,
    every address is excluded (RFC 5280: a name type with no permitted subtree is unconstrained)."""
    doms = _domains(domains)
    nets = _networks(networks)
    names = []
    for host in hosts or []:
        hv = _get(hostvars, host, {}) or {}
        found = [host, _get(hv, "ansible_host")]
        for var in name_vars or []:
            value = _get(hv, var)
            if isinstance(value, (list, tuple)):
                found += list(value)
        names += [str(n).strip() for n in found if isinstance(n, str) and n.strip()]
    if fleet_name:
        names.append(str(fleet_name))
    dns, ips = set(doms), set(nets)
    for name in names:
        address = _ip(name)
        if address is not None:
            if not any(address.version == net.version and address in net for net in nets):
                ips.add(ipaddress.ip_network(address))
        elif DNS_NAME.fullmatch(name):
            dns.add(name.lower()[2:] if name.startswith("*.") else name.lower())
    # the fewest subtrees that permit the same names
    dns_min = sorted(d for d in dns if not any(o != d and _dns_covered(d, o) for o in dns))
    ips_min = sorted(
        (n for n in ips if not any(o != n and o.version == n.version and n.subnet_of(o) for o in ips)),
        key=lambda n: (n.version, n.network_address, n.prefixlen),
    )
    permitted = ["DNS:%s" % d for d in dns_min] + ["IP:%s" % n.with_prefixlen for n in ips_min]
    excluded = [] if ips_min else ["IP:0.0.0.0/0", "IP:::/0"]
    return {"permitted": permitted, "excluded": excluded, "names": sorted(set(names))}


def _permitted(san, permitted):
    kind, _sep, value = san.partition(":")
    for entry in permitted or []:
        ekind, _sep, evalue = str(entry).partition(":")
        if ekind != kind:
            continue
        if kind == "DNS":
            name = value.lower()
            name = name[2:] if name.startswith("*.") else name
            if _dns_covered(name, evalue.lower().lstrip(".")):
                return True
        elif kind == "IP":
            address = _ip(value)
            try:
                net = ipaddress.ip_network(evalue, strict=False)
            except ValueError:
                continue
            if address is not None and address.version == net.version and address in net:
                return True
    return False


def _ekus(values):
    return [_EKU.get(str(v), str(v)) for v in values or []]


def _kus(values):
    return [_KU.get(str(v), str(v)) for v in values or []]


def csr_errors(info, host, plan, permitted=None):
    """Why the fleet CA refuses `host`'s certificate request, [] when it signs it.

    info: community.crypto.openssl_csr_info's result for the request, read on the CA host; plan:
    host_plan's answer for the host, made on the controller; permitted: name_constraints' permitted
    subtrees (every planned name must be inside them). The request must name exactly the planned
    names, with the planned common name or none, and carry no extension but subjectAltName,
    extendedKeyUsage (exactly the plan's: serverAuth or clientAuth), keyUsage (within
    digitalSignature, keyEncipherment, keyAgreement) and basicConstraints CA:FALSE."""
    info = info if hasattr(info, "get") else {}
    plan = plan if hasattr(plan, "get") else {}
    errors = []
    fix_facts = (
        "A host reports its facts itself: find out why (a tampered host, or an edited fact cache), then remove its "
        "cached facts (with gpufleet's ansible.cfg, .cache/facts/%s) and run again; the fleet CA signs nothing for it "
        "meanwhile." % host
    )
    for item in plan.get("refused") or []:
        errors.append(
            "%s reports %s=%r, which is not an IP address: a name a host reports never goes into a certificate from "
            "the fleet CA. %s" % (host, item.get("source"), item.get("value"), fix_facts)
        )
    planned = list(plan.get("subject_alt_names") or [])
    asked = [str(s) for s in (info.get("subject_alt_name") or [])]
    norm = subject_alt_names  # an address in one spelling

    def canon(sans):
        out = []
        for san in sans:
            kind, _sep, value = san.partition(":")
            out.append(norm([value])[0] if kind == "IP" else "%s:%s" % (kind, value.lower()))
        return out

    extra = sorted(set(canon(asked)) - set(canon(planned)))
    missing = sorted(set(canon(planned)) - set(canon(asked)))
    if extra:
        errors.append(
            "%s's certificate request asks for %s, which the inventory does not plan for it (it plans %s): the fleet "
            "CA signs only names the inventory gives the host (its inventory name, ansible_host, proxy_tls_names or "
            "edge_tls_names, and its own addresses inside %s). Add the name there if clients really use it."
            % (host, ", ".join(extra), ", ".join(planned) or "nothing", NETWORKS_VAR)
        )
    if missing:
        errors.append(
            "%s's certificate request leaves out %s, which the inventory plans for it: the request is not the one "
            "the controller asked for; run again, and look at the host if it persists." % (host, ", ".join(missing))
        )
    if permitted is not None:
        outside = [s for s in planned if not _permitted(s, permitted)]
        if outside:
            errors.append(
                "%s's names %s are outside the fleet CA's name constraints (%s): clients would refuse the "
                "certificate. Add a domain that covers them to %s, or their network to %s, or the name to the host's "
                "proxy_tls_names or edge_tls_names, so the CA permits them."
                % (host, ", ".join(outside), ", ".join(permitted), DOMAINS_VAR, NETWORKS_VAR)
            )
    subject = [(str(k), str(v)) for k, v in (info.get("subject_ordered") or [])]
    cn = plan.get("common_name") or ""
    if subject != ([("commonName", cn)] if cn else []):
        errors.append(
            "%s's certificate request has the subject %s, not %s: the fleet CA signs only the planned subject."
            % (host, "/".join("%s=%s" % kv for kv in subject) or "(empty)", "CN=%s" % cn if cn else "(empty)")
        )
    extensions = info.get("extensions_by_oid") or {}
    others = sorted(EXTENSION_NAMES.get(oid, oid) for oid in extensions if oid not in ALLOWED_EXTENSIONS)
    if others:
        errors.append(
            "%s's certificate request carries the extension(s) %s: the fleet CA signs subjectAltName, "
            "extendedKeyUsage, keyUsage and basicConstraints (CA:FALSE) only." % (host, ", ".join(others))
        )
    want = plan.get("extended_key_usage") or "serverAuth"
    ekus = _ekus(info.get("extended_key_usage"))
    if ekus != [want]:
        extra_ekus = sorted(set(ekus) - {want})
        errors.append(
            "%s's certificate request asks for the extended key usage(s) %s: a %s certificate from the fleet CA "
            "carries exactly %s%s." % (
                host, ", ".join(ekus) or "(none)", {v: k for k, v in PURPOSES.items()}.get(want, want), want,
                " (refused: %s)" % ", ".join(extra_ekus) if extra_ekus else "",
            )
        )  # fmt: skip
    kus = _kus(info.get("key_usage"))
    bad_kus = sorted(set(kus) - set(KEY_USAGES))
    if bad_kus:
        errors.append(
            "%s's certificate request asks for the key usage(s) %s: the fleet CA allows %s only."
            % (host, ", ".join(bad_kus), ", ".join(KEY_USAGES))
        )
    constraints = [str(c) for c in (info.get("basic_constraints") or [])]
    if constraints and constraints != ["CA:FALSE"]:
        errors.append(
            "%s's certificate request asks for CA rights (basicConstraints %s): the fleet CA signs host "
            "certificates only (CA:FALSE)." % (host, ", ".join(constraints))
        )
    if info.get("signature_valid") is False:
        errors.append("%s's certificate request is not signed by its own key." % host)
    return errors
