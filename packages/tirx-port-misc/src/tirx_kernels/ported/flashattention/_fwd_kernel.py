# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper forward (FlashAttention-3, arXiv 2407.08608; hopper/softmax.h,
# hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp, hopper/flash_fwd_kernel_sm90.h of
# https://github.com/Dao-AILab/flash-attention at the package's pinned commit
# 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in TIRx on tirx-core's Hopper layer; no code is copied.
"""The TIRx generator of ``flash_attention4``'s forward kernel (bf16/fp16, head dims up to 256).

Layout (flash-attn's batch-padded convention): q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], out
[B, Sq, Hq, Dv] (contiguous), lse [B, Hq, Sq] fp32 natural-log. q/k/v have unit stride in the head dim and any
batch/sequence/head strides (16-byte multiples, what TMA takes); the sizes and strides are run-time arguments.

One CTA per (128-query tile, query head, batch); 384 threads:
- warpgroup 0, the producer: ``setmaxnreg`` down to 40; one thread issues the TMA loads, Q once, then K and V of
  each key tile through two ``num_stages`` full/empty rings (separate rings so that S = Q K^T of a tile starts
  while its V is still in flight). A 4-D tensor map per operand (D, heads, seq, batch) makes TMA zero-fill the
  rows past Sq / Sk of *this* batch entry and the columns past D: ragged tails need no other handling in the loads.
- warpgroups 1 and 2, the consumers: 64 query rows each (rows 64 w .. 64 w + 63 of the tile). Per key tile:
  S = Q K^T with wgmma SS (both operands K-major, SW128), the mask (keys past Sk; causal, bottom-right aligned:
  key j is visible to query i iff j <= i + Sk - Sq), the online softmax on the accumulator fragment in the
  exp2 domain (``softmax_scale * log2 e`` folded into one FFMA per element, as FA3), P converted to 16-bit pairs
  *in registers* and O += P V with wgmma RS (P's m64 A fragment is exactly the S accumulator's layout, two S
  column blocks per k16 step, no shuffles), V read MN-major from smem (the transpose bit). Epilogue: O / rowsum
  stored from the registers, LSE = (max * scale log2 e + log2 rowsum) * ln 2 from lane 0 of each quad.
- Rows with no visible key (causal with Sq > Sk) get O = 0 and LSE = -inf.

The CTAs of a head are launched longest-first (the last query tile first): with causal masking the tiles' work
grows with the query index, so the long ones start early and the short ones fill the tail of the wave.

Schedules: ``plain`` (each consumer S, softmax, PV in turn), ``pingpong`` and ``overlap`` (the default).
``pingpong``: the consumers take turns issuing their GEMMs through
named barriers (``roles.wait_turn`` / ``pass_turn``, barriers 3 and 4): QK^T of consumer 0, QK^T of consumer 1, PV of
consumer 0, PV of consumer 1, ..., so one warpgroup's softmax runs while the other's GEMM holds the tensor cores
(FA3's inter-warpgroup overlap). Both consumers read every K/V use, so the turns need no ring-phase argument; the
counts match because consumer 0 skips its first wait and consumer 1 its last pass.

``overlap`` adds FA3's intra-warpgroup overlap on top: QK^T of tile n and PV of tile n - 1 are issued together (one
turn per tile), the softmax of tile n runs while PV n - 1 is on the tensor cores, and O is rescaled once it landed
(same registers as ``plain``: P of tile n - 1, S of tile n and O are live together in both).

Not yet (see the package README): a persistent scheduler, and sliding window, softcap, sink, varlen, paged KV.
"""

from __future__ import annotations

NUM_CONSUMERS = 2
BLOCK_M = NUM_CONSUMERS * 64  # one m64 wgmma row block per consumer
WG_BAR = 1  # named barriers 1, 2: consumer w's 128 threads
TURN_BAR = 3  # named barriers 3, 4: consumer w's turn to issue a GEMM (ping-pong)
CHUNK = 64  # 16-bit elements of one 128-byte SW128 row: the TMA box's inner extent
SMEM_LIMIT = 232448  # 227 KB, what ran on the H200 (HOPPER_TIRX.md)


def padded(d: int) -> int:
    """Head dim rounded up to whole 128-byte swizzle rows (TMA zero-fills the columns past d)."""
    return (d + CHUNK - 1) // CHUNK * CHUNK


def smem_bytes(head_dim: int, head_dim_v: int, block_n: int, num_stages: int) -> int:
    """The pool: Q tile, the K and V rings, the barriers (1 + 4 x num_stages)."""
    return 2 * (BLOCK_M * padded(head_dim) + num_stages * block_n * (padded(head_dim) + padded(head_dim_v))) \
        + 8 * (1 + 4 * num_stages)


def check_shape(head_dim: int, head_dim_v: int, block_n: int, num_stages: int) -> None:
    """Trace-time limits of the generator (the op checks the user-facing ones first)."""
    from tirx_kernels.core.lang import roles, wgmma

    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d % 8 or not 8 <= d <= 256:
            raise ValueError(f"flash_attention4: {name}={d} must be a multiple of 8 in [8, 256]")
    if block_n % 16 or not 16 <= block_n <= 256:
        raise ValueError(f"flash_attention4: block_n={block_n} must be a multiple of 16 in [16, 256]")
    # S (block_n / 2), O (Dv_pad / 2) and P (block_n / 4) accumulator registers of the consumer's 232.
    regs = wgmma.acc_regs(block_n) + wgmma.acc_regs(padded(head_dim_v)) + block_n // 4
    if regs > 200:
        raise ValueError(f"flash_attention4: block_n={block_n} with head_dim_v={head_dim_v} needs {regs} "
                         f"fragment registers of the consumer's {roles.CONSUMER_REGS}")
    nbytes = smem_bytes(head_dim, head_dim_v, block_n, num_stages)
    if num_stages < 1 or nbytes > SMEM_LIMIT:
        raise ValueError(f"flash_attention4: {num_stages} stages of block_n={block_n} need {nbytes} B of smem "
                         f"(limit {SMEM_LIMIT})")


SCHEDULES = ("plain", "pingpong", "overlap")


def build_fwd_kernel(dtype: str, head_dim: int, head_dim_v: int, causal: bool, block_n: int, num_stages: int,
                     schedule: str = "overlap"):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, roles, softmax, tma, wgmma

    check_shape(head_dim, head_dim_v, block_n, num_stages)
    if schedule not in SCHEDULES:
        raise ValueError(f"flash_attention4: schedule {schedule!r} is not one of {SCHEDULES}")
    pingpong = schedule in ("pingpong", "overlap")
    overlap = schedule == "overlap"
    dp, dvp = padded(head_dim), padded(head_dim_v)
    q_chunks, v_chunks = dp // CHUNK, dvp // CHUNK
    elem = tma.elem_bytes(dtype)
    q_tile = BLOCK_M * dp  # elements
    k_tile = block_n * dp
    v_tile = block_n * dvp
    s_regs = wgmma.acc_regs(block_n)
    o_regs = wgmma.acc_regs(dvp)
    p_regs = block_n // 4  # 16-bit pairs: 4 b32 registers per k16 step
    qk_steps = dp // 16
    pv_steps = block_n // 16
    # V is the MN-major B operand of O += P V: 64-column chunks of block_n rows, LBO steps between chunks.
    v_lbo, v_sbo = wgmma.desc_offsets(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=block_n * 128)
    v_kstep = wgmma.k_step_bytes(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, dtype)
    # One arrival per consumer warpgroup gives a slot back, after a warpgroup barrier (NOTES in release()).
    k_ring = mbarrier.Ring.for_warpgroups(num_stages, NUM_CONSUMERS, "warpgroup")
    v_ring = mbarrier.Ring.for_warpgroups(num_stages, NUM_CONSUMERS, "warpgroup")
    q_box = tma.check_box(dtype, [CHUNK, 1, BLOCK_M, 1])  # bytes of one box
    kv_box = tma.check_box(dtype, [CHUNK, 1, block_n, 1])
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    def key_end(m0, Sq, Sk):  # noqa: N803
        """One past the last key the query tile starting at ``m0`` sees."""
        return T.min(Sk, m0 + BLOCK_M + (Sk - Sq)) if causal else Sk

    def needs_mask(n0, diag, Sk):  # noqa: N803
        """Whether the key tile at ``n0`` reaches past Sk or (causal) right of the first row's diagonal."""
        past = n0 + block_n > Sk
        return T.Or(past, n0 + block_n - 1 > diag) if causal else past

    def hidden(col, lim, Sk):  # noqa: N803
        return T.Or(col >= Sk, col > lim) if causal else col >= Sk

    def turn_wait(cw, first):
        """Ping-pong: wait until the other consumer has issued its previous GEMM (consumer 0's first QK^T has
        no predecessor)."""
        if pingpong:
            with T.If(T.Or(cw > 0, T.Not(first))):
                with T.Then():
                    roles.wait_turn(TURN_BAR, cw)

    def turn_pass(cw, last):
        """Ping-pong: hand the tensor cores to the other consumer (consumer 1's last PV has nobody after it)."""
        if pingpong:
            with T.If(T.Or(cw == 0, T.Not(last))):
                with T.Then():
                    roles.pass_turn(TURN_BAR, cw)

    def tile_hidden(n0, diag, Sk, warp, lane):  # noqa: N803
        """The mask of key tile ``n0`` as ``softmax.mask`` takes it: (row half, column block, element) -> hidden."""
        return lambda r, j, e: hidden(n0 + wgmma.acc_col(lane, j, e), diag + wgmma.acc_row(warp, lane, r), Sk)

    def issue_qk(s_acc, desc_q, desc_k, s, cw):
        """S = Q K^T of the tile in stage ``s`` (SS; the first k16 step overwrites the accumulator), uncommitted."""
        wgmma.fence()
        for kk in range(qk_steps):
            q_off = ((kk // 4) * BLOCK_M * CHUNK + cw * 64 * CHUNK) * elem + (kk % 4) * 32
            k_off = (s * k_tile + (kk // 4) * block_n * CHUNK) * elem + (kk % 4) * 32
            wgmma.mma(block_n, s_acc, wgmma.desc_advance(desc_q[0], q_off), wgmma.desc_advance(desc_k[0], k_off),
                      dtype, scale_d=kk > 0)

    def issue_pv(o_acc, p_frag, desc_v, s):
        """O += P V of the tile in stage ``s`` (RS: P from registers; V MN-major), uncommitted."""
        for kk in range(pv_steps):
            wgmma.mma(dvp, o_acc, [p_frag[kk * 4 + i] for i in range(4)],
                      wgmma.desc_advance(desc_v[0], s * v_tile * elem + kk * v_kstep), dtype, b_major=wgmma.MN_MAJOR)

    def release(ring, empty, s, cw, warp, lane):
        """Give slot ``s`` back (one arrival for the warpgroup) once all its 128 threads passed their wgmma.wait."""
        # NOTES: on the GPU the warpgroup's wgmma already couples its warps, so one thread's wait would do (CUTLASS
        # relies on it); the CPU emulator runs threads apart and, without the barrier (named barrier 1 + cw), refilled
        # a slot a lagging lane had not read yet (wrong S at head dim 256, or a hang on a missed phase). Costs a
        # bar.sync per K and V tile.
        T.cuda.warpgroup_sync(WG_BAR + cw)
        ring.consumer_release_warpgroup(empty, s, warp, lane)

    def softmax_tile(s_acc, n0, diag, Sk, warp, lane, row_max, row_sum, red, corr, scale_log2):  # noqa: N803
        """Mask (edge tiles only) and online softmax of one S tile; each row half's O rescale left in ``corr``."""
        with T.If(needs_mask(n0, diag, Sk)):
            with T.Then():
                softmax.mask(s_acc, block_n, tile_hidden(n0, diag, Sk, warp, lane))
        for r in range(2):
            softmax.update(s_acc, block_n, r, row_max, row_sum, red, scale_log2)
            T.buffer_store(corr, red[1], [r])

    @T.prim_func
    def flash_attention4_fwd(q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, o_ptr: T.handle,
                             lse_ptr: T.handle, softmax_scale: T.float32):
        B = T.int32()
        Sq = T.int32()
        Sk = T.int32()
        Hq = T.int32()
        Hkv = T.int32()
        q_sb = T.int32()
        q_ss = T.int32()
        q_sh = T.int32()
        k_sb = T.int32()
        k_ss = T.int32()
        k_sh = T.int32()
        v_sb = T.int32()
        v_ss = T.int32()
        v_sh = T.int32()
        Q = T.match_buffer(q_ptr, (B, Sq, Hq, head_dim), dtype, strides=(q_sb, q_ss, q_sh, 1), align=16)
        K = T.match_buffer(k_ptr, (B, Sk, Hkv, head_dim), dtype, strides=(k_sb, k_ss, k_sh, 1), align=16)
        V = T.match_buffer(v_ptr, (B, Sk, Hkv, head_dim_v), dtype, strides=(v_sb, v_ss, v_sh, 1), align=16)
        Out = T.match_buffer(o_ptr, (B, Sq, Hq, head_dim_v), dtype, align=16)
        LSE = T.match_buffer(lse_ptr, (B, Hq, Sq), "float32", align=16)
        # Host: 4-D maps (D, heads, seq, batch), innermost first; boxes of 64 columns x 1 head x rows x 1 batch.
        q_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(q_map, Q.data, [head_dim, Hq, Sq, B], [q_sh, q_ss, q_sb], [CHUNK, 1, BLOCK_M, 1], dtype)
        tma.encode(k_map, K.data, [head_dim, Hkv, Sk, B], [k_sh, k_ss, k_sb], [CHUNK, 1, block_n, 1], dtype)
        tma.encode(v_map, V.data, [head_dim_v, Hkv, Sk, B], [v_sh, v_ss, v_sb], [CHUNK, 1, block_n, 1],
                           dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx, h, b = T.cta_id([(Sq + BLOCK_M - 1) // BLOCK_M, Hq, B])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        m_block = (Sq + BLOCK_M - 1) // BLOCK_M - 1 - bx  # longest (causal) tiles first
        m0 = m_block * BLOCK_M
        hk = h // (Hq // Hkv)
        # Keys this tile sees: all of them, or (causal, bottom-right) up to its last row's diagonal.
        n_blocks = T.max(key_end(m0, Sq, Sk) + block_n - 1, 0) // block_n

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        Qs = pool.alloc((q_tile,), dtype, align=1024)
        Ks = pool.alloc((num_stages * k_tile,), dtype, align=1024)
        Vs = pool.alloc((num_stages * v_tile,), dtype, align=1024)
        q_full = pool.alloc((1,), "uint64", align=8)
        k_full = pool.alloc((num_stages,), "uint64", align=8)
        k_empty = pool.alloc((num_stages,), "uint64", align=8)
        v_full = pool.alloc((num_stages,), "uint64", align=8)
        v_empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        s_acc = T.alloc_local((s_regs,), "float32")
        o_acc = T.alloc_local((o_regs,), "float32")
        p_frag = T.alloc_local((p_regs,), "uint32")
        row_max = T.alloc_local((2,), "float32")
        row_sum = T.alloc_local((2,), "float32")
        red = T.alloc_local((2,), "float32")
        corr = T.alloc_local((2,), "float32")  # overlap: each row half's O rescale, applied once PV has landed
        desc_q = T.alloc_local((1,), "uint64")
        desc_k = T.alloc_local((1,), "uint64")
        desc_v = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")

        if tid == 0:
            mbarrier.init(q_full.ptr_to([0]), 1)
            k_ring.init(k_full, k_empty)
            v_ring.init(v_full, v_empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            roles.producer_role()
            if tid == 0:
                mbarrier.arrive_expect_tx(q_full.ptr_to([0]), q_chunks * q_box)
                for c in T.unroll(q_chunks):
                    tma.load(Qs.ptr_to([c * BLOCK_M * CHUNK]), q_map, [c * CHUNK, h, m0, b], q_full.ptr_to([0]))
                for n in range(n_blocks):
                    s = k_ring.stage(n)
                    k_ring.producer_acquire(k_empty, n)
                    k_ring.producer_expect(k_full, n, q_chunks * kv_box)
                    for c in T.unroll(q_chunks):
                        tma.load(Ks.ptr_to([s * k_tile + c * block_n * CHUNK]), k_map, [c * CHUNK, hk, n * block_n, b],
                                 k_full.ptr_to([s]))
                    v_ring.producer_acquire(v_empty, n)
                    v_ring.producer_expect(v_full, n, v_chunks * kv_box)
                    for c in T.unroll(v_chunks):
                        tma.load(Vs.ptr_to([s * v_tile + c * block_n * CHUNK]), v_map,
                                 [c * CHUNK, hk, n * block_n, b], v_full.ptr_to([s]))
        else:
            # Math warpgroups: consumer cw owns query rows m0 + 64 cw .. + 63.
            cw, ct, warp, lane = roles.consumer_role(wg, tid)
            scale_log2 = softmax_scale * T.float32(softmax.LOG2E)
            wgmma.encode_desc_kmajor_sw128(desc_q.ptr_to([0]), Qs.ptr_to([0]))
            wgmma.encode_desc_kmajor_sw128(desc_k.ptr_to([0]), Ks.ptr_to([0]))
            wgmma.encode_desc(desc_v.ptr_to([0]), Vs.ptr_to([0]), v_lbo, v_sbo, wgmma.SWIZZLE_128B)
            for i in T.unroll(o_regs):
                o_acc[i] = T.float32(0)
            softmax.init(row_max, row_sum)
            mbarrier.wait(q_full.ptr_to([0]), 0)
            if overlap:
                # FA3's intra-warpgroup overlap: QK^T of tile n and PV of tile n - 1 are issued together, and the
                # softmax of tile n runs while PV n - 1 is still on the tensor cores; O's rescale waits for it.
                # One turn per tile (ping-pong), around both GEMMs.
                diag = m0 + cw * 64 + (Sk - Sq)  # key limit of the warpgroup's first row
                if n_blocks > 0:
                    k_ring.consumer_wait(k_full, 0)
                    turn_wait(cw, T.bool(True))
                    issue_qk(s_acc, desc_q, desc_k, 0, cw)
                    wgmma.commit()
                    turn_pass(cw, T.bool(False))
                    wgmma.wait(0)
                    release(k_ring, k_empty, 0, cw, warp, lane)
                    softmax_tile(s_acc, 0, diag, Sk, warp, lane, row_max, row_sum, red, corr, scale_log2)
                    softmax.pack_p(p_frag, s_acc, block_n, cvt_pack)
                    for n in range(1, n_blocks):
                        s = k_ring.stage(n)
                        sp = v_ring.stage(n - 1)
                        k_ring.consumer_wait(k_full, n)
                        v_ring.consumer_wait(v_full, n - 1)
                        turn_wait(cw, T.bool(False))
                        issue_qk(s_acc, desc_q, desc_k, s, cw)
                        wgmma.commit()
                        issue_pv(o_acc, p_frag, desc_v, sp)
                        wgmma.commit()
                        turn_pass(cw, T.bool(False))
                        wgmma.wait(1)  # S of tile n (the older group) has landed; PV n - 1 may still run
                        release(k_ring, k_empty, s, cw, warp, lane)
                        softmax_tile(s_acc, n * block_n, diag, Sk, warp, lane, row_max, row_sum, red, corr,
                                     scale_log2)
                        wgmma.wait(0)
                        release(v_ring, v_empty, sp, cw, warp, lane)
                        for r in T.unroll(2):
                            softmax.rescale(o_acc, dvp, r, corr[r])
                        softmax.pack_p(p_frag, s_acc, block_n, cvt_pack)
                    # The last tile's PV.
                    sl = v_ring.stage(n_blocks - 1)
                    v_ring.consumer_wait(v_full, n_blocks - 1)
                    turn_wait(cw, T.bool(False))
                    wgmma.fence()
                    issue_pv(o_acc, p_frag, desc_v, sl)
                    wgmma.commit()
                    turn_pass(cw, T.bool(True))
                    wgmma.wait(0)
                    release(v_ring, v_empty, sl, cw, warp, lane)
            else:
                # plain / pingpong: per tile S = QK^T, softmax, PV, each waited for before the next step.
                diag = m0 + cw * 64 + (Sk - Sq)  # key limit of the warpgroup's first row
                for n in range(n_blocks):
                    s = k_ring.stage(n)
                    k_ring.consumer_wait(k_full, n)
                    turn_wait(cw, n == 0)
                    issue_qk(s_acc, desc_q, desc_k, s, cw)
                    wgmma.commit()
                    turn_pass(cw, T.bool(False))
                    wgmma.wait(0)
                    release(k_ring, k_empty, s, cw, warp, lane)
                    softmax_tile(s_acc, n * block_n, diag, Sk, warp, lane, row_max, row_sum, red, corr, scale_log2)
                    for r in T.unroll(2):
                        softmax.rescale(o_acc, dvp, r, corr[r])
                    softmax.pack_p(p_frag, s_acc, block_n, cvt_pack)
                    v_ring.consumer_wait(v_full, n)
                    turn_wait(cw, T.bool(False))
                    wgmma.fence()
                    issue_pv(o_acc, p_frag, desc_v, s)
                    wgmma.commit()
                    turn_pass(cw, n == n_blocks - 1)
                    wgmma.wait(0)
                    release(v_ring, v_empty, s, cw, warp, lane)

            # Epilogue: O / rowsum from the registers (16-bit pairs), LSE from lane 0 of each quad.
            Ow = T.decl_buffer((B * Sq * Hq * head_dim_v // 2,), "uint32", data=Out.data)
            for r in T.unroll(2):
                inv, lse_row = softmax.finalize(r, row_max, row_sum, red, scale_log2)
                row = m0 + cw * 64 + wgmma.acc_row(warp, lane, r)
                if row < Sq:
                    base = ((b * Sq + row) * Hq + h) * head_dim_v
                    for j in T.unroll(dvp // 8):
                        col = wgmma.acc_col(lane, j)
                        if col < head_dim_v:
                            T.evaluate(cvt_pack(packed[0], o_acc[wgmma.acc_index(j, r, 1)] * inv,
                                                o_acc[wgmma.acc_index(j, r, 0)] * inv))
                            Ow[(base + col) // 2] = packed[0]
                    if lane % 4 == 0:
                        LSE[b, h, row] = lse_row

    return flash_attention4_fwd
