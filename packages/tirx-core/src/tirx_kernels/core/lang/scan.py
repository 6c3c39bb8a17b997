# SPDX-License-Identifier: Apache-2.0
"""Prefix scans across the threads of a CTA for ``@T.prim_func`` bodies: sum, max or min of one integer or float
value per thread, in thread order, with a running carry so that a loop over tiles of the CTA's width scans an array of
any length.

Every thread of the CTA must call :func:`cta_scan` (the shuffles use the full mask, and there is a CTA barrier),
also threads whose element is past the end (they pass the operation's identity, e.g. 0 for a sum).
"""

from __future__ import annotations

from tvm.script import tirx as T

WARP_SIZE = 32
OPS = ("sum", "max", "min")
_FULL = 0xFFFFFFFF


def scratch_words(threads: int) -> int:
    """Shared words (of the scanned dtype) :func:`cta_scan` needs: one per warp."""
    return threads // WARP_SIZE


def combine(op: str, a, b):
    if op == "sum":
        return a + b
    if op == "max":
        return T.max(a, b)
    if op == "min":
        return T.min(a, b)
    raise ValueError(f"scan: op {op!r} is one of {OPS}")


def warp_inclusive_scan(buf, index, lane, op: str, tmp) -> None:
    """``buf[index]`` (a local buffer element) becomes the inclusive ``op``-scan of it over the lanes of the warp:
    five ``__shfl_up_sync`` steps (Hillis-Steele), lanes below the distance keep their value (no identity element
    is needed, so none is spelt: an int32 minimum would be a ``long`` literal in the generated C). ``tmp`` is a
    local element (``(buffer, index)``): each shuffle lands there first so that every lane runs it (a shuffle inside
    the select would be a ternary operand in the generated C, skipped by the lanes that do not take it)."""
    tbuf, ti = tmp
    for step in (1, 2, 4, 8, 16):
        T.buffer_store(tbuf, T.cuda.__shfl_up_sync(T.uint32(_FULL), buf[index], step, WARP_SIZE), [ti])
        T.buffer_store(buf, T.Select(lane >= step, combine(op, tbuf[ti], buf[index]), buf[index]), [index])


def cta_scan(value, tid, threads: int, scratch, out, op: str = "sum", carry=None, scratch_offset=0) -> None:
    """Scan ``value`` over the ``threads`` threads of the CTA (a multiple of 32, at most 1024) in ``tid`` order,
    starting from ``carry`` (the scan of everything before this tile). Writes into the local buffer ``out`` (3
    elements of the scratch's dtype): ``out[0]`` the inclusive scan (carry, values of threads 0..tid), ``out[1]``
    the exclusive scan (carry, values of threads 0..tid-1; thread 0: the carry), ``out[2]`` the total (carry and
    all ``threads`` values, the same in every thread: the next tile's carry). ``carry`` is read before ``out`` is
    written (it may be ``out[2]`` of the previous tile). A sum's carry may be None (0); max and min take one (a
    value no element is below / above, e.g. 0 for clamped lengths): their identity is the caller's to know.

    Each warp scans its values on shuffles, lane 31 writes the warp's total to ``scratch`` (shared,
    ``scratch_words(threads)`` long, from ``scratch_offset``), one ``__syncthreads``, then every warp scans the warp
    totals itself (lane w holds warp w's) and takes its prefix and the CTA total by two more shuffles: one barrier
    per scan, where a warp-0 pass over the totals takes two. A second call on the same scratch words needs a
    barrier in between (a fast thread would overwrite totals a slow one has not read); calls that alternate between
    two regions of ``scratch`` need none (each call's barrier orders the other region's reads before its writes).
    """
    if threads % WARP_SIZE or not WARP_SIZE <= threads <= 1024:
        raise ValueError(f"cta_scan: threads {threads} must be a multiple of 32 in [32, 1024]")
    if op not in OPS:
        raise ValueError(f"cta_scan: op {op!r} is one of {OPS}")
    dtype = scratch.dtype
    if carry is None:
        if op != "sum":
            raise ValueError(f"cta_scan: a {op}-scan needs a carry (a value below / above every element)")
        carry = T.Cast(dtype, 0)
    warps = threads // WARP_SIZE
    lane = tid % WARP_SIZE
    warp = tid // WARP_SIZE
    # own: this thread's running scan; tmp: a shuffle's result; totals: the scan of warp totals; below: lane - 1's
    # inclusive scan; before: the warps before this one (carry included); every: all warps (carry included).
    own, tmp, totals, below, before, every = range(6)
    acc = T.alloc_local((6,), dtype)
    # Within the warp.
    T.buffer_store(acc, T.Cast(dtype, value), [own])
    warp_inclusive_scan(acc, own, lane, op, (acc, tmp))
    T.buffer_store(acc, T.cuda.__shfl_up_sync(T.uint32(_FULL), acc[own], 1, WARP_SIZE), [below])
    with T.If(lane == WARP_SIZE - 1):
        with T.Then():
            T.buffer_store(scratch, acc[own], [scratch_offset + warp])
    T.evaluate(T.cuda.cta_sync())
    # Across warps: lane w scans the totals of warps 0..w (the index clamped: lanes past the last warp read it again
    # and are never asked for).
    T.buffer_store(acc, scratch[scratch_offset + T.min(lane, warps - 1)], [totals])
    warp_inclusive_scan(acc, totals, lane, op, (acc, tmp))
    T.buffer_store(acc, T.cuda.__shfl_sync(T.uint32(_FULL), acc[totals], T.max(warp - 1, 0), WARP_SIZE), [before])
    T.buffer_store(acc, T.cuda.__shfl_sync(T.uint32(_FULL), acc[totals], warps - 1, WARP_SIZE), [every])
    T.buffer_store(acc, T.Select(warp > 0, combine(op, carry, acc[before]), carry), [before])
    T.buffer_store(acc, combine(op, carry, acc[every]), [every])
    T.buffer_store(out, combine(op, acc[before], acc[own]), [0])
    T.buffer_store(out, T.Select(lane > 0, combine(op, acc[before], acc[below]), acc[before]), [1])
    T.buffer_store(out, acc[every], [2])
