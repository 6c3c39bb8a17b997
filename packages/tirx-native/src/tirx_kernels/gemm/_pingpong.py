# SPDX-License-Identifier: Apache-2.0
"""Ping-pong persistent warp-specialized C = A·Bᵀ (bf16/fp16) for ``fp16_bf16_gemm``: same calling convention
as the other kernels (``fn(a, b, c)``, A (M, K), B (N, K), C (M, N) with row stride ``ldc``; M, N, K dynamic;
ragged edges through TMA zero-fill on loads and clipping on stores). Plain path only: NT, output in the input
dtype, no epilogue (the variants live in ``gemm/_persistent.py``).

Why: in the cooperative persistent kernel both math warpgroups split every tile by rows, so both sit in the
epilogue at the same time and the tensor cores idle there (the TMA stores overlap the next mainloop, but the
fp32 -> 16-bit conversion and staging writes do not). Ping-pong (CUTLASS's
``KernelTmaWarpSpecializedPingpong``, QuACK's Hopper default) gives each math warpgroup whole tiles,
alternately: while one converts and stores its tile, the other runs the next tile's mainloop, so the tensor
cores stay busy across tile boundaries.

Design:
- Grid and raster as the persistent kernel: ``min(num_tiles, num_sms)`` CTAs, CTA ``c`` walks tiles
  ``c, c + grid, ...`` in the grouped raster of ``core.lang.scheduler``. Its local tile ``t`` belongs to math
  warpgroup ``t % 2``.
- 384 threads: warpgroup 0 the TMA producer (one thread issues every load of the CTA's tiles in order),
  warpgroups 1-2 the consumers, with ``roles``' default split ``setmaxnreg`` 40 / 232 (40 + 2 x 232 = 3 x 168,
  the CTA's launch allocation: ``setmaxnreg.inc`` only takes what ``dec`` released, so 32 / 240 would hang;
  24 / 240 fits too but the 2-CTA producer spills at 24: it uses ~35). A consumer owns the whole
  128 x block_n tile as two m64 accumulators (rows 0-63 and 64-127), 2 x block_n / 2 fp32 registers:
  block_n <= 192 (192 accumulator registers of the 232; ptxas: 0 spills, highest register R216 at 128x192).
- One ``num_stages`` full/empty ring in the producer's global order (use count ``t * k_tiles + k``); each
  use is read by one consumer warpgroup only, so the empty barrier counts its 4 warps. A consumer waits only
  on its own tiles' uses and skips the other's entirely.
- Turn-taking (``roles.wait_turn`` / ``roles.pass_turn``, named barriers 3 and 4): a consumer starts its
  tile's mainloop only after the other consumer has *issued* the previous tile's mainloop (passed all its
  full waits). This is needed for correctness, not only for the alternation: an mbarrier parity wait
  tells apart only two consecutive phases. A consumer waiting for use ``it`` on stage ``s`` must know that
  the phase of use ``it - num_stages`` (of the other consumer's tile, in general) has completed; otherwise
  a phase count that lags by one has the awaited parity and the wait passes on stale data. Example: a fresh
  barrier (0 phases completed) passes a wait for parity 1 at once, so without the turn consumer 1 would read
  tile 1's first stage, use ``k_tiles`` with ``(k_tiles // num_stages)`` odd, before it was ever loaded
  (``tests/test_gemm_pingpong.py`` simulates both). With the turn, every use before the tile's first has
  had its full phase observed (by induction over the tiles), and the phase cannot run ahead either: use
  ``it + num_stages`` reloads the stage only after this consumer released use ``it``. The producer side
  needs nothing new: it alone acquires the empty barriers, in order, as in the cooperative kernel.
- Epilogue: each consumer has its own SW128 staging buffer of 128 rows x ``epi_cols`` 16-bit columns
  (64 x 64 boxes), so one consumer's epilogue never waits for the other's stores. ``block_n / epi_cols``
  rounds (``block_n`` rounded down to 64: a 176-column tile's last 48 columns go straight from the registers,
  ``_persistent.store_tail_from_registers``): the storing thread waits until its previous stores have *read*
  the buffer (bulk groups are per thread: ``wait_group.read`` sees only this warpgroup's stores), a warpgroup
  barrier (ids 1 + consumer),
  fp32 -> 16-bit pairs into the buffer, ``fence.proxy.async``, the barrier again, then the storing thread
  TMA-stores the boxes (skipping boxes wholly past N or rows past M) and commits without waiting.
- ``cluster_m = 2`` (as in the persistent kernel): the two CTAs of a cluster take M-tiles (2i, 2i+1) of one
  N-tile, each loads half of the B tile and multicasts it into both, each consumer releases a use in both
  CTAs (empty barrier: 8 arrivals). Both CTAs walk the same cluster-tile sequence, so local tile t is consumer
  t % 2's in both. The turns stay CTA-local: the parity argument is about the CTA's own full barriers, and a
  stage is reloaded (in either CTA) only after both CTAs' consumers released its previous use. An odd number
  of M-tiles leaves the last cluster's second CTA past M: it loads, multicasts and joins every barrier, and
  stores nothing. A final cluster barrier keeps either CTA alive while its peer may still write into it.
- ``cluster_n = 2`` (``cluster_m = 1``): the 1 x 2 transpose: N-tiles (2j, 2j+1) of one M-tile, each CTA
  loading half of the A tile's rows and multicasting them; a CTA past N stores nothing.
- ``cluster_m = cluster_n = 2``: a 2 x 2 block of tiles, each CTA loading half of its A tile and half of its B tile
  into the two CTAs that share each (as in ``gemm/_persistent.py``); each consumer releases a use in all four CTAs.
- ``release``: ``"warp"`` (lane 0 of each consumer warp arrives, in every CTA) or ``"warpgroup"`` (one arrival per
  consumer warpgroup and CTA: lane 0 of warp r arrives in CTA r), as in ``gemm/_persistent.py``.
- The lean consumer loop of ``gemm/_persistent.py`` (descriptors advanced from stage 0's, a ring cursor, tensor-map
  prefetch); each consumer seeks its cursor once per tile, as its uses skip the other consumer's tiles.
- Every shared buffer, barriers included, in one ``T.SMEMPool`` (1024-aligned only then).

Measured on the H200: ``docs/gemm.md`` (section 5' and the step table).
"""

from __future__ import annotations

from tirx_kernels.gemm._persistent import SMEM_LIMIT, ClusterGrid, staged_cols, store_tail_from_registers

NUM_CONSUMERS = 2
EPI_BAR = 1  # named barriers 1, 2: consumer w's epilogue (its 128 threads)
TURN_BAR = 3  # named barriers 3, 4: consumer w's turn to run a mainloop


def smem_bytes(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int, epi_cols: int) -> int:
    """Bytes of the pool: the A/B ring, one 128 x epi_cols 16-bit staging buffer per consumer, the ring's
    2 x num_stages barriers."""
    elem = 2
    return (num_stages * (block_m + block_n) * block_k * elem + NUM_CONSUMERS * block_m * epi_cols * elem
            + 2 * num_stages * 8)


def staging_offset(h, jj, r, warp, lane, epi_cols: int, dtype: str):
    """16-bit element offset, inside a consumer's staging buffer, of the even element of the pair that
    ``lane`` of ``warp`` holds at row half ``r`` of column block ``jj`` (of the round) of the accumulator of
    rows ``64 h ..``: box ``h * (epi_cols / 64) + column / 64`` of 64 x 64, 128B-swizzled inside. Python ints
    (tests) and TIR expressions (the kernel) alike."""
    from tirx_kernels.core.lang import tma, wgmma

    store_cols = 128 // tma.elem_bytes(dtype)
    row = wgmma.acc_row(warp, lane, r)
    col = wgmma.acc_col(lane, jj)
    box = h * (epi_cols // store_cols) + jj * 8 // store_cols
    return box * wgmma.M * store_cols + tma.sw128_offset(row, col % store_cols, dtype)


def store_box(h, b, epi_cols: int, dtype: str):
    """``(row offset in the tile, column offset in the round, staging element offset)`` of store box ``b``
    of the row half ``h``: the box :func:`staging_offset` fills."""
    from tirx_kernels.core.lang import tma, wgmma

    store_cols = 128 // tma.elem_bytes(dtype)
    return h * wgmma.M, b * store_cols, (h * (epi_cols // store_cols) + b) * wgmma.M * store_cols


def build_pingpong_kernel(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int, epi_cols: int,
                          group_m: int, num_sms: int, cluster_m: int = 1, cluster_n: int = 1,
                          release: str = "warp", layout: str = "nt",
                          out_dtype: str | None = None, epilogue: str = "none", bias_dtype: str | None = None,
                          pdl: str | None = None):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, roles, scheduler, tma, wgmma
    from tirx_kernels.core.lang import pdl as pdl_launch

    elem = tma.elem_bytes(dtype)
    if layout != "nt":
        raise ValueError(f"pingpong gemm: layout {layout!r} is not supported (only 'nt')")
    if (out_dtype or dtype) != dtype:
        raise ValueError(f"pingpong gemm: out_dtype {out_dtype!r} is not supported (only {dtype!r})")
    if epilogue != "none" or bias_dtype is not None:
        raise ValueError(f"pingpong gemm: epilogue {epilogue!r} / bias_dtype {bias_dtype!r} is not supported "
                         "(only 'none')")
    tiles = ClusterGrid(block_m, block_n, group_m, cluster_m, cluster_n, num_sms)  # checks the cluster shape
    if block_m != NUM_CONSUMERS * wgmma.M or block_k * elem != 128:
        raise ValueError("pingpong gemm: block_m must be 128 (2 x m64) and block_k one 128-byte SW128 row")
    # Two m64 accumulators of block_n / 2 registers each must leave room in the consumer's 232.
    if block_n % 16 or not 64 <= block_n <= 192:
        raise ValueError(f"pingpong gemm: block_n={block_n} must be a multiple of 16 in [64, 192] "
                         f"({2 * wgmma.acc_regs(block_n)} accumulator registers of {roles.CONSUMER_REGS})")
    store_cols = 128 // elem  # one SW128 store box: 64 rows x 128 bytes
    staged = staged_cols(block_n)  # through the staging buffer and TMA stores
    tail_cols = block_n - staged  # stored from registers (block_n % 64: 16, 32 or 48)
    if epi_cols <= 0 or epi_cols % store_cols or staged % epi_cols:
        raise ValueError(f"pingpong gemm: epi_cols={epi_cols} must be a multiple of {store_cols} dividing "
                         f"block_n={block_n} rounded down to {store_cols}")
    if group_m < 1 or num_sms < 1:
        raise ValueError(f"pingpong gemm: group_m={group_m} and num_sms={num_sms} must be >= 1")
    nbytes = smem_bytes(dtype, block_m, block_n, block_k, num_stages, epi_cols)
    if nbytes > SMEM_LIMIT:
        raise ValueError(f"pingpong gemm: {nbytes} B of smem > {SMEM_LIMIT}")
    assert roles.register_split_fits(NUM_CONSUMERS)

    a_tile = block_m * block_k  # elements per stage
    b_tile = block_n * block_k
    b_share = tiles.b_share()  # B rows each CTA of the cluster loads (and multicasts)
    a_share = tiles.a_share()  # A rows each CTA of a 1 x 2 / 2 x 2 cluster loads (and multicasts)
    cluster_size = tiles.cluster_size
    stage_bytes = (a_tile + b_tile) * elem  # full boxes, also past M/N/K, all sources of the cluster
    k_steps = block_k // 16
    nacc = wgmma.acc_regs(block_n)  # per m64 half
    store_rows = wgmma.M
    boxes_per_half = epi_cols // store_cols  # store boxes per 64-row half and round
    rounds = staged // epi_cols
    stage_elems = block_m * epi_cols  # one consumer's staging buffer, 16-bit elements
    # Each use is read by one consumer warpgroup (whole tiles), in every CTA of the cluster (multicast).
    ring = mbarrier.Ring.for_warpgroups(num_stages, 1, release, cluster_size)
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    def stage_pair(Cs, packed, acc, cs_base, h, rnd, jj, r, warp, lane):  # noqa: N803
        """Two adjacent columns of one accumulator row, packed to 16-bit, into the staging buffer."""
        j = rnd * (epi_cols // 8) + jj  # accumulator column block
        base = h * nacc  # this row half's accumulator
        T.evaluate(cvt_pack(packed[0], acc[base + wgmma.acc_index(j, r, 1)], acc[base + wgmma.acc_index(j, r, 0)]))
        T.buffer_store(Cs, packed[0], [(cs_base + staging_offset(h, jj, r, warp, lane, epi_cols, dtype)) // 2])

    def store_round(Cs, c_map, cs_base, m0, n0, rnd, M, N):  # noqa: N803
        """The storing thread's TMA stores of one round: 2 row halves x boxes_per_half boxes of 64 x 64; boxes
        wholly past M or N are skipped rather than relying on a fully clipped store."""
        for h in range(2):
            for b in range(boxes_per_half):
                row_off, col_off, off = store_box(h, b, epi_cols, dtype)
                col0 = n0 + rnd * epi_cols + col_off
                with T.If(T.And(m0 + row_off < M, col0 < N)):
                    with T.Then():
                        tma.store_2d(c_map, col0, m0 + row_off, Cs.ptr_to([(cs_base + off) // 2]))

    @T.prim_func
    def fp16_bf16_gemm_pingpong(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, (N, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, N), dtype, strides=(ldc, 1), align=16)
        # Host: tensor maps with this call's dims (rows/cols past the edge: zero-fill on load, clip on store).
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        c_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, K, a_share, block_k, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(b_map, B.data, N, K, K, b_share, block_k, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(c_map, C.data, M, N, ldc, store_rows, store_cols, dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        cta = T.cta_id([tiles.ctas(M, N)])
        rank = T.int32(0)
        if cluster_size > 1:
            rank = T.cta_id_in_cluster([cluster_size])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + block_k - 1) // block_k
        total = tiles.cluster_tiles(M, N)
        grid = tiles.ctas(M, N) // cluster_size
        cluster = cta // cluster_size
        my_tiles = scheduler.tiles_of_cta(cluster, grid, total)

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_tile,), dtype, align=1024)
        Bs = pool.alloc((num_stages * b_tile,), dtype, align=1024)
        Cs = pool.alloc((NUM_CONSUMERS * stage_elems // 2,), "uint32", align=1024)  # packed pairs, SW128
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((2 * nacc,), "float32")  # rows 0-63, then rows 64-127
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")
        remote = T.alloc_local((1,), "uint32")
        cursor = T.alloc_local((2,), "int32")  # the consumer's ring position (stage, phase)
        prev = T.alloc_local((1,), "int32")  # the stage of the previous use, released after the next one

        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        if cluster_size > 1:
            T.cuda.cluster_sync()
        else:
            T.cuda.cta_sync()
        pdl_launch.begin(pdl)  # programmatic dependent launch: no global access before the previous kernel is done

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers. Loads every tile of the CTA in order,
            # whichever consumer will read it.
            roles.producer_role()
            if tid == 0:
                tma.prefetch_descriptor(a_map)
                tma.prefetch_descriptor(b_map)
                tma.prefetch_descriptor(c_map)
                for t in range(my_tiles):
                    m_tile, n_tile = tiles.tile_mn(cluster + t * grid, M, N, rank)
                    for k in range(k_tiles):
                        it = t * k_tiles + k  # the ring's use count: continues across tiles
                        s = ring.stage(it)
                        ring.producer_acquire(empty, it)
                        ring.producer_expect(full, it, stage_bytes)
                        # Each CTA of a cluster loads its slice of the A (B) tile into the CTAs of its M-tile (N-tile).
                        tiles.load_a(As, a_map, a_tile, block_k, s, k, m_tile * block_m, full.ptr_to([s]), rank)
                        tiles.load_b_kmajor(Bs, b_map, b_tile, block_k, s, k, n_tile * block_n, full.ptr_to([s]), rank)
        else:
            # Math warpgroups: consumer cw takes the CTA's local tiles cw, cw + 2, ..., each whole.
            cw, ct, warp, lane = roles.consumer_role(wg, tid)
            cs_base = cw * stage_elems
            # Descriptors of stage 0 once; each use adds its byte offset (wgmma.desc_advance).
            wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]), As.ptr_to([0]))
            wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([0]))
            for i in range((my_tiles - cw + 1) // 2):
                t = 2 * i + cw
                m_tile, n_tile = tiles.tile_mn(cluster + t * grid, M, N, rank)
                m0 = m_tile * block_m
                n0 = n_tile * block_n
                # NOTES: the turn makes the ring's parity waits sound (module docstring); consumer 0's first
                # tile has no predecessor, so it starts without a turn.
                if t > 0:
                    roles.wait_turn(TURN_BAR, cw)
                # This consumer's uses of the ring skip the other's tiles: seek once per tile, then step.
                ring.cursor_seek(cursor, t * k_tiles)
                for k in range(k_tiles):
                    s = cursor[0]
                    ring.consumer_wait_at(full, cursor)
                    wgmma.fence()
                    for kk in T.unroll(k_steps):
                        for h in T.unroll(2):
                            # The tile's first wgmma overwrites the accumulator (scale-d = 0): no zeroing loop.
                            a_off = (s * a_tile + h * wgmma.M * block_k + kk * 16) * elem
                            wgmma.mma(block_n, acc, wgmma.desc_advance(desc_a[0], a_off),
                                      wgmma.desc_advance(desc_b[0], (s * b_tile + kk * 16) * elem), dtype,
                                      scale_d=k + kk > 0, acc_offset=h * nacc)
                    wgmma.commit()
                    # NOTES: one group in flight; once down to one, the previous use's wgmmas have read their smem.
                    wgmma.wait(1)
                    if k > 0:
                        ring.release_slot(empty, prev[0], warp, lane, remote[0])
                    prev[0] = s
                    ring.cursor_advance(cursor)
                # Every full wait of this tile has passed: the other consumer may start the next tile while
                # this one's last wgmmas run and its epilogue follows. The CTA's last tile passes no turn
                # (nobody would wait for it).
                if t + 1 < my_tiles:
                    roles.pass_turn(TURN_BAR, cw)
                wgmma.wait(0)
                ring.release_slot(empty, prev[0], warp, lane, remote[0])

                # Epilogue: `rounds` rounds of epi_cols columns through this consumer's own staging buffer,
                # as 2 (row halves) x boxes_per_half SW128 boxes of 64 x 64.
                for rnd in T.unroll(rounds):
                    # The buffer is free once this warpgroup's previous stores have read it.
                    if ct == 0:
                        tma.store_wait_read(0)
                    T.cuda.warpgroup_sync(EPI_BAR + cw)
                    for h in T.unroll(2):
                        for jj in T.unroll(epi_cols // 8):
                            for r in T.unroll(2):
                                stage_pair(Cs, packed, acc, cs_base, h, rnd, jj, r, warp, lane)
                    tma.fence_proxy_async()
                    T.cuda.warpgroup_sync(EPI_BAR + cw)
                    if ct == 0:
                        store_round(Cs, c_map, cs_base, m0, n0, rnd, M, N)
                        tma.store_commit()
                if tail_cols > 0:
                    # The last tail_cols columns of both row halves: pairs straight from the registers. Only
                    # built for such tiles: no C word view otherwise.
                    Cw = T.decl_buffer((M * ldc // 2,), "uint32", data=C.data)
                    for h in range(2):
                        store_tail_from_registers(Cw, packed, acc, h * nacc, staged // 8, tail_cols,
                                                  m0 + h * wgmma.M, n0 + staged, M, N, ldc, warp, lane, cvt_pack)
            if ct == 0:
                tma.store_wait(0)
        if cluster_size > 1:
            # No CTA may exit while a peer still multicasts into its smem or arrives on its barriers.
            T.cuda.cluster_sync()
        pdl_launch.end(pdl)

    return pdl_launch.launch(fp16_bf16_gemm_pingpong, pdl, cluster=cluster_size > 1)
