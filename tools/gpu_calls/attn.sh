#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Attention schedule variants (issues 22 / 23), one GPU call of <= 180 s, from the repo root after
# `source .gpu/setup.sh`: every variant of tools/sweeps/attn_schedules.py checked against an fp32 oracle on small ragged
# shapes, then timed beside torch SDPA (cuDNN, flash) at b2 h16 s8192 bf16: forward hd128, hd128 causal, hd64, backward
# hd128. The kernels are prebuilt on the CPU machine (`python tools/sweeps/attn_schedules.py build --out
# build/sweep-attn`, packed as build/gpu-extra/attn.tar.xz, carried as .gpu/extra/attn.tar.xz). Logs in $OUT/attn/.
set -uo pipefail
OUT=${OUT:-gpu-logs}
LOG="$OUT/attn"
mkdir -p "$LOG"
[ -f .gpu/setup.sh ] && source .gpu/setup.sh
DIR=/tmp/attn-sweep
rm -rf "$DIR" && mkdir -p "$DIR"
if ! xz -dc .gpu/extra/attn.tar.xz | tar -x -C "$DIR"; then
  echo "attn: .gpu/extra/attn.tar.xz missing or unreadable" | tee "$LOG/error.txt"
  exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > "$LOG/gpu.txt"
timeout -s INT 165 python3 tools/sweeps/attn_schedules.py run --dir "$DIR/sweep-attn" > "$LOG/run.log" 2>&1
rc=$?
cat "$LOG/gpu.txt"
# the table (the run's last lines); on a failure before it, the tail of the log
grep -A100 "TFLOP/s = " "$LOG/run.log" || tail -30 "$LOG/run.log"
echo "attn: rc=$rc"
exit $rc
