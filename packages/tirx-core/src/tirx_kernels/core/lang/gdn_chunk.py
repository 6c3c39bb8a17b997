# SPDX-License-Identifier: Apache-2.0
# Semantics follow FlashInfer's chunk_gated_delta_rule (flashinfer/gdn_prefill.py and the sm90 CuTe-DSL kernel
# flashinfer/gdn_kernels/delta_rule_dsl/delta_rule_sm90.py, flashinfer-python 0.7.4), fla's chunk_gated_delta_rule
# (fla-core 0.6.0) and cuDNN Frontend's GDN-1 linear-attention kernels (python/cudnn/linear_attention/frost/kernel/
# gdn_prefill_f16.py and gdn_recompute_f16.py, v1.28.0, commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082); read, not
# copied. Written anew in TIRx on tirx-core's Hopper layer.
"""The TIRx generator of the chunked Gated DeltaNet forward on Hopper, shared by FlashInfer's ``gdn_prefill_sm90``
(and the phase-1 kernel of ``gdn_cp_prefill_sm90``) and cuDNN's ``cudnn_sm90_gdn_prefill_f16`` / ``_recompute_f16``.

One CTA per (state head h, sequence n) walks the sequence's chunks of 64 tokens; 512 threads:

- warpgroup 0, the producer (40 registers): warp 0 streams each chunk's Q, K, V (3-D tensor maps over the packed
  [T, H, 128] tensors: two 64-column boxes each, rows past the sequence are other sequences' tokens or TMA's zero
  fill, masked below) through a two-stage ring, and writes the chunk's in-chunk cumulative log2 decay G and beta
  (zero past the sequence end, so padded tokens neither decay nor update) beside it.
- warpgroup 1, the aux (``_wy.aux_chunk``): the state-independent part of the chunk, one chunk ahead: P (the
  decayed, causal, scaled Q K^T), T beta = (I + A)^-1 diag(beta) and K_d (keys decayed to the chunk end), into a
  two-stage ring of its own.
- warpgroups 2 and 3, the consumers: state rows (values) 64 c .. 64 c + 63 each, fp32 in registers (an m64n128
  accumulator S[v, k]). Per chunk, with gamma_t = 2^G_t:

      Sb    = bf16(S)                                    (smem, the B operand of the next two products)
      Y     = V - diag(gamma) K Sb^T                      (K Sb^T on wgmma; Y to smem)
      Delta = (T beta) Y                                 (Delta to smem)
      S     = gamma_last S + Delta^T K_d                 (A = Delta MN-major, B = K_d MN-major)
      O     = scale diag(gamma) Q Sb^T + P Delta         (stored to global, rows of the sequence only)

The state is read from ``initial_state`` (row ``state_indices[n]`` of a pool, or ``n``; none or a negative index:
zero) and the final one written to ``output_state`` (row ``output_state_indices[n]``, else the read row; negative:
not written).


Variants (``build_kernel(io, variant)``), one schedule:

- ``"prefill"``: FlashInfer's contract above (state pool rows through ``state_indices`` / ``output_state_indices``).
- ``"transition"``: the context-parallel phase-1 kernel (``ported.flashinfer.gdn_prefill._cp``): no Q and no output,
  run bounds read as int32 pairs, a run whose read slot is ``IDENTITY_SLOT`` starts from the identity with V taken
  as 0.
- ``"checkpoint_prefill"`` / ``"checkpoint_recompute"``: cuDNN's contract. States are read from and written to row
  ``n`` (no pool indices); with a cadence of ``cc`` chunks (``checkpoint_every_n_tokens / 64``) the state *entering*
  chunk ``it`` (``it % cc == 0``), rounded to the I/O dtype, is the chunk's own 16-bit copy Sb: its two smem boxes go
  by TMA to row ``ckpt_offsets[n] + it / cc`` of ``checkpoints [count, H, V, K]`` (a sequence's checkpoint 0 is its
  initial state; cuDNN's pre-chunk indexing, the backward's input). The recompute form has no Q and no O: only K
  and V are loaded, and the checkpoints and / or the final state are its outputs.

The generator was written for the FlashInfer port (``gdn_prefill_sm90``) and extended for cuDNN's checkpoints; it
lives in tirx-core because both ports build on it (one prim_func body, a ``T.macro``; the two argument lists differ).
"""

from __future__ import annotations

from types import SimpleNamespace

from tirx_kernels.core.lang import gdn_layout as lay

LOG2E = 1.4426950408889634
LINEAR_GATE_FLOOR = 1e-30  # log2 of a linear gate of 0 (core.delta_rule_ref.LINEAR_GATE_FLOOR)
IO_DTYPES = ("bfloat16", "float16")
INV_DTYPE = "float16"
IDENTITY_SLOT = -2  # transition kernel: a run whose read slot is this starts from the identity with V taken as 0
VARIANTS = ("prefill", "transition", "checkpoint_prefill", "checkpoint_recompute")


def build_kernel(io: str, variant: str = "prefill"):
    """The chunked GDN forward kernel of one variant (module docstring)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import gdn_wy as _wy
    from tirx_kernels.core.lang import mbarrier, roles, tma, vector, wgmma

    if io not in IO_DTYPES:
        raise ValueError(f"gdn chunk kernel: io dtype {io!r} is not one of {IO_DTYPES}")
    if variant not in VARIANTS:
        raise ValueError(f"gdn chunk kernel: variant {variant!r} is not one of {VARIANTS}")
    transition = variant == "transition"
    ckpt = variant.startswith("checkpoint")
    with_q = variant in ("prefill", "checkpoint_prefill")  # Q feeds only the output
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

    def consumer_chunk(b, s, L, tok0, h, Hs, scale, cw, warp, lane, ck_row=None):  # noqa: N803
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
        if ckpt:
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
        # Y = V - gamma K Sb^T (V's box of this consumer's values, read at the fragment's positions; in a transition
        # kernel's identity run, 0). Rows past the sequence are zeroed, not left to the zero columns of T beta: they
        # may be another caller's padding (NaN, and 0 x NaN = NaN inside the next product).
        for j, r in lay.frag_pairs(64):
            row = wgmma.acc_row(warp, lane, r)
            col = wgmma.acc_col(lane, j)
            v0, v1 = vector.unpack2(tiles[lay.word(lay.v_box(s, cw), row, col, io)], io)
            if transition:
                v0, v1 = (T.Select(b.zero_v, T.float32(0), vv) for vv in (v0, v1))
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
        if ckpt:
            with T.If(issuer):
                with T.Then():
                    tma.store_wait_read(0)  # Sb is rewritten next chunk; the syncs from here on order every thread
        sync()
        # S = gamma_last S + Delta^T K_d, then Q Sb^T (the output's inter-chunk part) behind it.
        for i in range(wgmma.acc_regs(128)):
            T.buffer_store(s_acc, s_acc[i] * b.gam[2], [i])
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(128, s_acc, mdesc(b, yd + kk * lay.MN_KSTEP), mdesc(b, lay.kd_box(s, 0) + kk * lay.MN_KSTEP),
                      io, a_major=wgmma.MN_MAJOR, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        if not with_q:  # no output: the state update only
            wgmma.wait(0)
            qkv_ring.consumer_release_warpgroup(b.qkv_empty, s, warp, lane)
            aux_ring.consumer_release_warpgroup(b.aux_empty, s, warp, lane)
            return
        for kk in range(8):
            wgmma.mma(64, t_acc, kdesc(b, lay.kmajor_step(lay.q_box(s, 0), kk)), kdesc(b, lay.kmajor_step(sb, kk)),
                      io, scale_d=kk > 0)
        wgmma.commit()
        wgmma.wait(0)
        qkv_ring.consumer_release_warpgroup(b.qkv_empty, s, warp, lane)
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

    def bound(cu, n, end, cu64):
        """Sequence ``n``'s first (``end`` 0) or past-the-end token; the transition kernel's runs are int32 pairs."""
        return cu[2 * n + end] if transition else index_at(cu, n + end, cu64)

    def load_q(tiles, q_map, s, c, hq, tok0, full):
        if with_q:
            tma.load(tiles.ptr_to([lay.q_box(s, c) // 4]), q_map, [c * 64, hq, tok0], full.ptr_to([s]))

    def init_identity(s_acc, rslot, cw, warp, lane, j, r, e):
        """Transition kernel: a run whose read slot is IDENTITY_SLOT starts from the identity (and V taken as 0)."""
        if transition:
            row = cw * lay.V_PER_CONSUMER + wgmma.acc_row(warp, lane, r)
            with T.If(T.And(rslot == IDENTITY_SLOT, row == wgmma.acc_col(lane, j, e))):
                with T.Then():
                    T.buffer_store(s_acc, T.float32(1), [j * 4 + r * 2 + e])

    def encode_qkv(q_map, k_map, v_map, Q, K, V, Hq, Hk, Hv, total):  # noqa: N803
        """Host: the 3-D maps (D, heads, tokens) of Q, K, V, boxes of 64 columns x 1 head x 64 tokens."""
        for m, X, heads in ((q_map, Q, Hq), (k_map, K, Hk), (v_map, V, Hv)):
            tma.encode(m, X.data, [lay.DIM, heads, total], [lay.DIM, heads * lay.DIM], [64, 1, lay.CHUNK], io)

    def state_offset(slot, h, Hs, cw, warp, lane, j, r):  # noqa: N803
        v = cw * lay.V_PER_CONSUMER + wgmma.acc_row(warp, lane, r)
        return ((i64(slot) * Hs + h) * lay.DIM + v) * lay.DIM + wgmma.acc_col(lane, j)

    @T.macro
    def body(Q, K, V, G, B, CU, OUT, H0, HT, SIDX, OIDX, CKOFF, ck_map, q_map, k_map, v_map, n_seqs, flags, scale,  # noqa: N803
             ck_every, total, Hq, Hk, Hv, n_o):
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        h, n = T.cta_id([T.max(Hq, Hv), n_seqs])
        Hs = T.max(Hq, Hv)  # the checkpoint recompute passes k as q: max(Hk, Hv)
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
        bos = T.min(T.max(bound(CU, n, 0, cu64), 0), total)
        eos = T.min(T.max(bound(CU, n, 1, cu64), bos), total)
        n_chunks = (eos - bos + lay.CHUNK - 1) // lay.CHUNK
        # Compile-time branches (a Python if opens no scope) keep each variant's code as it was written for it.
        if not ckpt:
            hq = h // (Hs // Hq)
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
                            load_q(tiles, q_map, s, c, h // (Hs // Hq) if ckpt else hq, tok0, qkv_full)
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
                              s, L, scale, warp, lane, ct, io, INV_DTYPE, with_p=with_q)
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
            Ow = T.decl_buffer((n_o // 2,), "uint32", data=OUT.data)
            # The state's rows: pool rows through the index arrays (FlashInfer), or row n (cuDNN) with the
            # checkpoint rows of the sequence. (``x if ckpt else y`` reads only the variant's own names.)
            if ckpt:
                has_ck = flag(flags, lay.HAS_CKPT)
                ck0 = T.if_then_else(has_ck, CKOFF[T.if_then_else(has_ck, n, 0)], 0)
            else:
                rslot = T.if_then_else(flag(flags, lay.HAS_SIDX), index_at(SIDX, n, flag(flags, lay.SIDX64)), n)
                wslot = T.if_then_else(flag(flags, lay.HAS_OIDX), index_at(OIDX, n, flag(flags, lay.OIDX64)), rslot)
                load_init = T.And(flag(flags, lay.HAS_INIT), rslot >= 0)
            for j in T.unroll(16):
                for r in T.unroll(2):
                    for e in T.unroll(2):
                        s_acc[j * 4 + r * 2 + e] = T.float32(0)
                        if flag(flags, lay.HAS_INIT) if ckpt else load_init:
                            s_acc[j * 4 + r * 2 + e] = H0[state_offset(n if ckpt else rslot, h, Hs, cw, warp, lane, j,
                                                                       r) + e]
                        init_identity(s_acc, n if ckpt else rslot, cw, warp, lane, j, r, e)
            for it in range(n_chunks):
                s = qkv_ring.stage(it)
                L = T.min(eos - bos - it * lay.CHUNK, lay.CHUNK)
                if ckpt:
                    ck_row = T.if_then_else(T.And(has_ck, it % ck_every == 0), ck0 + it // ck_every, -1)
                qkv_ring.consumer_wait(qkv_full, it)
                consumer_chunk(SimpleNamespace(tiles=tiles, vec=vec, s_acc=s_acc, t_acc=t_acc, packed=packed, gam=gam,
                                               kdesc=kd0, mdesc=md0, aux_full=aux_full, aux_empty=aux_empty,
                                               qkv_empty=qkv_empty, ph=aux_ring.phase(it), ow=Ow, ck_map=ck_map,
                                               zero_v=(n if ckpt else rslot) == IDENTITY_SLOT),
                               s, L, bos + it * lay.CHUNK, h, Hs, scale, cw, warp, lane, ck_row if ckpt else None)
            if flag(flags, lay.HAS_FINAL) if ckpt else T.And(flag(flags, lay.HAS_FINAL), wslot >= 0):
                for j in T.unroll(16):
                    for r in T.unroll(2):
                        for e in T.unroll(2):
                            HT[state_offset(n if ckpt else wslot, h, Hs, cw, warp, lane, j, r) + e] = (
                                s_acc[j * 4 + r * 2 + e])

    if not ckpt:
        @T.prim_func
        def gdn_prefill(q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, g_ptr: T.handle, beta_ptr: T.handle,
                        cu_ptr: T.handle, o_ptr: T.handle, h0_ptr: T.handle, ht_ptr: T.handle, sidx_ptr: T.handle,
                        oidx_ptr: T.handle, n_seqs: T.int32, flags: T.int32, scale: T.float32):
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
            n_sidx = T.int32()
            n_oidx = T.int32()
            Q = T.match_buffer(q_ptr, (total, Hq, lay.DIM), io, align=16)
            K = T.match_buffer(k_ptr, (total, Hk, lay.DIM), io, align=16)
            V = T.match_buffer(v_ptr, (total, Hv, lay.DIM), io, align=16)
            G = T.match_buffer(g_ptr, (n_g,), "float32", align=4)
            B = T.match_buffer(beta_ptr, (n_beta,), "float32", align=4)
            CU = T.match_buffer(cu_ptr, (n_cu,), "int32", align=4)
            OUT = T.match_buffer(o_ptr, (n_o,), io, align=16)
            H0 = T.match_buffer(h0_ptr, (n_h0,), "float32", align=16)
            HT = T.match_buffer(ht_ptr, (n_ht,), "float32", align=16)
            SIDX = T.match_buffer(sidx_ptr, (n_sidx,), "int32", align=4)
            OIDX = T.match_buffer(oidx_ptr, (n_oidx,), "int32", align=4)
            q_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
            k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
            v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
            encode_qkv(q_map, k_map, v_map, Q, K, V, Hq, Hk, Hv, total)
            body(Q, K, V, G, B, CU, OUT, H0, HT, SIDX, OIDX, None, None, q_map, k_map, v_map, n_seqs, flags, scale,
                 None, total, Hq, Hk, Hv, n_o)

        return gdn_prefill

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
        q_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        encode_qkv(q_map, k_map, v_map, Q, K, V, Hq, Hk, Hv, total)
        # Checkpoints [count, H, V, K] as (K, V, count x H) rows; a call without them passes a small dummy (one
        # row declared, never stored to).
        ck_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(ck_map, CK.data, [lay.DIM, lay.DIM, T.max(T.Cast("int32", n_ck // (lay.DIM * lay.DIM)), 1)],
                   [lay.DIM, lay.DIM * lay.DIM], [64, 64, 1], io)
        body(Q, K, V, G, B, CU, OUT, H0, HT, None, None, CKOFF, ck_map, q_map, k_map, v_map, n_seqs, flags, scale,
             ck_every, total, Hq, Hk, Hv, n_o)

    return gdn_fwd
