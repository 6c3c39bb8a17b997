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


def cluster_tile_coords(tile, num_m, num_n, group_m: int, cluster_m: int, rank, cluster_n: int = 1):
    """``(m_tile, n_tile)`` for CTA ``rank`` of a ``cluster_m x 1`` (or ``1 x cluster_n``) cluster working on
    cluster tile ``tile``.

    A ``cluster_m x 1`` cluster covers ``cluster_m`` consecutive M-tiles of one N-tile (they share, and
    multicast, the B tile). Cluster tiles are rastered like :func:`tile_coords` over
    ``ceil(num_m / cluster_m)`` rows with ``group_m // cluster_m`` of them per group. When
    ``num_m % cluster_m != 0`` the last cluster row has CTAs whose ``m_tile >= num_m``: they still load
    (zero-filled) A, multicast their B share and join every barrier, but store nothing.

    A ``1 x cluster_n`` cluster covers ``cluster_n`` consecutive N-tiles of one M-tile (they share the A
    tile), rastered over ``ceil(num_n / cluster_n)`` cluster columns with ``group_m`` M-tiles per group; CTAs
    past N likewise load zero-filled B and store nothing.
    """
    if cluster_m > 1 and cluster_n > 1:
        raise ValueError(f"cluster_tile_coords: a {cluster_m} x {cluster_n} cluster (one of them must be 1)")
    if cluster_n > 1:
        m, nc = tile_coords(tile, num_m, ceil_div(num_n, cluster_n), group_m)
        return m, nc * cluster_n + rank
    if group_m % cluster_m:
        raise ValueError(f"cluster_tile_coords: group_m={group_m} must be a multiple of cluster_m={cluster_m}")
    mc, n = tile_coords(tile, ceil_div(num_m, cluster_m), num_n, group_m // cluster_m)
    return mc * cluster_m + rank, n


def num_cluster_tiles(num_m, num_n, cluster_m: int = 1, cluster_n: int = 1):
    """Cluster tiles covering ``num_m x num_n`` tiles with ``cluster_m x cluster_n`` clusters."""
    return ceil_div(num_m, cluster_m) * ceil_div(num_n, cluster_n)
