#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 21 (top-k): the cluster top-k kernel's first-histogram variants (spread bins, sub-histograms, 192 KB
# slices for 262144-score rows) against the product top-k kernels and torch.topk, on the GPU host after
# `source .gpu/setup.sh` (run from the repo root; <= 150 s). Needs .gpu/extra/topk.tar.xz (build/gpu-extra/topk.tar.xz:
# build/sweep-topk from `python tools/sweeps/topk_cluster_variants.py build`) and the product bundle in
# $TIRX_KERNELS_ARTIFACTS (or .gpu/artifacts.tar.xz, unpacked here as tools/gpu_check.sh does).
# 1. the GPU tests of fast_topk_clusters (the product kernel, top_k's dispatch, CUDA graph, two streams);
# 2. every variant bit for bit against the single-CTA kernel (random, tied, +-inf / NaN / -0.0 rows), then the
#    timings (cold L2) at fp32 k = 2048: 1x, 32x (one wave), 64x131072, 256x262144, and bf16 64x131072; a table last.
set -uo pipefail
OUT=${OUT:-gpu-logs}
LOG="$OUT/topk"; mkdir -p "$LOG"
# setup.sh installs the wheels (tens of seconds): only when the caller has not sourced it
if [[ "${PYTHONPATH:-}" != */tmp/site* ]] && [ -f .gpu/setup.sh ]; then source .gpu/setup.sh; fi
if [ -z "${TIRX_KERNELS_ARTIFACTS:-}" ] && [ -f .gpu/artifacts.tar.xz ]; then
  mkdir -p /tmp/tirx-bundle && xz -dc .gpu/artifacts.tar.xz | tar -x -C /tmp/tirx-bundle
  export TIRX_KERNELS_ARTIFACTS=/tmp/tirx-bundle/artifacts
fi
EXTRA=/tmp/topk-extra
rm -rf "$EXTRA" && mkdir -p "$EXTRA"
if ! xz -dc .gpu/extra/topk.tar.xz | tar -x -C "$EXTRA"; then
  echo "topk: no .gpu/extra/topk.tar.xz (copy build/gpu-extra/topk.tar.xz there)"; exit 2
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$LOG/gpu.txt"
rc=0
# 1. correctness of the product kernel (unchanged schedule; its source changed: knobs off by default)
timeout -s INT 50 python -m pytest -q -x -p no:cacheprovider \
  packages/tirx-port-flashinfer/tests/test_topk_clusters.py -k "gpu_exact or gpu_graph or gpu_unaligned" \
  > "$LOG/pytest.log" 2>&1 || rc=1
tail -3 "$LOG/pytest.log"
# 2. variants: bit-exact checks, then timings and the table
timeout -s INT 85 python tools/sweeps/topk_cluster_variants.py run --dir "$EXTRA/sweep-topk" \
  > "$LOG/variants.log" 2>&1 || rc=1
grep -E "^MISMATCH|^correctness|FAILED|Error" "$LOG/variants.log" | head -20
sed -n '/^== /,$p' "$LOG/variants.log" | grep -v '^|' | tail -60
grep '^|' "$LOG/variants.log"
exit $rc
