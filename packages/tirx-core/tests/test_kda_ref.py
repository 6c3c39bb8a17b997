# SPDX-License-Identifier: Apache-2.0
"""The KDA oracles (core.kda_ref): the chunked form against the token recurrence in fp64 over a ragged batch
(empty, 1-token, chunk-boundary and multi-chunk sequences, an initial state), a hand-written single step, and the
autograd gradients of the chunked form against those of the recurrence."""

import torch

from tirx_kernels.core import kda_ref


def _inputs(lens, h=2, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q, k, v, g = (torch.randn(1, t, h, 128, generator=gen, dtype=dtype) for _ in range(4))
    beta = torch.randn(1, t, h, generator=gen, dtype=dtype)
    a_log = torch.randn(h, generator=gen, dtype=dtype) * 0.5
    dt = torch.randn(h * 128, generator=gen, dtype=dtype) * 0.5
    h0 = torch.randn(len(lens), h, 128, 128, generator=gen, dtype=dtype) * 0.1
    cu = torch.tensor([0] + lens).cumsum(0)
    return q, k, v, g, beta, a_log, dt, h0, cu


def test_chunked_matches_recurrence_fp64():
    q, k, v, g, beta, a_log, dt, h0, cu = _inputs([70, 0, 1, 64, 130])
    args = (q, k, v, g, beta, a_log, dt, 128 ** -0.5, h0, cu)
    oc, sc = kda_ref.forward(*args, dtype=torch.float64, form="chunked")
    orr, sr = kda_ref.forward(*args, dtype=torch.float64, form="recurrent")
    torch.testing.assert_close(oc, orr, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(sc, sr, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(sc[1], h0[1])  # an empty sequence passes its state through


def test_one_step_by_hand():
    q, k, v, g, beta, a_log, dt, h0, cu = _inputs([1], h=1)
    o, s = kda_ref.forward(q, k, v, g, beta, a_log, dt, 0.5, h0, cu, lower_bound=-5.0, dtype=torch.float64)
    qn, kn = kda_ref.l2norm(q[0, 0, 0]), kda_ref.l2norm(k[0, 0, 0])
    gl = -5.0 * torch.sigmoid(torch.exp(a_log[0]) * (g[0, 0, 0] + dt))
    S = torch.exp(gl)[:, None] * h0[0, 0]
    S = S + torch.outer(kn, torch.sigmoid(beta[0, 0, 0]) * (v[0, 0, 0] - S.T @ kn))
    torch.testing.assert_close(s[0, 0], S)
    torch.testing.assert_close(o[0, 0, 0], 0.5 * S.T @ qn)


def test_chunked_gradients_match_the_recurrence():
    q, k, v, g, beta, a_log, dt, h0, cu = _inputs([5, 0, 1, 70], h=1, seed=1)
    gen = torch.Generator().manual_seed(2)
    do = torch.randn(v.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(h0.shape, generator=gen, dtype=torch.float64)
    args = (q, k, v, g, beta, a_log, dt, 128 ** -0.5, h0, cu, do, dht)
    gc = kda_ref.grads(*args, dtype=torch.float64, form="chunked")
    gr = kda_ref.grads(*args, dtype=torch.float64, form="recurrent")
    for name in kda_ref.GRAD_NAMES:
        torch.testing.assert_close(gc[name], gr[name], atol=1e-9, rtol=1e-8, msg=name)
    assert gc["g"].abs().sum() > 0 and gc["initial_state"][1].abs().sum() > 0
