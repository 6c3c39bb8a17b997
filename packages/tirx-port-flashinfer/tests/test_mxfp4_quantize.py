# SPDX-License-Identifier: Apache-2.0
"""mxfp4_quantize: params and bundle resolution, input validation, the generated CUDA run on the CPU
(``core.emulate``) bit for bit against ``core.quant_ref`` (every layout, ragged M, zero / inf / NaN / midpoint /
subnormal rows, the swizzled padding zeroed); SASS; on a GPU, the harness's checks of every config and the public
op against the oracle."""

import random

import pytest
import torch

from tirx_kernels.core import artifacts, quant_ref, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.quantization import _block_quant as B
from tirx_kernels.ported.flashinfer.quantization import mxfp4_quantize as mod

FMT, OP = "mxfp4", mod.mxfp4_quantize


def _call(x, layout="128x4"):
    return OP(x, sfLayout=layout)


def _ref(x, gs, layout):
    return quant_ref.mxfp4_quantize(x, layout)


def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == f"{FMT}_quantize" and len(mod.KERNEL_META["upstream"]["commit"]) == 40
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels))
    assert {c["label"] for c in mod.BENCH_CONFIGS} == {"fp16_128x4_m128_k1024", "fp16_linear_m4096_k4096",
                                                        "fp16_128x4_m16384_k7168"}


@pytest.mark.parametrize("x, arg, what", [
    (torch.zeros(4, 48, dtype=torch.bfloat16), "input", "K=48"),
    (torch.zeros(4, 64), "input", "dtype"),
    (torch.zeros(2, 4, 64, dtype=torch.bfloat16), "input", "dimensions"),
    (torch.zeros(4, 64, dtype=torch.bfloat16), "input", "CUDA"),
])
def test_rejected_inputs_name_the_argument(x, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        _call(x)


def test_layout_names():
    assert B.layout_name("op", 0) == "128x4" and B.layout_name("op", 1) == "8x4" and B.layout_name("op", 2) == "linear"
    assert B.layout_name("op", "layout_linear") == "linear"
    with pytest.raises(TirxInputError, match="sfLayout"):
        B.layout_name("op", "64x4")


@pytest.fixture(scope="module")
def emulation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", B.LAYOUTS)
@pytest.mark.parametrize("M, K", [(1, 64), (37, 96), (130, 160)])
def test_emulated_bit_exact(emulation, dtype, layout, M, K):  # noqa: N803
    K = K // B.block_of(FMT) * B.block_of(FMT)  # noqa: N806
    x = B.special_rows(M, K, dtype)
    gs = torch.tensor([448.0 * 6.0 / 30.0])
    codes, sf = B.emulate_quantize(x, gs if FMT == "nvfp4" else None, FMT, layout)
    want_codes, want_sf = _ref(x, gs, layout)
    assert torch.equal(codes.view(torch.uint8), want_codes)
    assert torch.equal(sf.view(-1), want_sf.view(-1))  # padding included: zeros in the swizzled layouts
    assert sf.shape == ((M, K // B.block_of(FMT)) if layout == "linear" else (want_sf.numel(),))


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
