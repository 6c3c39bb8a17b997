#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One full GPU evidence run on a host staged with ../shared/gpu/stage (run from the repo root there):
# correctness of every (kernel, config), graphs/torch.compile, compute-sanitizer on small configs, and
# the bench with references. Logs go to $OUT (or ./gpu-logs); a short table is printed last.
#   bash tools/gpu_check.sh [test|sanitize|general|bench|suite|gemm-sweep|c2x2|micro|breakdown|ssu-sweep|all] [args]
# FlashInfer references without its JIT: put the tar.xz of tools/flashinfer_aot.py into .gpu/trees/ after staging
# with --ref flashinfer (setup.sh unpacks it into the staged tree).
# gemm-sweep needs every tile in the bundle: build them with `python tools/gemm_sweep.py tiles` + build --params.
# The wgmma layer micro-kernels (test_lang_wgmma_numerics.py) run from build/lang-micro: build it on the CPU
# machine with `python packages/tirx-core/tests/test_lang_wgmma_gpu.py build/lang-micro` and carry it.
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
what=${1:-all}; shift || true
[ -f .gpu/setup.sh ] && source .gpu/setup.sh
# A whole bundle is ~46 MiB of .so files, ~4.5 MiB xz-packed (2026-12-07): carry .gpu/artifacts.tar.xz (made by
# `tar -C build -cf - artifacts | xz -T2 > .gpu/artifacts.tar.xz`) instead of .gpu/artifacts/, unpacked here.
# fla's Triton kernels took 100-116 s of compiling per fresh host in 2026-12-07's test runs (test_kda_forward h96,
# test_gdn_bprop), and the torch.compile references compile per row: the compile caches (Triton's, and Inductor's
# FX-graph / autotune cache) brought back from an earlier run ($OUT/caches.tar.xz, packed at the end: triton/ and
# inductor/) and carried as .gpu/caches.tar.xz are unpacked first (.gpu/triton-cache.tar.xz: a Triton cache alone).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor}
if [ -n "${TRITON_CACHE_DIR:-}" ]; then
  mkdir -p "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR"
  [ -f .gpu/triton-cache.tar.xz ] && xz -dc .gpu/triton-cache.tar.xz | tar -x -C "$TRITON_CACHE_DIR"
  if [ -f .gpu/caches.tar.xz ]; then
    mkdir -p /tmp/caches && xz -dc .gpu/caches.tar.xz | tar -x -C /tmp/caches
    cp -a /tmp/caches/triton/. "$TRITON_CACHE_DIR"/ 2>/dev/null; cp -a /tmp/caches/inductor/. "$TORCHINDUCTOR_CACHE_DIR"/ 2>/dev/null
  fi
fi
pack_caches() {  # at most 24 MiB packed, else not brought back
  [ -n "${TRITON_CACHE_DIR:-}" ] && [ -d "$TRITON_CACHE_DIR" ] || return 0
  rm -rf /tmp/caches-out && mkdir -p /tmp/caches-out && ln -s "$TRITON_CACHE_DIR" /tmp/caches-out/triton
  [ -d "$TORCHINDUCTOR_CACHE_DIR" ] && ln -s "$TORCHINDUCTOR_CACHE_DIR" /tmp/caches-out/inductor
  tar -C /tmp/caches-out -chf - . | xz -T0 -6 > "$OUT/caches.tar.xz"
  [ "$(stat -c %s "$OUT/caches.tar.xz")" -le $((24 << 20)) ] || rm -f "$OUT/caches.tar.xz"
}
trap 'pack_caches; bash tools/gpu_out_fit.sh "$OUT"' EXIT
if [ -f .gpu/artifacts.tar.xz ]; then
  mkdir -p /tmp/tirx-bundle && xz -dc .gpu/artifacts.tar.xz | tar -x -C /tmp/tirx-bundle
  export TIRX_KERNELS_ARTIFACTS=/tmp/tirx-bundle/artifacts
fi
export MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
if python3 -c "import flashinfer" 2>/dev/null; then
  # FlashInfer JIT-builds each module on first use (norm ~49 s): build once, before parallel workers race.
  python3 - <<'PY' 2>&1 | tail -2 | tee "$OUT/flashinfer_warm.log"
import time, torch, flashinfer
t = time.time()
x = torch.randn(8, 256, dtype=torch.bfloat16, device="cuda")
flashinfer.norm.rmsnorm(x, torch.ones(256, dtype=torch.bfloat16, device="cuda"))
flashinfer.activation.silu_and_mul(x); flashinfer.activation.gelu_and_mul(x); flashinfer.activation.gelu_tanh_and_mul(x)
torch.cuda.synchronize(); print(f"flashinfer JIT warm in {time.time() - t:.0f} s")
PY
fi
rc=0
if [ "$what" = all ] || [ "$what" = test ]; then
  # TEST_K: a -k expression; TEST_IDS: a file of node ids (e.g. the failures of an earlier run); TEST_LIMIT: seconds,
  # then SIGINT, so pytest still prints the reasons of what failed so far (a plain timeout kill loses them all:
  # 2026-12-07, run 6).
  sel=(packages/*/tests); [ -n "${TEST_IDS:-}" ] && mapfile -t sel < "$TEST_IDS"
  timeout -s INT "${TEST_LIMIT:-540}" python3 -m pytest -n "${TEST_WORKERS:-8}" -q -rfEs --tb=short -p no:cacheprovider \
    -p timeout --timeout 300 ${TEST_K:+-k "$TEST_K"} --junitxml="$OUT/junit.xml" "${sel[@]}" > "$OUT/pytest.log" 2>&1 || rc=1
  sed -n '/short test summary/,$p' "$OUT/pytest.log" | grep -vE "^SKIPPED" | cut -c1-300 | tail -40
  gzip -f "$OUT/pytest.log"
fi
if [ "$what" = all ] || [ "$what" = sanitize ]; then
  for kc in "rmsnorm bf16_37x2880_strided" "act_and_mul gelu_bf16_37x4096" "fp16_bf16_gemm bf16_129x264x72" \
            "fp16_bf16_gemm bf16_100x264x72_smallm_k8" "fp16_bf16_gemm bf16_37x520x1048_smallm_k4" \
            "fp16_bf16_gemm bf16_300x520x24_nn_c2" "fp16_bf16_gemm fp16_300x520x24_alpha_beta_bias" \
            "fp16_bf16_gemm bf16_2000x1544x72_pingpong_128x128" "fp16_bf16_gemm bf16_300x520x136_alpha_beta_bias_s4_e128" \
            "fp16_bf16_gemm fp16_300x520x136_persistent_s4_e128_c2" "fp16_bf16_gemm bf16_1000x1032x1048_nn_bias_128x64" \
            "fp16_bf16_gemm bf16_300x200x136_persistent_128x224" "fp16_bf16_gemm bf16_5x520x72_smallm_224_bk128_k4" \
            "fp16_bf16_gemm bf16_16x600x136_smallm_bk256_k2" "fp16_bf16_gemm bf16_100x264x1048_smallm_128x64_k2" \
            "fp16_bf16_gemm bf16_300x520x136_persistent_128x128_c2x2" "fp16_bf16_gemm fp16_300x520x136_pingpong_128x192_c2x2" \
            "fp16_bf16_gemm fp16_300x520x136_nn_alpha_beta_bias_c2x2" \
            "fp16_bf16_gemm fp16_37x200x520_smallm_64x64_k2" "rmsnorm fp16_37x16384" "rmsnorm fp16_37x7168_strided"; do
    set -- $kc
    # --report-api-errors no: with the CuTe-DSL stack staged, importing the references' cuda-python probes
    # driver entry points (cuGetProcAddress -> CUDA_ERROR_INVALID_VALUE, 34 per process): host-API noise that
    # made the exit code 9 with no device error (docs/measurements/2026-12-02-h200-c/sanitizer-run3.log).
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m tirx_kernels.test --kernel "$1" --config "$2" \
      >> "$OUT/sanitizer.log" 2>&1; echo "memcheck $1 $2 rc=$?" | tee -a "$OUT/sanitizer.log"
  done
  # The split-K cluster kernel reduces through distributed shared memory: racecheck its idle-rank configs too.
  # ... and the ping-pong consumers' turn-taking (208 tiles on 132 CTAs: both consumers of a CTA take tiles).
  # (racecheck of a persistent 128x224 config reports hazards inside cuBLAS's nvjet kernel, the test's reference
  # call, none in ours: docs/measurements/2026-12-03-h200/run1-sanitizer.log.)
  for c in bf16_100x264x72_smallm_k8 bf16_37x520x1048_smallm_k4 bf16_2000x1544x72_pingpong_128x128 \
           bf16_5x520x72_smallm_224_bk128_k4; do
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m tirx_kernels.test --kernel fp16_bf16_gemm \
      --config "$c" >> "$OUT/sanitizer.log" 2>&1; echo "racecheck fp16_bf16_gemm $c rc=$?" | tee -a "$OUT/sanitizer.log"
  done
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  ks=${*:-rmsnorm act_and_mul fp16_bf16_gemm}
  args=(); for k in $ks; do args+=(--kernel "$k"); done
  python3 -m tirx_kernels.bench "${args[@]}" --with-references --json > "$OUT/bench.json" 2> "$OUT/bench.err" || rc=1
  python3 - "$OUT/bench.json" <<'PY'
import json, sys
from tirx_kernels.bench import format_row
rows = json.load(open(sys.argv[1]))
if rows:
    c = rows[0]["ceilings"]; print(f"ceilings: copy {c['copy_tb_s']:.2f} TB/s, cuBLAS bf16 8192^3 {c['bf16_tflop_s']:.0f} TFLOP/s")
for r in rows:
    print(r["kernel"][:14], format_row(r))
PY
fi
if [ "$what" = suite ]; then
  # Bench-suite rows with references, one run JSON per kernel (`run --parts`: written as each kernel finishes, so a
  # cut call keeps what it measured; `promote --partial` pins them). SUITE_LIMIT: seconds for the whole list;
  # SUITE_KERNEL_TIMEOUT: a kernel past it is marked and skipped, and the run starts again after it (one process for
  # all kernels otherwise: a process per kernel cost ~7 s each on 2026-12-07). Needs the source stamp
  # (`python -m tirx_kernels.bench_suite stamp` after staging) since the host has no .git.
  end=$(( $(date +%s) + ${SUITE_LIMIT:-540} )); mkdir -p "$OUT/suite"
  # `suite needed`: the kernels this card's pinned rows lack or hold stale, cheapest first (`status --names`)
  if [ "${1:-}" = needed ]; then
    card=$(python3 -c "import torch; from tirx_kernels.bench_suite.cards import card_key; print(card_key(torch.cuda.get_device_name()))")
    set -- $(python3 -m tirx_kernels.bench_suite status --card "$card" --names)
    echo "suite needed on $card: $*" | tee "$OUT/suite-needed.txt"
  fi
  args=(); for k in "$@"; do args+=(--kernel "$k"); done
  while :; do
    left=$(( end - $(date +%s) )); [ "$left" -lt 30 ] && { echo "suite: out of time"; break; }
    timeout -s KILL "$left" python3 -m tirx_kernels.bench_suite run --parts "$OUT/suite" --with-references \
      --no-progress --time-limit $(( left - 20 )) --kernel-timeout "${SUITE_KERNEL_TIMEOUT:-240}" "${args[@]}" \
      >> "$OUT/suite.log" 2>&1
    code=$?; [ "$code" = 124 ] || break  # 124: a kernel ran past its limit (marked); go on after it
  done
  [ "${code:-0}" = 0 ] || rc=1
  grep -E "reference skipped|failed:|error:|past its|not started|parts written" "$OUT/suite.log" | cut -c1-220 | tail -40
  tar -C "$OUT" -czf "$OUT/suite.tar.gz" suite && rm -rf "$OUT/suite"
fi
if [ "$what" = all ] || [ "$what" = micro ]; then
  # Layer micro-kernels from the prebuilt bundle (build/lang-micro); a wrong barrier phase hangs: time-boxed.
  timeout 300 python3 -m pytest -q -rs -p no:cacheprovider packages/tirx-core/tests/test_lang_wgmma_numerics.py \
    packages/tirx-core/tests/test_lang_tma_numerics.py 2>&1 | tee "$OUT/micro.log" | tail -5 || rc=1
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
    -k "ring or multicast" packages/tirx-core/tests/test_lang_tma_numerics.py >> "$OUT/sanitizer.log" 2>&1
  echo "memcheck micro ring/multicast rc=$?" | tee -a "$OUT/sanitizer.log"
fi
if [ "$what" = all ] || [ "$what" = sanitize ] || [ "$what" = general ]; then
  # The general (any-size) kernels and the GEMM's odd-shape paths: head/tail accesses, shifted weight / gate / up
  # loads (16-byte reads that may pass a tensor's end inside its last 16-byte block), st.global C stores, padding.
  for kc in "rmsnorm bf16_37x3001_strided_odd" "rmsnorm fp16_37x7_strided_odd" "rmsnorm bf16_3x262144" \
            "act_and_mul gelu_tanh_bf16_37x5121" "act_and_mul gelu_fp16_4099x3" \
            "fp16_bf16_gemm bf16_129x1001x136_stg" "fp16_bf16_gemm bf16_300x77x73_nn_alpha_beta_padded"; do
    set -- $kc
    timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m tirx_kernels.test \
      --kernel "$1" --config "$2" >> "$OUT/sanitizer.log" 2>&1; echo "memcheck $1 $2 rc=$?" | tee -a "$OUT/sanitizer.log"
  done
fi
if [ "$what" = c2x2 ]; then
  # The 2 x 2-cluster and 112-column tiles against the rest (packages/tirx-native/docs/gemm.md section 17): how
  # many 4-CTA clusters fit at once (the probe, built on the CPU machine into build/probes/ and carried), then two
  # sweeps of the rows they are for, with every tile (build them all: gemm-sweep's note above).
  [ -x build/probes/cta_placement ] && build/probes/cta_placement 2>&1 | tee "$OUT/cta-placement.log" | head -5
  for pass in A B; do
    python3 tools/gemm_sweep.py run --shapes issue --rounds 5 \
      --only 8192x8192x8192,16384x16384x16384,8192x28672x8192,8192x14336x4096,512x4096x14336,2048x7168x2048,512x7168x2048 \
      --out "$OUT/gemm-c2x2-$pass.json" 2>&1 | tee "$OUT/gemm-c2x2-$pass.log" | tail -8 || rc=1
  done
fi
if [ "$what" = breakdown ]; then
  # Where multi-kernel ops spend their time (tools/probes/op_breakdown.py): the arguments are kernel:config rows.
  timeout 300 python3 tools/probes/op_breakdown.py "$@" 2>&1 | tee "$OUT/breakdown.log" | tail -60 || rc=1
fi
if [ "$what" = ssu-sweep ]; then
  # Mamba selective_state_update schedules (tools/sweeps/ssu_mtp_schedules.py): build them on the CPU machine into
  # build/sweep-ssu (~10 MiB) and carry it.
  timeout 400 python3 tools/sweeps/ssu_mtp_schedules.py run --dir build/sweep-ssu 2>&1 | tee "$OUT/ssu-sweep.log" \
    | grep -v "^\[" | tail -70 || rc=1
fi
if [ "$what" = gemm-sweep ]; then
  python3 tools/gemm_sweep.py run --shapes issue --out "$OUT/gemm-issue.json" 2>&1 | tee "$OUT/gemm-issue.log" | tail -8 || rc=1
  python3 tools/gemm_sweep.py run --shapes mid --out "$OUT/gemm-mid.json" 2>&1 | tee "$OUT/gemm-mid.log" | tail -4 || rc=1
fi
exit $rc
