# SPDX-License-Identifier: Apache-2.0
"""The chunked Gated DeltaNet prefill oracles of core.delta_rule_ref: the chunked WY form against the token
recurrence in fp64 (ragged batches with empty and 1-token sequences, chunk-boundary lengths, GQA and GVA head maps,
linear and log gates, no gate / beta), and the recurrence against the decode template's oracle (independent code)."""

import pytest
import torch

from tirx_kernels.core import delta_rule_ref as ref


def _inputs(lens, hq, hk, hv, d=16, seed=0, gate="log", state=True):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    hs = max(hq, hv)
    q = torch.randn(total, hq, d, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(total, hk, d, generator=gen), dim=-1)
    v = torch.randn(total, hv, d, generator=gen)
    a = 0.5 + 0.5 * torch.rand(total, hs, generator=gen)
    g = torch.log(a) if gate == "log" else a
    beta = torch.rand(total, hs, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    h0 = torch.randn(len(lens), hs, d, d, generator=gen) * 0.1 if state else None
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=cu, gate_domain=gate)


@pytest.mark.parametrize("lens, hq, hk, hv, gate", [
    ([70, 0, 1, 64, 129], 2, 2, 4, "log"),      # GVA, ragged, empty and 1-token sequences, chunk boundaries
    ([33, 100], 4, 2, 2, "linear"),             # GQA, linear-domain gate
    ([5], 1, 1, 1, "log"),
])
def test_chunked_matches_recurrence(lens, hq, hk, hv, gate):
    d = _inputs(lens, hq, hk, hv, gate=gate)
    o1, s1 = ref.gdn_prefill_recurrent(**d, scale=0.3, dtype=torch.float64)
    o2, s2 = ref.gdn_prefill_chunked(**d, scale=0.3, dtype=torch.float64, chunk_size=16)
    torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s2, s1, atol=1e-10, rtol=1e-10)
    # An empty sequence passes its initial state through; fp32 agrees with fp64 to fp32 rounding.
    if 0 in lens:
        n = lens.index(0)
        torch.testing.assert_close(s1[n], d["initial_state"][n].double())
    o3, s3 = ref.gdn_prefill_chunked(**d, scale=0.3)
    torch.testing.assert_close(o3.double(), o1, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s3.double(), s1, atol=1e-4, rtol=1e-4)


def test_no_gate_no_beta_no_state():
    d = _inputs([20, 3], 1, 1, 2, state=False)
    d.update(g=None, beta=None)
    o1, s1 = ref.gdn_prefill_recurrent(**d, dtype=torch.float64)
    o2, s2 = ref.gdn_prefill_chunked(**d, dtype=torch.float64, chunk_size=8)
    torch.testing.assert_close(o2, o1, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s2, s1, atol=1e-10, rtol=1e-10)


def test_recurrence_matches_decode_oracle():
    """One sequence through ``decode`` (per-channel gate broadcast from the scalar one, no L2 norm, a pool slot per
    token) gives the prefill recurrence's outputs and final state."""
    lens, hq, hv = [6], 2, 4
    d = _inputs(lens, hq, hq, hv, d=128)
    T = lens[0]
    o, s = ref.gdn_prefill_recurrent(**d, scale=0.2)
    pool = torch.zeros(T + 1, hv, 128, 128)
    pool[T] = d["initial_state"][0]
    g = d["g"][None, :, :, None].expand(1, T, hv, 128)
    out, new = ref.decode(pool, d["q"][None], d["k"][None], d["v"][None], g, d["beta"][None],
                          torch.arange(T)[None], 0.2, use_qk_l2norm=False, source=pool, source_index=[T])
    torch.testing.assert_close(out[0], o, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(new[T - 1], s[0], atol=1e-5, rtol=1e-4)


def test_head_maps():
    assert ref.head_maps(4, 2, 2) == (4, [0, 1, 2, 3], [0, 0, 1, 1], [0, 0, 1, 1])
    assert ref.head_maps(2, 2, 6) == (6, [0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1], [0, 1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="k has 3 heads"):
        ref.head_maps(4, 3, 4)
