# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's rmsnorm_fp4quant (RMSNorm fused with NVFP4 / MXFP4 quantization).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), flashinfer/cute_dsl/rmsnorm_fp4quant.py
# (RMSNormFP4QuantKernel, rmsnorm_fp4quant) and flashinfer/cute_dsl/fp4_common.py, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx for sm_90a (upstream's kernel needs SM100's e2m1 conversions): same semantics, other structure.
"""``y = rmsnorm(x) * w`` quantized to FP4 (e2m1, two codes a byte, the even element in the low nibble) with one
scale factor (SF) per block of ``block_size`` elements of a row:

- NVFP4 (``block_size=16``, ``scale_format="e4m3"``): SF = e4m3(min(gs * amax / 6, 448)), codes = e2m1(y * gs /
  SF), ``gs`` the optional fp32 global scale (1 without one);
- MXFP4 (``block_size=32``, ``scale_format="ue8m0"``): SF = 2**ceil(log2(amax / 6)) as a biased exponent byte,
  codes = e2m1(y / SF) (no global scale, as upstream); ``block_size=32`` with ``"e4m3"`` is NVFP4's rule on 32.

Order of the arithmetic as upstream, so codes and SF are the encoders' (``core.lang.quant``) of the same fp32
values: ``xw = x * w`` rounded to the input dtype (upstream multiplies packed bf16x2 / f16x2), ``amax`` = the
block's largest ``|xw|`` times ``rstd``, ``y = xw * rstd`` in fp32, then ``y * inv_scale``. ``rstd`` =
``rsqrt(mean(x**2) + eps)`` over the fp32 inputs (the weight does not enter the statistics).

SF layouts: linear ``[rows, H / block_size]`` or the 128x4 swizzled layout of the block-scaled GEMMs (rows padded
to 128, SF columns to 4; the padding is written with zeros, where upstream leaves it unwritten). Input ``(M, H)``
or ``(B, S, H)`` (rows), bf16 / fp16, any row stride that keeps rows on 16 bytes; H a multiple of ``block_size``.

Two kinds of artifact with the same arguments: specialized per (dtype, block, format, layout, H) for H <= 16384
(a row spread over ``threads_per_row`` threads holding its blocks in registers, one read of x and w), and general
per (dtype, block, format, layout) with H at run time (one CTA of ``GENERAL_THREADS`` a row; rows past
``GENERAL_THREADS * GENERAL_BLOCKS`` blocks are read twice, the second time mostly from L2). Both launch as
programmatic dependents (``core.lang.pdl``); ``enable_pdl`` is accepted and has no effect.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, runtime

from . import _fp4_rows

KERNEL_META = {
    "name": "flashinfer_rmsnorm_fp4quant",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "RMSNorm fused with NVFP4 (e4m3 SF / 16, global scale) or MXFP4 (ue8m0 SF / 32) quantization, "
                   "SF linear or 128x4 swizzled, bf16/fp16",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "public_ops": ["rmsnorm_fp4quant"],
}

# FlashInfer's test sizes (H in {1024, 3072, 3584, 4096, 8192, 16384}, M in {1, 19, 99, 989}), both formats and
# layouts, 3-D input, strided rows, SF columns that pad the swizzled layout (H / 16 % 4 != 0), H past the
# specialized kernels, and the general kernel pinned at an aligned H.
CONFIGS = [
    {"label": "nv_bf16_m1_h4096", "dtype": "bfloat16", "M": 1, "H": 4096},
    {"label": "nv_bf16_m989_h8192_swz", "dtype": "bfloat16", "M": 989, "H": 8192, "swizzled": True},
    {"label": "nv_fp16_m19_h3072_swz_gs", "dtype": "float16", "M": 19, "H": 3072, "swizzled": True,
     "global_scale": 0.37},
    {"label": "nv_bf16_m99_h1024_gs", "dtype": "bfloat16", "M": 99, "H": 1024, "global_scale": 3.0},
    {"label": "nv_fp16_m99_h3584", "dtype": "float16", "M": 99, "H": 3584},
    {"label": "mx_bf16_m99_h4096", "dtype": "bfloat16", "M": 99, "H": 4096, "block_size": 32},
    {"label": "mx_fp16_m19_h16384_swz", "dtype": "float16", "M": 19, "H": 16384, "block_size": 32,
     "swizzled": True},
    {"label": "nv32_bf16_m19_h2048_gs", "dtype": "bfloat16", "M": 19, "H": 2048, "block_size": 32,
     "scale_format": "e4m3", "global_scale": 2.5},
    {"label": "nv_3d_bf16_b4_s37_h2048_swz", "dtype": "bfloat16", "B": 4, "S": 37, "H": 2048, "swizzled": True},
    {"label": "nv_bf16_m37_h80_swz", "dtype": "bfloat16", "M": 37, "H": 80, "swizzled": True},
    {"label": "nv_bf16_m19_h4096_strided", "dtype": "bfloat16", "M": 19, "H": 4096, "x_row_stride": 4160},
    {"label": "nv_bf16_m3_h20000_swz", "dtype": "bfloat16", "M": 3, "H": 20000, "swizzled": True},
    {"label": "mx_bf16_m130_h4096_swz_general", "dtype": "bfloat16", "M": 130, "H": 4096, "block_size": 32,
     "swizzled": True, "schedule": "general"},
]

BENCH_CONFIGS = [
    {"label": "bench_nv_3d_b32_s32_h128", "dtype": "bfloat16", "B": 32, "S": 32, "H": 128},
    {"label": "bench_nv_m32_h4096", "dtype": "bfloat16", "M": 32, "H": 4096},
    {"label": "bench_nv_large_m64_h8192", "dtype": "bfloat16", "M": 64, "H": 8192},
    {"label": "bench_nv_m8192_h4096_swz", "dtype": "bfloat16", "M": 8192, "H": 4096, "swizzled": True},
    {"label": "bench_nv_m32768_h8192_swz", "dtype": "bfloat16", "M": 32768, "H": 8192, "swizzled": True},
    {"label": "bench_mx_m8192_h4096", "dtype": "bfloat16", "M": 8192, "H": 4096, "block_size": 32},
]

DEFAULTS = {"dtype": "bfloat16", "eps": 1e-6, "block_size": 16, "scale_format": None, "swizzled": False,
            "global_scale": None}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
BLOCK_SIZES = (16, 32)
SCALE_FORMATS = ("e4m3", "ue8m0")
_VEC = 8  # 16-bit elements per 16-byte vector
_WORDS = 4  # 32-bit words per 16-byte vector
MAX_H = 16384  # the specialized kernels
MAX_GENERAL_H = 2**30  # int32 column indices in the general kernel
MAX_ROWS = MAX_STRIDE = 2**31 - 1 - 1024  # int32 rows and strides (padded to 128); element offsets are 64-bit
MIN_CTA_THREADS = 128
VECTORS_PER_THREAD = 4  # 16-byte vectors of x (and of w) a thread holds: 2 NVFP4 blocks or 1 MXFP4 block
GENERAL_THREADS = 256
PDL = "end"
SF_TILE_ROWS, SF_TILE_COLS = 128, 4  # the swizzled layout's tile: 128 rows x 4 SF columns = 512 bytes


def default_format(block_size: int) -> str:
    """FlashInfer's ``scale_format=None``: ue8m0 for 32-element blocks, e4m3 for 16."""
    return "ue8m0" if block_size == 32 else "e4m3"


def sf_columns(H: int, block_size: int, swizzled: bool) -> int:
    """SF bytes a row's columns take (padded to 4 in the swizzled layout)."""
    nb = H // block_size
    return -(-nb // SF_TILE_COLS) * SF_TILE_COLS if swizzled else nb


def sf_rows(rows: int, swizzled: bool) -> int:
    """Rows of the SF layout (padded to 128 when swizzled)."""
    return -(-rows // SF_TILE_ROWS) * SF_TILE_ROWS if swizzled else rows


def specialized(H: int, block_size: int) -> bool:
    return H % block_size == 0 and block_size <= H <= MAX_H


def row_plan(H: int, block_size: int) -> dict:
    """``threads_per_row`` (a power of two up to 32, else whole warps), ``blocks_per_thread``, ``rows_per_cta``."""
    nb = H // block_size
    target = max(1, VECTORS_PER_THREAD * _VEC // block_size)
    want = -(-nb // target)
    tpr = max(2, 1 << (want - 1).bit_length()) if want <= 32 else 32 * -(-want // 32)
    return {"threads_per_row": tpr, "blocks_per_thread": -(-nb // tpr), "rows_per_cta": max(1, MIN_CTA_THREADS // tpr)}


def _key(cfg) -> dict:
    bs = int(cfg.get("block_size", 16))
    return {"dtype": cfg["dtype"], "block_size": bs, "scale_format": cfg.get("scale_format") or default_format(bs),
            "swizzled": bool(cfg.get("swizzled", False))}


def compile_params(**cfg) -> dict:
    """Specialized params where H has them (unless ``schedule="general"``), else the general ones."""
    params = _key(cfg)
    H = int(cfg["H"])
    if cfg.get("schedule") == "general" or not specialized(H, params["block_size"]):
        return {**params, "schedule": "general"}
    return {**params, "H": H}


def general_params(params: dict) -> dict:
    """The general artifact of the same (dtype, block, format, layout): it serves every H."""
    return {**_key(params), "schedule": "general"}


# Bundle specializations: NVFP4 (the format of Hopper-served FP4 checkpoints) at every catalog hidden size, both
# dtypes and layouts (48 artifacts); MXFP4 and e4m3-on-32 calls run the general artifacts.
def artifact_params() -> list[dict]:
    from tirx_kernels.core import model_dims

    out = [general_params({"dtype": t, "block_size": bs, "scale_format": f, "swizzled": s})
           for t in _DTYPES for bs, f in ((16, "e4m3"), (32, "e4m3"), (32, "ue8m0")) for s in (False, True)]
    out += [compile_params(dtype=t, H=H, swizzled=s) for t in _DTYPES for s in (False, True)
            for H in model_dims.hidden_sizes() if specialized(H, 16)]
    return out


def call_samples(rng) -> list[dict]:
    """Calls the public op can see: catalog hidden sizes, random multiples of the block up to 65536, every format,
    layout and dtype."""
    from tirx_kernels.core import model_dims

    out = []
    for bs, fmt in ((16, "e4m3"), (32, "ue8m0"), (32, "e4m3")):
        sizes = model_dims.hidden_sizes() + [bs * rng.randint(1, 16384 // bs) for _ in range(6)]
        sizes += [bs * rng.randint(16384 // bs, 65536 // bs) for _ in range(2)]
        out += [{"dtype": t, "M": rng.choice([1, 19, 4096]), "H": H, "block_size": bs, "scale_format": fmt,
                 "swizzled": s} for t in _DTYPES for s in (False, True) for H in sizes]
    return out


def sass_expect(dtype: str, block_size: int, scale_format: str, swizzled: bool, H: int | None = None,
                schedule: str | None = None, **_) -> list[str]:
    """16-byte loads, 8-byte code stores, byte SF stores."""
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.64", r"STG\.E\.U8"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, block_size: int = 16, scale_format: str = "e4m3", swizzled: bool = False,
               H: int | None = None, schedule: str | None = None, pdl: str | None = PDL):
    if dtype not in _DTYPES:
        raise ValueError(f"rmsnorm_fp4quant: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if block_size not in BLOCK_SIZES or scale_format not in SCALE_FORMATS:
        raise ValueError(f"rmsnorm_fp4quant: block_size {block_size} / scale_format {scale_format!r}: expected "
                         f"{BLOCK_SIZES} / {SCALE_FORMATS}")
    if scale_format == "ue8m0" and block_size != 32:
        raise ValueError("rmsnorm_fp4quant: scale_format 'ue8m0' (MXFP4) needs block_size 32")
    if schedule == "general":
        if H is not None:
            raise ValueError(f"rmsnorm_fp4quant: the general kernel takes H at run time, got H={H}")
        bpt = max(1, VECTORS_PER_THREAD * _VEC // block_size)
        return build_kernel(dtype, block_size, scale_format, swizzled, None, GENERAL_THREADS, bpt, 1, pdl)
    if schedule is not None:
        raise ValueError(f"rmsnorm_fp4quant: schedule {schedule!r} is not None or 'general'")
    if H is None or not specialized(H, block_size):
        raise ValueError(f"rmsnorm_fp4quant: H={H} must be a multiple of block_size {block_size} in "
                         f"[{block_size}, {MAX_H}]")
    plan = row_plan(H, block_size)
    return build_kernel(dtype, block_size, scale_format, swizzled, H, plan["threads_per_row"],
                        plan["blocks_per_thread"], plan["rows_per_cta"], pdl)


def build_kernel(dtype: str, block_size: int, scale_format: str, swizzled: bool, H_static: int | None,  # noqa: N803
                 tpr: int, bpt: int, rows_per_cta: int, pdl: str | None = PDL, add: bool = False,
                 normed: bool = False, both_layouts: bool = False):
    """One kernel for both kinds: ``H_static`` given, every block of a row is in registers (one read of x and w);
    None, H is a runtime argument and a row is walked in slabs of ``tpr * bpt`` blocks (x read again in the second
    pass when the row spans several slabs).

    ``add`` (add_rmsnorm_fp4quant): the row is ``h = x + residual`` in fp32 (its sum of squares), the residual gets
    ``h`` rounded and the quantized values are ``(h_rounded * rstd) * w`` (upstream's order); ``normed`` also
    stores those values rounded to the dtype, ``both_layouts`` the SF in a second, linear buffer. The add kernel
    takes ``(x, residual, w, y, sf, sf_linear, normed, gs, eps, zero)``; the unused buffers may be 1 element."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("rmsnorm_fp4quant", pdl)
    threads = tpr * rows_per_cta
    scratch_len = max(1, reduce.scratch_words(tpr, rows_per_cta))
    vpb = block_size // _VEC  # 16-byte vectors of a block
    wpb = vpb * _WORDS  # words of a block
    slab = tpr * bpt  # blocks a pass covers
    general = H_static is None
    nb_static = None if general else H_static // block_size
    quantizer = _fp4_rows.BlockQuantizer(dtype, block_size, scale_format, swizzled,
                                         values="scaled_product" if add else "rounded_product")

    def width(H):  # noqa: N803
        """The row length the device code computes with: the runtime H, or the static one (H stays an argument
        of both kinds, checked by the host code against the tensors)."""
        return H if general else H_static

    def block_pred(j, lane, first, nb, ok):
        """None where block ``j`` of every lane exists (static H), else the test (with the row's, ``ok``)."""
        pred = None
        if general or (j + 1) * tpr > nb_static:
            pred = first + j * tpr + lane < nb
        if ok is None or pred is None:
            return ok if pred is None else pred
        return T.And(ok, pred)

    def col(j, k, first, lane):
        return T.Cast("int64", (first + j * tpr + lane) * block_size + k * _VEC)

    def load_blocks(regs, buf, base, first, lane, nb, ok):
        """``regs`` <- this lane's blocks of the slab starting at block ``first`` (0 where masked: they add
        nothing to the sum of squares)."""
        for j in range(bpt):
            pred = block_pred(j, lane, first, nb, ok)
            for k in range(vpb):
                if pred is not None:
                    vector.fill(regs, (j * vpb + k) * _WORDS, _WORDS)
                vector.load_v4(regs, (j * vpb + k) * _WORDS, buf.ptr_to([base + col(j, k, first, lane)]), pred)

    def store_blocks(buf, base, regs, first, lane, nb, ok):
        for j in range(bpt):
            pred = block_pred(j, lane, first, nb, ok)
            for k in range(vpb):
                vector.store_v4(buf.ptr_to([base + col(j, k, first, lane)]), regs, (j * vpb + k) * _WORDS, pred)

    def sum_squares(acc, xr):
        for i in range(bpt * wpb):
            lo, hi = vector.unpack2(xr[i], dtype)
            T.buffer_store(acc, acc[0] + lo * lo + hi * hi, [0])

    def add_residual(acc, xr, rr):
        """``xr <- x + r`` rounded (the new residual); ``acc +=`` the squares of the unrounded fp32 sums."""
        for i in range(bpt * wpb):
            x_lo, x_hi = vector.unpack2(xr[i], dtype)
            r_lo, r_hi = vector.unpack2(rr[i], dtype)
            T.buffer_store(acc, acc[0] + (x_lo + r_lo) * (x_lo + r_lo) + (x_hi + r_hi) * (x_hi + r_hi), [0])
            vector.pack2(xr, i, x_lo + r_lo, x_hi + r_hi, dtype)

    def quantize_slab(xr, wr, first, lane, nb, ok, rstd, gs, Y64, S, S2, Nf, y_row, row, H):  # noqa: N803
        for j in range(bpt):
            b = first + j * tpr + lane
            quantizer.block(xr, wr, j * wpb, rstd, gs, Y64, S, y_row, row, b, nb, block_pred(j, lane, first, nb, ok),
                            linear_sf=S2 if both_layouts else None,
                            normed=(Nf, T.Cast("int64", row) * T.Cast("int64", width(H)) + T.Cast(
                                "int64", b * block_size)) if normed else None)

    def row_kernel(M, H, Xf, x_stride, Rf, r_stride, Wt, Y64, S, S2, Nf, G, eps, zero, cta, tid,  # noqa: N803
                   xr, rr, wr, acc, scratch):
        """The kernel body after the PDL wait (both signatures)."""
        row = cta * rows_per_cta + tid // tpr
        lane = tid % tpr
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        r_base = T.Cast("int64", row) * T.Cast("int64", r_stride) if add else None
        y_row = T.Cast("int64", row) * T.Cast("int64", width(H) // 16)
        nb = width(H) // block_size
        ok = None if rows_per_cta == 1 and not swizzled and not general else row < M
        T.buffer_store(acc, T.float32(0), [0])
        T.buffer_store(quantizer.gs, G[0], [0])
        if general:
            slabs = (nb + slab - 1) // slab
            with T.serial(slabs) as s:
                load_blocks(xr, Xf, x_base, s * slab, lane, nb, ok)
                if add:
                    load_blocks(rr, Rf, r_base, s * slab, lane, nb, ok)
                    T.buffer_store(acc, acc[0] + T.cuda.uint_as_float(vector.after_all(rr, bpt * wpb, zero)), [0])
                    add_residual(acc, xr, rr)
                    store_blocks(Rf, r_base, xr, s * slab, lane, nb, ok)
                else:
                    T.buffer_store(acc, acc[0] + T.cuda.uint_as_float(vector.after_all(xr, bpt * wpb, zero)), [0])
                    sum_squares(acc, xr)
        else:
            load_blocks(wr, Wt, T.int64(0), 0, lane, nb, None)
            load_blocks(xr, Xf, x_base, 0, lane, nb, ok)
            if add:
                load_blocks(rr, Rf, r_base, 0, lane, nb, ok)
                T.buffer_store(acc, T.cuda.uint_as_float(vector.after_all(rr, bpt * wpb, zero)), [0])
                add_residual(acc, xr, rr)
                store_blocks(Rf, r_base, xr, 0, lane, nb, ok)
            else:
                T.buffer_store(acc, T.cuda.uint_as_float(vector.after_all(xr, bpt * wpb, zero)), [0])
                sum_squares(acc, xr)
        total = reduce.group_sum(acc[0], tid, tpr, scratch)
        T.buffer_store(acc, T.rsqrt(total * (T.float32(1) / T.Cast("float32", width(H))) + eps), [0])
        rstd = acc[0]
        if general:
            with T.serial(slabs) as s:
                with T.If(slabs > 1):
                    with T.Then():  # the slab again: x, or the new residual (this thread's own stores)
                        load_blocks(xr, Rf if add else Xf, r_base if add else x_base, s * slab, lane, nb, ok)
                load_blocks(wr, Wt, T.int64(0), s * slab, lane, nb, None)
                quantize_slab(xr, wr, s * slab, lane, nb, ok, rstd, quantizer.gs[0], Y64, S, S2, Nf, y_row, row, H)
        else:
            quantize_slab(xr, wr, 0, lane, nb, ok, rstd, quantizer.gs[0], Y64, S, S2, Nf, y_row, row, H)
        if swizzled:
            quantizer.zero_padding(S, row, lane, tpr, M, nb)

    def grid(M):  # noqa: N803
        return ((M + 127) // 128 * 128 if swizzled else M + rows_per_cta - 1) // rows_per_cta

    if add:
        @T.prim_func
        def add_rmsnorm_fp4quant(x_ptr: T.handle, r_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle,
                                 s2_ptr: T.handle, n_ptr: T.handle, g_ptr: T.handle, eps: T.float32, zero: T.int32):
            M = T.int32()
            H = T.int32()
            x_stride = T.int32()
            r_stride = T.int32()
            sf_len = T.int32()
            sf2_len = T.int32()
            n_len = T.int64()
            X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=16)
            R = T.match_buffer(r_ptr, (M, H), dtype, strides=(r_stride, 1), align=16)
            Wt = T.match_buffer(w_ptr, (H,), dtype, align=16)
            Y = T.match_buffer(y_ptr, (M, H // 2), "uint8", align=8)
            S = T.match_buffer(s_ptr, (sf_len,), "uint8")
            S2 = T.match_buffer(s2_ptr, (sf2_len,), "uint8")
            Nf = T.match_buffer(n_ptr, (n_len,), dtype, align=16)
            G = T.match_buffer(g_ptr, (1,), "float32")
            T.device_entry()
            Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
            Rf = T.decl_buffer((M * r_stride,), dtype, data=R.data)
            Y64 = T.decl_buffer((M * (H // 16),), "uint64", data=Y.data)
            cta = T.cta_id([grid(M)])
            tid = T.thread_id([threads])
            xr = T.alloc_local((bpt * wpb,), "uint32")
            rr = T.alloc_local((bpt * wpb,), "uint32")
            wr = T.alloc_local((bpt * wpb,), "uint32")
            acc = T.alloc_local((1,), "float32")
            scratch = T.alloc_shared((scratch_len,), "float32")
            quantizer.alloc()
            pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write the inputs
            row_kernel(M, H, Xf, x_stride, Rf, r_stride, Wt, Y64, S, S2, Nf, G, eps, zero, cta, tid, xr, rr, wr, acc,
                       scratch)
            pdl_launch.end(pdl)

        return pdl_launch.launch(add_rmsnorm_fp4quant, pdl)

    @T.prim_func
    def rmsnorm_fp4quant(x_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, g_ptr: T.handle,
                         eps: T.float32, zero: T.int32):
        M = T.int32()
        H = T.int32()
        x_stride = T.int32()
        sf_len = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=16)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (M, H // 2), "uint8", align=8)
        S = T.match_buffer(s_ptr, (sf_len,), "uint8")
        G = T.match_buffer(g_ptr, (1,), "float32")
        T.device_entry()
        # Flat views indexed row * stride + col (TIRx drops match_buffer strides from device indexing).
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Y64 = T.decl_buffer((M * (H // 16),), "uint64", data=Y.data)
        cta = T.cta_id([grid(M)])
        tid = T.thread_id([threads])
        xr = T.alloc_local((bpt * wpb,), "uint32")
        wr = T.alloc_local((bpt * wpb,), "uint32")
        acc = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((scratch_len,), "float32")
        quantizer.alloc()
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write x, w or gs
        row_kernel(M, H, Xf, x_stride, None, None, Wt, Y64, S, None, None, G, eps, zero, cta, tid, xr, None, wr,
                   acc, scratch)
        pdl_launch.end(pdl)

    return pdl_launch.launch(rmsnorm_fp4quant, pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _rows_shape(cfg) -> tuple:
    return (cfg["B"], cfg["S"]) if "B" in cfg else (cfg["M"],)


def prepare_data(dtype: str, H: int, eps: float = 1e-6, block_size: int = 16, scale_format: str | None = None,
                 swizzled: bool = False, global_scale: float | None = None, x_row_stride: int | None = None,
                 **cfg) -> dict:
    g = _generator()
    t = _DTYPES[dtype]
    lead = _rows_shape(cfg)
    x = torch.randn(*lead, x_row_stride or H, generator=g, device="cuda", dtype=torch.float32).to(t)[..., :H]
    fmt = scale_format or default_format(block_size)
    rows = x.numel() // H
    y, sf = _fp4_rows.new_outputs(lead, H, rows, block_size, fmt, swizzled, x.device)
    gs = None if global_scale is None else torch.tensor([global_scale], dtype=torch.float32, device="cuda")
    return {"input": x, "weight": torch.randn(H, generator=g, device="cuda", dtype=torch.float32).to(t),
            "global_scale": gs, "eps": eps, "block_size": block_size, "scale_format": fmt,
            "is_sf_swizzled_layout": bool(swizzled), "y_fp4": y, "block_scale": sf}


def normalized(input, weight, eps) -> torch.Tensor:  # noqa: A002
    """The fp32 values the kernel encodes, in its order: ``xw = x * w`` rounded to the dtype, times ``rstd``."""
    x = input.float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (x * weight.float()).to(input.dtype).float() * rstd


def reference(input, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,  # noqa: A002
              is_sf_swizzled_layout=False, **_) -> dict:
    """Codes and SF of quant_ref's encoder applied to the fp32 oracle's normalized values (``normalized``)."""
    fmt = scale_format or default_format(block_size)
    y = normalized(input, weight, eps)
    codes, sf = _fp4_rows.encode_rows(y, block_size, fmt, global_scale, is_sf_swizzled_layout)
    return {"y_fp4": codes, "block_scale": sf}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("schedule") == "general":
        _run(data["input"], data["weight"], data["y_fp4"], data["block_scale"], data["global_scale"],
             float(data["eps"]), data["block_size"], data["scale_format"], data["is_sf_swizzled_layout"],
             general=True)
        return
    rmsnorm_fp4quant(data["input"], data["weight"], data["y_fp4"], data["block_scale"], data["global_scale"],
                     data["eps"], data["block_size"], data["scale_format"], data["is_sf_swizzled_layout"])


def roofline(dtype: str, H: int, block_size: int = 16, swizzled: bool = False, **cfg) -> dict:
    rows = 1
    for d in _rows_shape(cfg):
        rows *= d
    sf = sf_rows(rows, swizzled) * sf_columns(H, block_size, swizzled)
    return {"bytes": rows * H * 2 + H * 2 + rows * H // 2 + sf, "flops": 6 * rows * H}


def get_baselines(**cfg) -> dict:
    """torch: the oracle's arithmetic in torch ops (FlashInfer's FP4 kernels need SM100)."""
    def torch_eager():
        return lambda d: reference(**d)

    return {"torch": torch_eager}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "rmsnorm_fp4quant"


def _check_inputs(input, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format,  # noqa: A002
                  swizzled, op: str = "rmsnorm_fp4quant") -> str:
    """Validates a call (add_rmsnorm_fp4quant's too, ``op``); returns the scale format."""
    checks.tensor(op, "input", input, dtypes=tuple(_DTYPES.values()), ndim=(2, 3), cuda=False)
    H = input.shape[-1]
    if block_size not in BLOCK_SIZES:
        _fail(op, "block_size", "16 or 32", repr(block_size))
    fmt = scale_format or default_format(block_size)
    if fmt not in SCALE_FORMATS:
        _fail(op, "scale_format", "'e4m3', 'ue8m0' or None", repr(scale_format))
    if fmt == "ue8m0" and block_size != 32:
        _fail(op, "scale_format", "'e4m3' for block_size 16 (ue8m0 scales are MXFP4's, block_size 32)", repr(fmt))
    if H % block_size or H == 0:
        _fail(op, "input", f"a hidden size H that is a positive multiple of block_size {block_size}", f"H={H}")
    checks.in_range(op, "input", H, block_size, MAX_GENERAL_H)
    checks.tensor(op, "weight", weight, shape=(H,), cuda=False)
    checks.same_dtype(op, "input", input, weight=weight)
    rows = input.numel() // H
    if rows > MAX_ROWS:
        _fail(op, "input", f"at most {MAX_ROWS} rows", str(rows))
    if global_scale is not None:
        checks.tensor(op, "global_scale", global_scale, dtypes=(torch.float32,), shape=(1,), cuda=False)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _fail(op, "eps", "a float", type(eps).__name__)
    _fp4_rows.check_outputs(op, input.shape, H, rows, block_size, fmt, swizzled, y_fp4, block_scale)
    checks.tensor(op, "input", input, cuda=True)
    checks.same_device(op, "input", input, weight=weight,
                       **{k: v for k, v in (("y_fp4", y_fp4), ("block_scale", block_scale),
                                            ("global_scale", global_scale)) if v is not None})
    return fmt


def _fail(op: str, name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def rmsnorm_fp4quant(input: torch.Tensor, weight: torch.Tensor, y_fp4: torch.Tensor | None = None,  # noqa: A002
                     block_scale: torch.Tensor | None = None, global_scale: torch.Tensor | None = None,
                     eps: float = 1e-6, block_size: int = 16, scale_format: str | None = None,
                     is_sf_swizzled_layout: bool = False, enable_pdl: bool | None = None):
    """FlashInfer's ``rmsnorm_fp4quant``: returns ``(y_fp4, block_scale)``, written into the given buffers or new
    ones. ``input`` (M, H) or (B, S, H) bf16/fp16; ``y_fp4`` uint8 / float4_e2m1fn_x2 (..., H / 2); ``block_scale``
    linear (..., H / block_size) or swizzled (flat, rows padded to 128 and SF columns to 4), float8_e4m3fn or
    uint8; ``global_scale`` fp32 (1,) or None (1.0)."""
    swizzled = bool(is_sf_swizzled_layout)
    fmt = _check_inputs(input, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format, swizzled)
    H = input.shape[-1]
    lead = tuple(input.shape[:-1])
    if y_fp4 is None or block_scale is None:
        y_new, sf_new = _fp4_rows.new_outputs(lead, H, input.numel() // H, block_size, fmt, swizzled, input.device)
        y_fp4 = y_new if y_fp4 is None else y_fp4
        block_scale = sf_new if block_scale is None else block_scale
    if global_scale is None:
        global_scale = _fp4_rows.unit_scale(input.device)
    if runtime.direct_call(input, weight, y_fp4, block_scale, global_scale):
        _run(input, weight, y_fp4, block_scale, global_scale, float(eps), block_size, fmt, swizzled)
        runtime.mark_written(y_fp4)
        runtime.mark_written(block_scale)
    else:
        torch.ops.tirx.flashinfer_rmsnorm_fp4quant(input, weight, y_fp4, block_scale, global_scale, float(eps),
                                                   block_size, fmt, swizzled)
    return y_fp4, block_scale


def _run(input, weight, y_fp4, block_scale, global_scale, eps: float, block_size: int, fmt: str,  # noqa: A002
         swizzled: bool, general: bool = False) -> None:
    H = input.shape[-1]
    x2d = _fp4_rows.rows_on_16_bytes(input)
    if x2d.shape[0] == 0:
        return
    _fp4_rows.check_alignment(_OP, y_fp4=y_fp4)
    weight = _fp4_rows.on_16_bytes(weight)
    if global_scale is None:
        global_scale = _fp4_rows.unit_scale(input.device)
    dtype = str(input.dtype)[6:]
    general = general or not specialized(H, block_size)
    fn = _FUNCTIONS.get((input.dtype, H, block_size, fmt, swizzled, general, input.get_device()),
                        lambda: (general_params if general else lambda p: p)(
                            compile_params(dtype=dtype, H=H, block_size=block_size, scale_format=fmt,
                                           swizzled=swizzled)), input.device)
    fn(x2d, weight, y_fp4.view(torch.uint8).view(-1, H // 2), block_scale.view(torch.uint8).view(-1),
       global_scale, eps, 0)  # zero: see vector.after_all


_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::flashinfer_rmsnorm_fp4quant", mutates_args=("y_fp4", "block_scale"))
def _rmsnorm_fp4quant_op(input: torch.Tensor, weight: torch.Tensor, y_fp4: torch.Tensor,  # noqa: A002
                         block_scale: torch.Tensor, global_scale: torch.Tensor, eps: float, block_size: int,
                         scale_format: str, swizzled: bool) -> None:
    _run(input, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format, swizzled)


@_rmsnorm_fp4quant_op.register_fake
def _(input, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format, swizzled):  # noqa: A002
    return None


from tirx_kernels.core import harness  # noqa: E402

COMPARATORS = {"y_fp4": _fp4_rows.codes_close, "block_scale": _fp4_rows.scales_close}

run_test, run_bench = harness.bind(__name__)
