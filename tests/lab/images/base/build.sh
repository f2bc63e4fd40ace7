#!/usr/bin/env bash
# Recipe of the slim Debian 12 base for engine images (no systemd): debootstrap minbase,
# imported as TAG.   build.sh TAG MIRROR CA_BUNDLE
set -euo pipefail
tag=$1 mirror=$2 ca_bundle=$3
here=$(cd "$(dirname "$0")" && pwd)
pkgs=$(grep -Ev '^\s*(#|$)' "$here/packages.txt" | paste -sd, -)
root=$(mktemp -d /var/tmp/gpufleet-lab-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$pkgs" bookworm "$root" "$mirror" >&2
install -D -m 0644 "$ca_bundle" "$root/usr/local/share/gpufleet-lab/ca-bundle.crt"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
tar -C "$root" -c . | docker import \
  -c 'ENV SSL_CERT_FILE=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'ENV PIP_CERT=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'ENV REQUESTS_CA_BUNDLE=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'LABEL io.gpufleet.lab=base' \
  -c 'CMD ["/bin/bash"]' \
  - "$tag" >&2
