#!/usr/bin/env bash
# Recipe of the Debian 13 (trixie) base that tests/labtests/test_execution_environment.py builds
# the execution environment's steps on: Python 3.13 (ansible-core 2.21 needs 3.12 or newer) and
# pip, no systemd; debootstrap minbase, imported as TAG.   build.sh TAG MIRROR CA_BUNDLE
set -euo pipefail
tag=$1 mirror=$2 ca_bundle=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(mktemp -d /var/tmp/gpufleet-lab-ee-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$(grep -Ev '^\s*(#|$)' "$here/packages.txt" | paste -sd, -)" \
  trixie "$root" "$mirror" >&2
install -D -m 0644 "$ca_bundle" "$root/usr/local/share/gpufleet-lab/ca-bundle.crt"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
# pip trusts the machine's CA bundle (PyPI may be reached through a proxy that re-signs)
tar -C "$root" -c . | docker import \
  -c 'ENV PIP_CERT=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'ENV SSL_CERT_FILE=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'LABEL io.gpufleet.lab=ee-base' \
  -c 'CMD ["/bin/bash"]' \
  - "$tag" >&2
