"""Role docs rendered from meta/argument_specs.yml by tools/roledocs.py (a development tool, in
neither the wheel nor the collection tarball), and the --check that keeps them in sync."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

TOOL = ROOT / "tools" / "roledocs.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("roledocs", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


roledocs = _load_tool()

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def spec_of(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def rows(page: str) -> dict[str, list[str]]:
    """Table rows of a rendered page by option name (the first cell, backticks stripped)."""
    found = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in CELL_SPLIT.split(line)[1:-1]]
            assert len(cells) == 6, line
            found[cells[0].strip("`")] = cells
    return found


def page_of(root: Path, role: str) -> str:
    collection = roledocs.collection_name(root)
    (spec,) = [r for r in roledocs.load_roles(root) if r.name == role]
    return roledocs.render_role_page(spec, collection)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the generator reads and writes: role specs, galaxy.yml, README.md, docs/."""
    for spec in (ROOT / "roles").glob("*/meta/argument_specs.yml"):
        target = tmp_path / spec.relative_to(ROOT)
        target.parent.mkdir(parents=True)
        shutil.copyfile(spec, target)
    for name in ("galaxy.yml", "README.md"):
        shutil.copyfile(ROOT / name, tmp_path / name)
    if (ROOT / "docs").is_dir():
        shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def add_role(root: Path, name: str, entry_points: dict) -> None:
    path = root / "roles" / name / "meta" / "argument_specs.yml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"argument_specs": entry_points}, sort_keys=False))


def test_every_role_gets_a_page(tree):
    assert roledocs.main(["--root", str(tree)]) == 0
    pages = sorted(p.stem for p in (tree / "docs" / "roles").glob("*.md"))
    assert pages == ROLES
    readme = (tree / "README.md").read_text()
    for role in ROLES:
        page = (tree / "docs" / "roles" / ("%s.md" % role)).read_text()
        header = "<!-- Generated from roles/%s/meta/argument_specs.yml by `%s`" % (role, roledocs.COMMAND)
        assert page.startswith(header)
        assert "do not edit by hand" in page.splitlines()[0]
        assert page.endswith("\n") and not page.endswith("\n\n")
        assert "](docs/roles/%s.md)" % role in readme


def test_every_entry_point_and_option_is_documented():
    for role in ROLES:
        page = page_of(ROOT, role)
        found = rows(page)
        for entry, spec in spec_of(role).items():
            assert "## Entry point `%s`" % entry in page
            for option in spec.get("options") or {}:
                assert option in found, (role, entry, option)


@pytest.mark.parametrize(
    ("role", "option"),
    [
        ("proxy", "proxy_rate_limit"),
        ("proxy", "proxy_rate_burst"),
        ("proxy", "proxy_endpoints"),
        ("nccl", "nccl_env_file"),
    ],
)
def test_known_option_has_its_type_default_and_description(role, option):
    spec = spec_of(role)["main"]["options"][option]
    name, kind, required, default, _choices, description = rows(page_of(ROOT, role))[option]
    assert name == "`%s`" % option
    expected_type = spec["type"] if spec["type"] != "list" else "list of %s" % spec["elements"]
    assert kind == expected_type
    assert required == ("yes" if spec.get("required") else "no")
    if isinstance(spec["default"], list):
        assert default.strip("`") == "[%s]" % ", ".join('"%s"' % v for v in spec["default"])
    else:
        assert default.strip("`") == str(spec["default"])
    assert description == spec["description"]


def test_choices_and_required_suboptions():
    found = rows(page_of(ROOT, "engine"))
    engine = spec_of("engine")["main"]["options"]["gpufleet_engines"]["options"]
    assert found["gpufleet_engines[].engine"][4] == ", ".join("`%s`" % c for c in engine["engine"]["choices"])
    required = {name for name, spec in engine.items() if spec.get("required")}
    assert required
    for name in required:
        assert found["gpufleet_engines[].%s" % name][2] == "yes"


def test_suboptions_render_with_dotted_names_in_tables_of_their_own():
    page = page_of(ROOT, "engine")
    found = rows(page)
    subs = spec_of("engine")["main"]["options"]["gpufleet_engines"]["options"]
    assert "### Suboptions of `gpufleet_engines[]`" in page
    for name, spec in subs.items():
        assert "gpufleet_engines[].%s" % name in found
        assert found["gpufleet_engines[].%s" % name][1].startswith(spec.get("type", "str"))
    # A suboption named like a spec key ("options") is an option, not a nested table.
    assert "gpufleet_engines[].options" in found
    assert "Suboptions of `gpufleet_engines[].options`" not in page


def test_dict_suboptions_use_plain_dots_and_nest(tree):
    add_role(
        tree,
        "zz_nested",
        {
            "main": {
                "short_description": "Nested",
                "options": {
                    "zz_nested_server": {
                        "type": "dict",
                        "description": "A server.",
                        "options": {
                            "listen": {
                                "type": "list",
                                "elements": "dict",
                                "description": "Listeners.",
                                "options": {"port": {"type": "int", "required": True, "description": "Port."}},
                            }
                        },
                    }
                },
            }
        },
    )
    page = page_of(tree, "zz_nested")
    found = rows(page)
    assert found["zz_nested_server.listen"][1] == "list of dict"
    assert found["zz_nested_server.listen[].port"][1:3] == ["int", "yes"]
    assert page.index("Suboptions of `zz_nested_server`") < page.index("Suboptions of `zz_nested_server.listen[]`")


def test_pipes_and_newlines_in_cells_are_escaped(tree):
    add_role(
        tree,
        "zz_pipes",
        {
            "main": {
                "short_description": "Pipes | everywhere",
                "options": {
                    "zz_pipes_mode": {
                        "type": "str",
                        "description": ["One of a|b.", "Second paragraph\nwith a line break."],
                        "choices": ["a|b", "c"],
                        "default": "a|b",
                    }
                },
            }
        },
    )
    page = page_of(tree, "zz_pipes")
    _name, _kind, _req, default, choices, description = rows(page)["zz_pipes_mode"]
    assert default == r"`a\|b`"
    assert choices == r"`a\|b`, `c`"
    assert description == r"One of a\|b.<br>Second paragraph<br>with a line break."
    assert roledocs.main(["--root", str(tree)]) == 0
    (row,) = [line for line in (tree / "README.md").read_text().splitlines() if "zz_pipes.md" in line]
    assert r"Pipes \| everywhere" in row
    assert len(CELL_SPLIT.split(row)) == 5


def test_ansible_markup_becomes_markdown():
    assert roledocs._markup("C(a) O(b_c) I(d) B(e) L(f,https://g) NCCL_*") == (
        r"`a` `b_c` *d* **e** [f](https://g) NCCL\_\*"
    )


def test_check_fails_naming_the_stale_file_and_writes_nothing(tree, capsys):
    assert roledocs.main(["--root", str(tree)]) == 0
    assert roledocs.main(["--root", str(tree), "--check"]) == 0
    page = tree / "docs" / "roles" / "engine.md"
    edited = page.read_text().replace("Engine instances on this host.", "Hand-edited.")
    page.write_text(edited)
    capsys.readouterr()
    assert roledocs.main(["--root", str(tree), "--check"]) == 1
    out = capsys.readouterr().out
    assert "docs/roles/engine.md: out of date" in out
    assert roledocs.COMMAND in out
    assert "README.md" not in out
    assert page.read_text() == edited
    assert roledocs.main(["--root", str(tree)]) == 0
    assert roledocs.main(["--root", str(tree), "--check"]) == 0


def test_check_lists_every_stale_file(tree, capsys):
    assert roledocs.main(["--root", str(tree)]) == 0
    (tree / "docs" / "roles" / "nccl.md").unlink()
    spec_file = tree / "roles" / "proxy" / "meta" / "argument_specs.yml"
    spec_file.write_text(spec_file.read_text().replace("Port clients connect to", "Port that clients use"))
    shutil.rmtree(tree / "roles" / "edge")
    capsys.readouterr()
    assert roledocs.main(["--root", str(tree), "--check"]) == 1
    out = capsys.readouterr().out
    assert "docs/roles/nccl.md: missing" in out
    assert "docs/roles/proxy.md: out of date" in out
    assert "docs/roles/edge.md: generated for a role that no longer exists" in out
    assert "README.md: out of date" in out
    assert roledocs.main(["--root", str(tree)]) == 0
    assert not (tree / "docs" / "roles" / "edge.md").exists()
    assert roledocs.main(["--root", str(tree), "--check"]) == 0


def test_the_script_checks_a_fresh_tree(tree):
    assert roledocs.COMMAND == "python tools/roledocs.py"
    subprocess.run([sys.executable, str(TOOL), "--root", str(tree)], check=True, capture_output=True)
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--root", str(tree), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_script_checks_this_checkout_by_default():
    # the checkout's own docs are what `make lint` checks: exit 0 in sync, 1 out of date, never a crash
    proc = subprocess.run([sys.executable, str(TOOL), "--check"], cwd="/", capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    assert "role docs: " in proc.stdout


OPTIONS = {"zz_same_port": {"type": "int", "default": 1, "description": "Port."}}


def test_an_entry_point_with_mains_options_says_so_instead_of_repeating_them(tree):
    add_role(
        tree,
        "zz_same",
        {
            "main": {"short_description": "Same", "options": OPTIONS},
            "preflight": {"short_description": "Checks before any change", "options": dict(OPTIONS)},
            "other": {"short_description": "Other", "options": {"zz_same_x": {"type": "str", "description": "X."}}},
        },
    )
    page = page_of(tree, "zz_same")
    preflight = page.split("## Entry point `preflight`", 1)[1].split("## Entry point", 1)[0]
    assert "Checks before any change" in preflight and "tasks_from: preflight" in preflight
    assert "Takes the same options as the `main` entry point" in preflight and "| option |" not in preflight
    assert page.count("| `zz_same_port` |") == 1
    assert "| `zz_same_x` |" in page.split("## Entry point `other`", 1)[1]  # other options: their own table


def test_the_preflight_entry_points_of_the_roles_are_documented_once():
    for role in ROLES:
        entry_points = spec_of(role)
        if "preflight" not in entry_points or "main" not in entry_points:
            continue
        page = page_of(ROOT, role)
        same = entry_points["preflight"].get("options") == entry_points["main"].get("options")
        assert ("Takes the same options as the `main` entry point" in page) == same, role


def test_a_role_without_main_gets_a_page_and_a_line_not_a_row(tree):
    add_role(
        tree,
        "zz_shared",
        {"check": {"short_description": "A shared check", "options": {}}},
    )
    assert roledocs.main(["--root", str(tree)]) == 0
    page = (tree / "docs" / "roles" / "zz_shared.md").read_text()
    assert "## Entry point `check`" in page and "tasks_from: check" in page
    block = (tree / "README.md").read_text().split(roledocs.TABLE_START, 1)[1].split(roledocs.TABLE_END, 1)[0]
    assert "| [`gpufleet.serving.zz_shared`]" not in block
    (line,) = [x for x in block.splitlines() if "zz_shared" in x]
    assert line.startswith("Used only through their entry points") and "](docs/roles/zz_shared.md)" in line


README_WITHOUT_BLOCK = """# project

## Setup

```yaml
## Tests in a code block are not a heading
```

## Tests

Run them.
"""


def test_readme_section_is_added_before_the_tests_section_then_replaced_in_place():
    block = "%s\ntable one\n%s" % (roledocs.TABLE_START, roledocs.TABLE_END)
    added = roledocs.update_readme(README_WITHOUT_BLOCK, block)
    section = "%s\n\n%s\n\n" % (roledocs.SECTION_TITLE, block)
    assert added.replace(section, "") == README_WITHOUT_BLOCK
    assert added.index(roledocs.SECTION_TITLE) > added.index("## Tests in a code block")
    assert added.index(roledocs.SECTION_TITLE) < added.index("## Tests\n")
    again = roledocs.update_readme(added, block.replace("one", "two"))
    assert again == added.replace("table one", "table two")


def test_readme_with_one_marker_is_refused():
    with pytest.raises(roledocs.RoleDocsError, match="exactly one of each"):
        roledocs.update_readme("x\n%s\n" % roledocs.TABLE_START, "block")


def test_main_variables_are_required_options_then_spec_order():
    spec = roledocs.RoleSpec(
        name="r",
        spec_path=Path("roles/r/meta/argument_specs.yml"),
        entry_points={"main": {"options": {"r_%d" % i: {"required": i in (7, 9)} for i in range(10)}}},
    )
    assert roledocs.main_variables(spec) == ["r_0", "r_1", "r_2", "r_3", "r_7", "r_9"]
