#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run several tools/gpu_calls/<part>.sh checks in one device call, in the order given, each under its own limit and
# all within CALL_BUDGET seconds (the last parts are cut or skipped when time runs short); each part's log and files
# are packed into $OUT/<part>.tgz as it ends, so a call cut by the device limit still brings back what finished (at
# most 8 files: gpu.txt and seven parts). From the carried checkout's root, after staging with
# tools/gpu_stage_clean.sh, the bundle in .gpu/artifacts.tar.xz and the parts' extra tars in .gpu/extra/:
#   CALL_BUDGET=520 bash tools/gpu_calls/run_parts.sh norms:70 merge:45 quant:55 attn:90 deepgemm:85 topk:85 mamba:60
# (2026-12-07f's plan for the helpers' checks; that session's device time ran out in refused starts before it ran.)
set -o pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
[ -f .gpu/clean-src.sh ] && [ "$PWD" != /tmp/src ] && source .gpu/clean-src.sh
if [ -z "${TIRX_KERNELS_ARTIFACTS:-}" ] && [ -f .gpu/artifacts.tar.xz ]; then
  mkdir -p /tmp/tirx-bundle && xz -dc .gpu/artifacts.tar.xz | tar -x -C /tmp/tirx-bundle
  export TIRX_KERNELS_ARTIFACTS=/tmp/tirx-bundle/artifacts
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
END=$(( $(date +%s) + ${CALL_BUDGET:-520} ))
export NORMS_TEST_LIMIT=${NORMS_TEST_LIMIT:-40} NORMS_BENCH_LIMIT=${NORMS_BENCH_LIMIT:-18}
for spec in "$@"; do
  name=${spec%%:*}; limit=${spec#*:}; [ "$limit" = "$spec" ] && limit=90
  left=$(( END - $(date +%s) - 5 )); [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -lt 10 ] && { echo "== $name skipped (no time left)"; continue; }
  t0=$(date +%s)
  timeout -s INT "$limit" bash "tools/gpu_calls/$name.sh" > "$OUT/$name.txt" 2>&1
  echo "== $name rc=$? in $(( $(date +%s) - t0 )) s (limit $limit)" >> "$OUT/$name.txt"
  echo "######## $name"; grep -v "^\s*$" "$OUT/$name.txt" | tail -"${TAIL:-25}" | cut -c1-160
  (cd "$OUT" && tar -czf "$name.tgz" "$name.txt" $( [ -d "$name" ] && echo "$name") && rm -rf "$name.txt" "$name")
done
