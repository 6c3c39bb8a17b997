# SPDX-License-Identifier: Apache-2.0
# Port of the tile schedules of DeepGEMM's SM90 FP8 GEMMs (deep_gemm/include/deep_gemm/scheduler/gemm.cuh: GemmType
# Normal, MGroupedContiguous, MGroupedMasked) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b:
# which output tiles a persistent CTA walks and which group (expert) each belongs to, written anew for the TIRx
# kernel of ``_fp8_gemm_kernel.py``.
"""Tile schedules of the SM90 FP8 GEMM mainloop (``_fp8_gemm_kernel.build_kernel(schedule=...)``).

The mainloop is the same for every form; a schedule says which 128 x ``block_n`` tiles a persistent CTA walks
(``c, c + grid, ...`` of a linear order), where each tile's operands live, and which of its rows are stored:

- ``dense`` (``fp8_gemm_nt``): ``ceil(M/128) x ceil(N/block_n)`` tiles in ``core.lang.scheduler``'s grouped raster.
- ``m_contiguous`` (``m_grouped_fp8_gemm_nt_contiguous``, MoE forward): A's rows are grouped by expert, ``L[m]``
  (int32, one per row) the group of row m or -1 for a padding row; groups start on a 128-row boundary, so a tile's
  group is ``L`` of its first row (DeepGEMM reads the same entry). Tiles as ``dense``; B and sfb are read at the
  group's ``[G, N, K]`` / ``[G, ceil(N/128), ceil(K/128)]`` slice. A tile whose first row is -1 loads and computes
  nothing, and a 64-row slab whose first row is -1 skips its wgmma (DeepGEMM skips the same slabs); every row with
  ``L = -1`` is stored as 0 (DeepGEMM stores 0 for a skipped slab and the product of the padding row otherwise,
  which is 0 for the zero padding its tests and MoE dispatchers write).
- ``m_masked`` (``m_grouped_fp8_gemm_nt_masked``, decode MoE): A ``[G, max_m, K]``, ``L[g]`` (device-side, int32)
  the valid rows of group g (clamped to [0, max_m]). The grid, ``min(num_sms, G * ceil(max_m/128) * tiles_n)``,
  does not depend on ``L`` (a CUDA graph replays it with new counts); the tiles walked do: group after group,
  ``ceil(L[g]/128) x tiles_n`` tiles each, the grouped raster inside a group (DeepGEMM's order). Each thread sums
  the groups' tile counts once, then walks with a (group, first tile of the group) cursor that only moves forward.
  Only rows below ``L[g]`` are stored; a slab starting at or past it skips its wgmma. Rows past ``L[g]`` are left
  as they were (DeepGEMM writes the rest of the tile's rows too, with values of no meaning).
- ``batched`` (``fp8_einsum('bhr,hdr->bhd')``, DeepGEMM's sm90_fp8_bmm): G batches (heads) of equal M, no layout
  argument: ``G x ceil(M/128) x tiles_n`` tiles, batch after batch, the grouped raster inside a batch. A is read
  through a rank-3 tensor map of its own strides (``[G, M, K]`` of any row and batch stride: the strided heads of a
  ``[b, h, r]`` activation, never copied); sfa and D per batch as ``m_masked``'s.

Clusters (``cluster_n = 2``, every schedule): the linear order walks *cluster tiles*, ``cluster_n`` consecutive
N-tiles of one M-tile; CTA ``rank`` of the cluster takes N-tile ``cluster_n * j + rank`` of it (same M-tile, same
group: the A tile is shared and multicast). A CTA past N (an odd N-tile count) loads zero-filled B and stores
nothing. ``count`` and ``bind`` take the cluster's index and the number of clusters.

Every function here runs while the kernel is parsed (traced): ``T.If`` / ``T.While`` frames and ``T.buffer_store``
into the kernel's local buffers, never a Python ``if`` on a device value.
"""

from __future__ import annotations

from tirx_kernels.core.lang import scheduler

BLOCK_M = 128
SCHEDULES = ("dense", "m_contiguous", "m_masked", "batched")

# Slots of the per-tile local ``info`` buffer (int32) that ``bind`` fills.
M0, N0, GROUP, ROWS = 0, 1, 2, 3


class TileSchedule:
    """One schedule: ``grid`` (the launch extent, a function of the kernel's dims only), ``begin`` (per-thread state
    before the first tile), ``count`` (the tiles this CTA walks), ``bind`` (tile -> ``info``: its first row inside
    its group's rows of A, first column, group, and the rows of that group that are stored), ``loads`` / ``slab_live``
    (whether the tile's stages are loaded, whether a consumer warpgroup's slab runs its wgmma), ``row_kept`` (a stored
    row keeps its value, else 0) and the row offsets of A, the sfa column and D."""

    grouped = False  # B [G, N, K], sfb [G, ceil(N/128), ceil(K/128)], and a device-side int32 layout argument
    layout = None  # that argument's buffer (``match_layout``)

    def __init__(self, block_n: int, group_m: int, num_sms: int, block_m: int = BLOCK_M, cluster_n: int = 1):
        self.block_n, self.group_m, self.num_sms = block_n, group_m, num_sms
        self.block_m, self.cluster_n = block_m, cluster_n

    def match_layout(self, handle, M, G):  # noqa: N803
        """Bind the grouped schedules' int32 argument (contiguous: ``[M]``, the group of each row; masked: ``[G]``,
        the rows of each group) while the kernel's host part is parsed."""
        from tvm.script import tirx as T

        self.layout = T.match_buffer(handle, (M,) if self.name == "m_contiguous" else (G,), "int32", align=4)

    def tiles_mn(self, M, N):  # noqa: N803
        """(M-tiles, cluster columns of N-tiles) of one group: the walk's raster."""
        tm, tn = scheduler.num_tiles(M, N, self.block_m, self.block_n)
        return tm, scheduler.ceil_div(tn, self.cluster_n) if self.cluster_n > 1 else tn

    def walk(self, M, N, G):  # noqa: N803
        """Cluster tiles in the linear order (an upper bound for ``m_masked``: every group full)."""
        tm, tn = self.tiles_mn(M, N)
        return tm * tn

    def grid(self, M, N, G):  # noqa: N803
        """CTAs launched: ``cluster_n`` per cluster, at most ``num_sms``."""
        return scheduler.grid_size(self.walk(M, N, G), self.num_sms // self.cluster_n) * self.cluster_n

    def n_tile(self, nc, rank):
        return nc * self.cluster_n + rank if self.cluster_n > 1 else nc

    def begin(self, state, M, N, G):  # noqa: N803
        """Per-thread state before the first tile (an int32 local buffer of 3)."""

    def count(self, cluster, clusters, state, M, N, G):  # noqa: N803
        return scheduler.tiles_of_cta(cluster, clusters, self.walk(M, N, G))

    def bind(self, info, state, tile, M, N, G, rank=0):  # noqa: N803
        from tvm.script import tirx as T

        tm, tn = self.tiles_mn(M, N)
        m_tile, nc = scheduler.tile_coords(tile, tm, tn, self.group_m)
        T.buffer_store(info, m_tile * self.block_m, [M0])
        T.buffer_store(info, self.n_tile(nc, rank) * self.block_n, [N0])
        T.buffer_store(info, self.group_of(m_tile * self.block_m), [GROUP])
        T.buffer_store(info, M, [ROWS])

    def group_of(self, m0):
        from tvm.script import tirx as T

        return T.int32(0)

    def loads(self, info):
        """Whether the tile's K blocks go through the ring (the producer loads them, the consumers wait for them)."""
        return True

    def slab_live(self, info, slab_row0):
        """Whether the consumer slab whose first row (inside the group) is ``slab_row0`` runs its wgmma."""
        return True

    def row_kept(self, row):
        """Whether stored row ``row`` (inside the group) keeps its value; otherwise it is stored as 0."""
        return True

    def stored_rows(self, info, M):  # noqa: N803
        """Rows (inside the group) the epilogue stores: the tile's rows below this."""
        return M

    def a_row(self, info, M):  # noqa: N803
        """First row of the tile in A's rows as the tensor map sees them."""
        return info[M0]

    def sfa_row(self, info, k_blocks):
        """Row of the sfa tensor map (``(groups x) k_blocks`` rows of the MN-major scales) of K block 0."""
        return 0


class DenseSchedule(TileSchedule):
    name = "dense"


class ContiguousSchedule(TileSchedule):
    name = "m_contiguous"
    grouped = True

    def group_of(self, m0):
        return self.layout[m0]

    def loads(self, info):
        return info[GROUP] >= 0

    def slab_live(self, info, slab_row0):
        from tvm.script import tirx as T

        # A slab past M stores nothing; its first row's entry tells whether it holds any real row.
        return T.And(slab_row0 < info[ROWS], self.layout[T.min(slab_row0, info[ROWS] - 1)] >= 0)

    def row_kept(self, row):
        return self.layout[row] >= 0


class MaskedSchedule(TileSchedule):
    name = "m_masked"
    grouped = True

    def walk(self, M, N, G):  # noqa: N803
        tm, tn = self.tiles_mn(M, N)
        return G * tm * tn

    def rows(self, g, M):  # noqa: N803
        from tvm.script import tirx as T

        return T.min(T.max(self.layout[g], 0), M)

    def group_tiles_m(self, g, M):  # noqa: N803
        return scheduler.ceil_div(self.rows(g, M), self.block_m)

    def begin(self, state, M, N, G):  # noqa: N803
        """state = (M-tiles of all groups, cursor group, M-tiles of the groups before it)."""
        from tvm.script import tirx as T

        T.buffer_store(state, 0, [0])
        with T.serial(G) as g:
            T.buffer_store(state, state[0] + self.group_tiles_m(g, M), [0])
        T.buffer_store(state, 0, [1])
        T.buffer_store(state, 0, [2])

    def count(self, cluster, clusters, state, M, N, G):  # noqa: N803
        return scheduler.tiles_of_cta(cluster, clusters, state[0] * self.tiles_mn(M, N)[1])

    def bind(self, info, state, tile, M, N, G, rank=0):  # noqa: N803
        from tvm.script import tirx as T

        tn = self.tiles_mn(M, N)[1]
        # Move the cursor to the group holding `tile` (tiles of one CTA only increase; empty groups are passed).
        with T.While(T.And(state[1] < G - 1, tile >= (state[2] + self.group_tiles_m(state[1], M)) * tn)):
            T.buffer_store(state, state[2] + self.group_tiles_m(state[1], M), [2])
            T.buffer_store(state, state[1] + 1, [1])
        T.buffer_store(info, state[1], [GROUP])
        T.buffer_store(info, self.rows(state[1], M), [ROWS])
        m_tile, nc = scheduler.tile_coords(tile - state[2] * tn, scheduler.ceil_div(info[ROWS], self.block_m), tn,
                                           self.group_m)
        T.buffer_store(info, m_tile * self.block_m, [M0])
        T.buffer_store(info, self.n_tile(nc, rank) * self.block_n, [N0])

    def slab_live(self, info, slab_row0):
        return slab_row0 < info[ROWS]

    def stored_rows(self, info, M):  # noqa: N803
        return info[ROWS]

    def a_row(self, info, M):  # noqa: N803
        return info[GROUP] * M + info[M0]

    def sfa_row(self, info, k_blocks):
        return info[GROUP] * k_blocks


class BatchedSchedule(TileSchedule):
    name = "batched"
    grouped = True

    def match_layout(self, handle, M, G):  # noqa: N803
        """No layout argument: every batch has M rows."""

    def walk(self, M, N, G):  # noqa: N803
        tm, tn = self.tiles_mn(M, N)
        return G * tm * tn

    def bind(self, info, state, tile, M, N, G, rank=0):  # noqa: N803
        from tvm.script import tirx as T

        tm, tn = self.tiles_mn(M, N)
        g = tile // (tm * tn)
        m_tile, nc = scheduler.tile_coords(tile - g * (tm * tn), tm, tn, self.group_m)
        T.buffer_store(info, m_tile * self.block_m, [M0])
        T.buffer_store(info, self.n_tile(nc, rank) * self.block_n, [N0])
        T.buffer_store(info, g, [GROUP])
        T.buffer_store(info, M, [ROWS])

    def sfa_row(self, info, k_blocks):
        return info[GROUP] * k_blocks


def make(schedule: str, block_n: int, group_m: int, num_sms: int, block_m: int = BLOCK_M,
         cluster_n: int = 1) -> TileSchedule:
    classes = {c.name: c for c in (DenseSchedule, ContiguousSchedule, MaskedSchedule, BatchedSchedule)}
    if schedule not in classes:
        raise ValueError(f"fp8 gemm: schedule {schedule!r} is not one of {SCHEDULES}")
    if cluster_n not in (1, 2) or num_sms < cluster_n:
        raise ValueError(f"fp8 gemm: cluster_n={cluster_n} is not 1 or 2 (with at least that many SMs)")
    if block_m != BLOCK_M and schedule in ("m_contiguous", "m_masked"):
        # m_contiguous: groups are aligned to 128 rows, so a 256-row tile could span two; m_masked: not built.
        raise ValueError(f"fp8 gemm: block_m={block_m} is the dense / batched schedules' only (got {schedule!r})")
    return classes[schedule](block_n, group_m, num_sms, block_m, cluster_n)
