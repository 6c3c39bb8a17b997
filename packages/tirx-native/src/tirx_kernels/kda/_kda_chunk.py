# SPDX-License-Identifier: Apache-2.0
# The chunk-local algebra follows fla's chunk_kda (fla-org/flash-linear-attention, fla/ops/kda, commit 9c8e42e7:
# gated operands relative to a sub-chunk reference, the UT transform of I + A); read for semantics, written anew.
"""The chunk-local pass of the KDA forward (``kda_forward_portfolio_multishape``, kernel ``chunk``): everything of a
64-token chunk that does not depend on the recurrent state, one CTA (one warpgroup) per (chunk, head), all chunks of
all sequences at once.

Per chunk (tokens i, j < L, the chunk's valid length), with q', k' the L2-normalised rows, beta = sigmoid(beta_raw),
the safe gate g = lower_bound sigmoid(exp(A_log) (g_raw + dt_bias)) and G its in-chunk inclusive cumulative sum per
key channel (kept in log2 units)::

    A[i, j]  = beta_i sum_c k'_ic k'_jc 2^(G_ic - G_jc)           j < i
    P[i, j]  = scale sum_c q'_ic k'_jc 2^(G_ic - G_jc)             j <= i     -> ``pm``   [T, H, 64] bf16
    T beta   = (I + A)^-1 diag(beta)                                          -> ``tb``   [T, H, 64] bf16
    Q_g      = scale q' o 2^G,  K_g = k' o 2^G,  K_d = k' o 2^(G_last - G)    -> [T, H, 128] bf16
    gamma    = 2^G_last                                                       -> ``gam``  [chunks, H, 128] fp32

(rows at or past L zero). A and P are per-channel-decayed products, so they cannot be one GEMM of gated operands
relative to the chunk start (2^(G_0 - G_j) reaches 2^462 at the lower bound -5 over 64 tokens). They are computed
as four column strips of 16 keys on wgmma (m64n16k16): strip b gates both operands relative to r = G at token 16 b,
the row side by 2^min(G_i - r, 0) <= 1 (rows i < 16 b are masked anyway) and the key side by 2^(r - G_j) <= 2^108
(15 tokens of at most -5 in natural log): in range for bf16. The inverse of the unit lower-triangular I + A is a
forward substitution in fp32, one column per thread (64 threads; 2016 FMAs each).

``build_chunk_kernel("gdn2")`` is the same pass for GDN-2 (cuDNN's ``gdn2_prefill_f16``: per-key-channel erase gate
b instead of the scalar beta): q and k come normalised and mapped to the state heads, the gate as its fp32 natural
log (the safe gate applied), and b [T, H, 128] (post-sigmoid) multiplies the row side of A and K_g::

    A[i, j]  = sum_c b_ic k_ic k_jc 2^(G_ic - G_jc)     T = (I + A)^-1     K_g = b o k o 2^G

(b o k rounded to bf16 once, in shared memory, as the strips' operands are). The write gate is the caller's
(V_in = w o v, elementwise).

Launch: grid (chunk slots, H), 128 threads. The chunk table (``tok0``, ``clen`` per slot) is built on the device by
the op; a slot of length 0 does nothing, a negative length -L zero-fills its L rows (the tokens after the last
sequence, so the scan never reads uninitialised rows).
"""

from __future__ import annotations

DIM = 128
CHUNK = 64
THREADS = 128
LOG2E = 1.4426950408889634
L2_EPS = 1e-6
STRIP = 16
BOX = CHUNK * 64 * 2  # a 64-row x 64-column 16-bit SW128 box
RBOX = STRIP * 64 * 2  # a 16-row box (the key side of a strip)

# Shared memory (bytes). qn / kn: normalised rows, bf16 row-major [64][128]; gcs fp32 [64][128] (log2 units);
# the strip operands (LA, LQ: 2 boxes each, RB: 2 16-row boxes); after the strips the LA/LQ region holds A (fp32
# [64][64]) and then X = (I + A)^-1 (fp32 [64][64]).
OFF_LA = 0
OFF_LQ = 2 * BOX
OFF_RB = 4 * BOX
OFF_A = 0
OFF_X = CHUNK * CHUNK * 4
OFF_QN = OFF_RB + 2 * RBOX
OFF_KN = OFF_QN + CHUNK * DIM * 2
OFF_G = OFF_KN + CHUNK * DIM * 2
OFF_BETA = OFF_G + CHUNK * DIM * 4
SMEM_BYTES = OFF_BETA + CHUNK * 4
OFF_KB = SMEM_BYTES  # GDN-2: b o k, bf16 row-major [64][128]
SMEM_BYTES_GDN2 = OFF_KB + CHUNK * DIM * 2
VARIANTS = ("kda", "gdn2")


def build_chunk_kernel(variant: str = "kda"):
    if variant not in VARIANTS:
        raise ValueError(f"kda chunk kernel: variant {variant!r} is one of {VARIANTS}")
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import reduce, tma, vector, wgmma

    io = "bfloat16"

    def i64(x):
        return T.Cast("int64", x)

    def sw_word(box, row, col):
        """Word (uint32) index of the bf16 pair at (row, even col < 64) of the SW128 box at byte ``box``."""
        return (box + 2 * tma.sw128_offset(row, col, io)) // 4

    def sync():
        T.evaluate(T.cuda.cta_sync())

    def kstep(box0, kk, box_bytes):
        """Byte offset of k16 step ``kk`` of a K-major operand whose 128 columns span two boxes from ``box0``."""
        return box0 + (kk // 4) * box_bytes + (kk % 4) * 32

    row_src = OFF_KB if variant == "gdn2" else OFF_KN  # A's row side: b o k (GDN-2) or k

    def strip_operands(w, sm, sf, b, packed):
        """Strip ``b``'s gated operands (see the module docstring), 128 threads: LA / LQ rows all 64 tokens, RB the
        16 keys of the strip."""
        for it in range(CHUNK * 64 // THREADS):
            idx = w + THREADS * it
            row = idx // 64
            cw = idx % 64
            col = 2 * cw
            fs = []
            for e in range(2):
                ref = sf[(OFF_G // 4) + (STRIP * b) * DIM + col + e]
                fs.append(T.exp2(T.min(sf[(OFF_G // 4) + row * DIM + col + e] - ref, T.float32(0))))
            box = (col // 64) * BOX
            for src, dst in ((row_src, OFF_LA), (OFF_QN, OFF_LQ)):
                lo, hi = vector.unpack2(sm[src // 4 + row * 64 + cw], io)
                vector.pack2(packed, 0, lo * fs[0], hi * fs[1], io)
                T.buffer_store(sm, packed[0], [sw_word(dst + box, row, col % 64)])
        for it in range(STRIP * 64 // THREADS):
            idx = w + THREADS * it
            row = idx // 64
            cw = idx % 64
            col = 2 * cw
            tok = STRIP * b + row
            fs = []
            for e in range(2):
                ref = sf[(OFF_G // 4) + (STRIP * b) * DIM + col + e]
                fs.append(T.exp2(ref - sf[(OFF_G // 4) + tok * DIM + col + e]))
            lo, hi = vector.unpack2(sm[OFF_KN // 4 + tok * 64 + cw], io)
            vector.pack2(packed, 0, lo * fs[0], hi * fs[1], io)
            T.buffer_store(sm, packed[0], [sw_word(OFF_RB + (col // 64) * RBOX, row, col % 64)])

    def forward_substitution(sf, xs, j):
        """Column ``j`` of X = (I + A)^-1 (A strictly lower, fp32 at OFF_A): x_i = [i == j] - sum_m<i A[i, m] x_m."""
        for i in range(CHUNK):
            acc = T.Select(j == i, T.float32(1), T.float32(0))
            for m in range(i):
                acc = acc - sf[OFF_A // 4 + i * CHUNK + m] * xs[m]
            T.buffer_store(xs, acc, [i])
        for i in range(CHUNK):  # T beta = X diag(beta): column j scaled by beta_j
            T.buffer_store(sf, xs[i] * sf[OFF_BETA // 4 + j], [OFF_X // 4 + i * CHUNK + j])

    def bf16_value(x16):
        """The fp32 value of a bf16 read as int16 (bf16 is the top half of an fp32)."""
        return T.cuda.uint_as_float(T.Cast("uint32", T.Cast("uint16", x16)) << T.uint32(16))

    def when(cond):
        """A traced helper's conditional (a Python ``if`` on a TIR value would be dropped)."""
        return T.If(cond)

    def gate_and_beta(G, B, ALOG, BIAS, GAM, sf, tok0, L, cid, h, tid, lower_bound, gl):
        """Thread c owns key channel c: G_t = sum_{s <= t} g_s in log2 units (flat past L); beta = sigmoid, 0 past
        L; gamma = 2^G_last."""
        a = T.exp(ALOG[h])
        bias = BIAS[h, tid]
        T.buffer_store(gl, T.float32(0), [0])
        for t in range(CHUNK):
            with when(t < L):
                with T.Then():
                    x = bf16_value(G[tok0 + t, h, tid]) + bias
                    T.buffer_store(gl, gl[0] + lower_bound * T.float32(LOG2E) / (T.float32(1) + T.exp(-(a * x))),
                                   [0])
            T.buffer_store(sf, gl[0], [OFF_G // 4 + t * DIM + tid])
        T.buffer_store(GAM, T.exp2(gl[0]), [cid, h, tid])
        with when(tid < CHUNK):
            with T.Then():
                braw = bf16_value(B[tok0 + T.min(tid, T.max(L - 1, 0)), h])
                T.buffer_store(sf, T.Select(tid < L, T.float32(1) / (T.float32(1) + T.exp(-braw)), T.float32(0)),
                               [OFF_BETA // 4 + tid])

    def log_gate_rows(G, GAM, sf, tok0, L, cid, h, tid, gl):
        """GDN-2: thread c owns key channel c: G_t = log2(e) sum_{s <= t} g_s of the fp32 natural-log gate (flat
        past L); gamma = 2^G_last; the beta slots 1 (rows < L) so A and T carry no scalar gate."""
        T.buffer_store(gl, T.float32(0), [0])
        for t in range(CHUNK):
            with when(t < L):
                with T.Then():
                    T.buffer_store(gl, gl[0] + G[tok0 + t, h, tid] * T.float32(LOG2E), [0])
            T.buffer_store(sf, gl[0], [OFF_G // 4 + t * DIM + tid])
        T.buffer_store(GAM, T.exp2(gl[0]), [cid, h, tid])
        with when(tid < CHUNK):
            with T.Then():
                T.buffer_store(sf, T.Select(tid < L, T.float32(1), T.float32(0)), [OFF_BETA // 4 + tid])

    def erase_gated_keys(Bg, sm, tok0, L, h, tid, packed):
        """GDN-2: b o k rows (zero past L) at OFF_KB, a thread a word; k is already at OFF_KN."""
        for it in range(CHUNK * DIM // 2 // THREADS):
            idx = tid + THREADS * it
            row = idx // (DIM // 2)
            cw = idx % (DIM // 2)
            T.buffer_store(packed, T.uint32(0), [0])
            with when(row < L):
                with T.Then():
                    b0, b1 = vector.unpack2(Bg[tok0 + row, h, cw], io)
                    k0, k1 = vector.unpack2(sm[OFF_KN // 4 + row * 64 + cw], io)
                    vector.pack2(packed, 0, b0 * k0, b1 * k1, io)
            T.buffer_store(sm, packed[0], [OFF_KB // 4 + row * 64 + cw])

    def l2norm_rows(Q, K, sm, tok0, L, h, warp, lane, wv, packed, normalize=True):
        """q / k L2 norm (``normalize``; else a copy): warp w owns tokens 16 w .. 16 w + 15, a lane 4 channels (2
        words) of a row; rows past L are zero."""
        for t16 in range(16):
            t = warp * 16 + t16
            for src, dst in ((Q, OFF_QN), (K, OFF_KN)):
                for i in range(2):
                    T.buffer_store(wv, T.uint32(0), [i])
                with when(t < L):
                    with T.Then():
                        for i in range(2):
                            T.buffer_store(wv, src[tok0 + t, h, 2 * lane + i], [i])
                base = dst // 4 + t * 64 + 2 * lane
                if not normalize:
                    for i in range(2):
                        T.buffer_store(sm, wv[i], [base + i])
                    continue
                a0, a1 = vector.unpack2(wv[0], io)
                b0, b1 = vector.unpack2(wv[1], io)
                ss = reduce.warp_sum(a0 * a0 + a1 * a1 + b0 * b0 + b1 * b1)
                rs = T.rsqrt(ss + T.float32(L2_EPS))
                vector.pack2(packed, 0, a0 * rs, a1 * rs, io)
                T.buffer_store(sm, packed[0], [base])
                vector.pack2(packed, 0, b0 * rs, b1 * rs, io)
                T.buffer_store(sm, packed[0], [base + 1])

    def strips(sm, sf, tid, desc, acc1, acc2, packed):
        """A's and P's raw products (before masks and beta / scale) in four strips of 16 keys (m64n16k16 x 8)."""
        for b in range(4):
            strip_operands(tid, sm, sf, b, packed)
            tma.fence_proxy_async()
            sync()
            wgmma.fence()
            for acc, a_off in ((acc1, OFF_LA), (acc2, OFF_LQ)):
                for kk in range(8):
                    wgmma.mma(16, acc, wgmma.desc_advance(desc[0], kstep(a_off, kk, BOX)),
                              wgmma.desc_advance(desc[0], kstep(OFF_RB, kk, RBOX)), io, scale_d=kk > 0,
                              acc_offset=8 * b)
            wgmma.commit()
            wgmma.wait(0)
            sync()

    def emit_a_p(PM, sf, acc1, acc2, tok0, L, h, warp, lane, scale, packed):
        """A (masked, beta-scaled) to smem fp32; P (masked, scaled) straight to global rows < L."""
        for j in range(8):
            for r in range(2):
                row = wgmma.acc_row(warp, lane, r)
                col = wgmma.acc_col(lane, j)
                live = row < L
                pv = []
                for e in range(2):
                    T.buffer_store(sf, T.Select(T.And(live, col + e < row),
                                                sf[OFF_BETA // 4 + row] * acc1[wgmma.acc_index(j, r, e)],
                                                T.float32(0)), [OFF_A // 4 + row * CHUNK + col + e])
                    pv.append(T.Select(T.And(live, col + e <= row), scale * acc2[wgmma.acc_index(j, r, e)],
                                       T.float32(0)))
                vector.pack2(packed, 0, pv[0], pv[1], io)
                with when(live):
                    with T.Then():
                        T.buffer_store(PM, packed[0], [tok0 + row, h, col // 2])

    def tbeta_rows(TB, sf, tok0, L, h, tid, packed):
        for it in range(CHUNK * CHUNK // 2 // THREADS):
            idx = tid + THREADS * it
            row = idx // (CHUNK // 2)
            cw = idx % (CHUNK // 2)
            with when(row < L):
                with T.Then():
                    vector.pack2(packed, 0, sf[OFF_X // 4 + row * CHUNK + 2 * cw],
                                 sf[OFF_X // 4 + row * CHUNK + 2 * cw + 1], io)
                    T.buffer_store(TB, packed[0], [tok0 + row, h, cw])

    def gated_rows(QG, KG, KD, sm, sf, tok0, L, h, tid, scale, packed):
        """Q_g, K_g, K_d rows < L (a thread a word, coalesced)."""
        for it in range(CHUNK * DIM // 2 // THREADS):
            idx = tid + THREADS * it
            row = idx // (DIM // 2)
            cw = idx % (DIM // 2)
            with when(row < L):
                with T.Then():
                    g0 = sf[OFF_G // 4 + row * DIM + 2 * cw]
                    g1 = sf[OFF_G // 4 + row * DIM + 2 * cw + 1]
                    e0, e1 = T.exp2(g0), T.exp2(g1)
                    d0 = T.exp2(sf[OFF_G // 4 + (L - 1) * DIM + 2 * cw] - g0)
                    d1 = T.exp2(sf[OFF_G // 4 + (L - 1) * DIM + 2 * cw + 1] - g1)
                    q0, q1 = vector.unpack2(sm[OFF_QN // 4 + row * 64 + cw], io)
                    k0, k1 = vector.unpack2(sm[OFF_KN // 4 + row * 64 + cw], io)
                    r0, r1 = (k0, k1) if row_src == OFF_KN else vector.unpack2(sm[row_src // 4 + row * 64 + cw], io)
                    for dst, lo, hi in ((QG, scale * q0 * e0, scale * q1 * e1), (KG, r0 * e0, r1 * e1),
                                        (KD, k0 * d0, k1 * d1)):
                        vector.pack2(packed, 0, lo, hi, io)
                        T.buffer_store(dst, packed[0], [tok0 + row, h, cw])

    @T.macro
    def chunk_body(Q, K, G, B, ALOG, BIAS, TOK0, CLEN, QG, KG, KD, PM, TB, GAM, slots, H, scale,  # noqa: N803
                   lower_bound):
        cid, h = T.cta_id([slots, H])
        tid = T.thread_id([THREADS])

        pool = T.SMEMPool()
        sm = pool.alloc(((SMEM_BYTES_GDN2 if variant == "gdn2" else SMEM_BYTES) // 4,), "uint32", align=1024)
        pool.commit()
        sf = T.decl_buffer(((SMEM_BYTES_GDN2 if variant == "gdn2" else SMEM_BYTES) // 4,), "float32", data=sm.data,
                           scope="shared.dyn")
        packed = T.alloc_local((1,), "uint32")
        wv = T.alloc_local((2,), "uint32")
        acc1 = T.alloc_local((32,), "float32")
        acc2 = T.alloc_local((32,), "float32")
        xs = T.alloc_local((CHUNK,), "float32")
        desc = T.alloc_local((1,), "uint64")
        gl = T.alloc_local((1,), "float32")

        warp = tid // 32
        lane = tid % 32
        tok0 = TOK0[cid]
        clen = CLEN[cid]
        L = T.max(clen, 0)
        if clen < 0:
            # Tokens after the last sequence: zero rows (the scan reads them as a chunk's padding).
            for it in range((-clen * (DIM // 2) + THREADS - 1) // THREADS):
                idx = tid + THREADS * it
                if idx < -clen * (DIM // 2):
                    r = idx // (DIM // 2)
                    c = idx % (DIM // 2)
                    QG[tok0 + r, h, c] = T.uint32(0)
                    KG[tok0 + r, h, c] = T.uint32(0)
                    KD[tok0 + r, h, c] = T.uint32(0)
                    if c < CHUNK // 2:
                        PM[tok0 + r, h, c] = T.uint32(0)
                        TB[tok0 + r, h, c] = T.uint32(0)
        if clen > 0:
            if variant == "gdn2":
                log_gate_rows(G, GAM, sf, tok0, L, cid, h, tid, gl)
                l2norm_rows(Q, K, sm, tok0, L, h, warp, lane, wv, packed, normalize=False)
                sync()
                erase_gated_keys(B, sm, tok0, L, h, tid, packed)
            else:
                gate_and_beta(G, B, ALOG, BIAS, GAM, sf, tok0, L, cid, h, tid, lower_bound, gl)
                l2norm_rows(Q, K, sm, tok0, L, h, warp, lane, wv, packed)
            sync()
            wgmma.encode_desc(desc.ptr_to([0]), sm.ptr_to([0]), 1, 64, wgmma.SWIZZLE_128B)
            strips(sm, sf, tid, desc, acc1, acc2, packed)
            emit_a_p(PM, sf, acc1, acc2, tok0, L, h, warp, lane, scale, packed)
            sync()
            if tid < CHUNK:
                forward_substitution(sf, xs, tid)
            sync()
            tbeta_rows(TB, sf, tok0, L, h, tid, packed)
            gated_rows(QG, KG, KD, sm, sf, tok0, L, h, tid, scale, packed)

    if variant == "gdn2":  # each prim_func is parsed where it is defined: the other variant's is not
        @T.prim_func
        def gdn2_chunk(q_ptr: T.handle, k_ptr: T.handle, g_ptr: T.handle, b_ptr: T.handle, tok0_ptr: T.handle,
                       clen_ptr: T.handle, qg_ptr: T.handle, kg_ptr: T.handle, kd_ptr: T.handle, pm_ptr: T.handle,
                       tb_ptr: T.handle, gam_ptr: T.handle, scale: T.float32):
            total = T.int32()
            H = T.int32()
            slots = T.int32()
            Qb = T.match_buffer(q_ptr, (total, H, DIM), io, align=16)
            Kb = T.match_buffer(k_ptr, (total, H, DIM), io, align=16)
            G = T.match_buffer(g_ptr, (total, H, DIM), "float32", align=16)
            Bb = T.match_buffer(b_ptr, (total, H, DIM), io, align=16)
            TOK0 = T.match_buffer(tok0_ptr, (slots,), "int32", align=4)
            CLEN = T.match_buffer(clen_ptr, (slots,), "int32", align=4)
            QGb = T.match_buffer(qg_ptr, (total, H, DIM), io, align=16)
            KGb = T.match_buffer(kg_ptr, (total, H, DIM), io, align=16)
            KDb = T.match_buffer(kd_ptr, (total, H, DIM), io, align=16)
            PMb = T.match_buffer(pm_ptr, (total, H, CHUNK), io, align=16)
            TBb = T.match_buffer(tb_ptr, (total, H, CHUNK), io, align=16)
            GAM = T.match_buffer(gam_ptr, (slots, H, DIM), "float32", align=16)
            T.device_entry()
            Q = T.decl_buffer((total, H, DIM // 2), "uint32", data=Qb.data)
            K = T.decl_buffer((total, H, DIM // 2), "uint32", data=Kb.data)
            B = T.decl_buffer((total, H, DIM // 2), "uint32", data=Bb.data)
            QG = T.decl_buffer((total, H, DIM // 2), "uint32", data=QGb.data)
            KG = T.decl_buffer((total, H, DIM // 2), "uint32", data=KGb.data)
            KD = T.decl_buffer((total, H, DIM // 2), "uint32", data=KDb.data)
            PM = T.decl_buffer((total, H, CHUNK // 2), "uint32", data=PMb.data)
            TB = T.decl_buffer((total, H, CHUNK // 2), "uint32", data=TBb.data)
            chunk_body(Q, K, G, B, None, None, TOK0, CLEN, QG, KG, KD, PM, TB, GAM, slots, H, scale, None)

        return gdn2_chunk

    @T.prim_func
    def kda_chunk(q_ptr: T.handle, k_ptr: T.handle, g_ptr: T.handle, beta_ptr: T.handle, alog_ptr: T.handle,
                  bias_ptr: T.handle, tok0_ptr: T.handle, clen_ptr: T.handle, qg_ptr: T.handle, kg_ptr: T.handle,
                  kd_ptr: T.handle, pm_ptr: T.handle, tb_ptr: T.handle, gam_ptr: T.handle, scale: T.float32,
                  lower_bound: T.float32):
        total = T.int32()
        H = T.int32()
        slots = T.int32()
        Qb = T.match_buffer(q_ptr, (total, H, DIM), io, align=16)
        Kb = T.match_buffer(k_ptr, (total, H, DIM), io, align=16)
        G = T.match_buffer(g_ptr, (total, H, DIM), "int16", align=16)
        B = T.match_buffer(beta_ptr, (total, H), "int16", align=2)
        ALOG = T.match_buffer(alog_ptr, (H,), "float32", align=4)
        BIAS = T.match_buffer(bias_ptr, (H, DIM), "float32", align=4)
        TOK0 = T.match_buffer(tok0_ptr, (slots,), "int32", align=4)
        CLEN = T.match_buffer(clen_ptr, (slots,), "int32", align=4)
        QGb = T.match_buffer(qg_ptr, (total, H, DIM), io, align=16)
        KGb = T.match_buffer(kg_ptr, (total, H, DIM), io, align=16)
        KDb = T.match_buffer(kd_ptr, (total, H, DIM), io, align=16)
        PMb = T.match_buffer(pm_ptr, (total, H, CHUNK), io, align=16)
        TBb = T.match_buffer(tb_ptr, (total, H, CHUNK), io, align=16)
        GAM = T.match_buffer(gam_ptr, (slots, H, DIM), "float32", align=16)
        T.device_entry()
        Q = T.decl_buffer((total, H, DIM // 2), "uint32", data=Qb.data)
        K = T.decl_buffer((total, H, DIM // 2), "uint32", data=Kb.data)
        QG = T.decl_buffer((total, H, DIM // 2), "uint32", data=QGb.data)
        KG = T.decl_buffer((total, H, DIM // 2), "uint32", data=KGb.data)
        KD = T.decl_buffer((total, H, DIM // 2), "uint32", data=KDb.data)
        PM = T.decl_buffer((total, H, CHUNK // 2), "uint32", data=PMb.data)
        TB = T.decl_buffer((total, H, CHUNK // 2), "uint32", data=TBb.data)
        chunk_body(Q, K, G, B, ALOG, BIAS, TOK0, CLEN, QG, KG, KD, PM, TB, GAM, slots, H, scale, lower_bound)

    return kda_chunk
