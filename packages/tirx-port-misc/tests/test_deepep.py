# SPDX-License-Identifier: Apache-2.0
"""CPU tests of the DeepEP port: the layout and prefix sums against a loop-by-loop Python model of DeepEP's
semantics, and the dispatch and combine kernels on the CPU emulator for 1 and 3 simulated ranks in one process (every
rank's workspace in one allocation; all dispatch kernels, then the reads; all copies into the workspaces, then all
combine kernels: the order the host's barriers impose), exact against the torch all-to-all oracle. Their builds (no
spills, SASS) are test_build_kernels.py's rows."""

import shutil

import pytest
import torch

from tirx_kernels.ported.deepep import _host, _layout


def _routing(world, t, e, k, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(world, t, e, generator=g).topk(k, dim=-1).indices
    idx = idx.masked_fill(torch.rand(idx.shape, generator=g) < 0.3, -1)
    return idx.contiguous(), torch.randn(world, t, k, generator=g)


def test_layout_and_positions_match_a_loop_model():
    world, t, e, k = 3, 29, 12, 3
    idx, _ = _routing(world, t, e, k, 1)
    epr = e // world
    lays = [_layout.layout(idx[r], e, world) for r in range(world)]
    counts = torch.zeros(world, world, dtype=torch.int32)
    for r in range(world):
        per_rank, per_expert, in_rank = lays[r]
        for i in range(t):
            dsts = {int(x) // epr for x in idx[r, i] if x >= 0}
            assert in_rank[i].tolist() == [j in dsts for j in range(world)]
            for j in dsts:
                counts[r, j] += 1
        assert per_rank.tolist() == counts[r].tolist()
        assert per_expert.tolist() == [int((idx[r] == x).sum()) for x in range(e)]
    prefix = _layout.rank_prefix_matrix(counts)
    for j in range(world):
        row = 0
        for r in range(world):
            pos = _layout.positions(lays[r][2], prefix, r)
            for i in range(t):
                if lays[r][2][i, j]:
                    assert pos[i, j] == row
                    row += 1
                else:
                    assert pos[i, j] == -1
            assert prefix[r, j] == row
    per_expert_all = torch.stack([lay[1] for lay in lays])
    assert _host.aligned_expert_counts(per_expert_all, 1, world, 4) == [
        -(-int(per_expert_all[:, epr + x].sum()) // 4) * 4 for x in range(epr)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("world", [1, 3])
def test_dispatch_and_combine_emulated(world):
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    from tirx_kernels.core import build, emulate
    from tirx_kernels.ported.deepep import _kernels

    mod = emulate.compile_module(build.codegen_many({"dispatch": _kernels.build_dispatch_kernel(),
                                                     "combine": _kernels.build_combine_kernel()}))
    t, h, e, k = 7, 136, 12, 3  # 17 vectors a row: threads 0..16 of 128 copy one each
    idx, w = _routing(world, t, e, k, 2 + world)
    x = torch.randn(world, t, h).bfloat16()
    ref = _layout.reference_dispatch(list(x), list(idx), list(w), e)
    lays = [_layout.layout(idx[r], e, world) for r in range(world)]
    prefix = ref[0][5]
    recv = prefix[-1].tolist()
    cap = max(max(recv), 1)
    off = _layout.workspace_offsets(cap, h, k)
    stride = -(-off["bytes"] // 4096) * 4096
    ws = torch.zeros(world, stride, dtype=torch.uint8)
    pos = [_layout.positions(lays[r][2], prefix, r).contiguous() for r in range(world)]
    deltas = [torch.tensor([(q - r) * stride for q in range(world)], dtype=torch.int64) for r in range(world)]
    for r in range(world):  # every rank's dispatch, then the reads
        mod(x[r], idx[r], w[r], pos[r], deltas[r], ws[r], r, e // world, off["idx"], off["w"], off["src"],
            function="dispatch", hang_timeout=60.0).check()
    for r in range(world):
        v = _layout.views(ws[r], recv[r], cap, h, k)
        for got, want in zip((v["x"], v["idx"], v["w"], v["src"]), ref[r][:4]):
            assert torch.equal(got, want), r
    ys = [torch.randn(recv[r], h).bfloat16() for r in range(world)]
    for r in range(world):  # every rank's expert outputs into its workspace, then every combine
        v = _layout.views(ws[r], recv[r], cap, h, k)
        v["x"].copy_(ys[r])
    want = _layout.reference_combine(ys, [r[2] for r in ref], [lay[2] for lay in lays], pos)
    for r in range(world):
        cx = torch.full((t, h), float("nan")).bfloat16()
        cw = torch.full((t, k), float("nan"))
        mod(pos[r], deltas[r], ws[r], cx, cw, off["w"], function="combine", hang_timeout=60.0).check()
        assert torch.equal(cx, want[r][0]) and torch.equal(cw, want[r][1]), r
        sent = lays[r][2].any(dim=1)
        assert torch.equal(cw[sent], torch.where(idx[r] >= 0, w[r], torch.zeros_like(w[r]))[sent])



@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_host_paths_on_the_emulator(monkeypatch):
    """The ops' host side (workspace geometry, views, per-rank byte offsets, handles) with the kernels on the CPU
    emulator: simulate_dispatch / simulate_combine for 3 ranks and the public dispatch / combine with one rank, against
    the torch oracle."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    from tirx_kernels.core import build, emulate
    from tirx_kernels.ported.deepep import _kernels, combine, dispatch

    mod = emulate.compile_module(build.codegen_many({"dispatch": _kernels.build_dispatch_kernel(),
                                                     "combine": _kernels.build_combine_kernel()}))
    from tirx_kernels.core import checks

    tensor_check = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda *a, **kw: tensor_check(*a, **{**kw, "cuda": False}))  # CPU tensors
    monkeypatch.setattr(_host, "kernel", lambda name, params, device: (
        lambda *args: mod(*args, function=params["kernel"], hang_timeout=60.0).check()))
    world, t, h, e, k = 3, 9, 64, 12, 3
    idx, w = _routing(world, t, e, k, 5)
    x = torch.randn(world, t, h).bfloat16()
    ref = _layout.reference_dispatch(list(x), list(idx), list(w), e, 4)
    outs = dispatch.simulate_dispatch(x, idx, w, e, 4)
    for r in range(world):
        for got, want in zip(outs[r][:4], ref[r][:4]):
            assert torch.equal(got, want), r
        assert outs[r][4] == ref[r][4]
    ys = [torch.randn(o[0].shape[0], h).bfloat16() for o in outs]
    got = combine.simulate_combine(ys, [o[2] for o in outs], [o[5] for o in outs])
    want = _layout.reference_combine(ys, [o[2] for o in outs], [o[5].is_token_in_rank for o in outs],
                                     [o[5].positions for o in outs])
    for r in range(world):
        assert torch.equal(got[r][0], want[r][0]) and torch.equal(got[r][1], want[r][1]), r
    recv_x, recv_idx, recv_w, counts, handle = dispatch.dispatch(x[0], idx[0], w[0], e, expert_alignment=4)
    one = _layout.reference_dispatch([x[0]], [idx[0]], [w[0]], e, 4)[0]
    assert torch.equal(recv_x, one[0]) and torch.equal(recv_idx, one[1]) and torch.equal(recv_w, one[2])
    assert torch.equal(handle.recv_src_idx, one[3]) and counts == one[4]
    cx, cw = combine.combine(recv_x, handle, recv_w)
    want1 = _layout.reference_combine([recv_x], [recv_w], [handle.is_token_in_rank], [handle.positions])[0]
    assert torch.equal(cx, want1[0]) and torch.equal(cw, want1[1])
