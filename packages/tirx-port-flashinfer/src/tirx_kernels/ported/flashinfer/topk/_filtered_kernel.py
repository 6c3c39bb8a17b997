# SPDX-License-Identifier: Apache-2.0
# The TIRx function of filtered_topk (FlashInfer's filtered top-k, include/flashinfer/topk.cuh, release v0.7.4,
# commit 77039051b0be921788dc2784ec41423b558878ec), written anew; the plan is in filtered_topk.py's docstring.
"""``build_kernel(dtype, index_dtype, mode)``: the three-stage filtered top-k kernel (``stage`` is an argument)."""

from __future__ import annotations

from tvm.script import tirx as T

from . import _radix as rx
from . import radix_topk_single_cta as single
from .filtered_topk import BINS, CAP, COARSE_BITS, MAX_K


def build_kernel(dtype: str, index_dtype: str, mode: str):
    assert BINS <= CAP, (BINS, CAP)  # the coarse histogram lives in the candidates' buffer
    raw_t = rx.RAW[dtype]
    key_bits = rx.KEY_BITS[dtype]
    P = key_bits // 8  # noqa: N806
    threads, E, R, WARPS = rx.THREADS, rx.GATHER_ELEMS, rx.RADIX, rx.WARPS  # noqa: N806
    tile = threads * E
    plain = mode == "plain"
    coarse_shift = key_bits - COARSE_BITS
    above_at, cand_at = 4, 4 + MAX_K  # offsets in a row's list words

    def coarse_bin(key):
        """Bins count down from the largest keys, as in ``_radix``: bin 0 holds the largest."""
        return T.uint32(BINS - 1) - (key >> coarse_shift)

    def key_at(Xr, x_base, cand, overflow, j):  # noqa: N803
        """Stage 2's j-th key: the row's (B overflowed) or the j-th candidate's."""
        return T.Select(overflow, rx.key_of(Xr[x_base + T.Cast("int64", j)], dtype), cand[T.min(j, CAP - 1)])

    def rank_before(arr, length, v, steps=MAX_K):
        """How many of the ascending ``arr[0:length]`` (length <= 2 * steps - 1) are below ``v``."""
        pos = T.alloc_local((1,), "int32")
        T.buffer_store(pos, 0, [0])
        step = steps
        while step >= 1:
            with T.If(T.And(pos[0] + step <= length, arr[T.max(pos[0] + step - 1, 0)] < v)):
                with T.Then():
                    T.buffer_store(pos, pos[0] + step, [0])
            step //= 2
        return pos[0]

    @T.prim_func
    def filtered_topk(x_ptr: T.handle, cnt_ptr: T.handle, lst_ptr: T.handle, v_ptr: T.handle, i_ptr: T.handle,
                      len_ptr: T.handle, aux_ptr: T.handle, aux_stride: T.int32, stage: T.int32):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        C = T.int32()
        LW = T.int32()
        VM = T.int32()
        VK = T.int32()
        L = T.int32()
        A = T.int32()
        x_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, N), dtype, strides=(x_stride, 1), align=2)
        Cnt = T.match_buffer(cnt_ptr, (M, C, BINS), "int32", align=4)
        Lst = T.match_buffer(lst_ptr, (M, LW), "int32", align=4)
        V = T.match_buffer(v_ptr, (VM, VK), dtype, align=2)
        Ix = T.match_buffer(i_ptr, (M, K), index_dtype, align=4)
        Lens = T.match_buffer(len_ptr, (L,), "int32", align=4)
        Aux = T.match_buffer(aux_ptr, (A,), "int32", align=4)
        T.device_entry()
        T.attr({"tirx.max_registers": 64})
        Xr = T.decl_buffer((M * x_stride,), raw_t, data=X.data)
        Vr = T.decl_buffer((VM * VK,), raw_t, data=V.data)
        If = T.decl_buffer((M * K,), index_dtype, data=Ix.data)
        row, c = T.cta_id([M, C])
        tid = T.thread_id([threads])
        cand = T.alloc_shared((CAP,), "uint32")  # stage 2: candidate keys, then the winners' columns
        # Stages 0 / 1: the coarse histogram, in the same 16 KB (no stage uses both): 4096 bins and 4096 candidates
        # beside the above list stay under the 48 KB of static shared memory.
        coarse = T.decl_buffer((BINS,), "uint32", data=cand.data, scope="shared")
        hist = T.alloc_shared((R,), "uint32")
        scan_tot = T.alloc_shared((rx.SCAN_WARPS,), "uint32")
        state = T.alloc_shared((4,), "uint32")
        row_state = T.alloc_shared((4,), "uint32")
        wa = T.alloc_shared((2 * WARPS,), "uint32")  # per-warp counts, two alternating buffers
        wb = T.alloc_shared((2 * WARPS,), "uint32")
        above = T.alloc_shared((MAX_K,), "int32")
        acc = T.alloc_local((2,), "uint32")
        run = T.alloc_local((2,), "uint32")
        prefix = T.alloc_local((1,), "uint32")
        rem = T.alloc_local((1,), "uint32")
        f1 = T.alloc_local((E,), "uint32")
        f2 = T.alloc_local((E,), "uint32")
        b1 = T.alloc_local((E,), "uint32")
        b2 = T.alloc_local((E,), "uint32")
        lane = tid % 32
        warp = tid // 32
        below = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        o_base = T.Cast("int64", row) * T.Cast("int64", K)
        nrow = T.alloc_local((1,), "int32")
        if plain:
            nrow[0] = N
        else:
            nrow[0] = T.min(T.max(Lens[row], 0), N)
        n = nrow[0]
        chunk = (((N + C - 1) // C + (tile - 1)) // tile) * tile
        lo = c * chunk
        hi = T.min(lo + chunk, n)

        if n <= K:
            if stage == 2 and c == 0:
                for it in T.serial((K + (threads - 1)) // threads):
                    j = it * threads + tid
                    if j < K:
                        if j < n:
                            If[o_base + T.Cast("int64", j)] = rx.out_index(mode, index_dtype, j, row, Aux, aux_stride)
                            if plain:
                                Vr[o_base + T.Cast("int64", j)] = Xr[x_base + T.Cast("int64", j)]
                        else:
                            If[o_base + T.Cast("int64", j)] = T.Cast(index_dtype, -1)
                            if plain:
                                Vr[o_base + T.Cast("int64", j)] = T.Cast(raw_t, 0)
        elif stage == 0:
            # ---- coarse counts of this chunk
            for r in T.unroll(BINS // threads):
                coarse[r * threads + tid] = T.uint32(0)
            T.evaluate(T.cuda.cta_sync())
            # A thread issues its E loads of a tile before counting them; f1 holds the raw scores here.
            for it in T.serial(chunk // tile):
                single.load_tile(f1, Xr, x_base, lo + it * tile + tid, threads, hi)
                for j in T.unroll(E):
                    if lo + it * tile + j * threads + tid < hi:
                        rx.count(coarse, coarse_bin(rx.key_of(f1[j], dtype)))
            T.evaluate(T.cuda.cta_sync())
            for r in T.unroll(BINS // threads):
                Cnt[row, c, r * threads + tid] = T.Cast("int32", coarse[r * threads + tid])
        elif stage == 1:
            # ---- the bin B of the k-th largest: totals over chunks, a scan over groups of BINS / 256 bins, then those
            for r in T.unroll(BINS // threads):
                acc[0] = T.uint32(0)
                for cc in T.serial(C):
                    acc[0] = acc[0] + T.Cast("uint32", Cnt[row, cc, r * threads + tid])
                coarse[r * threads + tid] = acc[0]
            T.evaluate(T.cuda.cta_sync())
            if tid < R:
                acc[0] = T.uint32(0)
                for j in range(BINS // R):
                    acc[0] = acc[0] + coarse[tid * (BINS // R) + j]
                hist[tid] = acc[0]
            T.evaluate(T.cuda.cta_sync())
            rx.select_bin(hist, T.Cast("uint32", K), tid, scan_tot, state)
            if tid == 0:
                acc[0] = state[1]  # places left when the group starts
                acc[1] = T.uint32(0)  # found
                for j in range(BINS // R):
                    h = coarse[state[0] * (BINS // R) + j]
                    if acc[1] == T.uint32(0):
                        if h >= acc[0]:
                            row_state[0] = state[0] * (BINS // R) + j
                            row_state[1] = acc[0]
                            row_state[2] = h
                            acc[1] = T.uint32(1)
                        else:
                            acc[0] = acc[0] - h
            T.evaluate(T.cuda.cta_sync())
            bin_b = row_state[0]
            keep = row_state[2] <= T.uint32(CAP)
            if c == 0 and tid == 0:
                for q in range(3):
                    Lst[row, q] = T.Cast("int32", row_state[q])
            # ---- places of this chunk's first entries: the above / candidate counts of earlier chunks
            acc[0] = T.uint32(0)
            acc[1] = T.uint32(0)
            if bin_b > T.uint32(0):
                for g in T.serial(T.Cast("int32", (T.Cast("uint32", c) * bin_b + T.uint32(threads - 1))
                                             // T.uint32(threads))):
                    j = T.Cast("uint32", g * threads + tid)
                    if j < T.Cast("uint32", c) * bin_b:
                        acc[0] = acc[0] + T.Cast("uint32", Cnt[row, T.Cast("int32", j // bin_b),
                                                               T.Cast("int32", j % bin_b)])
            for g in T.serial((c + (threads - 1)) // threads):
                j = g * threads + tid
                if j < c:
                    acc[1] = acc[1] + T.Cast("uint32", Cnt[row, j, T.Cast("int32", bin_b)])
            for q in range(2):
                acc[q] = T.cuda.warp_sum(acc[q], 32)
            if lane == 0:
                wa[warp] = acc[0]
                wb[warp] = acc[1]
            T.evaluate(T.cuda.cta_sync())
            run[0] = T.uint32(0)
            run[1] = T.uint32(0)
            for w in range(WARPS):
                run[0] = run[0] + wa[w]
                run[1] = run[1] + wb[w]
            T.evaluate(T.cuda.cta_sync())
            # ---- scan the chunk: columns above B and (when they fit) in B, each list in ascending column order
            for t in T.serial(chunk // tile):
                ta = T.alloc_local((1,), "uint32")
                tb = T.alloc_local((1,), "uint32")
                ta[0] = T.uint32(0)
                tb[0] = T.uint32(0)
                for j in T.unroll(E):
                    i = lo + t * tile + warp * (32 * E) + j * 32 + lane
                    f1[j] = T.uint32(0)
                    f2[j] = T.uint32(0)
                    if i < hi:
                        rb = coarse_bin(rx.key_of(Xr[x_base + T.Cast("int64", i)], dtype))
                        if rb < bin_b:
                            f1[j] = T.uint32(1)
                        elif rb == bin_b and keep:
                            f2[j] = T.uint32(1)
                    b1[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), f1[j] != T.uint32(0))
                    b2[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), f2[j] != T.uint32(0))
                    ta[0] = ta[0] + T.Cast("uint32", T.popcount(b1[j]))
                    tb[0] = tb[0] + T.Cast("uint32", T.popcount(b2[j]))
                buf = (t % 2) * WARPS
                if lane == 0:
                    wa[buf + warp] = ta[0]
                    wb[buf + warp] = tb[0]
                T.evaluate(T.cuda.cta_sync())
                pa = T.alloc_local((1,), "uint32")
                pb = T.alloc_local((1,), "uint32")
                pa[0] = run[0]
                pb[0] = run[1]
                for w in range(WARPS):
                    if w < warp:
                        pa[0] = pa[0] + wa[buf + w]
                        pb[0] = pb[0] + wb[buf + w]
                    run[0] = run[0] + wa[buf + w]
                    run[1] = run[1] + wb[buf + w]
                for j in T.unroll(E):
                    col = lo + t * tile + warp * (32 * E) + j * 32 + lane
                    if f1[j] != T.uint32(0):
                        Lst[row, above_at + T.Cast("int32", pa[0] + T.Cast("uint32", T.popcount(b1[j] & below)))] = col
                    if f2[j] != T.uint32(0):
                        Lst[row, cand_at + T.Cast("int32", pb[0] + T.Cast("uint32", T.popcount(b2[j] & below)))] = col
                    pa[0] = pa[0] + T.Cast("uint32", T.popcount(b1[j]))
                    pb[0] = pb[0] + T.Cast("uint32", T.popcount(b2[j]))
        elif c == 0:
            # ---- stage 2: the exact select inside B, over the candidates (or, when B overflowed, the row)
            bin_b = T.Cast("uint32", Lst[row, 0])
            need = T.Cast("uint32", Lst[row, 1])
            count_b = T.Cast("uint32", Lst[row, 2])
            overflow = count_b > T.uint32(CAP)
            span = T.Select(overflow, n, T.Cast("int32", count_b))
            if count_b <= T.uint32(CAP):
                for it in T.serial((span + (threads - 1)) // threads):
                    j = it * threads + tid
                    if j < span:
                        col = Lst[row, cand_at + j]
                        cand[j] = rx.key_of(Xr[x_base + T.Cast("int64", col)], dtype)

            prefix[0] = T.uint32(0)
            rem[0] = need
            for p in range(P):
                shift = key_bits - 8 * (p + 1)
                rx.clear_hist(hist, tid)
                for it in T.serial((span + (threads - 1)) // threads):
                    j = it * threads + tid
                    if j < span:
                        key = key_at(Xr, x_base, cand, overflow, j)
                        if coarse_bin(key) == bin_b:
                            if p == 0:
                                rx.count(hist, T.uint32(255) - (key >> shift))
                            elif (key >> (shift + 8)) == (prefix[0] >> (shift + 8)):
                                rx.count(hist, T.uint32(255) - ((key >> shift) & T.uint32(255)))
                T.evaluate(T.cuda.cta_sync())
                rx.select_bin(hist, rem[0], tid, scan_tot, state)
                prefix[0] = prefix[0] | ((T.uint32(255) - state[0]) << shift)
                rem[0] = state[1]
            # winners (the `need` places of B): keys above the threshold, then its first `rem` ties by column;
            # their columns go to cand[0:need] in ascending order (a winner's place never passes its own index)
            run[0] = T.uint32(0)  # winners so far
            run[1] = T.uint32(0)  # ties so far
            for t in T.serial((span + (threads - 1)) // threads):
                j = t * threads + tid
                key = T.alloc_local((1,), "uint32")
                col = T.alloc_local((1,), "int32")
                key[0] = T.uint32(0)
                col[0] = j
                f1[0] = T.uint32(0)
                f2[0] = T.uint32(0)
                if j < span:
                    key[0] = key_at(Xr, x_base, cand, overflow, j)
                    if count_b <= T.uint32(CAP):
                        col[0] = Lst[row, cand_at + j]
                    if coarse_bin(key[0]) == bin_b:
                        if key[0] > prefix[0]:
                            f1[0] = T.uint32(1)
                        elif key[0] == prefix[0]:
                            f2[0] = T.uint32(1)
                b2[0] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), f2[0] != T.uint32(0))
                buf = (t % 2) * WARPS
                if lane == 0:
                    wb[buf + warp] = T.Cast("uint32", T.popcount(b2[0]))
                T.evaluate(T.cuda.cta_sync())
                tr = T.alloc_local((1,), "uint32")
                tr[0] = run[1] + T.Cast("uint32", T.popcount(b2[0] & below))
                for w in range(WARPS):
                    if w < warp:
                        tr[0] = tr[0] + wb[buf + w]
                    run[1] = run[1] + wb[buf + w]
                if f2[0] != T.uint32(0) and tr[0] < rem[0]:
                    f1[0] = T.uint32(1)
                b1[0] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), f1[0] != T.uint32(0))
                if lane == 0:
                    wa[buf + warp] = T.Cast("uint32", T.popcount(b1[0]))
                T.evaluate(T.cuda.cta_sync())
                wp = T.alloc_local((1,), "uint32")
                wp[0] = run[0] + T.Cast("uint32", T.popcount(b1[0] & below))
                for w in range(WARPS):
                    if w < warp:
                        wp[0] = wp[0] + wa[buf + w]
                    run[0] = run[0] + wa[buf + w]
                if f1[0] != T.uint32(0):
                    cand[wp[0]] = T.Cast("uint32", col[0])
            # ---- merge the above list and the winners into ascending column order
            n_above = K - T.Cast("int32", need)
            for it in T.serial((n_above + (threads - 1)) // threads):
                j = it * threads + tid
                if j < n_above:
                    above[j] = Lst[row, above_at + j]
            T.evaluate(T.cuda.cta_sync())
            for it in T.serial((K + (threads - 1)) // threads):
                j = it * threads + tid
                if j < K:
                    col = T.alloc_local((1,), "int32")
                    place = T.alloc_local((1,), "int32")
                    if j < n_above:
                        col[0] = above[j]
                        place[0] = j + rank_before(cand, T.Cast("int32", need), T.Cast("uint32", col[0]))
                    else:
                        col[0] = T.Cast("int32", cand[j - n_above])
                        place[0] = (j - n_above) + rank_before(above, n_above, col[0])
                    If[o_base + T.Cast("int64", place[0])] = rx.out_index(mode, index_dtype, col[0], row, Aux,
                                                                          aux_stride)
                    if plain:
                        Vr[o_base + T.Cast("int64", place[0])] = Xr[x_base + T.Cast("int64", col[0])]

    return filtered_topk
