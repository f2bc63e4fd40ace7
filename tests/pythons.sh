#!/usr/bin/env bash
# The other supported (controller Python, ansible-core) pairs besides the main venv's (make
# setup: Python 3.13 with ansible-core 2.21, requirements/constraints.txt): on each, the unit
# tests and ansible-test sanity, in its own venv (.venv-py3.X) installed from that pair's pins
# (requirements/core-2.NN.txt: the main pins with that ansible-core and the `ansible` release
# that carries its collections), cached by the pins' hash.
#   tests/pythons.sh [PYTHON:CORE ...]     default: $PYTHONS, else 3.11:2.19 3.12:2.20
# ansible-core 2.20 and later run only on Python 3.12 and newer (PyPI's wheels say so), so 2.19
# is the line for Python 3.11 controllers. The interpreter: tests/find-python.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=("$@")
[ ${#pairs[@]} -gt 0 ] || read -r -a pairs <<<"${PYTHONS:-3.11:2.19 3.12:2.20}"

one() {  # the venv for the pair $1 (made once per pins), then the unit tests and sanity on it
  local v=${1%%:*} core=${1##*:} py venv stamp pins rc=0
  pins=requirements/core-$core.txt
  [ -f "$pins" ] || { echo "pythons: no pins for ansible-core $core ($pins)" >&2; return 1; }
  py=$(tests/find-python.sh "$v") || { echo "pythons: install Python $v, or set PYTHONS" >&2; return 1; }
  venv=.venv-py$v
  stamp="$venv/.installed-$(cat pyproject.toml "$pins" | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade 'pip>=24'
    "$venv/bin/pip" install --quiet -c "$pins" -e '.[test]'
    touch "$stamp"
  fi
  echo "=== unit tests on $("$venv/bin/python" --version), ansible-core $("$venv/bin/python" -c \
    'from ansible.release import __version__; print(__version__)') ($venv)"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider || rc=$?
  # one sanity run at a time: ansible-test's cached venvs (~/.ansible/test) have no lock of their own
  echo "=== ansible-test sanity on ansible-core $core"
  BIN="$PWD/$venv/bin" flock "${TMPDIR:-/tmp}/gpufleet-sanity.lock" tests/sanity/run.sh || rc=$?
  return "$rc"
}

# The pairs side by side (each single-process: two of them fill two cores), each into its own
# log, printed whole when it ends; the tier fails when one pair fails.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for pair in "${pairs[@]}"; do
  one "$pair" >"$logs/$pair.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pairs[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  cat "$logs/${pairs[$i]}.log"
  [ "$rc" -eq 0 ] || { echo "pythons: Python ${pairs[$i]%%:*} with ansible-core ${pairs[$i]##*:} failed (exit $rc)" >&2; status=1; }
done
exit "$status"
