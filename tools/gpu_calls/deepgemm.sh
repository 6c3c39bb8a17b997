#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 24 (DeepGEMM SM90 FP8 GEMMs): the candidate tiles of _fp8_gemm_op.CANDIDATE_TILES (A multicast over 1 x 2
# clusters, 256-row tiles, scales read ahead) and the product tile, each checked against the fp32 oracle (calc_diff
# < 1e-3) and timed beside cuBLASLt blockwise torch._scaled_mm (and the registered op where the bundle is there) at
# 1d2d m4096 n4096 k7168 / m4096 n7168 k16384, contiguous g4 m8192 n4096 k7168, masked g1 m1024 n4096 k7168.
# Run from the repo root on the GPU host; the .so files come in .gpu/extra/deepgemm.tar.xz (built here with
# `python tools/sweeps/deepgemm_fp8_variants.py build --out build/sweep-deepgemm`, packed by
# `tar -C build -cf - sweep-deepgemm | xz -9 > build/gpu-extra/deepgemm.tar.xz`). About 60-120 s.
set -uo pipefail
OUT=${OUT:-gpu-logs}
LOG="$OUT/deepgemm"
mkdir -p "$LOG"
[ -f .gpu/setup.sh ] && source .gpu/setup.sh
DIR=/tmp/deepgemm-extra
rm -rf "$DIR" && mkdir -p "$DIR"
xz -dc .gpu/extra/deepgemm.tar.xz | tar -x -C "$DIR" || { echo "deepgemm: no .gpu/extra/deepgemm.tar.xz"; exit 1; }
if [ -z "${TIRX_KERNELS_ARTIFACTS:-}" ] && [ -f .gpu/artifacts.tar.xz ]; then
  mkdir -p /tmp/tirx-bundle && xz -dc .gpu/artifacts.tar.xz | tar -x -C /tmp/tirx-bundle
  export TIRX_KERNELS_ARTIFACTS=/tmp/tirx-bundle/artifacts
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$LOG/gpu.txt"
timeout 170 python3 tools/sweeps/deepgemm_fp8_variants.py run --dir "$DIR/sweep-deepgemm" > "$LOG/run.log" 2>&1
rc=$?
grep -E "calc_diff|FAILED|Error|error" "$LOG/run.log" | tail -30
sed -n '/^shape /,$p' "$LOG/run.log"
[ $rc -eq 0 ] || { echo "deepgemm: run exited $rc"; tail -20 "$LOG/run.log"; }
exit $rc
