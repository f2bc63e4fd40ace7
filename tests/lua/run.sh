#!/usr/bin/env bash
# The edge's Lua (roles/edge/files/lua) outside nginx, with Debian's LuaJIT and lua-cjson:
#   tests/lua/run.sh test   its specs (tests/lua/*_spec.lua) with busted, run by luajit (make unit)
#   tests/lua/run.sh lint   luacheck with .luacheckrc (make lint)
# Installs Debian's luajit, lua-cjson, lua-busted and lua-check when they are missing (as root;
# otherwise it names them).
set -euo pipefail
cd "$(dirname "$0")/../.."
packages=(luajit lua-cjson lua-busted lua-check)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "tests/lua/run.sh: install Debian's ${missing[*]} (sudo apt-get install ${missing[*]}) to test the edge's Lua" >&2
    exit 1
  fi
  # (one apt at a time with the lab's installs: the same lock harness.sh takes)
  exec 9>"${TMPDIR:-/tmp}/gpufleet-lab-apt.lock"
  flock -w 900 9
  echo "tests/lua/run.sh: installing Debian's ${missing[*]}" >&2
  apt-get update -qq 9>&-
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 9>&-
  exec 9>&-
fi
case "${1:-test}" in
  # busted's runner under the real LuaJIT (Debian's busted script would take the default `lua`)
  test) GPUFLEET_ROOT=$PWD exec luajit /usr/bin/busted --lpath="roles/edge/files/lua/?.lua;tests/lua/?.lua" \
          --pattern=_spec tests/lua ;;
  lint) exec luacheck --no-color roles/edge/files/lua tests/lua ;;
  *) echo "usage: tests/lua/run.sh test|lint" >&2; exit 2 ;;
esac
