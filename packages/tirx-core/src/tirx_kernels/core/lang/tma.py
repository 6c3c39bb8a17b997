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


def load_2d(dst, tmap, col, row, bar, multicast_mask=None, cache_policy=None):
    """Load the box at element (``row``, ``col``) into smem ``dst``, completing bytes on ``bar``.

    With ``multicast_mask`` (a 16-bit CTA mask) the box lands at the same smem offset, and completes on
    the same barrier offset, in every CTA of the mask. With ``cache_policy`` (a ``uint64`` from
    :func:`create_policy`) the load carries that L2 eviction priority (:func:`load`'s ``.L2::cache_hint``).
    """
    if cache_policy is not None:
        load(dst, tmap, [col, row], bar, multicast_mask=multicast_mask, cache_policy=cache_policy)
    elif multicast_mask is None:
        T.evaluate(T.ptx[LOAD_2D](dst, T.address_of(tmap), col, row, bar))
    else:
        T.evaluate(T.ptx[LOAD_2D_MULTICAST](dst, T.address_of(tmap), col, row, bar, _mask_u16(multicast_mask)))


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


# ---------------------------------------------------------------------------------------------------------
# Rank 2-5 maps, L2 promotion and cache hints, OOB fill, prefetch, store read-completion
# ---------------------------------------------------------------------------------------------------------

# CUtensorMapL2promotion: how far the L2 fetch of each box request is widened.
L2_PROMOTION_NONE, L2_PROMOTION_64B, L2_PROMOTION_128B, L2_PROMOTION_256B = 0, 1, 2, 3
# CUtensorMapFloatOOBfill: out-of-bounds elements of a load box read as zero, or as a NaN that makes
# FMA ignore them ("NAN_REQUEST_ZERO_FMA"). GEMM tails need zeros.
OOB_FILL_ZERO, OOB_FILL_NAN = 0, 1
# createpolicy priorities for the .L2::cache_hint operand of loads and stores.
EVICT_FIRST, EVICT_NORMAL, EVICT_LAST = "L2::evict_first", "L2::evict_normal", "L2::evict_last"

_SPAN = {SWIZZLE_NONE: None, SWIZZLE_32B: 32, SWIZZLE_64B: 64, SWIZZLE_128B: 128}


def check_box(dtype: str, box, swizzle: int = SWIZZLE_128B):
    """Host-independent TMA limits on a box (innermost first), raised at trace time: 1 <= extent <= 256,
    the inner extent a multiple of 16 bytes, and at most the swizzle span when swizzled."""
    if not 1 <= len(box) <= 5:
        raise ValueError(f"tma: box rank {len(box)} is not 1..5")
    if any(not 1 <= b <= 256 for b in box):
        raise ValueError(f"tma: box {tuple(box)} has an extent outside 1..256")
    inner = box[0] * elem_bytes(dtype)
    if inner % 16:
        raise ValueError(f"tma: inner box extent {inner} B is not a multiple of 16 B")
    span = _SPAN[swizzle]
    if span is not None and inner > span:
        raise ValueError(f"tma: inner box extent {inner} B exceeds the {span} B swizzle span")
    return inner * _prod(box[1:])


def _prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def encode(tmap, data, dims, strides, box, dtype: str, swizzle=SWIZZLE_128B, l2_promotion=L2_PROMOTION_NONE,
           oob_fill=OOB_FILL_ZERO, elem_strides=None):
    """Host side: tiled map of rank ``len(dims)`` (2..5), every list innermost first.

    ``dims`` are element extents; ``strides`` the ``rank - 1`` *element* strides of dims 1.. (dim 0 is
    contiguous), widened to int64 and scaled to bytes here; ``box`` the smem box extents;
    ``elem_strides`` (default all 1) the traversal step per dim. Returns the box's byte count (what an
    ``arrive_expect_tx`` for one load of it must announce, in bounds or not).
    """
    rank = len(dims)
    if not 2 <= rank <= 5 or len(strides) != rank - 1 or len(box) != rank:
        raise ValueError(f"tma: rank {rank} map needs {rank - 1} strides and {rank} box extents")
    elem_strides = [1] * rank if elem_strides is None else list(elem_strides)
    nbytes = check_box(dtype, box, swizzle)
    eb = elem_bytes(dtype)
    byte_strides = [T.Cast("int64", s) * eb for s in strides]
    T.evaluate(T.tensormap_encode_tiled(tmap, data, *dims, *byte_strides, *box, *elem_strides,
                                        descriptor_dtype=dtype, rank=rank, swizzle=swizzle,
                                        l2_promotion=l2_promotion, oob_fill=oob_fill))
    return nbytes


def create_policy(policy, priority: str = EVICT_LAST):
    """Device side: an L2 cache policy (``uint64`` local element ``policy``) covering every access with
    ``priority``; pass it as ``cache_policy`` to :func:`load` / :func:`store` (``.L2::cache_hint``).
    E.g. evict_last for a GEMM's reused operand, evict_first for streamed-once data."""
    if priority not in (EVICT_FIRST, EVICT_NORMAL, EVICT_LAST):
        raise ValueError(f"tma: cache priority {priority!r}")
    T.evaluate(T.ptx[f"createpolicy.fractional.{priority}.b64"](policy))


def _mask_u16(mask):
    """A multicast CTA mask as the instruction's 16-bit operand: a Python int, or a traced expression (a mask that
    depends on the CTA's rank in a 2 x 2 cluster, ``core.lang.scheduler.multicast_a``) cast to ``uint16``."""
    return T.uint16(mask) if isinstance(mask, int) else T.Cast("uint16", mask)


def load(dst, tmap, coords, bar, multicast_mask=None, cache_policy=None):
    """Load the box at ``coords`` (innermost first, rank = ``len(coords)``) into smem ``dst``, completing
    its bytes on ``bar``; optionally multicast to every CTA of the 16-bit ``multicast_mask`` (same smem
    and barrier offsets there) and with an L2 ``cache_policy``."""
    rank = len(coords)
    name = f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ops = [dst, T.address_of(tmap), *coords, bar]
    if multicast_mask is not None:
        name += ".multicast::cluster"
        ops.append(_mask_u16(multicast_mask))
    if cache_policy is not None:
        name += ".L2::cache_hint"
        ops.append(cache_policy)
    T.evaluate(T.ptx[name](*ops))


def store(tmap, coords, src, cache_policy=None):
    """Store the smem box ``src`` at ``coords`` (innermost first); clipped at the tensor's edge. Same
    fence / barrier / commit discipline as :func:`store_2d`."""
    name = f"cp.async.bulk.tensor.{len(coords)}d.global.shared::cta.tile.bulk_group"
    ops = [T.address_of(tmap), *coords, src]
    if cache_policy is not None:
        name += ".L2::cache_hint"
        ops.append(cache_policy)
    T.evaluate(T.ptx[name](*ops))


def prefetch(tmap, coords):
    """Pull the box at ``coords`` into L2 (no smem, no barrier)."""
    T.evaluate(T.ptx[f"cp.async.bulk.prefetch.tensor.{len(coords)}d.L2.global.tile"](T.address_of(tmap), *coords))


def store_wait_read(pending: int = 0):
    """Block until at most ``pending`` committed store groups still *read* their smem source: the staging
    buffer may then be rewritten, while the global writes may still be in flight (cheaper than
    :func:`store_wait`, which waits for the writes too)."""
    T.evaluate(T.ptx["cp.async.bulk.wait_group.read"](pending))


def prefetch_descriptor(tmap):
    """Warm the tensor-map descriptor cache line (once per CTA, before the first use)."""
    T.evaluate(T.ptx["prefetch.tensormap"](T.address_of(tmap)))
