# SPDX-License-Identifier: Apache-2.0
# The chunked backward follows fla's chunk_kda backward (fla-org/flash-linear-attention, fla/ops/kda, commit
# 9c8e42e7: per-chunk state checkpoints forward, the state gradient walked backward, chunk-parallel gradients from
# both); read for semantics, written anew.
"""The chunk-parallel part of the KDA backward (``kda_backward_packed``), in torch.

Given each chunk's entering state ``h_in`` (the forward scan's checkpoints) and the gradient of its leaving state
``dh_out`` (the backward walk's checkpoints, ``_kda_scan`` with ``backward=True``), the chunks are independent:
the chunk-local forward (gate, norms, the per-channel-decayed A and P in 16-key strips as the chunk kernel computes
them, the UT transform, the chunk's output and leaving state) is differentiated by autograd, all chunks of all
sequences and heads at once, in fp32. Gradients are with respect to the raw inputs (q, k, v, g_raw, beta logits,
A_log, dt_bias). Tokens outside every chunk (after ``cu_seqlens[-1]``) get zero gradients.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import kda_ref, runtime

CHUNK = 64
STRIP = 16


def gather_chunks(tok0, clen, total: int):
    """``(idx [S, 64] token of each chunk row (clamped), mask [S, 64] rows inside the chunk)``."""
    rows = torch.arange(CHUNK, device=tok0.device)
    idx = (tok0.long()[:, None] + rows).clamp(0, max(total - 1, 0))
    mask = rows[None, :] < clen.long().clamp_min(0)[:, None]
    return idx, mask


def chunk_local(q, k, v, g, beta, A_log, dt_bias, h_in, mask, scale, lower_bound):  # noqa: N803
    """Chunk rows ``[S, H, 64, D]`` (beta ``[S, H, 64]``), entering states ``[S, H, K, V]``: ``(o, h_out)``."""
    m = mask[:, None, :, None].to(q.dtype)
    h = q.shape[1]
    qa = kda_ref.l2norm(q) * m
    ka = kda_ref.l2norm(k) * m
    va = v * m
    x = g + dt_bias.view(h, 1, -1)
    gate = lower_bound * torch.sigmoid(torch.exp(A_log).view(h, 1, 1) * x) * m
    b = torch.sigmoid(beta) * m[..., 0]
    G = torch.cumsum(gate, 2)
    a_cols, p_cols = [], []
    for s0 in range(0, CHUNK, STRIP):
        ref = G[:, :, s0:s0 + 1, :]
        rows = torch.exp(torch.clamp(G - ref, max=0.0))
        keys = ka[:, :, s0:s0 + STRIP] * torch.exp(ref - G[:, :, s0:s0 + STRIP])
        a_cols.append((ka * rows) @ keys.transpose(-1, -2))
        p_cols.append((qa * rows) @ keys.transpose(-1, -2))
    eye = torch.eye(CHUNK, dtype=q.dtype, device=q.device)
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    A = torch.cat(a_cols, -1) * b[..., None] * (lower & ~eye.bool())
    P = scale * torch.cat(p_cols, -1) * lower
    tbeta = torch.linalg.solve_triangular(eye + A, torch.diag_embed(b), upper=False, unitriangular=True)
    eg = torch.exp(G)
    glast = G[:, :, -1:, :]
    u = tbeta @ (va - (ka * eg) @ h_in)
    o = (scale * qa * eg) @ h_in + P @ u
    h_out = torch.exp(glast).transpose(-1, -2) * h_in + (ka * torch.exp(glast - G)).transpose(-1, -2) @ u
    return o, h_out


def chunk_grads(q, k, v, g, beta, A_log, dt_bias, scale, lower_bound, tok0, clen, h_in, dh_out, do):  # noqa: N803
    """Gradients of the raw inputs (``[1, T, H, *]``) from the checkpoints: ``dict`` of dq, dk, dv, dg, dbeta
    (input shapes, fp32), dA_log, ddt_bias, and dh_in ``[S, H, K, V]`` (the gradient of each chunk's entering
    state: a sequence's first chunk gives its dh0)."""
    total = q.shape[1]
    idx, mask = gather_chunks(tok0, clen, total)

    def rows(x):  # [1, T, H, *] -> [S, H, 64, *] fp32
        return x[0][idx].float().transpose(1, 2).contiguous()

    # Inside the op's custom-op body (torch.compile's path) autograd is dispatched below: re-enabled for the VJP.
    with runtime.autograd_inside_custom_op():
        leaves = [rows(q), rows(k), rows(v), rows(g), rows(beta), A_log.float(), dt_bias.float(), h_in.float()]
        for t in leaves:
            t.requires_grad_(True)
        o, h_out = chunk_local(*leaves, mask, scale, lower_bound)
        dmask = mask[:, None, :, None].float()
        loss = (o * rows(do) * dmask).sum() + (h_out * dh_out.float()).sum()
        grads = torch.autograd.grad(loss, leaves)
    out = {}
    flat_idx = idx[mask]
    for name, gr, like in zip(("dq", "dk", "dv", "dg", "dbeta"), grads[:5], (q, k, v, g, beta)):
        full = torch.zeros(like.shape[1:], dtype=torch.float32, device=q.device)
        full[flat_idx] = gr.transpose(1, 2)[mask]
        out[name] = full[None]
    out["dA_log"], out["ddt_bias"], out["dh_in"] = grads[5], grads[6], grads[7]
    return out
