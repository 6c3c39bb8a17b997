#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Schedule-variant sweep for rmsnorm and act_and_mul: build every variant here, time them on the GPU host.

    python tools/sweep_variants.py build --out build/sweep   # CPU machine: tvm + nvcc -> .so + variants.json
    python tools/sweep_variants.py run --dir build/sweep     # GPU host: torch + apache-tvm-ffi only

``run`` checks each variant against an fp32 torch oracle on fresh random inputs (NaN-poisoned output, every
element must be written), then times all variants of a shape together with torch eager, torch.compile and
liger / flashinfer (when importable) in one ``bench.time_calls`` dict (cold L2, interleaved rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:  # bench.time_calls without an install; an installed tirx-core is left alone (a second root of the same
    import tirx_kernels.core  # noqa: F401 -- sources on sys.path once made fingerprints differ: core/artifacts.py)
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "packages", "tirx-core", "src"))

# ---------------------------------------------------------------------------------------------------------
# Variants: (name, kernel, compile params). Each "row"/"tile" default is listed first (what the op runs).
# ---------------------------------------------------------------------------------------------------------


def _rms(dtype, H, tag, **kw):
    short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    return (f"rms_{short}_{H}_{tag}", "rmsnorm", {"dtype": dtype, "H": H, **kw})


def _act(act, d, tag, dtype="bfloat16", **kw):
    short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    return (f"act_{act}_{short}_{d}_{tag}", "act_and_mul", {"act": act, "dtype": dtype, "d": d, **kw})


# Rounds 1-2 (tilings, persistent/pipelined schedules, streaming stores; logs in
# docs/measurements/2026-12-02-h200/sweep-round{1,2}.log) picked the tilings; round 3 (cache qualifiers of
# the loads, register caps, late weight) found that L1::no_allocate loads cost 4 % at act_and_mul
# 32768x14336 (672 -> 646 us with plain loads) and 1.5 % at rmsnorm 32768x8192; rounds 4-5 (L1 eviction
# qualifiers, store qualifiers, persistent/multi-row schedules with plain loads, two passes over x as
# torch.compile does) moved nothing further (logs: docs/measurements/2026-12-02-h200-b/). Round 6: rmsnorm rows
# staged in shared memory with per-thread cp.async lost 2-9 % (sweep-round6.log; code in commit a3a43d8,
# reverted). Earlier variant lists are in git history.
#
# Round 7 (the "bulk" schedules: persistent CTAs fed by 1-D TMA bulk copies into shared-memory rings) lost 2-9 %
# except ties at the small-row shapes (sweep-round7.log in docs/measurements/2026-12-02-h200-c/); its variant
# list is in git history.
#
# Round 8 (L2 eviction priorities, ``.L2::cache_hint`` operands from ``createpolicy``; log in
# docs/measurements/2026-12-03b-h200/sweep-round8.log) made rmsnorm's x loads L2 evict_last up to H = 7168 and
# torch.compile's two passes above (its variant list is in git history).
#
# Round 9: programmatic dependent launch (``core.lang.pdl``; FlashInfer launches its norms and activations with
# it on Hopper by default) -- pdl_end: wait before the first global access, launch_dependents after the stores;
# pdl_early: launch_dependents right after the wait -- timed from CUDA graphs of back-to-back calls at the
# latency-bound shapes (the suite's small rows) and cold-L2 at the large ones (must not lose there); and
# act_and_mul's L2 priorities (ld<p> gate/up loads, st<p> stores; ef = evict_first, el = evict_last), the
# experiment that moved rmsnorm in round 8 (log: docs/measurements/2026-12-03c-h200/sweep-round9.log; its
# variant list is in git history).


def _gemm(dtype, tile, tag, **kw):
    short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    return (f"gemm_{short}_{tile}_{tag}", "fp16_bf16_gemm", {"dtype": dtype, "tile": tile, **kw})


# The tiles TILE_TABLE picks for the GEMM shapes below (1024^3, 4096^3, M = 1 and 128 at 4096 x 4096).
_GEMM_TILES = ("persistent_128x64x64_s8_g8", "persistent_128x256x64_s4_e128_g8", "smallm_64x128x64_s8_k2",
               "smallm_128x64x64_s8_k2")


def _pdl(make, *args):
    return [make(*args, "pdl_end", pdl="end"), make(*args, "pdl_early", pdl="early")]


# Round 10 (log: docs/measurements/2026-12-03c-h200/sweep-round10.log): PDL for the GEMM kernels (1024^3 in a
# CUDA graph 5.0 us vs 5.7, cold L2 unchanged: now the default), and act_and_mul tilings with fewer, larger CTAs
# for few rows (FlashInfer runs one CTA of 1024 threads a row): fp16 37 x 2x14336 in a graph 1.4 us with 7
# segments of 256 threads (or 2 of 896) vs 1.6 with the default 14 of 128 (FlashInfer 1.5); 1 segment of 448
# threads x 4 vectors 2.8.
#
# Round 11 (log: docs/measurements/2026-12-03c-h200/sweep-round11.log): 256-thread segments equal 128 at the
# large act_and_mul shapes and win at few rows: now the default (its variant list is in git history).
#
# Round 12: PDL on and off for rmsnorm's cold-L2 rows, many rounds: round 9 and the bench of the final run read
# 4113x8192 1.5-4 % slower with PDL (within the rounds' spread), 8192x4096 faster.
VARIANTS = [
    _rms("bfloat16", 8192, "row"), _rms("bfloat16", 8192, "plain", pdl=None),
    _rms("bfloat16", 4096, "row"), _rms("bfloat16", 4096, "plain", pdl=None),
    _act("silu", 14336, "tile"),  # act_and_mul's default beside the references (its test reads it from here)
]

CALLS = {
    "rmsnorm": "fn(x2d, weight, out2d, eps: float, 0): x2d (M, H) and out2d (M, H) with unit column stride, "
               "16-byte row strides",
    "act_and_mul": "fn(x2d, out2d, 0): x2d (M, 2d), out2d (M, d), unit column stride",
    "fp16_bf16_gemm": "fn(a, b, c): C (M, N) = A (M, K) . B (N, K)^T, contiguous",
}


def _module(kernel: str):
    """The module that builds ``kernel``'s variants: for rmsnorm and act_and_mul the one in tools/sweeps/ (the
    product's schedules, and the sweep-only ones that left the product modules)."""
    if kernel == "fp16_bf16_gemm":
        from tirx_kernels.gemm import fp16_bf16_gemm as mod

        return mod
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if kernel == "rmsnorm":
        from sweeps import rmsnorm_variants as mod
    else:
        from sweeps import act_and_mul_variants as mod
    return mod


def _build_one(item):
    name, kernel, cfg, out = item
    from tirx_kernels.core import build

    mod = _module(kernel)
    params = mod.compile_params(**cfg)
    so = os.path.join(out, f"{name}.so")
    t0 = time.time()
    try:
        res = build.build_so(mod.get_kernel(**params), so)
    except Exception as e:  # keep going: one bad variant must not cost the sweep
        return {"name": name, "kernel": kernel, "params": params, "error": f"{type(e).__name__}: {e}"[-2000:]}
    ptxas = next(iter(res.ptxas_info.get("kernels", {}).values()), {})
    return {"name": name, "kernel": kernel, "params": params, "so": f"{name}.so", "call": CALLS[kernel],
            "ptxas": ptxas, "build_s": round(time.time() - t0, 1)}


def cmd_build(args) -> int:
    from concurrent.futures import ProcessPoolExecutor

    os.makedirs(args.out, exist_ok=True)
    only = args.only.split(",") if args.only else None
    items = [(n, k, c, args.out) for n, k, c in VARIANTS if not only or any(o in n for o in only)]
    with ProcessPoolExecutor(max_workers=args.jobs or os.cpu_count()) as ex:
        rows = list(ex.map(_build_one, items))
    for r in rows:
        p = r.get("ptxas", {})
        status = r.get("error", "").splitlines()[0] if "error" in r else (
            f"{p.get('registers')} regs, stack {p.get('stack_bytes')} B, spill {p.get('spill_store_bytes')} B")
        print(f"{r['name']:32s} {status}")
    with open(os.path.join(args.out, "variants.json"), "w") as f:
        json.dump({"variants": rows}, f, indent=1)
    bad = [r["name"] for r in rows if "error" in r]
    print(f"built {len(rows) - len(bad)}/{len(rows)} into {args.out}" + (f"; FAILED: {bad}" if bad else ""))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------------------
# run (GPU host)
# ---------------------------------------------------------------------------------------------------------

# "graph": time from CUDA graphs of back-to-back calls (bench.time_graph), as the suite does for rows under
# its graph threshold, instead of cold-L2 events.
SHAPES = [
    {"kernel": "fp16_bf16_gemm", "dtype": "bfloat16", "M": 1024, "N": 1024, "K": 1024, "graph": True},
    {"kernel": "fp16_bf16_gemm", "dtype": "bfloat16", "M": 1, "N": 4096, "K": 4096, "graph": True},
    {"kernel": "fp16_bf16_gemm", "dtype": "bfloat16", "M": 1, "N": 4096, "K": 4096},
    {"kernel": "fp16_bf16_gemm", "dtype": "bfloat16", "M": 128, "N": 4096, "K": 4096},
    {"kernel": "fp16_bf16_gemm", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096},
    {"kernel": "rmsnorm", "dtype": "bfloat16", "M": 32, "H": 128, "graph": True},
    {"kernel": "act_and_mul", "act": "silu", "dtype": "float16", "M": 37, "d": 14336, "graph": True},
    {"kernel": "rmsnorm", "dtype": "bfloat16", "M": 8192, "H": 4096},
    {"kernel": "rmsnorm", "dtype": "bfloat16", "M": 32768, "H": 8192},
    {"kernel": "rmsnorm", "dtype": "bfloat16", "M": 4113, "H": 8192},
    {"kernel": "rmsnorm", "dtype": "bfloat16", "M": 8192, "H": 7168},
    {"kernel": "rmsnorm", "dtype": "float16", "M": 4113, "H": 5120},
    # Correctness more than speed: fewer rows than persistent CTAs, and x rows strided (runtime stride).
    {"kernel": "rmsnorm", "dtype": "bfloat16", "M": 37, "H": 8192, "x_row_stride": 8256},
    {"kernel": "act_and_mul", "act": "silu", "dtype": "bfloat16", "M": 32768, "d": 14336},
    {"kernel": "act_and_mul", "act": "silu", "dtype": "bfloat16", "M": 4096, "d": 4096},
    {"kernel": "act_and_mul", "act": "gelu_tanh", "dtype": "bfloat16", "M": 4096, "d": 14336},
    {"kernel": "act_and_mul", "act": "silu", "dtype": "bfloat16", "M": 37, "d": 14336},  # fewer tiles than CTAs
]


def _matches(v: dict, shape: dict) -> bool:
    p = v["params"]
    if v["kernel"] != shape["kernel"] or p["dtype"] != shape["dtype"]:
        return False
    if shape["kernel"] == "rmsnorm":
        return p["H"] == shape["H"]
    if shape["kernel"] == "fp16_bf16_gemm":
        from tirx_kernels.gemm import fp16_bf16_gemm as mod

        return p["tile"] == mod.choose_tile(shape["M"], shape["N"], shape["K"])
    return p["act"] == shape["act"] and p["d"] == shape["d"]


def _torch_act(act, g):
    import torch.nn.functional as F

    return F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh" if act == "gelu_tanh" else "none")


def _references(shape: dict, data: dict) -> dict:
    """{name: zero-arg fn} for the references that import; each returns its output."""
    import torch
    import torch.nn.functional as F

    refs = {}
    if shape["kernel"] == "fp16_bf16_gemm":
        a, b = data["a"], data["b"]
        refs["cublas"] = lambda: F.linear(a, b)
        return refs
    if shape["kernel"] == "rmsnorm":
        x, w, eps = data["x"], data["w"], data["eps"]
        xc = x.contiguous()  # the libraries get contiguous rows (x itself for every timed shape)
        refs["torch"] = lambda: F.rms_norm(x, (x.shape[-1],), w, eps)
        comp = torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps), dynamic=False)
        refs["torch.compile"] = lambda: comp(x, w)
        try:
            from liger_kernel.transformers.functional import liger_rms_norm

            refs["liger"] = lambda: liger_rms_norm(xc, w, eps, offset=0.0, casting_mode="gemma")
        except Exception:
            pass
        try:
            import flashinfer.norm

            refs["flashinfer"] = lambda: flashinfer.norm.rmsnorm(xc, w, eps)
        except Exception:
            pass
        try:
            import quack

            refs["quack"] = lambda: quack.rmsnorm(xc, w, eps=eps)
        except Exception:
            pass
        return refs
    x, act = data["x"], shape["act"]
    d = x.shape[-1] // 2

    def eager(x):
        return _torch_act(act, x[..., :d]) * x[..., d:]

    refs["torch"] = lambda: eager(x)
    comp = torch.compile(eager, dynamic=False)
    refs["torch.compile"] = lambda: comp(x)
    try:
        import flashinfer.activation

        fi = getattr(flashinfer.activation, f"{act}_and_mul")
        refs["flashinfer"] = lambda: fi(x)
    except Exception:
        pass
    if act == "silu":
        try:
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            refs["liger"] = lambda: LigerSiLUMulFunction.apply(x[..., :d], x[..., d:])
        except Exception:
            pass
    return refs


def _data(shape: dict) -> dict:
    import torch

    t = {"bfloat16": torch.bfloat16, "float16": torch.float16}[shape["dtype"]]
    if shape["kernel"] == "fp16_bf16_gemm":
        M, N, K = shape["M"], shape["N"], shape["K"]
        a = torch.randn(M, K, device="cuda").to(t)
        b = torch.randn(N, K, device="cuda").to(t)
        return {"a": a, "b": b, "ref": a.float() @ b.float().T, "out_shape": (M, N), "dtype": t,
                "bytes": (M * K + N * K + M * N) * 2}
    if shape["kernel"] == "rmsnorm":
        M, H = shape["M"], shape["H"]
        x = torch.randn(M, shape.get("x_row_stride", H), device="cuda").to(t)[:, :H]
        w = torch.randn(H, device="cuda").to(t)
        xf = x.float()
        ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        return {"x": x, "w": w, "eps": 1e-6, "ref": ref, "out_shape": (M, H), "dtype": t,
                "bytes": 2 * M * H * 2 + H * 2}
    M, d = shape["M"], shape["d"]
    x = torch.randn(M, 2 * d, device="cuda").to(t)
    xf = x.float()
    ref = _torch_act(shape["act"], xf[:, :d]) * xf[:, d:]
    return {"x": x, "ref": ref, "out_shape": (M, d), "dtype": t, "bytes": 3 * M * d * 2}


def _caller(v: dict, fn, data: dict, out):
    if v["kernel"] == "fp16_bf16_gemm":
        a, b = data["a"], data["b"]
        return lambda: fn(a, b, out)
    if v["kernel"] == "rmsnorm":
        x, w, eps = data["x"], data["w"], data["eps"]
        return lambda: fn(x, w, out, eps, 0)
    x = data["x"]
    return lambda: fn(x, out, 0)


def _chain_check(fn, data: dict, out) -> str | None:
    """A PDL rmsnorm variant applied twice back to back, the second call reading the first's output (its
    ``griddepcontrol.wait`` is all that orders them once the first signals its dependents), 20 times with the
    intermediate re-poisoned each time; the result must match the oracle applied to the intermediate."""
    import torch

    x, w, eps = data["x"], data["w"], data["eps"]
    mid = torch.empty_like(out)
    for _ in range(20):
        mid.fill_(float("nan"))
        fn(x, w, mid, eps, 0)
        fn(mid, w, out, eps, 0)
    torch.cuda.synchronize()
    mf = mid.float()
    ref = mf * torch.rsqrt(mf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return _check(out, ref, data["dtype"])


def _check(out, ref, dtype) -> str | None:
    import torch

    if torch.isnan(out).any():
        return f"{int(torch.isnan(out).sum())} elements not written (NaN)"
    tol = 1.6e-2 if dtype == torch.bfloat16 else 4e-3
    err = (out.float() - ref).abs()
    bad = err > tol * (1 + ref.abs())
    if bad.any():
        return f"{int(bad.sum())} elements off, max abs err {float(err.max()):.3g}"
    return None


def cmd_run(args) -> int:
    import torch
    import tvm_ffi

    from tirx_kernels.core.bench import time_calls, time_graph

    with open(os.path.join(args.dir, "variants.json")) as f:
        variants = [v for v in json.load(f)["variants"] if "error" not in v]
    t_start = time.time()
    torch.manual_seed(0)
    summary = []
    for shape in SHAPES:
        vs = [v for v in variants if _matches(v, shape)]
        label = "x".join(str(shape[k]) for k in ("M", "N", "K", "H", "d") if k in shape)
        title = f"{shape['kernel']} {shape.get('act', '')} {shape['dtype']} {label}".replace("  ", " ")
        if "x_row_stride" in shape:
            title += f" (x row stride {shape['x_row_stride']})"
        if not vs:
            print(f"\n== {title}: no variants")
            continue
        data = _data(shape)
        fns, errors = {}, {}
        for v in vs:
            try:
                fn = tvm_ffi.load_module(os.path.join(args.dir, v["so"]))["main"]
                out = torch.full(data["out_shape"], float("nan"), device="cuda", dtype=data["dtype"])
                call = _caller(v, fn, data, out)
                call()
                torch.cuda.synchronize()
                err = _check(out, data["ref"], data["dtype"])
                if err is None:  # a second run on the same buffer after re-poisoning: no stale state
                    out.fill_(float("nan"))
                    call()
                    torch.cuda.synchronize()
                    err = _check(out, data["ref"], data["dtype"])
                if err is None and v["params"].get("pdl") and v["kernel"] == "rmsnorm":
                    err = _chain_check(fn, data, out)
                    err = err and f"chained calls: {err}"
            except Exception as e:
                err = f"{type(e).__name__}: {e}"[:300]
            if err:
                errors[v["name"]] = err
            else:
                fns[v["name"]] = call
        refs = {}
        for name, fn in _references(shape, data).items():
            try:
                fn()
                torch.cuda.synchronize()
                refs[name] = fn
            except Exception as e:
                errors[f"ref:{name}"] = f"{type(e).__name__}: {e}"[:200]
        if shape.get("graph"):
            title += " (CUDA graph)"
            times = {n: time_graph(f, rounds=args.rounds) for n, f in {**fns, **refs}.items()}
        else:
            times = time_calls({**fns, **refs}, calls=args.calls, rounds=args.rounds)
        best_ref = min(refs, key=lambda n: times[n]["median_us"]) if refs else None
        best_us = times[best_ref]["median_us"] if best_ref else float("nan")
        print(f"\n== {title}  (best reference: {best_ref} {best_us:.1f} us)")
        print(f"{'variant':34s} {'us':>8s} {'TB/s':>6s} {'ref/ours':>8s}  regs  spread(us)")
        rows = sorted(times.items(), key=lambda kv: kv[1]["median_us"])
        for name, t in rows:
            us = t["median_us"]
            regs = next((str(v["ptxas"].get("registers", "")) for v in vs if v["name"] == name), "ref")
            spread = f"{min(t['rounds_us']):.1f}-{max(t['rounds_us']):.1f}"
            print(f"{name:34s} {us:8.1f} {data['bytes'] / us / 1e6:6.2f} {best_us / us:8.3f}  {regs:>4s}  {spread}")
        for name, e in errors.items():
            print(f"{name:34s} FAILED: {e}")
        ours = [(n, t["median_us"]) for n, t in rows if n in fns]
        if ours:
            summary.append((title, ours[0][0], ours[0][1], best_ref, best_us))
        del data, fns, refs
        torch.cuda.empty_cache()
    print("\n== summary: best variant per shape vs best reference")
    for title, name, us, ref, ref_us in summary:
        print(f"{title:40s} {name:30s} {us:8.1f} us  {ref} {ref_us:8.1f} us  ref/ours {ref_us / us:.3f}")
    print(f"(sweep {time.time() - t_start:.0f} s)")
    print("SWEEP DONE")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build every variant (CPU: tvm + nvcc)")
    b.add_argument("--out", default="build/sweep")
    b.add_argument("--only", default="", help="build only variants whose name contains this")
    b.add_argument("--jobs", type=int, default=0)
    r = sub.add_parser("run", help="check and time every variant (GPU host: torch + tvm-ffi)")
    r.add_argument("--dir", default="build/sweep")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    return cmd_build(args) if args.cmd == "build" else cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
