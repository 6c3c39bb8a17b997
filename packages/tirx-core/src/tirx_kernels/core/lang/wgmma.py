# SPDX-License-Identifier: Apache-2.0
"""Hopper wgmma inside ``@T.prim_func`` bodies: instruction names, smem descriptors, issue, fence/commit/wait,
and the m64nN f32 accumulator fragment map.

TIRx has no tile-level wgmma dispatch on sm_90a, so this is the layer every Hopper GEMM-like kernel uses.
Each helper emits its statements through ``T.evaluate``: TIRx traces a plain Python helper called from a
kernel body, and a bare ``T.ptx.*`` call inside a helper builds an expression that is silently dropped
(seen in the codegen: the ``if`` around it came out empty).
"""

from __future__ import annotations

from tvm.script import tirx as T

M = 64  # wgmma's M is fixed: one warpgroup (4 warps x 16 rows)
K_BYTES = 32  # every 16-bit wgmma consumes 32 bytes of K (k16 for bf16/fp16)

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}
# CUtensorMapSwizzle numbering (what the TMA encode takes) == the encode helper's `swizzle` argument.
SWIZZLE_128B = 3


def instr_name(n: int, dtype: str, k: int = 16) -> str:
    """PTX name of the SS wgmma with an f32 accumulator, e.g. ``...m64n256k16.f32.bf16.bf16``."""
    if dtype not in _PTX_TYPE:
        raise ValueError(f"wgmma: dtype {dtype!r} is not one of {sorted(_PTX_TYPE)}")
    if k != 16:
        raise ValueError("wgmma: 16-bit inputs take K=16 per instruction")
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma: N={n} must be a multiple of 8 in [8, 256]")
    t = _PTX_TYPE[dtype]
    return f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t}"


def acc_regs(n: int) -> int:
    """f32 accumulator registers per thread for m64nN: 64*N values over 128 threads."""
    return n // 2


def encode_desc_kmajor_sw128(desc_ptr, smem_ptr):
    """Matrix descriptor for a K-major operand tile stored as rows of 128 bytes with the 128B swizzle.

    This is the layout TMA writes for a box whose inner (K) extent is 128 bytes with
    ``CU_TENSOR_MAP_SWIZZLE_128B``: row r at byte 128*r, its 16-byte chunks XOR-permuted by r % 8, so
    the swizzle repeats every 8 rows = 1024 bytes. Both offsets are in 16-byte units:
    - LBO (leading byte offset) = 1: the distance between core matrices along K. A swizzled K-major
      operand never steps along K inside one wgmma (16 elements = 32 bytes sit inside one 128-byte row), so
      the hardware ignores it; 1 is the conventional value.
    - SBO (stride byte offset) = 64 (1024 bytes): from one group of 8 rows (8x128 B) to the next along
      M/N.
    ``smem_ptr`` must point into a 1024-byte-aligned tile (the descriptor's base_offset is 0); stepping K
    by 16 elements inside the 128-byte row is ``+32 bytes`` on ``smem_ptr`` (the swizzle is applied by the
    hardware on absolute address bits, which is why the tile base must be 1024-aligned).
    """
    T.evaluate(T.cuda.wgmma.encode_matrix_descriptor(desc_ptr, smem_ptr, 1, 64, SWIZZLE_128B))


def mma_ss(n: int, dtype: str, acc, desc_a, desc_b, acc_offset: int = 0, scale_d=True):
    """Issue one ``D += A*B`` wgmma m64nNk16 (A, B from smem descriptors) over ``acc[acc_offset:+N/2]``.

    ``scale_d`` False makes it ``D = A*B`` (the accumulator's old value is ignored). The trailing immediates
    are scale-a = scale-b = 1 and no transpose: both operands are K-major.
    """
    regs = [acc[acc_offset + i] for i in range(acc_regs(n))]
    T.evaluate(T.ptx[instr_name(n, dtype)](*regs, desc_a, desc_b, T.bool(scale_d), 1, 1, 0, 0))


def fence():
    """Before the first wgmma that reads accumulators last written by ordinary instructions (or smem)."""
    T.evaluate(T.ptx.wgmma.fence.sync.aligned())


def commit():
    T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())


def wait(pending: int):
    """Block until at most ``pending`` committed wgmma groups are still in flight."""
    T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(pending))


def acc_index(j, r, e):
    """Register index in the m64nN f32 fragment of the value at column block ``j`` (8 columns), row half
    ``r`` (0: rows 0-7 of the warp's 16, 1: rows 8-15) and element ``e`` (0/1 = even/odd column)."""
    return j * 4 + r * 2 + e


def acc_row(warp, lane, r):
    """Row (0..63) of the warpgroup's 64-row tile held by ``lane`` of ``warp`` (0..3) in row half ``r``."""
    return warp * 16 + lane // 4 + r * 8


def acc_col(lane, j, e=0):
    """Column of element ``e`` in column block ``j``: each lane holds 2 adjacent columns per 8."""
    return j * 8 + (lane % 4) * 2 + e
