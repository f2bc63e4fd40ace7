#!/usr/bin/env bash
# Builds the lab's vLLM CPU image with Ray as TAG on top of the lab's vLLM CPU image VLLM_TAG
# (tests/labtests/test_ray_group.py runs a Ray group's rendered containers from it): a
# container of VLLM_TAG runs install.sh, then is committed with vLLM's entrypoint again.
#   build.sh TAG VLLM_TAG
set -euo pipefail
tag=$1 vllm=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/versions.env"
name=gpufleet-lab-vllm-ray-build-$$
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
start=$(date +%s)
docker run --name "$name" -v "$here/install.sh:/install.sh:ro" --entrypoint /bin/sh "$vllm" /install.sh \
  "$RAY_VERSION" >&2
docker commit \
  -c 'LABEL io.gpufleet.lab=vllm-cpu-ray' \
  -c 'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]' \
  -c 'CMD []' \
  "$name" "$tag" >/dev/null
echo "lab: built $tag in $(($(date +%s) - start)) s" >&2
