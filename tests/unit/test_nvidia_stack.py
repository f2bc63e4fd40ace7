"""The NVIDIA stack planner: versions, data tables, decisions and rendered apt sources.

Data sources (each also cited beside its table in module_utils/_nvidia_stack.py):
- CUDA release notes 13.1, "CUDA Toolkit and Corresponding Driver Versions" (minimum drivers).
- NVIDIA GPU Display Driver security bulletins 5703 (Oct 2025), 5821 (May 2026), 5861 (Sep 2026),
  github.com/NVIDIA/product-security.
- NVIDIA driver installation guide, "Kernel Modules" (open modules: Turing and newer).
- PCI ID repository (vendor 10de) for the device ids.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _nvidia_stack as stack

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "roles" / "common" / "files" / "apt-sources-check"


@pytest.mark.parametrize(
    ("a", "b", "ge"),
    [("535.261.03-1~deb12u1", "535.261.03", True), ("1:580.95.05-0ubuntu1", "580.178.04", False),
     ("580.178.04", "580.178.04", True), ("570.26", "570.124.06", False), ("1.17.8-1", "1.17.8", True)],
)  # fmt: skip
def test_version_compare_drops_epoch_and_revision(a, b, ge):
    assert stack.version_ge(a, b) is ge


@pytest.mark.parametrize(
    ("name", "device", "expected"),
    [(None, "0x2330", "hopper"), (None, "0x2335", "hopper"), (None, "0x2684", "ada"), (None, "0x26b9", "ada"),
     (None, "0x20b0", "ampere"), (None, "0x2204", "ampere"), (None, "0x1eb8", "turing"), (None, "0x1db4", "volta"),
     (None, "0x15f8", "pascal"), (None, "0x2901", "blackwell"), (None, "0x2b85", "blackwell"),
     ("NVIDIA H100 80GB HBM3", None, "hopper"), ("NVIDIA GeForce RTX 4090", None, "ada"),
     ("Tesla V100-SXM2-32GB", None, "volta"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", None, "blackwell"),
     ("NVIDIA A100-SXM4-80GB", None, "ampere"), ("Tesla T4", None, "turing"), ("Some Future GPU", None, None)],
)  # fmt: skip
def test_gpu_generation_from_pci_id_or_name(name, device, expected):
    assert stack.generation(name=name, pci_device_id=device) == expected


def test_kernel_module_flavour_rules():
    assert stack.kernel_modules("auto", ["hopper"], "580")[0] == "open"
    assert stack.kernel_modules("auto", ["pascal"], "580")[0] == "proprietary"
    assert stack.kernel_modules("auto", ["ampere"], "535")[0] == "proprietary"  # R535 predates the open default
    assert stack.kernel_modules("auto", [], "580")[0] == "open"
    _, _, errors = stack.kernel_modules("open", ["volta"], "580")
    assert "support Turing and newer only" in errors[0]
    _, _, errors = stack.kernel_modules("proprietary", ["blackwell"], "580")
    assert "only the open kernel modules support" in errors[0]
    _, _, errors = stack.kernel_modules("auto", ["blackwell"], "535")
    assert "R570 or newer" in errors[0]
    _, _, errors = stack.kernel_modules("auto", ["pascal", "blackwell"], "580")
    assert any("mixes pascal and Blackwell" in e for e in errors)


@pytest.mark.parametrize(
    ("policy", "container", "installed", "loaded", "nouveau", "expected"),
    [
        ("if_needed", True, "580.178.04-1", "570.195.03", False, (False, False)),
        ("if_needed", False, "580.178.04-1", "570.195.03", False, (True, True)),
        ("never", False, "580.178.04-1", "570.195.03", False, (False, True)),
        ("if_needed", False, "580.178.04-1", "580.178.04", False, (False, False)),
        ("if_needed", False, "580.178.04-1", None, True, (True, True)),
        ("if_needed", False, "580.178.04-1", None, False, (False, False)),
    ],
)
def test_reboot_only_when_needed_and_allowed(policy, container, installed, loaded, nouveau, expected):
    reboot, required, reason = stack.reboot_decision(policy, container, installed, loaded, nouveau)
    assert (reboot, required) == expected
    assert reason


def test_security_minimum_per_branch():
    errors, _ = stack.security_errors("535.261.03-1~deb12u1")  # Debian 12's archive
    assert errors and "535.309.01" in errors[0] and "nvidia_driver_security_action=warn" in errors[0]
    assert stack.security_errors("535.261.03", action="warn")[1]
    assert stack.security_errors("580.178.04") == ([], [])
    _, warnings = stack.security_errors("575.64.05")
    assert "end of life" in warnings[0]


def test_cuda_toolkit_against_the_driver():
    assert stack.toolkit_errors("12.8", "570.195.03") == []
    errors = stack.toolkit_errors("13.1", "580.178.04")
    assert "needs driver 590.44.01" in errors[0] and "runs CUDA 13.0 natively" in errors[0]
    assert "not a CUDA release" in stack.toolkit_errors("12.7", "580.178.04")[0]
    assert stack.driver_cuda("535.261.03") == "12.2"


# NVIDIA_REQUIRE_CUDA as CUDA base images set it (nvidia/cuda Dockerfiles; the same form is in
# vllm/vllm-openai images): the cuda>= clause, then brand/driver ranges that also satisfy it.
REQUIRE = (
    "cuda>=12.9 brand=unknown,driver>=535,driver<536 brand=grid,driver>=535,driver<536 "
    "brand=tesla,driver>=535,driver<536 brand=tesla,driver>=570,driver<571"
)


def test_image_cuda_requirement():
    assert stack.parse_require_cuda(REQUIRE)[0] == "12.9"
    assert stack.cuda_requirement_errors("img", REQUIRE, "575.57.08", "12.9") == []
    assert stack.cuda_requirement_errors("img", REQUIRE, "535.261.03", "12.2") == []  # a listed R535 range
    errors = stack.cuda_requirement_errors("vllm/vllm-openai:v0.32.0", REQUIRE, "550.163.01", "12.4")
    assert "needs CUDA 12.9" in errors[0] and "575.51.03" in errors[0]


def test_engine_image_filter_reads_docker_inspect_env():
    from ansible_collections.gpufleet.serving.plugins.filter.nvidia_stack import engine_image_cuda_errors

    result = {"item": "vllm/vllm-openai:v0.32.0", "stdout": '["PATH=/usr/bin","NVIDIA_REQUIRE_CUDA=%s"]' % REQUIRE}
    gpu = {"driver_version": "550.163.01", "cuda_version": "12.4"}
    assert engine_image_cuda_errors(result, gpu)
    disabled = dict(result, stdout=result["stdout"].replace('"]', '","NVIDIA_DISABLE_REQUIRE=1"]'))
    assert engine_image_cuda_errors(disabled, gpu) == []


def _facts(**kw):
    base = {"distribution": "Debian", "distribution_major": "12", "in_container": False, "secure_boot": "disabled",
            "pci_device_ids": ["0x2684"], "installed": {}}  # fmt: skip
    base.update(kw)
    return base


def _settings(**kw):
    base = {"source": "distro", "branch": "535", "version": "", "kernel_modules": "auto", "security_action": "fail"}
    base.update(kw)
    return base


def test_driver_plan_debian_compute_set_without_xorg():
    plan = stack.driver_plan(_settings(), _facts())
    assert plan["errors"] == []
    assert plan["kernel_modules"] == "proprietary"  # R535 on an Ada card: proprietary by default
    assert plan["packages"][0] == "nvidia-kernel-dkms" and "nvidia-driver" not in plan["packages"]
    assert plan["main_package"] == "libcuda1"
    open_plan = stack.driver_plan(_settings(kernel_modules="open"), _facts())
    assert open_plan["packages"][0] == "nvidia-open-kernel-dkms"


@pytest.mark.parametrize(
    ("settings", "facts", "words"),
    [
        ({"branch": "580"}, {}, "Debian 12's archive carries only R535"),
        ({"branch": "999"}, {}, "nvidia_driver_branch='999' is not a driver branch"),
        ({"version": "570.195.03-1"}, {}, "is not in nvidia_driver_branch=535"),
        ({}, {"secure_boot": "enabled"}, "Secure Boot is enabled"),
        ({"source": "local"}, {}, "needs nvidia_driver_local_packages"),
        ({"source": "cuda_repo", "branch": "580", "version": "580.95.05-1"}, {}, "is below 580.178.04"),
        ({"source": "cuda_repo", "branch": "580", "version": "580.178.04-1"},
         {"installed": {"nvidia-open": "580.159.03-1"}}, "set nvidia_driver_upgrade=true"),
        ({"gpu_generations": ["fermi"]}, {}, "nvidia_driver_gpu_generations"),
        ({}, {"distribution": "Fedora"}, "supports Debian and Ubuntu"),
    ],
)  # fmt: skip
def test_driver_plan_refusals(settings, facts, words):
    plan = stack.driver_plan(_settings(**settings), _facts(**facts))
    assert any(words in e for e in plan["errors"]), plan["errors"]


def test_secure_boot_with_a_mok_key_and_in_containers():
    signed = stack.driver_plan(_settings(mok_key="/k.priv", mok_cert="/k.der"), _facts(secure_boot="enabled"))
    assert signed["errors"] == [] and any("signs the module" in n for n in signed["notes"])
    container = stack.driver_plan(_settings(), _facts(secure_boot="enabled", in_container=True))
    assert container["errors"] == [] and any("container" in n for n in container["notes"])


def test_dpkg_installed_reads_dpkg_query():
    from ansible_collections.gpufleet.serving.plugins.filter.nvidia_stack import dpkg_installed

    text = "libcuda1\t535.309.01-0+deb12u1\thi \nnvidia-smi\t535.309.01-0+deb12u1\tii \nold\t1.0\trc \n"
    assert dpkg_installed(text) == {"libcuda1": "535.309.01-0+deb12u1", "nvidia-smi": "535.309.01-0+deb12u1"}


def test_package_sets_per_source():
    assert stack.driver_packages("cuda_repo", "ubuntu", "580", "open") == (
        ["nvidia-driver-pinning-580", "nvidia-open"],
        ["nvidia-open", "nvidia-driver-pinning-580"],
    )
    assert stack.driver_packages("cuda_repo", "debian", "570", "proprietary", "570.195.03-1")[0] == [
        "cuda-drivers-570=570.195.03-1"
    ]
    assert stack.driver_packages("distro", "ubuntu", "580", "open")[1] == [
        "nvidia-headless-580-server-open",
        "nvidia-utils-580-server",
    ]


DEBIAN_SOURCES = """Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# What debian-package-mirrors prints for DEBIAN_SOURCES (apt's order).
DEBIAN_ENTRIES = [
    {"uri": "http://mirror.example/debian", "suite": "bookworm"},
    {"uri": "http://mirror.example/debian", "suite": "bookworm-updates"},
    {"uri": "http://mirror.example/debian-security", "suite": "bookworm-security"},
]
MIRRORS = ROOT / "roles" / "nvidia_driver" / "files" / "debian-package-mirrors"


def test_debian_source_blocks_keep_the_hosts_mirrors():
    assert stack.debian_source_blocks(DEBIAN_ENTRIES) == [
        {"uris": ["http://mirror.example/debian"], "suites": ["bookworm", "bookworm-updates"]},
        {"uris": ["http://mirror.example/debian-security"], "suites": ["bookworm-security"]},
    ]
    two = DEBIAN_ENTRIES[:2] + [{"uri": "http://m2/debian", "suite": s} for s in ("bookworm", "bookworm-updates")]
    assert stack.debian_source_blocks(two) == [
        {"uris": ["http://mirror.example/debian", "http://m2/debian"], "suites": ["bookworm", "bookworm-updates"]}
    ]
    assert stack.debian_source_blocks([]) == []


def _mirrors(*files):
    proc = subprocess.run(
        ["/usr/bin/python3", str(MIRRORS), *map(str, files)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(
    subprocess.run(["/usr/bin/python3", "-c", "import apt_pkg"], capture_output=True, check=False).returncode != 0,
    reason="libapt's parser needs python3-apt (Debian/Ubuntu)",
)
def test_apt_itself_reads_the_hosts_sources(tmp_path):
    """The cases a hand-written parser got wrong: options in brackets, a folded second URI,
    `Enabled: no`, a deb-src line."""
    one_line = tmp_path / "sources.list"
    one_line.write_text(
        "# a comment\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] http://deb.debian.org/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
    )
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://m1.example/debian\n  http://m2.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n"
    )
    assert _mirrors(deb822, one_line, tmp_path / "missing.sources") == [
        {"uri": "http://m1.example/debian", "suite": "bookworm"},
        {"uri": "http://m1.example/debian", "suite": "bookworm-updates"},
        {"uri": "http://m2.example/debian", "suite": "bookworm"},
        {"uri": "http://m2.example/debian", "suite": "bookworm-updates"},
        {"uri": "http://deb.debian.org/debian", "suite": "bookworm"},
    ]
    sources = tmp_path / "plain.sources"
    sources.write_text(DEBIAN_SOURCES)
    assert _mirrors(sources) == DEBIAN_ENTRIES


def _render(role, template, **variables):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles" / role / "templates")))
    return env.get_template(template).render(ansible_managed="Managed by gpufleet", **variables)


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt's parser needs apt-get (Debian/Ubuntu)")
@pytest.mark.parametrize(
    ("role", "template", "variables", "expect"),
    [
        ("nvidia_driver", "cuda.sources.j2",
         {"__nvidia_driver_cuda_repo": "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"},
         "compute/cuda/repos/debian12/x86_64/Packages"),
        ("nvidia_driver", "debian-nonfree.sources.j2",
         {"__blocks": stack.debian_source_blocks(DEBIAN_ENTRIES), "nvidia_driver_debian_mirror": "",
          "ansible_facts": {"distribution_release": "bookworm"}},
         "mirror.example/debian/dists/bookworm/non-free-firmware/binary-"),
        ("common", "local.sources.j2",
         {"common_local_apt_repo_dir": "/srv/nvidia-driver", "common_local_apt_repo_comment": "NVIDIA driver packages"},
         "file:/srv/nvidia-driver"),
        ("container_runtime", "nvidia-container-toolkit.sources.j2",
         {"container_runtime_nvidia_toolkit_repo_url": "https://nvidia.github.io/libnvidia-container/stable/deb"},
         "libnvidia-container/stable/deb/"),
    ],
)  # fmt: skip
def test_rendered_sources_pass_apts_own_parser(tmp_path, role, template, variables, expect):
    path = tmp_path / "candidate"
    path.write_text(_render(role, template, **variables))
    proc = subprocess.run(["sh", str(CHECKER), str(path), "sources"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout, proc.stdout


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt's parser needs apt-get (Debian/Ubuntu)")
def test_the_checker_rejects_a_broken_source(tmp_path):
    path = tmp_path / "candidate"
    path.write_text("Types: deb\nURIs: http://x\nnot a field\n")
    proc = subprocess.run(["sh", str(CHECKER), str(path), "sources"], capture_output=True, text=True, check=False)
    assert proc.returncode != 0


def test_gpu_facts_lists_nvidia_gpus_on_the_pci_bus_without_a_driver(tmp_path):
    # what gpu_facts reads (plugins/module_utils/_sysfs.py)
    from ansible_collections.gpufleet.serving.plugins.module_utils._sysfs import pci_gpus

    devices = tmp_path / "bus" / "pci" / "devices"
    for address, vendor, klass, device in [
        ("0000:01:00.0", "0x10de", "0x030200", "0x2330"),  # H100 SXM, 3D controller
        ("0000:02:00.0", "0x10de", "0x040300", "0x22e8"),  # its audio function: not a GPU
        ("0000:03:00.0", "0x8086", "0x030000", "0x1234"),  # another vendor's VGA
    ]:
        (devices / address).mkdir(parents=True)
        (devices / address / "vendor").write_text(vendor + "\n")
        (devices / address / "class").write_text(klass + "\n")
        (devices / address / "device").write_text(device + "\n")
    found = pci_gpus(str(tmp_path))
    assert found == [{"address": "0000:01:00.0", "device_id": "0x2330", "driver": None}]
    assert stack.generation(pci_device_id=found[0]["device_id"]) == "hopper"
