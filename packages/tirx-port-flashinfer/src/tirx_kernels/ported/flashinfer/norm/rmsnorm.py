# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's rmsnorm and gemma_rmsnorm.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/norm (rmsnorm,
# gemma_rmsnorm; the CuTe-DSL RMSNormKernel in flashinfer/norm/kernels/rmsnorm.py), release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: same semantics (fp32 statistics, output rounded once), different structure.
"""``out = x * rsqrt(mean(x**2) + eps) * w`` (Gemma: ``* (1 + w)``) over the last dim of bf16/fp16 rows.

This module also holds the row kernel the FP8 ports of this folder share (``build_rows``, ``run_rows``):
``rmsnorm_quant`` (FP8 out) and ``fused_add_rmsnorm_quant`` (residual added in place, FP8 out).

Two kinds of artifact with the same arguments (the two-level plan of ``_row_plan``, shared with
``fused_add_rmsnorm``):
- specialized (``build_rows_specialized``), per (dtype, variant, H) for H % 8 == 0 in [16, 16384] with every row
  and the weight on 16 bytes (FP8 out rows on 8): H a compile-time constant, a row spread over the lanes of
  ``_row_plan.row_plan`` with weight, x (and the residual) in registers, all loads issued before any math, rows of
  <= 32 lanes packed several to a CTA. A bundle holds them for the catalog hidden sizes (``artifact_params``).
  The general kernel at these sizes ran 0.71-0.92x FlashInfer on the H100 (2026-12-07e: bf16 32x4096 2.0 us vs
  1.7, gemma 64x8192 2.9 vs 2.2, 8192x4096 54.1 vs 50.0); ``fused_add_rmsnorm``'s specialized kernels, the same
  plan, ran 1.0-1.44x.
- general (``build_rows``), per variant: everything below. Serves odd H, H > 16384, unaligned rows or weight, any
  H a bundle lacks, and the long-row split; ``schedule="general"`` configs time it at the specialized sizes.

The general kernel: H, row strides and alignment are run-time arguments. A CTA of ``THREADS`` threads normalizes
one row (or a *span* of it, below). The row is cut into 8-element chunks (one 16-byte vector of bf16/fp16); a
thread loads ``VECTORS`` chunks of a slab before any math. Where every row (x, residual, out) and the weight start
on a vector boundary (the usual contiguous call with H % 8 == 0) a chunk inside the row is one 16-byte access (8
bytes for FP8 out), the row's last partial chunk goes element by element; other layouts go element by element
throughout (a CTA-uniform branch). Rows of up to one slab (``THREADS * VECTORS * 8`` = 8192 elements) stay in
registers between the sum of squares and the stores; longer rows are read again (from L2).

Very long rows with few of them (rmsnorm_quant is tested to H = 1,048,576 with M = 3) would leave most SMs idle:
there the row is split into S spans over a (M, S) grid and the op launches the kernel twice: phase 1 writes each
span's sum of squares to a workspace, phase 2 adds the S partials in a fixed order (deterministic), then scales its
span. Phase 0 (the usual) does both in one CTA per row. Launched as a programmatic dependent (``core.lang.pdl``),
as FlashInfer launches its norms on Hopper; ``enable_pdl`` is accepted for FlashInfer's signature.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.core.op import OutOp
from tirx_kernels.ported.flashinfer.norm import _row_plan as plan

KERNEL_META = {
    "name": "flashinfer_rmsnorm",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "RMSNorm (and Gemma's (1 + w) form) over the last dim, fp32 statistics, bf16/fp16, any H / strides",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["rmsnorm", "gemma_rmsnorm"],
}

# FlashInfer's test sizes (tests/utils/test_norm.py: H in {111, 500, 1024, 3072, 4096, 8192, 16384}, M in {1, 19,
# 99, 989}), both variants and dtypes, strided rows, a long row.
CONFIGS = [
    {"label": "bf16_989x4096", "dtype": "bfloat16", "M": 989, "H": 4096},
    {"label": "bf16_19x8192", "dtype": "bfloat16", "M": 19, "H": 8192},
    {"label": "fp16_1x16384", "dtype": "float16", "M": 1, "H": 16384},
    {"label": "bf16_99x1024", "dtype": "bfloat16", "M": 99, "H": 1024},
    {"label": "fp16_99x3072", "dtype": "float16", "M": 99, "H": 3072},
    {"label": "bf16_19x500", "dtype": "bfloat16", "M": 19, "H": 500},
    {"label": "fp16_989x111", "dtype": "float16", "M": 989, "H": 111},
    {"label": "gemma_bf16_99x4096", "dtype": "bfloat16", "M": 99, "H": 4096, "gemma": True},
    {"label": "gemma_fp16_1x111", "dtype": "float16", "M": 1, "H": 111, "gemma": True},
    {"label": "gemma_bf16_989x16384", "dtype": "bfloat16", "M": 989, "H": 16384, "gemma": True},
    {"label": "bf16_19x4096_strided", "dtype": "bfloat16", "M": 19, "H": 4096, "input_row_stride": 4608,
     "out_row_stride": 4160},
    {"label": "fp16_19x500_strided_odd", "dtype": "float16", "M": 19, "H": 500, "input_row_stride": 503},
    {"label": "bf16_3x65536_split", "dtype": "bfloat16", "M": 3, "H": 65536},
    {"label": "bf16_19x1", "dtype": "bfloat16", "M": 19, "H": 1},
    {"label": "fp16_37x2880", "dtype": "float16", "M": 37, "H": 2880},
    {"label": "gemma_bf16_99x4096_general", "dtype": "bfloat16", "M": 99, "H": 4096, "gemma": True,
     "schedule": "general"},
]

BENCH_CONFIGS = [
    {"label": "bf16_32x4096", "dtype": "bfloat16", "M": 32, "H": 4096},
    {"label": "gemma_bf16_64x8192", "dtype": "bfloat16", "M": 64, "H": 8192, "gemma": True},
    {"label": "bf16_8192x4096", "dtype": "bfloat16", "M": 8192, "H": 4096},
    # The general kernel at the same rows (what an H missing from a bundle, or an unaligned row, costs).
    {"label": "bf16_32x4096_general", "dtype": "bfloat16", "M": 32, "H": 4096, "schedule": "general"},
    {"label": "gemma_bf16_64x8192_general", "dtype": "bfloat16", "M": 64, "H": 8192, "gemma": True,
     "schedule": "general"},
    {"label": "bf16_8192x4096_general", "dtype": "bfloat16", "M": 8192, "H": 4096, "schedule": "general"},
]

DEFAULTS = {"dtype": "bfloat16", "eps": 1e-6, "gemma": False}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
FP8 = {"float8_e4m3fn": (torch.float8_e4m3fn, 448.0, "e4m3x2"), "float8_e5m2": (torch.float8_e5m2, 57344.0, "e5m2x2")}
_VEC = 8  # 16-bit elements per 16-byte vector (a chunk)
_WORDS = 4  # 32-bit words per chunk
THREADS = 256
VECTORS = 4  # chunks a thread loads per slab: 256 x 4 x 8 = 8192 columns a pass
SLAB = THREADS * VECTORS  # chunks a slab covers
MAX_H = 2**30  # int32 column indices
MAX_ROWS = MAX_STRIDE = 2**31 - 1  # int32 row count and strides; row offsets are 64-bit
PDL = "end"


def compile_params(**cfg) -> dict:
    """The specialized params where H has them (unless ``schedule="general"``), else the general ones."""
    gemma = bool(cfg.get("gemma", False))
    if cfg.get("schedule") == "general" or not plan.specialized(int(cfg["H"])):
        return {"dtype": cfg["dtype"], "gemma": gemma, "schedule": "general"}
    return {"dtype": cfg["dtype"], "gemma": gemma, "H": int(cfg["H"])}


def general_params(params: dict) -> dict:
    """The general artifact: it serves every call any params of the same (dtype, gemma) serve."""
    return {"dtype": params["dtype"], "gemma": bool(params.get("gemma", False)), "schedule": "general"}


def artifact_params() -> list[dict]:
    """The general kernel of each (dtype, gemma) and the specialized one of every catalog hidden size (12 sizes:
    48 specialized artifacts, ~20 KB each in a batched .so)."""
    return [p for d in _DTYPES for g in (False, True) for p in
            [general_params({"dtype": d, "gemma": g})]
            + [compile_params(dtype=d, gemma=g, H=H) for H in plan.catalog_sizes()]]


def call_samples(rng) -> list[dict]:
    """Calls the public ops can see: catalog hidden sizes, random and odd H, both variants and dtypes."""
    from tirx_kernels.core import model_dims

    sizes = model_dims.hidden_sizes() + [rng.randint(1, 64) for _ in range(4)]
    sizes += [rng.randint(1, 70000) for _ in range(6)]
    return [{"dtype": d, "gemma": g, "M": rng.choice([1, 19, 4096]), "H": H}
            for d in _DTYPES for g in (False, True) for H in sizes]


def sass_expect(H: int | None = None, schedule: str | None = None, **_) -> list[str]:
    """16-byte loads and stores; the general kernel also the 2-byte ones of a row's unaligned ends."""
    if schedule == "general":
        return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.128", r"LDG\.E\.U16", r"STG\.E\.U16"]
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.128"]


def get_kernel(dtype: str, gemma: bool = False, H: int | None = None, schedule: str | None = None,
               pdl: str | None = PDL):
    if dtype not in _DTYPES:
        raise ValueError(f"rmsnorm: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    return rows_kernel(dtype, gemma, H=H, schedule=schedule, pdl=pdl)


def rows_kernel(dtype: str, gemma: bool, residual: bool = False, out_dtype: str | None = None, H: int | None = None,
                schedule: str | None = None, pdl: str | None = PDL):
    """The row kernel of a module's params: general (``schedule="general"``) or specialized at H."""
    if schedule == "general":
        if H is not None:
            raise ValueError(f"rmsnorm rows: the general kernel takes H at run time, got H={H}")
        return build_rows(dtype, gemma, residual=residual, out_dtype=out_dtype, pdl=pdl)
    if schedule is not None:
        raise ValueError(f"rmsnorm rows: schedule {schedule!r} is not None or 'general'")
    if H is None or not plan.specialized(H):
        raise ValueError(f"rmsnorm rows: H={H} must be a multiple of {_VEC} in [{plan.MIN_H}, {plan.MAX_H}]")
    return build_rows_specialized(dtype, gemma, H, residual=residual, out_dtype=out_dtype, pdl=pdl,
                                  **plan.row_plan(H))


# ---------------------------------------------------------------------------------------------------------
# The row kernel (shared with rmsnorm_quant and fused_add_rmsnorm_quant)
# ---------------------------------------------------------------------------------------------------------

class _RowMath:
    """What the general and the specialized row kernels compute alike, so both emit the same expressions (the
    specialized kernel must give the general one's bits): the fp32 operands of a packed word (x, or x + residual
    unrounded), and one output word (bf16/fp16, or FP8 codes through ``pair``) in FlashInfer's order."""

    def __init__(self, dtype: str, gemma: bool, residual: bool, out_dtype: str | None):
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import vector

        self.T, self.vector = T, vector
        self.dtype, self.gemma, self.residual = dtype, gemma, residual
        self.fp8 = out_dtype is not None
        if self.fp8 and out_dtype not in FP8:
            raise ValueError(f"rmsnorm rows: out_dtype {out_dtype!r} is not None or one of {sorted(FP8)}")
        self.y_dtype = "uint8" if self.fp8 else dtype
        self.fp8_max = FP8[out_dtype][1] if self.fp8 else 0.0
        self.cvt = f"cvt.rn.satfinite.{FP8[out_dtype][2]}.f32" if self.fp8 else None

    def values(self, xr, rr, i):
        """The fp32 values (low, high) of packed word ``i``: x, or ``x + residual`` (unrounded)."""
        a_lo, a_hi = self.vector.unpack2(xr[i], self.dtype)
        if not self.residual:
            return a_lo, a_hi
        b_lo, b_hi = self.vector.unpack2(rr[i], self.dtype)
        return a_lo + b_lo, a_hi + b_hi

    def factor(self, w):
        return self.T.float32(1) + w if self.gemma else w

    def out_word(self, orr, pair, j, lo, hi, w_word, rs, inv_scale):
        """Output word ``j`` of a chunk into ``orr``: ``(lo, hi) * rstd * w``; FP8 codes go two words at a time
        through ``pair`` into ``orr[j // 2]``."""
        T = self.T  # noqa: N806
        w_lo, w_hi = self.vector.unpack2(w_word, self.dtype)
        y_lo = lo * rs * self.factor(w_lo)
        y_hi = hi * rs * self.factor(w_hi)
        if not self.fp8:
            self.vector.pack2(orr, j, y_lo, y_hi, self.dtype)
            return
        # FlashInfer's order: ((x * rstd) * w) * (1 / scale), clamped, then RNE to FP8
        lim = T.float32(self.fp8_max)
        y_lo = T.min(T.max(y_lo * inv_scale, -lim), lim)
        y_hi = T.min(T.max(y_hi * inv_scale, -lim), lim)
        T.evaluate(T.ptx[self.cvt](pair[j % 2], y_hi, y_lo))  # first operand: the upper byte
        if j % 2 == 1:
            T.buffer_store(orr, T.Cast("uint32", pair[0]) | (T.Cast("uint32", pair[1]) << T.uint32(16)), [j // 2])


def build_rows(dtype: str, gemma: bool, residual: bool = False, out_dtype: str | None = None, pdl: str | None = PDL,
               threads: int = THREADS, vectors: int = VECTORS):
    """The row kernel. Arguments ``(x, r, w, y, scale, ws, eps, span, phase, zero)``: x, r (M, H) bf16/fp16 rows
    (r: the residual, read and written in place where ``residual``, else unused: pass x), w (H,), y (M, H) out rows
    (``out_dtype`` None: x's dtype; an FP8 name: its bytes as uint8), scale (1,) fp32 (FP8 out: ``y = sat(norm /
    scale)``; else unused), ws (Mw, S) fp32 span partials (phases 1 and 2; phase 0: any (1, 1)), ``span`` chunks a
    CTA covers, ``phase`` 0 / 1 / 2 (module docstring), ``zero`` 0 (``vector.after_all``)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("rmsnorm rows", pdl)
    math = _RowMath(dtype, gemma, residual, out_dtype)
    fp8, y_dtype, values = math.fp8, math.y_dtype, math.values
    y_align = 8 if fp8 else 16  # bytes of one chunk of out
    scratch_len = reduce.scratch_words(threads, 1)
    slab = threads * vectors

    def misaligned(ptr, row_off, elem_bytes, align):
        """Bytes the element ``row_off`` (int64) past ``ptr`` lies past an ``align``-byte boundary (0: aligned)."""
        addr = T.reinterpret("uint64", ptr) + T.Cast("uint64", row_off) * T.uint64(elem_bytes)
        return T.Cast("int32", addr & T.uint64(align - 1))

    def element(buf, idx):
        """fp32 value of one 2-byte element (through its bits, as the vector path unpacks)."""
        return vector.unpack2(T.Cast("uint32", T.reinterpret("uint16", buf[idx])), dtype)[0]

    def as_u16(value):
        return T.Cast("uint32", T.reinterpret("uint16", value))

    def load_chunk(regs, base, buf, row_base, c0, H, vec_ok):  # noqa: N803
        """``regs[base:+4]`` <- columns ``c0..c0+8`` of a row: one vector, or element by element (0 past H)."""
        with T.If(T.And(vec_ok, c0 + _VEC <= H)):
            with T.Then():
                vector.load_v4(regs, base, buf.ptr_to([row_base + T.Cast("int64", c0)]))
            with T.Else():
                vector.fill(regs, base, _WORDS)
                for e in range(_VEC):
                    with T.If(c0 + e < H):
                        with T.Then():
                            word = regs[base + e // 2] | (as_u16(buf[row_base + T.Cast("int64", c0 + e)])
                                                          << T.uint32(16 * (e % 2)))
                            T.buffer_store(regs, word, [base + e // 2])

    def load_slab(xr, rr, Xf, Rf, x_base, r_base, k0, k1, s, tid, H, vec_ok):  # noqa: N803
        for v in range(vectors):
            k = k0 + s * slab + v * threads + tid
            with T.If(k < k1):
                with T.Then():
                    load_chunk(xr, v * _WORDS, Xf, x_base, k * _VEC, H, vec_ok)
                    if residual:
                        load_chunk(rr, v * _WORDS, Rf, r_base, k * _VEC, H, vec_ok)
                with T.Else():
                    vector.fill(xr, v * _WORDS, _WORDS)
                    if residual:
                        vector.fill(rr, v * _WORDS, _WORDS)

    def store_halves(buf, row_base, c0, H, regs, vec_ok):  # noqa: N803
        with T.If(T.And(vec_ok, c0 + _VEC <= H)):
            with T.Then():
                vector.store_v4(buf.ptr_to([row_base + T.Cast("int64", c0)]), regs, 0)
            with T.Else():
                for e in range(_VEC):
                    with T.If(c0 + e < H):
                        with T.Then():
                            half = T.Cast("uint16", regs[e // 2] >> T.uint32(16 * (e % 2)))
                            T.buffer_store(buf, T.reinterpret(dtype, half),
                                           [row_base + T.Cast("int64", c0 + e)])

    def store_bytes(buf, row_base, c0, H, regs, vec_ok):  # noqa: N803
        """8 FP8 codes (``regs[0:2]``, little-endian) at columns ``c0..c0+8``: one 8-byte store, or byte by byte."""
        with T.If(T.And(vec_ok, c0 + _VEC <= H)):
            with T.Then():
                T.evaluate(T.ptx["st.global.v2.b32"](buf.ptr_to([row_base + T.Cast("int64", c0)]), regs[0], regs[1]))
            with T.Else():
                for e in range(_VEC):
                    with T.If(c0 + e < H):
                        with T.Then():
                            code = T.Cast("uint8", (regs[e // 4] >> T.uint32(8 * (e % 4))) & T.uint32(0xFF))
                            T.buffer_store(buf, code, [row_base + T.Cast("int64", c0 + e)])

    def scale_store_slab(Xf, Rf, Wt, Yf, x_base, r_base, y_base, k0, k1, s, tid, H, vec_ok, xr, rr, wr, orr,  # noqa: N803
                         pair, rs, inv_scale):
        for v in range(vectors):
            k = k0 + s * slab + v * threads + tid
            with T.If(k < k1):
                with T.Then():
                    c0 = k * _VEC
                    load_chunk(wr, 0, Wt, T.int64(0), c0, H, vec_ok)
                    if residual:  # the residual <- x + residual, rounded once
                        for j in range(_WORDS):
                            lo, hi = values(xr, rr, v * _WORDS + j)
                            vector.pack2(orr, j, lo, hi, dtype)
                        store_halves(Rf, r_base, c0, H, orr, vec_ok)
                    for j in range(_WORDS):
                        lo, hi = values(xr, rr, v * _WORDS + j)
                        math.out_word(orr, pair, j, lo, hi, wr[j], rs, inv_scale)
                    if fp8:
                        store_bytes(Yf, y_base, c0, H, orr, vec_ok)
                    else:
                        store_halves(Yf, y_base, c0, H, orr, vec_ok)

    @T.prim_func
    def rows(x_ptr: T.handle, r_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, ws_ptr: T.handle,
             eps: T.float32, span: T.int32, phase: T.int32, zero: T.int32):
        M = T.int32()
        H = T.int32()
        Mw = T.int32()
        S = T.int32()
        x_stride = T.int32()
        r_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=2)
        R = T.match_buffer(r_ptr, (M, H), dtype, strides=(r_stride, 1), align=2)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=2)
        Y = T.match_buffer(y_ptr, (M, H), y_dtype, strides=(y_stride, 1), align=1)
        Sc = T.match_buffer(s_ptr, (1,), "float32", align=4)
        WS = T.match_buffer(ws_ptr, (Mw, S), "float32", align=4)
        T.device_entry()
        # Flat views indexed row * stride + col (TIRx drops match_buffer strides from device indexing).
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Rf = T.decl_buffer((M * r_stride,), dtype, data=R.data)
        Yf = T.decl_buffer((M * y_stride,), y_dtype, data=Y.data)
        WSf = T.decl_buffer((Mw * S,), "float32", data=WS.data)
        row, part = T.cta_id([M, S])
        tid = T.thread_id([threads])
        xr = T.alloc_local((vectors * _WORDS,), "uint32")
        rr = T.alloc_local((vectors * _WORDS,), "uint32")
        wr = T.alloc_local((_WORDS,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        pair = T.alloc_local((2,), "uint16")
        acc = T.alloc_local((1,), "float32")
        total = T.alloc_local((1,), "float32")
        inv = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((scratch_len,), "float32")
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write the rows

        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        r_base = T.Cast("int64", row) * T.Cast("int64", r_stride)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        vec_ok = (misaligned(X.data, x_base, 2, 16) + misaligned(R.data, r_base, 2, 16)
                  + misaligned(Wt.data, T.int64(0), 2, 16) + misaligned(Y.data, y_base, 1 if fp8 else 2, y_align)) == 0
        chunks = (H + _VEC - 1) // _VEC
        k0 = part * span
        k1 = T.min(chunks, k0 + span)
        slabs = (k1 - k0 + slab - 1) // slab
        inv[0] = T.float32(0)
        if fp8:
            T.evaluate(T.ptx["rcp.approx.ftz.f32"](inv[0], Sc[0]))
        acc[0] = T.float32(0)
        total[0] = T.float32(0)
        if phase != 2:
            for s in T.serial(slabs):
                load_slab(xr, rr, Xf, Rf, x_base, r_base, k0, k1, s, tid, H, vec_ok)
                loaded = vector.after_all(xr, vectors * _WORDS, zero)
                if residual:  # the residual's loads too, before any math
                    loaded = loaded | vector.after_all(rr, vectors * _WORDS, zero)
                acc[0] = acc[0] + T.cuda.uint_as_float(loaded)
                for i in range(vectors * _WORDS):
                    lo, hi = values(xr, rr, i)
                    acc[0] = acc[0] + lo * lo + hi * hi
            total[0] = reduce.group_sum(acc[0], tid, threads, scratch)
            if phase == 1:
                if tid == 0:
                    WSf[T.Cast("int64", row) * T.Cast("int64", S) + T.Cast("int64", part)] = total[0]
        else:
            for j in T.serial(S):  # the spans' partials in a fixed order: every CTA of the row gets the same sum
                total[0] = total[0] + WSf[T.Cast("int64", row) * T.Cast("int64", S) + T.Cast("int64", j)]
        if phase != 1:
            rs = T.rsqrt(total[0] * (T.float32(1) / T.Cast("float32", H)) + eps)
            for s in T.serial(slabs):
                if slabs > 1 or phase == 2:
                    load_slab(xr, rr, Xf, Rf, x_base, r_base, k0, k1, s, tid, H, vec_ok)
                scale_store_slab(Xf, Rf, Wt, Yf, x_base, r_base, y_base, k0, k1, s, tid, H, vec_ok, xr, rr, wr, orr,
                                 pair, rs, inv[0])
        pdl_launch.end(pdl)

    return pdl_launch.launch(rows, pdl)


def build_rows_specialized(dtype: str, gemma: bool, H: int, residual: bool = False, out_dtype: str | None = None,  # noqa: N803
                           pdl: str | None = PDL, *, threads_per_row: int, vectors_per_thread: int,
                           rows_per_cta: int):
    """The row kernel at a compile-time H (``_row_plan.specialized``; every row and the weight on 16 bytes, FP8
    out rows on 8): ``build_rows``' arguments and results, for phase 0 only (``run_rows`` passes ``span`` = the
    row's chunks, ``phase`` 0 and a (1, 1) workspace to whichever artifact serves the call, so a bundle falling back
    to the general one still computes the same). A row is spread over ``threads_per_row`` lanes (``_row_plan``):
    weight, x and the residual all loaded into registers before any math, read once, the output (and the residual)
    written once; x + residual recomputed from the held words after the reduction rather than kept in fp32. The
    arithmetic is ``build_rows``' expression for expression (the same bits out)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("rmsnorm rows", pdl)
    if not plan.specialized(H):
        raise ValueError(f"rmsnorm rows: H={H} must be a multiple of {_VEC} in [{plan.MIN_H}, {plan.MAX_H}]")
    math = _RowMath(dtype, gemma, residual, out_dtype)
    fp8, y_dtype, values = math.fp8, math.y_dtype, math.values
    lanes = plan.Lanes(H, threads_per_row, vectors_per_thread, rows_per_cta)
    tpr, vpt, threads = threads_per_row, vectors_per_thread, lanes.threads
    scratch_len = max(1, reduce.scratch_words(tpr, rows_per_cta))

    def sum_squares(acc, xr, rr, Rf, r_base, lane, row_ok, orr):  # noqa: N803
        """``acc[0] +=`` the squares; with a residual, the residual <- x + residual, rounded once, stored."""
        for v in range(vpt):
            for j in range(_WORDS):
                lo, hi = values(xr, rr, v * _WORDS + j)
                T.buffer_store(acc, acc[0] + lo * lo + hi * hi, [0])
                if residual:
                    vector.pack2(orr, j, lo, hi, dtype)
            if residual:
                vector.store_v4(Rf.ptr_to([r_base + lanes.col(v, lane)]), orr, 0, lanes.pred(v, lane, row_ok))

    def scale_store(Yf, y_base, lane, row_ok, xr, rr, wr, orr, pair, rs, inv_scale):  # noqa: N803
        for v in range(vpt):
            for j in range(_WORDS):
                lo, hi = values(xr, rr, v * _WORDS + j)
                math.out_word(orr, pair, j, lo, hi, wr[v * _WORDS + j], rs, inv_scale)
            pred = lanes.pred(v, lane, row_ok)
            if not fp8:
                vector.store_v4(Yf.ptr_to([y_base + lanes.col(v, lane)]), orr, 0, pred)
            elif pred is None:  # 8 FP8 codes: one 8-byte store
                T.evaluate(T.ptx["st.global.v2.b32"](Yf.ptr_to([y_base + lanes.col(v, lane)]), orr[0], orr[1]))
            else:
                with T.If(pred):
                    with T.Then():
                        T.evaluate(T.ptx["st.global.v2.b32"](Yf.ptr_to([y_base + lanes.col(v, lane)]), orr[0],
                                                             orr[1]))

    @T.prim_func
    def rows(x_ptr: T.handle, r_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, ws_ptr: T.handle,
             eps: T.float32, span: T.int32, phase: T.int32, zero: T.int32):
        M = T.int32()
        Mw = T.int32()
        S = T.int32()
        x_stride = T.int32()
        r_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=16)
        R = T.match_buffer(r_ptr, (M, H), dtype, strides=(r_stride, 1), align=16)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (M, H), y_dtype, strides=(y_stride, 1), align=8 if fp8 else 16)
        Sc = T.match_buffer(s_ptr, (1,), "float32", align=4)
        WS = T.match_buffer(ws_ptr, (Mw, S), "float32", align=4)  # noqa: F841 (build_rows' argument; unused)
        T.device_entry()
        # Flat views indexed row * stride + col (TIRx drops match_buffer strides from device indexing).
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Rf = T.decl_buffer((M * r_stride,), dtype, data=R.data)
        Yf = T.decl_buffer((M * y_stride,), y_dtype, data=Y.data)
        cta = T.cta_id([(M + rows_per_cta - 1) // rows_per_cta])
        tid = T.thread_id([threads])
        xr = T.alloc_local((vpt * _WORDS,), "uint32")
        rr = T.alloc_local((vpt * _WORDS if residual else 1,), "uint32")
        wr = T.alloc_local((vpt * _WORDS,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        pair = T.alloc_local((2,), "uint16")
        acc = T.alloc_local((1,), "float32")
        inv = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((scratch_len,), "float32")
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write the rows

        row = cta * rows_per_cta + tid // tpr
        lane = tid % tpr
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        r_base = T.Cast("int64", row) * T.Cast("int64", r_stride)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        lanes.load(wr, Wt, 0, lane, None)
        lanes.load(xr, Xf, x_base, lane, lanes.row_ok(row, M))
        if residual:
            lanes.load(rr, Rf, r_base, lane, lanes.row_ok(row, M))
        inv[0] = T.float32(0)
        if fp8:
            T.evaluate(T.ptx["rcp.approx.ftz.f32"](inv[0], Sc[0]))
        acc[0] = T.cuda.uint_as_float(vector.after_all(wr, vpt * _WORDS, zero))  # 0.0, after the weight
        sum_squares(acc, xr, rr, Rf, r_base, lane, lanes.row_ok(row, M), orr)
        total = reduce.group_sum(acc[0], tid, tpr, scratch)
        rs = T.rsqrt(total * T.float32(1.0 / H) + eps)
        scale_store(Yf, y_base, lane, lanes.row_ok(row, M), xr, rr, wr, orr, pair, rs, inv[0])
        pdl_launch.end(pdl)

    return pdl_launch.launch(rows, pdl)


_WORKSPACE = runtime.StreamWorkspace(n_flags=1)
_SM_COUNT: dict = {}


def split_plan(M: int, H: int, sm_count: int) -> tuple[int, int]:
    """``(span, S)``: chunks a CTA covers and spans a row is cut into; S == 1 is phase 0 (one CTA a row)."""
    chunks = -(-H // _VEC)
    want = -(-2 * sm_count // max(M, 1))  # CTAs to fill the SMs twice
    S = max(1, min(want, -(-chunks // SLAB)))
    if S == 1:
        return chunks, 1
    span = SLAB * -(-chunks // (SLAB * S))  # whole slabs a span
    return span, -(-chunks // span)


def uses_general(x2d: torch.Tensor, r2d: torch.Tensor, weight: torch.Tensor, y2d: torch.Tensor) -> bool:
    """Whether a call runs the general kernel: H has no specialized kernel, or a row (x, residual, out: 16 bytes; an
    FP8 out, viewed as uint8: 8 bytes) or the weight does not start on its vector boundary."""
    return not (plan.specialized(x2d.shape[1]) and plan.aligned_rows(x2d) and plan.aligned_rows(r2d)
                and weight.data_ptr() % 16 == 0 and plan.aligned_rows(y2d, 8 if y2d.element_size() == 1 else 16))


def run_rows(fn, x2d, r2d, weight, y2d, scale, eps: float, general: bool = True) -> None:
    """Launch the row kernel ``fn`` on 2-D views: for a call the specialized kernel serves (``general`` False)
    one phase-0 launch, which the general kernel computes the same where a bundle served the call with it;
    otherwise one launch, or the two phases of a split row (``split_plan``)."""
    M, H = x2d.shape
    dev = x2d.device
    if general:
        sms = _SM_COUNT.get(dev.index)
        if sms is None:
            sms = _SM_COUNT[dev.index] = torch.cuda.get_device_properties(dev).multi_processor_count
        span, S = split_plan(M, H, sms)
    else:
        span, S = -(-H // _VEC), 1
    ws, _ = _WORKSPACE.get(dev, M * S if S > 1 else 1)
    sc = ws[:1] if scale is None else scale
    if S == 1:
        fn(x2d, r2d, weight, y2d, sc, ws[:1].view(1, 1), eps, span, 0, 0)
        return
    parts = ws[:M * S].view(M, S)
    fn(x2d, r2d, weight, y2d, sc, parts, eps, span, 1, 0)
    fn(x2d, r2d, weight, y2d, sc, parts, eps, span, 2, 0)


def unit_columns(t: torch.Tensor) -> torch.Tensor:
    """A 2-D view with column stride 1 (a size-1 last dim may have any stride; the kernel's checks want 1)."""
    return t if t.stride(1) == 1 else t.as_strided(t.shape, (t.stride(0), 1))


def fail(op: str, name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def check_rows(op: str, name: str, t: torch.Tensor, copy_ok: bool = False) -> None:
    """Rows a 2-D view reaches (no copy unless ``copy_ok``), unit column stride, int32 row count and strides."""
    H = t.shape[-1]
    if not copy_ok:
        try:
            t.view(-1, H)
        except RuntimeError:
            fail(op, name, "leading dims that flatten to rows without a copy (it is written)",
                 f"shape {tuple(t.shape)} strides {tuple(t.stride())}")
    if H > 1 and t.stride(-1) != 1:
        fail(op, name, "a unit stride in the last dim", f"strides {tuple(t.stride())}")
    rows = t.numel() // max(1, H)
    if rows > MAX_ROWS:
        fail(op, name, f"at most {MAX_ROWS} rows (the leading dims' product)", str(rows))
    for d in range(t.dim() - 1):
        if t.shape[d] > 1 and not 0 < t.stride(d) <= MAX_STRIDE:
            fail(op, name, f"strides of the leading dims in [1, {MAX_STRIDE}]", f"strides {tuple(t.stride())}")


def check_eps(op: str, eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        fail(op, "eps", "a float", type(eps).__name__)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def random_rows(M: int, H: int, row_stride: int | None, t: torch.dtype, g) -> torch.Tensor:
    return torch.randn(M, row_stride or H, generator=g, device="cuda", dtype=torch.float32).to(t)[:, :H]


def prepare_data(dtype: str, M: int, H: int, eps: float = 1e-6, gemma: bool = False,
                 input_row_stride: int | None = None, out_row_stride: int | None = None, **_) -> dict:
    g = generator()
    t = _DTYPES[dtype]
    out = torch.full((M, out_row_stride or H), float("nan"), device="cuda", dtype=t)[:, :H]
    return {"input": random_rows(M, H, input_row_stride, t, g),
            "weight": torch.randn(H, generator=g, device="cuda", dtype=torch.float32).to(t), "eps": eps,
            "gemma": bool(gemma), "out": out}


def normalized(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """fp32 ``x * rsqrt(mean(x**2) + eps) * w`` (Gemma ``1 + w``), x already fp32."""
    w = weight.float() + 1 if gemma else weight.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference(input, weight, eps, gemma=False, **_) -> dict:  # noqa: A002
    return {"out": normalized(input.float(), weight, eps, gemma)}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("schedule") == "general":  # the general kernel where the public op would pick the specialized one
        _run(data["input"], data["weight"], float(data["eps"]), data["gemma"], data["out"], general=True)
        return
    op = gemma_rmsnorm if data["gemma"] else rmsnorm
    op(data["input"], data["weight"], data["eps"], out=data["out"])


def roofline(dtype: str, M: int, H: int, **_) -> dict:
    return {"bytes": 2 * M * H * 2 + H * 2, "flops": 4 * M * H}


def get_baselines(**cfg) -> dict:
    gemma = bool(cfg.get("gemma", False))

    def _torch_fn(x, w, eps):
        return normalized(x.float(), w, eps, gemma).to(x.dtype)

    def torch_eager():
        return lambda d: {"out": _torch_fn(d["input"], d["weight"], d["eps"])}

    def torch_compile():
        fn = torch.compile(_torch_fn, dynamic=False)
        return lambda d: {"out": fn(d["input"], d["weight"], d["eps"])}

    def flashinfer():
        import flashinfer.norm

        op = flashinfer.norm.gemma_rmsnorm if gemma else flashinfer.norm.rmsnorm
        return lambda d: {"out": op(d["input"].contiguous(), d["weight"], d["eps"])}

    return {"torch": torch_eager, "torch.compile": torch_compile, "flashinfer": flashinfer}


# ---------------------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------------------

def _check_inputs(op: str, input, weight, eps, out) -> None:  # noqa: A002
    checks.tensor(op, "input", input, dtypes=tuple(_DTYPES.values()), ndim=tuple(range(1, 9)), cuda=False)
    H = input.shape[-1]
    checks.in_range(op, "input", H, 1, MAX_H)
    checks.tensor(op, "weight", weight, shape=(H,), cuda=False)
    checks.same_dtype(op, "input", input, weight=weight)
    check_eps(op, eps)
    check_rows(op, "input", input, copy_ok=True)
    if out is not None:
        checks.tensor(op, "out", out, shape=tuple(input.shape), cuda=False)
        checks.same_dtype(op, "input", input, out=out)
        check_rows(op, "out", out)
    checks.tensor(op, "input", input, cuda=True)
    checks.same_device(op, "input", input, weight=weight, **({} if out is None else {"out": out}))


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(input, weight, eps: float, gemma: bool, out, general: bool = False) -> None:  # noqa: A002
    H = input.shape[-1]
    x2d = unit_columns(input.reshape(-1, H))  # a view for every row layout the checks accept
    y2d = unit_columns(out.view(-1, H))
    weight = weight if weight.stride(0) == 1 else weight.as_strided((H,), (1,))
    if x2d.shape[0] == 0:
        return
    dtype = str(input.dtype)[6:]
    general = general or uses_general(x2d, x2d, weight, y2d)
    fn = _FUNCTIONS.get((input.dtype, gemma, H if not general else None, input.get_device()),
                        lambda: general_params({"dtype": dtype, "gemma": gemma}) if general
                        else compile_params(dtype=dtype, gemma=gemma, H=H), input.device)
    run_rows(fn, x2d, x2d, weight, y2d, None, eps, general)


def _new_out(input, weight, eps, gemma):  # noqa: A002
    return torch.empty(input.shape, dtype=input.dtype, device=input.device)


# tirx::flashinfer_rmsnorm(input, weight, eps, gemma) and tirx::flashinfer_rmsnorm_out(..., out).
_CUSTOM_OP = OutOp("flashinfer_rmsnorm", {"input": torch.Tensor, "weight": torch.Tensor, "eps": float, "gemma": bool},
                   run=_run, new_out=_new_out)


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,  # noqa: A002
            enable_pdl: bool | None = None) -> torch.Tensor:
    """``out = input * rsqrt(mean(input**2) + eps) * weight`` in fp32, rounded once. input (..., H) bf16/fp16 (2-D
    or 3-D as FlashInfer, any leading dims here), any row strides; weight (H,); ``out`` (same shape and dtype, any
    row strides) when given. ``enable_pdl``: FlashInfer's argument, accepted; the kernel always launches as a
    programmatic dependent."""
    _check_inputs("rmsnorm", input, weight, eps, out)
    return _CUSTOM_OP(input, weight, float(eps), False, out=out)


def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,  # noqa: A002
                  out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """As ``rmsnorm`` with Gemma's weight form ``(1 + weight)``."""
    _check_inputs("gemma_rmsnorm", input, weight, eps, out)
    return _CUSTOM_OP(input, weight, float(eps), True, out=out)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
