# SPDX-License-Identifier: Apache-2.0
"""The rest of the Hopper layer in ``core.lang``: wgmma for every input type (SS/RS, K-/MN-major, every
swizzle), TMA maps of rank 2-5 with L2 promotion / cache hints / OOB fill / multicast / prefetch, the
mbarrier ring, warp-specialized roles, and the persistent tile scheduler.

Pure arithmetic first (the scheduler without TIRx at all, and a simulation of the ring protocol a
persistent kernel runs), then the CUDA source of small kernels that use each helper, then their SASS
where nvcc and cuobjdump exist. Nothing here needs a GPU.
"""

import itertools
import random
import shutil

import pytest

from tirx_kernels.core.lang import scheduler

# ---------------------------------------------------------------------------------------------------------
# Scheduler: pure index math (no tvm needed)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_m, num_n, group_m", [(1, 1, 8), (7, 5, 1), (7, 5, 3), (32, 16, 8), (33, 17, 8),
                                                    (5, 9, 16), (64, 32, 8)])
def test_grouped_raster_is_a_bijection(num_m, num_n, group_m):
    coords = [scheduler.tile_coords(t, num_m, num_n, group_m) for t in range(num_m * num_n)]
    assert sorted(coords) == list(itertools.product(range(num_m), range(num_n)))


def test_grouped_raster_order():
    # group_m = 1: N fastest; group_m >= num_m: M fastest
    assert [scheduler.tile_coords(t, 3, 4, 1) for t in range(5)] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert [scheduler.tile_coords(t, 3, 4, 8) for t in range(5)] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]
    # group_m = 2 over 5 M-tiles: two full groups, then a group of height 1
    order = [scheduler.tile_coords(t, 5, 2, 2) for t in range(10)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1), (4, 0), (4, 1)]


def test_grouped_raster_bounds_the_working_set():
    # 132 resident CTAs over 64 x 32 tiles (8192^2 at 128x256): grouped, they touch 8 A panels
    num_m, num_n, wave = 64, 32, 132
    for group_m, max_a in ((8, 8), (64, 64)):
        tiles = [scheduler.tile_coords(t, num_m, num_n, group_m) for t in range(wave)]
        assert len({m for m, _ in tiles}) == max_a


@pytest.mark.parametrize("total, num_sms", [(1, 132), (131, 132), (132, 132), (133, 132), (512, 132), (7, 3)])
def test_persistent_walk_covers_every_tile_once(total, num_sms):
    grid = scheduler.grid_size(total, num_sms)
    assert grid == min(total, num_sms)
    seen = []
    for cta in range(grid):
        n = scheduler.tiles_of_cta(cta, grid, total)
        assert n >= 1
        seen += [cta + t * grid for t in range(n)]
    assert sorted(seen) == list(range(total))


@pytest.mark.parametrize("num_m, num_n", [(1, 3), (7, 5), (8, 4), (33, 17)])
def test_cluster_raster_pairs_share_b_and_pad_m(num_m, num_n):
    num_mc = scheduler.ceil_div(num_m, 2)
    seen = []
    for tile in range(num_mc * num_n):
        pair = [scheduler.cluster_tile_coords(tile, num_m, num_n, 8, 2, r) for r in range(2)]
        assert pair[0][1] == pair[1][1] and pair[1][0] == pair[0][0] + 1 and pair[0][0] % 2 == 0
        seen += pair
    # every real tile exactly once, plus one padding CTA past M per N-tile when num_m is odd
    real = [c for c in seen if c[0] < num_m]
    assert sorted(real) == list(itertools.product(range(num_m), range(num_n)))
    assert len(seen) - len(real) == (num_m % 2) * num_n
    with pytest.raises(ValueError):
        scheduler.cluster_tile_coords(0, 4, 4, 3, 2, 0)


@pytest.mark.parametrize("num_m, num_n", [(3, 1), (5, 7), (4, 8), (17, 33)])
def test_cluster_raster_1x2_pairs_share_a_and_pad_n(num_m, num_n):
    """1 x 2 clusters: the two CTAs take consecutive N-tiles (2j, 2j+1) of one M-tile; every real tile once,
    one padding CTA past N per M-tile when num_n is odd."""
    total = scheduler.num_cluster_tiles(num_m, num_n, 1, 2)
    assert total == num_m * scheduler.ceil_div(num_n, 2)
    seen = []
    for tile in range(total):
        pair = [scheduler.cluster_tile_coords(tile, num_m, num_n, 8, 1, r, cluster_n=2) for r in range(2)]
        assert pair[0][0] == pair[1][0] and pair[1][1] == pair[0][1] + 1 and pair[0][1] % 2 == 0
        seen += pair
    real = [c for c in seen if c[1] < num_n]
    assert sorted(real) == list(itertools.product(range(num_m), range(num_n)))
    assert len(seen) - len(real) == (num_n % 2) * num_m


@pytest.mark.parametrize("num_m, num_n", [(1, 1), (3, 5), (4, 8), (17, 33), (16, 41)])
def test_cluster_raster_2x2_blocks_and_pad_both(num_m, num_n):
    """2 x 2 clusters: CTA rank takes tile (rank_m, rank_n) = (rank % 2, rank // 2) of a 2 x 2 block of tiles; every
    real tile once, padding CTAs past M and past N where the tile counts are odd."""
    total = scheduler.num_cluster_tiles(num_m, num_n, 2, 2)
    assert total == scheduler.ceil_div(num_m, 2) * scheduler.ceil_div(num_n, 2)
    seen = []
    for tile in range(total):
        quad = [scheduler.cluster_tile_coords(tile, num_m, num_n, 8, 2, r, cluster_n=2) for r in range(4)]
        m0, n0 = quad[0]
        assert m0 % 2 == 0 and n0 % 2 == 0
        assert quad == [(m0 + r % 2, n0 + r // 2) for r in range(4)]
        seen += quad
    real = [c for c in seen if c[0] < num_m and c[1] < num_n]
    assert sorted(real) == list(itertools.product(range(num_m), range(num_n)))
    assert len(seen) == 4 * total
    with pytest.raises(ValueError, match="multiple of cluster_m"):
        scheduler.cluster_tile_coords(0, 4, 4, 3, 2, 0, cluster_n=2)


@pytest.mark.parametrize("cluster_m, cluster_n", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_multicast_slices_fill_every_cta_once(cluster_m, cluster_n):
    """Each CTA loads one slice of its A tile and one of its B tile into the CTAs that share that tile (same M-tile
    for A, same N-tile for B): every CTA then holds each A slice (of cluster_n) and each B slice (of cluster_m)
    exactly once, from CTAs of its own M-tile / N-tile. Without a partner the load is whole and not multicast."""
    size = cluster_m * cluster_n
    got = {c: [] for c in range(size)}
    for p in range(size):
        pm, pn = scheduler.cluster_rank_mn(p, cluster_m, cluster_n)
        assert p == pn * cluster_m + pm
        for op, (part, mask) in (("a", scheduler.multicast_a(p, cluster_m, cluster_n)),
                                 ("b", scheduler.multicast_b(p, cluster_m, cluster_n))):
            sharers = cluster_n if op == "a" else cluster_m
            assert (mask is None) == (sharers == 1)
            dsts = [p] if mask is None else [d for d in range(16) if mask >> d & 1]
            assert p in dsts and len(dsts) == sharers and max(dsts) < size
            for d in dsts:
                dm, dn = scheduler.cluster_rank_mn(d, cluster_m, cluster_n)
                assert (dm == pm) if op == "a" else (dn == pn)
                got[d].append((op, part))
    for c in range(size):
        assert sorted(got[c]) == [("a", j) for j in range(cluster_n)] + [("b", i) for i in range(cluster_m)]


def _stream_k_schedule(total, k_tiles, num_sms):
    """Every CTA's work units (tile, k_begin, k_end) of a stream-K launch, and the values the kernel binds."""
    grid = scheduler.stream_k_grid(total, k_tiles, num_sms)
    dp_waves = scheduler.stream_k_dp_waves(total, grid)
    sk_steps = (total - dp_waves * grid) * k_tiles
    units = {}
    for cta in range(grid):
        start = scheduler.stream_k_start(cta, sk_steps, grid)
        end = scheduler.stream_k_start(cta + 1, sk_steps, grid)
        n = scheduler.stream_k_units(dp_waves, start, end, k_tiles)
        units[cta] = [scheduler.stream_k_unit(u, cta, grid, dp_waves, start, end, k_tiles) for u in range(n)]
    return grid, dp_waves, sk_steps, units


@pytest.mark.parametrize("total, k_tiles, num_sms", [
    (128, 17, 132), (128, 224, 132), (448, 32, 132), (400, 4, 132), (4, 2, 132), (9, 3, 132), (264, 5, 132),
    (1, 1, 132), (133, 1, 132), (700, 13, 7), (5, 40, 3), (128, 64, 132),
])
def test_stream_k_covers_every_step_once_and_finishers_know_their_partials(total, k_tiles, num_sms):
    grid, dp_waves, sk_steps, units = _stream_k_schedule(total, k_tiles, num_sms)
    assert grid == min(num_sms, total * k_tiles)
    # Whole waves stay data-parallel: all of them when the tiles fill the waves, otherwise all but the last full one.
    assert dp_waves == (total // grid if total % grid == 0 else max(total // grid - 1, 0))
    owner = {}
    for cta, us in units.items():
        for i, (tile, kb, ke) in enumerate(us):
            assert 0 <= kb < ke <= k_tiles and 0 <= tile < total
            if i < dp_waves:
                assert (tile, kb, ke) == (cta + i * grid, 0, k_tiles)
            if kb > 0:
                assert i == dp_waves, "only a CTA's first stream-K unit may start inside a tile (one partial per CTA)"
            if kb == 0 and ke < k_tiles:
                assert i == len(us) - 1, "a CTA finishes a split tile last"
            for k in range(kb, ke):
                assert (tile, k) not in owner
                owner[tile, k] = cta
    assert len(owner) == total * k_tiles
    # A split tile's finisher (the CTA with its step 0) adds exactly the partials of the other CTAs that hold
    # steps of it: the non-empty ranges from the next CTA up to the owner of the tile's last step.
    for tile in range(total):
        holders = {owner[tile, k] for k in range(k_tiles)}
        if len(holders) == 1:
            continue
        head = owner[tile, 0]
        last = scheduler.stream_k_owner((tile - dp_waves * grid + 1) * k_tiles - 1, sk_steps, grid)
        partials = {c for c in range(head + 1, last + 1)
                    if scheduler.stream_k_start(c + 1, sk_steps, grid) > scheduler.stream_k_start(c, sk_steps, grid)}
        assert partials == holders - {head}
        assert all(c > head for c in partials), "a finisher only waits for CTAs after it"


def test_stream_k_balances_the_work():
    # 2048 x 7168 x 2048 on 128x256 tiles: 448 tiles = 3.39 waves of 132; stream-K gives every CTA the same
    # K-steps to within one: 2 data-parallel tiles (64 steps) and 44-45 stream-K steps.
    grid, dp_waves, sk_steps, units = _stream_k_schedule(448, 32, 132)
    assert (grid, dp_waves, sk_steps) == (132, 2, (448 - 264) * 32)
    steps = [sum(ke - kb for _, kb, ke in us) for us in units.values()]
    assert max(steps) - min(steps) <= 1 and min(steps) == 64 + 44



# ---------------------------------------------------------------------------------------------------------
# The ring protocol of the persistent GEMM, simulated with mbarrier parity semantics
# ---------------------------------------------------------------------------------------------------------

class _Barrier:
    """An mbarrier: ``count`` arrivals complete a phase; ``try_wait(parity)`` passes once the phase with
    that parity has completed, i.e. while the current phase's parity differs (hardware semantics)."""

    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def try_wait(self, parity):
        return self.phase % 2 != parity


def _simulate_persistent_ring(num_stages, num_tiles, k_tiles, num_consumers, seed):
    """Producer + consumers of one CTA over ``num_tiles`` tiles, scheduled at random; the schedule of waits
    and releases is the kernel's (release use it-1 after issuing use it, the tile's last use after the
    final wait). Checks no slot is overwritten before release, every use reads its own data, no deadlock."""
    from tirx_kernels.core.lang.mbarrier import Ring

    ring = Ring(num_stages, consumer_arrivals=num_consumers)
    full = [_Barrier(1) for _ in range(num_stages)]
    empty = [_Barrier(num_consumers) for _ in range(num_stages)]
    slot = [None] * num_stages
    readers = [set() for _ in range(num_stages)]  # consumers still reading a slot
    inflight = []  # TMA loads issued, not landed: (stage, use)
    total = num_tiles * k_tiles

    def producer():
        for it in range(total):
            s = ring.stage(it)
            while not empty[s].try_wait(ring.phase(it) ^ 1):
                yield
            assert not readers[s], f"use {it} overwrites stage {s} still read by {readers[s]}"
            inflight.append((s, it))
            yield

    def consumer(c):
        for t in range(num_tiles):
            for k in range(k_tiles):
                it = t * k_tiles + k
                s = ring.stage(it)
                while not full[s].try_wait(ring.phase(it)):
                    yield
                assert slot[s] == it, f"consumer {c} use {it} reads data of use {slot[s]}"
                readers[s].add(c)
                yield
                if k > 0:
                    readers[ring.stage(it - 1)].discard(c)
                    empty[ring.stage(it - 1)].arrive()
            readers[ring.stage(t * k_tiles + k_tiles - 1)].discard(c)
            empty[ring.stage(t * k_tiles + k_tiles - 1)].arrive()
            yield  # epilogue

    def land():
        s, it = inflight.pop(0)
        slot[s] = it
        full[s].arrive()  # the expect_tx arrival and the bytes, merged

    actors = {"p": producer(), **{c: consumer(c) for c in range(num_consumers)}}
    return _run_actors(actors, inflight, land, random.Random(seed), max_steps=100000)


def _run_actors(actors, inflight, land, rng, max_steps):
    """Step generator ``actors`` (one yield = one instruction's worth) and land in-flight TMA loads, in a random
    interleaving, until all actors finished and nothing is in flight; a run past ``max_steps`` is a deadlock."""
    steps = 0
    while actors or inflight:
        steps += 1
        assert steps < max_steps, "deadlock"
        if inflight and rng.random() < 0.3:
            land()
            continue
        if not actors:
            continue
        name = rng.choice(list(actors))
        try:
            next(actors[name])
        except StopIteration:
            del actors[name]
    return steps


@pytest.mark.parametrize("num_stages, num_tiles, k_tiles", [(3, 5, 1), (3, 4, 2), (3, 3, 7), (4, 6, 3), (6, 2, 17)])
def test_persistent_ring_protocol(num_stages, num_tiles, k_tiles):
    for seed in range(20):
        _simulate_persistent_ring(num_stages, num_tiles, k_tiles, num_consumers=2, seed=seed)


def _simulate_cluster_ring(num_stages, num_tiles, k_tiles, seed, cluster_m=2, cluster_n=1):
    """A ``cluster_m x cluster_n`` cluster with one ring release per consumer warpgroup and CTA
    (``consumer_release_warpgroup``: each warpgroup arrives once in every CTA of the cluster), the loads multicast as
    ``scheduler.multicast_a`` / ``multicast_b`` say: each CTA's producer loads its slice of A into the CTAs of its
    M-tile and its slice of B into those of its N-tile, so its empty barrier counts 2 warpgroups x cluster CTAs
    arrivals. Checks that no producer overwrites a slot any consumer of a CTA it writes into still reads, that every
    use of every CTA reads exactly its own A and B slices (from the CTAs of its M-tile / N-tile), no deadlock."""
    from tirx_kernels.core.lang.mbarrier import Ring

    cta_count, wgs = cluster_m * cluster_n, 2
    ring = Ring(num_stages, consumer_arrivals=wgs * cta_count)
    full = [[_Barrier(1) for _ in range(num_stages)] for _ in range(cta_count)]
    empty = [[_Barrier(wgs * cta_count) for _ in range(num_stages)] for _ in range(cta_count)]
    landed = [[set() for _ in range(num_stages)] for _ in range(cta_count)]  # (use, operand, part, source CTA)
    readers = [[set() for _ in range(num_stages)] for _ in range(cta_count)]  # warpgroups reading a CTA's stage
    inflight = []  # (source cta, stage, use) multicast writes not landed
    total = num_tiles * k_tiles

    def pieces(p):
        """(operand, part, destination CTAs) of source CTA p's loads of one stage."""
        for operand, (part, mask) in (("a", scheduler.multicast_a(p, cluster_m, cluster_n)),
                                      ("b", scheduler.multicast_b(p, cluster_m, cluster_n))):
            yield operand, part, [p] if mask is None else [d for d in range(cta_count) if mask >> d & 1]

    def expected(c, it):
        """What CTA c's stage must hold for use it: each A slice from a CTA of its M-tile, each B slice from one of
        its N-tile (same rank_m / rank_n), every slice once."""
        rm, rn = scheduler.cluster_rank_mn(c, cluster_m, cluster_n)
        got = {(op, part): src for use, op, part, src in landed[c][ring.stage(it)] if use == it}
        assert sorted(got) == [("a", j) for j in range(cluster_n)] + [("b", i) for i in range(cluster_m)], got
        for (op, _), src in got.items():
            sm, sn = scheduler.cluster_rank_mn(src, cluster_m, cluster_n)
            assert (sm == rm) if op == "a" else (sn == rn), (c, op, src)
        return len(landed[c][ring.stage(it)]) == cluster_m + cluster_n

    def producer(p):
        for it in range(total):
            s = ring.stage(it)
            while not empty[p][s].try_wait(ring.phase(it) ^ 1):
                yield
            for _, _, dsts in pieces(p):
                for d in dsts:
                    assert not readers[d][s], f"CTA {p} use {it} overwrites CTA {d}'s stage {s} ({readers[d][s]})"
            inflight.append((p, s, it))
            yield

    def release(s):
        for dst in range(cta_count):  # lane 0 of warp dst arrives in CTA dst
            empty[dst][s].arrive()

    def consumer(c, w):
        for t in range(num_tiles):
            for k in range(k_tiles):
                it = t * k_tiles + k
                s = ring.stage(it)
                while not full[c][s].try_wait(ring.phase(it)):
                    yield
                assert expected(c, it), f"CTA {c} use {it} reads {landed[c][s]}"
                readers[c][s].add(w)
                yield
                if k > 0:
                    readers[c][ring.stage(it - 1)].discard(w)
                    release(ring.stage(it - 1))
            readers[c][ring.stage(t * k_tiles + k_tiles - 1)].discard(w)
            release(ring.stage(t * k_tiles + k_tiles - 1))
            yield

    rng = random.Random(seed)
    pending = [[0] * num_stages for _ in range(cta_count)]

    def land():
        p, s, it = inflight.pop(rng.randrange(len(inflight)))
        for op, part, dsts in pieces(p):
            for dst in dsts:
                landed[dst][s] = {x for x in landed[dst][s] if x[0] == it} | {(it, op, part, p)}
                pending[dst][s] += 1
                if pending[dst][s] == cluster_m + cluster_n:  # expect_tx counted every slice
                    pending[dst][s] = 0
                    full[dst][s].arrive()

    actors = {("p", p): producer(p) for p in range(cta_count)}
    actors.update({(c, w): consumer(c, w) for c in range(cta_count) for w in range(wgs)})
    return _run_actors(actors, inflight, land, rng, max_steps=400000)


@pytest.mark.parametrize("cluster_m, cluster_n", [(2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("num_stages, num_tiles, k_tiles", [(3, 4, 2), (4, 6, 3), (6, 2, 17)])
def test_cluster_ring_with_warpgroup_release(num_stages, num_tiles, k_tiles, cluster_m, cluster_n):
    for seed in range(20):
        _simulate_cluster_ring(num_stages, num_tiles, k_tiles, seed, cluster_m, cluster_n)


def test_ring_without_last_release_deadlocks():
    """The bug the persistent kernel must not have: skipping the tile's last release (as the
    non-persistent kernel may) starves the next tile's producer."""
    from tirx_kernels.core.lang.mbarrier import Ring

    ring = Ring(3, consumer_arrivals=1)
    empty = [_Barrier(1) for _ in range(3)]
    k_tiles = 2
    for it in range(k_tiles):  # tile 0: only use 0 is released (after use 1 was issued)
        if it > 0:
            empty[ring.stage(it - 1)].arrive()
    blocked = [it for it in range(k_tiles, k_tiles + 3) if not empty[ring.stage(it)].try_wait(ring.phase(it) ^ 1)]
    assert blocked == [4]  # uses 2 (fresh stage 2) and 3 (stage 0, released) pass; use 4 waits for stage 1


# ---------------------------------------------------------------------------------------------------------
# Everything below traces TIRx
# ---------------------------------------------------------------------------------------------------------

tvm = pytest.importorskip("tvm")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build  # noqa: E402
from tirx_kernels.core.lang import mbarrier, roles, tma, wgmma  # noqa: E402

_ALL = ["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"]


def test_mma_names_and_operand_counts():
    assert wgmma.mma_name(256, "bfloat16") == wgmma.instr_name(256, "bfloat16")
    assert wgmma.mma_name(128, "float32") == "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"
    assert wgmma.mma_name(64, "float8_e4m3fn", "float8_e5m2") == \
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2"
    assert [wgmma.k_per_instr(d) for d in _ALL] == [16, 16, 8, 32, 32]
    # acc + A (desc | 4 regs) + B desc + scale-d + scale-a/b + transposes (16-bit only; none for RS A)
    assert wgmma.operand_count(256, "bfloat16", "ss") == 128 + 1 + 1 + 1 + 2 + 2
    assert wgmma.operand_count(256, "bfloat16", "rs") == 128 + 4 + 1 + 1 + 2 + 1
    assert wgmma.operand_count(64, "float32", "ss") == 32 + 1 + 1 + 1 + 2
    assert wgmma.operand_count(64, "float8_e5m2", "rs") == 32 + 4 + 1 + 1 + 2
    for bad in ((64, "bfloat16", "float16"), (64, "float32", "bfloat16"), (12, "float16", None)):
        with pytest.raises(ValueError):
            wgmma.mma_name(*bad)


@pytest.mark.parametrize("dtype", _ALL)
def test_rs_a_fragment_covers_64xk_once(dtype):
    k = wgmma.k_per_instr(dtype)
    per_reg = 4 // {"float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}.get(dtype, 2)
    seen = [(wgmma.a_frag_row(w, lane, i), wgmma.a_frag_col(lane, i, e, dtype))
            for w, lane, i, e in itertools.product(range(4), range(32), range(4), range(per_reg))]
    assert sorted(seen) == list(itertools.product(range(64), range(k)))


def test_descriptor_offsets():
    K, MN = wgmma.K_MAJOR, wgmma.MN_MAJOR
    # K-major swizzled: LBO unused (1), SBO = 8 rows of the swizzle span
    assert wgmma.desc_offsets(K, wgmma.SWIZZLE_128B) == (1, 64)  # what encode_desc_kmajor_sw128 uses
    assert wgmma.desc_offsets(K, wgmma.SWIZZLE_64B) == (1, 32)
    assert wgmma.desc_offsets(K, wgmma.SWIZZLE_32B) == (1, 16)
    # MN-major swizzled: LBO = next MN chunk (e.g. the next 64-column box of 64 K-rows), SBO = 8 K-rows
    assert wgmma.desc_offsets(MN, wgmma.SWIZZLE_128B, mn_chunk_bytes=128 * 64) == (512, 64)
    assert wgmma.desc_offsets(MN, wgmma.SWIZZLE_32B, mn_chunk_bytes=32 * 16) == (32, 16)
    # no swizzle: core matrices of 8 x 16 B; K-major box of 64 rows x 16 B per K half
    assert wgmma.desc_offsets(K, wgmma.SWIZZLE_NONE, core_mn_bytes=128, core_k_bytes=64 * 16) == (64, 8)
    assert wgmma.desc_offsets(MN, wgmma.SWIZZLE_NONE, core_mn_bytes=128, core_k_bytes=1024) == (64, 8)
    with pytest.raises(ValueError):
        wgmma.desc_offsets(MN, wgmma.SWIZZLE_128B)
    with pytest.raises(ValueError):
        wgmma.desc_offsets(MN, wgmma.SWIZZLE_128B, mn_chunk_bytes=1 << 18)  # 14-bit field
    assert wgmma.k_step_bytes(K, wgmma.SWIZZLE_128B, "bfloat16") == 32
    assert wgmma.k_step_bytes(MN, wgmma.SWIZZLE_128B, "bfloat16") == 16 * 128
    assert wgmma.k_step_bytes(K, wgmma.SWIZZLE_NONE, "float8_e4m3fn", core_k_bytes=1024) == 2048


def test_mma_rejects_illegal_majors():
    with pytest.raises(ValueError):
        wgmma.mma(64, None, None, None, "float32", b_major=wgmma.MN_MAJOR)
    with pytest.raises(ValueError):
        wgmma.mma(64, None, None, None, "float8_e4m3fn", a_major=wgmma.MN_MAJOR)


def test_tma_box_checks():
    assert tma.check_box("bfloat16", (64, 128)) == 64 * 128 * 2
    assert tma.check_box("float8_e4m3fn", (128, 4, 2), tma.SWIZZLE_128B) == 128 * 8
    for dtype, box, sw in (("bfloat16", (128, 64), tma.SWIZZLE_128B),  # 256 B > SW128 span
                           ("bfloat16", (4, 64), tma.SWIZZLE_NONE),  # 8 B inner extent
                           ("float32", (8, 300), tma.SWIZZLE_32B),  # extent > 256
                           ("bfloat16", (8,) * 6, tma.SWIZZLE_NONE)):
        with pytest.raises(ValueError):
            tma.check_box(dtype, box, sw)


def test_roles_register_budget():
    assert roles.launch_registers(384) == 168 and roles.launch_registers(256) == 255
    assert roles.register_split_fits(2)  # 40 + 2 x 232 = 504 = 3 x 168: the CTA's launch allocation
    assert roles.register_split_fits(2, producer=24, consumer=240)  # 504 too
    assert not roles.register_split_fits(2, consumer=240)
    # 32 + 2 x 240 = 512 fills the register file (65536) but exceeds the launch allocation: inc would hang.
    assert not roles.register_split_fits(2, producer=32, consumer=240)
    assert not roles.register_split_fits(3)
    with pytest.raises(ValueError):
        roles.setmaxnreg_inc(236)


# --- wgmma kernel: every input type, SS and RS, K- and MN-major, every swizzle -----------------------------

_N = 64


def _wgmma_kernel(dtype):
    elem = tma.elem_bytes(dtype)
    k = wgmma.k_per_instr(dtype)
    K, MN = wgmma.K_MAJOR, wgmma.MN_MAJOR
    sixteen = dtype in ("bfloat16", "float16")
    lbo_mn, sbo_mn = wgmma.desc_offsets(MN, wgmma.SWIZZLE_128B, mn_chunk_bytes=128 * k)
    lbo_64, sbo_64 = wgmma.desc_offsets(K, wgmma.SWIZZLE_64B)
    lbo_32, sbo_32 = wgmma.desc_offsets(K, wgmma.SWIZZLE_32B)
    lbo_0, sbo_0 = wgmma.desc_offsets(K, wgmma.SWIZZLE_NONE, core_mn_bytes=128, core_k_bytes=_N * 16)

    @T.prim_func
    def mmas(c_ptr: T.handle):
        C = T.match_buffer(c_ptr, (64, _N), "float32", align=16)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([128])
        pool = T.SMEMPool()
        As = pool.alloc((64 * 128 // elem,), dtype, align=1024)
        Bs = pool.alloc((_N * 128 // elem,), dtype, align=1024)
        pool.commit()
        acc = T.alloc_local((wgmma.acc_regs(_N),), "float32")
        da = T.alloc_local((1,), "uint64")
        db = T.alloc_local((1,), "uint64")
        ra = T.alloc_local((4,), "uint32")
        for i in T.unroll(4):
            ra[i] = T.uint32(0)
        wgmma.fence()
        wgmma.encode_desc(da.ptr_to([0]), As.ptr_to([0]), 1, 64, wgmma.SWIZZLE_128B)
        wgmma.encode_desc(db.ptr_to([0]), Bs.ptr_to([0]), lbo_64, sbo_64, wgmma.SWIZZLE_64B)
        wgmma.mma(_N, acc, da[0], db[0], dtype, scale_d=False)  # SS, K-major
        wgmma.encode_desc(db.ptr_to([0]), Bs.ptr_to([0]), lbo_32, sbo_32, wgmma.SWIZZLE_32B)
        wgmma.mma(_N, acc, [ra[0], ra[1], ra[2], ra[3]], db[0], dtype, scale_d=tid >= 0)  # RS
        wgmma.encode_desc(db.ptr_to([0]), Bs.ptr_to([0]), lbo_0, sbo_0, wgmma.SWIZZLE_NONE)
        wgmma.mma(_N, acc, da[0], db[0], dtype)
        if sixteen:
            wgmma.encode_desc(db.ptr_to([0]), Bs.ptr_to([0]), lbo_mn, sbo_mn, wgmma.SWIZZLE_128B)
            wgmma.mma(_N, acc, da[0], db[0], dtype, b_major=MN)  # SS, B MN-major
            wgmma.mma(_N, acc, da[0], db[0], dtype, a_major=MN, b_major=MN)
            wgmma.mma(_N, acc, [ra[0], ra[1], ra[2], ra[3]], db[0], dtype, b_major=MN)  # RS, B MN-major
        wgmma.commit()
        wgmma.wait(0)
        for j in T.unroll(_N // 8):
            for r in T.unroll(2):
                for e in T.unroll(2):
                    C[wgmma.acc_row(tid // 32, tid % 32, r), wgmma.acc_col(tid % 32, j, e)] = \
                        acc[wgmma.acc_index(j, r, e)]

    return mmas


@pytest.fixture(scope="module", params=_ALL)
def wgmma_case(request):
    return request.param, build.codegen(_wgmma_kernel(request.param))


def test_wgmma_codegen(wgmma_case):
    dtype, src = wgmma_case
    name = wgmma.mma_name(_N, dtype)
    assert '"{ .reg .pred ps0; setp.ne.b32 ps0,' in src and name in src
    calls = src[src.index('extern "C" __global__'):]
    assert "_ss_mma_async" in calls and "_rs_mma_async" in calls
    # descriptors: 128B (3), 64B (2), 32B (1), none (0) with their LBO/SBO
    for args in (", 1, 64, 3)", ", 1, 32, 2)", ", 1, 16, 1)", ", 64, 8, 0)"):
        assert args in calls, args
    if dtype in ("bfloat16", "float16"):
        # the trailing immediates of the SS (trans-a, trans-b) and RS (trans-b) helpers
        assert "_1_1_0_0(" in calls and "_1_1_0_1(" in calls and "_1_1_1_1(" in calls
        assert ", 128, 64, 3)" in calls  # MN-major SW128: LBO = next 64-column chunk (16 K-rows x 128 B)
    else:
        assert "_0_1(" not in calls


_SASS_MMA = {"bfloat16": r"HGMMA\.64x64x16\.F32\.BF16", "float16": r"HGMMA\.64x64x16\.F32\b",
             "float32": r"HGMMA\.64x64x8\.F32\.TF32", "float8_e4m3fn": r"QGMMA\.64x64x32\.F32\.E4M3\.E4M3",
             "float8_e5m2": r"QGMMA\.64x64x32\.F32\.E5M2\.E5M2"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("dtype", _ALL)
def test_wgmma_sass(tmp_path, dtype):
    import re

    res = build.build_so(_wgmma_kernel(dtype), str(tmp_path / "mma.so"))
    kern = next(iter(res.ptxas_info["kernels"].values()))
    assert kern["spill_store_bytes"] == 0 and kern["stack_bytes"] == 0
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = build.sass(res.so_path)
    assert len(re.findall(_SASS_MMA[dtype], sass)) >= (6 if dtype in ("bfloat16", "float16") else 3), dtype


# --- TMA: rank 2-5 maps, L2 promotion, OOB fill, cache hints, multicast, prefetch, store read-wait ---------

def _tma_kernel(cluster: bool):
    dtype = "bfloat16"

    @T.prim_func
    def maps(x_ptr: T.handle, y_ptr: T.handle):
        B = T.int32()
        H = T.int32()
        S = T.int32()
        X = T.match_buffer(x_ptr, (B, H, S, 2, 64), dtype, align=16)
        Y = T.match_buffer(y_ptr, (B, S, 64), dtype, align=16)
        m2 = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        m3 = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        m4 = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        m5 = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(m2, Y.data, [64, B * S], [64], [64, 64], dtype)
        tma.encode(m3, Y.data, [64, S, B], [64, S * 64], [64, 64, 1], dtype,
                   l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode(m4, X.data, [64, 2, S, B * H], [64, 128, S * 128], [32, 2, 16, 1], dtype,
                   swizzle=tma.SWIZZLE_64B, oob_fill=tma.OOB_FILL_NAN)
        tma.encode(m5, X.data, [64, 2, S, H, B], [64, 128, S * 128, H * S * 128], [64, 1, 8, 1, 1], dtype,
                   swizzle=tma.SWIZZLE_128B, l2_promotion=tma.L2_PROMOTION_128B, elem_strides=[1, 1, 2, 1, 1])
        T.device_entry()
        bx = T.cta_id([B * 2])
        rank = T.int32(0)
        if cluster:
            rank = T.cta_id_in_cluster([2])
        tid = T.thread_id([128])
        pool = T.SMEMPool()
        buf = pool.alloc((64 * 64,), dtype, align=1024)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        pol = T.alloc_local((1,), "uint64")
        if tid == 0:
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.fence_init()
        if cluster:
            T.cuda.cluster_sync()
        else:
            T.cuda.cta_sync()
        if tid == 0:
            tma.prefetch_descriptor(m3)
            tma.create_policy(pol[0], tma.EVICT_LAST)
            tma.prefetch(m5, [0, 0, 0, 0, bx // 2])
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), 64 * 64 * 2)
            tma.load(buf.ptr_to([0]), m3, [0, 0, bx // 2], bar.ptr_to([0]), cache_policy=pol[0])
            if cluster:
                tma.load(buf.ptr_to([0]), m4, [0, 0, 0, bx], bar.ptr_to([0]), multicast_mask=3,
                         cache_policy=pol[0])
            else:
                tma.load(buf.ptr_to([0]), m4, [0, 0, 0, bx], bar.ptr_to([0]))
            tma.load(buf.ptr_to([0]), m5, [0, 0, 0, 0, bx // 2], bar.ptr_to([0]))
        mbarrier.wait(bar.ptr_to([0]), 0)
        if tid == 0:
            tma.store(m3, [0, 0, bx // 2], buf.ptr_to([0]), cache_policy=pol[0])
            tma.store(m2, [0, rank * 64], buf.ptr_to([0]))
            tma.store_commit()
            tma.store_wait_read(0)
            tma.store_wait(0)
        if cluster:
            T.cuda.cluster_sync()

    return maps


def test_tma_codegen():
    src = build.codegen(_tma_kernel(cluster=True))
    for rank in (2, 3, 4, 5):
        assert f"CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, {rank}," in src, rank
    assert "static_cast<CUtensorMapL2promotion>(3)" in src and "static_cast<CUtensorMapL2promotion>(2)" in src
    assert "static_cast<CUtensorMapFloatOOBfill>(1)" in src
    assert "static_cast<CUtensorMapSwizzle>(2)" in src
    for text in ("createpolicy.fractional.L2::evict_last.b64",
                 "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint",
                 "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster.L2::cache_hint",
                 "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [",
                 "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group.L2::cache_hint",
                 "cp.async.bulk.prefetch.tensor.5d.L2.global.tile",
                 "prefetch.tensormap",
                 "cp.async.bulk.wait_group.read 0",
                 "cudaLaunchAttributeClusterDimension"):
        assert text in src, text
    assert "(((int64_t)S) * (int64_t)64) * (int64_t)2" in src or "(int64_t)S" in src  # strides widened


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_tma_sass(tmp_path):
    res = build.build_so(_tma_kernel(cluster=True), str(tmp_path / "tma.so"))
    assert next(iter(res.ptxas_info["kernels"].values()))["stack_bytes"] == 0
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = build.sass(res.so_path)
    for op in ("UTMALDG.3D", "UTMALDG.4D.MULTICAST", "UTMALDG.5D", "UTMASTG.3D", "UTMASTG.2D", "UTMAPF",
               "UTMACCTL.PF"):
        assert op in sass, op


# --- roles + ring + scheduler together: a warp-specialized persistent skeleton ----------------------------

def _ws_skeleton():
    num_stages, block = 4, 128
    ring = mbarrier.Ring(num_stages, consumer_arrivals=2 * 4)

    @T.prim_func
    def skeleton(x_ptr: T.handle):
        M = T.int32()
        N = T.int32()
        X = T.match_buffer(x_ptr, (M, N), "float32", align=16)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        total = ((M + block - 1) // block) * ((N + block - 1) // block)
        cta = T.cta_id([scheduler.grid_size(((M + block - 1) // block) * ((N + block - 1) // block), 132)])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        grid = scheduler.grid_size(total, 132)
        my_tiles = scheduler.tiles_of_cta(cta, grid, total)
        pool = T.SMEMPool()
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if wg == 0:
            roles.producer_role()
            if tid == 0:
                for t in range(my_tiles):
                    ring.producer_acquire(empty, t)
                    mbarrier.arrive(full.ptr_to([ring.stage(t)]))
        else:
            cw, ct, warp, lane = roles.consumer_role(wg, tid)
            for t in range(my_tiles):
                ring.consumer_wait(full, t)
                mt, nt = scheduler.tile_coords(cta + t * grid, (M + block - 1) // block, (N + block - 1) // block, 8)
                if ct == 0:
                    X[mt * block + cw, nt * block + warp] = T.float32(1)
                if lane == 0:
                    ring.consumer_release(empty, t)

    return skeleton


def test_ws_skeleton_codegen():
    src = build.codegen(_ws_skeleton())
    dev = src[src.index('extern "C" __global__'):]
    assert "__launch_bounds__(384, 1)" in dev
    assert "setmaxnreg_dec_sync_aligned_u32_40()" in dev and "setmaxnreg_inc_sync_aligned_u32_232()" in dev
    assert "min(" in src  # grid = min(tiles, 132) on the host
    assert dev.count("tvm_builtin_cuda_mbarrier_wait(") == 2
    assert "mbarrier.try_wait.parity" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_ws_skeleton_sass(tmp_path):
    res = build.build_so(_ws_skeleton(), str(tmp_path / "ws.so"))  # raises on warning C7508
    kern = next(iter(res.ptxas_info["kernels"].values()))
    assert kern["spill_store_bytes"] == 0 and kern["stack_bytes"] == 0
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = build.sass(res.so_path)
    assert sass.count("USETMAXREG") >= 2


# --- clusters: DSMEM loads through mapa, non-aligned cluster barrier, named barriers ------------------------

def _dsmem_kernel():
    from tirx_kernels.core.lang import cluster

    @T.prim_func
    def dsmem(x_ptr: T.handle):
        N = T.int32()
        X = T.match_buffer(x_ptr, (N,), "float32", align=16)
        T.device_entry()
        bx = T.cta_id([(N + 127) // 128 * 4])
        rank = T.cta_id_in_cluster([4])
        wg = T.warpgroup_id([2])
        tid = T.thread_id([256])
        pool = T.SMEMPool()
        P = pool.alloc((512,), "float32", align=1024)
        pool.commit()
        v = T.alloc_local((4,), "float32")
        scratch = T.alloc_local((1,), "uint32")
        if wg == 0:
            # A "producer" warpgroup joining both cluster barriers from its own branch.
            cluster.arrive(relaxed=True)
            cluster.wait()
            cluster.arrive(relaxed=True)
            cluster.wait()
        else:
            ct = tid - 128
            for e in T.unroll(4):
                P[ct * 4 + e] = T.Cast("float32", rank * 1000 + ct * 4 + e)
            cluster.named_sync(1, 128)
            cluster.arrive()  # release: the writes above are visible to the peers after their wait
            cluster.wait()
            cluster.load_v4_f32(v, 0, P.ptr_to([ct * 4]), (rank + 1) % 4, scratch[0])
            X[bx * 128 + ct] = v[0] + v[1] + v[2] + v[3]
            cluster.sync()

    return dsmem


def test_dsmem_codegen():
    src = build.codegen(_dsmem_kernel())
    for text in ("mapa.shared::cluster.u32", "ld.shared::cluster.v4.f32", "barrier.cluster.arrive;",
                 "barrier.cluster.arrive.relaxed;", "barrier.cluster.wait;", "bar.sync",
                 "cudaLaunchAttributeClusterDimension"):
        assert text in src, text
    # Only the non-aligned forms: legal where the warpgroups reach the barrier in different branches.
    assert "barrier.cluster.arrive.aligned" not in src and "barrier.cluster.wait.aligned" not in src


def test_cluster_helpers_reject_bad_named_barrier():
    from tirx_kernels.core.lang import cluster

    for bad in ((0, 128), (16, 128), (1, 100)):
        with pytest.raises(ValueError):
            cluster.named_sync(*bad)
        with pytest.raises(ValueError):
            cluster.named_arrive(*bad)


def _turns_kernel():
    """Two math warpgroups taking turns (roles.wait_turn / pass_turn with a runtime consumer index)."""

    @T.prim_func
    def turns(x_ptr: T.handle):
        X = T.match_buffer(x_ptr, (256,), "float32", align=16)
        T.device_entry()
        T.cta_id([1])
        wg = T.warpgroup_id([2])
        tid = T.thread_id([256])
        cw = wg
        if cw == 1:
            roles.wait_turn(3, cw)
        X[tid] = T.Cast("float32", cw)
        if cw == 0:
            roles.pass_turn(3, cw)

    return turns


def test_turn_taking_codegen():
    src = build.codegen(_turns_kernel())
    dev = src[src.index('extern "C" __global__'):]
    assert "bar_sync_count_sync(" in dev and "bar_arrive_arrive(" in dev
    assert "bar.sync %0, %1;" in src and "bar.arrive %0, %1;" in src
    assert "(uint)256" in dev


def test_named_barrier_helpers_reject_bad_ids():
    from tirx_kernels.core.lang import cluster

    for bad in ((0, 128), (16, 128), (1, 100)):
        with pytest.raises(ValueError):
            cluster.named_arrive(*bad)
    for first in (0, 15):
        with pytest.raises(ValueError):
            roles.wait_turn(first, 0)
        with pytest.raises(ValueError):
            roles.pass_turn(first, 0)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_dsmem_sass(tmp_path):
    res = build.build_so(_dsmem_kernel(), str(tmp_path / "dsmem.so"))
    kern = next(iter(res.ptxas_info["kernels"].values()))
    assert kern["spill_store_bytes"] == 0 and kern["stack_bytes"] == 0
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = build.sass(res.so_path)
    for op in ("UCGABAR_ARV", "UCGABAR_WAIT", "LD.E.128", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x80"):
        assert op in sass, op
