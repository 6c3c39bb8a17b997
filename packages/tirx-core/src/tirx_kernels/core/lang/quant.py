# SPDX-License-Identifier: Apache-2.0
"""Exact FP8 / FP4 encoders and scale-factor layouts for ``@T.prim_func`` bodies (parse-time helpers).

The rules are FlashInfer's quantizers (flashinfer-ai/flashinfer f2e04400e330fb2debe0bf8730d9424a1d37927f:
``flashinfer/quantization/quantization_cute_dsl_utils.py``, ``flashinfer/cute_dsl/fp4_common.py`` and the
TRT-LLM ``quantization_utils.cuh`` they mirror), restated here; ``tirx_kernels.core.quant_ref`` is the same
specification in torch, and the tests check every helper against it bit for bit.

Where FlashInfer's default path uses ``rcp.approx.ftz`` (an approximate reciprocal whose last bit is the
hardware's), these helpers follow its IEEE path instead (``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1``, the
"TE-exact" recipe: ``div.rn`` / ``mul.rn``), so that a torch encoder on any device reproduces every byte.

Expressions are returned; statements (the PTX conversions, which need a destination register) go through
``T.evaluate``. sm_90 has ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32`` but no e2m1 or ue8m0 conversion: those are
compares and bit arithmetic here.
"""

from __future__ import annotations

from pathlib import Path

from tvm.script import tirx as T

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
# fp32(1/6) and fp32(1/448), rounded to nearest: FlashInfer's IEEE NVFP4 path multiplies by 0x3E2AAAAB, and its
# MXFP8 kernel by Float32(1.0 / 448.0).
RCP_E2M1_MAX_BITS = 0x3E2AAAAB
RCP_E4M3_MAX_BITS = 0x3B124925
FLT_MAX_BITS = 0x7F7FFFFF

NVFP4_BLOCK = 16  # elements per e4m3 scale factor
MX_BLOCK = 32  # elements per ue8m0 scale factor (MXFP4, MXFP8)

SF_LAYOUTS = ("linear", "128x4", "8x4")

# CPU stand-ins for the PTX conversions used here, for ``tirx_kernels.core.emulate`` (its ``cuda_cpu.h`` does not
# carry them yet): pass ``emulate_cxxflags()`` to the emulator's compile flags.
EMULATE_STANDINS = Path(__file__).with_name("quant_cpu.h")


def emulate_cxxflags() -> list[str]:
    """g++ flags that force-include ``EMULATE_STANDINS`` (its content hash in a define, so cached executables
    rebuild when it changes)."""
    import hashlib

    digest = hashlib.sha256(EMULATE_STANDINS.read_bytes()).hexdigest()[:12]
    return ["-include", str(EMULATE_STANDINS), f"-DTIRX_QUANT_STANDINS={digest}"]


def _f32(bits: int):
    return T.cuda.uint_as_float(T.uint32(bits))


def f32_bits(x):
    """The IEEE bits of an fp32 expression, as ``uint32``."""
    return T.reinterpret("uint32", x)


# --------------------------------------------------------------------------------------------- FP8 (e4m3 / e5m2)
def fp8x2(dst, hi, lo, fmt: str = "e4m3"):
    """``dst`` (a ``uint16`` local element) <- two fp32 values as FP8: ``lo`` in the low byte (the lower address),
    ``hi`` in the high byte. One ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32``: round to nearest even, finite values
    beyond the format's maximum (and +-inf) saturate to +-max (448 / 57344), NaN gives the canonical NaN 0x7F,
    the sign of zero is kept."""
    if fmt == "e4m3":
        T.evaluate(T.ptx.cvt.rn.satfinite.e4m3x2.f32(dst, hi, lo))
    elif fmt == "e5m2":
        T.evaluate(T.ptx.cvt.rn.satfinite.e5m2x2.f32(dst, hi, lo))
    else:
        raise ValueError(f"quant.fp8x2: fmt must be 'e4m3' or 'e5m2', got {fmt!r}")


def e4m3_to_f32(code):
    """The exact fp32 value of an e4m3 byte (``uint32`` expression, low 8 bits used; 0x7F / 0xFF (NaN) are not
    expected: a scale factor is finite). Bit arithmetic: normals rebias the exponent (7 -> 127), subnormals are
    ``m * 2**-9``."""
    e = (code >> T.uint32(3)) & T.uint32(15)
    m = code & T.uint32(7)
    sign = (code & T.uint32(0x80)) << T.uint32(24)
    normal = T.cuda.uint_as_float(sign | ((e + T.uint32(120)) << T.uint32(23)) | (m << T.uint32(20)))
    sub = T.cuda.uint_as_float(sign | f32_bits(T.Cast("float32", m) * T.float32(2.0 ** -9)))
    return T.if_then_else(e == T.uint32(0), sub, normal)


# --------------------------------------------------------------------------------------------------- e2m1 (FP4)
# e2m1 magnitudes by code: 0, 0.5, 1, 1.5, 2, 3, 4, 6. A value exactly on a midpoint goes to the even code (RNE):
# 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 (the midpoints, ">" where the lower code
# is even, ">=" where the upper one is: quant_ref's rule).
E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
_E2M1_MAGIC_BIAS = 22 << 23  # 2**22 * 2**e: the fp32 whose ulp is the e2m1 step 2**(e - 1) of binade 2**e


def e2m1(x):
    """The e2m1 code (``uint32`` in 0..15: bit 3 the sign, bits 0-2 the magnitude) of an fp32 value, as
    ``cvt.rn.satfinite.e2m1x2.f32`` defines it on sm_100: round to nearest even, |x| > 5 (and +-inf) saturate to
    +-6, the sign bit is kept (also for values that round to zero). NaN has no e2m1 code: it gives +-0 (its sign
    bit); FlashInfer's amax ignores NaN too.

    sm_90 has no e2m1 conversion. Counting the seven midpoints passed (a compare and an add each) cost about 20
    SASS instructions an element, which made the FP4 quantizers instruction-bound (2026-12-07 H100: 52-56 % of
    the copy bandwidth). Here the fp32 adder rounds instead: e2m1's step in the binade ``[2**e, 2**(e+1))`` is
    ``2**(e-1)`` (0.5 below 2, 1 in [2, 4), 2 from 4 up), and ``a + M`` with ``M = 2**(22 + k)``, ``k =
    clamp(e, 0, 2)`` (the ulp of M is that step, ``a + M < 2 M``) rounds ``a`` to the step, ties to an even
    multiple, which is e2m1's even code; the multiple ``j = bits(a + M) - bits(M)`` gives the code ``j + 2 k``.
    ``a = min(max(0, |x|), 6)`` saturates first (every |x| > 5, +-inf included, rounds to 6 as 6 does) and sends
    NaN to 0 (``fmaxf`` returns the other operand; under ``core.emulate`` ``std::max(0, NaN)``: ``0 < NaN`` is
    false, 0), so no select follows the rounding (one became a branch an element in the SASS). About 9
    instructions; an |x| the GPU flushes to zero still rounds to code 0."""
    return ((f32_bits(x) >> T.uint32(28)) & T.uint32(8)) | _e2m1_magnitude(x)


def _e2m1_magnitude(x):
    """Bits 0-2 of :func:`e2m1` (its magnitude code, 0..7)."""
    a = T.min(T.max(T.float32(0), T.fabs(x)), T.float32(E2M1_MAX))
    e = T.max(f32_bits(a), T.uint32(0x3F800000)) & T.uint32(0x7F800000)  # 2**k, k in 0..2 (a <= 6)
    m = e + T.uint32(_E2M1_MAGIC_BIAS)
    return f32_bits(a + T.cuda.uint_as_float(m)) - (m + T.uint32(254)) + (e >> T.uint32(22))  # e >> 22: 254 + 2 k


def e2m1x8(vals):
    """Eight fp32 values -> eight e2m1 codes packed in a ``uint32``; ``vals[0]`` in the low nibble (the lowest
    address once stored little-endian), as FlashInfer packs ``cvt.rn.satfinite.e2m1x2.f32 d, v1, v0``. The
    magnitudes are summed shifted (disjoint bits: one LEA each) and each sign bit moved to bit ``4 i + 3`` by one
    shift and one masked OR (sign and magnitude joined per element first cost a fourth instruction)."""
    if len(vals) != 8:
        raise ValueError(f"quant.e2m1x8: expected 8 values, got {len(vals)}")
    mags = _e2m1_magnitude(vals[0])
    for i in range(1, 8):
        mags = mags + (_e2m1_magnitude(vals[i]) << T.uint32(4 * i))
    signs = f32_bits(vals[7]) & T.uint32(0x80000000)
    for i in range(7):
        signs = signs | ((f32_bits(vals[i]) >> T.uint32(28 - 4 * i)) & T.uint32(8 << (4 * i)))
    return mags | signs


# ------------------------------------------------------------------------------------------------------- ue8m0
def ue8m0_ceil(v):
    """The ue8m0 scale (``uint32`` 0..254) of an fp32 value, rounding up: FlashInfer's ``float_to_ue8m0_fast``
    (= ``__nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundPosInf)``). The biased exponent, plus one where the
    mantissa is not zero -- except a subnormal at most 2**-127, which is code 0 (2**-127) already; clamped to 254
    (255 is NaN in e8m0, so +inf / NaN give 254); 0 for v <= 0."""
    bits = f32_bits(v)
    e = (bits >> T.uint32(23)) & T.uint32(255)
    m = bits & T.uint32(0x7FFFFF)
    bump = T.Cast("uint32", T.And(m != T.uint32(0), T.Or(e != T.uint32(0), m > T.uint32(0x400000))))
    r = T.min(e + bump, T.uint32(254))
    return T.if_then_else(v <= T.float32(0), T.uint32(0), r)


def ue8m0_inv_scale(code):
    """``2**(127 - code)`` as fp32 built from bits (FlashInfer's ``ue8m0_to_inv_scale_fast``): exponent field
    ``254 - code``, so code 254 gives 0.0 (the subnormal 2**-127 is not formed); 0.0 for code 0."""
    inv = T.cuda.uint_as_float((T.uint32(254) - code) << T.uint32(23))
    return T.if_then_else(code == T.uint32(0), T.float32(0), inv)


# ------------------------------------------------------------------------------------------------ block scales
def nvfp4_block_scale(amax, global_scale):
    """The fp32 NVFP4 block scale before its e4m3 encoding (FlashInfer IEEE path ``nvfp4_scale_from_amax_rn``):
    ``amax * (global_scale * fp32(1/6))``, two round-to-nearest products; exactly 0 where amax is 0. Encode it
    with ``fp8x2(..., fmt="e4m3")`` (saturating at 448)."""
    s = amax * (global_scale * _f32(RCP_E2M1_MAX_BITS))
    return T.if_then_else(amax == T.float32(0), T.float32(0), s)


def nvfp4_output_scale(sf_value, global_scale, amax):
    """The factor applied to each element before its e2m1 encoding (FlashInfer ``nvfp4_compute_output_scale_rn``):
    ``min(1 / (sf_value * (1 / global_scale)), FLT_MAX)`` with ``sf_value`` the decoded e4m3 scale (two
    ``div.rn``, one ``mul.rn``; an e4m3 scale that underflowed to 0 gives FLT_MAX); 0 where amax is 0."""
    r = T.float32(1) / (sf_value * (T.float32(1) / global_scale))
    r = T.if_then_else(r < _f32(FLT_MAX_BITS), r, _f32(FLT_MAX_BITS))  # PTX min.f32: NaN -> the other operand
    return T.if_then_else(amax == T.float32(0), T.float32(0), r)


def mxfp4_block_scale(amax):
    """The ue8m0 code of an MXFP4 block: ``ue8m0_ceil(amax * fp32(1/6))`` (FlashInfer multiplies by
    ``rcp.approx.ftz(6)``, whose result is the correctly rounded 0x3E2AAAAB)."""
    return ue8m0_ceil(amax * _f32(RCP_E2M1_MAX_BITS))


def mxfp8_block_scale(amax):
    """The ue8m0 code of an MXFP8 block: ``ue8m0_ceil(amax * fp32(1/448))`` (FlashInfer's
    ``INV_FLOAT8_E4M3_MAX``)."""
    return ue8m0_ceil(amax * _f32(RCP_E4M3_MAX_BITS))


def amax_step(acc, x):
    """``max(acc, |x|)`` ignoring NaN, as FlashInfer's ``max.f16x2`` / ``max.f32`` reductions do; start ``acc`` at 0
    (never NaN). ``max`` is ``fmaxf`` on the GPU (one FMNMX, which returns the other operand for a NaN) and
    ``std::max(acc, |x|)`` under ``core.emulate`` (``acc < NaN`` is false: acc); a compare and select cost two
    instructions and, nested, repeated the inner expression."""
    return T.max(acc, T.fabs(x))


# ---------------------------------------------------------------------------------------- scale-factor layouts
def sf_cols_padded(cols, layout: str):
    """Scale-factor columns as stored (K / block): padded to 4 in the swizzled layouts, as is."""
    if layout == "linear":
        return cols
    _check_layout(layout)
    return (cols + 3) // 4 * 4


def sf_rows_padded(rows, layout: str):
    """Scale-factor rows as stored: M padded to 128 (128x4) or 8 (8x4), as is (linear)."""
    if layout == "linear":
        return rows
    tile = 128 if layout == "128x4" else 8
    _check_layout(layout)
    return (rows + tile - 1) // tile * tile


def _check_layout(layout: str):
    if layout not in SF_LAYOUTS:
        raise ValueError(f"quant: scale-factor layout {layout!r} is not one of {SF_LAYOUTS}")


def sf_offset(row, col, cols_padded, layout: str):
    """Byte offset of scale factor (row, col) in the ``layout`` buffer (``cols_padded``: ``sf_cols_padded``).

    - linear: ``row * cols + col``.
    - 128x4 (FlashInfer ``compute_sf_index_swizzled_128x4``, the cuBLAS / CUTLASS block-scaled layout): tiles of
      128 rows x 4 columns, 512 bytes each, row-tiles outermost; inside a tile byte
      ``(row % 32) * 16 + (row % 128) // 32 * 4 + col % 4``.
    - 8x4 (``compute_sf_index_swizzled_8x4``): tiles of 8 rows x 4 columns, 32 bytes each, row-tiles outermost,
      ``(row % 8) * 4 + col % 4`` inside.

    Pass 64-bit ``row`` for buffers past 2**31 bytes.
    """
    if layout == "linear":
        return row * cols_padded + col
    if layout == "128x4":
        return ((row // 128) * (cols_padded * 128) + (col // 4) * 512 + (row % 32) * 16
                + (row % 128) // 32 * 4 + col % 4)
    if layout == "8x4":
        return (row // 8) * (cols_padded * 8) + (col // 4) * 32 + (row % 8) * 4 + col % 4
    _check_layout(layout)
