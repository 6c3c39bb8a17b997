# SPDX-License-Identifier: Apache-2.0
"""``core.quant_ref``: the torch encoders on known values, midpoints, saturation, +-inf / NaN, layouts and
quantize -> dequantize round trips."""

import pytest
import torch

from tirx_kernels.core import quant_ref as Q


def test_e2m1_known_values_and_round_trip():
    vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = Q.e2m1_encode(vals)
    assert codes.tolist() == list(range(8))
    assert Q.e2m1_encode(-vals).tolist() == [c | 8 for c in range(8)]
    assert torch.equal(Q.e2m1_decode(Q.e2m1_encode(vals)), vals)
    all_codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(Q.e2m1_encode(Q.e2m1_decode(all_codes)), all_codes)


def test_e2m1_midpoints_round_to_even():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert Q.e2m1_decode(Q.e2m1_encode(mids)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    up = torch.nextafter(mids, torch.full_like(mids, 10.0))
    assert Q.e2m1_decode(Q.e2m1_encode(up)).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    down = torch.nextafter(mids, torch.zeros_like(mids))
    assert Q.e2m1_decode(Q.e2m1_encode(down)).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]


def test_e2m1_saturation_inf_nan_and_signed_zero():
    x = torch.tensor([5.5, 6.0, 7.0, 1e30, float("inf"), -float("inf"), -0.0, -0.1, float("nan")])
    assert Q.e2m1_encode(x).tolist() == [7, 7, 7, 7, 7, 15, 8, 8, 0]


def test_pack_unpack():
    codes = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = Q.pack_e2m1(codes)
    assert packed.shape == (3, 32) and int(packed[0, 0]) == int(codes[0, 0]) | (int(codes[0, 1]) << 4)
    assert torch.equal(Q.unpack_e2m1(packed), codes)


def test_fp8_saturation_nan_and_rne():
    x = torch.tensor([448.0, 460.0, 464.0, 1e9, float("inf"), -float("inf"), float("nan"), -0.0, 2.0 ** -10])
    assert Q.fp8_encode(x, "e4m3").tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x80, 0x00]
    # 2**-10 is the midpoint between 0 and the smallest subnormal 2**-9: to even (0); a bit above goes up.
    assert int(Q.fp8_encode(torch.tensor([2.0 ** -10 * 1.0001]), "e4m3")) == 1
    # 1.0625 lies halfway between 1.0 (mantissa 0, even) and 1.125.
    assert Q.fp8_decode(Q.fp8_encode(torch.tensor([1.0625, 1.1875]))).tolist() == [1.0, 1.25]
    y = torch.tensor([57344.0, 1e9, float("inf"), float("nan")])
    assert Q.fp8_encode(y, "e5m2").tolist() == [0x7B, 0x7B, 0x7B, 0x7F]
    codes = torch.arange(256, dtype=torch.uint8)
    finite = (codes & 0x7F) != 0x7F
    assert torch.equal(Q.fp8_encode(Q.fp8_decode(codes))[finite], codes[finite])


def test_ue8m0_ceil():
    v = torch.tensor([1.0, 1.0000001, 0.75, 2.0 ** -127, 2.0 ** -126, 0.0, -1.0, float("inf"), float("nan"), 3e38])
    assert Q.ue8m0_ceil(v).tolist() == [127, 128, 127, 0, 1, 0, 0, 254, 254, 254]
    sub = torch.tensor([0x00400001, 0x003FFFFF], dtype=torch.int32).view(torch.float32)
    assert Q.ue8m0_ceil(sub).tolist() == [1, 0]
    codes = torch.tensor([0, 1, 127, 128, 253, 254])
    assert Q.ue8m0_inv_scale(codes).tolist() == [0.0, 2.0 ** 126, 1.0, 0.5, 2.0 ** -126, 0.0]
    assert Q.ue8m0_decode(torch.tensor([127, 130])).tolist() == [1.0, 8.0]


@pytest.mark.parametrize("layout", Q.SF_LAYOUTS)
def test_sf_swizzle_round_trip(layout):
    rows, cols = 130, 7
    sf = torch.randint(1, 256, (rows, cols), dtype=torch.uint8)
    buf = Q.sf_swizzle(sf, layout)
    pr, pc = Q.sf_padded_shape(rows, cols, layout)
    assert buf.numel() == pr * pc
    assert int((buf == 0).sum()) == pr * pc - rows * cols  # padding is zero, every real scale nonzero here
    assert torch.equal(Q.sf_unswizzle(buf, rows, cols, layout), sf)


def test_sf_128x4_known_offsets():
    off = Q.sf_offsets(256, 8, "128x4")
    assert int(off[0, 1]) == 1 and int(off[1, 0]) == 16 and int(off[32, 0]) == 4 and int(off[0, 4]) == 512
    assert int(off[128, 0]) == 128 * 8 and int(off[127, 3]) == 31 * 16 + 3 * 4 + 3
    off8 = Q.sf_offsets(16, 8, "8x4")
    assert int(off8[1, 0]) == 4 and int(off8[0, 4]) == 32 and int(off8[8, 0]) == 64


def _data(m, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["linear", "128x4"])
def test_nvfp4_round_trip(dtype, layout):
    m, k = 37, 256
    x = _data(m, k, dtype)
    amax = x.float().abs().max()
    gs = (448.0 * 6.0) / amax
    packed, sf = Q.nvfp4_quantize(x, gs, layout)
    assert packed.shape == (m, k // 2) and packed.dtype == torch.uint8
    y = Q.nvfp4_dequantize(packed, sf, gs, m, k, layout)
    # e2m1 keeps 1 mantissa bit: each element within half a step of the largest code, i.e. 1/6 .. 1/4 of the
    # block amax (plus the e4m3 scale's own rounding).
    blk = Q.block_amax(x, 16).repeat_interleave(16, -1)
    assert ((y - x.float()).abs() <= blk * 0.26 + 1e-30).all()


def test_nvfp4_zero_block_and_tiny_scale():
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    x[1, 16:] = 1e-30
    packed, sf = Q.nvfp4_quantize(x, 1.0, "linear")
    assert sf.tolist() == [[0, 0], [0, 0]]  # the tiny block's e4m3 scale underflows to 0
    assert packed[0].tolist() == [0] * 16 and packed[1, 8:].tolist() == [0x77] * 8  # x * FLT_MAX saturates


@pytest.mark.parametrize("layout", ["linear", "128x4"])
def test_mxfp4_and_mxfp8_round_trip(layout):
    m, k = 19, 128
    x = _data(m, k, torch.bfloat16)
    blk = Q.block_amax(x, 32).repeat_interleave(32, -1)
    packed, sf = Q.mxfp4_quantize(x, layout)
    y = Q.mxfp4_dequantize(packed, sf, m, k, layout)
    assert ((y - x.float()).abs() <= blk * 0.34).all()  # power-of-two scale: up to 2x coarser than NVFP4
    codes, sf8 = Q.mxfp8_quantize(x, layout)
    y8 = Q.mxfp8_dequantize(codes, sf8, m, k, layout)
    assert ((y8 - x.float()).abs() <= x.float().abs() * 2.0 ** -4 + blk * 2.0 ** -9).all()


def test_k_not_a_multiple_of_the_block():
    with pytest.raises(ValueError, match="K=40"):
        Q.mxfp8_quantize(torch.zeros(2, 40), "linear")
    with pytest.raises(ValueError, match="K=24"):
        Q.nvfp4_quantize(torch.zeros(2, 24), 1.0, "linear")
