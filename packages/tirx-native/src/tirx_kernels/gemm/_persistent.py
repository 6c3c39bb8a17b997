# SPDX-License-Identifier: Apache-2.0
"""Persistent warp-specialized C = A·Bᵀ (bf16/fp16) for ``fp16_bf16_gemm``: same calling convention as its
non-persistent kernel (``fn(a, b, c)``, A (M, K), B (N, K), C (M, N) with row stride ``ldc``; M, N, K
dynamic; ragged edges through TMA zero-fill on loads and clipping on stores).

Design:
- Grid: ``min(num_tiles, num_sms)`` CTAs (clusters of ``cluster_m``), each looping over tiles
  ``c, c + grid, ...`` in the grouped raster of ``core.lang.scheduler`` (``group_m`` M-tiles per group,
  for L2 reuse). ``num_sms`` is a compile parameter (132 on the H200) rather than a device query: the
  kernel stays a pure function of its config, and a wrong value costs speed, never correctness.
- 384 threads: warpgroup 0 the TMA producer (setmaxnreg 40, one issuing thread), warpgroups 1-2 the math
  consumers (setmaxnreg 232), each a 64 x block_n slab of the tile with an m64n{block_n}k16 accumulator.
- One ``num_stages`` full/empty ring for the whole CTA lifetime: the ring's use count is the CTA's global
  k-iteration ``t * k_tiles + k`` over all its tiles, so stage and phase continue across tiles and the
  producer runs ahead into the next tile while the consumers are in the epilogue.
- Lean consumer loop: stage 0's A/B descriptors are built once and each use adds its byte offset
  (``wgmma.desc_advance``); the consumers keep the ring position in a (stage, phase) cursor (``Ring.cursor_*``)
  instead of dividing the use count by ``num_stages`` every k-tile; the producer prefetches the tensor maps.
  128 x 128 s6: 89 -> 33 SASS instructions per k-tile and warp, the tensor pipe as busy as before (Nsight
  Compute, 512x4096x14336: 90 %); +0.5-1 % in the sweep, 1024^3 +5 % (docs/gemm.md section 13).
- Epilogue: fp32 -> 16-bit pairs into a SW128 staging tile, TMA store of 64 x 64 boxes, committed but
  not waited for: the next tile's mainloop overlaps the store; only before rewriting the staging tile
  does the storing thread wait for the previous stores to have *read* it (``wait_group.read``).
- ``epi_cols`` (None = ``block_n``): the staging tile holds block_m x epi_cols 16-bit elements, and each
  consumer writes its 64 x block_n slab in ``block_n / epi_cols`` rounds of epi_cols columns, each round
  [wait until the previous stores have read the staging tile, warpgroup sync, accumulator columns ->
  staging, ``fence.proxy.async``, sync, TMA store boxes, commit]: the smem it saves buys ring stages
  (128 x 256 with epi_cols 128: 4 x 48 KB ring + 32 KB staging = 224 KB instead of 3 stages).
- ``cluster_m = 2``: the two CTAs of a cluster take M-tiles (2i, 2i+1) of one N-tile; each loads half of
  the B tile and multicasts it into both. When the number of M-tiles is odd, the last cluster's second
  CTA lies past M: it still loads (zero-filled) A, multicasts its B half and joins every barrier, but
  stores nothing.
- ``cluster_n = 2`` (``cluster_m = 1``): a 1 x 2 cluster, the transpose of the above: the two CTAs take N-tiles
  (2j, 2j+1) of one M-tile, each loads 64 of the tile's 128 A rows and multicasts them into both; a CTA past N
  loads zero-filled B and stores nothing.
- ``cluster_m = cluster_n = 2``: a 2 x 2 cluster covers a 2 x 2 block of tiles; CTA ``rank = 2 * rank_n + rank_m``
  takes tile (rank_m, rank_n) of it, loads A rows slice ``rank_n`` (64 of 128) into the two CTAs of its M-tile and B
  slice ``rank_m`` (half of block_n) into the two CTAs of its N-tile (``scheduler.multicast_a`` / ``multicast_b``:
  masks ``5 << rank_m`` and ``3 << 2 * rank_n``), so each CTA requests half of what an unclustered one does and the
  four readers of the block's panels share a GPC. Every consumer releases a slot in all four CTAs (the diagonal
  CTA's producer writes nothing into this one, so it waits for one CTA more than it must; the counts stay uniform).
  CTAs past M or N pad as in the 2-CTA clusters.
- ``release``: who gives a ring slot back after the consumers' ``wgmma.wait``: ``"warp"`` (lane 0 of every
  consumer warp, in every CTA of the cluster: 8 x cluster arrivals per slot) or ``"warpgroup"`` (lane 0 of
  warp r of each consumer warpgroup arrives in CTA r: 2 x cluster arrivals, the remote ones leaving from two
  warps at once; ``mbarrier.Ring.consumer_release_warpgroup``).
- ``block_n`` a multiple of 16 but not of 64 (224: N = 7168, 14336 and 28672 are 32, 64 and 128 such tiles,
  one or a whole number of waves on 132 SMs where 128 x 256 tiles leave a 0.85 wave; 176, cuBLAS's tile for
  2048 x 7168 x 2048 and 512 x 28672 x 8192: 41 and 163 N-tiles, 4.97 and 4.94 waves): the first
  ``block_n // 64 * 64`` columns go out through the staging tile and TMA as above, the last 16-48 straight from
  the accumulator registers (``store_tail_from_registers``: one ``st.global`` of a 16-bit pair per fragment
  element, clipped at M and N). The plain kernel only (NT, 16-bit out, no epilogue); clusters too (a CTA past
  M or N stores nothing there either).
- ``stream_k`` (the plain unclustered NT kernel only): the grid is ``min(num_sms, tiles x K-steps)`` CTAs; whole
  waves of tiles stay data-parallel and the rest (the last full wave and the partial one) is split evenly along K
  (``core.lang.scheduler``'s stream-K functions: CTA ``c`` gets K-steps [c * S / grid, (c + 1) * S / grid) of the
  S stream-K steps). A unit that does not start at a tile's K-step 0 is a *partial*: its accumulator goes to the
  CTA's slot of the fp32 workspace (``num_sms x block_m x block_n``, fragment order: each thread its own 16-byte
  vectors) and its warpgroup publishes a flag; the CTA holding the tile's step 0 finishes the tile last, waiting for
  and adding the partials of the CTAs after it before the usual epilogue (``core.lang.grid_flags``; the reader
  resets each flag, so they stay zero between launches). The ring, the cursor and the epilogue are the plain
  kernel's: a unit is a tile with a K-range, its first wgmma overwriting the accumulator.
- ``load_priority`` (None: no hint): every A and B TMA load carries that L2 eviction priority (``evict_first``,
  ``evict_last`` or ``evict_normal``; one ``createpolicy`` by the producer thread, ``.L2::cache_hint`` on the loads).
  Where one wave holds every tile (512 x 4096 / 6144 / 7168 on 128 x 128 / 192 / 224), all readers of a panel slice
  read it within one K-step, so its lines are dead once read; ``evict_first`` lets them leave L2 before the dirty
  lines a producer kernel (or the bench's cold-L2 fill) left there, which otherwise are written back while the GEMM
  streams its operands from DRAM (measured: ``docs/gemm.md`` section 16).
- ``c_store="stg"`` (the plain NT kernel, tiles of whole 64-column boxes): C rows of any alignment (odd N, where a
  tensor map of C cannot exist): each round's staging tile is read back row by row and written with 16-bit
  ``st.global`` clipped at M and N (``store_staged_rows``) instead of TMA stores; no tensor map of C.
- Every shared buffer, barriers included, in one ``T.SMEMPool`` (1024-aligned only then).

Variants (compile parameters; the defaults build exactly the plain kernel above):
- ``layout="nn"``: B is (K, N), N contiguous: an MN-major wgmma operand (transpose-B immediate). Each
  stage's B tile is ``block_n / 64`` TMA boxes of (block_k K-rows x 64 N-columns), 128B-swizzled, one
  after the other; the SW128 MN-major descriptor has LBO = one box (the next 64 N-columns) and SBO =
  1024 B (the next 8 K-rows), and each k16 step moves 16 K-rows = 2048 B.
- ``out_dtype="float32"``: the staging tile keeps its 16-bit size, so the fp32 slab goes out in
  block_n / (epi_cols / 2) passes of epi_cols / 2 columns (two passes of block_n / 2 without
  ``epi_cols``; TMA store boxes of 64 rows x 32 fp32 = one 128-byte swizzle row); each pass waits for the
  previous pass's stores to have read the staging tile.
- ``epilogue``: ``"bias"`` adds ``bias[n]`` (bf16/fp16/fp32, ``bias_dtype``); ``"alpha_beta"`` computes
  ``alpha * acc + beta * C`` with runtime fp32 scalars (kernel arguments); ``"alpha_beta_bias"`` both.
  When ``beta != 0`` (a uniform runtime branch) each consumer warpgroup TMA-loads its slab of the old C
  into the staging tile (the same boxes and swizzle the store uses, completing on a per-warpgroup
  mbarrier) and reads its own elements back from there; ``beta == 0`` never reads C (BLAS semantics:
  ``out`` may hold NaN).
  The kernel's arguments are ``(a, b, c[, bias][, alpha, beta])``.
- ``sync`` (plain unclustered NT only; ``core.lang.peer``; the distributed GEMMs of this folder): the M-tile order
  rotated by the argument ``m_rotate`` (M-tile ``(m + m_rotate) % num_m``). ``"wait_rows"`` (``allgather_gemm``, args
  ``(a, b, c, sync, sync_rows, sync_chunk, m_rotate)``): before a tile's first A load the producer waits for the int32
  flag (>= 1) of every chunk of rows it covers (row g: chunk ``g // sync_rows * ceil(sync_rows / sync_chunk) +
  g % sync_rows // sync_chunk``). ``"publish_tiles"`` (``gemm_reduce_scatter``, args ``(a, b, c, sync, m_rotate)``):
  once a tile's stores are written, each consumer warpgroup adds 1 to ``sync[m_tile * num_n + n_tile]`` (system scope).
"""

from __future__ import annotations

from tirx_kernels.core.lang import scheduler

SMEM_LIMIT = 232448  # 227 KB: the H200's opt-in maximum dynamic shared memory per block
NUM_CONSUMERS = 2

LAYOUTS = ("nt", "nn")
EPILOGUES = ("none", "bias", "alpha_beta", "alpha_beta_bias")
# How C leaves the staging tile: TMA stores, or (C rows not 16-byte aligned, e.g. odd N) per-element st.global.
C_STORES = ("tma", "stg")
SYNCS = (None, "wait_rows", "publish_tiles")  # cross-GPU hooks (``sync``); None: the plain kernel, unchanged


def has_bias(epilogue: str) -> bool:
    return epilogue in ("bias", "alpha_beta_bias")


def has_alpha_beta(epilogue: str) -> bool:
    return epilogue in ("alpha_beta", "alpha_beta_bias")


def staged_cols(block_n: int) -> int:
    """Columns of a tile that leave through the staging tile and TMA stores (whole 64-column SW128 boxes);
    the rest (32 when block_n % 64 == 32) are stored from registers."""
    return block_n - block_n % 64


def smem_bytes(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int,
               epilogue: str = "none", epi_cols: int | None = None) -> int:
    """Bytes of the pool: the A/B ring, the C staging tile of block_m x epi_cols (default: the staged
    columns, block_n rounded down to 64) 16-bit elements (whatever the output dtype: fp32 goes out in twice
    the passes), the 2 x num_stages ring barriers (+ one C-load barrier per consumer warpgroup when the
    epilogue reads C)."""
    elem = 2
    bars = 2 * num_stages + (NUM_CONSUMERS if has_alpha_beta(epilogue) else 0)
    staging = block_m * (epi_cols or staged_cols(block_n)) * elem
    return num_stages * (block_m + block_n) * block_k * elem + staging + bars * 8


def store_tail_from_registers(Cw, packed, acc, acc_base, col_block0, ncols, row0, col0, M, N, ldc, warp, lane,  # noqa: N803
                               cvt_pack):
    """``ncols`` (16, 32 or 48) columns of one m64 accumulator (registers from ``acc_base``, column blocks from
    ``col_block0``) straight to C: one ``st.global`` of a 16-bit pair per fragment element, at row
    ``row0 + acc_row``, column ``col0 + acc_col``, clipped at M and N (N % 8 == 0: a pair is all in or all out).
    ``Cw`` is C as 32-bit words (TIRx 0.27 drops match_buffer strides from device indexing; ldc and col0 are
    even). For tiles whose width is not a multiple of 64 (one SW128 store box): the staging tile and TMA stores
    take the whole boxes, this the rest. Traced: Python loops unroll, ``T.If`` guards."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import wgmma

    for j in range(ncols // 8):
        for r in range(2):
            T.evaluate(cvt_pack(packed[0], acc[acc_base + wgmma.acc_index(col_block0 + j, r, 1)],
                                acc[acc_base + wgmma.acc_index(col_block0 + j, r, 0)]))
            grow = row0 + wgmma.acc_row(warp, lane, r)
            gcol = col0 + wgmma.acc_col(lane, j)
            with T.If(T.And(grow < M, gcol < N)):
                with T.Then():
                    T.buffer_store(Cw, packed[0], [(T.Cast("int64", grow) * T.Cast("int64", ldc) + gcol) // 2])


class ClusterGrid:
    """The persistent grid both GEMM kernels (this one and ``gemm/_pingpong.py``) launch and walk: block_m x block_n
    tiles in ``cluster_m x cluster_n`` clusters, rastered by ``core.lang.scheduler`` with ``group_m`` M-tiles per
    group, on at most ``num_sms`` CTAs. Traced: ``M`` and ``N`` are the kernel's dims."""

    SHAPES = ((1, 1), (2, 1), (1, 2), (2, 2))  # (cluster_m, cluster_n) the kernels build

    def __init__(self, block_m: int, block_n: int, group_m: int, cluster_m: int, cluster_n: int, num_sms: int):
        if (cluster_m, cluster_n) not in self.SHAPES:
            raise ValueError(f"gemm cluster: cluster_m x cluster_n = {cluster_m} x {cluster_n} is not one of "
                             f"{self.SHAPES}")
        if group_m % cluster_m:
            raise ValueError(f"gemm cluster: cluster_m={cluster_m} must divide group_m={group_m}")
        if num_sms < cluster_m * cluster_n:
            raise ValueError(f"gemm cluster: num_sms={num_sms} is fewer than the {cluster_m * cluster_n} CTAs of a "
                             "cluster")
        self.block_m, self.block_n, self.group_m = block_m, block_n, group_m
        self.cluster_m, self.cluster_n = cluster_m, cluster_n
        self.cluster_size = cluster_m * cluster_n
        self.clusters_max = num_sms // self.cluster_size

    def cluster_tiles(self, M, N):  # noqa: N803
        num_m, num_n = scheduler.num_tiles(M, N, self.block_m, self.block_n)
        return scheduler.num_cluster_tiles(num_m, num_n, self.cluster_m, self.cluster_n)

    def ctas(self, M, N):  # noqa: N803
        """The grid: every CTA of one cluster per cluster tile, at most ``num_sms // cluster_size`` clusters."""
        return scheduler.grid_size(self.cluster_tiles(M, N), self.clusters_max) * self.cluster_size

    def tile_mn(self, tile, M, N, rank):  # noqa: N803
        """``(m_tile, n_tile)`` of CTA ``rank`` of the cluster working on cluster tile ``tile``."""
        num_m, num_n = scheduler.num_tiles(M, N, self.block_m, self.block_n)
        return scheduler.cluster_tile_coords(tile, num_m, num_n, self.group_m, self.cluster_m, rank, self.cluster_n)

    def a_share(self):
        """A rows each CTA loads per stage (and multicasts to the CTAs of its M-tile)."""
        return self.block_m // self.cluster_n

    def b_share(self):
        """B rows (N-columns) each CTA loads per stage (and multicasts to the CTAs of its N-tile)."""
        return self.block_n // self.cluster_m

    def a_slice(self, rank):
        """``(part, mask)`` of CTA ``rank``'s A load: rows ``[part * a_share, ...)`` of the tile, into the CTAs of
        ``mask`` (None: the whole tile, no multicast; ``scheduler.multicast_a``)."""
        return scheduler.multicast_a(rank, self.cluster_m, self.cluster_n)

    def b_slice(self, rank):
        """:meth:`a_slice` for B: rows (N-columns) ``[part * b_share, ...)``, into the CTAs of its N-tile."""
        return scheduler.multicast_b(rank, self.cluster_m, self.cluster_n)

    def load_a(self, As, a_map, a_tile, block_k, s, k, m0, bar, rank, cache_policy=None):  # noqa: N803
        """Stage ``s``'s A tile (rows from ``m0``, K-step ``k``) into ``As``: the whole box, or this CTA's slice
        multicast to the CTAs of its M-tile. Traced: the producer thread's TMA load."""
        _load_slice(As, a_map, a_tile, block_k, s, k, m0, bar, self.a_share(), self.a_slice(rank), cache_policy)

    def load_b_kmajor(self, Bs, b_map, b_tile, block_k, s, k, n0, bar, rank, cache_policy=None):  # noqa: N803
        """:meth:`load_a` for a K-major (NT) B tile: rows from ``n0``, this CTA's slice multicast to the CTAs of its
        N-tile."""
        _load_slice(Bs, b_map, b_tile, block_k, s, k, n0, bar, self.b_share(), self.b_slice(rank), cache_policy)


def _load_slice(dst, tmap, tile_elems, block_k, s, k, row0, bar, share, part_mask, cache_policy):
    """One K-major operand tile of stage ``s`` (``tile_elems`` elements a stage, rows from ``row0``): the whole box
    when ``part_mask`` has no mask, else rows ``[part * share, part * share + share)`` multicast to the mask's CTAs
    (the box of the tensor map is ``share`` rows then)."""
    from tirx_kernels.core.lang import tma

    part, mask = part_mask
    if mask is None:
        tma.load_2d(dst.ptr_to([s * tile_elems]), tmap, k * block_k, row0, bar, cache_policy=cache_policy)
    else:
        tma.load_2d(dst.ptr_to([s * tile_elems + part * share * block_k]), tmap, k * block_k, row0 + part * share,
                    bar, multicast_mask=mask, cache_policy=cache_policy)


def _drop_params(func, names):
    """``func`` without the parameters called ``names`` (ones its body never reads): one kernel source
    serves every argument list."""
    from tvm import tirx

    keep = [p for p in func.params if p.name not in names]
    if len(keep) == len(func.params):
        return func
    return tirx.PrimFunc(keep, func.body, func.ret_type, func.attrs)


def build_persistent_kernel(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int,
                            cluster_m: int, group_m: int, num_sms: int, layout: str = "nt",
                            out_dtype: str | None = None, epilogue: str = "none", bias_dtype: str | None = None,
                            epi_cols: int | None = None, pdl: str | None = None, cluster_n: int = 1,
                            release: str = "warp", stream_k: bool = False, load_priority: str | None = None,
                            c_store: str = "tma", sync: str | None = None):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import grid_flags, mbarrier, peer, roles, tma, vector, wgmma
    from tirx_kernels.core.lang import pdl as pdl_launch

    elem = tma.elem_bytes(dtype)
    out_dtype = out_dtype or dtype
    if layout not in LAYOUTS:
        raise ValueError(f"persistent gemm: layout {layout!r} is not one of {LAYOUTS}")
    if layout == "nn" and not wgmma.can_transpose(dtype):
        raise ValueError(f"persistent gemm: an NN (MN-major B) {dtype} operand cannot be transposed")
    if out_dtype not in (dtype, "float32"):
        raise ValueError(f"persistent gemm: out_dtype {out_dtype!r} must be {dtype!r} or 'float32'")
    if epilogue not in EPILOGUES:
        raise ValueError(f"persistent gemm: epilogue {epilogue!r} is not one of {EPILOGUES}")
    if has_bias(epilogue) != (bias_dtype is not None) or bias_dtype not in (None, dtype, "float32"):
        raise ValueError(f"persistent gemm: bias_dtype {bias_dtype!r} must be {dtype!r} or 'float32' exactly "
                         f"when the epilogue adds a bias (epilogue {epilogue!r})")
    if block_m != NUM_CONSUMERS * wgmma.M or block_k * elem != 128:
        raise ValueError("persistent gemm: block_m must be 128 (2 x m64) and block_k one 128-byte SW128 row")
    if block_n % 16 or not 64 <= block_n <= 256:
        raise ValueError(f"persistent gemm: block_n={block_n} must be a multiple of 16 in [64, 256]")
    staged = staged_cols(block_n)  # through the staging tile and TMA stores
    tail_cols = block_n - staged  # stored from registers
    if tail_cols and (layout != "nt" or out_dtype != dtype or epilogue != "none"):
        raise ValueError(f"persistent gemm: block_n={block_n} (not a multiple of 64) builds only the plain NT "
                         "kernel (16-bit out, no epilogue)")
    tiles = ClusterGrid(block_m, block_n, group_m, cluster_m, cluster_n, num_sms)  # checks the cluster shape
    if stream_k and (cluster_m * cluster_n != 1 or layout != "nt" or out_dtype != dtype or epilogue != "none"):
        raise ValueError("persistent gemm: stream_k builds only the plain unclustered NT kernel (16-bit out, no "
                         f"epilogue; got cluster {cluster_m}x{cluster_n}, layout {layout!r}, out_dtype "
                         f"{out_dtype!r}, epilogue {epilogue!r})")
    if epi_cols is not None and (isinstance(epi_cols, bool) or not isinstance(epi_cols, int) or epi_cols <= 0
                                 or epi_cols % 64 or staged % epi_cols):
        raise ValueError(f"persistent gemm: epi_cols={epi_cols!r} must be a multiple of 64 (one SW128 box of "
                         f"16-bit) dividing block_n={block_n} rounded down to 64, or None (= that)")
    if c_store not in C_STORES:
        raise ValueError(f"persistent gemm: c_store {c_store!r} is not one of {C_STORES}")
    stg = c_store == "stg"
    if stg and (tail_cols or stream_k or layout != "nt" or out_dtype != dtype or epilogue != "none"):
        raise ValueError("persistent gemm: c_store='stg' builds only the plain NT kernel (16-bit out, no epilogue, "
                         f"no stream-K) of a tile of whole 64-column boxes (block_n={block_n})")
    if load_priority is not None and load_priority not in vector.L2_PRIORITIES:
        raise ValueError(f"persistent gemm: load_priority={load_priority!r} must be None or one of "
                         f"{vector.L2_PRIORITIES}")
    nbytes = smem_bytes(dtype, block_m, block_n, block_k, num_stages, epilogue, epi_cols)
    if nbytes > SMEM_LIMIT:
        raise ValueError(f"persistent gemm: {nbytes} B of smem")
    assert roles.register_split_fits(NUM_CONSUMERS)

    a_tile = block_m * block_k  # elements per stage
    b_tile = block_n * block_k
    b_share = tiles.b_share()  # B rows each CTA of the cluster loads (and multicasts)
    a_share = tiles.a_share()  # A rows each CTA of a 1 x 2 / 2 x 2 cluster loads (and multicasts)
    cluster_size = tiles.cluster_size
    stage_bytes = (a_tile + b_tile) * elem  # full boxes, also past M/N/K, all sources of the cluster
    k_steps = block_k // 16
    nacc = wgmma.acc_regs(block_n)
    store_cols = 128 // elem  # one SW128 store box: 64 rows x 128 bytes
    store_rows = wgmma.M
    # Each stage is read by both consumer warpgroups of every CTA of the cluster (multicast).
    ring = mbarrier.Ring.for_warpgroups(num_stages, NUM_CONSUMERS, release, cluster_size)
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    # NN: B's smem tile per stage is (block_n / mn_chunk) boxes of block_k K-rows x mn_chunk N-cols.
    mn_chunk = 128 // elem  # N-columns per 128-byte swizzle row
    if layout == "nn" and b_share % mn_chunk:
        raise ValueError(f"persistent gemm: NN needs block_n / cluster_m = {b_share} to be a multiple of {mn_chunk}")
    b_boxes = b_share // mn_chunk  # B boxes each CTA loads per stage (NN)
    b_major = wgmma.K_MAJOR if layout == "nt" else wgmma.MN_MAJOR
    nn_lbo, nn_sbo = (1, 64) if layout == "nt" else wgmma.desc_offsets(
        wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=128 * block_k)
    b_kstep = wgmma.k_step_bytes(b_major, wgmma.SWIZZLE_128B, dtype) // elem  # elements per k16 step

    # The staging tile: block_m x epi 16-bit elements; the plain epilogue writes each slab in `rounds`.
    epi = epi_cols or staged
    rounds = staged // epi

    # Epilogue variants. `plain` is the original bf16/fp16-out, no-epilogue path, kept statement for
    # statement (one round when epi_cols is None).
    out_elem = tma.elem_bytes(out_dtype)
    plain = epilogue == "none" and out_elem == 2
    if sync not in SYNCS or sync and (cluster_size > 1 or stream_k or not plain or tail_cols or stg or layout != "nt"):
        raise ValueError(f"persistent gemm: sync={sync!r} must be one of {SYNCS}; a hook builds only the plain "
                         "unclustered NT kernel")
    reads_c = has_alpha_beta(epilogue)
    add_bias = has_bias(epilogue)
    pass_cols = epi * 2 // out_elem  # the staging tile holds epi 16-bit columns = epi / 2 fp32 columns
    passes = block_n // pass_cols
    out_cols = 128 // out_elem  # one SW128 store box: 64 rows x 128 bytes
    out_box = store_rows * out_cols  # out elements per box
    boxes_per_pass = pass_cols // out_cols
    cs_dtype = "uint32" if out_elem == 2 else "float32"  # 4-byte words: packed 16-bit pairs, or fp32
    out_pack = None if out_elem == 4 else cvt_pack

    def store_staged_rows(Cs, packed, cs_base, row0, col0, M, N, ldc, warp, lane, Ch):  # noqa: N803
        """c_store='stg': a warpgroup's 64 x epi staged columns (16-bit pairs, SW128 boxes of 64 x 64) to C with
        per-element ``st.global.b16``, clipped at M and N, for C rows of any alignment (odd N). Warp w stores rows
        w, w + 4, ...; lane l the pair at columns 2l, 2l + 1 of a box row: one SW128 row of smem (32 banks) and
        128 contiguous bytes of C per instruction pair, where stores straight from the accumulator fragments would
        touch 8 rows (lines) each. ``Ch`` is C as 16-bit words, indexed row * ldc + col in 64 bits. Traced: Python
        loops unroll, ``T.If`` guards; the staging tile is read after the warpgroup sync that follows its writes."""
        for box in range(epi // store_cols):
            with T.If(col0 + box * store_cols < N):  # boxes wholly past N store nothing
                with T.Then():
                    for i in range(store_rows // 4):
                        row = 4 * i + warp
                        T.buffer_store(packed, Cs[(cs_base + box * store_rows * store_cols
                                                   + tma.sw128_offset(row, 2 * lane, dtype)) // 2], [0])
                        grow = row0 + row
                        gcol = col0 + box * store_cols + 2 * lane
                        off = T.Cast("int64", grow) * T.Cast("int64", ldc) + T.Cast("int64", gcol)
                        with T.If(T.And(grow < M, gcol < N)):
                            with T.Then():
                                T.buffer_store(Ch, T.Cast("uint16", packed[0] & T.uint32(0xFFFF)), [off])
                        with T.If(T.And(grow < M, gcol + 1 < N)):
                            with T.Then():
                                T.buffer_store(Ch, T.Cast("uint16", packed[0] >> T.uint32(16)), [off + 1])

    def b_shape(N, K):  # noqa: N803
        return (N, K) if layout == "nt" else (K, N)

    def word(e):  # staging word index of out element e
        return e * out_elem // 4

    def epi_value(x, cin, bias_v, alpha, beta):
        """alpha * acc + beta * C_in + bias[n] in fp32, each term only where the epilogue has it."""
        if reads_c:
            # beta == 0 never loaded C: the staging words are stale (or uninitialised) there.
            x = x * alpha + T.Select(beta != T.float32(0), cin, T.float32(0)) * beta
        if add_bias:
            x = x + bias_v
        return x

    def bias_at(Bias, n, N):  # noqa: N803
        # Columns past N (N % 8 == 0, so a pair is in or out) are clipped by the store: clamp the index.
        return T.Cast("float32", Bias[T.min(n, N - 1)])

    def c_in(Cs, idx):
        """The two fp32 values of C_in at staging element idx (even)."""
        if out_elem == 4:
            return Cs[idx], Cs[idx + 1]
        return vector.unpack2(Cs[idx // 2], out_dtype)


    def epilogue_pair(Cs, packed, acc, Bias, alpha, beta, N, n0, ebase, p, jj, r, warp, lane):  # noqa: N803
        """One (column block, row half) of the accumulator: two adjacent columns of one row, through the
        epilogue math into the SW128 staging tile (where C_in was loaded, if it was)."""
        j = p * (pass_cols // 8) + jj  # accumulator column block
        row = wgmma.acc_row(warp, lane, r)
        colp = wgmma.acc_col(lane, jj)  # column inside this pass
        box = jj * 8 // out_cols
        idx = ebase + box * out_box + tma.sw128_offset(row, colp % out_cols, out_dtype)
        cin = c_in(Cs, idx) if reads_c else (None, None)
        n = n0 + p * pass_cols + colp
        b0 = bias_at(Bias, n, N) if add_bias else None
        b1 = bias_at(Bias, n + 1, N) if add_bias else None
        v0 = epi_value(acc[wgmma.acc_index(j, r, 0)], cin[0], b0, alpha, beta)
        v1 = epi_value(acc[wgmma.acc_index(j, r, 1)], cin[1], b1, alpha, beta)
        if out_pack is None:
            T.buffer_store(Cs, v0, [idx])
            T.buffer_store(Cs, v1, [idx + 1])
        else:
            T.evaluate(out_pack(packed[0], v1, v0))
            T.buffer_store(Cs, packed[0], [idx // 2])

    # Stream-K (``stream_k``): the schedule's values, bound to locals while the kernel is parsed (``bind_stream_k``,
    # ``bind_unit``), and the work unit's (tile, K-range) in place of the plain loop's (tile, all K). Without
    # stream_k these return exactly the plain kernel's expressions (Python 0 / True where it has nothing), so
    # its generated code is unchanged.
    sk = {}
    ws_per_cta = block_m * block_n  # fp32 partial of one tile
    vec_per_thread = nacc // 4  # 16-byte vectors of one consumer thread's accumulator

    def launch_ctas(M, N, K):  # noqa: N803
        if not stream_k:
            return tiles.ctas(M, N)
        return scheduler.stream_k_grid(tiles.cluster_tiles(M, N), (K + block_k - 1) // block_k, num_sms)

    def bind_stream_k(cta, grid, total, k_tiles):
        """sk["v"] <- (data-parallel waves, stream-K steps, this CTA's first and end step)."""
        v = T.alloc_local((4,), "int32")
        T.buffer_store(v, scheduler.stream_k_dp_waves(total, grid), [0])
        T.buffer_store(v, (total - v[0] * grid) * k_tiles, [1])
        T.buffer_store(v, scheduler.stream_k_start(cta, v[1], grid), [2])
        T.buffer_store(v, scheduler.stream_k_start(cta + 1, v[1], grid), [3])
        sk["v"] = v

    def bind_unit(t, cta, grid, k_tiles):
        """sk["u"] <- (tile, first K-step, end K-step) of work unit t (nothing without stream_k)."""
        if not stream_k:
            return
        v = sk["v"]
        u = T.alloc_local((3,), "int32")
        tile, kb, ke = scheduler.stream_k_unit(t, cta, grid, v[0], v[2], v[3], k_tiles)
        T.buffer_store(u, tile, [0])
        T.buffer_store(u, kb, [1])
        T.buffer_store(u, ke, [2])
        sk["u"] = u

    def units(my_tiles, k_tiles):
        if not stream_k:
            return my_tiles
        v = sk["v"]
        return scheduler.stream_k_units(v[0], v[2], v[3], k_tiles)

    def unit_tile(t, cluster, grid):
        return cluster + t * grid if not stream_k else sk["u"][0]

    def k_begin():
        return 0 if not stream_k else sk["u"][1]

    def k_end(k_tiles):
        return k_tiles if not stream_k else sk["u"][2]

    def k_in_unit(k):
        """k counted from the unit's first K-step (the first wgmma of a unit overwrites the accumulator)."""
        return k if not stream_k else k - sk["u"][1]

    def use_count(t, k, k_tiles):
        """The ring's use count of K-step k of unit t: the CTA's K-steps before it."""
        if not stream_k:
            return t * k_tiles + k
        v = sk["v"]
        return scheduler.stream_k_use(t, k, v[0], v[2], k_tiles)

    def stores_tile():
        """Whether the unit ends with the tile's epilogue: all but a partial (a unit not starting at K-step 0)."""
        return True if not stream_k else sk["u"][1] == 0

    def ws_vector(c, cw, i, ct):
        """Element offset of consumer thread (cw, ct)'s i-th 16-byte vector in CTA c's partial."""
        return c * ws_per_cta + ((cw * vec_per_thread + i) * 128 + ct) * 4

    def tile_m0(tile, M, N, rank, m_rotate):  # noqa: N803
        """The tile's first row (M-tile rotated by ``m_rotate`` with ``sync``)."""
        if sync is None:
            return tiles.tile_mn(tile, M, N, rank)[0] * block_m
        return (tiles.tile_mn(tile, M, N, rank)[0] + m_rotate) % scheduler.ceil_div(M, block_m) * block_m

    def sync_chunk_of(row, rows, chunk):
        """The flag of A row ``row`` (``sync="wait_rows"``: shards of ``rows`` rows, chunks of ``chunk``)."""
        return row // rows * scheduler.ceil_div(rows, chunk) + row % rows // chunk

    hint = {}  # load_priority: the producer thread's L2 policy, bound while the kernel is parsed

    def bind_load_policy():
        """The producer thread's L2 policy for its A/B loads (nothing without load_priority)."""
        if load_priority is not None:
            policy = T.alloc_local((1,), "uint64")
            vector.l2_policy(policy[0], load_priority)
            hint["policy"] = policy[0]

    def load_policy():
        """The A/B loads' ``cache_policy``: the policy :func:`bind_load_policy` made, or None (no hint)."""
        return hint.get("policy")

    def b_desc0(Bs, desc_b):  # noqa: N803
        """Encode B's descriptor of stage 0, k16 step 0 into desc_b."""
        if layout == "nt":
            wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([0]))
        else:
            # MN-major SW128: LBO = the next 64-column box, SBO = the next 8 K-rows.
            wgmma.encode_desc(desc_b.ptr_to([0]), Bs.ptr_to([0]), nn_lbo, nn_sbo, wgmma.SWIZZLE_128B)

    @T.prim_func
    def fp16_bf16_gemm_persistent(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle, bias_ptr: T.handle,
                                  alpha: T.float32, beta: T.float32, ws_ptr: T.handle, flags_ptr: T.handle,
                                  sync_ptr: T.handle, sync_rows: T.int32, sync_chunk: T.int32, m_rotate: T.int32):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, b_shape(N, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, N), out_dtype, strides=(ldc, 1), align=out_elem if stg else 16)
        # Read element by element: any element-aligned bias works (a slice too).
        Bias = T.match_buffer(bias_ptr, (N,), bias_dtype or "float32", align=tma.elem_bytes(bias_dtype or "float32"))
        # Stream-K: the partials (num_sms x block_m x block_n fp32, one per CTA at most) and one flag per consumer
        # warpgroup and CTA (zero between launches). The host allocates both (fp16_bf16_gemm._run).
        ws_len = T.int32()
        n_flags = T.int32()
        WS = T.match_buffer(ws_ptr, (ws_len,), "float32", align=16)
        Flags = T.match_buffer(flags_ptr, (n_flags,), "int32", align=4)
        n_sync = T.int32()
        Sync = T.match_buffer(sync_ptr, (n_sync,), "int32", align=4)  # sync: the cross-GPU flags
        # Host: tensor maps with this call's dims (rows/cols past the edge: zero-fill on load, clip on store).
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        c_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, K, a_share, block_k, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        if layout == "nt":
            tma.encode_2d(b_map, B.data, N, K, K, b_share, block_k, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        else:
            # B (K, N): boxes of block_k K-rows x 64 N-columns (one 128-byte swizzle row each).
            tma.encode_2d(b_map, B.data, K, N, N, block_k, mn_chunk, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        if not stg:  # (a tensor map needs 16-byte row strides)
            tma.encode_2d(c_map, C.data, M, N, ldc, store_rows, out_cols, out_dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        cta = T.cta_id([launch_ctas(M, N, K)])
        rank = T.int32(0)
        if cluster_size > 1:
            rank = T.cta_id_in_cluster([cluster_size])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + block_k - 1) // block_k
        total = tiles.cluster_tiles(M, N)
        grid = launch_ctas(M, N, K) // cluster_size
        cluster = cta // cluster_size
        my_tiles = scheduler.tiles_of_cta(cluster, grid, total)
        if stream_k:
            bind_stream_k(cta, grid, total, k_tiles)

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_tile,), dtype, align=1024)
        Bs = pool.alloc((num_stages * b_tile,), dtype, align=1024)
        Cs = pool.alloc((block_m * epi * elem // 4,), cs_dtype, align=1024)  # packed pairs / fp32, SW128
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        cbar = pool.alloc((NUM_CONSUMERS if reads_c else 0,), "uint64", align=8)  # C_in loads, per warpgroup
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")
        remote = T.alloc_local((1,), "uint32")
        cursor = T.alloc_local((2,), "int32")  # the consumer's ring position (stage, phase)
        prev = T.alloc_local((1,), "int32")  # the stage of the previous use, released after the next one
        if sync == "wait_rows":
            seen = T.alloc_local((3,), "int32")  # a flag read; the tile's first and last chunk of rows
        if stream_k:
            flag = T.alloc_local((1,), "int32")  # a flag read
            part = T.alloc_local((4,), "float32")  # one 16-byte vector of a partial

        if tid == 0:
            ring.init(full, empty)
            if reads_c:
                for i in T.unroll(NUM_CONSUMERS):
                    mbarrier.init(cbar.ptr_to([i]), 1)
            mbarrier.fence_init()
        if cluster_size > 1:
            T.cuda.cluster_sync()
        else:
            T.cuda.cta_sync()
        pdl_launch.begin(pdl)  # programmatic dependent launch: no global access before the previous kernel is done

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            roles.producer_role()
            if tid == 0:
                tma.prefetch_descriptor(a_map)
                tma.prefetch_descriptor(b_map)
                if not stg:
                    tma.prefetch_descriptor(c_map)
                bind_load_policy()
                for t in range(units(my_tiles, k_tiles)):
                    bind_unit(t, cta, grid, k_tiles)
                    tile = unit_tile(t, cluster, grid)
                    m0 = tile_m0(tile, M, N, rank, m_rotate)
                    n0 = tiles.tile_mn(tile, M, N, rank)[1] * block_n
                    if sync == "wait_rows":
                        # Every chunk of A rows the tile covers has arrived (flags set after the copies).
                        # (registers: two inline divisions in one loop header fail codegen, "Let cannot bind ...")
                        seen[1] = sync_chunk_of(m0, sync_rows, sync_chunk)
                        seen[2] = sync_chunk_of(T.min(m0 + block_m, M) - 1, sync_rows, sync_chunk)
                        for chunk in range(seen[1], seen[2] + 1):
                            peer.wait_geq(Sync.ptr_to([chunk]), 1, seen)
                        peer.async_writes_to_generic()  # the generic acquire before the TMA loads of the rows
                    for k in range(k_begin(), k_end(k_tiles)):
                        it = use_count(t, k, k_tiles)  # the ring's use count: continues across tiles
                        s = ring.stage(it)
                        ring.producer_acquire(empty, it)
                        ring.producer_expect(full, it, stage_bytes)
                        tiles.load_a(As, a_map, a_tile, block_k, s, k, m0, full.ptr_to([s]), rank, load_policy())
                        if layout == "nt":
                            tiles.load_b_kmajor(Bs, b_map, b_tile, block_k, s, k, n0, full.ptr_to([s]), rank,
                                                load_policy())
                        else:
                            # NN: box c holds N-columns [64c, 64c + 64) of the tile, all block_k K-rows.
                            for c in T.unroll(b_boxes):
                                if cluster_m == 2:
                                    tma.load_2d(Bs.ptr_to([s * b_tile + (tiles.b_slice(rank)[0] * b_boxes + c)
                                                           * mn_chunk * block_k]),
                                                b_map, n0 + (tiles.b_slice(rank)[0] * b_boxes + c) * mn_chunk,
                                                k * block_k, full.ptr_to([s]), multicast_mask=tiles.b_slice(rank)[1],
                                                cache_policy=load_policy())
                                else:
                                    tma.load_2d(Bs.ptr_to([s * b_tile + c * mn_chunk * block_k]), b_map,
                                                n0 + c * mn_chunk, k * block_k, full.ptr_to([s]),
                                                cache_policy=load_policy())
        else:
            # Math warpgroups: consumer cw owns rows [64*cw, 64*cw + 64) of every tile.
            cw, ct, warp, lane = roles.consumer_role(wg, tid)
            cs_base = cw * wgmma.M * epi
            for i in T.unroll(nacc):
                acc[i] = T.float32(0)
            # Descriptors of stage 0 once; each use adds its byte offset (wgmma.desc_advance).
            wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]), As.ptr_to([cw * wgmma.M * block_k]))
            b_desc0(Bs, desc_b)
            ring.cursor_init(cursor)  # the ring position continues across tiles, like the producer's use count
            for t in range(units(my_tiles, k_tiles)):
                bind_unit(t, cta, grid, k_tiles)
                tile = unit_tile(t, cluster, grid)
                m0 = tile_m0(tile, M, N, rank, m_rotate)
                n0 = tiles.tile_mn(tile, M, N, rank)[1] * block_n
                for k in range(k_begin(), k_end(k_tiles)):
                    s = cursor[0]
                    ring.consumer_wait_at(full, cursor)
                    wgmma.fence()
                    for kk in T.unroll(k_steps):
                        # NOTES: the tile's first wgmma overwrites the accumulator (scale-d = 0): no zeroing loop
                        # between tiles.
                        wgmma.mma(block_n, acc, wgmma.desc_advance(desc_a[0], (s * a_tile + kk * 16) * elem),
                                  wgmma.desc_advance(desc_b[0], (s * b_tile + kk * b_kstep) * elem), dtype,
                                  scale_d=k_in_unit(k) + kk > 0, b_major=b_major)
                    wgmma.commit()
                    # NOTES: one group in flight; once down to one, the previous use's wgmmas have read their smem.
                    wgmma.wait(1)
                    if k_in_unit(k) > 0:
                        ring.release_slot(empty, prev[0], warp, lane, remote[0])
                    prev[0] = s
                    ring.cursor_advance(cursor)
                wgmma.wait(0)
                # Release the tile's last stage too: the producer is already filling the next tile.
                ring.release_slot(empty, prev[0], warp, lane, remote[0])
                if stream_k:
                    if k_begin() > 0:
                        # A partial (the tile's end, the first unit of this CTA's range): the accumulator to this
                        # CTA's workspace slot, in fragment order (each thread its own 16-byte vectors), then the
                        # warpgroup's flag.
                        for i in T.unroll(vec_per_thread):
                            vector.store_v4(WS.ptr_to([ws_vector(cta, cw, i, ct)]), acc, 4 * i, dtype="float32")
                        T.cuda.warpgroup_sync(1 + cw)
                        if ct == 0:
                            grid_flags.publish(Flags.ptr_to([cta * NUM_CONSUMERS + cw]))
                    elif k_end(k_tiles) < k_tiles:
                        # The tile's first K-steps and its finisher (this CTA's last unit): add the partials of
                        # the CTAs after this one that cover the rest of the tile (every one with a non-empty
                        # range up to the owner of the tile's last step).
                        sk_tile = tile - sk["v"][0] * grid
                        for c2 in range(cta + 1, scheduler.stream_k_owner((sk_tile + 1) * k_tiles - 1,
                                                                           sk["v"][1], grid) + 1):
                            if scheduler.stream_k_start(c2 + 1, sk["v"][1], grid) > scheduler.stream_k_start(
                                    c2, sk["v"][1], grid):
                                if ct == 0:
                                    grid_flags.wait_for(Flags.ptr_to([c2 * NUM_CONSUMERS + cw]), 1, flag)
                                    grid_flags.reset(Flags.ptr_to([c2 * NUM_CONSUMERS + cw]))
                                T.cuda.warpgroup_sync(1 + cw)
                                for i in T.unroll(vec_per_thread):
                                    vector.load_v4(part, 0, WS.ptr_to([ws_vector(c2, cw, i, ct)]), cache="cg",
                                                   dtype="float32")
                                    for e in T.unroll(4):
                                        acc[4 * i + e] = acc[4 * i + e] + part[e]
                if stores_tile():
                    if plain:
                        # Epilogue: this warpgroup's 64 x block_n slab as block_n/64 SW128 boxes of 64 x 64, in
                        # `rounds` of epi columns (epi/64 boxes) through the staging tile. The staging tile is
                        # free once the previous stores (previous tile or round) have read it.
                        for q in T.unroll(rounds):
                            if ct == 0:
                                tma.store_wait_read(0)
                            T.cuda.warpgroup_sync(1 + cw)
                            for j in T.unroll(epi // 8):
                                for r in T.unroll(2):
                                    # Accumulator column block q * epi / 8 + j (inlined: a script assignment
                                    # would make it a local variable, and the register index dynamic).
                                    T.evaluate(cvt_pack(packed[0], acc[wgmma.acc_index(q * (epi // 8) + j, r, 1)],
                                                        acc[wgmma.acc_index(q * (epi // 8) + j, r, 0)]))
                                    row = wgmma.acc_row(warp, lane, r)
                                    col = wgmma.acc_col(lane, j)  # column inside this round
                                    box = j * 8 // store_cols
                                    Cs[(cs_base + box * store_rows * store_cols
                                        + tma.sw128_offset(row, col % store_cols, dtype)) // 2] = packed[0]
                            tma.fence_proxy_async()
                            T.cuda.warpgroup_sync(1 + cw)
                            row0 = m0 + cw * wgmma.M
                            if stg:
                                Ch = T.decl_buffer((M * ldc,), "uint16", data=C.data)
                                store_staged_rows(Cs, packed, cs_base, row0, n0 + q * epi, M, N, ldc, warp, lane, Ch)
                            elif ct == 0 and row0 < M:
                                for box in range(epi // store_cols):
                                    # Boxes wholly past N are skipped rather than relying on a fully clipped store.
                                    if n0 + q * epi + box * store_cols < N:
                                        tma.store_2d(c_map, n0 + q * epi + box * store_cols, row0,
                                                     Cs.ptr_to([(cs_base + box * store_rows * store_cols) // 2]))
                                tma.store_commit()
                        if sync == "publish_tiles":
                            # The tile's stores written (not only read), then its flag (one per warpgroup).
                            if ct == 0:
                                tma.store_wait(0)
                                peer.async_writes_to_generic()
                                peer.signal_add(Sync.ptr_to([(m0 // block_m) * scheduler.ceil_div(N, block_n)
                                                             + n0 // block_n]))
                        if tail_cols > 0:
                            # The last tail_cols columns (block_n % 64 = 16, 32 or 48): pairs straight from the
                            # registers. Only built for such tiles: no C word view otherwise.
                            Cw = T.decl_buffer((M * ldc // 2,), "uint32", data=C.data)
                            store_tail_from_registers(Cw, packed, acc, 0, staged // 8, tail_cols, m0 + cw * wgmma.M,
                                                      n0 + staged, M, N, ldc, warp, lane, cvt_pack)
                    else:
                        # General epilogue: `passes` rounds of pass_cols columns (block_n / epi, twice that for
                        # fp32 out), each
                        # [load C_in into the staging tile] -> alpha/beta/bias in fp32 -> staging -> TMA store.
                        grow0 = m0 + cw * wgmma.M
                        ebase = cw * wgmma.M * pass_cols  # this warpgroup's staging slab, in out elements
                        for p in T.unroll(passes):
                            # The staging tile is free once the previous stores (previous tile or pass) read it.
                            if ct == 0:
                                tma.store_wait_read(0)
                            T.cuda.warpgroup_sync(1 + cw)
                            if reads_c:
                                if beta != T.float32(0):
                                    # C_in: the same boxes the store writes, TMA-loaded into the staging tile.
                                    if ct == 0:
                                        mbarrier.arrive_expect_tx(cbar.ptr_to([cw]),
                                                              boxes_per_pass * out_box * out_elem)
                                        for box in T.unroll(boxes_per_pass):
                                            tma.load_2d(Cs.ptr_to([word(ebase + box * out_box)]), c_map,
                                                        n0 + p * pass_cols + box * out_cols, grow0, cbar.ptr_to([cw]))
                                    mbarrier.wait(cbar.ptr_to([cw]), (t * passes + p) % 2)
                            for jj in T.unroll(pass_cols // 8):
                                for r in T.unroll(2):
                                    epilogue_pair(Cs, packed, acc, Bias, alpha, beta, N, n0, ebase, p, jj, r,
                                                  warp, lane)
                            tma.fence_proxy_async()
                            T.cuda.warpgroup_sync(1 + cw)
                            if ct == 0 and grow0 < M:
                                for box in range(boxes_per_pass):
                                    if n0 + p * pass_cols + box * out_cols < N:
                                        tma.store_2d(c_map, n0 + p * pass_cols + box * out_cols, grow0,
                                                     Cs.ptr_to([word(ebase + box * out_box)]))
                                tma.store_commit()

            if ct == 0:
                tma.store_wait(0)
        if cluster_size > 1:
            # No CTA may exit while a peer still multicasts into its smem or arrives on its barriers.
            T.cuda.cluster_sync()
        pdl_launch.end(pdl)

    unused = ((() if add_bias else ("bias_ptr", "Bias")) + (() if reads_c else ("alpha", "beta"))
              + (() if stream_k else ("ws_ptr", "WS", "flags_ptr", "Flags"))
              + (("sync_ptr", "Sync", "m_rotate") if sync is None else ())
              + (() if sync == "wait_rows" else ("sync_rows", "sync_chunk")))
    return pdl_launch.launch(_drop_params(fp16_bf16_gemm_persistent, unused), pdl, cluster=cluster_size > 1)
