# SPDX-License-Identifier: Apache-2.0
# Conventions of cudnn-frontend's GDN bprop (python/cudnn/linear_attention/frost/kernel/gdn_bprop_f16.py, v1.28.0
# 1dbd2c09432dfd6cbf13a0ad85a071446398c082): natural-log gate, gradients at HO = max(HQ, HV) heads folded onto q/k/v
# heads, per-chunk checkpoints of the states entering chunks (this package's forward writes checkpoint 0 = the initial
# state: ceil(len / 64) of them a sequence); read for semantics only.
"""Oracles of the GDN-1 backward: the forward with its checkpoints (what the recompute kernel writes), the gradients
by torch autograd through tirx-core's chunked fp32/fp64 forward (``core.delta_rule_ref.gdn_prefill_chunked``), and
the closed-form chunked backward of ``_bwd_chunks`` end to end (torch; the op's stages are built from it).

States are ``[N, HO, V, K]`` (a row per value, keys contiguous: issue 26's contract and tirx-core's prefill oracle;
cuDNN stores ``[.., K, V]``); the checkpoints ``[C, HO, V, K]``, the state entering every chunk: C = sum over
sequences of ceil(len / 64), checkpoint 0 of a sequence its initial state."""

from __future__ import annotations

import torch

from tirx_kernels.core import delta_rule_ref
from tirx_kernels.ported.cudnn.linear_attention import _bwd_chunks as ch


def forward_checkpoints(q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, dtype=torch.float32):
    """(out [T, HO, V], final state [N, HO, V, K], checkpoints [C, HO, V, K]) of the chunked forward in ``dtype``."""
    hs, qh, kh, vh = delta_rule_ref.head_maps(q.shape[1], k.shape[1], v.shape[1])
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    lens = ch.lengths(cu_seqlens)
    counts = ch.checkpoint_counts(lens)
    ckpts = torch.zeros(sum(counts), hs, ch.DIM, ch.DIM, dtype=dtype, device=q.device)
    out = torch.zeros(q.shape[0], hs, ch.DIM, dtype=dtype, device=q.device)
    final = torch.zeros(len(lens), hs, ch.DIM, ch.DIM, dtype=dtype, device=q.device)
    base, t0 = 0, 0
    for n, length in enumerate(lens):
        s = None if initial_state is None else initial_state[n:n + 1]
        for j in range(-(-length // ch.CHUNK)):
            a, b = t0 + j * ch.CHUNK, t0 + min((j + 1) * ch.CHUNK, length)
            cu = torch.tensor([0, b - a], dtype=torch.int32)
            ckpts[base + j] = 0 if s is None else s[0]
            o, s = delta_rule_ref.gdn_prefill_chunked(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], scale, s, cu,
                                                      gate_domain="log", dtype=dtype, chunk_size=ch.CHUNK)
            out[a:b] = o
        if length:
            final[n] = s[0]
        elif initial_state is not None:
            final[n] = initial_state[n].to(dtype)
        base += counts[n]
        t0 += length
    return out, final, ckpts


def _functional_forward(q, k, v, g, beta, scale, h0, cu_seqlens, dtype):
    """The chunked forward of ``core.delta_rule_ref.gdn_prefill_chunked`` (same formulas) without in-place writes,
    so autograd can run through it."""
    hs, qh, kh, vh = delta_rule_ref.head_maps(q.shape[1], k.shape[1], v.shape[1])
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qf, kf, vf = q[:, qh], k[:, kh], v[:, vh]
    outs, finals, t0 = [], [], 0
    eye_full = torch.eye(ch.CHUNK, dtype=dtype, device=q.device)
    for n, length in enumerate(ch.lengths(cu_seqlens)):
        S = h0[n] if h0 is not None else torch.zeros(hs, ch.DIM, ch.DIM, dtype=dtype, device=q.device)
        for a in range(t0, t0 + length, ch.CHUNK):
            b = min(a + ch.CHUNK, t0 + length)
            c = b - a
            Q, K, V = (x[a:b].transpose(0, 1) for x in (qf, kf, vf))
            G = torch.cumsum(g[a:b].transpose(0, 1), -1)
            bt = beta[a:b].transpose(0, 1)
            lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
            diff = G[:, :, None] - G[:, None, :]
            decay = torch.exp(torch.where(lower, diff, torch.full_like(diff, -float("inf"))))
            eye = eye_full[:c, :c]
            A = bt[:, :, None] * (K @ K.transpose(1, 2)) * decay * (1 - eye)
            rhs = bt[:, :, None] * (V - torch.exp(G)[:, :, None] * (K @ S.transpose(1, 2)))
            D = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
            Oc = torch.exp(G)[:, :, None] * (Q @ S.transpose(1, 2)) + ((Q @ K.transpose(1, 2)) * decay) @ D
            outs.append((scale * Oc).transpose(0, 1))
            gc = G[:, -1:]
            S = torch.exp(gc)[:, :, None] * S + (D * torch.exp(gc - G)[:, :, None]).transpose(1, 2) @ K
        finals.append(S)
        t0 += length
    out = torch.cat(outs) if outs else torch.zeros(0, hs, ch.DIM, dtype=dtype, device=q.device)
    return out, torch.stack(finals)


def autograd_grads(q, k, v, g, beta, do, cu_seqlens, scale=None, initial_state=None, d_final_state=None,
                   dtype=torch.float32) -> dict:
    """dq, dk, dv (at q/k/v heads), dg, dbeta [T, HO], d_initial_state [N, HO, V, K] of
    sum(out * dO) + sum(final * d_final) by autograd through the chunked forward in ``dtype``."""
    leaves = {name: t.detach().to(dtype).requires_grad_(True) for name, t in
              (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))}
    h0 = None
    if initial_state is not None:
        h0 = initial_state.detach().to(dtype).requires_grad_(True)
        leaves["initial_state"] = h0
    out, final = _functional_forward(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], scale, h0,
                                     cu_seqlens, dtype)
    loss = (out * do.to(dtype)).sum()
    if d_final_state is not None:
        loss = loss + (final * d_final_state.to(dtype)).sum()
    loss = loss + 0 * sum(x.sum() for x in leaves.values())  # connected even with no token and no state term
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    res = {}
    for n, gr in zip(names, grads):
        res["d_" + n if n == "initial_state" else "d" + n] = (torch.zeros_like(leaves[n]) if gr is None
                                                              else gr.detach())
    return res


def fold_heads(x, n_heads: int):
    """[T, HO, D] gradients of the state heads summed onto ``n_heads`` source heads (head h reads source
    h // (HO / n_heads))."""
    t, hs = x.shape[:2]
    return x.view(t, n_heads, hs // n_heads, *x.shape[2:]).sum(2)


def chunked_grads(q, k, v, g, beta, do, cu_seqlens, checkpoints, scale=None, initial_state=None,
                  d_final_state=None, dtype=torch.float32, scan=None, layout: str = "pre_chunk") -> dict:
    """The closed-form chunked backward from the checkpoints (``scan``: the reverse state walk, default the torch
    loop ``_bwd_chunks.state_scan``; the op passes the TIRx kernel). ``initial_state`` is read only by the ``cudnn``
    checkpoint layout (the ``pre_chunk`` one holds it as checkpoint 0); ``d_initial_state`` is always returned."""
    hs, qh, kh, vh = delta_rule_ref.head_maps(q.shape[1], k.shape[1], v.shape[1])
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    cmap = ch.ChunkMap(cu_seqlens, q.device, ch.CHUNK, layout)
    total = q.shape[0]
    qx, kx, vx = q[:, qh], k[:, kh], v[:, vh]
    S = ch.entering_states(cmap, checkpoints, dtype, initial_state)
    f = ch.forward_pieces(cmap, qx, kx, vx, g, beta, S, scale, dtype)
    dO = cmap.gather(do, dtype)
    f.update(ch.scan_inputs(f, dO, scale))
    scan = scan or (lambda cm, ff, dfs: ch.state_scan(cm, ff, dfs, hs, dtype))
    dS, d0 = scan(cmap, f, d_final_state)
    dq, dk, dv, dbeta, dg = ch.gradients(cmap, f, dO, dS, scale)
    res = {"dq": fold_heads(cmap.scatter(dq, total), q.shape[1]),
           "dk": fold_heads(cmap.scatter(dk, total), k.shape[1]),
           "dv": fold_heads(cmap.scatter(dv, total), v.shape[1]),
           "dg": cmap.scatter(dg, total), "dbeta": cmap.scatter(dbeta, total), "d_initial_state": d0}
    return res
