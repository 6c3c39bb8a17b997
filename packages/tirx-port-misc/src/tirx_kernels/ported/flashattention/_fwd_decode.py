# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper forward for a KV cache (FlashAttention-3, arXiv 2407.08608; hopper/
# flash_fwd_launch_template.h's split-KV path, hopper/flash_fwd_combine_kernel.h, hopper/paged_kv.h and the PackGQA
# idea of hopper/pack_gqa.h, https://github.com/Dao-AILab/flash-attention at the package's pinned commit
# 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in TIRx on tirx-core's Hopper layer; no code is copied.
"""The TIRx generators of ``flash_attn_with_kvcache``'s kernels: the decode kernel (paged or contiguous KV cache,
GQA packing, split-KV) and the combine kernel that merges the splits.

Decode kernel, one CTA per (KV split, 64 packed query rows x KV head, batch entry); 256 threads, two CTAs per SM
(one at head dim 256):
- GQA packing (FA3's PackGQA): the ``group = Hq / Hkv`` query heads sharing a KV head are stacked into the M tile,
  packed row p = i * group + g for query i and head ``hk * group + g``, so a decode step (1-4 queries) of 16 query
  heads still fills a 64-row wgmma and K/V are read once per KV head, not once per query head.
- Warpgroup 0: thread 0 streams K and V of the split's key tiles through the mainloop's rings, one TMA box per
  ``box_rows`` keys (a run-time divisor of the page size and of ``block_n``) at the page ``block_table[b, key /
  page_size]`` gives, so pages may come in any order (the next tile's entries are read while the ring is full). A
  contiguous cache is the same kernel with one page per sequence (page size = the cache length, table = the batch
  indices).
- Warpgroup 1, the consumer: copies the packed Q rows into the SW128 tile itself (16-byte loads, zero rows and
  columns past the ends), then runs the mainloop (``overlap`` schedule without ping-pong turns) over the split's
  tiles, clearing the V rows past the sequence's length (a cache's unused slots may hold NaN).
  Each row's key limit: the sequence's cached length ``cache_seqlens[b]``, and under ``causal`` (a run-time flag: one
  artifact serves both) the bottom-right diagonal of its query i.
- Epilogue: with one split, out and LSE directly; else the split's normalised O (fp32) and LSE into the partial
  buffers [splits, B, Sq, Hq, Dv] / [splits, B, Hq, Sq]. A split with no visible key writes O 0 and LSE -inf.

Combine kernel (one warp per output row): LSE = log sum exp of the splits' LSEs, O = sum_s exp(lse_s - LSE) O_s
(the merge-state arithmetic of FlashInfer's cascade.merge_state, natural log here: -inf guard for a row no split
saw, which gives O 0 and LSE -inf)."""

from __future__ import annotations

import math

from tirx_kernels.ported.flashattention._fwd_mainloop import CHUNK, WG_BAR, Mainloop

NUM_CONSUMERS = 1
BLOCK_M = 64  # packed rows per CTA: one consumer warpgroup
THREADS = 128 * (1 + NUM_CONSUMERS)
# 2 CTAs an SM where the tiles allow: ptxas then compiles for 128 registers a thread (65536 / 512), and no single
# instruction may need more (an m64n256 PV wgmma has 128 accumulators + 4 A registers: head dim 256 runs one CTA an
# SM, 255 registers a thread, no setmaxnreg).
PRODUCER_REGS, CONSUMER_REGS = 40, 216  # 40 + 216 = 2 x 128, what 256 threads x 2 CTAs are launched with
MIN_BOX = 16  # rows of the smallest K/V TMA box (pages are multiples of it)
COMBINE_WARPS = 4
MAX_HEAD_DIM_V = 256


def smem_limit(ctas_per_sm: int) -> int:
    """Shared memory a CTA may use with ``ctas_per_sm`` on an SM: 228 KB less 1 KB reserved per CTA."""
    return min(233472 // ctas_per_sm - 1024, 232448)


def build_decode_kernel(dtype: str, head_dim: int, head_dim_v: int, block_n: int, num_stages: int,
                        ctas_per_sm: int = 2):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import roles, softmax, tma, vector, wgmma

    ml = Mainloop(dtype, head_dim, head_dim_v, block_n, num_stages, "overlap", NUM_CONSUMERS, smem_limit(ctas_per_sm))
    split_registers = ctas_per_sm == 2  # one CTA: 255 registers each from the launch, nothing to move
    if ctas_per_sm not in (1, 2) or (split_registers and not roles.register_split_fits(
            NUM_CONSUMERS, PRODUCER_REGS, CONSUMER_REGS, ctas_per_sm)):
        raise ValueError(f"flash_attention4 decode: {ctas_per_sm} CTAs an SM (1 or 2; the register split must fit)")
    per_row = ml.dp // 8  # 16-byte vectors of a padded Q row
    q_per_thread = BLOCK_M * per_row // 128  # the consumer warpgroup loads Q: dp / 16 vectors a thread
    max_boxes = block_n // MIN_BOX

    def producer_start():
        if split_registers:
            roles.producer_role(PRODUCER_REGS)

    def consumer_start(wg, tid):
        """``(consumer, thread, warp, lane)`` of the math warpgroup, taking the producer's registers when split."""
        if split_registers:
            return roles.consumer_role(wg, tid, CONSUMER_REGS)
        ct = tid - roles.WARPGROUP * wg
        return wg - 1, ct, ct // 32, ct % 32

    def encode_kv(tmap, data, d, hkv, page_size, num_pages, strides, box_rows):
        """A 4-D map (D, heads, rows in a page, pages) with a run-time box height (``tma.encode`` takes Python-int
        boxes only)."""
        T.evaluate(T.tensormap_encode_tiled(
            tmap, data, d, hkv, page_size, num_pages, *[T.Cast("int64", s) * ml.elem for s in strides], CHUNK, 1,
            box_rows, 1, 1, 1, 1, 1, descriptor_dtype=dtype, rank=4, swizzle=tma.SWIZZLE_128B))

    def load_q(sm, Q, b, hk, group, p0, rows_total, cw, warp, lane):  # noqa: N803
        """The consumer warpgroup (idle until Q is there anyway; registers to spare): the packed Q rows p0 .. p0 + 63
        into the SW128 tile, zeros past the rows and the head dim. Every load is issued before the first store (one
        memory latency), then the writes are made visible to the async proxy and the warpgroup."""
        regs = T.alloc_local((4 * q_per_thread,), "uint32")
        ct = warp * 32 + lane
        for k in range(q_per_thread):
            v = k * 128 + ct
            p, col = p0 + v // per_row, (v % per_row) * 8
            vector.fill(regs, 4 * k, 4)
            vector.load_v4(regs, 4 * k, Q.ptr_to([b, p // group, hk * group + p % group, col]),
                           T.And(p < rows_total, col < head_dim))
        for k in range(q_per_thread):
            v = k * 128 + ct
            row, col = v // per_row, (v % per_row) * 8
            off = (col // CHUNK) * BLOCK_M * CHUNK + tma.sw128_offset(row, col % CHUNK, dtype)
            vector.store_shared_v4(sm.q.ptr_to([off]), regs, 4 * k)
        tma.fence_proxy_async()
        # every thread's Q rows before the warpgroup's QK wgmma reads them (T.evaluate: a bare call is dropped)
        T.evaluate(T.cuda.warpgroup_sync(WG_BAR + cw))

    def kv_loaders(sm, k_map, v_map, pages, Table, b, hk, num_keys, box_rows, page_size, max_pages):  # noqa: N803
        """``produce_kv``'s callbacks: key tile ``n`` as boxes of ``box_rows`` keys, each at the page ``pages[j]``
        holds. K and V of a tile read the same pages; after V, the entries of tile ``n + 1`` are loaded into
        ``pages`` (their latency hides under the next ring-slot wait, not in front of the TMA issue). A box wholly
        past the sequence's keys reads page 0 (in bounds; its K scores are masked, its V rows cleared)."""
        boxes = block_n // box_rows

        def fetch(n):
            for j in range(max_boxes):
                key = n * block_n + j * box_rows
                with T.If(j < boxes):
                    with T.Then():
                        entry = Table[b, T.min(key // page_size, max_pages - 1)]
                        T.buffer_store(pages, T.if_then_else(key < num_keys, entry, 0), [j])

        def issue(tmap, chunks, dst, then=None):
            def load(n, s, bar):
                for j in range(max_boxes):
                    key = n * block_n + j * box_rows
                    with T.If(j < boxes):
                        with T.Then():
                            for c in range(chunks):
                                tma.load(dst(sm, s, c, j * box_rows), tmap, [c * CHUNK, hk, key % page_size,
                                                                            pages[j]], bar)
                if then is not None:
                    then(n + 1)
            return load

        # Parser-time values: the kernel body unpacks them into names without emitting variables.
        return T.meta_var((fetch, issue(k_map, ml.q_chunks, ml.k_dst), issue(v_map, ml.v_chunks, ml.v_dst, fetch)))

    def row_limits(rg, p0, group, num_q, num_k, causal, warp, lane):
        """Each row half's last visible key (query i = p / group; causal: bottom-right) and ``mask_from``."""
        last = num_k - 1
        for r in range(2):
            i = (p0 + wgmma.acc_row(warp, lane, r)) // group
            T.buffer_store(rg.klim, T.if_then_else(causal != 0, T.min(last, i + num_k - num_q), last), [r])
        return T.if_then_else(causal != 0, T.min(last, p0 // group + num_k - num_q), last)

    @T.prim_func
    def flash_attention4_decode(q_ptr: T.handle, kc_ptr: T.handle, vc_ptr: T.handle, seqlens_ptr: T.handle,
                                table_ptr: T.handle, o_ptr: T.handle, lse_ptr: T.handle, op_ptr: T.handle,
                                lp_ptr: T.handle, box_rows: T.int32, num_splits: T.int32, use_seqlens: T.int32,
                                seqlen_all: T.int32, causal: T.int32, softmax_scale: T.float32):
        B = T.int32()
        Sq = T.int32()
        Hq = T.int32()
        Hkv = T.int32()
        NP = T.int32()
        PS = T.int32()
        MP = T.int32()
        NSL = T.int32()
        NOP = T.int32()
        NLP = T.int32()
        q_sb = T.int32()
        q_ss = T.int32()
        q_sh = T.int32()
        k_sp = T.int32()
        k_ss = T.int32()
        k_sh = T.int32()
        v_sp = T.int32()
        v_ss = T.int32()
        v_sh = T.int32()
        t_sb = T.int32()
        Q = T.match_buffer(q_ptr, (B, Sq, Hq, head_dim), dtype, strides=(q_sb, q_ss, q_sh, 1), align=16)
        Kc = T.match_buffer(kc_ptr, (NP, PS, Hkv, head_dim), dtype, strides=(k_sp, k_ss, k_sh, 1), align=16)
        Vc = T.match_buffer(vc_ptr, (NP, PS, Hkv, head_dim_v), dtype, strides=(v_sp, v_ss, v_sh, 1), align=16)
        Seqlens = T.match_buffer(seqlens_ptr, (NSL,), "int32")
        Table = T.match_buffer(table_ptr, (B, MP), "int32", strides=(t_sb, 1))
        Out = T.match_buffer(o_ptr, (B, Sq, Hq, head_dim_v), dtype, align=16)
        LSE = T.match_buffer(lse_ptr, (B, Hq, Sq), "float32", align=16)
        OPart = T.match_buffer(op_ptr, (NOP,), "float32", align=16)
        LPart = T.match_buffer(lp_ptr, (NLP,), "float32")
        k_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        v_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        encode_kv(k_map, Kc.data, head_dim, Hkv, PS, NP, [k_sh, k_ss, k_sp], box_rows)
        encode_kv(v_map, Vc.data, head_dim_v, Hkv, PS, NP, [v_sh, v_ss, v_sp], box_rows)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas_per_sm})
        split, mh, b = T.cta_id([num_splits, (Sq * (Hq // Hkv) + BLOCK_M - 1) // BLOCK_M * Hkv, B])
        wg = T.warpgroup_id([1 + NUM_CONSUMERS])
        tid = T.thread_id([THREADS])
        group = Hq // Hkv
        rows_total = Sq * group
        hk = mh % Hkv
        p0 = (mh // Hkv) * BLOCK_M
        cap = MP * PS
        num_k = T.min(T.if_then_else(use_seqlens != 0, Seqlens[T.min(b, NSL - 1)], seqlen_all), cap)
        # Keys the tile's last row sees (causal: its diagonal), in tiles, shared out over the splits.
        i_last = T.min(p0 + BLOCK_M, rows_total) - 1
        key_end = T.if_then_else(causal != 0, T.max(T.min(num_k, i_last // group + 1 + num_k - Sq), 0), num_k)
        n_total = (key_end + block_n - 1) // block_n
        per_split = (n_total + num_splits - 1) // num_splits
        n_begin = T.min(split * per_split, n_total)
        n_end = T.min(n_begin + per_split, n_total)

        pool = T.SMEMPool()
        sm = ml.alloc_smem(pool)
        pool.commit()
        rg = ml.alloc_regs()
        pages = T.alloc_local((max_boxes,), "int32")  # the TMA thread's page of each box of the next key tile

        if tid == 0:
            ml.init_barriers(sm)
        T.cuda.cta_sync()

        if wg == 0:
            producer_start()
            if tid == 0:
                fetch, load_k, load_v = kv_loaders(sm, k_map, v_map, pages, Table, b, hk, num_k, box_rows, PS, MP)
                fetch(n_begin)
                ml.produce_kv(sm, n_begin, n_end, load_k, load_v)
        else:
            cw, _, warp, lane = consumer_start(wg, tid)
            load_q(sm, Q, b, hk, group, p0, rows_total, cw, warp, lane)
            scale_log2 = softmax_scale * T.float32(softmax.LOG2E)
            mask_from = row_limits(rg, p0, group, Sq, num_k, causal, warp, lane)
            # A cache's slots past the sequence's length hold whatever was there: their V rows are cleared.
            ml.consume(sm, rg, n_begin, n_end, mask_from, cw, warp, lane, scale_log2, num_k, wait_q=False)
            Ow = T.decl_buffer((B * Sq * Hq * head_dim_v // 2,), "uint32", data=Out.data)
            Lf = T.decl_buffer((B * Hq * Sq,), "float32", data=LSE.data)
            for r in T.unroll(2):
                inv, lse_row = ml.finalize(rg, r, scale_log2)
                p = p0 + wgmma.acc_row(warp, lane, r)
                if p < rows_total:
                    i = p // group
                    h = hk * group + p % group
                    if num_splits == 1:
                        _store_row(ml, rg, r, lane, inv, lse_row, Ow, ((b * Sq + i) * Hq + h) * head_dim_v, Lf,
                                   (b * Hq + h) * Sq + i)
                    else:
                        _store_row(ml, rg, r, lane, inv, lse_row, OPart,
                                   (((split * B + b) * Sq + i) * Hq + h) * head_dim_v, LPart,
                                   ((split * B + b) * Hq + h) * Sq + i)

    return flash_attention4_decode


def _store_row(ml, rg, r, lane, inv, lse_row, o_buf, o_row, lse_buf, lse_index):
    """Row half ``r``'s normalised output row at element ``o_row`` of ``o_buf`` (16-bit pairs into a ``uint32``
    view, or fp32 partials) and its LSE (lane 0 of the quad) at ``lse_buf[lse_index]`` (flat)."""
    from tvm.script import tirx as T

    def write(col, lo, hi):
        if o_buf.dtype == "uint32":
            T.buffer_store(o_buf, ml.pack_pair(rg, lo, hi), [(o_row + col) // 2])
        else:
            T.buffer_store(o_buf, lo, [o_row + col])
            T.buffer_store(o_buf, hi, [o_row + col + 1])

    ml.store_o_pairs(rg, r, lane, inv, write)
    with T.If(lane % 4 == 0):
        with T.Then():
            T.buffer_store(lse_buf, lse_row, [lse_index])


def _add(x, y):
    return x + y


def build_combine_kernel(dtype: str):
    """Merge ``num_splits`` partial results: o_part [S, B, Sq, Hq, Dv] and lse_part [S, B, Hq, Sq] (fp32) into out
    [B, Sq, Hq, Dv] (``dtype``) and lse [B, Hq, Sq]; Dv (even, at most 256) and every size at run time."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import softmax

    pairs = MAX_HEAD_DIM_V // 64  # column pairs a lane may hold: columns 2 lane + 64 k
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]
    log2e, ln2 = T.float32(softmax.LOG2E), T.float32(math.log(2.0))
    full = T.uint32(0xFFFFFFFF)

    def warp_reduce(buf, k, op):
        """``buf[k]`` <- ``op`` over the warp (each step stored: a re-used expression would nest exponentially)."""
        for off in (16, 8, 4, 2, 1):
            T.buffer_store(buf, op(buf[k], T.cuda.__shfl_xor_sync(full, buf[k], off, 32)), [k])

    @T.prim_func
    def flash_attention4_combine(op_ptr: T.handle, lp_ptr: T.handle, o_ptr: T.handle, lse_ptr: T.handle):
        S = T.int32()
        B = T.int32()
        Sq = T.int32()
        Hq = T.int32()
        Dv = T.int32()
        OPart = T.match_buffer(op_ptr, (S, B, Sq, Hq, Dv), "float32", align=16)
        LPart = T.match_buffer(lp_ptr, (S, B, Hq, Sq), "float32")
        Out = T.match_buffer(o_ptr, (B, Sq, Hq, Dv), dtype, align=16)
        LSE = T.match_buffer(lse_ptr, (B, Hq, Sq), "float32")
        T.device_entry()
        bx = T.cta_id([(B * Sq * Hq + COMBINE_WARPS - 1) // COMBINE_WARPS])
        tid = T.thread_id([32 * COMBINE_WARPS])
        rows = B * Sq * Hq
        acc = T.alloc_local((2 * pairs,), "float32")
        st = T.alloc_local((4,), "float32")  # max, sum, final lse, weight
        packed = T.alloc_local((1,), "uint32")
        lane = tid % 32
        row = bx * COMBINE_WARPS + tid // 32
        if row < rows:
            h = row % Hq
            i = (row // Hq) % Sq
            b = row // (Hq * Sq)
            st[0] = T.float32(-math.inf)
            for s0 in range((S + 31) // 32):
                if s0 * 32 + lane < S:
                    st[0] = T.max(st[0], LPart[s0 * 32 + lane, b, h, i])
            warp_reduce(st, 0, T.max)
            st[1] = T.float32(0)
            if st[0] != T.float32(-math.inf):
                for s0 in range((S + 31) // 32):
                    if s0 * 32 + lane < S:
                        st[1] = st[1] + T.exp2((LPart[s0 * 32 + lane, b, h, i] - st[0]) * log2e)
            warp_reduce(st, 1, _add)
            st[2] = T.Select(st[1] > T.float32(0), st[0] + T.log2(st[1]) * ln2, T.float32(-math.inf))
            for k in T.unroll(2 * pairs):
                acc[k] = T.float32(0)
            if st[1] > T.float32(0):
                for s in range(S):
                    st[3] = T.exp2((LPart[s, b, h, i] - st[2]) * log2e)
                    for k in T.unroll(pairs):
                        if 2 * lane + 64 * k < Dv:
                            acc[2 * k] = acc[2 * k] + st[3] * OPart[s, b, i, h, 2 * lane + 64 * k]
                            acc[2 * k + 1] = acc[2 * k + 1] + st[3] * OPart[s, b, i, h, 2 * lane + 64 * k + 1]
            Ow = T.decl_buffer((B * Sq * Hq * Dv // 2,), "uint32", data=Out.data)
            for k in T.unroll(pairs):
                if 2 * lane + 64 * k < Dv:
                    T.evaluate(cvt_pack(packed[0], acc[2 * k + 1], acc[2 * k]))
                    Ow[(row * Dv + 2 * lane + 64 * k) // 2] = packed[0]
            if lane == 0:
                LSE[b, h, i] = st[2]

    return flash_attention4_combine
