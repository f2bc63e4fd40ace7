# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small network filters: certificate subject alternative names, hosts' addresses.

Documented in tls_subject_alt_names.yml and inventory_addresses.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_group import address_of
from ansible_collections.gpufleet.serving.plugins.module_utils._tls import subject_alt_names


def tls_subject_alt_names(names):
    """['gpu01', '10.0.0.5'] -> ['DNS:gpu01', 'IP:10.0.0.5'] (module_utils/_tls.py)"""
    return subject_alt_names(names)


def inventory_addresses(names, hostvars):
    """Each host's address as its peers reach it (module_utils/_engine_group.address_of)."""
    return [address_of(hostvars, name) for name in names or []]


class FilterModule:
    def filters(self):
        return {"tls_subject_alt_names": tls_subject_alt_names, "inventory_addresses": inventory_addresses}
