# SPDX-License-Identifier: Apache-2.0
"""The block-quantizer driver FlashInfer's quantizers share here (nvfp4_quantize, mxfp4_quantize, mxfp8_quantize):
one thread per scale block, its 16 / 32 elements read with 16-byte loads, the block's amax, scale and codes by
``core.lang.quant``, codes stored 8 / 16 / 32 bytes at a time, the scale byte in the linear or swizzled layout.

Semantics: flashinfer-ai/flashinfer f2e04400e330fb2debe0bf8730d9424a1d37927f, flashinfer/quantization/kernels/
{nvfp4,mxfp4,mxfp8}_quantize.py and quantization_cute_dsl_utils.py (NVFP4 in its IEEE path,
FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1, so that ``core.quant_ref`` reproduces every byte; see core.lang.quant).

The grid covers the scale buffer as stored (rows and columns padded in a swizzled layout): a thread whose
(row, column) lies in the padding writes a zero scale byte and nothing else, so every byte of the returned scale
buffer is defined (FlashInfer's swizzled buffers hold zeros there).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, quant_ref

FORMATS = {  # format: (elements per scale, code bits)
    "nvfp4": (16, 4),
    "mxfp4": (32, 4),
    "mxfp8": (32, 8),
}
LAYOUTS = ("linear", "128x4", "8x4")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
THREADS = 256
_VEC = 8  # 16-bit elements per 16-byte vector
_WORDS = 4


def block_of(fmt: str) -> int:
    return FORMATS[fmt][0]


def sf_shape(M: int, K: int, fmt: str, layout: str) -> tuple[int, int]:  # noqa: N803
    """(rows, columns) of the scale buffer as stored."""
    return quant_ref.sf_padded_shape(M, K // block_of(fmt), layout)


def grid_blocks(M: int, K: int, fmt: str, layout: str) -> int:  # noqa: N803
    rows, cols = sf_shape(M, K, fmt, layout)
    return rows * cols


def build_kernel(dtype: str, fmt: str, layout: str, name: str):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import quant, vector

    if dtype not in DTYPES or fmt not in FORMATS or layout not in LAYOUTS:
        raise ValueError(f"{name}: dtype {dtype!r} / format {fmt!r} / layout {layout!r}: expected one of "
                         f"{sorted(DTYPES)} / {sorted(FORMATS)} / {LAYOUTS}")
    blk, bits = FORMATS[fmt]
    nwords = blk // 2  # input words (two 16-bit elements each) of a block
    out_words = blk * bits // 32  # output words of a block

    def i64(v):
        return T.Cast("int64", v)

    @T.prim_func
    def block_quantize(x_ptr: T.handle, g_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, M: T.int32,
                       K: T.int32, tiles: T.int32):
        x_len = T.int64()
        y_len = T.int64()
        s_len = T.int64()
        X = T.match_buffer(x_ptr, (x_len,), dtype, align=16)
        G = T.match_buffer(g_ptr, (1,), "float32")
        Y = T.match_buffer(y_ptr, (y_len,), "uint32", align=8)
        S = T.match_buffer(s_ptr, (s_len,), "uint8")
        T.device_entry()
        cta = T.cta_id([tiles])
        tid = T.thread_id([THREADS])
        xr = T.alloc_local((nwords,), "uint32")
        v = T.alloc_local((blk,), "float32")
        out = T.alloc_local((out_words,), "uint32")
        amax = T.alloc_local((1,), "float32")
        scale = T.alloc_local((1,), "float32")  # the factor applied to each element before its encoding
        code = T.alloc_local((1,), "uint32")  # the block's scale byte
        pair = T.alloc_local((1,), "uint16")

        nb = i64(K // blk)
        cols = nb if layout == "linear" else (nb + 3) // 4 * 4
        rows = i64(M) if layout == "linear" else quant.sf_rows_padded(i64(M), layout)
        idx = i64(cta) * THREADS + i64(tid)
        row = idx // cols
        col = idx % cols
        with T.If(idx < rows * cols):
            with T.Then():
                with T.If(T.And(row < i64(M), col < nb)):
                    with T.Then():
                        base = row * i64(K) + col * blk
                        for j in range(blk // _VEC):
                            vector.load_v4(xr, j * _WORDS, X.ptr_to([base + j * _VEC]), cache="nc_stream")
                        amax[0] = T.float32(0)
                        for i in range(nwords):
                            lo, hi = vector.unpack2(xr[i], dtype)
                            v[2 * i] = lo
                            v[2 * i + 1] = hi
                            amax[0] = quant.amax_step(quant.amax_step(amax[0], lo), hi)
                        if fmt == "nvfp4":
                            gs = G[0]
                            s = quant.nvfp4_block_scale(amax[0], gs)
                            quant.fp8x2(pair[0], s, s, "e4m3")
                            code[0] = T.Cast("uint32", pair[0]) & T.uint32(0xFF)
                            scale[0] = quant.nvfp4_output_scale(quant.e4m3_to_f32(code[0]), gs, amax[0])
                        else:
                            code[0] = (quant.mxfp4_block_scale(amax[0]) if fmt == "mxfp4"
                                       else quant.mxfp8_block_scale(amax[0]))
                            scale[0] = quant.ue8m0_inv_scale(code[0])
                        if bits == 4:
                            for w in range(out_words):
                                out[w] = quant.e2m1x8([v[8 * w + e] * scale[0] for e in range(8)])
                        else:
                            for w in range(out_words):
                                quant.fp8x2(pair[0], v[4 * w + 1] * scale[0], v[4 * w] * scale[0], "e4m3")
                                lo16 = T.Cast("uint32", pair[0])
                                quant.fp8x2(pair[0], v[4 * w + 3] * scale[0], v[4 * w + 2] * scale[0], "e4m3")
                                out[w] = lo16 | (T.Cast("uint32", pair[0]) << T.uint32(16))
                        y0 = (row * i64(K) + col * blk) * bits // 32  # the block's first output word
                        if out_words == 2:
                            T.evaluate(T.ptx.st.global_.v2.b32(Y.ptr_to([y0]), out[0], out[1]))
                        else:
                            for j in range(out_words // _WORDS):
                                vector.store_v4(Y.ptr_to([y0 + j * _WORDS]), out, j * _WORDS)
                        S[quant.sf_offset(row, col, cols, layout)] = T.Cast("uint8", code[0])
                    with T.Else():
                        S[quant.sf_offset(row, col, cols, layout)] = T.uint8(0)

    return block_quantize.with_attr("global_symbol", name)


# --------------------------------------------------------------------------------------------------- host side
def check_input(op: str, x: torch.Tensor, fmt: str) -> None:
    checks.tensor(op, "input", x, dtypes=tuple(DTYPES.values()), ndim=2, cuda=False)
    blk = block_of(fmt)
    K = x.shape[-1]
    if K % blk:
        raise checks.TirxInputError(f"{op}: argument 'input': K={K} is not a multiple of the scale block ({blk})")
    if x.shape[0] * K >= 2**31 * 16:
        raise checks.TirxInputError(f"{op}: argument 'input': {x.shape[0] * K} elements is too many")


def new_outputs(x: torch.Tensor, fmt: str, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)``: codes uint8 ``[M, K/2]`` (fp4) / float8_e4m3fn ``[M, K]`` (mxfp8); scales uint8,
    ``[M, K/block]`` linear, flat ``padded rows * padded columns`` swizzled."""
    M, K = x.shape
    blk, bits = FORMATS[fmt]
    codes = torch.empty(M, K * bits // 8, dtype=torch.uint8, device=x.device)
    rows, cols = sf_shape(M, K, fmt, layout)
    sf = torch.empty((M, cols) if layout == "linear" else (rows * cols,), dtype=torch.uint8, device=x.device)
    return codes, sf


def tiles(M: int, K: int, fmt: str, layout: str) -> int:  # noqa: N803
    return max(1, -(-grid_blocks(M, K, fmt, layout) // THREADS))


def run(fn, x: torch.Tensor, global_scale: torch.Tensor, codes: torch.Tensor, sf: torch.Tensor, fmt: str,
        layout: str) -> None:
    M, K = x.shape
    if M == 0 or K == 0:
        return
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()
    fn(x.view(-1), global_scale, codes.view(-1).view(torch.uint32), sf.view(-1), M, K, tiles(M, K, fmt, layout))


def reference(x: torch.Tensor, fmt: str, layout: str, global_scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """core.quant_ref's codes and scales, shaped as the op returns them."""
    if fmt == "nvfp4":
        codes, sf = quant_ref.nvfp4_quantize(x, global_scale, layout)
    elif fmt == "mxfp4":
        codes, sf = quant_ref.mxfp4_quantize(x, layout)
    else:
        codes, sf = quant_ref.mxfp8_quantize(x, layout)
    return codes, sf
