# SPDX-License-Identifier: Apache-2.0
"""Sums across threads for ``@T.prim_func`` bodies: within a warp (shuffle butterfly) and across the
warps of a thread group (one shared-memory exchange).

A *group* is ``threads_per_group`` consecutive threads of the CTA (e.g. the threads of one row of a
row-wise norm); a CTA may hold several groups. Every thread of the CTA must call these helpers (the
shuffles use the full mask, the group sum has a CTA barrier), also threads whose data is masked off.
"""

from __future__ import annotations

from tvm.script import tirx as T

WARP_SIZE = 32


def warp_sum(value, width: int = WARP_SIZE):
    """Sum of ``value`` over each aligned run of ``width`` lanes (a power of two, 2..32), in every lane.

    ``T.cuda.warp_sum`` emits ``log2(width)`` ``__shfl_xor_sync`` steps (SHFL.BFLY in SASS), nothing else.
    """
    return T.cuda.warp_sum(value, width)


def scratch_words(threads_per_group: int, num_groups: int) -> int:
    """Shared fp32 words ``group_sum`` needs: one per warp when a group spans several warps, else 0."""
    if threads_per_group <= WARP_SIZE:
        return 0
    return (threads_per_group // WARP_SIZE) * num_groups


def group_sum(value, tid, threads_per_group: int, scratch=None, scratch_offset=0):
    """Sum of ``value`` over the ``threads_per_group`` consecutive threads that ``tid`` belongs to.

    Up to 32 threads (a power of two): shuffles only. More (a multiple of 32): each warp shuffles, lane 0
    writes its partial to ``scratch`` (shared fp32, ``scratch_words(...)`` long), one ``__syncthreads``,
    then every thread adds its group's partials itself (broadcast reads). That is one barrier where
    ``T.cuda.cta_sum`` takes two (warp 0 reduces the partials and broadcasts through smem again), and it
    serves several groups per CTA and warp counts that are not a power of two (5 or 7 warps a row).
    Call it once per ``scratch`` buffer: a second use needs a ``T.cuda.cta_sync()`` in between, or
    alternate between two halves of a twice-as-long buffer with ``scratch_offset`` (0 / ``scratch_words``;
    may be a TIR expression): a loop doing that needs only this one barrier per trip.
    """
    if threads_per_group <= WARP_SIZE:
        if threads_per_group & (threads_per_group - 1) or threads_per_group < 2:
            raise ValueError(f"group_sum: threads_per_group {threads_per_group} must be a power of two >= 2")
        return warp_sum(value, threads_per_group)
    if threads_per_group % WARP_SIZE:
        raise ValueError(f"group_sum: threads_per_group {threads_per_group} > 32 must be a multiple of 32")
    if scratch is None:
        raise ValueError("group_sum: a group wider than a warp needs a shared scratch buffer")
    warps = threads_per_group // WARP_SIZE
    partial = T.alloc_local((1,), "float32")
    T.buffer_store(partial, warp_sum(value), [0])
    warp = tid // WARP_SIZE
    with T.If(tid % WARP_SIZE == 0):
        with T.Then():
            T.buffer_store(scratch, partial[0], [scratch_offset + warp])
    T.evaluate(T.cuda.cta_sync())
    first = scratch_offset + (warp // warps) * warps
    total = scratch[first]
    for i in range(1, warps):
        total = total + scratch[first + i]
    T.buffer_store(partial, total, [0])
    return partial[0]
