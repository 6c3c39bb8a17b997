# SPDX-License-Identifier: Apache-2.0
"""mxfp8_quantize: params and bundle resolution, input validation, the generated CUDA run on the CPU
(``core.emulate``) bit for bit against ``core.quant_ref`` (every layout, ragged M, zero / inf / NaN / midpoint /
subnormal rows, the swizzled padding zeroed); SASS; on a GPU, the harness's checks of every config and the public
op against the oracle."""

import pytest
import torch

from tirx_kernels.core import quant_ref
from tirx_kernels.ported.flashinfer.quantization import _block_quant as B
from tirx_kernels.ported.flashinfer.quantization import mxfp8_quantize as mod
from tirx_kernels.ported.flashinfer.quantization._test_cases import BlockQuantCases

FMT, OP = "mxfp8", mod.mxfp8_quantize


def _call(x, layout="128x4"):
    return OP(x, sf_swizzle_layout=layout)


def _ref(x, gs, layout):
    return quant_ref.mxfp8_quantize(x, layout)


class TestMxfp8(BlockQuantCases):
    FMT, MOD, BAD_K = FMT, mod, 48
    call, ref = staticmethod(_call), staticmethod(_ref)


def test_sass():
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, f"{FMT}_quantize", {"dtype": "bfloat16", "layout": "128x4"})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
@pytest.mark.parametrize("layout", B.LAYOUTS)
def test_gpu_public_op(layout):
    """The public op on special rows bit for bit against the oracle on the same device, and its dequantized output
    against the input (within the format's step)."""
    M, K = 300, 2048  # noqa: N806
    x = B.special_rows(M, K, torch.bfloat16).cuda()
    codes, sf = _call(x, layout)
    want_codes, want_sf = _ref(x, None, layout)
    assert torch.equal(codes.view(torch.uint8), want_codes) and torch.equal(sf.view(-1), want_sf.view(-1))
    rows = slice(6, M)  # finite rows, no special values
    y = quant_ref.mxfp8_dequantize(codes.view(torch.uint8), sf, M, K, layout)[rows]
    blk = quant_ref.block_amax(x[rows], 32).repeat_interleave(32, -1)
    assert ((y - x[rows].float()).abs() <= x[rows].float().abs() * 2.0 ** -4 + blk * 2.0 ** -9 + 1e-6).all()


@gpu
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_matches_flashinfer(swizzled, dtype):
    """FlashInfer 0.7.4's mxfp8_quantize runs on the H100: codes and scales byte for byte (finite rows)."""
    flashinfer = pytest.importorskip("flashinfer")
    M, K = 1000, 4096  # noqa: N806
    x = B.special_rows(M, K, dtype)[6:].cuda()
    q, sf = mod.mxfp8_quantize(x, is_sf_swizzled_layout=swizzled)
    fq, fsf = flashinfer.mxfp8_quantize(x, is_sf_swizzled_layout=swizzled)
    assert torch.equal(q.view(torch.uint8), fq.view(torch.uint8))
    assert torch.equal(sf.view(torch.uint8).reshape(-1), fsf.view(torch.uint8).reshape(-1))


@pytest.mark.parametrize("behaviour", ["computes", "zeros", "stale"])
def test_flashinfer_reference_is_timed_only_once_it_produced_the_oracles_bytes(behaviour, monkeypatch):
    """FlashInfer 0.7.4's mxfp8_quantize took 0.8-2.0 us at every size on the H100 (too fast to have read its input):
    the reference checks a call on a fresh input against the oracle and is a missing reference if it differs, also
    when its output holds the timed data's right bytes (``stale``: memory the allocator handed back)."""
    import sys
    import types

    data = B.prepare_data("mxfp8", "float16", 32, 256, "linear", device="cpu")
    want = mod.reference(**data)

    def fake_quantize(x, is_sf_swizzled_layout=True):
        if behaviour == "computes":
            return tuple(mod.reference(**{**data, "x": x})[k] for k in ("x_q", "sf"))
        q = want["x_q"].clone() if behaviour == "stale" else torch.zeros_like(want["x_q"])
        return q, want["sf"].clone()

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(mxfp8_quantize=fake_quantize))
    fn = mod.get_baselines(dtype="float16", M=32, K=256, layout="linear")["flashinfer"]()
    if behaviour == "computes":
        assert torch.equal(fn(data)["x_q"].view(torch.uint8), want["x_q"].view(torch.uint8))
        fn(data)  # checked once per data set
    else:
        with pytest.raises(ImportError, match="does not produce the quantized bytes"):
            fn(data)
