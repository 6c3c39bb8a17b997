# SPDX-License-Identifier: Apache-2.0
"""TMA (cp.async.bulk.tensor) helpers: host-side 2-D tensor-map encode, device-side load (optionally
multicast over the cluster) and store with its bulk-group commit/wait, and the SW128 staging address.

Call ``encode_2d`` before ``T.device_entry()`` (host code, on a ``T.Bind(T.tvm_stack_alloca("tensormap",
1))``); the map becomes a ``const __grid_constant__ CUtensorMap`` kernel parameter automatically. Device
helpers emit through ``T.evaluate`` (a bare ``T.ptx.*`` call in a traced helper is dropped).

Out-of-bounds behaviour, which ragged GEMM tails rely on: a load box reaching past the tensor's edge is
zero-filled in smem (and still completes its full byte count on the mbarrier); a store box is clipped to
the tensor, so rows/columns beyond it are never written.
"""

from __future__ import annotations

from tvm.script import tirx as T

# CUtensorMapSwizzle
SWIZZLE_NONE, SWIZZLE_32B, SWIZZLE_64B, SWIZZLE_128B = 0, 1, 2, 3
_ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1}

LOAD_2D = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
LOAD_2D_MULTICAST = LOAD_2D + ".multicast::cluster"
STORE_2D = "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"


def elem_bytes(dtype: str) -> int:
    return _ELEM_BYTES[dtype]


def encode_2d(tmap, data, rows, cols, row_stride, box_rows, box_cols, dtype: str, swizzle=SWIZZLE_128B,
              l2_promotion=0):
    """Host side: tiled map of a row-major ``[rows, cols]`` matrix (``row_stride`` in elements).

    TMA's innermost dimension comes first, so the map is (cols, rows). Requirements the caller validates
    on the host: data pointer and ``row_stride * elem`` multiples of 16 bytes; ``box_cols * elem`` at most
    the swizzle span (128 bytes for SW128); each box extent at most 256. ``row_stride`` is widened to
    int64 before the byte multiply so large matrices cannot overflow int32.
    """
    eb = elem_bytes(dtype)
    T.evaluate(T.tensormap_encode_tiled(tmap, data, cols, rows, T.Cast("int64", row_stride) * eb, box_cols,
                                        box_rows, 1, 1, descriptor_dtype=dtype, rank=2, swizzle=swizzle,
                                        l2_promotion=l2_promotion))


def load_2d(dst, tmap, col, row, bar, multicast_mask=None):
    """Load the box at element (``row``, ``col``) into smem ``dst``, completing bytes on ``bar``.

    With ``multicast_mask`` (a 16-bit CTA mask) the box lands at the same smem offset, and completes on
    the same barrier offset, in every CTA of the mask.
    """
    if multicast_mask is None:
        T.evaluate(T.ptx[LOAD_2D](dst, T.address_of(tmap), col, row, bar))
    else:
        T.evaluate(T.ptx[LOAD_2D_MULTICAST](dst, T.address_of(tmap), col, row, bar, T.uint16(multicast_mask)))


def store_2d(tmap, col, row, src):
    """Store the smem box ``src`` to element (``row``, ``col``) of the map; clipped at the tensor's edge.

    Before it: the generic-proxy writes of ``src`` need ``fence_proxy_async()`` and a barrier of the
    writing threads; after it, ``store_commit()`` then ``store_wait(0)`` before smem is reused or freed.
    """
    T.evaluate(T.ptx[STORE_2D](T.address_of(tmap), col, row, src))


def fence_proxy_async():
    """Make this thread's ordinary smem writes visible to the async proxy (TMA store reads)."""
    T.evaluate(T.ptx.fence.proxy.async_.shared__cta())


def store_commit():
    T.evaluate(T.ptx.cp.async_.bulk.commit_group())


def store_wait(pending: int = 0):
    T.evaluate(T.ptx.cp.async_.bulk.wait_group(pending))


def sw128_offset(row, col, dtype: str):
    """Element offset of (``row``, ``col``) inside a tile of 128-byte rows stored with the 128B swizzle.

    The layout TMA expects for an SW128 box (and writes for loads): byte ``128*row + 16*((col_bytes // 16)
    ^ (row % 8)) + col_bytes % 16``, i.e. the 16-byte chunk index is XORed with the row mod 8. The tile
    base must be 1024-byte aligned (the swizzle uses absolute address bits). A warp writing 4 bytes per lane
    at 8 rows x 4 consecutive words (the wgmma accumulator pattern) hits 32 distinct banks.
    """
    per_chunk = 16 // elem_bytes(dtype)
    per_row = 128 // elem_bytes(dtype)
    return row * per_row + ((col // per_chunk) ^ (row % 8)) * per_chunk + col % per_chunk
