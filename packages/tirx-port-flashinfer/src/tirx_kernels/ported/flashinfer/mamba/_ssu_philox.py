# SPDX-License-Identifier: Apache-2.0
# Stochastic rounding of an fp16 Mamba state, as FlashInfer's selective_state_update with ``rand_seed``.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/mamba/conversion.cuh
# (philox_randint4x, cvt_rs_f16_sw) and kernel_selective_state_update_stp.cuh, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). Read for semantics only; written anew.
"""Philox-4x32 (Triton's ``tl.randint4x`` stream: key = the int64 seed's halves, counter = (offset low, offset
high, 0, 0), ``rounds`` rounds) and the software fp32 -> fp16 stochastic rounding Hopper needs (no ``cvt.rs``):
13 random bits added below the fp16 mantissa, then truncation (overflow to inf, below the normal range to zero).
FlashInfer's single-token kernel draws one Philox call per 4 consecutive state columns, at the element offset
``slot * slot_stride + (head * dim + row) * dstate + column`` of the column group's first element (the source slot),
and gives column ``c`` the output ``c % 4``. TIR builders for the kernel, torch versions for the oracle."""

from __future__ import annotations

import torch

KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57
_M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------------------
# TIR (the kernel)
# ---------------------------------------------------------------------------------------------------------

def tir_randint4x(T, ph, seed_lo, seed_hi, offset, rounds):  # noqa: N803
    """``ph[0:4] =`` Philox-4x32 of the int64 ``offset`` under the seed words; ``ph`` a local uint32[8] (state in
    registers round by round: a nested expression would grow exponentially). ``rounds``: a Python int (unrolled)
    or an int32 kernel argument (a loop)."""
    def umulhi(a, const):
        return T.Cast("uint32", (T.Cast("uint64", a) * T.uint64(const)) >> T.uint64(32))

    T.buffer_store(ph, T.Cast("uint32", offset), [0])
    T.buffer_store(ph, T.Cast("uint32", T.shift_right(offset, T.int64(32))), [1])
    T.buffer_store(ph, T.uint32(0), [2])
    T.buffer_store(ph, T.uint32(0), [3])
    T.buffer_store(ph, seed_lo, [4])
    T.buffer_store(ph, seed_hi, [5])
    def one_round():
        T.buffer_store(ph, ph[0], [6])
        T.buffer_store(ph, ph[2], [7])
        T.buffer_store(ph, umulhi(ph[7], ROUND_B) ^ ph[1] ^ ph[4], [0])
        T.buffer_store(ph, umulhi(ph[6], ROUND_A) ^ ph[3] ^ ph[5], [2])
        T.buffer_store(ph, ph[7] * T.uint32(ROUND_B), [1])
        T.buffer_store(ph, ph[6] * T.uint32(ROUND_A), [3])
        T.buffer_store(ph, ph[4] + T.uint32(KEY_A), [4])
        T.buffer_store(ph, ph[5] + T.uint32(KEY_B), [5])

    if isinstance(rounds, int):
        for _ in range(rounds):
            one_round()
    else:
        with T.serial(0, rounds):
            one_round()


def tir_cvt_rs_f16(T, x, rand):  # noqa: N803
    """The fp16 bits (low 16 of a uint32) of ``x`` stochastically rounded with ``rand``'s low 13 bits."""
    bits = T.cuda.float_as_uint(x)
    ab = (bits & T.uint32(0x7FFFFFFF)) + (rand & T.uint32(0x1FFF))
    e = (ab >> T.uint32(23)) & T.uint32(0xFF)
    mant = ab & T.uint32(0x7FFFFF)
    normal = ((e - T.uint32(112)) << T.uint32(10)) | (mant >> T.uint32(13))
    h = T.if_then_else(e == T.uint32(0xFF), T.if_then_else(mant != T.uint32(0), T.uint32(0x7E00), T.uint32(0x7C00)),
                       T.if_then_else(e > T.uint32(142), T.uint32(0x7C00),
                                      T.if_then_else(e < T.uint32(113), T.uint32(0), normal)))
    return ((bits & T.uint32(0x80000000)) >> T.uint32(16)) | h


# ---------------------------------------------------------------------------------------------------------
# torch (the oracle): uint32 values held in int64 tensors
# ---------------------------------------------------------------------------------------------------------

def randint4x(seed: int, offsets: torch.Tensor, rounds: int) -> torch.Tensor:
    """Philox-4x32 outputs ``(4, *offsets.shape)`` (int64 holding uint32) for int64 ``offsets``."""
    def umulhi(a, const):
        # a < 2^32, const < 2^32: the product overflows int64, so split a into 16-bit halves
        lo, hi = a & 0xFFFF, a >> 16
        return ((hi * const) + ((lo * const) >> 16)) >> 16 & _M32

    s = seed & ((1 << 64) - 1)
    k0, k1 = s & _M32, s >> 32
    off = offsets.long()
    c0 = off & _M32
    c1 = (off >> 32) & _M32
    c2 = torch.zeros_like(off)
    c3 = torch.zeros_like(off)
    for _ in range(rounds):
        _c0, _c2 = c0, c2
        c0 = umulhi(_c2, ROUND_B) ^ c1 ^ k0
        c2 = umulhi(_c0, ROUND_A) ^ c3 ^ k1
        c1 = (ROUND_B * _c2) & _M32
        c3 = (ROUND_A * _c0) & _M32
        k0, k1 = (k0 + KEY_A) & _M32, (k1 + KEY_B) & _M32
    return torch.stack([c0, c1, c2, c3])


def cvt_rs_f16(x: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` to fp16 with ``rand``'s low 13 bits as the rounding noise (the kernel's software path)."""
    bits = x.float().contiguous().view(torch.int32).long() & _M32
    ab = (bits & 0x7FFFFFFF) + (rand & 0x1FFF)
    e = (ab >> 23) & 0xFF
    mant = ab & 0x7FFFFF
    h = torch.where(e == 0xFF, torch.where(mant != 0, 0x7E00, 0x7C00),
                    torch.where(e > 142, 0x7C00, torch.where(e < 113, 0, ((e - 112) << 10) | (mant >> 13))))
    out = ((bits & 0x80000000) >> 16) | h
    return (out - ((out & 0x8000) << 1)).to(torch.int16).view(torch.float16)  # the 16 bits, as a signed int16


def round_rows(s: torch.Tensor, seed: int, row_offsets: torch.Tensor, rounds: int) -> torch.Tensor:
    """fp32 state rows ``s (..., dstate)`` to fp16 the kernel's way; ``row_offsets`` (s.shape[:-1]) the element
    offset of each row's first column in the source slot."""
    dstate = s.shape[-1]
    col = torch.arange(dstate, device=s.device)
    base = row_offsets.long()[..., None] + (col - col % 4)
    r = randint4x(seed, base, rounds)  # (4, ..., dstate)
    pick = torch.gather(r, 0, (col % 4).expand_as(base).unsqueeze(0))[0]
    return cvt_rs_f16(s, pick)
