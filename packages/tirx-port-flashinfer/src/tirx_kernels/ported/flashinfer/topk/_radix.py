# SPDX-License-Identifier: Apache-2.0
# Shared pieces of the top-k family (FlashInfer's radix top-k, include/flashinfer/topk.cuh, release v0.7.4, commit
# 77039051b0be921788dc2784ec41423b558878ec), written anew in TIRx.
"""Radix select over order-preserving unsigned keys, for ``@T.prim_func`` bodies (helpers run at parse time).

Keys: a score's raw bits (fp32: 32, fp16/bf16: 16) mapped so that unsigned order is the float order: a negative
score's bits are inverted, a non-negative one gets its sign bit set. Two scores torch treats as equal get equal
keys: -0.0 takes +0.0's key, and every NaN (either sign, any payload) takes the largest key, above +inf (torch.topk
ranks NaN above everything). The threshold search is one 8-bit digit a pass, most significant first: a 256-bin
shared histogram (shared atomics) of the keys that match the digits found so far, then one 256-thread prefix scan
finds the bin holding the k-th largest. Ties at the threshold are cut by index (the lowest indices win) with the same
machinery over the index bits, so every call selects the same set; the gather writes it in ascending index order.
"""

from __future__ import annotations

from tvm.script import tirx as T

THREADS = 1024
WARPS = THREADS // 32
RADIX = 256
SCAN_WARPS = RADIX // 32
KEY_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}
RAW = {"float32": "uint32", "float16": "uint16", "bfloat16": "uint16"}
_INF_BITS = {"float32": 0x7F800000, "float16": 0x7C00, "bfloat16": 0x7F80}
GATHER_ELEMS = 4  # elements a lane tests per gather tile (a warp covers 128 consecutive scores a tile)


def key_of(raw, dtype: str):
    """The order-preserving uint32 key of a score's raw bits (see the module docstring)."""
    bits = KEY_BITS[dtype]
    u = T.Cast("uint32", raw)
    sign = T.uint32(1 << (bits - 1))
    full = T.uint32((1 << bits) - 1)
    return T.Select((u & ~sign & full) > T.uint32(_INF_BITS[dtype]), full,
                    T.Select(u == sign, sign, T.Select((u & sign) != T.uint32(0), ~u & full, u | sign)))


def select_bin(hist, rem, tid, scan_tot, state):
    """The bin ``b`` where the inclusive prefix count of ``hist`` first reaches ``rem`` (>= 1, <= the total):
    ``state[0] = b``, ``state[1] = rem - count(bins < b)``, ``state[2] = hist[b]``. Every CTA thread calls it;
    it ends with a barrier after which ``state`` is readable (and ``hist`` may be rewritten)."""
    v = T.alloc_local((1,), "uint32")
    y = T.alloc_local((1,), "uint32")
    lane = tid % 32
    warp = tid // 32
    with T.If(tid < RADIX):
        with T.Then():
            h = hist[tid]
            T.buffer_store(v, h, [0])
            for d in (1, 2, 4, 8, 16):
                # every lane shuffles (full mask), the lanes below d keep their value
                T.buffer_store(y, T.tvm_warp_shuffle_up(T.uint32(0xFFFFFFFF), v[0], d, 32, 32), [0])
                with T.If(lane >= d):
                    with T.Then():
                        T.buffer_store(v, v[0] + y[0], [0])
            with T.If(lane == 31):
                with T.Then():
                    T.buffer_store(scan_tot, v[0], [warp])
    T.evaluate(T.cuda.cta_sync())
    with T.If(tid < RADIX):
        with T.Then():
            for w in range(SCAN_WARPS - 1):
                with T.If(warp > w):
                    with T.Then():
                        T.buffer_store(v, v[0] + scan_tot[w], [0])
            h = hist[tid]
            with T.If(T.And(v[0] >= rem, v[0] - h < rem)):
                with T.Then():
                    T.buffer_store(state, T.Cast("uint32", tid), [0])
                    T.buffer_store(state, rem - (v[0] - h), [1])
                    T.buffer_store(state, h, [2])
    T.evaluate(T.cuda.cta_sync())


def clear_hist(hist, tid):
    with T.If(tid < RADIX):
        with T.Then():
            T.buffer_store(hist, T.uint32(0), [tid])
    T.evaluate(T.cuda.cta_sync())


def count(hist, b):
    T.evaluate(T.cuda.atomic_add(hist.ptr_to([b]), T.uint32(1)))


def out_index(mode: str, index_dtype: str, col, row, aux, aux_stride):
    """What the output holds for a selected column: the column ("plain"), its page-table entry ``aux[row *
    aux_stride + col]`` ("page_table") or ``col + aux[row]`` ("ragged")."""
    if mode == "page_table":
        return T.Cast(index_dtype, aux[T.Cast("int64", row) * T.Cast("int64", aux_stride) + T.Cast("int64", col)])
    if mode == "ragged":
        return T.Cast(index_dtype, aux[row] + col)
    return T.Cast(index_dtype, col)
