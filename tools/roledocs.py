"""Role documentation generated from each role's meta/argument_specs.yml (a development tool).

    python tools/roledocs.py            write docs/roles/<role>.md and README.md's roles table
    python tools/roledocs.py --check    write nothing; exit 1 naming every file out of date

meta/argument_specs.yml is the one place a role's inputs are described (Ansible validates
them against it), so the Markdown is rendered from it and never edited by hand: one page per
role with a table of options per entry point (suboptions in tables of their own, with dotted
names such as ``gpufleet_engines[].port``), and a summary table in README.md between
``<!-- roles-table:start -->`` and ``<!-- roles-table:end -->``. An entry point with the same
options as ``main`` (a role's ``preflight``) says so instead of repeating the tables. A role
without ``main`` (one used only through ``tasks_from``) gets a page, and a line under the
README table rather than a row. Output follows spec order, so the same specs always give the
same bytes.

It needs only Python and PyYAML, and ships in neither the gpufleet wheel nor the collection
tarball. antsibull-docs, the ecosystem's generator, renders reStructuredText (with HTML
tables) for a Sphinx docsite, not Markdown pages or a README table for GitHub, so it does not
replace this file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

COMMAND = "python tools/roledocs.py"
DOCS_DIR = Path("docs") / "roles"
README = Path("README.md")
TABLE_START = "<!-- roles-table:start -->"
TABLE_END = "<!-- roles-table:end -->"
SECTION_TITLE = "## Roles and their main variables"
# Main variables in the README table: every required option, then others in spec order up to this many.
MAIN_VARIABLES = 6
GENERATED_MARK = "by `%s`; do not edit by hand." % COMMAND

# Ansible's documentation markup (C(), O(), I() ...), and backtick spans an author wrote, which stay as they are.
_MARKUP = re.compile(r"(`[^`]*`)|\b([BCEIMOUV])\(([^()]*)\)|\bL\(([^(),]*),\s*([^()]*)\)")
# Plain-text characters Markdown would read as emphasis or an HTML tag (an underscore only outside a word).
_ACTIVE = re.compile(r"\*|(?<!\w)_|_(?!\w)|<(?=[A-Za-z/!?])")
_CONSTRAINTS = ("mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by")


class RoleDocsError(Exception):
    """A spec or README that cannot be rendered; the message says what to fix."""


@dataclass(frozen=True)
class RoleSpec:
    name: str
    spec_path: Path  # relative to the root
    entry_points: dict[str, dict[str, Any]]

    @property
    def main(self) -> dict[str, Any]:
        return self.entry_points.get("main") or next(iter(self.entry_points.values()), {})

    @property
    def has_main(self) -> bool:
        """Whether `roles:` can run the role (it has a `main` entry point)."""
        return "main" in self.entry_points

    def same_as_main(self, name: str) -> bool:
        """Whether entry point `name` (not main) takes exactly main's options (e.g. a YAML alias)."""
        if name == "main" or not self.has_main:
            return False
        options = self.entry_points[name].get("options") or {}
        return bool(options) and options == (self.entry_points["main"].get("options") or {})


@dataclass(frozen=True)
class OptionTable:
    """One table of options: an entry point's own, or the suboptions of one option."""

    title: str | None  # None for the entry point's own table
    prefix: str  # prepended to each option's name: "" or "gpufleet_engines[]."
    options: dict[str, dict[str, Any]]


# --- loading -------------------------------------------------------------------------------


def collection_name(root: Path) -> str:
    """namespace.name of the collection at root (from galaxy.yml)."""
    galaxy = root / "galaxy.yml"
    if not galaxy.is_file():
        raise RoleDocsError("%s is missing; --root must be the collection's root folder" % galaxy)
    data = yaml.safe_load(galaxy.read_text(encoding="utf-8")) or {}
    return "%s.%s" % (data["namespace"], data["name"])


def load_roles(root: Path) -> list[RoleSpec]:
    """Every role under root/roles that has meta/argument_specs.yml, sorted by name."""
    roles = []
    for spec_file in sorted((root / "roles").glob("*/meta/argument_specs.yml")):
        rel = spec_file.relative_to(root)
        data = yaml.safe_load(spec_file.read_text(encoding="utf-8"))
        entry_points = data.get("argument_specs") if isinstance(data, dict) else None
        if not isinstance(entry_points, dict) or not entry_points:
            raise RoleDocsError("%s: needs a top-level argument_specs mapping with at least `main`" % rel)
        for name, entry in entry_points.items():
            if not isinstance(entry, dict):
                raise RoleDocsError("%s: entry point %s must be a mapping" % (rel, name))
            options = entry.get("options") or {}
            if not isinstance(options, dict):
                raise RoleDocsError("%s: %s.options must be a mapping of option names" % (rel, name))
        roles.append(RoleSpec(name=spec_file.parents[1].name, spec_path=rel, entry_points=entry_points))
    return roles


# --- text and cells ------------------------------------------------------------------------


def _markup(text: str) -> str:
    """Ansible markup to Markdown (C(x) O(x) V(x) E(x) M(x) -> `x`, I(x) -> *x*, B(x) -> **x**, L(t,u) -> [t](u));
    the rest is plain text, escaped where Markdown would read it as emphasis or HTML."""
    out, last = [], 0
    for match in _MARKUP.finditer(text):
        out.append(_plain(text[last : match.start()]))
        last = match.end()
        written, kind, inner, link_text, url = match.groups()
        if written is not None:
            out.append(written)
        elif link_text is not None:
            out.append("[%s](%s)" % (_plain(link_text), url.strip()))
        elif kind == "I":
            out.append("*%s*" % _plain(inner))
        elif kind == "B":
            out.append("**%s**" % _plain(inner))
        elif kind == "U":
            out.append("<%s>" % inner)
        else:
            out.append(_code(inner))
    out.append(_plain(text[last:]))
    return "".join(out)


def _plain(text: str) -> str:
    return _ACTIVE.sub(lambda m: "&lt;" if m.group() == "<" else "\\" + m.group(), text)


def _paragraphs(description: Any) -> list[str]:
    """A spec description (a string or a list of strings) as paragraphs of Markdown."""
    if description is None:
        return []
    items = description if isinstance(description, list) else [description]
    return [_markup(str(item).strip()) for item in items if str(item).strip()]


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return "%s%s%s%s%s" % (fence, pad, text, pad, fence)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, line breaks as <br>."""
    text = text.strip().replace("\r\n", "\n").replace("|", "\\|")
    return "<br>".join(line.strip() for line in text.split("\n"))


def _value(value: Any) -> str:
    """A default or choice as inline code: strings bare (empty as ""), everything else as YAML/JSON."""
    if isinstance(value, str):
        return _code(value) if value else _code('""')
    return _code(json.dumps(value, ensure_ascii=False))


def _type(spec: Mapping[str, Any]) -> str:
    kind = str(spec.get("type") or "str")
    if kind == "list" and spec.get("elements"):
        return "list of %s" % spec["elements"]
    return kind


def _row(cells: list[str]) -> str:
    return "| %s |" % " | ".join(_cell(c) for c in cells)


# --- option tables -------------------------------------------------------------------------


def _tables(options: dict[str, dict[str, Any]], prefix: str = "") -> Iterator[OptionTable]:
    """The table of these options, then (depth first, in spec order) one per option with suboptions."""
    yield OptionTable(title=prefix.rstrip(".") or None, prefix=prefix, options=options)
    for name, spec in options.items():
        sub = (spec or {}).get("options")
        if sub:
            sep = "[]." if (spec or {}).get("type") == "list" else "."
            yield from _tables(sub, prefix + name + sep)


def _option_row(name: str, spec: dict[str, Any] | None) -> str:
    spec = spec or {}
    description = "<br>".join(_paragraphs(spec.get("description")))
    aliases = spec.get("aliases") or []
    if aliases:
        description += " Aliases: %s." % ", ".join(_code(str(a)) for a in aliases)
    if spec.get("no_log"):
        description += " Secret: kept out of output (`no_log`)."
    for line in _constraint_lines(spec):
        description += " %s" % line
    return _row(
        [
            _code(name),
            _type(spec),
            "yes" if spec.get("required") else "no",
            _value(spec["default"]) if "default" in spec else "",
            ", ".join(_value(c) for c in spec.get("choices") or []),
            description.strip(),
        ]
    )


def _constraint_lines(spec: Mapping[str, Any]) -> list[str]:
    """Cross-option rules (mutually_exclusive, required_if ...) in words, when a spec has them."""
    lines = []
    for key in _CONSTRAINTS:
        for rule in spec.get(key) or []:
            if isinstance(rule, Mapping):
                rule = ["%s: %s" % (k, v) for k, v in rule.items()]
            text = ", ".join(str(r) for r in rule) if isinstance(rule, list | tuple) else str(rule)
            lines.append("%s: %s." % (key.replace("_", " ").capitalize(), text))
    return lines


def _render_table(table: OptionTable, heading: str) -> list[str]:
    out = []
    if table.title:
        out += ["%s Suboptions of %s" % (heading, _code(table.title)), ""]
    out += [
        "| option | type | required | default | choices | description |",
        "|---|---|---|---|---|---|",
    ]
    out += [_option_row(table.prefix + name, spec) for name, spec in table.options.items()]
    out.append("")
    return out


# --- pages ---------------------------------------------------------------------------------


def render_role_page(role: RoleSpec, collection: str) -> str:
    """docs/roles/<role>.md for one role."""
    out = [
        "<!-- Generated from %s %s -->" % (role.spec_path.as_posix(), GENERATED_MARK),
        "",
        "# %s" % _code("%s.%s" % (collection, role.name)),
        "",
    ]
    main = role.main
    if main.get("short_description"):
        out += [_markup(str(main["short_description"]).strip()), ""]
    for paragraph in _paragraphs(main.get("description")):
        out += [paragraph, ""]
    if len(role.entry_points) > 1:
        out += ["Entry points: %s." % ", ".join(_code(name) for name in role.entry_points), ""]
    for name, entry in role.entry_points.items():
        out += ["## Entry point %s" % _code(name), ""]
        if name == "main":
            out += ["Runs with `roles:`, `import_role` or `include_role` (no `tasks_from`).", ""]
        else:
            if entry.get("short_description"):
                out += [_markup(str(entry["short_description"]).strip()), ""]
            for paragraph in _paragraphs(entry.get("description")):
                out += [paragraph, ""]
            out += [
                "Runs with `import_role` or `include_role` and `tasks_from: %s`." % name,
                "",
            ]
        rules = _constraint_lines(entry)
        if rules:
            out += ["- %s" % line for line in rules] + [""]
        options = entry.get("options") or {}
        if not options:
            out += ["This entry point takes no options.", ""]
            continue
        if role.same_as_main(name):
            out += [
                "Takes the same options as the `main` entry point (above), and Ansible validates them against "
                "this entry point before its first task.",
                "",
            ]
            continue
        for table in _tables(options):
            out += _render_table(table, "###")
    return "\n".join(out).rstrip("\n") + "\n"


def main_variables(role: RoleSpec) -> list[str]:
    """The main entry point's required options, then the others in spec order, up to MAIN_VARIABLES."""
    options = role.main.get("options") or {}
    required = {name for name, spec in options.items() if (spec or {}).get("required")}
    budget = max(MAIN_VARIABLES - len(required), 0)
    chosen = []
    for name in options:
        if name in required:
            chosen.append(name)
        elif budget:
            chosen.append(name)
            budget -= 1
    return chosen


def render_roles_table(roles: list[RoleSpec], collection: str) -> str:
    """The README block between the markers (markers included)."""
    lines = [
        TABLE_START,
        "<!-- Generated from roles/*/meta/argument_specs.yml %s -->" % GENERATED_MARK,
        "",
        "Every option of every entry point, with types, defaults and choices, is on the role's page",
        "under [docs/roles/](docs/roles/).",
        "",
        "| role | purpose | main variables |",
        "|---|---|---|",
    ]
    for role in (r for r in roles if r.has_main):
        page = (DOCS_DIR / ("%s.md" % role.name)).as_posix()
        names = main_variables(role)
        variables = ", ".join(_code(n) for n in names)
        rest = len(role.main.get("options") or {}) - len(names)
        if rest > 0:
            variables += ", [%d more](%s)" % (rest, page)
        purpose = _markup(str(role.main.get("short_description") or "").strip())
        lines.append(_row(["[%s](%s)" % (_code("%s.%s" % (collection, role.name)), page), purpose, variables]))
    entry_only = [r for r in roles if not r.has_main]
    if entry_only:
        links = ", ".join(
            "[%s](%s)" % (_code("%s.%s" % (collection, r.name)), (DOCS_DIR / ("%s.md" % r.name)).as_posix())
            for r in entry_only
        )
        lines += ["", "Used only through their entry points (`tasks_from`), by the roles above: %s." % links]
    lines.append(TABLE_END)
    return "\n".join(lines)


def update_readme(text: str, block: str) -> str:
    """README text with the roles block replaced, or added as a section before the tests section."""
    starts, ends = text.count(TABLE_START), text.count(TABLE_END)
    if (starts, ends) == (1, 1):
        head, rest = text.split(TABLE_START, 1)
        if TABLE_END not in rest:
            raise RoleDocsError("README.md: %s must come after %s" % (TABLE_END, TABLE_START))
        return head + block + rest.split(TABLE_END, 1)[1]
    if (starts, ends) != (0, 0):
        raise RoleDocsError(
            "README.md has %d %s and %d %s markers; keep exactly one of each (or neither, and the section "
            "is added before the tests section)" % (starts, TABLE_START, ends, TABLE_END)
        )
    section = "%s\n\n%s\n\n" % (SECTION_TITLE, block)
    lines = text.splitlines(keepends=True)
    at = _tests_section_line(lines)
    if at is None:
        return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    return "".join(lines[:at]) + section + "".join(lines[at:])


def _tests_section_line(lines: list[str]) -> int | None:
    """Index of the first level-2 heading about tests, outside fenced code blocks."""
    fenced = False
    for index, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and re.match(r"##\s+.*\btests?\b", line, re.IGNORECASE):
            return index
    return None


# --- files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    write: dict[Path, str]  # relative path -> wanted content
    remove: list[Path]  # generated pages whose role is gone


def plan(root: Path) -> Plan:
    """What the generated files under root should hold."""
    collection = collection_name(root)
    roles = load_roles(root)
    wanted = {DOCS_DIR / ("%s.md" % role.name): render_role_page(role, collection) for role in roles}
    readme = root / README
    if not readme.is_file():
        raise RoleDocsError("%s is missing" % readme)
    wanted[README] = update_readme(readme.read_text(encoding="utf-8"), render_roles_table(roles, collection))
    remove = []
    for page in sorted((root / DOCS_DIR).glob("*.md")):
        rel = page.relative_to(root)
        if rel not in wanted and GENERATED_MARK in page.read_text(encoding="utf-8"):
            remove.append(rel)
    return Plan(write=wanted, remove=remove)


def stale(root: Path, wanted: Plan) -> list[tuple[Path, str]]:
    """(file, why) for every generated file under root that differs from the plan."""
    problems = []
    for rel, content in wanted.write.items():
        path = root / rel
        if not path.is_file():
            problems.append((rel, "missing"))
        elif path.read_text(encoding="utf-8") != content:
            problems.append((rel, "out of date"))
    problems += [(rel, "generated for a role that no longer exists; remove it") for rel in wanted.remove]
    return problems


def write(root: Path, wanted: Plan) -> list[Path]:
    """Write what differs; returns the files written or removed."""
    changed = [rel for rel, _why in stale(root, wanted)]
    for rel in changed:
        path = root / rel
        if rel in wanted.remove:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(wanted.write[rel], encoding="utf-8", newline="\n")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    parser.add_argument("--root", type=Path, help="collection root (default: the checkout this file is in)")
    args = parser.parse_args(argv)
    root = (args.root or Path(__file__).resolve().parents[1]).resolve()
    try:
        wanted = plan(root)
        if args.check:
            problems = stale(root, wanted)
            for rel, why in problems:
                print("%s: %s" % (rel.as_posix(), why))
            if problems:
                print("role docs: %d file(s) out of date; run `%s` and commit the result" % (len(problems), COMMAND))
                return 1
            print("role docs: %d file(s) in sync with meta/argument_specs.yml" % len(wanted.write))
            return 0
        changed = write(root, wanted)
    except (RoleDocsError, OSError, yaml.YAMLError) as err:
        print("%s: %s" % (COMMAND, err), file=sys.stderr)
        return 2
    for rel in changed:
        print("%s %s" % ("removed" if rel in wanted.remove else "wrote", rel.as_posix()))
    in_sync = len(wanted.write) - len(set(changed) - set(wanted.remove))
    print("role docs: %d file(s) changed, %d in sync" % (len(changed), in_sync))
    return 0


if __name__ == "__main__":
    sys.exit(main())
