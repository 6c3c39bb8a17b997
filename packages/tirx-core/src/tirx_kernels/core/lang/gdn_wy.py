# SPDX-License-Identifier: Apache-2.0
"""The aux warpgroup's chunk-local work (traced into ``gdn_chunk.py``'s prim_func): everything of a chunk that does
not depend on the state, one chunk ahead of the consumers.

For chunk tokens i, j < L (the chunk's valid length), G the in-chunk cumulative log2 decay, beta the update gates:

    A[i, j] = beta_i (k_i . k_j) 2^(G_i - G_j)              j < i       (KK^T on wgmma, masked in the fragment)
    P[i, j] = scale (q_i . k_j) 2^(G_i - G_j)               j <= i      (QK^T, written as the consumers' A operand)
    T beta  = (I + A)^-1 diag(beta)                                     (the UT transform, below)
    K_d[i]  = 2^(G_{L-1} - G_i) k_i                                     (the state update's decayed keys)

and zero for rows / columns at or past L (so padded tokens carry no update: their Delta rows come out 0).

The inverse of the unit lower-triangular I + A, in fp16 (FlashInfer's sm90 kernel inverts in fp16 too): the four
16 x 16 diagonal blocks are inverted in fp32 by forward substitution, one warp each (its fragment rows are exactly
its block's rows), giving the block-diagonal D = (I + A_diag)^-1. With A_off the part below the diagonal blocks,
I + A = (I + A_diag)(I + N) for N = D A_off, which is nilpotent (N^4 = 0, four block rows), so

    (I + A)^-1 = (I - N)(I + N^2) D

four 64 x 64 x 64 wgmmas, each with its A operand straight from the previous accumulator (RS) and its B operand a
row-major fp16 tile (MN-major). Scratch: the chunk's T-beta box holds D, the K_d boxes hold A_off / N^2 (X1) and
N (X2, whose rows 16 w .. 16 w + 15 -- 2 KB -- first serve warp w as fp32 scratch for its diagonal block).
"""

from __future__ import annotations

from tvm.script import tirx as T

from tirx_kernels.core.lang import gdn_layout as lay
from tirx_kernels.core.lang import tma, vector, wgmma


def _cvt(dtype: str):
    return {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]


def pack_store(tiles, w, lo, hi, dtype: str, packed):
    """``tiles[w] <- (lo, hi)`` rounded to ``dtype`` (lo in the low half)."""
    T.evaluate(_cvt(dtype)(packed[0], hi, lo))
    T.buffer_store(tiles, packed[0], [w])


def store_frag(tiles, box, acc, n: int, warp, lane, dtype: str, packed, value=None):
    """The m64nN fragment ``acc`` (or ``value(j, r, e, acc_value)``) into the 16-bit row-major SW128 box(es) from
    byte ``box`` (column c goes to box c // 64)."""
    for j, r in lay.frag_pairs(n):
        row = wgmma.acc_row(warp, lane, r)
        col = wgmma.acc_col(lane, j)
        vals = [acc[wgmma.acc_index(j, r, e)] for e in range(2)]
        if value is not None:
            vals = [value(j, r, e, vals[e]) for e in range(2)]
        pack_store(tiles, lay.word(box + (8 * j // 64) * lay.BOX, row, col % 64, dtype), vals[0], vals[1], dtype,
                   packed)


def rs_frag(afrag, acc, dtype: str):
    """The m64n64 fragment ``acc`` as the RS A operand of the next m64n64k16 x 4: 16 packed registers."""
    for kk in range(4):
        for i in range(4):
            T.evaluate(_cvt(dtype)(afrag[kk * 4 + i], acc[wgmma.acc_as_rs_a(kk, i, 1)],
                                   acc[wgmma.acc_as_rs_a(kk, i, 0)]))


def aux_chunk(b, s, L, scale, warp, lane, ct, io: str, inv: str, with_p: bool = True):  # noqa: N803
    """Chunk work of the aux warpgroup on ring stage ``s`` (Q/K/V and the WY outputs), valid length ``L``. ``b``
    holds the kernel's buffers and locals (``tiles``, ``tf``, ``vec``, ``acc1``, ``acc2``, ``afrag``, ``xs``,
    ``packed``, ``vw``, ``kdesc``, ``mdesc``). ``with_p=False``: no P (and no Q read), for a kernel without output."""
    tiles, tf, vec = b.tiles, b.tf, b.vec
    acc1, acc2, afrag, xs, packed = b.acc1, b.acc2, b.afrag, b.xs, b.packed
    x1, x2 = lay.kd_box(s, 0), lay.kd_box(s, 1)
    scratch = (x2 + warp * 2048) // 4  # fp32 words: this warp's diagonal block of A, then of D (16 x 16 each)

    def kdesc(byte):
        return wgmma.desc_advance(b.kdesc[0], byte)

    def mdesc(byte):
        return wgmma.desc_advance(b.mdesc[0], byte)

    def sync():
        tma.fence_proxy_async()
        T.evaluate(T.cuda.warpgroup_sync(lay.AUX_BAR))

    def inv_gemm(acc, bbox, scale_first):
        """acc (+)= afrag (RS, 4 k16 steps) x the fp16 row-major box at ``bbox``."""
        wgmma.fence()
        for kk in range(4):
            wgmma.mma(64, acc, [afrag[kk * 4 + i] for i in range(4)], mdesc(bbox + kk * lay.MN_KSTEP), inv,
                      scale_d=scale_first or kk > 0, b_major=wgmma.MN_MAJOR)
        wgmma.commit()
        wgmma.wait(0)

    # KK^T and QK^T (both operands K-major: the K box rows are the N index).
    wgmma.fence()
    for kk in range(8):
        wgmma.mma(64, acc1, kdesc(lay.kmajor_step(lay.k_box(s, 0), kk)),
                  kdesc(lay.kmajor_step(lay.k_box(s, 0), kk)), io, scale_d=kk > 0)
    for kk in range(8 if with_p else 0):
        wgmma.mma(64, acc2, kdesc(lay.kmajor_step(lay.q_box(s, 0), kk)),
                  kdesc(lay.kmajor_step(lay.k_box(s, 0), kk)), io, scale_d=kk > 0)
    wgmma.commit()
    wgmma.wait(0)

    # A (in acc1, masked and decayed) and P (written to its box).
    for j, r in lay.frag_pairs(64):
        row = wgmma.acc_row(warp, lane, r)
        g_row = vec[lay.vec_g(s, row)]
        b_row = vec[lay.vec_beta(s, row)]
        pv = []
        for e in range(2):
            col = wgmma.acc_col(lane, j, e)
            idx = wgmma.acc_index(j, r, e)
            dec = T.exp2(g_row - vec[lay.vec_g(s, col)])
            live = row < L
            pv.append(T.Select(T.And(live, col <= row), scale * dec * acc2[idx], T.float32(0)))
            T.buffer_store(acc1, T.Select(T.And(live, col < row), b_row * dec * acc1[idx], T.float32(0)), [idx])
        if with_p:
            pack_store(tiles, lay.word(lay.p_box(s), row, wgmma.acc_col(lane, j), io), pv[0], pv[1], io, packed)

    # Diagonal block of warp w (columns 16 w .. 16 w + 15 = column blocks 2 w, 2 w + 1) to fp32 scratch.
    for j, r in lay.frag_pairs(64):
        for e in range(2):
            lr = lane // 4 + 8 * r
            lc = 8 * (j % 2) + 2 * (lane % 4) + e
            with T.If(j // 2 == warp):
                with T.Then():
                    T.buffer_store(tf, acc1[wgmma.acc_index(j, r, e)], [scratch + lr * 16 + lc])
    T.evaluate(T.cuda.warp_sync())
    # Forward substitution, one column per lane: x_i = [i == c] - sum_{m < i} A[i, m] x_m.
    with T.If(lane < 16):
        with T.Then():
            for i in range(16):
                acc = T.Select(lane == i, T.float32(1), T.float32(0))
                for m in range(i):
                    acc = acc - tf[scratch + i * 16 + m] * xs[m]
                T.buffer_store(xs, acc, [i])
            for i in range(16):
                T.buffer_store(tf, xs[i], [scratch + 256 + i * 16 + lane])
    T.evaluate(T.cuda.warp_sync())

    def d_value(lr, lc):
        return tf[scratch + 256 + lr * 16 + lc]

    # D as RS A (nonzero only in k16 step ``warp``) and as the row-major box (B of the last product).
    for kk in range(4):
        for i in range(4):
            lr = lane // 4 + 8 * (i % 2)
            lc = 8 * (i // 2) + 2 * (lane % 4)
            T.evaluate(_cvt(inv)(packed[0], d_value(lr, lc + 1), d_value(lr, lc)))
            T.buffer_store(afrag, T.Select(warp == kk, packed[0], T.uint32(0)), [kk * 4 + i])
    store_frag(tiles, lay.tb_box(s), acc1, 64, warp, lane, inv, packed,
               value=lambda j, r, e, a: T.Select(j // 2 == warp,
                                                 d_value(lane // 4 + 8 * r, 8 * (j % 2) + 2 * (lane % 4) + e),
                                                 T.float32(0)))
    # A_off: A without the diagonal blocks.
    store_frag(tiles, x1, acc1, 64, warp, lane, inv, packed,
               value=lambda j, r, e, a: T.Select(j // 2 == warp, T.float32(0), a))
    sync()
    inv_gemm(acc1, x1, False)  # N = D A_off
    store_frag(tiles, x2, acc1, 64, warp, lane, inv, packed)  # over this warp's own scratch rows only
    rs_frag(afrag, acc1, inv)
    sync()
    inv_gemm(acc2, x2, False)  # N^2
    store_frag(tiles, x1, acc2, 64, warp, lane, inv, packed)
    for j, r in lay.frag_pairs(64):
        for e in range(2):
            idx = wgmma.acc_index(j, r, e)
            eye = T.Select(wgmma.acc_row(warp, lane, r) == wgmma.acc_col(lane, j, e), T.float32(1), T.float32(0))
            T.buffer_store(acc1, eye - acc1[idx], [idx])  # U = I - N
    rs_frag(afrag, acc1, inv)
    sync()
    inv_gemm(acc1, x1, True)  # M = U + U N^2
    rs_frag(afrag, acc1, inv)
    inv_gemm(acc2, lay.tb_box(s), False)  # T = M D
    # T beta (columns scaled by beta_j) over D's box: the consumers' A operand of Delta = T beta Y.
    store_frag(tiles, lay.tb_box(s), acc2, 64, warp, lane, io, packed,
               value=lambda j, r, e, a: a * vec[lay.vec_beta(s, wgmma.acc_col(lane, j, e))])

    # K_d = 2^(G_{L-1} - G_t) K, zero past L: the K boxes copied 16 bytes at a time (same swizzle, same rows).
    g_last = vec[lay.vec_g(s, L - 1)]
    for i in range(2 * lay.BOX // 16 // 128):
        q = ct + 128 * i
        bx = q // (lay.BOX // 16)
        row = (q % (lay.BOX // 16)) // 8
        off = bx * lay.BOX + (q % (lay.BOX // 16)) * 16
        f = T.exp2(g_last - vec[lay.vec_g(s, row)])
        live = row < L  # a select, not a zero factor: rows past the sequence may be NaN padding
        vector.load_shared_v4(b.vw, 0, tiles.ptr_to([(lay.k_box(s, 0) + off) // 4]))
        for w in range(4):
            lo, hi = vector.unpack2(b.vw[w], io)
            vector.pack2(b.vw, w, T.Select(live, lo * f, T.float32(0)), T.Select(live, hi * f, T.float32(0)), io)
        vector.store_shared_v4(tiles.ptr_to([(lay.kd_box(s, 0) + off) // 4]), b.vw, 0)
    sync()

