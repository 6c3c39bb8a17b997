# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper backward (FlashAttention-3, arXiv 2407.08608; hopper/flash_bwd_kernel_sm90.h,
# hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp and hopper/flash_bwd_launch_template.h of
# https://github.com/Dao-AILab/flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in
# TIRx on tirx-core's Hopper layer; no code is copied.
"""The TIRx generator of the attention backward's main kernel (bf16/fp16, head dims up to 128).

Inputs as the forward's (q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], any 16-byte-multiple batch /
sequence / head strides) plus dO (like the output) and the preprocess's products (``_bwd_pre_post``): LSE in the
log2 domain and delta = rowsum(dO * O) (minus dLSE), fp32 [B, Hq, Sq_pad] with Sq_pad a multiple of ``block_m`` and
the rows past Sq padded (LSE +inf: P = 0 there), the zeroed fp32 dQ accumulator and the zeroed order flags.

One CTA per (KV head x head split, batch, key block of BLOCK_N = 128 rows), key blocks slowest; 384 threads:
- warpgroup 0 (``setmaxnreg`` 40): warp 0 loads K and V of the block once (4-D TMA, zero fill past Sk), then walks
  the query blocks of every query head the CTA serves, Q + LSE and dO + delta of each through two 2-stage
  full/empty rings (TMA + 1-D bulk copies on one mbarrier). Warp 1 writes dQ: per query block it takes each
  consumer's fp32 dQ tile from shared memory and adds it to the global accumulator with one bulk reduction
  (``cp.reduce.async.bulk .add.f32``); in deterministic mode it first waits until the key blocks before it (a fixed
  order, which is also their launch order: key blocks are the grid's slowest dimension) have added theirs, and
  publishes its own turn after (``core.lang.grid_flags``).
- warpgroups 1 and 2 (``setmaxnreg`` 232), 64 key rows each, dK and dV of those rows in registers for the whole
  walk. Per query block (``block_m`` rows), FA3's "SdP swapAB" form: S^T = K Q^T and dP^T = V dO^T (wgmma SS, the
  key rows as M), P^T = exp2(S^T * scale log2 e - LSE) (under the dP^T GEMM) with the causal mask (bottom-right,
  key j visible to query i iff j <= i + Sk - Sq) on the blocks that cross the diagonal, dS^T = P^T (dP^T - delta)
  (block_m 128: LSE / delta shuffled between lanes, FA3's ShuffleLSE, to fit the registers); dV += P^T dO and
  dK += dS^T Q with wgmma RS (P^T and dS^T packed to 16 bits in registers: the accumulator's fragment is the RS A
  fragment); dS^T also goes to shared memory (``stmatrix``, swizzled, MN-major) for dQ = dS K (wgmma SS, both
  operands MN-major), split between the consumers by columns (block_m 64) or rows (block_m 128), accumulated in fp32
  by warp 1.
  Epilogue: dK * softmax_scale and dV rounded and stored (one head split: the outputs; several: fp32 partials that
  ``_bwd_pre_post`` sums over the group).

Rows past Sk read zeros (TMA): their S^T is 0 and P^T = exp2(-LSE) is not, but dP^T = 0 and the K row is 0, so they
add nothing to dQ, and their dK / dV rows are never stored. Query rows past Sq have Q = dO = 0 and LSE +inf: P = 0.
"""

from __future__ import annotations

NUM_CONSUMERS = 2
BLOCK_N = NUM_CONSUMERS * 64  # key rows per CTA: one m64 wgmma row block per consumer
CHUNK = 64  # 16-bit elements of one 128-byte SW128 row: the TMA box's inner extent
NUM_STAGES = 2  # Q / dO ring depth; dS is double-buffered too
SMEM_LIMIT = 232448  # 227 KB
PRODUCER_REGS, CONSUMER_REGS = 40, 232  # 40 + 2 x 232 = 3 x 168 (roles.register_split_fits)
# P^T by ex2.approx.ftz (one MUFU.EX2 a weight; exp2f cost 4 instructions each in the SASS): fewer instructions, the
# same values but for weights below 2^-126.
FAST_EXP2 = True
PDS_BAR = 3  # named barrier over both consumers: their dS^T tiles are in shared memory
DQ_FULL_BAR = 4  # 4 + w: consumer w's dQ tile is in shared memory (its 128 threads arrive, warp 1 syncs)
DQ_EMPTY_BAR = 6  # 6 + w: warp 1 has read consumer w's dQ tile (warp 1 arrives, the consumer syncs)
WAIT_FENCE_BAR = 8  # 8 + w: consumer w's own 128 threads (wait_fence)
DQ_THREADS = 128 + 32
REDUCE_ADD = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"


def padded(d: int) -> int:
    """Head dim rounded up to whole 128-byte swizzle rows (TMA zero-fills the columns past d)."""
    return (d + CHUNK - 1) // CHUNK * CHUNK


def block_m_for(head_dim: int) -> int:
    """Query rows per step: 128 at head dim 64 (S^T of 64 x 128 per consumer, dQ split by rows), else 64 (dQ split
    by columns), FA3's hdim64 / hdim128 tiles."""
    return 128 if padded(head_dim) == 64 else 64


def layout(head_dim: int, head_dim_v: int, block_m: int) -> dict:
    """Element offsets in the 16-bit tile buffer (each 1024-byte aligned) and the fp32 / barrier sizes."""
    dp, dvp = padded(head_dim), padded(head_dim_v)
    off = {"k": 0, "v": BLOCK_N * dp}
    off["q"] = off["v"] + BLOCK_N * dvp
    off["do"] = off["q"] + NUM_STAGES * block_m * dp
    off["ds"] = off["do"] + NUM_STAGES * block_m * dvp
    off["tiles"] = off["ds"] + 2 * block_m * BLOCK_N
    off["dq_floats"] = block_m * dp  # both consumers' dQ tiles
    off["stat_floats"] = NUM_STAGES * block_m  # LSE (and as many delta) per stage
    return off


def smem_bytes(head_dim: int, head_dim_v: int, block_m: int) -> int:
    lay = layout(head_dim, head_dim_v, block_m)
    return 2 * lay["tiles"] + 4 * (lay["dq_floats"] + 2 * lay["stat_floats"]) + 8 * (1 + 4 * NUM_STAGES) + 64


def check_shape(head_dim: int, head_dim_v: int, block_m: int) -> None:
    from tirx_kernels.core.lang import roles

    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d % 16 or not 16 <= d <= 128:
            raise ValueError(f"flash_attention_backward: {name}={d} must be a multiple of 16 in [16, 128] "
                             "(this schedule keeps a 64-row dK and dV per consumer in registers)")
    if block_m not in (64, 128) or (block_m == 64 and padded(head_dim) % 128):
        raise ValueError(f"flash_attention_backward: block_m={block_m} is 128, or 64 with a head dim padded to 128")
    if not roles.register_split_fits(NUM_CONSUMERS, PRODUCER_REGS, CONSUMER_REGS):
        raise ValueError("flash_attention_backward: register split does not fit")
    nbytes = smem_bytes(head_dim, head_dim_v, block_m)
    if nbytes > SMEM_LIMIT:
        raise ValueError(f"flash_attention_backward: {nbytes} B of smem (limit {SMEM_LIMIT})")


def build_bwd_kernel(dtype: str, head_dim: int, head_dim_v: int, causal: bool, block_m: int,
                     fast_exp2: bool = FAST_EXP2, wait_fence: bool = False):
    """``fast_exp2``: P^T by ``ex2.approx.ftz.f32`` (one MUFU.EX2 a weight) instead of ``exp2f`` (ptxas adds a range
    check and two predicated FMULs to each: ``core.lang.softmax.update``'s note).

    NOTES: in the SASS of the hd128 kernel (2026-12-07) the wait for dP^T (WARPGROUP.DEPBAR.LE gsb0, 0x0) sits after
    the first few MUFU.EX2 of P^T, so P^T hardly runs under the dP^T GEMM as the schedule means. Reading delta into
    registers before the wait did not move it (tried, same SASS shape): ptxas's scheduler lifts the wait, with the
    long dS^T / stmatrix / GEMM chain behind it, above the short independent exp2 chains. Issuing dV += P^T dO
    before that wait (it needs P^T and dO only; the wait would then follow a wgmma reading every P^T register) was
    worse on paper: 16 B of spills and ptxas serialized every wgmma of the kernel (a DEPBAR after each HGMMA).
    ``wait_fence``: the wait behind a warpgroup barrier whose id depends on the sum of the thread's P^T values (32
    FADDs; "sum < -1 - Sq" is never true, NaN included, and no compiler can prove it), which no exp2 can sink below: the
    forward's ``Mainloop.wait_fence``. A variant to measure (tools/sweeps/attn_schedules.py)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import bulk, cluster, grid_flags, mbarrier, roles, softmax, tma, wgmma

    check_shape(head_dim, head_dim_v, block_m)
    bm, bn = block_m, BLOCK_N
    dp, dvp = padded(head_dim), padded(head_dim_v)
    q_chunks, v_chunks = dp // CHUNK, dvp // CHUNK
    lay = layout(head_dim, head_dim_v, bm)
    elem = tma.elem_bytes(dtype)
    q_tile, do_tile, ds_tile = bm * dp, bm * dvp, bm * bn  # elements per stage
    s_regs = wgmma.acc_regs(bm)  # S^T / dP^T: 64 key rows x bm queries
    dk_regs, dv_regs = wgmma.acc_regs(dp), wgmma.acc_regs(dvp)
    p_regs = bm // 4  # 16-bit pairs of P^T / dS^T as RS A: 4 b32 registers per k16 step
    row_split = bm == 128  # dQ split between the consumers by query rows (else by head-dim columns)
    shuffle_stats = bm == 128  # load_stats
    dq_n = dp if row_split else dp // 2
    dq_regs = wgmma.acc_regs(dq_n)
    dq_half = bm * dp // 2  # floats of one consumer's dQ tile
    qk_steps, vo_steps = (head_dim + 15) // 16, (head_dim_v + 15) // 16  # K-major reductions skip the pad
    m_steps, n_steps = bm // 16, bn // 16
    mn_step = wgmma.k_step_bytes(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, dtype)  # 16 rows of 128 B
    bm_lbo, bm_sbo = wgmma.desc_offsets(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=bm * 128)
    bn_lbo, bn_sbo = wgmma.desc_offsets(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=bn * 128)
    q_ring = mbarrier.Ring.for_warpgroups(NUM_STAGES, NUM_CONSUMERS, "warpgroup")
    do_ring = mbarrier.Ring.for_warpgroups(NUM_STAGES, NUM_CONSUMERS, "warpgroup")
    q_box = tma.check_box(dtype, [CHUNK, 1, bm, 1])
    kv_box = tma.check_box(dtype, [CHUNK, 1, bn, 1])
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    def first_block(bx, n_blocks, deterministic):
        """The key block of CTA ``bx``. Deterministic causal: the key blocks add a query block's dQ last-first, so
        they launch last-first too (a CTA only ever waits for CTAs launched before it); otherwise the longest
        blocks (causal: the first) launch first."""
        return T.Select(deterministic != 0, n_blocks - 1 - bx, bx) if causal else bx

    def m_first(n0, Sq, Sk):  # noqa: N803
        """The first query block that sees a key of the block at ``n0`` (causal, bottom-right aligned)."""
        return T.max(n0 - (Sk - Sq), 0) // bm if causal else 0

    def dq_order(m, n_block, n_blocks, Sq, Sk):  # noqa: N803
        """This CTA's turn among the key blocks that add to query block ``m`` (deterministic mode): causal, the
        blocks touching it are 0 .. touching - 1 and add last-first; otherwise in key-block order."""
        if causal:
            touching = T.min(n_blocks, ((m + 1) * bm + (Sk - Sq) + bn - 1) // bn)
            return touching - 1 - n_block
        return n_block

    def kmajor(desc, elem_off, row_bytes=0):
        """Descriptor of the K-major tile at ``elem_off`` of the tile buffer, ``row_bytes`` further in."""
        return wgmma.desc_advance(desc[0], elem_off * elem + row_bytes)

    def issue_s_dp(acc, desc, a_off, b_off, b_rows, steps, cw):
        """acc = A B^T with A = 64 rows (consumer cw's keys) of the tile at ``a_off`` and B the ``b_rows``-row tile
        at ``b_off``, both K-major over the head dim (chunks of 64 columns); uncommitted."""
        for kk in range(steps):
            a = kmajor(desc, a_off + (kk // 4) * bn * CHUNK, cw * 64 * 128 + (kk % 4) * 32)
            b = kmajor(desc, b_off + (kk // 4) * b_rows * CHUNK, (kk % 4) * 32)
            wgmma.mma(bm, acc, a, b, dtype, scale_d=kk > 0)

    def issue_rs(acc, n, frag, desc_mn, b_off):
        """acc += A B with A = P^T / dS^T from registers (64 keys x bm queries) and B the query-side tile at
        ``b_off`` read MN-major (head dim contiguous); uncommitted."""
        for kk in range(m_steps):
            wgmma.mma(n, acc, [frag[kk * 4 + i] for i in range(4)],
                      wgmma.desc_advance(desc_mn[0], b_off * elem + kk * mn_step), dtype, b_major=wgmma.MN_MAJOR)

    def issue_dq(acc, desc_mn, ds_off, cw):
        """dQ part of consumer cw = dS K over all bn keys: A = dS^T tile (MN-major: queries contiguous), B = K
        (MN-major: head dim contiguous); the first step overwrites the accumulator; uncommitted."""
        a_chunk = cw if row_split else 0
        b_chunk = 0 if row_split else cw * (dq_n // CHUNK)
        for kk in range(n_steps):
            a = wgmma.desc_advance(desc_mn[0], (ds_off + a_chunk * bn * CHUNK) * elem + kk * mn_step)
            b = wgmma.desc_advance(desc_mn[0], (lay["k"] + b_chunk * bn * CHUNK) * elem + kk * mn_step)
            wgmma.mma(dq_n, acc, a, b, dtype, scale_d=kk > 0, a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)

    def load_stats(stats, lse_s, dlt_s, stat_off, lane):
        """block_m 128 (FA3's shuffled stats): a thread keeps only the LSE and delta of query blocks j = lane // 4 and
        lane // 4 + 8 (columns 8 j + 2 (lane % 4) + e) and hands them to the quad column that needs them by shuffle:
        4 + 4 registers instead of 32 + 32, which the 64 x 128 S^T and dP^T tiles leave no room for."""
        if not shuffle_stats:
            return
        for jj in range(2):
            for e in range(2):
                col = (lane // 4 + 8 * jj) * 8 + (lane % 4) * 2 + e
                T.buffer_store(stats, lse_s[stat_off + col], [jj * 2 + e])
                T.buffer_store(stats, dlt_s[stat_off + col], [4 + jj * 2 + e])

    def stat(stats, lse_s, dlt_s, stat_off, which, j, e, lane):
        """LSE (which 0) or delta (1) of this thread's query column 8 j + 2 (lane % 4) + e."""
        if shuffle_stats:
            return T.cuda.__shfl_sync(T.uint32(0xFFFFFFFF), stats[which * 4 + (j // 8) * 2 + e],
                                      (j % 8) * 4 + lane % 4, 32)
        return (lse_s if which == 0 else dlt_s)[stat_off + wgmma.acc_col(lane, j, e)]

    def p_tile(s_acc, stats, cur, lse_s, dlt_s, stat_off, scale_log2, masked, key0, q0, Sk, Sq, warp, lane):  # noqa: N803
        """In place: s_acc <- P^T = exp2(S^T scale_log2 - LSE[query]), 0 where masked (causal: key > query + Sk -
        Sq). A thread's columns are queries 8 j + 2 (lane % 4) + e."""
        for j in range(bm // 8):
            for e in range(2):
                col = wgmma.acc_col(lane, j, e)
                T.buffer_store(cur, stat(stats, lse_s, dlt_s, stat_off, 0, j, e, lane), [0])
                for r in range(2):
                    idx = wgmma.acc_index(j, r, e)
                    if fast_exp2:
                        T.evaluate(T.ptx.ex2.approx.ftz.f32(s_acc[idx], s_acc[idx] * scale_log2 - cur[0]))
                        p = s_acc[idx]
                    else:
                        p = T.exp2(s_acc[idx] * scale_log2 - cur[0])
                    if masked:
                        key = key0 + wgmma.acc_row(warp, lane, r)
                        p = T.Select(key > q0 + col + (Sk - Sq), T.float32(0), p)
                    if masked or not fast_exp2:
                        T.buffer_store(s_acc, p, [idx])

    def p_tile_masked_where_needed(s_acc, stats, cur, lse_s, dlt_s, stat_off, scale_log2, key0, q0, Sk, Sq,  # noqa: N803
                                   warp, lane):
        """:func:`p_tile`, masked (causal) only where the consumer's 64 keys cross the diagonal of the block."""
        args = (s_acc, stats, cur, lse_s, dlt_s, stat_off, scale_log2)
        if not causal:
            p_tile(*args, False, key0, q0, Sk, Sq, warp, lane)
            return
        with T.If(key0 + 63 > q0 + (Sk - Sq)):
            with T.Then():
                p_tile(*args, True, key0, q0, Sk, Sq, warp, lane)
            with T.Else():
                p_tile(*args, False, key0, q0, Sk, Sq, warp, lane)

    def ds_from_p(s_acc, dp_acc, stats, cur, lse_s, dlt_s, stat_off, lane):
        """In place: dp_acc <- dS^T = P^T (dP^T - delta[query]) (a masked P is 0, so is its dS)."""
        for j in range(bm // 8):
            for e in range(2):
                T.buffer_store(cur, stat(stats, lse_s, dlt_s, stat_off, 1, j, e, lane), [1])
                for r in range(2):
                    idx = wgmma.acc_index(j, r, e)
                    T.buffer_store(dp_acc, s_acc[idx] * (dp_acc[idx] - cur[1]), [idx])

    def store_ds(tiles, ds_frag, ds_off, cw, warp, lane):
        """dS^T (packed pairs of adjacent queries) into the SW128 MN-major tile, key row R of query chunk c at
        ``c * bn * 64 + sw128(R, query % 64)``: one ``stmatrix.x4`` per k16 step (its four 8x8 matrices are the RS
        fragment's four registers: row half i % 2, 8-query block 2 kk + i // 2), lane l addressing row l % 8 of matrix
        l // 8. The swizzle XORs the 16-byte chunk with R % 8 = l % 8: conflict-free."""
        mat = lane // 8
        r8 = lane % 8
        row = cw * 64 + warp * 16 + (mat % 2) * 8 + r8
        x = (mat // 2) ^ r8  # chunk (2 kk) % 8 + mat // 2, XOR r8, is (2 kk) % 8 XOR x: 2 kk % 8 is even
        for kk in range(m_steps):
            off = ds_off + (kk // 4) * bn * CHUNK + row * CHUNK + (((2 * kk) % 8) ^ x) * 8
            T.evaluate(T.ptx["stmatrix.sync.aligned.m8n8.x4.shared.b16"](
                T.cuda.cvta_generic_to_shared(tiles.ptr_to([off])), *[ds_frag[kk * 4 + i] for i in range(4)]))

    @T.prim_func
    def flash_attention_bwd(q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, do_ptr: T.handle,
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
        DKacc = T.match_buffer(dkacc_ptr, (Bacc, Sacc, Hacc, dp), "float32", align=16)
        DVacc = T.match_buffer(dvacc_ptr, (Bacc, Sacc, Hacc, dvp), "float32", align=16)
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
        heads = Hq // Hkv // splits  # query heads this CTA walks, the KV head's group / splits
        h_first = hk * (Hq // Hkv) + (y % splits) * heads
        m_end = (Sq + bm - 1) // bm
        m_begin = m_first(n0, Sq, Sk)
        m_count = T.max(m_end - m_begin, 0)
        total = heads * m_count

        pool = T.SMEMPool()
        Tiles = pool.alloc((lay["tiles"],), dtype, align=1024)
        DQs = pool.alloc((lay["dq_floats"],), "float32", align=128)
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
        dq_acc = T.alloc_local((dq_regs,), "float32")
        p_frag = T.alloc_local((p_regs,), "uint32")
        ds_frag = T.alloc_local((p_regs,), "uint32")
        desc_k = T.alloc_local((1,), "uint64")
        desc_bm = T.alloc_local((1,), "uint64")
        desc_bn = T.alloc_local((1,), "uint64")
        stats = T.alloc_local((8,), "float32")  # shuffled LSE / delta (block_m 128)
        cur = T.alloc_local((2,), "float32")  # the LSE and delta of the column being processed
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
            warp = tid // 32
            lane = tid % 32
            if tid == 0:
                # TMA warp: K and V of the block once, then Q + LSE and dO + delta per (head, query block).
                mbarrier.arrive_expect_tx(kv_full.ptr_to([0]), (q_chunks + v_chunks) * kv_box)
                for c in T.unroll(q_chunks):
                    tma.load(Tiles.ptr_to([lay["k"] + c * bn * CHUNK]), k_map, [c * CHUNK, hk, n0, b],
                             kv_full.ptr_to([0]))
                for c in T.unroll(v_chunks):
                    tma.load(Tiles.ptr_to([lay["v"] + c * bn * CHUNK]), v_map, [c * CHUNK, hk, n0, b],
                             kv_full.ptr_to([0]))
                for hi in T.serial(heads, unroll=False):  # a loop: the 40 producer registers
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
            elif warp == 1:
                # dQ warp: each consumer's fp32 tile added to the global accumulator by one bulk reduction.
                for hi in T.serial(heads, unroll=False):  # a loop: the 40 producer registers
                    for mi in T.serial(m_count, unroll=False):
                        it = hi * m_count + mi
                        h = h_first + hi
                        m = m_begin + mi
                        order = dq_order(m, n_block, n_blocks, Sq, Sk)
                        if deterministic != 0:
                            if lane == 0:
                                grid_flags.wait_for(Sem.ptr_to([b, h, m]), order, seen)
                                # The previous turn's bulk adds (async proxy) seen through a generic acquire: order
                                # them before this turn's bulk adds to the same floats.
                                T.evaluate(T.ptx["fence.proxy.async.global"]())
                        # NOTES: bar.sync / bar.arrive are .aligned (the whole warp executes them together): every
                        # lane-0-only step is followed by a __syncwarp before the next barrier.
                        T.evaluate(T.cuda.warp_sync())
                        for w in T.unroll(NUM_CONSUMERS):
                            cluster.named_sync(DQ_FULL_BAR + w, DQ_THREADS)
                            if lane == 0:
                                T.evaluate(T.ptx[REDUCE_ADD](DQacc.ptr_to([b, h, m * bm * dp + w * dq_half]),
                                                             DQs.ptr_to([w * dq_half]), T.uint32(dq_half * 4)))
                                tma.store_commit()
                            T.evaluate(T.cuda.warp_sync())
                        if lane == 0:
                            if deterministic != 0:
                                tma.store_wait(0)  # the adds are done before the next block's turn
                                grid_flags.publish(Sem.ptr_to([b, h, m]), order + 1)
                            else:
                                tma.store_wait_read(0)
                        T.evaluate(T.cuda.warp_sync())
                        if it < total - 1:  # the consumers skip their first wait: the counts match
                            for w in T.unroll(NUM_CONSUMERS):
                                cluster.named_arrive(DQ_EMPTY_BAR + w, DQ_THREADS)
        else:
            # Math warpgroups: consumer cw owns key rows n0 + 64 cw .. + 63 and their dK, dV.
            cw, ct, warp, lane = roles.consumer_role(wg, tid, CONSUMER_REGS)
            scale_log2 = softmax_scale * T.float32(softmax.LOG2E)
            wgmma.encode_desc_kmajor_sw128(desc_k.ptr_to([0]), Tiles.ptr_to([0]))
            wgmma.encode_desc(desc_bm.ptr_to([0]), Tiles.ptr_to([0]), bm_lbo, bm_sbo, wgmma.SWIZZLE_128B)
            wgmma.encode_desc(desc_bn.ptr_to([0]), Tiles.ptr_to([0]), bn_lbo, bn_sbo, wgmma.SWIZZLE_128B)
            for i in T.unroll(dk_regs):
                dk_acc[i] = T.float32(0)
            for i in T.unroll(dv_regs):
                dv_acc[i] = T.float32(0)
            key0 = n0 + cw * 64
            mbarrier.wait(kv_full.ptr_to([0]), 0)
            for hi in range(heads):
                for mi in range(m_count):
                    it = hi * m_count + mi
                    m0 = (m_begin + mi) * bm
                    s = q_ring.stage(it)
                    ds_off = lay["ds"] + (it % 2) * ds_tile
                    # S^T = K Q^T and dP^T = V dO^T (SS), each as soon as its operands landed.
                    q_ring.consumer_wait(q_full, it)
                    wgmma.fence()
                    issue_s_dp(s_acc, desc_k, lay["k"], lay["q"] + s * q_tile, bm, qk_steps, cw)
                    wgmma.commit()
                    do_ring.consumer_wait(do_full, it)
                    issue_s_dp(dp_acc, desc_k, lay["v"], lay["do"] + s * do_tile, bm, vo_steps, cw)
                    wgmma.commit()
                    wgmma.wait(1)  # S^T has landed: P^T under the dP^T GEMM
                    load_stats(stats, LSEs, Dlts, s * bm, lane)
                    p_tile_masked_where_needed(s_acc, stats, cur, LSEs, Dlts, s * bm, scale_log2, key0, m0, Sk, Sq,
                                               warp, lane)
                    if wait_fence:
                        T.buffer_store(cur, T.float32(0), [0])
                        for i in range(s_regs):
                            T.buffer_store(cur, cur[0] + s_acc[i], [0])
                        # ptxas knows the weights are >= 0 and folded "sum < 0" (this sum starts at 0, unlike the
                        # forward's loop-carried row sum); against -1 - Sq (a run-time value) it cannot
                        dep = T.Select(cur[0] < T.Cast("float32", -1 - Sq), 1, 0)
                        T.evaluate(T.cuda.warpgroup_sync(WAIT_FENCE_BAR + cw + dep))
                    wgmma.wait(0)
                    ds_from_p(s_acc, dp_acc, stats, cur, LSEs, Dlts, s * bm, lane)
                    softmax.pack_p(p_frag, s_acc, bm, cvt_pack)
                    softmax.pack_p(ds_frag, dp_acc, bm, cvt_pack)
                    store_ds(Tiles, ds_frag, ds_off, cw, warp, lane)
                    # dV += P^T dO (RS); then, once both consumers' dS^T are in smem, dQ = dS K and dK += dS^T Q.
                    wgmma.fence()
                    issue_rs(dv_acc, dvp, p_frag, desc_bm, lay["do"] + s * do_tile)
                    wgmma.commit()
                    tma.fence_proxy_async()
                    cluster.named_sync(PDS_BAR, NUM_CONSUMERS * 128)
                    issue_dq(dq_acc, desc_bn, ds_off, cw)
                    wgmma.commit()
                    issue_rs(dk_acc, dp, ds_frag, desc_bm, lay["q"] + s * q_tile)
                    wgmma.commit()
                    wgmma.wait(1)  # dV and dQ have landed; dK may still run
                    do_ring.consumer_release_warpgroup(do_empty, s, warp, lane)
                    if it > 0:
                        cluster.named_sync(DQ_EMPTY_BAR + cw, DQ_THREADS)
                    for i in T.unroll(dq_regs // 4):
                        T.evaluate(T.ptx.st.shared.v4.b32(
                            DQs.ptr_to([cw * dq_half + (i * 128 + ct) * 4]),
                            *[T.reinterpret("uint32", dq_acc[i * 4 + e]) for e in range(4)]))
                    tma.fence_proxy_async()
                    cluster.named_arrive(DQ_FULL_BAR + cw, DQ_THREADS)
                    wgmma.wait(0)
                    q_ring.consumer_release_warpgroup(q_empty, s, warp, lane)

            # Epilogue: dK * softmax_scale and dV, rows below Sk; 16-bit outputs, or fp32 partials of a head split.
            DKw = T.decl_buffer((B * Sk * Hkv * head_dim // 2,), "uint32", data=DK.data)
            DVw = T.decl_buffer((B * Sk * Hkv * head_dim_v // 2,), "uint32", data=DV.data)
            for r in T.unroll(2):
                row = key0 + wgmma.acc_row(warp, lane, r)
                if row < Sk:
                    if splits == 1:
                        kbase = ((b * Sk + row) * Hkv + hk) * head_dim
                        vbase = ((b * Sk + row) * Hkv + hk) * head_dim_v
                        for j in T.unroll(head_dim // 8):
                            col = wgmma.acc_col(lane, j)
                            T.evaluate(cvt_pack(packed[0], dk_acc[wgmma.acc_index(j, r, 1)] * softmax_scale,
                                                dk_acc[wgmma.acc_index(j, r, 0)] * softmax_scale))
                            DKw[(kbase + col) // 2] = packed[0]
                        for j in T.unroll(head_dim_v // 8):
                            col = wgmma.acc_col(lane, j)
                            T.evaluate(cvt_pack(packed[0], dv_acc[wgmma.acc_index(j, r, 1)],
                                                dv_acc[wgmma.acc_index(j, r, 0)]))
                            DVw[(vbase + col) // 2] = packed[0]
                    else:
                        for j in T.unroll(head_dim // 8):
                            for e in T.unroll(2):
                                DKacc[b, row, y, wgmma.acc_col(lane, j, e)] = (
                                    dk_acc[wgmma.acc_index(j, r, e)] * softmax_scale)
                        for j in T.unroll(head_dim_v // 8):
                            for e in T.unroll(2):
                                DVacc[b, row, y, wgmma.acc_col(lane, j, e)] = dv_acc[wgmma.acc_index(j, r, e)]

    return flash_attention_bwd
