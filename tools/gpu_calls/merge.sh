#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 20 (merge_state, helper "merge", 2026-12-08): the (position, head block) grid with no division before the
# first load, and two rows a thread on large grids (``rows_per_thread``). Runs from the repo root on the GPU host
# after `source .gpu/setup.sh`, on the product bundle (`python -m tirx_kernels.build --all` REBUILT after this
# change: the runtime refuses a stale merge_state artifact by its fingerprint). No extra tar.
#   1. GPU tests (-x): merge_state's graph replay and odd layouts, and a selection of test_gpu.py's configs against
#      the oracle (odd D, H = 3, D = 1024, -inf rows, strides, masks, the two-row grids at s512 h32) and FlashInfer;
#   2. the three issue rows timed as the harness times them (bench.time_calls: cold L2, interleaved rounds, then a
#      CUDA graph for rows under 10 us), one row = one data set: ours as the public op picks (``plan``), ours with
#      1 and 2 rows a thread (the knob), FlashInfer 0.7.4; the variants' outputs are compared bit for bit first.
# Logs in $OUT/merge/; the table is printed last. <= 45 s: tests killed at 24 s, bench at 18 s.
set -uo pipefail
OUT=${OUT:-gpu-logs}
LOG="$OUT/merge"; mkdir -p "$LOG"
if [ -z "${TIRX_KERNELS_ARTIFACTS:-}" ] && [ -f .gpu/artifacts.tar.xz ]; then
  mkdir -p /tmp/tirx-bundle && xz -dc .gpu/artifacts.tar.xz | tar -x -C /tmp/tirx-bundle
  export TIRX_KERNELS_ARTIFACTS=/tmp/tirx-bundle/artifacts
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$LOG/gpu.txt"
rc=0

T=packages/tirx-port-flashinfer/tests
C="$T/test_gpu.py::test_correctness[merge_state-"
U="$T/test_gpu.py::test_matches_flashinfer[merge_state-"
timeout -s INT 24 python3 -m pytest -q -x -rfE --tb=short -p no:cacheprovider \
  "$T/test_merge_state.py::test_graph_replay_gpu" "$T/test_merge_state.py::test_public_ops_odd_layouts_gpu" \
  "${C}fp16_s512_h32_d128]" "${C}bf16_s37_h3_d200]" "${C}bf16_s5_h2_d1024]" "${C}bf16_s37_h8_d128_neginf]" \
  "${C}fp16_s37_h8_d128_strided]" "${C}inplace_fp16_s512_h32_d128_mask]" "${C}inplace_bf16_s37_h8_d256_strided]" \
  "${C}inplace_bf16_s37_h8_d64_neginf]" "${C}states_bf16_s512_n16_h32_d128]" "${C}states_bf16_s37_n5_h8_d256_strided]" \
  "${U}fp16_s512_h32_d128]" "${U}inplace_fp16_s512_h32_d128_mask]" "${U}states_bf16_s512_n16_h32_d128]" \
  > "$LOG/pytest.log" 2>&1 || rc=1
tail -4 "$LOG/pytest.log"

timeout -s INT 18 python3 - "$LOG" <<'PY' || rc=1
import json, os, sys, time, traceback

import torch

from tirx_kernels import registry
from tirx_kernels.core import bench

log = sys.argv[1]
t0 = time.time()
mod = registry.load("merge_state")
cfgs = {c["label"]: c for c in mod.CONFIGS + mod.BENCH_CONFIGS}
ROWS = ["fp16_s128_h32_d128", "fp16_s2048_h32_d128", "bf16_s16384_h32_d128"]
PINNED = {"fp16_s128_h32_d128": (2.1, 1.9), "fp16_s2048_h32_d128": (23.8, 23.0), "bf16_s16384_h32_d128": (141.1, 139.2)}
results = []
for label in ROWS:
    cfg = cfgs[label]
    row = {"label": label, "plan": mod.plan(cfg["S"], cfg["H"], cfg["D"], cfg["op"])}
    try:
        data = mod.prepare_data(**cfg)
        outs = {}
        for rpt in (1, 2):  # the two geometries give the same bits
            mod.launch({**cfg, "rows_per_thread": rpt}, data)
            outs[rpt] = (data["v"].clone(), data["s"].clone())
        want = mod.reference(**data)
        row["same_bits"] = all(torch.equal(outs[1][i].view(torch.int32 if i else torch.int16),
                                           outs[2][i].view(torch.int32 if i else torch.int16)) for i in (0, 1))
        row["max_err_v"] = (outs[1][0].float() - want["v"]).abs().max().item()
        fns = {"ours": lambda: mod.launch(cfg, data),
               "ours_rpt1": lambda: mod.launch({**cfg, "rows_per_thread": 1}, data),
               "ours_rpt2": lambda: mod.launch({**cfg, "rows_per_thread": 2}, data)}
        try:
            ref = mod.get_baselines(**cfg)["flashinfer"]()
            fns["flashinfer"] = lambda: ref(data)
        except ImportError as e:
            row["missing"] = str(e)
        torch.cuda.synchronize()
        times = bench.time_calls(fns)
        if times["ours"]["median_us"] < bench.GRAPH_THRESHOLD_US:  # as bench_config: graphs for small rows
            for n, f in fns.items():
                try:
                    times[n] = bench.time_graph(f)
                except Exception as e:  # one that cannot be captured keeps its event timing
                    times[n]["graph_error"] = f"{type(e).__name__}: {e}"
        row["us"] = {n: t["median_us"] for n, t in times.items()}
        row["timer"] = times["ours"]["timer"]
        row["tb_s"] = mod.roofline(**cfg)["bytes"] / row["us"]["ours"] / 1e6
    except KeyboardInterrupt:
        row["error"] = "interrupted (time limit)"
        results.append(row)
        break
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    results.append(row)
    json.dump(results, open(os.path.join(log, "bench.json"), "w"), indent=1)

print(f"\n{'row':22s} {'lu':>2s} {'ours':>7s} {'1 row':>7s} {'2 rows':>7s} {'flashinf':>8s} {'fi/ours':>7s} "
      f"{'TB/s':>5s} {'pinned ours/fi':>15s} {'bits':>5s}  timer")
for r in results:
    if "error" in r:
        print(f"{r['label']:22s} ERROR {r['error'][:100]}")
        continue
    u = r["us"]
    fi = u.get("flashinfer", float("nan"))
    p = PINNED[r["label"]]
    print(f"{r['label']:22s} {r['plan']['lu']:2d} {u['ours']:7.2f} {u['ours_rpt1']:7.2f} {u['ours_rpt2']:7.2f} "
          f"{fi:8.2f} {fi / u['ours']:7.2f} {r['tb_s']:5.2f} {p[0]:7.1f}/{p[1]:<7.1f} "
          f"{'same' if r['same_bits'] else 'DIFF'}  {r['timer']}")
print(f"(us on {torch.cuda.get_device_name()}; 'ours' = the public op's plan (lu = log2 rows a thread), '1 row' / "
      f"'2 rows' = the rows_per_thread knob; fi/ours > 1: ours faster; pinned = 2026-12-07e H100; bench "
      f"{time.time() - t0:.0f} s)")
PY
exit $rc
