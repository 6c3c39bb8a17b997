# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper FP8 forward (FlashAttention-3, arXiv 2407.08608 sec. 3.3; hopper/
# mainloop_fwd_sm90_tma_gmma_ws.hpp and hopper/utils.h of https://github.com/Dao-AILab/flash-attention at the
# package's pinned commit 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in TIRx on tirx-core's Hopper layer
# and ``_fwd_mainloop.Mainloop``; no code is copied.
"""The TIRx generator of ``flash_attention4_fp4``'s kernel: attention forward with Q, K, V in FP8 e4m3 on the bf16
kernel's mainloop (TMA producer warpgroup, two consumer warpgroups in ping-pong with the intra-warpgroup overlap,
exp2 online softmax), with the three things 8-bit wgmma changes:

- both smem operands must be K-major (no transpose for 8-bit inputs): V arrives transposed, ``vt`` [B, Hkv, D,
  Sk16] (keys contiguous, ``_fwd_fp8_prepass.transpose_v``), and PV reads it as a K-major B operand (the swizzle span
  is one key tile's ``block_n`` bytes);
- one instruction consumes k32 (32 bytes): QK^T is m64nNk32 over 128-byte SW128 rows of 128 elements;
- P goes to the PV wgmma as e4m3 *in registers*, and the 8-bit A fragment is not the f32 accumulator's layout: a
  thread holds columns ``4 t .. 4 t + 3`` (``t = lane % 4``) of each 16 in one register, but accumulator columns
  ``2 t, 2 t + 1, 8 + 2 t, 9 + 2 t``. The *keys* are permuted instead, by the pre-pass that writes ``vt`` anyway: A
  byte ``e`` of register ``i`` (K position ``16 (i // 2) + 4 t + e``) takes the thread's own accumulator column
  ``16 (i // 2) + 8 (e // 2) + 2 t + e % 2``, and ``vt``'s column at that K position holds that key
  (``_fwd_fp8_prepass.V_KEY_ORDER``). PV sums over keys, so the order is free: no shuffle, no extra instruction in
  the mainloop. FA3 does the same for row-major V (``permute_Cregs_fp8`` swaps registers within the thread and its
  in-kernel V transpose writes the matching key order; byte shuffles across the quad only for column-major V).

Scales (FA3's FP8 API): per (batch, kv head) fp32 descales ``q_descale``, ``k_descale``, ``v_descale`` [B, Hkv];
``q_descale * k_descale * softmax_scale * log2 e`` is the exp2 scale of S (one FFMA per score as in bf16), and the
output's normaliser carries ``v_descale``. Output bf16 [B, Sq, Hq, D], LSE fp32 [B, Hq, Sq] (natural log, of the
descaled scores)."""

from __future__ import annotations

from tirx_kernels.ported.flashattention import _fwd_kernel
from tirx_kernels.ported.flashattention._fwd_mainloop import FRAGMENT_REGS, SMEM_LIMIT, Mainloop

E4M3 = "float8_e4m3fn"
STORAGE = "uint8"  # how Q, K, V^T and their smem tiles are typed (the ops pass byte views of the e4m3 tensors)
FP8_CHUNK = 128  # e4m3 elements of one 128-byte SW128 row: the Q/K box's inner extent (64 / SW64 for hd <= 64)
BLOCK_M = _fwd_kernel.BLOCK_M
NUM_CONSUMERS = _fwd_kernel.NUM_CONSUMERS
# P in [0, 2^8] before its e4m3 rounding (FA3's Max_offset for FP8): normal e4m3 precision down to 2^-14 of the row
# max (2^-6 without), below 448.
P_OFFSET = 8


def row_bytes(d: int) -> int:
    """Bytes of one swizzled Q/K row: 64 (SW64) for head dims up to 64, else 128 (SW128)."""
    return 64 if d <= 64 else FP8_CHUNK


def padded(d: int) -> int:
    """Head dim rounded up to whole swizzled rows (TMA zero-fills the columns past d)."""
    return (d + row_bytes(d) - 1) // row_bytes(d) * row_bytes(d)


def smem_bytes(head_dim: int, block_n: int, num_stages: int, block_m: int = BLOCK_M) -> int:
    """The pool: Q tile, the K and V^T rings (1 byte an element), the barriers."""
    dp = padded(head_dim)
    return block_m * dp + num_stages * 2 * block_n * dp + 8 * (1 + 4 * num_stages)


def fragment_regs(head_dim: int, block_n: int) -> int:
    """S (block_n / 2) and O (D / 2) f32 accumulators and P (block_n / 8 b32: four e4m3 a register)."""
    return block_n // 2 + padded(head_dim) // 2 + block_n // 8


class FP8Mainloop(Mainloop):
    """``Mainloop`` for e4m3 Q/K/V^T tiles: the geometry attributes the shared loop reads, the k32 PV issue from the
    K-major V^T tile, and P packed four e4m3 to a register (module docstring)."""

    def __init__(self, head_dim: int, block_n: int, num_stages: int, schedule: str = "overlap",
                 num_consumers: int = NUM_CONSUMERS, smem_limit: int = SMEM_LIMIT):
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import mbarrier, tma, wgmma
        from tirx_kernels.ported.flashattention._fwd_mainloop import SCHEDULES

        if schedule not in SCHEDULES:
            raise ValueError(f"flash_attention4_fp4: schedule {schedule!r} is not one of {SCHEDULES}")
        if num_consumers not in (1, 2):
            raise ValueError(f"flash_attention4_fp4: {num_consumers} consumer warpgroups (1 or 2)")
        if head_dim % 16 or not 16 <= head_dim <= 256:
            raise ValueError(f"flash_attention4_fp4: head_dim={head_dim} must be a multiple of 16 in [16, 256]")
        # V^T's rows are one key tile: block_n bytes, a swizzle span (64 or 128), k32 steps inside it.
        swizzles = {64: wgmma.SWIZZLE_64B, 128: wgmma.SWIZZLE_128B}
        if block_n not in swizzles:
            raise ValueError(f"flash_attention4_fp4: block_n={block_n} must be one of {sorted(swizzles)}")
        regs = fragment_regs(head_dim, block_n)
        if regs > FRAGMENT_REGS + 8:  # hd256 x 128 keys (FA3's tile) needs 208: measured spill-free (build test)
            raise ValueError(f"flash_attention4_fp4: block_n={block_n} with head_dim={head_dim} needs {regs} "
                             f"fragment registers")
        self.block_m = 64 * num_consumers
        nbytes = smem_bytes(head_dim, block_n, num_stages, self.block_m)
        if num_stages < 1 or nbytes > smem_limit:
            raise ValueError(f"flash_attention4_fp4: {num_stages} stages of block_n={block_n} need {nbytes} B of "
                             f"smem (limit {smem_limit})")
        # Tiles are bytes to TIRx (the emulator and TMA take uint8); the wgmma reads them as e4m3.
        self.dtype, self.mma_dtype, self.head_dim, self.head_dim_v = STORAGE, E4M3, head_dim, head_dim
        self.block_n, self.num_stages, self.num_consumers = block_n, num_stages, num_consumers
        self.pingpong = num_consumers == 2 and schedule in ("pingpong", "overlap")
        self.overlap = schedule == "overlap"
        self.chunk = row_bytes(head_dim)
        self.qk_swizzle = wgmma.SWIZZLE_64B if self.chunk == 64 else wgmma.SWIZZLE_128B
        self.dp = self.dvp = padded(head_dim)
        self.q_chunks, self.v_chunks = self.dp // self.chunk, 1
        self.elem = 1
        self.q_tile = self.block_m * self.dp
        self.k_tile = block_n * self.dp
        self.v_tile = self.dvp * block_n  # V^T: dvp rows of block_n keys
        self.s_regs = wgmma.acc_regs(block_n)
        self.o_regs = wgmma.acc_regs(self.dvp)
        self.p_regs = block_n // 8
        self.qk_steps = self.dp // 32
        self.pv_steps = block_n // 32
        self.v_swizzle = swizzles[block_n]
        self.v_lbo, self.v_sbo = wgmma.desc_offsets(wgmma.K_MAJOR, self.v_swizzle)
        self.v_kstep = wgmma.k_step_bytes(wgmma.K_MAJOR, self.v_swizzle, E4M3)
        self.k_ring = mbarrier.Ring.for_warpgroups(num_stages, num_consumers, "warpgroup")
        self.v_ring = mbarrier.Ring.for_warpgroups(num_stages, num_consumers, "warpgroup")
        self.q_box_bytes = tma.check_box(STORAGE, [self.chunk, 1, self.block_m, 1], self.qk_swizzle)
        self.kv_tile_bytes = tma.check_box(STORAGE, [self.chunk, 1, block_n, 1], self.qk_swizzle)
        self.k_stage_bytes = self.q_chunks * self.kv_tile_bytes
        self.v_box = [block_n, self.dvp, 1, 1]
        self.v_stage_bytes = tma.check_box(STORAGE, self.v_box, self.v_swizzle)
        self.cvt_pack = T.ptx.cvt.rn.bf16x2.f32  # the output's pairs (pack_pair); P goes through _pack_p
        self.p_offset = P_OFFSET

    def alloc_regs(self):
        from tvm.script import tirx as T

        rg = super().alloc_regs()
        rg.value.p_half = T.alloc_local((2,), "uint16")  # two e4m3 pairs before they join in one P register
        return rg

    def _pack_p(self, rg):
        """P (the exp2 weights in S's registers) as e4m3 A registers, 4 per k32 step, each from the thread's own
        accumulator columns (module docstring: the key order of V^T matches)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import quant, wgmma

        for kk in range(self.pv_steps):
            for i in range(4):
                for half in range(2):
                    j = 4 * kk + 2 * (i // 2) + half
                    quant.fp8x2(rg.p_half[half], rg.s_acc[wgmma.acc_index(j, i % 2, 1)],
                                rg.s_acc[wgmma.acc_index(j, i % 2, 0)])
                T.buffer_store(rg.p_frag, T.Cast("uint32", rg.p_half[0]) | (T.Cast("uint32", rg.p_half[1])
                                                                             << T.uint32(16)), [kk * 4 + i])

    def _issue_pv(self, rg, s):
        """O += P V of the tile in stage ``s``: RS, B = V^T K-major (k32 steps of 32 bytes along its rows)."""
        from tirx_kernels.core.lang import wgmma

        for kk in range(self.pv_steps):
            wgmma.mma(self.dvp, rg.o_acc, [rg.p_frag[kk * 4 + i] for i in range(4)],
                      wgmma.desc_advance(rg.desc_v[0], s * self.v_tile + kk * self.v_kstep), E4M3)


def _produce(ml, sm, q_map, k_map, v_map, m0, h, hk, b, n_blocks):
    """The TMA thread: Q (query rows m0.., head h), then K tile n (rows n block_n.., 128-element chunks) and V^T
    tile n (keys n block_n.., every head-dim row in one box) of kv head ``hk``."""
    from tirx_kernels.core.lang import tma

    ml.load_q_tma(sm, q_map, lambda c: [c * ml.chunk, h, m0, b])

    def load_k(n, s, bar):
        for c in range(ml.q_chunks):
            tma.load(ml.k_dst(sm, s, c), k_map, [c * ml.chunk, hk, n * ml.block_n, b], bar)

    def load_v(n, s, bar):
        tma.load(ml.v_dst(sm, s, 0), v_map, [n * ml.block_n, 0, hk, b], bar)

    ml.produce_kv(sm, 0, n_blocks, load_k, load_v)


# setmaxnreg splits (consumer -> producer) that fill 3 x 128 threads x 168 registers exactly: 40 / 232 (the bf16
# kernel's), 24 / 240 (FA3's; hd256's 128 x 128 tile with the overlap spilled 48 bytes at 232, none at 240).
PRODUCER_REGS = {232: 40, 240: 24}


def build_fp8_fwd_kernel(head_dim: int, causal: bool, block_n: int, num_stages: int, schedule: str = "overlap",
                         consumer_regs: int = 232):
    """The batch-padded FP8 kernel: one CTA per (query tile, query head, batch entry), longest causal tiles first."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import roles, tma, wgmma

    if consumer_regs not in PRODUCER_REGS:
        raise ValueError(f"flash_attention4_fp4: consumer_regs={consumer_regs} not one of {sorted(PRODUCER_REGS)}")
    producer_regs = PRODUCER_REGS[consumer_regs]
    assert roles.register_split_fits(NUM_CONSUMERS, producer_regs, consumer_regs)
    ml = FP8Mainloop(head_dim, block_n, num_stages, schedule)

    @T.prim_func
    def flash_attention4_fp8_fwd(q_ptr: T.handle, k_ptr: T.handle, vt_ptr: T.handle, qd_ptr: T.handle,
                                 kd_ptr: T.handle, vd_ptr: T.handle, o_ptr: T.handle, lse_ptr: T.handle,
                                 softmax_scale: T.float32):
        B = T.int32()
        Sq = T.int32()
        Sk = T.int32()
        Sk16 = T.int32()
        Hq = T.int32()
        Hkv = T.int32()
        q_sb = T.int32()
        q_ss = T.int32()
        q_sh = T.int32()
        k_sb = T.int32()
        k_ss = T.int32()
        k_sh = T.int32()
        vt_sb = T.int32()
        vt_sh = T.int32()
        vt_sd = T.int32()
        Q = T.match_buffer(q_ptr, (B, Sq, Hq, head_dim), STORAGE, strides=(q_sb, q_ss, q_sh, 1), align=16)
        K = T.match_buffer(k_ptr, (B, Sk, Hkv, head_dim), STORAGE, strides=(k_sb, k_ss, k_sh, 1), align=16)
        Vt = T.match_buffer(vt_ptr, (B, Hkv, head_dim, Sk16), STORAGE, strides=(vt_sb, vt_sh, vt_sd, 1), align=16)
        QD = T.match_buffer(qd_ptr, (B, Hkv), "float32")
        KD = T.match_buffer(kd_ptr, (B, Hkv), "float32")
        VD = T.match_buffer(vd_ptr, (B, Hkv), "float32")
        Out = T.match_buffer(o_ptr, (B, Sq, Hq, head_dim), "bfloat16", align=16)
        LSE = T.match_buffer(lse_ptr, (B, Hq, Sq), "float32", align=16)
        # Host: 4-D maps, innermost first: Q/K (D, heads, seq, batch), V^T (keys, D, heads, batch).
        q_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(q_map, Q.data, [head_dim, Hq, Sq, B], [q_sh, q_ss, q_sb], [ml.chunk, 1, BLOCK_M, 1], STORAGE,
                   swizzle=ml.qk_swizzle)
        tma.encode(k_map, K.data, [head_dim, Hkv, Sk, B], [k_sh, k_ss, k_sb], [ml.chunk, 1, block_n, 1], STORAGE,
                   swizzle=ml.qk_swizzle)
        tma.encode(v_map, Vt.data, [Sk16, head_dim, Hkv, B], [vt_sd, vt_sh, vt_sb], ml.v_box, STORAGE,
                   swizzle=ml.v_swizzle)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx, h, b = T.cta_id([(Sq + BLOCK_M - 1) // BLOCK_M, Hq, B])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        m0 = ((Sq + BLOCK_M - 1) // BLOCK_M - 1 - bx) * BLOCK_M  # longest (causal) tiles first
        hk = h // (Hq // Hkv)
        n_blocks = _fwd_kernel._key_tiles(m0, Sq, Sk, block_n, causal)

        pool = T.SMEMPool()
        sm = ml.alloc_smem(pool)
        pool.commit()
        rg = ml.alloc_regs()
        scales = T.alloc_local((2,), "float32")

        if tid == 0:
            ml.init_barriers(sm)
        T.cuda.cta_sync()

        if wg == 0:
            roles.producer_role(producer_regs)
            if tid == 0:
                _produce(ml, sm, q_map, k_map, v_map, m0, h, hk, b, n_blocks)
        else:
            # S's scale (softmax_scale x the Q and K descales) and O's (the V descale), read once.
            scales[0] = softmax_scale * QD[b, hk] * KD[b, hk]
            scales[1] = VD[b, hk]
            first_row, warp, lane, scale_log2 = _fwd_kernel._consumer(ml, sm, rg, wg, tid, scales[0], m0, Sq, Sk,
                                                                      n_blocks, causal,
                                                                      consumer_regs=consumer_regs)
            Ow = T.decl_buffer((B * Sq * Hq * head_dim // 2,), "uint32", data=Out.data)
            for r in T.unroll(2):
                inv, lse_row = ml.finalize(rg, r, scale_log2)
                row = first_row + wgmma.acc_row(warp, lane, r)
                if row < Sq:
                    _fwd_kernel._store(ml, rg, Ow, LSE, r, lane, inv * scales[1], lse_row,
                                       ((b * Sq + row) * Hq + h) * head_dim, [b, h, row])

    return flash_attention4_fp8_fwd
