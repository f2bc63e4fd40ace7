#!/usr/bin/env bash
# make lint: `ansible-builder create` on execution-environment.yml, with the collection tarball
# it takes (make build-collection's), into .cache/ee-context; fails when the context lacks the
# tarball (ansible-builder only warns about a source that matches nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${BIN:-.venv/bin}"
version=$("$BIN/python" -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])')
rm -f .cache/dist/gpufleet-serving-*.tar.gz
"$BIN/ansible-galaxy" collection build --force --output-path .cache/dist >/dev/null
rm -rf .cache/ee-context
"$BIN/ansible-builder" create -f execution-environment.yml -c .cache/ee-context >/dev/null
test -s ".cache/ee-context/_build/collections/gpufleet-serving-$version.tar.gz" || {
  echo "ee: the build context lacks gpufleet-serving-$version.tar.gz (execution-environment.yml's" \
    "additional_build_files)" >&2
  exit 1
}
grep -q "collections/gpufleet-serving-$version.tar.gz" .cache/ee-context/_build/requirements.yml || {
  echo "ee: the context's requirements.yml does not install gpufleet-serving-$version.tar.gz" >&2
  exit 1
}
echo "ee: ansible-builder create made .cache/ee-context with gpufleet.serving $version"
