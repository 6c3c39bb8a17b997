# SPDX-License-Identifier: Apache-2.0
"""Thread-block clusters inside ``@T.prim_func`` bodies: distributed shared memory (DSMEM) loads from a peer
CTA through ``mapa``, and the cluster barrier in the form that may sit in warp-specialized branches.

Launch a kernel as clusters by binding ``T.cta_id_in_cluster([size])`` (the host wrapper then passes the
cluster-dimension launch attribute); the CTAs of a cluster are co-scheduled on one GPC and can read each
other's shared memory. A peer's smem is addressed in the ``shared::cluster`` window: ``mapa`` maps this CTA's
``shared::cta`` address of a buffer to the same offset in CTA ``rank``, and ``ld.shared::cluster`` reads it.
Nothing orders a peer's ordinary smem writes before such a read except a cluster barrier: the writer's
``barrier.cluster.arrive`` (release semantics by default) and the reader's ``barrier.cluster.wait`` (acquire
by default). The same barrier at the end keeps a CTA from exiting, and its smem from disappearing, while
peers still read it.

``T.cuda.cluster_sync()`` emits the ``.aligned`` forms, which require every thread of the CTA to execute the
*same* barrier instruction. A warp-specialized kernel whose producer and consumer warpgroups reach the
barrier in different branches (they cannot share a join point: the consumers' accumulators would be live
across it under the producer's ``setmaxnreg.dec`` budget) uses :func:`arrive` / :func:`wait` here, the
non-aligned forms, once per thread per barrier phase.

Helpers emit through ``T.evaluate`` (a bare ``T.ptx.*`` call in a traced helper is dropped).
"""

from __future__ import annotations

from tvm.script import tirx as T

MAX_PORTABLE_SIZE = 8  # CTAs per cluster guaranteed schedulable without the non-portable opt-in


def map_shared(scratch, smem_ptr, cta_rank):
    """``scratch`` (a ``uint32`` local element) <- the ``shared::cluster`` address of ``smem_ptr`` (a pointer
    into this CTA's smem, e.g. ``X.ptr_to([i])``) in CTA ``cta_rank`` of the cluster (``mapa``)."""
    T.evaluate(T.ptx.mapa.shared__cluster.u32(scratch, T.cuda.cvta_generic_to_shared(smem_ptr), T.uint32(cta_rank)))


def load_v4_f32(regs, base, smem_ptr, cta_rank, scratch):
    """``regs[base:base+4]`` (``float32`` locals) <- the 16 bytes at ``smem_ptr``'s offset in CTA ``cta_rank``'s
    shared memory (``mapa`` + ``ld.shared::cluster.v4.f32``; the own rank works too and stays on-SM).

    ``smem_ptr`` must be 16-byte aligned. The load is weak: order it after the peer's writes with a cluster
    barrier (:func:`arrive` after the writes there, :func:`wait` before the load here).
    """
    map_shared(scratch, smem_ptr, cta_rank)
    T.evaluate(T.ptx["ld.shared::cluster.v4.f32"](regs[base], regs[base + 1], regs[base + 2], regs[base + 3],
                                                  scratch))


def arrive(relaxed: bool = False):
    """This thread arrives on the cluster barrier (``barrier.cluster.arrive``, non-aligned: may be executed
    from divergent code). Default release semantics publish this thread's prior memory writes to the
    cluster; ``relaxed`` drops that (for a barrier that only guards liveness)."""
    T.evaluate(T.ptx["barrier.cluster.arrive.relaxed" if relaxed else "barrier.cluster.arrive"]())


def wait():
    """Wait until every thread of every CTA in the cluster has arrived (``barrier.cluster.wait``,
    non-aligned, acquire semantics: peers' writes before their arrive are visible after it)."""
    T.evaluate(T.ptx["barrier.cluster.wait"]())


def sync():
    """:func:`arrive` then :func:`wait`: a full cluster barrier callable from divergent branches."""
    arrive()
    wait()


def _named_barrier_operands(what: str, barrier_id, num_threads: int):
    # A TIR id (warp-uniform, e.g. 1 + warpgroup) is checked where it is a Python int only.
    if (isinstance(barrier_id, int) and not 0 < barrier_id < 16) or num_threads % 32 or not 0 < num_threads <= 1024:
        raise ValueError(f"{what}: barrier {barrier_id} (1..15) over {num_threads} threads (multiple of 32)")
    bar = T.uint32(barrier_id) if isinstance(barrier_id, int) else T.Cast("uint32", barrier_id)
    return bar, T.uint32(num_threads)


def named_sync(barrier_id, num_threads: int):
    """Named CTA barrier ``bar.sync id, n`` over ``num_threads`` threads (a multiple of 32; id 1..15, 0 is
    ``__syncthreads``; a Python int or a warp-uniform TIR value): e.g. every consumer warpgroup of a
    warp-specialized kernel, without the producer."""
    T.evaluate(T.ptx.bar.sync(*_named_barrier_operands("named_sync", barrier_id, num_threads)))


def named_arrive(barrier_id, num_threads: int):
    """``bar.arrive id, n``: count this warp on named barrier ``id`` and go on without waiting; the barrier
    completes when the other side's :func:`named_sync` brings the count to ``num_threads`` (a signal from one
    group of warps to another). A named barrier has no phases: a second arrive before the waiters' sync
    would count towards the same completion."""
    T.evaluate(T.ptx.bar.arrive(*_named_barrier_operands("named_arrive", barrier_id, num_threads)))
