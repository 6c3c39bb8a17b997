# SPDX-License-Identifier: Apache-2.0
"""The fp32 oracle of ``flash_attention4_fp4`` and the error bounds its outputs are judged by.

The oracle computes with exactly what the kernel reads: the e4m3 Q, K, V after the pre-pass, times their fp32
descales (the NVFP4 / MXFP8 -> e4m3 requantization is part of the op, measured separately by the pre-pass test).
Against it the kernel makes three errors, each bounded per element here rather than by one global tolerance:

1. P rounded to e4m3 before the PV GEMM (FA3 does the same), as 2^8 p (``_fwd_fp8.P_OFFSET``; p <= 1 relative to the
   running row max): relative error <= 2^-4 when 2^8 p >= 2^-6 (3 mantissa bits), absolute <= 2^-10 below
   (subnormals: spacing 2^-9), i.e. 2^-18 in units of p; rescaling by the later max corrections only shrinks both,
   and p (final max) < 2^-14 wherever the running value was subnormal. The row sum l is the unrounded one. So
   |dO_id| <= (2^-4 sum_j p_ij |v_jd| + 2^-18 sum_{j: p_ij < 2^-14} |v_jd|) / l_i.
2. S = Q K^T on the FP8 tensor cores: the products are exact in fp32 but Hopper's FP8 MMA accumulates with ~14 bits
   (DeepSeek-V3 report, sec. 3.3.2), truncating, once per 32-wide k group and inside each group at the alignment to
   its largest product, so |dS_ij| <= EPS_ACC * sum_d |q_id k_jd| (scaled), EPS_ACC = 2^-9 (16x over 2^-13). 2^-10
   was too tight on the H100 (2026-12-07, docs/measurements/2026-12-07-h100): re-run, 13 of the odd-length and GQA
   configs failed on the LSE alone, 1 to 41 elements each, the first offending element at 1.0x to 1.7x that bound
   (d128 and d256, e4m3 and MXFP8; rel. Frobenius 2.7e-4 to 5.7e-4; outputs within their bounds).
   It moves the LSE by at most max_j |dS_ij| and each p (and l) by a relative 2 max_j |dS_ij|,
   hence the 4 dS_i term on the P bound.
3. The bf16 output: 2^-9 relative, taken as 2^-8; LSE's fp32 exp2 / log2 / summation: 1e-4 (1 + |lse|), the bf16
   kernel's LSE tolerance.
Typical errors are far below the bounds (a flat softmax over random V: rel. Frobenius ~0.014, the P rounding's
sqrt-N average; CPU emulation, tests)."""

from __future__ import annotations

import torch

from tirx_kernels.core import harness

P_OFFSET = 8  # _fwd_fp8.P_OFFSET (not imported: this module stays free of TIRx)
P_REL = 2.0**-4
P_SUBNORMAL = 2.0**(-6 - P_OFFSET)
P_ABS = 2.0**(-10 - P_OFFSET)
EPS_ACC = 2.0**-9
OUT_REL = 2.0**-8
LSE_TOL = 1e-4


def _dequantized(inp: dict):
    """fp32 q [B, Hq, Sq, D], k, v [B, Hq, Sk, D] (GQA heads repeated) of the kernel's inputs times their descales."""
    q, k, v = inp["q"], inp["k"], inp["v"]
    B, Sq, Hq, D = q.shape
    Hkv = k.shape[2]
    g = Hq // Hkv
    qf = (q.float().view(B, Sq, Hkv, g * D) * inp["q_descale"][:, None, :, None]).view(B, Sq, Hq, D)
    kf = k.float() * inp["k_descale"][:, None, :, None]
    vf = v.float() * inp["v_descale"][:, None, :, None]
    return (qf.transpose(1, 2), kf.transpose(1, 2).repeat_interleave(g, 1), vf.transpose(1, 2).repeat_interleave(g, 1))


def oracle(inp: dict, softmax_scale: float, causal: bool, bounds: bool = False, q_block: int = 512):
    """(out [B, Sq, Hq, D], lse [B, Hq, Sq]) in fp32 with flash-attn's conventions (bottom-right causal; a row that
    sees no key: out 0, lse -inf); with ``bounds`` also the per-element bounds (out_bound, lse_bound) of the module
    docstring."""
    qf, kf, vf = _dequantized(inp)
    B, Hq, Sq, D = qf.shape
    Sk = kf.shape[2]
    out = torch.empty(B, Hq, Sq, D, dtype=torch.float32, device=qf.device)
    lse = torch.empty(B, Hq, Sq, dtype=torch.float32, device=qf.device)
    out_bound, lse_bound = torch.empty_like(out), torch.empty_like(lse)
    for i0 in range(0, Sq, q_block):
        q = qf[:, :, i0:i0 + q_block]
        s = torch.matmul(q, kf.transpose(-1, -2)) * softmax_scale
        hidden = None
        if causal:
            rows = torch.arange(i0, i0 + q.shape[2], device=q.device)[:, None]
            hidden = torch.arange(Sk, device=q.device)[None, :] > rows + (Sk - Sq)
            s = s.masked_fill(hidden, float("-inf"))
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
        total = p.sum(-1, keepdim=True)
        seen = total > 0
        denom = torch.where(seen, total, torch.ones_like(total))
        out[:, :, i0:i0 + q_block] = torch.matmul(p, vf) / denom
        blk_lse = torch.where(seen, m + torch.log(denom), torch.full_like(m, float("-inf"))).squeeze(-1)
        lse[:, :, i0:i0 + q_block] = blk_lse
        if bounds:
            ds = torch.matmul(q.abs(), kf.abs().transpose(-1, -2)) * (EPS_ACC * softmax_scale)
            if hidden is not None:
                ds = ds.masked_fill(hidden, 0.0)
            ds = ds.amax(-1, keepdim=True)
            va = vf.abs()
            small = torch.where((p < P_SUBNORMAL) & (p > 0), torch.ones_like(p), torch.zeros_like(p))
            pb = ((P_REL + 4 * ds) * torch.matmul(p, va) + P_ABS * torch.matmul(small, va)) / denom
            out_bound[:, :, i0:i0 + q_block] = pb + OUT_REL * out[:, :, i0:i0 + q_block].abs()
            lse_bound[:, :, i0:i0 + q_block] = ds.squeeze(-1) + LSE_TOL * (1 + blk_lse.abs())
    out = out.transpose(1, 2)
    if bounds:
        return out, lse, out_bound.transpose(1, 2), lse_bound
    return out, lse


def check(name: str, got, want, bound) -> dict:
    """``|got - want| <= bound`` elementwise (finite values), with the error statistics; raises
    ``harness.KernelCheckError`` naming the first element outside."""
    g, w = got.float(), want.float()
    if not torch.isfinite(g).all():
        raise harness.KernelCheckError(f"{name}: {int((~torch.isfinite(g)).sum())} of {g.numel()} elements are not "
                                       f"finite (unwritten or NaN)")
    diff = (g - w).abs()
    rel_fro = (diff.norm() / max(w.norm().item(), 1e-30)).item()
    bad = diff > bound
    stats = {"max_abs": diff.max().item() if diff.numel() else 0.0, "rel_fro": rel_fro,
             "max_of_bound": (diff / bound.clamp_min(1e-30)).max().item() if diff.numel() else 0.0}
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise harness.KernelCheckError(
            f"{name}: {int(bad.sum())} of {g.numel()} elements differ from the fp32 oracle beyond the FP8 bound "
            f"(first at {idx}: got {g[idx].item()}, want {w[idx].item()}, bound {bound[idx].item():.3g}; "
            f"rel_fro={rel_fro:.2e})")
    return stats


def check_outputs(out, lse, inp: dict, softmax_scale: float, causal: bool) -> dict:
    """Both outputs against the oracle of ``inp`` (the kernel's inputs): LSE -inf exactly where a row sees no key."""
    want, want_lse, out_bound, lse_bound = oracle(inp, softmax_scale, causal, bounds=True)
    empty = torch.isinf(want_lse) & (want_lse < 0)
    got_empty = torch.isinf(lse) & (lse < 0)
    if not torch.equal(got_empty, empty):
        raise harness.KernelCheckError(f"lse: {int((got_empty != empty).sum())} rows differ in being -inf (a row "
                                       f"that sees no key)")
    return {"out": check("out", out, want, out_bound),
            "lse": check("lse", lse[~empty], want_lse[~empty], lse_bound[~empty])}


def _inputs(inputs: dict) -> dict:
    from tirx_kernels.ported.flashattention.flash_attention4_fp4 import kernel_inputs

    return kernel_inputs(**inputs)


def _compare_out(got, want, cfg, inputs):
    _, _, bound, _ = oracle(_inputs(inputs), inputs["softmax_scale"], inputs["causal"], bounds=True)
    return check("out", got, want, bound)


def _compare_lse(got, want, cfg, inputs):
    _, _, _, bound = oracle(_inputs(inputs), inputs["softmax_scale"], inputs["causal"], bounds=True)
    empty = torch.isinf(want) & (want < 0)
    if not torch.equal(torch.isinf(got) & (got < 0), empty):
        n = int(((torch.isinf(got) & (got < 0)) != empty).sum())
        raise harness.KernelCheckError(f"lse: {n} rows differ in being -inf (a row that sees no key)")
    return check("lse", got[~empty], want[~empty], bound[~empty])


COMPARATORS = {"out": _compare_out, "lse": _compare_lse}
