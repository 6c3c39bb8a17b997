# SPDX-License-Identifier: Apache-2.0
"""act_and_mul's sweep-only schedules, out of the product module (issue 20: the variants that lost leave it):

- "persistent": grid ``min(tiles, ctas_per_sm * NUM_SMS)``, tiles strided by the grid; with ``pipeline`` the
  next tile's loads are issued before the current tile's math and stores (``build_kernel_persistent``).
- "bulk": persistent CTAs, (row, column chunk) tiles bulk-copied into a shared-memory ring by a producer warp
  (``build_kernel_bulk``; its keys ``chunk``, ``stages``, ``out``, ``load_hint``, and ``vectors_per_thread``;
  sweep round 7: lost 2-9 %, ties at small rows).

A kernel module for tools/sweep_variants.py and the build tests: ``compile_params`` / ``get_kernel`` /
``sass_expect`` take these schedules and pass every other one to
``tirx_kernels.ported.flashinfer.activation.act_and_mul``.
"""

from __future__ import annotations

from tirx_kernels.ported.flashinfer.activation import act_and_mul as product
from tirx_kernels.ported.flashinfer.activation.act_and_mul import _VEC, LOAD_CACHE, _act_vector

SCHEDULES = ("persistent", "bulk")
BULK_KEYS = ("chunk", "stages", "out", "load_hint")
KEYS = ("pipeline", *BULK_KEYS)
NUM_SMS = 132  # H200 SXM


def compile_params(**cfg) -> dict:
    """The product's params, plus this module's keys for its schedules."""
    params = product.compile_params(**cfg)
    if cfg.get("schedule") in SCHEDULES:
        params.update({k: cfg[k] for k in KEYS if k in cfg})
    return params


def get_kernel(act: str, dtype: str, d: int | None = None, schedule: str = "tile", ctas_per_sm: int | None = None,
               pipeline: bool = True, store_cache: str = "default", load_cache: str = LOAD_CACHE, **tiling):
    """The kernel of a sweep-only schedule (``tiling``: ``product.TILE_KEYS`` for "persistent", ``BULK_KEYS`` and
    ``vectors_per_thread`` for "bulk"); any other schedule is the product's ``get_kernel``."""
    if schedule not in SCHEDULES:
        return product.get_kernel(act, dtype, d, schedule=schedule, ctas_per_sm=ctas_per_sm, store_cache=store_cache,
                                  load_cache=load_cache, **tiling)
    if act not in product.ACTS or dtype not in product._DTYPES:
        raise ValueError(f"act_and_mul: act {act!r} / dtype {dtype!r}")
    if d is None or d % _VEC or d <= 0:
        raise ValueError(f"act_and_mul: d={d} must be a positive multiple of {_VEC}")
    if schedule == "bulk":
        unknown = set(tiling) - {*BULK_KEYS, "vectors_per_thread"}
        if unknown:
            raise ValueError(f"act_and_mul: unknown compile params for schedule 'bulk': {sorted(unknown)}")
        return build_kernel_bulk(act, dtype, d, ctas_per_sm=ctas_per_sm, store_cache=store_cache, **tiling)
    unknown = set(tiling) - set(product.TILE_KEYS)
    if unknown:
        raise ValueError(f"act_and_mul: unknown compile params {sorted(unknown)}")
    plan = {**product.tile_plan(d), **tiling}
    if plan["segments"] * plan["threads_per_segment"] * plan["vectors_per_thread"] * _VEC < d:
        raise ValueError(f"act_and_mul: tiling {plan} does not cover d={d}")
    plan.pop("rows_per_cta")
    return build_kernel_persistent(act, dtype, d, **plan, ctas_per_sm=ctas_per_sm or 2, pipeline=pipeline,
                                   store_cache=store_cache, load_cache=load_cache)


def sass_expect(act: str, dtype: str, d: int | None = None, schedule: str = "tile", out: str = "reg",
                **kw) -> list[str]:
    """For "bulk": the bulk copies (``UBLKCP.S.G`` / ``UBLKCP.G.S``), the mbarrier ring and 16-byte smem
    accesses; else the product's."""
    if schedule == "bulk":
        stores = [r"STG\.E\.128"] if out == "reg" else [r"STS\.128", r"UBLKCP\.G\.S "]
        return [r"UBLKCP\.S\.G ", r"SYNCS\.PHASECHK\.TRANS64", r"SYNCS\.ARRIVE", r"LDS\.128", *stores]
    return product.sass_expect(act, dtype, d, schedule=schedule, **kw)


def build_kernel_persistent(act: str, dtype: str, d: int, segments: int, threads_per_segment: int,
                            vectors_per_thread: int, ctas_per_sm: int, pipeline: bool = True,
                            store_cache: str = "default", num_sms: int = NUM_SMS, load_cache: str = LOAD_CACHE):
    """Persistent tiles: ``min(M * segments, ctas_per_sm * num_sms)`` CTAs of ``threads_per_segment``
    threads; CTA ``c`` does tiles ``c, c + grid, ...`` (tile ``t``: row ``t // segments``, segment
    ``t % segments``). With ``pipeline`` the next tile's gate/up go into a second register set before the
    current tile's math and stores (plain ``ld.global``: ptxas cannot sink them below the stores), then
    move into the first. ``__launch_bounds__(threads, ctas_per_sm)`` keeps the whole grid resident.
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    tps = threads_per_segment
    vpt = vectors_per_thread
    nvec = d // _VEC
    words = vector.WORDS_PER_VECTOR
    max_grid = ctas_per_sm * num_sms

    def col_pred(v, seg, lane):
        tail = ((segments - 1) * vpt + v + 1) * tps > nvec
        return (seg * vpt + v) * tps + lane < nvec if tail else None

    def both(a, b):
        if a is None or b is None:
            return b if a is None else a
        return T.And(a, b)

    def col(v, seg, lane):
        return ((seg * vpt + v) * tps + lane) * _VEC

    def tile_rc(t):
        return (t, 0) if segments == 1 else (t // segments, t % segments)

    def load_tile(gr, ur, Xf, t, x_stride, lane, tile_ok):
        row, seg = tile_rc(t)
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        for v in range(vpt):
            pred = both(tile_ok, col_pred(v, seg, lane))
            vector.load_v4(gr, v * words, Xf.ptr_to([x_base + col(v, seg, lane)]), pred, cache=load_cache)
            vector.load_v4(ur, v * words, Xf.ptr_to([x_base + d + col(v, seg, lane)]), pred, cache=load_cache)

    def compute_store(Yf, t, y_stride, lane, gr, ur, orr, tmp):
        row, seg = tile_rc(t)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        for v in range(vpt):
            _act_vector(act, dtype, orr, gr, ur, v, tmp)
            vector.store_v4(Yf.ptr_to([y_base + col(v, seg, lane)]), orr, 0, col_pred(v, seg, lane),
                            cache=store_cache)

    @T.prim_func
    def act_and_mul(x_ptr: T.handle, y_ptr: T.handle, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, 2 * d), dtype, strides=(x_stride, 1), align=16)
        Y = T.match_buffer(y_ptr, (M, d), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas_per_sm})
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([T.min(M * segments, max_grid)])
        tid = T.thread_id([tps])
        gr = T.alloc_local((vpt * words,), "uint32")
        ur = T.alloc_local((vpt * words,), "uint32")
        gn = T.alloc_local((vpt * words,), "uint32")
        un = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        tmp = T.alloc_local((2 * words,), "float32")
        dep = T.alloc_local((1,), "uint32")
        tiles = M * segments
        grid = T.min(tiles, max_grid)
        if pipeline:
            load_tile(gr, ur, Xf, cta, x_stride, tid, None)
        for it in range((tiles - 1 - cta) // grid + 1):
            t = cta + it * grid
            if pipeline:
                load_tile(gn, un, Xf, t + grid, x_stride, tid, t + grid < tiles)
            else:
                load_tile(gr, ur, Xf, t, x_stride, tid, None)
                # Every word depends on every load (``zero`` is 0): all loads issue before any math.
                dep[0] = vector.after_all(gr, vpt * words, zero) | vector.after_all(ur, vpt * words, zero)
                for i in range(vpt * words):
                    T.buffer_store(gr, gr[i] ^ dep[0], [i])
            compute_store(Yf, t, y_stride, tid, gr, ur, orr, tmp)
            if pipeline:
                vector.copy(gr, gn, vpt * words)
                vector.copy(ur, un, vpt * words)

    return act_and_mul


# "bulk" schedule: persistent CTAs stream (row, column chunk) tiles -- the gate chunk and the up chunk, two 1-D
# TMA bulk copies completing on one full mbarrier -- through a ring of ``stages`` shared-memory stages, fed by a
# producer warp; the consumer warps compute from ``ld.shared``. A whole row (2 x 28 KB in, 28 KB out at
# d = 14336) is too coarse a ring unit: 2-3 stages of it would fill an SM's shared memory for one or two CTAs,
# so the unit is a chunk of ``chunk`` columns (default 2048: 8 KB in per stage; 14336 = 7 chunks).
BULK_OUTS = ("reg", "bulk")
BULK_MAX_CHUNK = 2048
SMEM_PER_CTA = 232448  # 227 KB: the most one CTA may use on the H200
SMEM_PER_SM = 233472  # 228 KB shared by the CTAs of an SM, 1 KB of it reserved per CTA by the driver
SMEM_RESERVED_PER_CTA = 1024
MAX_THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32
BULK_THREADS_PER_SM = 1024  # default residency


def bulk_plan(d: int, chunk: int | None = None, vectors_per_thread: int = 2, stages: int = 4,
              ctas_per_sm: int | None = None, out: str = "reg") -> dict:
    """Chunk, consumer threads, CTAs per SM and shared memory of the "bulk" schedule (ValueError if it
    cannot run): ``chunk`` columns divide d, each consumer thread holds ``vectors_per_thread`` 16-byte
    vectors of gate and of up, whole consumer warps. ``chunk`` defaults to the largest such divisor of d up
    to 2048 columns; ``ctas_per_sm`` to as many as shared memory holds up to 1024 threads an SM."""
    if out not in BULK_OUTS:
        raise ValueError(f"act_and_mul bulk: out {out!r} is not one of {BULK_OUTS}")
    if stages < 1 or vectors_per_thread < 1:
        raise ValueError(f"act_and_mul bulk: stages {stages} and vectors_per_thread {vectors_per_thread} must be >= 1")
    step = _VEC * vectors_per_thread * 32  # columns of one consumer warp
    if chunk is None:
        cands = [c for c in range(step, min(d, BULK_MAX_CHUNK) + 1, step) if d % c == 0]
        if not cands:
            raise ValueError(f"act_and_mul bulk: d={d} has no column chunk <= {BULK_MAX_CHUNK} that is a multiple of "
                             f"{step} (whole warps of {vectors_per_thread} vectors a thread)")
        chunk = cands[-1]
    if chunk <= 0 or d % chunk or chunk % step:
        raise ValueError(f"act_and_mul bulk: chunk {chunk} must divide d={d} and be a multiple of {step} columns "
                         f"(whole warps of {vectors_per_thread} 16-byte vectors a thread)")
    consumers = chunk // (_VEC * vectors_per_thread)
    threads = consumers + 32
    if threads > 1024:
        raise ValueError(f"act_and_mul bulk: {consumers} consumer threads + a producer warp exceed 1024")
    stage_bytes = 2 * chunk * 2  # gate + up; 16-byte multiples: chunk is a multiple of 8 columns
    smem = stages * stage_bytes + 2 * 8 * stages
    if smem > SMEM_PER_CTA:
        raise ValueError(f"act_and_mul bulk: {stages} stages of {stage_bytes} B exceed the {SMEM_PER_CTA} B of a CTA")
    fit = min(SMEM_PER_SM // (smem + SMEM_RESERVED_PER_CTA), MAX_THREADS_PER_SM // threads, MAX_CTAS_PER_SM)
    ctas = ctas_per_sm or max(1, min(fit, BULK_THREADS_PER_SM // threads))
    if not 1 <= ctas <= fit:
        raise ValueError(f"act_and_mul bulk: {ctas} CTAs/SM of {stages} x {stage_bytes} B stages and {threads} "
                         f"threads do not fit one SM (at most {fit})")
    return {"chunk": chunk, "vectors_per_thread": vectors_per_thread, "consumers": consumers, "threads": threads,
            "ctas_per_sm": ctas, "stage_bytes": stage_bytes, "smem_bytes": smem}


def build_kernel_bulk(act: str, dtype: str, d: int, chunk: int | None = None, vectors_per_thread: int = 2,
                      stages: int = 4, ctas_per_sm: int | None = None, out: str = "reg", num_sms: int = NUM_SMS,
                      load_hint: str | None = None, store_cache: str = "default"):
    """Persistent CTAs over tiles ``t = cta, cta + grid, ...`` (``grid = min(M * d / chunk, ctas_per_sm *
    num_sms)``; tile ``t``: row ``t // chunks``, columns ``(t % chunks) * chunk ..+chunk``) through a
    full/empty ``mbarrier.Ring`` of ``stages`` stages ``[gate chunk | up chunk]``.

    Producer (lane 0 of the last warp): for the CTA's ``j``-th tile, ``producer_acquire`` (wait on
    ``empty[j % stages]`` for the release of tile ``j - stages``, parity ``((j // stages) % 2) ^ 1``, which a
    fresh barrier passes for the first ``stages`` tiles), ``arrive_expect_tx(full, 2 * chunk * 2)`` and the two
    bulk loads. Consumers (the other warps, ``vectors_per_thread`` vectors of gate and of up a thread, vector
    ``v`` of thread ``t`` at column ``(v * consumers + t) * 8`` of the chunk: conflict-free ``ld.shared``) wait
    on ``full`` with parity ``(j // stages) % 2``, then

    - ``out="reg"``: read gate and up, compute, store with 16-byte ``st.global``;
    - ``out="bulk"``: read, compute, write the output vector over the gate vector it came from (only this
      thread touches it), ``fence.proxy.async``;

    then ``__syncwarp`` and lane 0 of each warp releases the stage (``empty`` counts one arrival per
    consumer warp). The release comes after the stores, whose issue needs the loaded values: the reads are
    complete, not merely ordered, before the producer may overwrite the stage. With ``out="bulk"`` the
    producer then owns a stage holding a finished output chunk: before refilling it with tile ``j`` it
    bulk-stores tile ``j - stages`` from its gate half, commits and waits ``wait_read(0)``; after its last
    load it waits for the release of each of the last ``min(stages, tiles)`` tiles (parity
    ``(j // stages) % 2``) and stores them, then drains.

    Phases: a stage's full barrier completes again only after the producer's next load, which follows the
    release of the stage by every consumer warp, which follows their wait: no consumer can miss a phase;
    symmetrically the producer waits on an empty barrier only for a release whose load it has issued. The
    consumers never wait for the producer's stores, the producer never touches data. Tiles past ``M`` rows
    do not exist (the tile count is ``M * chunks``); every load issued is consumed.
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import bulk, mbarrier, vector

    plan = bulk_plan(d, chunk, vectors_per_thread, stages, ctas_per_sm, out)
    chunk, vpt, nc = plan["chunk"], plan["vectors_per_thread"], plan["consumers"]
    threads, ctas, stage_bytes = plan["threads"], plan["ctas_per_sm"], plan["stage_bytes"]
    chunks = d // chunk
    words = vector.WORDS_PER_VECTOR
    max_grid = ctas * num_sms
    ring = mbarrier.Ring(stages, consumer_arrivals=nc // 32)
    if load_hint not in (None, bulk.EVICT_FIRST, bulk.EVICT_NORMAL, bulk.EVICT_LAST):
        raise ValueError(f"act_and_mul bulk: load_hint {load_hint!r}")

    def tile_rc(t):
        """(row, first column) of tile ``t >= 0`` (truncating division by the constant ``chunks``: bind the
        results to locals in the kernel body, or TIR folds them into 64-bit division of the addresses)."""
        return T.truncdiv(t, chunks), T.truncmod(t, chunks) * chunk

    def offset(row, c0, stride):
        return T.Cast("int64", row) * T.Cast("int64", stride) + c0

    def load_tile(S, full, Xf, j, row, c0, x_stride, pol):  # noqa: N803
        gate = offset(row, c0, x_stride)
        s = ring.stage(j)
        policy = None if load_hint is None else pol[0]
        ring.producer_expect(full, j, stage_bytes)
        bulk.load(S.ptr_to([s * 2 * chunk]), Xf.ptr_to([gate]), chunk * 2, full.ptr_to([s]), cache_policy=policy)
        bulk.load(S.ptr_to([s * 2 * chunk + chunk]), Xf.ptr_to([gate + d]), chunk * 2, full.ptr_to([s]),
                  cache_policy=policy)

    def store_tile(S, Yf, j, row, c0, y_stride):  # noqa: N803
        bulk.store(Yf.ptr_to([offset(row, c0, y_stride)]), S.ptr_to([ring.stage(j) * 2 * chunk]), chunk * 2)
        bulk.commit()

    def read_tile(S, j, lane, gr, ur):  # noqa: N803
        base = ring.stage(j) * 2 * chunk
        for v in range(vpt):
            col = (v * nc + lane) * _VEC
            vector.load_shared_v4(gr, v * words, S.ptr_to([base + col]))
            vector.load_shared_v4(ur, v * words, S.ptr_to([base + chunk + col]))

    def compute_out(S, Yf, j, row, c0, y_stride, lane, gr, ur, orr, tmp):  # noqa: N803
        y = offset(row, c0, y_stride)
        for v in range(vpt):
            col = (v * nc + lane) * _VEC
            _act_vector(act, dtype, orr, gr, ur, v, tmp)
            if out == "reg":
                vector.store_v4(Yf.ptr_to([y + col]), orr, 0, cache=store_cache)
            else:
                vector.store_shared_v4(S.ptr_to([ring.stage(j) * 2 * chunk + col]), orr, 0)

    @T.prim_func
    def act_and_mul(x_ptr: T.handle, y_ptr: T.handle, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, 2 * d), dtype, strides=(x_stride, 1), align=16)
        Y = T.match_buffer(y_ptr, (M, d), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas})
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([T.min(M * chunks, max_grid)])
        tid = T.thread_id([threads])
        pool = T.SMEMPool()  # everything in the one dynamic pool (no static __shared__)
        S = pool.alloc((stages * 2 * chunk,), dtype, align=128)
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.commit()
        gr = T.alloc_local((vpt * words,), "uint32")
        ur = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        tmp = T.alloc_local((2 * words,), "float32")
        pol = T.alloc_local((1,), "uint64")
        tiles = M * chunks
        grid = T.min(tiles, max_grid)
        n = (tiles - 1 - cta) // grid + 1  # tiles of this CTA (>= 1: grid <= tiles)
        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()  # the last CTA-wide barrier: producer and consumers part here
        if tid >= nc:
            if tid == nc:  # producer
                if load_hint is not None:
                    bulk.create_policy(pol[0], load_hint)
                for j in T.serial(n):
                    row, c0 = tile_rc(cta + j * grid)
                    ring.producer_acquire(empty, j)
                    if out == "bulk":
                        if j >= stages:  # the stage holds tile j - stages' output: store it, wait until read
                            prow, pc0 = tile_rc(cta + (j - stages) * grid)
                            store_tile(S, Yf, j - stages, prow, pc0, y_stride)
                            bulk.wait_read(0)
                    load_tile(S, full, Xf, j, row, c0, x_stride, pol)
                if out == "bulk":
                    for j in T.serial(T.max(n - stages, 0), n):
                        row, c0 = tile_rc(cta + j * grid)
                        mbarrier.wait(empty.ptr_to([ring.stage(j)]), ring.phase(j))  # tile j released
                        store_tile(S, Yf, j, row, c0, y_stride)
                    bulk.wait_read(0)  # smem stays valid until the last store has read it
        else:
            for j in T.serial(n):
                row, c0 = tile_rc(cta + j * grid)
                ring.consumer_wait(full, j)
                read_tile(S, j, tid, gr, ur)
                compute_out(S, Yf, j, row, c0, y_stride, tid, gr, ur, orr, tmp)
                if out == "bulk":
                    bulk.fence_proxy_async()  # this thread's st.shared -> visible to the bulk store
                T.cuda.warp_sync()  # the warp's reads (and writes) of the stage are done
                if tid % 32 == 0:
                    ring.consumer_release(empty, j)

    return act_and_mul
