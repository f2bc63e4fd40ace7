# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small network filters: certificate subject alternative names, hosts' addresses.

Documented in tls_subject_alt_names.yml and inventory_addresses.yml beside this file."""

from __future__ import annotations

import ipaddress


def tls_subject_alt_names(names):
    """['gpu01', '10.0.0.5'] -> ['DNS:gpu01', 'IP:10.0.0.5']"""
    out = []
    for name in names or []:
        try:
            ipaddress.ip_address(str(name))
            out.append("IP:%s" % name)
        except ValueError:
            out.append("DNS:%s" % name)
    return out


def inventory_addresses(names, hostvars):
    """Each host's address as its peers reach it: ansible_host when it is an address, else the
    default IPv4 address its gathered facts name, else ansible_host (a name) or the inventory
    name."""
    out = []
    for name in names or []:
        hv = hostvars.get(name, {})
        facts = hv.get("ansible_facts") or {}
        fact_address = (facts.get("default_ipv4") or {}).get("address")
        given = hv.get("ansible_host")
        try:
            ipaddress.ip_address(str(given))
            given_is_address = True
        except ValueError:
            given_is_address = False
        out.append(str(given if given_is_address else fact_address or given or name))
    return out


class FilterModule:
    def filters(self):
        return {"tls_subject_alt_names": tls_subject_alt_names, "inventory_addresses": inventory_addresses}
