# SPDX-License-Identifier: Apache-2.0
"""Micro-kernels for ``core.lang.tma`` / ``core.lang.mbarrier`` / clusters (issue #4): TMA loads and stores
with tensor maps of rank 2-5, multicast across a 2-CTA cluster, L2 cache hints, OOB zero fill, a 3-stage
full/empty mbarrier ring, dynamic shared memory above 48 KB and the cluster launch.

Cases (one CTA of 128 threads unless stated; data travel as raw ``int32`` words, the tensor maps describe
them as ``float32``, which TMA copies bit for bit and zero-fills as integer 0):

- ``tma_load_sw128_64k``: four 128x32 SW128 boxes of a 256x64 tensor into a 64 KB dynamic-smem pool, then a
  per-thread un-swizzle (``tma.sw128_offset``) and ``st.global``: out == in.
- ``tma_load_rank{3,4,5}``: one non-swizzled box of a rank-3/4/5 map over a padded strided tensor, copied back
  out: out == the box.
- ``tma_load_oob_zero``: two 16x16 boxes of a 20x24 tensor, one past the bottom-right edge and one before the
  top-left (negative coordinates), into smem poisoned beforehand: inside values copied, outside zeros.
- ``tma_store_clipped``: a 3x3 grid of 16x16 boxes written by threads into smem and TMA-stored to a 36x40
  map over a 40x48 buffer: the last row/column of boxes is clipped; the guard band keeps its poison.
- ``tma_l2_hint``: ``create_policy`` + ``cache_policy`` load (evict_first) and store (evict_last) plus
  ``prefetch``/``prefetch_descriptor``: the thread copy and the TMA-stored copy both equal the input.
- ``tma_ring``: ``mbarrier.Ring`` of 3 stages streaming 8 boxes from one producer thread (warp 4) to 4
  consumer warps that copy each box to global and release it (lane 0 per warp): out == in.
- ``tma_cluster_multicast``: a 2-CTA cluster; each CTA loads half of a 32x32 box with
  ``multicast_mask=3``, each CTA's smem then holds the whole box, which it writes to its own output slice.
- ``tma_bulk_ring``: ``core.lang.bulk`` (1-D ``cp.async.bulk``, no tensor map) in the protocol of rmsnorm's
  "bulk" schedule: 3 persistent CTAs stream the 41 rows of a matrix (14/14/13 rows each) through a 3-stage
  ring of full barriers (phases wrap 4-5 times); threads read a row with ``ld.shared``, write its complement
  back in place, and one thread bulk-stores the row; a stage is refilled only after its store has read it
  (``wait_read``), rows past the end are never loaded nor stored. out == ~in.

CPU (CI): each kernel builds to an sm_90a ``.so`` with no spills and no stack, and its SASS/host source has
the expected facts (``UTMALDG.<r>D``, ``.MULTICAST``, ``UTMASTG``, ``UBLKCP``, ``SYNCS``, the cluster launch
attribute, the >48 KB dynamic-smem opt-in). GPU: the GPU host has no compiler; the kernels are built here into a bundle
(``python packages/tirx-core/tests/test_lang_tma_micro.py build/lang-micro``: ``tma_*.so`` +
``tma_cases.json``, beside the wgmma bundle) that ``test_lang_tma_numerics.py`` runs.
"""

import dataclasses
import re
import shutil

import pytest

pytest.importorskip("tvm")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build  # noqa: E402
from tirx_kernels.core.lang import bulk, mbarrier, tma, vector  # noqa: E402

DT = "float32"  # descriptor dtype of the int32 words (4 bytes, copied bit for bit)
POISON = -0x21524111  # 0xDEADBEEF: smem poison (the host poisons outputs itself)
THREADS = 128


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kind: str
    inp: tuple  # int32 input shape (row-major, torch order)
    out: tuple  # int32 output shape
    params: dict = dataclasses.field(default_factory=dict)
    sass: tuple = ()  # regexes the SASS must match
    host: tuple = ()  # substrings the generated source must contain


def _strided_case(name, dims, strides, box, coords):
    """A rank-``len(dims)`` map (innermost first; ``strides`` in elements for dims 1..) over a flat buffer."""
    size = strides[-1] * dims[-1]
    nbox = 1
    for b in box:
        nbox *= b
    return Case(name, "strided", (size,), (nbox,),
                dict(dims=list(dims), strides=list(strides), box=list(box), coords=list(coords)),
                sass=(rf"UTMALDG\.{len(dims)}D ",))


CASES = [
    Case("tma_load_sw128_64k", "sw128", (256, 64), (256, 64), dict(box_rows=128, box_cols=32),
         sass=(r"UTMALDG\.2D ",), host=("cudaFuncAttributeMaxDynamicSharedMemorySize",
                                         "static_cast<CUtensorMapSwizzle>(3)")),
    _strided_case("tma_load_rank3", (8, 5, 6), (12, 72), (4, 3, 2), (4, 1, 3)),
    _strided_case("tma_load_rank4", (8, 3, 4, 5), (8, 28, 116), (4, 2, 3, 2), (0, 1, 1, 3)),
    _strided_case("tma_load_rank5", (8, 2, 3, 2, 3), (8, 16, 52, 104), (8, 2, 2, 2, 2), (0, 0, 1, 0, 1)),
    Case("tma_load_oob_zero", "oob", (20, 24), (2, 16, 16), dict(box=16, coords=[[16, 12], [-8, -4]]),
         sass=(r"UTMALDG\.2D ",)),
    Case("tma_store_clipped", "store", (48, 48), (40, 48), dict(box=16, grid=3, rows=36, cols=40),
         sass=(r"UTMASTG\.2D ",)),
    Case("tma_l2_hint", "l2hint", (64, 32), (2, 64, 32), {},
         sass=(r"UTMALDG\.2D \[UR\d+\], \[UR\d+\], desc\[UR\d+\]", r"UTMASTG\.2D \[UR\d+\], \[UR\d+\], desc\[UR\d+\]",
               r"UTMAPF\.L2\.2D ", r"UTMACCTL\.PF ")),
    Case("tma_ring", "ring", (128, 32), (128, 32), dict(stages=3, boxes=8, box_rows=16),
         sass=(r"UTMALDG\.2D ",)),
    Case("tma_cluster_multicast", "cluster", (48, 32), (2, 32, 32), dict(row0=8, half=16),
         sass=(r"UTMALDG\.2D\.MULTICAST ",), host=("cudaLaunchAttributeClusterDimension",)),
    Case("tma_bulk_ring", "bulk", (41, 256), (41, 256), dict(ctas=3, stages=3, threads=64),
         sass=(r"UBLKCP\.S\.G \[UR\d+\], \[UR\d+\], UR\d+, desc\[UR\d+\]", r"UBLKCP\.G\.S \[UR\d+\], \[UR\d+\], UR\d+ ",
               r"SYNCS\.ARRIVE\.TRANS64", r"LDS\.128", r"STS\.128"),
         host=(bulk.LOAD + ".L2::cache_hint [", bulk.STORE + " [", "cp.async.bulk.commit_group;",
               "cp.async.bulk.wait_group.read 0;")),
]
_IDS = [c.name for c in CASES]


# ---------------------------------------------------------------------------------------------------------
# The micro-kernels
# ---------------------------------------------------------------------------------------------------------


def _k_sw128(c: Case):
    rows, cols = c.inp
    br, bc = c.params["box_rows"], c.params["box_cols"]
    nr, nc = rows // br, cols // bc
    box_words = br * bc
    total = rows * cols
    assert bc * 4 == 128 and total * 4 > 48 * 1024

    @T.prim_func
    def micro(a_ptr: T.handle, o_ptr: T.handle):
        A = T.match_buffer(a_ptr, (rows, cols), "int32", align=16)
        Out = T.match_buffer(o_ptr, (rows, cols), "int32", align=16)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, rows, cols, cols, br, bc, DT, swizzle=tma.SWIZZLE_128B)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS])
        pool = T.SMEMPool()
        S = pool.alloc((total,), "int32", align=1024)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        if tid == 0:
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if tid == 0:
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), total * 4)
            for b in T.unroll(nr * nc):
                tma.load_2d(S.ptr_to([b * box_words]), a_map, (b % nc) * bc, (b // nc) * br, bar.ptr_to([0]))
        mbarrier.wait(bar.ptr_to([0]), 0)
        for it in T.serial(total // THREADS):
            r = (it * THREADS + tid) // cols
            col = (it * THREADS + tid) % cols
            Out[r, col] = S[((r // br) * nc + col // bc) * box_words + tma.sw128_offset(r % br, col % bc, DT)]

    return micro


def _k_strided(c: Case):
    p = c.params
    dims, strides, box, coords = p["dims"], p["strides"], p["box"], p["coords"]
    (size,), (nbox,) = c.inp, c.out

    @T.prim_func
    def micro(a_ptr: T.handle, o_ptr: T.handle):
        A = T.match_buffer(a_ptr, (size,), "int32", align=16)
        Out = T.match_buffer(o_ptr, (nbox,), "int32", align=16)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(a_map, A.data, dims, strides, box, DT, swizzle=tma.SWIZZLE_NONE)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS])
        pool = T.SMEMPool()
        S = pool.alloc((nbox,), "int32", align=1024)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        if tid == 0:
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if tid == 0:
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), nbox * 4)
            tma.load(S.ptr_to([0]), a_map, coords, bar.ptr_to([0]))
        mbarrier.wait(bar.ptr_to([0]), 0)
        for it in T.serial((nbox + THREADS - 1) // THREADS):
            if it * THREADS + tid < nbox:
                Out[it * THREADS + tid] = S[it * THREADS + tid]

    return micro


def _k_oob(c: Case):
    rows, cols = c.inp
    bx = c.params["box"]
    (c0x, c0y), (c1x, c1y) = c.params["coords"]
    bw = bx * bx

    @T.prim_func
    def micro(a_ptr: T.handle, o_ptr: T.handle):
        A = T.match_buffer(a_ptr, (rows, cols), "int32", align=16)
        Out = T.match_buffer(o_ptr, (2, bx, bx), "int32", align=16)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(a_map, A.data, [cols, rows], [cols], [bx, bx], DT, swizzle=tma.SWIZZLE_NONE,
                   oob_fill=tma.OOB_FILL_ZERO)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS])
        pool = T.SMEMPool()
        S = pool.alloc((2 * bw,), "int32", align=1024)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        if tid == 0:
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.fence_init()
        for it in T.serial(2 * bw // THREADS):  # poison: the zeros must come from TMA
            S[it * THREADS + tid] = T.int32(POISON)
        tma.fence_proxy_async()  # generic writes ordered before the async-proxy (TMA) writes
        T.cuda.cta_sync()
        if tid == 0:
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), 2 * bw * 4)  # full boxes, in bounds or not
            tma.load(S.ptr_to([0]), a_map, [c0x, c0y], bar.ptr_to([0]))
            tma.load(S.ptr_to([bw]), a_map, [c1x, c1y], bar.ptr_to([0]))
        mbarrier.wait(bar.ptr_to([0]), 0)
        for it in T.serial(2 * bw // THREADS):
            i = it * THREADS + tid
            Out[i // bw, (i % bw) // bx, i % bx] = S[i]

    return micro


def _k_store(c: Case):
    xr, xc = c.inp
    orow, ocol = c.out
    p = c.params
    bx, g, rows, cols = p["box"], p["grid"], p["rows"], p["cols"]
    bw = bx * bx
    nw = g * g * bw

    @T.prim_func
    def micro(x_ptr: T.handle, o_ptr: T.handle):
        X = T.match_buffer(x_ptr, (xr, xc), "int32", align=16)
        Out = T.match_buffer(o_ptr, (orow, ocol), "int32", align=16)
        o_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        # a rows x cols map over the wider buffer: boxes are clipped there, the rest is a guard band
        tma.encode(o_map, Out.data, [cols, rows], [ocol], [bx, bx], DT, swizzle=tma.SWIZZLE_NONE)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS])
        pool = T.SMEMPool()
        S = pool.alloc((nw,), "int32", align=1024)
        pool.commit()
        for it in T.serial(nw // THREADS):
            i = it * THREADS + tid
            S[i] = X[(i // bw) // g * bx + (i % bw) // bx, (i // bw) % g * bx + i % bx]
        tma.fence_proxy_async()  # generic smem writes -> visible to the TMA store (async proxy)
        T.cuda.cta_sync()
        if tid == 0:
            for b in T.unroll(g * g):
                tma.store(o_map, [(b % g) * bx, (b // g) * bx], S.ptr_to([b * bw]))
            tma.store_commit()
            tma.store_wait_read(0)
            tma.store_wait(0)

    return micro


def _k_l2hint(c: Case):
    rows, cols = c.inp

    @T.prim_func
    def micro(a_ptr: T.handle, o_ptr: T.handle):
        A = T.match_buffer(a_ptr, (rows, cols), "int32", align=16)
        Out = T.match_buffer(o_ptr, (2, rows, cols), "int32", align=16)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        o_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(a_map, A.data, [cols, rows], [cols], [cols, rows], DT, swizzle=tma.SWIZZLE_NONE,
                   l2_promotion=tma.L2_PROMOTION_128B)
        tma.encode(o_map, Out.data, [cols, 2 * rows], [cols], [cols, rows], DT, swizzle=tma.SWIZZLE_NONE)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS])
        pool = T.SMEMPool()
        S = pool.alloc((rows * cols,), "int32", align=1024)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        pol = T.alloc_local((2,), "uint64")
        if tid == 0:
            tma.prefetch_descriptor(a_map)
            tma.prefetch(a_map, [0, 0])
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if tid == 0:
            tma.create_policy(pol[0], tma.EVICT_FIRST)
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), rows * cols * 4)
            tma.load(S.ptr_to([0]), a_map, [0, 0], bar.ptr_to([0]), cache_policy=pol[0])
        mbarrier.wait(bar.ptr_to([0]), 0)
        for it in T.serial(rows * cols // THREADS):
            Out[0, (it * THREADS + tid) // cols, (it * THREADS + tid) % cols] = S[it * THREADS + tid]
        if tid == 0:
            tma.create_policy(pol[1], tma.EVICT_LAST)
            tma.fence_proxy_async()
            tma.store(o_map, [0, rows], S.ptr_to([0]), cache_policy=pol[1])
            tma.store_commit()
            tma.store_wait(0)

    return micro


def _k_ring(c: Case):
    rows, cols = c.inp
    p = c.params
    stages, boxes, br = p["stages"], p["boxes"], p["box_rows"]
    assert boxes * br == rows
    bw = br * cols
    ring = mbarrier.Ring(stages, consumer_arrivals=4)  # lane 0 of each consumer warp

    @T.prim_func
    def micro(a_ptr: T.handle, o_ptr: T.handle):
        A = T.match_buffer(a_ptr, (rows, cols), "int32", align=16)
        Out = T.match_buffer(o_ptr, (rows, cols), "int32", align=16)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(a_map, A.data, [cols, rows], [cols], [cols, br], DT, swizzle=tma.SWIZZLE_NONE)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS + 32])  # warps 0-3 consume, warp 4 produces
        pool = T.SMEMPool()
        S = pool.alloc((stages * bw,), "int32", align=1024)
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.commit()
        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if tid >= THREADS:
            if tid == THREADS:
                for it in T.serial(boxes):
                    ring.producer_acquire(empty, it)
                    ring.producer_expect(full, it, bw * 4)
                    tma.load(S.ptr_to([ring.stage(it) * bw]), a_map, [0, it * br], full.ptr_to([ring.stage(it)]))
        else:
            for it in T.serial(boxes):
                ring.consumer_wait(full, it)
                for j in T.unroll(bw // THREADS):
                    Out[it * br + (j * THREADS + tid) // cols, (j * THREADS + tid) % cols] = \
                        S[ring.stage(it) * bw + j * THREADS + tid]
                T.cuda.warp_sync()
                if tid % 32 == 0:
                    ring.consumer_release(empty, it)

    return micro


def _k_cluster(c: Case):
    rows, cols = c.inp
    _, br, _ = c.out
    row0, half = c.params["row0"], c.params["half"]
    assert 2 * half == br

    @T.prim_func
    def micro(a_ptr: T.handle, o_ptr: T.handle):
        A = T.match_buffer(a_ptr, (rows, cols), "int32", align=16)
        Out = T.match_buffer(o_ptr, (2, br, cols), "int32", align=16)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode(a_map, A.data, [cols, rows], [cols], [cols, half], DT, swizzle=tma.SWIZZLE_NONE)
        T.device_entry()
        cta = T.cta_id([2])
        rank = T.cta_id_in_cluster([2])
        tid = T.thread_id([THREADS])
        pool = T.SMEMPool()
        S = pool.alloc((br * cols,), "int32", align=1024)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        if tid == 0:
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.fence_init()
        T.cuda.cluster_sync()  # the peer's barrier is initialised before our multicast completes on it
        if tid == 0:
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), br * cols * 4)  # both halves land here
            tma.load(S.ptr_to([rank * half * cols]), a_map, [0, row0 + rank * half], bar.ptr_to([0]),
                     multicast_mask=3)
        mbarrier.wait(bar.ptr_to([0]), 0)
        for it in T.serial(br * cols // THREADS):
            Out[cta, (it * THREADS + tid) // cols, (it * THREADS + tid) % cols] = S[it * THREADS + tid]
        T.cuda.cluster_sync()  # no CTA exits while the peer's multicast may still write its smem

    return micro


def _k_bulk(c: Case):
    """rmsnorm's "bulk" ring with ``out="bulk"`` (``tools/sweeps/rmsnorm_variants.py``, ``build_kernel_bulk``), the math
    replaced by a complement. Row ``k`` of a CTA is use ``k`` of the ring: stage ``k % stages``, full-barrier
    parity ``(k // stages) % 2``. Per row: wait; ``ld.shared``; barrier B1 (every thread has read the row);
    thread 0 waits until the store of row ``k - 1`` has read its stage, then refills that stage with row
    ``k - 1 + stages``; ``st.shared`` of the result in place; proxy fence; barrier B2; thread 0 bulk-stores
    row ``k`` and commits. No thread can be two phases behind on a barrier: a stage's next load is issued
    after B1 of the row after the one it held, which every thread reaches only after waiting for that row."""
    rows, cols = c.inp
    p = c.params
    ctas, stages, nt = p["ctas"], p["stages"], p["threads"]
    words = vector.WORDS_PER_VECTOR
    vpt = cols // words // nt  # 16-byte vectors per thread
    row_bytes = cols * 4
    assert vpt * words * nt == cols and stages >= 2

    @T.prim_func
    def micro(a_ptr: T.handle, o_ptr: T.handle):
        A = T.match_buffer(a_ptr, (rows, cols), "int32", align=16)
        Out = T.match_buffer(o_ptr, (rows, cols), "int32", align=16)
        T.device_entry()
        cta = T.cta_id([ctas])
        tid = T.thread_id([nt])
        pool = T.SMEMPool()
        S = pool.alloc((stages * cols,), "int32", align=128)
        full = pool.alloc((stages,), "uint64", align=8)
        pool.commit()
        regs = T.alloc_local((vpt * words,), "uint32")
        pol = T.alloc_local((1,), "uint64")
        n = (rows - 1 - cta) // ctas + 1  # rows of this CTA: cta, cta + ctas, ...
        if tid == 0:
            for s in T.unroll(stages):
                mbarrier.init(full.ptr_to([s]), 1)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if tid == 0:
            bulk.create_policy(pol[0], bulk.EVICT_FIRST)
            for s in T.unroll(stages):
                if s < n:
                    mbarrier.arrive_expect_tx(full.ptr_to([s]), row_bytes)
                    bulk.load(S.ptr_to([s * cols]), A.ptr_to([cta + s * ctas, 0]), row_bytes, full.ptr_to([s]),
                              cache_policy=pol[0])
        for k in T.serial(n):
            mbarrier.wait(full.ptr_to([mbarrier.stage(k, stages)]), mbarrier.phase(k, stages))
            for v in T.unroll(vpt):
                vector.load_shared_v4(regs, v * words, S.ptr_to([mbarrier.stage(k, stages) * cols
                                                                 + (v * nt + tid) * words]))
            T.cuda.cta_sync()  # B1
            if tid == 0:
                if k >= 1:
                    bulk.wait_read(0)  # the store of row k - 1 has read its stage
                    if k - 1 + stages < n:
                        mbarrier.arrive_expect_tx(full.ptr_to([mbarrier.stage(k - 1, stages)]), row_bytes)
                        bulk.load(S.ptr_to([mbarrier.stage(k - 1, stages) * cols]),
                                  A.ptr_to([cta + (k - 1 + stages) * ctas, 0]), row_bytes,
                                  full.ptr_to([mbarrier.stage(k - 1, stages)]), cache_policy=pol[0])
            for v in T.unroll(vpt):
                for j in T.unroll(words):
                    regs[v * words + j] = regs[v * words + j] ^ T.uint32(0xFFFFFFFF)
                vector.store_shared_v4(S.ptr_to([mbarrier.stage(k, stages) * cols + (v * nt + tid) * words]), regs,
                                       v * words)
            bulk.fence_proxy_async()  # this thread's st.shared -> visible to the bulk store (async proxy)
            T.cuda.cta_sync()  # B2
            if tid == 0:
                bulk.store(Out.ptr_to([cta + k * ctas, 0]), S.ptr_to([mbarrier.stage(k, stages) * cols]), row_bytes)
                bulk.commit()
        if tid == 0:
            bulk.wait_read(0)  # smem stays valid until the last store has read it

    return micro


_KERNELS = {"sw128": _k_sw128, "strided": _k_strided, "oob": _k_oob, "store": _k_store, "l2hint": _k_l2hint,
            "ring": _k_ring, "cluster": _k_cluster, "bulk": _k_bulk}


def _kernel(c: Case):
    return _KERNELS[c.kind](c)


_built: dict[str, build.BuildResult] = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Build each case's ``.so`` once per test process."""
    def get(c: Case) -> build.BuildResult:
        if c.name not in _built:
            _built[c.name] = build.build_so(_kernel(c), str(tmp_path_factory.mktemp(c.name) / f"{c.name}.so"))
        return _built[c.name]
    return get


# ---------------------------------------------------------------------------------------------------------
# CPU: layer limits at trace time, codegen + build + SASS
# ---------------------------------------------------------------------------------------------------------


def test_box_limits_and_byte_counts():
    assert tma.check_box(DT, [32, 128], tma.SWIZZLE_128B) == 128 * 128
    assert tma.check_box(DT, [4, 3, 2], tma.SWIZZLE_NONE) == 4 * 3 * 2 * 4
    for bad in ([3, 2], [64, 2], [4, 257], [4] * 6):  # 12 B inner, 256 B > SW128 span, extent, rank
        with pytest.raises(ValueError):
            tma.check_box(DT, bad, tma.SWIZZLE_128B)


def test_bulk_sizes_and_spellings():
    """Static sizes must be positive multiples of 16 B; the load without a hint and the store with one (the
    micro-kernel uses the other two spellings) and the full wait_group."""
    for bad in (0, 8, 1000, -16):
        with pytest.raises(ValueError, match="multiple of 16"):
            bulk.check_size(bad)
    bulk.check_size(16)

    @T.prim_func
    def spellings(a_ptr: T.handle, o_ptr: T.handle, n: T.int32):
        A = T.match_buffer(a_ptr, (256,), "int32", align=16)
        Out = T.match_buffer(o_ptr, (256,), "int32", align=16)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([32])
        pool = T.SMEMPool()
        S = pool.alloc((256,), "int32", align=128)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        pol = T.alloc_local((1,), "uint64")
        if tid == 0:
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        if tid == 0:
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), n * 4)
            bulk.load(S.ptr_to([0]), A.ptr_to([0]), n * 4, bar.ptr_to([0]))  # a runtime size
        mbarrier.wait(bar.ptr_to([0]), 0)
        if tid == 0:
            bulk.create_policy(pol[0], bulk.EVICT_LAST)
            bulk.store(Out.ptr_to([0]), S.ptr_to([0]), 1024, cache_policy=pol[0])
            bulk.commit()
            bulk.wait(0)

    src = build.codegen(spellings)
    assert bulk.LOAD + " [%0], [%1], %2, [%3];" in src
    assert bulk.STORE + ".L2::cache_hint [%0], [%1], %2, %3;" in src
    assert "cp.async.bulk.wait_group 0;" in src and "createpolicy.fractional.L2::evict_last.b64" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_micro_kernel_builds(case, built):
    res = built(case)
    src = open(res.cu_path).read()
    dev = src[src.index('extern "C" __global__'):]
    assert dev.count("__shared__") == 1  # everything, barriers included, in the 1024-aligned pool
    for text in case.host:
        assert text in src, text
    if case.kind != "bulk":  # 1-D bulk copies take plain pointers
        assert "const __grid_constant__ CUtensorMap" in src
    if case.kind == "cluster":
        assert ".multicast::cluster" in src and "barrier.cluster" in src
    if case.kind == "l2hint":
        assert "createpolicy.fractional.L2::evict_first.b64" in src
        assert "createpolicy.fractional.L2::evict_last.b64" in src
        assert src.count(".L2::cache_hint") >= 2
    kern = next(iter(res.ptxas_info["kernels"].values()))
    assert kern["spill_store_bytes"] == 0 and kern["spill_load_bytes"] == 0 and kern["stack_bytes"] == 0, kern
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = build.sass(res.so_path)
    for pat in case.sass:
        assert re.search(pat, sass), pat
    loads = re.findall(r"UTMALDG\.\S+", sass)
    if case.kind == "strided":
        rank = len(case.params["dims"])
        assert loads and all(ld.startswith(f"UTMALDG.{rank}D") for ld in loads), loads
    if case.kind != "l2hint":  # the L2 cache policy travels as a desc[URx] operand, only with the hint
        assert not re.search(r"UTMA(LDG|STG)\S* .*desc\[", sass)
    if case.kind != "store":
        assert "SYNCS" in sass  # mbarrier init / arrive.expect_tx / try_wait
    if case.kind == "ring":  # arrive + try_wait on two barrier arrays
        assert len(re.findall(r"SYNCS\.ARRIVE", sass)) >= 2, re.findall(r"SYNCS\.\S+", sass)
    assert "LDL" not in sass and "STL" not in sass


# ---------------------------------------------------------------------------------------------------------
# Prebuilt bundle for the GPU host (no compiler there): test_lang_tma_numerics.py runs it
# ---------------------------------------------------------------------------------------------------------


def build_bundle(out_dir: str) -> str:
    """Build every case into ``out_dir`` (``tma_<name>.so`` + ``tma_cases.json``; the wgmma bundle's
    ``cases.json`` and ``.so`` files in the same folder are left alone)."""
    from tirx_kernels.core import testing

    return testing.write_micro_bundle(out_dir, "tma_cases.json", [
        (f"{c.name}.so", lambda c=c: _kernel(c),
         {"name": c.name, "kind": c.kind, "inp": list(c.inp), "out": list(c.out), "params": c.params,
          "poison": POISON}) for c in CASES])


def test_bundle_lists_every_case(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(build, "build_so", lambda func, path: open(path, "w").close())
    cases = json.load(open(build_bundle(str(tmp_path))))["cases"]
    assert [c["name"] for c in cases] == _IDS and all((tmp_path / c["so"]).exists() for c in cases)
    assert all(c["so"].startswith("tma_") for c in cases)
    assert not (tmp_path / "cases.json").exists()


if __name__ == "__main__":  # python packages/tirx-core/tests/test_lang_tma_micro.py build/lang-micro
    import sys

    print(build_bundle(sys.argv[1] if len(sys.argv) > 1 else "build/lang-micro"))
