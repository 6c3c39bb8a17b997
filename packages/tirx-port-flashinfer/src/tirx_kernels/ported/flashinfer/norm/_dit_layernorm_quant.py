# SPDX-License-Identifier: Apache-2.0
# The NVFP4 / MXFP8 outputs of flashinfer_fused_dit_layernorm (norm/fused_dit_layernorm.py): FlashInfer's
# include/flashinfer/norm/fused_dit_layernorm.cuh (FP4Converter / FP8Converter, get_sf_out_offset_128x4) and
# flashinfer/norm/__init__.py (_dit_ln_prepare_outputs) at release v0.7.4 (commit
# 77039051b0be921788dc2784ec41423b558878ec); there SM100-only, written anew in TIRx for sm_90a.
"""Quantized ``norm_out`` of the fused DiT LayerNorm, as upstream defines it:

- the normalized value of each element is first rounded to bf16 (upstream packs ``__float22bfloat162_rn`` before
  its converter), then quantized per block along H;
- NVFP4 (``use_nvfp4``): blocks of 16, e4m3 scale ``sf = e4m3(gs * (amax * (1/6)))`` with the global scale ``gs``
  (``global_scaling_factor``), codes ``e2m1(y * (1 / (f32(sf) * (1 / gs))))`` (0 where the rounded scale is 0);
  ``norm_out`` int32 ``[B, R, H/8]`` (8 codes a word, element 0 in the low nibble);
- MXFP8 (``use_mxfp8``): blocks of 32, ``sf = ue8m0_ceil(amax * (1/448))``, codes ``e4m3(y * 2**(127 - sf))``;
  ``norm_out`` int32 ``[B, R, H/4]`` (element 0 in the low byte);
- scales uint8 ``sf_out [B, ceil(R/128), ceil(nb/4), 32, 4, 4]`` (``nb`` = H / block): FlashInfer's 128x4 swizzle
  per batch (rows padded to 128 per batch); padding bytes are not written (upstream leaves them as allocated).

Upstream takes its reciprocals with ``rcp.approx.ftz`` (1/6, 1/448, 1/gs and the output scale); this port divides
round-to-nearest, as ``_fp4_rows``' "trtllm" recipe does: the two agree except where an approximate reciprocal is off
by an ulp at a rounding boundary of a code. (An MXFP8 scale code 0, ``amax < 448 * 2**-127``, gives codes of 0
here; upstream's flushed reciprocal would give inf there.)

The kernel: H, strides and alignment at run time (H % 16 / % 32), one CTA of ``QUANT_THREADS[fmt]`` a token. The mean
and the variance of squared deviations as the general bf16 kernel forms them (the same order, so the same bits:
``norm_out`` is the general kernel's bf16 output, quantized), each pass forming ``x`` from the inputs again; then
each thread takes whole scale blocks: forms ``x`` of its 16 / 32 elements once more, writes ``residual_out``,
normalizes, rounds to bf16, and writes the block's scale byte and codes.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import quant_ref
from tirx_kernels.ported.flashinfer.norm import layernorm as _ln
from tirx_kernels.ported.flashinfer.norm._dit_layernorm_kernels import (
    _DTYPE,
    PDL,
    _gated,
    _modulated,
    _normalized,
    _sum_x,
    _token_offset,
)

QUANT_FORMATS = {"nvfp4": 16, "mxfp8": 32}  # format: elements per scale
# Threads of a token's CTA, by format. MXFP8 holds a 32-element block in registers: at 256 threads ptxas capped the
# kernel at 64 registers and spilled 8 bytes (CI's build check, 2026-12-06); at 128 it takes 72 with no spill. NVFP4
# went to 128 too when the e2m1 encoder became the fp32-adder form (2026-12-07f): at 256 threads ptxas kept 48
# registers and spilled 4 bytes (CI's build check); at 128 none.
QUANT_THREADS = {"nvfp4": 128, "mxfp8": 128}
FP4_MAX, E4M3_MAX = 6.0, 448.0


def block_of(fmt: str) -> int:
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"fused_dit_layernorm: output format {fmt!r} is not one of {sorted(QUANT_FORMATS)}")
    return QUANT_FORMATS[fmt]


def norm_out_shape(B: int, R: int, H: int, fmt: str) -> tuple:  # noqa: N803
    """int32 words of the codes: 8 e2m1 (NVFP4) / 4 e4m3 (MXFP8) per word."""
    return (B, R, H // (8 if fmt == "nvfp4" else 4))


def sf_out_shape(B: int, R: int, H: int, fmt: str) -> tuple:  # noqa: N803
    nb = H // block_of(fmt)
    return (B, -(-R // 128), -(-nb // 4), 32, 4, 4)


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def build_quantized(mode: str, fmt: str, pdl: str | None = PDL, threads: int | None = None):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import quant, reduce, vector

    pdl_launch.check_trigger("fused_dit_layernorm", pdl)
    blk = block_of(fmt)
    threads = QUANT_THREADS[fmt] if threads is None else threads
    words = reduce.scratch_words(threads, 1)
    gated, modulated = _gated(mode), _modulated(mode)
    code_words = blk // 8 if fmt == "nvfp4" else blk // 4  # uint32 words of one block's codes

    def x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf):  # noqa: N803
        cc = T.Cast("int64", c)
        res = T.Select(has_residual != 0, _ln.element(T, Rf, r_base + cc), T.float32(0))
        gate = _ln.element(T, Gf, g_base + cc) if gated else None
        return _sum_x(T, mode, _ln.element(T, Xf, x_base + cc), res, gate, GB[c] if gated else None, isf)

    def quantize_block(j, tok, b, r, H, R, cols, Xf, Rf, Gf, GB, ROf, Scf, Shf, W1, W2, Y, S, Gs,  # noqa: N803
                       bases, has_residual, isf, stat, locs):
        """Block ``j`` of token ``tok`` (batch ``b``, row ``r``): residual_out, y rounded to bf16, its amax, the
        scale byte and the codes. (Buffers passed one by one: TIRx names a kernel parameter after the variable.)"""
        x_base, r_base, g_base, sc_base, sh_base, ro_base = bases
        q, amax, inv, sf, fp8, pair, xl = locs
        T.buffer_store(amax, T.float32(0), [0])
        for e in range(blk):
            c = j * blk + e
            cc = T.Cast("int64", c)
            # x held in a register before residual_out (maybe residual itself) is written: an unbound expression
            # would read the residual again after the store
            T.buffer_store(xl, x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf), [0])
            x = xl[0]
            _ln.store_element(T, ROf, ro_base + cc, x, pair)
            y = _normalized(T, mode, x, stat[0], stat[1], W1[c], W2[c],
                            _ln.element(T, Scf, sc_base + cc) if modulated else None,
                            _ln.element(T, Shf, sh_base + cc) if modulated else None)
            vector.pack2(pair, 0, y, T.float32(0), _DTYPE)  # upstream's bf16 rounding of norm_out
            T.buffer_store(q, vector.unpack2(pair[0], _DTYPE)[0], [e])
            T.buffer_store(amax, quant.amax_step(amax[0], q[e]), [0])
        if fmt == "nvfp4":
            gs = Gs[0]
            quant.fp8x2(fp8[0], T.float32(0), gs * (amax[0] * T.float32(1.0 / FP4_MAX)), "e4m3")
            T.buffer_store(sf, T.Cast("uint32", fp8[0]) & T.uint32(0xFF), [0])
            T.buffer_store(inv, T.if_then_else(sf[0] == T.uint32(0), T.float32(0), T.float32(1) / (
                quant.e4m3_to_f32(sf[0]) * (T.float32(1) / gs))), [0])
        else:
            T.buffer_store(sf, quant.ue8m0_ceil(amax[0] * T.float32(1.0 / E4M3_MAX)), [0])
            T.buffer_store(inv, quant.ue8m0_inv_scale(sf[0]), [0])
        i64 = T.Cast
        batch_sf = i64("int64", (R + 127) // 128 * 128) * i64("int64", cols)
        T.buffer_store(S, T.Cast("uint8", sf[0]), [i64("int64", b) * batch_sf + quant.sf_offset(
            i64("int64", r), i64("int64", j), i64("int64", cols), "128x4")])
        y0 = i64("int64", tok) * i64("int64", H // (8 if fmt == "nvfp4" else 4)) + i64("int64", j * code_words)
        for w in range(code_words):
            if fmt == "nvfp4":
                T.buffer_store(Y, quant.e2m1x8([q[8 * w + e] * inv[0] for e in range(8)]), [y0 + w])
            else:
                quant.fp8x2(fp8[0], q[4 * w + 1] * inv[0], q[4 * w] * inv[0], "e4m3")
                quant.fp8x2(fp8[1], q[4 * w + 3] * inv[0], q[4 * w + 2] * inv[0], "e4m3")
                T.buffer_store(Y, T.Cast("uint32", fp8[0]) | (T.Cast("uint32", fp8[1]) << T.uint32(16)), [y0 + w])

    @T.prim_func
    def fused_dit_layernorm_quant(x_ptr: T.handle, r_ptr: T.handle, g_ptr: T.handle, sc_ptr: T.handle,
                                  sh_ptr: T.handle, gb_ptr: T.handle, w1_ptr: T.handle, w2_ptr: T.handle,
                                  isf_ptr: T.handle, ro_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle,
                                  gs_ptr: T.handle, eps: T.float32, has_residual: T.int32):
        B = T.int32()
        R = T.int32()
        H = T.int32()
        xb = T.int32()
        xr = T.int32()
        rb = T.int32()
        rr = T.int32()
        gbs = T.int32()
        grs = T.int32()
        scb = T.int32()
        scr = T.int32()
        shb = T.int32()
        shr = T.int32()
        rob = T.int32()
        ror = T.int32()
        y_len = T.int64()
        s_len = T.int64()
        X = T.match_buffer(x_ptr, (B, R, H), _DTYPE, strides=(xb, xr, 1), align=2)
        Rs = T.match_buffer(r_ptr, (B, R, H), _DTYPE, strides=(rb, rr, 1), align=2)
        Gt = T.match_buffer(g_ptr, (B, R, H), _DTYPE, strides=(gbs, grs, 1), align=2)
        Sc = T.match_buffer(sc_ptr, (B, R, H), _DTYPE, strides=(scb, scr, 1), align=2)
        Sh = T.match_buffer(sh_ptr, (B, R, H), _DTYPE, strides=(shb, shr, 1), align=2)
        GB = T.match_buffer(gb_ptr, (H,), "float32", align=4)
        W1 = T.match_buffer(w1_ptr, (H,), "float32", align=4)
        W2 = T.match_buffer(w2_ptr, (H,), "float32", align=4)
        Isf = T.match_buffer(isf_ptr, (1,), "float32", align=4)
        RO = T.match_buffer(ro_ptr, (B, R, H), _DTYPE, strides=(rob, ror, 1), align=2)
        Y = T.match_buffer(y_ptr, (y_len,), "uint32", align=4)
        S = T.match_buffer(s_ptr, (s_len,), "uint8")
        Gs = T.match_buffer(gs_ptr, (1,), "float32", align=4)
        T.device_entry()
        Xf = T.decl_buffer((1,), _DTYPE, data=X.data)
        Rf = T.decl_buffer((1,), _DTYPE, data=Rs.data)
        Gf = T.decl_buffer((1,), _DTYPE, data=Gt.data)
        Scf = T.decl_buffer((1,), _DTYPE, data=Sc.data)
        Shf = T.decl_buffer((1,), _DTYPE, data=Sh.data)
        ROf = T.decl_buffer((1,), _DTYPE, data=RO.data)
        tok = T.cta_id([B * R])
        tid = T.thread_id([threads])
        acc = T.alloc_local((1,), "float32")
        stat = T.alloc_local((2,), "float32")
        pair = T.alloc_local((1,), "uint32")
        q = T.alloc_local((blk,), "float32")
        amax = T.alloc_local((1,), "float32")
        inv = T.alloc_local((1,), "float32")
        sf = T.alloc_local((1,), "uint32")
        fp8 = T.alloc_local((2,), "uint16")
        xl = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((2 * words,), "float32")
        pdl_launch.begin(pdl)

        b = T.truncdiv(tok, R)
        r = T.truncmod(tok, R)
        x_base = _token_offset(T, b, r, xb, xr)
        r_base = _token_offset(T, b, r, rb, rr)
        g_base = _token_offset(T, b, r, gbs, grs)
        sc_base = _token_offset(T, b, r, scb, scr)
        sh_base = _token_offset(T, b, r, shb, shr)
        ro_base = _token_offset(T, b, r, rob, ror)
        isf = Isf[0]
        trips = (H + (threads - 1)) // threads
        # the general bf16 kernel's passes, in its order (module docstring)
        acc[0] = T.float32(0)
        for i in T.serial(trips):
            c = i * threads + tid
            if c < H:
                acc[0] = acc[0] + x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf)
        stat[0] = reduce.group_sum(acc[0], tid, threads, scratch) / T.Cast("float32", H)  # the mean
        acc[0] = T.float32(0)
        for i in T.serial(trips):
            c = i * threads + tid
            if c < H:
                d = x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf) - stat[0]
                acc[0] = acc[0] + d * d
        stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, threads, scratch, words) / T.Cast("float32", H) + eps)
        # whole blocks per thread: residual_out, y rounded to bf16, the scale byte, the codes. After the barrier
        # above every read of the passes is done, and each element is read then written by one thread here
        # (residual_out may be residual itself).
        nb = H // blk
        cols = (nb + 3) // 4 * 4
        bases = (x_base, r_base, g_base, sc_base, sh_base, ro_base)
        locs = (q, amax, inv, sf, fp8, pair, xl)
        for i in T.serial((nb + (threads - 1)) // threads):
            j = i * threads + tid
            if j < nb:
                quantize_block(j, tok, b, r, H, R, cols, Xf, Rf, Gf, GB, ROf, Scf, Shf, W1, W2, Y, S, Gs, bases,
                               has_residual, isf, stat, locs)
        pdl_launch.end(pdl)

    return pdl_launch.launch(fused_dit_layernorm_quant, pdl)


# ---------------------------------------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------------------------------------

def encode(y: torch.Tensor, fmt: str, global_scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm_out int32 [B, R, H/8 or H/4], sf_out uint8 [B, ...128x4 tiles])`` of fp32 values ``y`` [B, R, H]
    (rounded to bf16 first, as upstream), the padding of sf_out zero."""
    B, R, H = y.shape  # noqa: N806
    blk = block_of(fmt)
    rows = y.to(torch.bfloat16).float().reshape(B * R, H // blk, blk)
    amax = rows.abs().nan_to_num(nan=0.0).amax(-1)
    if fmt == "nvfp4":
        gs = torch.as_tensor(global_scale, dtype=torch.float32, device=y.device).reshape(())
        sf = quant_ref.fp8_encode(gs * (amax * torch.tensor(1.0 / FP4_MAX)), "e4m3")
        f = quant_ref.fp8_decode(sf, "e4m3")
        inv = torch.where(f == 0, torch.zeros_like(f), 1.0 / (f * (1.0 / gs)))
        codes = quant_ref.pack_e2m1(quant_ref.e2m1_encode(rows * inv[..., None]).reshape(B * R, H))
    else:
        sf = quant_ref.ue8m0_ceil(amax * torch.tensor(1.0 / E4M3_MAX))
        codes = quant_ref.fp8_encode(rows * quant_ref.ue8m0_inv_scale(sf)[..., None], "e4m3").reshape(B * R, H)
    out = codes.contiguous().view(torch.int32).reshape(norm_out_shape(B, R, H, fmt))
    per_batch = [quant_ref.sf_swizzle(sf.view(B, R, -1)[i].contiguous(), "128x4") for i in range(B)]
    return out, torch.stack(per_batch).reshape(sf_out_shape(B, R, H, fmt))


def dequantize(norm_out: torch.Tensor, sf_out: torch.Tensor, fmt: str, H: int, global_scale=None):  # noqa: N803
    """fp32 ``[B, R, H]`` of quantized outputs (codes times their block's scale)."""
    B, R = norm_out.shape[:2]  # noqa: N806
    blk = block_of(fmt)
    flat = sf_out.reshape(B, -1)
    sf = torch.stack([quant_ref.sf_unswizzle(flat[i], R, H // blk, "128x4") for i in range(B)])
    codes = norm_out.contiguous().view(torch.uint8).reshape(B, R, -1)
    if fmt == "nvfp4":
        gs = torch.as_tensor(global_scale, dtype=torch.float32, device=norm_out.device).reshape(())
        v = quant_ref.e2m1_decode(quant_ref.unpack_e2m1(codes))
        scale = quant_ref.fp8_decode(sf, "e4m3") / gs
    else:
        v = quant_ref.fp8_decode(codes, "e4m3")
        scale = quant_ref.ue8m0_decode(sf)
    return (v.reshape(B, R, H // blk, blk) * scale[..., None]).reshape(B, R, H)
