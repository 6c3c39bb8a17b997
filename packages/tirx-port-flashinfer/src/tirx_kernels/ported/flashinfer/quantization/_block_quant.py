# SPDX-License-Identifier: Apache-2.0
"""The block-quantizer driver FlashInfer's quantizers share here (nvfp4_quantize, mxfp4_quantize, mxfp8_quantize):
one thread per scale block, its 16 / 32 elements read with 16-byte loads, the block's amax, scale and codes by
``core.lang.quant``, codes stored 8 / 16 / 32 bytes at a time, the scale byte in the linear or swizzled layout.

Semantics: flashinfer-ai/flashinfer f2e04400e330fb2debe0bf8730d9424a1d37927f, flashinfer/quantization/kernels/
{nvfp4,mxfp4,mxfp8}_quantize.py and quantization_cute_dsl_utils.py (NVFP4 in its IEEE path,
FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1, so that ``core.quant_ref`` reproduces every byte; see core.lang.quant).

The grid covers the scale buffer as stored (rows and columns padded in a swizzled layout): a thread whose
(row, column) lies in the padding writes a zero scale byte and nothing else, so every byte of the returned scale
buffer is defined (FlashInfer's swizzled buffers hold zeros there).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, quant_ref

FORMATS = {  # format: (elements per scale, code bits)
    "nvfp4": (16, 4),
    "mxfp4": (32, 4),
    "mxfp8": (32, 8),
}
LAYOUTS = ("linear", "128x4", "8x4")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
THREADS = 256
# One scale block a thread. Two (u * THREADS apart, all loads first) was tried on paper (SASS, 2026-12-08): 912
# instructions for two 16-element NVFP4 blocks against 2 x 480 -- the block scale, its two div.rn and the stores are
# per block, only the index division and the global-scale load were shared -- at 48-79 registers instead of 36-46.
_VEC = 8  # 16-bit elements per 16-byte vector
_WORDS = 4


def block_of(fmt: str) -> int:
    return FORMATS[fmt][0]


def sf_shape(M: int, K: int, fmt: str, layout: str) -> tuple[int, int]:  # noqa: N803
    """(rows, columns) of the scale buffer as stored."""
    return quant_ref.sf_padded_shape(M, K // block_of(fmt), layout)


def grid_blocks(M: int, K: int, fmt: str, layout: str) -> int:  # noqa: N803
    rows, cols = sf_shape(M, K, fmt, layout)
    return rows * cols


def silu(g):
    """fp32 ``g / (1 + exp(-g))`` with a round-to-nearest divide, as FlashInfer's ``_silu_f32``. Its exponential
    is the fast ``ex2.approx`` one; ``T.exp`` here is CUDA's ``expf`` (within 2 ulp) on the GPU and glibc's ``expf``
    under ``core.emulate``: an intermediate at a rounding boundary of the dtype may land one step apart."""
    from tvm.script import tirx as T

    return g / (T.float32(1) + T.exp(-g))


class _Block:
    """The device code of one scale block (locals allocated by :meth:`alloc`): :meth:`emit` loads the block's
    16 / 32 elements (16-byte loads), takes their amax, the scale (``gs``: NVFP4's global scale), the codes, and
    stores the codes and the scale byte; :meth:`amax_of` only loads and returns the amax (the per-token pass)."""

    def __init__(self, dtype: str, fmt: str, layout: str, silu_and_mul: bool = False):
        self.dtype, self.fmt, self.layout = dtype, fmt, layout
        self.blk, self.bits = FORMATS[fmt]
        self.silu_and_mul = silu_and_mul

    def alloc(self):
        from tvm.script import tirx as T

        self.xr = T.alloc_local((self.blk // 2,), "uint32")
        if self.silu_and_mul:
            self.ur = T.alloc_local((self.blk // 2,), "uint32")  # the up half's words
        self.v = T.alloc_local((self.blk,), "float32")
        self.out = T.alloc_local((self.blk * self.bits // 32,), "uint32")
        self.amax = T.alloc_local((1,), "float32")
        self.scale = T.alloc_local((1,), "float32")  # the factor applied to each element before its encoding
        self.code = T.alloc_local((1,), "uint32")  # the block's scale byte
        self.pair = T.alloc_local((2,), "uint16")  # two: an expression reads the first after the second is written

    def alloc_held(self, n: int):
        """``n`` register sets for blocks held between two passes (:meth:`held_amax`, :meth:`held_emit`), apart from
        ``self.xr`` (the blocks loaded one at a time in between)."""
        from tvm.script import tirx as T

        self.one = self.xr
        self.held = [T.alloc_local((self.blk // 2,), "uint32") for _ in range(n)]

    def held_amax(self, X, row, tid, nb, K, acc, threads: int):  # noqa: N803
        """Load blocks ``h * threads + tid`` (h < len(held), those below ``nb``) of ``row`` into the held sets,
        every load issued first, then ``acc[0] = max(acc[0], their amaxes)``."""
        from tvm.script import tirx as T

        for h, regs in enumerate(self.held):
            self.xr = regs
            with T.If(h * threads + tid < nb):
                with T.Then():
                    self.load(X, row, T.Cast("int64", h * threads + tid), K)
        for h, regs in enumerate(self.held):
            self.xr = regs
            with T.If(h * threads + tid < nb):
                with T.Then():
                    T.buffer_store(acc, T.max(acc[0], self.reduce()), [0])
        self.xr = self.one

    def held_emit(self, Y, S, row, tid, nb, cols, K, gs, threads: int):  # noqa: N803
        """Quantize the held blocks (:meth:`held_amax`) with global scale ``gs``; a held column in the swizzled
        padding (``nb <= col < cols``) gets a zero scale byte."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import quant

        for h, regs in enumerate(self.held):
            self.xr = regs
            col = T.Cast("int64", h * threads + tid)
            with T.If(h * threads + tid < nb):
                with T.Then():
                    self.emit(None, Y, S, row, col, K, T.Cast("int64", cols), gs, loaded=True)
                with T.Else():
                    with T.If(h * threads + tid < cols):
                        with T.Then():
                            T.buffer_store(S, T.uint8(0), [quant.sf_offset(row, col, T.Cast("int64", cols),
                                                                           self.layout)])
        self.xr = self.one

    def load(self, X, row, col, K):  # noqa: N803
        """Issue the loads of block (row, col) of ``X`` (flat, row stride K, 2K with ``silu_and_mul``; int64 row /
        col) into ``self.xr`` (and ``self.ur``)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import vector

        k64 = T.Cast("int64", K)
        base = row * (2 * k64 if self.silu_and_mul else k64) + col * self.blk
        # L1-allocating loads: a warp's 16-byte loads of one vector index are 32 / 64 bytes apart (one thread a
        # block), so each fills half of every 32-byte sector it touches, and with L1::no_allocate the next vector's
        # load fetched the same sectors from L2 again (2x the L2 -> SM traffic of the bytes used).
        for j in range(self.blk // _VEC):
            vector.load_v4(self.xr, j * _WORDS, X.ptr_to([base + j * _VEC]), cache="nc")
            if self.silu_and_mul:
                vector.load_v4(self.ur, j * _WORDS, X.ptr_to([base + k64 + j * _VEC]), cache="nc")

    def reduce(self):
        """The loaded block's values into ``self.v`` (fp32) and its amax (returned). With ``silu_and_mul`` the row is
        ``[gate | up]`` of 2K elements and the block's values are ``silu(gate) * up`` in fp32 rounded to the dtype
        (FlashInfer's SwiGLU quantizer quantizes that half2 / bfloat2)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import quant, vector

        if self.silu_and_mul:
            for i in range(self.blk // 2):
                g_lo, g_hi = vector.unpack2(self.xr[i], self.dtype)
                u_lo, u_hi = vector.unpack2(self.ur[i], self.dtype)
                vector.pack2(self.xr, i, silu(g_lo) * u_lo, silu(g_hi) * u_hi, self.dtype)
        T.buffer_store(self.amax, T.float32(0), [0])
        for i in range(self.blk // 2):
            lo, hi = vector.unpack2(self.xr[i], self.dtype)
            T.buffer_store(self.v, lo, [2 * i])
            T.buffer_store(self.v, hi, [2 * i + 1])
            T.buffer_store(self.amax, quant.amax_step(self.amax[0], lo), [0])
            T.buffer_store(self.amax, quant.amax_step(self.amax[0], hi), [0])
        return self.amax[0]

    def amax_of(self, X, row, col, K):  # noqa: N803
        """Load block (row, col) of ``X``; its amax (:meth:`load`, :meth:`reduce`)."""
        self.load(X, row, col, K)
        return self.reduce()

    def emit(self, X, Y, S, row, col, K, cols, gs=None, loaded: bool = False):  # noqa: N803
        """Quantize block (row, col): load it (unless ``loaded``: ``self.xr`` holds it), reduce, encode, store."""
        if not loaded:
            self.load(X, row, col, K)
        self.reduce()
        self.encode_store(Y, S, row, col, K, cols, gs)

    def encode_store(self, Y, S, row, col, K, cols, gs=None):  # noqa: N803
        """The reduced block's scale and codes (``gs``: NVFP4's global scale), stored."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import quant, vector

        amax, scale, code, pair, v, out = self.amax, self.scale, self.code, self.pair, self.v, self.out
        if self.fmt == "nvfp4":
            s = quant.nvfp4_block_scale(amax[0], gs)
            quant.fp8x2(pair[0], s, s, "e4m3")
            T.buffer_store(code, T.Cast("uint32", pair[0]) & T.uint32(0xFF), [0])
            T.buffer_store(scale, quant.nvfp4_output_scale(quant.e4m3_to_f32(code[0]), gs, amax[0]), [0])
        else:
            e = quant.mxfp4_block_scale(amax[0]) if self.fmt == "mxfp4" else quant.mxfp8_block_scale(amax[0])
            T.buffer_store(code, e, [0])
            T.buffer_store(scale, quant.ue8m0_inv_scale(code[0]), [0])
        out_words = self.blk * self.bits // 32
        if self.bits == 4:
            for w in range(out_words):
                T.buffer_store(out, quant.e2m1x8([v[8 * w + e] * scale[0] for e in range(8)]), [w])
        else:
            for w in range(out_words):
                quant.fp8x2(pair[0], v[4 * w + 1] * scale[0], v[4 * w] * scale[0], "e4m3")
                quant.fp8x2(pair[1], v[4 * w + 3] * scale[0], v[4 * w + 2] * scale[0], "e4m3")
                T.buffer_store(out, T.Cast("uint32", pair[0]) | (T.Cast("uint32", pair[1]) << T.uint32(16)), [w])
        y0 = (row * T.Cast("int64", K) + col * self.blk) * self.bits // 32  # the block's first output word
        if out_words == 2:
            T.evaluate(T.ptx.st.global_.v2.b32(Y.ptr_to([y0]), out[0], out[1]))
        else:
            for j in range(out_words // _WORDS):
                vector.store_v4(Y.ptr_to([y0 + j * _WORDS]), out, j * _WORDS)
        T.buffer_store(S, T.Cast("uint8", code[0]), [quant.sf_offset(row, col, cols, self.layout)])


def _check_params(dtype: str, fmt: str, layout: str, name: str):
    if dtype not in DTYPES or fmt not in FORMATS or layout not in LAYOUTS:
        raise ValueError(f"{name}: dtype {dtype!r} / format {fmt!r} / layout {layout!r}: expected one of "
                         f"{sorted(DTYPES)} / {sorted(FORMATS)} / {LAYOUTS}")


def build_kernel(dtype: str, fmt: str, layout: str, name: str, silu_and_mul: bool = False):
    """One thread per block of the scale buffer as stored (padding blocks write a zero scale byte). With
    ``silu_and_mul`` (NVFP4 only) the input rows are ``[gate | up]``, 2K wide, and K is the output's width."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import quant

    _check_params(dtype, fmt, layout, name)
    if silu_and_mul and fmt != "nvfp4":
        raise ValueError(f"{name}: silu_and_mul is an NVFP4 fusion (FlashInfer's silu_and_mul_nvfp4_quantize), "
                         f"got format {fmt!r}")
    blk = FORMATS[fmt][0]
    block = _Block(dtype, fmt, layout, silu_and_mul)

    def i64(v):
        return T.Cast("int64", v)

    @T.prim_func
    def block_quantize(x_ptr: T.handle, g_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, M: T.int32,
                       K: T.int32, tiles: T.int32):
        x_len = T.int64()
        y_len = T.int64()
        s_len = T.int64()
        X = T.match_buffer(x_ptr, (x_len,), dtype, align=16)
        G = T.match_buffer(g_ptr, (1,), "float32")
        Y = T.match_buffer(y_ptr, (y_len,), "uint32", align=8)
        S = T.match_buffer(s_ptr, (s_len,), "uint8")
        T.device_entry()
        cta = T.cta_id([tiles])
        tid = T.thread_id([THREADS])
        block.alloc()

        # 32-bit block index, row and column (check_input keeps the scale buffer under 2**31 - THREADS blocks):
        # the 64-bit division was a CALL of about 70 instructions a thread; offsets are 64-bit from here on.
        nb = K // blk
        cols = nb if layout == "linear" else (nb + 3) // 4 * 4
        rows = M if layout == "linear" else quant.sf_rows_padded(M, layout)
        idx = cta * THREADS + tid
        row = idx // cols
        col = idx % cols
        with T.If(idx < rows * cols):
            with T.Then():
                with T.If(T.And(row < M, col < nb)):
                    with T.Then():
                        block.emit(X, Y, S, i64(row), i64(col), K, i64(cols), G[0] if fmt == "nvfp4" else None)
                    with T.Else():
                        S[quant.sf_offset(i64(row), i64(col), i64(cols), layout)] = T.uint8(0)

    return block_quantize.with_attr("global_symbol", name)


PT_THREADS = 128  # the per-token kernel: one CTA per row
# Blocks a thread of the per-token kernel keeps in registers between its two passes (8 words each): rows up to
# PT_THREADS * PT_HELD * 16 = 8192 elements are read from HBM once, with every load of the row issued before the
# amax; the columns past that are re-read in pass 2 (L2). Re-reading the whole row, one block at a time each pass,
# left the kernel at 36-47 % of the copy bandwidth (2026-12-07 H100).
PT_HELD = 4


def build_per_token_kernel(dtype: str, layout: str, name: str):
    """NVFP4 with a per-row global scale (FlashInfer's per-token path, IEEE recipe): one CTA per row of the scale
    buffer as stored. Pass 1 loads the thread's first ``PT_HELD`` blocks of the row into registers (all loads
    first), takes the row's amax (those, then any further blocks loaded one at a time; warp max, one shared
    exchange); the row's encode scale is ``min((1 / gsi) / row_amax, FLT_MAX)`` (1 where that is 0; FLT_MAX for an
    all-zero row) and its per-token scale ``1 / encode`` (0 for an all-zero row); pass 2 quantizes each block with
    the encode scale as NVFP4's global scale, from the registers (the further blocks reloaded, L2). Padding rows /
    columns of a swizzled layout get zero scale bytes."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import quant

    _check_params(dtype, "nvfp4", layout, name)
    blk = FORMATS["nvfp4"][0]
    block = _Block(dtype, "nvfp4", layout)
    warps = PT_THREADS // 32
    held = PT_HELD * PT_THREADS  # blocks of a row held in registers
    flt_max = T.cuda.uint_as_float(T.uint32(quant.FLT_MAX_BITS))

    def i64(v):
        return T.Cast("int64", v)

    @T.prim_func
    def per_token_quantize(x_ptr: T.handle, g_ptr: T.handle, y_ptr: T.handle, s_ptr: T.handle, p_ptr: T.handle,
                           M: T.int32, K: T.int32, rows_padded: T.int32):
        x_len = T.int64()
        y_len = T.int64()
        s_len = T.int64()
        X = T.match_buffer(x_ptr, (x_len,), dtype, align=16)
        G = T.match_buffer(g_ptr, (1,), "float32")
        Y = T.match_buffer(y_ptr, (y_len,), "uint32", align=8)
        S = T.match_buffer(s_ptr, (s_len,), "uint8")
        P = T.match_buffer(p_ptr, (M,), "float32")
        T.device_entry()
        cta = T.cta_id([rows_padded])
        tid = T.thread_id([PT_THREADS])
        block.alloc()
        block.alloc_held(PT_HELD)
        local = T.alloc_local((1,), "float32")
        enc = T.alloc_local((1,), "float32")
        part = T.alloc_shared((warps,), "float32")

        nb = K // blk
        cols = nb if layout == "linear" else (nb + 3) // 4 * 4
        row = i64(cta)
        with T.If(cta < M):
            with T.Then():
                local[0] = T.float32(0)
                block.held_amax(X, row, tid, nb, K, local, PT_THREADS)
                for it in T.serial((nb - held + PT_THREADS - 1) // PT_THREADS):
                    col = held + it * PT_THREADS + tid
                    with T.If(col < nb):
                        with T.Then():
                            local[0] = T.max(local[0], block.amax_of(X, row, i64(col), K))
                local[0] = T.cuda.warp_max(local[0], 32)
                with T.If(tid % 32 == 0):
                    with T.Then():
                        part[tid // 32] = local[0]
                T.evaluate(T.cuda.cta_sync())
                local[0] = part[0]
                for w in range(1, warps):
                    local[0] = T.if_then_else(part[w] > local[0], part[w], local[0])
                ratio = (T.float32(1) / G[0]) / local[0]
                ratio = T.if_then_else(ratio < flt_max, ratio, flt_max)
                enc[0] = T.if_then_else(local[0] == T.float32(0), flt_max,
                                        T.if_then_else(ratio == T.float32(0), T.float32(1), ratio))
                with T.If(tid == 0):
                    with T.Then():
                        P[cta] = T.if_then_else(local[0] == T.float32(0), T.float32(0), T.float32(1) / enc[0])
                block.held_emit(Y, S, row, tid, nb, cols, K, enc[0], PT_THREADS)
                for it in T.serial((cols - held + PT_THREADS - 1) // PT_THREADS):
                    col = held + it * PT_THREADS + tid
                    with T.If(col < nb):
                        with T.Then():
                            block.emit(X, Y, S, row, i64(col), K, i64(cols), enc[0])
                        with T.Else():
                            with T.If(col < cols):
                                with T.Then():
                                    S[quant.sf_offset(row, i64(col), i64(cols), layout)] = T.uint8(0)
            with T.Else():
                for it in T.serial((cols + PT_THREADS - 1) // PT_THREADS):
                    col = it * PT_THREADS + tid
                    with T.If(col < cols):
                        with T.Then():
                            S[quant.sf_offset(row, i64(col), i64(cols), layout)] = T.uint8(0)

    return per_token_quantize.with_attr("global_symbol", name)


# --------------------------------------------------------------------------------------------------- host side
_MODULES = {fmt: f"{__package__}.{fmt}_quantize" for fmt in FORMATS}
# FlashInfer's SfLayout enum values (layout_128x4 = 0, layout_8x4 = 1, layout_linear = 2), its names and ours.
_LAYOUT_NAMES = {0: "128x4", 1: "8x4", 2: "linear", "layout_128x4": "128x4", "layout_8x4": "8x4",
                 "layout_linear": "linear", **{name: name for name in LAYOUTS}}


def layout_name(op: str, sf_layout) -> str:
    """Our layout name for a FlashInfer ``SfLayout`` (the enum, its int value or name) or one of ``LAYOUTS``."""
    key = getattr(sf_layout, "name", None) or getattr(sf_layout, "value", sf_layout)
    if key not in _LAYOUT_NAMES:
        key = sf_layout
    if key not in _LAYOUT_NAMES:
        raise checks.TirxInputError(f"{op}: argument 'sfLayout': expected one of {LAYOUTS} or a FlashInfer SfLayout, "
                                    f"got {sf_layout!r}")
    return _LAYOUT_NAMES[key]


def out_width(x: torch.Tensor, silu_and_mul: bool = False) -> int:
    """K, the quantized width: the input's last dimension, half of it for a ``[gate | up]`` input."""
    return x.shape[-1] // 2 if silu_and_mul else x.shape[-1]


def check_input(op: str, x: torch.Tensor, fmt: str, cuda: bool = True, silu_and_mul: bool = False,
                name: str = "input") -> None:
    """dtype, 2-D, K a multiple of the block (``silu_and_mul``: an even last dimension 2K), the launch's size; on
    CUDA (``cuda``: callers checking further arguments first pass False and call :func:`check_cuda` after)."""
    checks.tensor(op, name, x, dtypes=tuple(DTYPES.values()), ndim=2, cuda=False)
    blk = block_of(fmt)
    if silu_and_mul and x.shape[-1] % 2:
        raise checks.TirxInputError(f"{op}: argument '{name}': the last dimension ({x.shape[-1]}) must be even "
                                    f"(gate and up concatenated)")
    K = out_width(x, silu_and_mul)  # noqa: N806
    if K % blk:
        raise checks.TirxInputError(f"{op}: argument '{name}': K={K} is not a multiple of the scale block ({blk})")
    if grid_blocks(x.shape[0], K, fmt, "128x4") >= 2**31 - THREADS:
        raise checks.TirxInputError(f"{op}: argument '{name}': {tuple(x.shape)} has too many scale blocks for one "
                                    f"launch (2**31)")
    if cuda:
        check_cuda(op, x, name)


def check_cuda(op: str, x: torch.Tensor, name: str = "input") -> None:
    checks.tensor(op, name, x, cuda=True)


def new_outputs(x: torch.Tensor, fmt: str, layout: str, silu_and_mul: bool = False) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    """``(codes, scales)`` as returned: codes uint8 ``[M, K/2]`` (fp4) / float8_e4m3fn ``[M, K]`` (mxfp8); scales
    uint8, ``[M, K/block]`` linear, flat ``padded rows * padded columns`` swizzled."""
    M, K = x.shape[0], out_width(x, silu_and_mul)  # noqa: N806
    bits = FORMATS[fmt][1]
    codes = torch.empty(M, K * bits // 8, dtype=torch.uint8 if bits == 4 else torch.float8_e4m3fn,
                        device=x.device)
    rows, cols = sf_shape(M, K, fmt, layout)
    sf = torch.empty((M, cols) if layout == "linear" else (rows * cols,), dtype=torch.uint8, device=x.device)
    return codes, sf


def tiles(M: int, K: int, fmt: str, layout: str) -> int:  # noqa: N803
    return max(1, -(-grid_blocks(M, K, fmt, layout) // THREADS))


_CACHES: dict = {}
_UNIT: dict = {}


def _unit(device) -> torch.Tensor:
    """A placeholder global scale for the MX formats (their kernels do not read it)."""
    key = (device.type, device.index)
    if key not in _UNIT:
        _UNIT[key] = torch.ones(1, dtype=torch.float32, device=device)
    return _UNIT[key]


def run(x: torch.Tensor, global_scale, codes: torch.Tensor, sf: torch.Tensor, fmt: str, layout: str,
        silu_and_mul: bool = False) -> None:
    """Quantize ``x`` (``silu(gate) * up`` of it with ``silu_and_mul``) into the given outputs (the kernel of
    ``fmt``'s module, cached per dtype / layout / fusion / device)."""
    from tirx_kernels.core import runtime

    M, K = x.shape[0], out_width(x, silu_and_mul)  # noqa: N806
    if M == 0 or K == 0:
        return
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()
    if codes.data_ptr() % 16:
        raise checks.TirxInputError(f"{fmt}_quantize: the codes output must be 16-byte aligned")
    if fmt not in _CACHES:
        _CACHES[fmt] = runtime.FunctionCache(_MODULES[fmt])
    dtype = str(x.dtype)[6:]
    params = {"dtype": dtype, "layout": layout, **({"silu_and_mul": True} if silu_and_mul else {})}
    fn = _CACHES[fmt].get((x.dtype, layout, silu_and_mul, x.get_device()), lambda: params, x.device)
    gs = _unit(x.device) if global_scale is None else global_scale.reshape(1).to(torch.float32)
    fn(x.view(-1), gs, codes.view(-1).view(torch.uint8).view(torch.uint32), sf.view(-1).view(torch.uint8), M, K,
       tiles(M, K, fmt, layout))


def quantize(op: str, x: torch.Tensor, global_scale, fmt: str, layout: str, silu_and_mul: bool = False,
             name: str = "input") -> tuple[torch.Tensor, torch.Tensor]:
    """The public ops' body: checks, outputs, then the kernel (directly in eager mode, else the custom op)."""
    from tirx_kernels.core import runtime

    check_input(op, x, fmt, cuda=False, silu_and_mul=silu_and_mul, name=name)
    if fmt == "nvfp4":
        checks.tensor(op, "global_scale", global_scale, dtypes=(torch.float32,), cuda=False)
        if global_scale.numel() != 1:
            raise checks.TirxInputError(f"{op}: argument 'global_scale': expected one element, got "
                                        f"{tuple(global_scale.shape)}")
    check_cuda(op, x, name)
    codes, sf = new_outputs(x, fmt, layout, silu_and_mul)
    if runtime.direct_call(x, global_scale):
        run(x, global_scale, codes, sf, fmt, layout, silu_and_mul)
    else:
        torch.ops.tirx.flashinfer_block_quantize(x, global_scale, codes, sf, fmt, layout, silu_and_mul)
    return codes, sf


@torch.library.custom_op("tirx::flashinfer_block_quantize", mutates_args=("codes", "sf"))
def _block_quantize_op(x: torch.Tensor, global_scale: torch.Tensor | None, codes: torch.Tensor, sf: torch.Tensor,
                       fmt: str, layout: str, silu_and_mul: bool = False) -> None:
    run(x, global_scale, codes, sf, fmt, layout, silu_and_mul)


@_block_quantize_op.register_fake
def _(x, global_scale, codes, sf, fmt, layout, silu_and_mul=False):
    return None


# ------------------------------------------------------------------------------------------ protocol helpers
def layout_of(sf: torch.Tensor, M: int, K: int, fmt: str) -> str:  # noqa: N803
    """The layout of a scale buffer from its shape (2-D: linear; flat: 128x4 when its size fits, else 8x4)."""
    if sf.dim() == 2:
        return "linear"
    return "128x4" if sf.numel() == grid_blocks(M, K, fmt, "128x4") else "8x4"


def prepare_data(fmt: str, dtype: str, M: int, K: int, layout: str, silu_and_mul: bool = False,  # noqa: N803
                 device: str = "cuda", **_) -> dict:
    """Rows of widely different magnitude (1e-2 .. 1e2), a calibrated global scale (448 * 6 / amax of what is
    quantized), outputs poisoned (0xFF). ``silu_and_mul``: rows ``[gate | up]`` of 2K, each half 1e-1 .. 1e1, so that
    what is quantized spans 1e-2 .. 1e2 as well: gate and up of 1e2 made fp16 products past 65504 (inf ``h``, a
    global scale of 0, and every code of the call decided by NaN / FLT_MAX edge cases, H200 run 1)."""
    import os

    seed = int(os.environ.get("TIRX_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    lo, hi = (-1, 1) if silu_and_mul else (-2, 2)
    mag = torch.logspace(lo, hi, max(M, 1), device=device)[:M, None]
    x = (torch.randn(M, 2 * K if silu_and_mul else K, generator=g, device=device) * mag).to(DTYPES[dtype])
    codes, sf = new_outputs(x, fmt, layout, silu_and_mul)
    codes.view(torch.uint8).fill_(0xFF)
    sf.fill_(0xFF)
    data = {"x": x, "x_q": codes, "sf": sf}
    if fmt == "nvfp4":
        h = silu_and_mul_values(x) if silu_and_mul else x
        data["global_scale"] = (448.0 * 6.0 / h.float().abs().amax().clamp_min(1e-12)).reshape(1).float()
    if silu_and_mul:
        data["silu_and_mul"] = True
    return data


def reference(fmt: str, x: torch.Tensor, sf: torch.Tensor, global_scale=None, silu_and_mul: bool = False,
              **_) -> dict:
    """core.quant_ref's codes and scales (of ``silu(gate) * up`` rounded to the dtype with ``silu_and_mul``),
    shaped and typed as the op returns them."""
    if silu_and_mul:
        x = silu_and_mul_values(x)
    M, K = x.shape  # noqa: N806
    layout = layout_of(sf, M, K, fmt)
    if fmt == "nvfp4":
        codes, ref_sf = quant_ref.nvfp4_quantize(x, global_scale, layout)
    elif fmt == "mxfp4":
        codes, ref_sf = quant_ref.mxfp4_quantize(x, layout)
    else:
        codes, ref_sf = quant_ref.mxfp8_quantize(x, layout)
        codes = codes.view(torch.float8_e4m3fn)
    return {"x_q": codes, "sf": ref_sf.reshape(sf.shape)}


def silu_and_mul_values(x: torch.Tensor, exp=torch.exp) -> torch.Tensor:
    """The values the fused kernel quantizes: ``silu(gate) * up`` of ``x = [gate | up]`` in fp32 in the kernel's
    order, rounded to x's dtype (``exp``: the exponential, e.g. the emulation's libm ``expf``). A NaN is the
    canonical 0x7FFF that ``cvt.rn.{bf16x2,f16x2}.f32`` gives (torch's rounding keeps a NaN's sign, and ``silu(-inf)
    = -inf / inf`` is negative; the sign of a NaN decides its e2m1 code)."""
    K = x.shape[-1] // 2  # noqa: N806
    g, u = x[..., :K].float(), x[..., K:].float()
    h = (g / (1 + exp(-g)) * u).to(x.dtype)
    canonical = torch.full_like(h.view(torch.int16), 0x7FFF)
    return torch.where(h.isnan(), canonical, h.view(torch.int16)).view(x.dtype)


def roofline(fmt: str, M: int, K: int, layout: str, silu_and_mul: bool = False, **_) -> dict:  # noqa: N803
    """Input read once (2K a row with ``silu_and_mul``), codes and the scale buffer (padding included) written
    once."""
    bits = FORMATS[fmt][1]
    reads = 2 if silu_and_mul else 1
    return {"bytes": reads * M * K * 2 + M * K * bits // 8 + grid_blocks(M, K, fmt, layout),
            "flops": (4 + 6 * silu_and_mul) * M * K}


def call_samples(rng, fmt: str) -> list[dict]:
    from tirx_kernels.core import model_dims

    blk = block_of(fmt)
    ks = sorted({k for k in (*model_dims.hidden_sizes(), *model_dims.intermediate_sizes()) if k % blk == 0})
    ks += [blk * rng.randint(1, 700) for _ in range(4)]
    return [{"dtype": t, "layout": lay, "M": rng.choice([1, 7, 128, 1000, rng.randint(1, 20000)]), "K": k}
            for t in DTYPES for lay in LAYOUTS for k in ks]


# ------------------------------------------------------------------------------------------------ CPU evidence
def emulate_quantize(x: torch.Tensor, global_scale, fmt: str, layout: str,
                     silu_and_mul: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel's generated CUDA on the CPU (``core.emulate``, with core.lang.quant's stand-ins) on CPU
    tensors; outputs start poisoned (0xAB / 0xCD), so every byte the result holds was written by the kernel."""
    from tirx_kernels.core import emulate
    from tirx_kernels.core.lang import quant

    M, K = x.shape[0], out_width(x, silu_and_mul)  # noqa: N806
    codes, sf = new_outputs(x, fmt, layout, silu_and_mul)
    codes.view(torch.uint8).fill_(0xAB)
    sf.fill_(0xCD)
    gs = torch.ones(1) if global_scale is None else torch.as_tensor(global_scale, dtype=torch.float32).reshape(1)
    flags = emulate.CXXFLAGS
    emulate.CXXFLAGS = [*flags, *quant.emulate_cxxflags()]
    try:
        kern = emulate.compile(build_kernel(str(x.dtype)[6:], fmt, layout, f"{fmt}_quantize", silu_and_mul))
    finally:
        emulate.CXXFLAGS = flags
    args = {"X_ptr": x.contiguous().view(-1), "Y_ptr": codes.view(-1).view(torch.uint8).view(torch.int32),
            "S_ptr": sf.view(-1), "M": M, "K": K, "tiles": tiles(M, K, fmt, layout)}
    if "G_ptr" in [p.name for p in kern.params]:
        args["G_ptr"] = gs
    kern(grid=(args["tiles"],), block=(THREADS,), **args).check()
    return codes, sf


def special_rows(M: int, K: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:  # noqa: N803
    """Test input: rows from 1e-2 to 1e2 in magnitude, plus (where M allows) an all-zero row, a row with +-inf and
    NaN, one at the dtype's largest finite values, one of e2m1 / e4m3 midpoints, one of subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-2, 2, max(M, 1))[:M, None]
    specials = [torch.zeros(K),
                torch.tensor([float("inf"), -float("inf"), float("nan"), 1.0] * (K // 4)),
                torch.full((K,), torch.finfo(dtype).max) * torch.sign(torch.randn(K, generator=g)),
                torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * (K // 8)) * 1.5,
                torch.full((K,), torch.finfo(dtype).tiny / 4)]
    for i, row in enumerate(specials[:max(0, M - 1)]):
        x[i + 1] = row
    return x.to(dtype)
