# SPDX-License-Identifier: Apache-2.0
"""Shared-memory map, roles, barriers and fragment <-> SW128-tile helpers of the chunked GDN forward kernel
(``gdn_chunk.py``: FlashInfer's gdn_prefill_sm90 and its context-parallel phase, cuDNN's GDN-1 prefill and
recompute); the chunk-local WY work of the aux warpgroup is in ``gdn_wy.py``.

Every operand tile is a *box* of 64 rows x 64 16-bit columns = 8 KB with rows of 128 bytes and the 128-byte
swizzle: what a TMA box of (64 columns, 1 head, 64 tokens) writes, and what a wgmma descriptor reads either
K-major (rows are M/N, the 64 columns are K) or MN-major (rows are K, the 64 columns are M/N). One region of
``uint32`` words holds all boxes; 16-bit pairs are read and written as words.
"""

from __future__ import annotations

# (No TVM import here: the op imports this module on machines without the compiler.)

# Run-time flags of the kernel (one int32 argument).
HAS_G, GATE_LOG, HAS_BETA, CU64, HAS_INIT, HAS_FINAL, HAS_SIDX, SIDX64, HAS_OIDX, OIDX64 = (1 << i for i in range(10))
HAS_CKPT = 1 << 10  # the checkpoint kernels: per-chunk state checkpoints are written
DIM = 128  # K = V = 128
CHUNK = 64  # tokens per chunk = rows of every box
BOX = CHUNK * 64 * 2  # bytes of one 64 x 64 16-bit box
NUM_STAGES = 2  # the Q/K/V ring and the aux (WY) ring

# Warpgroups: 0 producer (warp 0: TMA + the gate/beta vectors), 1 aux (chunk-local WY transform), 2.. consumers
# (the state recurrence, 64 value rows each).
NUM_CONSUMERS = 2
THREADS = 128 * (2 + NUM_CONSUMERS)
V_PER_CONSUMER = DIM // NUM_CONSUMERS
AUX_BAR = 1  # named barrier of the aux warpgroup
CONSUMER_BAR = 2  # named barriers 2, 3: consumer 0, 1
# setmaxnreg split of 4 x 128 threads x 128 launch registers: 40 + 152 + 2 x 160 = 512.
PRODUCER_REGS, AUX_REGS, CONSUMER_REGS = 40, 152, 160

# Byte offsets in the tile region.
QKV_STAGE = 6 * BOX  # Q boxes 0, 1 (columns 0-63, 64-127), then K, then V


def q_box(s, b):
    return s * QKV_STAGE + b * BOX


def k_box(s, b):
    return s * QKV_STAGE + (2 + b) * BOX


def v_box(s, b):
    return s * QKV_STAGE + (4 + b) * BOX


AUX_BASE = NUM_STAGES * QKV_STAGE
AUX_STAGE = 4 * BOX  # T beta (the inverse's D tile while it is computed), P, K_d boxes 0, 1 (inverse scratch X1, X2)


def tb_box(s):
    return AUX_BASE + s * AUX_STAGE


def p_box(s):
    return AUX_BASE + s * AUX_STAGE + BOX


def kd_box(s, b):
    return AUX_BASE + s * AUX_STAGE + (2 + b) * BOX


CONS_BASE = AUX_BASE + NUM_STAGES * AUX_STAGE
CONS_STAGE = 3 * BOX  # S (the 16-bit copy of the state, two K-major boxes), then Y / Delta


def sb_box(c, b):
    return CONS_BASE + c * CONS_STAGE + b * BOX


def yd_box(c):
    return CONS_BASE + c * CONS_STAGE + 2 * BOX


TILE_BYTES = CONS_BASE + NUM_CONSUMERS * CONS_STAGE  # 212992
VEC_WORDS = NUM_STAGES * 2 * CHUNK  # per Q/K/V stage: G (in-chunk cumulative log2 decay) and beta, fp32
SMEM_LIMIT = 232448


def vec_g(s, t):
    return s * 2 * CHUNK + t


def vec_beta(s, t):
    return s * 2 * CHUNK + CHUNK + t


# Descriptor offsets (16-byte units): K-major SW128 (LBO unused, SBO 8 rows); MN-major SW128 (LBO = the next 64-wide
# MN chunk = the next box, SBO 8 K-rows). One k16 step: +32 bytes (K-major, inside a 128-byte row; the second box
# from step 4) or +16 rows = 2048 bytes (MN-major).
# (= wgmma.desc_offsets(K_MAJOR, SWIZZLE_128B) and desc_offsets(MN_MAJOR, SWIZZLE_128B, mn_chunk_bytes=BOX); the
# emulated tests check it.)
KMAJ = (1, 64)
MNMAJ = (BOX // 16, 64)
MN_KSTEP = 16 * 128


def kmajor_step(box0: int, kk: int) -> int:
    """Byte offset of k16 step ``kk`` of a K-major operand whose 128 K columns span two boxes from ``box0``."""
    return box0 + (kk // 4) * BOX + (kk % 4) * 32


def word(box, row, col, dtype: str):
    """Word index of the 16-bit pair at (``row``, even ``col`` < 64) of the box at byte ``box``."""
    from tirx_kernels.core.lang import tma

    return (box + 2 * tma.sw128_offset(row, col, dtype)) // 4


def frag_pairs(n: int):
    """(column block j, row half r) of an m64nN accumulator fragment, in register order."""
    return [(j, r) for j in range(n // 8) for r in range(2)]
