"""Find the gpufleet.serving collection that this CLI drives and make it importable.

The CLI has no logic of its own that the collection already has: parsers and the planner
are imported from the collection's module_utils, so both always agree.
"""

from __future__ import annotations

import sys
from pathlib import Path


class CollectionNotFoundError(RuntimeError):
    pass


def collection_root() -> Path:
    """The folder holding galaxy.yml of gpufleet.serving (a checkout's root)."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2], here.parent / "collection"):
        if (candidate / "galaxy.yml").is_file() and (candidate / "plugins").is_dir():
            return candidate
    raise CollectionNotFoundError(
        "gpufleet.serving not found next to the CLI (looked in %s); run gpufleet from a checkout "
        "installed with `pip install -e .`" % here.parents[2]
    )


def collections_path() -> Path:
    """A folder that contains ansible_collections/gpufleet/serving."""
    root = collection_root()
    linked = root / "collections"
    if (linked / "ansible_collections" / "gpufleet" / "serving" / "galaxy.yml").is_file():
        return linked
    raise CollectionNotFoundError("%s/ansible_collections/gpufleet/serving is missing" % linked)


def ensure_importable() -> None:
    path = str(collections_path())
    if path not in sys.path:
        sys.path.insert(0, path)
