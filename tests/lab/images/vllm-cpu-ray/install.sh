#!/bin/sh
# Runs inside a container of the lab's vLLM CPU image (see build.sh): adds Ray with its
# dashboard (the `default` extra) to the engine's own environment, /opt/vllm, without moving
# any package vLLM already has (every installed version is a constraint).
#   install.sh RAY_VERSION
set -eu
RAY_VERSION=$1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
/opt/vllm/bin/pip freeze --exclude-editable | grep -v '^vllm' > /tmp/installed.txt
/opt/vllm/bin/pip install --quiet -c /tmp/installed.txt "ray[default]==${RAY_VERSION}"
# Bytecode once, here (the image runs with PYTHONDONTWRITEBYTECODE=1): only what is new.
/opt/vllm/bin/python -m compileall -q -j 0 /opt/vllm/lib/python3.11/site-packages >/dev/null || true
rm -rf /root/.cache /tmp/*
/opt/vllm/bin/python -c "import ray; print('ray', ray.__version__)"
