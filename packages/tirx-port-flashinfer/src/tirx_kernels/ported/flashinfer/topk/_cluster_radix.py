# SPDX-License-Identifier: Apache-2.0
# The TIRx function of fast_topk_clusters (FlashInfer's fast_topk_clusters_exact.cuh, release v0.7.4, commit
# 77039051b0be921788dc2784ec41423b558878ec), written anew: see fast_topk_clusters.py for the algorithm.
"""``build_kernel(dtype, cluster, slice_elems, threads, load_unroll, gather_elems, spread, copies)``: one cluster a
row, grid ``rows * cluster`` CTAs; arguments ``(x (M, N) strided, values (M, K), indices (M, K) int64, vec_ok)``.

Two knobs of the first (whole-slice) histogram, both off in the product schedule until measured:

- ``spread``: the first digit is not the key's top byte but a monotone 8-bit bin of its top 11 bits (sign, the 8
  exponent bits, 2 mantissa bits; exponents 2^-15 .. 2^17 get 4 bins each, those below / above share the end bins),
  as FlashInfer's filtered top-k bins an fp16 copy of the score. The top byte of an fp32 / bf16 key is the sign and 7
  exponent bits: on N(0, 1) rows ~68 % of the scores fall in two bins ([0.5, 2) and (-2, -0.5]), so every warp's
  shared atomics hit the same two words; the spread bins hold at most ~7 % each. The bin is not a prefix of the key,
  so the exact select then runs all key_bits / 8 digit passes over the candidates in the chosen bin (one cluster
  round more); fp16 keys (top byte: sign, 5 exponent and 2 mantissa bits: already spread) keep the prefix passes.
- ``copies``: the first histogram in that many sub-histograms (warp w counts into copy w % copies, copies padded
  by one word so a bin's copies sit in different banks), summed before the first cluster round: the warps of a CTA
  then contend for a hot bin ``copies`` times less.

On paper (H100, 64 x 131072 fp32, C = 8, two 512-thread CTAs an SM): 1x131072 ran 22.3 us and 64 rows (two waves)
70.6 us, so a CTA's 16384 scores take ~12-14 us that a second CTA on the SM does not hide: ~1.3 SM cycles a score,
where its loads (bulk copies) and ALU work are a few hundred ns; the hot-bin shared atomics are the suspect the two
knobs remove (tools/sweeps/topk_cluster_variants.py measures them).
"""

from __future__ import annotations

R = 256  # bins of an 8-bit digit
PIECES = 4  # bulk copies a slice loads in
SPREAD_LO = 112 * 4  # spread bins: (exponent, 2 mantissa bits) from exponent 112 (2^-15) get bins of their own


def build_kernel(dtype: str, C: int, cap: int, threads: int, U: int, E: int,  # noqa: N803
                 spread: bool = False, copies: int = 1):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import bulk, mbarrier
    from tirx_kernels.core.lang import cluster as cl

    from . import _radix as rx

    raw_t = rx.RAW[dtype]
    key_bits = rx.KEY_BITS[dtype]
    P = key_bits // 8  # noqa: N806
    vec = 4 if key_bits == 32 else 8  # scores a 16-byte vector holds
    shift0 = key_bits - 8
    elem = key_bits // 8
    warps = threads // 32
    tile = threads * E
    piece = cap // PIECES  # scores a bulk copy (and its mbarrier) brings
    assert threads >= R and piece % vec == 0 and cap <= 1 << 16  # candidate positions are uint16
    spread = spread and dtype != "float16"
    NP = P + 1 if spread else P  # noqa: N806  (digit passes: the spread bin, then every key byte)
    H = copies  # noqa: N806
    assert 1 <= H <= warps

    def first_digit(key):
        """The first pass's digit of a key, ascending with the key (the top byte, or the spread bin)."""
        if not spread:
            return key >> shift0
        v = T.Cast("int32", (key >> T.uint32(key_bits - 11)) & T.uint32(0x3FF))
        pos = T.uint32(128) + T.Cast("uint32", T.min(T.max(v - SPREAD_LO, 0), 127))
        neg = T.Cast("uint32", T.min(T.max(v - (1023 - SPREAD_LO - 127), 0), 127))
        return T.Select((key >> T.uint32(key_bits - 1)) != T.uint32(0), pos, neg)

    def pass_match(key, shift, prefix, cth):
        """Whether pass p >= 1 (``shift`` a run-time value) counts ``key``: its bits above ``shift + 8`` are the
        threshold's found so far (spread: and its bin is the threshold's). Spread pass 1 compares no key bits
        (shift + 8 = key_bits): shifted in two steps, never by the key width."""
        if not spread:
            return (key >> (shift + 8)) == (prefix >> (shift + 8))
        return T.And(first_digit(key) == cth,
                     ((key >> (shift + 7)) >> T.uint32(1)) == ((prefix >> (shift + 7)) >> T.uint32(1)))

    def count_first(hist, sub, warp, key):
        if H == 1:
            rx.count(hist, T.uint32(255) - first_digit(key))
        else:
            rx.count(sub, T.Cast("uint32", (warp % H) * (R + 1)) + T.uint32(255) - first_digit(key))

    def i64(v):
        return T.Cast("int64", v)

    @T.prim_func
    def fast_topk_clusters(x_ptr: T.handle, v_ptr: T.handle, i_ptr: T.handle, vec_ok: T.int32):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        x_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, N), dtype, strides=(x_stride, 1), align=2)
        V = T.match_buffer(v_ptr, (M, K), dtype, align=2)
        Ix = T.match_buffer(i_ptr, (M, K), "int64", align=8)
        T.device_entry()
        T.attr({"tirx.max_registers": 64})  # two 512-thread CTAs an SM
        # Raw-bit views, indexed row * stride + col: keys come from the bits, values are copied as bits.
        Xr = T.decl_buffer((M * x_stride,), raw_t, data=X.data)
        Vr = T.decl_buffer((M * K,), raw_t, data=V.data)
        If = T.decl_buffer((M * K,), "int64", data=Ix.data)
        cta = T.cta_id([M * C])
        rank = T.cta_id_in_cluster([C])
        tid = T.thread_id([threads])

        # Shared memory: the slice, two histograms (alternating passes), the cluster-summed one, the counts
        # peers read, scan and warp scratch.
        pool = T.SMEMPool()
        S = pool.alloc((cap,), raw_t, align=16)
        cand = pool.alloc((cap,), "uint16", align=16)  # slice positions of the candidates, ascending
        hist = pool.alloc((2 * R,), "uint32", align=16)
        tot = pool.alloc((R,), "uint32", align=16)
        counts = pool.alloc((4,), "uint32", align=16)
        state = pool.alloc((4,), "uint32", align=16)
        scan_tot = pool.alloc((rx.SCAN_WARPS,), "uint32", align=16)
        warp_a = pool.alloc((2 * warps,), "uint32", align=16)
        warp_b = pool.alloc((warps,), "uint32", align=16)
        bars = pool.alloc((PIECES,), "uint64", align=8)
        sub = pool.alloc((H * (R + 1) if H > 1 else 4,), "uint32", align=16)  # unused with one copy
        pool.commit()

        words = T.alloc_local((U,), "uint32")
        part = T.alloc_local((4 * C,), "float32")
        remote = T.alloc_local((1,), "uint32")
        acc = T.alloc_local((4,), "uint32")
        prefix = T.alloc_local((1,), "uint32")
        rem = T.alloc_local((1,), "uint32")
        run = T.alloc_local((2,), "uint32")
        ncand = T.alloc_local((1,), "int32")
        cth = T.alloc_local((1,), "uint32")  # the first digit of the threshold key
        tie = T.alloc_local((E,), "uint32")
        sel = T.alloc_local((E,), "uint32")
        ball = T.alloc_local((E,), "uint32")
        lane = tid % 32
        warp = tid // 32
        below = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)
        row = cta // C
        x_base = i64(row) * i64(x_stride)
        o_base = i64(row) * i64(K)
        chunk = ((N + C - 1) // C + (vec - 1)) // vec * vec
        lo = rank * chunk
        ln = T.max(T.min(T.min(chunk, cap), N - lo), 0)  # scores of this slice (the op keeps chunk <= cap)
        if tid < R:
            hist[tid] = T.uint32(0)
            hist[R + tid] = T.uint32(0)
        if H > 1:
            for it in T.serial((H * (R + 1) + threads - 1) // threads):
                if it * threads + tid < H * (R + 1):
                    sub[it * threads + tid] = T.uint32(0)
        if tid == 0:
            for q in range(PIECES):
                mbarrier.init(bars.ptr_to([q]), 1)
            mbarrier.fence_init()
        T.evaluate(T.cuda.cta_sync())

        # -- 1. The slice into shared memory, once; the first digit's histogram on the way.
        if vec_ok != 0:
            # Rows on 16 bytes: PIECES bulk copies (the whole slice in flight at once, no registers), each
            # histogrammed as soon as its mbarrier completes. The last piece ends on a whole vector (bytes past
            # the row stay in its 16-byte granule; they are never counted).
            if tid == 0:
                for q in range(PIECES):
                    a = q * piece
                    if a < ln:
                        nbytes = T.Cast("uint32", (T.min(a + piece, (ln + (vec - 1)) // vec * vec) - a) * elem)
                        T.evaluate(T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(bars.ptr_to([q]), nbytes))
                        bulk.load(S.ptr_to([a]), Xr.ptr_to([x_base + i64(lo + a)]), nbytes, bars.ptr_to([q]))
            for q in range(PIECES):
                a = q * piece
                if a < ln:
                    mbarrier.wait(bars.ptr_to([q]), 0)
                    for it in T.serial((T.min(piece, ln - a) + (threads - 1)) // threads):
                        j = a + it * threads + tid
                        if j < T.min(a + piece, ln):
                            count_first(hist, sub, warp, rx.key_of(S[j], dtype))
        else:
            for it in T.serial((ln + (threads * U - 1)) // (threads * U)):
                for u in T.unroll(U):
                    j = it * (threads * U) + u * threads + tid
                    if j < ln:
                        words[u] = T.Cast("uint32", Xr[x_base + i64(lo + j)])
                for u in T.unroll(U):
                    j = it * (threads * U) + u * threads + tid
                    if j < ln:
                        S[j] = T.Cast(raw_t, words[u])
                        count_first(hist, sub, warp, rx.key_of(words[u], dtype))

        if H > 1:
            # the copies into buffer 0 (the first cluster barrier below publishes it)
            T.evaluate(T.cuda.cta_sync())
            if tid < R:
                acc[0] = sub[tid]
                for h in range(1, H):
                    acc[0] = acc[0] + sub[h * (R + 1) + tid]
                hist[tid] = acc[0]

        # -- 2. Digit passes: cluster-summed histograms, the same scan in every CTA.
        prefix[0] = T.uint32(0)
        rem[0] = T.Cast("uint32", K)
        for p in range(NP):
            # the key byte pass p finds (spread: pass 0 finds the bin, pass p >= 1 the key's byte p - 1)
            shift = key_bits - 8 * (p if spread else p + 1)
            hb = (p % 2) * R
            if p > 0:
                for it in T.serial((ncand[0] + (threads - 1)) // threads):
                    c = it * threads + tid
                    if c < ncand[0]:
                        key = rx.key_of(S[T.Cast("int32", cand[c])], dtype)
                        if pass_match(key, shift, prefix[0], cth[0]):
                            rx.count(hist, T.uint32(hb + 255) - ((key >> shift) & T.uint32(255)))
            # Every CTA's histogram of this pass complete and visible cluster-wide (release / acquire).
            cl.sync()
            if tid < R // 4:
                # every rank's 16-byte load issued before the first add: one DSMEM latency, not C
                for r in range(C):
                    cl.load_v4_f32(part, 4 * r, hist.ptr_to([hb + 4 * tid]), r, remote[0])
                for q in range(4):
                    acc[q] = T.reinterpret("uint32", part[q])
                    for r in range(1, C):
                        acc[q] = acc[q] + T.reinterpret("uint32", part[4 * r + q])
                    tot[4 * tid + q] = acc[q]
            if p + 1 < NP and tid < R:
                # the other buffer: its last readers (pass p - 1) arrived at the barrier above after reading
                hist[(1 - p % 2) * R + tid] = T.uint32(0)
            T.evaluate(T.cuda.cta_sync())
            rx.select_bin(tot, rem[0], tid, scan_tot, state)
            if p == 0:
                cth[0] = T.uint32(255) - state[0]
            if p > 0 or not spread:
                prefix[0] = prefix[0] | ((T.uint32(255) - state[0]) << shift)
            rem[0] = state[1]
            if p == 0:
                # Candidates: the slice positions whose first key digit is the chosen one or above (the scores
                # this pass selected and those the later passes decide on), ascending, so that the later passes
                # and the gather read only them. A warp tests 32 * E consecutive scores a tile, ballots give the
                # places within the warp, one barrier a tile the warps' (two alternating buffers of warp totals).
                run[0] = T.uint32(0)
                for t in T.serial((ln + (tile - 1)) // tile):
                    cw = T.alloc_local((1,), "uint32")
                    cpos = T.alloc_local((1,), "uint32")
                    csum = T.alloc_local((1,), "uint32")
                    cw[0] = T.uint32(0)
                    for j in T.unroll(E):
                        i = t * tile + warp * (32 * E) + j * 32 + lane
                        sel[j] = T.uint32(0)
                        if i < ln:
                            if first_digit(rx.key_of(S[i], dtype)) >= cth[0]:
                                sel[j] = T.uint32(1)
                        ball[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), sel[j] != T.uint32(0))
                        cw[0] = cw[0] + T.Cast("uint32", T.popcount(ball[j]))
                    if lane == 0:
                        warp_a[(t % 2) * warps + warp] = cw[0]
                    T.evaluate(T.cuda.cta_sync())
                    cpos[0] = run[0]
                    csum[0] = T.uint32(0)
                    for w in range(warps):
                        if w < warp:
                            cpos[0] = cpos[0] + warp_a[(t % 2) * warps + w]
                        csum[0] = csum[0] + warp_a[(t % 2) * warps + w]
                    run[0] = run[0] + csum[0]
                    for j in T.unroll(E):
                        if sel[j] != T.uint32(0):
                            cand[cpos[0] + T.Cast("uint32", T.popcount(ball[j] & below))] = T.Cast(
                                "uint16", t * tile + warp * (32 * E) + j * 32 + lane)
                        cpos[0] = cpos[0] + T.Cast("uint32", T.popcount(ball[j]))
                ncand[0] = T.Cast("int32", run[0])
                T.evaluate(T.cuda.cta_sync())

        # -- 3. This CTA's scores above the threshold key and its ties; the CTAs before it from their counts.
        acc[0] = T.uint32(0)
        acc[1] = T.uint32(0)
        for it in T.serial((ncand[0] + (threads - 1)) // threads):
            c = it * threads + tid
            if c < ncand[0]:
                key = rx.key_of(S[T.Cast("int32", cand[c])], dtype)
                if key > prefix[0]:
                    acc[0] = acc[0] + T.uint32(1)
                elif key == prefix[0]:
                    acc[1] = acc[1] + T.uint32(1)
        for q in range(2):
            acc[q] = T.cuda.warp_sum(acc[q], 32)
        if lane == 0:
            warp_a[warp] = acc[0]
            warp_b[warp] = acc[1]
        T.evaluate(T.cuda.cta_sync())
        if tid == 0:
            acc[0] = T.uint32(0)
            acc[1] = T.uint32(0)
            for w in range(warps):
                acc[0] = acc[0] + warp_a[w]
                acc[1] = acc[1] + warp_b[w]
            counts[0] = acc[0]
            counts[1] = acc[1]
            counts[2] = T.uint32(0)
            counts[3] = T.uint32(0)
        cl.sync()
        if tid == 0:
            acc[0] = T.uint32(0)
            acc[1] = T.uint32(0)
            for r in range(C - 1):
                if r < rank:
                    cl.load_v4_f32(part, 0, counts.ptr_to([0]), r, remote[0])
                    acc[0] = acc[0] + T.reinterpret("uint32", part[0])
                    acc[1] = acc[1] + T.reinterpret("uint32", part[1])
            state[0] = acc[0]
            state[1] = acc[1]
        # done reading peers' counts (the wait at the end keeps this CTA's alive for theirs)
        cl.arrive()
        T.evaluate(T.cuda.cta_sync())

        # -- 4. Gather in ascending index order. Ties this CTA takes: its first `allowed` (in index order).
        allowed = T.if_then_else(rem[0] > state[1], rem[0] - state[1], T.uint32(0))
        run[0] = state[0] + T.min(rem[0], state[1])  # output place of this CTA's first selected score
        run[1] = T.uint32(0)  # ties of this slice seen in earlier tiles
        for t in T.serial((ncand[0] + (tile - 1)) // tile):
            tw = T.alloc_local((1,), "uint32")
            tw[0] = T.uint32(0)
            for j in T.unroll(E):
                i = t * tile + warp * (32 * E) + j * 32 + lane
                tie[j] = T.uint32(0)
                sel[j] = T.uint32(0)
                if i < ncand[0]:
                    key = rx.key_of(S[T.Cast("int32", cand[i])], dtype)
                    if key > prefix[0]:
                        sel[j] = T.uint32(1)
                    elif key == prefix[0]:
                        tie[j] = T.uint32(1)
                ball[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), tie[j] != T.uint32(0))
                tw[0] = tw[0] + T.Cast("uint32", T.popcount(ball[j]))
            if lane == 0:
                warp_a[warp] = tw[0]
            T.evaluate(T.cuda.cta_sync())
            rank_t = T.alloc_local((1,), "uint32")
            tsum = T.alloc_local((1,), "uint32")
            rank_t[0] = run[1]
            tsum[0] = T.uint32(0)
            for w in range(warps):
                if w < warp:
                    rank_t[0] = rank_t[0] + warp_a[w]
                tsum[0] = tsum[0] + warp_a[w]
            run[1] = run[1] + tsum[0]
            sw = T.alloc_local((1,), "uint32")
            sw[0] = T.uint32(0)
            for j in T.unroll(E):
                if tie[j] != T.uint32(0) and rank_t[0] + T.Cast("uint32", T.popcount(ball[j] & below)) < allowed:
                    sel[j] = T.uint32(1)
                rank_t[0] = rank_t[0] + T.Cast("uint32", T.popcount(ball[j]))
                ball[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), sel[j] != T.uint32(0))
                sw[0] = sw[0] + T.Cast("uint32", T.popcount(ball[j]))
            if lane == 0:
                warp_b[warp] = sw[0]
            T.evaluate(T.cuda.cta_sync())
            pos0 = T.alloc_local((1,), "uint32")
            ssum = T.alloc_local((1,), "uint32")
            pos0[0] = run[0]
            ssum[0] = T.uint32(0)
            for w in range(warps):
                if w < warp:
                    pos0[0] = pos0[0] + warp_b[w]
                ssum[0] = ssum[0] + warp_b[w]
            run[0] = run[0] + ssum[0]
            for j in T.unroll(E):
                if sel[j] != T.uint32(0):
                    pos = i64(pos0[0] + T.Cast("uint32", T.popcount(ball[j] & below)))
                    i = T.Cast("int32", cand[t * tile + warp * (32 * E) + j * 32 + lane])
                    If[o_base + pos] = i64(lo + i)
                    Vr[o_base + pos] = S[i]
                pos0[0] = pos0[0] + T.Cast("uint32", T.popcount(ball[j]))
        cl.wait()

    return fast_topk_clusters
