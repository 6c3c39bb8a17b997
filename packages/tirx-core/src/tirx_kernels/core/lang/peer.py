# SPDX-License-Identifier: Apache-2.0
"""Flags and buffers shared between GPUs (peer memory over NVLink: torch symmetric-memory or NVSHMEM buffers), for
``@T.prim_func`` bodies. The distributed kernels (``tirx_kernels.gemm.allgather_gemm`` / ``gemm_reduce_scatter``,
``tirx_kernels.ported.deepep``) use them; no NVLink multicast (multimem / NVLS) anywhere.

The protocol is :mod:`grid_flags`' at system scope: a writer makes its data visible, then one thread
:func:`signal_add` s a flag (``fence.acq_rel.sys`` and a relaxed ``red.add`` at system scope: a release cumulative
over the writes a barrier ordered before it); a reader thread :func:`wait_geq` s the flag (``ld.acquire.sys`` in a
loop), the readers meet at a barrier, then load the data with loads that do not hit a stale L1 line (``.cg`` /
``.volatile``). A flag counts arrivals (several writers add to one flag, the reader waits for the total), and the
host zeroes the flags of a call before any writer runs, so a count never mixes two calls.

Data written by TMA stores (the async proxy) is published only after ``cp.async.bulk.wait_group 0`` (written, not only
read) and :func:`async_writes_to_generic` (``fence.proxy.async.global``); data a TMA load will read after a generic
acquire needs the same fence between the acquire and the load.

Peer buffers: a kernel gets its own buffer (a ``match_buffer`` parameter) and a table of int64 *byte offsets* from
it to each peer's buffer (``peer_base - own_base``: symmetric-memory buffers are separately mapped, so the offsets are
arbitrary multiples of the allocation granularity); :func:`peer_elem_offset` turns one into an element offset of the
own buffer's dtype. With one rank the table holds 0 (the buffer itself), and a single-process simulation of several
ranks puts every "peer" buffer in one allocation (the CPU emulator then checks every access against it).

Helpers are traced: statements go through ``T.evaluate``; loops in them are Python loops (unrolled).
"""

from __future__ import annotations

from tvm.script import tirx as T


def wait_geq(flag_ptr, value, scratch):
    """Spin until the ``int32`` flag at ``flag_ptr`` (own or peer memory) is at least ``value``
    (``ld.acquire.sys``); ``scratch`` is an ``int32`` local array (element 0 is used)."""
    T.evaluate(T.ptx["ld.acquire.sys.global.b32"](scratch[0], flag_ptr))
    with T.While(scratch[0] < value):
        T.evaluate(T.ptx["ld.acquire.sys.global.b32"](scratch[0], flag_ptr))


def signal_add(flag_ptr, value=1):
    """Add ``value`` to the ``int32`` flag at ``flag_ptr`` (own or peer memory) with release semantics at system
    scope: every write this thread's CTA ordered before it (through a barrier) is visible to a thread on any GPU
    that acquires the flag."""
    T.evaluate(T.ptx["fence.acq_rel.sys"]())
    T.evaluate(T.ptx["red.relaxed.sys.global.add.s32"](flag_ptr, T.int32(value)))


def system_fence():
    """``fence.acq_rel.sys``: this thread's earlier writes (peer stores too) are ordered before its later ones for
    every observer in the system; at a kernel's end, before a host-side barrier publishes them."""
    T.evaluate(T.ptx["fence.acq_rel.sys"]())


def async_writes_to_generic():
    """``fence.proxy.async.global``: orders this thread's completed async-proxy (TMA) global accesses with its
    later generic ones (a flag release after TMA stores) and its generic acquires with its later TMA loads."""
    T.evaluate(T.ptx["fence.proxy.async.global"]())


def peer_elem_offset(delta_bytes, dtype_bytes: int):
    """The element offset (int64) of a peer buffer from the own buffer, given the byte offset from the peer table
    (a multiple of the element size: buffers are allocation-aligned)."""
    return T.Cast("int64", delta_bytes) // T.int64(dtype_bytes)
