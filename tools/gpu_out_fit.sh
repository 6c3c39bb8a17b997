#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fit a device call's $OUT to what comes back: at most 8 files (2026-12-07e: a call that left 10 lost its
# suite parts, 28 kernels' rows). Keeps suite.tar.gz and caches.tar.xz as they are and packs everything else into
# logs.tar.gz when there are more than 8 entries. Run it last in a call script: bash tools/gpu_out_fit.sh "$OUT"
set -uo pipefail
out=${1:-${OUT:-gpu-logs}}
[ -d "$out" ] || exit 0
n=$(find "$out" -mindepth 1 -maxdepth 1 | wc -l)
[ "$n" -le 8 ] && exit 0
mapfile -t rest < <(cd "$out" && find . -mindepth 1 -maxdepth 1 ! -name suite.tar.gz ! -name caches.tar.xz \
  ! -name logs.tar.gz -printf '%P\n' | sort)
tar -C "$out" -czf "$out/logs.tar.gz.tmp" "${rest[@]}" && (cd "$out" && rm -rf "${rest[@]}") \
  && mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
echo "gpu_out_fit: $n entries in $out, ${#rest[@]} packed into logs.tar.gz"
