# SPDX-License-Identifier: Apache-2.0
"""core.gdn2_ref: the chunked GDN-2 oracle against the token recurrence (fp64, ragged THD batches with empty and
1-token sequences, GQA / GVA heads, checkpoints at each cuDNN cadence), the recurrence against a loop written out
here per token, the reduction to GDN-1 (channel-constant gates, b = w = beta) against core.delta_rule_ref, and the
gate forms."""

import pytest
import torch

from tirx_kernels.core import delta_rule_ref, gdn2_ref


def _data(seqs, hq=2, hk=2, hv=4, dtype=torch.float64, init=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total, n = sum(seqs), len(seqs)
    hs = max(hq, hv)

    def rnd(*shape, s=1.0):
        return s * torch.randn(*shape, generator=gen, dtype=dtype)

    k = torch.nn.functional.normalize(rnd(total, hk, 128), dim=-1)
    return dict(q=rnd(total, hq, 128, s=0.2), k=k, v=rnd(total, hv, 128, s=0.2),
                g=-0.5 * torch.rand(total, hs, 128, generator=gen, dtype=dtype),
                b=torch.rand(total, hs, 128, generator=gen, dtype=dtype),
                w=torch.rand(total, hs, 128, generator=gen, dtype=dtype),
                initial_state=rnd(n, hs, 128, 128, s=0.05) if init else None,
                cu_seqlens=torch.tensor([0] + list(seqs)).cumsum(0))


@pytest.mark.parametrize("seqs, heads, cadence", [
    ((37, 0, 1, 16, 50), (2, 2, 4), 16),
    ((33, 1), (4, 2, 2), 32),
    ((50, 0), (1, 1, 1), 48),
    ((20,), (2, 2, 2), 0),
], ids=["gva_c16", "gqa_c32", "h1_c48", "nockpt"])
def test_chunked_matches_recurrence(seqs, heads, cadence):
    d = _data(seqs, *heads)
    o1, s1, c1 = gdn2_ref.gdn2_recurrent(**d, dtype=torch.float64, checkpoint_every=cadence)
    o2, s2, c2 = gdn2_ref.gdn2_chunked(**d, dtype=torch.float64, checkpoint_every=cadence)
    torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s2, s1, atol=1e-10, rtol=1e-10)
    if cadence:
        assert c1.shape[0] == sum(-(-n // cadence) for n in seqs)
        torch.testing.assert_close(c2, c1, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(c1[0], d["initial_state"][0])  # a sequence's checkpoint 0 is its initial state
    else:
        assert c1 is None and c2 is None
    n_empty = seqs.index(0) if 0 in seqs else None
    if n_empty is not None:  # an empty sequence passes its state through
        torch.testing.assert_close(s1[n_empty], d["initial_state"][n_empty])


def test_chunk_size_64_and_fp32():
    d = _data((70, 3), 2, 2, 2)
    o1, s1, _ = gdn2_ref.gdn2_recurrent(**d, dtype=torch.float64)
    o2, s2, _ = gdn2_ref.gdn2_chunked(**d, dtype=torch.float32, chunk_size=64)
    torch.testing.assert_close(o2.double(), o1, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s2.double(), s1, atol=2e-5, rtol=1e-4)


def test_recurrence_is_the_written_out_rule():
    """One sequence, one head: the update written out per token in matrix form."""
    d = _data((9,), 1, 1, 1)
    o, s, ck = gdn2_ref.gdn2_recurrent(**d, dtype=torch.float64, checkpoint_every=16)
    S = d["initial_state"][0, 0].clone()
    for t in range(9):
        S = S @ torch.diag(torch.exp(d["g"][t, 0]))
        u = d["w"][t, 0] * d["v"][t, 0] - S @ (d["b"][t, 0] * d["k"][t, 0])
        S = S + torch.outer(u, d["k"][t, 0])
        torch.testing.assert_close(o[t, 0], 128 ** -0.5 * S @ d["q"][t, 0])
    torch.testing.assert_close(s[0, 0], S)
    torch.testing.assert_close(ck[0], d["initial_state"][0])


def test_reduces_to_gdn1():
    """Channel-constant decay, b = w = beta: the scalar-gated delta rule of core.delta_rule_ref."""
    d = _data((40, 0, 7), 2, 2, 2)
    total = d["q"].shape[0]
    beta = torch.rand(total, 2, dtype=torch.float64)
    loga = -0.3 * torch.rand(total, 2, dtype=torch.float64)
    o2, s2, _ = gdn2_ref.gdn2_chunked(d["q"], d["k"], d["v"], loga[..., None].expand(-1, -1, 128),
                                      beta[..., None].expand(-1, -1, 128), beta[..., None].expand(-1, -1, 128),
                                      None, d["initial_state"], d["cu_seqlens"], dtype=torch.float64)
    o1, s1 = delta_rule_ref.gdn_prefill_recurrent(d["q"], d["k"], d["v"], loga, beta, None, d["initial_state"],
                                                  d["cu_seqlens"], "log", torch.float64)
    torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s2, s1, atol=1e-10, rtol=1e-10)


def test_gate_forms_and_l2norm():
    g = torch.randn(5, 2, 128)
    a_log, dt = torch.randn(2), torch.randn(2, 128)
    gg, bb, ww = gdn2_ref.gates(g, torch.randn(5, 2, 128), None, safe_gate=True, a_log=a_log, dt_bias=dt,
                                lower_bound=-5.0, use_beta_sigmoid=True)
    want = -5.0 * torch.sigmoid(torch.exp(a_log)[None, :, None] * (g + dt[None]))
    torch.testing.assert_close(gg, want)
    assert (bb > 0).all() and (bb < 1).all() and ww is None
    assert ((gg <= 0) & (gg >= -5)).all()
    x = torch.randn(3, 2, 128)
    torch.testing.assert_close(gdn2_ref.l2norm(x).norm(dim=-1), torch.ones(3, 2))
    d = _data((5,), 1, 1, 1)
    o1, _, _ = gdn2_ref.gdn2_recurrent(**{**d, "q": 3 * d["q"], "k": 2 * d["k"]}, use_qk_l2norm=True,
                                       dtype=torch.float64)
    o2, _, _ = gdn2_ref.gdn2_recurrent(**{**d, "q": d["q"] / d["q"].norm(dim=-1, keepdim=True)},
                                       dtype=torch.float64)
    torch.testing.assert_close(o1, o2)
