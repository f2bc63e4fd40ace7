"""The map of the tree in docs/architecture.md, generated from the tree (a development tool).

    python tools/archmap.py            rewrite the map between its markers
    python tools/archmap.py --check    write nothing; exit 1 when the map is out of date

One row per role (its entry points and the short_description of its first one, from
meta/argument_specs.yml), module (DOCUMENTATION's short_description), filter (its sidecar's),
module_utils file and CLI file (the first line of its docstring), playbook (the first line
of its header comment) and command script (the first line of its header). A piece added,
removed or renamed without the map changing fails `make lint`, so the map cannot go stale.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
START = "<!-- map:start (python tools/archmap.py writes this part) -->"
END = "<!-- map:end -->"
# The Python scripts installed as commands, beside their roles or the lab (no .py extension).
SCRIPT_FOLDERS = ("roles/*/files", "tests/lab")


def _first_sentence(text: str) -> str:
    line = " ".join(text.strip().split("\n\n")[0].split())
    line = re.sub(r"^gpufleet[a-z ]*: ", "", line)  # a script's "gpufleet: ..." label
    match = re.match(r"(.*?[a-z)\]`](?<!e\.g)(?<!i\.e))\.(?:\s|$)", line)
    return (match.group(1) if match else line.rstrip(".")).replace("|", "\\|")


def _docstring(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return _first_sentence(doc) if doc else ""


def _header_comment(path: Path) -> str:
    """The first paragraph of a file's leading comment (after a shebang or `---`)."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("#!") or line.strip() == "---" or (not lines and line.startswith("# -*-")):
            continue
        if line.startswith("#"):
            text = line.lstrip("#").strip()
            if not text and lines:
                break
            if text:
                lines.append(text)
        else:
            break
    return _first_sentence(" ".join(lines))


def _script_summary(path: Path) -> str:
    text = path.read_text()
    try:
        doc = ast.get_docstring(ast.parse(text))
    except SyntaxError:
        doc = None
    return _first_sentence(doc) if doc else _header_comment(path)


def roles() -> list:
    rows = []
    for spec in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        name = spec.parents[1].name
        points = yaml.safe_load(spec.read_text())["argument_specs"]
        first = points.get("main") or next(iter(points.values()))
        rows.append(("`%s`" % name, ", ".join(points), _first_sentence(first.get("short_description", ""))))
    return rows


def modules() -> list:
    rows = []
    for path in sorted(ROOT.glob("plugins/modules/*.py")):
        match = re.search(r"DOCUMENTATION\s*=\s*r?(['\"]{3})(.*?)\1", path.read_text(), re.S)
        doc = yaml.safe_load(match.group(2)) if match else {}
        rows.append(("`%s`" % path.stem, "plugins/modules/%s" % path.name, _first_sentence(doc["short_description"])))
    return rows


def filters() -> list:
    rows = []
    for path in sorted(ROOT.glob("plugins/filter/*.yml")):
        doc = yaml.safe_load(path.read_text())["DOCUMENTATION"]
        source = _filter_source(doc["name"])
        rows.append(("`%s`" % doc["name"], source, _first_sentence(doc["short_description"])))
    return rows


def _filter_source(name: str) -> str:
    for path in sorted(ROOT.glob("plugins/filter/*.py")):
        if re.search(r"['\"]%s['\"]\s*:" % re.escape(name), path.read_text()):
            return "plugins/filter/%s" % path.name
    raise SystemExit("archmap: no plugins/filter/*.py maps the filter %r" % name)


def python_files(folder: str) -> list:
    return [
        ("`%s`" % p.name, "%s/%s" % (folder, p.name), _docstring(p))
        for p in sorted((ROOT / folder).glob("*.py"))
        if p.name != "__init__.py"
    ]


def playbooks() -> list:
    return [
        ("`%s`" % p.relative_to(ROOT), _header_comment(p))
        for p in sorted((ROOT / "playbooks").rglob("*.yml"))
        if "vars" not in p.relative_to(ROOT / "playbooks").parts
    ]


def scripts() -> list:
    rows = []
    for pattern in SCRIPT_FOLDERS:
        for path in sorted(ROOT.glob(pattern + "/*")):
            if path.is_file() and "." not in path.name and path.read_bytes()[:2] == b"#!":
                rows.append(("`%s`" % path.name, str(path.relative_to(ROOT)), _script_summary(path)))
    return rows


def _table(title: str, head: tuple, rows: list) -> list:
    out = ["### %s (%d)" % (title, len(rows)), "", "| %s |" % " | ".join(head), "|" + "---|" * len(head)]
    out += ["| %s |" % " | ".join(cell or "-" for cell in row) for row in rows]
    return [*out, ""]


def render() -> str:
    parts = [START, ""]
    parts += _table("Roles", ("role", "entry points", "what it does"), roles())
    parts += _table("Modules", ("module", "file", "what it does"), modules())
    parts += _table("Filters", ("filter", "file", "what it returns"), filters())
    parts += _table(
        "module_utils: the logic behind them", ("file", "path", "what it holds"), python_files("plugins/module_utils")
    )
    parts += _table("Playbooks", ("playbook", "what it does"), playbooks())
    parts += _table("Commands installed on hosts and lab hosts", ("script", "path", "what it does"), scripts())
    parts += _table("The CLI", ("file", "path", "what it holds"), python_files("src/gpufleet"))
    return "\n".join([*parts, END])


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the map is out of date")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    if START not in text or END not in text:
        print("archmap: %s has no map markers (%s ... %s)" % (_shown(DOC), START, END), file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    new = head + render() + tail
    if new == text:
        return 0
    if args.check:
        print(
            "archmap: the map in %s is out of date; run: python tools/archmap.py" % _shown(DOC),
            file=sys.stderr,
        )
        return 1
    DOC.write_text(new)
    print("archmap: wrote the map in %s" % _shown(DOC))
    return 0


if __name__ == "__main__":
    sys.exit(main())
