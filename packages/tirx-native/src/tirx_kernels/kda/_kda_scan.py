# SPDX-License-Identifier: Apache-2.0
# The inter-chunk recurrence follows fla's chunk_kda forward (fla-org/flash-linear-attention, fla/ops/kda, commit
# 9c8e42e7); read for semantics, written anew on tirx-core's Hopper layer.
"""The state pass of the KDA forward (``kda_forward_portfolio_multishape``, kernel ``scan``): the recurrence over a
sequence's chunks on wgmma, from the chunk pass's operands (``_kda_chunk``).

One CTA (one warpgroup, 128 threads) per (head h, sequence n, value half): the CTA's 64 value rows of the state,
S[v, k] (fp32, an m64n128 accumulator in registers), walk the chunks. Per chunk of valid length L:

    Sb    = bf16(S)                                  (smem, K-major: the B operand of the next two products)
    Y     = V - K_g Sb^T        (rows >= L zeroed)   (Y to smem)
    Delta = (T beta) Y          (rows >= L zeroed)   (Delta over Y)
    S     = S diag(gamma) + Delta^T K_d              (gamma: the chunk's per-key-channel decay 2^G_last)
    O     = Q_g Sb^T + P Delta                       (rows < L stored; scale and 2^G already in Q_g, P)

Q_g, K_g, K_d, this CTA's 64 columns of V, T beta and P arrive by TMA (3-D maps over the packed [T, H, *]
tensors, boxes of 64 columns x 1 head x 64 tokens) into a two-stage ring; thread 0 issues chunk c + 2 once the CTA
is done with chunk c. Rows of a box past the sequence are the next sequence's tokens (or TMA's zero fill): Y and
Delta zero them, so they add nothing to the state (the chunk pass makes every row finite).

The state is fla's layout [N, H, K, V] (read and written transposed from the accumulator), fp32. With
``HAS_CKPT`` the state entering each chunk is stored to ``ck`` [chunk slots, H, K, V] (what the backward needs).

``backward=True`` builds the backward's reverse walk (``kda_backward_packed``, kernel ``walk``) on the same ring:
D, the gradient of the state leaving a chunk (from ``dht``), steps to the gradient of the state entering it
(``bwd_step``); ``ck`` receives D leaving each chunk, ``ht`` the gradient of the initial state. Its operands come
in the forward's slots swapped: K_d in K_g's, K_g in K_d's, dO in V's.
"""

from __future__ import annotations

from types import SimpleNamespace

DIM = 128
CHUNK = 64
THREADS = 128
BOX = CHUNK * 64 * 2
NUM_STAGES = 2
STAGE = 9 * BOX  # Q_g 0-1, K_g 2-3, K_d 4-5, V 6, T beta 7, P 8
SB = NUM_STAGES * STAGE
YD = SB + 2 * BOX
TILE_BYTES = YD + BOX  # 172032
KMAJ = (1, 64)  # wgmma.desc_offsets(K_MAJOR, SWIZZLE_128B)
MNMAJ = (BOX // 16, 64)  # wgmma.desc_offsets(MN_MAJOR, SWIZZLE_128B, mn_chunk_bytes=BOX)
MN_KSTEP = 16 * 128
# Run-time flags
CU64, HAS_INIT, HAS_FINAL, HAS_CKPT = 1, 2, 4, 8


def box(s, i):
    return s * STAGE + i * BOX


def kmajor_step(box0, kk):
    return box0 + (kk // 4) * BOX + (kk % 4) * 32


def build_scan_kernel(backward: bool = False):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, tma, vector, wgmma

    io = "bfloat16"

    def i64(x):
        return T.Cast("int64", x)

    def word(b, row, col):
        return (b + 2 * tma.sw128_offset(row, col, io)) // 4

    def frag_pairs(n):
        return [(j, r) for j in range(n // 8) for r in range(2)]

    def sync():
        tma.fence_proxy_async()
        T.evaluate(T.cuda.cta_sync())

    def store_frag(tiles, b0, acc, n, warp, lane, packed, value=None):
        for j, r in frag_pairs(n):
            row = wgmma.acc_row(warp, lane, r)
            col = wgmma.acc_col(lane, j)
            vals = [acc[wgmma.acc_index(j, r, e)] for e in range(2)]
            if value is not None:
                vals = [value(row, v) for v in vals]
            vector.pack2(packed, 0, vals[0], vals[1], io)
            T.buffer_store(tiles, packed[0], [word(b0 + (8 * j // 64) * BOX, row, col % 64)])

    def issue(tiles, full, maps, s, tok0, h, vh):
        qg_map, kg_map, kd_map, v_map, tb_map, pm_map = maps
        bar = full.ptr_to([s])
        mbarrier.arrive_expect_tx(bar, 9 * BOX)
        for i in range(2):
            tma.load(tiles.ptr_to([box(s, i) // 4]), qg_map, [i * 64, h, tok0], bar)
            tma.load(tiles.ptr_to([box(s, 2 + i) // 4]), kg_map, [i * 64, h, tok0], bar)
            tma.load(tiles.ptr_to([box(s, 4 + i) // 4]), kd_map, [i * 64, h, tok0], bar)
        tma.load(tiles.ptr_to([box(s, 6) // 4]), v_map, [vh * 64, h, tok0], bar)
        tma.load(tiles.ptr_to([box(s, 7) // 4]), tb_map, [0, h, tok0], bar)
        tma.load(tiles.ptr_to([box(s, 8) // 4]), pm_map, [0, h, tok0], bar)

    def chunk_step(b, s, L, tok0, h, H, vh, warp, lane, OUT, gbase):  # noqa: N803
        tiles, s_acc, t_acc, packed, gam = b.tiles, b.s_acc, b.t_acc, b.packed, b.gam

        def kd_(byte):
            return wgmma.desc_advance(b.kdesc[0], byte)

        def md_(byte):
            return wgmma.desc_advance(b.mdesc[0], byte)

        # This chunk's decay of the thread's 32 key columns (L2-resident; issued before the first wait).
        for j in range(16):
            for e in range(2):
                T.buffer_store(gam, b.GAM[gbase + wgmma.acc_col(lane, j, e)], [2 * j + e])
        mbarrier.wait(b.full.ptr_to([s]), b.ph)
        # Sb = bf16(S): two K-major boxes (keys 0-63, 64-127).
        store_frag(tiles, SB, s_acc, 128, warp, lane, packed)
        sync()
        # K_g Sb^T
        wgmma.fence()
        for kk in range(8):
            wgmma.mma(64, t_acc, kd_(kmajor_step(box(s, 2), kk)), kd_(kmajor_step(SB, kk)), io, scale_d=kk > 0)
        wgmma.commit()
        wgmma.wait(0)
        # Y = V - K_g Sb^T, rows >= L zero (a select: padding rows may hold anything).
        for j, r in frag_pairs(64):
            row = wgmma.acc_row(warp, lane, r)
            col = wgmma.acc_col(lane, j)
            v0, v1 = vector.unpack2(tiles[word(box(s, 6), row, col)], io)
            y = [T.Select(row < L, vv - t_acc[wgmma.acc_index(j, r, e)], T.float32(0))
                 for e, vv in enumerate((v0, v1))]
            vector.pack2(packed, 0, y[0], y[1], io)
            T.buffer_store(tiles, packed[0], [word(YD, row, col)])
        sync()
        # Delta = (T beta) Y   (A: T beta K-major; B: Y [token][value], MN-major)
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(64, t_acc, kd_(box(s, 7) + kk * 32), md_(YD + kk * MN_KSTEP), io, scale_d=kk > 0,
                      b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        wgmma.wait(0)
        sync()  # every warp's Y reads retired before Delta overwrites it
        # Delta over Y, rows >= L zero (T beta's rows there are another chunk's).
        store_frag(tiles, YD, t_acc, 64, warp, lane, packed, value=lambda row, v: T.Select(row < L, v, T.float32(0)))
        sync()
        # S = S diag(gamma) + Delta^T K_d (A: Delta MN-major; B: K_d [token][key] MN-major, two 64-key chunks);
        # then Q_g Sb^T behind it.
        for j, r in frag_pairs(128):
            for e in range(2):
                idx = wgmma.acc_index(j, r, e)
                T.buffer_store(s_acc, s_acc[idx] * gam[2 * j + e], [idx])
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(128, s_acc, md_(YD + kk * MN_KSTEP), md_(box(s, 4) + kk * MN_KSTEP), io,
                      a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        for kk in range(8):
            wgmma.mma(64, t_acc, kd_(kmajor_step(box(s, 0), kk)), kd_(kmajor_step(SB, kk)), io, scale_d=kk > 0)
        for kk in range(4):
            wgmma.mma(64, t_acc, kd_(box(s, 8) + kk * 32), md_(YD + kk * MN_KSTEP), io, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        wgmma.wait(0)
        for j, r in frag_pairs(64):
            row = wgmma.acc_row(warp, lane, r)
            with T.If(row < L):
                with T.Then():
                    vector.pack2(packed, 0, t_acc[wgmma.acc_index(j, r, 0)], t_acc[wgmma.acc_index(j, r, 1)], io)
                    col = vh * 64 + wgmma.acc_col(lane, j)
                    T.buffer_store(OUT, packed[0], [((i64(tok0 + row) * H + h) * DIM + col) // 2])
        sync()  # the stage and Sb / Y are free

    def bwd_step(b, s, L, warp, lane, ct, gbase):
        """The reverse walk's chunk: D (the gradient of the state leaving the chunk, [v, k]) becomes the gradient
        of the state entering it. Stage boxes: Q_g 0-1, K_d 2-3, K_g 4-5, dO 6 (this CTA's values), T beta 7,
        P 8::

            Y  = P^T dO + K_d Db^T           (rows >= L zero)
            E  = (T beta)^T Y                (rows >= L zero; stored negated)
            D  = D diag(gamma) - E^T K_g + dO^T Q_g
        """
        tiles, s_acc, t_acc, packed, gam = b.tiles, b.s_acc, b.t_acc, b.packed, b.gam

        def kd_(byte):
            return wgmma.desc_advance(b.kdesc[0], byte)

        def md_(byte):
            return wgmma.desc_advance(b.mdesc[0], byte)

        for j in range(16):
            for e in range(2):
                T.buffer_store(gam, b.GAM[gbase + wgmma.acc_col(lane, j, e)], [2 * j + e])
        mbarrier.wait(b.full.ptr_to([s]), b.ph)
        # dO rows >= L: zero (they are the next sequence's; P^T dO and dO^T Q_g sum over the rows).
        for i in range(CHUNK * 32 // THREADS):
            w = ct + THREADS * i
            with T.If(w // 32 >= L):
                with T.Then():
                    T.buffer_store(tiles, T.uint32(0), [box(s, 6) // 4 + w])
        store_frag(tiles, SB, s_acc, 128, warp, lane, packed)
        sync()
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(64, t_acc, md_(box(s, 8) + kk * MN_KSTEP), md_(box(s, 6) + kk * MN_KSTEP), io, scale_d=kk > 0,
                      a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
        for kk in range(8):
            wgmma.mma(64, t_acc, kd_(kmajor_step(box(s, 2), kk)), kd_(kmajor_step(SB, kk)), io)
        wgmma.commit()
        wgmma.wait(0)
        store_frag(tiles, YD, t_acc, 64, warp, lane, packed, value=lambda row, v: T.Select(row < L, v, T.float32(0)))
        sync()
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(64, t_acc, md_(box(s, 7) + kk * MN_KSTEP), md_(YD + kk * MN_KSTEP), io, scale_d=kk > 0,
                      a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        wgmma.wait(0)
        sync()
        store_frag(tiles, YD, t_acc, 64, warp, lane, packed,
                   value=lambda row, v: T.Select(row < L, T.float32(0) - v, T.float32(0)))
        sync()
        for j, r in frag_pairs(128):
            for e in range(2):
                idx = wgmma.acc_index(j, r, e)
                T.buffer_store(s_acc, s_acc[idx] * gam[2 * j + e], [idx])
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(128, s_acc, md_(YD + kk * MN_KSTEP), md_(box(s, 4) + kk * MN_KSTEP), io,
                      a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
        for kk in range(4):
            wgmma.mma(128, s_acc, md_(box(s, 6) + kk * MN_KSTEP), md_(box(s, 0) + kk * MN_KSTEP), io,
                      a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        wgmma.wait(0)
        sync()  # the stage and Sb / Y are free

    def step(b, s, L, tok0, h, H, vh, warp, lane, tid, OUT, gbase):  # noqa: N803
        if backward:
            bwd_step(b, s, L, warp, lane, tid, gbase)
        else:
            chunk_step(b, s, L, tok0, h, H, vh, warp, lane, OUT, gbase)

    def chunk_of(it, n_chunks):
        return n_chunks - 1 - it if backward else it

    def state_offset(n, h, H, vh, warp, lane, j, r, e):  # noqa: N803
        """fla's [N, H, K, V] offset of accumulator element (row v, column k)."""
        v = vh * 64 + wgmma.acc_row(warp, lane, r)
        k = wgmma.acc_col(lane, j, e)
        return ((i64(n) * H + h) * DIM + k) * DIM + v

    def load_state(s_acc, H0, n, h, H, vh, warp, lane, flags):  # noqa: N803
        for j, r in frag_pairs(128):
            for e in range(2):
                T.buffer_store(s_acc, T.if_then_else((flags & HAS_INIT) > 0,
                                                     H0[state_offset(n, h, H, vh, warp, lane, j, r, e)],
                                                     T.float32(0)), [wgmma.acc_index(j, r, e)])

    def store_state(s_acc, HT, n, h, H, vh, warp, lane):  # noqa: N803
        for j, r in frag_pairs(128):
            for e in range(2):
                T.buffer_store(HT, s_acc[wgmma.acc_index(j, r, e)], [state_offset(n, h, H, vh, warp, lane, j, r, e)])

    def prologue(tiles, full, maps, n_chunks, bos, h, vh):
        for s in range(NUM_STAGES):
            with T.If(s < n_chunks):
                with T.Then():
                    issue(tiles, full, maps, s, bos + chunk_of(s, n_chunks) * CHUNK, h, vh)

    def init_bars(full):
        for s in range(NUM_STAGES):
            mbarrier.init(full.ptr_to([s]), 1)
        mbarrier.fence_init()

    @T.prim_func
    def kda_scan(qg_ptr: T.handle, kg_ptr: T.handle, kd_ptr: T.handle, v_ptr: T.handle, tb_ptr: T.handle,
                 pm_ptr: T.handle, gam_ptr: T.handle, cu_ptr: T.handle, cbase_ptr: T.handle, o_ptr: T.handle,
                 h0_ptr: T.handle, ht_ptr: T.handle, ck_ptr: T.handle, n_seqs: T.int32, flags: T.int32):
        total = T.int32()
        H = T.int32()
        n_gam = T.int64()
        n_cu = T.int32()
        n_cb = T.int32()
        n_o = T.int64()
        n_h0 = T.int64()
        n_ht = T.int64()
        n_ck = T.int64()
        QG = T.match_buffer(qg_ptr, (total, H, DIM), io, align=16)
        KG = T.match_buffer(kg_ptr, (total, H, DIM), io, align=16)
        KD = T.match_buffer(kd_ptr, (total, H, DIM), io, align=16)
        V = T.match_buffer(v_ptr, (total, H, DIM), io, align=16)
        TB = T.match_buffer(tb_ptr, (total, H, CHUNK), io, align=16)
        PM = T.match_buffer(pm_ptr, (total, H, CHUNK), io, align=16)
        GAM = T.match_buffer(gam_ptr, (n_gam,), "float32", align=16)
        CU = T.match_buffer(cu_ptr, (n_cu,), "int32", align=4)
        CB = T.match_buffer(cbase_ptr, (n_cb,), "int32", align=4)
        OUTb = T.match_buffer(o_ptr, (n_o,), io, align=16)
        H0 = T.match_buffer(h0_ptr, (n_h0,), "float32", align=16)
        HT = T.match_buffer(ht_ptr, (n_ht,), "float32", align=16)
        CK = T.match_buffer(ck_ptr, (n_ck,), "float32", align=16)
        qg_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        kg_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        kd_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tb_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        pm_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(qg_map, QG.data, [DIM, H, total], [DIM, H * DIM], [64, 1, CHUNK], io)
        tma.encode(kg_map, KG.data, [DIM, H, total], [DIM, H * DIM], [64, 1, CHUNK], io)
        tma.encode(kd_map, KD.data, [DIM, H, total], [DIM, H * DIM], [64, 1, CHUNK], io)
        tma.encode(v_map, V.data, [DIM, H, total], [DIM, H * DIM], [64, 1, CHUNK], io)
        tma.encode(tb_map, TB.data, [CHUNK, H, total], [CHUNK, H * CHUNK], [64, 1, CHUNK], io)
        tma.encode(pm_map, PM.data, [CHUNK, H, total], [CHUNK, H * CHUNK], [64, 1, CHUNK], io)
        T.device_entry()
        OUT = T.decl_buffer((n_o // 2,), "uint32", data=OUTb.data)
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        h, n, vh = T.cta_id([H, n_seqs, 2])
        tid = T.thread_id([THREADS])

        pool = T.SMEMPool()
        tiles = pool.alloc((TILE_BYTES // 4,), "uint32", align=1024)
        full = pool.alloc((NUM_STAGES,), "uint64", align=8)
        pool.commit()
        packed = T.alloc_local((1,), "uint32")
        kd0 = T.alloc_local((1,), "uint64")
        md0 = T.alloc_local((1,), "uint64")
        s_acc = T.alloc_local((64,), "float32")
        t_acc = T.alloc_local((32,), "float32")
        gam = T.alloc_local((32,), "float32")
        warp = tid // 32
        lane = tid % 32

        cu64 = (flags & CU64) > 0
        bos = T.min(T.max(CU[T.if_then_else(cu64, n + n, n)], 0), total)
        eos = T.min(T.max(CU[T.if_then_else(cu64, n + n + 2, n + 1)], bos), total)
        n_chunks = (eos - bos + CHUNK - 1) // CHUNK
        cbase = CB[n]

        if tid == 0:
            init_bars(full)
        T.cuda.cta_sync()
        if tid == 0:
            prologue(tiles, full, (qg_map, kg_map, kd_map, v_map, tb_map, pm_map), n_chunks, bos, h, vh)
        wgmma.encode_desc(kd0.ptr_to([0]), tiles.ptr_to([0]), KMAJ[0], KMAJ[1], wgmma.SWIZZLE_128B)
        wgmma.encode_desc(md0.ptr_to([0]), tiles.ptr_to([0]), MNMAJ[0], MNMAJ[1], wgmma.SWIZZLE_128B)
        load_state(s_acc, H0, n, h, H, vh, warp, lane, flags)
        for it in range(n_chunks):
            s = it % NUM_STAGES
            c = chunk_of(it, n_chunks)
            L = T.min(eos - bos - c * CHUNK, CHUNK)
            if (flags & HAS_CKPT) > 0:
                store_state(s_acc, CK, cbase + c, h, H, vh, warp, lane)
            step(SimpleNamespace(tiles=tiles, s_acc=s_acc, t_acc=t_acc, packed=packed, gam=gam, kdesc=kd0,
                                 mdesc=md0, full=full, ph=(it // NUM_STAGES) % 2, GAM=GAM),
                 s, L, bos + c * CHUNK, h, H, vh, warp, lane, tid, OUT, (i64(cbase + c) * H + h) * DIM)
            if tid == 0:
                if it + NUM_STAGES < n_chunks:
                    issue(tiles, full, (qg_map, kg_map, kd_map, v_map, tb_map, pm_map), s,
                          bos + chunk_of(it + NUM_STAGES, n_chunks) * CHUNK, h, vh)
        if (flags & HAS_FINAL) > 0:
            store_state(s_acc, HT, n, h, H, vh, warp, lane)

    return kda_scan

