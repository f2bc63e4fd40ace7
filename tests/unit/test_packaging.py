"""Packaging: the collection tarball is clean, the collection resolves in place."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import ROOT

BIN = Path(sys.executable).parent


def _env():
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (BIN, env.get("PATH", ""))
    env.pop("ANSIBLE_CONFIG", None)
    return env


def test_collection_tarball_has_no_tests_ci_or_caches(tmp_path):
    subprocess.run(
        [BIN / "ansible-galaxy", "collection", "build", "--output-path", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env=_env(),
    )
    (tarball,) = tmp_path.glob("gpufleet-serving-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    tops = {n.split("/")[0] for n in names}
    assert {"MANIFEST.json", "FILES.json", "README.md", "meta", "plugins", "roles"} <= tops
    for banned in ("tests", ".ci", ".cache", ".venv", "extensions", "src", "dist", "build", ".git"):
        assert banned not in tops, banned
    assert not [n for n in names if n.startswith("collections/ansible_collections")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "plugins/modules/gpu_facts.py" in names
    assert "roles/nccl/meta/argument_specs.yml" in names


def test_ansible_doc_resolves_in_place():
    proc = subprocess.run(
        [BIN / "ansible-doc", "gpufleet.serving.gpu_facts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "gpufleet_gpu" in proc.stdout
    assert str(ROOT / "collections" / "ansible_collections" / "gpufleet" / "serving") in proc.stdout
