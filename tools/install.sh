#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install everything the CPU jobs need, from scratch: torch (CPU build), the TIRx compiler, the runtime,
# the build/test tools, and every package of this repo in editable mode. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python3 -m pip"
python3 -c "import torch" 2>/dev/null || $PIP install -q torch==2.13.0
$PIP install -q \
  "apache-tvm==0.27.0.post1" "apache-tvm-ffi==0.1.15.post2" "hatchling>=1.21" "editables>=0.5" "packaging>=23" \
  "pytest>=8" "pytest-xdist>=3.5" "ruff==0.17.6" "nvidia-cuda-cuobjdump==13.2.51" "nvidia-cuda-nvdisasm==13.2.86" \
  "pyyaml==6.0.3" "kcoral==0.1.1" "matplotlib==3.11.2"
# One pip call: editable installs of namespace packages; build isolation off (hatchling and editables, its
# editable-build requirement, are installed above).
$PIP install -q --no-deps --no-build-isolation \
  -e packages/tirx-core -e packages/tirx-native -e packages/tirx-port-flashinfer -e packages/tirx-port-cudnn \
  -e packages/tirx-port-deepgemm -e packages/tirx-port-flashmla -e packages/tirx-port-misc
python3 -m tirx_kernels.registry >/dev/null
echo "install.sh: done ($(python3 -c 'import torch, tvm; print("torch", torch.__version__, "tvm", tvm.__version__)'))"
