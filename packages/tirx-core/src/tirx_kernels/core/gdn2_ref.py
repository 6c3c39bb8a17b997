# SPDX-License-Identifier: Apache-2.0
# The GDN-2 recurrence as cuDNN Frontend's linear-attention kernels define it (python/cudnn/linear_attention/frost,
# https://github.com/NVIDIA/cudnn-frontend v1.28.0, commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082) and FlashInfer's
# chunk_gated_delta_rule2 documents it; read for semantics, written anew.
"""torch oracles of Gated DeltaNet 2 (GDN-2) over THD-packed sequences: a token-by-token recurrence and the chunked
(WY) form, fp32 or fp64, with cuDNN's per-segment state checkpoints.

Per state head, the state S is [V, K] (a row per value, keys contiguous: cuDNN's [N, H, V, K] layout). Per token,
with the per-key-channel log decay g_t [K], the per-key-channel erase gate b_t [K] and the per-value-channel write
gate w_t [V]:

    S   = S diag(exp(g_t))                 (decay along the key axis)
    u_t = w_t * v_t - S (b_t * k_t)        (the gated write minus what the erase-gated key reads)
    S   = S + u_t k_t^T
    o_t = scale S q_t

Channel-constant g and b = w = beta give the GDN-1 delta rule (``core.delta_rule_ref``; the CPU test checks it).
Head maps as GDN-1 (``delta_rule_ref.head_maps``): H = max(Hq, Hv) state heads; g, b [T, H, K], w [T, H, V].
Gate forms: the natural-log decay, or cuDNN's safe gate ``lower_bound * sigmoid(exp(A_log[h]) (x + dt_bias[h]))``
(``A_log`` [H], ``dt_bias`` [H, K], ``lower_bound`` -5 by default); b post-sigmoid or logits; optional q/k L2
normalisation (x rsqrt(sum x^2 + 1e-24), in fp32)."""

from __future__ import annotations

import torch

from tirx_kernels.core.delta_rule_ref import head_maps

L2_EPS2 = 1e-24
DEFAULT_LOWER_BOUND = -5.0


def gates(g, b, w, safe_gate: bool = False, a_log=None, dt_bias=None, lower_bound: float = DEFAULT_LOWER_BOUND,
          use_beta_sigmoid: bool = False, dtype=torch.float32):
    """(log decay, erase gate, write gate) in ``dtype``, from cuDNN's gate forms; None gates: no decay, ones."""
    gf = None if g is None else g.to(dtype)
    if safe_gate:
        x = gf + dt_bias.to(dtype)[None]
        gf = lower_bound * torch.sigmoid(torch.exp(a_log.to(dtype))[None, :, None] * x)
    bf = None if b is None else (torch.sigmoid(b.to(dtype)) if use_beta_sigmoid else b.to(dtype))
    return gf, bf, None if w is None else w.to(dtype)


def l2norm(x, dtype=torch.float32):
    xf = x.to(dtype)
    return xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + L2_EPS2)


def _inputs(q, k, v, g, b, w, scale, initial_state, cu_seqlens, use_qk_l2norm, dtype):
    hs, qh, kh, vh = head_maps(q.shape[1], k.shape[1], v.shape[1])
    if use_qk_l2norm:
        q, k = l2norm(q, dtype), l2norm(k, dtype)
    qf, kf, vf = (x.to(dtype)[:, idx] for x, idx in ((q, qh), (k, kh), (v, vh)))  # [T, H, D]
    total, dk, dv = qf.shape[0], kf.shape[-1], vf.shape[-1]
    dev = q.device
    g = torch.zeros(total, hs, dk, dtype=dtype, device=dev) if g is None else g.to(dtype)
    b = torch.ones(total, hs, dk, dtype=dtype, device=dev) if b is None else b.to(dtype)
    w = torch.ones(total, hs, dv, dtype=dtype, device=dev) if w is None else w.to(dtype)
    scale = dk ** -0.5 if scale is None else scale
    cu = [int(x) for x in cu_seqlens.cpu()]
    n = len(cu) - 1
    state = (torch.zeros(n, hs, dv, dk, dtype=dtype, device=dev) if initial_state is None
             else initial_state.to(dtype).clone())
    return qf, kf, vf, g, b, w, scale, cu, state


def _run(step, q, k, v, g, b, w, scale, initial_state, cu_seqlens, use_qk_l2norm, dtype, checkpoint_every):
    """Drive ``step(S, t0, t1) -> (out rows, S)`` over each sequence's segments of ``checkpoint_every`` tokens (the
    whole sequence without), recording the state entering each segment."""
    qf, kf, vf, g, b, w, scale, cu, state = _inputs(q, k, v, g, b, w, scale, initial_state, cu_seqlens,
                                                     use_qk_l2norm, dtype)
    out = torch.zeros(qf.shape[0], qf.shape[1], vf.shape[-1], dtype=dtype, device=q.device)
    ckpts = []
    args = (qf, kf, vf, g, b, w, scale)
    for n in range(len(cu) - 1):
        S = state[n]
        seg = checkpoint_every or max(cu[n + 1] - cu[n], 1)
        for t0 in range(cu[n], cu[n + 1], seg):
            if checkpoint_every:
                ckpts.append(S.clone())  # S may be a view of the state rows written below
            t1 = min(t0 + seg, cu[n + 1])
            out[t0:t1], S = step(S, t0, t1, *args)
        state[n] = S
    return out, state, (torch.stack(ckpts) if ckpts else None)


def _recurrent_step(S, t0, t1, q, k, v, g, b, w, scale):
    rows = []
    for t in range(t0, t1):
        S = S * torch.exp(g[t])[:, None, :]
        u = w[t] * v[t] - (S * (b[t] * k[t])[:, None, :]).sum(-1)  # [H, V]
        S = S + u[..., None] * k[t][:, None, :]
        rows.append(scale * (S * q[t][:, None, :]).sum(-1))
    return torch.stack(rows), S


def gdn2_recurrent(q, k, v, g=None, b=None, w=None, scale=None, initial_state=None, cu_seqlens=None,
                   use_qk_l2norm: bool = False, dtype=torch.float32, checkpoint_every: int = 0):
    """The token-by-token recurrence: ``(out [T, H, V], final state [N, H, V, K], checkpoints [count, H, V, K] or
    None)`` in ``dtype``; checkpoint i of a sequence is the state entering its token i * ``checkpoint_every``."""
    return _run(_recurrent_step, q, k, v, g, b, w, scale, initial_state, cu_seqlens, use_qk_l2norm, dtype,
                checkpoint_every)


def _chunk_step(chunk_size):
    def step(S, t0, t1, q, k, v, g, b, w, scale):
        rows = []
        for c0 in range(t0, t1, chunk_size):
            c1 = min(c0 + chunk_size, t1)
            c = c1 - c0
            Q, K, V, Gl, B, W = (x[c0:c1].transpose(0, 1) for x in (q, k, v, g, b, w))  # [H, c, D]
            G = torch.cumsum(Gl, 1)  # [H, c, K], inclusive
            # decay[i, j, d] = exp(G_i - G_j) for j <= i (0 above the diagonal; G is non-increasing for log decays)
            diff = G[:, :, None, :] - G[:, None, :, :]
            lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
            decay = torch.exp(diff.masked_fill(~lower[None, :, :, None], float("-inf")))
            strict = lower & ~torch.eye(c, dtype=torch.bool, device=q.device)
            A = torch.einsum("hid,hjd,hijd->hij", B * K, K, decay) * strict
            gam = torch.exp(G)
            rhs = W * V - ((B * K * gam) @ S.transpose(1, 2))  # [H, c, V]
            eye = torch.eye(c, dtype=q.dtype, device=q.device)
            U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
            P = torch.einsum("hid,hjd,hijd->hij", Q, K, decay)  # causal (decay is 0 above the diagonal)
            rows.append(scale * ((Q * gam) @ S.transpose(1, 2) + P @ U).transpose(0, 1))
            tail = torch.exp(G[:, -1:, :] - G)  # [H, c, K]
            S = S * torch.exp(G[:, -1, :])[:, None, :] + U.transpose(1, 2) @ (K * tail)
        return torch.cat(rows), S
    return step


def gdn2_chunked(q, k, v, g=None, b=None, w=None, scale=None, initial_state=None, cu_seqlens=None,
                 use_qk_l2norm: bool = False, dtype=torch.float32, checkpoint_every: int = 0, chunk_size: int = 16):
    """The chunked (WY) form, ``chunk_size`` tokens (cuDNN's GDN-2 kernels: 16) from the state S entering it, G the
    in-chunk inclusive cumulative log decay per key channel:

        A[i, j] = sum_d b_i[d] k_i[d] k_j[d] exp(G_i[d] - G_j[d])    (j < i)
        U       = (I + A)^-1 (W * V - (B * K * exp(G)) S^T)          (the chunk's writes u_t)
        O       = scale ((Q * exp(G)) S^T + (sum_d q_i[d] k_j[d] exp(G_i[d] - G_j[d]), j <= i) U)
        S       = S diag(exp(G_last)) + U^T (K * exp(G_last - G))

    Same outputs as :func:`gdn2_recurrent` up to rounding."""
    return _run(_chunk_step(chunk_size), q, k, v, g, b, w, scale, initial_state, cu_seqlens, use_qk_l2norm, dtype,
                checkpoint_every)
