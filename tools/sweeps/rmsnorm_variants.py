# SPDX-License-Identifier: Apache-2.0
"""rmsnorm's sweep-only schedules, out of the product module (issue 20: the variants that lost leave it):

- "persistent": ``min(M, ctas_per_sm * NUM_SMS)`` CTAs, one row of ``threads_per_row`` threads at a time, rows
  strided by the grid; the weight loaded once per CTA, and with ``pipeline`` the next row's x loaded before the
  current row is reduced and stored (``build_kernel_persistent``; sweep rounds 1-2, 4-5: no gain).
- "bulk": persistent CTAs fed by a ring of ``stages`` shared-memory row buffers filled with 1-D TMA bulk copies,
  output from registers (``out="reg"``) or bulk-stored from the stage (``out="bulk"``) (``build_kernel_bulk``;
  round 7: lost 2-9 %, ties at small rows).

A kernel module for tools/sweep_variants.py and the build tests: ``compile_params`` / ``get_kernel`` /
``sass_expect`` take these schedules (compile params ``schedule``, ``pipeline``, ``stages``, ``out``, ``x_regs``,
``load_hint``) and pass every other one to ``tirx_kernels.norm.rmsnorm``.
"""

from __future__ import annotations

from tirx_kernels.norm import rmsnorm as product
from tirx_kernels.norm.rmsnorm import _VEC, MAX_H, MIN_H, _col_pred, _scale_vector, _sum_squares

SCHEDULES = ("persistent", "bulk")
KEYS = ("pipeline", "stages", "out", "x_regs", "load_hint")
NUM_SMS = 132  # H200 SXM


def compile_params(**cfg) -> dict:
    """The product's params, plus this module's keys for its schedules."""
    params = product.compile_params(**cfg)
    if cfg.get("schedule") in SCHEDULES:
        params.update({k: cfg[k] for k in KEYS if k in cfg})
    return params


def get_kernel(dtype: str, H: int | None = None, schedule: str = "row", threads_per_row: int | None = None,
               ctas_per_sm: int | None = None, store_cache: str = "default", load_cache: str | None = None,
               pipeline: bool = True, stages: int = 2, out: str = "reg", x_regs: bool = False,
               load_hint: str | None = None, **kw):
    """The kernel of a sweep-only schedule; any other schedule is the product's ``get_kernel``."""
    if schedule not in SCHEDULES:
        return product.get_kernel(dtype, H, schedule=schedule, threads_per_row=threads_per_row,
                                  ctas_per_sm=ctas_per_sm, store_cache=store_cache, load_cache=load_cache, **kw)
    if dtype not in product._DTYPES:
        raise ValueError(f"rmsnorm: dtype {dtype!r} is not one of {sorted(product._DTYPES)}")
    if H % _VEC or not MIN_H <= H <= MAX_H:
        raise ValueError(f"rmsnorm: H={H} must be a multiple of {_VEC} in [{MIN_H}, {MAX_H}]")
    if schedule == "bulk":
        return build_kernel_bulk(dtype, H, stages, ctas_per_sm, out, threads_per_row, x_regs, load_hint=load_hint,
                                 store_cache=store_cache)
    tpr = threads_per_row or product.row_plan(H)["threads_per_row"]
    return build_kernel_persistent(dtype, H, tpr, ctas_per_sm or 2, pipeline, store_cache,
                                   load_cache=load_cache or product.x_load_cache(H))


def sass_expect(dtype: str, H: int | None = None, schedule: str = "row", out: str = "reg", **kw) -> list[str]:
    """For "bulk": the bulk copies (``UBLKCP.S.G`` global->shared, ``UBLKCP.G.S`` shared->global), mbarrier
    waits, 16-byte smem accesses and the weight's 16-byte global loads; else the product's."""
    if schedule == "bulk":
        stores = [r"STG\.E\.128"] if out == "reg" else [r"STS\.128", r"UBLKCP\.G\.S "]
        return [r"UBLKCP\.S\.G ", r"SYNCS\.PHASECHK\.TRANS64", r"LDS\.128", r"LDG\.E\.128", *stores]
    return product.sass_expect(dtype, H, schedule=schedule, **kw)


def build_kernel_persistent(dtype: str, H: int, threads_per_row: int, ctas_per_sm: int, pipeline: bool = True,
                            store_cache: str = "default", num_sms: int = NUM_SMS, load_cache: str = "stream"):
    """Persistent rows: ``min(M, ctas_per_sm * num_sms)`` CTAs of ``threads_per_row`` threads (a multiple
    of 32), CTA ``c`` doing rows ``c, c + grid, ...``. The weight is loaded into registers once per CTA.
    With ``pipeline`` the x of the next row goes into a second register set before the current row's sum
    of squares, barrier and stores (its loads cannot sink below the barrier nor, being plain ``ld.global``,
    below the stores), then moves into the first set; the shared partials alternate between two halves so
    that one barrier per row suffices. ``__launch_bounds__(threads, ctas_per_sm)`` caps the registers so
    that the whole grid is resident.
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import reduce, vector

    tpr = threads_per_row
    if tpr % 32:
        raise ValueError(f"rmsnorm persistent: threads_per_row {tpr} must be a multiple of 32")
    vpt = vector.ceil_div(H // _VEC, tpr)
    words = vector.WORDS_PER_VECTOR
    half = max(1, reduce.scratch_words(tpr, 1))
    max_grid = ctas_per_sm * num_sms
    inv_h = 1.0 / H

    def load_row(regs, buf, base, lane, row_ok, cache):
        for v in range(vpt):
            pred = _col_pred(v, lane, tpr, H)
            if pred is not None:
                vector.fill(regs, v * words, words)
            if row_ok is not None:
                pred = row_ok if pred is None else T.And(row_ok, pred)
            vector.load_v4(regs, v * words, buf.ptr_to([base + (v * tpr + lane) * _VEC]), pred, cache=cache)

    def scale_store(buf, base, lane, xr, wr, orr, rs):
        for v in range(vpt):
            _scale_vector(orr, xr, wr, v, rs, dtype)
            vector.store_v4(buf.ptr_to([base + (v * tpr + lane) * _VEC]), orr, 0, _col_pred(v, lane, tpr, H),
                            cache=store_cache)

    @T.prim_func
    def rmsnorm(x_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, eps: T.float32, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=16)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (M, H), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas_per_sm})
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([T.min(M, max_grid)])
        tid = T.thread_id([tpr])
        xr = T.alloc_local((vpt * words,), "uint32")
        xn = T.alloc_local((vpt * words,), "uint32")
        wr = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        acc = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((2 * half,), "float32")
        grid = T.min(M, max_grid)
        load_row(wr, Wt, 0, tid, None, "default")
        if pipeline:
            load_row(xr, Xf, T.Cast("int64", cta) * T.Cast("int64", x_stride), tid, None, load_cache)
        for it in range((M - 1 - cta) // grid + 1):
            row = cta + it * grid
            if pipeline:
                nrow = row + grid
                load_row(xn, Xf, T.Cast("int64", nrow) * T.Cast("int64", x_stride), tid, nrow < M, load_cache)
            else:
                load_row(xr, Xf, T.Cast("int64", row) * T.Cast("int64", x_stride), tid, None, load_cache)
            acc[0] = T.cuda.uint_as_float(vector.after_all(wr, vpt * words, zero))  # 0.0, after the weight
            _sum_squares(acc, xr, vpt * words, dtype)
            total = reduce.group_sum(acc[0], tid, tpr, scratch, (it % 2) * half)
            rs = T.rsqrt(total * T.float32(inv_h) + eps)
            scale_store(Yf, T.Cast("int64", row) * T.Cast("int64", y_stride), tid, xr, wr, orr, rs)
            if pipeline:
                vector.copy(xr, xn, vpt * words)

    return rmsnorm


# "bulk" schedule: persistent CTAs stream whole rows of x into a ring of shared-memory stages with 1-D TMA bulk
# copies (``core.lang.bulk``: one instruction per row, issued by one thread, completing on the stage's full
# mbarrier), so the bytes in flight per SM are bounded by shared memory (stages x row bytes x CTAs), not by
# registers. Sweep round 7: lost 2-9 % to "row" except ties at the small-row shapes.
BULK_OUTS = ("reg", "bulk")
BULK_VECTORS_PER_THREAD = 4
SMEM_PER_CTA = 232448  # 227 KB: the most one CTA may use on the H200
SMEM_PER_SM = 233472  # 228 KB: what the CTAs of one SM share, 1 KB of it reserved per CTA by the driver
SMEM_RESERVED_PER_CTA = 1024
MAX_THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32
BULK_THREADS_PER_SM = 1024  # default residency: 64 registers a thread (x and weight vectors + addressing)


def bulk_plan(H: int, stages: int, ctas_per_sm: int | None = None, out: str = "reg",
              threads_per_row: int | None = None, x_regs: bool = False) -> dict:
    """Threads, vectors per thread, refill lag and shared memory of the "bulk" schedule (ValueError if it
    cannot run); see ``build_kernel_bulk``.

    ``threads_per_row`` defaults to whole warps of ~4 vectors each (8192 -> 256, 7168 -> 224, 5120 -> 160,
    4096 -> 128); ``ctas_per_sm`` to as many as shared memory holds up to 1024 threads an SM (8192 -> 4).
    """
    row_bytes = H * 2
    if H <= 0 or row_bytes % 16:
        raise ValueError(f"rmsnorm bulk: a row of H={H} 16-bit elements is {row_bytes} B, not a positive multiple "
                         "of 16 B (cp.async.bulk copies 16-byte multiples between 16-byte aligned addresses)")
    if out not in BULK_OUTS:
        raise ValueError(f"rmsnorm bulk: out {out!r} is not one of {BULK_OUTS}")
    lag = 0 if out == "reg" and x_regs else 1
    if stages < lag + 1:
        why = "refills a stage one row late and " if lag else ""
        raise ValueError(f"rmsnorm bulk: out={out!r}, x_regs={x_regs} {why}needs at least {lag + 1} stage(s), "
                         f"got {stages}")
    nvec = H // _VEC
    tpr = threads_per_row or 32 * -(-nvec // (32 * BULK_VECTORS_PER_THREAD))
    if tpr % 32 or not 32 <= tpr <= 1024:
        raise ValueError(f"rmsnorm bulk: threads_per_row {tpr} must be a multiple of 32 in [32, 1024]")
    smem = stages * row_bytes + 8 * stages + 4 * 2 * (tpr // 32)  # ring, full barriers, 2 x the warps' partials
    if smem > SMEM_PER_CTA:
        raise ValueError(f"rmsnorm bulk: {stages} stages of H={H} ({smem} B of shared memory) exceed the "
                         f"{SMEM_PER_CTA} B a CTA may use")
    fit = min(SMEM_PER_SM // (smem + SMEM_RESERVED_PER_CTA), MAX_THREADS_PER_SM // tpr, MAX_CTAS_PER_SM)
    ctas = ctas_per_sm or max(1, min(fit, BULK_THREADS_PER_SM // tpr))
    if not 1 <= ctas <= fit:
        raise ValueError(f"rmsnorm bulk: {ctas} CTAs/SM of {stages} x {row_bytes} B stages and {tpr} threads do "
                         f"not fit one SM (at most {fit}: {SMEM_PER_SM} B of shared memory incl. "
                         f"{SMEM_RESERVED_PER_CTA} B reserved per CTA, {MAX_THREADS_PER_SM} threads, "
                         f"{MAX_CTAS_PER_SM} CTAs)")
    return {"threads_per_row": tpr, "vectors_per_thread": -(-nvec // tpr), "ctas_per_sm": ctas, "lag": lag,
            "row_bytes": row_bytes, "smem_bytes": smem}


def build_kernel_bulk(dtype: str, H: int, stages: int, ctas_per_sm: int | None = None, out: str = "reg",
                      threads_per_row: int | None = None, x_regs: bool = False, num_sms: int = NUM_SMS,
                      load_hint: str | None = None, store_cache: str = "default"):
    """Persistent CTAs (``min(M, ctas_per_sm * num_sms)``, one row of ``threads_per_row`` threads at a time,
    rows ``cta, cta + grid, ...``) fed by a ring of ``stages`` row buffers in shared memory.

    Row ``k`` of a CTA is use ``k`` of the ring: stage ``k % stages``, loaded by thread 0 with one bulk copy
    after ``arrive_expect_tx(full[stage], row bytes)``; the first ``stages`` rows are issued up front. Every
    thread waits on ``full[stage]`` with parity ``(k // stages) % 2``, reads its vectors with ``ld.shared``
    (vector ``v`` of thread ``t`` at columns ``(v * tpr + t) * 8``: a warp reads 512 contiguous bytes,
    conflict-free), sums their squares, and reduces across the CTA (``reduce.group_sum``: one barrier, B1;
    the shared partials alternate between two halves so that one barrier a row suffices). The weight is
    loaded into registers once per CTA. After B1 each thread scales its vectors, read again from the stage
    (or kept in registers from the first pass with ``x_regs``, +16 registers at 4 vectors a thread), and

    - ``out="reg"``: stores them with 16-byte ``st.global``;
    - ``out="bulk"``: writes them back into the stage positions it read (no other thread touches those),
      ``fence.proxy.async``, arrives on named barrier 1 (B2: warp 0 waits there, the other warps go on) and
      thread 0 bulk-stores the row and commits its bulk group.

    Refill: a stage may be loaded again once no thread reads it any more and, with ``out="bulk"``, once its
    store has read it. With ``out="reg"`` and ``x_regs`` nobody reads the stage after B1 of its row, so
    thread 0 refills it right there with row ``k + stages`` (``lag`` 0: loads run ``stages`` rows ahead).
    Otherwise the second pass (or the bulk store) still uses it after B1: thread 0 refills the stage of row
    ``k - 1`` after B1 of row ``k`` (every thread has finished row ``k - 1`` by then), with ``out="bulk"``
    after ``wait_read(0)`` on the store of row ``k - 1``, issued a row of work earlier (``lag`` 1: loads run
    ``stages - 1`` rows ahead, so ``stages >= 2``).

    Phases: ``full[s]`` completes one phase per row it holds. A stage's next load is issued after B1 of row
    ``k + lag``, which every thread reaches only after it has waited for row ``k``: no thread can still be
    waiting for a phase when the barrier completes the next one, so the parity wait is unambiguous. Only rows
    ``< M`` are loaded (``k + stages < rows`` of this CTA) or stored; every load issued is waited for; thread
    0 drains its stores (``wait_read``) before the CTA exits. ``load_hint``: an L2 priority for the x loads
    (``bulk.EVICT_FIRST`` ...).
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import bulk, cluster, mbarrier, reduce, vector

    plan = bulk_plan(H, stages, ctas_per_sm, out, threads_per_row, x_regs)
    tpr, vpt, ctas, lag = plan["threads_per_row"], plan["vectors_per_thread"], plan["ctas_per_sm"], plan["lag"]
    row_bytes = plan["row_bytes"]
    words = vector.WORDS_PER_VECTOR
    half = max(1, reduce.scratch_words(tpr, 1))
    max_grid = ctas * num_sms
    inv_h = 1.0 / H
    if load_hint not in (None, bulk.EVICT_FIRST, bulk.EVICT_NORMAL, bulk.EVICT_LAST):
        raise ValueError(f"rmsnorm bulk: load_hint {load_hint!r}")

    def fill(ring, full, Xf, stage, row, x_stride, pol):  # noqa: N803
        """Thread 0: announce and issue the bulk load of ``row`` into ``stage``."""
        mbarrier.arrive_expect_tx(full.ptr_to([stage]), row_bytes)
        bulk.load(ring.ptr_to([stage * H]), Xf.ptr_to([T.Cast("int64", row) * T.Cast("int64", x_stride)]), row_bytes,
                  full.ptr_to([stage]), cache_policy=None if load_hint is None else pol[0])

    def load_weight(wr, Wt, lane):  # noqa: N803
        for v in range(vpt):
            pred = _col_pred(v, lane, tpr, H)
            if pred is not None:
                vector.fill(wr, v * words, words)
            vector.load_v4(wr, v * words, Wt.ptr_to([(v * tpr + lane) * _VEC]), pred, cache="default")

    def read_vector(ring, stage, lane, xr, v):
        """Vector ``v`` of this thread from ``stage`` into ``xr`` (its own slot with ``x_regs``, else slot 0);
        a vector past H reads as 0."""
        base = v * words if x_regs else 0
        pred = _col_pred(v, lane, tpr, H)
        if pred is not None:
            vector.fill(xr, base, words)
        vector.load_shared_v4(xr, base, ring.ptr_to([stage * H + (v * tpr + lane) * _VEC]), pred)
        return base

    def sum_squares(ring, stage, lane, xr, acc):
        for v in range(vpt):
            _sum_squares(acc, xr, words, dtype, read_vector(ring, stage, lane, xr, v))

    def scale_out(ring, stage, Yf, y_base, lane, xr, wr, orr, rs):  # noqa: N803
        """x * rs * w of every vector of this thread to global (``out="reg"``) or back into the stage."""
        for v in range(vpt):
            if not x_regs:
                read_vector(ring, stage, lane, xr, v)
            _scale_vector(orr, xr, wr, v, rs, dtype, x_base=0 if not x_regs else None)
            pred = _col_pred(v, lane, tpr, H)
            if out == "reg":
                vector.store_v4(Yf.ptr_to([y_base + (v * tpr + lane) * _VEC]), orr, 0, pred, cache=store_cache)
            else:
                vector.store_shared_v4(ring.ptr_to([stage * H + (v * tpr + lane) * _VEC]), orr, 0, pred)

    @T.prim_func
    def rmsnorm(x_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, eps: T.float32, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=16)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (M, H), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas})
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([T.min(M, max_grid)])
        tid = T.thread_id([tpr])
        pool = T.SMEMPool()  # everything in the one dynamic pool (no static __shared__)
        ring = pool.alloc((stages * H,), dtype, align=128)
        full = pool.alloc((stages,), "uint64", align=8)
        scratch = pool.alloc((2 * half,), "float32", align=16)
        pool.commit()
        xr = T.alloc_local(((vpt if x_regs else 1) * words,), "uint32")
        wr = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        acc = T.alloc_local((1,), "float32")
        pol = T.alloc_local((1,), "uint64")
        grid = T.min(M, max_grid)
        rows = (M - 1 - cta) // grid + 1  # rows of this CTA (>= 1: grid <= M)

        if tid == 0:
            for s in T.unroll(stages):
                mbarrier.init(full.ptr_to([s]), 1)  # one arrival (thread 0's expect_tx) + the row's bytes
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if tid == 0:
            if load_hint is not None:
                bulk.create_policy(pol[0], load_hint)
            for s in T.unroll(stages):
                if s < rows:
                    fill(ring, full, Xf, s, cta + s * grid, x_stride, pol)
        load_weight(wr, Wt, tid)  # once per CTA, into registers (overlapping the first rows' bulk loads)

        for k in T.serial(rows):
            row = cta + k * grid
            mbarrier.wait(full.ptr_to([mbarrier.stage(k, stages)]), mbarrier.phase(k, stages))
            acc[0] = T.cuda.uint_as_float(vector.after_all(wr, vpt * words, zero))  # 0.0, after the weight
            sum_squares(ring, mbarrier.stage(k, stages), tid, xr, acc)
            total = reduce.group_sum(acc[0], tid, tpr, scratch, (k % 2) * half)  # B1 (a CTA barrier if tpr > 32)
            if tpr == 32:
                T.cuda.cta_sync()  # one warp: group_sum is shuffles only, B1 must still order the reads
            rs = T.rsqrt(total * T.float32(inv_h) + eps)
            if tid == 0:  # refill (see the docstring): stage of row k - lag with row k - lag + stages
                if lag == 0:
                    if k + stages < rows:
                        fill(ring, full, Xf, mbarrier.stage(k, stages), row + stages * grid, x_stride, pol)
                else:
                    if k >= 1:
                        if out == "bulk":
                            bulk.wait_read(0)  # the store of row k - 1 has read its stage
                        if k - 1 + stages < rows:
                            fill(ring, full, Xf, mbarrier.stage(k - 1, stages), row + (stages - 1) * grid, x_stride,
                                 pol)
            scale_out(ring, mbarrier.stage(k, stages), Yf, T.Cast("int64", row) * T.Cast("int64", y_stride), tid, xr,
                      wr, orr, rs)
            if out == "bulk":
                bulk.fence_proxy_async()  # this thread's st.shared -> visible to the bulk store (async proxy)
                if tid < 32:
                    cluster.named_sync(1, tpr)  # B2: every thread's vectors are written and fenced
                    if tid == 0:
                        bulk.store(Yf.ptr_to([T.Cast("int64", row) * T.Cast("int64", y_stride)]),
                                   ring.ptr_to([mbarrier.stage(k, stages) * H]), row_bytes)
                        bulk.commit()
                else:
                    cluster.named_arrive(1, tpr)
        if out == "bulk":
            if tid == 0:
                bulk.wait_read(0)  # the last stores have read their stages before the CTA (and its smem) exits

    return rmsnorm
