# SPDX-License-Identifier: Apache-2.0
"""On the GPU (sm_90a): ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` on the issue's odd shapes against
the fp32 oracle and torch SDPA: ragged lengths (1, 17, 127, 8193) with empty sequences, GQA ratios 1..16, pages of
16 .. 256 rows out of order, 1-4 queries, forced and heuristic split counts, long caches; varlen against the batch
kernel bit for bit, contiguous cache against the same keys paged bit for bit; graph replay and torch.compile. Every
config row of both kernels also runs through test_gpu.py (oracle, guard bands, inputs unchanged, FA4). Skips with the
reason elsewhere."""

import math

import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


def _varlen():
    testing.load_or_skip("flash_attention4_varlen")
    from tirx_kernels.ported.flashattention import flash_attention4 as fa
    from tirx_kernels.ported.flashattention import flash_attention4_varlen as m

    return fa, m


def _kvcache():
    testing.load_or_skip("flash_attention4_kvcache")
    from tirx_kernels.ported.flashattention import flash_attention4 as fa
    from tirx_kernels.ported.flashattention import flash_attention4_kvcache as m

    return fa, m


def _sdpa_close(m, data, out, **cfg):
    ref = m.get_baselines(**cfg)["torch"]()(data)
    if "out" in ref:
        torch.testing.assert_close(out, ref["out"], rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------------------------------------ varlen

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d, dv", [(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_ragged_against_the_oracle_and_sdpa(dtype, d, dv, causal):
    fa, m = _varlen()
    torch.manual_seed(d + causal)
    lq, lk = [1, 17, 0, 127, 8193, 5, 300], [1, 17, 3, 127, 8193, 0, 200]
    data = m.prepare_data(dtype, lq, lk, 4, 2, d, dv, causal)
    out, lse = m.flash_attn_varlen_func(data["q"], data["k"], data["v"], data["cu_seqlens_q"], data["cu_seqlens_k"],
                                        max(lq), max(lk), causal=causal)
    want = m.reference(**data)
    fa.check_outputs_against_oracle(out, lse, want["out"], want["lse"])
    _sdpa_close(m, data, out)


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gqa_ratios_with_seqused_k(ratio, causal):
    fa, m = _varlen()
    torch.manual_seed(ratio)
    lq, lk, used = [777, 1, 64, 0], [900, 300, 64, 10], [800, 0, 64, 10]
    data = m.prepare_data("bfloat16", lq, lk, 2 * ratio, 2, 128, causal=causal, seqused_k=used)
    out, lse = m.flash_attn_varlen_func(data["q"], data["k"], data["v"], data["cu_seqlens_q"], data["cu_seqlens_k"],
                                        max(lq), seqused_k=data["seqused_k"], causal=causal)
    want = m.reference(**data)
    fa.check_outputs_against_oracle(out, lse, want["out"], want["lse"])
    _sdpa_close(m, data, out)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_equals_the_batch_kernel_bit_for_bit(causal):
    """Equal lengths: the same tiles and arithmetic; rows of the next sequence in a tail tile are masked (P = 0)."""
    fa, m = _varlen()
    q = torch.randn(3, 1000, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(3, 1000, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(3, 1000, 2, 128, dtype=torch.bfloat16, device="cuda")
    want, want_lse = fa.flash_attn_func(q, k, v, causal=causal)
    cu = torch.tensor([0, 1000, 2000, 3000], dtype=torch.int32, device="cuda")
    got, got_lse = m.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 1000, 1000,
                                            causal=causal)
    assert torch.equal(got, want.flatten(0, 1))
    assert torch.equal(got_lse, want_lse.permute(1, 0, 2).flatten(1, 2))


def test_varlen_empty_edges():
    _, m = _varlen()
    q = torch.randn(5, 2, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(0, 2, 64, dtype=torch.bfloat16, device="cuda")
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device="cuda")
    cu_k = torch.zeros(3, dtype=torch.int32, device="cuda")
    out, lse = m.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 0)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all()
    out, lse = m.flash_attn_varlen_func(q[:0], q, q, torch.zeros(3, dtype=torch.int32, device="cuda"), cu_q)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)


def test_varlen_cuda_graph_replay_with_new_inputs():
    testing.check_graph_replay("flash_attention4_varlen", "bf16_ragged_h4kv2_d128_causal")


def test_varlen_torch_compile_fullgraph():
    _, m = _varlen()
    data = m.prepare_data("bfloat16", [300, 17], [300, 40], 4, 2, 128, causal=True)
    args = (data["q"], data["k"], data["v"], data["cu_seqlens_q"], data["cu_seqlens_k"])
    f = torch.compile(lambda *a: m.flash_attn_varlen_func(*a, 300, 300, causal=True)[0].float() * 2, fullgraph=True)
    want, _ = m.flash_attn_varlen_func(*args, 300, 300, causal=True)
    assert torch.equal(f(*args), want.float() * 2)


# ------------------------------------------------------------------------------------------------ KV cache

@pytest.mark.parametrize("page_size", [16, 48, 64, 256])
@pytest.mark.parametrize("sq", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_paged_against_the_oracle_and_sdpa(page_size, sq, causal):
    fa, m = _kvcache()
    torch.manual_seed(page_size + sq)
    cfg = {"dtype": "bfloat16", "B": 5, "Sq": sq, "Hq": 32, "Hkv": 8, "D": 128,
           "seqlens_k": [1, 17, 127, 8193, 0], "page_size": page_size, "causal": causal}
    data = m.prepare_data(**cfg)
    out, lse = m.flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"],
                                         cache_seqlens=data["cache_seqlens"], block_table=data["block_table"],
                                         causal=causal, return_softmax_lse=True)
    want = m.reference(**data)
    fa.check_outputs_against_oracle(out, lse, want["out"], want["lse"])
    _sdpa_close(m, data, out, **cfg)


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("num_splits", [0, 1, 13])
def test_kvcache_gqa_ratios_and_split_counts(ratio, num_splits):
    fa, m = _kvcache()
    torch.manual_seed(ratio * 7 + num_splits)
    data = m.prepare_data("bfloat16", 3, 4, 2 * ratio, 2, 128, [3000, 5, 700], page_size=64, causal=True)
    out, lse = m.flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"],
                                         cache_seqlens=data["cache_seqlens"], block_table=data["block_table"],
                                         causal=True, num_splits=num_splits, return_softmax_lse=True)
    want = m.reference(**data)
    fa.check_outputs_against_oracle(out, lse, want["out"], want["lse"])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d, dv", [(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)])
def test_kvcache_every_head_dim_pair(dtype, d, dv):
    fa, m = _kvcache()
    data = m.prepare_data(dtype, 2, 2, 8, 2, d, [4097, 33], Dv=dv, page_size=32, causal=True)
    out, lse = m.flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"],
                                         cache_seqlens=data["cache_seqlens"], page_table=data["block_table"],
                                         causal=True, return_softmax_lse=True)
    want = m.reference(**data)
    fa.check_outputs_against_oracle(out, lse, want["out"], want["lse"])


def test_kvcache_contiguous_equals_paged_bit_for_bit():
    """The same keys as a contiguous cache (one page a sequence, tile-high boxes) and as 16-row pages out of order:
    the same tiles and arithmetic, with the same split count."""
    _, m = _kvcache()
    data = m.prepare_data("bfloat16", 3, 1, 16, 2, 128, [5000, 1, 300], page_size=16)
    kc = torch.zeros(3, 5008, 2, 128, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    for b, n in enumerate([5000, 1, 300]):
        kc[b, :n], vc[b, :n] = m.gather_kv(data["k_cache"], data["v_cache"], b, n, data["block_table"])
    for splits in (1, 6):
        paged = m.flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"],
                                          cache_seqlens=data["cache_seqlens"], block_table=data["block_table"],
                                          num_splits=splits, return_softmax_lse=True)
        contig = m.flash_attn_with_kvcache(data["q"], kc, vc, cache_seqlens=data["cache_seqlens"], num_splits=splits,
                                           return_softmax_lse=True)
        assert torch.equal(paged[0], contig[0]) and torch.equal(paged[1], contig[1]), splits


def test_kvcache_long_cache_and_int_or_no_lengths():
    fa, m = _kvcache()
    data = m.prepare_data("bfloat16", 1, 1, 32, 8, 128, [65536], page_size=64)
    out = m.flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"], cache_seqlens=65536,
                                    block_table=data["block_table"])
    want = m.reference(**data)
    torch.testing.assert_close(out.float(), want["out"], rtol=1.6e-2, atol=1e-2)
    whole = m.flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"], block_table=data["block_table"])
    assert torch.equal(out, whole)  # the table holds exactly 65536 keys: None means all of them


def test_kvcache_cuda_graph_replay_with_new_inputs():
    testing.check_graph_replay("flash_attention4_kvcache", "bf16_b2_q2_h8kv2_d128_p256_split7")


def test_kvcache_torch_compile_fullgraph():
    _, m = _kvcache()
    data = m.prepare_data("bfloat16", 2, 1, 8, 2, 128, [1000, 77], page_size=64)
    args = (data["q"], data["k_cache"], data["v_cache"])
    kw = {"cache_seqlens": data["cache_seqlens"], "block_table": data["block_table"], "num_splits": 3}
    f = torch.compile(lambda *a: m.flash_attn_with_kvcache(*a, **kw).float() * 2, fullgraph=True)
    assert torch.equal(f(*args), m.flash_attn_with_kvcache(*args, **kw).float() * 2)


def test_kvcache_decode_scale_argument():
    fa, m = _kvcache()
    data = m.prepare_data("bfloat16", 2, 1, 8, 8, 64, [300, 20], page_size=16)
    out = m.flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"], cache_seqlens=data["cache_seqlens"],
                                    block_table=data["block_table"], softmax_scale=0.3)
    want = m.reference(**{**data, "softmax_scale": 0.3})
    torch.testing.assert_close(out.float(), want["out"], rtol=1.6e-2, atol=1e-2)
    assert not math.isclose(0.3, data["softmax_scale"])
