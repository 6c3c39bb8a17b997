# SPDX-License-Identifier: Apache-2.0
# The chunked backward of the gated delta rule as cudnn-frontend's GDN bprop (python/cudnn/linear_attention/frost/
# kernel/gdn_bprop_f16.py, v1.28.0 1dbd2c09432dfd6cbf13a0ad85a071446398c082) and fla's chunk_gated_delta_rule_bwd
# (fla-core 0.6.0) compute it; derived here from the chunked forward, read for semantics only.
"""Chunk-parallel pieces of the GDN-1 backward (torch, batched over every chunk of every sequence and head).

Per chunk of ``L <= 64`` tokens, from the state ``S`` [V, K] entering it (a checkpoint), natural-log cumulative gate
``G_i``, gamma = exp(G), gamma_C = exp(G_{L-1}), E_ij = exp(G_i - G_j):

    A   = diag(beta) (K K^T o E)_strict        Tm = (I + A)^-1        (the WY / UT transform)
    rhs = V - diag(gamma) K S^T                D  = Tm diag(beta) rhs   (the chunk's new values)
    P   = scale (Q K^T o E)_{j <= i}            O  = scale diag(gamma) Q S^T + P D
    S'  = gamma_C S + D^T K_d,                  K_d = diag(exp(G_C - G)) K

Backward, given dO and dS' (the state gradient at the chunk's end):

    dD   = P^T dO + K_d dS'^T          drhs' = Tm^T dD      dV = diag(beta) drhs'
    dA   = -(drhs' D^T)_strict          (the inverse's gradient: -Tm^T dD rhs'^T Tm^T, rhs' = diag(beta) rhs)
    dS   = gamma_C dS' - (dS' K_d^T) W + dO^T X,   W = Tm diag(beta gamma) K,   X = scale diag(gamma) Q - P W

The last line is the only sequential step (the reverse walk over chunks: ``state_scan`` here, the TIRx kernel
``_bwd_state_kernel`` on the GPU); everything else is chunk-parallel once every chunk's dS' is known. dq, dk, dbeta
and the gate gradient (dG per position, then a reverse cumulative sum inside the chunk) follow in ``gradients``.
"""

from __future__ import annotations

import torch

CHUNK = 64
DIM = 128


def lengths(cu_seqlens) -> list[int]:
    cu = [int(x) for x in cu_seqlens.cpu()]
    return [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]


LAYOUTS = ("pre_chunk", "cudnn")


def checkpoint_counts(lens: list[int], chunk: int = CHUNK, layout: str = "pre_chunk") -> list[int]:
    """Checkpoints a sequence has. ``pre_chunk``: the states entering each of its chunks (checkpoint 0 = the initial
    state), as this package's forward / recompute kernels write them (``_fwd_kernel``); ``cudnn``: cuDNN's backward
    ABI, the states entering chunks 1 .. n - 1 (chunk 0 reads the initial state)."""
    if layout not in LAYOUTS:
        raise ValueError(f"checkpoint layout {layout!r} is not one of {LAYOUTS}")
    if layout == "cudnn":
        return [(n - 1) // chunk if n > 0 else 0 for n in lens]
    return [-(-n // chunk) for n in lens]


def n_checkpoints(cu_seqlens) -> int:
    return sum(checkpoint_counts(lengths(cu_seqlens)))


class ChunkMap:
    """Where every chunk of a packed batch sits: chunk c covers tokens ``tok[c, :len[c]]`` of sequence ``seq[c]``
    (position ``pos[c]`` in it); chunks of a sequence are consecutive, first to last."""

    def __init__(self, cu_seqlens, device, chunk: int = CHUNK, layout: str = "pre_chunk"):
        lens = lengths(cu_seqlens)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        seq, pos, start, ln, ck = [], [], [], [], []
        ck_base = 0
        self.chunk_cu = [0]
        for n, length in enumerate(lens):
            nc = -(-length // chunk)
            for j in range(nc):
                seq.append(n)
                pos.append(j)
                start.append(cu[n] + j * chunk)
                ln.append(min(chunk, length - j * chunk))
                ck.append(ck_base + j if layout == "pre_chunk" else (ck_base + j - 1 if j > 0 else -1))
            ck_base += checkpoint_counts([length], chunk, layout)[0]
            self.chunk_cu.append(self.chunk_cu[-1] + nc)
        self.n_seqs = len(lens)
        self.n_chunks = len(seq)
        self.total = cu[-1]
        self.seq = torch.tensor(seq, dtype=torch.long, device=device)
        self.ckpt = torch.tensor(ck, dtype=torch.long, device=device)
        ar = torch.arange(chunk, device=device)
        st = torch.tensor(start, dtype=torch.long, device=device)
        ln_t = torch.tensor(ln, dtype=torch.long, device=device)
        self.valid = ar[None, :] < ln_t[:, None]  # [NC, C]
        self.tok = torch.where(self.valid, st[:, None] + ar[None, :], torch.zeros((), dtype=torch.long,
                                                                                   device=device))
        self.last = (ln_t - 1).clamp_min(0)  # [NC]

    def gather(self, x, dtype):
        """[T, H, ...] -> [NC, H, C, ...] in ``dtype``, zero past each chunk's end."""
        y = x.to(dtype)[self.tok]  # [NC, C, H, ...]
        mask = self.valid.view(*self.valid.shape, *([1] * (y.dim() - 2)))
        y = torch.where(mask, y, torch.zeros((), dtype=dtype, device=y.device))
        return y.transpose(1, 2).contiguous()

    def sub(self, c0: int, c1: int) -> ChunkMap:
        """The map of chunks ``c0 .. c1 - 1`` alone (for slabs of chunks: gather / scatter / entering_states)."""
        out = object.__new__(ChunkMap)
        out.__dict__.update(self.__dict__)
        for name in ("seq", "ckpt", "valid", "tok", "last"):
            setattr(out, name, getattr(self, name)[c0:c1])
        out.n_chunks = out.seq.shape[0]
        return out

    def scatter_into(self, out, y):
        """``out`` [T, H, ...] <- the valid rows of ``y`` [NC, H, C, ...]."""
        out[self.tok[self.valid]] = y.transpose(1, 2)[self.valid].to(out.dtype)

    def scatter(self, y, total):
        """[NC, H, C, ...] -> [T, H, ...] (the valid rows)."""
        y = y.transpose(1, 2)  # [NC, C, H, ...]
        out = torch.zeros(total, *y.shape[2:], dtype=y.dtype, device=y.device)
        out[self.tok[self.valid]] = y[self.valid]
        return out


def entering_states(cmap: ChunkMap, checkpoints, dtype, initial_state=None):
    """[NC, H, V, K]: the state entering every chunk -- its checkpoint, or (a chunk 0 of the ``cudnn`` layout) the
    sequence's initial state or zero."""
    hs = checkpoints.shape[1]
    first = cmap.ckpt < 0
    if checkpoints.shape[0]:
        s = checkpoints[cmap.ckpt.clamp_min(0)].to(dtype)
    else:
        s = torch.zeros(cmap.n_chunks, hs, DIM, DIM, dtype=dtype, device=cmap.seq.device)
    if bool(first.any()):
        init = (initial_state[cmap.seq].to(dtype) if initial_state is not None
                else torch.zeros((), dtype=dtype, device=s.device))
        s = torch.where(first[:, None, None, None], init, s)
    return s


def forward_pieces(cmap: ChunkMap, q, k, v, g, beta, S, scale: float, dtype):
    """The chunk-local forward quantities the backward needs (dict of [NC, H, ...] tensors)."""
    Q, K, V = (cmap.gather(x, dtype) for x in (q, k, v))
    G = torch.cumsum(cmap.gather(g, dtype), -1)  # [NC, H, C]; flat past the end
    B = cmap.gather(beta, dtype)
    valid = cmap.valid[:, None, :]  # [NC, 1, C]
    vv = valid[..., :, None] & valid[..., None, :]
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    diff = G[..., :, None] - G[..., None, :]
    incl = vv & lower
    strict = incl & ~torch.eye(CHUNK, dtype=torch.bool, device=q.device)
    zero = torch.zeros((), dtype=dtype, device=q.device)
    E = torch.where(incl, torch.exp(torch.where(incl, diff, zero)), zero)
    gam = torch.exp(G)
    g_last = G[..., -1:]  # == G_{L-1}: g is zero past the end
    gam_c = torch.exp(g_last)[..., 0]  # [NC, H]
    KK = K @ K.transpose(-1, -2)
    A = torch.where(strict, B[..., :, None] * KK * E, zero)
    eye = torch.eye(CHUNK, dtype=dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    H = K @ S.transpose(-1, -2)  # K S^T [C, V]
    rhs = V - gam[..., None] * H
    D = Tm @ (B[..., None] * rhs)
    QK = Q @ K.transpose(-1, -2)
    P = torch.where(incl, scale * QK * E, zero)
    Kd = torch.where(valid[..., None], torch.exp(g_last - G)[..., None] * K, zero)
    W = Tm @ ((B * gam)[..., None] * K)
    return dict(Q=Q, K=K, V=V, G=G, B=B, E=E, gam=gam, gam_c=gam_c, KK=KK, A=A, Tm=Tm, H=H, rhs=rhs, D=D, P=P,
                Kd=Kd, W=W, S=S, strict=strict, incl=incl)


def scan_inputs(f: dict, dO, scale: float) -> dict:
    """The walk's chunk terms: dO and X = scale diag(gamma) Q - P W ([NC, H, C, D]; R = dO^T X is the chunk's own
    term of the state gradient)."""
    return {"dO": dO, "X": scale * f["gam"][..., None] * f["Q"] - f["P"] @ f["W"]}


def state_scan(cmap: ChunkMap, f: dict, d_final_state, hs: int, dtype):
    """The reverse walk: (dS' per chunk [NC, H, V, K], dstate0 [N, H, V, K]) from ``f``'s K_d, W, X, dO, gamma_C.
    Reference of the TIRx kernel."""
    dev = f["X"].device
    dS_end = torch.zeros(cmap.n_chunks, hs, DIM, DIM, dtype=dtype, device=dev)
    d0 = torch.zeros(cmap.n_seqs, hs, DIM, DIM, dtype=dtype, device=dev)
    for n in range(cmap.n_seqs):
        ds = (d_final_state[n].to(dtype) if d_final_state is not None
              else torch.zeros(hs, DIM, DIM, dtype=dtype, device=dev))
        for c in range(cmap.chunk_cu[n + 1] - 1, cmap.chunk_cu[n] - 1, -1):
            dS_end[c] = ds
            gc = f["gam_c"][c]  # [H] (GDN-1) or [H, K] (GDN-2: per key channel)
            gc = gc[:, None, None] if gc.dim() == 1 else gc[:, None, :]
            ds = ds * gc - (ds @ f["Kd"][c].transpose(-1, -2)) @ f["W"][c] + f["dO"][c].transpose(-1, -2) @ f["X"][c]
        d0[n] = ds
    return dS_end, d0


def gradients(cmap: ChunkMap, f: dict, dO, dS, scale: float):
    """dq, dk, dv, dbeta, dg per chunk ([NC, H, C(, D)]) from the forward pieces, dO and every chunk's dS'."""
    Q, K, E, gam, D, P, Tm, S = f["Q"], f["K"], f["E"], f["gam"], f["D"], f["P"], f["Tm"], f["S"]
    B, rhs, H, A, Kd = f["B"], f["rhs"], f["H"], f["A"], f["Kd"]
    zero = torch.zeros((), dtype=Q.dtype, device=Q.device)
    dD = P.transpose(-1, -2) @ dO + Kd @ dS.transpose(-1, -2)
    dP = torch.where(f["incl"], dO @ D.transpose(-1, -2), zero)
    dQK = scale * dP * E
    drhs_p = Tm.transpose(-1, -2) @ dD
    dbeta = (drhs_p * rhs).sum(-1)
    drhs = B[..., None] * drhs_p
    dA = torch.where(f["strict"], -(drhs_p @ D.transpose(-1, -2)), zero)
    dbeta = dbeta + (dA * f["KK"] * E).sum(-1)
    dKK = dA * B[..., :, None] * E
    dH = -gam[..., None] * drhs
    DdS = D @ dS  # [C, K]
    decay_end = torch.where(cmap.valid[:, None, :], torch.exp(f["G"][..., -1:] - f["G"]), zero)
    dq = dQK @ K + scale * gam[..., None] * (dO @ S)
    dk = dH @ S + dQK.transpose(-1, -2) @ Q + (dKK + dKK.transpose(-1, -2)) @ K + decay_end[..., None] * DdS
    Z = dP * P
    Y = dA * A
    F = (DdS * Kd).sum(-1)
    dG = scale * gam * (dO * (Q @ S.transpose(-1, -2))).sum(-1) + (dH * H).sum(-1)
    dG = dG + Z.sum(-1) - Z.sum(-2) + Y.sum(-1) - Y.sum(-2) - F
    extra = F.sum(-1) + f["gam_c"] * (dS * S).sum((-1, -2))  # d/dG_{L-1}: the end-of-chunk decay
    dG = dG + extra[..., None] * torch.nn.functional.one_hot(cmap.last, CHUNK).to(dG.dtype)[:, None, :]
    dG = torch.where(cmap.valid[:, None, :], dG, zero)
    dg = torch.flip(torch.cumsum(torch.flip(dG, (-1,)), -1), (-1,))  # G_i = sum_{t <= i} g_t
    return dq, dk, drhs, dbeta, dg
