#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Mamba-2 selective_state_update: the bulk-copy-staged state tile and 16-byte B / C staging (_ssu_kernel_tma's
# state_io / stage_vectors; 38 variants, ptxas registers in the table) against the registered register-loading
# forms and FlashInfer 0.7.4 in place (tools/sweeps/ssu_tma_schedules.py run). Each variant is checked against the
# fp32 oracle first, then timed (CUDA events, cold L2, 5 interleaved rounds) at STP b64 d64 s128, STP b64 d128 s256
# and MTP b1 / b512 / b2048 T=6 d64 s128, bf16 state. Run from the repo root on the GPU host after
# `source .gpu/setup.sh`, with .gpu/extra/mamba.tar.xz (build/gpu-extra/mamba.tar.xz, 0.2 MiB, made on the CPU
# machine: `python tools/sweeps/ssu_tma_schedules.py build --out build/sweep-ssu-tma`, then
# `tar -C build -cf - --exclude='*.cu' --exclude='.build-*' sweep-ssu-tma | xz -9 > build/gpu-extra/mamba.tar.xz`).
# About 1.5-3 minutes (the run is capped at 190 s); logs in $OUT/mamba/.
set -uo pipefail
OUT=${OUT:-gpu-logs}
log="$OUT/mamba"; mkdir -p "$log"
t0=$(date +%s)
mkdir -p build && xz -dc .gpu/extra/mamba.tar.xz | tar -x -C build || { echo "mamba: no .gpu/extra/mamba.tar.xz"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$log/gpu.txt"
timeout -s INT 190 python3 tools/sweeps/ssu_tma_schedules.py run --dir build/sweep-ssu-tma > "$log/run.log" 2>&1
rc=$?
grep -v "^== table" "$log/run.log" | grep -E "^==|FAILED|Error|error" | tail -30
echo "mamba: rc $rc in $(( $(date +%s) - t0 )) s; table (us, FlashInfer us / ours):"
if grep -q "^== table" "$log/run.log"; then
  sed -n '/^== table/,$p' "$log/run.log" | tail -110
else  # cut short: the shapes finished so far, as they were printed
  grep -v "^\[" "$log/run.log" | tail -80
fi
exit $rc
