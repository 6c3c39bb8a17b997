# SPDX-License-Identifier: Apache-2.0
# GDN-2 (Gated DeltaNet v2) as cudnn-frontend defines it (python/cudnn/linear_attention/frost/kernel/gdn2_bprop_f16.py,
# v1.28.0 1dbd2c09432dfd6cbf13a0ad85a071446398c082: per-key-channel decay and erase gate, per-value-channel write
# gate, 16-token chunks); read for semantics only.
"""GDN-2's recurrence, its oracles and the chunk-parallel pieces of its backward (torch).

Per token, state S [V, K] (a row per value), decay a = exp(g) [K], erase gate beta [K], write gate w [V]:

    S = S diag(a);   u = w o v - S (beta o k);   S = S + u k^T;   o = scale S q

(GDN-1 is beta and w the same scalar). Per chunk of C = 16 tokens from the state S entering it, G = the in-chunk
cumulative log decay per key channel, D_ijd = exp(G_id - G_jd) (j <= i):

    M   = (sum_d beta_id k_id k_jd D_ijd)_{j < i}     Tm = (I + M)^-1
    U   = Tm (W o V - K_dec S^T),  K_dec = exp(G) o beta o K
    A   = scale (sum_d q_id k_jd D_ijd)_{j <= i}      O = scale (exp(G) o Q) S^T + A U
    S'  = S diag(exp(G_last)) + U^T K_res,  K_res = exp(G_last - G) o K

The state gradient walks back as dS = dS' diag(exp(G_last)) - (dS' K_res^T) W + dO^T X with W = Tm K_dec and
X = scale exp(G) o Q - A W (the TIRx walk kernel, chunk 16); every other gradient of a chunk is the
vector-Jacobian product of the chunk function above with (dO, dS') -- batched over all chunks by torch autograd.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import delta_rule_ref, runtime
from tirx_kernels.ported.cudnn.linear_attention import _bwd_chunks as ch

CHUNK = 16
DIM = 128


def recurrent_forward(q, k, v, g, beta, w, cu_seqlens, scale=None, initial_state=None, dtype=torch.float64):
    """(out [T, HO, V], final [N, HO, V, K]) token by token (differentiable: no in-place writes)."""
    hs, qh, kh, vh = delta_rule_ref.head_maps(q.shape[1], k.shape[1], v.shape[1])
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qf, kf, vf = q.to(dtype)[:, qh], k.to(dtype)[:, kh], v.to(dtype)[:, vh]
    gf, bf, wf = g.to(dtype), beta.to(dtype), w.to(dtype)
    outs, finals, t0 = [], [], 0
    for n, length in enumerate(ch.lengths(cu_seqlens)):
        S = (initial_state[n].to(dtype) if initial_state is not None
             else torch.zeros(hs, DIM, DIM, dtype=dtype, device=q.device))
        for t in range(t0, t0 + length):
            S = S * torch.exp(gf[t])[:, None, :]
            u = wf[t] * vf[t] - (S @ (bf[t] * kf[t])[..., None])[..., 0]
            S = S + u[..., None] * kf[t][:, None, :]
            outs.append(scale * (S @ qf[t][..., None])[..., 0])
        finals.append(S)
        t0 += length
    out = torch.stack(outs) if outs else torch.zeros(0, hs, DIM, dtype=dtype, device=q.device)
    return out, torch.stack(finals)


def checkpoints_from_recurrence(q, k, v, g, beta, w, cu_seqlens, scale=None, initial_state=None,
                                dtype=torch.float32):
    """[sum ceil(len / 16), HO, V, K]: the state entering every 16-token chunk (checkpoint 0 = the initial state)."""
    hs = max(q.shape[1], v.shape[1])
    lens = ch.lengths(cu_seqlens)
    rows = []
    t0 = 0
    for n, length in enumerate(lens):
        s = None if initial_state is None else initial_state[n:n + 1]
        for a in range(t0, t0 + length, CHUNK):
            rows.append(torch.zeros(hs, DIM, DIM, dtype=dtype, device=q.device) if s is None else s[0].to(dtype))
            b = min(a + CHUNK, t0 + length)
            cu = torch.tensor([0, b - a], dtype=torch.int32)
            _, s = recurrent_forward(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], w[a:b], cu, scale, s, dtype)
        t0 += length
    if not rows:
        return torch.zeros(0, hs, DIM, DIM, dtype=dtype, device=q.device)
    return torch.stack(rows)


def autograd_grads(q, k, v, g, beta, w, do, cu_seqlens, scale=None, initial_state=None, d_final_state=None,
                   dtype=torch.float64) -> dict:
    """Gradients of sum(out * dO) + sum(final * d_final_state) through the token recurrence."""
    names = ["q", "k", "v", "g", "beta", "w"]
    leaves = {n: t.detach().to(dtype).requires_grad_(True) for n, t in zip(names, (q, k, v, g, beta, w))}
    h0 = None
    if initial_state is not None:
        h0 = initial_state.detach().to(dtype).requires_grad_(True)
    out, final = recurrent_forward(*(leaves[n] for n in names), cu_seqlens, scale, h0, dtype)
    loss = (out * do.to(dtype)).sum()
    if d_final_state is not None:
        loss = loss + (final * d_final_state.to(dtype)).sum()
    loss = loss + 0 * sum(x.sum() for x in leaves.values())  # connected even with no token and no state term
    wrt = [leaves[n] for n in names] + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    res = {"d" + n: (torch.zeros_like(leaves[n]) if gr is None else gr.detach()) for n, gr in zip(names, grads)}
    if h0 is not None:
        res["d_initial_state"] = grads[-1].detach() if grads[-1] is not None else torch.zeros_like(h0)
    return res


def chunk_function(cmap, Q, K, V, g, B, Wg, S, scale: float):  # noqa: N803
    """(O [NC, H, C, V], S' [NC, H, V, K], walk pieces) of every chunk, from gathered inputs."""
    valid = cmap.valid[:, None, :]
    G = torch.cumsum(g, -2)  # [NC, H, C, K]
    gl = G[..., -1:, :]  # g is zero past the end
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=Q.device).tril()
    incl = valid[..., :, None] & valid[..., None, :] & lower
    strict = incl & ~torch.eye(CHUNK, dtype=torch.bool, device=Q.device)
    zero = torch.zeros((), dtype=Q.dtype, device=Q.device)
    diff = G[..., :, None, :] - G[..., None, :, :]  # [NC, H, C, C, K]
    Dp = torch.where(incl[..., None], torch.exp(torch.where(incl[..., None], diff, zero)), zero)
    M = torch.where(strict, torch.einsum("...id,...jd,...ijd->...ij", B * K, K, Dp), zero)
    eye = torch.eye(CHUNK, dtype=Q.dtype, device=Q.device)
    Tm = torch.linalg.solve_triangular(eye + M, eye.expand_as(M), upper=False, unitriangular=True)
    eG = torch.exp(G)
    Kdec = eG * B * K
    U = Tm @ (Wg * V - Kdec @ S.transpose(-1, -2))
    A = torch.where(incl, scale * torch.einsum("...id,...jd,...ijd->...ij", Q, K, Dp), zero)
    out = scale * (eG * Q) @ S.transpose(-1, -2) + A @ U
    Kres = torch.where(valid[..., None], torch.exp(gl - G) * K, zero)
    S_end = S * torch.exp(gl) + U.transpose(-1, -2) @ Kres
    return out, S_end, {"Kd": Kres, "W": Tm @ Kdec, "A": A, "eGQ": eG * Q, "gam_c": torch.exp(gl[..., 0, :])}


def chunked_grads(q, k, v, g, beta, w, do, cu_seqlens, checkpoints, scale=None, d_final_state=None,
                  dtype=torch.float32, scan=None, max_tiles: int | None = None, initial_state=None,
                  layout: str = "pre_chunk") -> dict:
    """GDN-2's backward from the checkpoints: the walk's inputs per chunk, the walk (``scan(cmap, pieces,
    d_final_state)``, default the torch loop), then the chunk VJPs; the chunk-parallel steps in slabs of at most
    ``max_tiles`` (chunk, head) tiles (the pairwise decays are [16, 16, 128] a tile). Gradients of q / k / v at their
    own heads, g / beta / w / d_initial_state at HO. ``initial_state``: read by the ``cudnn`` checkpoint layout only."""
    hs, qh, kh, vh = delta_rule_ref.head_maps(q.shape[1], k.shape[1], v.shape[1])
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    cmap = ch.ChunkMap(cu_seqlens, q.device, CHUNK, layout)
    total, nc = q.shape[0], cmap.n_chunks
    step = nc if max_tiles is None else max(1, max_tiles // hs)
    xs = (q[:, qh], k[:, kh], v[:, vh], g, beta, w)
    ranges = [(c0, min(c0 + step, nc)) for c0 in range(0, nc, max(step, 1))]
    dev = q.device
    pieces = {name: torch.zeros(nc, hs, CHUNK, DIM, dtype=dtype, device=dev) for name in ("Kd", "W", "X", "dO")}
    pieces["gam_c"] = torch.zeros(nc, hs, DIM, dtype=dtype, device=dev)
    with torch.no_grad():
        for c0, c1 in ranges:
            sub = cmap.sub(c0, c1)
            _, _, pc = chunk_function(sub, *(sub.gather(x, dtype) for x in xs),
                                      ch.entering_states(sub, checkpoints, dtype, initial_state), scale)
            pc["dO"] = sub.gather(do, dtype)
            pc["X"] = scale * pc["eGQ"] - pc["A"] @ pc["W"]
            for name in pieces:
                pieces[name][c0:c1] = pc[name]
        scan = scan or (lambda cm, pc, dfs: ch.state_scan(cm, pc, dfs, hs, dtype))
        dS, d0 = scan(cmap, pieces, d_final_state)
    del pieces
    grads = [torch.zeros(total, hs, DIM, dtype=dtype, device=dev) for _ in xs]
    for c0, c1 in ranges:
        sub = cmap.sub(c0, c1)
        # The op's custom-op body (torch.compile's path) runs below autograd: re-enabled for the chunk VJPs.
        with runtime.autograd_inside_custom_op():
            leaves = [sub.gather(x, dtype).requires_grad_(True) for x in xs]
            S = ch.entering_states(sub, checkpoints, dtype, initial_state)
            out, S_end, _ = chunk_function(sub, *leaves, S, scale)
            got = torch.autograd.grad([out, S_end], leaves, grad_outputs=[sub.gather(do, dtype), dS[c0:c1]],
                                      allow_unused=True)
        for dst, gr in zip(grads, got):
            if gr is not None:
                sub.scatter_into(dst, gr)
    dq, dk, dv, dg, dbeta, dw = grads
    return {"dq": _fold(dq, q.shape[1]), "dk": _fold(dk, k.shape[1]), "dv": _fold(dv, v.shape[1]), "dg": dg,
            "dbeta": dbeta, "dw": dw, "d_initial_state": d0}


def _fold(x, n_heads: int):
    """[T, HO, D] gradients summed onto the ``n_heads`` source heads (state head h reads h // (HO / n_heads))."""
    t, hs = x.shape[:2]
    return x.view(t, n_heads, hs // n_heads, *x.shape[2:]).sum(2)
