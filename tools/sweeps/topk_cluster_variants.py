#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Variants of the cluster top-k kernel (``_cluster_radix.build_kernel``'s knobs) against the product top-k kernels
and torch.topk, at issue 21's rows (fp32, k = 2048: 1 x 131072, 64 x 131072, 256 x 262144) and a bf16 row:

    python tools/sweeps/topk_cluster_variants.py build --out build/sweep-topk   # CPU machine: one .so + variants.json
    python tools/sweeps/topk_cluster_variants.py run --dir build/sweep-topk     # GPU host: torch + apache-tvm-ffi

A variant is (dtype, cluster size, shared bytes for the slice, threads, spread, copies): ``spread`` bins the first
digit by (sign, exponent, 2 mantissa bits) instead of the key's top byte, ``copies`` splits the first histogram
into per-warp-group copies (both against the hot-bin shared atomics of N(0, 1) rows, see ``_cluster_radix``); a
"wide" variant holds 32768 fp32 scores a CTA (192 KB, one 1024-thread CTA an SM), so a cluster of 8 holds a
262144-score row. ``run`` checks every variant bit for bit against the single-CTA kernel (the deterministic result
all top-k kernels share) on random, tied and special (+-inf, NaN, -0.0) rows, then times them with the product
kernels and torch.topk (``bench.time_calls``: cold L2, interleaved rounds). Exploration: a winner goes into
``fast_topk_clusters``' schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KB = 1024
# (name, dtype, cluster, slice bytes, threads, spread, copies); "base" is the product schedule (a check of the loader)
VARIANTS = [
    ("f32_base", "float32", 8, 96 * KB, 512, False, 1),
    ("f32_spread", "float32", 8, 96 * KB, 512, True, 1),
    ("f32_copies8", "float32", 8, 96 * KB, 512, False, 8),
    ("f32_spread_copies8", "float32", 8, 96 * KB, 512, True, 8),
    ("f32_spread_copies8_t1024", "float32", 8, 96 * KB, 1024, True, 8),
    ("f32_wide_base", "float32", 8, 192 * KB, 1024, False, 1),
    ("f32_wide_spread", "float32", 8, 192 * KB, 1024, True, 1),
    ("f32_wide_spread_copies8", "float32", 8, 192 * KB, 1024, True, 8),
    ("bf16_base", "bfloat16", 8, 96 * KB, 512, False, 1),
    ("bf16_spread", "bfloat16", 8, 96 * KB, 512, True, 1),
    ("bf16_spread_copies8", "bfloat16", 8, 96 * KB, 512, True, 8),
]
# (label, dtype, rows, row length, k)
SHAPES = [
    ("f32 1x131072 k2048", "float32", 1, 131072, 2048),
    # one wave of 8-CTA clusters at two 512-thread CTAs an SM (33 rows): with 1 and 64 rows it splits a CTA's
    # latency chain (1 row) from the SM's throughput (32 rows: two CTAs an SM) and the second wave (64 rows)
    ("f32 32x131072 k2048", "float32", 32, 131072, 2048),
    ("f32 64x131072 k2048", "float32", 64, 131072, 2048),
    ("f32 256x262144 k2048", "float32", 256, 262144, 2048),
    ("bf16 64x131072 k2048", "bfloat16", 64, 131072, 2048),
]
_ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}


def capacity(dtype: str, slice_bytes: int) -> int:
    """Scores a CTA holds (fast_topk_clusters.slice_capacity for another slice size)."""
    return slice_bytes // (_ELEM[dtype] + 2) // 64 * 64


def fits(v, dtype: str, N: int) -> bool:  # noqa: N803
    from tirx_kernels.ported.flashinfer.topk import fast_topk_clusters as fc

    _, vd, C, sb, *_ = v
    return vd == dtype and fc.chunk_of(N, C, dtype) <= capacity(dtype, sb)


def cmd_build(a) -> int:
    from tirx_kernels.core import build
    from tirx_kernels.ported.flashinfer.topk import _cluster_radix as cr
    from tirx_kernels.ported.flashinfer.topk import fast_topk_clusters as fc

    os.makedirs(a.out, exist_ok=True)
    funcs = {}
    for name, dtype, C, sb, threads, spread, copies in VARIANTS:  # noqa: N806
        funcs[name] = cr.build_kernel(dtype, C, capacity(dtype, sb), threads, fc.LOAD_UNROLL, fc.GATHER_ELEMS,
                                      spread=spread, copies=copies)
    t0 = time.time()
    res = build.build_so_many(funcs, os.path.join(a.out, "variants.so"))
    kernels = res.ptxas_info.get("kernels", {})
    for kname, info in kernels.items():
        print(f"{kname[:60]:60s} {info.get('registers')} regs, spill {info.get('spill_store_bytes')} B")
    print(f"built {len(funcs)} variants in {time.time() - t0:.0f} s")
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump({"variants": [list(v) for v in VARIANTS], "ptxas": kernels}, f, indent=1)
    return 0


def _rows(kind: str, M: int, N: int, dtype, seed: int):  # noqa: N803
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, N, generator=g, device="cuda")
    if kind == "ties":
        x = (x * 4).round() / 4
    elif kind == "special":
        for val in (float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 3.0):
            pos = torch.randint(0, N, (M, 64), generator=g, device="cuda")
            x.scatter_(1, pos, torch.full(pos.shape, val, device="cuda"))
    return x.to(dtype)


def cmd_run(a) -> int:
    import torch
    import tvm_ffi

    from tirx_kernels.core import bench
    from tirx_kernels.ported.flashinfer.topk import fast_topk_clusters as fc
    from tirx_kernels.ported.flashinfer.topk import filtered_topk as filt
    from tirx_kernels.ported.flashinfer.topk import radix_topk_multi_cta as multi
    from tirx_kernels.ported.flashinfer.topk import radix_topk_single_cta as single

    lib = tvm_ffi.load_module(os.path.join(a.dir, "variants.so"))
    fns_v = {v[0]: lib[v[0]] for v in VARIANTS}
    raw = {"float32": torch.int32, "bfloat16": torch.int16}
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bad = set()

    def call_variant(name, x, k, vals, idx):
        x = single._rows(x)
        fns_v[name](x, vals, idx, int(fc.vector_ok(x)))

    # ---- correctness: every variant against the single-CTA kernel, bit for bit
    checks = [("random", 3, 131072, 2048), ("ties", 2, 131072, 2048), ("special", 2, 100000, 1000),
              ("random", 2, 262144, 2048), ("ties", 2, 262144, 4096), ("random", 4, 50001, 300)]
    for dtype in ("float32", "bfloat16"):
        for kind, M, N, k in checks:  # noqa: N806
            x = _rows(kind, M, N, dt[dtype], seed=N + k)
            wv = torch.empty(M, k, device="cuda", dtype=x.dtype)
            wi = torch.empty(M, k, device="cuda", dtype=torch.int64)
            single._run(x, k, wv, wi, dispatch=False)
            for v in VARIANTS:
                if not fits(v, dtype, N):
                    continue
                vals = torch.full_like(wv, float("nan"))
                idx = torch.full_like(wi, -7)
                call_variant(v[0], x, k, vals, idx)
                torch.cuda.synchronize()
                ok = torch.equal(idx, wi) and torch.equal(vals.view(raw[dtype]), wv.view(raw[dtype]))
                if not ok:
                    bad.add(v[0])
                    print(f"MISMATCH {v[0]} {kind} {M}x{N} k{k}: "
                          f"{(idx != wi).sum().item()} indices differ")
    print(f"correctness: {len(VARIANTS) - len(bad)}/{len(VARIANTS)} variants bit-exact"
          + (f"; wrong: {sorted(bad)}" if bad else ""))

    def shape_fns(x, k, vals, idx):
        """The calls timed at one shape: the variants that hold its rows, the product kernels, torch.topk."""
        M, N = x.shape  # noqa: N806
        dtype = str(x.dtype)[6:]
        fns = {}
        for v in VARIANTS:
            if fits(v, dtype, N) and v[0] not in bad:
                fns["var " + v[0]] = (lambda n=v[0]: call_variant(n, x, k, vals, idx))
        fns["top_k (product dispatch)"] = lambda: single._run(x, k, vals, idx)
        if fc.plan_cluster(M, N, dtype, sms):
            fns["fast_topk_clusters"] = lambda: fc._forced(x, k, False, vals, idx)
        fns["filtered_topk"] = lambda: filt._forced(x, k, False, vals, idx)
        fns["radix_topk_multi_cta"] = lambda: multi._forced(x, k, False, vals, idx)
        fns["radix_topk_single_cta"] = lambda: single._run(x, k, vals, idx, dispatch=False)
        fns["torch.topk"] = lambda: torch.topk(x, k, dim=-1)
        return fns

    # ---- timing
    summary = []
    for label, dtype, M, N, k in SHAPES:  # noqa: N806
        x = _rows("random", M, N, dt[dtype], seed=1)
        vals = torch.empty(M, k, device="cuda", dtype=x.dtype)
        idx = torch.empty(M, k, device="cuda", dtype=torch.int64)
        fns = shape_fns(x, k, vals, idx)
        for name in list(fns):
            try:  # a product kernel missing from the bundle (a stale fingerprint) costs its row, not the run
                fns[name]()
                torch.cuda.synchronize()
            except Exception as e:
                print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:200]}")
                del fns[name]
        times = bench.time_calls(fns, calls=20, rounds=3)
        nbytes = M * N * x.element_size()
        print(f"\n== {label} ({nbytes / 1e6:.1f} MB read: {nbytes / 3e6:.1f} us at 3 TB/s)")
        for name, t in sorted(times.items(), key=lambda kv: kv[1]["median_us"]):
            print(f"  {name:34s} {t['median_us']:9.1f} us")
        best = min(((n, t["median_us"]) for n, t in times.items() if n.startswith("var ")),
                   key=lambda p: p[1], default=("-", float("nan")))
        summary.append((label, best, times.get("fast_topk_clusters", {}).get("median_us", float("nan")),
                        *(times.get(n, {}).get("median_us", float("nan"))
                          for n in ("filtered_topk", "top_k (product dispatch)", "torch.topk"))))
    print("\n| row | best variant | us | fast_topk_clusters | filtered | top_k | torch.topk |")
    print("|---|---|---|---|---|---|---|")
    for label, (bn, bu), fcu, fu, tku, tu in summary:
        print(f"| {label} | {bn[4:]} | {bu:.1f} | {fcu:.1f} | {fu:.1f} | {tku:.1f} | {tu:.1f} |")
    return 1 if bad else 0


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=os.path.join(ROOT, "build", "sweep-topk"))
    r = sub.add_parser("run")
    r.add_argument("--dir", default=os.path.join(ROOT, "build", "sweep-topk"))
    a = ap.parse_args(argv)
    return cmd_build(a) if a.cmd == "build" else cmd_run(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
