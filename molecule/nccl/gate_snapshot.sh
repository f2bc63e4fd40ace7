#!/bin/bash
# gate.yml's picture of a lab host, compared before and after each run of site.yml: /etc
# (every entry's type, mode, owner and link target, and every file's checksum), the package
# list, gpufleet's helper folders, and Docker's state (installed or not; if it is, its
# containers and images).
set -euo pipefail
echo '## /etc entries'
find /etc -xdev -printf '%y %m %u:%g %p %l\n' | LC_ALL=C sort
echo '## /etc checksums'
find /etc -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
echo '## packages'
dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\n'
echo '## helper folders'
find /usr/local/libexec /usr/local/lib /usr/local/bin -xdev -printf '%y %m %p\n' 2>/dev/null | LC_ALL=C sort || true
echo '## docker'
if command -v docker >/dev/null 2>&1; then
  docker ps -a --no-trunc --format '{{.ID}} {{.Image}} {{.Names}} {{.State}}'
  docker images --no-trunc --format '{{.ID}} {{.Repository}}:{{.Tag}}'
else
  echo 'docker is not installed'
fi
