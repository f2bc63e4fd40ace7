# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet CA's rules as filters (module_utils/_tls.py): a host's planned names, the CA's name
constraints, whether the CA signs a request, and the fleet's TLS settings' errors.

Documented in tls_host_plan.yml, tls_name_constraints.yml, tls_csr_errors.yml and
tls_settings_errors.yml beside this file."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils import _tls


def tls_host_plan(hostvars, host, names=None, networks=None, fleet_name="", purpose="server"):
    """The names `host`'s certificate is for, from the inventory (hostvars) on the controller."""
    return _tls.host_plan(hostvars, host, names or [], networks or [], fleet_name, purpose)


def tls_name_constraints(hostvars, hosts, domains=None, networks=None, fleet_name="", name_vars=None):
    """The fleet CA's permitted and excluded subtrees for the inventory's hosts."""
    return _tls.name_constraints(hostvars, hosts, domains or [], networks or [], fleet_name, name_vars or [])


def tls_csr_errors(info, host, plan, permitted=None):
    """Why the fleet CA refuses a host's certificate request ([] when it signs it)."""
    return _tls.csr_errors(info, host, plan, permitted)


def tls_settings_errors(settings):
    """The errors of the fleet's TLS variables."""
    return _tls.settings_errors(settings)


class FilterModule:
    def filters(self):
        return {
            "tls_host_plan": tls_host_plan,
            "tls_name_constraints": tls_name_constraints,
            "tls_csr_errors": tls_csr_errors,
            "tls_settings_errors": tls_settings_errors,
        }
