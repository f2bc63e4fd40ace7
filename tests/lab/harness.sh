#!/usr/bin/env bash
# gpufleet lab harness: makes this machine able to run lab hosts.
#   harness.sh docker        install Debian's docker.io if needed, start dockerd if not running
#   harness.sh image NAME    build lab image NAME (tests/lab/images/NAME) unless an image
#                            with the same recipe hash exists; prints the image tag
#   harness.sh image-tag NAME  print the tag the recipe hashes to (builds nothing)
#   harness.sh clean         remove lab containers, volumes and images (label io.gpufleet.lab)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="$root/.cache/lab"
mkdir -p "$cache"

log() { printf 'lab: %s\n' "$*" >&2; }

apt_install() {
  local missing=()
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

ensure_docker() {
  # The docker client alone is not enough: a Docker engine must answer.
  if docker info >/dev/null 2>&1; then return 0; fi
  apt_install docker.io iptables
  if ! pgrep -x dockerd >/dev/null; then
    log "starting dockerd (log: $cache/dockerd.log)"
    nohup dockerd >"$cache/dockerd.log" 2>&1 &
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && return 0; sleep 1; done
  log "dockerd did not answer within 60 s; see $cache/dockerd.log"; exit 1
}

ca_bundle() { echo "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"; }

debian_mirror() {
  # The mirror that this machine's apt sources name (debootstrap must use it).
  local m
  m=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
      | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ' || true)
  echo "${m:-http://deb.debian.org/debian}" | sed 's:/*$::'
}

image_tag() {
  local name=$1 dir="$here/images/$1"
  [ -d "$dir" ] || { log "no image recipe at $dir"; exit 2; }
  # Content hash of everything that goes into the image: the recipe folder, the CA
  # bundle that gets trusted inside and the mirror it is built from.
  local h
  h=$( { (cd "$dir" && find . -type f -print0 | sort -z | xargs -0 sha256sum);
         sha256sum < "$(ca_bundle)"; debian_mirror; } | sha256sum | cut -c1-12)
  echo "gpufleet-lab/$name:$h"
}

ensure_image() {
  local name=$1 tag
  tag=$(image_tag "$name")
  if docker image inspect "$tag" >/dev/null 2>&1; then
    log "image $tag is cached"
  else
    log "building $tag (recipe changed or first run)"
    case "$name" in
      host) apt_install debootstrap; "$here/images/host/build.sh" "$tag" "$(debian_mirror)" "$(ca_bundle)" ;;
      *) "$here/images/$name/build.sh" "$tag" ;;
    esac
  fi
  echo "$tag"
}

clean() {
  docker ps -aq --filter label=io.gpufleet.lab | xargs -r docker rm -f >/dev/null
  docker volume ls -q --filter label=io.gpufleet.lab | xargs -r docker volume rm >/dev/null
  docker images -q --filter label=io.gpufleet.lab | sort -u | xargs -r docker rmi -f >/dev/null
}

case "${1:-}" in
  docker) ensure_docker ;;
  image) ensure_docker; ensure_image "${2:?image name}" ;;
  image-tag) image_tag "${2:?image name}" ;;
  clean) ensure_docker; clean ;;
  *) sed -n '2,8p' "$0" >&2; exit 2 ;;
esac
