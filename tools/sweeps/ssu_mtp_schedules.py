#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Schedule sweep of the Mamba-2 selective_state_update kernel (``_ssu_kernel.build_kernel``'s knobs), for the
multi-token rows where ours ran 0.52-0.85x FlashInfer 0.7.4 on the H100 (2026-12-07, 0.64-1.00 TB/s of a 3 TB/s
copy: neither side near the memory roof) and the single-token ones:

    python tools/sweeps/ssu_mtp_schedules.py build --out build/sweep-ssu   # CPU machine: .so files + variants.json
    python tools/sweeps/ssu_mtp_schedules.py run --dir build/sweep-ssu     # GPU host: torch + apache-tvm-ffi

A variant is (rows a CTA, lanes a row, rows a thread, token_major[, min CTAs an SM]: ``__launch_bounds__``' second
argument, a register cap). ``run`` takes each shape's data from the
registered module's ``prepare_data``, checks every variant's output and pool against the registered simple
schedule's on the same inputs (bf16 tolerance), then times the variants, that schedule and FlashInfer together
(``bench.time_calls``: cold L2, interleaved rounds). Exploration, not product: a winner goes into ``SCHEDULES``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (rows_per_cta, lanes_per_row, rows_per_thread, token_major); the first three of each token count are the row-major
# SCHEDULES (the registered single-token forms); the registered multi-token forms (MTP_SCHEDULES) are among the
# token-major ones and are also timed as "registered".
KNOBS = [(64, 8, 4, False), (16, 8, 2, False), (32, 16, 1, False),
         (64, 8, 4, True), (16, 8, 2, True), (32, 8, 2, True), (32, 8, 4, True), (64, 8, 2, True),
         (32, 4, 2, True), (64, 4, 4, True), (16, 4, 2, True),
         # occupancy (2026-12-07e, CPU analysis): the registered token-major simple form takes 128 registers at 64
         # threads, so 8 CTAs (16 warps) an SM, loads and math of a CTA not overlapped; b2048 ran 29 % of the copy
         # roof. Capped registers, and one row a thread (half the fp32 state in registers):
         (32, 4, 2, True, 12), (32, 8, 2, True, 8), (64, 8, 2, True, 4), (32, 4, 1, True), (32, 4, 1, True, 8),
         (16, 4, 1, True, 16)]
STP_KNOBS = [(64, 8, 4, False), (16, 8, 2, False), (32, 16, 1, False), (32, 8, 2, False), (64, 4, 4, False),
             (32, 4, 2, False)]
# (label, registered module, config overrides): the H100 bench rows of issue 25 and a serving-size STP row.
SHAPES = [
    # b1: the op's row ran 108 us against FlashInfer's 12.7 after the token-major change (H200, 2026-12-07d) while
    # b512's kernel time bounds a CTA at ~13 us: the kernel alone here, to split kernel from host time
    ("mtp b1 h64 d64 s128 t6", "selective_state_update_mtp_simple", {"batch": 1, "T": 6}),
    ("mtp b64 h64 d64 s128 t6", "selective_state_update_mtp_simple", {"batch": 64, "T": 6}),
    ("mtp b512 h64 d64 s128 t6", "selective_state_update_mtp_simple", {"batch": 512, "T": 6}),
    ("mtp b2048 h64 d64 s128 t6", "selective_state_update_mtp_simple", {"batch": 2048, "T": 6}),
    ("stp b64 h64 d64 s128", "selective_state_update_stp_simple", {"batch": 64}),
    ("stp b64 h64 d128 s256", "selective_state_update_stp_simple", {"batch": 64, "dim": 128, "dstate": 256}),
]


def variant_name(knobs, max_tokens: int, dstate: int) -> str:
    r, lanes, rt, tm, mb = (*knobs, 0)[:5]
    return f"t{max_tokens}_s{dstate}_r{r}_l{lanes}_rt{rt}" + ("_tm" if tm else "") + (f"_mb{mb}" if mb else "")


def _build_one(item):
    knobs, max_tokens, dstate, out = item
    from tirx_kernels.core import build
    from tirx_kernels.ported.flashinfer.mamba import _ssu_kernel as sk

    r, lanes, rt, tm, mb = (*knobs, 0)[:5]
    name = variant_name(knobs, max_tokens, dstate)
    t0 = time.time()
    try:
        res = build.build_so(sk.build_kernel("bfloat16", "bfloat16", dstate, max_tokens, rows_per_cta=r,
                                             lanes_per_row=lanes, rows_per_thread=rt, token_major=tm,
                                             min_blocks_per_sm=mb),
                             os.path.join(out, name + ".so"))
    except Exception as e:  # one bad variant does not cost the sweep
        return {"name": name, "error": f"{type(e).__name__}: {e}"[-1500:]}
    ptxas = next(iter(res.ptxas_info.get("kernels", {}).values()), {})
    return {"name": name, "so": name + ".so", "knobs": list(knobs), "max_tokens": max_tokens, "dstate": dstate,
            "registers": ptxas.get("registers"), "spill": ptxas.get("spill_store_bytes"),
            "build_s": round(time.time() - t0, 1)}


def cmd_build(a) -> int:
    from concurrent.futures import ProcessPoolExecutor

    os.makedirs(a.out, exist_ok=True)
    items = [(k, 8, 128, a.out) for k in KNOBS] + [(k, 1, s, a.out) for k in STP_KNOBS for s in (128, 256)]
    with ProcessPoolExecutor(max_workers=a.jobs or os.cpu_count()) as ex:
        rows = list(ex.map(_build_one, items))
    for r in rows:
        print(f"{r['name']:32s} " + (r["error"].splitlines()[0] if "error" in r else
                                     f"{r['registers']} regs, spill {r['spill']} B, {r['build_s']} s"))
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump({"variants": rows}, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


def _fits(v, n) -> bool:
    r = v["knobs"][0]
    tokens = n["x"].shape[1]
    return (v["dstate"] == n["state"].shape[3] and (v["max_tokens"] == 1) == (tokens == 1)
            and n["x"].shape[3] % r == 0)


def cmd_run(a) -> int:
    import torch
    import tvm_ffi

    from tirx_kernels import registry
    from tirx_kernels.core import bench, harness
    from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as ssu
    from tirx_kernels.ported.flashinfer.mamba import _ssu_op as op

    with open(os.path.join(a.dir, "variants.json")) as f:
        variants = [v for v in json.load(f)["variants"] if "error" not in v]
    for label, kernel, over in SHAPES:
        mod = registry.load(kernel)
        cfg = harness.full_config(mod, {**mod.CONFIGS[0], **over, "intermediate": False, "dst": False,
                                        "z": False, "pad": False})
        torch.manual_seed(0)
        data = mod.prepare_data(**cfg)
        n = ssu.normalize(*ssu.op_args(data))
        sched = "mtp_simple" if n.pop("mtp") else "stp_simple"
        pool0, fns, errors = n["state"].clone(), {}, {}
        n["out"].fill_(float("nan"))
        op.run(sched, n)  # the registered simple schedule: what every variant must reproduce
        torch.cuda.synchronize()
        want_out, want_pool = n["out"].float().clone(), n["state"].float().clone()
        for v in (v for v in variants if _fits(v, n)):
            try:
                fn = tvm_ffi.load_module(os.path.join(a.dir, v["so"]))["main"]
                ptrs, scalars, _, _, _ = op.kernel_args(**n, schedule=sched)
                args = [*(ptrs[k] for k in op.ARG_ORDER), *(scalars[k] for k in op.SCALAR_ORDER)]
                n["state"].copy_(pool0)
                n["out"].fill_(float("nan"))
                fn(*args)
                torch.cuda.synchronize()
                for got, want, what in ((n["out"].float(), want_out, "out"), (n["state"].float(), want_pool, "pool")):
                    if not torch.allclose(got, want, atol=3e-2, rtol=2e-2):
                        raise AssertionError(f"{what} differs from the registered op's: max "
                                             f"{(got - want).abs().nan_to_num(1e9).max().item():.3g}")
                fns[v["name"]] = (lambda f=fn, x=args: f(*x))
            except Exception as e:
                errors[v["name"]] = f"{type(e).__name__}: {e}"[:200]
        fns[f"registered {sched}"] = lambda s=sched, nn=n: op.run(s, nn)
        for ref, make in mod.get_baselines(**cfg).items():
            try:
                f = make()
                f(data)
                torch.cuda.synchronize()
                fns[ref] = (lambda f=f, d=data: f(d))
            except Exception as e:
                errors[ref] = f"{type(e).__name__}: {e}"[:200]
        times = bench.time_calls(fns)
        nbytes = mod.roofline(**cfg)["bytes"]
        best = min(t["median_us"] for t in times.values())
        print(f"\n== {label} ({nbytes / 1e6:.0f} MB of state and I/O)")
        for name, t in sorted(times.items(), key=lambda kv: kv[1]["median_us"]):
            us = t["median_us"]
            print(f"  {name:32s} {us:9.1f} us  {nbytes / us / 1e6:5.2f} TB/s  x{us / best:.2f}")
        for name, err in errors.items():
            print(f"  {name:32s} FAILED: {err}")
    return 0


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=os.path.join(ROOT, "build", "sweep-ssu"))
    b.add_argument("--jobs", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("--dir", default=os.path.join(ROOT, "build", "sweep-ssu"))
    a = ap.parse_args(argv)
    return cmd_build(a) if a.cmd == "build" else cmd_run(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
