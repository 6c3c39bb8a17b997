# SPDX-License-Identifier: Apache-2.0
# The reverse state-gradient walk of cudnn-frontend's GDN bprop (python/cudnn/linear_attention/frost/kernel/
# gdn_bprop_f16.py, v1.28.0 1dbd2c09432dfd6cbf13a0ad85a071446398c082: its "dstate" accumulator), written anew on
# tirx-core's Hopper layer; the tile map is gdn_prefill_sm90's (tirx_kernels.ported.flashinfer.gdn_prefill._layout,
# imported read-only).
"""The TIRx kernel of the GDN backward's sequential step: per (state head h, sequence n), chunks last to first,

    dS_end[c] = dS                                   (stored: the chunk's dS', fp32)
    Y         = bf16(dS) K_d^T                       [V, C]   (RS wgmma: dS's fragment is the A operand)
    dS        = dS diag(gamma_C) - bf16(Y) W + dO^T X          (RS wgmma with W MN-major; SS wgmma, both MN-major)

with C = 64 (GDN-1) or 16 (GDN-2) tokens a chunk and gamma_C the chunk's decay per key channel (GDN-1's scalar
decay repeated over the keys).

and ``dstate0[n, h] = dS`` at the end (the gradient of the initial state). dS starts from ``d_final_state[n, h]``
(flag HAS_DFINAL) or zero. K_d, W and X ([C, K] 16-bit, zero past a chunk's end), dO ([C, V] 16-bit) and gamma_C
([K]) come
from the chunk-parallel stage (``_bwd_chunks``), chunk ``c`` of sequence ``n`` being row ``chunk_cu[n] + j``.

The rows of dS (values) evolve independently, so each (h, n) is two CTAs of one warpgroup: CTA w holds dS rows
64 w .. 64 w + 63 in registers (an m64n128 fp32 accumulator) -- twice the CTAs of one two-warpgroup CTA, for the
batches of few sequences and heads (B * H < 132) that would leave SMs idle; the K_d / W tiles are read twice (L2).
K_d is read K-major (rows = chunk positions = the N of Y, columns = keys = its K), W MN-major (rows = chunk positions
= the K of the update, columns = keys = its N), X as W, dO MN-major as the A of dO^T X (only this CTA's 64 values):
C x 64 SW128 boxes, loaded by TMA (thread 0) one chunk ahead into a two-stage ring. The Y product runs while dS' is
stored and dS takes its decay. (R = dO^T X is the chunk's own term: computing it here saves its [V, K] fp32 round
trip through global memory a chunk.)
"""

from __future__ import annotations

from tirx_kernels.core.lang import gdn_layout as lay

IO_DTYPES = ("bfloat16", "float16")
CHUNKS = (64, 16)
HAS_DFINAL = 1
THREADS = 128
HALVES = 2  # CTAs per (head, sequence): value rows 0-63, 64-127
STAGES = 2  # K_d / W tile stages: chunk c - 1's TMA loads run under chunk c's products
DIM = lay.DIM


def build_kernel(io: str, chunk: int = 64):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, tma, wgmma

    if io not in IO_DTYPES:
        raise ValueError(f"gdn bprop state walk: io dtype {io!r} is not one of {IO_DTYPES}")
    if chunk not in CHUNKS:
        raise ValueError(f"gdn bprop state walk: chunk {chunk} is not one of {CHUNKS}")
    cvt = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[io]
    box = chunk * 128  # bytes of a C x 64 16-bit SW128 box
    kd_box, w_box, x_box, do_box = 0, 2 * box, 4 * box, 6 * box  # within a stage
    stage_bytes = 7 * box
    tile_bytes = STAGES * stage_bytes
    steps = chunk // 16  # k16 steps of the update
    mnmaj = wgmma.desc_offsets(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=box)

    def kmajor_step(s, kk):
        return s * stage_bytes + kd_box + (kk // 4) * box + (kk % 4) * 32

    def i64(x):
        return T.Cast("int64", x)

    def state_offset(head_row, wg, warp, lane, j, r):
        """Element of (value row, key column) of this thread's fragment in a [.., V, K] fp32 state row."""
        v = wg * 64 + wgmma.acc_row(warp, lane, r)
        return (head_row * DIM + v) * DIM + wgmma.acc_col(lane, j)

    def encode_maps(maps, bufs, n_kd):
        """Host: 2-D maps of the [NC * H * C, 128] tiles, boxes of C rows x 64 columns (SW128)."""
        for tmap, buf in zip(maps, bufs):
            tma.encode_2d(tmap, buf.data, T.Cast("int32", n_kd // DIM), DIM, DIM, chunk, 64, io)

    def issue(tiles, full, maps, c, s, n_heads, h, wg):
        """Thread 0: chunk ``c``'s K_d, W, X boxes and this CTA's dO box into stage ``s`` (TMA, on full[s])."""
        kd_map, w_map, x_map, do_map = maps
        row_t = T.Cast("int32", (c * n_heads + h) * chunk)
        mbarrier.arrive_expect_tx(full.ptr_to([s]), stage_bytes)
        for b in range(2):
            for base, tmap in ((kd_box, kd_map), (w_box, w_map), (x_box, x_map)):
                tma.load_2d(tiles.ptr_to([(s * stage_bytes + base + b * box) // 4]), tmap, b * 64, row_t,
                            full.ptr_to([s]))
        tma.load_2d(tiles.ptr_to([(s * stage_bytes + do_box) // 4]), do_map, wg * 64, row_t, full.ptr_to([s]))

    @T.prim_func
    def gdn_bwd_state(kd_ptr: T.handle, w_ptr: T.handle, x_ptr: T.handle, do_ptr: T.handle, gc_ptr: T.handle,
                      ccu_ptr: T.handle, dfs_ptr: T.handle, dse_ptr: T.handle, d0_ptr: T.handle, n_seqs: T.int32,
                      n_heads: T.int32, flags: T.int32):
        n_kd = T.int64()
        n_gc = T.int64()
        n_cu = T.int32()
        n_dfs = T.int64()
        n_dse = T.int64()
        n_d0 = T.int64()
        # Read by TMA only (the maps carry the 16-bit dtype): uint16 keeps fp16's ``half`` out of the host code,
        # whose translation unit does not declare it.
        KD = T.match_buffer(kd_ptr, (n_kd,), "uint16", align=16)
        W = T.match_buffer(w_ptr, (n_kd,), "uint16", align=16)
        X = T.match_buffer(x_ptr, (n_kd,), "uint16", align=16)
        DO = T.match_buffer(do_ptr, (n_kd,), "uint16", align=16)
        GC = T.match_buffer(gc_ptr, (n_gc,), "float32", align=4)
        CCU = T.match_buffer(ccu_ptr, (n_cu,), "int32", align=4)
        DFS = T.match_buffer(dfs_ptr, (n_dfs,), "float32", align=16)
        DSE = T.match_buffer(dse_ptr, (n_dse,), "float32", align=16)
        D0 = T.match_buffer(d0_ptr, (n_d0,), "float32", align=16)
        kd_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        w_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        x_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        do_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        encode_maps((kd_map, w_map, x_map, do_map), (KD, W, X, DO), n_kd)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        h, n, wg = T.cta_id([n_heads, n_seqs, HALVES])
        tid = T.thread_id([THREADS])

        pool = T.SMEMPool()
        tiles = pool.alloc((tile_bytes // 4,), "uint32", align=1024)
        full = pool.alloc((STAGES,), "uint64", align=8)
        pool.commit()
        s_acc = T.alloc_local((64,), "float32")
        y_acc = T.alloc_local((chunk // 2,), "float32")
        afrag = T.alloc_local((32,), "uint32")
        kd0 = T.alloc_local((1,), "uint64")
        md0 = T.alloc_local((1,), "uint64")

        ct = tid % 128
        warp = ct // 32
        lane = ct % 32
        c0 = CCU[n]
        c1 = CCU[n + 1]
        seq_head = i64(n) * n_heads + h
        if tid == 0:
            for s in range(STAGES):
                mbarrier.init(full.ptr_to([s]), 1)
            mbarrier.fence_init()
        T.cuda.cta_sync()

        if T.And(tid == 0, c1 > c0):
            issue(tiles, full, (kd_map, w_map, x_map, do_map), c1 - 1, 0, n_heads, h, wg)
        wgmma.encode_desc(kd0.ptr_to([0]), tiles.ptr_to([0]), lay.KMAJ[0], lay.KMAJ[1], wgmma.SWIZZLE_128B)
        wgmma.encode_desc(md0.ptr_to([0]), tiles.ptr_to([0]), mnmaj[0], mnmaj[1], wgmma.SWIZZLE_128B)
        for j in T.unroll(16):
            for r in T.unroll(2):
                for e in T.unroll(2):
                    s_acc[j * 4 + r * 2 + e] = T.float32(0)
                    if (flags & HAS_DFINAL) > 0:
                        s_acc[j * 4 + r * 2 + e] = DFS[state_offset(seq_head, wg, warp, lane, j, r) + e]
        for it in range(c1 - c0):
            c = c1 - 1 - it
            row = i64(c) * n_heads + h  # the chunk's (chunk, head) row of K_d / W / R / gamma_C / dS_end
            s = it % STAGES
            # Every thread is past chunk it - 1's wgmmas (each waited for): its stage is free for chunk c - 1.
            T.cuda.cta_sync()
            if T.And(tid == 0, it + 1 < c1 - c0):
                issue(tiles, full, (kd_map, w_map, x_map, do_map), c - 1, (it + 1) % STAGES, n_heads, h, wg)
            mbarrier.wait(full.ptr_to([s]), (it // STAGES) % 2)
            # Y = dS K_d^T with dS as the RS A operand; while it runs, dS' goes out to dS_end and dS takes its
            # decay (dS is not an operand of the running wgmma).
            for kk in T.unroll(8):
                for i in T.unroll(4):
                    T.evaluate(cvt(afrag[kk * 4 + i], s_acc[wgmma.acc_as_rs_a(kk, i, 1)],
                                   s_acc[wgmma.acc_as_rs_a(kk, i, 0)]))
            wgmma.fence()
            for kk in range(8):
                wgmma.mma(chunk, y_acc, [afrag[kk * 4 + i] for i in range(4)],
                          wgmma.desc_advance(kd0[0], kmajor_step(s, kk)), io, scale_d=kk > 0)
            wgmma.commit()
            for j in T.unroll(16):
                for r in T.unroll(2):
                    for e in T.unroll(2):
                        DSE[state_offset(row, wg, warp, lane, j, r) + e] = s_acc[j * 4 + r * 2 + e]
            # dS = dS diag(gamma_C) - Y W + dO^T X
            for j in T.unroll(16):
                for e in T.unroll(2):
                    gc = GC[row * DIM + wgmma.acc_col(lane, j) + e]
                    for r in T.unroll(2):
                        s_acc[j * 4 + r * 2 + e] = gc * s_acc[j * 4 + r * 2 + e]
            wgmma.wait(0)
            for kk in T.unroll(steps):
                for i in T.unroll(4):
                    T.evaluate(cvt(afrag[kk * 4 + i], T.float32(0) - y_acc[wgmma.acc_as_rs_a(kk, i, 1)],
                                   T.float32(0) - y_acc[wgmma.acc_as_rs_a(kk, i, 0)]))
            wgmma.fence()
            for kk in range(steps):
                wgmma.mma(128, s_acc, [afrag[kk * 4 + i] for i in range(4)],
                          wgmma.desc_advance(md0[0], s * stage_bytes + w_box + kk * lay.MN_KSTEP), io,
                          b_major=wgmma.MN_MAJOR)
            for kk in range(steps):
                wgmma.mma(128, s_acc, wgmma.desc_advance(md0[0], s * stage_bytes + do_box + kk * lay.MN_KSTEP),
                          wgmma.desc_advance(md0[0], s * stage_bytes + x_box + kk * lay.MN_KSTEP), io,
                          a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
            wgmma.commit()
            wgmma.wait(0)
        for j in T.unroll(16):
            for r in T.unroll(2):
                for e in T.unroll(2):
                    D0[state_offset(seq_head, wg, warp, lane, j, r) + e] = s_acc[j * 4 + r * 2 + e]

    return gdn_bwd_state


def kernel_args(kd, w, x, do, gamma_c, chunk_cu, d_final_state, dstate_end, dstate0, dummy) -> tuple:
    """Arguments in the PrimFunc's order: kd, w, x [NC, H, C, K] and do [NC, H, C, V] 16-bit; gamma_c [NC, H, K]
    fp32; chunk_cu [N + 1] int32; d_final_state (or None), dstate_end [NC, H, V, K], dstate0 [N, H, V, K] fp32."""
    n_heads = dstate0.shape[1]
    flags = HAS_DFINAL if d_final_state is not None else 0
    dfs = dummy if d_final_state is None else d_final_state.reshape(-1)
    import torch

    def bits(t):  # the 16-bit tiles as the kernel's uint16 buffers
        return t.reshape(-1).view(torch.uint16)

    return (bits(kd), bits(w), bits(x), bits(do), gamma_c.reshape(-1), chunk_cu, dfs,
            dstate_end.reshape(-1), dstate0.reshape(-1), chunk_cu.shape[0] - 1, n_heads, flags)
