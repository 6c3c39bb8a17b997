# SPDX-License-Identifier: Apache-2.0
"""1-D bulk copies (``cp.async.bulk``, the non-tensor form of TMA) for ``@T.prim_func`` bodies: a contiguous
run of bytes global -> shared completing on an mbarrier, and shared -> global in a bulk group.

No tensor map: the addresses are plain pointers (``X.ptr_to([...])``), so a row of any runtime stride can be
moved by one instruction issued by one thread (SASS ``UBLKCP.S.G`` / ``UBLKCP.G.S``). Requirements, which the
hardware does not check gracefully: both addresses 16-byte aligned, the size a multiple of 16 bytes (checked
here when it is a Python int).

- :func:`load`: ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``. The bytes count as
  transactions on ``bar``: announce them in the same phase with ``mbarrier.arrive_expect_tx`` (issued before
  the copy by the same thread; several loads may share one announcement of their sum). A consumer that has
  waited for the phase sees the data with ordinary ``ld.shared``.
- :func:`store`: ``cp.async.bulk.global.shared::cta.bulk_group``. Before it, the smem written by ordinary
  stores must be made visible to the async proxy: every writing thread ``fence_proxy_async()``, then a
  barrier of the writers, then one thread issues the store and :func:`commit`. The source may be rewritten
  only after :func:`wait_read` (the bulk engine has read it); the CTA must not exit before that either.
- Refilling a buffer that threads read with ``ld.shared`` needs no proxy fence: the readers' barrier (or
  mbarrier arrive) before the refill is issued orders their reads first, as in every TMA load ring.

The bulk-group commit/wait instructions are the ones TMA tensor stores use (``tma.store_commit`` ...): the
names here are aliases, so that a kernel reads as one protocol.
"""

from __future__ import annotations

from tvm.script import tirx as T

from . import tma

LOAD = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
STORE = "cp.async.bulk.global.shared::cta.bulk_group"
ALIGN = 16  # bytes: addresses and sizes

# L2 priorities for ``create_policy`` (the ``.L2::cache_hint`` operand of load/store).
EVICT_FIRST, EVICT_NORMAL, EVICT_LAST = tma.EVICT_FIRST, tma.EVICT_NORMAL, tma.EVICT_LAST
create_policy = tma.create_policy
fence_proxy_async = tma.fence_proxy_async
commit = tma.store_commit


def check_size(nbytes) -> None:
    """Trace-time check of a static size: a positive multiple of 16 bytes (runtime sizes pass unchecked)."""
    if isinstance(nbytes, int) and (nbytes <= 0 or nbytes % ALIGN):
        raise ValueError(f"bulk: copy size {nbytes} B must be a positive multiple of {ALIGN} B")


def _size(nbytes):
    check_size(nbytes)
    return T.uint32(nbytes) if isinstance(nbytes, int) else T.Cast("uint32", nbytes)


def load(dst, src, nbytes, bar, cache_policy=None):
    """``nbytes`` from global ``src`` to shared ``dst``, completing as transactions on mbarrier ``bar``
    (pointers from ``ptr_to``); ``cache_policy`` a ``uint64`` from :func:`create_policy`."""
    if cache_policy is None:
        T.evaluate(T.ptx[LOAD](dst, src, _size(nbytes), bar))
    else:
        T.evaluate(T.ptx[LOAD + ".L2::cache_hint"](dst, src, _size(nbytes), bar, cache_policy))


def store(dst, src, nbytes, cache_policy=None):
    """``nbytes`` from shared ``src`` to global ``dst`` in the current bulk group (then :func:`commit`)."""
    if cache_policy is None:
        T.evaluate(T.ptx[STORE](dst, src, _size(nbytes)))
    else:
        T.evaluate(T.ptx[STORE + ".L2::cache_hint"](dst, src, _size(nbytes), cache_policy))


def wait_read(pending: int = 0):
    """Block (the issuing thread) until at most ``pending`` committed groups still read their smem source."""
    tma.store_wait_read(pending)


def wait(pending: int = 0):
    """Block until at most ``pending`` committed groups are incomplete (their global writes done too)."""
    tma.store_wait(pending)
