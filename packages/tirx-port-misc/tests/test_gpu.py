# SPDX-License-Identifier: Apache-2.0
"""On the GPU (sm_90a): every config of the package's kernels against the fp32 oracle and the upstream reference;
flash_attention4 on the issue's odd shapes (ragged 1, 17, 127, 8193; GQA ratios 1..16) against the oracle and torch
SDPA, strided (packed QKV) inputs, empty edges, graph replay and torch.compile. Skips with the reason elsewhere."""

import math

import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
CASES = testing.cases("tirx-port-misc")


@pytest.mark.parametrize("kernel, label", CASES)
def test_correctness(kernel, label):
    testing.check_correctness(kernel, label)


@pytest.mark.parametrize("kernel, label", CASES)
def test_matches_upstream(kernel, label):
    testing.check_upstream(kernel, label)


def test_cuda_graph_replay_with_new_inputs():
    testing.check_graph_replay("flash_attention4", "bf16_b2_h4_s1000_d128_causal")


def _fa4():
    testing.load_or_skip("flash_attention4")
    from tirx_kernels.ported.flashattention import flash_attention4 as m

    return m


def _check(m, q, k, v, causal, out, lse, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    want, want_lse = m.attention_fp32(q, k, v, scale, causal)
    m.check_outputs_against_oracle(out, lse, want, want_lse)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d, dv", [(64, 64), (128, 128), (256, 256), (192, 128)])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 17), (127, 127), (1, 8193), (17, 127), (127, 17), (8193, 8193)])
@pytest.mark.parametrize("causal", [False, True])
def test_odd_lengths_against_the_oracle(dtype, d, dv, sq, sk, causal):
    m = _fa4()
    torch.manual_seed(sq * 31 + sk)
    q = torch.randn(1, sq, 4, d, dtype=dtype, device="cuda")
    k = torch.randn(1, sk, 2, d, dtype=dtype, device="cuda")
    v = torch.randn(1, sk, 2, dv, dtype=dtype, device="cuda")
    out, lse = m.flash_attn_func(q, k, v, causal=causal)
    _check(m, q, k, v, causal, out, lse)


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_ratios_against_sdpa(ratio, causal):
    m = _fa4()
    torch.manual_seed(ratio)
    hkv = 2
    q = torch.randn(2, 777, hkv * ratio, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 777, hkv, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 777, hkv, 128, dtype=torch.bfloat16, device="cuda")
    out, lse = m.flash_attn_func(q, k, v, causal=causal)
    _check(m, q, k, v, causal, out, lse)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=causal, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)


def test_packed_qkv_views_match_contiguous_inputs():
    m = _fa4()
    qkv = torch.randn(2, 300, 3, 8, 128, dtype=torch.bfloat16, device="cuda")
    q, k, v = qkv.unbind(2)
    got, got_lse = m.flash_attn_func(q, k, v, causal=True, softmax_scale=0.1)
    want, want_lse = m.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, softmax_scale=0.1)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    _check(m, q, k, v, True, got, got_lse, scale=0.1)


def test_empty_edges():
    m = _fa4()
    q = torch.randn(1, 5, 2, 64, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(1, 0, 2, 64, dtype=torch.bfloat16, device="cuda")
    out, lse = m.flash_attn_func(q, kv, kv)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all()
    out, lse = m.flash_attn_func(q[:0], q[:0], q[:0])
    assert out.shape == (0, 5, 2, 64) and lse.shape == (0, 2, 5)


def test_torch_compile_fullgraph():
    m = _fa4()
    q = torch.randn(1, 300, 4, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 300, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 300, 2, 128, dtype=torch.bfloat16, device="cuda")
    f = torch.compile(lambda q, k, v: m.flash_attn_func(q, k, v, causal=True)[0].float() * 2, fullgraph=True)
    want, _ = m.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(f(q, k, v), want.float() * 2)


def test_schedules_agree_bit_for_bit():
    """The turns and the overlap only reorder GEMM issue and softmax; each warpgroup's arithmetic is the same."""
    m = _fa4()
    q = torch.randn(2, 1000, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 1000, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 1000, 2, 128, dtype=torch.bfloat16, device="cuda")
    outs = {}
    for schedule in ("overlap", "pingpong", "plain"):
        o = torch.empty(2, 1000, 8, 128, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(2, 8, 1000, dtype=torch.float32, device="cuda")
        m._run(q, k, v, 1 / math.sqrt(128), True, o, lse, schedule)
        outs[schedule] = (o, lse)
    for schedule in ("pingpong", "plain"):
        assert torch.equal(outs["overlap"][0], outs[schedule][0]), schedule
        assert torch.equal(outs["overlap"][1], outs[schedule][1]), schedule
