# SPDX-License-Identifier: Apache-2.0
"""mxfp4_quantize: params and bundle resolution, input validation, the generated CUDA run on the CPU
(``core.emulate``) bit for bit against ``core.quant_ref`` (every layout, ragged M, zero / inf / NaN / midpoint /
subnormal rows, the swizzled padding zeroed); SASS; on a GPU, the harness's checks of every config and the public
op against the oracle."""

import pytest
import torch

from tirx_kernels.core import quant_ref
from tirx_kernels.ported.flashinfer.quantization import _block_quant as B
from tirx_kernels.ported.flashinfer.quantization import mxfp4_quantize as mod
from tirx_kernels.ported.flashinfer.quantization._test_cases import BlockQuantCases

FMT, OP = "mxfp4", mod.mxfp4_quantize


def _call(x, layout="128x4"):
    return OP(x, sfLayout=layout)


def _ref(x, gs, layout):
    return quant_ref.mxfp4_quantize(x, layout)


class TestMxfp4(BlockQuantCases):
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
    y = quant_ref.mxfp4_dequantize(codes, sf, M, K, layout)[rows]
    blk = quant_ref.block_amax(x[rows], 32).repeat_interleave(32, -1)
    assert ((y - x[rows].float()).abs() <= blk * 0.34 + 1e-6).all()
