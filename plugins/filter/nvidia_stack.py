# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the NVIDIA stack planner (logic in module_utils/_nvidia_stack.py).

Each filter is documented in its sidecar file (nvidia_driver_plan.yml, ...)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.module_utils import _nvidia_stack as stack


def nvidia_driver_plan(settings, facts):
    try:
        return stack.driver_plan(dict(settings), dict(facts))
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError("nvidia_driver_plan: %s" % exc) from None


def nvidia_reboot_decision(policy, in_container=False, installed=None, loaded=None, nouveau_loaded=False,
                           gpus_present=True):  # fmt: skip
    reboot, required, reason = stack.reboot_decision(
        policy, in_container, installed, loaded, nouveau_loaded=nouveau_loaded, gpus_present=gpus_present
    )
    return {"reboot": reboot, "required": required, "reason": reason}


def nvidia_security(version, action="fail"):
    errors, warnings = stack.security_errors(version, action)
    return {"errors": errors, "warnings": warnings}


def debian_source_blocks(text):
    return stack.debian_source_blocks(text)


def cuda_toolkit_check(toolkit, driver_version):
    return stack.toolkit_errors(toolkit, driver_version)


def engine_image_cuda_errors(inspect_result, gpu):
    """Errors for one `docker image inspect --format '{{json .Config.Env}}'` loop result
    against the host's gpufleet_gpu facts."""
    import json

    try:
        env = json.loads(inspect_result.get("stdout") or "[]") or []
    except ValueError:
        return []
    require = next((e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_REQUIRE_CUDA=")), None)
    if any(e.startswith("NVIDIA_DISABLE_REQUIRE=") and e.split("=", 1)[1] not in ("", "0", "false") for e in env):
        return []
    gpu = gpu or {}
    return stack.cuda_requirement_errors(
        inspect_result.get("item"), require, gpu.get("driver_version"), gpu.get("cuda_version"), where="engine image"
    )


def dpkg_installed(text):
    """{package: version} of the installed packages from
    `dpkg-query -W -f '${Package}\t${Version}\t${db:Status-Abbrev}\n'` (read-only, no python3-apt)."""
    found = {}
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].strip()[1:2] == "i":
            found[parts[0].split(":", 1)[0]] = parts[1]
    return found


def apt_candidate(policy_text):
    """The Candidate: version from `apt-cache policy PACKAGE` output (None when none)."""
    for line in (policy_text or "").splitlines():
        line = line.strip()
        if line.startswith("Candidate:"):
            value = line.split(":", 1)[1].strip()
            return None if value in ("", "(none)") else value
    return None


class FilterModule:
    def filters(self):
        return {
            "nvidia_driver_plan": nvidia_driver_plan,
            "nvidia_reboot_decision": nvidia_reboot_decision,
            "nvidia_security": nvidia_security,
            "debian_source_blocks": debian_source_blocks,
            "cuda_toolkit_check": cuda_toolkit_check,
            "apt_candidate": apt_candidate,
            "dpkg_installed": dpkg_installed,
            "engine_image_cuda_errors": engine_image_cuda_errors,
            "nvidia_upstream_version": stack.upstream,
        }
