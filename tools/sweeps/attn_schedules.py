#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Schedule variants of the attention forward (``_fwd_kernel.build_fwd_kernel``'s knobs) and backward main kernel
(``_bwd_kernel.build_bwd_kernel``'s), for issues 22 / 23's bf16 rows at b2 h16 s8192 (H100, 2026-12-07b pins:
forward hd128 526 TFLOP/s, hd128 causal 546, hd64 388; backward hd128 510; targets >= 555 / 465 / 537):

    python tools/sweeps/attn_schedules.py build --out build/sweep-attn   # CPU machine: .so files + variants.json
    python tools/sweeps/attn_schedules.py run --dir build/sweep-attn     # GPU host: torch + apache-tvm-ffi

What the variants change (SASS of the product kernels read on the CPU machine, 2026-12-07):
- ``exp2`` (now the forward's default, ``product``): the softmax weights by ``ex2.approx.ftz.f32``. ``exp2f``
  lowers to the non-ftz ``ex2.approx.f32`` and ptxas wraps each in FSETP + two predicated FMULs: 4 instructions a
  weight instead of 1 (64 weights a thread a tile in the forward, 32 in the backward).
- ``ovl2`` (forward): the intra-warpgroup overlap as designed. In the product's ``overlap`` loop ptxas placed the
  wait for PV n - 1 (WARPGROUP.DEPBAR.LE gsb0, 0x0) ahead of the softmax of tile n, so the softmax never ran under
  the PV GEMM: ``split_mask`` (tiles that need no mask in a branch-free loop) and ``late_release`` (V's slot given
  back after P is packed) leave it below most of the MUFU.EX2.
- ``ovl3``: ``ovl2`` and the PV wait fenced: ptxas puts the wait (and any barrier) into the first latency bubble
  after the S wait, so ``ovl2`` still left 41 of 66 MUFU.EX2 of a tile after it (none before it in the causal
  kernel); a warpgroup bar.sync whose id depends on both row sums (always + 0, unprovably) keeps all 66 before it.
- ``ovl3_re``: ``ovl3`` with FA3's order of the O rescale (between the QK^T and PV issues, under QK^T), so only P's
  packing follows the PV wait. (Alone, without the fence, it left the wait ahead of the softmax too.)
- ``exp2_fence`` (backward): the same fence for the dP^T wait (all 32 MUFU.EX2 of P^T before it, where the product
  kernel had 2 of 32: P^T did not run under the dP^T GEMM).
- ``n176`` / ``n192``: wider key tiles (FA3's 128 x 176 for hd128 non-causal, 192 keys at hd64): fewer row
  reductions, O rescales and barrier turns per key.
- ``c3`` (hd64): three consumer warpgroups, 192 query rows a CTA, 512 threads, setmaxnreg 32 / 160 (FA3's hd64
  tile): at hd64 the exp2 of a tile costs as many SM cycles as its two GEMMs (16 MUFU.EX2 a clock vs 4096 dense
  FLOP a clock), so more warps to hide the softmax under the other warpgroups' GEMMs.

``run`` checks every variant against an fp32 oracle on small ragged shapes (forward: out and LSE; backward: dq, dk,
dv through ``flash_attention_backward.run_kernels`` with the variant as its main kernel), then times the variants
beside torch SDPA's cuDNN and flash backends at the pinned rows (CUDA events, cold L2: a 512 MiB fill before every
call; rounds interleaved; medians). Exploration, not product: a winner goes into ``flash_attention4`` /
``flash_attention_backward``'s tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (variant, head_dim, causal): flash_attention4.VARIANTS' names ("base": the kernel of the 2026-12-07 pins,
# "product": today's default); block_n is the product table's unless a variant sets it.
FWD_VARIANTS = [
    ("base", 128, False), ("product", 128, False), ("ovl2", 128, False), ("ovl2_n176", 128, False),
    ("pp_exp2", 128, False), ("ovl3", 128, False), ("ovl3_n176", 128, False), ("ovl3_re", 128, False),
    ("base", 128, True), ("product", 128, True), ("ovl2", 128, True), ("ovl3", 128, True),
    ("base", 64, False), ("product", 64, False), ("ovl2", 64, False), ("ovl2_n192", 64, False),
    ("ovl2_c3", 64, False), ("exp2_c3", 64, False), ("ovl3", 64, False), ("ovl3_n192", 64, False),
    ("ovl3_c3", 64, False), ("ovl3_re", 64, False),
]
BWD_VARIANTS = [("base", 128, False, {"fast_exp2": False}), ("exp2", 128, False, {"fast_exp2": True}),
                ("exp2_fence", 128, False, {"fast_exp2": True, "wait_fence": True})]
# Timed rows (B, S, H, D, causal) and the checked small shapes (B, Sq, Sk, Hq, Hkv).
FWD_ROWS = [(2, 8192, 16, 128, False), (2, 8192, 16, 128, True), (2, 8192, 16, 64, False)]
BWD_ROWS = [(2, 8192, 16, 128, False)]
CHECK_SHAPES = [(1, 1000, 1000, 4, 2), (2, 333, 517, 2, 2)]


def fwd_name(name, d, causal):
    return f"fwd_d{d}{'_causal' if causal else ''}_{name}"


def _build_one(item):
    kind, name, d, causal, knobs, out = item
    from tirx_kernels.core import build
    from tirx_kernels.ported.flashattention import _bwd_kernel, _bwd_pre_post, _fwd_kernel, flash_attention4

    t0 = time.time()
    if kind == "fwd":
        so = fwd_name(name, d, causal)
        knobs = flash_attention4.kernel_knobs(d, d, variant=None if name == "product" else name)
        func = lambda: _fwd_kernel.build_fwd_kernel("bfloat16", d, d, causal, **knobs)  # noqa: E731
    elif kind == "bwd":
        so = f"bwd_d{d}{'_causal' if causal else ''}_{name}"
        func = lambda: _bwd_kernel.build_bwd_kernel("bfloat16", d, d, causal,  # noqa: E731
                                                    _bwd_kernel.block_m_for(d), **knobs)
    else:  # the backward's pre / post kernels (bf16), as the product builds them
        so = f"bwd_{name}"
        builder = {"pre": _bwd_pre_post.build_preprocess, "post": _bwd_pre_post.build_postprocess}[name]
        func = lambda: builder("bfloat16")  # noqa: E731
    try:
        res = build.build_so(func(), os.path.join(out, so + ".so"))
    except Exception as e:  # one bad variant does not cost the sweep
        return {"name": so, "error": f"{type(e).__name__}: {e}"[-1500:]}
    os.remove(res.cu_path)  # the tar carries the .so only
    ptxas = next(iter(res.ptxas_info.get("kernels", {}).values()), {})
    return {"name": so, "so": so + ".so", "kind": kind, "variant": name, "head_dim": d, "causal": causal,
            "knobs": knobs, "registers": ptxas.get("registers"), "spill": ptxas.get("spill_store_bytes"),
            "build_s": round(time.time() - t0, 1)}


def cmd_build(a) -> int:
    from concurrent.futures import ProcessPoolExecutor

    os.makedirs(a.out, exist_ok=True)
    items = ([("fwd", n, d, c, {}, a.out) for n, d, c in FWD_VARIANTS]
             + [("bwd", n, d, c, k, a.out) for n, d, c, k in BWD_VARIANTS]
             + [("aux", n, 0, False, {}, a.out) for n in ("pre", "post")])
    with ProcessPoolExecutor(max_workers=a.jobs or os.cpu_count()) as ex:
        rows = list(ex.map(_build_one, items))
    for r in rows:
        print(f"{r['name']:32s} " + (r["error"].splitlines()[0] if "error" in r else
                                     f"{r['registers']} regs, spill {r['spill']} B, {r['build_s']} s"))
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump({"variants": rows}, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


# ------------------------------------------------------------------------------------------------ GPU side


def _oracle(q, k, v, scale, causal):
    """fp32 attention, flash-attn's conventions (bottom-right causal): (out [B, Sq, Hq, D], lse [B, Hq, Sq])."""
    import torch

    Sq, Hq, Sk, Hkv = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    kf = k.float().transpose(1, 2).repeat_interleave(Hq // Hkv, 1)
    vf = v.float().transpose(1, 2).repeat_interleave(Hq // Hkv, 1)
    s = q.float().transpose(1, 2) @ kf.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1) @ vf).transpose(1, 2), lse


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12)).item()


def _time(fns: dict, calls: int = 8, rounds: int = 5) -> dict:
    """Median microseconds a call: every round runs each function ``calls`` times, each after a 512 MiB fill (cold
    L2), start/end events around the call only."""
    import statistics

    import torch

    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    for fn in fns.values():
        fn()
        fn()
    torch.cuda.synchronize()
    samples = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
            for i, (s, e) in enumerate(ev):
                flush.fill_(i & 0xFF)
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            samples[name].append(statistics.median(s.elapsed_time(e) * 1e3 for s, e in ev))
    return {n: statistics.median(v) for n, v in samples.items()}


def _sdpa(backend):
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = getattr(SDPBackend, backend)

    def run(q, k, v, causal, scale):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal, scale=scale).transpose(1, 2)
    return run


def _sdpa_backward(backend, q, k, v, dout, causal, scale):
    """SDPA's backward alone (its forward graph built once, kept for every call)."""
    import torch

    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = _sdpa(backend)(qq, kk, vv, causal, scale)
    return lambda: torch.autograd.grad(o, (qq, kk, vv), dout, retain_graph=True)


def cmd_run(a) -> int:
    import torch
    import tvm_ffi

    with open(os.path.join(a.dir, "variants.json")) as f:
        variants = [v for v in json.load(f)["variants"] if "error" not in v]
    load = {v["name"]: tvm_ffi.load_module(os.path.join(a.dir, v["so"]))["main"] for v in variants}
    table, bad = [], {}
    torch.manual_seed(0)
    dev = "cuda"
    bf = torch.bfloat16

    def fwd(fn, q, k, v, scale):
        B, Sq, Hq, _ = q.shape
        out = torch.empty(B, Sq, Hq, v.shape[3], dtype=q.dtype, device=dev)
        lse = torch.empty(B, Hq, Sq, dtype=torch.float32, device=dev)
        fn(q, k, v, out, lse, float(scale))
        return out, lse

    # --- forward: check, then time
    for v in (v for v in variants if v["kind"] == "fwd"):
        d, causal = v["head_dim"], v["causal"]
        try:
            for B, Sq, Sk, Hq, Hkv in CHECK_SHAPES:
                if causal and Sq > Sk:
                    continue
                q = torch.randn(B, Sq, Hq, d, dtype=bf, device=dev)
                k = torch.randn(B, Sk, Hkv, d, dtype=bf, device=dev)
                vv = torch.randn(B, Sk, Hkv, d, dtype=bf, device=dev)
                out, lse = fwd(load[v["name"]], q, k, vv, d ** -0.5)
                want, want_lse = _oracle(q, k, vv, d ** -0.5, causal)
                e_out, e_lse = _rel(out, want), (lse - want_lse).abs().max().item()
                if not (e_out < 1e-2 and e_lse < 1e-3):
                    raise AssertionError(f"B{B} Sq{Sq} Sk{Sk} H{Hq}/{Hkv}: out rel {e_out:.3g}, lse max {e_lse:.3g}")
        except Exception as e:
            bad[v["name"]] = f"{type(e).__name__}: {e}"[:300]

    def fwd_row(B, S, H, D, causal):  # noqa: N803
        q, k, vv = (torch.randn(B, S, H, D, dtype=bf, device=dev) for _ in range(3))
        scale = D ** -0.5
        fns = {}
        for v in variants:
            if v["kind"] == "fwd" and v["head_dim"] == D and v["causal"] == causal and v["name"] not in bad:
                fn = load[v["name"]]
                fns[v["variant"]] = (lambda fn=fn: fwd(fn, q, k, vv, scale))
        for ref in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
            try:
                f = _sdpa(ref)
                f(q, k, vv, causal, scale)
                fns["sdpa_" + ref.split("_")[0].lower()] = (lambda f=f: f(q, k, vv, causal, scale))
            except Exception as e:
                bad[f"sdpa {ref} d{D}"] = f"{type(e).__name__}: {e}"[:200]
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        for name, us in _time(fns).items():
            table.append((f"fwd hd{D}{' causal' if causal else ''}", name, us, flops / us / 1e6))

    for row in FWD_ROWS:
        try:
            fwd_row(*row)
        except Exception as e:  # the other rows and the table still come
            bad[f"forward row {row}"] = f"{type(e).__name__}: {e}"[:300]
    try:  # a failure here (e.g. a staged package without run_kernels) still prints the forward rows
        _run_backward(variants, load, fwd, table, bad)
    except Exception as e:
        bad["backward"] = f"{type(e).__name__}: {e}"[:300]
    return _print(table, bad)


def _run_backward(variants, load, fwd, table, bad):
    """The backward rows: the product's run_kernels with each variant as its main kernel."""
    import torch

    from tirx_kernels.ported.flashattention.flash_attention_backward import run_kernels

    dev, bf = "cuda", torch.bfloat16

    aux = {"pre": load.get("bwd_pre"), "post": load.get("bwd_post")}

    def bwd(main, q, k, v, out, dout, lse, causal, scale):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def call(kernel, *args):
            (main if kernel == "main" else aux[kernel])(*args)
        run_kernels(call, q, k, v, out, dout, lse, None, scale, causal, False, dq, dk, dv,
                    sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
        return dq, dk, dv

    base_fwd = {d: load.get(fwd_name("base", d, c)) for d, c in ((128, False),)}
    for v in (v for v in variants if v["kind"] == "bwd"):
        d, causal = v["head_dim"], v["causal"]
        try:
            B, Sq, Sk, Hq = 1, 1000, 1000, 4
            q, k, vv = (torch.randn(B, n, Hq, d, dtype=bf, device=dev, requires_grad=True) for n in (Sq, Sk, Sk))
            dout = torch.randn(B, Sq, Hq, d, dtype=bf, device=dev)
            out, lse = fwd(base_fwd[d], q.detach(), k.detach(), vv.detach(), d ** -0.5)
            got = bwd(load[v["name"]], q.detach(), k.detach(), vv.detach(), out, dout, lse, causal, d ** -0.5)
            want_out, _ = _oracle(q, k, vv, d ** -0.5, causal)
            want = torch.autograd.grad(want_out, (q, k, vv), dout.float())
            errs = [_rel(g, w) for g, w in zip(got, want)]
            if not all(e < 2e-2 for e in errs):
                raise AssertionError(f"dq/dk/dv rel {[f'{e:.3g}' for e in errs]}")
        except Exception as e:
            bad[v["name"]] = f"{type(e).__name__}: {e}"[:300]

    def bwd_row(B, S, H, D, causal):  # noqa: N803
        scale = D ** -0.5
        q, k, vv = (torch.randn(B, S, H, D, dtype=bf, device=dev) for _ in range(3))
        dout = torch.randn(B, S, H, D, dtype=bf, device=dev)
        out, lse = fwd(base_fwd[D], q, k, vv, scale)
        fns = {}
        for v in variants:
            if v["kind"] == "bwd" and v["head_dim"] == D and v["causal"] == causal and v["name"] not in bad:
                fns[v["variant"]] = (lambda m=load[v["name"]]: bwd(m, q, k, vv, out, dout, lse, causal, scale))
        for ref in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
            try:
                fns["sdpa_" + ref.split("_")[0].lower()] = _sdpa_backward(ref, q, k, vv, dout, causal, scale)
                fns["sdpa_" + ref.split("_")[0].lower()]()
            except Exception as e:
                bad[f"sdpa {ref} bwd d{D}"] = f"{type(e).__name__}: {e}"[:200]
        flops = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        for name, us in _time(fns).items():
            table.append((f"bwd hd{D}{' causal' if causal else ''}", name, us, flops / us / 1e6))

    for row in BWD_ROWS:
        bwd_row(*row)


def _print(table, bad):
    import torch

    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"\n{card}  (b2 h16 s8192 bf16; TFLOP/s = 4 b h s^2 d [x0.5 causal] [x2.5 bwd] / t)")
    for row, name, us, tf in table:
        print(f"  {row:18s} {name:14s} {us:9.1f} us  {tf:6.1f} TFLOP/s")
    for name, err in bad.items():
        print(f"  FAILED {name}: {err}")
    return 1 if any(not n.startswith("sdpa") for n in bad) else 0


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=os.path.join(ROOT, "build", "sweep-attn"))
    b.add_argument("--jobs", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("--dir", default=os.path.join(ROOT, "build", "sweep-attn"))
    a = ap.parse_args(argv)
    return cmd_build(a) if a.cmd == "build" else cmd_run(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
