# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's FP8 input casts (deep_gemm/utils/math.py: per_token_cast_to_fp8, per_block_cast_to_fp8,
# ceil_to_ue8m0) and of the scale layout its SM90 GEMMs take (csrc/jit_kernels/impls/smxx_layout.hpp:
# get_mn_major_tma_aligned_tensor; csrc/utils/math.hpp: get_tma_aligned_size) at deepseek-ai/DeepGEMM
# 54e22612409371d6364144b69086735beb54e98b. DeepGEMM casts in torch; these are CUDA-core TIRx kernels for sm_90a.
"""The casts DeepGEMM's FP8 GEMMs take their inputs from, shared by ``per_token_cast_to_fp8`` and
``per_block_cast_to_fp8``.

The recipe (DeepGEMM's, in fp32): a block's ``amax = max(max|x|, 1e-4)`` (the clamp keeps an all-zero block's
scale finite), its scale ``sf = amax * fp32(1 / 448)``, or with ``use_ue8m0`` that scale rounded *up* to a
power of two (exponent + 1 where the mantissa is not zero, exponent clamped to 1..254), and the codes
``e4m3(x * (1 / sf))`` (round to nearest even; ``|x / sf| <= 448`` by construction, so saturation never acts on a
finite input). Blocks are 1x128 (per token, along K) or 128x128; a ragged last block counts only its valid
elements (DeepGEMM pads with zeros, which do not change the amax).

Why a multiply by ``fp32(1/448)`` and not the divide DeepGEMM's source writes (``x_amax / 448.0``): DeepGEMM runs that
line on CUDA tensors, where torch divides by a Python scalar as a multiply by its fp32 reciprocal. An IEEE divide gave
scales 1 ulp apart and so 1-code differences near ties in 0.01-0.1 % of the codes against torch on the GPU (2026-12-06,
H200: 131480 of 117440512 at 16384x7168), while agreeing with torch on the CPU. Kernel and oracle now do what DeepGEMM
does on the GPU, on either device.

Scale layouts, as the SM90 GEMM consumes them:
- per token: ``sfa [M, ceil(K/128)]`` fp32, **MN-major and TMA-aligned**: strides ``(1, align(M, 4))``
  (``get_mn_major_tma_aligned_tensor``: each 128-K block's column of M scales starts 16-byte aligned, so one TMA
  box of a tile's row scales is a contiguous run). The padding rows are not part of the tensor and are not written.
- per block: ``sfb [ceil(N/128), ceil(K/128)]`` fp32, row-major (DeepGEMM's SM90 check accepts it as is).

Kernels (one artifact per (input dtype, ue8m0), sizes at run time):
- per token: a half-warp per 1x128 block, 8 elements a lane (16-byte loads), amax by a width-16 butterfly, the
  8 codes of a lane stored as one 8-byte word pair; 16 blocks per 256-thread CTA.
- per block: a 256-thread CTA per 128x128 block; a half-warp per row, 8 rows per half-warp kept in registers
  (one read of the input), amax by a warp butterfly and a shared exchange of the 8 warps.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks

GRAN = 128  # DeepGEMM's SM90 recipe: 1x128 per-token and 128x128 per-block scales
E4M3_MAX = 448.0
INV_E4M3_MAX = 1.0 / E4M3_MAX  # rounded to fp32 where used: torch's scalar divide on CUDA (module docstring)
AMAX_FLOOR = 1e-4  # DeepGEMM's clamp of the amax (an all-zero block keeps a finite, non-zero scale)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
THREADS = 256
_VEC = 8  # 16-bit elements per lane (one 16-byte load)
_LANES = GRAN // _VEC  # lanes per 128-element run: a half-warp
_ROWS_PER_THREAD = GRAN // (THREADS // _LANES)  # per-block kernel: 8 rows per half-warp


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tma_aligned_size(x: int, element_size: int = 4) -> int:
    """DeepGEMM's ``get_tma_aligned_size``: ``x`` rounded up so that ``x`` elements fill whole 16-byte units."""
    unit = 16 // element_size
    return ceil_div(x, unit) * unit


def new_mn_major_sf(mn: int, k: int, device) -> torch.Tensor:
    """An fp32 ``[mn, ceil(k/128)]`` tensor with DeepGEMM's MN-major TMA-aligned strides ``(1, align(mn, 4))``."""
    return torch.empty_strided((mn, ceil_div(k, GRAN)), (1, tma_aligned_size(mn)), dtype=torch.float32,
                               device=device)


# ------------------------------------------------------------------------------------------------ oracles
def ceil_to_ue8m0_ref(sf: torch.Tensor) -> torch.Tensor:
    """fp32 ``sf`` rounded up to a power of two: exponent + 1 where the mantissa is not zero, clamped to 1..254."""
    bits = sf.abs().float().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exp.clamp(1, 254) << 23).view(torch.float32)


def _scale_and_codes(view: torch.Tensor, amax: torch.Tensor, use_ue8m0: bool):
    sf = amax.clamp(min=AMAX_FLOOR) * INV_E4M3_MAX  # fp32 scalar multiply on CPU and CUDA alike (module docstring)
    if use_ue8m0:
        sf = ceil_to_ue8m0_ref(sf)
    codes = (view.float() * (1.0 / sf)).to(torch.float8_e4m3fn)
    return sf, codes


def per_token_ref(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [M, K] e4m3, sf [M, ceil(K/128)] fp32 contiguous)`` by DeepGEMM's formulas (zero padding of a
    ragged last block)."""
    m, k = x.shape
    kp = ceil_div(k, GRAN) * GRAN
    padded = torch.zeros(m, kp, dtype=x.dtype, device=x.device)
    padded[:, :k] = x
    view = padded.view(m, kp // GRAN, GRAN)
    sf, codes = _scale_and_codes(view, view.abs().float().amax(dim=2, keepdim=True), use_ue8m0)
    return codes.view(m, kp)[:, :k].contiguous(), sf.view(m, kp // GRAN)


def per_block_ref(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [N, K] e4m3, sf [ceil(N/128), ceil(K/128)] fp32)`` by DeepGEMM's formulas."""
    n, k = x.shape
    np_, kp = ceil_div(n, GRAN) * GRAN, ceil_div(k, GRAN) * GRAN
    padded = torch.zeros(np_, kp, dtype=x.dtype, device=x.device)
    padded[:n, :k] = x
    view = padded.view(np_ // GRAN, GRAN, kp // GRAN, GRAN)
    sf, codes = _scale_and_codes(view, view.abs().float().amax(dim=(1, 3), keepdim=True), use_ue8m0)
    return codes.view(np_, kp)[:n, :k].contiguous(), sf.view(np_ // GRAN, kp // GRAN)


# ------------------------------------------------------------------------------------------------ device side
def _block_scale(amax, use_ue8m0: bool):
    """The fp32 scale of a block from its amax (see the module docstring)."""
    from tvm.script import tirx as T

    sf = T.max(amax, T.float32(AMAX_FLOOR)) * T.float32(INV_E4M3_MAX)
    if not use_ue8m0:
        return sf
    bits = T.reinterpret("uint32", sf)
    exp = ((bits >> T.uint32(23)) & T.uint32(0xFF)) + T.Cast("uint32", (bits & T.uint32(0x7FFFFF)) != T.uint32(0))
    return T.cuda.uint_as_float(T.min(T.max(exp, T.uint32(1)), T.uint32(254)) << T.uint32(23))


class _Run:
    """One lane's 8 consecutive elements of a 128-element run: 16-byte load, amax, encode, 8-byte store."""

    def __init__(self, dtype: str, rows: int):
        self.dtype, self.rows = dtype, rows

    def alloc(self):
        from tvm.script import tirx as T

        self.xr = T.alloc_local((4 * self.rows,), "uint32")
        self.out = T.alloc_local((2,), "uint32")
        self.pair = T.alloc_local((2,), "uint16")

    def load(self, X, i, elem, valid):  # noqa: N803
        """Run ``i``'s 8 elements from flat element offset ``elem`` (zeros where not ``valid``)."""
        from tirx_kernels.core.lang import vector

        vector.fill(self.xr, 4 * i, 4)
        vector.load_v4(self.xr, 4 * i, X.ptr_to([elem]), valid, cache="nc_stream")

    def amax(self, i, acc):
        from tirx_kernels.core.lang import quant, vector

        for w in range(4):
            lo, hi = vector.unpack2(self.xr[4 * i + w], self.dtype)
            acc = quant.amax_step(quant.amax_step(acc, lo), hi)
        return acc

    def store(self, Y, i, elem, valid, inv):  # noqa: N803
        """Encode run ``i`` times ``inv`` and store its 8 codes at byte offset ``elem`` of ``Y`` (uint32 words)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import quant, vector

        for w in range(2):
            a0, a1 = vector.unpack2(self.xr[4 * i + 2 * w], self.dtype)
            a2, a3 = vector.unpack2(self.xr[4 * i + 2 * w + 1], self.dtype)
            quant.fp8x2(self.pair[0], a1 * inv, a0 * inv, "e4m3")
            quant.fp8x2(self.pair[1], a3 * inv, a2 * inv, "e4m3")
            T.buffer_store(self.out, T.Cast("uint32", self.pair[0]) | (T.Cast("uint32", self.pair[1]) << T.uint32(16)),
                           [w])
        with T.If(valid):
            with T.Then():
                T.evaluate(T.ptx.st.global_.v2.b32(Y.ptr_to([elem // 4]), self.out[0], self.out[1]))


def _check_params(dtype: str, name: str):
    if dtype not in DTYPES:
        raise ValueError(f"{name}: dtype {dtype!r}: expected one of {sorted(DTYPES)}")


def build_per_token_kernel(dtype: str, use_ue8m0: bool, name: str):
    """A half-warp per (row, 128-K block); 16 blocks per CTA (grid ``ceil(M * ceil(K/128) / 16)``)."""
    from tvm.script import tirx as T

    _check_params(dtype, name)
    run = _Run(dtype, 1)
    per_cta = THREADS // _LANES

    def i64(v):
        return T.Cast("int64", v)

    @T.prim_func
    def per_token_cast(x_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, M: T.int32, K: T.int32,
                       sf_stride: T.int32, tiles: T.int32):
        x_len = T.int64()
        y_len = T.int64()
        s_len = T.int64()
        X = T.match_buffer(x_ptr, (x_len,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (y_len,), "uint32", align=8)
        S = T.match_buffer(s_ptr, (s_len,), "float32")
        T.device_entry()
        cta = T.cta_id([tiles])
        tid = T.thread_id([THREADS])
        run.alloc()
        amax = T.alloc_local((1,), "float32")
        sf = T.alloc_local((1,), "float32")

        nb = i64((K + GRAN - 1) // GRAN)
        blk_id = i64(cta) * per_cta + i64(tid // _LANES)
        row = blk_id // nb
        blk = blk_id % nb
        col = blk * GRAN + i64(tid % _LANES) * _VEC
        # NOTES: every lane of the warp reaches the shuffles below (a lane past the end loads nothing and
        # contributes 0), so the butterfly never waits on an exited lane.
        valid = T.And(row < i64(M), col < i64(K))
        elem = row * i64(K) + col
        run.load(X, 0, elem, valid)
        amax[0] = run.amax(0, T.float32(0))
        for step in range(4):  # the half-warp's butterfly: xor 8, 4, 2, 1 stays inside the half
            amax[0] = T.max(amax[0], T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), amax[0], 8 >> step, 32, 32))
        sf[0] = _block_scale(amax[0], use_ue8m0)
        run.store(Y, 0, elem, valid, T.float32(1) / sf[0])
        with T.If(T.And(tid % _LANES == 0, row < i64(M))):
            with T.Then():
                S[blk * i64(sf_stride) + row] = sf[0]

    return per_token_cast.with_attr("global_symbol", name)


def build_per_block_kernel(dtype: str, use_ue8m0: bool, name: str):
    """A CTA per 128x128 block (grid ``(ceil(K/128), ceil(N/128))``); half-warp ``h`` holds rows ``h + 16 r``."""
    from tvm.script import tirx as T

    _check_params(dtype, name)
    rows = _ROWS_PER_THREAD
    run = _Run(dtype, rows)
    warps = THREADS // 32
    stride = THREADS // _LANES  # rows between one half-warp's runs

    def i64(v):
        return T.Cast("int64", v)

    @T.prim_func
    def per_block_cast(x_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, N: T.int32, K: T.int32,
                       kb: T.int32, nb: T.int32):
        x_len = T.int64()
        y_len = T.int64()
        s_len = T.int64()
        X = T.match_buffer(x_ptr, (x_len,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (y_len,), "uint32", align=8)
        S = T.match_buffer(s_ptr, (s_len,), "float32")
        T.device_entry()
        bk, bn = T.cta_id([kb, nb])
        tid = T.thread_id([THREADS])
        run.alloc()
        amax = T.alloc_local((1,), "float32")
        sf = T.alloc_local((1,), "float32")
        part = T.alloc_shared((warps,), "float32")

        col = i64(bk) * GRAN + i64(tid % _LANES) * _VEC
        row0 = i64(bn) * GRAN + i64(tid // _LANES)
        amax[0] = T.float32(0)
        for r in T.unroll(rows):
            row = row0 + r * stride
            run.load(X, r, row * i64(K) + col, T.And(row < i64(N), col < i64(K)))
            amax[0] = run.amax(r, amax[0])
        amax[0] = T.cuda.warp_max(amax[0], 32)
        with T.If(tid % 32 == 0):
            with T.Then():
                part[tid // 32] = amax[0]
        T.evaluate(T.cuda.cta_sync())
        amax[0] = part[0]
        for w in range(1, warps):
            amax[0] = T.max(amax[0], part[w])
        sf[0] = _block_scale(amax[0], use_ue8m0)
        for r in T.unroll(rows):
            row = row0 + r * stride
            run.store(Y, r, row * i64(K) + col, T.And(row < i64(N), col < i64(K)), T.float32(1) / sf[0])
        with T.If(tid == 0):
            with T.Then():
                S[i64(bn) * i64(kb) + i64(bk)] = sf[0]

    return per_block_cast.with_attr("global_symbol", name)


# --------------------------------------------------------------------------------------------------- host side
def check_input(op: str, x: torch.Tensor, cuda: bool = True) -> None:
    """bf16 / fp16, 2-D, K a multiple of 8 (16-byte rows for the vector loads, 8-byte rows of codes)."""
    checks.tensor(op, "x", x, dtypes=tuple(DTYPES.values()), ndim=2, cuda=False)
    checks.multiple_of(op, "x.shape[1]", x.shape[1], _VEC, "rows are read 16 bytes and written 8 bytes at a time")
    if x.shape[0] * ceil_div(x.shape[1], GRAN) >= 2**31 - THREADS:
        raise checks.TirxInputError(f"{op}: argument 'x': {tuple(x.shape)} has too many scale blocks for one launch")
    if cuda:
        checks.tensor(op, "x", x, cuda=True)


def check_gran_k(op: str, gran_k: int) -> None:
    if gran_k != GRAN:
        raise checks.TirxInputError(f"{op}: argument 'gran_k': SM90 DeepGEMM's FP8 recipe scales 128-element "
                                    f"blocks, got {gran_k}")


def per_token_tiles(m: int, k: int) -> int:
    return max(1, ceil_div(m * ceil_div(k, GRAN), THREADS // _LANES))


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()


def run_per_token(fn, x: torch.Tensor, codes: torch.Tensor, sf: torch.Tensor) -> None:
    m, k = x.shape
    if m == 0 or k == 0:
        return
    fn(_contiguous(x).view(-1), codes.view(-1).view(torch.uint8).view(torch.uint32),
       sf.as_strided((sf.stride(1) * (sf.shape[1] - 1) + m,), (1,)), m, k, sf.stride(1), per_token_tiles(m, k))


def run_per_block(fn, x: torch.Tensor, codes: torch.Tensor, sf: torch.Tensor) -> None:
    n, k = x.shape
    if n == 0 or k == 0:
        return
    fn(_contiguous(x).view(-1), codes.view(-1).view(torch.uint8).view(torch.uint32), sf.view(-1), n, k, sf.shape[1],
       sf.shape[0])


def random_input(m: int, k: int, dtype, seed: int = 0, device="cpu") -> torch.Tensor:
    """Rows of widely different magnitude (1e-3 .. 1e2), one all-zero row and one row of tiny values where M
    allows (the amax clamp acts there)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device) * torch.logspace(-3, 2, max(m, 1), device=device)[:m, None]
    if m > 2:
        x[1] = 0
        x[2] = x[2] * 1e-6
    return x.to(dtype)
