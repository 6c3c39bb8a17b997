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
- Epilogue: fp32 -> 16-bit pairs into a SW128 staging tile, TMA store of 64 x 64 boxes, committed but
  not waited for: the next tile's mainloop overlaps the store; only before rewriting the staging tile
  does the storing thread wait for the previous stores to have *read* it (``wait_group.read``).
- ``cluster_m = 2``: the two CTAs of a cluster take M-tiles (2i, 2i+1) of one N-tile; each loads half of
  the B tile and multicasts it into both. When the number of M-tiles is odd, the last cluster's second
  CTA lies past M: it still loads (zero-filled) A, multicasts its B half and joins every barrier, but
  stores nothing.
- Every shared buffer, barriers included, in one ``T.SMEMPool`` (1024-aligned only then).
"""

from __future__ import annotations

SMEM_LIMIT = 232448  # 227 KB: the H200's opt-in maximum dynamic shared memory per block
NUM_CONSUMERS = 2


def smem_bytes(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int) -> int:
    """Bytes of the pool: the A/B ring, the C staging tile, the 2 x num_stages barriers."""
    elem = 2
    return num_stages * (block_m + block_n) * block_k * elem + block_m * block_n * elem + 2 * num_stages * 8


def build_persistent_kernel(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int,
                            cluster_m: int, group_m: int, num_sms: int):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, roles, scheduler, tma, wgmma

    elem = tma.elem_bytes(dtype)
    if block_m != NUM_CONSUMERS * wgmma.M or block_k * elem != 128:
        raise ValueError("persistent gemm: block_m must be 128 (2 x m64) and block_k one 128-byte SW128 row")
    if block_n % 64 or not 64 <= block_n <= 256:
        raise ValueError(f"persistent gemm: block_n={block_n} must be a multiple of 64 in [64, 256]")
    if cluster_m not in (1, 2) or group_m % cluster_m or num_sms < cluster_m:
        raise ValueError(f"persistent gemm: cluster_m={cluster_m} (1 or 2) must divide group_m={group_m}")
    if smem_bytes(dtype, block_m, block_n, block_k, num_stages) > SMEM_LIMIT:
        raise ValueError(f"persistent gemm: {smem_bytes(dtype, block_m, block_n, block_k, num_stages)} B of smem")
    assert roles.register_split_fits(NUM_CONSUMERS)

    a_tile = block_m * block_k  # elements per stage
    b_tile = block_n * block_k
    b_share = block_n // cluster_m  # B rows each CTA of the cluster loads (and multicasts)
    stage_bytes = (a_tile + b_tile) * elem  # full boxes, also past M/N/K, all sources of the cluster
    k_steps = block_k // 16
    nacc = wgmma.acc_regs(block_n)
    store_cols = 128 // elem  # one SW128 store box: 64 rows x 128 bytes
    store_rows = wgmma.M
    # Each stage is read by the 8 consumer warps of every CTA of the cluster (B multicast).
    empty_arrivals = NUM_CONSUMERS * 4 * cluster_m
    clusters_max = num_sms // cluster_m
    ring = mbarrier.Ring(num_stages, empty_arrivals)
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    def cluster_tiles(M, N):  # noqa: N803 (M, N are the kernel's dims)
        num_m, num_n = scheduler.num_tiles(M, N, block_m, block_n)
        return scheduler.ceil_div(num_m, cluster_m) * num_n

    def grid_ctas(M, N):  # noqa: N803
        return scheduler.grid_size(cluster_tiles(M, N), clusters_max) * cluster_m

    def tile_m(tile, M, N, rank):  # noqa: N803
        num_m, num_n = scheduler.num_tiles(M, N, block_m, block_n)
        return scheduler.cluster_tile_coords(tile, num_m, num_n, group_m, cluster_m, rank)[0]

    def tile_n(tile, M, N):  # noqa: N803
        num_m, num_n = scheduler.num_tiles(M, N, block_m, block_n)
        return scheduler.cluster_tile_coords(tile, num_m, num_n, group_m, cluster_m, 0)[1]

    @T.prim_func
    def fp16_bf16_gemm_persistent(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
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
        tma.encode_2d(a_map, A.data, M, K, K, block_m, block_k, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(b_map, B.data, N, K, K, b_share, block_k, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(c_map, C.data, M, N, ldc, store_rows, store_cols, dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        cta = T.cta_id([grid_ctas(M, N)])
        rank = T.int32(0)
        if cluster_m == 2:
            rank = T.cta_id_in_cluster([2])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + block_k - 1) // block_k
        total = cluster_tiles(M, N)
        grid = grid_ctas(M, N) // cluster_m
        cluster = cta // cluster_m
        my_tiles = scheduler.tiles_of_cta(cluster, grid, total)

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_tile,), dtype, align=1024)
        Bs = pool.alloc((num_stages * b_tile,), dtype, align=1024)
        Cs = pool.alloc((block_m * block_n * elem // 4,), "uint32", align=1024)  # packed pairs, SW128
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")
        remote = T.alloc_local((1,), "uint32")

        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        if cluster_m == 2:
            T.cuda.cluster_sync()
        else:
            T.cuda.cta_sync()

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            roles.producer_role()
            if tid == 0:
                for t in range(my_tiles):
                    tile = cluster + t * grid
                    m0 = tile_m(tile, M, N, rank) * block_m
                    n0 = tile_n(tile, M, N) * block_n
                    for k in range(k_tiles):
                        it = t * k_tiles + k  # the ring's use count: continues across tiles
                        s = ring.stage(it)
                        ring.producer_acquire(empty, it)
                        ring.producer_expect(full, it, stage_bytes)
                        tma.load_2d(As.ptr_to([s * a_tile]), a_map, k * block_k, m0, full.ptr_to([s]))
                        if cluster_m == 2:
                            tma.load_2d(Bs.ptr_to([s * b_tile + rank * b_share * block_k]), b_map, k * block_k,
                                        n0 + rank * b_share, full.ptr_to([s]), multicast_mask=3)
                        else:
                            tma.load_2d(Bs.ptr_to([s * b_tile]), b_map, k * block_k, n0, full.ptr_to([s]))
        else:
            # Math warpgroups: consumer cw owns rows [64*cw, 64*cw + 64) of every tile.
            cw, ct, warp, lane = roles.consumer_role(wg, tid)
            cs_base = cw * wgmma.M * block_n
            for i in T.unroll(nacc):
                acc[i] = T.float32(0)
            for t in range(my_tiles):
                tile = cluster + t * grid
                m0 = tile_m(tile, M, N, rank) * block_m
                n0 = tile_n(tile, M, N) * block_n
                for k in range(k_tiles):
                    it = t * k_tiles + k
                    s = ring.stage(it)
                    ring.consumer_wait(full, it)
                    wgmma.fence()
                    for kk in T.unroll(k_steps):
                        wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]),
                                                       As.ptr_to([s * a_tile + cw * wgmma.M * block_k + kk * 16]))
                        wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([s * b_tile + kk * 16]))
                        # NOTES: the tile's first wgmma overwrites the accumulator (scale-d = 0): no zeroing
                        # loop between tiles.
                        wgmma.mma(block_n, acc, desc_a[0], desc_b[0], dtype, scale_d=k + kk > 0)
                    wgmma.commit()
                    # NOTES: one group in flight; once down to one, use it-1's wgmmas have read their smem.
                    wgmma.wait(1)
                    if k > 0 and lane == 0:
                        ring.consumer_release(empty, it - 1, cluster_m, remote[0])
                wgmma.wait(0)
                # Release the tile's last stage too: the producer is already filling the next tile.
                if lane == 0:
                    ring.consumer_release(empty, t * k_tiles + k_tiles - 1, cluster_m, remote[0])

                # Epilogue: this warpgroup's 64 x block_n slab as block_n/64 SW128 boxes of 64 x 64.
                # The staging tile is free once the previous tile's stores have read it.
                if ct == 0:
                    tma.store_wait_read(0)
                T.cuda.warpgroup_sync(1 + cw)
                for j in T.unroll(block_n // 8):
                    for r in T.unroll(2):
                        T.evaluate(cvt_pack(packed[0], acc[wgmma.acc_index(j, r, 1)],
                                            acc[wgmma.acc_index(j, r, 0)]))
                        row = wgmma.acc_row(warp, lane, r)
                        col = wgmma.acc_col(lane, j)
                        box = j * 8 // store_cols
                        Cs[(cs_base + box * store_rows * store_cols
                            + tma.sw128_offset(row, col % store_cols, dtype)) // 2] = packed[0]
                tma.fence_proxy_async()
                T.cuda.warpgroup_sync(1 + cw)
                row0 = m0 + cw * wgmma.M
                if ct == 0 and row0 < M:
                    for box in range(block_n // store_cols):
                        # Boxes wholly past N are skipped rather than relying on a fully clipped store.
                        if n0 + box * store_cols < N:
                            tma.store_2d(c_map, n0 + box * store_cols, row0,
                                         Cs.ptr_to([(cs_base + box * store_rows * store_cols) // 2]))
                    tma.store_commit()
            if ct == 0:
                tma.store_wait(0)
        if cluster_m == 2:
            # No CTA may exit while its peer still multicasts into its smem or arrives on its barriers.
            T.cuda.cluster_sync()

    return fp16_bf16_gemm_persistent
