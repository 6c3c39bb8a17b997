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


# ---------------------------------------------------------------------------------------------------------
# Every input type, SS and RS forms (the helpers above are the bf16/fp16 K-major SS subset the GEMM uses)
# ---------------------------------------------------------------------------------------------------------

# dtype -> (PTX type, K per instruction). Every wgmma consumes 32 bytes of K per row: k16 for 16-bit
# inputs, k8 for tf32 (fp32 storage, the low 13 mantissa bits ignored), k32 for fp8.
_INPUTS = {
    "bfloat16": ("bf16", 16),
    "float16": ("f16", 16),
    "float32": ("tf32", 8),
    "float8_e4m3fn": ("e4m3", 32),
    "float8_e5m2": ("e5m2", 32),
}
# Only the 16-bit inputs have the transpose immediates, i.e. may be MN-major in smem; tf32 and fp8
# operands must be K-major (ISA 9.7.17.5.2).
_TRANSPOSABLE = ("bf16", "f16")
_FP8 = ("e4m3", "e5m2")

K_MAJOR, MN_MAJOR = "K", "MN"


def _input(dtype: str) -> tuple[str, int]:
    if dtype not in _INPUTS:
        raise ValueError(f"wgmma: dtype {dtype!r} is not one of {sorted(_INPUTS)}")
    return _INPUTS[dtype]


def k_per_instr(dtype: str) -> int:
    """K extent of one wgmma for this input type (16, 8 for tf32, 32 for fp8)."""
    return _input(dtype)[1]


def can_transpose(dtype: str) -> bool:
    """Whether the operand may be MN-major (``imm-trans`` exists only for bf16/fp16)."""
    return _input(dtype)[0] in _TRANSPOSABLE


def mma_name(n: int, a_dtype: str, b_dtype: str | None = None) -> str:
    """PTX name of the f32-accumulator wgmma m64nNkK for any input pair (SS and RS share the name).

    bf16/fp16/tf32 take the same type on both sides; fp8 mixes e4m3 and e5m2 freely.
    """
    b_dtype = a_dtype if b_dtype is None else b_dtype
    (ta, k), (tb, _) = _input(a_dtype), _input(b_dtype)
    if ta != tb and not (ta in _FP8 and tb in _FP8):
        raise ValueError(f"wgmma: cannot mix {a_dtype} and {b_dtype}")
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma: N={n} must be a multiple of 8 in [8, 256]")
    return f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ta}.{tb}"


def operand_count(n: int, dtype: str, form: str = "ss") -> int:
    """Operands the instruction takes: N/2 f32 accumulators, A (1 descriptor, or 4 b32 registers for RS),
    the B descriptor, scale-d, imm-scale-a/b, and for 16-bit inputs imm-trans-a (SS only) and imm-trans-b."""
    if form not in ("ss", "rs"):
        raise ValueError(f"wgmma: form {form!r} is 'ss' or 'rs'")
    trans = (2 if form == "ss" else 1) if can_transpose(dtype) else 0
    return acc_regs(n) + (1 if form == "ss" else 4) + 1 + 1 + 2 + trans


def mma(n: int, acc, a, desc_b, a_dtype: str, b_dtype: str | None = None, *, scale_d=True,
        a_major: str = K_MAJOR, b_major: str = K_MAJOR, acc_offset: int = 0):
    """Issue one ``D (+)= A*B`` wgmma m64nNkK over ``acc[acc_offset : acc_offset + N/2]``.

    ``a`` is A's smem descriptor (SS form) or a sequence of 4 ``uint32`` register values holding this
    thread's A fragment (RS form, see :func:`a_frag_row`). ``scale_d`` is a Python bool or a warp-uniform
    TIR predicate: false makes it ``D = A*B`` (how a persistent kernel restarts its accumulator per tile
    without a zeroing loop). ``*_major`` = ``"MN"`` sets the operand's transpose immediate (16-bit only;
    an RS A is always K-major: it sits in registers).
    """
    rs = isinstance(a, list | tuple)
    b_dtype = a_dtype if b_dtype is None else b_dtype
    name = mma_name(n, a_dtype, b_dtype)
    for dt, major, what in ((a_dtype, a_major, "A"), (b_dtype, b_major, "B")):
        if major not in (K_MAJOR, MN_MAJOR):
            raise ValueError(f"wgmma: {what} major {major!r} is 'K' or 'MN'")
        if major == MN_MAJOR and not can_transpose(dt):
            raise ValueError(f"wgmma: {dt} {what} must be K-major (no transpose for tf32/fp8)")
    if rs and (len(a) != 4 or a_major != K_MAJOR):
        raise ValueError("wgmma RS: A is 4 b32 registers, K-major")
    pred = T.bool(scale_d) if isinstance(scale_d, bool) else scale_d
    ops = [acc[acc_offset + i] for i in range(acc_regs(n))]
    ops += list(a) if rs else [a]
    ops += [desc_b, pred, 1, 1]
    if can_transpose(a_dtype):
        ops += ([] if rs else [int(a_major == MN_MAJOR)]) + [int(b_major == MN_MAJOR)]
    assert len(ops) == operand_count(n, a_dtype, "rs" if rs else "ss")
    T.evaluate(T.ptx[name](*ops))


def a_frag_row(warp, lane, i):
    """Row (0..63) of A register ``i`` (0..3) of an RS wgmma: the m16 A fragment of ``mma.sync`` per warp;
    odd registers hold the lower 8 rows of the warp's 16."""
    return warp * 16 + lane // 4 + (i % 2) * 8


def a_frag_col(lane, i, e, dtype: str):
    """K index of element ``e`` (0 .. 4/elem_bytes - 1) packed in A register ``i``: registers 0/1 cover
    the first half of the instruction's K, 2/3 the second; each lane holds 4 bytes of K per register."""
    k = k_per_instr(dtype)
    per_reg = k // 8  # elements of 4 bytes: 2 (16-bit), 1 (tf32), 4 (fp8)
    return (i // 2) * (k // 2) + (lane % 4) * per_reg + e


def acc_as_rs_a(kk, i, e):
    """The f32 accumulator register (of an m64nN fragment) that holds element ``e`` of RS A register ``i`` of k16
    step ``kk``, when a 16-bit product of one wgmma feeds the next as its A (attention's P = softmax(S) into PV).

    A register ``i`` sits at the accumulator's rows (row half ``i % 2``) and at K columns ``8 (i // 2) + 2 (lane %
    4) + e`` of the step, i.e. accumulator column block ``2 kk + i // 2``: the same thread holds both, so the
    conversion needs no shuffle or shared memory. Pack elements 0 and 1 into one b32 (cvt ...x2, element 0 in the
    low half). 16-bit inputs only (k16)."""
    return acc_index(2 * kk + i // 2, i % 2, e)


# ---------------------------------------------------------------------------------------------------------
# Shared-memory matrix descriptors: K-major and MN-major, no swizzle / 32 / 64 / 128-byte swizzle
# ---------------------------------------------------------------------------------------------------------
#
# A descriptor names the smem tile of one wgmma operand: start address, LBO (leading-dimension byte
# offset), SBO (stride-dimension byte offset), both in 16-byte units (14 bits each: < 256 KB), and the
# swizzle mode. The hardware sees the tile as "core matrices" of 8 rows x 16 bytes and the two offsets
# say where the next core matrix is. What they mean depends on the operand's major-ness (S = swizzle
# span in bytes, 32/64/128; the layouts below are exactly what a TMA box with that swizzle writes):
#
# K-major (K contiguous: A (M, K) and B (N, K) of an NT GEMM), TMA box inner extent = S bytes of K:
#   - swizzled: MN-row r sits at byte S*r, 8 rows = one S*8-byte swizzle atom.
#       SBO = 8*S   (next group of 8 MN-rows)
#       LBO = unused, 1 by convention: one instruction's 32 bytes of K never leave an S-byte row
#             (for SW32 they are the whole row). Stepping K by one instruction is +32 bytes on the
#             start address; the tile base must be S*8-aligned (1024 B covers every mode).
#   - no swizzle ("interleave"): each core matrix is 8 rows x 16 B stored contiguously (128 B).
#       SBO = byte distance between core matrices along MN (128 for a box of 16-byte rows)
#       LBO = byte distance between the two 16-byte K halves (rows * 16 for one 16-byte-wide box per K
#             half)
# MN-major (MN contiguous: B (K, N) of an NN GEMM, 16-bit inputs only), TMA box inner extent = S bytes
# of MN, outer extent = the K rows:
#   - swizzled: K-row k sits at byte S*k; the S bytes hold S/elem consecutive MN elements.
#       LBO = byte distance between consecutive S-byte MN chunks (the next TMA box: S * box_k_rows)
#       SBO = 8*S   (next group of 8 K-rows; one k16 instruction spans two of them)
#   - no swizzle: core matrix = 16 B of MN x 8 K-rows, contiguous; the roles swap:
#       SBO = byte distance between core matrices along MN
#       LBO = byte distance between groups of 8 K-rows

SWIZZLE_NONE, SWIZZLE_32B, SWIZZLE_64B = 0, 1, 2  # SWIZZLE_128B = 3 above; CUtensorMapSwizzle numbering
_SPAN = {SWIZZLE_NONE: 16, SWIZZLE_32B: 32, SWIZZLE_64B: 64, SWIZZLE_128B: 128}


def swizzle_span(swizzle: int) -> int:
    """Bytes of one swizzled row (16 for no swizzle: one core-matrix row)."""
    if swizzle not in _SPAN:
        raise ValueError(f"wgmma: swizzle {swizzle} is not one of {sorted(_SPAN)}")
    return _SPAN[swizzle]


def desc_offsets(major: str, swizzle: int, *, mn_chunk_bytes: int | None = None,
                 core_mn_bytes: int | None = None, core_k_bytes: int | None = None) -> tuple[int, int]:
    """``(LBO, SBO)`` in 16-byte units for a tile in the layout TMA writes (see the table above).

    - K-major swizzled: no extra argument.
    - MN-major swizzled: ``mn_chunk_bytes`` = distance between S-byte MN chunks (S * K-rows of a box).
    - no swizzle: ``core_mn_bytes`` / ``core_k_bytes`` = distances between core matrices along MN / K
      (for MN-major, along K counts groups of 8 K-rows).
    """
    span = swizzle_span(swizzle)
    if major == K_MAJOR and swizzle != SWIZZLE_NONE:
        lbo, sbo = 16, 8 * span
    elif major == MN_MAJOR and swizzle != SWIZZLE_NONE:
        if mn_chunk_bytes is None:
            raise ValueError("wgmma: an MN-major swizzled tile needs mn_chunk_bytes")
        lbo, sbo = mn_chunk_bytes, 8 * span
    elif major in (K_MAJOR, MN_MAJOR):
        if core_mn_bytes is None or core_k_bytes is None:
            raise ValueError("wgmma: an unswizzled tile needs core_mn_bytes and core_k_bytes")
        lbo, sbo = (core_k_bytes, core_mn_bytes)
    else:
        raise ValueError(f"wgmma: major {major!r} is 'K' or 'MN'")
    for what, v in (("LBO", lbo), ("SBO", sbo)):
        if v % 16 or not 0 < v < (1 << 18):
            raise ValueError(f"wgmma: {what}={v} bytes must be a positive multiple of 16 below 256 KB")
    return lbo // 16, sbo // 16


def encode_desc(desc_ptr, smem_ptr, lbo: int, sbo: int, swizzle: int):
    """Write the descriptor of the tile at ``smem_ptr`` (offsets from :func:`desc_offsets`) to
    ``desc_ptr`` (a ``uint64`` local element pointer)."""
    swizzle_span(swizzle)
    T.evaluate(T.cuda.wgmma.encode_matrix_descriptor(desc_ptr, smem_ptr, lbo, sbo, swizzle))


def desc_advance(desc, byte_offset):
    """The descriptor of the tile ``byte_offset`` bytes (a multiple of 16) past the one ``desc`` describes:
    the start address is bits 0-13 of the descriptor in 16-byte units, so the offset adds to the 64-bit value
    directly. Valid while the new address stays in the 256 KB the field spans (shared memory is 228 KB: no
    carry into the offsets above). A loop that builds each descriptor once outside and advances it inside
    spends one 64-bit add per wgmma operand instead of the shift/mask/or of :func:`encode_desc`."""
    return desc + T.Cast("uint64", byte_offset // 16)


def k_step_bytes(major: str, swizzle: int, dtype: str, core_k_bytes: int | None = None) -> int:
    """How far the start address moves for the next instruction along K inside one tile.

    - K-major swizzled: 32 bytes (one instruction's K inside the swizzled row; past the row, next box).
    - MN-major swizzled: ``k`` K-rows of S bytes (``k`` = :func:`k_per_instr`).
    - no swizzle: two core matrices along K, ``2 * core_k_bytes`` (the LBO of K-major, of MN-major too).
    """
    if swizzle == SWIZZLE_NONE:
        if core_k_bytes is None:
            raise ValueError("wgmma: an unswizzled tile needs core_k_bytes")
        return 2 * core_k_bytes
    if major == K_MAJOR:
        return 32
    return k_per_instr(dtype) * swizzle_span(swizzle)
