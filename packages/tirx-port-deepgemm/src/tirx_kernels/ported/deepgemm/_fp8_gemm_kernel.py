# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's SM90 FP8 GEMM with 1D-2D block scaling (deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh,
# csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b:
# its recipe (per 128-K block, wgmma into a temporary accumulator, then promotion with sfa[row] * sfb[block]),
# written anew in TIRx on the project's Hopper layer (core.lang) and the native GEMM's warp-specialized structure.
"""The kernel of ``deepgemm_sm90_fp8_gemm_1d2d`` and of the m-grouped GEMMs: ``D[M, N] (bf16) (+)= (A[M, K] e4m3 *
sfa) (B[N, K] e4m3 * sfb)^T`` with ``sfa`` 1x128 per-token scales (MN-major, TMA-aligned: ``sfa[k_block * align(M,
4) + m]``) and ``sfb`` 128x128 block scales (``[ceil(N/128), ceil(K/128)]`` row-major); the grouped forms take B and
sfb per group (``[G, N, K]``, ``[G, ceil(N/128), ceil(K/128)]``) and a tile schedule (``_fp8_gemm_sched``: which
tiles a CTA walks, each tile's group, which rows are stored) around the same mainloop.

Design (DeepGEMM's SM90 1d2d, on the native GEMM's skeleton, ``tirx_kernels.gemm._persistent``):
- Persistent grid of ``min(tiles, num_sms)`` CTAs walking 128 x ``block_n`` tiles in ``core.lang.scheduler``'s
  grouped raster. 384 threads: warpgroup 0 the TMA producer (one issuing thread, setmaxnreg 40), warpgroups 1-2 the
  math consumers (setmaxnreg 232), each a 64 x ``block_n`` slab of the tile.
- One ``num_stages`` full/empty ring over the CTA's lifetime; a stage is one 128-K block: A 128 x 128 and B
  ``block_n`` x 128 e4m3 tiles (128-byte K rows, SW128, K-major: the only major FP8 wgmma takes) and the tile's 128
  ``sfa`` values of that K block (one 512-byte TMA box of the MN-major scale column, zero-filled past M).
- Math, per K block (the promotion): four wgmma m64nNk32 into a temporary fp32 accumulator (the first with
  scale-d 0), wait, read the two ``sfa`` rows this thread's fragment covers from the stage, give the stage back,
  then ``acc += tmp * (sfa[row] * sfb[n_block, k_block])``. ``block_n`` divides 128, so a tile meets one ``sfb``
  per K block (read from global: one 4-byte value per K block, cached); a 256-wide candidate tile runs as two
  128-wide halves through the same temporary, one ``sfb`` each.
- Candidate knobs of ``build_kernel`` (issue 24; the defaults build the product kernel): 1 x 2 clusters multicasting
  A, 256-row tiles (two 128-row waves through the one temporary), 128 x 256 tiles, scales read ahead of the wgmma.
- NOTES: the fp32 main accumulator never sees a wgmma (DeepGEMM's reason for the split: the tensor core's FP8
  accumulation keeps fewer mantissa bits, so each 128-K partial is promoted to a real fp32 sum).
- Epilogue: bf16 pairs straight from the accumulator fragment to global (``st.global.b32``, clipped at M and N;
  ``accumulate`` adds the bf16 value D held first, DeepGEMM's C-into-D convention).
- Ragged shapes: TMA zero-fills A / B / sfa boxes past M, N, K (a zero-filled sfa row only scales a row that is not
  stored; K's tail adds zeros).
- Ring positions: producer and consumers each step a (stage, phase) cursor once per loaded K block, so a schedule
  may skip a tile's loads (a contiguous tile of padding rows) on both sides alike.
- Schedules (``_fp8_gemm_sched``): ``dense``; ``m_contiguous`` (B / sfb at the group of the tile's first row, rows
  of group -1 stored as 0); ``m_masked`` (A, sfa and D at the tile's group, rows past ``masked_m[g]`` not stored,
  a grid that does not depend on ``masked_m``); ``batched`` (G batches of equal M: A through a rank-3 map of its
  own strides, sfa and D per batch as ``m_masked``'s). A slab (64 rows) a schedule marks dead skips its wgmma but still
  waits for and releases every stage.
"""

from __future__ import annotations

SMEM_LIMIT = 232448  # 227 KB, the opt-in maximum dynamic shared memory per block
NUM_CONSUMERS = 2
BLOCK_M = 128
BLOCK_K = 128  # one scale block: 128 e4m3 = one 128-byte SW128 row
GRAN = 128
AB_DTYPE = "float8_e4m3fn"


RECIPES = ("1d2d", "1d1d")


def smem_bytes(block_n: int, num_stages: int, recipe: str = "1d2d", block_m: int = BLOCK_M) -> int:
    """The ring (A, B, the sfa column and, 1d1d, the sfb row of each stage) and its 2 x num_stages barriers."""
    sf_bytes = block_m * 4 + (block_n * 4 if recipe == "1d1d" else 0)
    return num_stages * ((block_m + block_n) * BLOCK_K + sf_bytes) + 2 * num_stages * 8


def build_kernel(block_n: int, num_stages: int, group_m: int, num_sms: int, accumulate: bool = False,
                 schedule: str = "dense", recipe: str = "1d2d", block_m: int = BLOCK_M, cluster_n: int = 1,
                 prefetch_scales: bool = False):
    """Kernel arguments by schedule (``_fp8_gemm_sched``):

    - ``dense``: ``(a, sfa, b, sfb, d, ldd)``: a (M, K) and b (N, K) e4m3 (K % 16 == 0), sfa flat fp32 (the MN-major
      TMA-aligned buffer), sfb (ceil(N/128), ceil(K/128)) fp32, d bf16 as 32-bit words with row stride ``ldd``
      elements (even; N even).
    - ``m_contiguous``: ``(a, sfa, b, sfb, d, grouped_layout, ldd)``: b (G, N, K), sfb (G, ceil(N/128), ceil(K/128)),
      grouped_layout (M,) int32.
    - ``m_masked``: ``(a, sfa, b, sfb, d, masked_m, ldd, ldg)``: a (G, max_m, K), sfa flat (G groups of
      ``ceil(K/128)`` columns of ``align(max_m, 4)``), b and sfb as above, masked_m (G,) int32, d's group stride
      ``ldg`` elements (even).
    - ``batched``: ``(a, sfa, b, sfb, d, ldd, ldg)``: a (G, M, K) of any batch and row strides (multiples of 16
      bytes, unit K stride: TMA reads it in place), sfa, b, sfb and d as ``m_masked``'s.

    ``recipe="1d1d"`` (the dense schedule): B's scales are 1x128 per row as A's (sfb flat, MN-major TMA-aligned like
    sfa: ``sfb[k_block * align(N, 4) + n]``, TMA-loaded per stage beside sfa), each column promoted with its own
    ``sfb[n]``, and D fp32 (``accumulate``: ``D += ...``, the wgrad form).

    Candidate knobs (issue 24; the defaults build the kernel measured at 0.72-0.80x cuBLASLt blockwise):

    - ``cluster_n=2``: 1 x 2 clusters, the two CTAs on N-tiles (2j, 2j+1) of one M-tile; each loads half of the A
      tile's rows and multicasts it into both (``scheduler.multicast_a``), so a CTA requests 3/4 of the L2 bytes of
      a 128 x 128 tile. The stage is written by both producers, so every consumer releases it in both CTAs.
    - ``block_m=256`` (dense / batched, 1d2d): a 256 x ``block_n`` tile, two waves of 128 rows; each consumer
      warpgroup runs a 64-row slab of each wave through the one temporary accumulator (wgmma, wait, promote, next
      wave: DeepGEMM's ``WAVE_BLOCK_M``), 128 + 64 fp32 registers of accumulators at ``block_n`` 128.
      With ``cluster_n=2`` a CTA requests 1/2 of the L2 bytes per FLOP of an unclustered 128 x 128 tile (DeepGEMM's
      SM90 heuristic picks 256 x 128 with a 1 x 2 cluster at 4096 x 4096 x 7168 and 4096 x 7168 x 16384; its L2
      model rates the unclustered 128 x 128 tile 1.8x slower there).
    - ``prefetch_scales``: the K block's ``sfb`` (global, 4 bytes) is loaded before the full-barrier wait instead
      of after ``wgmma.wait`` (where its latency sat between the wgmma and the promotion, SASS of the default), and
      the grouped schedules' per-slab liveness is decided once per tile instead of once per K block."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, roles, tma, vector, wgmma

    from . import _fp8_gemm_sched as S

    if block_n not in (64, 128, 256) or block_n == 256 and recipe != "1d2d":
        raise ValueError(f"fp8 gemm {recipe}: block_n={block_n} must divide the 128-wide sfb block (64 or 128) or, "
                         "1d2d, be two of them (256)")
    if recipe not in RECIPES:
        raise ValueError(f"fp8 gemm: recipe {recipe!r} is not one of {RECIPES}")
    if block_m not in (128, 256) or block_m != BLOCK_M and recipe != "1d2d":
        raise ValueError(f"fp8 gemm {recipe}: block_m={block_m} (128, or 256 with the 1d2d recipe)")
    if block_m * block_n > 128 * 256:
        raise ValueError(f"fp8 gemm: a {block_m} x {block_n} tile needs more than 232 registers a consumer thread")
    if smem_bytes(block_n, num_stages, recipe, block_m) > SMEM_LIMIT or num_stages < 2:
        raise ValueError(f"fp8 gemm {recipe}: {num_stages} stages of {block_m} x {block_n} need "
                         f"{smem_bytes(block_n, num_stages, recipe, block_m)} B of shared memory (at most "
                         f"{SMEM_LIMIT}, 2 stages)")
    sched = S.make(schedule, block_n, group_m, num_sms, block_m, cluster_n)
    if accumulate and schedule != "dense":
        raise ValueError(f"fp8 gemm 1d2d: accumulate (C) is the dense schedule's only (got {schedule!r})")
    one_d = recipe == "1d1d"
    if one_d and schedule != "dense":
        raise ValueError(f"fp8 gemm 1d1d: the dense schedule only (got {schedule!r})")
    assert roles.register_split_fits(NUM_CONSUMERS)
    masked = schedule == "m_masked"
    batched = schedule == "batched"
    per_batch = masked or batched  # A, sfa and D offset by the tile's group

    a_tile, b_tile = block_m * BLOCK_K, block_n * BLOCK_K  # bytes (= elements) per stage
    stage_bytes = a_tile + b_tile + block_m * 4 + (block_n * 4 if one_d else 0)
    k_steps = BLOCK_K // wgmma.k_per_instr(AB_DTYPE)  # 4 wgmma k32 per K block
    wgmma_n = min(block_n, GRAN)  # the wgmma's N: one sfb block at most
    halves = block_n // wgmma_n  # N parts of the tile (256: two, each with its own sfb)
    nacc = wgmma.acc_regs(wgmma_n)
    waves = block_m // BLOCK_M  # waves of 128 rows: one 64-row slab of each per consumer warpgroup
    parts = waves * halves  # (wave, half) parts of a consumer's share, each through the one temporary accumulator
    a_share = block_m // cluster_n  # A rows each CTA of a cluster loads (and multicasts)
    ring = mbarrier.Ring.for_warpgroups(num_stages, NUM_CONSUMERS, cluster_size=cluster_n)
    always_live = schedule in ("dense", "batched")  # slab_live is the constant True

    def sfb_at(SFB, g, n0, k, sfb_rows):  # noqa: N803
        # A CTA of a cluster past N (odd N-tile count), or a tile's second half past N, reads the last row of sfb:
        # its products are never stored.
        nb = n0 // GRAN if cluster_n == 1 and halves == 1 else T.min(n0 // GRAN, sfb_rows - 1)
        return SFB[g, nb, k] if sched.grouped else SFB[nb, k]

    def b_row(info, N):  # noqa: N803
        """B's tensor-map row of the tile's first column (grouped: inside the tile's group's N rows)."""
        return info[S.GROUP] * N + info[S.N0] if sched.grouped else info[S.N0]

    def kept(row, x):
        """``x``, or 0 where the schedule stores the row as 0."""
        keep = sched.row_kept(row)
        return x if keep is True else T.Select(keep, x, T.float32(0))

    def promote(scale, col_scale, r, j, e):
        """The factor of the K block's partial at fragment (j, r, e): sfa[row] * sfb (1d2d: one product per row,
        formed once; 1d1d: sfa[row] * sfb[col])."""
        return scale[r] * col_scale[2 * j + e] if one_d else scale[r]

    def sfb_value(sfb_reg, SFB, g, n0, h, k, sfb_rows):  # noqa: N803
        """The K block's sfb of half ``h``: the register loaded ahead (prefetch_scales), else a load here."""
        return sfb_reg[h] if prefetch_scales else sfb_at(SFB, g, n0 + h * GRAN, k, sfb_rows)

    def sfa_value(sfa_reg, SFAs, s, slab, w, r, warp, lane):  # noqa: N803
        """sfa of fragment row ``r`` of the slab: the register read before the wgmma (prefetch_scales), else from the
        stage here."""
        return sfa_reg[2 * w + r] if prefetch_scales else SFAs[s * block_m + slab + wgmma.acc_row(warp, lane, r)]

    def slab_live(info, m0, slab, live, w):
        """Whether the consumer slab starting at tile row ``slab`` runs its wgmma (prefetch_scales: decided once
        per tile into ``live``)."""
        if always_live:
            return True
        return live[w] == 1 if prefetch_scales else sched.slab_live(info, m0 + slab)

    def d_word(row, col, info, ldd, ldg):
        off = T.Cast("int64", row) * ldd + col
        if per_batch:
            off = off + T.Cast("int64", info[S.GROUP]) * ldg
        return off // 2

    @T.prim_func
    def fp8_gemm_1d2d(a_ptr: T.handle, sfa_ptr: T.handle, b_ptr: T.handle, sfb_ptr: T.handle, d_ptr: T.handle,
                      layout_ptr: T.handle, ldd: T.int32, ldg: T.int32):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        G = T.int32()
        sfa_len = T.int32()
        sfb_rows = T.int32()
        sfb_cols = T.int32()
        d_len = T.int64()
        if batched:
            a_sg = T.int32()
            a_sm = T.int32()
            A = T.match_buffer(a_ptr, (G, M, K), AB_DTYPE, strides=(a_sg, a_sm, 1), align=16)
        elif masked:
            A = T.match_buffer(a_ptr, (G, M, K), AB_DTYPE, align=16)
        else:
            A = T.match_buffer(a_ptr, (M, K), AB_DTYPE, align=16)
        if sched.grouped:
            B = T.match_buffer(b_ptr, (G, N, K), AB_DTYPE, align=16)
            SFB = T.match_buffer(sfb_ptr, (G, sfb_rows, sfb_cols), "float32", align=4)
        elif one_d:
            B = T.match_buffer(b_ptr, (N, K), AB_DTYPE, align=16)
            SFB = T.match_buffer(sfb_ptr, (sfb_rows,), "float32", align=16)  # flat: sfb_rows is its length here
        else:
            B = T.match_buffer(b_ptr, (N, K), AB_DTYPE, align=16)
            SFB = T.match_buffer(sfb_ptr, (sfb_rows, sfb_cols), "float32", align=4)
        if sched.grouped:
            sched.match_layout(layout_ptr, M, G)
        SFA = T.match_buffer(sfa_ptr, (sfa_len,), "float32", align=16)
        if one_d:
            Df = T.match_buffer(d_ptr, (d_len,), "float32", align=4)
        else:
            Dw = T.match_buffer(d_ptr, (d_len,), "uint32", align=4)
        # Host: tensor maps of this call's dims. sfa is read as a ((groups x) k_blocks, M) matrix of row stride
        # align(M, 4); A and B as ((groups x) rows, K).
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        sfa_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        if batched:
            tma.encode(a_map, A.data, [K, M, G], [a_sm, a_sg], [BLOCK_K, a_share, 1], AB_DTYPE,
                       l2_promotion=tma.L2_PROMOTION_256B)
        else:
            tma.encode_2d(a_map, A.data, G * M if masked else M, K, K, a_share, BLOCK_K, AB_DTYPE,
                          l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(b_map, B.data, G * N if sched.grouped else N, K, K, block_n, BLOCK_K, AB_DTYPE,
                      l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(sfa_map, SFA.data, (G if per_batch else 1) * ((K + GRAN - 1) // GRAN), M, (M + 3) // 4 * 4, 1,
                      block_m, "float32", swizzle=tma.SWIZZLE_NONE)
        if one_d:
            sfb_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
            tma.encode_2d(sfb_map, SFB.data, (K + GRAN - 1) // GRAN, N, (N + 3) // 4 * 4, 1, block_n, "float32",
                          swizzle=tma.SWIZZLE_NONE)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        cta = T.cta_id([sched.grid(M, N, G)])
        rank = T.int32(0)
        if cluster_n > 1:
            rank = T.cta_id_in_cluster([cluster_n])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + BLOCK_K - 1) // BLOCK_K

        # Shared memory: one pool, 1024-aligned operand tiles first, barriers last.
        pool = T.SMEMPool()
        # Operand tiles as bytes: TMA and the wgmma descriptors need only their addresses.
        As = pool.alloc((num_stages * a_tile,), "uint8", align=1024)
        Bs = pool.alloc((num_stages * b_tile,), "uint8", align=1024)
        SFAs = pool.alloc((num_stages * block_m,), "float32", align=128)
        if one_d:
            SFBs = pool.alloc((num_stages * block_n,), "float32", align=128)
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((parts * nacc,), "float32")
        tmp = T.alloc_local((nacc,), "float32")
        sfb_reg = T.alloc_local((2 * halves,), "float32")  # prefetch_scales: this K block's sfb (per half), the next
        sfa_reg = T.alloc_local((2 * waves,), "float32")  # prefetch_scales: sfa of the thread's rows, every wave
        live = T.alloc_local((waves,), "int32")  # prefetch_scales: the slabs of the tile that run their wgmma
        scale = T.alloc_local((2,), "float32")  # sfa[row] (* sfb: 1d2d) of this thread's two fragment rows
        col_scale = T.alloc_local((block_n // 4 if one_d else 1,), "float32")  # 1d1d: sfb of this thread's columns
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")
        remote = T.alloc_local((1,), "uint32")
        cursor = T.alloc_local((2,), "int32")
        state = T.alloc_local((3,), "int32")  # the schedule's walk (m_masked: tile count, group cursor)
        info = T.alloc_local((4,), "int32")  # the tile: first row in its group, first column, group, rows stored

        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        if cluster_n > 1:
            T.cuda.cluster_sync()  # the peer's barriers are initialised before anything multicasts into them
        else:
            T.cuda.cta_sync()
        sched.begin(state, M, N, G)
        ring.cursor_init(cursor)
        clusters = sched.grid(M, N, G) // cluster_n
        cluster = cta // cluster_n
        my_tiles = sched.count(cluster, clusters, state, M, N, G)

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            roles.producer_role()
            if tid == 0:
                tma.prefetch_descriptor(a_map)
                tma.prefetch_descriptor(b_map)
                tma.prefetch_descriptor(sfa_map)
                if one_d:
                    tma.prefetch_descriptor(sfb_map)
                for t in range(my_tiles):
                    sched.bind(info, state, cluster + t * clusters, M, N, G, rank)
                    if sched.loads(info):
                        for k in range(k_tiles):
                            s = cursor[0]
                            # The slot's previous use must have been released (a fresh ring passes at once).
                            mbarrier.wait(empty.ptr_to([s]), cursor[1] ^ 1)
                            mbarrier.arrive_expect_tx(full.ptr_to([s]), stage_bytes)
                            if cluster_n == 1:
                                if batched:
                                    tma.load(As.ptr_to([s * a_tile]), a_map, [k * BLOCK_K, info[S.M0],
                                                                               info[S.GROUP]], full.ptr_to([s]))
                                else:
                                    tma.load_2d(As.ptr_to([s * a_tile]), a_map, k * BLOCK_K, sched.a_row(info, M),
                                                full.ptr_to([s]))
                            else:
                                # This CTA's half of the A rows, into both CTAs (same smem and barrier offsets).
                                if batched:
                                    tma.load(As.ptr_to([s * a_tile + rank * a_share * BLOCK_K]), a_map,
                                             [k * BLOCK_K, info[S.M0] + rank * a_share, info[S.GROUP]],
                                             full.ptr_to([s]), multicast_mask=3)
                                else:
                                    tma.load_2d(As.ptr_to([s * a_tile + rank * a_share * BLOCK_K]), a_map,
                                                k * BLOCK_K, sched.a_row(info, M) + rank * a_share,
                                                full.ptr_to([s]), multicast_mask=3)
                            tma.load_2d(Bs.ptr_to([s * b_tile]), b_map, k * BLOCK_K, b_row(info, N),
                                        full.ptr_to([s]))
                            tma.load_2d(SFAs.ptr_to([s * block_m]), sfa_map, info[S.M0],
                                        sched.sfa_row(info, k_tiles) + k, full.ptr_to([s]))
                            if one_d:
                                tma.load_2d(SFBs.ptr_to([s * block_n]), sfb_map, info[S.N0], k, full.ptr_to([s]))
                            ring.cursor_advance(cursor)
        else:
            # Math warpgroups: consumer cw owns rows [64 cw, 64 cw + 64) of every tile.
            cw, ct, warp, lane = roles.consumer_role(wg, tid)
            wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]), As.ptr_to([cw * wgmma.M * BLOCK_K]))
            wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([0]))
            for t in range(my_tiles):
                sched.bind(info, state, cluster + t * clusters, M, N, G, rank)
                m0 = info[S.M0]
                n0 = info[S.N0]
                for i in T.unroll(parts * nacc):
                    acc[i] = T.float32(0)
                if prefetch_scales and not always_live:
                    for w in T.unroll(waves):
                        live[w] = T.Cast("int32", sched.slab_live(info, m0 + w * BLOCK_M + cw * wgmma.M))
                if sched.loads(info):
                    if prefetch_scales and not one_d:
                        for h in T.unroll(halves):
                            sfb_reg[halves + h] = sfb_at(SFB, info[S.GROUP], n0 + h * GRAN, 0, sfb_rows)
                    for k in range(k_tiles):
                        s = cursor[0]
                        if prefetch_scales and not one_d:
                            # The next K block's sfb is loaded one K block ahead: its latency never sits between
                            # the wgmma and the promotion.
                            for h in T.unroll(halves):
                                sfb_reg[h] = sfb_reg[halves + h]
                                sfb_reg[halves + h] = sfb_at(SFB, info[S.GROUP], n0 + h * GRAN,
                                                             T.min(k + 1, k_tiles - 1), sfb_rows)
                        ring.consumer_wait_at(full, cursor)
                        if prefetch_scales and not one_d:
                            # sfa from the stage before the wgmma (DeepGEMM reads its scales before
                            # warpgroup_arrive), not after wgmma.wait.
                            for w in T.unroll(waves):
                                for r in T.unroll(2):
                                    sfa_reg[2 * w + r] = SFAs[s * block_m + w * BLOCK_M + cw * wgmma.M
                                                              + wgmma.acc_row(warp, lane, r)]
                        if one_d:
                            # 1d1d: both scale vectors into registers before the wgmma (their loads overlap it).
                            for r in T.unroll(2):
                                scale[r] = SFAs[s * block_m + cw * wgmma.M + wgmma.acc_row(warp, lane, r)]
                            for j in T.unroll(block_n // 8):
                                for e in T.unroll(2):
                                    col_scale[2 * j + e] = SFBs[s * block_n + wgmma.acc_col(lane, j, e)]
                        for p in T.unroll(parts):
                            w = p // halves  # the part's wave (rows) and half (columns)
                            h = p % halves
                            slab = w * BLOCK_M + cw * wgmma.M  # the slab's first row in the tile
                            if slab_live(info, m0, slab, live, w):
                                wgmma.fence()
                                for kk in T.unroll(k_steps):
                                    # NOTES: the K block's first wgmma overwrites the temporary (scale-d 0): no
                                    # zeroing.
                                    wgmma.mma(wgmma_n, tmp,
                                              wgmma.desc_advance(desc_a[0], s * a_tile + w * BLOCK_M * BLOCK_K
                                                                 + kk * 32),
                                              wgmma.desc_advance(desc_b[0], s * b_tile + h * wgmma_n * BLOCK_K
                                                                 + kk * 32), AB_DTYPE,
                                              scale_d=kk > 0)
                                wgmma.commit()
                                wgmma.wait(0)
                                if not one_d:
                                    for r in T.unroll(2):
                                        scale[r] = (sfa_value(sfa_reg, SFAs, s, slab, w, r, warp, lane)
                                                    * sfb_value(sfb_reg, SFB, info[S.GROUP], n0, h, k, sfb_rows))
                            if p == parts - 1:
                                # The stage's smem (operands and sfa) has been read: give it back before the last
                                # promotion. NOTES: lane 0 arrives for its warp, so every lane must be past its sfa
                                # reads (and its full-barrier wait: a lane still spinning there would miss the
                                # phase the refill completes).
                                T.evaluate(T.call_extern("void", "__syncwarp"))
                                ring.release_slot(empty, s, warp, lane, remote[0])
                                ring.cursor_advance(cursor)
                            if slab_live(info, m0, slab, live, w):
                                for j in T.unroll(wgmma_n // 8):
                                    for r in T.unroll(2):
                                        for e in T.unroll(2):
                                            acc[p * nacc + wgmma.acc_index(j, r, e)] = (
                                                acc[p * nacc + wgmma.acc_index(j, r, e)]
                                                + tmp[wgmma.acc_index(j, r, e)] * promote(scale, col_scale, r, j, e))
                # Epilogue: bf16 pairs (1d1d: fp32 pairs) from the fragment to D, clipped at the stored rows and N (N
                # even: a pair is in or out); rows the schedule does not keep are stored as 0.
                for p in T.unroll(parts):
                    for j in T.unroll(wgmma_n // 8):
                        for r in T.unroll(2):
                            row = m0 + p // halves * BLOCK_M + cw * wgmma.M + wgmma.acc_row(warp, lane, r)
                            col = n0 + p % halves * wgmma_n + wgmma.acc_col(lane, j)
                            x0 = acc[p * nacc + wgmma.acc_index(j, r, 0)]
                            x1 = acc[p * nacc + wgmma.acc_index(j, r, 1)]
                            if row < sched.stored_rows(info, M) and col < N:
                                if one_d:
                                    for e in T.unroll(2):
                                        if accumulate:
                                            Df[T.Cast("int64", row) * ldd + col + e] = (
                                                Df[T.Cast("int64", row) * ldd + col + e]
                                                + acc[p * nacc + wgmma.acc_index(j, r, e)])
                                        else:
                                            Df[T.Cast("int64", row) * ldd + col + e] = (
                                                acc[p * nacc + wgmma.acc_index(j, r, e)])
                                else:
                                    if accumulate:
                                        lo, hi = vector.unpack2(Dw[d_word(row, col, info, ldd, ldg)], "bfloat16")
                                        T.evaluate(T.ptx.cvt.rn.bf16x2.f32(packed[0], x1 + hi, x0 + lo))
                                    else:
                                        T.evaluate(T.ptx.cvt.rn.bf16x2.f32(packed[0], kept(row, x1), kept(row, x0)))
                                    Dw[d_word(row, col, info, ldd, ldg)] = packed[0]
        if cluster_n > 1:
            # No CTA may exit while its peer still multicasts into its smem or arrives on its barriers.
            T.cuda.cluster_sync()

    unused = {"dense": ("layout_ptr", "ldg"), "m_contiguous": ("ldg",), "m_masked": (),
              "batched": ("layout_ptr",)}[schedule]
    return _drop_params(fp8_gemm_1d2d, unused)


def _drop_params(func, names):
    """``func`` without the parameters called ``names`` (ones its schedule never reads): one kernel source serves
    every argument list."""
    from tvm import tirx

    keep = [p for p in func.params if p.name not in names]
    return func if len(keep) == len(func.params) else tirx.PrimFunc(keep, func.body, func.ret_type, func.attrs)
