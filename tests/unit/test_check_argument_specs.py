"""tests/lint/check_argument_specs.py: defaults/main.yml and meta/argument_specs.yml agree,
and a default is left out of the docs only where the description says defaults/main.yml
holds it."""

from __future__ import annotations

import importlib.util

import yaml
from conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "check_argument_specs", ROOT / "tests" / "lint" / "check_argument_specs.py"
)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def _role(tmp_path, defaults, options):
    role = tmp_path / "demo"
    (role / "defaults").mkdir(parents=True, exist_ok=True)
    (role / "meta").mkdir(exist_ok=True)
    (role / "defaults" / "main.yml").write_text(yaml.safe_dump(defaults))
    specs = {"argument_specs": {"main": {"short_description": "x", "options": options}}}
    (role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump(specs))
    return role


def test_the_repositorys_roles_pass():
    roles = [p for p in (ROOT / "roles").iterdir() if p.is_dir()]
    assert [line for role in roles for line in check.check_role(role)] == []


def test_a_default_left_out_must_say_where_it_is(tmp_path):
    images = {"a": "img:1"}
    silent = _role(tmp_path, {"demo_images": images}, {"demo_images": {"type": "dict", "description": "Images."}})
    (problem,) = check.check_role(silent)
    assert "demo_images documents no default" in problem
    said = _role(
        tmp_path,
        {"demo_images": images},
        {"demo_images": {"type": "dict", "description": "Images; default: the pins in defaults/main.yml."}},
    )
    assert check.check_role(said) == []


def test_the_other_checks_stay_strict(tmp_path):
    role = _role(
        tmp_path,
        {"demo_port": 80, "demo_extra": 1},
        {
            "demo_port": {"type": "int", "default": 8080, "description": "Port."},
            "demo_missing": {"type": "int", "default": 1, "description": "Not in defaults."},
            "other_name": {"type": "int", "required": True, "description": "Badly named."},
            "demo_bare": {"type": "int", "default": 1},
        },
    )
    (role / "defaults" / "main.yml").write_text(yaml.safe_dump({"demo_port": 80, "demo_extra": 1, "demo_bare": 1}))
    text = "\n".join(check.check_role(role))
    assert "demo_extra is in defaults/main.yml but not in meta/argument_specs.yml" in text
    assert "demo_port documented default 8080 differs from defaults/main.yml 80" in text
    assert "demo_missing is in meta/argument_specs.yml but not in defaults/main.yml" in text
    assert "option other_name starts with neither demo_ nor gpufleet_" in text
    assert "demo_bare has no description" in text
