#!/usr/bin/env bash
# promtool and amtool (Prometheus' and Alertmanager's own checkers) without installing either
# service: Debian's packages (the ones the monitoring role installs) are downloaded with
# `apt-get download` and unpacked with `dpkg-deb -x` into a cache keyed by their versions.
#   tests/promtools.sh     prints the folder holding promtool and amtool (stdout: that line only)
# A second call with the same apt candidates is instant (no download), from any checkout on this
# machine. PROMTOOLS_CACHE moves the cache (default: promtools/ in gpufleet's machine cache,
# ~/.cache/gpufleet or GPUFLEET_CACHE). apt's lists are refreshed (apt-get update) only when the
# download fails and we are root. Calls at once (the unit tests' workers) take turns on a lock.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${PROMTOOLS_CACHE:-$(tests/lab/harness.sh cache-dir)/promtools}
packages=(prometheus prometheus-alertmanager)

key_of() {
  # one apt-cache call for both candidates ("2.42.0+ds-5+deb12u1", "0.25.0-1+b4") ->
  # "prometheus_2.42.0+ds-5+deb12u1-alertmanager_0.25.0-1+b4"
  local p a
  read -r p a < <(apt-cache policy "${packages[@]}" 2>/dev/null |
    awk '/^[^ ]/ {pkg=$1} /Candidate:/ {v[pkg]=$2} END {print v["prometheus:"], v["prometheus-alertmanager:"]}')
  if [ -z "$p" ] || [ "$p" = "(none)" ] || [ -z "$a" ] || [ "$a" = "(none)" ]; then
    return 1
  fi
  echo "prometheus_${p//:/%}-alertmanager_${a//:/%}"
}

have_tools() { [ -x "$1/usr/bin/promtool" ] && [ -x "$1/usr/bin/amtool" ]; }

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "promtools: needs apt-get and dpkg-deb (a Debian or Ubuntu machine); or put promtool and amtool" \
    "under $cache/<any>/usr/bin yourself" >&2
  newest=$(ls -1d "$cache"/*/ 2>/dev/null | tail -1 || true)
  if [ -n "$newest" ] && have_tools "$newest"; then echo "${newest%/}/usr/bin"; exit 0; fi
  exit 1
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key=$(key_of) || {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >&2
    key=$(key_of)
  else
    echo "promtools: apt knows no prometheus/prometheus-alertmanager package; run 'sudo apt-get update'" >&2
    exit 1
  fi
}
dest="$cache/$key"
if have_tools "$dest"; then
  echo "$dest/usr/bin"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
download() { (cd "$work" && apt-get download -q "${packages[@]}" 1>&2); }
if ! download; then
  if [ "$(id -u)" = 0 ]; then
    echo "promtools: download failed; refreshing apt's lists and trying again" >&2
    apt-get update -qq >&2
    download
  else
    echo "promtools: apt-get download ${packages[*]} failed (stale apt lists? run 'sudo apt-get update')" >&2
    exit 1
  fi
fi
mkdir -p "$work/root"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$work/root"
done
if ! have_tools "$work/root"; then
  echo "promtools: the packages held no usr/bin/promtool and usr/bin/amtool ($(ls "$work"))" >&2
  exit 1
fi
# Only the two binaries are kept (the packages also carry the servers, their web assets, docs).
mkdir -p "$work/keep/usr/bin"
mv "$work/root/usr/bin/promtool" "$work/root/usr/bin/amtool" "$work/keep/usr/bin/"
rm -rf "$dest"
mv "$work/keep" "$dest"
echo "promtools: $("$dest/usr/bin/promtool" --version 2>&1 | head -1 || true)" >&2
echo "$dest/usr/bin"
