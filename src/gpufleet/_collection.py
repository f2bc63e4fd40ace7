"""Find the gpufleet.serving collection that this CLI drives and make it importable.

The CLI has no logic of its own that the collection already has: parsers and the planner
are imported from the collection's module_utils, so both always agree.

Two copies can be in use, looked for in this order:

- a checkout (`pip install -e .`): the repository root is the collection, and
  collections/ansible_collections/gpufleet/serving links back to it;
- an installed wheel (`pip install .`): setup.py packs the collection at
  gpufleet/collection/ansible_collections/gpufleet/serving, so gpufleet/collection is a
  collections path.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

NAME = ("ansible_collections", "gpufleet", "serving")
# Ansible's own default after the collection's path (ansible-core's COLLECTIONS_PATHS).
DEFAULT_COLLECTIONS_PATHS = ("~/.ansible/collections", "/usr/share/ansible/collections")


class CollectionNotFoundError(RuntimeError):
    pass


@dataclass(frozen=True)
class Collection:
    """One copy of gpufleet.serving and the files the CLI hands to ansible-runner."""

    root: Path  # the folder holding galaxy.yml
    collections_path: Path  # a folder that contains ansible_collections/gpufleet/serving
    packaged: bool  # True: the copy inside an installed wheel; False: a checkout

    @property
    def site_playbook(self) -> Path:
        return self.root / "playbooks" / "site.yml"

    @property
    def rollout_playbook(self) -> Path:
        return self.root / "playbooks" / "rollout.yml"

    @property
    def inventories(self) -> Path:
        """The example inventories (inventories/lab, ...)."""
        return self.root / "inventories"

    @property
    def ansible_cfg(self) -> Path | None:
        """A checkout's ansible.cfg; an installed copy has none (Ansible's defaults apply)."""
        cfg = self.root / "ansible.cfg"
        return cfg if not self.packaged and cfg.is_file() else None

    def envvars(self) -> dict[str, str]:
        """Environment for ansible(-runner) that resolves gpufleet.serving to this copy first.

        Collections already on ANSIBLE_COLLECTIONS_PATH (or Ansible's default paths) stay
        after it; community collections from PyPI's `ansible` package are found on sys.path.
        """
        given = os.environ.get("ANSIBLE_COLLECTIONS_PATH")
        rest = given.split(os.pathsep) if given else list(DEFAULT_COLLECTIONS_PATHS)
        paths = [str(self.collections_path), *(p for p in rest if p and p != str(self.collections_path))]
        return {"ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(paths)}


def dependencies(coll: Collection) -> list[str]:
    """The collections gpufleet.serving needs (galaxy.yml's dependencies)."""
    import yaml

    return sorted((yaml.safe_load((coll.root / "galaxy.yml").read_text()) or {}).get("dependencies") or {})


def missing_dependencies(coll: Collection, collections_path: str, search: list[str] | None = None) -> list[str]:
    """The needed collections that Ansible would not find: not under any entry of the
    collections path, nor under sys.path (where PyPI's `ansible` package puts them; Ansible
    scans sys.path too)."""
    roots = [p for p in collections_path.split(os.pathsep) if p] + list(sys.path if search is None else search)
    missing = []
    for name in dependencies(coll):
        namespace, collection = name.split(".", 1)
        if not any(
            (Path(root).expanduser() / "ansible_collections" / namespace / collection).is_dir() for root in roots
        ):
            missing.append(name)
    return missing


def _is_collection(folder: Path) -> bool:
    return (folder / "galaxy.yml").is_file() and (folder / "plugins").is_dir()


def locate_collection() -> Collection:
    """The copy of gpufleet.serving in use: the checkout first, then the installed one."""
    here = Path(__file__).resolve()
    checkout = here.parents[2]
    if here.parents[1].name == "src" and _is_collection(checkout):
        linked = checkout / "collections"
        if not _is_collection(linked.joinpath(*NAME)):
            raise CollectionNotFoundError(
                "%s is missing; it is a link to the checkout's root (ln -s ../../.. %s)"
                % (linked.joinpath(*NAME), linked.joinpath(*NAME))
            )
        return Collection(root=checkout, collections_path=linked, packaged=False)
    packaged = here.parent / "collection"
    if _is_collection(packaged.joinpath(*NAME)):
        return Collection(root=packaged.joinpath(*NAME), collections_path=packaged, packaged=True)
    raise CollectionNotFoundError(
        "gpufleet.serving not found next to the CLI (looked in %s and %s); reinstall gpufleet "
        "(`pip install .` from a checkout or `pip install -e .` for development)" % (checkout, packaged.joinpath(*NAME))
    )


def collection_root() -> Path:
    """The folder holding galaxy.yml of gpufleet.serving (a checkout's root, or the installed copy)."""
    return locate_collection().root


def collections_path() -> Path:
    """A folder that contains ansible_collections/gpufleet/serving."""
    return locate_collection().collections_path


def ensure_importable() -> None:
    path = str(collections_path())
    if path not in sys.path:
        sys.path.insert(0, path)


def install_collection(target: str | None = None, force: bool = False, deps: bool = True) -> int:
    """`gpufleet collection install`: build the carried gpufleet.serving and install it with
    ansible-galaxy (into `target`, or the first entry of Ansible's collections path), so plain
    ansible-playbook and ansible-doc find it; with its community collections from Galaxy
    unless deps is False (they come from pip's `gpufleet[collections]`). Returns
    ansible-galaxy's exit status."""
    import subprocess
    import tempfile

    coll = locate_collection()
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    command = str(galaxy) if galaxy.is_file() else "ansible-galaxy"
    with tempfile.TemporaryDirectory(prefix="gpufleet-collection-") as out:
        built = subprocess.run(
            [command, "collection", "build", "--output-path", out, str(coll.root)],
            capture_output=True,
            text=True,
            check=False,
        )
        tarballs = sorted(Path(out).glob("gpufleet-serving-*.tar.gz"))
        if built.returncode != 0 or not tarballs:
            sys.stderr.write(built.stdout + built.stderr)
            print("gpufleet collection install: building %s failed" % coll.root, file=sys.stderr)
            return built.returncode or 1
        argv = [command, "collection", "install", str(tarballs[0])] + ([] if deps else ["--no-deps"])
        if target:
            argv += ["-p", str(Path(target).expanduser())]
        if force:
            argv.append("--force")
        return subprocess.run(argv, check=False).returncode
