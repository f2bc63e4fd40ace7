"""Build step that puts the gpufleet.serving collection inside the gpufleet wheel.

The metadata lives in pyproject.toml; this file only adds one build command. A wheel (and so
`pip install .`) carries the collection at gpufleet/collection/ansible_collections/gpufleet/serving,
where gpufleet._collection finds it: the installed CLI works from any folder without a checkout.
An sdist carries the same files, so a wheel built from it is the same. `pip install -e .`
copies nothing: the CLI finds the checkout's collection in place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# Where the collection lands inside the wheel (a collections path: gpufleet/collection).
PACKAGED = ("gpufleet", "collection", "ansible_collections", "gpufleet", "serving")
# What the installed collection carries: what running site.yml and rollout.yml needs, and
# otherwise the same files as `ansible-galaxy collection build` puts in the tarball
# (tests/unit/test_packaging.py compares the two).
REQUIRED = ("galaxy.yml", "README.md", "LICENSE", "site.yml", "meta", "plugins", "roles", "playbooks", "inventories")
OPTIONAL = ("CHANGELOG.rst", "changelogs", "collections/requirements.yml", "docs")
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".retry")


def collection_files() -> list[str]:
    """The collection's files, relative to the project root, in a stable order."""
    missing = [part for part in REQUIRED if not (HERE / part).exists()]
    if missing:
        raise SystemExit(
            "gpufleet build: %s missing from %s; build from a checkout or an sdist of gpufleet"
            % (", ".join(missing), HERE)
        )
    files: list[str] = []
    for part in REQUIRED + OPTIONAL:
        path = HERE / part
        if path.is_file():
            files.append(part)
            continue
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            rel = Path(folder).relative_to(HERE)
            files += [(rel / n).as_posix() for n in sorted(names) if not n.endswith(SKIP_SUFFIXES)]
    return files


class BuildPyWithCollection(build_py):
    """build_py that also copies the collection into the package (not in editable mode)."""

    def _collection_mapping(self) -> dict[str, str]:
        target = os.path.join(self.build_lib, *PACKAGED)
        return {os.path.join(target, *rel.split("/")): str(HERE / rel) for rel in collection_files()}

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        # Start clean: a file removed from the checkout must not linger in build/ and the wheel.
        shutil.rmtree(os.path.join(self.build_lib, *PACKAGED[:2]), ignore_errors=True)
        for target, source in self._collection_mapping().items():
            self.mkpath(os.path.dirname(target))
            self.copy_file(source, target, preserve_mode=True)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:  # already from get_output_mapping()
            return outputs
        return [*outputs, *self._collection_mapping()]

    def get_output_mapping(self) -> dict[str, str]:
        return {**super().get_output_mapping(), **self._collection_mapping()}

    def get_source_files(self) -> list[str]:
        # sdist asks build_py for its sources: the collection goes into the sdist this way.
        return [*super().get_source_files(), *collection_files()]


setup(cmdclass={"build_py": BuildPyWithCollection})
