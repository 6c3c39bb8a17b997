# SPDX-License-Identifier: Apache-2.0
"""The TIRx kernels of ``flash_attention4_fp4``'s K/V requantization: NVFP4 or MXFP8 [B, S, Hkv, D] (contiguous) ->
e4m3 [B, S, Hkv, D], byte for byte what ``_fwd_fp8_prepass.requantize_nvfp4`` / ``requantize_mxfp8`` compute in torch,
in one pass (in: 0.5 + 1/16 or 1 + 1/32 B an element, out: 1 B) instead of torch's fp32 temporaries.

One thread per 16 elements: NVFP4 reads 8 bytes of packed e2m1 and its e4m3 block scale, decodes each nibble to fp32
from bits, multiplies by ``scale * mult[b, h]`` (mult = 448 / (6 max scale of the head), the same two fp32 products
as torch), and converts pairs with ``cvt.rn.satfinite.e4m3x2.f32`` (torch clamps to +-448, then rounds to nearest
even: the same byte); MXFP8 reads 16 e4m3 bytes and its ue8m0 code and multiplies by 2^(code - top[b, h]) (top: the
head's largest code, passed as fp32; exponents below -30 are clamped there, which changes nothing: the products are
below e4m3's smallest subnormal either way). One 16-byte store."""

from __future__ import annotations

GROUP = 16  # elements a thread
THREADS = 128
FORMATS = ("nvfp4", "mxfp8")


def _e2m1_to_f32(nibble):
    """fp32 of an e2m1 code (``uint32``, low 4 bits) from bits: 0, 0.5, then 2^(e - 1) (1 + m / 2), sign bit 3."""
    from tvm.script import tirx as T

    mag = nibble & T.uint32(7)
    e, m = mag >> T.uint32(1), mag & T.uint32(1)
    bits = T.if_then_else(mag < T.uint32(2), T.if_then_else(mag == T.uint32(1), T.uint32(0x3F000000), T.uint32(0)),
                          ((T.uint32(126) + e) << T.uint32(23)) | (m << T.uint32(22)))
    return T.cuda.uint_as_float(bits | ((nibble & T.uint32(8)) << T.uint32(28)))


def _convert(vals, o, half, out_ptr):
    """``vals`` (16 fp32 expressions) -> e4m3, 4 words, one 16-byte store at ``out_ptr``."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import quant, vector

    for j in range(4):
        for p in range(2):
            quant.fp8x2(half[p], vals[4 * j + 2 * p + 1], vals[4 * j + 2 * p])
        T.buffer_store(o, T.Cast("uint32", half[0]) | (T.Cast("uint32", half[1]) << T.uint32(16)), [j])
    vector.store_v4(out_ptr, o, 0)


def _nvfp4(Xw, SF, M, w, o, half, g, bh, out_ptr):  # noqa: N803
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import quant

    for i in range(2):
        T.buffer_store(w, Xw[2 * g + i], [i])
    scale = quant.e4m3_to_f32(T.Cast("uint32", SF[g])) * M[bh]
    vals = [_e2m1_to_f32((w[k // 8] >> T.uint32(4 * (k % 8))) & T.uint32(15)) * scale for k in range(GROUP)]
    _convert(vals, o, half, out_ptr)


def _mxfp8(Xw, SF, M, w, o, half, g, bh, sf_index, out_ptr):  # noqa: N803
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import quant

    for i in range(4):
        T.buffer_store(w, Xw[4 * g + i], [i])
    d = T.max(T.Cast("float32", SF[sf_index]) - M[bh], T.float32(-30))
    shift = T.cuda.uint_as_float(T.Cast("uint32", T.Cast("int32", d) + 127) << T.uint32(23))
    vals = [quant.e4m3_to_f32((w[k // 4] >> T.uint32(8 * (k % 4))) & T.uint32(255)) * shift for k in range(GROUP)]
    _convert(vals, o, half, out_ptr)


def build_requant_kernel(kv_format: str, head_dim: int):
    from tvm.script import tirx as T

    if kv_format not in FORMATS:
        raise ValueError(f"flash_attention4_fp4: requant kv_format {kv_format!r} is not one of {FORMATS}")
    if head_dim % 32:
        raise ValueError(f"flash_attention4_fp4: requant head_dim={head_dim} is not a multiple of 32")
    nvfp4 = kv_format == "nvfp4"
    x_cols = head_dim // 2 if nvfp4 else head_dim
    sf_cols = head_dim // (16 if nvfp4 else 32)
    groups = head_dim // GROUP  # per (b, s, h) row

    @T.prim_func
    def flash_attention4_fp8_requant_kv(x_ptr: T.handle, sf_ptr: T.handle, m_ptr: T.handle, o_ptr: T.handle):
        B = T.int32()
        S = T.int32()
        H = T.int32()
        X = T.match_buffer(x_ptr, (B, S, H, x_cols), "uint8", align=16)
        SF = T.match_buffer(sf_ptr, (B * S * H * sf_cols,), "uint8")
        M = T.match_buffer(m_ptr, (B * H,), "float32")
        Out = T.match_buffer(o_ptr, (B, S, H, head_dim), "uint8", align=16)
        T.device_entry()
        bx = T.cta_id([(B * S * H * groups + THREADS - 1) // THREADS])
        tid = T.thread_id([THREADS])
        w = T.alloc_local((4,), "uint32")
        o = T.alloc_local((4,), "uint32")
        half = T.alloc_local((2,), "uint16")
        Xw = T.decl_buffer((B * S * H * x_cols // 4,), "uint32", data=X.data)
        Of = T.decl_buffer((B * S * H * head_dim,), "uint8", data=Out.data)
        g = bx * THREADS + tid
        if g < B * S * H * groups:
            row = g // groups
            bh = (row // (S * H)) * H + row % H
            if nvfp4:
                _nvfp4(Xw, SF, M, w, o, half, g, bh, Of.ptr_to([g * GROUP]))
            else:
                _mxfp8(Xw, SF, M, w, o, half, g, bh, row * sf_cols + (g % groups) // 2, Of.ptr_to([g * GROUP]))

    return flash_attention4_fp8_requant_kv
