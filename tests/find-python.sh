#!/usr/bin/env bash
# The path of a runnable Python X.Y: pythonX.Y on PATH, else pyenv's (~/.pyenv/versions/X.Y.*),
# else uv's; the first that runs and is that version (a pyenv shim may only print advice).
#   tests/find-python.sh 3.13      prints the path, or exits 1 saying where it looked
set -euo pipefail
v=${1:?a version, like 3.13}
for p in $(command -v "python$v" || true) "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" \
    $(command -v uv >/dev/null && uv python find "$v" 2>/dev/null || true); do
  if [ -x "$p" ] && [ "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
    echo "$p"
    exit 0
  fi
done
echo "no Python $v here (looked for python$v on PATH, in pyenv and uv)" >&2
exit 1
