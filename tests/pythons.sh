#!/usr/bin/env bash
# The fast tier's unit tests on every controller Python gpufleet supports besides the main
# one (make setup's python3, 3.11): each in its own venv (.venv-py3.X), installed from the
# same pins CI uses (requirements/constraints.txt), cached by the pins' hash.
#   tests/pythons.sh [VERSION ...]      default: $PYTHONS, else 3.12 3.13
# The interpreter: pythonX.Y on PATH, else pyenv's (~/.pyenv/versions/X.Y.*), else uv's; the first that runs.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || read -r -a versions <<<"${PYTHONS:-3.12 3.13}"

find_python() {
  # a candidate counts when it runs and is that version (a pyenv shim may only print advice)
  local v=$1 p
  for p in $(command -v "python$v" || true) "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" \
      $(command -v uv >/dev/null && uv python find "$v" 2>/dev/null || true); do
    if [ -x "$p" ] && [ "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
      echo "$p"; return
    fi
  done
  return 1
}

stamp_of() { cat pyproject.toml requirements/constraints.txt | sha256sum | cut -c1-16; }

one() {  # the venv for Python $1 (made once per pins), then the unit tests on it
  local v=$1 py venv stamp
  py=$(find_python "$v") || {
    echo "pythons: no Python $v here (looked for python$v on PATH, in pyenv and uv); install it or set PYTHONS" >&2
    return 1
  }
  venv=.venv-py$v
  stamp="$venv/.installed-$(stamp_of)"
  if [ ! -f "$stamp" ]; then
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade 'pip>=24'
    "$venv/bin/pip" install --quiet -c requirements/constraints.txt -e '.[test]'
    touch "$stamp"
  fi
  echo "=== unit tests on $("$venv/bin/python" --version) ($venv)"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider
}

# The versions side by side (the tests are single-process: two of them fill two cores), each
# into its own log, printed whole when it ends; the tier fails when one version fails.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for v in "${versions[@]}"; do
  one "$v" >"$logs/$v.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!versions[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  cat "$logs/${versions[$i]}.log"
  [ "$rc" -eq 0 ] || { echo "pythons: the unit tests on Python ${versions[$i]} failed (exit $rc)" >&2; status=1; }
done
exit "$status"
