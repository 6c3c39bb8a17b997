# SPDX-License-Identifier: Apache-2.0
"""fp32 torch oracle of the delta-rule decode template (:mod:`tirx_kernels.core.lang.delta_rule`): the recurrence,
the gate forms and the state-pool addressing written out in torch, plus the pool comparator the kernels' harness
checks use (slots a call does not address stay bit-identical); and the two oracles of the chunked Gated DeltaNet
prefill (a token-by-token recurrence and the chunked WY form, fp32 or fp64) over THD-packed sequences."""

from __future__ import annotations

import math

import torch

K_DIM = V_DIM = 128
SOFTPLUS_THRESHOLD = 20.0
L2_EPS = 1e-6
GATE_MODES = ("log", "softplus", "lower_bound")


def gate(g: torch.Tensor, gate_mode: str, A_log=None, dt_bias=None, lower_bound: float = 0.0,  # noqa: N803
         n_heads: int = 1) -> torch.Tensor:
    """The multiplicative per-channel gate exp(...) of ``g`` ``(B, T, HV, K)``; ``A_log`` ``(H,)`` and
    ``dt_bias`` ``(H * K,)`` belong to the query/key head of each value head."""
    gf = g.float()
    if gate_mode == "log":
        return torch.exp(gf)
    n_vheads = g.shape[2]
    ratio = n_vheads // n_heads
    x = gf
    if dt_bias is not None:
        x = x + dt_bias.float().view(n_heads, K_DIM).repeat_interleave(ratio, 0)
    a = torch.exp(A_log.float()).repeat_interleave(ratio)[:, None]  # (HV, 1)
    if gate_mode == "softplus":
        sp = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x)), x)
        return torch.exp(-a * sp)
    if gate_mode == "lower_bound":
        return torch.exp(lower_bound * torch.sigmoid(a * x))
    raise ValueError(f"gate_mode {gate_mode!r}: one of {GATE_MODES}")


def decode(pool, q, k, v, g, beta, slots, scale, use_qk_l2norm=True, gate_mode="log", A_log=None,  # noqa: N803
           dt_bias=None, lower_bound=0.0, beta_is_logit=False, source=None, source_index=None, num_accepted=None):
    """``(out fp32 (B, T, HV, V), new pool)``. ``slots`` ``(B, T)``: token t's checkpoint slot (negative: the
    token is inactive: no state change, output 0, no write); the state is read from ``source[source_index[n]]``
    with a source pool, else from ``pool[slots[n, clamp(num_accepted[n] - 1, 0, T - 1)]]`` (column 0 without
    ``num_accepted``); a negative read slot reads slot 0. Entries are applied in order (distinct slots expected)."""
    batch, ntokens, n_heads, _ = q.shape
    n_vheads = v.shape[2]
    ratio = n_vheads // n_heads
    new = pool.clone()
    qf = q.float().repeat_interleave(ratio, 2)
    kf = k.float().repeat_interleave(ratio, 2)
    if use_qk_l2norm:
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + L2_EPS)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + L2_EPS)
    qf = qf * scale
    gates = gate(g, gate_mode, A_log, dt_bias, lower_bound, n_heads)  # (B, T, HV, K)
    b = beta.float()
    b = torch.sigmoid(b) if beta_is_logit else b
    slots = slots.long().cpu()
    out = torch.zeros(batch, ntokens, n_vheads, V_DIM, device=q.device)
    for n in range(batch):
        if source is not None:
            src, s0 = source, int(source_index[n])
        else:
            c = 0 if num_accepted is None else min(max(int(num_accepted[n]) - 1, 0), ntokens - 1)
            src, s0 = pool, int(slots[n, c])
        S = src[max(s0, 0)].float()  # (HV, V, K)
        for t in range(ntokens):
            slot = int(slots[n, t])
            if slot < 0:
                continue
            S = S * gates[n, t][:, None, :]
            kt = kf[n, t][:, None, :]
            pred = (S * kt).sum(-1)  # (HV, V)
            S = S + (b[n, t][:, None] * (v[n, t].float() - pred))[..., None] * kt
            out[n, t] = (S * qf[n, t][:, None, :]).sum(-1)
            new[slot] = S.to(pool.dtype)
    return out, new


def pool_comparator(key: str, atol: float = 2e-2, rtol: float = 2e-2):
    """Slots the oracle does not write bit-identical to the input, written ones within bf16 tolerance."""
    def compare(got, want, cfg, inputs):
        from tirx_kernels.core import harness

        before = inputs[key]
        lead = before.shape[0]

        def bits(t):
            return t.reshape(lead, -1).contiguous().view(torch.uint8)

        gb, bb = bits(got), bits(before)
        written = (gb != bb).any(1) | (bits(want.to(before.dtype)) != bb).any(1)
        if not torch.equal(gb[~written], bb[~written]):
            raise harness.KernelCheckError(f"{key}: a slot the call does not address changed")
        try:
            torch.testing.assert_close(got[written].float(), want[written].float(), atol=atol, rtol=rtol)
        except AssertionError as e:
            raise harness.KernelCheckError(f"{key}: {str(e)[:600]}") from None
        return {"slots_written": int(written.sum()), "slots_untouched": int((~written).sum())}
    return compare


# ---------------------------------------------------------------------------------------------------------
# Chunked prefill (Gated DeltaNet over THD-packed variable-length sequences): two independent torch oracles
# ---------------------------------------------------------------------------------------------------------
#
# FlashInfer's gdn_prefill conventions: q [T, Hq, K], k [T, Hk, K], v [T, Hv, V] packed over the sequences of
# ``cu_seqlens``; the state heads are Hs = max(Hq, Hv) (GQA: Hq > Hk = Hv; GVA: Hv > Hq = Hk), state head h reads q
# head h / (Hs / Hq), k head h / (Hs / Hk), v head h / (Hs / Hv); g and beta are [T, Hs]; the state is [N, Hs, V, K]
# (a row per value, keys contiguous); out is [T, Hs, V]. Per token, in order:
#     S = a S;  S += beta (v - S k) k^T;  o = scale S q
# with the decay a = exp(g) (``gate_domain="log"``) or a = g (``"linear"``).

LINEAR_GATE_FLOOR = 1e-30  # the chunked form takes log(a): a linear gate of 0 becomes this (the state is wiped)


def head_maps(n_q: int, n_k: int, n_v: int) -> tuple[int, list[int], list[int], list[int]]:
    """``(Hs, q head, k head, v head of each state head)``; raises ValueError unless GQA/GVA divides evenly."""
    hs = max(n_q, n_v)
    for name, n in (("q", n_q), ("k", n_k), ("v", n_v)):
        if n < 1 or hs % n:
            raise ValueError(f"gdn prefill: {name} has {n} heads, which must divide max(Hq, Hv) = {hs}")
    return hs, [h // (hs // n_q) for h in range(hs)], [h // (hs // n_k) for h in range(hs)], \
        [h // (hs // n_v) for h in range(hs)]


def _prefill_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, gate_domain, dtype):
    hs, qh, kh, vh = head_maps(q.shape[1], k.shape[1], v.shape[1])
    total = q.shape[0]
    qf, kf, vf = (x.to(dtype)[:, idx] for x, idx in ((q, qh), (k, kh), (v, vh)))  # [T, Hs, D]
    if g is None:
        log_a = torch.zeros(total, hs, dtype=dtype, device=q.device)
    elif gate_domain == "log":
        log_a = g.to(dtype)
    elif gate_domain == "linear":
        log_a = torch.log(g.to(dtype).clamp_min(LINEAR_GATE_FLOOR))
    else:
        raise ValueError(f"gate_domain {gate_domain!r}: 'log' or 'linear'")
    b = torch.ones(total, hs, dtype=dtype, device=q.device) if beta is None else beta.to(dtype)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    cu = [int(x) for x in cu_seqlens.cpu()]
    n = len(cu) - 1
    state = (torch.zeros(n, hs, vf.shape[-1], kf.shape[-1], dtype=dtype, device=q.device) if initial_state is None
             else initial_state.to(dtype).clone())
    return qf, kf, vf, log_a, b, scale, cu, state


def gdn_prefill_recurrent(q, k, v, g=None, beta=None, scale=None, initial_state=None, cu_seqlens=None,
                          gate_domain: str = "log", dtype=torch.float32):
    """The token-by-token recurrence: ``(out [T, Hs, V], final state [N, Hs, V, K])`` in ``dtype``."""
    qf, kf, vf, log_a, b, scale, cu, state = _prefill_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                                              gate_domain, dtype)
    out = torch.zeros(qf.shape[0], qf.shape[1], vf.shape[-1], dtype=dtype, device=q.device)
    for n in range(len(cu) - 1):
        S = state[n]  # [Hs, V, K]
        for t in range(cu[n], cu[n + 1]):
            S = S * torch.exp(log_a[t])[:, None, None]
            pred = (S * kf[t][:, None, :]).sum(-1)  # [Hs, V]
            S = S + (b[t][:, None] * (vf[t] - pred))[..., None] * kf[t][:, None, :]
            out[t] = scale * (S * qf[t][:, None, :]).sum(-1)
        state[n] = S
    return out, state


def gdn_prefill_chunked(q, k, v, g=None, beta=None, scale=None, initial_state=None, cu_seqlens=None,
                        gate_domain: str = "log", dtype=torch.float32, chunk_size: int = 64):
    """The chunked (WY / UT-transform) form the kernels compute, in ``dtype`` throughout; same result as
    :func:`gdn_prefill_recurrent` up to rounding. Per chunk of ``C`` tokens from state ``S`` (G = the in-chunk
    cumulative sum of log a, gamma = exp(G)):

        A[i, j]  = beta_i (k_i . k_j) gamma_i / gamma_j   (j < i; else 0)
        D        = (I + A)^-1 diag(beta) (V - diag(gamma) K S^T)       (the chunk's "new values")
        O        = scale (diag(gamma) Q S^T + (Q K^T * gamma_i / gamma_j, j <= i) D)
        S        = gamma_C S + D^T diag(gamma_C / gamma) K
    """
    qf, kf, vf, log_a, b, scale, cu, state = _prefill_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                                              gate_domain, dtype)
    out = torch.zeros(qf.shape[0], qf.shape[1], vf.shape[-1], dtype=dtype, device=q.device)
    for n in range(len(cu) - 1):
        S = state[n]
        for t0 in range(cu[n], cu[n + 1], chunk_size):
            t1 = min(t0 + chunk_size, cu[n + 1])
            c = t1 - t0
            Q, K, V = (x[t0:t1].transpose(0, 1) for x in (qf, kf, vf))  # [Hs, c, D]
            G = torch.cumsum(log_a[t0:t1].transpose(0, 1), -1)  # [Hs, c]
            bt = b[t0:t1].transpose(0, 1)
            diff = G[:, :, None] - G[:, None, :]  # G_i - G_j
            lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
            decay = torch.exp(torch.where(lower, diff, torch.full_like(diff, -math.inf)))  # 0 above the diagonal
            eye = torch.eye(c, dtype=dtype, device=q.device)
            A = bt[:, :, None] * (K @ K.transpose(1, 2)) * decay * (1 - eye)
            rhs = bt[:, :, None] * (V - torch.exp(G)[:, :, None] * (K @ S.transpose(1, 2)))
            D = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
            Oc = torch.exp(G)[:, :, None] * (Q @ S.transpose(1, 2)) + ((Q @ K.transpose(1, 2)) * decay) @ D
            out[t0:t1] = (scale * Oc).transpose(0, 1)
            gc = G[:, -1:]
            S = torch.exp(gc)[:, :, None] * S + (D * torch.exp(gc - G)[:, :, None]).transpose(1, 2) @ K
        state[n] = S
    return out, state
