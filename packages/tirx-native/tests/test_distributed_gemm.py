# SPDX-License-Identifier: Apache-2.0
"""CPU tests of the distributed GEMMs (``allgather_gemm``, ``gemm_reduce_scatter``): the schedules (which rows a
rank's GEMM reads first, the copy and flag order), the hooks' argument lists, and the CPU emulator running the
kernels for several simulated ranks in one process (every "peer" buffer in one allocation): the producers of every
rank first (copies and flags for the all-gather; the partial GEMMs for the reduce-scatter), then the consumers, which
is a valid order for flag protocols (a consumer finds its flags set). GPU runs: tests/test_distributed_gemm_gpu.py.
"""

import shutil

import pytest
import torch

from tirx_kernels.core.lang import scheduler
from tirx_kernels.gemm import _dist
from tirx_kernels.gemm import allgather_gemm as ag
from tirx_kernels.gemm import gemm_reduce_scatter as rs


def _rank_tile_order(rank, world, M, N, tile):  # noqa: N803
    """The M-tiles rank ``rank``'s GEMM starts, in launch order (CTA c's first tile is linear tile c; the m-rotation of
    gemm/_persistent.py's sync hooks)."""
    p = ag._tile_params(tile)
    num_m, num_n = scheduler.num_tiles(M, N, p["block_m"], p["block_n"])
    rotate = rank * (M // world) // p["block_m"]
    grid = min(num_m * num_n, p["num_sms"])
    return [(scheduler.tile_coords(c, num_m, num_n, p["group_m"])[0] + rotate) % num_m for c in range(grid)]


@pytest.mark.parametrize("world, n", [(4, 24576), (8, 57344)])
def test_allgather_first_wave_reads_the_own_shard_first(world, n):
    """At M = 8192 the first tiles every rank launches lie in its own shard (no wait), and the first M-tile that
    needs a peer shard needs rank + 1's, the first one copied."""
    M, tile = 8192, ag.choose_tile(n // world)  # noqa: N806
    shard_tiles = M // world // 128
    for rank in range(world):
        order = _rank_tile_order(rank, world, M, n // world, tile)
        shards = [m // shard_tiles for m in order]
        assert shards[0] == rank
        foreign = [s for s in shards if s != rank]
        assert not foreign or foreign[0] == (rank + 1) % world


def test_one_rank_copies_before_a_gemm_that_never_waits(monkeypatch):
    """World size 1: the gathered A is complete before the GEMM starts, and every flag the GEMM would wait on is
    already set (no concurrent copy a spinning persistent GEMM could starve)."""
    calls = []

    def fake_gemm(gathered, w, out, flags, shard, chunk, m_rotate):
        calls.append((gathered.clone(), flags.clone(), shard, chunk, m_rotate))
        out.copy_(gathered @ w.T)

    monkeypatch.setattr(ag, "_gemm_fn", lambda a, w, tile: (fake_gemm, 128))
    a, w = torch.randn(300, 64), torch.randn(40, 64)
    out, gathered = torch.full((300, 40), float("nan")), torch.full((300, 64), float("nan"))
    ag.local_gemm(a, w, out, gathered)
    (g, flags, shard, chunk, m_rotate), = calls
    assert torch.equal(g, a) and bool((flags == 1).all()) and flags.numel() == -(-shard // chunk)
    assert shard == 300 and m_rotate == 0 and torch.allclose(out, a @ w.T)


def test_one_rank_is_the_library_gemm_into_out(monkeypatch):
    """gemm_reduce_scatter with one rank: the plain product by fp16_bf16_gemm straight into ``out`` (no partial
    workspace, no flags, no reduce kernel), the pinned tile passed on."""
    from tirx_kernels.gemm import fp16_bf16_gemm

    seen = []
    monkeypatch.setattr(rs, "gemm_then_reduce", lambda *a, **k: seen.append("protocol"))
    monkeypatch.setattr(fp16_bf16_gemm, "gemm_nt", lambda a, w, out, tile=None: (
        seen.append(tile), out.copy_(a.float() @ w.float().T)))
    a, w = torch.randn(256, 64).half(), torch.randn(128, 64).half()
    out = torch.full((256, 128), float("nan"), dtype=torch.float16)
    assert rs._gemm_reduce_scatter(a, w, None, out, rs.NARROW_TILE) is out
    assert seen == [rs.NARROW_TILE] and torch.equal(out, (a.float() @ w.float().T).half())


def test_chunks_are_whole_m_tiles():
    for shard in (100, 128, 1024, 2048, 8192, 1000):
        c = _dist.chunk_rows(shard, 128)
        assert c % 128 == 0 and c >= 128 and -(-shard // c) <= 4


def test_tile_choice_and_params():
    assert ag.compile_params(dtype="float16", M=8192, N=57344, K=8192, world_size=8)["tile"] == ag.WIDE_TILE
    assert ag.compile_params(dtype="bfloat16", M=300, N=600, K=136, world_size=3)["tile"] == ag.NARROW_TILE
    with pytest.raises(ValueError, match="tile"):
        ag.get_kernel("float16", "persistent_128x256x64_s3_c2_g8")


needs_tvm = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@needs_tvm
def test_sync_hooks_take_their_arguments():
    pytest.importorskip("tvm", reason="apache-tvm is needed to trace kernels")
    from tirx_kernels.gemm import _persistent

    f = ag.get_kernel("bfloat16", ag.NARROW_TILE)
    assert [p.name for p in f.params] == ["A", "B", "C", "Sync", "sync_rows", "sync_chunk", "m_rotate"]
    g = _persistent.build_persistent_kernel("bfloat16", 128, 128, 64, 6, 1, 8, 132, sync="publish_tiles")
    assert [p.name for p in g.params] == ["A", "B", "C", "Sync", "m_rotate"]
    with pytest.raises(ValueError, match="sync"):
        _persistent.build_persistent_kernel("bfloat16", 128, 128, 64, 6, 2, 8, 132, sync="wait_rows")


@pytest.fixture(scope="module")
def emulated():
    """The all-gather GEMM, the reduce-scatter's partial GEMM and its reduce (bf16, 128 x 128 tiles), one g++ run."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    from tirx_kernels.core import build, emulate

    return emulate.compile_module(build.codegen_many({
        "ag": ag.get_kernel("bfloat16", ag.NARROW_TILE),
        "rs_gemm": rs.get_kernel("bfloat16", rs.NARROW_TILE, "gemm"),
        "rs_reduce": rs.get_kernel("bfloat16", rs.NARROW_TILE, "reduce")}))


@needs_tvm
def test_allgather_gemm_emulated_three_ranks(emulated):
    """3 ranks of 100 rows (M = 300: shard boundaries inside M-tiles 0 and 1, so a tile waits for two shards' flags),
    N / W = 200 (2 N-tiles of 128, the second ragged), K = 136 (3 K-tiles): each rank's rotated GEMM over the gathered
    A, after the copies and flags (producers first), equals the fp32 oracle of its column shard."""
    world, M, N, K = 3, 300, 600, 136  # noqa: N806
    g = torch.Generator().manual_seed(7)
    a = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).bfloat16()
    shard = M // world
    chunk = _dist.chunk_rows(shard, 128)
    per_shard = -(-shard // chunk)
    for rank in range(world):
        gathered = torch.cat([a[p * shard:(p + 1) * shard] for p in range(world)])  # the copies (producers)
        flags = torch.ones(world * per_shard, dtype=torch.int32)  # and their flags
        w_r = w[rank * 200:(rank + 1) * 200].contiguous()
        out = torch.full((M, 200), float("nan")).bfloat16()
        emulated(gathered, w_r, out, flags, shard, chunk, rank * shard // 128, function="ag",
                 hang_timeout=120.0).check()
        want = a.float() @ w_r.float().T
        torch.testing.assert_close(out.float(), want, atol=2e-2 * want.abs().max().item(), rtol=1.6e-2)
        assert torch.equal(gathered, a)


@needs_tvm
def test_gemm_reduce_scatter_emulated_three_ranks(emulated):
    """3 ranks, M = 300 (output shards of 100 rows end inside M-tiles), N = 200 (ragged second N-tile), K / W = 48 (one
    zero-filled K-tile): every rank's partial GEMM into its workspace (all three in one allocation), publishing its
    tile flags; then every rank's reduce through the workspaces' byte offsets. Each shard is the fp32 sum's, and
    every tile flag reads NUM_CONSUMERS."""
    world, M, N, k = 3, 300, 200, 48  # noqa: N806
    g = torch.Generator().manual_seed(11)
    a = torch.randn(world, M, k, generator=g).bfloat16()
    w = (torch.randn(world, N, k, generator=g) / (world * k) ** 0.5).bfloat16()
    flag_off, n_flags, nbytes = rs.layout(M, N, rs.NARROW_TILE)
    stride = -(-nbytes // 4096) * 4096
    ws = torch.full((world, stride), 0x5A, dtype=torch.uint8)
    views = [rs._views(ws[r], M, N, rs.NARROW_TILE, torch.bfloat16) for r in range(world)]
    for _, flags in views:
        flags.zero_()
    for r in range(world):  # the producers: every rank's partial GEMM
        m_rotate = (r + 1) % world * (M // world) // 128
        emulated(a[r], w[r], views[r][0], views[r][1], m_rotate, function="rs_gemm", hang_timeout=120.0).check()
    for r in range(world):
        torch.testing.assert_close(views[r][0].float(), a[r].float() @ w[r].float().T, atol=3e-2, rtol=1.6e-2)
        assert views[r][1].tolist() == [rs.NUM_CONSUMERS] * n_flags
    out = torch.full((M, N), float("nan")).bfloat16()
    for r in range(world):  # the consumers: every rank's reduce of its shard
        deltas = torch.tensor([(q - r) * stride for q in range(world)], dtype=torch.int64)
        emulated(views[r][0], views[r][1], deltas, out[r * 100:(r + 1) * 100], r, rs.REDUCE_CTAS,
                 function="rs_reduce", hang_timeout=120.0).check()
    parts = sum(views[r][0].float() for r in range(world))  # the rounded partials, summed in fp32
    torch.testing.assert_close(out.float(), parts.bfloat16().float(), atol=0, rtol=0)
    want = torch.einsum("rmk,rnk->mn", a.float(), w.float())
    torch.testing.assert_close(out.float(), want, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("kernel, params", [
    ("gemm_reduce_scatter", {"dtype": "float16", "tile": "persistent_128x256x64_s4_e128_g8", "part": "reduce"}),
])
def test_distributed_gemm_builds_without_spills(kernel, params):
    """The artifacts test_build_kernels.py does not build (it builds compile_params of every config: the GEMMs):
    nvcc for sm_90a, no spills or local memory, the expected SASS."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    import importlib

    from tirx_kernels.core import testing

    testing.build_and_check_sass(importlib.import_module(f"tirx_kernels.gemm.{kernel}"), kernel, params)


def test_peer_deltas_are_made_once_per_workspace():
    """The reduce's peer offsets are a device tensor made once per workspace and rank (a per-call copy of a host
    list broke CUDA-graph capture), each peer's address minus this rank's."""
    class Symm:
        buffer_ptrs = [1 << 20, 5 << 20, 3 << 20]

    d = rs._peer_deltas(Symm(), 1, torch.device("cpu"))
    assert d.tolist() == [-(4 << 20), 0, -(2 << 20)] and d.dtype == torch.int64
    assert rs._peer_deltas(Symm(), 1, torch.device("cpu")) is d
    assert rs._peer_deltas(Symm(), 2, torch.device("cpu")).tolist() == [-(2 << 20), 2 << 20, 0]
