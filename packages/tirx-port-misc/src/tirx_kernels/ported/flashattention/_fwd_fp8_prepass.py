# SPDX-License-Identifier: Apache-2.0
# FP8 K/V preparation for flash_attention4_fp4 (FA3's FP8 path, arXiv 2407.08608 sec. 3.3, transposes V inside the
# kernel; https://github.com/Dao-AILab/flash-attention commit 0251105a2fb19d2957484b7f023cd8c115286ced hopper/): read,
# not copied. The NVFP4 / MXFP8 decode follows tirx_kernels.core.quant_ref.
"""The pre-pass of ``flash_attention4_fp4`` (before the attention kernel) in torch: the specification of the op's
TIRx pre-pass kernels (``_fwd_fp8_transpose``, ``_fwd_fp8_requant``: byte for byte), the oracle's and the tests' path,
and the op's requantization under torch.compile.

- ``transpose_v``: V e4m3 [B, Sk, Hkv, D] -> V^T [B, Hkv, D, Sk16] (``Sk16`` = Sk rounded up to 16, zero keys past
  Sk), because 8-bit wgmma takes its B operand K-major only; inside each group of 16 keys the columns are in
  ``V_KEY_ORDER`` (the kernel's P registers hold the keys in that order: ``_fwd_fp8`` module docstring).
- ``dequantize_kv``: NVFP4 (packed e2m1 + e4m3 scale per 16 + a global scale) and MXFP8 (e4m3 + ue8m0 per 32)
  K/V requantized to e4m3 with one fp32 descale per (batch, kv head), taken from the block scales alone (no amax
  pass over the data): NVFP4 6 max(scale) / global_scale / 448, MXFP8 2^(max code - 127), which makes MXFP8's
  requantization exact but for values that fall into e4m3's subnormals.

Cost (the TIRx kernels, one pass each): V^T reads and writes V once; NVFP4 / MXFP8 -> e4m3 reads 0.5 + 1/16 (1 + 1/32)
B and writes 1 B an element of K and V. Decoding inside the producer warpgroup (FA3 transposes V there) would save
both; ``test_prepass_cost_at_s8192`` (GPU) measures them."""

from __future__ import annotations

import torch

from tirx_kernels.core import quant_ref

E4M3_MAX = 448.0
KEY_GROUP = 16
# Position p of a 16-key group in V^T holds key V_KEY_ORDER[p]: p = 4 t + e (t = lane % 4 of the quad, e the byte of
# the P register) takes accumulator column 8 (e // 2) + 2 t + e % 2.
V_KEY_ORDER = tuple(8 * (e // 2) + 2 * t + e % 2 for t in range(4) for e in range(4))
KV_FORMATS = ("e4m3", "nvfp4", "mxfp8")


def transpose_v(v: torch.Tensor) -> torch.Tensor:
    """V [B, Sk, Hkv, D] float8_e4m3fn -> V^T [B, Hkv, D, Sk16] float8_e4m3fn, contiguous (module docstring).

    One strided copy: ``V_KEY_ORDER`` maps position ``4 t + 2 e1 + e0`` to key ``8 e1 + 2 t + e0``, a permutation of
    the (2, 4, 2) digits of the key's index in its group, so it is a permute of a view, not a gather; the ragged last
    group goes through a zero-padded copy."""
    B, Sk, H, D = v.shape
    groups, tail = divmod(Sk, KEY_GROUP)
    out = torch.empty((B, H, D, groups + (tail > 0), KEY_GROUP), dtype=torch.uint8, device=v.device)
    src = v.view(torch.uint8)

    def put(dst, keys):  # keys [B, n * 16, H, D] -> dst [B, H, D, n, 16] in V_KEY_ORDER
        n = keys.shape[1] // KEY_GROUP
        dst.unflatten(-1, (4, 2, 2)).copy_(keys.view(B, n, 2, 4, 2, H, D).permute(0, 5, 6, 1, 3, 2, 4))

    if groups:
        put(out[:, :, :, :groups], src[:, :groups * KEY_GROUP])
    if tail:
        last = torch.zeros((B, KEY_GROUP, H, D), dtype=torch.uint8, device=v.device)
        last[:, :tail] = src[:, groups * KEY_GROUP:]
        put(out[:, :, :, groups:], last)
    return out.view(B, H, D, -1).view(torch.float8_e4m3fn)


def quantize_per_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [B, S, H, D] -> (e4m3 [B, S, H, D], descale fp32 [B, H]) with x ~ e4m3 * descale, descale = amax / 448
    of each (batch, head) (1 where the head is all zeros); RNE, clamped to +-448."""
    amax = x.abs().amax(dim=(1, 3))
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (x / descale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, descale.float().contiguous()


def decode_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale) -> torch.Tensor:
    """[..., D/2] uint8 (element 2i in the low nibble), [..., D/16] e4m3 scales (uint8 or float8_e4m3fn) and the
    global scale -> fp32 [..., D] = e2m1 * scale / global_scale (``quant_ref.nvfp4_dequantize``'s rule)."""
    vals = quant_ref.e2m1_decode(quant_ref.unpack_e2m1(packed))
    sf = quant_ref.fp8_decode(scale.view(torch.uint8), "e4m3")
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device)
    return (vals.unflatten(-1, (-1, quant_ref.NVFP4_BLOCK)) * (sf / gs)[..., None]).flatten(-2)


def decode_mxfp8(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[..., D] e4m3 and [..., D/32] ue8m0 codes (uint8) -> fp32 [..., D] = e4m3 * 2**(code - 127)."""
    x = quant_ref.fp8_decode(data.view(torch.uint8), "e4m3")
    s = quant_ref.ue8m0_decode(scale.view(torch.uint8))
    return (x.unflatten(-1, (-1, quant_ref.MX_BLOCK)) * s[..., None]).flatten(-2)


def head_factors(kv_format: str, scale: torch.Tensor, global_scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, kv head) from the block scales [B, S, H, D/block] alone: (the factor the requantization applies,
    the descale of the e4m3 result), both fp32 [B, H]. NVFP4: (448 / (6 max scale), 6 max scale / 448 /
    global_scale); MXFP8: (the largest ue8m0 code, as fp32; 2^(code - 127)). Scales are non-negative, so the largest
    code byte is the largest scale."""
    top = scale.view(torch.uint8).amax(dim=(1, 3))
    if kv_format == "mxfp8":
        return top.float().contiguous(), quant_ref.ue8m0_decode(top).contiguous()
    sf_max = quant_ref.fp8_decode(top, "e4m3")
    sf_max = torch.where(sf_max > 0, sf_max, torch.ones_like(sf_max))
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=scale.device)
    return (E4M3_MAX / 6.0 / sf_max).contiguous(), (sf_max * (6.0 / E4M3_MAX) / gs).float().contiguous()


def requantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 [B, S, H, D/2] + [B, S, H, D/16] -> (e4m3 [B, S, H, D], descale [B, H]): e2m1 * (scale * 448 / (6 max
    scale)), every value within +-448 (module docstring; ``_fwd_fp8_requant`` computes the same bytes)."""
    mult, descale = head_factors("nvfp4", scale, global_scale)
    sf = quant_ref.fp8_decode(scale.view(torch.uint8), "e4m3") * mult[:, None, :, None]
    vals = quant_ref.e2m1_decode(quant_ref.unpack_e2m1(packed)).unflatten(-1, (-1, quant_ref.NVFP4_BLOCK))
    return (vals * sf[..., None]).flatten(-2).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), descale


def requantize_mxfp8(data: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 [B, S, H, D] + ue8m0 [B, S, H, D/32] -> (e4m3, descale [B, H] = 2^(top - 127)): each block times
    2^(code - top) (exponents below -30 clamped: those products round to zero either way), exact unless it lands in
    e4m3's subnormals."""
    top, descale = head_factors("mxfp8", scale)
    d = (scale.view(torch.uint8).float() - top[:, None, :, None]).clamp_min(-30.0)
    shift = torch.ldexp(torch.ones_like(d), d)
    x = quant_ref.fp8_decode(data.view(torch.uint8), "e4m3").unflatten(-1, (-1, quant_ref.MX_BLOCK))
    return (x * shift[..., None]).flatten(-2).to(torch.float8_e4m3fn), descale


def dequantize_kv(x: torch.Tensor, kv_format: str, scale=None, global_scale=None) -> tuple[torch.Tensor,
                                                                                              torch.Tensor | None]:
    """One of K / V in ``kv_format`` -> (e4m3 [B, S, Hkv, D], descale [B, Hkv] or None for e4m3 input, whose
    descale is the caller's)."""
    if kv_format == "e4m3":
        return x, None
    if kv_format == "nvfp4":
        return requantize_nvfp4(x, scale, global_scale)
    if kv_format == "mxfp8":
        return requantize_mxfp8(x, scale)
    raise ValueError(f"dequantize_kv: kv_format {kv_format!r} is not one of {KV_FORMATS}")
