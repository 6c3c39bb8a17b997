# SPDX-License-Identifier: Apache-2.0
"""flash_attention_backward_sm90 on the GPU (sm_90a), beyond the registered rows that test_gpu.py checks: ragged
lengths (1, 17, 127, 1000) against the fp32 oracle, GQA ratios 1..8 against torch SDPA's backward (both judged against
the oracle: ours within twice SDPA's error), deterministic mode bit for bit run to run (and close to the fast mode),
the gradient of the LSE output, a ``dout`` that is an expanded view, CUDA-graph replay, and training through
``flash_attn_func`` (autograd; under torch.compile too). Skips with the reason elsewhere."""

import math

import pytest
import torch

from tirx_kernels.core import harness, testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
KERNEL = "flash_attention_backward_sm90"


def _mod():
    return testing.load_or_skip(KERNEL)


def _inputs(m, dtype, B, sq, sk, hq, hkv, d, causal, seed=0, dv=None):  # noqa: N803
    torch.manual_seed(seed)
    q = torch.randn(B, sq, hq, d, dtype=dtype, device="cuda")
    k = torch.randn(B, sk, hkv, d, dtype=dtype, device="cuda")
    v = torch.randn(B, sk, hkv, d if dv is None else dv, dtype=dtype, device="cuda")
    scale = 1 / math.sqrt(d)
    out, lse = m._fwd.flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    return q, k, v, out, lse, dout, scale


def _check_oracle(m, q, k, v, out, dout, scale, causal, grads, dlse=None):
    """Each gradient against the fp32 oracle's autograd, at most twice the error of plain attention done in the
    inputs' dtype (flash-attn's criterion: ``harness.compare_to_low_precision``, which the module's COMPARATORS use)."""
    want = m.attention_grads_fp32(q, k, v, dout, scale, causal, dlse, out=out)
    lowp = m.attention_grads_low_precision(q, k, v, dout, scale, causal, dlse)
    dv_rms = want[2].float().pow(2).mean().sqrt().item()
    for name, g, w, lp in zip(("dq", "dk", "dv"), grads, want, lowp):
        if not w.any():
            # Exactly zero where every row sees one key (softmax constant, dS = 0): the kernel's dP - delta leaves
            # rounding noise (~1e-7 on the H100, 2026-12-06); judged against dv's scale.
            assert g.float().abs().max().item() <= 1e-3 * dv_rms, f"{name}: not zero where the oracle is"
            continue
        harness.compare_to_low_precision(name, g, w, lp, "the fp32 oracle's autograd")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d, dv", [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 17), (127, 127), (1, 1000), (17, 127), (127, 17), (1000, 1000)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_odd_lengths_against_the_oracle(dtype, d, dv, sq, sk, causal, deterministic):
    m = _mod()
    q, k, v, out, lse, dout, scale = _inputs(m, dtype, 2, sq, sk, 4, 2, d, causal, seed=sq * 31 + sk, dv=dv)
    grads = m.flash_attn_backward(q, k, v, out, dout, lse, causal=causal, deterministic=deterministic)
    _check_oracle(m, q, k, v, out, dout, scale, causal, grads)


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gqa_ratios_against_sdpa(ratio, causal, d):
    """Ours and SDPA's backward (default backend, GQA) both against the fp32 oracle: ours within twice SDPA's error
    (plus a bf16 rounding of the gradient's scale)."""
    import torch.nn.functional as F  # noqa: N812

    m = _mod()
    hkv = 2
    q, k, v, out, lse, dout, scale = _inputs(m, torch.bfloat16, 2, 1000, 1000, hkv * ratio, hkv, d, causal, seed=ratio)
    ours = m.flash_attn_backward(q, k, v, out, dout, lse, causal=causal)
    qs, ks, vs = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=ratio > 1)
    sdpa = [g.transpose(1, 2) for g in torch.autograd.grad(o, (qs, ks, vs), dout.transpose(1, 2))]
    want = m.attention_grads_fp32(q, k, v, dout, scale, causal)
    for name, a, b, w in zip(("dq", "dk", "dv"), ours, sdpa, want):
        err_ours = (a.float() - w).abs().max().item()
        err_sdpa = (b.float() - w).abs().max().item()
        assert err_ours <= 2 * err_sdpa + 1e-2 * w.abs().max().item(), (name, err_ours, err_sdpa)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [16, 2])
def test_deterministic_mode_is_bit_identical(causal, hkv):
    m = _mod()
    q, k, v, out, lse, dout, _ = _inputs(m, torch.bfloat16, 2, 2048, 2048, 16, hkv, 128, causal)
    first = m.flash_attn_backward(q, k, v, out, dout, lse, causal=causal, deterministic=True)
    for _ in range(3):
        again = m.flash_attn_backward(q, k, v, out, dout, lse, causal=causal, deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    fast = m.flash_attn_backward(q, k, v, out, dout, lse, causal=causal)
    for a, b in zip(first, fast):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_lse_gradient_and_expanded_dout():
    """A dLSE (a z-loss on the LSE) folds into delta; a dout of stride 0 (out.sum()'s gradient) is copied for TMA."""
    m = _mod()
    q, k, v, out, lse, _, scale = _inputs(m, torch.bfloat16, 2, 300, 300, 4, 2, 128, True)
    dlse = torch.randn_like(lse)
    dout = torch.ones(1, 1, 1, 1, dtype=out.dtype, device="cuda").expand_as(out)
    grads = m.flash_attn_backward(q, k, v, out, dout, lse, causal=True, dlse=dlse)
    _check_oracle(m, q, k, v, out, dout, scale, True, grads, dlse)


def test_cuda_graph_replay_with_new_inputs():
    testing.check_graph_replay(KERNEL, "bf16_b2_h4_s1000_d128_causal")


@pytest.mark.parametrize("compiled", [False, True])
def test_flash_attn_func_trains(compiled):
    """A few SGD steps through flash_attn_func (causal, GQA) with autograd: the gradients match the fp32 oracle's,
    eager and under torch.compile(fullgraph=True)."""
    m = _mod()
    fwd = m._fwd
    torch.manual_seed(0)
    q = torch.randn(2, 500, 8, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(2, 500, 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(2, 500, 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    target = torch.randn(2, 500, 8, 128, device="cuda")

    def loss_fn(q, k, v):
        out, lse = fwd.flash_attn_func(q, k, v, causal=True)
        return ((out.float() - target) ** 2).mean() + 1e-3 * lse.float().square().mean()

    step = torch.compile(loss_fn, fullgraph=True) if compiled else loss_fn
    losses = []
    for _ in range(3):
        loss = step(q, k, v)
        grads = torch.autograd.grad(loss, (q, k, v))
        qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
        o, lse = fwd.attention_fp32(qf, kf, vf, 1 / math.sqrt(128), True)
        ref = torch.autograd.grad(((o - target) ** 2).mean() + 1e-3 * lse.square().mean(), (qf, kf, vf))
        for g, r in zip(grads, ref):
            assert (g.float() - r).norm() / r.norm() < 3e-2
        with torch.no_grad():  # a fixed-size step along each gradient (the raw gradients are below bf16's ulp)
            for x, g in zip((q, k, v), grads):
                x -= (0.05 * g.float() / g.float().abs().max()).to(x.dtype)
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_deterministic_through_autograd_follows_torch():
    m = _mod()
    q, k, v, *_ = _inputs(m, torch.bfloat16, 1, 1024, 1024, 8, 8, 128, True)
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    g = torch.randn(1, 1024, 8, 128, dtype=torch.bfloat16, device="cuda")
    torch.use_deterministic_algorithms(True)
    try:
        runs = [torch.autograd.grad(m._fwd.flash_attn_func(*xs, causal=True)[0], xs, g) for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    for a, b in zip(*runs):
        assert torch.equal(a, b)
