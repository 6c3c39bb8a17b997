# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper backward pre/postprocess (hopper/flash_bwd_preprocess_kernel.h,
# hopper/flash_bwd_postprocess_kernel.h of https://github.com/Dao-AILab/flash-attention at commit
# 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in TIRx; no code is copied.
"""The small kernels around the attention backward's main kernel (``_bwd_kernel``); every size is a run-time argument,
so one artifact per dtype serves every call.

- ``preprocess``: per query row, delta = rowsum(dO * O) in fp32 (minus dLSE where the caller has a gradient of the
  LSE output: d lse_i / d s_ij = P_ij folds into delta) and LSE * log2 e, both into [B, Hq, Sq_pad] with the rows past
  Sq padded (LSE +inf, delta 0) so that the main kernel's 1-D bulk copies of a query block never leave the buffer; an
  LSE of -inf (a row that sees no key) becomes +inf too (P = 0 there). It also zeroes the fp32 dQ accumulator and the
  deterministic mode's order flags. A warp per row: lane l reads the 16-byte vectors l of O and dO (Dv <= 256).
- ``postprocess``: the fp32 dQ accumulator, which the main kernel's consumers write in their wgmma fragment order
  (per query block and consumer, 16-byte vector i of thread t at float ``(i * 128 + t) * 4``), times softmax_scale,
  rounded into dQ [B, Sq, Hq, D]; a CTA per query block, a 128-thread half per consumer tile.
- ``group_reduce``: with the query heads of a KV group split over several CTAs, the fp32 dK / dV partials
  [B, Sk, Hkv * splits, D_pad] summed over the splits in a fixed order (deterministic) and rounded.
"""

from __future__ import annotations

import math

PRE_ROWS = 64  # query rows per preprocess CTA (8 warps x 8 rows)
PRE_THREADS = 256
POST_THREADS = 256
REDUCE_THREADS = 256
_FULL = 0xFFFFFFFF


def _cvt(T, dtype):  # noqa: N803
    return {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]


def build_preprocess(dtype: str):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import softmax, vector

    def dot8(o, g):
        """The fp32 dot product of two 16-byte vectors of 8 packed bf16/fp16."""
        acc = None
        for i in range(4):
            o0, o1 = vector.unpack2(o[i], dtype)
            g0, g1 = vector.unpack2(g[i], dtype)
            term = o0 * g0 + o1 * g1
            acc = term if acc is None else acc + term
        return acc

    def warp_sum(acc):
        """``acc[0]`` summed over the warp (every lane), one butterfly step a statement."""
        for k in (16, 8, 4, 2, 1):
            T.buffer_store(acc, acc[0] + T.cuda.__shfl_xor_sync(T.uint32(_FULL), acc[0], k, 32), [0])

    @T.prim_func
    def flash_attention_bwd_pre(o_ptr: T.handle, do_ptr: T.handle, lse_ptr: T.handle, dlse_ptr: T.handle,
                                lse2_ptr: T.handle, dlt_ptr: T.handle, dqacc_ptr: T.handle, sem_ptr: T.handle,
                                use_dlse: T.int32, block_m: T.int32, dq_width: T.int32):
        B = T.int32()
        Sq = T.int32()
        Hq = T.int32()
        Dv = T.int32()
        SqPad = T.int32()
        QAcc = T.int32()
        MBlocks = T.int32()
        o_sb, o_ss, o_sh = T.int32(), T.int32(), T.int32()
        g_sb, g_ss, g_sh = T.int32(), T.int32(), T.int32()
        Out = T.match_buffer(o_ptr, (B, Sq, Hq, Dv), dtype, strides=(o_sb, o_ss, o_sh, 1), align=16)
        Grad = T.match_buffer(do_ptr, (B, Sq, Hq, Dv), dtype, strides=(g_sb, g_ss, g_sh, 1), align=16)
        LSE = T.match_buffer(lse_ptr, (B, Hq, Sq), "float32", align=16)
        dLSE = T.match_buffer(dlse_ptr, (B, Hq, Sq), "float32", align=16)
        LSE2 = T.match_buffer(lse2_ptr, (B, Hq, SqPad), "float32", align=16)
        Dlt = T.match_buffer(dlt_ptr, (B, Hq, SqPad), "float32", align=16)
        DQacc = T.match_buffer(dqacc_ptr, (B, Hq, QAcc), "float32", align=16)
        Sem = T.match_buffer(sem_ptr, (B, Hq, MBlocks), "int32", align=16)
        T.device_entry()
        bx, h, b = T.cta_id([SqPad // PRE_ROWS, Hq, B])
        tid = T.thread_id([PRE_THREADS])
        warp = tid // 32
        lane = tid % 32
        # Flat views indexed with the strides (ptr_to on a strided buffer computes a compact offset).
        Oflat = T.decl_buffer((1,), dtype, data=Out.data)
        Gflat = T.decl_buffer((1,), dtype, data=Grad.data)
        o = T.alloc_local((4,), "uint32")
        g = T.alloc_local((4,), "uint32")
        z = T.alloc_local((4,), "uint32")
        acc = T.alloc_local((1,), "float32")
        for rr in range(PRE_ROWS // 8):
            row = bx * PRE_ROWS + warp * (PRE_ROWS // 8) + rr
            acc[0] = T.float32(0)
            if T.And(row < Sq, lane * 8 < Dv):
                vector.load_v4(o, 0, Oflat.ptr_to([b * o_sb + row * o_ss + h * o_sh + lane * 8]))
                vector.load_v4(g, 0, Gflat.ptr_to([b * g_sb + row * g_ss + h * g_sh + lane * 8]))
                acc[0] = dot8(o, g)
            warp_sum(acc)
            if lane == 0:
                if row < Sq:
                    lse = LSE[b, h, row]
                    LSE2[b, h, row] = T.Select(lse == T.float32(-math.inf), T.float32(math.inf),
                                               lse * T.float32(softmax.LOG2E))
                    Dlt[b, h, row] = T.Select(use_dlse != 0, acc[0] - dLSE[b, h, row], acc[0])
                else:
                    LSE2[b, h, row] = T.float32(math.inf)
                    Dlt[b, h, row] = T.float32(0)
        # Zero this CTA's rows of the dQ accumulator (dq_width floats a row) and its query block's order flag.
        vector.fill(z, 0, 4)
        n4 = PRE_ROWS * dq_width // 4
        for i in range((n4 + PRE_THREADS - 1) // PRE_THREADS):
            idx = i * PRE_THREADS + tid
            if idx < n4:
                vector.store_v4(DQacc.ptr_to([b, h, bx * PRE_ROWS * dq_width + idx * 4]), z, 0)
        if T.And(tid == 0, (bx * PRE_ROWS) % block_m == 0):
            Sem[b, h, bx * PRE_ROWS // block_m] = 0

    return flash_attention_bwd_pre


def build_postprocess(dtype: str):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    cvt = _cvt(T, dtype)

    @T.prim_func
    def flash_attention_bwd_post(dqacc_ptr: T.handle, dq_ptr: T.handle, softmax_scale: T.float32,
                                 block_m: T.int32, dq_width: T.int32):
        B = T.int32()
        Hq = T.int32()
        QAcc = T.int32()
        Sq = T.int32()
        D = T.int32()
        DQacc = T.match_buffer(dqacc_ptr, (B, Hq, QAcc), "float32", align=16)
        DQ = T.match_buffer(dq_ptr, (B, Sq, Hq, D), dtype, align=16)
        T.device_entry()
        bx, h, b = T.cta_id([(Sq + block_m - 1) // block_m, Hq, B])
        tid = T.thread_id([POST_THREADS])
        v = T.alloc_local((4,), "uint32")
        packed = T.alloc_local((1,), "uint32")
        DQw = T.decl_buffer((B * Sq * Hq * D // 2,), "uint32", data=DQ.data)
        w = tid // 128
        t = tid % 128
        warp = t // 32
        lane = t % 32
        row_split = block_m == 128  # the main kernel's consumers split dQ by rows (else by columns)
        half = block_m * dq_width // 2
        dq_n = T.Select(row_split, dq_width, dq_width // 2)
        row0 = bx * block_m + T.Select(row_split, 64 * w, 0)
        col0 = T.Select(row_split, 0, w * (dq_width // 2))
        base = bx * block_m * dq_width + w * half
        for i in range(dq_n // 8):
            vector.load_v4(v, 0, DQacc.ptr_to([b, h, base + (i * 128 + t) * 4]))
            for r in T.unroll(2):
                row = row0 + warp * 16 + lane // 4 + 8 * r
                col = col0 + 8 * i + 2 * (lane % 4)
                if T.And(row < Sq, col < D):
                    T.evaluate(cvt(packed[0], T.reinterpret("float32", v[2 * r + 1]) * softmax_scale,
                                   T.reinterpret("float32", v[2 * r]) * softmax_scale))
                    DQw[(((b * Sq + row) * Hq + h) * D + col) // 2] = packed[0]

    return flash_attention_bwd_post


def build_group_reduce(dtype: str):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    cvt = _cvt(T, dtype)

    @T.prim_func
    def flash_attention_bwd_group_reduce(acc_ptr: T.handle, out_ptr: T.handle):
        B = T.int32()
        S = T.int32()
        Hs = T.int32()
        Dp = T.int32()
        H = T.int32()
        D = T.int32()
        Acc = T.match_buffer(acc_ptr, (B, S, Hs, Dp), "float32", align=16)
        Out = T.match_buffer(out_ptr, (B, S, H, D), dtype, align=16)
        T.device_entry()
        bx = T.cta_id([(B * S * H * (D // 4) + REDUCE_THREADS - 1) // REDUCE_THREADS])
        tid = T.thread_id([REDUCE_THREADS])
        v = T.alloc_local((4,), "uint32")
        s = T.alloc_local((4,), "float32")
        packed = T.alloc_local((2,), "uint32")
        Outw = T.decl_buffer((B * S * H * D // 2,), "uint32", data=Out.data)
        quads = D // 4
        idx = bx * REDUCE_THREADS + tid
        if idx < B * S * H * quads:
            c4 = idx % quads
            hh = idx // quads % H
            bs = idx // quads // H  # b * S + s
            splits = Hs // H
            for e in T.unroll(4):
                s[e] = T.float32(0)
            for sp in range(splits):
                vector.load_v4(v, 0, Acc.ptr_to([bs // S, bs % S, hh * splits + sp, c4 * 4]))
                for e in T.unroll(4):
                    s[e] = s[e] + T.reinterpret("float32", v[e])
            for e in T.unroll(2):
                T.evaluate(cvt(packed[e], s[2 * e + 1], s[2 * e]))
                Outw[(bs * H + hh) * (D // 2) + c4 * 2 + e] = packed[e]

    return flash_attention_bwd_group_reduce
