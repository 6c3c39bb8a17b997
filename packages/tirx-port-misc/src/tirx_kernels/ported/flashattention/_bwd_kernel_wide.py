# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper backward at head dims 192 / 256 (FlashAttention-3; hopper/
# mainloop_bwd_sm90_tma_gmma_ws.hpp with the hdim192 / hdim256 tiles of hopper/flash_bwd_launch_template.h and FA4's
# flash_attn/cute/interface.py::_tile_size_bwd_sm90, https://github.com/Dao-AILab/flash-attention at commit
# 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in TIRx; no code is copied.
"""The attention backward's main kernel for wide heads (head dims 192 and 256, and 192 / 128): same arguments, same
preprocess / postprocess and the same fp32 dQ accumulator layout as ``_bwd_kernel`` (the <= 128 schedule).

A 64-key block's dK and dV (64 x 256 fp32 each) do not fit one warpgroup's registers, so the consumers split the head
dims instead of the keys (FA3's hdim256 tile: no "swapAB", P and dS through shared memory):
- per query block of 64 rows, consumer w computes S and dP for the block's keys 32 w .. 32 w + 31 (wgmma SS m64n32,
  the queries as M: its LSE / delta are two rows' worth, read from shared memory), P and dS, and writes both (16-bit)
  into [query][key] SW128 tiles by ``stmatrix``;
- after a barrier of both consumers, consumer w owns head-dim columns w * D_pad / 2 .. of dV += P^T dO, dK += dS^T Q
  (A = the P / dS tile read MN-major: the keys contiguous) and dQ = dS K (A = the dS tile K-major), all wgmma SS;
- dQ is added to the fp32 accumulator straight from the registers (``red.global.add.v4.f32``, FA3's choice at head dim
  256: a shared-memory dQ tile would not fit beside two Q / dO stages). Deterministic mode: one consumer thread waits
  for the block's turn, both consumers add, then it publishes the next turn.
Head dims are padded to 256 for the GEMMs' N (192 + 64 columns that are never loaded nor stored: the consumer's
64-column halves stay whole swizzle rows); the reductions over the head dim (S, dP) run over the true D and Dv.
"""

from __future__ import annotations

from tirx_kernels.ported.flashattention._bwd_kernel import CHUNK, NUM_CONSUMERS, NUM_STAGES, SMEM_LIMIT, padded

BLOCK_M = 64  # query rows per step
BLOCK_N = 64  # key rows per CTA
PRODUCER_REGS, CONSUMER_REGS = 40, 232
PDS_BAR = 3  # named barrier over both consumers: P and dS are in shared memory
DET_BAR = 4  # deterministic mode: the dQ turn (before the adds) and its end (after them)


def wide_dim(d: int) -> int:
    """The GEMMs' padded N: a multiple of 128, so that each consumer's half is whole 64-column swizzle rows."""
    return (d + 127) // 128 * 128


def layout(head_dim: int, head_dim_v: int) -> dict:
    dw, dvw = wide_dim(head_dim), wide_dim(head_dim_v)
    off = {"k": 0, "v": BLOCK_N * dw}
    off["q"] = off["v"] + BLOCK_N * dvw
    off["do"] = off["q"] + NUM_STAGES * BLOCK_M * dw
    off["p"] = off["do"] + NUM_STAGES * BLOCK_M * dvw  # 2 stages of P then dS, 64 x 64 each
    off["tiles"] = off["p"] + 2 * 2 * BLOCK_M * BLOCK_N
    off["stat_floats"] = NUM_STAGES * BLOCK_M
    return off


def smem_bytes(head_dim: int, head_dim_v: int) -> int:
    lay = layout(head_dim, head_dim_v)
    return 2 * lay["tiles"] + 4 * 2 * lay["stat_floats"] + 8 * (1 + 4 * NUM_STAGES) + 64


def check_shape(head_dim: int, head_dim_v: int) -> None:
    from tirx_kernels.core.lang import roles

    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d % 16 or not 16 <= d <= 256:
            raise ValueError(f"flash_attention_backward: {name}={d} must be a multiple of 16 in [16, 256]")
    if not roles.register_split_fits(NUM_CONSUMERS, PRODUCER_REGS, CONSUMER_REGS):
        raise ValueError("flash_attention_backward: register split does not fit")
    nbytes = smem_bytes(head_dim, head_dim_v)
    if nbytes > SMEM_LIMIT:
        raise ValueError(f"flash_attention_backward: {nbytes} B of smem (limit {SMEM_LIMIT})")


def build_bwd_kernel_wide(dtype: str, head_dim: int, head_dim_v: int, causal: bool):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import bulk, cluster, grid_flags, mbarrier, roles, softmax, tma, wgmma

    check_shape(head_dim, head_dim_v)
    bm, bn = BLOCK_M, BLOCK_N
    dw, dvw = wide_dim(head_dim), wide_dim(head_dim_v)
    dp, dvp = padded(head_dim), padded(head_dim_v)  # columns loaded (the rest of a wide tile is never read)
    q_chunks, v_chunks = dp // CHUNK, dvp // CHUNK
    lay = layout(head_dim, head_dim_v)
    elem = tma.elem_bytes(dtype)
    q_tile, do_tile, pds_tile = bm * dw, bm * dvw, bm * bn
    half_n = bn // NUM_CONSUMERS  # keys of S / dP per consumer
    s_regs = wgmma.acc_regs(half_n)
    dk_n, dv_n = dw // NUM_CONSUMERS, dvw // NUM_CONSUMERS  # head-dim columns of dK, dQ / dV per consumer
    dk_regs, dv_regs = wgmma.acc_regs(dk_n), wgmma.acc_regs(dv_n)
    dq_half = bm * dw // 2  # floats of one consumer's part of a query block's dQ accumulator
    qk_steps, vo_steps = (head_dim + 15) // 16, (head_dim_v + 15) // 16
    key_steps = bn // 16  # reductions over the keys (dQ) and the queries (dK, dV: bm = bn)
    mn_step = wgmma.k_step_bytes(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, dtype)
    mn_lbo, mn_sbo = wgmma.desc_offsets(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=bm * 128)
    q_ring = mbarrier.Ring.for_warpgroups(NUM_STAGES, NUM_CONSUMERS, "warpgroup")
    do_ring = mbarrier.Ring.for_warpgroups(NUM_STAGES, NUM_CONSUMERS, "warpgroup")
    q_box = tma.check_box(dtype, [CHUNK, 1, bm, 1])
    kv_box = tma.check_box(dtype, [CHUNK, 1, bn, 1])
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    def first_block(bx, n_blocks, deterministic):
        """As ``_bwd_kernel``: deterministic causal launches the key blocks last-first (the order they add dQ)."""
        return T.Select(deterministic != 0, n_blocks - 1 - bx, bx) if causal else bx

    def m_first(n0, Sq, Sk):  # noqa: N803
        return T.max(n0 - (Sk - Sq), 0) // bm if causal else 0

    def dq_order(m, n_block, n_blocks, Sq, Sk):  # noqa: N803
        if causal:
            touching = T.min(n_blocks, ((m + 1) * bm + (Sk - Sq) + bn - 1) // bn)
            return touching - 1 - n_block
        return n_block

    def kdesc(desc, elem_off, row_bytes=0):
        return wgmma.desc_advance(desc[0], elem_off * elem + row_bytes)

    def issue_s_dp(acc, desc_k, a_off, b_off, steps, cw):
        """acc = A B^T, A = the 64-row query-side tile at ``a_off``, B = keys 32 cw .. + 31 of the key-side tile at
        ``b_off``, both K-major over the head dim; uncommitted."""
        for kk in range(steps):
            a = kdesc(desc_k, a_off + (kk // 4) * bm * CHUNK, (kk % 4) * 32)
            b = kdesc(desc_k, b_off + (kk // 4) * bn * CHUNK, cw * half_n * 128 + (kk % 4) * 32)
            wgmma.mma(half_n, acc, a, b, dtype, scale_d=kk > 0)

    def issue_t(acc, n, desc_mn, a_off, b_off, cw):
        """acc += A^T B: A = the P or dS tile read MN-major (64 keys contiguous per query row), B = consumer cw's
        columns of the query-side tile at ``b_off`` (MN-major); uncommitted."""
        for kk in range(key_steps):
            a = wgmma.desc_advance(desc_mn[0], a_off * elem + kk * mn_step)
            b = wgmma.desc_advance(desc_mn[0], (b_off + cw * (n // CHUNK) * bm * CHUNK) * elem + kk * mn_step)
            wgmma.mma(n, acc, a, b, dtype, a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)

    def issue_dq(acc, desc_k, desc_mn, ds_off, cw):
        """dQ part of consumer cw = dS K: A = the dS tile K-major (keys contiguous), B = K's columns of consumer cw
        read MN-major; the first step overwrites the accumulator; uncommitted."""
        for kk in range(key_steps):
            a = kdesc(desc_k, ds_off, kk * 32)
            b = wgmma.desc_advance(desc_mn[0], (lay["k"] + cw * (dk_n // CHUNK) * bn * CHUNK) * elem + kk * mn_step)
            wgmma.mma(dk_n, acc, a, b, dtype, scale_d=kk > 0, b_major=wgmma.MN_MAJOR)

    def p_ds(s_acc, dp_acc, lse_s, dlt_s, stat_off, scale_log2, masked, key0, q0, Sk, Sq, warp, lane):  # noqa: N803
        """In place: s_acc <- P = exp2(S scale_log2 - LSE[query]) (0 where masked), dp_acc <- dS = P (dP -
        delta[query]); a thread's rows are queries 16 warp + lane / 4 + 8 r, its columns keys key0 + acc_col."""
        for r in range(2):
            row = wgmma.acc_row(warp, lane, r)
            lse = lse_s[stat_off + row]
            dlt = dlt_s[stat_off + row]
            for j in range(half_n // 8):
                for e in range(2):
                    idx = wgmma.acc_index(j, r, e)
                    p = T.exp2(s_acc[idx] * scale_log2 - lse)
                    if masked:
                        p = T.Select(key0 + wgmma.acc_col(lane, j, e) > q0 + row + (Sk - Sq), T.float32(0), p)
                    T.buffer_store(s_acc, p, [idx])
                    T.buffer_store(dp_acc, s_acc[idx] * (dp_acc[idx] - dlt), [idx])

    def p_ds_tile(s_acc, dp_acc, lse_s, dlt_s, stat_off, scale_log2, key0, q0, Sk, Sq, warp, lane):  # noqa: N803
        args = (s_acc, dp_acc, lse_s, dlt_s, stat_off, scale_log2)
        if not causal:
            p_ds(*args, False, key0, q0, Sk, Sq, warp, lane)
            return
        with T.If(key0 + half_n - 1 > q0 + (Sk - Sq)):  # the consumer's keys cross the diagonal
            with T.Then():
                p_ds(*args, True, key0, q0, Sk, Sq, warp, lane)
            with T.Else():
                p_ds(*args, False, key0, q0, Sk, Sq, warp, lane)

    def store_tile(tiles, frag, tile_off, cw, warp, lane):
        """P or dS (packed pairs of adjacent keys, rows = queries) into the [query][key] SW128 tile: one
        ``stmatrix.x4`` per 16 keys, lane l addressing row l % 8 of matrix l // 8 (matrix i: row half i % 2, 8-key
        block 2 kk + i // 2 of the consumer's 32 keys)."""
        mat = lane // 8
        r8 = lane % 8
        row = warp * 16 + (mat % 2) * 8 + r8
        for kk in range(half_n // 16):
            chunk = cw * (half_n // 8) + 2 * kk + mat // 2
            off = tile_off + row * CHUNK + (chunk ^ r8) * 8
            T.evaluate(T.ptx["stmatrix.sync.aligned.m8n8.x4.shared.b16"](
                T.cuda.cvta_generic_to_shared(tiles.ptr_to([off])), *[frag[kk * 4 + i] for i in range(4)]))

    @T.prim_func
    def flash_attention_bwd_wide(q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, do_ptr: T.handle,
                                 lse_ptr: T.handle, dlt_ptr: T.handle, dqacc_ptr: T.handle, sem_ptr: T.handle,
                                 dk_ptr: T.handle, dv_ptr: T.handle, dkacc_ptr: T.handle, dvacc_ptr: T.handle,
                                 softmax_scale: T.float32, splits: T.int32, deterministic: T.int32):
        B = T.int32()
        Sq = T.int32()
        Sk = T.int32()
        Hq = T.int32()
        Hkv = T.int32()
        SqPad = T.int32()
        MBlocks = T.int32()
        QAcc = T.int32()
        Bacc = T.int32()
        Sacc = T.int32()
        Hacc = T.int32()
        q_sb, q_ss, q_sh = T.int32(), T.int32(), T.int32()
        k_sb, k_ss, k_sh = T.int32(), T.int32(), T.int32()
        v_sb, v_ss, v_sh = T.int32(), T.int32(), T.int32()
        o_sb, o_ss, o_sh = T.int32(), T.int32(), T.int32()
        Q = T.match_buffer(q_ptr, (B, Sq, Hq, head_dim), dtype, strides=(q_sb, q_ss, q_sh, 1), align=16)
        K = T.match_buffer(k_ptr, (B, Sk, Hkv, head_dim), dtype, strides=(k_sb, k_ss, k_sh, 1), align=16)
        V = T.match_buffer(v_ptr, (B, Sk, Hkv, head_dim_v), dtype, strides=(v_sb, v_ss, v_sh, 1), align=16)
        dO = T.match_buffer(do_ptr, (B, Sq, Hq, head_dim_v), dtype, strides=(o_sb, o_ss, o_sh, 1), align=16)
        LSE2 = T.match_buffer(lse_ptr, (B, Hq, SqPad), "float32", align=16)
        Dlt = T.match_buffer(dlt_ptr, (B, Hq, SqPad), "float32", align=16)
        DQacc = T.match_buffer(dqacc_ptr, (B, Hq, QAcc), "float32", align=16)
        Sem = T.match_buffer(sem_ptr, (B, Hq, MBlocks), "int32", align=16)
        DK = T.match_buffer(dk_ptr, (B, Sk, Hkv, head_dim), dtype, align=16)
        DV = T.match_buffer(dv_ptr, (B, Sk, Hkv, head_dim_v), dtype, align=16)
        DKacc = T.match_buffer(dkacc_ptr, (Bacc, Sacc, Hacc, dw), "float32", align=16)
        DVacc = T.match_buffer(dvacc_ptr, (Bacc, Sacc, Hacc, dvw), "float32", align=16)
        q_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        do_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(q_map, Q.data, [head_dim, Hq, Sq, B], [q_sh, q_ss, q_sb], [CHUNK, 1, bm, 1], dtype)
        tma.encode(k_map, K.data, [head_dim, Hkv, Sk, B], [k_sh, k_ss, k_sb], [CHUNK, 1, bn, 1], dtype)
        tma.encode(v_map, V.data, [head_dim_v, Hkv, Sk, B], [v_sh, v_ss, v_sb], [CHUNK, 1, bn, 1], dtype)
        tma.encode(do_map, dO.data, [head_dim_v, Hq, Sq, B], [o_sh, o_ss, o_sb], [CHUNK, 1, bm, 1], dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        # Key blocks slowest: the hardware launches every (head, batch) of key block 0 (causal: the most query
        # blocks) first, then block 1, ... (longest first over the whole grid, FA3's LPT order).
        y, b, bx = T.cta_id([Hkv * splits, B, (Sk + bn - 1) // bn])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        n_blocks = (Sk + bn - 1) // bn
        n_block = first_block(bx, n_blocks, deterministic)
        n0 = n_block * bn
        hk = y // splits
        heads = Hq // Hkv // splits
        h_first = hk * (Hq // Hkv) + (y % splits) * heads
        m_begin = m_first(n0, Sq, Sk)
        m_count = T.max((Sq + bm - 1) // bm - m_begin, 0)

        pool = T.SMEMPool()
        Tiles = pool.alloc((lay["tiles"],), dtype, align=1024)
        LSEs = pool.alloc((lay["stat_floats"],), "float32", align=16)
        Dlts = pool.alloc((lay["stat_floats"],), "float32", align=16)
        kv_full = pool.alloc((1,), "uint64", align=8)
        q_full = pool.alloc((NUM_STAGES,), "uint64", align=8)
        q_empty = pool.alloc((NUM_STAGES,), "uint64", align=8)
        do_full = pool.alloc((NUM_STAGES,), "uint64", align=8)
        do_empty = pool.alloc((NUM_STAGES,), "uint64", align=8)
        pool.commit()
        s_acc = T.alloc_local((s_regs,), "float32")
        dp_acc = T.alloc_local((s_regs,), "float32")
        dk_acc = T.alloc_local((dk_regs,), "float32")
        dv_acc = T.alloc_local((dv_regs,), "float32")
        dq_acc = T.alloc_local((dk_regs,), "float32")
        p_frag = T.alloc_local((s_regs // 2,), "uint32")
        ds_frag = T.alloc_local((s_regs // 2,), "uint32")
        desc_k = T.alloc_local((1,), "uint64")
        desc_mn = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")
        seen = T.alloc_local((1,), "int32")

        if tid == 0:
            mbarrier.init(kv_full.ptr_to([0]), 1)
            q_ring.init(q_full, q_empty)
            do_ring.init(do_full, do_empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()

        if wg == 0:
            roles.producer_role(PRODUCER_REGS)
            if tid == 0:
                mbarrier.arrive_expect_tx(kv_full.ptr_to([0]), (q_chunks + v_chunks) * kv_box)
                for c in T.unroll(q_chunks):
                    tma.load(Tiles.ptr_to([lay["k"] + c * bn * CHUNK]), k_map, [c * CHUNK, hk, n0, b],
                             kv_full.ptr_to([0]))
                for c in T.unroll(v_chunks):
                    tma.load(Tiles.ptr_to([lay["v"] + c * bn * CHUNK]), v_map, [c * CHUNK, hk, n0, b],
                             kv_full.ptr_to([0]))
                for hi in T.serial(heads, unroll=False):
                    for mi in T.serial(m_count, unroll=False):
                        it = hi * m_count + mi
                        h = h_first + hi
                        m0 = (m_begin + mi) * bm
                        s = q_ring.stage(it)
                        q_ring.producer_acquire(q_empty, it)
                        q_ring.producer_expect(q_full, it, q_chunks * q_box + bm * 4)
                        for c in T.unroll(q_chunks):
                            tma.load(Tiles.ptr_to([lay["q"] + s * q_tile + c * bm * CHUNK]), q_map,
                                     [c * CHUNK, h, m0, b], q_full.ptr_to([s]))
                        bulk.load(LSEs.ptr_to([s * bm]), LSE2.ptr_to([b, h, m0]), bm * 4, q_full.ptr_to([s]))
                        do_ring.producer_acquire(do_empty, it)
                        do_ring.producer_expect(do_full, it, v_chunks * q_box + bm * 4)
                        for c in T.unroll(v_chunks):
                            tma.load(Tiles.ptr_to([lay["do"] + s * do_tile + c * bm * CHUNK]), do_map,
                                     [c * CHUNK, h, m0, b], do_full.ptr_to([s]))
                        bulk.load(Dlts.ptr_to([s * bm]), Dlt.ptr_to([b, h, m0]), bm * 4, do_full.ptr_to([s]))
        else:
            cw, ct, warp, lane = roles.consumer_role(wg, tid, CONSUMER_REGS)
            scale_log2 = softmax_scale * T.float32(softmax.LOG2E)
            wgmma.encode_desc_kmajor_sw128(desc_k.ptr_to([0]), Tiles.ptr_to([0]))
            wgmma.encode_desc(desc_mn.ptr_to([0]), Tiles.ptr_to([0]), mn_lbo, mn_sbo, wgmma.SWIZZLE_128B)
            for i in T.unroll(dk_regs):
                dk_acc[i] = T.float32(0)
            for i in T.unroll(dv_regs):
                dv_acc[i] = T.float32(0)
            mbarrier.wait(kv_full.ptr_to([0]), 0)
            for hi in range(heads):
                for mi in range(m_count):
                    it = hi * m_count + mi
                    h = h_first + hi
                    m = m_begin + mi
                    s = q_ring.stage(it)
                    p_off = lay["p"] + (it % 2) * 2 * pds_tile
                    ds_off = p_off + pds_tile
                    # S and dP of the consumer's 32 keys (SS), P and dS, both tiles to shared memory.
                    q_ring.consumer_wait(q_full, it)
                    wgmma.fence()
                    issue_s_dp(s_acc, desc_k, lay["q"] + s * q_tile, lay["k"], qk_steps, cw)
                    wgmma.commit()
                    do_ring.consumer_wait(do_full, it)
                    issue_s_dp(dp_acc, desc_k, lay["do"] + s * do_tile, lay["v"], vo_steps, cw)
                    wgmma.commit()
                    wgmma.wait(0)
                    p_ds_tile(s_acc, dp_acc, LSEs, Dlts, s * bm, scale_log2, n0 + cw * half_n, m * bm, Sk, Sq,
                              warp, lane)
                    softmax.pack_p(p_frag, s_acc, half_n, cvt_pack)
                    softmax.pack_p(ds_frag, dp_acc, half_n, cvt_pack)
                    store_tile(Tiles, p_frag, p_off, cw, warp, lane)
                    store_tile(Tiles, ds_frag, ds_off, cw, warp, lane)
                    tma.fence_proxy_async()
                    cluster.named_sync(PDS_BAR, NUM_CONSUMERS * 128)
                    # The consumer's head-dim columns: dV += P^T dO, dQ = dS K, dK += dS^T Q (SS).
                    wgmma.fence()
                    issue_t(dv_acc, dv_n, desc_mn, p_off, lay["do"] + s * do_tile, cw)
                    wgmma.commit()
                    issue_dq(dq_acc, desc_k, desc_mn, ds_off, cw)
                    wgmma.commit()
                    issue_t(dk_acc, dk_n, desc_mn, ds_off, lay["q"] + s * q_tile, cw)
                    wgmma.commit()
                    wgmma.wait(1)  # dV and dQ have landed
                    do_ring.consumer_release_warpgroup(do_empty, s, warp, lane)
                    if deterministic != 0:
                        if T.And(cw == 0, ct == 0):
                            grid_flags.wait_for(Sem.ptr_to([b, h, m]), dq_order(m, n_block, n_blocks, Sq, Sk), seen)
                        T.evaluate(T.cuda.warp_sync())  # bar.sync is .aligned: the warp reconverges first
                        cluster.named_sync(DET_BAR, NUM_CONSUMERS * 128)
                    base = m * bm * dw + cw * dq_half
                    for i in T.unroll(dk_regs // 4):
                        T.evaluate(T.ptx["red.global.add.v4.f32"](DQacc.ptr_to([b, h, base + (i * 128 + ct) * 4]),
                                                                  *[dq_acc[i * 4 + e] for e in range(4)]))
                    if deterministic != 0:
                        cluster.named_sync(DET_BAR, NUM_CONSUMERS * 128)
                        if T.And(cw == 0, ct == 0):
                            grid_flags.publish(Sem.ptr_to([b, h, m]), dq_order(m, n_block, n_blocks, Sq, Sk) + 1)
                        T.evaluate(T.cuda.warp_sync())
                    wgmma.wait(0)
                    q_ring.consumer_release_warpgroup(q_empty, s, warp, lane)

            # Epilogue: keys n0 .. n0 + 63 (rows), the consumer's head-dim columns.
            DKw = T.decl_buffer((B * Sk * Hkv * head_dim // 2,), "uint32", data=DK.data)
            DVw = T.decl_buffer((B * Sk * Hkv * head_dim_v // 2,), "uint32", data=DV.data)
            for r in T.unroll(2):
                row = n0 + wgmma.acc_row(warp, lane, r)
                if row < Sk:
                    for j in T.unroll(dk_n // 8):
                        col = cw * dk_n + wgmma.acc_col(lane, j)
                        if col < head_dim:
                            if splits == 1:
                                T.evaluate(cvt_pack(packed[0], dk_acc[wgmma.acc_index(j, r, 1)] * softmax_scale,
                                                    dk_acc[wgmma.acc_index(j, r, 0)] * softmax_scale))
                                DKw[(((b * Sk + row) * Hkv + hk) * head_dim + col) // 2] = packed[0]
                            else:
                                for e in T.unroll(2):
                                    DKacc[b, row, y, col + e] = dk_acc[wgmma.acc_index(j, r, e)] * softmax_scale
                    for j in T.unroll(dv_n // 8):
                        col = cw * dv_n + wgmma.acc_col(lane, j)
                        if col < head_dim_v:
                            if splits == 1:
                                T.evaluate(cvt_pack(packed[0], dv_acc[wgmma.acc_index(j, r, 1)],
                                                    dv_acc[wgmma.acc_index(j, r, 0)]))
                                DVw[(((b * Sk + row) * Hkv + hk) * head_dim_v + col) // 2] = packed[0]
                            else:
                                for e in T.unroll(2):
                                    DVacc[b, row, y, col + e] = dv_acc[wgmma.acc_index(j, r, e)]

    return flash_attention_bwd_wide
