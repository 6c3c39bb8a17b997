# SPDX-License-Identifier: Apache-2.0
"""Exact FP4 / FP8-scale encoders, device (TIRx, parse-time helpers) and torch, bit for bit the same: e2m1 codes
(round to nearest even, saturating at 6, the sign kept), e4m3 scale factors (round to nearest even, saturating
at 448), ue8m0 scale factors (the biased exponent of 2**ceil(log2(s)), clamped to [0, 255]) and the 128x4
swizzled SF offset. Plain integer / float arithmetic (sm_90 has no e2m1 conversion instruction), so the CPU
emulation runs the same code.
"""

from __future__ import annotations

import torch

# Rounding thresholds of |v| between consecutive e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; ties go to the even
# code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4): ">" where the lower code is even.
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
_E4M3_MIN_NORMAL = 2.0**-6


class tir:  # noqa: N801
    """Device helpers (call while a prim_func is parsed); values are fp32, results uint32."""

    @staticmethod
    def e2m1_nibble(v):
        from tvm.script import tirx as T

        a = T.abs(v)
        idx = T.uint32(0)
        for t, inclusive in _E2M1_STEPS:
            idx = idx + T.Cast("uint32", a >= T.float32(t) if inclusive else a > T.float32(t))
        return idx | ((T.reinterpret("uint32", v) >> T.uint32(31)) << T.uint32(3))

    @staticmethod
    def e2m1x8(values):
        """Eight codes in a word, value ``i`` in bits ``4i..4i+3`` (the lower address's low nibble)."""
        from tvm.script import tirx as T

        word = tir.e2m1_nibble(values[0])
        for i in range(1, 8):
            word = word | (tir.e2m1_nibble(values[i]) << T.uint32(4 * i))
        return word

    @staticmethod
    def e4m3_from_f32(v):
        """Non-negative ``v`` -> e4m3 byte (RNE, saturating at 448 = 0x7E)."""
        from tvm.script import tirx as T

        bits = T.reinterpret("uint32", v)
        rounded = (bits + T.uint32(0x7FFFF) + ((bits >> T.uint32(20)) & T.uint32(1))) >> T.uint32(20)
        normal = T.min(rounded - T.uint32(120 << 3), T.uint32(0x7E))
        subnormal = T.Cast("uint32", T.nearbyint(v * T.float32(512)))
        return T.if_then_else(v >= T.float32(_E4M3_MIN_NORMAL), normal, subnormal)

    @staticmethod
    def e4m3_to_f32(b):
        from tvm.script import tirx as T

        e = (b >> T.uint32(3)) & T.uint32(15)
        m = b & T.uint32(7)
        normal = T.reinterpret("float32", ((e + T.uint32(120)) << T.uint32(23)) | (m << T.uint32(20)))
        return T.if_then_else(e == T.uint32(0), T.Cast("float32", m) * T.float32(1.0 / 512), normal)

    @staticmethod
    def e4m3_inverse(b):
        """``1 / e4m3(b)``, 0 for a zero scale."""
        from tvm.script import tirx as T

        return T.if_then_else(b == T.uint32(0), T.float32(0), T.float32(1) / tir.e4m3_to_f32(b))

    @staticmethod
    def ue8m0_from_f32(s):
        """Non-negative ``s`` -> biased exponent of ``2**ceil(log2(s))`` in [0, 255] (0 for s == 0)."""
        from tvm.script import tirx as T

        bits = T.reinterpret("uint32", s)
        exp = (bits >> T.uint32(23)) & T.uint32(0xFF)
        mant = bits & T.uint32(0x7FFFFF)
        normal = T.min(exp + T.Cast("uint32", mant != T.uint32(0)), T.uint32(255))
        return T.if_then_else(exp == T.uint32(0), T.Cast("uint32", mant > T.uint32(0x400000)), normal)

    @staticmethod
    def ue8m0_inverse(e):
        """``2**(127 - e)``, 0 for e == 0."""
        from tvm.script import tirx as T

        normal = T.reinterpret("float32", (T.uint32(254) - e) << T.uint32(23))
        tiny = T.reinterpret("float32", T.uint32(0x400000) >> (e - T.uint32(254)))
        return T.if_then_else(e == T.uint32(0), T.float32(0), T.if_then_else(e >= T.uint32(254), tiny, normal))

    @staticmethod
    def sf_offset_128x4(row, col, nb):
        """int64 byte offset of SF (row, col) in the 128x4 swizzled layout of ``nb`` SF columns."""
        from tvm.script import tirx as T

        r = T.Cast("int64", row)
        c = T.Cast("int64", col)
        k_tiles = (T.Cast("int64", nb) + 3) // 4
        return ((r // 128) * k_tiles * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4)


class ref:  # noqa: N801
    """The torch side: the same rules on fp32 tensors (any device)."""

    @staticmethod
    def e2m1_from_f32(v: torch.Tensor) -> torch.Tensor:
        """Nibbles (uint8 0..15) of fp32 values."""
        a = v.abs()
        idx = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
        for t, inclusive in _E2M1_STEPS:
            idx += (a >= t if inclusive else a > t).to(torch.uint8)
        sign = (v.view(torch.int32) < 0).to(torch.uint8) << 3
        return idx | sign

    @staticmethod
    def e2m1_pack(nibbles: torch.Tensor) -> torch.Tensor:
        """(..., 2n) nibbles -> (..., n) bytes, the even element in the low nibble."""
        n = nibbles.to(torch.uint8)
        return n[..., 0::2] | (n[..., 1::2] << 4)

    @staticmethod
    def e2m1_to_f32(nibbles: torch.Tensor) -> torch.Tensor:
        table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], device=nibbles.device)
        return table[nibbles.long()]

    @staticmethod
    def e2m1_unpack(packed: torch.Tensor) -> torch.Tensor:
        b = packed.view(torch.uint8)
        return torch.stack([b & 15, b >> 4], -1).flatten(-2)

    @staticmethod
    def e4m3_from_f32(v: torch.Tensor) -> torch.Tensor:
        """Non-negative fp32 -> e4m3 bytes (uint8)."""
        v = v.float()
        bits = v.view(torch.int32).long() & 0xFFFFFFFF
        rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20
        normal = torch.clamp(rounded - (120 << 3), max=0x7E)
        subnormal = torch.round(v * 512).long()  # torch.round: half to even
        return torch.where(v >= _E4M3_MIN_NORMAL, normal, subnormal).to(torch.uint8)

    @staticmethod
    def e4m3_to_f32(b: torch.Tensor) -> torch.Tensor:
        return b.view(torch.float8_e4m3fn).float()

    @staticmethod
    def e4m3_inverse(b: torch.Tensor) -> torch.Tensor:
        f = ref.e4m3_to_f32(b)
        return torch.where(f == 0, torch.zeros_like(f), 1.0 / f)

    @staticmethod
    def ue8m0_from_f32(s: torch.Tensor) -> torch.Tensor:
        bits = s.float().view(torch.int32).long() & 0xFFFFFFFF
        exp = (bits >> 23) & 0xFF
        mant = bits & 0x7FFFFF
        normal = torch.clamp(exp + (mant != 0).long(), max=255)
        return torch.where(exp == 0, (mant > 0x400000).long(), normal).to(torch.uint8)

    @staticmethod
    def ue8m0_inverse(e: torch.Tensor) -> torch.Tensor:
        k = 127 - e.long()
        return torch.where(e == 0, torch.zeros(e.shape, device=e.device), torch.pow(2.0, k.double()).float())

    @staticmethod
    def swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
        """(rows, cols) uint8 -> the flat 128x4 swizzled layout (rows padded to 128, cols to 4, with zeros)."""
        rows, cols = sf.shape
        pr, pc = -(-rows // 128) * 128, -(-cols // 4) * 4
        padded = torch.zeros(pr, pc, dtype=sf.dtype, device=sf.device)
        padded[:rows, :cols] = sf
        return padded.view(pr // 128, 4, 32, pc // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
