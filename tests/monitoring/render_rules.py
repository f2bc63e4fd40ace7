"""Render the monitoring role's rules template the way its template task does, for promtool.

    python tests/monitoring/render_rules.py OUTPUT      e.g. /tmp/rules/gpufleet-rules.yml

Values: roles/monitoring/defaults/main.yml (the documented thresholds), the XID codes that
mean drain (``DRAIN_XIDS`` of plugins/module_utils/_gpu_health.py, the list the watchdog
quarantines on), as ``__monitoring_drain_xids``, and each engine's series from the engine
registry (``engine_series()`` of plugins/module_utils/_engine_options.py, what the
engine_series filter gives the role), as ``__monitoring_engines``. Jinja2 with the options of Ansible's template
module (trim_blocks on, strict undefined), no filter beyond Jinja's own.

The promtool unit tests (tests/monitoring/*.test.yml) name the rules file ``gpufleet-rules.yml``
beside themselves; to run them by hand:

    d=$(mktemp -d) && python tests/monitoring/render_rules.py $d/gpufleet-rules.yml &&
      cp tests/monitoring/*.test.yml $d && "$(tests/promtools.sh)"/promtool test rules $d/*.test.yml
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles" / "monitoring" / "templates" / "gpufleet-rules.yml.j2"
DEFAULTS = ROOT / "roles" / "monitoring" / "defaults" / "main.yml"
GPU_HEALTH = ROOT / "plugins" / "module_utils" / "_gpu_health.py"
# Used only until plugins/module_utils/_gpu_health.py (the canonical list) exists.
FALLBACK_DRAIN_XIDS = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120]


def drain_xids() -> list[int]:
    """The XID codes that mean drain: the watchdog's list where it is present."""
    if not GPU_HEALTH.is_file():
        return list(FALLBACK_DRAIN_XIDS)
    spec = importlib.util.spec_from_file_location("_gpufleet_gpu_health", GPU_HEALTH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(int(x) for x in module.DRAIN_XIDS)


def engine_series() -> list[dict]:
    """Each engine's series, from the engine registry (the collection made importable as the CLI does)."""
    sys.path.insert(0, str(ROOT / "src"))
    from gpufleet._collection import ensure_importable

    ensure_importable()
    from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import engine_series as series

    return series()


def variables() -> dict[str, Any]:
    values = yaml.safe_load(DEFAULTS.read_text())
    values["ansible_managed"] = "Ansible managed: rendered by tests/monitoring/render_rules.py"
    values["__monitoring_drain_xids"] = drain_xids()
    values["__monitoring_engines"] = engine_series()
    return values


def render(extra: dict[str, Any] | None = None) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)),
        trim_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    return env.get_template(TEMPLATE.name).render({**variables(), **(extra or {})})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the rendered rules file to write")
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render())
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
