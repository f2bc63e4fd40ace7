#!/usr/bin/env bash
# ansible-test sanity over the collection as it ships.
#
# ansible-test must run inside a folder named ansible_collections/gpufleet/serving, and it
# resolves symlinks, so the in-repo link (collections/ansible_collections/gpufleet/serving ->
# the repo root) does not satisfy it. This script builds the collection tarball (what
# `ansible-galaxy collection build` ships, galaxy.yml's build_ignore applied), unpacks it into a
# temporary ansible_collections/gpufleet/serving, adds tests/sanity/ignore-*.txt and runs sanity
# there:
#   1. every sanity test with the controller's Python (SANITY_PYTHON, default BIN's python);
#   2. compile and import on each managed-host Python in SANITY_TARGET_PYTHONS that is installed
#      (default: the oldest this ansible-core supports on managed hosts, and 3.13);
#      these tests check only what runs on managed hosts (modules, module_utils). A version that
#      is not installed is skipped with a note. pyenv's versions are found without activating them.
# Each sanity test installs its pinned requirements from PyPI into a cached virtual environment
# under ~/.ansible/test/venv (first run only); the project venv is untouched. ansible-test
# fetches pip's bootstrap script from a host outside PyPI: tests/sanity/get_pip.py stands in for
# it when none is cached.
#
#   tests/sanity/run.sh                         both steps
#   tests/sanity/run.sh --test pylint           step 1 only, with these ansible-test options
#   SANITY_TARGET_PYTHONS= tests/sanity/run.sh  step 1 only
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
export PATH="$BIN:$PATH"
# the venv's own Python (ansible-test runs its controller tests there), and for compile and
# import the oldest managed-host Python this ansible-core supports (3.8 for 2.19, 3.9 for 2.20
# and 2.21) and the newest here
CONTROLLER_PYTHON="${SANITY_PYTHON:-$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"
OLDEST_TARGET="$(python -c 'from ansible_test._util.target.common.constants import REMOTE_ONLY_PYTHON_VERSIONS as r
print(r[0])')"
TARGET_PYTHONS="${SANITY_TARGET_PYTHONS-$OLDEST_TARGET 3.13}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-sanity.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
DEST="$WORK/ansible_collections/gpufleet/serving"
mkdir -p "$DEST/tests/sanity" "$WORK/build"

(cd "$ROOT" && ansible-galaxy collection build --force --output-path "$WORK/build" >/dev/null)
tar -xzf "$WORK"/build/gpufleet-serving-*.tar.gz -C "$DEST"
cp "$ROOT"/tests/sanity/ignore-*.txt "$DEST/tests/sanity/"

# ansible-test bootstraps pip in its virtual environments with a get-pip.py downloaded from
# ci-files.testing.ansible.com (unreachable here); without one in its cache, use ours (and keep
# a cached copy of ours current).
PIP_VERSION="$(python -c 'import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="'"$CONTROLLER_PYTHON"'"))["pip"])')"
GET_PIP="$HOME/.ansible/test/cache/get_pip_${PIP_VERSION//./_}.py"
if [ ! -s "$GET_PIP" ] || grep -q "Stand-in for get-pip.py in ansible-test" "$GET_PIP"; then
  mkdir -p "$(dirname "$GET_PIP")"
  cp "$ROOT/tests/sanity/get_pip.py" "$GET_PIP"
fi

# A runnable pythonX.Y on PATH: as it is, else the folder tests/find-python.sh finds it in
# (pyenv's or uv's) put in front (pyenv's shims answer only for the active version).
find_python() {
  local found
  "python$1" -c '' 2>/dev/null && return 0
  found=$("$ROOT/tests/find-python.sh" "$1" 2>/dev/null) || return 1
  PATH="$(dirname "$found"):$PATH"
}

# One exclusion, with its reason, kept here because ansible-lint's production profile
# (sanity[cannot-ignore]) permits only a few tests (shebang, shellcheck, ...) in ignore-*.txt:
#   replace-urlopen skips plugins/module_utils/_engine_render.py: what it matches is not a call
#   but the text of the engine container's health check (python3 -c "...urlopen(...)"), which
#   Docker runs inside the engine image, where Ansible's open_url does not exist. The test still
#   runs on every other file.
URLOPEN_TEXT_ONLY=plugins/module_utils/_engine_render.py

cd "$DEST"
rc=0
SECONDS=0
if [ $# -eq 0 ]; then
  ansible-test sanity --local --python "$CONTROLLER_PYTHON" --color no --skip-test replace-urlopen || rc=$?
  ansible-test sanity --local --python "$CONTROLLER_PYTHON" --color no --test replace-urlopen \
    --exclude "$URLOPEN_TEXT_ONLY" || rc=$?
else
  ansible-test sanity --local --python "$CONTROLLER_PYTHON" --color no "$@" || rc=$?
fi
echo "sanity on Python $CONTROLLER_PYTHON: ${SECONDS}s"

if [ $# -eq 0 ]; then
  for version in $TARGET_PYTHONS; do
    if ! find_python "$version"; then
      echo "sanity: Python $version is not installed here; compile and import not checked on it"
      continue
    fi
    SECONDS=0
    ansible-test sanity --local --python "$version" --color no --test compile --test import || rc=$?
    echo "sanity compile and import on Python $version: ${SECONDS}s"
  done
fi
exit "$rc"
