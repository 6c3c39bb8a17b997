#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Mamba-2 selective_state_update state tile staged in shared memory by bulk copies (``_ssu_kernel_tma``'s
``state_io``; its ``stage_vectors``: B / C staged with 16-byte loads), against the registered register-loading forms
and FlashInfer 0.7.4 in place, on issue 25's H100 rows (2026-12-07e: ours 0.4-0.8x FlashInfer; the register-cap
sweep's best MTP form 0.70x, so not occupancy alone):

    python tools/sweeps/ssu_tma_schedules.py build --out build/sweep-ssu-tma   # CPU machine: .so files + variants.json
    python tools/sweeps/ssu_tma_schedules.py run --dir build/sweep-ssu-tma     # GPU host: torch + apache-tvm-ffi
    python tools/sweeps/ssu_tma_schedules.py index --out build/sweep-ssu-tma   # variants.json of what is built so far

``state_io="bulk"``: one thread issues the CTA's state tile (its rows of one head: one contiguous run of the pool) as
``rows_per_thread`` bulk copies on as many mbarriers before the B / C staging, so the tile is in flight with no
registers held and a thread starts on its first row as soon as that piece lands (FlashInfer's sm90 MTP kernel stages
state rows in shared memory through TMA; read for design only). ``"bulk_store"``: the final state also goes back
through the tile, one bulk store a CTA. ``"regs"``: the registered forms (16-byte vector loads into registers).

``run``: each shape's variants are first checked against the fp32 oracle (``_ssu_op.oracle``) on the shape with the
batch cut to 16, a pad slot and z (output and the whole pool, bf16 tolerance); a variant that fails is not timed.
Then the variants, the registered op (where the product bundle is there) and FlashInfer in place are timed together
(``bench.time_calls``: CUDA events, cold L2, interleaved rounds) on the bench configs (no z, no pad, as call A's
sweep). Exploration, not product: a winner goes into ``SCHEDULES`` / ``MTP_SCHEDULES`` after this measures it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (state_io, rows_per_cta, lanes_per_row, rows_per_thread, token_major[, min CTAs an SM[, stage_vectors]])
MTP_KNOBS = [
    ("regs", 32, 4, 2, True),          # the registered MTP simple form
    ("regs", 16, 4, 1, True, 16),      # call A's best (0.70x FlashInfer at b2048)
    ("bulk", 32, 4, 2, True),
    ("bulk_store", 32, 4, 2, True),
    ("bulk_store", 16, 4, 1, True),
    ("bulk_store", 32, 8, 2, True),
    ("bulk_store", 32, 8, 4, True),    # 4 rows share each B / C shared-memory load (half the smem traffic of 2)
    ("bulk_store", 64, 8, 4, True),
    # row-major: one row's fp32 state in registers at a time, the rest waits in the tile (fewer registers)
    ("bulk_store", 32, 4, 2, False),
    ("bulk_store", 64, 8, 4, False),
    # B / C staged with 16-byte loads (the registered form issues 2 x 8 x 128 2-byte loads a CTA: 4x the load
    # instructions of its state tile)
    ("regs", 32, 4, 2, True, 0, True),
    ("regs", 16, 4, 1, True, 16, True),
    ("bulk_store", 32, 4, 2, True, 0, True),
    ("bulk_store", 32, 8, 4, True, 0, True),
    ("bulk_store", 16, 4, 1, True, 16, True),
    ("bulk_store", 32, 4, 2, False, 0, True),
    ("bulk_store", 64, 8, 4, False, 0, True),
    # a row over 16 lanes, row-major, B / C vectors (FlashInfer's simple MTP kernel, read for design: a row a warp,
    # state rows staged in shared memory, B / C staged with vector loads, every token of a row before the next row)
    ("bulk_store", 32, 16, 1, False, 0, True),
    ("bulk_store", 64, 16, 2, False, 0, True),
    ("bulk_store", 64, 8, 4, False, 8, True),  # the row-major tile form (70 registers) capped to 8 CTAs an SM
]
STP_KNOBS = [
    ("regs", 64, 8, 4, False),         # the registered STP simple form
    ("bulk", 64, 8, 4, False),
    ("bulk_store", 64, 8, 4, False),
    ("bulk_store", 32, 8, 2, False),
    ("bulk_store", 64, 4, 4, False),   # 64 threads, 4 pieces of 16 rows
    ("bulk_store", 64, 8, 8, False),   # 64 threads, 8 pieces of 8 rows (a row sooner)
    ("bulk_store", 16, 8, 2, False),   # 4x the CTAs
    # occupancy (ptxas, 2026-12-08): the registered form takes 95 registers at s128 and 154 at s256 (128 threads: 5
    # and 3 CTAs an SM, 4096 / 8192 CTAs in 6-7 waves); the tile forms 64 / 95. Capped at 8 CTAs an SM (64):
    ("regs", 64, 8, 4, False, 8),
    ("bulk_store", 64, 8, 4, False, 8),
]
MTP_TOKENS = 8  # the registered MTP artifacts' max_tokens (T = 6 calls run them)
# (label, registered module, config overrides, max_tokens, dstate)
SHAPES = [
    ("stp b64 h64 d64 s128", "selective_state_update_stp_simple", {"batch": 64}, 1, 128),
    ("stp b64 h64 d128 s256", "selective_state_update_stp_simple", {"batch": 64, "dim": 128, "dstate": 256}, 1, 256),
    ("mtp b1 h64 d64 s128 t6", "selective_state_update_mtp_simple", {"batch": 1, "T": 6}, MTP_TOKENS, 128),
    ("mtp b512 h64 d64 s128 t6", "selective_state_update_mtp_simple", {"batch": 512, "T": 6}, MTP_TOKENS, 128),
    ("mtp b2048 h64 d64 s128 t6", "selective_state_update_mtp_simple", {"batch": 2048, "T": 6}, MTP_TOKENS, 128),
]
CHECK_BATCH = 16
TOL = (3e-2, 2e-2)  # bf16 state and output against the fp32 oracle (the emulated tests' tolerance)


def _unpack(knobs):
    return (*knobs, 0, False)[:7] if len(knobs) == 5 else (*knobs, False)[:7]


def variant_name(knobs, max_tokens: int, dstate: int) -> str:
    io, r, lanes, rt, tm, mb, sv = _unpack(knobs)
    return (f"{io}_t{max_tokens}_s{dstate}_r{r}_l{lanes}_rt{rt}" + ("_tm" if tm else "")
            + (f"_mb{mb}" if mb else "") + ("_sv" if sv else ""))


def _items(out):
    return ([(k, MTP_TOKENS, 128, out) for k in MTP_KNOBS]
            + [(k, 1, s, out) for k in STP_KNOBS for s in (128, 256)])


def _build_one(item):
    knobs, max_tokens, dstate, out = item
    from tirx_kernels.core import build
    from tirx_kernels.ported.flashinfer.mamba import _ssu_kernel_tma as sk

    io, r, lanes, rt, tm, mb, sv = _unpack(knobs)
    name = variant_name(knobs, max_tokens, dstate)
    side = os.path.join(out, name + ".json")
    if os.path.exists(side) and os.path.exists(os.path.join(out, name + ".so")):  # built by an earlier run
        with open(side) as f:
            return json.load(f)
    t0 = time.time()
    try:
        res = build.build_so(sk.build_kernel("bfloat16", "bfloat16", dstate, max_tokens, rows_per_cta=r,
                                             lanes_per_row=lanes, rows_per_thread=rt, token_major=tm,
                                             min_blocks_per_sm=mb, state_io=io, stage_vectors=sv),
                             os.path.join(out, name + ".so"))
    except Exception as e:  # one bad variant does not cost the sweep
        return {"name": name, "error": f"{type(e).__name__}: {e}"[-1500:]}
    ptxas = next(iter(res.ptxas_info.get("kernels", {}).values()), {})
    row = {"name": name, "so": name + ".so", "knobs": list(knobs), "max_tokens": max_tokens, "dstate": dstate,
           "registers": ptxas.get("registers"), "spill": ptxas.get("spill_store_bytes"),
           "build_s": round(time.time() - t0, 1)}
    with open(side, "w") as f:
        json.dump(row, f)
    return row


def cmd_build(a) -> int:
    from concurrent.futures import ProcessPoolExecutor

    os.makedirs(a.out, exist_ok=True)
    with ProcessPoolExecutor(max_workers=a.jobs or os.cpu_count()) as ex:
        rows = list(ex.map(_build_one, _items(a.out)))
    for r in rows:
        print(f"{r['name']:40s} " + (r["error"].splitlines()[0] if "error" in r else
                                     f"{r['registers']} regs, spill {r['spill']} B, {r['build_s']} s"))
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump({"variants": rows}, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


_NAME = re.compile(r"^(regs|bulk|bulk_store)_t(\d+)_s(\d+)_r(\d+)_l(\d+)_rt(\d+)(_tm)?(?:_mb(\d+))?(_sv)?$")


def cmd_index(a) -> int:
    """variants.json from the .so files in ``--out`` (a build cut short, or built in parts): knobs from the names,
    registers from each variant's side file where it has one."""
    rows = []
    for so in sorted(f for f in os.listdir(a.out) if f.endswith(".so")):
        name = so[:-3]
        side = os.path.join(a.out, name + ".json")
        if os.path.exists(side):
            with open(side) as f:
                rows.append(json.load(f))
            continue
        m = _NAME.match(name)
        if not m:
            continue
        io, t, st, r, lanes, rt, tm, mb, sv = m.groups()
        rows.append({"name": name, "so": so, "knobs": [io, int(r), int(lanes), int(rt), bool(tm), int(mb or 0),
                                                        bool(sv)], "max_tokens": int(t), "dstate": int(st)})
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump({"variants": rows}, f, indent=1)
    print(f"{len(rows)} variants indexed")
    return 0


def _fits(v, max_tokens, dstate, dim) -> bool:
    return v["max_tokens"] == max_tokens and v["dstate"] == dstate and dim % v["knobs"][1] == 0


def _normalized(mod, ssu, cfg):
    import torch

    torch.manual_seed(0)
    data = mod.prepare_data(**cfg)
    n = ssu.normalize(*ssu.op_args(data))
    n.pop("mtp")
    return data, n


def _args(op, n, sched):
    ptrs, scalars, _, _, _ = op.kernel_args(**n, schedule=sched)
    return [*(ptrs[k] for k in op.ARG_ORDER), *(scalars[k] for k in op.SCALAR_ORDER)]


def _check(fn, op, n, sched, want_out, want_pool, pool0):
    """The variant on ``n`` (its pool restored first) against the oracle's output and pool."""
    import torch

    n["state"].copy_(pool0)
    n["out"].fill_(float("nan"))
    fn(*_args(op, n, sched))
    torch.cuda.synchronize()
    for got, want, what in ((n["out"].float(), want_out, "out"), (n["state"].float(), want_pool.float(), "pool")):
        bad = ~torch.isclose(got, want, atol=TOL[0], rtol=TOL[1])
        if bad.any():
            raise AssertionError(f"{what}: {int(bad.sum())} elements off the oracle, max "
                                 f"{(got - want).abs().nan_to_num(1e9).max().item():.3g}")


def cmd_run(a) -> int:
    import torch
    import tvm_ffi

    from tirx_kernels import registry
    from tirx_kernels.core import bench, harness
    from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as ssu
    from tirx_kernels.ported.flashinfer.mamba import _ssu_op as op

    print(torch.cuda.get_device_name(), flush=True)
    with open(os.path.join(a.dir, "variants.json")) as f:
        variants = [v for v in json.load(f)["variants"] if "error" not in v]
    for v in variants:
        v["fn"] = tvm_ffi.load_module(os.path.join(a.dir, v["so"]))["main"]
    oracle_keys = set(inspect.signature(op.oracle).parameters)
    regs = {v["name"]: v.get("registers") for v in variants}
    table = []
    for label, kernel, over, max_tokens, dstate in SHAPES:
        t_shape = time.time()
        mod = registry.load(kernel)
        sched = "mtp_simple" if max_tokens > 1 else "stp_simple"
        base = {**mod.CONFIGS[0], **over, "intermediate": False, "dst": False}
        mine = [v for v in variants if _fits(v, max_tokens, dstate, base.get("dim", 64))]
        # 1. the oracle check, batch cut to CHECK_BATCH, with a pad slot and z
        _, n = _normalized(mod, ssu, harness.full_config(mod, {**base, "batch": min(base["batch"], CHECK_BATCH),
                                                               "z": True, "pad": True}))
        pool0 = n["state"].clone()
        want_out, want_pool, _ = op.oracle(**{k: v for k, v in n.items() if k in oracle_keys})
        errors, fns = {}, {}
        for v in mine:
            try:
                _check(v["fn"], op, n, sched, want_out, want_pool, pool0)
            except Exception as e:
                errors[v["name"]] = f"{type(e).__name__}: {e}"[:200]
        del n, pool0, want_out, want_pool
        # 2. timing on the bench config, ours in place and FlashInfer in place
        cfg = harness.full_config(mod, {**base, "z": False, "pad": False})
        data, n = _normalized(mod, ssu, cfg)
        for v in mine:
            if v["name"] not in errors:
                fns[v["name"]] = (lambda f=v["fn"], x=_args(op, n, sched): f(*x))
        try:
            op.run(sched, n)
            torch.cuda.synchronize()
            fns[f"registered op {sched}"] = lambda s=sched, nn=n: op.run(s, nn)
        except Exception as e:  # the product bundle not unpacked here: the "regs" variants are the same kernels
            errors[f"registered op {sched}"] = f"{type(e).__name__}: {e}"[:200]
        for ref, make in mod.get_baselines(**cfg).items():
            try:
                f = make()
                f(data)
                torch.cuda.synchronize()
                fns[ref] = (lambda f=f, d=data: f(d))
            except Exception as e:
                errors[ref] = f"{type(e).__name__}: {e}"[:200]
        times = bench.time_calls(fns, calls=a.calls, rounds=a.rounds)
        nbytes = mod.roofline(**cfg)["bytes"]
        fi = times.get("flashinfer", {}).get("median_us")
        print(f"\n== {label} ({nbytes / 1e6:.0f} MB of state and I/O; {time.time() - t_shape:.0f} s)", flush=True)
        for name, t in sorted(times.items(), key=lambda kv: kv[1]["median_us"]):
            us = t["median_us"]
            ratio = f"x{fi / us:.2f} vs FlashInfer" if fi else ""
            print(f"  {name:44s} {us:9.1f} us  {nbytes / us / 1e6:5.2f} TB/s  {ratio}  rounds "
                  + " ".join(f"{r:.1f}" for r in t["rounds_us"]), flush=True)
            table.append((label, name, us, fi / us if fi else None))
        for name, err in errors.items():
            print(f"  {name:44s} FAILED: {err}", flush=True)
            table.append((label, name, None, None))
        del data, n, fns
        torch.cuda.empty_cache()
    print("\n== table (us; ratio = FlashInfer us / ours: > 1 is faster than FlashInfer; registers a thread)")
    for label, name, us, ratio in table:
        r = f"{regs[name]:4d}r" if regs.get(name) else "     "
        print(f"{label:26s} {name:44s} {r} " + (f"{us:9.1f}  {ratio:5.2f}" if us is not None and ratio
                                                   else f"{us:9.1f}      -" if us is not None else "   FAILED"))
    return 0


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=os.path.join(ROOT, "build", "sweep-ssu-tma"))
    b.add_argument("--jobs", type=int, default=0)
    i = sub.add_parser("index")
    i.add_argument("--out", default=os.path.join(ROOT, "build", "sweep-ssu-tma"))
    r = sub.add_parser("run")
    r.add_argument("--dir", default=os.path.join(ROOT, "build", "sweep-ssu-tma"))
    r.add_argument("--calls", type=int, default=20)
    r.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    return {"build": cmd_build, "index": cmd_index, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
