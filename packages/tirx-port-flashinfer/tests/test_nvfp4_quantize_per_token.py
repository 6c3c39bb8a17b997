# SPDX-License-Identifier: Apache-2.0
"""nvfp4_quantize_per_token: params and bundle resolution, input validation, the generated CUDA run on the CPU
(``core.emulate``) bit for bit against ``core.quant_ref.nvfp4_quantize_per_token`` (codes, scales with the
swizzled padding, per-token scales; zero / inf / NaN rows, rows longer than one pass of the CTA); SASS; on a GPU,
the harness's checks of every config."""

import random

import pytest
import torch

from tirx_kernels.core import artifacts, quant_ref, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.quantization import _block_quant as B
from tirx_kernels.ported.flashinfer.quantization import nvfp4_quantize_per_token as mod


def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "nvfp4_quantize_per_token"
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels))


@pytest.mark.parametrize("x, gs, arg, what", [
    (torch.zeros(4, 40, dtype=torch.bfloat16), torch.ones(1), "input", "K=40"),
    (torch.zeros(4, 64), torch.ones(1), "input", "dtype"),
    (torch.zeros(4, 64, dtype=torch.bfloat16), torch.ones(2), "a_global_sf", "one element"),
    (torch.zeros(4, 64, dtype=torch.bfloat16), torch.ones(1, dtype=torch.float16), "a_global_sf", "dtype"),
    (torch.zeros(4, 64, dtype=torch.bfloat16), torch.ones(1), "input", "CUDA"),
])
def test_rejected_inputs_name_the_argument(x, gs, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        mod.nvfp4_quantize_per_token(x, gs)


def _emulate(x, gsi, layout):
    from tirx_kernels.core import emulate
    from tirx_kernels.core.lang import quant

    M, K = x.shape  # noqa: N806
    codes, sf = B.new_outputs(x, "nvfp4", layout)
    codes.fill_(0xAB)
    sf.fill_(0xCD)
    pts = torch.full((M,), float("nan"))
    rows, _ = B.sf_shape(M, K, "nvfp4", layout)
    flags = emulate.CXXFLAGS
    emulate.CXXFLAGS = [*flags, *quant.emulate_cxxflags()]
    try:
        kern = emulate.compile(mod.get_kernel(str(x.dtype)[6:], layout))
    finally:
        emulate.CXXFLAGS = flags
    kern(grid=(rows,), block=(B.PT_THREADS,), X_ptr=x.contiguous().view(-1), G_ptr=torch.tensor([gsi]),
         Y_ptr=codes.view(-1).view(torch.int32), S_ptr=sf.view(-1), P_ptr=pts, M=M, K=K, rows_padded=rows).check()
    return codes, sf, pts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", B.LAYOUTS)
# 2080 / 16 = 130 blocks: two of the held rounds of 128; 9008 / 16 = 563: the four held rounds (PT_HELD), then 51
# blocks re-read in each pass (and a padding column there in 128x4 / 8x4)
@pytest.mark.parametrize("M, K", [(1, 64), (9, 80), (20, 2080), (3, 9008)])
def test_emulated_bit_exact(dtype, layout, M, K):  # noqa: N803
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    x = B.special_rows(M, K, dtype)
    gsi = 0.37
    codes, sf, pts = _emulate(x, gsi, layout)
    want_codes, want_sf, want_pts = quant_ref.nvfp4_quantize_per_token(x, gsi, layout)
    assert torch.equal(codes, want_codes)
    assert torch.equal(sf.view(-1), want_sf.view(-1))
    assert torch.equal(pts.view(torch.int32), want_pts.view(torch.int32))


def test_sass():
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "nvfp4_quantize_per_token", {"dtype": "bfloat16", "layout": "128x4"})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
def test_gpu_public_op_special_rows():
    M, K = 300, 2048  # noqa: N806
    x = B.special_rows(M, K, torch.bfloat16).cuda()
    gsi = torch.tensor([0.5], device="cuda")
    codes, sf, pts = mod.nvfp4_quantize_per_token(x, gsi)
    want = quant_ref.nvfp4_quantize_per_token(x, gsi, "128x4")
    assert torch.equal(codes, want[0]) and torch.equal(sf, want[1]) and torch.equal(pts, want[2])
