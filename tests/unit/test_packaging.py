"""Packaging: the collection tarball is clean, the collection resolves in place, the wheel
carries the same collection and the installed CLI finds it, execution-environment.yml agrees
with the pins CI installs."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, ROOT
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from gpufleet import __version__
from gpufleet._collection import locate_collection

BIN = Path(sys.executable).parent
# Where setup.py puts the collection inside the wheel (a collections path: gpufleet/collection).
PACKAGED = "gpufleet/collection/ansible_collections/gpufleet/serving/"


def _env():
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (BIN, env.get("PATH", ""))
    env.pop("ANSIBLE_CONFIG", None)
    return env


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> list[tarfile.TarInfo]:
    out = tmp_path_factory.mktemp("galaxy")
    subprocess.run(
        [BIN / "ansible-galaxy", "collection", "build", "--output-path", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env=_env(),
    )
    (tarball,) = out.glob("gpufleet-serving-*.tar.gz")
    with tarfile.open(tarball) as tar:
        return tar.getmembers()


@pytest.fixture(scope="module")
def tarball_names(tarball) -> list[str]:
    return [m.name for m in tarball]


# Left out of the copy the wheel is built from: caches, the venv and build output, which a
# checkout may hold in any size. Decoys of the first two are put back to prove the build skips them.
_NOT_COPIED = {".git", ".venv", ".cache", ".ansible", ".pytest_cache", ".ruff_cache", "build", "dist", "context"}


def _ignore(folder: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if Path(folder) == ROOT:
        skip |= (_NOT_COPIED & set(names)) | {n for n in names if n.startswith(".venv-py")}
    return skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` would install, built from a copy of this checkout.

    A copy, so that setuptools' build/ and egg-info land in the temporary folder. pip builds in
    isolation (as `pip install .` does): the venv's own setuptools may predate the SPDX license
    in pyproject.toml, so pip fetches setuptools>=77 from its index or cache.
    """
    tree = tmp_path_factory.mktemp("checkout") / "gpufleet"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=_ignore)
    for decoy in (".venv/lib/decoy.py", ".cache/facts/decoy"):
        (tree / decoy).parent.mkdir(parents=True, exist_ok=True)
        (tree / decoy).write_text("# decoy\n")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [BIN / "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(tree)],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("gpufleet-%s-py3-none-any.whl" % __version__)
    return built


@pytest.fixture(scope="module")
def wheel_names(wheel) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_collection_tarball_has_no_tests_ci_or_caches(tarball_names):
    names = tarball_names
    tops = {n.split("/")[0] for n in names}
    assert {"MANIFEST.json", "FILES.json", "README.md", "meta", "plugins", "roles"} <= tops
    for banned in ("tests", "tools", ".ci", ".cache", ".venv", "molecule", "src", "dist", "build", ".git", "context"):
        assert banned not in tops, banned
    for banned in ("setup.py", "pyproject.toml", "execution-environment.yml", "Makefile", ".ansible-lint-ignore"):
        assert banned not in names, banned
    assert not [n for n in names if n.startswith("collections/ansible_collections")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "plugins/modules/gpu_facts.py" in names
    assert "roles/nccl/meta/argument_specs.yml" in names


def test_ansible_doc_resolves_in_place():
    proc = subprocess.run(
        [BIN / "ansible-doc", "gpufleet.serving.gpu_facts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "gpufleet_gpu" in proc.stdout
    assert str(ROOT / "collections" / "ansible_collections" / "gpufleet" / "serving") in proc.stdout


def test_checkout_copy_is_found_first(monkeypatch):
    copy = locate_collection()
    assert copy.packaged is False
    assert copy.root == ROOT
    assert copy.collections_path == ROOT / "collections"
    assert copy.site_playbook == ROOT / "playbooks" / "site.yml"
    assert copy.rollout_playbook == ROOT / "playbooks" / "rollout.yml"
    assert copy.inventories == ROOT / "inventories"
    assert copy.ansible_cfg == ROOT / "ansible.cfg"
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", "/srv/mine:%s" % (ROOT / "collections"))
    assert copy.envvars() == {"ANSIBLE_COLLECTIONS_PATH": "%s:/srv/mine" % (ROOT / "collections")}
    monkeypatch.delenv("ANSIBLE_COLLECTIONS_PATH")
    assert copy.envvars()["ANSIBLE_COLLECTIONS_PATH"].startswith(str(ROOT / "collections") + ":~/.ansible")


BANNED_IN_WHEEL = re.compile(r"(tests|\.venv|\.cache|molecule|src|build|collections/ansible_collections)/")


def test_wheel_carries_the_collection_and_nothing_else(wheel_names):
    names = set(wheel_names)
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    assert roles
    needed = [
        "galaxy.yml",
        "meta/runtime.yml",
        "site.yml",
        "playbooks/site.yml",
        "playbooks/rollout.yml",
        "inventories/lab/hosts.yml",
        "plugins/modules/gpu_facts.py",
        "plugins/module_utils/_model_shape.py",
        *("roles/%s/meta/argument_specs.yml" % role for role in roles),
    ]
    assert not [n for n in needed if PACKAGED + n not in names]
    assert {"gpufleet/cli.py", "gpufleet/_collection.py"} <= names
    assert not [n for n in names if "roledocs" in n]  # a development tool (tools/), not the product
    for name in names:
        assert name.startswith(("gpufleet/", "gpufleet-%s.dist-info/" % __version__)), name
        inner = name[len(PACKAGED) :] if name.startswith(PACKAGED) else None
        if inner is None:
            assert not name.startswith("gpufleet/collection/"), name
            continue
        assert not BANNED_IN_WHEEL.match(inner), name
        assert inner not in ("setup.py", "pyproject.toml", "Makefile", "ansible.cfg"), name
        assert "__pycache__" not in inner and not inner.endswith(".pyc"), name


def test_wheel_metadata_makes_the_bench_client_an_extra(wheel):
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("gpufleet-%s.dist-info/METADATA" % __version__).decode()
    requires = [Requirement(line.split(":", 1)[1]) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    openai = [r for r in requires if canonicalize_name(r.name) == "openai"]
    assert openai and all(r.marker and r.marker.evaluate({"extra": "bench"}) for r in openai)
    assert not [r for r in openai if r.marker.evaluate({"extra": ""})], "openai must not be a plain dependency"
    assert "Provides-Extra: bench" in meta.splitlines()


def test_the_bench_extra_holds_the_client_and_the_test_extra_pulls_it_in():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert "openai" not in names  # every command but `gpufleet bench` (and the demo's answer) works without it
    extras = project["optional-dependencies"]
    assert [canonicalize_name(Requirement(r).name) for r in extras["bench"]] == ["openai"]
    pulled = [Requirement(r) for r in extras["test"] if canonicalize_name(Requirement(r).name) == "gpufleet"]
    assert [r.extras for r in pulled] == [{"lab"}]
    assert [Requirement(r).extras for r in extras["lab"]] == [{"bench", "collections"}]
    assert "openai" in _constraints()  # what CI installs (make setup: .[test])


def test_the_community_collections_are_an_extra_not_a_dependency():
    """ansible-core only; the 48-namespace `ansible` package is the `collections` extra, and the
    collections the roles use are exactly the ones galaxy.yml and requirements.yml name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert "ansible" not in names and "ansible-core" in names
    assert [canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["collections"]] == [
        "ansible"
    ]
    used = set()
    for folder in ("roles", "playbooks"):
        for path in (ROOT / folder).rglob("*.y*ml"):
            used |= set(re.findall(r"\b(community\.[a-z_]+|ansible\.posix)\.[a-z_]+", path.read_text()))
    declared = set(_load(ROOT / "galaxy.yml")["dependencies"])
    required = {c["name"] for c in _load(ROOT / "collections" / "requirements.yml")["collections"]}
    assert used == declared == required


def test_wheel_collection_is_the_galaxy_tarball(wheel_names, tarball):
    """The installed collection carries what a released one does (galaxy.yml in place of
    MANIFEST.json/FILES.json). A difference: add the path to setup.py's parts or build_ignore."""
    in_wheel = {n[len(PACKAGED) :] for n in wheel_names if n.startswith(PACKAGED)}
    in_tarball = {m.name for m in tarball if m.isfile()}
    assert in_wheel == (in_tarball - {"MANIFEST.json", "FILES.json"}) | {"galaxy.yml"}


# Run by the interpreter with the unpacked wheel first on sys.path, from a folder outside the
# checkout: what an installed gpufleet sees.
_PROBE = """
import json, sys
import gpufleet
from gpufleet._collection import ensure_importable, locate_collection
from gpufleet.cli import main
copy = locate_collection()
ensure_importable()
from ansible_collections.gpufleet.serving.plugins.module_utils import _gpu_topology
print(json.dumps({
    "gpufleet": gpufleet.__file__, "module_utils": _gpu_topology.__file__, "packaged": copy.packaged,
    "root": str(copy.root), "collections_path": str(copy.collections_path),
    "site": copy.site_playbook.is_file(), "rollout": copy.rollout_playbook.is_file(),
    "inventory": (copy.inventories / "lab" / "hosts.yml").is_file(), "cfg": copy.ansible_cfg and str(copy.ansible_cfg),
    "envvars": copy.envvars(),
}))
sys.exit(main(["gpu", "show", sys.argv[1]]))
"""


def test_installed_wheel_finds_its_collection_from_any_folder(wheel, tmp_path):
    site = tmp_path / "site-packages"  # a pure-Python wheel installs by unpacking
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**_env(), "PYTHONPATH": str(site)}
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(FIXTURES / "8x_h100_sxm_nv18_12nic_numa_off")],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    first, shown = proc.stdout.split("\n", 1)
    seen = json.loads(first)
    packaged = site / PACKAGED
    assert seen["gpufleet"] == str(site / "gpufleet" / "__init__.py")
    assert seen["module_utils"] == str(packaged / "plugins" / "module_utils" / "_gpu_topology.py")
    assert seen["packaged"] is True
    assert seen["root"] == str(packaged)
    assert seen["collections_path"] == str(site / "gpufleet" / "collection")
    assert seen["site"] and seen["rollout"] and seen["inventory"]
    assert seen["cfg"] is None
    assert "8 GPU(s)" in shown

    doc = subprocess.run(
        [BIN / "ansible-doc", "gpufleet.serving.gpu_facts"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={**env, **seen["envvars"]},
        check=False,
    )
    assert doc.returncode == 0, doc.stderr
    assert str(packaged / "plugins" / "modules" / "gpu_facts.py") in doc.stdout


def test_the_wheels_collection_serves_plain_ansible_and_its_cli_passes_ansible_options(wheel, tmp_path):
    """From the unpacked wheel, in an unrelated folder: `gpufleet deploy -u admin -b --list-hosts`
    lists the hosts, and after `gpufleet collection install -p DIR` (or with `gpufleet collection
    path` on the collections path) plain ansible-doc finds the roles."""
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "hosts.yml").write_text("all:\n  children:\n    gpu_hosts:\n      hosts:\n        gpu-07: {}\n")
    env = {**_env(), "PYTHONPATH": str(site), "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "c"),
           "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)

    def gpufleet(*args):
        return subprocess.run(
            [sys.executable, "-m", "gpufleet.cli", *args], cwd=elsewhere, capture_output=True, text=True, env=env,
            check=False, timeout=300,
        )  # fmt: skip

    listed = gpufleet("deploy", "-i", "hosts.yml", "-u", "admin", "-b", "--list-hosts")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "gpu-07" in listed.stdout.split()

    def role_doc(collections_path):
        return subprocess.run(
            [BIN / "ansible-doc", "-t", "role", "gpufleet.serving.engine"], cwd=elsewhere, capture_output=True,
            text=True, env={**env, "ANSIBLE_COLLECTIONS_PATH": collections_path}, check=False,
        )  # fmt: skip

    assert "ENTRY POINT" not in role_doc(str(tmp_path / "empty")).stdout  # plain Ansible alone does not see it
    path = gpufleet("collection", "path")
    assert path.returncode == 0 and path.stdout.strip() == str(site / "gpufleet" / "collection")
    doc = role_doc(path.stdout.strip())
    assert doc.stdout.startswith("> ROLE: *gpufleet.serving.engine* (%s/" % path.stdout.strip()), doc.stderr
    assert "ENTRY POINT: *main*" in doc.stdout

    # the community collections come from this venv's `ansible` package here (no Galaxy in CI)
    installed = gpufleet("collection", "install", "--no-deps", "-p", str(tmp_path / "collections"))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (tmp_path / "collections" / "ansible_collections" / "gpufleet" / "serving" / "MANIFEST.json").is_file()
    doc = role_doc(str(tmp_path / "collections"))
    assert doc.stdout.startswith("> ROLE: *gpufleet.serving.engine* (%s/" % (tmp_path / "collections")), doc.stderr
    assert "ENTRY POINT: *main*" in doc.stdout
    plays = subprocess.run(
        [BIN / "ansible-playbook", "gpufleet.serving.site", "-i", "hosts.yml", "--list-hosts"], cwd=elsewhere,
        capture_output=True, text=True, env={**env, "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections")},
        check=False,
    )  # fmt: skip
    assert plays.returncode == 0 and "gpu-07" in plays.stdout.split(), plays.stdout + plays.stderr


# --- execution-environment.yml --------------------------------------------------------------

EE_TOP = {
    "version",
    "images",
    "dependencies",
    "options",
    "build_arg_defaults",
    "additional_build_files",
    "additional_build_steps",
}
EE_DEPENDENCIES = {"python", "galaxy", "system", "python_interpreter", "ansible_core", "ansible_runner", "exclude"}


def _load(path: Path):
    return yaml.safe_load(path.read_text())


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _exact(requirement: str) -> tuple[str, str]:
    req = Requirement(requirement)
    (spec,) = req.specifier
    assert spec.operator == "==", "%s: the EE pins exact versions" % requirement
    return canonicalize_name(req.name), spec.version


@pytest.fixture(scope="module")
def ee() -> dict:
    return _load(ROOT / "execution-environment.yml")


def test_execution_environment_schema_basics(ee):
    assert ee["version"] == 3
    assert set(ee) <= EE_TOP
    base = ee["images"]["base_image"]["name"]
    assert isinstance(base, str) and re.match(r"^[\w.-]+(/[\w.-]+)+:[\w.-]+$", base), base
    deps = ee["dependencies"]
    assert set(deps) <= EE_DEPENDENCIES
    assert set(deps["ansible_core"]) == {"package_pip"}
    assert set(deps["ansible_runner"]) == {"package_pip"}
    assert set(deps["python_interpreter"]) <= {"package_system", "python_path"}
    assert all(isinstance(c["name"], str) for c in deps["galaxy"]["collections"])
    assert all(isinstance(c["version"], str) for c in _galaxy_collections(ee))
    assert isinstance(deps["python"], list) and isinstance(deps["system"], list)


def _galaxy_collections(ee: dict) -> list[dict]:
    """The EE's collections from Galaxy (gpufleet.serving itself comes as a file)."""
    return [c for c in ee["dependencies"]["galaxy"]["collections"] if c.get("type") != "file"]


def test_execution_environment_holds_the_collection_it_builds(ee):
    """The image carries gpufleet.serving itself: the tarball `make build-collection` writes for
    galaxy.yml's version, copied into the build context and installed from there."""
    galaxy = _load(ROOT / "galaxy.yml")
    tarball = "%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"])
    files = [c for c in ee["dependencies"]["galaxy"]["collections"] if c.get("type") == "file"]
    assert files == [{"name": "collections/" + tarball, "type": "file"}]
    (extra,) = ee["additional_build_files"]
    assert extra["dest"] == "collections"
    assert Path(extra["src"]).parent == Path(".cache/dist") and fnmatch.fnmatch(tarball, Path(extra["src"]).name)
    makefile = (ROOT / "Makefile").read_text()
    assert "collection build --force --output-path .cache/dist" in makefile


def test_execution_environment_pins_what_ci_installs(ee):
    pins = _constraints()
    deps = ee["dependencies"]
    for requirement in (deps["ansible_core"]["package_pip"], deps["ansible_runner"]["package_pip"], *deps["python"]):
        name, version = _exact(requirement)
        assert pins.get(name) == version, "%s: constraints.txt has %s" % (requirement, pins.get(name))
    assert {_exact(r)[0] for r in deps["python"]} <= pins.keys()

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    interpreter = re.search(r"python(\d+\.\d+)$", deps["python_interpreter"]["python_path"]).group(1)
    assert SpecifierSet(project["requires-python"]).contains(interpreter + ".0"), interpreter
    assert "python" + interpreter in deps["python_interpreter"]["package_system"].split()
    # Every dependency declared in pyproject.toml that the controller side needs is there.
    declared = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    in_ee = {_exact(deps[k]["package_pip"])[0] for k in ("ansible_core", "ansible_runner")}
    in_ee |= {_exact(r)[0] for r in deps["python"]}
    # `ansible` (the community package) is replaced in the EE by its collections from Galaxy.
    # The EE runs playbooks only: the bench extra (openai, for `gpufleet bench`) is not in it.
    assert declared - {"ansible"} <= in_ee
    assert "openai" not in in_ee


def test_execution_environment_collections_are_galaxy_yml_dependencies(ee):
    wanted = _load(ROOT / "galaxy.yml")["dependencies"]
    ranges = {c["name"]: c["version"] for c in _load(ROOT / "collections" / "requirements.yml")["collections"]}
    got = {c["name"]: c["version"] for c in _galaxy_collections(ee)}
    assert got.keys() == wanted.keys()
    for name, version in got.items():
        assert version.startswith("=="), "%s: the EE pins exact versions" % name
        exact = version[2:]
        for source, spec in (("galaxy.yml", wanted[name]), ("collections/requirements.yml", ranges.get(name, ""))):
            assert SpecifierSet(spec).contains(exact), "%s %s is outside %s's %s" % (name, exact, source, spec)


def test_execution_environment_collections_are_the_tested_ones(ee):
    """CI tests with the collections inside the pinned `ansible` release; the EE has the same."""
    pinned = _constraints()["ansible"]
    try:
        dist = metadata.distribution("ansible")
    except metadata.PackageNotFoundError:
        pytest.skip("PyPI's ansible package is not installed")
    if dist.version != pinned:
        pytest.skip("ansible %s installed, constraints.txt pins %s" % (dist.version, pinned))
    for entry in _galaxy_collections(ee):
        manifest = Path(dist.locate_file("ansible_collections/%s/MANIFEST.json" % entry["name"].replace(".", "/")))
        shipped = json.loads(manifest.read_text())["collection_info"]["version"]
        assert entry["version"] == "==" + shipped, "ansible %s ships %s %s" % (pinned, entry["name"], shipped)


def test_ruff_reads_every_python_script_without_an_extension():
    """ruff finds files by extension: the scripts installed as commands (engine-watchdog, the
    router's worker sync, the lab's stand-ins) are named in pyproject's extend-include."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    scripts = set()
    for name in tracked.splitlines():
        path = ROOT / name
        if "." in path.name or not path.is_file():
            continue
        with path.open("rb") as handle:
            first = handle.readline()
        if first.startswith(b"#!") and b"python" in first:
            scripts.add(name)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert scripts and scripts == set(config["tool"]["ruff"]["extend-include"])


# --- ansible-core lines -------------------------------------------------------------------


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_every_tested_ansible_core_line_is_admitted_and_none_above():
    """The ranges follow what is tested: each pins file's ansible-core (the main venv's 2.21 and
    make pythons' 2.19 and 2.20) is inside pyproject's range and the collection's
    requires_ansible; pyproject stops after the newest tested line (so pip never takes an
    untested core, and never downgrades a tested one); each pins file's `ansible` (the community
    collections) is inside the collections extra; and each pins file names a Python line that
    exists for it in make pythons or make setup."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core_range = next(SpecifierSet(str(Requirement(r).specifier)) for r in project["dependencies"]
                      if Requirement(r).name == "ansible-core")  # fmt: skip
    collections_range = Requirement(project["optional-dependencies"]["collections"][0]).specifier
    runtime = SpecifierSet(_load(ROOT / "meta" / "runtime.yml")["requires_ansible"])
    files = [ROOT / "requirements" / "constraints.txt", *sorted((ROOT / "requirements").glob("core-*.txt"))]
    cores = {}
    for path in files:
        pins = _pins(path)
        cores[path.name] = pins["ansible-core"]
        assert core_range.contains(pins["ansible-core"]) and runtime.contains(pins["ansible-core"]), path.name
        assert collections_range.contains(pins["ansible"]), path.name
        if path.name.startswith("core-"):
            assert pins["ansible-core"].startswith(path.name[len("core-") : -len(".txt")] + "."), path.name
    lines = sorted({tuple(int(x) for x in v.split(".")[:2]) for v in cores.values()})
    assert lines == [(2, 19), (2, 20), (2, 21)], cores
    newest = "%d.%d" % lines[-1]
    assert cores["constraints.txt"].startswith(newest + "."), "make test runs on the newest line"
    assert not core_range.contains("%d.%d.0" % (lines[-1][0], lines[-1][1] + 1)), "an untested line is admitted"
    assert not core_range.contains("2.18.0") and not runtime.contains("2.18.0")
    makefile = (ROOT / "Makefile").read_text()
    pairs = re.search(r"^PYTHONS \?= (.*)$", makefile, re.M).group(1).split()
    assert sorted(pair.split(":")[1] for pair in pairs) == ["2.19", "2.20"]
