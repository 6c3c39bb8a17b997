# SPDX-License-Identifier: Apache-2.0
"""The ping-pong GEMM (gemm/_pingpong.py) on the CPU: its ring + turn-taking protocol simulated with mbarrier
parity and named-barrier semantics (and the stale read it prevents), the epilogue's staging/store addressing
against the accumulator fragment map, the smem budget, the rejected options, and the sm_90a builds."""

import itertools
import random
import re

import pytest

pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")

from tirx_kernels.core import testing  # noqa: E402
from tirx_kernels.core.lang import mbarrier, tma, wgmma  # noqa: E402
from tirx_kernels.gemm import _persistent, _pingpong  # noqa: E402
from tirx_kernels.gemm import fp16_bf16_gemm as mod  # noqa: E402

PINGPONG = [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "pingpong"]


def _params(tile):
    return {k: v for k, v in mod.TILE_CONFIGS[tile].items() if k != "kind"}


# ---------------------------------------------------------------------------------------------------------
# Protocol: one CTA's producer and two ping-pong consumers, scheduled at random
# ---------------------------------------------------------------------------------------------------------

class _Mbarrier:
    """``count`` arrivals complete a phase; ``try_wait(parity)`` passes while the current phase's parity
    differs from ``parity`` (the hardware rule: a fresh barrier passes a wait for parity 1 at once)."""

    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def try_wait(self, parity):
        return self.phase % 2 != parity


class _NamedBarrier:
    """``bar.sync`` / ``bar.arrive`` counted in warpgroups: completes when ``count`` have arrived; a sync
    returns once the generation it joined has completed. No phases: extra arrivals would complete it early,
    which the kernel's turn discipline must rule out (checked: at most ``count`` per generation)."""

    def __init__(self, count=2):
        self.count, self.arrived, self.generation = count, [], 0

    def arrive(self, who):
        assert who not in self.arrived, f"warpgroup {who} arrives twice in one generation"
        self.arrived.append(who)
        if len(self.arrived) == self.count:
            self.arrived, self.generation = [], self.generation + 1

    def sync(self, who):
        gen = self.generation
        self.arrive(who)
        while self.generation == gen:
            yield


def _simulate(num_stages, my_tiles, k_tiles, seed, turns=True):
    """The kernel's schedule: the producer loads every use in order; consumer w takes local tiles w, w+2, ...,
    waits for its turn (not on its first tile 0), waits/consumes/releases its uses (use it-1 after issuing
    use it, the last after the tile), passes the turn after its mainloop unless it was the CTA's last tile.
    Asserts every use reads its own data, no slot is reloaded while read, no deadlock, and the turn
    barriers end with no dangling arrival."""
    ring = mbarrier.Ring(num_stages, consumer_arrivals=1)  # one actor = one consumer warpgroup
    full = [_Mbarrier(1) for _ in range(num_stages)]
    empty = [_Mbarrier(1) for _ in range(num_stages)]
    turn = [_NamedBarrier(), _NamedBarrier()]
    slot = [None] * num_stages
    reading = [False] * num_stages
    inflight = []

    def producer():
        for it in range(my_tiles * k_tiles):
            s = ring.stage(it)
            while not empty[s].try_wait(ring.phase(it) ^ 1):
                yield
            assert not reading[s], f"use {it} reloads stage {s} while it is read"
            inflight.append((s, it))
            yield

    def release(it):
        reading[ring.stage(it)] = False
        empty[ring.stage(it)].arrive()

    def consumer(w):
        for t in range(w, my_tiles, 2):
            if turns and t > 0:
                yield from turn[w].sync(w)
            for k in range(k_tiles):
                it = t * k_tiles + k
                s = ring.stage(it)
                while not full[s].try_wait(ring.phase(it)):
                    yield
                assert slot[s] == it, f"consumer {w} use {it} reads the data of use {slot[s]}"
                reading[s] = True
                yield
                if k > 0:
                    release(it - 1)
            if turns and t + 1 < my_tiles:
                turn[1 - w].arrive(w)
            release(t * k_tiles + k_tiles - 1)
            yield  # epilogue

    rng = random.Random(seed)
    actors = {"p": producer(), 0: consumer(0), 1: consumer(1)}
    steps = 0
    while actors or inflight:
        steps += 1
        assert steps < 200000, "deadlock"
        if inflight and rng.random() < 0.3:
            s, it = inflight.pop(0)
            slot[s] = it
            full[s].arrive()  # the expect_tx arrival and the bytes, merged
            continue
        if not actors:
            continue
        name = rng.choice(list(actors))
        try:
            next(actors[name])
        except StopIteration:
            del actors[name]
    assert all(not b.arrived for b in turn), "a turn was passed that nobody took"


@pytest.mark.parametrize("num_stages, my_tiles, k_tiles",
                         [(4, 1, 3), (4, 2, 1), (4, 5, 4), (6, 3, 2), (6, 7, 3), (4, 4, 9), (5, 6, 5), (3, 8, 1)])
def test_pingpong_protocol(num_stages, my_tiles, k_tiles):
    for seed in range(30):
        _simulate(num_stages, my_tiles, k_tiles, seed)


def test_pingpong_without_turns_reads_stale_stage():
    """Why the turn exists: with k_tiles == num_stages, consumer 1's first use (k_tiles) waits for parity 1
    on stage 0, which a fresh barrier passes before anything was loaded."""
    failures = 0
    for seed in range(30):
        try:
            _simulate(4, 2, 4, seed, turns=False)
        except AssertionError as e:
            assert "reads the data of use" in str(e)
            failures += 1
    assert failures > 0
    ring = mbarrier.Ring(4, 1)
    assert _Mbarrier(1).try_wait(ring.phase(4))  # the wait that passes on a fresh barrier


# ---------------------------------------------------------------------------------------------------------
# Epilogue addressing: every accumulator value reaches its own output element through the staging buffer
# ---------------------------------------------------------------------------------------------------------

def _sw128_inverse(offset, dtype):
    """(row, col) of element ``offset`` of a 64 x 64 16-bit SW128 box (the inverse of tma.sw128_offset)."""
    per_chunk, per_row = 16 // tma.elem_bytes(dtype), 128 // tma.elem_bytes(dtype)
    row, in_row = divmod(offset, per_row)
    chunk, e = divmod(in_row, per_chunk)
    return row, (chunk ^ (row % 8)) * per_chunk + e


@pytest.mark.parametrize("tile", PINGPONG)
def test_epilogue_addressing(tile):
    cfg = mod.TILE_CONFIGS[tile]
    block_n, epi_cols, dtype = cfg["block_n"], cfg["epi_cols"], "bfloat16"
    nacc = wgmma.acc_regs(block_n)
    boxes = [_pingpong.store_box(h, b, epi_cols, dtype) for h in range(2) for b in range(epi_cols // 64)]
    box_elems = 64 * 64
    assert sorted(off for _, _, off in boxes) == [i * box_elems for i in range(len(boxes))]
    by_offset = {off: (ro, co) for ro, co, off in boxes}
    seen_regs = set()
    staged = _persistent.staged_cols(block_n)
    for rnd in range(staged // epi_cols):
        written = set()
        for h, jj, r, warp, lane, e in itertools.product(range(2), range(epi_cols // 8), range(2), range(4),
                                                        range(32), range(2)):
            # The value: register h*nacc + acc_index(j, r, e) holds tile element (64h + acc_row, acc_col(j, e)).
            j = rnd * (epi_cols // 8) + jj
            reg = h * nacc + wgmma.acc_index(j, r, e)
            want = (64 * h + wgmma.acc_row(warp, lane, r), wgmma.acc_col(lane, j, e))
            # Where it goes: staging element (even element of the packed pair + e), then the store box.
            idx = _pingpong.staging_offset(h, jj, r, warp, lane, epi_cols, dtype) + e
            assert idx not in written
            written.add(idx)
            box_off = idx - idx % box_elems
            row_off, col_off = by_offset[box_off]
            brow, bcol = _sw128_inverse(idx - box_off, dtype)
            got = (row_off + brow, rnd * epi_cols + col_off + bcol)
            assert got == want, (rnd, h, jj, r, warp, lane, e)
            seen_regs.add(reg)
        assert written == set(range(2 * 64 * epi_cols))  # the whole 128 x epi_cols buffer, once
    # The columns past the staged ones (176: 48) go from the registers (_persistent.store_tail_from_registers with
    # acc_base h * nacc, col_block0 staged / 8, row0 64 h, col0 staged): each register to its own tile element.
    tail = set()
    for h, j, r, warp, lane, e in itertools.product(range(2), range((block_n - staged) // 8), range(2), range(4),
                                                  range(32), range(2)):
        reg = h * nacc + wgmma.acc_index(staged // 8 + j, r, e)
        got = (64 * h + wgmma.acc_row(warp, lane, r), staged + wgmma.acc_col(lane, j, e))
        assert got == (64 * h + wgmma.acc_row(warp, lane, r), wgmma.acc_col(lane, staged // 8 + j, e))
        assert got not in tail
        tail.add(got)
        seen_regs.add(reg)
    assert len(tail) == 128 * (block_n - staged)
    assert seen_regs == set(range(2 * nacc))  # every accumulator register stored once


# ---------------------------------------------------------------------------------------------------------
# Budgets, options, builds
# ---------------------------------------------------------------------------------------------------------

def test_pingpong_tiles_fit_smem():
    # (block_n, stages): bytes, whatever the cluster / release
    expect = {(128, 6): 229472, (192, 4): 196672, (176, 5): 227408, (112, 6): 217184}
    for tile in PINGPONG:
        c = mod.TILE_CONFIGS[tile]
        nbytes = _pingpong.smem_bytes("bfloat16", c["block_m"], c["block_n"], c["block_k"], c["num_stages"],
                                      c["epi_cols"])
        assert nbytes == expect[c["block_n"], c["num_stages"]] and nbytes <= _pingpong.SMEM_LIMIT
        # The next stage would not fit.
        assert _pingpong.smem_bytes("bfloat16", c["block_m"], c["block_n"], c["block_k"], c["num_stages"] + 1,
                                    c["epi_cols"]) > _pingpong.SMEM_LIMIT


@pytest.mark.parametrize("bad, word", [
    ({"block_n": 256}, "block_n"),  # 2 x 128 accumulator registers: more than the consumers' 232
    ({"block_n": 184}, "block_n"),  # not a multiple of 16
    ({"block_m": 64}, "block_m"),
    ({"epi_cols": 96}, "epi_cols"),
    ({"epi_cols": 128}, "epi_cols"),  # does not divide 192
    ({"num_stages": 5}, "smem"),
    ({"cluster_m": 3}, "cluster_m"),
    ({"cluster_m": 2, "group_m": 3}, "cluster_m"),
    ({"cluster_n": 3}, "cluster_n"),
    ({"cluster_n": 2, "cluster_m": 3}, "cluster_n"),
    ({"cluster_n": 2, "cluster_m": 2, "num_sms": 3}, "num_sms"),
    ({"release": "thread"}, "release"),
    ({"layout": "nn"}, "layout"),
    ({"out_dtype": "float32"}, "out_dtype"),
    ({"epilogue": "bias", "bias_dtype": "bfloat16"}, "epilogue"),
])
def test_pingpong_rejects_unsupported(bad, word):
    params = {**_params("pingpong_128x192x64_s4_e64_g8"), **bad}
    with pytest.raises(ValueError, match=word):
        _pingpong.build_pingpong_kernel("bfloat16", **params)


def test_get_kernel_rejects_variants_on_pingpong_tiles():
    with pytest.raises(ValueError, match="need a persistent tile"):
        mod.get_kernel("bfloat16", PINGPONG[0], layout="nn")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("tile", PINGPONG)
def test_pingpong_tile_builds(tile, dtype):
    sass = testing.build_and_check_sass(mod, "fp16_bf16_gemm", {"dtype": dtype, "tile": tile})
    n = mod.TILE_CONFIGS[tile]["block_n"]
    # two m64 halves x 4 k16 steps per stage, times nvcc's unrolling of the mainloop
    hgmma = sass.count(f"HGMMA.64x{n}x16")
    assert hgmma and hgmma % (2 * 4) == 0, hgmma
    # setmaxnreg 40 (0x28) for the producer, 232 (0xe8) for the consumers
    assert re.search(r"USETMAXREG\.DEALLOC\S*\s+0x28\b", sass)
    assert re.search(r"USETMAXREG\.TRY_ALLOC\S*\s+\S+\s+0xe8\b", sass)
    assert "BAR.ARV" in sass  # the turn handed over
    if mod.cluster_ctas(tile) == 2:
        assert "UTMALDG.2D.MULTICAST" in sass
