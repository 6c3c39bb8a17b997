# SPDX-License-Identifier: Apache-2.0
# Semantics and argument conventions follow cuDNN Frontend's GDN-1 linear-attention kernels
# (python/cudnn/linear_attention/frost/kernel/gdn_prefill_f16.py and gdn_recompute_f16.py,
# https://github.com/NVIDIA/cudnn-frontend, v1.28.0, commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082); read, not
# copied. The chunk algorithm and its Hopper schedule are this project's gdn_prefill_sm90 generator
# (tirx_kernels.ported.flashinfer.gdn_prefill._kernel at commit 8aa4469), whose aux-warpgroup WY transform (_wy) and
# shared-memory map (_layout) are imported unchanged.
"""The TIRx generator of cuDNN's chunked GDN-1 forward (``cudnn_sm90_gdn_prefill_f16``) and of its checkpoint
recompute (``cudnn_sm90_gdn_recompute_f16``).

The schedule is gdn_prefill_sm90's: one CTA per (state head h, sequence n), 64-token chunks, a producer warpgroup
streaming Q/K/V by TMA, an aux warpgroup doing the chunk-local WY transform one chunk ahead, two consumer warpgroups
holding 64 fp32 state rows each in registers (``flashinfer.gdn_prefill._kernel`` explains the chunk products).
What cuDNN's contract adds:

- per-chunk **state checkpoints**: with a cadence of ``cc`` chunks (``checkpoint_every_n_tokens / 64``), the state
  *entering* chunk ``it`` (``it % cc == 0``), rounded to the I/O dtype, is the chunk's own 16-bit copy Sb: its two
  smem boxes go by TMA to row ``ckpt_offsets[n] + it / cc`` of ``checkpoints [count, H, V, K]``. A sequence's
  checkpoint 0 is its initial state and a sequence of L tokens has ceil(L / cadence) of them (cuDNN's pre-chunk
  indexing, the backward's input);
- the **recompute** form: no Q and no O. Only K and V are loaded; the checkpoints and / or the final state are its
  outputs.

States are fp32 here (the op converts a bf16 initial / final state around the launch); gate and beta are fp32
[T, H] (the op turns cuDNN's safe gate and beta logits into them). A sequence's CTA without chunks (empty sequence)
passes its initial state (or zero) to the final state.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from tirx_kernels.ported.flashinfer.gdn_prefill import _layout as lay

LOG2E = 1.4426950408889634
LINEAR_GATE_FLOOR = 1e-30  # log2 of a linear gate of 0 (core.delta_rule_ref.LINEAR_GATE_FLOOR)
IO_DTYPES = ("bfloat16", "float16")
MODES = ("prefill", "recompute")
INV_DTYPE = "float16"
HAS_CKPT = 1 << 10  # run-time flag beside _layout's HAS_G, GATE_LOG, HAS_BETA, CU64, HAS_INIT, HAS_FINAL


def build_kernel(io: str, mode: str = "prefill"):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, roles, tma, vector, wgmma
    from tirx_kernels.ported.flashinfer.gdn_prefill import _wy

    if io not in IO_DTYPES:
        raise ValueError(f"cudnn gdn: io dtype {io!r} is not one of {IO_DTYPES}")
    if mode not in MODES:
        raise ValueError(f"cudnn gdn: mode {mode!r} is not one of {MODES}")
    with_q = mode == "prefill"
    # The aux computes P (from the Q box) only where the WY module can leave it out (a no-output kernel's option).
    aux_kw = {} if with_q or "with_p" not in inspect.signature(_wy.aux_chunk).parameters else {"with_p": False}
    smem = lay.TILE_BYTES + 4 * lay.VEC_WORDS + 8 * 4 * lay.NUM_STAGES
    assert smem <= lay.SMEM_LIMIT, smem
    # full: lane 0's arrive.expect_tx plus the 32 lanes that wrote G / beta; empty: the aux and each consumer.
    qkv_ring = mbarrier.Ring(lay.NUM_STAGES, consumer_arrivals=1 + lay.NUM_CONSUMERS, producer_arrivals=33)
    aux_ring = mbarrier.Ring(lay.NUM_STAGES, consumer_arrivals=lay.NUM_CONSUMERS)
    cvt = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[io]

    def i64(x):
        return T.Cast("int64", x)

    def index_at(ix, i, is64):
        """Entry ``i`` of an int32 / int64 index array (its low word: every valid value is below 2**31)."""
        return ix[T.if_then_else(is64, i + i, i)]

    def flag(flags, f):
        return (flags & f) > 0

    def kdesc(b, byte):
        return wgmma.desc_advance(b.kdesc[0], byte)

    def mdesc(b, byte):
        return wgmma.desc_advance(b.mdesc[0], byte)

    def state_offset(slot, h, Hs, cw, warp, lane, j, r):  # noqa: N803
        v = cw * lay.V_PER_CONSUMER + wgmma.acc_row(warp, lane, r)
        return ((i64(slot) * Hs + h) * lay.DIM + v) * lay.DIM + wgmma.acc_col(lane, j)

    def consumer_chunk(b, s, L, tok0, h, Hs, scale, cw, warp, lane, ck_row):  # noqa: N803
        tiles, vec, s_acc, t_acc, packed = b.tiles, b.vec, b.s_acc, b.t_acc, b.packed
        sb, yd = lay.sb_box(cw, 0), lay.yd_box(cw)
        bar = lay.CONSUMER_BAR + cw

        def sync():
            tma.fence_proxy_async()
            T.evaluate(T.cuda.warpgroup_sync(bar))

        for r in range(2):
            T.buffer_store(b.gam, T.exp2(vec[lay.vec_g(s, wgmma.acc_row(warp, lane, r))]), [r])
        T.buffer_store(b.gam, T.exp2(vec[lay.vec_g(s, lay.CHUNK - 1)]), [2])  # G is flat past L
        # Sb = S rounded to 16 bits, two K-major boxes (keys 0-63, 64-127).
        _wy.store_frag(tiles, sb, s_acc, 128, warp, lane, io, packed)
        sync()
        # The checkpoint of the state entering this chunk (ck_row < 0: none) is Sb: its two boxes go out by TMA
        # (rows v of checkpoint row ck_row, head h), read back from smem before the chunk's last sync.
        issuer = T.And(ck_row >= 0, T.And(warp == 0, lane == 0))
        with T.If(issuer):
            with T.Then():
                for bb in range(2):
                    tma.store(b.ck_map, [bb * 64, cw * lay.V_PER_CONSUMER, ck_row * Hs + h],
                              tiles.ptr_to([(sb + bb * lay.BOX) // 4]))
                tma.store_commit()
        # K Sb^T
        wgmma.fence()
        for kk in range(8):
            wgmma.mma(64, t_acc, kdesc(b, lay.kmajor_step(lay.k_box(s, 0), kk)), kdesc(b, lay.kmajor_step(sb, kk)),
                      io, scale_d=kk > 0)
        wgmma.commit()
        wgmma.wait(0)
        # Y = V - gamma K Sb^T; rows past the sequence are selected to zero (they may be a caller's NaN padding).
        for j, r in lay.frag_pairs(64):
            row = wgmma.acc_row(warp, lane, r)
            col = wgmma.acc_col(lane, j)
            v0, v1 = vector.unpack2(tiles[lay.word(lay.v_box(s, cw), row, col, io)], io)
            y = [T.Select(row < L, vv - b.gam[r] * t_acc[wgmma.acc_index(j, r, e)], T.float32(0))
                 for e, vv in enumerate((v0, v1))]
            _wy.pack_store(tiles, lay.word(yd, row, col, io), y[0], y[1], io, packed)
        mbarrier.wait(b.aux_full.ptr_to([s]), b.ph)
        sync()
        # Delta = (T beta) Y
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(64, t_acc, kdesc(b, lay.tb_box(s) + kk * 32), mdesc(b, yd + kk * lay.MN_KSTEP), io,
                      scale_d=kk > 0, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        wgmma.wait(0)
        _wy.store_frag(tiles, yd, t_acc, 64, warp, lane, io, packed)
        with T.If(issuer):
            with T.Then():
                tma.store_wait_read(0)  # Sb is rewritten next chunk; the syncs from here on order every thread after
        sync()
        # S = gamma_last S + Delta^T K_d, then (prefill) Q Sb^T, the output's inter-chunk part, behind it.
        for i in range(wgmma.acc_regs(128)):
            T.buffer_store(s_acc, s_acc[i] * b.gam[2], [i])
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(128, s_acc, mdesc(b, yd + kk * lay.MN_KSTEP), mdesc(b, lay.kd_box(s, 0) + kk * lay.MN_KSTEP),
                      io, a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        if with_q:
            for kk in range(8):
                wgmma.mma(64, t_acc, kdesc(b, lay.kmajor_step(lay.q_box(s, 0), kk)),
                          kdesc(b, lay.kmajor_step(sb, kk)), io, scale_d=kk > 0)
            wgmma.commit()
        wgmma.wait(0)
        qkv_ring.consumer_release_warpgroup(b.qkv_empty, s, warp, lane)
        if not with_q:
            aux_ring.consumer_release_warpgroup(b.aux_empty, s, warp, lane)
            return
        # O = scale gamma Q Sb^T + P Delta
        for j, r in lay.frag_pairs(64):
            for e in range(2):
                idx = wgmma.acc_index(j, r, e)
                T.buffer_store(t_acc, t_acc[idx] * (scale * b.gam[r]), [idx])
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(64, t_acc, kdesc(b, lay.p_box(s) + kk * 32), mdesc(b, yd + kk * lay.MN_KSTEP), io,
                      b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        wgmma.wait(0)
        aux_ring.consumer_release_warpgroup(b.aux_empty, s, warp, lane)
        for j, r in lay.frag_pairs(64):
            row = wgmma.acc_row(warp, lane, r)
            with T.If(row < L):
                with T.Then():
                    T.evaluate(cvt(packed[0], t_acc[wgmma.acc_index(j, r, 1)], t_acc[wgmma.acc_index(j, r, 0)]))
                    col = cw * lay.V_PER_CONSUMER + wgmma.acc_col(lane, j)
                    T.buffer_store(b.ow, packed[0], [((i64(tok0 + row) * Hs + h) * lay.DIM + col) // 2])

    @T.prim_func
    def gdn_fwd(q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, g_ptr: T.handle, beta_ptr: T.handle,
                cu_ptr: T.handle, o_ptr: T.handle, h0_ptr: T.handle, ht_ptr: T.handle, ckoff_ptr: T.handle,
                ck_ptr: T.handle, n_seqs: T.int32, flags: T.int32, scale: T.float32, ck_every: T.int32):
        total = T.int32()
        Hq = T.int32()
        Hk = T.int32()
        Hv = T.int32()
        n_g = T.int32()
        n_beta = T.int32()
        n_cu = T.int32()
        n_o = T.int64()
        n_h0 = T.int64()
        n_ht = T.int64()
        n_ckoff = T.int32()
        n_ck = T.int64()
        Q = T.match_buffer(q_ptr, (total, Hq, lay.DIM), io, align=16)
        K = T.match_buffer(k_ptr, (total, Hk, lay.DIM), io, align=16)
        V = T.match_buffer(v_ptr, (total, Hv, lay.DIM), io, align=16)
        G = T.match_buffer(g_ptr, (n_g,), "float32", align=4)
        B = T.match_buffer(beta_ptr, (n_beta,), "float32", align=4)
        CU = T.match_buffer(cu_ptr, (n_cu,), "int32", align=4)
        OUT = T.match_buffer(o_ptr, (n_o,), io, align=16)
        H0 = T.match_buffer(h0_ptr, (n_h0,), "float32", align=16)
        HT = T.match_buffer(ht_ptr, (n_ht,), "float32", align=16)
        CKOFF = T.match_buffer(ckoff_ptr, (n_ckoff,), "int32", align=4)
        CK = T.match_buffer(ck_ptr, (n_ck,), io, align=16)
        # Host: 3-D maps (D, heads, tokens), boxes of 64 columns x 1 head x 64 tokens.
        q_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(q_map, Q.data, [lay.DIM, Hq, total], [lay.DIM, Hq * lay.DIM], [64, 1, lay.CHUNK], io)
        tma.encode(k_map, K.data, [lay.DIM, Hk, total], [lay.DIM, Hk * lay.DIM], [64, 1, lay.CHUNK], io)
        tma.encode(v_map, V.data, [lay.DIM, Hv, total], [lay.DIM, Hv * lay.DIM], [64, 1, lay.CHUNK], io)
        # Checkpoints [count, H, V, K] as (K, V, count x H) rows; a call without them passes a small dummy (one
        # row declared, never stored to).
        ck_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(ck_map, CK.data, [lay.DIM, lay.DIM, T.max(T.Cast("int32", n_ck // (lay.DIM * lay.DIM)), 1)],
                   [lay.DIM, lay.DIM * lay.DIM], [64, 64, 1], io)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        h, n = T.cta_id([T.max(Hq, Hv), n_seqs])
        Hs = T.max(Hq, Hv)  # the recompute passes k as q: max(Hk, Hv)
        wg = T.warpgroup_id([2 + lay.NUM_CONSUMERS])
        tid = T.thread_id([lay.THREADS])

        pool = T.SMEMPool()
        tiles = pool.alloc((lay.TILE_BYTES // 4,), "uint32", align=1024)
        vec = pool.alloc((lay.VEC_WORDS,), "float32", align=16)
        qkv_full = pool.alloc((lay.NUM_STAGES,), "uint64", align=8)
        qkv_empty = pool.alloc((lay.NUM_STAGES,), "uint64", align=8)
        aux_full = pool.alloc((lay.NUM_STAGES,), "uint64", align=8)
        aux_empty = pool.alloc((lay.NUM_STAGES,), "uint64", align=8)
        pool.commit()
        tf = T.decl_buffer((lay.TILE_BYTES // 4,), "float32", data=tiles.data, scope="shared.dyn")
        packed = T.alloc_local((1,), "uint32")
        kd0 = T.alloc_local((1,), "uint64")
        md0 = T.alloc_local((1,), "uint64")

        cu64 = flag(flags, lay.CU64)
        bos = T.min(T.max(index_at(CU, n, cu64), 0), total)
        eos = T.min(T.max(index_at(CU, n + 1, cu64), bos), total)
        n_chunks = (eos - bos + lay.CHUNK - 1) // lay.CHUNK
        hk = h // (Hs // Hk)
        hv = h // (Hs // Hv)

        if tid == 0:
            qkv_ring.init(qkv_full, qkv_empty)
            aux_ring.init(aux_full, aux_empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()

        if wg == 0:
            roles.setmaxnreg_dec(lay.PRODUCER_REGS)
            lane = tid % 32
            la = T.alloc_local((2,), "float32")
            bt = T.alloc_local((2,), "float32")
            if tid < 32:
                for it in range(n_chunks):
                    s = qkv_ring.stage(it)
                    tok0 = bos + it * lay.CHUNK
                    qkv_ring.producer_acquire(qkv_empty, it)
                    if lane == 0:
                        qkv_ring.producer_expect(qkv_full, it, (6 if with_q else 4) * lay.BOX)
                        for c in T.unroll(2):
                            if with_q:
                                tma.load(tiles.ptr_to([lay.q_box(s, c) // 4]), q_map, [c * 64, h // (Hs // Hq), tok0],
                                         qkv_full.ptr_to([s]))
                            tma.load(tiles.ptr_to([lay.k_box(s, c) // 4]), k_map, [c * 64, hk, tok0],
                                     qkv_full.ptr_to([s]))
                            tma.load(tiles.ptr_to([lay.v_box(s, c) // 4]), v_map, [c * 64, hv, tok0],
                                     qkv_full.ptr_to([s]))
                    for i in T.unroll(2):
                        tok = tok0 + 32 * i + lane
                        la[i] = T.float32(0)
                        bt[i] = T.float32(0)
                        if tok < eos:
                            bt[i] = T.float32(1)
                            if flag(flags, lay.HAS_G):
                                gv = G[i64(tok) * Hs + h]
                                la[i] = T.Select(flag(flags, lay.GATE_LOG), gv * T.float32(LOG2E),
                                                 T.log2(T.max(gv, T.float32(LINEAR_GATE_FLOOR))))
                            if flag(flags, lay.HAS_BETA):
                                bt[i] = B[i64(tok) * Hs + h]
                    # Inclusive scan of the 64 log2 decays (lane holds tokens lane and 32 + lane).
                    for i in T.unroll(2):
                        for d in T.unroll(5):
                            up = T.cuda.__shfl_up_sync(T.uint32(0xFFFFFFFF), la[i], 1 << d, 32)
                            if lane >= (1 << d):
                                la[i] = la[i] + up
                    la[1] = la[1] + T.cuda.__shfl_sync(T.uint32(0xFFFFFFFF), la[0], 31, 32)
                    for i in T.unroll(2):
                        vec[lay.vec_g(s, 32 * i + lane)] = la[i]
                        vec[lay.vec_beta(s, 32 * i + lane)] = bt[i]
                    mbarrier.arrive(qkv_full.ptr_to([s]))
        elif wg == 1:
            roles.setmaxnreg_inc(lay.AUX_REGS)
            ct = tid - 128
            warp = ct // 32
            lane = ct % 32
            acc1 = T.alloc_local((32,), "float32")
            acc2 = T.alloc_local((32,), "float32")
            afrag = T.alloc_local((16,), "uint32")
            xs = T.alloc_local((16,), "float32")
            vw = T.alloc_local((4,), "uint32")
            wgmma.encode_desc(kd0.ptr_to([0]), tiles.ptr_to([0]), lay.KMAJ[0], lay.KMAJ[1], wgmma.SWIZZLE_128B)
            wgmma.encode_desc(md0.ptr_to([0]), tiles.ptr_to([0]), lay.MNMAJ[0], lay.MNMAJ[1], wgmma.SWIZZLE_128B)
            for it in range(n_chunks):
                s = aux_ring.stage(it)
                L = T.min(eos - bos - it * lay.CHUNK, lay.CHUNK)
                qkv_ring.consumer_wait(qkv_full, it)
                aux_ring.producer_acquire(aux_empty, it)
                _wy.aux_chunk(SimpleNamespace(tiles=tiles, tf=tf, vec=vec, acc1=acc1, acc2=acc2, afrag=afrag, xs=xs,
                                              packed=packed, vw=vw, kdesc=kd0, mdesc=md0),
                              s, L, scale, warp, lane, ct, io, INV_DTYPE, **aux_kw)
                if ct == 0:
                    mbarrier.arrive(aux_full.ptr_to([s]))
                    mbarrier.arrive(qkv_empty.ptr_to([s]))
        else:
            roles.setmaxnreg_inc(lay.CONSUMER_REGS)
            cw = wg - 2
            ct = tid - 128 * wg
            warp = ct // 32
            lane = ct % 32
            s_acc = T.alloc_local((64,), "float32")
            t_acc = T.alloc_local((32,), "float32")
            gam = T.alloc_local((3,), "float32")
            wgmma.encode_desc(kd0.ptr_to([0]), tiles.ptr_to([0]), lay.KMAJ[0], lay.KMAJ[1], wgmma.SWIZZLE_128B)
            wgmma.encode_desc(md0.ptr_to([0]), tiles.ptr_to([0]), lay.MNMAJ[0], lay.MNMAJ[1], wgmma.SWIZZLE_128B)
            ow = T.decl_buffer((n_o // 2,), "uint32", data=OUT.data)
            has_ck = flag(flags, HAS_CKPT)
            ck0 = T.if_then_else(has_ck, CKOFF[T.if_then_else(has_ck, n, 0)], 0)
            for j in T.unroll(16):
                for r in T.unroll(2):
                    for e in T.unroll(2):
                        s_acc[j * 4 + r * 2 + e] = T.float32(0)
                        if flag(flags, lay.HAS_INIT):
                            s_acc[j * 4 + r * 2 + e] = H0[state_offset(n, h, Hs, cw, warp, lane, j, r) + e]
            for it in range(n_chunks):
                s = qkv_ring.stage(it)
                L = T.min(eos - bos - it * lay.CHUNK, lay.CHUNK)
                ck_row = T.if_then_else(T.And(has_ck, it % ck_every == 0), ck0 + it // ck_every, -1)
                qkv_ring.consumer_wait(qkv_full, it)
                consumer_chunk(SimpleNamespace(tiles=tiles, vec=vec, s_acc=s_acc, t_acc=t_acc, packed=packed, gam=gam,
                                               kdesc=kd0, mdesc=md0, aux_full=aux_full, aux_empty=aux_empty,
                                               qkv_empty=qkv_empty, ph=aux_ring.phase(it), ow=ow, ck_map=ck_map),
                               s, L, bos + it * lay.CHUNK, h, Hs, scale, cw, warp, lane, ck_row)
            if flag(flags, lay.HAS_FINAL):
                for j in T.unroll(16):
                    for r in T.unroll(2):
                        for e in T.unroll(2):
                            HT[state_offset(n, h, Hs, cw, warp, lane, j, r) + e] = s_acc[j * 4 + r * 2 + e]

    return gdn_fwd
