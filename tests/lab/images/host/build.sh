#!/usr/bin/env bash
# Recipe of the lab host image: a systemd-enabled Debian 12 root filesystem made with
# (docker import cannot set STOPSIGNAL: the lab create playbook passes SIGRTMIN+3.)
# debootstrap, imported into the local Docker engine as TAG. Called by harness.sh only
# when no image with this recipe's hash exists.
#   build.sh TAG MIRROR CA_BUNDLE
set -euo pipefail
tag=$1 mirror=$2 ca_bundle=$3
here=$(cd "$(dirname "$0")" && pwd)
pkgs=$(grep -Ev '^\s*(#|$)' "$here/packages.txt" | paste -sd, -)
root=$(mktemp -d /var/tmp/gpufleet-lab-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include="$pkgs" bookworm "$root" "$mirror" >&2

# Apt sources like a real host's: the same mirror, with updates and security.
security=${mirror%/debian}/debian-security
[ "$security" = "$mirror/debian-security" ] && security=http://deb.debian.org/debian-security
rm -f "$root/etc/apt/sources.list"
cat > "$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES

# Trust the build machine's CA bundle (TLS to the package registries is intercepted
# here). It gets a path of its own: installing ca-certificates regenerates
# /etc/ssl/certs/ca-certificates.crt and would drop it.
install -D -m 0644 "$ca_bundle" "$root/usr/local/share/gpufleet-lab/ca-bundle.crt"
cat >> "$root/etc/environment" <<ENVIRON
SSL_CERT_FILE=/usr/local/share/gpufleet-lab/ca-bundle.crt
PIP_CERT=/usr/local/share/gpufleet-lab/ca-bundle.crt
REQUESTS_CA_BUNDLE=/usr/local/share/gpufleet-lab/ca-bundle.crt
ENVIRON

# A container boots systemd as PID 1: drop the units that make no sense there.
for unit in getty@tty1.service console-getty.service systemd-udevd.service \
    systemd-udev-trigger.service systemd-firstboot.service systemd-modules-load.service \
    sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
    systemd-remount-fs.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
: > "$root/etc/machine-id"
echo 'lab-host' > "$root/etc/hostname"
# No package caches in the image; the apt lists stay, as on a real installed host.
rm -rf "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb

tar -C "$root" -c . | docker import \
  -c 'ENV container=docker' \
  -c 'ENV SSL_CERT_FILE=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'ENV PIP_CERT=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'ENV REQUESTS_CA_BUNDLE=/usr/local/share/gpufleet-lab/ca-bundle.crt' \
  -c 'CMD ["/lib/systemd/systemd"]' \
  -c "LABEL io.gpufleet.lab=host" \
  - "$tag" >&2
