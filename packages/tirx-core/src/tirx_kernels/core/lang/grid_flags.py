# SPDX-License-Identifier: Apache-2.0
"""Flags in global memory between the CTAs of one grid, for ``@T.prim_func`` bodies (stream-K: a CTA that
computed part of a tile's K range hands its partial accumulator to the CTA that finishes the tile).

The protocol (the one CUTLASS's generic barrier uses): every writer thread stores its data (``vector.store_v4``),
the writing threads meet at a barrier, then one thread :func:`publish` es the flag (``fence.acq_rel.gpu`` and a
relaxed store: a release at GPU scope, cumulative over the writes the barrier ordered before it). The reader: one
thread :func:`wait_for` s the flag (``ld.acquire.gpu`` in a loop), the readers meet at a barrier, then load the
data from L2 (``vector.load_v4(..., cache="cg")``: never a stale L1 line). A flag is used once per launch and
the reader puts it back to 0 (:func:`reset`), so flags stay zeroed between launches and need no memset.

Waits only terminate if the CTA that publishes is running or will run: grids that use these flags are at most
one CTA per SM, and a CTA only waits for CTAs of a higher index that publish before they wait themselves.

Helpers are traced: statements go through ``T.evaluate``; loops in them are Python loops (unrolled).
"""

from __future__ import annotations

from tvm.script import tirx as T


def publish(flag_ptr, value=1):
    """Set the ``int32`` flag at ``flag_ptr`` to ``value`` with release semantics at GPU scope: every write this
    thread's CTA ordered before it (through a barrier) is visible to a thread that acquires the flag."""
    T.evaluate(T.ptx["fence.acq_rel.gpu"]())
    T.evaluate(T.ptx["st.relaxed.gpu.global.b32"](flag_ptr, T.int32(value)))


def wait_for(flag_ptr, value, scratch):
    """Spin until the ``int32`` flag at ``flag_ptr`` reads ``value`` (``ld.acquire.gpu``); ``scratch`` is an
    ``int32`` local array (element 0 is used)."""
    T.evaluate(T.ptx["ld.acquire.gpu.global.b32"](scratch[0], flag_ptr))
    with T.While(scratch[0] != value):
        T.evaluate(T.ptx["ld.acquire.gpu.global.b32"](scratch[0], flag_ptr))


def reset(flag_ptr):
    """Put the flag back to 0 (after its one reader has acquired it): the next launch finds it zeroed."""
    T.evaluate(T.ptx["st.relaxed.gpu.global.b32"](flag_ptr, T.int32(0)))
