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
  per K block (read from global: one 4-byte value per K block, cached).
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


def smem_bytes(block_n: int, num_stages: int, recipe: str = "1d2d") -> int:
    """The ring (A, B, the sfa column and, 1d1d, the sfb row of each stage) and its 2 x num_stages barriers."""
    sf_bytes = BLOCK_M * 4 + (block_n * 4 if recipe == "1d1d" else 0)
    return num_stages * ((BLOCK_M + block_n) * BLOCK_K + sf_bytes) + 2 * num_stages * 8


def build_kernel(block_n: int, num_stages: int, group_m: int, num_sms: int, accumulate: bool = False,
                 schedule: str = "dense", recipe: str = "1d2d"):
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
    ``sfb[n]``, and D fp32 (``accumulate``: ``D += ...``, the wgrad form)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, roles, tma, vector, wgmma

    from . import _fp8_gemm_sched as S

    if block_n not in (64, 128):
        raise ValueError(f"fp8 gemm 1d2d: block_n={block_n} must divide the 128-wide sfb block (64 or 128)")
    if recipe not in RECIPES:
        raise ValueError(f"fp8 gemm: recipe {recipe!r} is not one of {RECIPES}")
    if smem_bytes(block_n, num_stages, recipe) > SMEM_LIMIT or num_stages < 2:
        raise ValueError(f"fp8 gemm {recipe}: {num_stages} stages of 128 x {block_n} need "
                         f"{smem_bytes(block_n, num_stages, recipe)} B of shared memory (at most {SMEM_LIMIT}, "
                         "2 stages)")
    sched = S.make(schedule, block_n, group_m, num_sms)
    if accumulate and schedule != "dense":
        raise ValueError(f"fp8 gemm 1d2d: accumulate (C) is the dense schedule's only (got {schedule!r})")
    one_d = recipe == "1d1d"
    if one_d and schedule != "dense":
        raise ValueError(f"fp8 gemm 1d1d: the dense schedule only (got {schedule!r})")
    assert roles.register_split_fits(NUM_CONSUMERS)
    masked = schedule == "m_masked"
    batched = schedule == "batched"
    per_batch = masked or batched  # A, sfa and D offset by the tile's group

    a_tile, b_tile = BLOCK_M * BLOCK_K, block_n * BLOCK_K  # bytes (= elements) per stage
    stage_bytes = a_tile + b_tile + BLOCK_M * 4 + (block_n * 4 if one_d else 0)
    k_steps = BLOCK_K // wgmma.k_per_instr(AB_DTYPE)  # 4 wgmma k32 per K block
    nacc = wgmma.acc_regs(block_n)
    ring = mbarrier.Ring.for_warpgroups(num_stages, NUM_CONSUMERS)

    def sfb_at(SFB, g, n0, k):  # noqa: N803
        return SFB[g, n0 // GRAN, k] if sched.grouped else SFB[n0 // GRAN, k]

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
            tma.encode(a_map, A.data, [K, M, G], [a_sm, a_sg], [BLOCK_K, BLOCK_M, 1], AB_DTYPE,
                       l2_promotion=tma.L2_PROMOTION_256B)
        else:
            tma.encode_2d(a_map, A.data, G * M if masked else M, K, K, BLOCK_M, BLOCK_K, AB_DTYPE,
                          l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(b_map, B.data, G * N if sched.grouped else N, K, K, block_n, BLOCK_K, AB_DTYPE,
                      l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(sfa_map, SFA.data, (G if per_batch else 1) * ((K + GRAN - 1) // GRAN), M, (M + 3) // 4 * 4, 1,
                      BLOCK_M, "float32", swizzle=tma.SWIZZLE_NONE)
        if one_d:
            sfb_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
            tma.encode_2d(sfb_map, SFB.data, (K + GRAN - 1) // GRAN, N, (N + 3) // 4 * 4, 1, block_n, "float32",
                          swizzle=tma.SWIZZLE_NONE)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        cta = T.cta_id([sched.grid(M, N, G)])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + BLOCK_K - 1) // BLOCK_K

        # Shared memory: one pool, 1024-aligned operand tiles first, barriers last.
        pool = T.SMEMPool()
        # Operand tiles as bytes: TMA and the wgmma descriptors need only their addresses.
        As = pool.alloc((num_stages * a_tile,), "uint8", align=1024)
        Bs = pool.alloc((num_stages * b_tile,), "uint8", align=1024)
        SFAs = pool.alloc((num_stages * BLOCK_M,), "float32", align=128)
        if one_d:
            SFBs = pool.alloc((num_stages * block_n,), "float32", align=128)
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        tmp = T.alloc_local((nacc,), "float32")
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
        T.cuda.cta_sync()
        sched.begin(state, M, N, G)
        ring.cursor_init(cursor)
        my_tiles = sched.count(cta, sched.grid(M, N, G), state, M, N, G)

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
                    sched.bind(info, state, cta + t * sched.grid(M, N, G), M, N, G)
                    if sched.loads(info):
                        for k in range(k_tiles):
                            s = cursor[0]
                            # The slot's previous use must have been released (a fresh ring passes at once).
                            mbarrier.wait(empty.ptr_to([s]), cursor[1] ^ 1)
                            mbarrier.arrive_expect_tx(full.ptr_to([s]), stage_bytes)
                            if batched:
                                tma.load(As.ptr_to([s * a_tile]), a_map, [k * BLOCK_K, info[S.M0], info[S.GROUP]],
                                         full.ptr_to([s]))
                            else:
                                tma.load_2d(As.ptr_to([s * a_tile]), a_map, k * BLOCK_K, sched.a_row(info, M),
                                            full.ptr_to([s]))
                            tma.load_2d(Bs.ptr_to([s * b_tile]), b_map, k * BLOCK_K, b_row(info, N),
                                        full.ptr_to([s]))
                            tma.load_2d(SFAs.ptr_to([s * BLOCK_M]), sfa_map, info[S.M0],
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
                sched.bind(info, state, cta + t * sched.grid(M, N, G), M, N, G)
                m0 = info[S.M0]
                n0 = info[S.N0]
                for i in T.unroll(nacc):
                    acc[i] = T.float32(0)
                if sched.loads(info):
                    for k in range(k_tiles):
                        s = cursor[0]
                        ring.consumer_wait_at(full, cursor)
                        if one_d:
                            # 1d1d: both scale vectors into registers before the wgmma (their loads overlap it).
                            for r in T.unroll(2):
                                scale[r] = SFAs[s * BLOCK_M + cw * wgmma.M + wgmma.acc_row(warp, lane, r)]
                            for j in T.unroll(block_n // 8):
                                for e in T.unroll(2):
                                    col_scale[2 * j + e] = SFBs[s * block_n + wgmma.acc_col(lane, j, e)]
                        if sched.slab_live(info, m0 + cw * wgmma.M):
                            wgmma.fence()
                            for kk in T.unroll(k_steps):
                                # NOTES: the K block's first wgmma overwrites the temporary (scale-d 0): no zeroing.
                                wgmma.mma(block_n, tmp, wgmma.desc_advance(desc_a[0], s * a_tile + kk * 32),
                                          wgmma.desc_advance(desc_b[0], s * b_tile + kk * 32), AB_DTYPE,
                                          scale_d=kk > 0)
                            wgmma.commit()
                            wgmma.wait(0)
                            if not one_d:
                                for r in T.unroll(2):
                                    scale[r] = (SFAs[s * BLOCK_M + cw * wgmma.M + wgmma.acc_row(warp, lane, r)]
                                                * sfb_at(SFB, info[S.GROUP], n0, k))
                        # The stage's smem (operands and sfa) has been read: give it back before the promotion.
                        # NOTES: lane 0 arrives for its warp, so every lane must be past its sfa reads (and its
                        # full-barrier wait: a lane still spinning there would miss the phase the refill completes).
                        T.evaluate(T.call_extern("void", "__syncwarp"))
                        ring.release_slot(empty, s, warp, lane, remote[0])
                        ring.cursor_advance(cursor)
                        if sched.slab_live(info, m0 + cw * wgmma.M):
                            for j in T.unroll(block_n // 8):
                                for r in T.unroll(2):
                                    for e in T.unroll(2):
                                        acc[wgmma.acc_index(j, r, e)] = (acc[wgmma.acc_index(j, r, e)]
                                                                         + tmp[wgmma.acc_index(j, r, e)]
                                                                         * promote(scale, col_scale, r, j, e))
                # Epilogue: bf16 pairs (1d1d: fp32 pairs) from the fragment to D, clipped at the stored rows and N (N
                # even: a pair is in or out); rows the schedule does not keep are stored as 0.
                for j in T.unroll(block_n // 8):
                    for r in T.unroll(2):
                        row = m0 + cw * wgmma.M + wgmma.acc_row(warp, lane, r)
                        col = n0 + wgmma.acc_col(lane, j)
                        if row < sched.stored_rows(info, M) and col < N:
                            if one_d:
                                for e in T.unroll(2):
                                    if accumulate:
                                        Df[T.Cast("int64", row) * ldd + col + e] = (
                                            Df[T.Cast("int64", row) * ldd + col + e] + acc[wgmma.acc_index(j, r, e)])
                                    else:
                                        Df[T.Cast("int64", row) * ldd + col + e] = acc[wgmma.acc_index(j, r, e)]
                            else:
                                if accumulate:
                                    lo, hi = vector.unpack2(Dw[d_word(row, col, info, ldd, ldg)], "bfloat16")
                                    T.evaluate(T.ptx.cvt.rn.bf16x2.f32(packed[0], acc[wgmma.acc_index(j, r, 1)] + hi,
                                                                       acc[wgmma.acc_index(j, r, 0)] + lo))
                                else:
                                    T.evaluate(T.ptx.cvt.rn.bf16x2.f32(packed[0],
                                                                       kept(row, acc[wgmma.acc_index(j, r, 1)]),
                                                                       kept(row, acc[wgmma.acc_index(j, r, 0)])))
                                Dw[d_word(row, col, info, ldd, ldg)] = packed[0]

    unused = {"dense": ("layout_ptr", "ldg"), "m_contiguous": ("ldg",), "m_masked": (),
              "batched": ("layout_ptr",)}[schedule]
    return _drop_params(fp8_gemm_1d2d, unused)


def _drop_params(func, names):
    """``func`` without the parameters called ``names`` (ones its schedule never reads): one kernel source serves
    every argument list."""
    from tvm import tirx

    keep = [p for p in func.params if p.name not in names]
    return func if len(keep) == len(func.params) else tirx.PrimFunc(keep, func.body, func.ret_type, func.attrs)
