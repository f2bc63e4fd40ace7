# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA stack planner (private to gpufleet.serving): driver and CUDA toolkit, and
the CUDA an engine image needs. Pure Python: version arithmetic, the data tables (branches, security
minimums, CUDA compatibility, GPU generations), the package sets per source, and the
decisions (kernel module flavour, reboot, image CUDA requirement) with their messages.
"""

from __future__ import annotations

import re

# ---------------------------------------------------------------- versions


def upstream(version):
    """'1:535.247.01-1~deb12u1' -> '535.247.01' (drop the Debian epoch and revision)."""
    if version is None:
        return None
    text = str(version).strip()
    if ":" in text:
        text = text.split(":", 1)[1]
    return text.split("-", 1)[0].split("~", 1)[0]


def vtuple(version):
    """A comparable tuple of the numeric parts of an upstream version ('570.86.10' -> (570, 86, 10))."""
    parts = re.findall(r"\d+", upstream(version) or "")
    return tuple(int(p) for p in parts)


def version_ge(a, b):
    return vtuple(a) >= vtuple(b)


def branch_of(version):
    """The driver branch of a version: '535.247.01' -> '535'."""
    parts = vtuple(version)
    return str(parts[0]) if parts else None


# ---------------------------------------------------------------- data

# Driver branches gpufleet knows, with NVIDIA's support status (data-center "Supported Drivers
# and CUDA Toolkit Versions" page, docs.nvidia.com/datacenter/tesla/drivers): R535 LTSB
# (EOL June 2026), R570 production (EOL Feb 2026), R580 LTSB (EOL Aug 2028); R550, R560,
# R565, R575 end of life. The highest CUDA major each branch runs natively.
BRANCHES = {
    "535": "LTSB, end of life June 2026",
    "550": "end of life",
    "560": "end of life",
    "565": "end of life",
    "570": "production branch, end of life February 2026",
    "575": "end of life",
    "580": "LTSB, supported to August 2028",
    "590": "feature branch",
    "595": "production branch",
    "610": "feature branch",
    "615": "production branch",
}

# Minimum Linux driver for each CUDA toolkit (CUDA release notes, "CUDA Toolkit and
# Corresponding Driver Versions", docs.nvidia.com/cuda/cuda-toolkit-release-notes, 13.1 edition).
CUDA_MIN_DRIVER = {
    "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06", "12.4": "550.54.14",
    "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06",
    "13.1": "590.44.01",
}  # fmt: skip
# Minor-version compatibility (same page): any CUDA 12.x runtime runs on a >= 525.60.13 driver
# (without PTX JIT of newer PTX); CUDA 13.x needs >= 580.
CUDA_MAJOR_MIN_DRIVER = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}

# Minimum patched driver per branch: the fixed versions of the latest NVIDIA GPU Display
# Driver security bulletin that lists the branch (github.com/NVIDIA/product-security):
# 5861 (September 2026) R580 580.178.04, R595 595.91.07, R610 610.57.04, R615 615.71.09;
# 5821 (May 2026) R535 535.309.01, the last R535 fix (the branch ended June 2026);
# 5703 (October 2025) R570 570.195.03, the last R570 fix (ended February 2026).
# Branches without a row (R550, R560, R565, R575, R590) get no fixes at all: the role
# warns that they are end of life.
SECURITY_MINIMUM = {
    "535": "535.309.01",
    "570": "570.195.03",
    "580": "580.178.04",
    "595": "595.91.07",
    "610": "610.57.04",
    "615": "615.71.09",
}

# ---------------------------------------------------------------- GPU generations

GENERATIONS = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
# PCI device id ranges (vendor 0x10de) per generation, from the PCI ID repository
# (pci-ids.ucw.cz, vendor 10de): anchors such as V100 1db1, T4 1eb8, A100 20b0, RTX 3090 2204,
# A10 2236, H100 SXM 2330, H200 2335, RTX 4090 2684, L40S 26b9, L4 27b8, B200 2901, RTX 5090 2b85.
PCI_RANGES = (
    (0x0FC0, 0x103F, "kepler"),
    (0x1180, 0x12FF, "kepler"),
    (0x1340, 0x13FF, "maxwell"),
    (0x1400, 0x143F, "maxwell"),
    (0x17C0, 0x17FF, "maxwell"),
    (0x15F0, 0x15FF, "pascal"),
    (0x1B00, 0x1D1F, "pascal"),
    (0x1D80, 0x1DBF, "volta"),
    (0x1E00, 0x1FFF, "turing"),
    (0x2180, 0x21FF, "turing"),
    (0x2080, 0x20FF, "ampere"),
    (0x2200, 0x22FF, "ampere"),
    (0x2400, 0x25FF, "ampere"),
    (0x2300, 0x234F, "hopper"),
    (0x2680, 0x28FF, "ada"),
    (0x2900, 0x29FF, "blackwell"),
    (0x2B00, 0x2DFF, "blackwell"),
)
# Product names as nvidia-smi prints them.
NAME_PATTERNS = (
    (r"\b(B100|B200|B300|GB200|GB300|RTX 50\d0|RTX PRO \d+ Blackwell)", "blackwell"),
    (r"\b(H100|H200|H800|H20|GH200)\b", "hopper"),
    (r"\b(L40S?|L4|L20|RTX 40\d0|RTX \d+ Ada)", "ada"),
    (r"\b(A100|A800|A40|A30|A16|A10G?|A2|RTX 30\d0|RTX A\d+)\b", "ampere"),
    (r"\b(T4|RTX 20\d0|TITAN RTX|Quadro RTX)", "turing"),
    (r"\b(V100|TITAN V)\b", "volta"),
    (r"\b(P100|P40|P4|GTX 10\d0|TITAN Xp?)\b", "pascal"),
    (r"\b(M40|M60|M10|GTX 9\d0)\b", "maxwell"),
    (r"\b(K80|K40|K20)\b", "kepler"),
)


def generation(name=None, pci_device_id=None):
    """The GPU generation from a PCI device id (int or '0x2330') or an nvidia-smi name."""
    if pci_device_id is not None:
        dev = int(pci_device_id, 16) if isinstance(pci_device_id, str) else int(pci_device_id)
        for lo, hi, gen in PCI_RANGES:
            if lo <= dev <= hi:
                return gen
    if name:
        for pattern, gen in NAME_PATTERNS:
            if re.search(pattern, name):
                return gen
    return None


def _at_least(gen, floor):
    return GENERATIONS.index(gen) >= GENERATIONS.index(floor)


# ---------------------------------------------------------------- kernel module flavour


def kernel_modules(requested, generations, branch):
    """('open' | 'proprietary', reason, errors) for the GPUs present.

    NVIDIA's open kernel modules support Turing and newer only; Blackwell (and Grace
    Hopper) need them; NVIDIA recommends them for Turing and newer from R560 on
    (driver installation guide, "Choosing an Installation Method"; the
    open-gpu-kernel-modules README). Pre-Turing GPUs need the proprietary modules.
    """
    gens = sorted({g for g in generations if g}, key=GENERATIONS.index)
    errors = []
    old = [g for g in gens if not _at_least(g, "turing")]
    newest = gens[-1] if gens else None
    if requested == "open" and old:
        errors.append(
            "nvidia_driver_kernel_modules=open, but this host has %s GPUs: the open kernel modules support Turing and "
            "newer only. Use proprietary (or auto)." % "/".join(old)
        )
    if requested == "proprietary" and newest == "blackwell":
        errors.append(
            "nvidia_driver_kernel_modules=proprietary, but this host has Blackwell GPUs, which only the open kernel "
            "modules support. Use open (or auto)."
        )
    if old and newest == "blackwell":
        errors.append(
            "this host mixes %s and Blackwell GPUs: no kernel module flavour drives both; split them across hosts."
            % "/".join(old)
        )
    if branch and newest == "blackwell" and int(branch) < 570:
        errors.append(
            "nvidia_driver_branch=%s does not support Blackwell GPUs (R570 or newer does); choose 570 or 580." % branch
        )
    if requested in ("open", "proprietary"):
        return requested, "pinned by nvidia_driver_kernel_modules", errors
    if old:
        return "proprietary", "%s GPUs need the proprietary modules" % "/".join(old), errors
    if newest:
        if branch and int(branch) < 560 and newest != "blackwell":
            return (
                "proprietary",
                "R%s defaults to the proprietary modules (NVIDIA recommends open from R560)" % branch,
                errors,
            )
        return "open", "%s GPUs: NVIDIA recommends the open modules for Turing and newer" % newest.capitalize(), errors
    if branch and int(branch) >= 560:
        return "open", "no GPU generation detected; R%s defaults to the open modules" % branch, errors
    return "proprietary", "no GPU generation detected; R%s defaults to the proprietary modules" % branch, errors


# ---------------------------------------------------------------- package sets


def driver_packages(source, distribution, branch, flavour, version=None, local_packages=None):
    """The packages to install (name or name=version) and the ones to hold."""
    pin = ("=" + version) if version else ""
    if source == "local":
        names = list(local_packages or [])
        return [n + pin for n in names], names
    if source == "distro" and distribution == "debian":
        # Debian 12 has no headless metapackage; this is the compute set without Xorg
        # (nvidia-driver pulls the X/GL stack): the module (DKMS), its GSP firmware, the
        # CUDA and NVML libraries, nvidia-smi and nvidia-persistenced (contrib).
        module = "nvidia-open-kernel-dkms" if flavour == "open" else "nvidia-kernel-dkms"
        names = [module, "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-smi", "nvidia-persistenced"]
        versioned = [module, "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-smi"]
        return [n + (pin if n in versioned else "") for n in names], names
    if source == "distro" and distribution == "ubuntu":
        suffix = "-server-open" if flavour == "open" else "-server"
        names = ["nvidia-headless-%s%s" % (branch, suffix), "nvidia-utils-%s-server" % branch]
        return [n + pin for n in names], names
    if source == "cuda_repo":
        # NVIDIA's CUDA repository: nvidia-open (open kernel modules) or cuda-drivers
        # (proprietary), the whole compute driver. From R580 NVIDIA ships branch pinning
        # packages, installed first (driver installation guide, "Version locking");
        # before that the branch is in the metapackage's name (cuda-drivers-570).
        meta = "nvidia-open" if flavour == "open" else "cuda-drivers"
        if int(branch) >= 580:
            names = ["nvidia-driver-pinning-%s" % branch, meta]
            return [names[0], meta + pin], [meta, names[0]]
        names = ["%s-%s" % (meta, branch)]
        return [n + pin for n in names], names
    raise ValueError("no package set for source %s on %s" % (source, distribution))


def driver_cuda(driver_version):
    """The newest CUDA toolkit a driver version runs natively (CUDA_MIN_DRIVER)."""
    best = None
    for cuda, minimum in CUDA_MIN_DRIVER.items():
        if version_ge(driver_version, minimum) and (best is None or vtuple(cuda) > vtuple(best)):
            best = cuda
    return best


def toolkit_errors(toolkit, driver_version, where="cuda_toolkit_version"):
    """A toolkit newer than the driver runs: refuse it, naming the driver it needs."""
    key = ".".join(str(toolkit).split(".")[:2])
    need = CUDA_MIN_DRIVER.get(key)
    if need is None:
        return ["%s=%s is not a CUDA release gpufleet knows (%s)." % (where, toolkit, ", ".join(CUDA_MIN_DRIVER))]
    if driver_version and not version_ge(driver_version, need):
        return [
            "%s=%s needs driver %s or newer, but the host's driver is %s (it runs CUDA %s natively). Raise "
            "nvidia_driver_branch/nvidia_driver_version or pick cuda_toolkit_version %s."
            % (
                where,
                toolkit,
                need,
                upstream(driver_version),
                driver_cuda(driver_version) or "< 12.0",
                driver_cuda(driver_version) or "11.x",
            )
        ]
    return []


def debian_source_blocks(entries):
    """[{uris, suites}] from a host's Debian package entries as apt read them
    ([{uri, suite}] from roles/nvidia_driver/files/debian-package-mirrors): each mirror with
    its suites, mirrors with the same suites together, in order, so the non-free components
    can be added on the same mirrors."""
    suites_of = {}
    for entry in entries or []:
        suites = suites_of.setdefault(entry["uri"], [])
        if entry["suite"] not in suites:
            suites.append(entry["suite"])
    blocks = []
    for uri, suites in suites_of.items():
        same = [b for b in blocks if b["suites"] == suites]
        if same:
            same[0]["uris"].append(uri)
        else:
            blocks.append({"uris": [uri], "suites": suites})
    return blocks


# ---------------------------------------------------------------- reboot decision


def reboot_decision(policy, in_container, installed, loaded, nouveau_loaded=False, gpus_present=True):
    """(reboot now, reboot required, reason).

    The kernel module that is loaded must be the one the installed libraries expect, or
    every NVML call fails with "Driver/library version mismatch". A reboot is needed when
    a module is loaded and differs from the installed one, or when nouveau holds the GPU.
    It happens only when nvidia_driver_reboot is if_needed, and never in a container.
    """
    if in_container:
        return False, False, "in a container: no kernel module is loaded or replaced here"
    if not installed or not gpus_present:
        return False, False, "no NVIDIA GPU or driver on this host"
    if loaded and upstream(loaded) != upstream(installed):
        why = "the loaded module is %s, the installed driver %s" % (upstream(loaded), upstream(installed))
    elif not loaded and nouveau_loaded:
        why = "nouveau holds the GPU; the NVIDIA module loads after a reboot"
    else:
        return False, False, "the loaded module matches the installed driver" if loaded else "module not loaded yet"
    if policy == "if_needed":
        return True, True, why
    return False, True, why + " (nvidia_driver_reboot=never: reboot this host yourself)"


# ---------------------------------------------------------------- image CUDA requirement


def parse_require_cuda(value):
    """NVIDIA_REQUIRE_CUDA ('cuda>=12.8 brand=tesla,driver>=535,driver<536 ...') ->
    (cuda version or None, [alternatives: {'brand': ..., 'min': ..., 'max': ...}])."""
    cuda, alternatives = None, []
    for token in (value or "").split():
        if token.startswith("cuda>="):
            cuda = token[len("cuda>=") :]
            continue
        alt = {}
        for part in token.split(","):
            if part.startswith("brand="):
                alt["brand"] = part[len("brand=") :]
            elif part.startswith("driver>="):
                alt["min"] = part[len("driver>=") :]
            elif part.startswith("driver<"):
                alt["max"] = part[len("driver<") :]
        if alt:
            alternatives.append(alt)
    return cuda, alternatives


def cuda_requirement_errors(image, require, driver_version, driver_cuda, where="engine"):
    """Sentences when the host driver cannot run an image's CUDA (nvidia-container-cli
    refuses such a container: "unsatisfied condition: cuda>=X")."""
    cuda, alternatives = parse_require_cuda(require)
    if not cuda or not driver_version:
        return []
    if driver_cuda and vtuple(driver_cuda) >= vtuple(cuda):
        return []
    for alt in alternatives:
        if (
            alt.get("min")
            and vtuple(driver_version) >= vtuple(alt["min"])
            and (not alt.get("max") or vtuple(driver_version) < vtuple(alt["max"]))
        ):
            return []  # a data-center branch the image also accepts (forward compatibility)
    need = CUDA_MIN_DRIVER.get(".".join(cuda.split(".")[:2])) or CUDA_MAJOR_MIN_DRIVER.get(cuda.split(".")[0])
    return [
        "%s: image %s needs CUDA %s (NVIDIA_REQUIRE_CUDA), but the driver %s supports CUDA %s; the container "
        "would not start. Upgrade the driver (nvidia_driver_branch with at least %s) or use an image built for "
        "CUDA %s." % (where, image, cuda, driver_version, driver_cuda or "?", need or "a newer driver", driver_cuda)
    ]


# ---------------------------------------------------------------- security minimum


def security_errors(version, action="fail", table=None):
    """(errors, warnings) when a driver version is below its branch's patched minimum."""
    table = SECURITY_MINIMUM if table is None else table
    branch = branch_of(version)
    minimum = table.get(branch)
    if not minimum:
        status = BRANCHES.get(branch, "not a branch gpufleet knows")
        return [], ["driver branch R%s: %s, and no security bulletin lists fixes for it; move to R580 (LTSB)."
                    % (branch, status)]  # fmt: skip
    if version_ge(version, minimum):
        return [], []
    message = (
        "driver %s is below %s, the first R%s release with the fixes of NVIDIA's latest security bulletin for this "
        "branch; pin nvidia_driver_version to %s or newer (or set nvidia_driver_security_action=warn to accept it)."
        % (upstream(version), minimum, branch, minimum)
    )
    return ([message], []) if action == "fail" else ([], [message])


# ---------------------------------------------------------------- the driver plan

SOURCES = ("distro", "cuda_repo", "local")


def _installed_version(installed, name):
    """A package's installed version from {name: version} or package_facts' {name: [{version}]}."""
    value = (installed or {}).get(name) if name else None
    if isinstance(value, list):
        value = value[0].get("version") if value and isinstance(value[0], dict) else None
    return value


# The one package whose version stands for the installed driver, per source.
MAIN_PACKAGE = {"debian": "libcuda1", "ubuntu": "nvidia-utils-%s-server"}


def driver_plan(settings, facts):
    """Everything the nvidia_driver role decides before it changes anything.

    settings: source, branch, version, kernel_modules, security_action, upgrade,
    local_packages, mok_key, mok_cert, gpu_generations (override).
    facts: distribution, distribution_major, in_container, secure_boot (enabled|disabled|
    unknown), pci_device_ids, gpu_names, installed ({package: version}).
    Returns errors (each naming the variable, the value and the fix), warnings, the module
    flavour and why, the packages to install and hold, and the main package.
    """
    errors, warnings, notes = [], [], []
    source = settings.get("source")
    branch = str(settings.get("branch") or "")
    version = settings.get("version") or None
    distribution = (facts.get("distribution") or "").lower()
    major = str(facts.get("distribution_major") or "")
    if source not in SOURCES:
        errors.append("nvidia_driver_source=%r must be one of %s." % (source, ", ".join(SOURCES)))
    if branch not in BRANCHES:
        errors.append(
            "nvidia_driver_branch=%r is not a driver branch gpufleet knows (%s); R580 is the long-term branch."
            % (branch, ", ".join(sorted(BRANCHES)))
        )
    if version and branch_of(version) != branch:
        errors.append(
            "nvidia_driver_version=%s is not in nvidia_driver_branch=%s; make them agree (version %s.x)."
            % (version, branch, branch)
        )
    if distribution not in ("debian", "ubuntu"):
        errors.append("the nvidia_driver role supports Debian and Ubuntu hosts, not %r." % distribution)
    if source == "distro" and distribution == "debian" and branch and branch != "535":
        errors.append(
            "nvidia_driver_branch=%s: Debian %s's archive carries only R535; set nvidia_driver_branch=535 or "
            "nvidia_driver_source=cuda_repo for R%s." % (branch, major, branch)
        )
    if source == "local" and not settings.get("local_packages"):
        errors.append("nvidia_driver_source=local needs nvidia_driver_local_packages (the package names to install).")
    generations = list(settings.get("gpu_generations") or [])
    if not generations:
        generations = [generation(pci_device_id=d) for d in facts.get("pci_device_ids") or []]
        generations += [generation(name=n) for n in facts.get("gpu_names") or []]
    unknown = [g for g in generations if g and g not in GENERATIONS]
    if unknown:
        errors.append("nvidia_driver_gpu_generations: %s unknown; use %s." % (unknown, ", ".join(GENERATIONS)))
        generations = [g for g in generations if g in GENERATIONS]
    requested = settings.get("kernel_modules") or "auto"
    if requested not in ("auto", "open", "proprietary"):
        errors.append("nvidia_driver_kernel_modules=%r must be auto, open or proprietary." % requested)
        requested = "auto"
    flavour, why, flavour_errors = kernel_modules(requested, generations, branch if branch in BRANCHES else None)
    errors.extend(flavour_errors)
    if facts.get("secure_boot") == "enabled" and not facts.get("in_container"):
        if not (settings.get("mok_key") and settings.get("mok_cert")):
            errors.append(
                "Secure Boot is enabled (mokutil --sb-state): the kernel refuses an unsigned DKMS-built nvidia module. "
                "Set nvidia_driver_mok_key and nvidia_driver_mok_cert to a Machine Owner Key enrolled with "
                "`mokutil --import`, or disable Secure Boot in the firmware."
            )
        else:
            notes.append("Secure Boot is on: DKMS signs the module with %s" % settings["mok_cert"])
    if version:
        sec_errors, sec_warnings = security_errors(version, settings.get("security_action") or "fail")
        errors.extend(sec_errors)
        warnings.extend(sec_warnings)
    packages, hold = [], []
    if not errors:
        packages, hold = driver_packages(
            source, distribution, branch, flavour, version=version, local_packages=settings.get("local_packages")
        )
    main = hold[0] if source in ("local", "cuda_repo") and hold else None
    if source == "distro":
        main = MAIN_PACKAGE[distribution].replace("%s", branch) if distribution in MAIN_PACKAGE else None
    installed = _installed_version(facts.get("installed"), main)
    if installed and version and upstream(installed) != upstream(version) and not settings.get("upgrade"):
        errors.append(
            "%s %s is installed and held, nvidia_driver_version asks for %s: set nvidia_driver_upgrade=true to move "
            "(it lifts the hold, installs, holds again; the new module loads at the next reboot)."
            % (main, upstream(installed), upstream(version))
        )
    if facts.get("in_container"):
        notes.append("container: packages and configuration only; the module load, reboot and GPU check are skipped")
    return {
        "errors": errors,
        "warnings": warnings,
        "notes": notes,
        "kernel_modules": flavour,
        "kernel_modules_reason": why,
        "generations": sorted({g for g in generations if g}, key=GENERATIONS.index),
        "packages": packages,
        "hold": hold,
        "main_package": main,
        "installed_version": upstream(installed) if installed else None,
    }
