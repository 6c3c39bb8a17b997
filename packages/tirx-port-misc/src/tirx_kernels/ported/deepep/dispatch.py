# SPDX-License-Identifier: Apache-2.0
# Port of DeepEP's intranode dispatch (deep_ep/buffer.py Buffer.dispatch, csrc/kernels/intranode.cu) from
# https://github.com/deepseek-ai/DeepEP at commit 01dc3aaac82068020353dce2c302e38153c0bfaa: semantics read, not copied.
"""MoE dispatch over NVLink, DeepEP's intranode semantics (``_layout``'s docstring): each rank's tokens x [t, H] bf16
with top-k experts over E (-1 masked) and weights go to the ranks owning those experts; every rank returns its
received rows (ordered by source rank, then token), their local top-k experts and weights, the source index of each
row, its per-expert receive counts rounded up to ``expert_alignment`` and DeepEP's ``rank_prefix_matrix``.

Design: the layout in torch; counts exchanged and read on the host; the TIRx kernel (``_kernels``: a CTA per token,
16-byte peer stores to each destination's workspace at the row ``_layout.positions`` gives it), between two barriers
(``_host``). No NVLink multicast. Any world size; no process group: one rank. ``simulate_dispatch`` runs W ranks on
one GPU (the CONFIGS' ``world_size`` > 1 rows); the multi-GPU test is tests/test_deepep_gpu.py.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, symm
from tirx_kernels.ported.deepep import _host, _layout

KERNEL_META = {
    "name": "deepep_dispatch",
    "category": "ported.deepep",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "MoE token dispatch over NVLink (DeepEP intranode semantics: layout, rank/expert prefix sums, "
                   "peer stores into the owners' receive buffers), bf16, any world size",
    "public_ops": ["dispatch"],
    "upstream": {"project": "DeepEP", "url": "https://github.com/deepseek-ai/DeepEP",
                 "commit": "01dc3aaac82068020353dce2c302e38153c0bfaa"},
}

# The catalog's rows (x [t, 7168] bf16, top-6 of 256 experts, 8 ranks: simulated on one GPU), masked and aligned
# variants, world size 1, and a small ragged one.
CONFIGS = [
    {"label": "w8sim_t128_h7168_e256_k6", "T": 128, "H": 7168, "E": 256, "topk": 6, "world_size": 8},
    {"label": "w8sim_t1024_h7168_e256_k6", "T": 1024, "H": 7168, "E": 256, "topk": 6, "world_size": 8},
    {"label": "w8sim_t4096_h7168_e256_k6", "T": 4096, "H": 7168, "E": 256, "topk": 6, "world_size": 8},
    {"label": "w8sim_t1024_h7168_e256_k6_masked_align128", "T": 1024, "H": 7168, "E": 256, "topk": 6,
     "world_size": 8, "masked": 0.25, "alignment": 128},
    {"label": "w1_t4096_h7168_e256_k6", "T": 4096, "H": 7168, "E": 256, "topk": 6, "world_size": 1},
    {"label": "w3sim_t37_h136_e12_k3_masked", "T": 37, "H": 136, "E": 12, "topk": 3, "world_size": 3, "masked": 0.3},
]
DEFAULTS = {"masked": 0.0, "alignment": 1}


def compile_params(**cfg) -> dict:
    return {"kernel": "dispatch"}


def call_samples(rng) -> list[dict]:
    return [{"T": rng.randint(1, 4096), "H": 8 * rng.randint(1, 1024), "E": 256, "topk": rng.choice([1, 6, 8]),
             "world_size": w} for w in (1, 2, 4, 8) for _ in range(6)]


def get_kernel(**_):
    from tirx_kernels.ported.deepep import _kernels

    return _kernels.build_dispatch_kernel()


def sass_expect(**_) -> list[str]:
    """16-byte row copies (the peer stores) and the system-scope fence before the kernel ends."""
    return [r"LDG\.E\.128", r"STG\.E\.128", r"MEMBAR\.ALL\.SYS"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle
# ---------------------------------------------------------------------------------------------------------

def routing(world_size: int, T: int, E: int, topk: int, masked: float = 0.0, device="cuda") -> tuple:  # noqa: N803
    """Per rank: top-k distinct experts of random scores, a ``masked`` fraction of entries -1, random weights."""
    scores = torch.rand(world_size, T, E, device=device)
    idx = scores.topk(topk, dim=-1).indices
    if masked:
        idx = idx.masked_fill(torch.rand(idx.shape, device=device) < masked, -1)
    return idx.contiguous(), torch.randn(world_size, T, topk, device=device)


def prepare_data(T: int, H: int, E: int, topk: int, world_size: int, masked: float = 0.0, alignment: int = 1,  # noqa: N803
                 **_) -> dict:
    x = torch.randn(world_size, T, H, device="cuda").bfloat16()
    idx, w = routing(world_size, T, E, topk, masked)
    ref = _layout.reference_dispatch(list(x), list(idx), list(w), E, alignment)
    total = sum(r[0].shape[0] for r in ref)
    return {"x": x, "topk_idx": idx, "topk_weights": w, "num_experts": E, "alignment": alignment,
            "recv_x": torch.full((total, H), float("nan"), device="cuda").bfloat16(),
            "recv_topk_idx": torch.zeros(total, topk, dtype=torch.int64, device="cuda"),
            "recv_topk_weights": torch.full((total, topk), float("nan"), device="cuda"),
            "recv_src_idx": torch.zeros(total, dtype=torch.int32, device="cuda"),
            "num_recv_tokens_per_expert": torch.zeros(E, dtype=torch.int32, device="cuda"),
            "rank_prefix_matrix": torch.zeros(world_size, world_size, dtype=torch.int32, device="cuda")}


def reference(x, topk_idx, topk_weights, num_experts, alignment=1, **_) -> dict:
    """The torch all-to-all oracle (``_layout.reference_dispatch``), every rank's outputs concatenated."""
    ref = _layout.reference_dispatch(list(x), list(topk_idx), list(topk_weights), num_experts, alignment)
    return {"recv_x": torch.cat([r[0] for r in ref]), "recv_topk_idx": torch.cat([r[1] for r in ref]),
            "recv_topk_weights": torch.cat([r[2] for r in ref]), "recv_src_idx": torch.cat([r[3] for r in ref]),
            "num_recv_tokens_per_expert": torch.tensor([c for r in ref for c in r[4]], dtype=torch.int32,
                                                       device=x.device),
            "rank_prefix_matrix": ref[0][5]}


COMPARATORS = {k: harness.bit_exact for k in ("recv_x", "recv_topk_weights")}


def launch(cfg: dict, data: dict) -> None:
    outs = simulate_dispatch(data["x"], data["topk_idx"], data["topk_weights"], data["num_experts"],
                             data["alignment"])
    rows = 0
    for recv_x, recv_idx, recv_w, src, _, _ in outs:
        n = recv_x.shape[0]
        data["recv_x"][rows:rows + n].copy_(recv_x)
        data["recv_topk_idx"][rows:rows + n].copy_(recv_idx)
        data["recv_topk_weights"][rows:rows + n].copy_(recv_w)
        data["recv_src_idx"][rows:rows + n].copy_(src)
        rows += n
    data["num_recv_tokens_per_expert"].copy_(torch.tensor([c for o in outs for c in o[4]], dtype=torch.int32))
    data["rank_prefix_matrix"].copy_(outs[0][5].rank_prefix_matrix)


def roofline(T: int, H: int, topk: int, world_size: int, **_) -> dict:  # noqa: N803
    """Bytes: every rank's rows read once, at most min(topk, W) copies of each written (an upper bound)."""
    return {"bytes": world_size * T * H * 2 * (1 + min(topk, world_size))}


def get_baselines(**cfg) -> dict:
    def torch_all_to_all():
        # One GPU: the torch oracle (index_select + cat per destination, what an all_to_all_single moves). The
        # multi-GPU comparison (torch.distributed.all_to_all_single) is tests/test_deepep_gpu.py's.
        return lambda data: {k: v for k, v in reference(**data).items()}

    return {"torch_all_to_all": torch_all_to_all}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "deepep_dispatch"


def _run_kernel(x, topk_idx, topk_weights, pos, peers, rank, epr, offs):
    fn = _host.kernel(__name__, compile_params(), x.device)
    fn(x, topk_idx, topk_weights, pos, peers.deltas, peers.ws, rank, epr, *offs)


def dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, group=None,
             expert_alignment: int = 1):
    """``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle)`` of DeepEP's intranode
    dispatch over the ranks of ``group`` (a ProcessGroup with symmetric memory; None: one rank). ``handle.
    recv_src_idx`` holds each received row's index on its source rank."""
    _, rank, world = symm.group_rank_size(group)
    _host.check_dispatch(_OP, x, topk_idx, topk_weights, num_experts, world, expert_alignment)
    if torch.compiler.is_compiling():  # the handle is a host object: the custom op (recv tensors only) is the way in
        raise checks.TirxInputError(f"{_OP}: argument 'x': dispatch returns a host handle torch.compile cannot trace; "
                                    "call torch.ops.tirx.deepep_dispatch for the received tensors")
    per_rank, per_expert, in_rank = _layout.layout(topk_idx, num_experts, world)
    counts, per_expert_all = _host.exchange_counts(group, per_rank, per_expert)
    prefix = _layout.rank_prefix_matrix(counts)
    pos = _layout.positions(in_rank, prefix, rank).contiguous()
    recv = prefix[-1].tolist()  # one host sync (DeepEP's non-cached dispatch)
    hidden, topk = x.shape[1], topk_idx.shape[1]
    off, offs = _host.offsets_args(max(max(recv), 1), hidden, topk)
    peers = _host.Peers(group, off["bytes"], x.device)
    peers.barrier()  # no peer still reads this rank's workspace
    _run_kernel(x, topk_idx, topk_weights, pos, peers, rank, num_experts // world, offs)
    peers.barrier()  # every row has landed
    v = _layout.views(peers.ws, recv[rank], max(max(recv), 1), hidden, topk)
    handle = _host.Handle(pos, prefix, in_rank, recv[rank], max(max(recv), 1), hidden, topk)
    handle.recv_src_idx = v["src"].clone()
    counts_list = _host.aligned_expert_counts(per_expert_all, rank, world, expert_alignment)
    return v["x"].clone(), v["idx"].clone(), v["w"].clone(), counts_list, handle


@torch.library.custom_op("tirx::deepep_dispatch", mutates_args=(),
                         schema="(Tensor x, Tensor topk_idx, Tensor topk_weights, int num_experts) -> "
                                "(Tensor, Tensor, Tensor)")
def _dispatch_op(x, topk_idx, topk_weights, num_experts):
    recv_x, recv_idx, recv_w, _, _ = dispatch(x, topk_idx, topk_weights, num_experts)
    return recv_x, recv_idx, recv_w


@_dispatch_op.register_fake
def _(x, topk_idx, topk_weights, num_experts):
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty((n, x.shape[1])), topk_idx.new_empty((n, topk_idx.shape[1])), \
        topk_weights.new_empty((n, topk_weights.shape[1]))


def simulate_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                      expert_alignment: int = 1) -> list:
    """W = ``x.shape[0]`` ranks on one GPU (rank r's inputs ``x[r]`` ...; every workspace in one allocation): every
    rank's dispatch kernel, then the reads. Per rank: ``(recv_x, recv_topk_idx, recv_topk_weights, recv_src_idx,
    num_recv_tokens_per_expert_list, handle)``."""
    world, _, hidden = x.shape
    topk = topk_idx.shape[2]
    for r in range(world):
        _host.check_dispatch(_OP, x[r], topk_idx[r], topk_weights[r], num_experts, world, expert_alignment)
    lays = [_layout.layout(topk_idx[r], num_experts, world) for r in range(world)]
    prefix = _layout.rank_prefix_matrix(torch.stack([lay[0] for lay in lays]))
    recv = prefix[-1].tolist()
    cap = max(max(recv), 1)
    off, offs = _host.offsets_args(cap, hidden, topk)
    stride = -(-off["bytes"] // 4096) * 4096
    ws = torch.empty(world, stride, dtype=torch.uint8, device=x.device)
    handles = []
    for r in range(world):
        pos = _layout.positions(lays[r][2], prefix, r).contiguous()
        peers = _SimPeers(ws[r], torch.tensor([(q - r) * stride for q in range(world)], dtype=torch.int64,
                                              device=x.device))
        _run_kernel(x[r], topk_idx[r], topk_weights[r], pos, peers, r, num_experts // world, offs)
        handles.append(_host.Handle(pos, prefix, lays[r][2], recv[r], cap, hidden, topk))
    per_expert_all = torch.stack([lay[1] for lay in lays])
    out = []
    for r in range(world):
        v = _layout.views(ws[r], recv[r], cap, hidden, topk)
        handles[r].recv_src_idx = v["src"].clone()
        out.append((v["x"].clone(), v["idx"].clone(), v["w"].clone(), v["src"].clone(),
                    _host.aligned_expert_counts(per_expert_all, r, world, expert_alignment), handles[r]))
    return out


class _SimPeers:
    def __init__(self, ws, deltas):
        self.ws, self.deltas = ws, deltas


run_test, run_bench = harness.bind(__name__)
