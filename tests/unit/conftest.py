"""Shared helpers for unit tests: the collection resolves in place, fixtures are real captures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"
sys.path.insert(0, str(ROOT / "collections"))
sys.path.insert(0, str(ROOT / "src"))


def read_fixture(machine: str, name: str) -> str | None:
    """A captured output with its '#~ ' provenance header removed (None if not captured)."""
    path = FIXTURES / machine / name
    if not path.is_file():
        return None
    return "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#~ "))


@pytest.fixture
def fixture_text():
    return read_fixture
