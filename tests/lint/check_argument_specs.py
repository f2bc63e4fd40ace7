#!/usr/bin/env python3
"""Every role's defaults/main.yml and meta/argument_specs.yml must list the same variables.

argument_specs' `default:` is documentation only (Ansible does not apply it), so a key in
one file and not the other, or a documented default that differs from the real one, is a
lie in the docs. Every optional variable documents its default, except one whose value is
deliberately written only in defaults/main.yml (pinned images, say): its description says
so by naming defaults/main.yml. Exit 1 with one line per problem.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# How a description says the default is written only in defaults/main.yml.
DEFAULT_ELSEWHERE = "defaults/main.yml"


def check_role(role: Path) -> list[str]:
    problems = []
    defaults_file = role / "defaults" / "main.yml"
    specs_file = role / "meta" / "argument_specs.yml"
    if not specs_file.is_file():
        return ["%s: meta/argument_specs.yml is missing" % role.name]
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.is_file() else {}
    defaults = defaults or {}
    specs = yaml.safe_load(specs_file.read_text())["argument_specs"]
    # A role used only through its entry points (tasks_from: the common role) has no main: its
    # inputs are the union of every entry point's.
    if "main" in specs:
        options = (specs.get("main") or {}).get("options") or {}
    else:
        options = {k: v for entry in specs.values() for k, v in ((entry or {}).get("options") or {}).items()}
    public_defaults = {k: v for k, v in defaults.items() if not k.startswith("_")}
    for key in sorted(set(public_defaults) - set(options)):
        problems.append("%s: %s is in defaults/main.yml but not in meta/argument_specs.yml" % (role.name, key))
    for key, spec in sorted(options.items()):
        if not key.startswith((role.name.lstrip("_") + "_", "gpufleet_")):
            problems.append("%s: option %s starts with neither %s_ nor gpufleet_" % (role.name, key, role.name))
        if spec.get("required"):
            if key in public_defaults:
                problems.append("%s: %s is required but has a default in defaults/main.yml" % (role.name, key))
            continue
        if key not in public_defaults:
            problems.append("%s: %s is in meta/argument_specs.yml but not in defaults/main.yml" % (role.name, key))
            continue
        if not spec.get("description"):
            problems.append("%s: %s has no description" % (role.name, key))
        if "default" not in spec:
            if DEFAULT_ELSEWHERE not in _text(spec.get("description")):
                problems.append(
                    "%s: %s documents no default; give it, or say in its description that %s holds it"
                    % (role.name, key, DEFAULT_ELSEWHERE)
                )
        elif spec["default"] != public_defaults[key]:
            problems.append(
                "%s: %s documented default %r differs from defaults/main.yml %r"
                % (role.name, key, spec["default"], public_defaults[key])
            )
    return problems


def _text(description) -> str:
    return " ".join(description) if isinstance(description, list) else str(description or "")


def main() -> int:
    roles = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
    problems = [line for role in roles for line in check_role(role)]
    for line in problems:
        print(line)
    print("argument_specs check: %d roles, %d problems" % (len(roles), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
