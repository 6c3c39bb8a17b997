# SPDX-License-Identifier: Apache-2.0
# Port of DeepEP's intranode Buffer.dispatch / Buffer.combine flow (deep_ep/buffer.py, csrc/deep_ep.cpp) from
# https://github.com/deepseek-ai/DeepEP at commit 01dc3aaac82068020353dce2c302e38153c0bfaa: semantics read, not copied.
"""Host side of ``deepep_dispatch`` / ``deepep_combine``: the count exchange, the workspaces and the barriers.

Per dispatch call on each of W ranks: the layout (``_layout.layout``); the counts exchanged (an NCCL all-gather of
[tokens per rank, tokens per expert]: DeepEP's notify step) and read on the host (one sync, as DeepEP's non-cached
dispatch), which sizes every rank's receive region alike (the largest receive count); a barrier (no peer still reads
this rank's workspace); the dispatch kernel's peer stores; a barrier (every row has landed); the received rows copied
out. Combine: the expert outputs (and weights) copied into the workspace; a barrier; the combine kernel's peer loads;
a barrier (no rank rewrites a workspace a peer still reads). Workspaces: torch symmetric memory (NVLink multicast
off); with one rank a local buffer. ``simulate_*``: W ranks on one GPU, every workspace in one allocation.
"""

from __future__ import annotations

import dataclasses

import torch

from tirx_kernels.core import checks, runtime, symm
from tirx_kernels.ported.deepep import _layout


@dataclasses.dataclass
class Handle:
    """What combine needs from dispatch: the rows each token went to on each rank (``positions`` [t, W], -1: not
    sent), DeepEP's ``rank_prefix_matrix`` [W, W], ``is_token_in_rank`` [t, W], the receive rows of this rank, and the
    workspace geometry (``capacity`` rows of ``hidden`` x bf16 and ``topk`` experts)."""
    positions: torch.Tensor
    rank_prefix_matrix: torch.Tensor
    is_token_in_rank: torch.Tensor
    num_recv: int
    capacity: int
    hidden: int
    topk: int


def check_dispatch(op, x, topk_idx, topk_weights, num_experts: int, world: int, alignment: int) -> None:
    checks.tensor(op, "x", x, dtypes=(torch.bfloat16,), ndim=2, contiguous=True)
    checks.multiple_of(op, "x.shape[1]", x.shape[1], 8, "hidden: 16-byte rows")
    checks.tensor(op, "topk_idx", topk_idx, dtypes=(torch.int64,), ndim=2, shape=(x.shape[0], None), contiguous=True)
    checks.tensor(op, "topk_weights", topk_weights, dtypes=(torch.float32,), shape=tuple(topk_idx.shape),
                  contiguous=True)
    checks.same_device(op, "x", x, topk_idx=topk_idx, topk_weights=topk_weights)
    checks.multiple_of(op, "num_experts", num_experts, world, "experts split evenly over the ranks")
    checks.in_range(op, "expert_alignment", alignment, 1, 1 << 20)


_FUNCTIONS = {}


def kernel(module_name: str, params: dict, device):
    """The loaded kernel of ``module_name`` (``deepep.dispatch`` / ``deepep.combine``) for ``params``."""
    fn = _FUNCTIONS.get((module_name, device.index))
    if fn is None:
        import importlib
        import sys

        importlib.import_module(module_name)
        fn = _FUNCTIONS[(module_name, device.index)] = runtime.get_function(sys.modules[module_name], params, device)
    return fn


class Peers:
    """This rank's workspace (uint8), the byte offsets of every rank's (``deltas``), and the barrier between ranks."""

    def __init__(self, group, nbytes: int, device):
        self.name, self.rank, self.world = symm.group_rank_size(group)
        if self.world == 1:
            self.ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self.deltas = torch.zeros(1, dtype=torch.int64, device=device)
            self._symm = None
            return
        self._symm = symm.symm_workspace(self.name, nbytes)
        self.ws = self._symm.get_buffer(self.rank, (nbytes,), torch.uint8)
        ptrs = self._symm.buffer_ptrs
        self.deltas = torch.tensor([p - ptrs[self.rank] for p in ptrs], dtype=torch.int64, device=device)

    def barrier(self) -> None:
        if self._symm is not None:
            self._symm.barrier()


def exchange_counts(group, per_rank: torch.Tensor, per_expert: torch.Tensor) -> tuple:
    """``(counts [W, W]: tokens rank i sends to rank j, per-expert counts [W, E] of every source rank)``."""
    _, _, world = symm.group_rank_size(group)
    mine = torch.cat([per_rank, per_expert]).to(torch.int32)
    if world == 1:
        rows = mine.unsqueeze(0)
    else:
        import torch.distributed as dist

        rows = torch.empty(world, mine.numel(), dtype=torch.int32, device=mine.device)
        dist.all_gather_into_tensor(rows, mine, group=group)
    return rows[:, :world], rows[:, world:]


def aligned_expert_counts(per_expert_all: torch.Tensor, rank: int, world: int, alignment: int) -> list:
    epr = per_expert_all.shape[1] // world
    counts = per_expert_all[:, rank * epr:(rank + 1) * epr].sum(0).tolist()
    return [-(-c // alignment) * alignment for c in counts]


def offsets_args(capacity: int, hidden: int, topk: int) -> tuple:
    off = _layout.workspace_offsets(capacity, hidden, topk)
    return off, (off["idx"], off["w"], off["src"])
