"""The engine role's settings as its preflight hands them to the engine_plan filter, read
from roles/engine/defaults/main.yml: the one place the pinned images and the container
ulimits are written."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE_DEFAULTS = yaml.safe_load((ROOT / "roles" / "engine" / "defaults" / "main.yml").read_text())


def role_defaults(**over) -> dict:
    """defaults= as roles/engine/tasks/preflight.yml builds it, with `over` on top."""
    defaults = {
        "images": ROLE_DEFAULTS["engine_images"],
        "ulimits": ROLE_DEFAULTS["engine_ulimits"],
        "config_dir": ROLE_DEFAULTS["engine_config_dir"],
        "surge": ROLE_DEFAULTS["engine_surge"],
        "env_files": [ROLE_DEFAULTS["engine_nccl_env_file"]] if ROLE_DEFAULTS["engine_nccl_env_file"] else [],
        "slices": ROLE_DEFAULTS["engine_cgroup_slices"],
        "housekeeping_units": ROLE_DEFAULTS["engine_housekeeping_units"],
        "cache_dir": ROLE_DEFAULTS["engine_cache_dir"] if ROLE_DEFAULTS["engine_compile_cache"] else "",
    }
    defaults.update(over)
    return defaults
