# SPDX-License-Identifier: Apache-2.0
# Port of DeepEP's intranode combine (deep_ep/buffer.py Buffer.combine, csrc/kernels/intranode.cu) from
# https://github.com/deepseek-ai/DeepEP at commit 01dc3aaac82068020353dce2c302e38153c0bfaa: semantics read, not copied.
"""MoE combine over NVLink, DeepEP's intranode semantics: the expert outputs of the rows a rank received in
``deepep_dispatch`` go back to their source tokens; a token's row is the sum, over the ranks it was sent to, of their
rows for it (fp32 in rank order, rounded to bf16; the expert side applied the top-k weights, as in DeepEP), and its
weights the sum of the ranks' local weights.

Design: each rank copies its expert outputs (and weights) into its workspace; a barrier; the TIRx kernel (a CTA per
source token) *pulls* the rows with peer loads at the positions dispatch chose (``handle.positions``); a barrier.
No NVLink multicast. ``simulate_combine`` runs W ranks on one GPU; the multi-GPU test is tests/test_deepep_gpu.py.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, symm
from tirx_kernels.ported.deepep import _host, _layout
from tirx_kernels.ported.deepep import dispatch as _dispatch

KERNEL_META = {
    "name": "deepep_combine",
    "category": "ported.deepep",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "MoE combine over NVLink (DeepEP intranode semantics: each token's expert outputs pulled from "
                   "the ranks it went to by peer loads and summed in fp32), bf16, any world size",
    "public_ops": ["combine"],
    "upstream": {"project": "DeepEP", "url": "https://github.com/deepseek-ai/DeepEP",
                 "commit": "01dc3aaac82068020353dce2c302e38153c0bfaa"},
}

CONFIGS = [
    {"label": "w8sim_t4096_h7168_e256_k6", "T": 4096, "H": 7168, "E": 256, "topk": 6, "world_size": 8},
    {"label": "w8sim_t1024_h7168_e256_k6", "T": 1024, "H": 7168, "E": 256, "topk": 6, "world_size": 8},
    {"label": "w8sim_t128_h7168_e256_k6_masked", "T": 128, "H": 7168, "E": 256, "topk": 6, "world_size": 8,
     "masked": 0.25},
    {"label": "w1_t4096_h7168_e256_k6", "T": 4096, "H": 7168, "E": 256, "topk": 6, "world_size": 1},
    {"label": "w3sim_t37_h136_e12_k3_masked", "T": 37, "H": 136, "E": 12, "topk": 3, "world_size": 3, "masked": 0.3},
]
DEFAULTS = {"masked": 0.0}


def compile_params(**cfg) -> dict:
    return {"kernel": "combine"}


def call_samples(rng) -> list[dict]:
    return _dispatch.call_samples(rng)


def get_kernel(**_):
    from tirx_kernels.ported.deepep import _kernels

    return _kernels.build_combine_kernel()


def sass_expect(**_) -> list[str]:
    """16-byte peer loads that allocate no L1 line, 16-byte stores of the sums."""
    return [r"LDG\.E\.NA\.128", r"STG\.E\.128"]


def prepare_data(T: int, H: int, E: int, topk: int, world_size: int, masked: float = 0.0, **_) -> dict:  # noqa: N803
    """A routing (as dispatch's), the torch dispatch of it, random expert outputs ``y`` for every received row (all
    ranks' rows concatenated) with the received weights ``y_w``; outputs per source rank and token."""
    x = torch.randn(world_size, T, H, device="cuda").bfloat16()
    idx, w = _dispatch.routing(world_size, T, E, topk, masked)
    ref = _layout.reference_dispatch(list(x), list(idx), list(w), E)
    lays = [_layout.layout(idx[r], E, world_size) for r in range(world_size)]
    prefix = ref[0][5]
    pos = torch.stack([_layout.positions(lays[r][2], prefix, r) for r in range(world_size)])
    rows = [r[0].shape[0] for r in ref]  # received rows per rank (a list: not a tensor the harness guards)
    y = torch.randn(sum(rows), H, device="cuda").bfloat16()
    return {"y": y, "y_w": torch.cat([r[2] for r in ref]), "positions": pos.contiguous(),
            "is_token_in_rank": torch.stack([lay[2] for lay in lays]), "recv_rows": rows,
            "combined_x": torch.full((world_size, T, H), float("nan"), device="cuda").bfloat16(),
            "combined_topk_weights": torch.full((world_size, T, topk), float("nan"), device="cuda")}


def _split(y, recv_rows):
    return list(torch.split(y, list(recv_rows)))


def reference(y, y_w, positions, is_token_in_rank, recv_rows, **_) -> dict:
    """The torch oracle: per source token, the rows of the ranks it went to summed in fp32 in rank order."""
    ref = _layout.reference_combine(_split(y, recv_rows), _split(y_w, recv_rows), list(is_token_in_rank),
                                    list(positions))
    return {"combined_x": torch.stack([r[0] for r in ref]), "combined_topk_weights": torch.stack([r[1] for r in ref])}


COMPARATORS = {k: harness.bit_exact for k in ("combined_x", "combined_topk_weights")}


def launch(cfg: dict, data: dict) -> None:
    world = data["positions"].shape[0]
    ys, ws = _split(data["y"], data["recv_rows"]), _split(data["y_w"], data["recv_rows"])
    cap = max(max(data["recv_rows"]), 1)
    handles = [_host.Handle(data["positions"][r], None, data["is_token_in_rank"][r], ys[r].shape[0], cap,
                            ys[r].shape[1], ws[r].shape[1]) for r in range(world)]
    for r, (cx, cw) in enumerate(simulate_combine(ys, ws, handles)):
        data["combined_x"][r].copy_(cx)
        data["combined_topk_weights"][r].copy_(cw)


def roofline(T: int, H: int, topk: int, world_size: int, **_) -> dict:  # noqa: N803
    return {"bytes": world_size * T * H * 2 * (1 + min(topk, world_size))}


def get_baselines(**cfg) -> dict:
    def torch_all_to_all():
        return lambda data: reference(**data)

    return {"torch_all_to_all": torch_all_to_all}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "deepep_combine"


def _check(x, handle, topk_weights) -> None:
    checks.tensor(_OP, "x", x, dtypes=(torch.bfloat16,), shape=(handle.num_recv, handle.hidden), contiguous=True)
    if topk_weights is not None:
        checks.tensor(_OP, "topk_weights", topk_weights, dtypes=(torch.float32,), shape=(handle.num_recv, handle.topk),
                      contiguous=True)


def _run(x, topk_weights, handle, peers, out, out_w):
    off, _ = _host.offsets_args(handle.capacity, handle.hidden, handle.topk)
    v = _layout.views(peers.ws, handle.num_recv, handle.capacity, handle.hidden, handle.topk)
    v["x"].copy_(x)
    if topk_weights is not None:
        v["w"].copy_(topk_weights)
    else:
        v["w"].zero_()
    return off


def combine(x: torch.Tensor, handle, topk_weights: torch.Tensor | None = None, group=None):
    """``(combined_x [t, H] bf16, combined_topk_weights [t, k] fp32 or None)`` for this rank's expert outputs ``x``
    [num_recv, H] of the rows ``deepep_dispatch`` gave it (``handle``), over the ranks of ``group``."""
    _check(x, handle, topk_weights)
    if torch.compiler.is_compiling():
        raise checks.TirxInputError(f"{_OP}: argument 'handle': a dispatch handle cannot be traced by torch.compile")
    _, rank, world = symm.group_rank_size(group)
    off, _ = _host.offsets_args(handle.capacity, handle.hidden, handle.topk)
    peers = _host.Peers(group, off["bytes"], x.device)
    _run(x, topk_weights, handle, peers, None, None)
    t = handle.positions.shape[0]
    out = x.new_empty((t, handle.hidden))
    out_w = torch.empty(t, handle.topk, dtype=torch.float32, device=x.device)
    peers.barrier()  # every rank's outputs in its workspace
    _host.kernel(__name__, compile_params(), x.device)(handle.positions, peers.deltas, peers.ws, out, out_w, off["w"])
    peers.barrier()  # no rank rewrites its workspace while a peer still reads it
    return out, (out_w if topk_weights is not None else None)


@torch.library.custom_op("tirx::deepep_combine", mutates_args=(),
                         schema="(Tensor x, Tensor positions, Tensor y_w) -> (Tensor, Tensor)")
def _combine_op(x, positions, y_w):
    handle = _host.Handle(positions, None, positions >= 0, x.shape[0], max(x.shape[0], 1), x.shape[1], y_w.shape[1])
    return combine(x, handle, y_w)


@_combine_op.register_fake
def _(x, positions, y_w):
    return x.new_empty((positions.shape[0], x.shape[1])), y_w.new_empty((positions.shape[0], y_w.shape[1]))


def simulate_combine(ys: list, ws: list, handles: list) -> list:
    """W ranks on one GPU: rank r's expert outputs ``ys[r]`` and weights ``ws[r]`` for the rows of ``handles[r]`` (all
    with one ``capacity``); every rank's copy into its workspace (one allocation), then every rank's combine."""
    world = len(ys)
    h0 = handles[0]
    off, _ = _host.offsets_args(h0.capacity, h0.hidden, h0.topk)
    stride = -(-off["bytes"] // 4096) * 4096
    wsp = torch.empty(world, stride, dtype=torch.uint8, device=ys[0].device)
    for r in range(world):
        _check(ys[r], handles[r], ws[r])
        _run(ys[r], ws[r], handles[r], _dispatch._SimPeers(wsp[r], None), None, None)
    out = []
    fn = _host.kernel(__name__, compile_params(), ys[0].device)
    for r in range(world):
        t = handles[r].positions.shape[0]
        cx = ys[0].new_empty((t, h0.hidden))
        cw = torch.empty(t, h0.topk, dtype=torch.float32, device=ys[0].device)
        deltas = torch.tensor([(q - r) * stride for q in range(world)], dtype=torch.int64, device=ys[0].device)
        fn(handles[r].positions.contiguous(), deltas, wsp[r], cx, cw, off["w"])
        out.append((cx, cw))
    return out


run_test, run_bench = harness.bind(__name__)
