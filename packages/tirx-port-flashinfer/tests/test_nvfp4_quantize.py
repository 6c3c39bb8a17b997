# SPDX-License-Identifier: Apache-2.0
"""nvfp4_quantize: params and bundle resolution, input validation, the generated CUDA run on the CPU
(``core.emulate``) bit for bit against ``core.quant_ref`` (every layout, ragged M, zero / inf / NaN / midpoint /
subnormal rows, the swizzled padding zeroed), the fused SwiGLU input (silu_and_mul_nvfp4_quantize: ``silu(gate) *
up`` rounded to the dtype, with the emulation's libm ``expf``, then the same encoder; input unchanged); SASS; on a
GPU, the harness's checks of every config and both public ops against the oracle."""

import ctypes
import ctypes.util

import pytest
import torch

from tirx_kernels.core import quant_ref
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import _fp4_rows
from tirx_kernels.ported.flashinfer.quantization import _block_quant as B
from tirx_kernels.ported.flashinfer.quantization import nvfp4_quantize as mod
from tirx_kernels.ported.flashinfer.quantization._test_cases import BlockQuantCases

FMT, OP = "nvfp4", mod.nvfp4_quantize


def _call(x, layout="128x4"):
    return OP(x, torch.ones(1), sfLayout=layout)


def _ref(x, gs, layout):
    return quant_ref.nvfp4_quantize(x, gs, layout)


class TestNvfp4(BlockQuantCases):
    FMT, MOD, BAD_K = FMT, mod, 40
    call, ref = staticmethod(_call), staticmethod(_ref)


@pytest.mark.parametrize("x, kw, arg, what", [
    (torch.zeros(4, 40, dtype=torch.bfloat16), {}, "input", "K=20"),
    (torch.zeros(4, 33, dtype=torch.bfloat16), {}, "input", "even"),
    (torch.zeros(4, 64), {}, "input", "dtype"),
    (torch.zeros(4, 64, dtype=torch.bfloat16), {}, "input", "CUDA"),
    (torch.zeros(4, 64, dtype=torch.bfloat16), {"gs": torch.ones(2)}, "global_scale", "one element"),
])
def test_silu_and_mul_rejected_inputs_name_the_argument(x, kw, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        mod.silu_and_mul_nvfp4_quantize(x, kw.get("gs", torch.ones(1)))
    with pytest.raises(ValueError, match="sf_vec_size"):
        mod.silu_and_mul_nvfp4_quantize(x, torch.ones(1), sf_vec_size=32)


def test_silu_and_mul_params():
    assert mod.compile_params("bfloat16", "linear", silu_and_mul=True) == {"dtype": "bfloat16", "layout": "linear",
                                                                          "silu_and_mul": True}
    assert mod.compile_params("bfloat16", "linear") == {"dtype": "bfloat16", "layout": "linear"}
    assert {"dtype": "float16", "layout": "8x4", "silu_and_mul": True} in mod.artifact_params()


def test_silu_and_mul_fusion_is_nvfp4_only():
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")  # the GPU host has none
    with pytest.raises(ValueError, match="NVFP4 fusion"):
        B.build_kernel("bfloat16", "mxfp8", "linear", "mxfp8_quantize", silu_and_mul=True)


@pytest.mark.parametrize("seed", ["1", "2", "3"])
def test_silu_and_mul_rows_stay_in_the_dtype_range(monkeypatch, seed):
    """What the fused rows quantize spans 1e-2 .. 1e2 with no inf (gate and up of 1e2 each made fp16 products past
    65504: a calibrated global scale of 0 and codes decided by NaN edge cases, H200 run 1), the global scale finite."""
    monkeypatch.setenv("TIRX_SEED", seed)
    for c in (c for c in mod.CONFIGS if c.get("silu_and_mul")):
        d = mod.prepare_data(**{**c, "M": min(c["M"], 128)}, device="cpu")
        h = B.silu_and_mul_values(d["x"]).float()
        gs = float(d["global_scale"])
        assert torch.isfinite(h).all() and h.abs().max() < 1e4 and 0 < gs < float("inf"), c["label"]


@pytest.fixture(scope="module")
def emulation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")


_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.expf.restype = ctypes.c_float
_LIBM.expf.argtypes = [ctypes.c_float]


def _libm_exp(t: torch.Tensor) -> torch.Tensor:
    """glibc's ``expf`` element-wise: the exponential the emulation's ``expf`` calls."""
    return torch.tensor([_LIBM.expf(float(v)) for v in t.reshape(-1)], dtype=torch.float32).reshape(t.shape)


@pytest.mark.parametrize("dtype, layout, M, K", [
    (torch.bfloat16, "128x4", 37, 80), (torch.float16, "linear", 9, 160), (torch.bfloat16, "8x4", 130, 32),
])
def test_silu_and_mul_emulated_bit_exact(emulation, dtype, layout, M, K):  # noqa: N803
    """gate and up halves with special rows (zero, +-inf / NaN, the dtype's largest values, midpoints, subnormals)
    and rows of 1e-2 .. 1e2: codes and scales (padding included) bit for bit against the oracle's encoder applied to
    ``silu(gate) * up`` rounded to the dtype; the input left as it was."""
    x = torch.cat([B.special_rows(M, K, dtype, seed=1), B.special_rows(M, K, dtype, seed=2).flip(0)], dim=1)
    x0 = x.clone()
    gs = torch.tensor([448.0 * 6.0 / 50.0])
    codes, sf = B.emulate_quantize(x, gs, FMT, layout, silu_and_mul=True)
    assert torch.equal(x.view(torch.int16), x0.view(torch.int16))  # bits: the NaN row compares unequal as values
    h = B.silu_and_mul_values(x, exp=_libm_exp)
    want_codes, want_sf = _ref(h, gs, layout)
    assert codes.shape == (M, K // 2)
    got_nib, want_nib = quant_ref.unpack_e2m1(codes.view(torch.uint8)), quant_ref.unpack_e2m1(want_codes)
    if dtype == torch.float16:
        # a NaN h (silu(-inf) * up): the device's cvt.rn.f16x2.f32 gives the canonical NaN 0x7FFF, the emulation's
        # stand-in keeps the host's sign; the sign of a NaN picks its code (+-0), so those are not compared here
        keep = ~h.isnan()
        got_nib, want_nib = got_nib[keep], want_nib[keep]
    assert torch.equal(got_nib, want_nib)
    assert torch.equal(sf.view(-1), want_sf.view(-1))
    # the module's oracle (torch's exp) agrees with the kernel off rounding ties of the intermediate
    want = mod.reference(x, sf, gs, silu_and_mul=True)
    _fp4_rows.codes_close(codes, want["x_q"], {}, {})
    _fp4_rows.scales_close(sf, want["sf"], {}, {})


@pytest.mark.parametrize("fused", [False, True])
def test_sass(fused):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, f"{FMT}_quantize", mod.compile_params("bfloat16", "128x4", fused))


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
    rows = slice(6, M)  # finite rows, no special values
    gs = (448.0 * 6.0 / x[rows].float().abs().amax()).reshape(1)
    codes, sf = OP(x, gs, sfLayout=layout)
    want_codes, want_sf = _ref(x, gs, layout)
    assert torch.equal(codes, want_codes) and torch.equal(sf.view(-1), want_sf.view(-1))
    y = quant_ref.nvfp4_dequantize(codes, sf, gs, M, K, layout)[rows]
    blk = quant_ref.block_amax(x[rows], 16).repeat_interleave(16, -1)
    assert ((y - x[rows].float()).abs() <= blk * 0.26 + 1e-6).all()


@gpu
@pytest.mark.parametrize("layout", B.LAYOUTS)
def test_gpu_silu_and_mul_public_op(layout):
    """silu_and_mul_nvfp4_quantize: upstream's shapes (scales 2-D), codes and scales within one step of the oracle
    on 1 % at most (the exponential), the dequantized output against ``silu(gate) * up`` within the format's step,
    the input unchanged."""
    M, K = 300, 2048  # noqa: N806
    x = (torch.randn(M, 2 * K, device="cuda") * 3).to(torch.bfloat16)
    x0 = x.clone()
    h = B.silu_and_mul_values(x)
    gs = (448.0 * 6.0 / h.float().abs().amax()).reshape(1)
    codes, sf = mod.silu_and_mul_nvfp4_quantize(x, gs, is_sf_swizzled_layout=layout != "linear",
                                                is_sf_8x4_layout=layout == "8x4")
    assert torch.equal(x, x0)
    rows, cols = B.sf_shape(M, K, FMT, layout)
    assert codes.shape == (M, K // 2) and sf.shape == (rows, cols) and sf.dtype == torch.uint8
    want_codes, want_sf = _ref(h, gs, layout)
    _fp4_rows.codes_close(codes, want_codes, {}, {})
    _fp4_rows.scales_close(sf.view(-1), want_sf.view(-1), {}, {})
    y = quant_ref.nvfp4_dequantize(codes, sf.view(-1) if layout != "linear" else sf, gs, M, K, layout)
    blk = quant_ref.block_amax(h, 16).repeat_interleave(16, -1)
    assert ((y - h.float()).abs() <= blk * 0.26 + 1e-6).all()
