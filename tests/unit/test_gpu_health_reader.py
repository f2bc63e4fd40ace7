"""The health reader ships inside the gpu_health_reader module's payload (the way Ansible ships
shared code), and stands alone on the host beside the watchdog."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from ansible_collections.gpufleet.serving.plugins.modules.gpu_health_reader import reader_source

ROOT = Path(__file__).resolve().parents[2]
READER = ROOT / "plugins" / "module_utils" / "_gpu_health.py"


def test_the_module_writes_the_collection_s_reader_byte_for_byte():
    assert reader_source() == READER.read_bytes()


def test_the_reader_needs_nothing_but_the_standard_library():
    # the watchdog imports it as one file, with the host's python3
    names = set()
    for node in ast.walk(ast.parse(READER.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    assert names and names <= set(sys.stdlib_module_names)
