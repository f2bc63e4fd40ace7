#!/usr/bin/env bash
# PACKAGE STAND-INS for the lab (not NVIDIA software): tiny .deb files named and versioned
# like a driver branch and the NVIDIA Container Toolkit, built here with dpkg-deb, so the
# roles' "local package folder" path runs real apt against them: install a pinned version,
# hold it, refuse to move it silently, upgrade it on request. They contain only a text file
# saying what they are (and, for the toolkit, a config.toml to edit).
#   build.sh OUT_DIR
set -euo pipefail
out=$1
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

deb() {  # deb NAME VERSION DEPENDS [FILE_PATH FILE_CONTENT]
  local name=$1 version=$2 depends=$3 dir="$work/$1_$2"
  mkdir -p "$dir/DEBIAN" "$dir/usr/share/doc/$name"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: all"
    echo "Maintainer: gpufleet lab <lab@gpufleet.invalid>"
    [ -n "$depends" ] && echo "Depends: $depends"
    echo "Description: gpufleet lab stand-in for $name $version"
    echo " A package stand-in built by tests/lab/standin-debs/build.sh; it installs nothing real."
  } > "$dir/DEBIAN/control"
  echo "gpufleet lab PACKAGE STAND-IN: $name $version (not NVIDIA software)" > "$dir/usr/share/doc/$name/STAND-IN"
  if [ $# -ge 5 ]; then
    mkdir -p "$dir/$(dirname "$4")"
    printf '%s\n' "$5" > "$dir/$4"
    echo "$4" > "$dir/DEBIAN/conffiles"
  fi
  dpkg-deb --root-owner-group --build "$dir" "$out/${name}_${version}_all.deb" >/dev/null
}

# A driver branch, three releases: 580.159.03 (below NVIDIA's security minimum for R580),
# 580.178.04 (the minimum) and a later stand-in release.
for v in 580.159.03-1 580.178.04-1 580.195.02-1; do
  deb gpufleet-standin-libnvidia-compute "$v" ""
  deb gpufleet-standin-nvidia-driver "$v" "gpufleet-standin-libnvidia-compute (= $v)"
done

# The NVIDIA Container Toolkit's four packages, two releases each (1.17.7 is the last one
# without the CVE-2025-23266 fix). The base package carries a config.toml like the real one's
# top-level sections, so the role's settings are applied to a real file.
config='#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[features]'
for v in 1.17.7-1 1.17.8-1; do
  deb libnvidia-container1 "$v" ""
  deb libnvidia-container-tools "$v" "libnvidia-container1 (= $v)"
  deb nvidia-container-toolkit-base "$v" "" /etc/nvidia-container-runtime/config.toml "$config"
  deb nvidia-container-toolkit "$v" "nvidia-container-toolkit-base (= $v), libnvidia-container-tools (= $v)"
done

# NVIDIA's dcgm-exporter package (datacenter-gpu-manager-exporter; its Debian version is the
# exporter's own, 4.8.2 in NVIDIA/dcgm-exporter 4.5.3-4.8.2) as a HARDWARE STAND-IN: /usr/bin/dcgm-exporter
# is tests/lab/dcgm-exporter-standin serving a real capture (8 GPUs; --gpus N keeps fewer). No systemd
# unit: the exporters role writes its own. Built here, not with deb(): it carries three files.
lab=$(cd "$(dirname "$0")/.." && pwd)
name=datacenter-gpu-manager-exporter version=4.8.2-1
dir="$work/${name}_$version"
mkdir -p "$dir/DEBIAN" "$dir/usr/bin" "$dir/usr/share/gpufleet-standin/dcgm-exporter" "$dir/usr/share/doc/$name"
cat > "$dir/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: all
Maintainer: gpufleet lab <lab@gpufleet.invalid>
Depends: python3
Description: gpufleet lab HARDWARE STAND-IN for NVIDIA dcgm-exporter $version
 Serves a captured dcgm-exporter /metrics text on :9400 and injects faults read from
 /etc/gpufleet-standin/dcgm-fault; it reads no GPU. Built by tests/lab/standin-debs/build.sh.
EOF
install -m 0755 "$lab/dcgm-exporter-standin" "$dir/usr/bin/dcgm-exporter"
install -m 0644 "$lab/../fixtures/dcgm/8x_a800_sxm4_80gb_mig.txt" "$dir/usr/share/gpufleet-standin/dcgm-exporter/metrics.txt"
echo "gpufleet lab HARDWARE STAND-IN: $name $version (not NVIDIA software): /usr/bin/dcgm-exporter serves the capture in /usr/share/gpufleet-standin/dcgm-exporter/metrics.txt (source in its header) and reads faults from /etc/gpufleet-standin/dcgm-fault (usage: dcgm-exporter --help)" > "$dir/usr/share/doc/$name/STAND-IN"
dpkg-deb --root-owner-group --build "$dir" "$out/${name}_${version}_all.deb" >/dev/null
ls "$out"
