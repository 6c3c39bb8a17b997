# SPDX-License-Identifier: Apache-2.0
"""The general rmsnorm kernel: H, the row strides and every pointer's alignment are runtime values, so one
artifact per dtype serves every call the specialized kernels (H a compile-time multiple of 8, 16-byte rows) do
not: odd H, H < 16 or > 16384, rows or a weight that do not start on 16 bytes.

Design: one CTA of ``threads`` (default 128) threads per row. A row is cut into *chunks* of 8 columns aligned to
x's 16-byte boundaries: chunk ``k`` covers columns ``8 k - ax ..+8``, where ``ax`` (0..7) is how many elements the
row starts past a 16-byte boundary (a per-row value: base pointer + row * stride). Every chunk wholly inside the
row is one 16-byte load; only the first and the last chunk of a row (the unaligned head and tail) take scalar
2-byte accesses. Thread ``t`` holds chunks ``s * threads * vectors + v * threads + t`` (``v < vectors``):
consecutive threads read consecutive 16 bytes.
- The weight's alignment relative to the row differs per row (``d = (aw - ax) mod 8``, uniform in a CTA):
  with ``d == 0`` a chunk's weight is one 16-byte load, otherwise the two aligned vectors around it, shifted
  by ``d`` elements in registers (selects and funnel shifts; no local memory).
- The output row's alignment ``ao`` equals ``ax`` for contiguous tensors (or any with the same row layout):
  then each full chunk is one 16-byte store. Where it differs (a CTA-uniform branch) every element is stored
  on its own: correct for any strides, slower, and only for unusual layouts.
- Rows of up to ``threads * vectors`` chunks (8185+ elements at the defaults) are read once and kept in
  registers (``vectors`` vectors a thread). Longer rows take two passes: the sum of squares over every slab, then
  each slab read again (L2 where the row's bytes are still resident, else DRAM) and scaled. Expected on an H100
  at 262144: about 2/3 of the copy bandwidth (~2-2.3 TB/s) when the re-read misses L2, not QuACK's ~3 TB/s (a
  row split over a cluster, reduced through DSMEM, read once); that is the next step for long rows.

Schedule knobs for odd H (issue 19: an odd H within 10 % of the nearest aligned one; tools/sweeps/odd_sizes.py times
them beside the specialized kernel; the defaults are the schedule above until the H100 says otherwise):
- ``edge_loads="vector"``: the head and tail chunks of x are one 16-byte load each (the aligned vector holding
  them lies in the row's first / last 16-byte block, so in mapped memory), the columns outside the row zeroed in
  registers; the weight's edge chunks are its two aligned vectors, shifted. "scalar": 2-byte loads, element by
  element.
- ``rows_per_cta`` R > 1: a CTA normalizes R rows, 8 rows apart (rows ``8 R g + p + 8 i`` for CTA ``8 g + p``),
  so contiguous rows of any H, whose misalignment repeats every 8 rows, give a CTA rows of one misalignment.
- ``weight_smem``: each thread keeps the weight of its chunks, shifted to the row's misalignment, in shared
  memory (16 bytes a chunk, read back by the thread that wrote it: no barrier) and re-stages it only when a row's
  misalignment differs from the previous row's; a one-pass row then reads its weight with one 16-byte shared load
  a chunk instead of two global vectors and the funnel shift. Rows longer than one pass read the weight as above.
"""

from __future__ import annotations

# Defaults (sweep knobs: compile params threads_per_row / vectors_per_thread / ctas_per_sm with schedule "general").
THREADS = 128
VECTORS = 8  # 16-byte vectors of x a thread holds: 32 registers; 128 x 8 x 8 = 8192 columns in one pass
# __launch_bounds__(128, n): rows in flight an SM. bf16 at 8 (<= 64 registers): 63, no spills; fp16 at 8 spilled 52 B
# (its conversions need a few more registers), at 7: 71 registers, no spills.
MIN_CTAS_PER_SM = {"bfloat16": 8, "float16": 7}
# x loads skip L1 (the weight, read by every CTA of an SM, stays there) and carry the specialized kernel's L2
# priorities (rmsnorm.ROW_ACCESS, measured): the first read evict_last (a long row's second read, evict_first,
# then finds it in L2 more often; H <= 7168 gained 2-4 % with it).
X_POLICIES = {"x": "evict_last", "reload": "evict_first"}
# The odd-H knobs' defaults (the schedule measured so far; tools/sweeps/odd_sizes.py times the others).
EDGE_LOADS = ("scalar", "vector")
DEFAULT_EDGE_LOADS = "scalar"
ROWS_PER_CTA = 1
WEIGHT_SMEM = False
_VEC = 8
_WORDS = 4


def build_general(dtype: str, pdl: str | None = None, threads: int = THREADS, vectors: int = VECTORS,
                  ctas_per_sm: int | None = None, edge_loads: str = DEFAULT_EDGE_LOADS,
                  rows_per_cta: int = ROWS_PER_CTA, weight_smem: bool = WEIGHT_SMEM):
    """The general kernel (same arguments as the specialized one: ``x, weight, out, eps, zero``): CTAs of
    ``threads`` threads (a multiple of 32), ``vectors`` 16-byte vectors of x a thread per pass, launch bounds
    promising ``ctas_per_sm`` CTAs an SM (default ``MIN_CTAS_PER_SM``); ``edge_loads``, ``rows_per_cta`` and
    ``weight_smem``: the odd-H knobs of the module docstring."""
    if threads % 32 or not 32 <= threads <= 1024 or vectors < 1:
        raise ValueError(f"rmsnorm general: threads {threads} (a multiple of 32 in [32, 1024]), vectors {vectors}")
    if edge_loads not in EDGE_LOADS or not 1 <= rows_per_cta <= 64:
        raise ValueError(f"rmsnorm general: edge_loads {edge_loads!r} (one of {EDGE_LOADS}), rows_per_cta "
                         f"{rows_per_cta} (1..64)")
    ctas_per_sm = ctas_per_sm or MIN_CTAS_PER_SM[dtype]
    slab = threads * vectors  # chunks per pass over a long row
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, rowwise, vector

    from .rmsnorm import _sum_squares

    pdl_launch.check_trigger("rmsnorm", pdl)
    scratch_len = reduce.scratch_words(threads, 1)
    # Several rows a CTA: group_sum alternates between two halves of its scratch (one barrier a row).
    scratch_alloc = scratch_len if rows_per_cta == 1 else 2 * max(1, scratch_len)
    access = vector.AccessPolicies("rmsnorm", X_POLICIES)

    def as_u16(value):
        return T.Cast("uint32", T.reinterpret("uint16", value))

    def load_scalars(regs, base, buf, row_base, c0, H):  # noqa: N803
        """``regs[base:+4]`` <- columns ``c0..c0+8`` of a row element by element, 0 past either end."""
        vector.fill(regs, base, _WORDS)
        for e in range(_VEC):
            with T.If(T.And(c0 + e >= 0, c0 + e < H)):
                with T.Then():
                    word = regs[base + e // 2] | (as_u16(buf[row_base + c0 + e]) << T.uint32(16 * (e % 2)))
                    T.buffer_store(regs, word, [base + e // 2])

    def mask_outside(regs, base, c0, H):  # noqa: N803
        """Zero the columns of the chunk at ``c0`` that lie outside the row (a head or tail loaded whole)."""
        for j in range(_WORDS):
            lo = T.if_then_else(T.And(c0 + 2 * j >= 0, c0 + 2 * j < H), T.uint32(0xFFFF), T.uint32(0))
            hi = T.if_then_else(T.And(c0 + 2 * j + 1 >= 0, c0 + 2 * j + 1 < H), T.uint32(0xFFFF0000), T.uint32(0))
            T.buffer_store(regs, regs[base + j] & (lo | hi), [base + j])

    def load_chunk(regs, base, buf, row_base, c0, H, policy=None):  # noqa: N803
        """One 16-byte load when the chunk lies inside the row (the middle of a row), else scalars (or, with
        vector edges, the whole aligned vector, masked)."""
        if edge_loads == "vector":
            vector.load_v4(regs, base, buf.ptr_to([row_base + c0]), cache="stream", policy=policy)
            with T.If(full(c0, H)):
                with T.Then():
                    T.evaluate(0)
                with T.Else():
                    mask_outside(regs, base, c0, H)
            return
        with T.If(full(c0, H)):
            with T.Then():
                vector.load_v4(regs, base, buf.ptr_to([row_base + c0]), cache="stream", policy=policy)
            with T.Else():
                load_scalars(regs, base, buf, row_base, c0, H)

    def load_weight(wr, wn, sw, Wt, c0, d, H):  # noqa: N803
        """``wr[0:4]`` <- weight columns ``c0..c0+8``: one 16-byte load if the weight is aligned like x
        (``d == 0``), else the two aligned vectors that hold the chunk, shifted down by ``d`` elements (with
        vector edges also at the row's ends: each vector only where it holds a weight element)."""
        if edge_loads == "vector":
            with T.If(T.And(full(c0, H), d == 0)):
                with T.Then():
                    vector.load_v4(wr, 0, Wt.ptr_to([c0]))
                with T.Else():
                    vector.load_v4(wn, 0, Wt.ptr_to([c0 - d]), c0 - d + _VEC > 0)
                    vector.load_v4(wn, _WORDS, Wt.ptr_to([c0 - d + _VEC]), T.And(d > 0, c0 - d + _VEC < H))
                    rowwise.shift_down(wr, wn, sw, d)
            return
        with T.If(T.And(full(c0, H), d == 0)):
            with T.Then():
                vector.load_v4(wr, 0, Wt.ptr_to([c0]))
            with T.Else():
                with T.If(full(c0, H)):
                    with T.Then():
                        vector.load_v4(wn, 0, Wt.ptr_to([c0 - d]))
                        vector.load_v4(wn, _WORDS, Wt.ptr_to([c0 - d + _VEC]))
                        q = d >> 1
                        picked = [T.if_then_else(q == 0, wn[i], T.if_then_else(
                            q == 1, wn[i + 1], T.if_then_else(q == 2, wn[i + 2], wn[i + 3]))) for i in range(5)]
                        for i in range(_WORDS):
                            odd = (picked[i] >> T.uint32(16)) | (picked[i + 1] << T.uint32(16))
                            T.buffer_store(wr, T.if_then_else((d & 1) == 1, odd, picked[i]), [i])
                    with T.Else():
                        load_scalars(wr, 0, Wt, 0, c0, H)

    def store_chunk(Yf, row_base, c0, H, orr, vector_ok):  # noqa: N803
        """16 bytes where the chunk is inside the row and out is aligned like x, else element by element."""
        with T.If(vector_ok):
            with T.Then():
                vector.store_v4(Yf.ptr_to([row_base + c0]), orr, 0)
            with T.Else():
                rowwise.store_elements(Yf, row_base, c0, H, orr, dtype)

    def chunk(s, v, tid):
        return s * slab + v * threads + tid

    full = rowwise.chunk_inside

    def load_slab(xr, Xf, x_base, s, tid, ax, chunks, H, policy):  # noqa: N803
        for v in range(vectors):
            with T.If(chunk(s, v, tid) < chunks):
                with T.Then():
                    load_chunk(xr, v * _WORDS, Xf, x_base, (chunk(s, v, tid) << 3) - ax, H, policy)
                with T.Else():
                    vector.fill(xr, v * _WORDS, _WORDS)

    def stage_weight(wsm, Wt, tid, ax, d, chunks, H, wr, wn, sw):  # noqa: N803
        """The weight of the thread's chunks of a one-pass row, shifted to the row's misalignment, into its
        16-byte slots of ``wsm`` (slot = chunk index; only this thread reads them back)."""
        for v in range(vectors):
            with T.If(chunk(0, v, tid) < chunks):
                with T.Then():
                    load_weight(wr, wn, sw, Wt, (chunk(0, v, tid) << 3) - ax, d, H)
                    for j in range(_WORDS):
                        T.buffer_store(wsm, wr[j], [chunk(0, v, tid) * _WORDS + j])

    def scale_store_slab(Yf, y_base, Wt, s, tid, ax, ao, d, chunks, H, xr, wr, wn, sw, orr, rs,  # noqa: N803
                         wsm=None):
        """Pass 2 over slab ``s``; ``wsm``: the weight from the thread's shared-memory slots (a one-pass row)."""
        for v in range(vectors):
            with T.If(chunk(s, v, tid) < chunks):
                with T.Then():
                    c0 = (chunk(s, v, tid) << 3) - ax
                    if wsm is None:
                        load_weight(wr, wn, sw, Wt, c0, d, H)
                    else:
                        for j in range(_WORDS):
                            T.buffer_store(wr, wsm[chunk(s, v, tid) * _WORDS + j], [j])
                    for j in range(_WORDS):
                        x_lo, x_hi = vector.unpack2(xr[v * _WORDS + j], dtype)
                        w_lo, w_hi = vector.unpack2(wr[j], dtype)
                        vector.pack2(orr, j, x_lo * rs * w_lo, x_hi * rs * w_hi, dtype)
                    store_chunk(Yf, y_base, c0, H, orr, T.And(full(c0, H), ao == ax))

    # Rows of a CTA: CTA 8 g + p takes rows 8 R g + p + 8 i (i < R), 64-bit (the last group may pass 2**31).
    group = 8 * rows_per_cta

    def cta_count(M):  # noqa: N803
        return M if rows_per_cta == 1 else ((M - 1) // group + 1) * 8

    def row_of(cta, i):
        if rows_per_cta == 1:
            return cta
        return T.Cast("int64", cta >> 3) * group + T.Cast("int64", (cta & 7) + 8 * i)

    def row_exists(row, M):  # noqa: N803
        return row < M if rows_per_cta == 1 else row < T.Cast("int64", M)

    wsm_len = slab * _WORDS if weight_smem else 1

    @T.prim_func
    def rmsnorm(x_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, eps: T.float32, zero: T.int32):
        M = T.int32()
        H = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=2)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=2)
        Y = T.match_buffer(y_ptr, (M, H), dtype, strides=(y_stride, 1), align=2)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas_per_sm})
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([cta_count(M)])
        tid = T.thread_id([threads])
        xr = T.alloc_local((vectors * _WORDS,), "uint32")
        wr = T.alloc_local((_WORDS,), "uint32")
        wn = T.alloc_local((2 * _WORDS,), "uint32")
        sw = T.alloc_local((6,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        acc = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((scratch_alloc,), "float32")
        wsm = T.alloc_shared((wsm_len,), "uint32")
        staged = T.alloc_local((1,), "int32")
        pol = T.alloc_local((access.count,), "uint64")
        access.create(pol)
        pdl_launch.begin(pdl)
        staged[0] = -1  # the misalignment whose shifted weight wsm holds (weight_smem), none yet

        for i in T.serial(rows_per_cta):
            row = row_of(cta, i)
            if row_exists(row, M):  # CTA-uniform
                # Row geometry: the chunks are aligned to x's 16-byte boundaries (64-bit row offsets).
                x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
                y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
                ax = rowwise.row_misalign(X.data, x_base)
                ao = rowwise.row_misalign(Y.data, y_base)
                d = (rowwise.misalign(Wt.data) - ax) & 7  # elements a chunk's weight lies past a 16-byte boundary
                chunks = (H + ax + 7) >> 3
                slabs = (chunks + slab - 1) // slab

                # Pass 1: sum of squares in fp32 (a one-slab row stays in xr for pass 2).
                acc[0] = T.float32(0)
                for s in T.serial(slabs):
                    load_slab(xr, Xf, x_base, s, tid, ax, chunks, H, access.operand(pol, "x"))
                    acc[0] = acc[0] + T.cuda.uint_as_float(vector.after_all(xr, vectors * _WORDS, zero))
                    _sum_squares(acc, xr, vectors * _WORDS, dtype)
                total = reduce.group_sum(acc[0], tid, threads, scratch, (i & 1) * scratch_len)
                rs = T.rsqrt(total * (T.float32(1) / T.Cast("float32", H)) + eps)

                # Pass 2: out = x * rs * w, rounded once (longer rows read their slab again).
                if weight_smem:
                    if slabs == 1:
                        if staged[0] != ax:
                            stage_weight(wsm, Wt, tid, ax, d, chunks, H, wr, wn, sw)
                            staged[0] = ax
                        scale_store_slab(Yf, y_base, Wt, 0, tid, ax, ao, d, chunks, H, xr, wr, wn, sw, orr, rs,
                                         wsm)
                    else:
                        for s in T.serial(slabs):
                            load_slab(xr, Xf, x_base, s, tid, ax, chunks, H, access.operand(pol, "reload"))
                            scale_store_slab(Yf, y_base, Wt, s, tid, ax, ao, d, chunks, H, xr, wr, wn, sw, orr, rs)
                else:
                    for s in T.serial(slabs):
                        if slabs > 1:
                            load_slab(xr, Xf, x_base, s, tid, ax, chunks, H, access.operand(pol, "reload"))
                        scale_store_slab(Yf, y_base, Wt, s, tid, ax, ao, d, chunks, H, xr, wr, wn, sw, orr, rs)
        pdl_launch.end(pdl)

    return pdl_launch.launch(rmsnorm, pdl)
