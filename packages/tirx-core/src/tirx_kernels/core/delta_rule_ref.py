# SPDX-License-Identifier: Apache-2.0
"""fp32 torch oracle of the delta-rule decode template (:mod:`tirx_kernels.core.lang.delta_rule`): the recurrence,
the gate forms and the state-pool addressing written out in torch, plus the pool comparator the kernels' harness
checks use (slots a call does not address stay bit-identical)."""

from __future__ import annotations

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
