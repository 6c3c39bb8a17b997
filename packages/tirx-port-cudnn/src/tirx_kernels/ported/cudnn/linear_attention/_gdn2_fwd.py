# SPDX-License-Identifier: Apache-2.0
# GDN-2 as cuDNN Frontend's gdn2_prefill_f16 / gdn2_recompute_f16 define it (python/cudnn/linear_attention/frost,
# https://github.com/NVIDIA/cudnn-frontend v1.28.0, commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082); read for
# semantics only. The state scan is tirx-native's KDA scan kernel (tirx_kernels.kda._kda_scan, commit 27efdc4).
"""The GDN-2 forward of ``cudnn_sm90_gdn2_prefill_f16`` / ``_recompute_f16``: the chunk pass (tirx-native's KDA chunk
kernel, its GDN-2 variant), then the wgmma state scan of tirx-native's KDA forward, then the checkpoints.

GDN-2 (``core.gdn2_ref``): per-key-channel decay g and erase gate b, per-value-channel write gate w. Over a chunk of
64 tokens (G the inclusive cumulative log decay per key channel) its WY form is exactly the KDA scan's chunk step

    Y = V_in - K_g S^T,   Delta = T Y,   S = S diag(gamma) + Delta^T K_d,   O = Q_g S^T + P Delta

with V_in = w * v, K_g = b * k * exp(G), T = (I + A)^-1 (A[i, j] = sum_d b_i k_i k_j exp(G_i - G_j), j < i),
K_d = k * exp(G_last - G), Q_g = scale q * exp(G), P[i, j] = scale sum_d q_i k_j exp(G_i - G_j) (j <= i), gamma =
exp(G_last). ``kernel_pass`` computes these on the GPU (``_kda_chunk``: one CTA per chunk and head, the products on
wgmma in 16-key strips, bf16 out) from the device chunk table; ``chunk_pass`` is the same algebra in fp32 torch
(chunk-parallel; decays factored per 16-token block), the CPU tests' stand-in beside a torch scan. The scan (one CTA
per head, sequence and value half, the state in registers) stores the state entering every chunk (fp32, [slots, H,
K, V]) when checkpoints are asked for. cuDNN's checkpoints (every 16 / 32 / 48 tokens: inside a chunk) are then
advanced from the chunk's entering state in torch (with a host read of ``cu_seqlens``; without checkpoints the op
reads nothing back).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import delta_rule_ref, gdn2_ref

DIM = 128
CHUNK = 64  # the scan's chunk (cuDNN's GDN-2 kernels use 16: a schedule choice, the math is the same)
CADENCES = (0, 16, 32, 48)
# (chunk, head) pairs whose checkpoints are advanced at a time: ~150 KiB of fp32 temporaries each (48 rows of five
# gathered tensors and U), ~0.6 GiB a batch
_CKPT_PAIRS = 4096
_SUB = 16  # the pairwise decays' diagonal blocks (16 x 16 x 128 per chunk and head)
_DIAG_BATCH = 8192  # (chunk, head) pairs per block of diagonal decays: 1 GiB


def chunk_list(cu: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """((first token, length) of every 64-token chunk, sequences in order; each sequence's first chunk index)."""
    chunks, base = [], []
    for n in range(len(cu) - 1):
        base.append(len(chunks))
        chunks += [(t0, min(CHUNK, cu[n + 1] - t0)) for t0 in range(cu[n], cu[n + 1], CHUNK)]
    return chunks, base


def _pairwise(G, left, right):
    """[B, 64, 64]: sum_d left_i[d] right_j[d] exp(G_i[d] - G_j[d]) for j <= i (0 above). G is non-increasing along
    the chunk (log decays <= 0, cuDNN's contract), so per 16-token row block I with r its reference (the last token
    before it) both factors exp(G_i - G_r) and exp(G_r - G_j) (j <= r) are <= 1: the blocks left of the diagonal are
    one matmul each; the 16 x 16 diagonal blocks take the pairwise decays directly."""
    nb, c, d = G.shape
    sub = _SUB
    out = torch.zeros(nb, c, c, dtype=G.dtype, device=G.device)
    lower = torch.ones(sub, sub, dtype=torch.bool, device=G.device).tril()
    for i0 in range(0, c, sub):
        rows = slice(i0, i0 + sub)
        g = G[:, rows]
        for b0 in range(0, nb, _DIAG_BATCH):  # 16 x 16 x 128 fp32 decays: 128 KiB per (chunk, head)
            gb = g[b0:b0 + _DIAG_BATCH]
            dec = torch.exp((gb[:, :, None, :] - gb[:, None, :, :]).masked_fill(~lower[None, :, :, None],
                                                                                float("-inf")))
            out[b0:b0 + _DIAG_BATCH, rows, rows] = torch.einsum("bid,bjd,bijd->bij", left[b0:b0 + _DIAG_BATCH, rows],
                                                                right[b0:b0 + _DIAG_BATCH, rows], dec)
        if i0:
            gr = G[:, i0 - 1:i0]  # [B, 1, d]
            out[:, rows, :i0] = (left[:, rows] * torch.exp(g - gr)) @ (right[:, :i0] * torch.exp(gr - G[:, :i0])).mT
    return out


def _chunk_gather(cu: list[int], total: int, dev):
    """``(chunks, token index [nc, 64], live [nc, 64], gather)``: ``gather(x, cs, rows)`` maps [T, H, D] to [n, H,
    rows, D] fp32, the first ``rows`` rows of the chunks ``cs`` (all when None; rows past a chunk's end zero)."""
    chunks, _ = chunk_list(cu)
    t0 = torch.tensor([c[0] for c in chunks], device=dev, dtype=torch.long)
    ln = torch.tensor([c[1] for c in chunks], device=dev, dtype=torch.long)
    i = torch.arange(CHUNK, device=dev)
    tok = (t0[:, None] + i[None]).clamp_max(max(total - 1, 0))  # [nc, 64]
    live = (i[None] < ln[:, None])  # [nc, 64]

    def gather(x, cs=None, rows=CHUNK):
        t, lv = (tok, live) if cs is None else (tok[cs], live[cs])
        t, lv = t[:, :rows], lv[:, :rows]
        return torch.where(lv[:, :, None, None], x[t].float(), torch.zeros((), device=dev)).permute(0, 2, 1, 3)
    return len(chunks), tok, live, gather


def kernel_inputs(q, k, v, gate, beta, w, use_qk_l2norm: bool, safe_gate: bool, a_log, dt_bias, lower_bound,
                  use_beta_sigmoid: bool):
    """``kernel_pass``'s inputs at the state heads: ``(q, k, g, b, v_in)``, q / k bf16 (normalised; q None stays
    None), the fp32 natural-log gate, the erase gate b and V_in = w o v in bf16 (each rounded once, as from
    ``expand_inputs``' fp32 tensors, without those: six fp32 [T, H, 128] copies, 1 GiB each at b1 s8192 h64). fp16
    inputs are rounded to bf16 here (the kernels' operands are bf16)."""
    ref = q if q is not None else k
    _, qh, kh, vh = delta_rule_ref.head_maps(ref.shape[1], k.shape[1], v.shape[1])
    bf16 = torch.bfloat16

    def heads(x, idx):
        """``x`` at the state heads: a gather only where heads are shared (GQA / GVA); the identity map's copy took
        250 us of a 3.0 ms call at b1 s8192 h16 (H200, 2026-12-07d)."""
        return x if idx == list(range(x.shape[1])) else x[:, idx]

    def rows(x, idx):
        return heads((gdn2_ref.l2norm(x) if use_qk_l2norm else x).to(bf16), idx)

    gf, bf, _ = gdn2_ref.gates(gate, beta, None, safe_gate, a_log, dt_bias, lower_bound, use_beta_sigmoid)
    v_in = w * heads(v, vh) if w.dtype == bf16 else (w.float() * heads(v, vh).float()).to(bf16)
    return (None if q is None else rows(q, qh)), rows(k, kh), gf, bf.to(bf16), v_in


def kernel_pass(functions, q, k, g, b, scale, cu_seqlens):
    """The chunk pass on the GPU: ``_kda_chunk``'s GDN-2 variant on ``kernel_inputs`` (``q`` None: the recompute,
    k stands in and Q_g / P go unused), every chunk at once from the device chunk table (no host read). Returns what
    the KDA forward's ``chunk_pass`` does, for its ``scan_pass``: ``(qg, kg, kd, pm, tb, gam, base)``."""
    from tirx_kernels.kda import kda_forward_portfolio_multishape as kda_fwd

    total, hs = k.shape[0], k.shape[1]
    tok0, clen, base = kda_fwd.chunk_table(cu_seqlens, total, functions)
    out = kda_fwd.chunk_outputs(total, hs, tok0.shape[0], k.device)
    fn = functions.get(("chunk", k.get_device()), lambda: {"kernel": "chunk"}, k.device)
    fn(k if q is None else q, k, g.float().contiguous(), b, tok0, clen, *out, float(scale))
    return (*out, base)


def kernel_chunk_rows(chunks, v_in, k, g, cu: list[int]):
    """``checkpoints``' chunk rows from the kernel pass's token rows (the values the scan used: T, K_g, V_in) and the
    expanded k and gate (K, and G the in-chunk cumulative log decay), gathered a batch of chunks at a time."""
    _, _, _, gather = _chunk_gather(cu, k.shape[0], k.device)
    kg, tb = chunks[1], chunks[4]
    return lambda cs, n: {"tb": gather(tb, cs, n)[..., :n], "kg": gather(kg, cs, n), "vin": gather(v_in, cs, n),
                          "k": gather(k, cs, n), "G": torch.cumsum(gather(g, cs, n), 2)}


def pass_chunk_rows(ops):
    """``checkpoints``' chunk rows from the torch chunk pass's fp32 chunk tensors."""
    return lambda cs, n: {"tb": ops["tb_c"][cs, :, :n, :n], "kg": ops["kg_c"][cs, :, :n],
                          "vin": ops["vin_c"][cs, :, :n], "k": ops["k_c"][cs, :, :n], "G": ops["G"][cs, :, :n]}


def chunk_pass(q, k, v, g, b, w, scale, cu: list[int]):
    """The scan's operands on per-state-head fp32 inputs [T, H, *] (``q`` None: zeros, the recompute). Returns a dict:
    ``qg, kg, kd, v_in`` [T, H, 128] and ``tb, pm`` [T, H, 64] bf16 (token rows), ``gam`` [chunks, H, 128] fp32, and
    the fp32 chunk tensors the checkpoints need (``kg_c``, ``vin_c``, ``tb_c``, ``k_c``, ``G``: [chunks, H, 64, *])."""
    total, hs = k.shape[0], k.shape[1]
    dev = k.device
    nc, tok, live, gather = _chunk_gather(cu, total, dev)
    K, V, Gl, B, W = (gather(x) for x in (k, v, g, b, w))
    G = torch.cumsum(Gl, 2)  # flat past the chunk's end (g = 0 there)
    eG = torch.exp(G)
    glast = G[:, :, -1]
    flat = (nc * hs, CHUNK, DIM)
    A = _pairwise(G.reshape(flat), (B * K).reshape(flat), K.reshape(flat)).view(nc, hs, CHUNK, CHUNK)
    A = A * (1 - torch.eye(CHUNK, device=dev))
    eye = torch.eye(CHUNK, device=dev).expand(nc, hs, CHUNK, CHUNK)
    Tb = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
    ops = {"kg": B * K * eG, "kd": K * torch.exp(glast[:, :, None] - G), "v_in": W * V, "tb": Tb}
    if q is not None:
        Q = gather(q)
        ops["qg"] = scale * Q * eG
        ops["pm"] = scale * _pairwise(G.reshape(flat), Q.reshape(flat), K.reshape(flat)).view(nc, hs, CHUNK, CHUNK)

    rows = tok[live]  # the chunk rows that are tokens of their sequence

    def scatter(x, width):
        out = torch.zeros(total, hs, width, dtype=torch.bfloat16, device=dev)
        if nc:
            out[rows] = x.permute(0, 2, 1, 3)[live].to(torch.bfloat16)
        return out

    res = {name: scatter(ops[name], DIM) for name in ("kg", "kd", "v_in")}
    res["tb"] = scatter(Tb, CHUNK)
    res["qg"] = scatter(ops["qg"], DIM) if q is not None else torch.zeros(total, hs, DIM, dtype=torch.bfloat16,
                                                                           device=dev)
    res["pm"] = scatter(ops["pm"], CHUNK) if q is not None else torch.zeros(total, hs, CHUNK, dtype=torch.bfloat16,
                                                                            device=dev)
    res["gam"] = torch.exp(glast).contiguous()
    res.update(kg_c=ops["kg"], vin_c=ops["v_in"], tb_c=Tb, k_c=K, G=G)
    return res


def expand_inputs(q, k, v, g, b, w, use_qk_l2norm: bool, safe_gate: bool, a_log, dt_bias, lower_bound,
                  use_beta_sigmoid: bool):
    """Per-state-head fp32 [T, H, *] inputs (head maps of ``delta_rule_ref``; ``q`` may be None), gates applied."""
    ref = q if q is not None else k
    hs, qh, kh, vh = delta_rule_ref.head_maps(ref.shape[1], k.shape[1], v.shape[1])
    if use_qk_l2norm:
        k = gdn2_ref.l2norm(k)
        q = None if q is None else gdn2_ref.l2norm(q)
    gf, bf, wf = gdn2_ref.gates(g, b, w, safe_gate, a_log, dt_bias, lower_bound, use_beta_sigmoid)
    qf = None if q is None else q.float()[:, qh]
    return qf, k.float()[:, kh], v.float()[:, vh], gf, bf, wf.float(), hs


def checkpoints(chunk_rows, ck64, cu: list[int], cadence: int, out):
    """cuDNN's checkpoints into ``out`` [count, H, V, K] from the states entering each chunk (``ck64`` [chunks, H, K,
    V] fp32). Inside a chunk the state is walked in 16-token blocks from the entering state S_0 with the chunk's
    writes U = T (V_in - K_g S_0^T): S_e = S_b diag(exp(G_e - G_b)) + U[b:e]^T (K[b:e] exp(G_e - G[b:e])) (b, e the
    last tokens before and in the block; every factor <= 1: G is non-increasing). ``chunk_rows(cs, n)``: fp32 ``tb``
    [c, H, n, n] and ``kg``, ``vin``, ``k``, ``G`` [c, H, n, 128], the first n rows of the chunks ``cs``. A batch of
    chunks at a time; offset-0 checkpoints are the entering states. (It advanced every checkpoint from S_0 over the
    chunk's 64 rows at once before: 48 [H, 64, 128] fp32 temporaries per batch of 16 chunks at cadence 16.)"""
    chunks, base = chunk_list(cu)
    where = []  # (chunk, offset) of every checkpoint, sequences in order
    for n in range(len(cu) - 1):
        where += [(base[n] + p // CHUNK, p % CHUNK) for p in range(0, cu[n + 1] - cu[n], cadence)]
    if not where:
        return out
    dev = ck64.device

    def put(slots, chunk_pos, states):
        """``out[slots] = states[chunk_pos]`` (host lists; nothing read back)."""
        if slots:
            out[torch.tensor(slots, device=dev)] = states[torch.tensor(chunk_pos, device=dev)].to(out.dtype)

    put([i for i, (_, m) in enumerate(where) if m == 0], [c for c, m in where if m == 0], ck64.transpose(-1, -2))
    slot = {cm: i for i, cm in enumerate(where)}
    inner = sorted({c for c, m in where if m})
    blocks = max(m for _, m in where) // _SUB  # 16-token blocks walked: up to the last checkpoint offset
    step = max(1, _CKPT_PAIRS // ck64.shape[1])
    for s in range(0, len(inner), step):
        batch = inner[s:s + step]
        r = chunk_rows(torch.tensor(batch, device=dev), blocks * _SUB)
        S = ck64[batch].transpose(-1, -2).float()  # [c, H, V, K]: S_0
        U = r["tb"] @ (r["vin"] - r["kg"] @ S.transpose(-1, -2))  # [c, H, n, V]
        g_before = torch.zeros_like(r["G"][:, :, :1])
        for blk in range(blocks):
            rows = slice(blk * _SUB, (blk + 1) * _SUB)
            g_last = r["G"][:, :, rows.stop - 1:rows.stop]  # [c, H, 1, K]
            S = S * torch.exp(g_last - g_before) + U[:, :, rows].transpose(-1, -2) @ (
                r["k"][:, :, rows] * torch.exp(g_last - r["G"][:, :, rows]))
            g_before = g_last
            at = [(slot[c, rows.stop], p) for p, c in enumerate(batch) if (c, rows.stop) in slot]
            put([i for i, _ in at], [p for _, p in at], S)
    return out


def scan_torch(ops, cu: list[int], initial_state, with_output: bool = True):
    """The scan kernel's chunk steps in torch on the fp32 chunk tensors (the CPU tests' stand-in for the kernel):
    ``(out [T, H, V] or None, final [N, H, K, V], entering states [chunks, H, K, V])``, fla's state layout."""
    chunks, base = chunk_list(cu)
    hs, dev = ops["gam"].shape[1], ops["gam"].device
    n = len(cu) - 1
    final = torch.zeros(n, hs, DIM, DIM, device=dev)
    ck = torch.zeros(len(chunks), hs, DIM, DIM, device=dev)
    out = torch.zeros(ops["kg"].shape[0], hs, DIM, device=dev) if with_output else None
    for s in range(n):
        S = (torch.zeros(hs, DIM, DIM, device=dev) if initial_state is None
             else initial_state[s].transpose(-1, -2).float())  # [H, V, K]
        for c in range(base[s], base[s + 1] if s + 1 < n else len(chunks)):
            t0, L = chunks[c]
            ck[c] = S.transpose(-1, -2)
            delta = ops["tb_c"][c] @ (ops["vin_c"][c] - ops["kg_c"][c] @ S.transpose(-1, -2))  # [H, 64, V]
            if with_output:
                qg = ops["qg"][t0:t0 + L].float().transpose(0, 1)
                pm = ops["pm"][t0:t0 + L].float().transpose(0, 1)[:, :, :CHUNK]
                out[t0:t0 + L] = (qg @ S.transpose(-1, -2) + pm @ delta).transpose(0, 1)
            kd = ops["k_c"][c] * torch.exp(ops["G"][c][:, -1:, :] - ops["G"][c])
            S = S * ops["gam"][c][:, None, :] + delta.transpose(-1, -2) @ kd
        final[s] = S.transpose(-1, -2)
    return out, final, ck
