# SPDX-License-Identifier: Apache-2.0
# Port of DeepEP's intranode dispatch layout (deep_ep/buffer.py get_dispatch_layout / dispatch, csrc/kernels/
# layout.cu and intranode.cu) from https://github.com/deepseek-ai/DeepEP at commit
# 01dc3aaac82068020353dce2c302e38153c0bfaa: semantics read, not copied.
"""The dispatch layout (torch, on the tokens' device) and the receive-buffer layout shared by ``deepep_dispatch`` and
``deepep_combine``.

DeepEP's intranode semantics, for ``W`` ranks each owning ``E / W`` consecutive experts:
- ``num_tokens_per_rank[j]``: tokens of this rank with at least one top-k expert on rank j (-1 entries masked);
  ``is_token_in_rank[i, j]``: token i goes to rank j; ``num_tokens_per_expert[e]``: tokens with expert e in their top-k.
- ``rank_prefix_matrix[i, j]``: tokens ranks 0..i send to rank j (prefix over the source rank), so rank j receives
  the tokens of rank i in rows ``[rank_prefix_matrix[i - 1, j], rank_prefix_matrix[i, j])``, each source's tokens in
  their order.
- per received row: the token (``recv_src_idx``: its index on the source rank), its top-k experts made local to the
  receiver (``e - j * E / W``; -1 where the expert is elsewhere or masked) and their weights (0 where -1);
  ``num_recv_tokens_per_expert``: per local expert, received rows naming it, rounded up to ``expert_alignment``.
- combine: each token's row is the sum, over the ranks it went to, of that rank's row for it (fp32, rank order),
  and its weights the sum of the ranks' local weights.

``positions[i, j]``: the row token i lands in on rank j (-1: not sent) = ``rank_prefix_matrix[rank - 1, j]`` + the
number of this rank's tokens before i sent to j; the dispatch kernel writes there and the combine kernel reads there.
"""

from __future__ import annotations

import torch


def layout(topk_idx: torch.Tensor, num_experts: int, world: int) -> tuple:
    """``(num_tokens_per_rank [W] int32, num_tokens_per_expert [E] int32, is_token_in_rank [t, W] bool)``."""
    t = topk_idx.shape[0]
    valid = topk_idx >= 0
    experts = torch.where(valid, topk_idx, torch.zeros_like(topk_idx))
    per_expert = torch.zeros(num_experts, dtype=torch.int32, device=topk_idx.device)
    per_expert.index_add_(0, experts[valid], torch.ones_like(experts[valid], dtype=torch.int32))
    owner = experts // (num_experts // world)
    in_rank = torch.zeros(t, world, dtype=torch.bool, device=topk_idx.device)
    rows = torch.arange(t, device=topk_idx.device).unsqueeze(1).expand_as(owner)
    in_rank[rows[valid], owner[valid]] = True
    return in_rank.sum(0, dtype=torch.int32), per_expert, in_rank


def rank_prefix_matrix(counts: torch.Tensor) -> torch.Tensor:
    """``counts[i, j]`` = tokens rank i sends to rank j -> DeepEP's prefix over the source rank (int32)."""
    return counts.cumsum(0, dtype=torch.int32)


def positions(is_token_in_rank: torch.Tensor, prefix: torch.Tensor, rank: int) -> torch.Tensor:
    """Row of each (token, destination) pair in the destination's receive buffer, -1 where not sent (int32)."""
    start = prefix[rank - 1] if rank > 0 else torch.zeros_like(prefix[0])
    sent = is_token_in_rank.to(torch.int32)
    before = sent.cumsum(0, dtype=torch.int32) - sent
    return torch.where(is_token_in_rank, start.unsqueeze(0) + before, torch.full_like(before, -1))


def localize(topk_idx: torch.Tensor, topk_weights: torch.Tensor, rank: int, experts_per_rank: int) -> tuple:
    """The top-k experts of rank ``rank`` made local (others and masked: -1) and their weights (others: 0)."""
    local = topk_idx - rank * experts_per_rank
    mine = (topk_idx >= 0) & (local >= 0) & (local < experts_per_rank)
    return torch.where(mine, local, torch.full_like(local, -1)), torch.where(mine, topk_weights,
                                                                            torch.zeros_like(topk_weights))


def recv_expert_counts(recv_topk_idx: torch.Tensor, experts_per_rank: int, alignment: int) -> list:
    """Received rows per local expert, rounded up to ``alignment`` (DeepEP's num_recv_tokens_per_expert_list)."""
    counts = [(recv_topk_idx == e).any(dim=1).sum().item() for e in range(experts_per_rank)]
    return [-(-c // alignment) * alignment for c in counts]


# ---------------------------------------------------------------------------------------------------------
# The receive buffer in a rank's (symmetric) workspace: rows of x, then their top-k experts, weights, source index
# ---------------------------------------------------------------------------------------------------------

def _align(n: int) -> int:
    return -(-n // 128) * 128


def workspace_offsets(capacity: int, hidden: int, topk: int) -> dict:
    """Byte offsets of the regions of a workspace of ``capacity`` rows: ``x`` (bf16 rows), ``idx`` (int64 top-k),
    ``w`` (fp32 top-k), ``src`` (int32), and the total ``bytes``."""
    x = 0
    idx = _align(capacity * hidden * 2)
    w = _align(idx + capacity * topk * 8)
    src = _align(w + capacity * topk * 4)
    return {"x": x, "idx": idx, "w": w, "src": src, "bytes": _align(src + capacity * 4)}


def views(ws: torch.Tensor, rows: int, capacity: int, hidden: int, topk: int) -> dict:
    """The first ``rows`` rows of each region of one rank's workspace (a uint8 tensor)."""
    off = workspace_offsets(capacity, hidden, topk)
    return {"x": ws[off["x"]:off["x"] + rows * hidden * 2].view(torch.bfloat16).view(rows, hidden),
            "idx": ws[off["idx"]:off["idx"] + rows * topk * 8].view(torch.int64).view(rows, topk),
            "w": ws[off["w"]:off["w"] + rows * topk * 4].view(torch.float32).view(rows, topk),
            "src": ws[off["src"]:off["src"] + rows * 4].view(torch.int32)}


# ---------------------------------------------------------------------------------------------------------
# The torch all-to-all oracle (every rank's inputs in one process)
# ---------------------------------------------------------------------------------------------------------

def reference_dispatch(xs, topk_idxs, topk_weights, num_experts: int, alignment: int = 1) -> list:
    """Per destination rank: ``(recv_x, recv_topk_idx, recv_topk_weights, recv_src_idx, num_recv_tokens_per_expert,
    rank_prefix_matrix)`` of DeepEP's intranode dispatch, from every rank's inputs (lists indexed by rank)."""
    world = len(xs)
    epr = num_experts // world
    lay = [layout(ti, num_experts, world) for ti in topk_idxs]
    prefix = rank_prefix_matrix(torch.stack([lay_r[0] for lay_r in lay]))
    out = []
    for j in range(world):
        rows = [torch.nonzero(lay[i][2][:, j]).flatten() for i in range(world)]
        rx = torch.cat([xs[i][rows[i]] for i in range(world)])
        ri, rw = zip(*[localize(topk_idxs[i][rows[i]], topk_weights[i][rows[i]], j, epr) for i in range(world)])
        ri, rw = torch.cat(ri), torch.cat(rw)
        src = torch.cat(rows).to(torch.int32)
        out.append((rx, ri, rw, src, recv_expert_counts(ri, epr, alignment), prefix))
    return out


def reference_combine(ys, topk_ws, is_token_in_ranks, positions_list) -> list:
    """Per source rank: ``(combined_x, combined_topk_weights)``: each token's rows on the ranks it went to, summed in
    fp32 in rank order (then rounded to bf16), and their local weights summed."""
    world = len(ys)
    out = []
    for in_rank, pos in zip(is_token_in_ranks, positions_list):
        acc = torch.zeros(pos.shape[0], ys[0].shape[1], dtype=torch.float32, device=ys[0].device)
        accw = torch.zeros(pos.shape[0], topk_ws[0].shape[1], dtype=torch.float32, device=ys[0].device)
        for j in range(world):
            sel = in_rank[:, j]
            acc[sel] += ys[j][pos[sel, j].long()].float()
            accw[sel] += topk_ws[j][pos[sel, j].long()]
        out.append((acc.to(ys[0].dtype), accw))
    return out
