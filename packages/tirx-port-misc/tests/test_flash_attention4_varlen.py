# SPDX-License-Identifier: Apache-2.0
"""flash_attention4_varlen on the CPU: input validation (every failure names its argument), the arguments not
implemented yet, the per-sequence oracle against the batch-padded one and against float64 attention, the byte/FLOP
model, and the sm_90a build (tensor cores for both GEMMs, 3-D TMA, setmaxnreg, no spills). The emulated kernel runs
are in test_flash_attention4_varlen_emulated.py, the GPU runs in test_flash_attention4_varlen_kvcache_gpu.py."""

from __future__ import annotations

import random
import re

import pytest
import torch

from tirx_kernels.core import checks
from tirx_kernels.ported.flashattention import flash_attention4 as fa
from tirx_kernels.ported.flashattention import flash_attention4_varlen as mod


def _t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def _cu(*lengths):
    return mod._cu(lengths, "cpu")


_Q, _K = _t(10, 4, 64), _t(12, 2, 64)
_CQ, _CK = _cu(4, 6), _cu(5, 7)


@pytest.mark.parametrize("kwargs, arg", [
    ({"q": _t(1, 10, 4, 64)}, "q"),
    ({"q": _Q.float()}, "q"),
    ({"k": _K.half()}, "k"),
    ({"k": _t(12, 2, 128)}, "k"),
    ({"v": _t(11, 2, 64)}, "v"),
    ({"v": _t(12, 2, 128)}, "v"),
    ({"k": _t(12, 3, 64), "v": _t(12, 3, 64)}, "k"),
    ({"q": _t(10, 4, 128)[..., ::2]}, "q"),
    ({"cu_seqlens_q": _CQ.long()}, "cu_seqlens_q"),
    ({"cu_seqlens_q": torch.zeros(0, dtype=torch.int32)}, "cu_seqlens_q"),
    ({"cu_seqlens_k": _cu(5, 3, 4)}, "cu_seqlens_k"),
    ({"seqused_k": torch.tensor([1, 2, 3], dtype=torch.int32)}, "seqused_k"),
    ({"seqused_k": torch.tensor([1, 2])}, "seqused_k"),
    ({"max_seqlen_q": -1}, "max_seqlen_q"),
    ({"softmax_scale": float("inf")}, "softmax_scale"),
    ({"out": (_t(10, 4, 32), torch.empty(4, 10))}, "out[0]"),
    ({"out": (_t(10, 4, 64), torch.empty(10, 4))}, "out[1]"),
    ({}, "q"),  # valid, but on the CPU
])
def test_invalid_inputs_name_the_argument(kwargs, arg):
    call = {"q": _Q, "k": _K, "v": _K, "cu_seqlens_q": _CQ, "cu_seqlens_k": _CK, **kwargs}
    with pytest.raises(checks.TirxInputError, match=re.escape(f"argument '{arg}'")):
        mod.flash_attn_varlen_func(**call)


@pytest.mark.parametrize("kwargs, arg", [
    ({"seqused_q": torch.tensor([4, 6], dtype=torch.int32)}, "seqused_q"),
    ({"window_size": (128, 0)}, "window_size"),
    ({"softcap": 30.0}, "softcap"),
    ({"learnable_sink": torch.zeros(4)}, "learnable_sink"),
    ({"num_splits": 4}, "num_splits"),
])
def test_unimplemented_arguments_raise_naming_them(kwargs, arg):
    with pytest.raises(NotImplementedError, match=re.escape(f"argument '{arg}'")):
        mod.flash_attn_varlen_func(_Q, _K, _K, _CQ, _CK, **kwargs)


def test_oracle_equals_the_batch_oracle_on_equal_lengths():
    torch.manual_seed(0)
    q, k, v = _t(3, 37, 4, 64), _t(3, 50, 2, 64), _t(3, 50, 2, 64)
    for causal in (False, True):
        want, want_lse = fa.attention_fp32(q, k, v, 0.125, causal)
        got, got_lse = mod.attention_varlen_fp32(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), _cu(37, 37, 37),
                                                 _cu(50, 50, 50), 0.125, causal)
        assert torch.equal(got, want.flatten(0, 1))
        assert torch.equal(got_lse, want_lse.permute(1, 0, 2).flatten(1, 2))


def test_oracle_per_sequence_with_empty_ones_and_seqused_k():
    """Against float64 softmax attention per sequence, bottom-right causal; a sequence with no key: out 0, lse -inf."""
    torch.manual_seed(1)
    lq, lk, used = [3, 0, 5, 4], [6, 2, 0, 9], [6, 1, 0, 2]
    q, k, v = _t(sum(lq), 2, 64), _t(sum(lk), 1, 64), _t(sum(lk), 1, 64)
    out, lse = mod.attention_varlen_fp32(q, k, v, mod._cu(lq, "cpu"), mod._cu(lk, "cpu"), 0.2, True,
                                         torch.tensor(used, dtype=torch.int32))
    qs = ks = 0
    for nq, nk, u in zip(lq, lk, used):
        qq, kk, vv = q[qs:qs + nq].double(), k[ks:ks + u].double(), v[ks:ks + u].double()
        for i in range(nq):
            lim = i + u - nq  # bottom-right: keys 0 .. lim
            if lim < 0:
                assert (out[qs + i] == 0).all() and torch.isinf(lse[:, qs + i]).all()
                continue
            s = torch.einsum("hd,nd->nh", qq[i], kk[:lim + 1, 0]) * 0.2  # [keys, heads]; MQA: one KV head
            p = torch.softmax(s, 0)
            torch.testing.assert_close(out[qs + i].double(), torch.einsum("nh,nd->hd", p, vv[:lim + 1, 0]),
                                       rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lse[:, qs + i].double(), torch.logsumexp(s, 0), rtol=1e-5, atol=1e-5)
        qs, ks = qs + nq, ks + nk


def test_roofline_sums_the_sequences():
    one = fa.roofline(B=1, Sq=100, Sk=100, Hq=4, Hkv=2, D=128, causal=True)
    got = mod.roofline([100, 0, 100], [100, 5, 100], 4, 2, 128, causal=True)
    assert got["flops"] == 2 * one["flops"]


def test_call_samples_and_configs_share_the_batch_artifacts():
    built = {tuple(sorted(p.items())) for p in mod.artifact_params()}
    rows = [{**mod.DEFAULTS, **c} for c in mod.CONFIGS + mod.BENCH_CONFIGS if not c.get("schedule")]
    for cfg in mod.call_samples(random.Random(0)) + rows:
        assert tuple(sorted(mod.compile_params(**cfg).items())) in built


@pytest.mark.parametrize("params", [
    {"dtype": "bfloat16", "head_dim": 128, "head_dim_v": 128, "causal": True, "schedule": mod.SCHEDULE},
], ids=["bf16_d128_causal"])
def test_builds_for_sm90a_with_tensor_cores_and_tma(params):
    pytest.importorskip("tvm")
    from tirx_kernels.core import build, testing

    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed")
    sass = testing.build_and_check_sass(mod, "flash_attention4_varlen", params)
    assert "MUFU.EX2" in sass
