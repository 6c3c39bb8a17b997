# SPDX-License-Identifier: Apache-2.0
"""Small-M (memory-bound) C = A·Bᵀ (bf16/fp16) for ``fp16_bf16_gemm``: split-K over a thread-block cluster,
reduced through distributed shared memory. Same calling convention as the other kernels (``fn(a, b, c)``,
A (M, K), B (N, K), C (M, N) with row stride ``ldc``; M, N, K dynamic; K % 8 == 0, N % 8 == 0).

Why: for M <= 128 the GEMM is bound by streaming B (N·K·2 bytes) from DRAM once; FLOPs are negligible. The
big-tile kernel gives such shapes few CTAs (N=4096: 16 tiles of 128x256) with a 3-stage ring, i.e. too
few bytes in flight per SM and too few SMs streaming (128x14336x4096 ran at 2.05 TB/s, 0.71x cuBLAS).
What saturates DRAM is every SM keeping ~100 KB of loads in flight. So:

- Grid: one CTA per (M-tile, N-tile, K-slice), non-persistent, M-tiles fastest. The ``split_k`` CTAs of an
  (M, N) tile form one cluster (``T.cta_id_in_cluster([split_k])``); rank ``r`` streams K-tiles
  ``[r*kt/split_k, (r+1)*kt/split_k)``. N=4096 at block_n=128 gives 32 tiles x split 4 = 128 CTAs on 132 SMs.
- 128 * (1 + block_m/64) threads: warpgroup 0 is the TMA producer (one issuing thread), the 1 or 2 others
  are wgmma consumers, each a 64-row slab with an m64n{block_n}k16 fp32 accumulator (block_n/2 registers).
  With 2 consumers (384 threads) ``setmaxnreg`` moves registers to them (40/232); a 256-thread CTA already
  has 255 registers a thread and needs none (setmaxnreg.inc cannot go below the launch allocation).
- A deep full/empty ring (``num_stages`` of 64-element = 128-byte SW128 K-slices of A and B, 160-200 KB):
  that is the bytes-in-flight per SM. B is loaded with an L2 evict_first policy (read once), A with
  evict_last (every N-tile's cluster re-reads it). Ragged M/N/K: TMA zero-fills boxes past the edges.
- Split-K reduction, deterministic, in the same launch, no workspace, no atomics: after the mainloop each
  CTA writes its fp32 partial tile into its own smem (reusing the drained ring: the ring is free once every
  consumer has waited for all its loads and wgmmas, a named barrier over the consumers), cluster barrier
  (release/acquire), then rank ``r`` reduces the ``r``-th contiguous 1/split_k of the tile's *valid*
  (row < M, col < N) 4-column units by reading every rank's partial (``mapa`` + ``ld.shared::cluster.v4``,
  ranks summed in order 0..split_k-1), converts to bf16/fp16 and stores 8 bytes per unit with
  ``st.global`` (coalesced along the row). A last (relaxed) cluster barrier keeps every CTA, and so its
  smem, alive until all peers have read it.
- ``block_k`` 128 or 256: a stage is ``block_k / 64`` SW128 sub-tiles (boxes of 64 K-columns) of A and of B,
  loaded back to back, so each B row is read as 256 / 512 contiguous bytes at a time rather than 128 (DRAM
  row-buffer locality while every SM streams its own rows); the stage's last sub-tiles may lie wholly past K:
  they are neither loaded (the full barrier expects only the loaded boxes' bytes) nor multiplied.
- A rank whose K range is empty (K < 64 * split_k) issues no loads, contributes a zero partial and joins
  every barrier. ``split_k = 1`` is the same kernel without the cluster (CTA barriers instead).
- The producer and consumer warpgroups join the cluster barriers in their own branches (non-aligned
  ``barrier.cluster.arrive/wait``, ``core.lang.cluster``): a join point would keep the consumers'
  accumulators live under the producer's 40-register budget.
"""

from __future__ import annotations

SMEM_LIMIT = 232448  # 227 KB: the H200's opt-in maximum dynamic shared memory per block
SPLITS = (1, 2, 4, 8)  # cluster sizes along K (8 = the portable maximum)
PARTIAL_PAD = 8  # fp32 pad per partial row: 64-bit fragment stores hit 2 wavefronts (the minimum)
UNIT = 4  # output columns per reduction unit: one 16-byte fp32 load per rank, one 8-byte store
SUB_K = 64  # K-columns of one SW128 sub-tile (128 bytes of a 16-bit row): one TMA box
SUB_TILES_K = (64, 128, 256)  # block_k: 1, 2 or 4 sub-tiles per stage


def ring_bytes(block_m: int, block_n: int, block_k: int, num_stages: int, elem: int = 2) -> int:
    return num_stages * (block_m + block_n) * block_k * elem


def partial_bytes(block_m: int, block_n: int) -> int:
    return block_m * (block_n + PARTIAL_PAD) * 4


def smem_bytes(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int) -> int:
    """Bytes of the pool: the ring, aliased by the fp32 partial tile after the mainloop, then the barriers."""
    region = max(ring_bytes(block_m, block_n, block_k, num_stages), partial_bytes(block_m, block_n))
    return region + 2 * num_stages * 8


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    from tvm.script import tirx as T

    return T.min(a, b)


def k_slice(rank, k_tiles, split_k: int):
    """``(first K-tile, number of K-tiles)`` of cluster rank ``rank``: an even split, the count possibly 0.
    Python ints (tests) and TIR expressions (the kernel) alike."""
    first = rank * k_tiles // split_k
    return first, (rank + 1) * k_tiles // split_k - first


def unit_share(units, rank, split_k: int):
    """``[first, last)`` of the ``units`` reduction units (4 output columns each) that rank ``rank`` reduces:
    contiguous shares of ``ceil(units / split_k)``, the last ones possibly short or empty."""
    share = (units + split_k - 1) // split_k
    first = rank * share
    return first, _min(units, first + share), share


def sass_expect(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int, split_k: int) -> list[str]:
    """SASS the CPU build test asserts: the wgmma shape, TMA loads, 8-byte C stores; register reconfiguration
    with 2 consumers; with a cluster, its barrier (UCGABAR) and the DSMEM loads (generic LD.E.128)."""
    out = [rf"HGMMA\.64x{block_n}x16\.F32" + (r"\.BF16" if dtype == "bfloat16" else r"\b"), r"UTMALDG\.2D",
           r"STG\.E\.64"]
    if block_m == 128:
        out.append(r"USETMAXREG")
    if split_k > 1:
        out += [r"UCGABAR_ARV", r"UCGABAR_WAIT", r"\bLD\.E\.128\b"]
    return out


def check_params(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int, split_k: int) -> None:
    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"small-M gemm: dtype {dtype!r} is not bfloat16/float16")
    if block_m not in (64, 128):
        raise ValueError(f"small-M gemm: block_m={block_m} must be 64 or 128 (1 or 2 consumer warpgroups)")
    if block_k not in SUB_TILES_K:
        raise ValueError(f"small-M gemm: block_k={block_k} must be one of {SUB_TILES_K} (1, 2 or 4 SW128 "
                         "sub-tiles of 64 K-columns)")
    if block_n % 32 or not 64 <= block_n <= 256:
        raise ValueError(f"small-M gemm: block_n={block_n} must be a multiple of 32 in [64, 256]")
    if split_k not in SPLITS:
        raise ValueError(f"small-M gemm: split_k={split_k} must be one of {SPLITS}")
    if num_stages < 2:
        raise ValueError(f"small-M gemm: num_stages={num_stages} must be >= 2")
    nbytes = smem_bytes(dtype, block_m, block_n, block_k, num_stages)
    if nbytes > SMEM_LIMIT:
        raise ValueError(f"small-M gemm: {nbytes} B of smem exceeds {SMEM_LIMIT}")


def build_small_m_kernel(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int, split_k: int,
                         pdl: str | None = None):
    check_params(dtype, block_m, block_n, block_k, num_stages, split_k)

    from tvm.script import tirx as T

    from tirx_kernels.core.lang import cluster, mbarrier, roles, tma, vector, wgmma
    from tirx_kernels.core.lang import pdl as pdl_launch

    elem = tma.elem_bytes(dtype)
    num_consumers = block_m // wgmma.M
    nthreads = roles.WARPGROUP * (1 + num_consumers)
    consumer_threads = roles.WARPGROUP * num_consumers
    use_setmaxnreg = num_consumers == 2
    if use_setmaxnreg:
        assert roles.register_split_fits(num_consumers)
    a_tile = block_m * block_k  # elements per stage
    b_tile = block_n * block_k
    subs = block_k // SUB_K  # SW128 sub-tiles (TMA boxes) per operand and stage
    sub_bytes = (block_m + block_n) * SUB_K * elem  # one A box + one B box, also when they reach past M/N/K
    stage_bytes = subs * sub_bytes
    k_steps = SUB_K // 16  # k16 wgmma steps per sub-tile
    nacc = wgmma.acc_regs(block_n)
    pstride = block_n + PARTIAL_PAD  # fp32 elements per partial row
    region = max(ring_bytes(block_m, block_n, block_k, num_stages, elem), partial_bytes(block_m, block_n))
    ring = mbarrier.Ring(num_stages, 4 * num_consumers)  # lane 0 of each consumer warp releases a slot
    clustered = split_k > 1
    mainloop_done, partials_ready = 1, 2  # named barriers over the consumer threads

    def consumer_ids(wg, tid):
        """(consumer index, thread in its warpgroup, warp, lane); takes the registers with 2 consumers."""
        if use_setmaxnreg:
            return roles.consumer_role(wg, tid)
        ct = tid - roles.WARPGROUP
        return 0, ct, ct // 32, ct % 32

    def reduce_unit(part, words, P, off, remote):  # noqa: N803 (P is the partial tile)
        """``words`` <- the 4 columns at partial offset ``off`` summed over the ranks (in rank order 0..),
        rounded to 16 bits. Every rank's 16-byte load is issued before the first add."""
        for p in range(split_k):
            if clustered:
                cluster.load_v4_f32(part, 4 * p, P.ptr_to([off]), p, remote[0])
            else:
                for e in range(4):
                    T.buffer_store(part, P[off + e], [e])
        for e in range(2):
            lo = part[2 * e]
            hi = part[2 * e + 1]
            for p in range(1, split_k):
                lo = lo + part[4 * p + 2 * e]
                hi = hi + part[4 * p + 2 * e + 1]
            vector.pack2(words, e, lo, hi, dtype)

    def sub_tile_in_k(k0, c, K):  # noqa: N803
        """Whether sub-tile ``c`` of the stage starting at K-column ``k0`` starts before K: the producer loads
        it and the consumers multiply it only then."""
        return k0 + c * SUB_K < K

    def load_sub_tile(As, Bs, a_map, b_map, full, pol_a, pol_b, s, c, k, m0, n0):  # noqa: N803
        """TMA loads of sub-tile ``c`` (K-columns from ``k``) of A and B into stage ``s``, L2 policies A evict_last,
        B evict_first."""
        tma.load(As.ptr_to([s * a_tile + c * block_m * SUB_K]), a_map, [k, m0], full.ptr_to([s]),
                 cache_policy=pol_a[0])
        tma.load(Bs.ptr_to([s * b_tile + c * block_n * SUB_K]), b_map, [k, n0], full.ptr_to([s]),
                 cache_policy=pol_b[0])

    def mma_sub_tile(acc, desc_a, desc_b, As, Bs, s, c, cw):  # noqa: N803 (As, Bs are the smem tiles)
        """The k16 wgmmas of sub-tile ``c`` of stage ``s``: consumer ``cw``'s 64 rows of A times the B tile."""
        a_sub = s * a_tile + c * block_m * SUB_K + cw * wgmma.M * SUB_K  # this consumer's 64 rows of sub-tile c
        b_sub = s * b_tile + c * block_n * SUB_K
        for kk in range(k_steps):  # a Python loop: unrolled as the script is parsed
            wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]), As.ptr_to([a_sub + kk * 16]))
            wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([b_sub + kk * 16]))
            wgmma.mma(block_n, acc, desc_a[0], desc_b[0], dtype)

    @T.prim_func
    def fp16_bf16_gemm_small_m(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, (N, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, N), dtype, strides=(ldc, 1), align=16)
        # Host: tensor maps with this call's dims (boxes past the edges are zero-filled on load).
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, K, block_m, SUB_K, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(b_map, B.data, N, K, K, block_n, SUB_K, dtype, l2_promotion=tma.L2_PROMOTION_256B)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        # Flat view of C indexed row * ldc + col: TIRx 0.27 binds match_buffer strides on the host but
        # drops them from device indexing (it would address C[r, c] as r * N + c).
        Cf = T.decl_buffer((M * ldc,), dtype, data=C.data)
        cta = T.cta_id([split_k * ((M + block_m - 1) // block_m) * ((N + block_n - 1) // block_n)])
        rank = T.int32(0)
        if clustered:
            rank = T.cta_id_in_cluster([split_k])
        wg = T.warpgroup_id([1 + num_consumers])
        tid = T.thread_id([nthreads])
        num_m = (M + block_m - 1) // block_m
        tile = cta // split_k  # M-tiles fastest: neighbouring clusters share the B tile in L2
        m0 = (tile % num_m) * block_m
        n0 = (tile // num_m) * block_n
        k_tiles = (K + block_k - 1) // block_k
        k_begin, nk = k_slice(rank, k_tiles, split_k)  # nk may be 0 when K < block_k * split_k

        # Shared memory: the ring, the fp32 partial tile over it (used only once the ring has drained),
        # then the barriers. One pool: its base is 1024-aligned only without any static __shared__.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_tile,), dtype, align=1024)
        Bs = pool.alloc((num_stages * b_tile,), dtype, align=1024)
        pool.move_base_to(0)
        P = pool.alloc((block_m * pstride,), "float32", align=1024)
        pool.move_base_to(region)
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        pol_a = T.alloc_local((1,), "uint64")
        pol_b = T.alloc_local((1,), "uint64")
        part = T.alloc_local((4 * split_k,), "float32")
        words = T.alloc_local((2,), "uint32")
        remote = T.alloc_local((1,), "uint32")

        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        pdl_launch.begin(pdl)  # programmatic dependent launch: no global access before the previous kernel is done

        if wg == 0:
            # TMA warpgroup.
            if use_setmaxnreg:
                roles.producer_role()
            if tid == 0:
                tma.create_policy(pol_a[0], tma.EVICT_LAST)  # A: re-read by every N-tile's cluster
                tma.create_policy(pol_b[0], tma.EVICT_FIRST)  # B: streamed once
                for i in range(nk):
                    s = ring.stage(i)
                    ring.producer_acquire(empty, i)
                    if subs == 1:
                        ring.producer_expect(full, i, stage_bytes)
                        load_sub_tile(As, Bs, a_map, b_map, full, pol_a, pol_b, s, 0, (k_begin + i) * block_k, m0, n0)
                    else:
                        # Sub-tiles starting past K are not loaded (nor multiplied): expect only the others.
                        k0 = (k_begin + i) * block_k
                        ring.producer_expect(full, i, T.min(subs, (K - k0 + SUB_K - 1) // SUB_K) * sub_bytes)
                        for c in T.unroll(subs):
                            if sub_tile_in_k(k0, c, K):
                                load_sub_tile(As, Bs, a_map, b_map, full, pol_a, pol_b, s, c, k0 + c * SUB_K, m0, n0)
            if clustered:
                # Join both cluster barriers of the consumers' epilogue (the producer publishes nothing).
                cluster.arrive(relaxed=True)
                cluster.wait()
                cluster.arrive(relaxed=True)
                cluster.wait()
        else:
            # Math warpgroups: consumer cw owns rows [64*cw, 64*cw + 64) of the tile.
            cw, ct, warp, lane = consumer_ids(wg, tid)
            for i in T.unroll(nacc):
                acc[i] = T.float32(0)  # an idle rank (nk == 0) contributes these zeros
            for i in range(nk):
                s = ring.stage(i)
                ring.consumer_wait(full, i)
                wgmma.fence()
                if subs == 1:
                    mma_sub_tile(acc, desc_a, desc_b, As, Bs, s, 0, cw)
                else:
                    for c in T.unroll(subs):
                        if sub_tile_in_k((k_begin + i) * block_k, c, K):
                            mma_sub_tile(acc, desc_a, desc_b, As, Bs, s, c, cw)
                wgmma.commit()
                # NOTES: one group in flight; once down to one, use i-1's wgmmas have read their smem. The
                # last use is never released: nothing waits for it.
                wgmma.wait(1)
                if i > 0 and lane == 0:
                    ring.consumer_release(empty, i - 1)
            wgmma.wait(0)

            # Every consumer's wgmmas are done (and every TMA load landed: all full barriers were waited):
            # the ring's smem is free for the fp32 partial tile.
            cluster.named_sync(mainloop_done, consumer_threads)
            for j in T.unroll(block_n // 8):
                for r in T.unroll(2):
                    row = cw * wgmma.M + wgmma.acc_row(warp, lane, r)
                    col = wgmma.acc_col(lane, j)
                    P[row * pstride + col] = acc[wgmma.acc_index(j, r, 0)]
                    P[row * pstride + col + 1] = acc[wgmma.acc_index(j, r, 1)]
            if clustered:
                cluster.arrive()  # release: the partial tile is visible to the peers after their wait
                cluster.wait()
            else:
                cluster.named_sync(partials_ready, consumer_threads)

            # Reduction: this rank's contiguous share of the valid units (rows < M, 4 columns < N).
            units_per_row = (T.min(block_n, N - n0)) // UNIT  # N % 8 == 0: a unit is all in or all out
            units = T.min(block_m, M - m0) * units_per_row
            first, last, share = unit_share(units, rank, split_k)
            for it in range((share + consumer_threads - 1) // consumer_threads):
                u = first + it * consumer_threads + ct + cw * roles.WARPGROUP
                if u < last:
                    row = u // units_per_row
                    col = (u % units_per_row) * UNIT
                    reduce_unit(part, words, P, row * pstride + col, remote)
                    c_off = T.Cast("int64", m0 + row) * T.Cast("int64", ldc) + (n0 + col)
                    T.evaluate(T.ptx.st.global_.v2.b32(Cf.ptr_to([c_off]), words[0], words[1]))
            if clustered:
                # No CTA may exit (and free its smem) while a peer still reads its partial tile.
                cluster.arrive(relaxed=True)
                cluster.wait()
        pdl_launch.end(pdl)

    return pdl_launch.launch(fp16_bf16_gemm_small_m, pdl, cluster=clustered)
