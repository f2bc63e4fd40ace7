"""docs/architecture.md's map is the tree's: tools/archmap.py --check (in make lint) passes on
the checkout, names every role, module and filter, and fails once the map and the tree part."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _archmap():
    spec = importlib.util.spec_from_file_location("archmap", ROOT / "tools" / "archmap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_map_names_every_piece_of_the_tree():
    archmap = _archmap()
    assert archmap.main(["--check"]) == 0
    text = archmap.render()
    for role in (ROOT / "roles").iterdir():
        assert "| `%s` |" % role.name in text
    for module in (ROOT / "plugins" / "modules").glob("*.py"):
        assert "plugins/modules/%s" % module.name in text
    for sidecar in (ROOT / "plugins" / "filter").glob("*.yml"):
        assert "| `%s` |" % sidecar.stem in text


def test_a_stale_map_fails_the_check(tmp_path, monkeypatch, capsys):
    archmap = _archmap()
    doc = tmp_path / "architecture.md"
    # a role the tree no longer has, still in the map
    doc.write_text(archmap.DOC.read_text().replace("| `nccl` |", "| `nccl` |\n| `old_role` | main | gone |", 1))
    monkeypatch.setattr(archmap, "DOC", doc)
    before = doc.read_text()
    assert archmap.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert doc.read_text() == before  # --check writes nothing
    assert archmap.main([]) == 0 and "old_role" not in doc.read_text()
