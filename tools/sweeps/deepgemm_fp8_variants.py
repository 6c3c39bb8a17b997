#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Candidate tiles of DeepGEMM's SM90 FP8 GEMMs (issue 24: ours 0.62-0.80x cuBLASLt blockwise on the H100), each
against the fp32 oracle (DeepGEMM's calc_diff < 1e-3) and timed beside ``torch._scaled_mm`` blockwise:

    python tools/sweeps/deepgemm_fp8_variants.py build --out build/sweep-deepgemm   # CPU machine: .so + variants.json
    python tools/sweeps/deepgemm_fp8_variants.py run --dir build/sweep-deepgemm     # GPU host: torch + apache-tvm-ffi

A variant is a tile of ``_fp8_gemm_op.TILES`` (the product's, the baseline) or ``CANDIDATE_TILES`` (block_m,
cluster_n, prefetch_scales: ``_fp8_gemm_kernel.build_kernel``'s knobs), built per schedule. ``run`` takes each
shape's data from the registered module's ``prepare_data``, checks every variant's output against the module's fp32
oracle (rows a schedule stores), then times the variants, cuBLASLt and the registered op together
(``bench.time_calls``: cold L2, interleaved rounds), printing TFLOP/s and the ratio to cuBLASLt. Exploration, not
product: a winner goes into ``TILES`` and ``choose_tile``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, registered module, schedule, bench config, tiles)
DENSE_TILES = ["128x128_s6", "128x128_s6_pf", "128x128_s6_c2", "256x128_s4", "256x128_s4_c2", "128x256_s4_c2"]
GROUPED_TILES = ["128x128_s6", "128x128_s6_pf", "128x128_s6_c2", "128x256_s4", "128x256_s4_c2"]
SHAPES = [
    ("1d2d m4096 n4096 k7168", "fp8_gemm_1d2d", "dense", {"M": 4096, "N": 4096, "K": 7168}, DENSE_TILES),
    ("1d2d m4096 n7168 k16384", "fp8_gemm_1d2d", "dense", {"M": 4096, "N": 7168, "K": 16384}, DENSE_TILES),
    ("contig g4 m8192 n4096 k7168", "m_grouped_fp8_gemm_contiguous", "m_contiguous",
     {"G": 4, "m": 8192, "N": 4096, "K": 7168}, GROUPED_TILES),
    ("masked g1 m1024 n4096 k7168", "m_grouped_fp8_gemm_masked", "m_masked",
     {"G": 1, "max_m": 1024, "m": 1024, "N": 4096, "K": 7168, "exact": True}, GROUPED_TILES),
]


def variant_name(module: str, tile: str) -> str:
    return f"{module}__{tile}"


def _module(name: str):
    import importlib

    return importlib.import_module(f"tirx_kernels.ported.deepgemm.{name}")


def _build_one(item):
    module, schedule, tile, out = item
    from tirx_kernels.core import build
    from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O

    name = variant_name(module, tile)
    t0 = time.time()
    try:
        res = build.build_so(O.build(_module(module).KERNEL_META["name"], tile, schedule),
                             os.path.join(out, name + ".so"))
    except Exception as e:  # one bad variant does not cost the sweep
        return {"name": name, "error": f"{type(e).__name__}: {e}"[-1500:]}
    ptxas = next(iter(res.ptxas_info.get("kernels", {}).values()), {})
    return {"name": name, "so": name + ".so", "module": module, "tile": tile, "registers": ptxas.get("registers"),
            "spill": ptxas.get("spill_store_bytes"), "build_s": round(time.time() - t0, 1)}


def cmd_build(a) -> int:
    from concurrent.futures import ProcessPoolExecutor

    os.makedirs(a.out, exist_ok=True)
    items = sorted({(m, s, t, a.out) for _, m, s, _, tiles in SHAPES for t in tiles})
    with ProcessPoolExecutor(max_workers=a.jobs or os.cpu_count()) as ex:
        rows = list(ex.map(_build_one, items))
    for r in rows:
        print(f"{r['name']:52s} " + (r["error"].splitlines()[0] if "error" in r else
                                     f"{r['registers']} regs, spill {r['spill']} B, {r['build_s']} s"))
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump({"variants": rows}, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


def _args_and_rows(module: str, data: dict, cfg: dict):
    """The kernel's arguments for ``data`` and the mask of D's rows the op defines (None: all)."""
    mod = _module(module)
    if module == "m_grouped_fp8_gemm_contiguous":
        return mod.kernel_args(data["a"], data["sfa"], data["b"], data["sfb"], data["d"], data["grouped_layout"]), None
    if module == "m_grouped_fp8_gemm_masked":
        valid = mod.valid_rows(data["masked_m"], data["a"].shape[1])
        return mod.kernel_args(data["a"], data["sfa"], data["b"], data["sfb"], data["d"], data["masked_m"]), valid
    return mod.kernel_args(data["a"], data["sfa"], data["b"], data["sfb"], data["d"]), None


def cmd_run(a) -> int:
    import torch
    import tvm_ffi

    from tirx_kernels.core import bench, harness
    from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O

    with open(os.path.join(a.dir, "variants.json")) as f:
        variants = {v["name"]: v for v in json.load(f)["variants"] if "error" not in v}
    table, failures = [], 0
    for label, module, _, over, tiles in SHAPES:
        mod = _module(module)
        cfg = harness.full_config(mod, over)
        torch.manual_seed(0)
        data = mod.prepare_data(**cfg)
        want = mod.reference(**data)["d"]
        flops = mod.roofline(**cfg)["flops"]
        fns, errors = {}, {}
        for tile in tiles:
            v = variants.get(variant_name(module, tile))
            if v is None:
                errors[tile] = "not built"
                continue
            try:
                fn = tvm_ffi.load_module(os.path.join(a.dir, v["so"]))["main"]
                args, rows = _args_and_rows(module, data, cfg)
                data["d"].fill_(float("nan"))
                fn(*args)
                torch.cuda.synchronize()
                got = data["d"] if rows is None else data["d"][rows]
                diff = O.check_calc_diff(got, want if rows is None else want[rows])["calc_diff"]
                print(f"{label:30s} {tile:16s} calc_diff {diff:.2e}  {v['registers']} regs, spill {v['spill']} B")
                fns[tile] = (lambda f=fn, x=args: f(*x))
            except Exception as e:
                errors[tile] = f"{type(e).__name__}: {e}"[:300]
                failures += 1
        try:
            mod.launch(cfg, data)  # the registered op (the product bundle), where it is installed
            torch.cuda.synchronize()
            fns["registered op"] = (lambda m=mod, c=cfg, d=data: m.launch(c, d))
        except Exception as e:
            errors["registered op"] = f"{type(e).__name__}: {e}"[:200]
        try:
            make = mod.get_baselines(**cfg)["cublas"]()
            make(data)
            torch.cuda.synchronize()
            fns["cublas"] = (lambda f=make, d=data: f(d))
        except Exception as e:
            errors["cublas"] = f"{type(e).__name__}: {e}"[:200]
        times = bench.time_calls(fns, calls=a.calls, rounds=a.rounds)
        ref = times.get("cublas", {}).get("median_us")
        for name, t in times.items():
            us = t["median_us"]
            table.append((label, name, us, flops / us / 1e6, ref / us if ref else float("nan")))
        for name, err in errors.items():
            print(f"{label:30s} {name:16s} FAILED: {err}")
    print(f"\n{'shape':30s} {'variant':16s} {'us':>9s} {'TFLOP/s':>8s} {'x cuBLASLt':>10s}")
    for label, name, us, tf, ratio in table:
        print(f"{label:30s} {name:16s} {us:9.1f} {tf:8.0f} {ratio:10.3f}")
    return 1 if failures else 0


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=os.path.join(ROOT, "build", "sweep-deepgemm"))
    b.add_argument("--jobs", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("--dir", default=os.path.join(ROOT, "build", "sweep-deepgemm"))
    r.add_argument("--calls", type=int, default=10)
    r.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    return cmd_build(a) if a.cmd == "build" else cmd_run(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
