# SPDX-License-Identifier: Apache-2.0
"""Torch reference encoders: the bit-exact specification of ``tirx_kernels.core.lang.quant`` (CPU or GPU).

FlashInfer's quantizers (flashinfer-ai/flashinfer f2e04400e330fb2debe0bf8730d9424a1d37927f,
``flashinfer/quantization/``) restated as torch ops, in their IEEE ("TE-exact", no ``rcp.approx``) form, so that
every byte is reproducible on any device:

- NVFP4: e2m1 codes, one e4m3 scale per 16 elements, a global fp32 scale. ``sf = e4m3(amax * (gs * fp32(1/6)))``;
  each element is ``e2m1(x * min(1 / (f32(sf) * (1 / gs)), FLT_MAX))`` (0 where amax is 0).
- MXFP4: e2m1 codes, one ue8m0 scale per 32 elements: ``e = ceil_ue8m0(amax * fp32(1/6))``, elements
  ``e2m1(x * 2**(127 - e))`` (0 for e == 0).
- MXFP8: e4m3 codes, one ue8m0 scale per 32: ``e = ceil_ue8m0(amax * fp32(1/448))``, elements
  ``e4m3(x * 2**(127 - e))``.

amax ignores NaN. Packing: two e2m1 codes a byte, the even element in the low nibble. Scale layouts: ``linear``
``[M, K/block]``; ``128x4`` / ``8x4`` swizzled (M padded to 128 / 8, K/block padded to 4, padding bytes 0), as a
flat uint8 buffer -- ``sf_swizzle`` / ``sf_unswizzle`` convert.

Every function takes and returns tensors on the input's device; float math is fp32 (products and quotients
rounded to nearest, never fused), which is what the kernels do.
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
NVFP4_BLOCK = 16
MX_BLOCK = 32
SF_LAYOUTS = ("linear", "128x4", "8x4")

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# (threshold, inclusive): the code is the number of thresholds |x| passes; ties go to the even code.
_E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
                    (5.0, False))


def _bits_to_f32(bits: int, device) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int32, device=device).view(torch.float32)[0]


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """The IEEE bits of fp32 ``x`` as int64 (non-negative)."""
    return x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def rcp_e2m1_max(device=None) -> torch.Tensor:
    """fp32(1/6) = 0x3E2AAAAB."""
    return _bits_to_f32(0x3E2AAAAB, device)


def rcp_e4m3_max(device=None) -> torch.Tensor:
    """fp32(1/448) = 0x3B124925."""
    return _bits_to_f32(0x3B124925, device)


# ------------------------------------------------------------------------------------------------------- e2m1
def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8 0..15) of fp32 ``x``: RNE, saturating at +-6 (inf too), sign kept, NaN -> +-0."""
    x = x.to(torch.float32)
    a = x.abs()
    mag = torch.zeros(x.shape, dtype=torch.int64, device=x.device)
    for t, inclusive in _E2M1_THRESHOLDS:
        mag += (a >= t) if inclusive else (a > t)
    sign = (f32_bits(x) >> 28) & 8
    return (sign | mag).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of e2m1 codes (uint8, low 4 bits)."""
    c = codes.to(torch.int64)
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=codes.device)
    v = table[c & 7]
    return torch.where((c & 8) != 0, -v, v)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """``[..., K]`` codes -> ``[..., K/2]`` uint8, element 2i in the low nibble."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """``[..., K/2]`` uint8 -> ``[..., K]`` codes."""
    p = packed.view(torch.uint8)
    return torch.stack([p & 15, p >> 4], dim=-1).flatten(-2)


# -------------------------------------------------------------------------------------------------------- FP8
def fp8_encode(x: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """FP8 codes (uint8) of ``x`` as ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32``: RNE, +-max for finite overflow and
    +-inf, NaN -> 0x7F, sign of zero kept."""
    x = x.to(torch.float32)
    if fmt == "e4m3":
        dtype, mx = torch.float8_e4m3fn, E4M3_MAX
    elif fmt == "e5m2":
        dtype, mx = torch.float8_e5m2, E5M2_MAX
    else:
        raise ValueError(f"fp8_encode: fmt must be 'e4m3' or 'e5m2', got {fmt!r}")
    codes = x.clamp(-mx, mx).to(dtype).view(torch.uint8)
    return torch.where(torch.isnan(x), torch.full_like(codes, 0x7F), codes)


def fp8_decode(codes: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    return codes.view(torch.uint8).contiguous().view(dtype).to(torch.float32)


# ------------------------------------------------------------------------------------------------------ ue8m0
def ue8m0_ceil(v: torch.Tensor) -> torch.Tensor:
    """ue8m0 codes (uint8 0..254) rounding ``v`` up to a power of two (FlashInfer ``float_to_ue8m0_fast``): 0 for
    v <= 0, 254 for +inf / NaN, a subnormal at most 2**-127 -> 0."""
    v = v.to(torch.float32)
    bits = f32_bits(v)
    e = (bits >> 23) & 255
    m = bits & 0x7FFFFF
    bump = (m != 0) & ((e != 0) | (m > 0x400000))
    r = torch.clamp(e + bump.to(torch.int64), max=254)
    return torch.where(v <= 0, torch.zeros_like(r), r).to(torch.uint8)


def ue8m0_inv_scale(code: torch.Tensor) -> torch.Tensor:
    """``2**(127 - code)`` built from bits (exponent field 254 - code: code 254 -> 0.0), 0 for code 0."""
    c = code.to(torch.int64)
    inv = ((254 - c) << 23).to(torch.int32).view(torch.float32)
    return torch.where(c == 0, torch.zeros_like(inv), inv)


def ue8m0_decode(code: torch.Tensor) -> torch.Tensor:
    """``2**(code - 127)`` (code 0: 2**-127, a subnormal), as fp32."""
    return torch.exp2(code.to(torch.float32) - 127.0)


# --------------------------------------------------------------------------------------------- scale layouts
def sf_padded_shape(rows: int, cols: int, layout: str) -> tuple[int, int]:
    """(rows, cols) of the scale buffer as stored: padded to (128, 4) / (8, 4) when swizzled."""
    if layout == "linear":
        return rows, cols
    if layout not in SF_LAYOUTS:
        raise ValueError(f"scale-factor layout {layout!r} is not one of {SF_LAYOUTS}")
    tile = 128 if layout == "128x4" else 8
    return -(-rows // tile) * tile, -(-cols // 4) * 4


def sf_offsets(rows: int, cols: int, layout: str, device=None) -> torch.Tensor:
    """``[rows, cols]`` int64 byte offset of each scale factor in the ``layout`` buffer (see quant.sf_offset)."""
    _, cp = sf_padded_shape(rows, cols, layout)
    r = torch.arange(rows, device=device, dtype=torch.int64)[:, None]
    c = torch.arange(cols, device=device, dtype=torch.int64)[None, :]
    if layout == "linear":
        return r * cols + c
    if layout == "128x4":
        return (r // 128) * (cp * 128) + (c // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4
    return (r // 8) * (cp * 8) + (c // 4) * 32 + (r % 8) * 4 + c % 4


def sf_swizzle(sf: torch.Tensor, layout: str) -> torch.Tensor:
    """``[M, C]`` uint8 scales -> the ``layout`` buffer (flat uint8, padding 0; linear: ``sf`` as is)."""
    if layout == "linear":
        return sf.contiguous()
    rows, cols = sf.shape
    pr, pc = sf_padded_shape(rows, cols, layout)
    out = torch.zeros(pr * pc, dtype=torch.uint8, device=sf.device)
    out[sf_offsets(rows, cols, layout, sf.device).flatten()] = sf.reshape(-1).view(torch.uint8)
    return out


def sf_unswizzle(buf: torch.Tensor, rows: int, cols: int, layout: str) -> torch.Tensor:
    """The ``layout`` buffer -> ``[rows, cols]`` uint8 scales."""
    if layout == "linear":
        return buf.reshape(rows, cols)
    return buf.reshape(-1).view(torch.uint8)[sf_offsets(rows, cols, layout, buf.device)]


# ------------------------------------------------------------------------------------------------ quantizers
def block_amax(x: torch.Tensor, block: int) -> torch.Tensor:
    """``[M, K]`` -> ``[M, K/block]`` fp32 max |x| per block, NaN ignored (0 for an all-NaN block)."""
    a = x.to(torch.float32).abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.reshape(*x.shape[:-1], x.shape[-1] // block, block).amax(-1)


def _check_k(k: int, block: int, what: str):
    if k % block:
        raise ValueError(f"{what}: K={k} is not a multiple of the scale block ({block})")


def nvfp4_quantize(x: torch.Tensor, global_scale, layout: str = "128x4") -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 (IEEE path): ``([M, K/2] uint8 packed e2m1, scales in ``layout`` as uint8)``; ``global_scale``: one
    value, or one per row."""
    m, k = x.shape
    _check_k(k, NVFP4_BLOCK, "nvfp4_quantize")
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(-1, 1)
    amax = block_amax(x, NVFP4_BLOCK)
    s = amax * (gs * rcp_e2m1_max(x.device))
    s = torch.where(amax == 0, torch.zeros_like(s), s)
    sf = fp8_encode(s, "e4m3")
    sfv = fp8_decode(sf, "e4m3")
    flt_max = torch.tensor(torch.finfo(torch.float32).max, device=x.device)
    out_scale = torch.fmin(1.0 / (sfv * (1.0 / gs)), flt_max)
    out_scale = torch.where(amax == 0, torch.zeros_like(out_scale), out_scale)
    xs = x.to(torch.float32).reshape(m, k // NVFP4_BLOCK, NVFP4_BLOCK) * out_scale[..., None]
    return pack_e2m1(e2m1_encode(xs.reshape(m, k))), sf_swizzle(sf, layout)


def nvfp4_dequantize(packed: torch.Tensor, sf: torch.Tensor, global_scale, m: int, k: int,
                     layout: str = "128x4") -> torch.Tensor:
    """fp32 ``[M, K]``: ``e2m1 * f32(sf) / global_scale``."""
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device).reshape(())
    scale = fp8_decode(sf_unswizzle(sf, m, k // NVFP4_BLOCK, layout), "e4m3") / gs
    v = e2m1_decode(unpack_e2m1(packed)).reshape(m, k // NVFP4_BLOCK, NVFP4_BLOCK)
    return (v * scale[..., None]).reshape(m, k)


def mxfp4_quantize(x: torch.Tensor, layout: str = "128x4") -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4: ``([M, K/2] uint8 packed e2m1, ue8m0 scales in ``layout``)``."""
    m, k = x.shape
    _check_k(k, MX_BLOCK, "mxfp4_quantize")
    e = ue8m0_ceil(block_amax(x, MX_BLOCK) * rcp_e2m1_max(x.device))
    xs = x.to(torch.float32).reshape(m, k // MX_BLOCK, MX_BLOCK) * ue8m0_inv_scale(e)[..., None]
    return pack_e2m1(e2m1_encode(xs.reshape(m, k))), sf_swizzle(e, layout)


def mxfp4_dequantize(packed: torch.Tensor, sf: torch.Tensor, m: int, k: int, layout: str = "128x4"):
    scale = ue8m0_decode(sf_unswizzle(sf, m, k // MX_BLOCK, layout))
    v = e2m1_decode(unpack_e2m1(packed)).reshape(m, k // MX_BLOCK, MX_BLOCK)
    return (v * scale[..., None]).reshape(m, k)


def mxfp8_quantize(x: torch.Tensor, layout: str = "128x4") -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8: ``([M, K] uint8 e4m3 codes, ue8m0 scales in ``layout``)``."""
    m, k = x.shape
    _check_k(k, MX_BLOCK, "mxfp8_quantize")
    e = ue8m0_ceil(block_amax(x, MX_BLOCK) * rcp_e4m3_max(x.device))
    xs = x.to(torch.float32).reshape(m, k // MX_BLOCK, MX_BLOCK) * ue8m0_inv_scale(e)[..., None]
    return fp8_encode(xs.reshape(m, k), "e4m3"), sf_swizzle(e, layout)


def mxfp8_dequantize(codes: torch.Tensor, sf: torch.Tensor, m: int, k: int, layout: str = "128x4"):
    scale = ue8m0_decode(sf_unswizzle(sf, m, k // MX_BLOCK, layout))
    v = fp8_decode(codes.reshape(m, k), "e4m3").reshape(m, k // MX_BLOCK, MX_BLOCK)
    return (v * scale[..., None]).reshape(m, k)


def nvfp4_quantize_per_token(x: torch.Tensor, global_scale_inv, layout: str = "128x4"):
    """NVFP4 with a per-row global scale (FlashInfer's per-token path, IEEE recipe): ``(packed, scales,
    per_token_scale [M] fp32)``. Per row: ``enc = min((1 / gsi) / row_amax, FLT_MAX)`` (1 where that is 0,
    FLT_MAX for an all-zero row), ``per_token_scale = 1 / enc`` (0 for an all-zero row); the row's blocks are
    ``nvfp4_quantize`` with global scale ``enc``."""
    m, k = x.shape
    _check_k(k, NVFP4_BLOCK, "nvfp4_quantize_per_token")
    gsi = torch.as_tensor(global_scale_inv, dtype=torch.float32, device=x.device).reshape(())
    flt_max = torch.tensor(torch.finfo(torch.float32).max, device=x.device)
    row_amax = block_amax(x, k)[:, 0]
    ratio = torch.fmin((1.0 / gsi) / row_amax, flt_max)
    enc = torch.where(ratio == 0, torch.ones_like(ratio), ratio)
    enc = torch.where(row_amax == 0, flt_max.expand_as(enc), enc)
    pts = torch.where(row_amax == 0, torch.zeros_like(enc), 1.0 / enc)
    packed, sf = nvfp4_quantize(x, enc, layout)
    return packed, sf, pts
