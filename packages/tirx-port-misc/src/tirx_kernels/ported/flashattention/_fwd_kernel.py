# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper forward (FlashAttention-3, arXiv 2407.08608; hopper/softmax.h,
# hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp, hopper/flash_fwd_kernel_sm90.h of
# https://github.com/Dao-AILab/flash-attention at the package's pinned commit
# 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in TIRx on tirx-core's Hopper layer; no code is copied.
"""The TIRx generators of ``flash_attention4``'s prefill kernels (bf16/fp16, head dims up to 256): batch-padded
(``build_fwd_kernel``) and varlen (``build_varlen_kernel``), both on ``_fwd_mainloop.Mainloop``.

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

Knobs beside the schedule (``Mainloop``'s, picked per op by ``flash_attention4.kernel_knobs``; variants timed by
tools/sweeps/attn_schedules.py): ``fast_exp2``, ``split_mask``, ``late_release``, and ``num_consumers`` 3 (FA3's hd64
tile: 192 query rows, 512 threads, setmaxnreg 32 / 160, turn barriers 4-6).

Varlen (flash-attn's packed THD convention): q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], out
[total_q, Hq, Dv], lse [Hq, total_q]; sequence b holds query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 and keys
cu_seqlens_k[b] .. + (seqused_k[b] if given, else cu_seqlens_k[b + 1] - cu_seqlens_k[b]). The grid is (query tiles of
max_seqlen_q, Hq, B); a tile past its sequence's end exits at once. The maps are 3-D (D, heads, total rows): a box
reaching past a sequence's end reads the next sequence's rows (FA3 does the same), which the key mask hides (keys)
or the guarded store drops (queries); past the last row TMA zero-fills. The V rows past a sequence's keys are cleared
in smem before PV reads them (P is 0 there, but 0 x NaN is NaN, and the keys past seqused_k may be memory nobody
wrote).

Not yet (see the package README): a persistent scheduler, and sliding window, softcap, sink.
"""

from __future__ import annotations

from tirx_kernels.ported.flashattention._fwd_mainloop import (  # noqa: F401 -- re-exported for the tests
    CHUNK,
    SCHEDULES,
    SMEM_LIMIT,
    Mainloop,
    check_shape,
    padded,
    smem_bytes,
)

NUM_CONSUMERS = 2
BLOCK_M = NUM_CONSUMERS * 64  # one m64 wgmma row block per consumer
# setmaxnreg split (producer, consumer) by consumer warpgroups: 384 threads launch with 168 registers (40 + 2 x 232 =
# 3 x 168); 512 threads with 128 (FA3's split for its three-consumer hd64 tile: 32 + 3 x 160 = 4 x 128).
REGISTER_SPLIT = {2: (40, 232), 3: (32, 160)}


def _consumer(ml, sm, rg, wg, tid, softmax_scale, m0, num_q, num_k, n_blocks, causal, clear_v: bool = False,
              consumer_regs: int | None = None):
    """Math warpgroup ``wg``: its 64 rows of the query tile at ``m0`` against key tiles 0 .. n_blocks - 1; returns
    (row of row half r, the mainloop's registers, lane) for the epilogue. ``consumer_regs``: the setmaxnreg.inc
    target (default ``roles.CONSUMER_REGS``)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import roles, softmax

    cw, _, warp, lane = roles.consumer_role(wg, tid, consumer_regs or roles.CONSUMER_REGS)
    scale_log2 = softmax_scale * T.float32(softmax.LOG2E)
    first_row = m0 + cw * 64
    mask_from = ml.causal_limits(rg, first_row, num_q, num_k, causal, warp, lane)
    ml.consume(sm, rg, 0, n_blocks, mask_from, cw, warp, lane, scale_log2, num_k if clear_v else None)
    return first_row, warp, lane, scale_log2


def _key_tiles(m0, num_q, num_k, block_n: int, causal: bool, block_m: int = BLOCK_M):
    """Key tiles the query tile at ``m0`` sees: all of them, or (causal, bottom-right) up to its last row's
    diagonal."""
    from tvm.script import tirx as T

    key_end = T.min(num_k, m0 + block_m + (num_k - num_q)) if causal else num_k
    return T.max(key_end + block_n - 1, 0) // block_n


def _produce(ml, sm, q_map, k_map, v_map, q_coord, kv_coord, h, hk, n_blocks):
    """The TMA thread: Q at row ``q_coord`` of head ``h``, then K/V tiles 0 .. n_blocks - 1 of head ``hk``;
    ``kv_coord(n)`` the map coordinates past (column, head) of key tile ``n``'s first row."""
    from tirx_kernels.core.lang import tma

    ml.load_q_tma(sm, q_map, lambda c: [c * CHUNK, h, *q_coord])

    def load(tmap, chunks, dst):
        def issue(n, s, bar):
            for c in range(chunks):
                tma.load(dst(sm, s, c), tmap, [c * CHUNK, hk, *kv_coord(n)], bar)
        return issue

    ml.produce_kv(sm, 0, n_blocks, load(k_map, ml.q_chunks, ml.k_dst), load(v_map, ml.v_chunks, ml.v_dst))


def _store(ml, rg, Ow, LSE, r, lane, inv, lse_row, o_row, lse_index):  # noqa: N803
    """Row half ``r``'s output row (``o_row``: its element offset in ``Ow``'s 16-bit view) and LSE (lane 0 of the
    quad, at ``lse_index``)."""
    from tvm.script import tirx as T

    ml.store_o_pairs(rg, r, lane, inv,
                     lambda col, lo, hi: T.buffer_store(Ow, ml.pack_pair(rg, lo, hi), [(o_row + col) // 2]))
    with T.If(lane % 4 == 0):
        with T.Then():
            T.buffer_store(LSE, lse_row, lse_index)


def _batch_rows(b, block_n: int):
    """Key tile ``n`` of batch entry ``b`` in a (.., seq, batch) map."""
    return lambda n: [n * block_n, b]


def _packed_rows(k_off, block_n: int):
    """Key tile ``n`` of the sequence starting at row ``k_off`` of a packed (.., total rows) map."""
    return lambda n: [k_off + n * block_n]


def build_fwd_kernel(dtype: str, head_dim: int, head_dim_v: int, causal: bool, block_n: int, num_stages: int,
                     schedule: str = "overlap", fast_exp2: bool = False, split_mask: bool = False,
                     late_release: bool = False, num_consumers: int = NUM_CONSUMERS, rescale_early: bool = False,
                     wait_fence: bool = False):
    """The batch-padded kernel: one CTA per (query tile, query head, batch entry). The knobs after ``schedule`` are
    ``Mainloop``'s; ``num_consumers`` 3 is FA3's hd64 tile (192 query rows, 512 threads)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import roles, tma, wgmma

    ml = Mainloop(dtype, head_dim, head_dim_v, block_n, num_stages, schedule, num_consumers, fast_exp2=fast_exp2,
                  split_mask=split_mask, late_release=late_release, rescale_early=rescale_early,
                  wait_fence=wait_fence)
    block_m = ml.block_m
    producer_regs, consumer_regs = REGISTER_SPLIT[num_consumers]
    if not roles.register_split_fits(num_consumers, producer_regs, consumer_regs):
        raise ValueError(f"flash_attention4: register split {producer_regs}/{consumer_regs} does not fit")
    threads = 128 * (1 + num_consumers)

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
        tma.encode(q_map, Q.data, [head_dim, Hq, Sq, B], [q_sh, q_ss, q_sb], [CHUNK, 1, block_m, 1], dtype)
        tma.encode(k_map, K.data, [head_dim, Hkv, Sk, B], [k_sh, k_ss, k_sb], [CHUNK, 1, block_n, 1], dtype)
        tma.encode(v_map, V.data, [head_dim_v, Hkv, Sk, B], [v_sh, v_ss, v_sb], [CHUNK, 1, block_n, 1], dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx, h, b = T.cta_id([(Sq + block_m - 1) // block_m, Hq, B])
        wg = T.warpgroup_id([1 + num_consumers])
        tid = T.thread_id([threads])
        m0 = ((Sq + block_m - 1) // block_m - 1 - bx) * block_m  # longest (causal) tiles first
        hk = h // (Hq // Hkv)
        n_blocks = _key_tiles(m0, Sq, Sk, block_n, causal, block_m)

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        sm = ml.alloc_smem(pool)
        pool.commit()
        rg = ml.alloc_regs()

        if tid == 0:
            ml.init_barriers(sm)
        T.cuda.cta_sync()

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            roles.producer_role(producer_regs)
            if tid == 0:
                _produce(ml, sm, q_map, k_map, v_map, [m0, b], _batch_rows(b, block_n), h, hk, n_blocks)
        else:
            first_row, warp, lane, scale_log2 = _consumer(ml, sm, rg, wg, tid, softmax_scale, m0, Sq, Sk, n_blocks,
                                                          causal, consumer_regs=consumer_regs)
            # Epilogue: O / rowsum from the registers (16-bit pairs), LSE from lane 0 of each quad.
            Ow = T.decl_buffer((B * Sq * Hq * head_dim_v // 2,), "uint32", data=Out.data)
            for r in T.unroll(2):
                inv, lse_row = ml.finalize(rg, r, scale_log2)
                row = first_row + wgmma.acc_row(warp, lane, r)
                if row < Sq:
                    _store(ml, rg, Ow, LSE, r, lane, inv, lse_row, ((b * Sq + row) * Hq + h) * head_dim_v,
                           [b, h, row])

    return flash_attention4_fwd


def build_varlen_kernel(dtype: str, head_dim: int, head_dim_v: int, causal: bool, block_n: int, num_stages: int,
                        schedule: str = "overlap"):
    """The varlen kernel (module docstring): one CTA per (query tile of the longest sequence, query head, sequence);
    ``use_seqused_k`` (a run-time 0/1) reads each sequence's key count from ``seqused_k``."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import roles, tma, wgmma

    ml = Mainloop(dtype, head_dim, head_dim_v, block_n, num_stages, schedule, NUM_CONSUMERS)

    @T.prim_func
    def flash_attention4_varlen_fwd(q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, cu_q_ptr: T.handle,
                                    cu_k_ptr: T.handle, used_k_ptr: T.handle, o_ptr: T.handle, lse_ptr: T.handle,
                                    max_seqlen_q: T.int32, use_seqused_k: T.int32, softmax_scale: T.float32):
        TQ = T.int32()
        TK = T.int32()
        Hq = T.int32()
        Hkv = T.int32()
        B1 = T.int32()
        NU = T.int32()
        q_ss = T.int32()
        q_sh = T.int32()
        k_ss = T.int32()
        k_sh = T.int32()
        v_ss = T.int32()
        v_sh = T.int32()
        Q = T.match_buffer(q_ptr, (TQ, Hq, head_dim), dtype, strides=(q_ss, q_sh, 1), align=16)
        K = T.match_buffer(k_ptr, (TK, Hkv, head_dim), dtype, strides=(k_ss, k_sh, 1), align=16)
        V = T.match_buffer(v_ptr, (TK, Hkv, head_dim_v), dtype, strides=(v_ss, v_sh, 1), align=16)
        CuQ = T.match_buffer(cu_q_ptr, (B1,), "int32")
        CuK = T.match_buffer(cu_k_ptr, (B1,), "int32")
        UsedK = T.match_buffer(used_k_ptr, (NU,), "int32")
        Out = T.match_buffer(o_ptr, (TQ, Hq, head_dim_v), dtype, align=16)
        LSE = T.match_buffer(lse_ptr, (Hq, TQ), "float32", align=16)
        # Host: 3-D maps (D, heads, total rows), innermost first.
        q_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(q_map, Q.data, [head_dim, Hq, TQ], [q_sh, q_ss], [CHUNK, 1, BLOCK_M], dtype)
        tma.encode(k_map, K.data, [head_dim, Hkv, TK], [k_sh, k_ss], [CHUNK, 1, block_n], dtype)
        tma.encode(v_map, V.data, [head_dim_v, Hkv, TK], [v_sh, v_ss], [CHUNK, 1, block_n], dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        bx, h, b = T.cta_id([(max_seqlen_q + BLOCK_M - 1) // BLOCK_M, Hq, B1 - 1])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        q_off = CuQ[b]
        num_q = CuQ[b + 1] - q_off
        k_off = CuK[b]
        num_k = T.if_then_else(use_seqused_k != 0, UsedK[T.min(b, NU - 1)], CuK[b + 1] - k_off)
        m0 = ((num_q + BLOCK_M - 1) // BLOCK_M - 1 - bx) * BLOCK_M  # longest (causal) tiles first; < 0: no tile
        hk = h // (Hq // Hkv)
        n_blocks = _key_tiles(m0, num_q, num_k, block_n, causal)

        pool = T.SMEMPool()
        sm = ml.alloc_smem(pool)
        pool.commit()
        rg = ml.alloc_regs()

        if m0 >= 0:
            if tid == 0:
                ml.init_barriers(sm)
            T.cuda.cta_sync()
            if wg == 0:
                roles.producer_role()
                if tid == 0:
                    _produce(ml, sm, q_map, k_map, v_map, [q_off + m0], _packed_rows(k_off, block_n), h, hk,
                             n_blocks)
            else:
                # Keys past seqused_k may be unwritten memory: their V rows are cleared (TMA reads them as they are).
                first_row, warp, lane, scale_log2 = _consumer(ml, sm, rg, wg, tid, softmax_scale, m0, num_q, num_k,
                                                              n_blocks, causal, clear_v=True)
                Ow = T.decl_buffer((TQ * Hq * head_dim_v // 2,), "uint32", data=Out.data)
                for r in T.unroll(2):
                    inv, lse_row = ml.finalize(rg, r, scale_log2)
                    row = first_row + wgmma.acc_row(warp, lane, r)
                    if T.And(row < num_q, q_off + row < TQ):  # the second: a cu_seqlens_q past q stores nothing
                        _store(ml, rg, Ow, LSE, r, lane, inv, lse_row, ((q_off + row) * Hq + h) * head_dim_v,
                               [h, q_off + row])

    return flash_attention4_varlen_fwd
