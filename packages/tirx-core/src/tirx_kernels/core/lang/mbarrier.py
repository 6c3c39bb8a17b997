# SPDX-License-Identifier: Apache-2.0
"""mbarrier helpers for ``@T.prim_func`` bodies: init, arrive (local, expect_tx, remote through ``mapa``),
parity wait, and the stage/phase arithmetic of a full/empty ring.

Every statement goes through ``T.evaluate`` (a bare ``T.ptx.*`` call in a traced helper is dropped).
Barriers must live in the kernel's single ``T.SMEMPool``: any static ``__shared__`` moves the pool base off
1024 B and silently breaks 128B-swizzled TMA/wgmma tiles.
"""

from __future__ import annotations

from tvm.script import tirx as T


def init(bar, count):
    """Initialise ``bar`` (a pointer into smem) to expect ``count`` arrivals per phase."""
    T.evaluate(T.ptx.mbarrier.init.shared__cta.b64(bar, T.uint32(count)))


def fence_init():
    """After the inits, before the CTA (cluster) barrier: make them visible to other threads, to remote
    CTAs of the cluster, and to the async proxy (TMA complete_tx)."""
    T.evaluate(T.ptx.fence.mbarrier_init.release.cluster())
    T.evaluate(T.ptx.fence.proxy.async_.shared__cta())


def arrive(bar):
    T.evaluate(T.ptx.mbarrier.arrive.shared__cta.b64(bar))


def arrive_expect_tx(bar, nbytes):
    """Arrive once and add ``nbytes`` of expected TMA transactions to the current phase.

    TMA always counts the full box: a box that reaches past the tensor's edge is zero-filled in smem and
    still completes all of its bytes, so ``nbytes`` is the box size, not the in-bounds part.
    """
    T.evaluate(T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(bar, T.uint32(nbytes)))


def arrive_remote(bar, cta_rank, scratch):
    """Arrive on the barrier at the same smem offset in CTA ``cta_rank`` of the cluster.

    ``scratch`` is a ``uint32`` local buffer element receiving the ``mapa`` address. Default semantics
    (release.cta): a ``.release.cluster`` arrive emits a GPU-wide fence and cost 40 % on the H200 GEMM
    (398 vs 658 TFLOP/s).
    """
    T.evaluate(T.ptx.mapa.shared__cluster.u32(scratch, T.cuda.cvta_generic_to_shared(bar), T.uint32(cta_rank)))
    T.evaluate(T.ptx.mbarrier.arrive.shared__cluster.b64(scratch))


def wait(bar, parity):
    """Spin until the phase with ``parity`` of ``bar`` has completed."""
    T.evaluate(T.cuda.mbarrier_wait(bar, parity))


def stage(k, num_stages: int):
    """Ring slot of the k-th use."""
    return k % num_stages


def phase(k, num_stages: int):
    """Parity the consumer of the k-th use waits for on the *full* barrier; the producer waits for
    ``phase ^ 1`` on the *empty* one, which a fresh barrier satisfies at once (its "previous" phase counts
    as complete), so the first ``num_stages`` loads need no pre-arrival."""
    return (k // num_stages) % 2


# How the consumers of a ring give a slot back (Ring.for_warpgroups / release_slot).
RELEASES = ("warp", "warpgroup")


class Ring:
    """The stage/phase discipline of a ``num_stages`` full/empty barrier ring (one producer, N consumers).

    ``full[s]``: the producer's ``arrive_expect_tx`` plus the TMA bytes complete it (``producer_arrivals``
    = 1); ``empty[s]``: ``consumer_arrivals`` arrivals (e.g. lane 0 of each consumer warp, times the
    cluster size when the stage is multicast into every CTA) give the slot back.

    ``it`` is the *use count* of the ring, a counter that keeps running across everything the kernel
    streams through it (a persistent kernel's tiles included): stage and phase derive from it, so resetting
    it per tile would desynchronise the parities. Each use must be released exactly once, the last one of
    every tile too, or the producer of the next tile waits forever.

    Build the Ring in Python outside the ``@T.prim_func`` (TIRx cannot bind a Python object inside one) and
    pass the two barrier buffers (``uint64``, ``num_stages`` each, in the kernel's pool) to its methods.
    """

    def __init__(self, num_stages: int, consumer_arrivals: int, producer_arrivals: int = 1):
        if num_stages < 1 or consumer_arrivals < 1 or producer_arrivals < 1:
            raise ValueError("mbarrier.Ring: stages and arrival counts must be >= 1")
        self.num_stages = num_stages
        self.consumer_arrivals = consumer_arrivals
        self.producer_arrivals = producer_arrivals
        self.release = "warp"  # what release_slot does; set by for_warpgroups
        self.cluster_size = 1

    @classmethod
    def for_warpgroups(cls, num_stages: int, warpgroups: int, release: str = "warp", cluster_size: int = 1):
        """A ring each use of which is read by ``warpgroups`` consumer warpgroups in every CTA of a
        ``cluster_size`` cluster (each CTA's producer multicasting into the CTAs sharing its slices), given back by
        :meth:`release_slot` per ``release``: ``"warp"`` (lane 0 of every consumer warp, in every CTA) or
        ``"warpgroup"`` (:meth:`consumer_release_warpgroup`); the empty barriers count those arrivals."""
        if release not in RELEASES:
            raise ValueError(f"mbarrier.Ring: release {release!r} is not one of {RELEASES}")
        per_warpgroup = 4 if release == "warp" else 1
        ring = cls(num_stages, warpgroups * per_warpgroup * cluster_size)
        ring.release, ring.cluster_size = release, cluster_size
        return ring

    def stage(self, it):
        return stage(it, self.num_stages)

    def phase(self, it):
        return phase(it, self.num_stages)

    def init(self, full, empty):
        """By one thread, before ``fence_init()`` and the CTA/cluster barrier."""
        for s in range(self.num_stages):
            init(full.ptr_to([s]), self.producer_arrivals)
            init(empty.ptr_to([s]), self.consumer_arrivals)

    def producer_acquire(self, empty, it):
        """Wait until use ``it``'s slot is free (a fresh ring passes the first ``num_stages`` at once)."""
        wait(empty.ptr_to([self.stage(it)]), self.phase(it) ^ 1)

    def producer_expect(self, full, it, nbytes):
        """Arrive on use ``it``'s full barrier announcing the TMA bytes that will complete it."""
        arrive_expect_tx(full.ptr_to([self.stage(it)]), nbytes)

    def consumer_wait(self, full, it):
        wait(full.ptr_to([self.stage(it)]), self.phase(it))

    def cursor_init(self, cursor):
        """A running (stage, phase) cursor in a 2-element ``int32`` local buffer, at use 0. Stepping it once per
        use (:meth:`cursor_advance`) replaces the ``it % num_stages`` and ``(it // num_stages) % 2`` of every
        use (an integer division by a constant when ``num_stages`` is not a power of two)."""
        T.buffer_store(cursor, T.int32(0), [0])
        T.buffer_store(cursor, T.int32(0), [1])

    def cursor_seek(self, cursor, it):
        """Put the cursor at use ``it`` (one division: once per tile where a consumer skips uses)."""
        T.buffer_store(cursor, self.stage(it), [0])
        T.buffer_store(cursor, self.phase(it), [1])

    def cursor_advance(self, cursor):
        """Step the cursor to the next use: the stage wraps to 0 after ``num_stages - 1``, flipping the phase."""
        wrap = cursor[0] == self.num_stages - 1
        T.buffer_store(cursor, T.Select(wrap, cursor[1] ^ 1, cursor[1]), [1])
        T.buffer_store(cursor, T.Select(wrap, 0, cursor[0] + 1), [0])

    def consumer_wait_at(self, full, cursor):
        """:meth:`consumer_wait` for the use the cursor is at."""
        wait(full.ptr_to([cursor[0]]), cursor[1])

    def consumer_release(self, empty, it, cluster_size: int = 1, scratch=None, stage=None):
        """Give use ``it``'s slot back (or slot ``stage``, given instead: ``it`` None); with ``cluster_size > 1``
        arrive on the slot in every CTA of the cluster (each CTA's producer multicasts into all of them),
        ``scratch`` a ``uint32`` local."""
        bar = empty.ptr_to([self.stage(it) if stage is None else stage])
        if cluster_size == 1:
            arrive(bar)
        else:
            for r in range(cluster_size):
                arrive_remote(bar, r, scratch)

    def release_slot(self, empty, stage, warp, lane, scratch):
        """Give slot ``stage`` back, called by every consumer thread after its ``wgmma.wait``, as the ring's
        ``release`` says (:meth:`for_warpgroups`); ``scratch`` a ``uint32`` local (cluster arrivals)."""
        if self.release == "warp":
            with T.If(lane == 0):  # a traced helper's Python `if` on a TIR value would be dropped: T.If
                with T.Then():
                    self.consumer_release(empty, None, self.cluster_size, scratch, stage=stage)
        else:
            self.consumer_release_warpgroup(empty, stage, warp, lane, self.cluster_size, scratch)

    def consumer_release_warpgroup(self, empty, stage, warp, lane, cluster_size: int = 1, scratch=None):
        """Give slot ``stage`` back with *one* arrival per consumer warpgroup and CTA of the cluster
        (``consumer_arrivals`` = consumer warpgroups x cluster size), called by every thread of a warpgroup
        after its ``wgmma.wait``: lane 0 of warp ``r`` arrives in CTA ``r``, so the remote arrivals of a
        2-CTA cluster leave from two warps at once instead of one after the other.

        Sound because a wgmma is one warpgroup-wide asynchronous operation: once any warp's ``wait_group``
        has returned, the group's shared-memory reads are complete for the whole warpgroup (CUTLASS's sm90
        TMA pipeline counts its empty barriers the same way: one arrival per consumer warpgroup and
        destination CTA).
        """
        if cluster_size > 4:
            raise ValueError(f"mbarrier.Ring: a warpgroup has 4 warps to release into {cluster_size} CTAs")
        bar = empty.ptr_to([stage])
        # A traced helper's Python `if` on a TIR value would be dropped silently: T.If.
        with T.If(T.And(lane == 0, warp < cluster_size)):
            with T.Then():
                if cluster_size == 1:
                    arrive(bar)
                else:
                    arrive_remote(bar, warp, scratch)
