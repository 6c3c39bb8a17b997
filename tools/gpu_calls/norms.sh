#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU check of issue 20's norm rows (2026-12-07, helper "norms"): rmsnorm.build_rows' ops (flashinfer_rmsnorm,
# flashinfer_rmsnorm_quant, flashinfer_fused_add_rmsnorm_quant) now run a specialized kernel per (dtype, variant, H)
# at the catalog sizes and keep the general one for every other call. Runs from the repo root on the GPU host after
# `source .gpu/setup.sh`, on the product bundle (`build --all`: it must hold the specialized artifacts):
#   1. the three ops' GPU tests (every config through the harness, views at every alignment, FlashInfer, graphs);
#   2. the bench rows, timed with the harness (bench.bench_config: cold L2, interleaved rounds, CUDA graph under
#      the latency threshold): the old general kernel (`*_general` configs), the specialized one, FlashInfer and
#      torch.compile of the same row (references timed with the specialized row, in one run).
# Logs in $OUT/norms/; the table is printed last. At most ~150 s: FlashInfer warm-up <= 25 s, tests NORMS_TEST_LIMIT (50), bench rows started within
# NORMS_BENCH_LIMIT (50) s and killed at +15.
set -uo pipefail
OUT=${OUT:-gpu-logs}
LOG="$OUT/norms"; mkdir -p "$LOG"
if [ -z "${TIRX_KERNELS_ARTIFACTS:-}" ] && [ -f .gpu/artifacts.tar.xz ]; then
  mkdir -p /tmp/tirx-bundle && xz -dc .gpu/artifacts.tar.xz | tar -x -C /tmp/tirx-bundle
  export TIRX_KERNELS_ARTIFACTS=/tmp/tirx-bundle/artifacts
fi
# Inductor / Triton caches of an earlier run, where carried (torch.compile compiles each reference row otherwise).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton}
if [ -f .gpu/caches.tar.xz ] && [ ! -d /tmp/caches/inductor ]; then
  mkdir -p /tmp/caches "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR" && xz -dc .gpu/caches.tar.xz | tar -x -C /tmp/caches
  cp -a /tmp/caches/triton/. "$TRITON_CACHE_DIR"/ 2>/dev/null; cp -a /tmp/caches/inductor/. "$TORCHINDUCTOR_CACHE_DIR"/ 2>/dev/null
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$LOG/gpu.txt"
echo "bundle: ${TIRX_KERNELS_ARTIFACTS:-none}" | tee -a "$LOG/gpu.txt"

# FlashInfer JIT-builds its norm module on first use (~49 s cold, gpu_check.sh): once here, before the test workers
# race for it (instant where an AOT tree is staged or an earlier call warmed /tmp/flashinfer).
timeout 25 python3 - <<'PY' 2>&1 | tail -1 | tee "$LOG/flashinfer_warm.log"
import time, torch, flashinfer
t = time.time()
x = torch.randn(8, 256, dtype=torch.bfloat16, device="cuda")
w = torch.ones(256, dtype=torch.bfloat16, device="cuda")
sc = torch.ones(1, device="cuda")
y = torch.empty(8, 256, dtype=torch.float8_e4m3fn, device="cuda")
flashinfer.norm.rmsnorm(x, w); flashinfer.norm.gemma_rmsnorm(x, w)
flashinfer.norm.rmsnorm_quant(y, x, w, sc); flashinfer.norm.fused_add_rmsnorm_quant(y, x, x.clone(), w, sc)
torch.cuda.synchronize(); print(f"flashinfer norms warm in {time.time() - t:.0f} s")
PY

T=packages/tirx-port-flashinfer/tests
timeout -s INT "${NORMS_TEST_LIMIT:-50}" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -n 6 -k gpu \
  "$T/test_flashinfer_rmsnorm.py" "$T/test_rmsnorm_quant.py" "$T/test_fused_add_rmsnorm_quant.py" \
  "$T/test_fused_add_rmsnorm.py" > "$LOG/pytest.log" 2>&1
echo "tests rc=$?" | tee -a "$LOG/pytest.log"
grep -E "passed|failed|error" "$LOG/pytest.log" | tail -12

NORMS_BENCH_LIMIT=${NORMS_BENCH_LIMIT:-50} timeout -s INT $(( ${NORMS_BENCH_LIMIT:-50} + 15 )) python3 - "$LOG" <<'PY'
import json, os, sys, time, traceback

log = sys.argv[1]
limit = float(os.environ.get("NORMS_BENCH_LIMIT", "50"))
t0 = time.time()
from tirx_kernels import registry
from tirx_kernels.core import runtime

ROWS = {  # kernel: the bench rows (each also timed as its `<label>_general` config, the old kernel)
    "flashinfer_rmsnorm": ["bf16_32x4096", "gemma_bf16_64x8192", "bf16_8192x4096"],
    "flashinfer_rmsnorm_quant": ["bf16_e4m3_32x4096", "bf16_e4m3_64x8192", "bf16_e4m3_8192x4096"],
    "flashinfer_fused_add_rmsnorm_quant": ["bf16_e4m3_32x4096", "bf16_e4m3_64x8192", "bf16_e4m3_8192x4096"],
}
# small rows of every kernel first (the latency-bound rows issue 20 is about), then medium, then large
ORDER = [(k, labels[i]) for i in range(3) for k, labels in ROWS.items()]
results, lines = [], []
mods = {k: registry.load(k) for k in ROWS}
for kernel, label in ORDER:
    mod = mods[kernel]
    cfgs = {c["label"]: c for c in mod.CONFIGS + mod.BENCH_CONFIGS}
    if time.time() - t0 > limit:
        lines.append(f"{kernel:36s} {label:22s} skipped (NORMS_BENCH_LIMIT {limit:.0f} s)")
        continue
    row = {"kernel": kernel, "label": label}
    try:
        spec_fn = runtime.artifact_location(mod, mod.compile_params(**cfgs[label]))[1]
        gen_fn = runtime.artifact_location(mod, mod.compile_params(**cfgs[label + "_general"]))[1]
        if spec_fn == gen_fn:  # the bundle has no specialized artifact here: both rows would time one kernel
            raise RuntimeError(f"the bundle serves {label} with the general artifact {gen_fn}: rebuild it")
        spec = mod.run_bench(with_references=True, **cfgs[label])
        gen = mod.run_bench(**cfgs[label + "_general"])
        row.update(spec_us=spec["us"], gen_us=gen["us"], timer=spec["timer"], gen_timer=gen["timer"],
                   pct=spec["pct_of_ceiling"],
                   refs={n: r["us"] for n, r in spec["references"].items()},
                   missing=spec.get("missing_references", {}))
    except KeyboardInterrupt:  # the call's time limit (timeout -s INT): print what was measured
        lines.append(f"{kernel:36s} {label:22s} interrupted at {time.time() - t0:.0f} s")
        break
    except Exception as e:  # a row that fails is reported, the others still run
        row["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    results.append(row)
    json.dump(results, open(os.path.join(log, "bench.json"), "w"), indent=1)

print(f"\n{'kernel':36s} {'row':22s} {'general':>8s} {'special':>8s} {'flashinf':>8s} {'t.compile':>9s} "
      f"{'best ref':>8s} {'ref/ours':>8s} {'gain':>6s} {'%ceil':>6s}  timer")
for r in results:
    if "error" in r:
        print(f"{r['kernel']:36s} {r['label']:22s} ERROR {r['error'][:90]}")
        continue
    refs = {n: u for n, u in r["refs"].items() if n != "torch"}
    best = min(refs.values()) if refs else float("nan")
    fi, tc = r["refs"].get("flashinfer", float("nan")), r["refs"].get("torch.compile", float("nan"))
    print(f"{r['kernel']:36s} {r['label']:22s} {r['gen_us']:8.1f} {r['spec_us']:8.1f} {fi:8.1f} {tc:9.1f} "
          f"{best:8.1f} {best / r['spec_us']:8.2f} {r['gen_us'] / r['spec_us']:6.2f} {r['pct']:6.0f}  {r['timer']}")
for line in lines:
    print(line)
print(f"(us; 'ref/ours' = fastest of FlashInfer / torch.compile over the specialized kernel; 'gain' = general / "
      f"specialized; bench {time.time() - t0:.0f} s)")
PY
