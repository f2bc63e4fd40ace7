"""The execution environment holds the collection (issue 33).

`ansible-builder create` makes the build context from execution-environment.yml; its image
would start from CentOS Stream on quay.io, which this machine cannot reach. So the test builds
the context's own steps on a Debian 13 base (tests/lab/images/ee-base): the ansible-core and
ansible-runner the context's Containerfile installs, its Python requirements, and its galaxy
stage's `ansible-galaxy collection install -r requirements.yml` run word for word, offline,
from the context's /build. Galaxy is out of reach too: the community collections it would
fetch are put in place first, at the pinned versions, from PyPI's `ansible` package (the same
release CI tests with), and the install must find them satisfying both the pins and
gpufleet.serving's own dependencies. Inside the image: the collection list, and site.yml's
tasks listed from the installed collection with no project folder mounted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.full

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HARNESS = ROOT / "tests" / "lab" / "harness.sh"


def _run(*argv, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False, **kw)
    assert proc.returncode == 0, "%s\n%s\n%s" % (argv, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def _galaxy_stage(containerfile: str) -> tuple[str, str]:
    """The Containerfile's ansible install refs and its galaxy stage's collection install line."""
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]+)"', containerfile, re.M).group(1)
    (install,) = re.findall(r"^RUN (.*ansible-galaxy collection install .*)$", containerfile, re.M)
    return refs, install


def _with_dependencies(names: list[str], root: Path) -> list[str]:
    """The collections `names` need, themselves included, as their MANIFEST.json files say."""
    seen: list[str] = []
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        manifest = json.loads((root / name.replace(".", "/") / "MANIFEST.json").read_text())
        todo.extend(manifest["collection_info"].get("dependencies") or {})
    return sorted(seen)


def test_the_execution_environment_installs_the_collection_and_its_dependencies(tmp_path):
    _run(BIN / "ansible-galaxy", "collection", "build", "--force", "--output-path", ROOT / ".cache" / "dist", cwd=ROOT)
    context = tmp_path / "context"
    _run(BIN / "ansible-builder", "create", "-f", ROOT / "execution-environment.yml", "-c", context, cwd=ROOT)
    containerfile = next(p for p in (context / "Dockerfile", context / "Containerfile") if p.exists()).read_text()
    refs, install = _galaxy_stage(containerfile)
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text())["collections"]
    pinned = {c["name"]: c["version"].lstrip("=") for c in requirements if c.get("type") != "file"}
    assert pinned and [c["type"] for c in requirements if c.get("type")] == ["file"]

    # Galaxy's stand-in: the pinned collections (and what they depend on) from PyPI's ansible
    # package, which must carry exactly the pinned versions
    shipped = Path(metadata.distribution("ansible").locate_file("ansible_collections"))
    seeded = tmp_path / "seed" / "ansible_collections"
    for name in _with_dependencies(list(pinned), shipped):
        shutil.copytree(shipped / name.replace(".", "/"), seeded / name.replace(".", "/"))
    for name, version in pinned.items():
        manifest = json.loads((seeded / name.replace(".", "/") / "MANIFEST.json").read_text())
        assert manifest["collection_info"]["version"] == version, name
    shutil.copytree(tmp_path / "seed", context / "seed")

    base = _run(HARNESS, "image", "ee-base").stdout.strip()
    (context / "Dockerfile.lab").write_text(
        "\n".join(
            [
                "FROM %s" % base,
                "ENV PIP_BREAK_SYSTEM_PACKAGES=1",
                # the base stage: ansible-core and ansible-runner as the Containerfile pins them
                "RUN python3 -m pip install --no-cache-dir %s" % refs,
                # Galaxy's stand-in, then the galaxy stage word for word, offline
                "COPY seed/ /usr/share/ansible/collections/",
                "COPY _build /build",
                "WORKDIR /build",
                "ARG ANSIBLE_GALAXY_CLI_COLLECTION_OPTS=--offline",
                "ARG ANSIBLE_GALAXY_CLI_ROLE_OPTS=",
                "RUN %s" % install,
                # the builder stage's Python requirements
                "RUN python3 -m pip install --no-cache-dir -r requirements.txt",
                "WORKDIR /runner",
                "",
            ]
        )
    )
    tag = "gpufleet-lab/ee-test:latest"
    built = subprocess.run(
        ["docker", "build", "-q", "-f", str(context / "Dockerfile.lab"), "-t", tag, "--label", "io.gpufleet.lab=ee",
         str(context)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    try:
        listed = _run("docker", "run", "--rm", tag, "ansible-galaxy", "collection", "list", "--format", "json")
        found = {n: v["version"] for path in json.loads(listed.stdout).values() for n, v in path.items()}
        galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
        assert found["gpufleet.serving"] == galaxy["version"]
        for name, version in pinned.items():
            assert found[name] == version, (name, found)
        # the playbook from the installed collection, with no project folder: every role resolves
        inventory = "[gpu_hosts]\\ngpu-1\\n[edge]\\nedge-1\\n"
        tasks = _run(
            "docker", "run", "--rm", tag, "sh", "-c",
            "printf '%s' > /tmp/hosts && ansible-playbook gpufleet.serving.site -i /tmp/hosts --list-tasks" % inventory,
        )  # fmt: skip
        for role in ("container_runtime", "nccl", "engine", "edge", "monitoring"):
            assert re.search(r"^\s+gpufleet\.serving\.%s : " % role, tasks.stdout, re.M), (role, tasks.stdout[-2000:])
        print(json.dumps(found, indent=1))
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
