# SPDX-License-Identifier: Apache-2.0
"""Rows at any alignment, for the general (runtime-size) row kernels: a row is cut into *chunks* of one 16-byte
vector (8 bf16/fp16 elements) aligned to a 16-byte boundary of some row, so a chunk inside the row is one vector
access and only a row's first and last chunk (its unaligned head and tail) go element by element.

Chunk ``k`` of a row that starts ``a`` elements past a 16-byte boundary (``row_misalign``) covers columns
``c0 = 8 k - a .. c0 + 8``. Another row (the weight, the gate / up half, out) aligned ``b`` elements past its own
boundary holds the same columns ``s = (b - a) mod 8`` elements past a boundary: the two aligned vectors around
them, shifted down by ``s`` in registers (``shift_down``), give the chunk. Helpers run while the prim_func is
parsed (as ``vector``'s); offsets are 64-bit, ``c0`` and the row length 32-bit.
"""

from __future__ import annotations

from tvm.script import tirx as T

from . import vector

CHUNK = 8  # elements of a chunk: one 16-byte vector of 2-byte elements
_WORDS = vector.WORDS_PER_VECTOR


def misalign(ptr):
    """Elements (0..7) a 2-byte element pointer lies past a 16-byte boundary."""
    return T.Cast("int32", (T.reinterpret("uint64", ptr) >> T.uint64(1)) & T.uint64(7))


def row_misalign(ptr, row_offset):
    """Elements (0..7) the row ``row_offset`` (int64, elements) past ``ptr`` starts past a 16-byte boundary."""
    return T.Cast("int32", (T.Cast("int64", misalign(ptr)) + row_offset) & T.int64(7))


def chunk_inside(c0, n):
    """The chunk at column ``c0`` lies wholly inside a row of ``n`` columns (not its head or tail)."""
    return T.And(c0 >= 0, c0 + CHUNK <= n)


def shift_down(dst, src, tmp, s):
    """``dst[0:4]`` <- the 16 bytes starting ``s`` (0..7, runtime) 16-bit elements into ``src[0:8]`` (two
    16-byte vectors): select by 2 words, by 1 word (through ``tmp[0:6]``), then a 16-bit funnel (15 selects and
    4 funnels, no dynamic indexing: a runtime register index would put the words in local memory)."""
    for i in range(6):
        T.buffer_store(tmp, T.if_then_else((s & 4) != 0, src[i + 2], src[i]), [i])
    for i in range(5):
        T.buffer_store(tmp, T.if_then_else((s & 2) != 0, tmp[i + 1], tmp[i]), [i])
    for j in range(_WORDS):
        odd = (tmp[j] >> T.uint32(16)) | (tmp[j + 1] << T.uint32(16))
        T.buffer_store(dst, T.if_then_else((s & 1) != 0, odd, tmp[j]), [j])


def store_elements(buf, row_base, c0, n, regs, dtype: str):
    """The chunk's packed words ``regs[0:4]`` stored element by element at ``buf[row_base + c0 + e]`` (int64
    ``row_base``), only the columns inside a row of ``n`` (a head or tail chunk)."""
    for e in range(CHUNK):
        with T.If(T.And(c0 + e >= 0, c0 + e < n)):
            with T.Then():
                half = T.Cast("uint16", regs[e // 2] >> T.uint32(16 * (e % 2)))
                T.buffer_store(buf, T.reinterpret(dtype, half), [row_base + T.Cast("int64", c0 + e)])
