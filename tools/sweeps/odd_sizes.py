#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Odd sizes against aligned ones (issue 19 item 2: an odd H / d within 10 % of the nearest aligned size): the
general kernels' schedule knobs timed beside the specialized kernel of the aligned size, in one process.

    python tools/sweeps/odd_sizes.py build --out build/odd   # CPU machine: tvm + nvcc -> .so per variant
    python tools/sweeps/odd_sizes.py run --dir build/odd     # GPU host: torch + apache-tvm-ffi only

The variants are built here, not from a bundle (the GPU host has no compiler and the knobs are not compile params
of the product modules): ``build`` writes one ``.so`` per variant and ``variants.json``; carry the folder. ``run``
checks every variant on each shape it serves against the fp32 oracle (NaN-poisoned output, two calls), then times
them with ``bench.time_calls`` (cold L2, interleaved rounds): the specialized kernels only at their own size, the
general variants at every size of their kernel. Variant names: ``rms_<knobs>`` / ``act_<knobs>``; ``spec`` is the
specialized kernel, ``gen`` the general kernel's default schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/: sweep_variants' data, oracle checks and references

# (name, kernel, spec): spec "spec" = the specialized kernel at ``size``; else the general kernel's knobs.
RMS_GENERAL = {
    "gen": {},
    "gen_t64": {"threads": 64, "ctas_per_sm": 16},
    "gen_edge": {"edge_loads": "vector"},
    "gen_r4": {"rows_per_cta": 4},
    "gen_r4_smem": {"rows_per_cta": 4, "weight_smem": True},
    "gen_r2_smem": {"rows_per_cta": 2, "weight_smem": True},
    "gen_r8_smem": {"rows_per_cta": 8, "weight_smem": True},
    "gen_edge_r4_smem": {"edge_loads": "vector", "rows_per_cta": 4, "weight_smem": True},
    "gen_edge_r8_smem": {"edge_loads": "vector", "rows_per_cta": 8, "weight_smem": True},
    # The several-rows variants need 65-72 registers: at 8 CTAs an SM (64) ptxas spilled 8 bytes, so 7 as well.
    "gen_r4_smem_c7": {"rows_per_cta": 4, "weight_smem": True, "ctas_per_sm": 7},
    "gen_edge_r4_smem_c7": {"edge_loads": "vector", "rows_per_cta": 4, "weight_smem": True, "ctas_per_sm": 7},
    "gen_edge_r8_smem_c7": {"edge_loads": "vector", "rows_per_cta": 8, "weight_smem": True, "ctas_per_sm": 7},
    "gen_edge_r4_smem_v4": {"edge_loads": "vector", "rows_per_cta": 4, "weight_smem": True, "vectors": 4,
                            "ctas_per_sm": 9},
    "gen_edge_r4_smem_t64": {"edge_loads": "vector", "rows_per_cta": 4, "weight_smem": True, "threads": 64,
                             "ctas_per_sm": 14},
}
ACT_GENERAL = {
    "gen": {},
    "gen_c2": {"chunks_per_thread": 2},
}
RMS_SPECIALIZED = (3000, 4096, 1544)  # the aligned neighbours of the odd shapes below
ACT_SPECIALIZED = (5120, 14336)

# (kernel, dtype, M, size): each odd size beside its aligned neighbour.
SHAPES = [
    ("rmsnorm", "bfloat16", 8192, 3000), ("rmsnorm", "bfloat16", 8192, 3001),
    ("rmsnorm", "bfloat16", 8192, 4096), ("rmsnorm", "bfloat16", 8192, 4095),
    ("rmsnorm", "bfloat16", 8192, 1544), ("rmsnorm", "bfloat16", 8192, 1543),
    ("act_and_mul", "bfloat16", 8192, 5120), ("act_and_mul", "bfloat16", 8192, 5121),
    ("act_and_mul", "bfloat16", 8192, 14336), ("act_and_mul", "bfloat16", 8192, 14335),
]


def variants() -> list[tuple[str, str, dict]]:
    out = [(f"rms_spec_{H}", "rmsnorm", {"spec": H}) for H in RMS_SPECIALIZED]
    out += [(f"rms_{n}", "rmsnorm", k) for n, k in RMS_GENERAL.items()]
    out += [(f"act_spec_{d}", "act_and_mul", {"spec": d}) for d in ACT_SPECIALIZED]
    out += [(f"act_{n}", "act_and_mul", k) for n, k in ACT_GENERAL.items()]
    return out


def kernel_of(kernel: str, spec: dict, dtype: str = "bfloat16", act: str = "silu"):
    """The TIRx function of a variant."""
    if kernel == "rmsnorm":
        from tirx_kernels.norm import _rmsnorm_general as gen
        from tirx_kernels.norm import rmsnorm as mod

        if "spec" in spec:
            return mod.get_kernel(**mod.compile_params(dtype=dtype, H=spec["spec"]))
        knobs = dict(spec)
        return gen.build_general(dtype, mod.PDL, knobs.pop("threads", gen.THREADS), knobs.pop("vectors", gen.VECTORS),
                                 knobs.pop("ctas_per_sm", None), **knobs)
    from tirx_kernels.ported.flashinfer.activation import _act_and_mul_general as gen
    from tirx_kernels.ported.flashinfer.activation import act_and_mul as mod

    if "spec" in spec:
        return mod.get_kernel(**mod.compile_params(act=act, dtype=dtype, d=spec["spec"]))
    return gen.build_general(act, dtype, mod.LOAD_POLICY, mod.STORE_POLICY, mod.PDL, **spec)


def _build_one(item):
    name, kernel, spec, out = item
    from tirx_kernels.core import build

    so = os.path.join(out, f"{name}.so")
    t0 = time.time()
    try:
        res = build.build_so(kernel_of(kernel, spec), so)
    except Exception as e:  # keep going: one bad variant must not cost the sweep
        return {"name": name, "kernel": kernel, "spec": spec, "error": f"{type(e).__name__}: {e}"[-2000:]}
    ptxas = next(iter(res.ptxas_info.get("kernels", {}).values()), {})
    return {"name": name, "kernel": kernel, "spec": spec, "so": f"{name}.so", "ptxas": ptxas,
            "build_s": round(time.time() - t0, 1)}


def cmd_build(args) -> int:
    from concurrent.futures import ProcessPoolExecutor

    os.makedirs(args.out, exist_ok=True)
    only = args.only.split(",") if args.only else None
    items = [(n, k, s, args.out) for n, k, s in variants() if not only or any(o in n for o in only)]
    with ProcessPoolExecutor(max_workers=args.jobs or os.cpu_count()) as ex:
        rows = list(ex.map(_build_one, items))
    for r in rows:
        p = r.get("ptxas", {})
        status = r.get("error", "").splitlines()[0] if "error" in r else (
            f"{p.get('registers')} regs, stack {p.get('stack_bytes')} B, spill {p.get('spill_store_bytes')} B")
        print(f"{r['name']:28s} {status}")
    index = os.path.join(args.out, "variants.json")
    if only and os.path.exists(index):  # a partial build keeps the other variants already in the folder
        with open(index) as f:
            built = {r["name"] for r in rows}
            rows = [r for r in json.load(f)["variants"] if r["name"] not in built] + rows
    with open(index, "w") as f:
        json.dump({"variants": rows}, f, indent=1)
    bad = [r["name"] for r in rows if "error" in r]
    print(f"built {len(rows) - len(bad)}/{len(rows)} into {args.out}" + (f"; FAILED: {bad}" if bad else ""))
    return 1 if bad else 0


def _serves(v: dict, kernel: str, size: int) -> bool:
    return v["kernel"] == kernel and v["spec"].get("spec", size) == size


def cmd_run(args) -> int:
    import torch
    import tvm_ffi
    from sweep_variants import _caller, _check, _data

    from tirx_kernels.core.bench import time_calls

    with open(os.path.join(args.dir, "variants.json")) as f:
        vs = [v for v in json.load(f)["variants"] if "error" not in v]
    fns_of = {v["name"]: tvm_ffi.load_module(os.path.join(args.dir, v["so"]))["main"] for v in vs}
    torch.manual_seed(0)
    results = {}
    for kernel, dtype, M, size in SHAPES:
        shape = {"kernel": kernel, "dtype": dtype, "M": M, **({"H": size} if kernel == "rmsnorm" else
                                                               {"act": "silu", "d": size})}
        title = f"{kernel} {dtype} {M}x{size}"
        data = _data(shape)
        calls, errors = {}, {}
        for v in (v for v in vs if _serves(v, kernel, size)):
            out = torch.full(data["out_shape"], float("nan"), device="cuda", dtype=data["dtype"])
            call = _caller({"kernel": kernel}, fns_of[v["name"]], data, out)
            try:
                err = None
                for _ in range(2):  # a second call on the re-poisoned output: no stale state
                    out.fill_(float("nan"))
                    call()
                    torch.cuda.synchronize()
                    err = err or _check(out, data["ref"], data["dtype"])
            except Exception as e:
                err = f"{type(e).__name__}: {e}"[:300]
            if err:
                errors[v["name"]] = err
            else:
                calls[v["name"]] = call
        times = time_calls(calls, calls=args.calls, rounds=args.rounds)
        print(f"\n== {title}")
        print(f"{'variant':28s} {'us':>8s} {'TB/s':>6s}  regs  spread(us)")
        for name, t in sorted(times.items(), key=lambda kv: kv[1]["median_us"]):
            regs = next(str(v["ptxas"].get("registers", "")) for v in vs if v["name"] == name)
            spread = f"{min(t['rounds_us']):.1f}-{max(t['rounds_us']):.1f}"
            print(f"{name:28s} {t['median_us']:8.1f} {data['bytes'] / t['median_us'] / 1e6:6.2f}  {regs:>4s}  {spread}")
            results[(kernel, size, name)] = t["median_us"]
        for name, e in errors.items():
            print(f"{name:28s} FAILED: {e}")
        del data
        torch.cuda.empty_cache()
    # Odd sizes against the specialized kernel of the aligned neighbour listed just before them (goal: <= 1.10).
    print("\n== odd / aligned specialized (goal <= 1.10)")
    for (k_a, _, _, aligned), (k_o, _, _, odd) in zip(SHAPES[::2], SHAPES[1::2]):
        base = results.get((k_a, aligned, f"{'rms' if k_a == 'rmsnorm' else 'act'}_spec_{aligned}"))
        if base is None:
            continue
        ours = sorted((us, n) for (k, s, n), us in results.items() if k == k_o and s == odd)
        for us, n in ours[:3]:
            print(f"{k_o:12s} {odd:6d} {n:28s} {us:8.1f} us vs {base:8.1f} ({aligned}): {us / base:.3f}")
    print("SWEEP DONE")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build every variant (CPU: tvm + nvcc)")
    b.add_argument("--out", default="build/odd")
    b.add_argument("--only", default="", help="build only variants whose name contains one of these (comma list)")
    b.add_argument("--jobs", type=int, default=0)
    r = sub.add_parser("run", help="check and time every variant (GPU host: torch + tvm-ffi)")
    r.add_argument("--dir", default="build/odd")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    return cmd_build(args) if args.cmd == "build" else cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
