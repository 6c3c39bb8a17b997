# SPDX-License-Identifier: Apache-2.0
"""``core.lang.quant`` encoders, run on the CPU through ``core.emulate`` over every bf16 bit pattern, random fp32
bit patterns and each format's midpoints, against ``core.quant_ref`` bit for bit."""

import pytest
import torch

pytest.importorskip("tvm")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build, emulate, quant_ref  # noqa: E402
from tirx_kernels.core.lang import quant  # noqa: E402

CTAS, THREADS = 4, 128


@pytest.fixture(autouse=True)
def _standins(monkeypatch):
    monkeypatch.setattr(emulate, "CXXFLAGS", [*emulate.CXXFLAGS, *quant.emulate_cxxflags()])


@T.prim_func
def _encoders(x_ptr: T.handle, e2m1_ptr: T.handle, e4m3_ptr: T.handle, e5m2_ptr: T.handle, ue8_ptr: T.handle,
              inv_ptr: T.handle, dec_ptr: T.handle, nvs_ptr: T.handle, nvo_ptr: T.handle, mx4_ptr: T.handle,
              mx8_ptr: T.handle, amax_ptr: T.handle, x8_ptr: T.handle, gs: T.float32):
    N = T.int32()
    X = T.match_buffer(x_ptr, (N,), "float32", align=16)
    E2 = T.match_buffer(e2m1_ptr, (N,), "uint8")
    E4 = T.match_buffer(e4m3_ptr, (N,), "uint8")
    E5 = T.match_buffer(e5m2_ptr, (N,), "uint8")
    U8 = T.match_buffer(ue8_ptr, (N,), "uint8")
    INV = T.match_buffer(inv_ptr, (N,), "float32")
    DEC = T.match_buffer(dec_ptr, (N,), "float32")
    NVS = T.match_buffer(nvs_ptr, (N,), "float32")
    NVO = T.match_buffer(nvo_ptr, (N,), "float32")
    MX4 = T.match_buffer(mx4_ptr, (N,), "uint8")
    MX8 = T.match_buffer(mx8_ptr, (N,), "uint8")
    AM = T.match_buffer(amax_ptr, (N,), "float32")
    X8 = T.match_buffer(x8_ptr, (N // 8,), "uint32")
    T.device_entry()
    cta = T.cta_id([CTAS])
    tid = T.thread_id([THREADS])
    pair = T.alloc_local((2,), "uint16")
    acc = T.alloc_local((1,), "float32")
    for it in T.serial((N + CTAS * THREADS - 1) // (CTAS * THREADS)):
        i = it * (CTAS * THREADS) + cta * THREADS + tid
        if i < N:
            x = X[i]
            E2[i] = T.Cast("uint8", quant.e2m1(x))
            quant.fp8x2(pair[0], x, x, "e4m3")
            quant.fp8x2(pair[1], x, x, "e5m2")
            E4[i] = T.Cast("uint8", pair[0] & T.uint16(0xFF))
            E5[i] = T.Cast("uint8", pair[1] >> T.uint16(8))
            U8[i] = T.Cast("uint8", quant.ue8m0_ceil(x))
            INV[i] = quant.ue8m0_inv_scale(T.Cast("uint32", i % 256))
            DEC[i] = quant.e4m3_to_f32(T.Cast("uint32", i % 256))
            NVS[i] = quant.nvfp4_block_scale(T.fabs(x), gs)
            NVO[i] = quant.nvfp4_output_scale(quant.e4m3_to_f32(T.Cast("uint32", i % 128)), gs, T.fabs(x))
            MX4[i] = T.Cast("uint8", quant.mxfp4_block_scale(T.fabs(x)))
            MX8[i] = T.Cast("uint8", quant.mxfp8_block_scale(T.fabs(x)))
            acc[0] = T.float32(0)
            acc[0] = quant.amax_step(acc[0], x)
            acc[0] = quant.amax_step(acc[0], X[(i + 1) % N])
            AM[i] = acc[0]
            if i % 8 == 0 and i + 8 <= N:
                X8[i // 8] = quant.e2m1x8([X[i + k] for k in range(8)])


def _f32(bits):
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    bf16_all = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    rnd = _f32(torch.randint(0, 2**32, (32768,), generator=g, dtype=torch.int64).tolist())
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 448.0, 464.0, 480.0, 57344.0, 61440.0,
                         2.0 ** -127, 2.0 ** -126, 2.0 ** -10, 2.0 ** -9 * 1.5, 2.0 ** -7 * 1.0625,
                         # e2m1's binade edges (its encoder switches rounding step there) and the saturation edge
                         0.125, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 7.0, 8.0, 16.0])
    mids = torch.cat([mids, -mids])
    up = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    down = torch.nextafter(mids, torch.full_like(mids, float("-inf")))
    sub = _f32([0x00400000, 0x00400001, 0x003FFFFF, 1, 0x007FFFFF, 0x80400001])
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")])
    # fp32 patterns across e2m1's range (0.125 .. 16), every 1021st: mantissa bits below bf16's
    dense = _f32(list(range(0x3E000000, 0x41800000, 1021)))
    x = torch.cat([bf16_all, rnd, mids, up, down, sub, specials, dense, -dense]).contiguous()
    return x


def _bits(t):
    return t.contiguous().view(torch.int32)


def test_encoders_match_reference():
    x = _inputs()
    n = x.numel()
    gs = 448.0 * 6.0 / 3.25
    outs = dict(e2m1=torch.zeros(n, dtype=torch.uint8), e4m3=torch.zeros(n, dtype=torch.uint8),
                e5m2=torch.zeros(n, dtype=torch.uint8), ue8=torch.zeros(n, dtype=torch.uint8),
                inv=torch.zeros(n), dec=torch.zeros(n), nvs=torch.zeros(n), nvo=torch.zeros(n),
                mx4=torch.zeros(n, dtype=torch.uint8), mx8=torch.zeros(n, dtype=torch.uint8), amax=torch.zeros(n),
                x8=torch.zeros(n // 8, dtype=torch.int32))
    names = dict(e2m1="E2", e4m3="E4", e5m2="E5", ue8="U8", inv="INV", dec="DEC", nvs="NVS", nvo="NVO", mx4="MX4",
                 mx8="MX8", amax="AM", x8="X8")
    emulate.compile(_encoders)(grid=(CTAS,), block=(THREADS,), X_ptr=x, N=n, gs=gs,
                               **{names[k] + "_ptr": v for k, v in outs.items()}).check()

    assert torch.equal(outs["e2m1"], quant_ref.e2m1_encode(x))
    nib = quant_ref.e2m1_encode(x[: n // 8 * 8]).to(torch.int64).view(-1, 8)  # e2m1x8: element k in nibble k
    packed = (nib << (4 * torch.arange(8))).sum(-1)
    assert torch.equal(outs["x8"].to(torch.int64) & 0xFFFFFFFF, packed)
    nan = torch.isnan(x)
    assert torch.equal(outs["e4m3"], quant_ref.fp8_encode(x, "e4m3"))
    assert torch.equal(outs["e5m2"], quant_ref.fp8_encode(x, "e5m2"))
    assert torch.equal(outs["ue8"], quant_ref.ue8m0_ceil(x))
    codes = torch.arange(n) % 256
    assert torch.equal(_bits(outs["inv"]), _bits(quant_ref.ue8m0_inv_scale(codes)))
    finite = (codes & 0x7F) != 0x7F  # e4m3 NaN codes are not decoded
    assert torch.equal(_bits(outs["dec"])[finite], _bits(quant_ref.fp8_decode(codes.to(torch.uint8)))[finite])
    a = x.abs()
    gst = torch.tensor(gs, dtype=torch.float32)
    ref_s = torch.where(a == 0, torch.zeros_like(a), a * (gst * quant_ref.rcp_e2m1_max()))
    assert torch.equal(_bits(outs["nvs"])[~nan], _bits(ref_s)[~nan])
    sfv = quant_ref.fp8_decode((torch.arange(n) % 128).to(torch.uint8))
    ref_o = torch.fmin(1.0 / (sfv * (1.0 / gst)), torch.tensor(torch.finfo(torch.float32).max))
    ref_o = torch.where(a == 0, torch.zeros_like(ref_o), ref_o)
    ok = ~nan & (torch.arange(n) % 128 != 0x7F)  # a scale factor is never the e4m3 NaN
    assert torch.equal(_bits(outs["nvo"])[ok], _bits(ref_o)[ok])
    assert torch.equal(outs["mx4"], quant_ref.ue8m0_ceil(a * quant_ref.rcp_e2m1_max()))
    assert torch.equal(outs["mx8"], quant_ref.ue8m0_ceil(a * quant_ref.rcp_e4m3_max()))
    pairs = torch.stack([x, x.roll(-1)], -1)
    ref_am = quant_ref.block_amax(pairs, 2)[:, 0]
    assert torch.equal(_bits(outs["amax"]), _bits(ref_am))


def _sf_kernel(layout: str):
    @T.prim_func
    def sf_offsets(o_ptr: T.handle):
        R = T.int32()
        C = T.int32()
        OFF = T.match_buffer(o_ptr, (R, C), "int32")
        T.device_entry()
        tid = T.thread_id([THREADS])
        for r in T.serial(R):
            for it in T.serial((C + THREADS - 1) // THREADS):
                c = it * THREADS + tid
                if c < C:
                    OFF[r, c] = quant.sf_offset(r, c, quant.sf_cols_padded(C, layout), layout)

    return sf_offsets


@pytest.mark.parametrize("layout", quant.SF_LAYOUTS)
def test_sf_offsets_match_reference(layout):
    rows, cols = 259, 13
    o = torch.zeros(rows, cols, dtype=torch.int32)
    emulate.compile(_sf_kernel(layout))(grid=(1,), block=(THREADS,), OFF_ptr=o, R=rows, C=cols).check()
    ref = quant_ref.sf_offsets(rows, cols, layout)
    assert torch.equal(o.to(torch.int64), ref)
    pr, pc = quant_ref.sf_padded_shape(rows, cols, layout)
    assert (pr, pc) == (quant.sf_rows_padded(rows, layout), quant.sf_cols_padded(cols, layout))
    assert ref.unique().numel() == rows * cols and int(ref.max()) < pr * pc


def test_fp8_cvt_is_one_ptx_instruction():
    src = build.codegen(_encoders)
    assert "cvt.rn.satfinite.e4m3x2.f32" in src and "cvt.rn.satfinite.e5m2x2.f32" in src
