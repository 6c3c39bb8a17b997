# SPDX-License-Identifier: Apache-2.0
"""The chunk table of the KDA forward (``kda_forward_portfolio_multishape``, kernel ``table``): from
``cu_seqlens`` to the chunk pass's per-slot ``(tok0, clen)`` and each sequence's first slot ``base``, on the device
in one launch. It computes exactly what ``chunk_table_torch`` (the oracle) does in ~25 small torch ops, whose host
time (launches) made the GPU wait for the host at small shapes (H200, 2026-12-07, op_breakdown --host: h16 b1 t8192
issued in 959 us of host time against 1128 us of kernels).

One CTA of 1024 threads, in two phases:

1. Over the N + 1 entries of ``cu_seqlens`` in tiles of 1024 (a running carry, so N is unbounded): clamp each to
   [0, T], a max-scan (``clamped_cu``'s cummax) -> ``ccu`` (written to the scratch ``ccu`` [N + 1]), each
   sequence's chunk count ceil((ccu[n + 1] - ccu[n]) / 64) and a sum-scan of the counts -> ``base[n]`` (the exclusive
   scan). The carries of the last tile are ``ccu[N]`` and the number of real chunks E.
2. A barrier (``base`` and ``ccu`` are global: ``__syncthreads`` orders the CTA's global writes before its reads),
   then slot ``idx`` (``tid``, ``tid + 1024``, ...): below E, its sequence is the last n with ``base[n] <= idx``
   (a binary search; the oracle's ``searchsorted(ends, idx, right=True)`` clamped to N - 1 is the same n, as
   ``ends[n] = base[n + 1]``), ``tok0 = ccu[n] + 64 (idx - base[n])``, ``clen = min(ccu[n + 1] - tok0, 64)``; from E
   on, the tail after ``ccu[N]``: ``tok0 = min(ccu[N] + 64 (idx - E), max(T - 1, 0))`` and ``clen = -max(min(T -
   (ccu[N] + 64 (idx - E)), 64), 0)`` (in int64, as the oracle computes it).

``cu_seqlens`` comes as its int32 words (``cu64``: int64 values, read whole: a value past 2^31 clamps to T as in
the oracle). Launch: grid (1,), 1024 threads; T <= 2^30 (the launcher's check: ccu[j] + 63 and the slot count stay
in int32; slot positions are computed in int64).
"""

from __future__ import annotations

CHUNK = 64
THREADS = 1024


def build_chunk_table_kernel(threads: int = THREADS):
    """The kernel at ``threads`` per CTA (the artifact: 1024; the tests also build 64, whose tiles make a few
    sequences cross tile boundaries quickly on the CPU)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import scan

    warps = scan.scratch_words(threads)

    def i64(x):
        return T.Cast("int64", x)

    @T.prim_func
    def kda_chunk_table(cu_ptr: T.handle, tok0_ptr: T.handle, clen_ptr: T.handle, base_ptr: T.handle,
                        ccu_ptr: T.handle, total: T.int32, cu64: T.int32):
        n_words = T.int32()
        slots = T.int32()
        n = T.int32()
        n_cu = T.int32()
        CU = T.match_buffer(cu_ptr, (n_words,), "int32", align=4)
        TOK0 = T.match_buffer(tok0_ptr, (slots,), "int32", align=4)
        CLEN = T.match_buffer(clen_ptr, (slots,), "int32", align=4)
        BASE = T.match_buffer(base_ptr, (n,), "int32", align=4)
        CCU = T.match_buffer(ccu_ptr, (n_cu,), "int32", align=4)
        T.device_entry()
        CU64 = T.decl_buffer((n_words // 2,), "int64", data=CU.data)
        T.cta_id([1])
        tid = T.thread_id([threads])
        # Two scratch regions: the max-scan's and the sum-scan's alternate, so a tile needs only their barriers.
        scratch = T.alloc_shared((2 * warps,), "int32")
        mx = T.alloc_local((3,), "int32")  # clamped cu: inclusive (ccu[j]), exclusive (ccu[j - 1]), total
        sm = T.alloc_local((3,), "int32")  # chunk counts: inclusive, exclusive (base[j - 1]), total
        raw = T.alloc_local((1,), "int64")
        lo = T.alloc_local((1,), "int32")
        hi = T.alloc_local((1,), "int32")
        mx[2] = 0  # the carries: clamped values are >= 0, so 0 is the max-scan's identity here
        sm[2] = 0

        # Phase 1: entry j of cu_seqlens per thread and tile; sequence j - 1 ends at entry j.
        for tile in range((n_cu + threads - 1) // threads):
            j = tile * threads + tid
            raw[0] = T.int64(0)
            if j < n_cu:
                if cu64 != 0:
                    raw[0] = CU64[j]
                else:
                    raw[0] = i64(CU[j])
            clamped = T.Cast("int32", T.min(T.max(raw[0], T.int64(0)), i64(total)))
            scan.cta_scan(clamped, tid, threads, scratch, mx, "max", carry=mx[2])
            count = T.Select(T.And(j >= 1, j < n_cu), (mx[0] - mx[1] + (CHUNK - 1)) // CHUNK, 0)
            scan.cta_scan(count, tid, threads, scratch, sm, "sum", carry=sm[2], scratch_offset=warps)
            if j < n_cu:
                CCU[j] = mx[0]
                if j >= 1:
                    BASE[j - 1] = sm[1]
        T.evaluate(T.cuda.cta_sync())

        # Phase 2: the slots. real = E (sm[2]) chunks, then the tail after ccu[N] (mx[2]).
        for it in range((slots + threads - 1) // threads):
            idx = it * threads + tid
            if idx < slots:
                if idx < sm[2]:
                    lo[0] = 0  # base[lo] <= idx < base[hi] (hi = n: past the end)
                    hi[0] = n
                    while hi[0] - lo[0] > 1:
                        mid = (lo[0] + hi[0]) >> 1
                        if BASE[mid] <= idx:
                            lo[0] = mid
                        else:
                            hi[0] = mid
                    tok0 = i64(CCU[lo[0]]) + i64(CHUNK) * i64(idx - BASE[lo[0]])
                    TOK0[idx] = T.Cast("int32", tok0)
                    CLEN[idx] = T.Cast("int32", T.min(i64(CCU[lo[0] + 1]) - tok0, i64(CHUNK)))
                else:
                    tail_tok0 = i64(mx[2]) + i64(CHUNK) * i64(idx - sm[2])
                    TOK0[idx] = T.Cast("int32", T.min(tail_tok0, i64(T.max(total - 1, 0))))
                    CLEN[idx] = T.Cast("int32", -T.max(T.min(i64(total) - tail_tok0, i64(CHUNK)), T.int64(0)))

    return kda_chunk_table
