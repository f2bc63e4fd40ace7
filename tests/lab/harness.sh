#!/usr/bin/env bash
# gpufleet lab harness: makes this machine able to run lab hosts.
#   harness.sh docker        install Debian's docker.io if needed, start dockerd if not running
#   harness.sh image NAME    build lab image NAME (tests/lab/images/NAME) unless an image
#                            with the same recipe hash exists, or load it from its archive in
#                            the machine cache (the host and engine images); prints the image tag
#   harness.sh image-tag NAME  print the tag the recipe hashes to (builds nothing)
#   harness.sh archive NAME  image NAME as a docker-save archive in .cache/lab/images (prints the path)
#   harness.sh model NAME    generate tiny model NAME in .cache/lab/models (prints the path)
#   harness.sh ssh DIR NAME...  let Ansible reach lab hosts NAME... over SSH, as it reaches a real
#                            fleet: the lab key (made once) authorized for root and for the login
#                            user (login-user) on each, and in DIR
#                            an ssh_config mapping each NAME to its address and a known_hosts with
#                            each host's key read from the host itself, and DIR/cp for Ansible's
#                            ControlPersist sockets (empty); prints the ssh_config path
#   harness.sh login-user NAME...  on lab hosts NAME...: the unprivileged login user `admin` with
#                            passwordless sudo, as a cloud image's first boot makes it (ubuntu, admin)
#   harness.sh clean         remove lab containers, volumes and images (label io.gpufleet.lab)
#   harness.sh cache-dir     print gpufleet's machine cache (its lab/ folder is the lab's cache)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# What is slow to make (the engine image's archive, the tiny models, the router wheels, the lab's
# SSH key) lives on the machine, not in the checkout, so a fresh clone finds it made: everything
# in it is named by the hash of the recipe it comes from. GPUFLEET_CACHE moves it.
# (HOME may be unset: `gpufleet lab test` from cron or a CI job with a bare environment)
home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
machine_cache=${GPUFLEET_CACHE:-${XDG_CACHE_HOME:-$home/.cache}/gpufleet}
cache="$machine_cache/lab"
mkdir -p "$cache"
# The checkout's .cache/lab is a link to it: the Molecule scenarios and `gpufleet lab test` find
# the archives and models there. A folder left there by an older checkout is set aside, not lost.
link="$root/.cache/lab"
if [ "$(readlink "$link" 2>/dev/null)" != "$cache" ]; then
  mkdir -p "$root/.cache"
  if [ -e "$link" ] && [ ! -L "$link" ]; then mv "$link" "$link.old.$(date +%s)"; fi
  ln -sfn "$cache" "$link"
fi

log() { printf 'lab: %s\n' "$*" >&2; }

apt_install() {
  # one install at a time (the demo builds two images at once; both may want debootstrap):
  # the check is made again under the lock
  local missing=()
  exec 9>"${TMPDIR:-/tmp}/gpufleet-lab-apt.lock"
  flock -w 900 9 || { log "another apt install of the lab held its lock for 15 minutes"; exit 1; }
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    # the lock's descriptor is not handed to apt (a daemon a package starts would keep it)
    apt-get update -qq 9>&-
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 9>&-
  fi
  exec 9>&-
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
         sha256sum < "$(ca_bundle)"; debian_mirror;
         case "$name" in vllm-cpu) image_tag base ;; vllm-cpu-ray) image_tag vllm-cpu ;; esac; } \
       | sha256sum | cut -c1-12)
  echo "gpufleet-lab/$name:$h"
}

archive_file() { local tag=$1; echo "$cache/images/${tag//[\/:]/_}.tar"; }

ensure_image() {
  local name=$1 tag file
  tag=$(image_tag "$name")
  file=$(archive_file "$tag")
  if docker image inspect "$tag" >/dev/null 2>&1; then
    log "image $tag is cached"
    if [ "$name" = host ] && [ ! -s "$file" ]; then keep_archive "$tag" "$file"; fi
  elif [ -s "$file" ] && docker load -q -i "$file" >&2 && docker image inspect "$tag" >/dev/null 2>&1; then
    # the machine cache keeps the engine image's archive (the lab hosts load it) and the host
    # image's: an image removed from Docker (`gpufleet demo down`, a prune) comes back from it
    # in seconds, not the minutes of its build. The file is named by the recipe's hash.
    log "image $tag loaded from the machine cache ($file)"
  else
    # an archive Docker could not load is not handed to lab hosts either: made again below
    if [ -s "$file" ]; then log "could not load $file: removed, $tag is built again"; rm -f "$file"; fi
    log "building $tag (recipe changed or first run)"
    case "$name" in
      host|base|ee-base) apt_install debootstrap; "$here/images/$name/build.sh" "$tag" "$(debian_mirror)" "$(ca_bundle)" ;;
      vllm-cpu) "$here/images/vllm-cpu/build.sh" "$tag" "$(ensure_image base)" ;;
      vllm-cpu-ray) "$here/images/vllm-cpu-ray/build.sh" "$tag" "$(ensure_image vllm-cpu)" ;;
      *) log "no build rule for image $name"; exit 2 ;;
    esac
    # the host image is small (about 270 MB) and every lab starts from it: kept as an archive too
    if [ "$name" = host ]; then keep_archive "$tag" "$file"; fi
  fi
  echo "$tag"
}

save_archive() {
  # written under a name of this process's own, then moved: a reader never sees half a file, and
  # a failed save (a full disk) leaves nothing behind
  local tag=$1 file=$2
  mkdir -p "$(dirname "$file")"
  log "saving $tag to $file"
  if docker save -o "$file.tmp.$$" "$tag"; then mv "$file.tmp.$$" "$file"; else rm -f "$file.tmp.$$"; return 1; fi
}

keep_archive() {
  # the host image's archive only spares a later build: a run whose image is there goes on without it
  save_archive "$@" || log "could not keep $1 as $2 (the image itself is fine)"
}

archive() {
  # The image as a `docker save` archive under .cache/lab/images/, for lab hosts to load
  # the way an air-gapped host does. Named by the content-hashed tag: made once.
  local tag file
  tag=$(ensure_image "$1")
  file=$(archive_file "$tag")
  [ -s "$file" ] || save_archive "$tag" "$file"
  echo "$file"
}

model() {
  # A tiny model generated offline by tests/lab/images/tiny-model/generate.py, run inside
  # the vLLM image (which has torch, transformers and tokenizers). Cached by content.
  local name=$1 vllm h out
  vllm=$(ensure_image vllm-cpu)
  h=$( { sha256sum "$here/images/tiny-model/generate.py"; echo "$name $vllm"; } | sha256sum | cut -c1-12)
  out="$cache/models/$name-$h"
  if [ ! -f "$out/config.json" ]; then
    log "generating tiny model $name into $out"
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    docker run --rm --network none -v "$here/images/tiny-model/generate.py:/generate.py:ro" \
      -v "$out.tmp:/out" --entrypoint python3 "$vllm" /generate.py "$name" /out >&2
    rm -rf "$out" && mv "$out.tmp" "$out"
  fi
  echo "$out"
}

# The lab's unprivileged login, made at first boot as cloud-init makes a cloud image's user:
# no password, passwordless sudo. The fleet lab and the demo log in as it and escalate.
LOGIN_USER=admin
login_user() {
  local name
  for name in "$@"; do
    docker exec "$name" sh -c "id -u $LOGIN_USER >/dev/null 2>&1 || useradd -m -s /bin/bash $LOGIN_USER
      printf '%s ALL=(ALL) NOPASSWD:ALL\n' $LOGIN_USER > /etc/sudoers.d/90-gpufleet-lab
      chmod 0440 /etc/sudoers.d/90-gpufleet-lab && visudo -cq"
  done
}

ssh_access() {
  # SSH with pipelining and ControlPersist costs about a third less per task than docker exec
  # here (docs/benchmarks.md). The inventory keeps the hosts' names (the edge, the proxies'
  # certificates and the firewall use them); the ssh_config resolves them.
  local dir=$1; shift
  local key="$cache/ssh/id_ed25519" name addr hostkey
  mkdir -p "$dir" && install -d -m 0700 "$cache/ssh"
  # Ansible's ControlPersist sockets for these hosts live in DIR/cp (ansible_control_path_dir),
  # emptied here: a master left by earlier lab hosts of the same name or address would take
  # the new connections to a container that is gone.
  rm -rf "$dir/cp" && install -d -m 0700 "$dir/cp"
  [ -f "$key" ] || ssh-keygen -q -t ed25519 -N "" -C gpufleet-lab -f "$key"
  : > "$dir/known_hosts.tmp"
  : > "$dir/ssh_config.tmp"
  for name in "$@"; do
    login_user "$name"
    # the lab key logs in as root and as the unprivileged user
    docker exec -i "$name" sh -c "key=\$(cat); for home in /root /home/$LOGIN_USER; do
      owner=\$(stat -c %U \$home); install -d -m 0700 -o \$owner \$home/.ssh
      printf '%s\\n' \"\$key\" > \$home/.ssh/authorized_keys
      chown \$owner \$home/.ssh/authorized_keys; chmod 0600 \$home/.ssh/authorized_keys; done" < "$key.pub"
    for _ in $(seq 1 30); do
      hostkey=$(docker exec "$name" sh -c 'systemctl is-active --quiet ssh && cut -d" " -f1,2 /etc/ssh/ssh_host_ed25519_key.pub' 2>/dev/null) && break
      sleep 1
    done
    [ -n "$hostkey" ] || { log "sshd does not run on lab host $name"; exit 1; }
    addr=$(docker inspect -f '{{(index .NetworkSettings.Networks "gpufleet-lab").IPAddress}}' "$name")
    printf '%s,%s %s\n' "$name" "$addr" "$hostkey" >> "$dir/known_hosts.tmp"
    printf 'Host %s\n  HostName %s\n' "$name" "$addr" >> "$dir/ssh_config.tmp"
  done
  cat >> "$dir/ssh_config.tmp" <<CONFIG
Host *
  User root
  IdentityFile $key
  IdentitiesOnly yes
  UserKnownHostsFile $dir/known_hosts
  StrictHostKeyChecking yes
  ControlMaster auto
  ControlPersist 120s
  ForwardX11 no
  LogLevel ERROR
CONFIG
  chmod 0600 "$dir/known_hosts.tmp" "$dir/ssh_config.tmp"
  mv "$dir/known_hosts.tmp" "$dir/known_hosts" && mv "$dir/ssh_config.tmp" "$dir/ssh_config"
  echo "$dir/ssh_config"
}

clean() {
  docker ps -aq --filter label=io.gpufleet.lab | xargs -r docker rm -f >/dev/null
  docker volume ls -q --filter label=io.gpufleet.lab | xargs -r docker volume rm >/dev/null
  # Engine images are built on the base image (vllm-cpu-ray on vllm-cpu): remove children first.
  for _ in 1 2 3; do
    docker images --format '{{.Repository}}:{{.Tag}}' --filter label=io.gpufleet.lab \
      | xargs -r -n1 docker rmi >/dev/null 2>&1 || true
  done
  rm -rf "$cache/images" "$cache/models"
}

case "${1:-}" in
  docker) ensure_docker ;;
  image) ensure_docker; ensure_image "${2:?image name}" ;;
  image-tag) image_tag "${2:?image name}" ;;
  archive) ensure_docker; archive "${2:?image name}" ;;
  model) ensure_docker; model "${2:?model name}" ;;
  ssh) ssh_access "${2:?folder}" "${@:3}" ;;
  login-user) login_user "${@:2}" ;;
  clean) ensure_docker; clean ;;
  cache-dir) echo "$machine_cache" ;;
  *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
