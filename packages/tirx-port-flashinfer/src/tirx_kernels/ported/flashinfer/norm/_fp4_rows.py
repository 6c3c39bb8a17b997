# SPDX-License-Identifier: Apache-2.0
"""What FlashInfer's FP4-output row kernels share (rmsnorm_fp4quant, add_rmsnorm_fp4quant,
silu_and_mul_nvfp4_experts_quantize): the per-block quantizer of the device code, the SF layouts, output
allocation and checks, the torch oracle's encoding and the comparators.

Semantics follow flashinfer/cute_dsl/fp4_common.py and rmsnorm_fp4quant.py at v0.7.4
(commit 77039051b0be921788dc2784ec41423b558878ec): a block's SF from its largest magnitude, codes of ``y *
inv_scale``; the encoders themselves are core.lang.quant's (device) and core.quant_ref's (torch).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, quant_ref

FP4_MAX = 6.0
E4M3_MAX = 448.0
SF_TILE_ROWS, SF_TILE_COLS = 128, 4
SF_TILE_BYTES = SF_TILE_ROWS * SF_TILE_COLS
# Two NVFP4 scale recipes upstream: "cute_dsl" (flashinfer/cute_dsl's norms: SF = e4m3(min(gs * amax / 6, 448)),
# inv = gs / SF) and "trtllm" (TRT-LLM's cvt_warp_fp16_to_fp4, the experts quantizer: SF = e4m3(gs * (amax / 6)),
# inv = 1 / (SF * (1 / gs))). They round differently, so each kernel keeps its upstream's.
RECIPES = ("cute_dsl", "trtllm")
_VEC = 8
_WORDS = 4


def sf_cols(nb: int, swizzled: bool) -> int:
    return -(-nb // SF_TILE_COLS) * SF_TILE_COLS if swizzled else nb


def sf_rows(rows: int, swizzled: bool) -> int:
    return -(-rows // SF_TILE_ROWS) * SF_TILE_ROWS if swizzled else rows


# ---------------------------------------------------------------------------------------------------------
# Device code
# ---------------------------------------------------------------------------------------------------------

def sf_offset(row, col, nb, swizzled: bool):
    """int64 byte offset of SF (row, col) of ``nb`` SF columns: linear, or FlashInfer's swizzled 128x4
    (``core.lang.quant.sf_offset``)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import quant

    r, c, n = T.Cast("int64", row), T.Cast("int64", col), T.Cast("int64", nb)
    if swizzled:
        return quant.sf_offset(r, c, quant.sf_cols_padded(n, "128x4"), "128x4")
    return quant.sf_offset(r, c, n, "linear")


# How a block's fp32 values ``y`` come from its words (``x``) and the weight's (``w``), by upstream kernel:
# "rounded_product": y = (x * w rounded to the dtype) * scale (rmsnorm_fp4quant's packed bf16x2 / f16x2 multiply);
# "scaled_product": y = (x * scale) * w in fp32 (add_rmsnorm_fp4quant's compute_y_and_max_abs_f32);
# "words": y = x (the experts quantizer; scale 1).
VALUE_MODES = ("rounded_product", "scaled_product", "words")


class BlockQuantizer:
    """Quantizes one block of a row held as packed 16-bit words (``block_size / 2`` words) in its upstream kernel's
    order (``values``, ``VALUE_MODES``): the block's fp32 values, their largest magnitude, the SF (``recipe``), then
    the codes of ``y * inv_scale``; stores the block's codes (8-byte stores), its SF byte (and optionally the same
    byte in a second, linear SF buffer, and ``y`` rounded to the dtype)."""

    def __init__(self, dtype: str, block_size: int, scale_format: str, swizzled: bool,
                 values: str = "rounded_product", recipe: str = "cute_dsl"):
        if recipe not in RECIPES or values not in VALUE_MODES:
            raise ValueError(f"BlockQuantizer: recipe {recipe!r} / values {values!r}: expected one of {RECIPES} / "
                             f"{VALUE_MODES}")
        self.dtype, self.block_size, self.scale_format = dtype, block_size, scale_format
        self.swizzled, self.values, self.recipe = swizzled, values, recipe

    def alloc(self):
        """The block's locals; call once in the kernel body, before :meth:`block`."""
        from tvm.script import tirx as T

        self.q = T.alloc_local((self.block_size,), "float32")
        self.word = T.alloc_local((_WORDS,), "uint32")
        self.sf = T.alloc_local((1,), "uint32")
        self.inv = T.alloc_local((1,), "float32")
        self.t = T.alloc_local((1,), "float32")
        self.gs = T.alloc_local((1,), "float32")  # a kernel's global scale, loaded once (after the PDL wait)
        self.fp8 = T.alloc_local((1,), "uint16")

    def block(self, xr, wr, base, scale, gs, Y64, S, y_row, row, b, nb, pred, sf_base=None, linear_sf=None,
              normed=None):  # noqa: N803
        """Block ``b`` of ``row`` from ``xr[base:]`` (and ``wr[base:]``): codes to ``Y64[y_row + b * (block / 16)
        + c]`` (``y_row``: int64 index of the row's first 8-byte word), SF to ``S[sf_base + offset(row, b)]``
        (and to ``linear_sf[row * nb + b]``), ``y`` rounded to ``normed = (buffer, int64 index of the block's first
        element)`` (16-byte stores); only where ``pred`` holds."""
        from tvm.script import tirx as T

        def body():
            self._block(T, xr, wr, base, scale, gs, Y64, S, y_row, row, b, nb, sf_base, linear_sf, normed)

        if pred is None:
            body()
        else:
            with T.If(pred):
                with T.Then():
                    body()

    def _block(self, T, xr, wr, base, scale, gs, Y64, S, y_row, row, b, nb, sf_base, linear_sf, normed):  # noqa: N803
        from tirx_kernels.core.lang import quant, vector

        def e4m3(value):
            """The e4m3 byte of ``value`` (``cvt.rn.satfinite.e4m3x2.f32``) as uint32."""
            quant.fp8x2(self.fp8[0], T.float32(0), value, "e4m3")
            return T.Cast("uint32", self.fp8[0]) & T.uint32(0xFF)

        def e4m3_inverse(code):
            return T.if_then_else(code == T.uint32(0), T.float32(0), T.float32(1) / quant.e4m3_to_f32(code))

        q = self.q
        for i in range(self.block_size // 2):
            lo, hi = vector.unpack2(xr[base + i], self.dtype)
            if self.values == "rounded_product":
                w_lo, w_hi = vector.unpack2(wr[base + i], self.dtype)
                vector.pack2(self.word, 0, lo * w_lo, hi * w_hi, self.dtype)  # the packed multiply's rounding
                lo, hi = vector.unpack2(self.word[0], self.dtype)
            elif self.values == "scaled_product":
                w_lo, w_hi = vector.unpack2(wr[base + i], self.dtype)
                lo, hi = lo * scale * w_lo, hi * scale * w_hi
            T.buffer_store(q, lo, [2 * i])
            T.buffer_store(q, hi, [2 * i + 1])
        if self.values == "scaled_product":
            scale = None  # already applied
        amax = T.abs(q[0])
        for i in range(1, self.block_size):
            amax = T.max(amax, T.abs(q[i]))
        sf, inv, t = self.sf, self.inv, self.t
        T.buffer_store(t, amax if scale is None else amax * scale, [0])  # the block's largest |y|
        if self.scale_format == "ue8m0":
            T.buffer_store(t, t[0] * T.float32(1.0 / FP4_MAX), [0])
            T.buffer_store(sf, quant.ue8m0_ceil(t[0]), [0])
            T.buffer_store(inv, quant.ue8m0_inv_scale(sf[0]), [0])
        elif self.recipe == "cute_dsl":
            T.buffer_store(t, T.min(gs * t[0] * T.float32(1.0 / FP4_MAX), T.float32(E4M3_MAX)), [0])
            T.buffer_store(sf, e4m3(t[0]), [0])
            T.buffer_store(inv, e4m3_inverse(sf[0]) * gs, [0])
        else:  # trtllm: SF = e4m3(gs * (amax / 6)), inv = 1 / (SF / gs); 0 for an all-zero block
            T.buffer_store(sf, e4m3(gs * (t[0] * T.float32(1.0 / FP4_MAX))), [0])
            T.buffer_store(inv, T.if_then_else(t[0] == T.float32(0), T.float32(0), T.float32(1) / (
                quant.e4m3_to_f32(sf[0]) * (T.float32(1) / gs))), [0])
        offset = sf_offset(row, b, nb, self.swizzled)
        T.buffer_store(S, T.Cast("uint8", sf[0]), [offset if sf_base is None else sf_base + offset])
        if linear_sf is not None:
            T.buffer_store(linear_sf, T.Cast("uint8", sf[0]), [sf_offset(row, b, nb, False)])
        if scale is not None:
            for i in range(self.block_size):
                T.buffer_store(q, q[i] * scale, [i])  # y
        if normed is not None:
            buf, index = normed
            for v in range(self.block_size // _VEC):
                for j in range(_WORDS):
                    vector.pack2(self.word, j, q[v * _VEC + 2 * j], q[v * _VEC + 2 * j + 1], self.dtype)
                vector.store_v4(buf.ptr_to([index + v * _VEC]), self.word, 0)
        for i in range(self.block_size):
            T.buffer_store(q, q[i] * inv[0], [i])  # y * inv_scale
        for c in range(self.block_size // 16):
            lo_word = quant.e2m1x8([q[16 * c + e] for e in range(8)])
            hi_word = quant.e2m1x8([q[16 * c + 8 + e] for e in range(8)])
            packed = T.Cast("uint64", lo_word) | (T.Cast("uint64", hi_word) << T.uint64(32))
            T.buffer_store(Y64, packed, [y_row + T.Cast("int64", b * (self.block_size // 16) + c)])

    def zero_padding(self, S, row, lane, lanes: int, M, nb):  # noqa: N803
        """Swizzled layout: zeros in the SF padding of ``row`` (columns ``nb..`` of a valid row, every column of a
        padding row ``M <= row``), spread over ``lanes`` threads. The grid covers the rows padded to 128 exactly."""
        from tvm.script import tirx as T

        padded_cols = (nb + SF_TILE_COLS - 1) // SF_TILE_COLS * SF_TILE_COLS
        first = T.if_then_else(row < M, nb, 0)
        with T.serial((padded_cols + lanes - 1) // lanes) as i:
            col = first + i * lanes + lane
            with T.If(col < padded_cols):
                with T.Then():
                    T.buffer_store(S, T.uint8(0), [sf_offset(row, col, nb, True)])


# ---------------------------------------------------------------------------------------------------------
# Host side: outputs, checks, oracle, comparators
# ---------------------------------------------------------------------------------------------------------

def sf_dtype(scale_format: str) -> torch.dtype:
    """FlashInfer's SF dtype: float8_e4m3fn for e4m3, uint8 for ue8m0."""
    return torch.uint8 if scale_format == "ue8m0" else torch.float8_e4m3fn


def new_outputs(lead: tuple, H: int, rows: int, block_size: int, scale_format: str, swizzled: bool,  # noqa: N803
                device) -> tuple:
    """``(y_fp4, block_scale)`` as FlashInfer allocates them: codes uint8 ``(*lead, H / 2)``; SF linear
    ``(*lead, H / block_size)`` or swizzled flat ``(padded rows * padded columns,)``."""
    nb = H // block_size
    y = torch.empty(*lead, H // 2, dtype=torch.uint8, device=device)
    if swizzled:
        sf = torch.empty(sf_rows(rows, True) * sf_cols(nb, True), dtype=sf_dtype(scale_format), device=device)
    else:
        sf = torch.empty(*lead, nb, dtype=sf_dtype(scale_format), device=device)
    return y, sf


_FP4_DTYPES = tuple(d for d in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)
_SF_DTYPES = (torch.uint8, torch.float8_e4m3fn)


def check_outputs(op: str, in_shape, H: int, rows: int, block_size: int, scale_format: str, swizzled: bool,  # noqa: N803
                  y_fp4, block_scale, y_name: str = "y_fp4", sf_name: str = "block_scale") -> None:
    """Given output buffers: dtype, shape and a contiguous layout (FlashInfer writes them as compact tensors)."""
    lead = tuple(in_shape[:-1])
    if y_fp4 is not None:
        checks.tensor(op, y_name, y_fp4, dtypes=_FP4_DTYPES, shape=(*lead, H // 2), contiguous=True, cuda=False)
    if block_scale is not None:
        nb = H // block_size
        if swizzled:
            checks.tensor(op, sf_name, block_scale, dtypes=_SF_DTYPES, contiguous=True, cuda=False)
            need = sf_rows(rows, True) * sf_cols(nb, True)
            if block_scale.numel() != need:
                raise checks.TirxInputError(
                    f"{op}: argument '{sf_name}': expected {need} elements (the swizzled 128x4 layout of {rows} rows "
                    f"x {nb} scales), got shape {tuple(block_scale.shape)}")
        else:
            checks.tensor(op, sf_name, block_scale, dtypes=_SF_DTYPES, shape=(*lead, nb), contiguous=True, cuda=False)


def check_alignment(op: str, **tensors) -> None:
    """Real tensors only (not under fake mode): code rows are stored 8 bytes at a time."""
    for name, t in tensors.items():
        if t is not None and t.data_ptr() % 8:
            raise checks.TirxInputError(f"{op}: argument '{name}': expected a data pointer aligned to 8 bytes, got "
                                        f"address 0x{t.data_ptr():x}")


def rows_on_16_bytes(x: torch.Tensor) -> torch.Tensor:
    """``x`` as 2-D rows ``(rows, H)`` with unit column stride, rows starting on 16 bytes (a view where the layout
    allows, else a contiguous copy, as FlashInfer's ``.contiguous()``)."""
    H = x.shape[-1]
    try:
        x2 = x.view(-1, H)
    except RuntimeError:
        x2 = x.reshape(-1, H)
    ok = x2.data_ptr() % 16 == 0 and (H == 1 or x2.stride(1) == 1) and (x2.shape[0] <= 1 or x2.stride(0) % _VEC == 0)
    if not ok:
        x2 = x2.clone(memory_format=torch.contiguous_format)
    if x2.stride(1) != 1:
        x2 = x2.as_strided(x2.shape, (x2.stride(0), 1))
    return x2


def on_16_bytes(t: torch.Tensor) -> torch.Tensor:
    return t if t.data_ptr() % 16 == 0 and t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


_UNIT = {}


def unit_scale(device) -> torch.Tensor:
    """A cached fp32 ``[1.0]`` (FlashInfer's default global scale) per device; a fresh one while torch.compile
    traces (a cached tensor made under its fake mode would be fake)."""
    if torch.compiler.is_compiling():
        return torch.ones(1, dtype=torch.float32, device=device)
    key = (device.type, device.index)
    if key not in _UNIT:
        _UNIT[key] = torch.ones(1, dtype=torch.float32, device=device)
    return _UNIT[key]


def e4m3_inverse(sf: torch.Tensor) -> torch.Tensor:
    """``1 / e4m3(sf)``, 0 for a zero scale (the kernels' rule)."""
    f = quant_ref.fp8_decode(sf)
    return torch.where(f == 0, torch.zeros_like(f), 1.0 / f)


def encode_rows(y: torch.Tensor, block_size: int, scale_format: str, global_scale, swizzled: bool,
                recipe: str = "cute_dsl") -> tuple:
    """The oracle's codes (uint8 ``(..., H / 2)``) and SF (linear ``(..., H / block)`` or swizzled flat, padding
    zero) of fp32 values ``y`` (..., H), in the kernels' order (core.quant_ref's encoders)."""
    H = y.shape[-1]
    lead = y.shape[:-1]
    rows = y.reshape(-1, H).float()
    blocks = rows.view(rows.shape[0], H // block_size, block_size)
    amax = blocks.abs().amax(-1)
    if scale_format == "ue8m0":
        sf = quant_ref.ue8m0_ceil(amax * torch.tensor(1.0 / FP4_MAX, dtype=torch.float32))
        inv = quant_ref.ue8m0_inv_scale(sf)
    else:
        gs = (global_scale.float() if global_scale is not None else torch.ones(1)).to(y.device)
        gs = gs.reshape(-1, 1) if gs.numel() > 1 else gs  # one scale per row (the experts' per-expert scales)
        sixth = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)
        if recipe == "cute_dsl":
            sf = quant_ref.fp8_encode(torch.clamp_max(gs * amax * sixth, E4M3_MAX), "e4m3")
            inv = e4m3_inverse(sf) * gs
        else:
            sf = quant_ref.fp8_encode(gs * (amax * sixth), "e4m3")
            inv = torch.where(amax == 0, torch.zeros_like(amax), 1.0 / (quant_ref.fp8_decode(sf) * (1.0 / gs)))
    codes = quant_ref.pack_e2m1(quant_ref.e2m1_encode(blocks * inv.unsqueeze(-1)).view(rows.shape[0], H))
    sf = sf.view(torch.uint8) if sf.dtype != torch.uint8 else sf
    if swizzled:
        flat = quant_ref.sf_swizzle(sf, "128x4")
    else:
        flat = sf.reshape(*lead, H // block_size)
    return codes.reshape(*lead, H // 2), flat.view(sf_dtype(scale_format))


# Comparators (PROTOCOL.md, COMPARATORS): the oracle's rstd comes from torch's reduction and rsqrt, the kernel's
# from its own order and the GPU's rsqrt, so a value at a rounding boundary of an SF or a code may land on the
# other side. Every element must match or sit one step off; the share of those must be small. (CPU emulation
# tests with inputs whose rstd is exact check bit for bit.)
MAX_OFF_SHARE = 0.01
_E2M1_ORDER = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 0, -1, -2, -3, -4, -5, -6, -7])  # nibble -> signed rank


def _nibbles(t: torch.Tensor) -> torch.Tensor:
    b = t.view(torch.uint8).reshape(-1).long()
    return torch.stack([b & 15, b >> 4], -1).reshape(-1)


def codes_close(got, want, cfg, inputs) -> dict:
    from tirx_kernels.core.harness import KernelCheckError

    if got.shape != want.shape:
        raise KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")
    order = _E2M1_ORDER.to(got.device)
    g, w = order[_nibbles(got)], order[_nibbles(want)]
    off = (g - w).abs()
    if (off > 1).any():
        i = int((off > 1).nonzero()[0])
        raise KernelCheckError(f"{int((off > 1).sum())} codes more than one step from the oracle's (first at nibble "
                               f"{i}: rank {int(g[i])}, want {int(w[i])})")
    share = float((off > 0).float().mean()) if off.numel() else 0.0
    if share > MAX_OFF_SHARE:
        raise KernelCheckError(f"{share:.2%} of the codes are one step off the oracle's (allowed {MAX_OFF_SHARE:.0%})")
    return {"codes_one_step_off": share}


def scales_close(got, want, cfg, inputs) -> dict:
    from tirx_kernels.core.harness import KernelCheckError

    if got.shape != want.shape:
        raise KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")
    g, w = got.view(torch.uint8).long(), want.view(torch.uint8).long()
    off = (g - w).abs()
    if (off > 1).any():
        i = tuple(int(v) for v in (off > 1).nonzero()[0])
        raise KernelCheckError(f"{int((off > 1).sum())} scale factors more than one step from the oracle's (first "
                               f"at {i}: 0x{int(g[i]):02x}, want 0x{int(w[i]):02x})")
    share = float((off > 0).float().mean()) if off.numel() else 0.0
    if share > MAX_OFF_SHARE:
        raise KernelCheckError(f"{share:.2%} of the scale factors are one step off (allowed {MAX_OFF_SHARE:.0%})")
    return {"scales_one_step_off": share}
