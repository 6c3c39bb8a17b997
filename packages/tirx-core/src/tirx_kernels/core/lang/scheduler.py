# SPDX-License-Identifier: Apache-2.0
"""Persistent tile scheduling with a grouped (swizzled) raster: pure index math.

A persistent kernel launches ``grid = min(num_tiles, num_sms)`` CTAs (clusters) and CTA ``c`` walks the
tiles ``c, c + grid, c + 2*grid, ...``. Each linear tile id maps to an output tile ``(m_tile, n_tile)`` by
the grouped order (the one Triton's matmul tutorial popularised): tiles run down ``group_m`` M-tiles for
one N-tile, then the next N-tile, and only after all N-tiles move to the next group of ``group_m``
M-tiles. The CTAs resident at one time then share ``group_m`` A row-panels and a run of B row-panels in
L2 instead of all of A (M fastest) or all of B (N fastest).

Everything here works on Python ints (unit tests, host heuristics) and on TIR expressions alike (called
while a ``@T.prim_func`` is parsed); ``tvm`` is imported only when an expression needs ``T.min``. All
operands are non-negative, so ``//`` and ``%`` (floordiv/floormod in TIR) match C division.
"""

from __future__ import annotations


def ceil_div(a, b):
    return (a + b - 1) // b


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    from tvm.script import tirx as T

    return T.min(a, b)


def num_tiles(m, n, block_m: int, block_n: int):
    """(number of M tiles, number of N tiles) covering an ``m x n`` output; edge tiles are partial."""
    return ceil_div(m, block_m), ceil_div(n, block_n)


def grid_size(total_tiles, num_sms: int):
    """CTAs (or clusters) of a persistent launch: one per SM, never more than there are tiles."""
    return _min(total_tiles, num_sms)


def tiles_of_cta(cta, grid, total_tiles):
    """How many tiles CTA ``cta`` (< ``grid``) processes when walking ``cta, cta + grid, ...``."""
    return (total_tiles - cta + grid - 1) // grid


def tile_coords(tile, num_m, num_n, group_m: int):
    """``(m_tile, n_tile)`` of linear tile id ``tile`` (< ``num_m * num_n``) in the grouped raster.

    The last group may hold fewer than ``group_m`` M-tiles (``num_m % group_m``); it is rastered with its
    actual height, so the map stays a bijection onto ``[0, num_m) x [0, num_n)``. ``group_m = 1`` is the
    N-fastest order; ``group_m >= num_m`` the M-fastest order.
    """
    if group_m < 1:
        raise ValueError(f"tile_coords: group_m={group_m} must be >= 1")
    per_group = group_m * num_n
    group = tile // per_group
    first_m = group * group_m
    height = _min(num_m - first_m, group_m)
    in_group = tile % per_group
    return first_m + in_group % height, in_group // height


def cluster_rank_mn(rank, cluster_m: int, cluster_n: int):
    """``(rank_m, rank_n)``: where CTA ``rank`` of a ``cluster_m x cluster_n`` cluster sits, M fastest
    (``rank = rank_n * cluster_m + rank_m``). With one of the sizes 1 the other coordinate is ``rank`` itself."""
    if cluster_n == 1:
        return rank, 0
    if cluster_m == 1:
        return 0, rank
    return rank % cluster_m, rank // cluster_m


def _shift_left(base: int, by):
    if isinstance(by, int):
        return base << by
    from tvm.script import tirx as T

    return T.shift_left(T.int32(base), by)


def multicast_a(rank, cluster_m: int, cluster_n: int):
    """``(part, mask)`` of CTA ``rank``'s A load in a ``cluster_m x cluster_n`` cluster: the ``cluster_n`` CTAs of
    one M-tile (same ``rank_m``) share its A tile, so each loads rows slice ``part`` (of ``cluster_n``) and
    multicasts it to the CTAs of ``mask`` (bit r = CTA r); ``(0, None)`` without a partner (``cluster_n == 1``:
    the whole tile, no multicast). ``mask`` is a Python int unless it depends on a traced rank."""
    rank_m, rank_n = cluster_rank_mn(rank, cluster_m, cluster_n)
    if cluster_n == 1:
        return 0, None
    same_m = sum(1 << (j * cluster_m) for j in range(cluster_n))  # ranks rank_m + j * cluster_m
    return rank_n, same_m if cluster_m == 1 else _shift_left(same_m, rank_m)


def multicast_b(rank, cluster_m: int, cluster_n: int):
    """:func:`multicast_a` for B: the ``cluster_m`` CTAs of one N-tile (same ``rank_n``) share its B tile; each
    loads slice ``rank_m`` (of ``cluster_m``) of its rows into the CTAs of ``mask``."""
    rank_m, rank_n = cluster_rank_mn(rank, cluster_m, cluster_n)
    if cluster_m == 1:
        return 0, None
    same_n = (1 << cluster_m) - 1  # ranks rank_n * cluster_m + i
    return rank_m, same_n if cluster_n == 1 else _shift_left(same_n, rank_n * cluster_m)


def cluster_tile_coords(tile, num_m, num_n, group_m: int, cluster_m: int, rank, cluster_n: int = 1):
    """``(m_tile, n_tile)`` for CTA ``rank`` of a ``cluster_m x cluster_n`` cluster working on cluster tile
    ``tile``.

    A ``cluster_m x 1`` cluster covers ``cluster_m`` consecutive M-tiles of one N-tile (they share, and
    multicast, the B tile). Cluster tiles are rastered like :func:`tile_coords` over
    ``ceil(num_m / cluster_m)`` rows with ``group_m // cluster_m`` of them per group. When
    ``num_m % cluster_m != 0`` the last cluster row has CTAs whose ``m_tile >= num_m``: they still load
    (zero-filled) A, multicast their B share and join every barrier, but store nothing.

    A ``1 x cluster_n`` cluster covers ``cluster_n`` consecutive N-tiles of one M-tile (they share the A
    tile), rastered over ``ceil(num_n / cluster_n)`` cluster columns with ``group_m`` M-tiles per group; CTAs
    past N likewise load zero-filled B and store nothing.

    A ``cluster_m x cluster_n`` cluster (both > 1) covers that block of tiles: CTA ``rank`` takes tile
    ``(rank_m, rank_n)`` of it (:func:`cluster_rank_mn`); cluster tiles are rastered over
    ``ceil(num_m / cluster_m) x ceil(num_n / cluster_n)`` with ``group_m // cluster_m`` cluster rows per group, and
    CTAs past M or N pad as above. A cluster is co-scheduled on one GPC, so every reader of the block's A and B
    panels sits in one GPC (docs/gemm.md section 16: 2-CTA clusters land their neighbours in other GPCs).
    """
    if group_m % cluster_m:
        raise ValueError(f"cluster_tile_coords: group_m={group_m} must be a multiple of cluster_m={cluster_m}")
    if cluster_n > 1 and cluster_m == 1:
        m, nc = tile_coords(tile, num_m, ceil_div(num_n, cluster_n), group_m)
        return m, nc * cluster_n + rank
    if cluster_n > 1:
        rank_m, rank_n = cluster_rank_mn(rank, cluster_m, cluster_n)
        mc, nc = tile_coords(tile, ceil_div(num_m, cluster_m), ceil_div(num_n, cluster_n), group_m // cluster_m)
        return mc * cluster_m + rank_m, nc * cluster_n + rank_n
    mc, n = tile_coords(tile, ceil_div(num_m, cluster_m), num_n, group_m // cluster_m)
    return mc * cluster_m + rank, n


def num_cluster_tiles(num_m, num_n, cluster_m: int = 1, cluster_n: int = 1):
    """Cluster tiles covering ``num_m x num_n`` tiles with ``cluster_m x cluster_n`` clusters."""
    return ceil_div(num_m, cluster_m) * ceil_div(num_n, cluster_n)


# ---------------------------------------------------------------------------------------------------------
# Stream-K: a persistent grid that splits the last waves' tiles along K so that every CTA does the same work
# ---------------------------------------------------------------------------------------------------------
#
# With ``total`` tiles of ``k_tiles`` K-steps on ``grid`` CTAs, the plain schedule runs ceil(total / grid) waves
# and the last one is partly idle (448 tiles on 132 SMs: 3.39 waves take 4). Stream-K (Osama et al., PPoPP '23;
# CUTLASS's "DP + SK" hybrid) keeps ``dp_waves`` whole waves of tiles ("data-parallel": tile ``cta + w * grid``)
# and spreads the rest, the last full wave and the partial one, evenly over the CTAs as one range of K-steps: CTA
# ``c`` gets the K-steps [start(c), start(c + 1)) of the stream-K tiles laid end to end (tile by tile, K fastest),
# ``start(c) = c * sk_steps // grid``. A CTA's range covers the end of one tile (a *partial*: it does not start at
# the tile's K-step 0), whole tiles, and the beginning of another; the CTA that holds a tile's K-step 0 *finishes*
# it: it adds the partials of the CTAs after it that cover the rest of the tile (each CTA leaves at most one
# partial: only its first range can start inside a tile) and stores the tile. A CTA does its partial first and its
# finishing last, so a finisher never waits long and never for a CTA that waits (see ``core.lang.grid_flags``).
# The functions below work on Python ints and TIR expressions alike; the kernel binds their results once.


def _select(cond, a, b):
    if isinstance(cond, bool):
        return a if cond else b
    from tvm.script import tirx as T

    return T.Select(cond, a, b)


def _max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    from tvm.script import tirx as T

    return T.max(a, b)


def _mul_div(a, b, c):
    """``a * b // c`` without 32-bit overflow of the product (int64 in TIR)."""
    if isinstance(a, int) and isinstance(b, int) and isinstance(c, int):
        return a * b // c
    from tvm.script import tirx as T

    return T.Cast("int32", T.Cast("int64", a) * T.Cast("int64", b) // T.Cast("int64", c))


def stream_k_grid(total_tiles, k_tiles, num_sms: int):
    """CTAs of a stream-K launch: one per SM, never more than there are K-steps."""
    return grid_size(total_tiles * k_tiles, num_sms)


def stream_k_dp_waves(total_tiles, grid):
    """Whole waves of data-parallel tiles: all of them when the tiles fill the waves exactly, otherwise all but
    the last full wave (which joins the partial one in the stream-K part)."""
    full = total_tiles // grid
    return _select(total_tiles % grid == 0, full, _max(full - 1, 0))


def stream_k_start(cta, sk_steps, grid):
    """CTA ``cta``'s first K-step in the stream-K part (``cta = grid``: the end of the last CTA's range)."""
    return _mul_div(cta, sk_steps, grid)


def stream_k_owner(step, sk_steps, grid):
    """The CTA whose range holds stream-K step ``step``: the largest ``c`` with ``start(c) <= step``, i.e. with
    ``c * sk_steps < (step + 1) * grid``."""
    if isinstance(step, int) and isinstance(sk_steps, int) and isinstance(grid, int):
        return ((step + 1) * grid - 1) // sk_steps
    from tvm.script import tirx as T

    return T.Cast("int32", ((T.Cast("int64", step) + 1) * T.Cast("int64", grid) - 1) // T.Cast("int64", sk_steps))


def stream_k_units(dp_waves, start, end, k_tiles):
    """How many work units a CTA runs: its ``dp_waves`` whole tiles, then one per stream-K tile its range
    [start, end) touches."""
    return dp_waves + _select(end > start, (end - 1) // k_tiles - start // k_tiles + 1, 0)


def _stream_k_tile(u, dp_waves, start, k_tiles):
    """Work unit ``u``'s tile among the stream-K tiles (``u >= dp_waves``): the range's first tile, then the next."""
    return start // k_tiles + u - dp_waves


def stream_k_unit(u, cta, grid, dp_waves, start, end, k_tiles):
    """``(tile, k_begin, k_end)`` of CTA ``cta``'s work unit ``u``: a data-parallel tile ``cta + u * grid`` (all
    K-steps) while ``u < dp_waves``, then the stream-K tiles its range touches, each clipped to the range."""
    dp_tiles = dp_waves * grid
    sk_tile = _stream_k_tile(u, dp_waves, start, k_tiles)
    dp = u < dp_waves
    return (_select(dp, cta + u * grid, dp_tiles + sk_tile),
            _select(dp, 0, _max(start - sk_tile * k_tiles, 0)),
            _select(dp, k_tiles, _min(end - sk_tile * k_tiles, k_tiles)))


def stream_k_use(u, k, dp_waves, start, k_tiles):
    """How many K-steps the CTA ran before K-step ``k`` of its unit ``u`` (a ring's use count): whole tiles while
    ``u < dp_waves``, then the data-parallel steps plus the stream-K steps from ``start``."""
    return _select(u < dp_waves, u * k_tiles + k,
                   dp_waves * k_tiles + _stream_k_tile(u, dp_waves, start, k_tiles) * k_tiles + k - start)
