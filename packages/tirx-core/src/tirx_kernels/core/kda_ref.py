# SPDX-License-Identifier: Apache-2.0
# Semantics follow fla's chunk_kda (fla-org/flash-linear-attention, fla/ops/kda, commit 9c8e42e7: safe gate
# lower_bound * sigmoid(exp(A_log) (g + dt_bias)), beta sigmoid, q/k L2 norm, state [N, H, K, V]); read, not copied.
"""fp32 / fp64 torch oracles of KDA (Kimi Delta Attention) over THD-packed variable-length sequences: the token
recurrence, the chunked form the kernels compute, and gradients by autograd through the chunked form.

Per sequence and head, state ``S`` ``[K, V]`` (fla's layout), token by token with the per-key-channel log gate
``g_t`` (``[K]``, <= 0), beta ``b_t``, L2-normalised ``q_t``, ``k_t``::

    S   = diag(exp(g_t)) S
    S  += k_t (b_t (v_t - S^T k_t))^T
    o_t = scale S^T q_t

The safe gate (``gate``): ``g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias[h, :]))``; beta =
``sigmoid(beta_raw)``; ``l2norm(x) = x * rsqrt(sum x^2 + 1e-6)``.
"""

from __future__ import annotations

import torch

DIM = 128
L2_EPS = 1e-6
CHUNK = 64


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gate(g_raw, A_log, dt_bias, lower_bound: float):  # noqa: N803
    """The per-step log gate ``[T, H, K]`` (in ``g_raw``'s float dtype) of the safe gate."""
    h = g_raw.shape[-2]
    x = g_raw + dt_bias.to(g_raw.dtype).view(h, -1)
    return lower_bound * torch.sigmoid(torch.exp(A_log.to(g_raw.dtype))[:, None] * x)


def activate(q, k, v, g_raw, beta_raw, A_log, dt_bias, lower_bound, dtype):  # noqa: N803
    """(q', k', v, log gate, beta) in ``dtype`` from the raw [T, H, *] inputs (no batch dim)."""
    qf, kf, vf = (x.to(dtype) for x in (q, k, v))
    return (l2norm(qf), l2norm(kf), vf, gate(g_raw.to(dtype), A_log, dt_bias, lower_bound),
            torch.sigmoid(beta_raw.to(dtype)))


def _bounds(cu_seqlens) -> list[int]:
    return [int(x) for x in cu_seqlens.cpu()]


def recurrent(q, k, v, g, beta, scale, initial_state, cu_seqlens):
    """Token recurrence on activated inputs ``[T, H, D]`` (g: log gate, beta: [T, H]); ``initial_state``
    ``[N, H, K, V]`` or None. Returns ``(o [T, H, V], final [N, H, K, V])`` in q's dtype."""
    cu = _bounds(cu_seqlens)
    n, h = len(cu) - 1, q.shape[1]
    o = torch.zeros_like(v)
    finals = []
    for s in range(n):
        S = (torch.zeros(h, DIM, DIM, dtype=q.dtype, device=q.device) if initial_state is None
             else initial_state[s].to(q.dtype))
        for t in range(cu[s], cu[s + 1]):
            S = S * torch.exp(g[t])[:, :, None]
            pred = torch.einsum("hkv,hk->hv", S, k[t])
            S = S + k[t][:, :, None] * (beta[t][:, None] * (v[t] - pred))[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", S, q[t])
        finals.append(S)
    return o, torch.stack(finals) if finals else torch.zeros(0, h, DIM, DIM, dtype=q.dtype, device=q.device)


def _chunk_step(q, k, v, g, beta, S, scale):  # noqa: N803
    """One chunk of :func:`chunked`: rows [c, H, D] from state S [H, K, V] -> (o [H, c, V], S)."""
    c = q.shape[0]
    Q, K, V = (x.transpose(0, 1) for x in (q, k, v))  # [H, c, D]
    G = torch.cumsum(g.transpose(0, 1), 1)  # [H, c, K]
    b = beta.transpose(0, 1)  # [H, c]
    diff = G[:, :, None, :] - G[:, None, :, :]  # [H, i, j, K]
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp(torch.where(lower[None, :, :, None], diff, torch.full_like(diff, -torch.inf)))
    kk = torch.einsum("hik,hjk,hijk->hij", K, K, decay)
    qk = torch.einsum("hik,hjk,hijk->hij", Q, K, decay)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    A = b[:, :, None] * kk * (1 - eye)
    rhs = b[:, :, None] * (V - (K * torch.exp(G)) @ S)
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    o = scale * ((Q * torch.exp(G)) @ S + qk @ U)
    glast = G[:, -1]  # [H, K]
    S = torch.exp(glast)[:, :, None] * S + (K * torch.exp(glast[:, None, :] - G)).transpose(1, 2) @ U
    return o, S


def chunked(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk: int = CHUNK):
    """The chunked (WY) form, same arguments and result as :func:`recurrent` up to rounding. Per chunk of ``c``
    tokens from state ``S`` (G the in-chunk inclusive cumulative log gate, per key channel)::

        A[i, j] = beta_i sum_c k_ic k_jc exp(G_ic - G_jc)        j < i
        P[i, j] = scale sum_c q_ic k_jc exp(G_ic - G_jc)         j <= i
        U       = (I + A)^-1 diag(beta) (V - (K o exp(G)) S)
        O       = scale (Q o exp(G)) S + P U
        S       = diag(exp(G_last)) S + (K o exp(G_last - G))^T U

    Differentiable (used by :func:`grads`)."""
    cu = _bounds(cu_seqlens)
    n, h = len(cu) - 1, q.shape[1]
    outs = []
    finals = []
    for s in range(n):
        S = (torch.zeros(h, DIM, DIM, dtype=q.dtype, device=q.device) if initial_state is None
             else initial_state[s].to(q.dtype))
        for t0 in range(cu[s], cu[s + 1], chunk):
            t1 = min(t0 + chunk, cu[s + 1])
            args = (q[t0:t1], k[t0:t1], v[t0:t1], g[t0:t1], beta[t0:t1], S, scale)
            if torch.is_grad_enabled():  # recomputed in the backward: the [H, c, c, K] decays are not kept
                oc, S = torch.utils.checkpoint.checkpoint(_chunk_step, *args, use_reentrant=False)
            else:
                oc, S = _chunk_step(*args)
            outs.append(oc)
        finals.append(S)
    o = torch.cat(outs, 1).transpose(0, 1) if outs else torch.zeros_like(v)
    return o, torch.stack(finals) if finals else torch.zeros(0, h, DIM, DIM, dtype=q.dtype, device=q.device)


def forward(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, cu_seqlens, lower_bound=-5.0,  # noqa: N803
            dtype=torch.float32, form: str = "chunked"):
    """The whole KDA forward from raw inputs ``[1, T, H, D]`` (``beta`` ``[1, T, H]``): ``(o [1, T, H, V],
    final [N, H, K, V])`` in ``dtype``."""
    qa, ka, va, ga, ba = activate(q[0], k[0], v[0], g[0], beta[0], A_log, dt_bias, lower_bound, dtype)
    h0 = None if initial_state is None else initial_state.to(dtype)
    fn = {"chunked": chunked, "recurrent": recurrent}[form]
    o, ht = fn(qa, ka, va, ga, ba, scale, h0, cu_seqlens)
    return o[None], ht


GRAD_NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")


def grads(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, cu_seqlens, do, dht,  # noqa: N803
          lower_bound=-5.0, dtype=torch.float32, form: str = "chunked") -> dict:
    """Gradients of ``<o, do> + <final, dht>`` (``dht`` may be None) with respect to the raw inputs, by autograd
    through :func:`forward` in ``dtype``: ``{name: grad}`` for ``GRAD_NAMES`` (``initial_state``: None when not
    given)."""
    leaves = {name: (None if t is None else t.detach().to(dtype).requires_grad_(True))
              for name, t in zip(GRAD_NAMES, (q, k, v, g, beta, A_log, dt_bias, initial_state))}
    with torch.enable_grad():
        o, ht = forward(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], leaves["A_log"],
                        leaves["dt_bias"], scale, leaves["initial_state"], cu_seqlens, lower_bound, dtype, form)
        loss = (o * do.to(dtype)).sum()
        if dht is not None:
            loss = loss + (ht * dht.to(dtype)).sum()
        live = [t for t in leaves.values() if t is not None]
        got = torch.autograd.grad(loss, live, allow_unused=True)
    out = dict.fromkeys(GRAD_NAMES)
    it = iter(got)
    for name, t in leaves.items():
        if t is not None:
            gr = next(it)
            out[name] = torch.zeros_like(t) if gr is None else gr
    return out
