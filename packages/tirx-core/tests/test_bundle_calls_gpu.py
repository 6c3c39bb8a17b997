# SPDX-License-Identifier: Apache-2.0
"""On the GPU: the calls a new user makes, served from the prebuilt bundle (issue 19's list), against fp32.

On a GPU host without the compiler (``TIRX_KERNELS_ARTIFACTS`` set, apache-tvm absent) every call below must find
its artifact in a bundle built by ``python -m tirx_kernels.build --all``: shapes no CONFIGS row names, every GEMM
call form, odd sizes. Each output is compared with an fp32 torch computation of the same inputs.
"""

import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


def _close(got, want, rtol=1.6e-2, atol_rel=1e-2):
    assert got.shape == want.shape and not torch.isnan(got).any()
    err = (got.float() - want).abs()
    scale = want.pow(2).mean().sqrt().item() + 1e-6
    assert (err <= atol_rel * scale + rtol * want.abs()).all(), f"max err {err.max().item():.3g} (rms {scale:.3g})"


def _gemm():
    testing.load_or_skip("fp16_bf16_gemm")
    from tirx_kernels.gemm import fp16_bf16_gemm as g

    return g


@pytest.mark.parametrize("M, N, K", [(300, 4096, 1024), (77, 50257, 264), (1000, 1003, 1001), (5, 3, 7)])
def test_gemm_call_forms_from_the_bundle(M, N, K):
    g = _gemm()
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N)
    a = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
    b_nk = torch.randn(N, K, device="cuda", generator=gen).to(torch.bfloat16)
    b_kn = b_nk.t().contiguous()
    bias = torch.randn(N, device="cuda", generator=gen).to(torch.bfloat16)
    ref = a.float() @ b_nk.float().t()
    _close(g.gemm_nn(a, b_kn), ref)
    _close(g.gemm_nt(a, b_nk), ref)
    _close(g.gemm_nt(a, b_nk, bias=bias), ref + bias.float())
    c_in = torch.randn(M, N, device="cuda", generator=gen).to(torch.bfloat16)
    out = c_in.clone()
    g.gemm_nt(a, b_nk, out, alpha=0.5, beta=2.0)
    _close(out, 0.5 * ref + 2.0 * c_in.float())
    got = g.gemm_nn(a, b_kn, bias=bias, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    _close(got, ref + bias.float())


@pytest.mark.parametrize("act, d", [("gelu_tanh", 5120), ("silu", 1024), ("silu", 5121), ("gelu", 3)])
def test_act_and_mul_from_the_bundle(act, d):
    testing.load_or_skip("act_and_mul")
    from tirx_kernels.ported.flashinfer.activation import act_and_mul as m

    op = {"silu": m.silu_and_mul, "gelu": m.gelu_and_mul, "gelu_tanh": m.gelu_tanh_and_mul}[act]
    ref = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
    x = torch.randn(19, 2 * d, device="cuda").to(torch.bfloat16)
    _close(op(x), ref(x[..., :d].float()) * x[..., d:].float())


@pytest.mark.parametrize("H", [1544, 3000, 3001, 1, 262144])
def test_rmsnorm_from_the_bundle(H):
    testing.load_or_skip("rmsnorm")
    from tirx_kernels.norm.rmsnorm import rmsnorm

    x = torch.randn(7, H, device="cuda").to(torch.bfloat16)
    w = torch.randn(H, device="cuda").to(torch.bfloat16)
    xf = x.float()
    want = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    _close(rmsnorm(x, w, eps=1e-6), want)
