"""Lab-tier tests: need the Docker engine and the lab images (tests/lab/harness.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
HARNESS = ROOT / "tests" / "lab" / "harness.sh"


@pytest.fixture(scope="session")
def vllm_image():
    return subprocess.run([HARNESS, "image", "vllm-cpu"], check=True, capture_output=True, text=True).stdout.strip()
