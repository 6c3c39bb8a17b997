# SPDX-License-Identifier: Apache-2.0
"""flash_attention4_kvcache on the CPU: input validation (every failure names its argument), the arguments not
implemented yet, the split-count heuristic and the TMA box height, the oracle (paged gather against a contiguous
layout and float64 attention), the split-KV + combine arithmetic in torch against the unsplit oracle, params and
bundle coverage, and the sm_90a builds of the decode and combine kernels (no spills). The emulated kernel runs are
in test_flash_attention4_kvcache_emulated.py, the GPU runs in test_flash_attention4_varlen_kvcache_gpu.py."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

from tirx_kernels.core import checks
from tirx_kernels.ported.flashattention import flash_attention4 as fa
from tirx_kernels.ported.flashattention import flash_attention4_kvcache as mod


def _t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


_Q = _t(2, 1, 8, 128)
_KC = _t(6, 16, 2, 128)  # 6 pages of 16 rows
_TABLE = torch.tensor([[3, 1, 5], [0, 2, 4]], dtype=torch.int32)
_LENS = torch.tensor([40, 7], dtype=torch.int32)


@pytest.mark.parametrize("kwargs, arg", [
    ({"q": _t(2, 8, 128)}, "q"),
    ({"q": _Q.float()}, "q"),
    ({"k_cache": _KC.half()}, "k_cache"),
    ({"k_cache": _t(6, 16, 2, 64)}, "k_cache"),
    ({"v_cache": _t(6, 8, 2, 128)}, "v_cache"),
    ({"v_cache": _t(6, 16, 2, 64)}, "v_cache"),
    ({"k_cache": _t(6, 16, 3, 128), "v_cache": _t(6, 16, 3, 128)}, "k_cache"),
    ({"k_cache": _t(6, 8, 2, 128), "v_cache": _t(6, 8, 2, 128)}, "k_cache"),  # pages below 16 rows
    ({"k_cache": _t(6, 24, 2, 128), "v_cache": _t(6, 24, 2, 128)}, "k_cache"),  # not a multiple of 16
    ({"k_cache": _t(6, 16, 2, 132)[..., :128]}, "k_cache"),  # heads 264 bytes apart: not TMA-strided
    ({"block_table": _TABLE.long()}, "block_table"),
    ({"block_table": _TABLE[:1]}, "block_table"),
    ({"block_table": _TABLE[:, :0]}, "block_table"),
    ({"block_table": _TABLE, "page_table": _TABLE}, "page_table"),
    ({"cache_seqlens": _LENS.long()}, "cache_seqlens"),
    ({"cache_seqlens": _LENS[:1]}, "cache_seqlens"),
    ({"cache_seqlens": -3}, "cache_seqlens"),
    ({"num_splits": -1}, "num_splits"),
    ({"softmax_scale": float("nan")}, "softmax_scale"),
    ({"num_splits": 1000}, "num_splits"),
    ({"out": (_t(2, 1, 8, 64), torch.empty(2, 8, 1))}, "out[0]"),
    ({"out": (_t(2, 1, 8, 128), torch.empty(2, 1, 8))}, "out[1]"),
    ({"block_table": None, "k_cache": _t(1, 16, 2, 128), "v_cache": _t(1, 16, 2, 128)}, "k_cache"),
    ({"block_table": None, "cache_batch_idx": torch.tensor([0, 1])}, "cache_batch_idx"),
    ({}, "q"),  # valid, but on the CPU
])
def test_invalid_inputs_name_the_argument(kwargs, arg):
    call = {"q": _Q, "k_cache": _KC, "v_cache": _KC, "cache_seqlens": _LENS, "block_table": _TABLE, **kwargs}
    with pytest.raises(checks.TirxInputError, match=re.escape(f"argument '{arg}'")):
        mod.flash_attn_with_kvcache(**call)


@pytest.mark.parametrize("kwargs, arg", [
    ({"k": _t(2, 1, 2, 128), "v": _t(2, 1, 2, 128)}, "k"),
    ({"rotary_cos": torch.zeros(4, 32)}, "rotary_cos"),
    ({"cache_leftpad": torch.zeros(2, dtype=torch.int32)}, "cache_leftpad"),
    ({"alibi_slopes": torch.zeros(8)}, "alibi_slopes"),
    ({"window_size": (64, 0)}, "window_size"),
    ({"softcap": 5.0}, "softcap"),
    ({"learnable_sink": torch.zeros(8)}, "learnable_sink"),
    ({"cache_batch_idx": torch.tensor([1, 0], dtype=torch.int32)}, "cache_batch_idx"),  # with a block table
])
def test_unimplemented_arguments_raise_naming_them(kwargs, arg):
    with pytest.raises(NotImplementedError, match=re.escape(f"argument '{arg}'")):
        mod.flash_attn_with_kvcache(_Q, _KC, _KC, cache_seqlens=_LENS, block_table=_TABLE, **kwargs)


# ------------------------------------------------------------------------------------------------ planning

def test_split_heuristic_fills_the_gpu_and_stays_within_the_keys():
    assert mod.num_splits_heuristic(tiles=2000, key_blocks=128, num_sms=132) == 1  # the tiles alone fill it
    s = mod.num_splits_heuristic(tiles=64, key_blocks=128, num_sms=132)  # b8 x 8 KV heads, 8192 keys
    assert 1 < s <= 8 and 64 * s / (math.ceil(64 * s / 264) * 264) >= 0.85 * 0.97
    assert mod.num_splits_heuristic(tiles=8, key_blocks=1024, num_sms=132) >= 20  # one sequence, 65536 keys
    assert mod.num_splits_heuristic(tiles=1, key_blocks=3, num_sms=132) <= 3
    assert mod.num_splits_heuristic(tiles=1, key_blocks=100000, num_sms=132) <= mod.MAX_SPLITS


@pytest.mark.parametrize("page, d, want", [(16, 128, 16), (48, 128, 16), (64, 128, 64), (256, 128, 64),
                                           (32, 64, 32), (256, 64, 128), (64, 256, 64), (16, 256, 16)])
def test_box_height_divides_the_page_and_the_key_tile(page, d, want):
    q, kc = torch.empty(1, 1, 4, d), torch.empty(3, page, 4, d)
    box_rows, splits = mod._plan(q, kc, kc, torch.zeros(1, 3, dtype=torch.int32), 2, 3 * page)
    assert box_rows == want and splits >= 1
    assert mod._plan(q, kc, kc, None, 1, page)[0] == mod.DECODE_TILES[(d, d)][0]  # contiguous: the whole tile


def test_every_decode_tile_fits_its_ctas_an_sm():
    pytest.importorskip("tvm", reason="the mainloop module builds TIRx at import")
    from tirx_kernels.ported.flashattention import _fwd_decode, _fwd_mainloop

    for (d, dv), (bn, stages, ctas) in mod.DECODE_TILES.items():
        _fwd_mainloop.check_shape(d, dv, bn, stages, _fwd_decode.BLOCK_M, _fwd_decode.smem_limit(ctas))


# ------------------------------------------------------------------------------------------------ the oracle

def test_paged_oracle_equals_the_contiguous_one():
    """The same keys laid out as out-of-order pages and as one contiguous cache give the same result."""
    torch.manual_seed(0)
    paged = mod.prepare_data("bfloat16", 3, 2, 8, 2, 64, [70, 0, 33], page_size=16, causal=True, device="cpu")
    kc = torch.zeros(3, 80, 2, 64, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    for b, n in enumerate([70, 0, 33]):
        kc[b, :n], vc[b, :n] = mod.gather_kv(paged["k_cache"], paged["v_cache"], b, n, paged["block_table"])
    got = mod.reference(**paged)
    want = mod.reference(**{**paged, "k_cache": kc, "v_cache": vc, "block_table": None})
    assert torch.equal(got["out"], want["out"]) and torch.equal(got["lse"], want["lse"])
    assert torch.isinf(got["lse"][1]).all() and (got["out"][1] == 0).all()
    assert len(set(paged["block_table"].flatten().tolist())) == paged["block_table"].numel()  # distinct pages


def test_oracle_matches_float64_decode_attention():
    torch.manual_seed(1)
    data = mod.prepare_data("bfloat16", 2, 3, 6, 3, 64, [20, 9], page_size=16, causal=True, device="cpu")
    got = mod.reference(**data)
    for b, n in enumerate([20, 9]):
        kk, vv = mod.gather_kv(data["k_cache"], data["v_cache"], b, n, data["block_table"])
        for i in range(3):
            lim = i + n - 3
            for h in range(6):
                s = kk[:lim + 1, h // 2].double() @ data["q"][b, i, h].double() * data["softmax_scale"]
                torch.testing.assert_close(got["out"][b, i, h].double(), torch.softmax(s, 0) @ vv[:lim + 1, h // 2]
                                           .double(), rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(got["lse"][b, h, i].double(), torch.logsumexp(s, 0), rtol=1e-5, atol=1e-5)


def test_split_and_combine_arithmetic_matches_the_unsplit_oracle():
    """The kernels' split-KV in torch: each split's normalised (O, LSE) over its key tiles (empty and fully masked
    splits included), merged as the combine kernel does, equals attention over every key."""
    torch.manual_seed(2)
    sq, n, block_n, splits = 3, 300, 64, 7
    q, k, v = _t(1, sq, 4, 64), _t(1, n, 2, 64), _t(1, n, 2, 64)
    want, want_lse = fa.attention_fp32(q, k, v, 0.125, True)
    n_tiles = -(-n // block_n)
    per = -(-n_tiles // splits)
    parts = []
    for s in range(splits):
        lo, hi = min(s * per, n_tiles) * block_n, min((s + 1) * per * block_n, n)
        if lo >= hi:
            parts.append((torch.zeros_like(want), torch.full_like(want_lse, float("-inf"))))
            continue
        # Causal limits of the full sequence: keys past the split stay hidden; keys before it are another split's.
        s_full = torch.einsum("bihd,bjhd->bhij", q.float(), k.float().repeat_interleave(2, 2)) * 0.125
        visible = torch.arange(n)[None, :] <= torch.arange(sq)[:, None] + n - sq
        inside = (torch.arange(n) >= lo) & (torch.arange(n) < hi)
        sc = s_full.masked_fill(~(visible & inside), float("-inf"))
        m = sc.amax(-1, keepdim=True)
        p = torch.exp(sc - torch.where(torch.isinf(m), torch.zeros_like(m), m))
        tot = p.sum(-1, keepdim=True)
        o = (p / torch.where(tot > 0, tot, torch.ones_like(tot))) @ v.float().repeat_interleave(2, 2).transpose(1, 2)
        lse = torch.where(tot > 0, m + torch.log(tot), torch.full_like(m, float("-inf"))).squeeze(-1)
        parts.append((o.transpose(1, 2), lse))
    lses = torch.stack([p[1] for p in parts])  # [splits, 1, H, Sq]
    mx = lses.amax(0)
    tot = torch.exp(lses - torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)).sum(0)
    lse = torch.where(tot > 0, mx + torch.log(tot), torch.full_like(mx, float("-inf")))
    w = torch.exp(lses - lse)  # [splits, 1, H, Sq]
    out = sum(w[s].transpose(1, 2)[..., None] * parts[s][0] for s in range(splits))
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ params, shapes

def test_call_samples_configs_and_combine_resolve_to_artifacts():
    built = {tuple(sorted(p.items())) for p in mod.artifact_params()}
    rows = [{**mod.DEFAULTS, **c} for c in mod.CONFIGS + mod.BENCH_CONFIGS]
    for cfg in mod.call_samples(random.Random(0)) + rows:
        assert tuple(sorted(mod.compile_params(**cfg).items())) in built
        assert tuple(sorted(mod.compile_params("combine", **cfg).items())) in built


def test_roofline_counts_the_cache_bytes():
    m = mod.roofline(B=2, Sq=1, Hq=32, Hkv=8, D=128, Sk=8192)
    assert m["bytes"] >= 2 * 8192 * 8 * 256 * 2 and m["flops"] == 2 * 2 * 32 * 256 * 8192
    assert mod.roofline(B=2, Sq=1, Hq=32, Hkv=8, D=128, seqlens_k=[8192, 8192]) == m


# ------------------------------------------------------------------------------------------------ the builds

# One representative build of each kernel in CI (the others are built by `build --all`).
@pytest.mark.parametrize("params", [
    {"kernel": "decode", "dtype": "bfloat16", "head_dim": 128, "head_dim_v": 128},
    {"kernel": "combine", "dtype": "bfloat16"},
], ids=["decode_bf16_d128", "combine_bf16"])
def test_builds_for_sm90a(params):
    pytest.importorskip("tvm")
    from tirx_kernels.core import build, testing

    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed")
    testing.build_and_check_sass(mod, "flash_attention4_kvcache", params)


def test_a_misaligned_cache_base_is_refused_naming_it():
    """TMA needs a 16-byte base; a KV cache is never copied to fix one (the launch path checks real pointers)."""
    q = _t(1, 1, 4, 64)
    kc = torch.randn(2 * 16 * 4 * 64 + 4).to(torch.bfloat16)[4:].view(2, 16, 4, 64)  # 8 bytes past an alignment
    out, lse = _t(1, 1, 4, 64), torch.empty(1, 4, 1)
    with pytest.raises(checks.TirxInputError, match=re.escape("argument 'k_cache'")):
        mod._run(q, kc, kc, None, 16, torch.zeros(1, 1, dtype=torch.int32), 16, 1, 0.125, False, out, lse)
