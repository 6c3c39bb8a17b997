# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's fused DiT LayerNorm (flashinfer.diffusion_ops: WAN-style gate / residual / adaLN modulation).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/norm/fused_dit_layernorm.cuh
# (meta_fused_layernorm), python/flashinfer/norm (fused_dit_*), tests/norm/test_fused_dit_layernorm.py, release
# v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec); read at fb28d7242b3506a2348265962041acc1fb56cca4.
# Written anew in TIRx: same semantics (fp32 sum, residual rounded once, statistics and output from the unrounded
# sum), different structure and a two-pass variance.
"""DiT (WAN 2.x) LayerNorm fused with the residual / gate update and adaLN modulation, three modes, on bf16 tokens
``[batch, rows, H]``:

- ``grgb`` (``fused_dit_gate_residual_layernorm_gamma_beta``):
  ``x = residual + input * (gate + gate_bias)``, ``norm_out = LayerNorm(x) * gamma + beta``.
- ``grss`` (``fused_dit_gate_residual_layernorm_scale_shift``):
  ``x = residual + input * (gate + gate_bias)``, ``norm_out = LayerNorm(x) * (1 + scale + scale_bias) + shift +
  shift_bias``.
- ``rss`` (``fused_dit_residual_layernorm_scale_shift``): ``x = residual + input`` (``input`` alone without a
  residual), modulated as ``grss``.

``residual_out = bf16(x)``; the statistics and ``norm_out`` use the unrounded fp32 ``x`` (as upstream), LayerNorm
without affine (its own ``gamma``/``beta`` only in ``grgb``), ``rsqrt(var + eps)``. gate, scale and shift are bf16
*per token* (upstream: views of WAN's ``temb.chunk(6, dim=2)``, row stride ``6 * H``): here any batch and row
strides, so a per-batch modulation broadcast over rows (an ``expand``-ed ``[batch, 1, H]``, row stride 0) works
too. Biases, gamma and beta are fp32 ``[H]`` (or ``[1, H]``); an absent bias is 0. ``input_global_scaling_factor``
(fp32 ``[1]`` on the device) multiplies ``input`` (``(gate + gate_bias) * s`` with a gate): upstream's order of
operations, so a scale of exactly 1 gives the bits of no scale. Upstream computes the variance as ``E[x**2] -
mean**2`` (clamped at 0); this port takes the mean of squared deviations, in two passes over registers.

Beyond upstream (hidden 3072 only, contiguous input / residual / outputs): any H >= 1, any batch and row strides of
every token tensor, ``residual_out`` may be ``residual`` itself (each element is read before it is written by the
same thread). Output bf16; upstream's NVFP4 / MXFP8 outputs are SM100-only there and not ported yet (the public ops
reject ``use_nvfp4`` / ``use_mxfp8``).

Kernels, per mode: specialized per H (H % 8 == 0 in [16, 16384], every token tensor and vector on 16 bytes): a token
over ``threads_per_row`` threads (``layernorm.row_plan``), each loading its 16-byte vectors of input, residual, gate,
scale and shift before any math, holding ``x`` in fp32 registers; the biases, gamma and beta (shared by every token,
L1/L2-resident) are loaded vector by vector where used. General (``schedule="general"``): H, strides and alignment at
run time, one CTA of ``GENERAL_THREADS`` per token, element-wise: ``x`` held in registers for H <= 4096, else three
passes that form it from the inputs again.
Both launch as programmatic dependents (``core.lang.pdl``). ptxas (nvcc 13.0, sm_90a), H = 3072: grgb 52, rss 60,
grss 64 registers (192 threads a token, 2 vectors each); rss 128: 39, rss 16384: 104; general 48-60; no spills.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks
from tirx_kernels.ported.flashinfer.norm import layernorm as _ln

KERNEL_META = {
    "name": "flashinfer_fused_dit_layernorm",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DiT LayerNorm fused with residual / gate and adaLN scale-shift (modes grgb, rss, grss), bf16",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["fused_dit_gate_residual_layernorm_gamma_beta", "fused_dit_gate_residual_layernorm_scale_shift",
                   "fused_dit_residual_layernorm_scale_shift"],
}

# FlashInfer's test shapes (batch, rows) in {(1, 1920), (1, 768), (2, 1920), (2, 768), (4, 1920)} x 3072 for every
# mode (WAN temb views: gate / scale / shift with row stride 6 * H), rss without a residual, an input scale, a per-batch
# broadcast modulation, odd H and strided tokens (the general kernel), and the general kernel pinned at 3072.
CONFIGS = [
    {"label": "grgb_b1_r1920", "mode": "grgb", "B": 1, "R": 1920, "H": 3072},
    {"label": "grgb_b2_r768", "mode": "grgb", "B": 2, "R": 768, "H": 3072},
    {"label": "grgb_b4_r1920", "mode": "grgb", "B": 4, "R": 1920, "H": 3072},
    {"label": "rss_b1_r768", "mode": "rss", "B": 1, "R": 768, "H": 3072},
    {"label": "rss_b2_r1920", "mode": "rss", "B": 2, "R": 1920, "H": 3072},
    {"label": "rss_b4_r1920", "mode": "rss", "B": 4, "R": 1920, "H": 3072},
    {"label": "rss_noresidual_b2_r768", "mode": "rss", "B": 2, "R": 768, "H": 3072, "residual": False},
    {"label": "grss_b1_r768_input_scale", "mode": "grss", "B": 1, "R": 768, "H": 3072, "input_scale": 0.5},
    {"label": "grss_b1_r768", "mode": "grss", "B": 1, "R": 768, "H": 3072},
    {"label": "grss_b2_r1920", "mode": "grss", "B": 2, "R": 1920, "H": 3072},
    {"label": "grss_b4_r1920", "mode": "grss", "B": 4, "R": 1920, "H": 3072},
    {"label": "grss_b2_r77_per_batch", "mode": "grss", "B": 2, "R": 77, "H": 3072, "per_batch": True},
    {"label": "grss_b2_r19_h1000", "mode": "grss", "B": 2, "R": 19, "H": 1000},
    {"label": "grgb_b3_r5_h129_strided", "mode": "grgb", "B": 3, "R": 5, "H": 129, "row_pad": 3},
    {"label": "rss_b1_r33_h5120", "mode": "rss", "B": 1, "R": 33, "H": 5120},
    {"label": "grgb_b2_r768_general", "mode": "grgb", "B": 2, "R": 768, "H": 3072, "schedule": "general"},
]

BENCH_CONFIGS = [
    {"label": "rss_b1_r768", "mode": "rss", "B": 1, "R": 768, "H": 3072},
    {"label": "grgb_b1_r1920", "mode": "grgb", "B": 1, "R": 1920, "H": 3072},
    {"label": "grss_b4_r1920", "mode": "grss", "B": 4, "R": 1920, "H": 3072},
    {"label": "grss_b1_r768", "mode": "grss", "B": 1, "R": 768, "H": 3072},
    {"label": "grgb_b4_r1920", "mode": "grgb", "B": 4, "R": 1920, "H": 3072},
    {"label": "rss_b4_r1920", "mode": "rss", "B": 4, "R": 1920, "H": 3072},
]

DEFAULTS = {"dtype": "bfloat16", "eps": 1e-6}

MODES = ("grgb", "rss", "grss")
_DTYPE = "bfloat16"
_VEC = 8
_WORDS = 4
MAX_GENERAL_H = 2**30
MAX_TOKENS = 2**31 - 1 - 1024  # batch * rows in int32 (token = cta * rows_per_cta + group, below 2**31)
MAX_STRIDE = 2**31 - 1
GENERAL_THREADS = 256
PDL = "end"
WAN_HIDDEN = 3072  # the hidden size upstream supports (WAN 2.2 5B)
# DiT hidden sizes a bundle specializes: WAN 2.1 1.3B / SD3 1536, WAN 2.2 5B / Flux 3072, WAN 2.1 14B 5120 (the LLM
# catalog's sizes are not DiT widths; any other H runs the general kernel).
DIT_HIDDEN = (1536, WAN_HIDDEN, 5120)


def _gated(mode: str) -> bool:
    return mode in ("grgb", "grss")


def _modulated(mode: str) -> bool:
    return mode in ("rss", "grss")


def compile_params(**cfg) -> dict:
    mode = cfg.get("mode", "grgb")
    if cfg.get("schedule") == "general" or not _ln.specialized(int(cfg["H"])):
        return {"mode": mode, "schedule": "general"}
    return {"mode": mode, "H": int(cfg["H"])}


def general_params(params: dict) -> dict:
    return {"mode": params["mode"], "schedule": "general"}


def artifact_params() -> list[dict]:
    """Per mode: the general kernel and the specialized one of each DiT hidden size."""
    return [p for mode in MODES
            for p in [general_params({"mode": mode})] + [{"mode": mode, "H": H} for H in DIT_HIDDEN]]


def call_samples(rng) -> list[dict]:
    from tirx_kernels.core import model_dims

    sizes = model_dims.hidden_sizes() + list(DIT_HIDDEN) + [rng.randint(1, 64) for _ in range(3)]
    sizes += [rng.randint(1, 20000) for _ in range(6)] + [8 * rng.randint(2, 2048) for _ in range(4)]
    return [{"mode": mode, "B": rng.choice([1, 2, 4]), "R": rng.choice([1, 768, 1920]), "H": H}
            for mode in MODES for H in sizes]


def sass_expect(mode: str, H: int | None = None, schedule: str | None = None, **_) -> list[str]:
    if schedule == "general":
        return [r"LDG\.E\.U16", r"STG\.E\.U16"]
    return [r"LDG\.E\.NA\.128", r"LDG\.E\.128", r"STG\.E\.128"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx functions
# ---------------------------------------------------------------------------------------------------------

def get_kernel(mode: str, H: int | None = None, schedule: str | None = None, pdl: str | None = PDL):
    if mode not in MODES:
        raise ValueError(f"fused_dit_layernorm: mode {mode!r} is not one of {MODES}")
    if schedule == "general":
        if H is not None:
            raise ValueError(f"fused_dit_layernorm: the general kernel takes H at run time, got H={H}")
        return build_general(mode, pdl)
    if schedule is not None:
        raise ValueError(f"fused_dit_layernorm: schedule {schedule!r} is not None or 'general'")
    if H is None or not _ln.specialized(H):
        raise ValueError(f"fused_dit_layernorm: H={H} must be a multiple of {_VEC} in [{_ln.MIN_H}, {_ln.MAX_H}]")
    return build_kernel(mode, H, pdl=pdl, **_ln.row_plan(H))


def _token_offset(T, b, r, sb, sr):
    """64-bit element offset of token (b, r) in a tensor of batch / row strides ``sb`` / ``sr``."""
    return T.Cast("int64", b) * T.Cast("int64", sb) + T.Cast("int64", r) * T.Cast("int64", sr)


def _sum_x(T, mode, inp, res, gate, gate_bias, isf):
    """fp32 ``x`` of one element: upstream's ``fma(input, (gate + gate_bias) [* s], residual)`` or
    ``fma(input, s, residual)``."""
    return inp * ((gate + gate_bias) * isf if _gated(mode) else isf) + res


def _normalized(T, mode, x, mean, rs, w1, w2, scale=None, shift=None):
    """fp32 ``norm_out`` of one element: ``w1``/``w2`` are gamma/beta (grgb) or scale_bias/shift_bias."""
    if _gated(mode) and not _modulated(mode):
        return (x - mean) * (rs * w1) + w2
    return (x - mean) * rs * (T.float32(1) + (scale + w1)) + (shift + w2)


def build_kernel(mode: str, H: int, threads_per_row: int, vectors_per_thread: int, rows_per_cta: int,
                 pdl: str | None = PDL):
    """The specialized kernel (H a compile-time multiple of 8; every token tensor and vector on 16 bytes)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("fused_dit_layernorm", pdl)
    tpr, vpt = threads_per_row, vectors_per_thread
    threads = tpr * rows_per_cta
    words = reduce.scratch_words(tpr, rows_per_cta)
    inv_h = 1.0 / H
    gated, modulated = _gated(mode), _modulated(mode)
    nw = vpt * _WORDS

    def col_pred(v, lane):
        return (v * tpr + lane) * _VEC < H if (v + 1) * tpr * _VEC > H else None

    def both(a, b):
        if a is None or b is None:
            return b if a is None else a
        return T.And(a, b)

    def load(regs, buf, base, lane, pred_row):
        for v in range(vpt):
            pred = both(pred_row, col_pred(v, lane))
            if pred is not None:
                vector.fill(regs, v * _WORDS, _WORDS)  # masked vectors are 0: x is 0 there
            vector.load_v4(regs, v * _WORDS, buf.ptr_to([base + (v * tpr + lane) * _VEC]), pred, cache=_ln.X_CACHE)

    def all_loaded(xw, rw, gw, scw, shw, zero):
        """A uint32 that is 0 at run time but depends on every token load (``vector.after_all``). OR-ed into the
        input scale and the gate bias, which every x uses, it keeps all math behind the last load's issue; with a
        dependency on the residual alone ptxas issued the first vector's loads, its math, then the second's (SASS,
        grss 3072), and grgb's gate + gate_bias waited on the gate before the last loads were issued."""
        held = [xw, rw] + ([gw] if gated else []) + ([scw, shw] if modulated else [])
        pending = vector.after_all(held[0], nw, zero)
        for regs in held[1:]:
            pending = pending | vector.after_all(regs, nw, zero)
        return pending

    def form_x(xf, xw, rw, gw, GB, lane, isf, pend, bw, orr, ROf, ro_base, row_ok, acc):  # noqa: N803
        """``xf`` <- fp32 x of every held element; residual_out <- bf16(x); ``acc[0] +=`` the sum of x."""
        for v in range(vpt):
            c0 = (v * tpr + lane) * _VEC
            if gated:
                _ln.load_fp32_chunk(T, bw, GB, c0, col_pred(v, lane))
            for j in range(_WORDS):
                i = v * _WORDS + j
                in_lo, in_hi = vector.unpack2(xw[i], _DTYPE)
                r_lo, r_hi = vector.unpack2(rw[i], _DTYPE)
                g_lo, g_hi = vector.unpack2(gw[i], _DTYPE) if gated else (None, None)
                b_lo, b_hi = (T.cuda.uint_as_float(bw[2 * j] | pend[0]),
                              T.cuda.uint_as_float(bw[2 * j + 1] | pend[0])) if gated else (None, None)
                T.buffer_store(xf, _sum_x(T, mode, in_lo, r_lo, g_lo, b_lo, isf), [2 * i])
                T.buffer_store(xf, _sum_x(T, mode, in_hi, r_hi, g_hi, b_hi, isf), [2 * i + 1])
                vector.pack2(orr, j, xf[2 * i], xf[2 * i + 1], _DTYPE)
                T.buffer_store(acc, acc[0] + xf[2 * i] + xf[2 * i + 1], [0])
            vector.store_v4(ROf.ptr_to([ro_base + c0]), orr, 0, both(row_ok, col_pred(v, lane)))

    def squared_deviations(xf, lane, mean, acc, part):
        T.buffer_store(acc, T.float32(0), [0])
        for v in range(vpt):
            T.buffer_store(part, T.float32(0), [0])
            for e in range(_VEC):
                d = xf[v * _VEC + e] - mean
                T.buffer_store(part, part[0] + d * d, [0])
            pred = col_pred(v, lane)
            T.buffer_store(acc, acc[0] + (part[0] if pred is None else T.Select(pred, part[0], T.float32(0))), [0])

    def scale_store(xf, scw, shw, W1, W2, lane, w1w, w2w, orr, NOf, no_base, row_ok, mean, rs):  # noqa: N803
        for v in range(vpt):
            c0 = (v * tpr + lane) * _VEC
            _ln.load_fp32_chunk(T, w1w, W1, c0, col_pred(v, lane))
            _ln.load_fp32_chunk(T, w2w, W2, c0, col_pred(v, lane))
            for j in range(_WORDS):
                i = v * _WORDS + j
                w1_lo, w1_hi = _ln.fp32_pair(T, w1w, 2 * j)
                w2_lo, w2_hi = _ln.fp32_pair(T, w2w, 2 * j)
                sc_lo, sc_hi = vector.unpack2(scw[i], _DTYPE) if modulated else (None, None)
                sh_lo, sh_hi = vector.unpack2(shw[i], _DTYPE) if modulated else (None, None)
                vector.pack2(orr, j, _normalized(T, mode, xf[2 * i], mean, rs, w1_lo, w2_lo, sc_lo, sh_lo),
                             _normalized(T, mode, xf[2 * i + 1], mean, rs, w1_hi, w2_hi, sc_hi, sh_hi), _DTYPE)
            vector.store_v4(NOf.ptr_to([no_base + c0]), orr, 0, both(row_ok, col_pred(v, lane)))

    @T.prim_func
    def fused_dit_layernorm(x_ptr: T.handle, r_ptr: T.handle, g_ptr: T.handle, sc_ptr: T.handle, sh_ptr: T.handle,
                            gb_ptr: T.handle, w1_ptr: T.handle, w2_ptr: T.handle, isf_ptr: T.handle,
                            ro_ptr: T.handle, no_ptr: T.handle, eps: T.float32, has_residual: T.int32,
                            zero: T.int32):
        B = T.int32()
        R = T.int32()
        xb = T.int32()
        xr = T.int32()
        rb = T.int32()
        rr = T.int32()
        gbs = T.int32()
        grs = T.int32()
        scb = T.int32()
        scr = T.int32()
        shb = T.int32()
        shr = T.int32()
        rob = T.int32()
        ror = T.int32()
        nob = T.int32()
        nor = T.int32()
        X = T.match_buffer(x_ptr, (B, R, H), _DTYPE, strides=(xb, xr, 1), align=16)
        Rs = T.match_buffer(r_ptr, (B, R, H), _DTYPE, strides=(rb, rr, 1), align=16)
        Gt = T.match_buffer(g_ptr, (B, R, H), _DTYPE, strides=(gbs, grs, 1), align=16)
        Sc = T.match_buffer(sc_ptr, (B, R, H), _DTYPE, strides=(scb, scr, 1), align=16)
        Sh = T.match_buffer(sh_ptr, (B, R, H), _DTYPE, strides=(shb, shr, 1), align=16)
        GB = T.match_buffer(gb_ptr, (H,), "float32", align=16)
        W1 = T.match_buffer(w1_ptr, (H,), "float32", align=16)
        W2 = T.match_buffer(w2_ptr, (H,), "float32", align=16)
        Isf = T.match_buffer(isf_ptr, (1,), "float32", align=4)
        RO = T.match_buffer(ro_ptr, (B, R, H), _DTYPE, strides=(rob, ror, 1), align=16)
        NO = T.match_buffer(no_ptr, (B, R, H), _DTYPE, strides=(nob, nor, 1), align=16)
        T.device_entry()
        # Flat views indexed b * batch_stride + r * row_stride + col (TIRx drops match_buffer strides from device
        # indexing); their extent only names the buffer.
        Xf = T.decl_buffer((1,), _DTYPE, data=X.data)
        Rf = T.decl_buffer((1,), _DTYPE, data=Rs.data)
        Gf = T.decl_buffer((1,), _DTYPE, data=Gt.data)
        Scf = T.decl_buffer((1,), _DTYPE, data=Sc.data)
        Shf = T.decl_buffer((1,), _DTYPE, data=Sh.data)
        ROf = T.decl_buffer((1,), _DTYPE, data=RO.data)
        NOf = T.decl_buffer((1,), _DTYPE, data=NO.data)
        cta = T.cta_id([(B * R + rows_per_cta - 1) // rows_per_cta])
        tid = T.thread_id([threads])
        xw = T.alloc_local((nw,), "uint32")
        rw = T.alloc_local((nw,), "uint32")
        gw = T.alloc_local((nw if gated else _WORDS,), "uint32")
        scw = T.alloc_local((nw if modulated else _WORDS,), "uint32")
        shw = T.alloc_local((nw if modulated else _WORDS,), "uint32")
        xf = T.alloc_local((vpt * _VEC,), "float32")
        bw = T.alloc_local((2 * _WORDS,), "uint32")
        w2w = T.alloc_local((2 * _WORDS,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        pend = T.alloc_local((1,), "uint32")
        acc = T.alloc_local((1,), "float32")
        part = T.alloc_local((1,), "float32")
        stat = T.alloc_local((2,), "float32")
        scratch = T.alloc_shared((max(1, 2 * words),), "float32")
        pdl_launch.begin(pdl)

        tok = cta * rows_per_cta + tid // tpr
        lane = tid % tpr
        row_ok = T.bool(True) if rows_per_cta == 1 else tok < B * R
        t = T.min(tok, B * R - 1)  # a group past the last token (tail CTA) only joins the reductions
        b = T.truncdiv(t, R)
        r = T.truncmod(t, R)
        load(xw, Xf, _token_offset(T, b, r, xb, xr), lane, row_ok)
        load(rw, Rf, _token_offset(T, b, r, rb, rr), lane, T.And(row_ok, has_residual != 0))
        if gated:
            load(gw, Gf, _token_offset(T, b, r, gbs, grs), lane, row_ok)
        if modulated:
            load(scw, Scf, _token_offset(T, b, r, scb, scr), lane, row_ok)
            load(shw, Shf, _token_offset(T, b, r, shb, shr), lane, row_ok)
        pend[0] = all_loaded(xw, rw, gw, scw, shw, zero)
        isf = T.cuda.uint_as_float(T.reinterpret("uint32", Isf[0]) | pend[0])
        acc[0] = T.float32(0)
        form_x(xf, xw, rw, gw, GB, lane, isf, pend, bw, orr, ROf, _token_offset(T, b, r, rob, ror), row_ok, acc)
        stat[0] = reduce.group_sum(acc[0], tid, tpr, scratch) * T.float32(inv_h)  # the mean
        squared_deviations(xf, lane, stat[0], acc, part)
        stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, tpr, scratch, words) * T.float32(inv_h) + eps)
        scale_store(xf, scw, shw, W1, W2, lane, bw, w2w, orr, NOf, _token_offset(T, b, r, nob, nor), row_ok,
                    stat[0], stat[1])
        pdl_launch.end(pdl)

    return pdl_launch.launch(fused_dit_layernorm, pdl)


def build_general(mode: str, pdl: str | None = PDL, threads: int = GENERAL_THREADS, held: int = _ln.GENERAL_HELD):
    """The general kernel: H, strides and alignment at run time; one CTA of ``threads`` per token, element-wise
    (coalesced 2-byte accesses). Tokens of up to ``threads * held`` elements keep ``x`` in registers (element
    ``k * threads + tid`` in slot ``k``); longer ones (a CTA-uniform branch) take three passes (sum, squared
    deviations, outputs), each forming ``x`` from the inputs again (the same bits)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce

    pdl_launch.check_trigger("fused_dit_layernorm", pdl)
    words = reduce.scratch_words(threads, 1)
    gated, modulated = _gated(mode), _modulated(mode)

    def x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf):  # noqa: N803
        cc = T.Cast("int64", c)
        res = T.Select(has_residual != 0, _ln.element(T, Rf, r_base + cc), T.float32(0))
        gate = _ln.element(T, Gf, g_base + cc) if gated else None
        return _sum_x(T, mode, _ln.element(T, Xf, x_base + cc), res, gate, GB[c] if gated else None, isf)

    def outputs_at(ROf, NOf, Scf, Shf, W1, W2, bases, c, x, mean, rs, pair):  # noqa: N803
        """residual_out and norm_out of element ``c`` (after this thread's last read of it: in place over residual)."""
        sc_base, sh_base, ro_base, no_base = bases
        cc = T.Cast("int64", c)
        _ln.store_element(T, ROf, ro_base + cc, x, pair)
        y = _normalized(T, mode, x, mean, rs, W1[c], W2[c],
                        _ln.element(T, Scf, sc_base + cc) if modulated else None,
                        _ln.element(T, Shf, sh_base + cc) if modulated else None)
        _ln.store_element(T, NOf, no_base + cc, y, pair)

    def load_held(xv, tid, H, *x_args):  # noqa: N803
        """``xv[k]`` <- x of element ``k * threads + tid`` (0 past the token); returns their sum."""
        for k in range(held):
            T.buffer_store(xv, T.float32(0), [k])
            with T.If(k * threads + tid < H):
                with T.Then():
                    T.buffer_store(xv, x_at(*x_args[:7], k * threads + tid, *x_args[7:]), [k])
        total = xv[0]
        for k in range(1, held):
            total = total + xv[k]
        return total

    def held_deviations(xv, tid, H, mean):  # noqa: N803
        total = T.float32(0)
        for k in range(held):
            total = total + T.Select(k * threads + tid < H, (xv[k] - mean) * (xv[k] - mean), T.float32(0))
        return total

    def store_held(xv, tid, H, out_args, mean, rs, pair):  # noqa: N803
        for k in range(held):
            with T.If(k * threads + tid < H):
                with T.Then():
                    outputs_at(*out_args, k * threads + tid, xv[k], mean, rs, pair)

    @T.prim_func
    def fused_dit_layernorm(x_ptr: T.handle, r_ptr: T.handle, g_ptr: T.handle, sc_ptr: T.handle, sh_ptr: T.handle,
                            gb_ptr: T.handle, w1_ptr: T.handle, w2_ptr: T.handle, isf_ptr: T.handle,
                            ro_ptr: T.handle, no_ptr: T.handle, eps: T.float32, has_residual: T.int32,
                            zero: T.int32):
        B = T.int32()
        R = T.int32()
        H = T.int32()
        xb = T.int32()
        xr = T.int32()
        rb = T.int32()
        rr = T.int32()
        gbs = T.int32()
        grs = T.int32()
        scb = T.int32()
        scr = T.int32()
        shb = T.int32()
        shr = T.int32()
        rob = T.int32()
        ror = T.int32()
        nob = T.int32()
        nor = T.int32()
        X = T.match_buffer(x_ptr, (B, R, H), _DTYPE, strides=(xb, xr, 1), align=2)
        Rs = T.match_buffer(r_ptr, (B, R, H), _DTYPE, strides=(rb, rr, 1), align=2)
        Gt = T.match_buffer(g_ptr, (B, R, H), _DTYPE, strides=(gbs, grs, 1), align=2)
        Sc = T.match_buffer(sc_ptr, (B, R, H), _DTYPE, strides=(scb, scr, 1), align=2)
        Sh = T.match_buffer(sh_ptr, (B, R, H), _DTYPE, strides=(shb, shr, 1), align=2)
        GB = T.match_buffer(gb_ptr, (H,), "float32", align=4)
        W1 = T.match_buffer(w1_ptr, (H,), "float32", align=4)
        W2 = T.match_buffer(w2_ptr, (H,), "float32", align=4)
        Isf = T.match_buffer(isf_ptr, (1,), "float32", align=4)
        RO = T.match_buffer(ro_ptr, (B, R, H), _DTYPE, strides=(rob, ror, 1), align=2)
        NO = T.match_buffer(no_ptr, (B, R, H), _DTYPE, strides=(nob, nor, 1), align=2)
        T.device_entry()
        Xf = T.decl_buffer((1,), _DTYPE, data=X.data)
        Rf = T.decl_buffer((1,), _DTYPE, data=Rs.data)
        Gf = T.decl_buffer((1,), _DTYPE, data=Gt.data)
        Scf = T.decl_buffer((1,), _DTYPE, data=Sc.data)
        Shf = T.decl_buffer((1,), _DTYPE, data=Sh.data)
        ROf = T.decl_buffer((1,), _DTYPE, data=RO.data)
        NOf = T.decl_buffer((1,), _DTYPE, data=NO.data)
        tok = T.cta_id([B * R])
        tid = T.thread_id([threads])
        xv = T.alloc_local((held,), "float32")
        acc = T.alloc_local((1,), "float32")
        stat = T.alloc_local((2,), "float32")
        pair = T.alloc_local((1,), "uint32")
        scratch = T.alloc_shared((2 * words,), "float32")
        pdl_launch.begin(pdl)

        b = T.truncdiv(tok, R)
        r = T.truncmod(tok, R)
        x_base = _token_offset(T, b, r, xb, xr)
        r_base = _token_offset(T, b, r, rb, rr)
        g_base = _token_offset(T, b, r, gbs, grs)
        isf = Isf[0]
        bases = (_token_offset(T, b, r, scb, scr), _token_offset(T, b, r, shb, shr), _token_offset(T, b, r, rob, ror),
                 _token_offset(T, b, r, nob, nor))
        if H <= threads * held:
            acc[0] = load_held(xv, tid, H, Xf, Rf, Gf, GB, x_base, r_base, g_base, has_residual, isf)
            stat[0] = reduce.group_sum(acc[0], tid, threads, scratch) / T.Cast("float32", H)  # the mean
            acc[0] = held_deviations(xv, tid, H, stat[0])
            stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, threads, scratch, words) / T.Cast("float32", H) + eps)
            store_held(xv, tid, H, (ROf, NOf, Scf, Shf, W1, W2, bases), stat[0], stat[1], pair)
        else:
            trips = (H + (threads - 1)) // threads
            acc[0] = T.float32(0)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    acc[0] = acc[0] + x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf)
            stat[0] = reduce.group_sum(acc[0], tid, threads, scratch) / T.Cast("float32", H)  # the mean
            acc[0] = T.float32(0)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    d = x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf) - stat[0]
                    acc[0] = acc[0] + d * d
            stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, threads, scratch, words) / T.Cast("float32", H) + eps)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    # x bound once: outputs_at uses it after residual_out (maybe residual itself) is written
                    x = x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf)
                    outputs_at(ROf, NOf, Scf, Shf, W1, W2, bases, c, x, stat[0], stat[1], pair)
        pdl_launch.end(pdl)

    return pdl_launch.launch(fused_dit_layernorm, pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(mode: str, B: int, R: int, H: int, eps: float = 1e-6, residual: bool = True,  # noqa: N803
                 per_batch: bool = False, row_pad: int = 0, input_scale: float | None = None, **_) -> dict:
    """WAN's layout: gate / scale / shift are views of one temb ``[B, R, 6, H]`` (row stride ``6 * H``; with
    ``per_batch`` a ``[B, 1, 6, H]`` temb broadcast over the rows); ``row_pad`` pads input and residual rows."""
    g = _generator()

    def tokens():
        return torch.randn(B, R, H + row_pad, generator=g, device="cuda").to(torch.bfloat16)[..., :H]

    def vec():
        return torch.randn(H, generator=g, device="cuda")

    temb = torch.randn(B, 1 if per_batch else R, 6, H, generator=g, device="cuda").to(torch.bfloat16)
    chunk = [temb[:, :, k].expand(B, R, H) for k in range(6)]
    data = {"mode": mode, "eps": eps, "input": tokens(), "residual": tokens() if residual else None}
    if _gated(mode):
        data.update(gate=chunk[2], gate_bias=vec())
    if _modulated(mode):
        data.update(scale=chunk[1], shift=chunk[0], scale_bias=vec(), shift_bias=vec())
    if mode == "grgb":
        data.update(gamma=vec(), beta=vec())
    if input_scale is not None:
        data["input_global_scaling_factor"] = torch.full((1,), input_scale, device="cuda")
    data["residual_out"] = torch.full((B, R, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    data["norm_out"] = torch.full((B, R, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    return data


def reference(mode, input, eps, residual=None, gate=None, gate_bias=None, scale=None, shift=None,  # noqa: A002
              scale_bias=None, shift_bias=None, gamma=None, beta=None, input_global_scaling_factor=None,
              **_) -> dict:
    """fp32 oracle: residual_out is x rounded to bf16; norm_out uses the unrounded x."""
    s = 1.0 if input_global_scaling_factor is None else input_global_scaling_factor.float()
    mul = (gate.float() + (0 if gate_bias is None else gate_bias.float())) * s if _gated(mode) else s
    x = input.float() * mul + (0 if residual is None else residual.float())
    H = x.shape[-1]
    if mode == "grgb":
        y = torch.nn.functional.layer_norm(x, (H,), gamma.float(), beta.float(), eps)
    else:
        sb = 0 if scale_bias is None else scale_bias.float()
        hb = 0 if shift_bias is None else shift_bias.float()
        y = torch.nn.functional.layer_norm(x, (H,), None, None, eps) * (1 + scale.float() + sb) + shift.float() + hb
    return {"residual_out": x.to(torch.bfloat16).float(), "norm_out": y}


_OPTIONAL = ("gate_bias", "scale_bias", "shift_bias", "input_global_scaling_factor")


def launch(cfg: dict, data: dict) -> None:
    mode = data["mode"]
    kw = {k: data[k] for k in _OPTIONAL if data.get(k) is not None}
    outs = {"residual_out": data["residual_out"], "norm_out": data["norm_out"], "epsilon": data["eps"]}
    if cfg.get("schedule") == "general":  # the general kernel where the public op would pick the specialized one
        _call(mode, data["input"], data.get("residual"), data.get("gate"), data.get("scale"), data.get("shift"),
              data.get("gamma"), data.get("beta"), general=True, **kw, **outs)
    elif mode == "grgb":
        fused_dit_gate_residual_layernorm_gamma_beta(data["input"], data["residual"], data["gate"], data["gamma"],
                                                     data["beta"], **kw, **outs)
    elif mode == "grss":
        fused_dit_gate_residual_layernorm_scale_shift(data["input"], data["residual"], data["gate"], data["scale"],
                                                      data["shift"], **kw, **outs)
    else:
        fused_dit_residual_layernorm_scale_shift(data["input"], data["scale"], data["shift"],
                                                 residual=data.get("residual"), **kw, **outs)


def roofline(mode: str, B: int, R: int, H: int, residual: bool = True, per_batch: bool = False,  # noqa: N803
             **_) -> dict:
    """Token tensors read once (input, residual, gate / scale / shift), both outputs written once, vectors once."""
    mods = (1 if _gated(mode) else 0) + (2 if _modulated(mode) else 0)
    tokens = B * R * H
    return {"bytes": 2 * tokens * (1 + residual + 2) + 2 * (B if per_batch else B * R) * H * mods + 4 * 3 * H,
            "flops": 12 * tokens}


def get_baselines(**cfg) -> dict:
    mode = cfg.get("mode", "grgb")

    def torch_eager():
        return lambda d: {k: v.to(torch.bfloat16) for k, v in reference(**d).items()}

    def torch_compile():
        fn = torch.compile(lambda d: reference(**d), dynamic=False)
        return lambda d: {k: v.to(torch.bfloat16) for k, v in fn(d).items()}

    def flashinfer():
        import flashinfer.diffusion_ops as dops

        if cfg["H"] != WAN_HIDDEN:
            raise ImportError(f"flashinfer's fused DiT LayerNorm takes H = {WAN_HIDDEN} only (H={cfg['H']})")

        def temb_view(t):
            """t as upstream requires it: a chunk of a [B, R, 6, H] buffer (row stride 6 * H)."""
            buf = torch.zeros(*t.shape[:2], 6, t.shape[2], device=t.device, dtype=t.dtype)
            buf[:, :, 0].copy_(t)
            return buf[:, :, 0]

        def fn(d):
            kw = {k: d[k] for k in _OPTIONAL if d.get(k) is not None}
            x = d["input"].contiguous()
            res = None if d.get("residual") is None else d["residual"].contiguous()
            if mode == "grgb":
                ro, no = dops.fused_dit_gate_residual_layernorm_gamma_beta(
                    x, res, temb_view(d["gate"]), d["gamma"], d["beta"], epsilon=d["eps"], **kw)
            elif mode == "grss":
                ro, no = dops.fused_dit_gate_residual_layernorm_scale_shift(
                    x, res, temb_view(d["gate"]), temb_view(d["scale"]), temb_view(d["shift"]), epsilon=d["eps"],
                    **kw)
            else:
                ro, no = dops.fused_dit_residual_layernorm_scale_shift(
                    x, temb_view(d["scale"]), temb_view(d["shift"]), residual=res, epsilon=d["eps"], **kw)
            return {"residual_out": ro, "norm_out": no}
        return fn

    return {"torch": torch_eager, "torch.compile": torch_compile, "flashinfer": flashinfer}


# ---------------------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------------------

def _fail(op: str, name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def _check_tokens(op: str, name: str, t, shape) -> None:
    checks.tensor(op, name, t, dtypes=(torch.bfloat16,), shape=shape, cuda=False)
    for d in range(2):
        if t.shape[d] > 1 and not 0 <= t.stride(d) <= MAX_STRIDE:
            _fail(op, name, f"batch and row strides in [0, {MAX_STRIDE}]", f"strides {tuple(t.stride())}")


def _check_vector(op: str, name: str, t, H: int) -> None:  # noqa: N803
    if t is None:
        return
    checks.tensor(op, name, t, dtypes=(torch.float32,), ndim=(1, 2), cuda=False)
    if t.shape[-1] != H or t.numel() != H:
        _fail(op, name, f"shape ({H},) or (1, {H})", f"shape {tuple(t.shape)}")


def _check(op: str, input, tokens: dict, vectors: dict, eps, use_nvfp4, use_mxfp8, sf, outs: dict) -> None:  # noqa: A002
    checks.tensor(op, "input", input, dtypes=(torch.bfloat16,), ndim=(3,), cuda=False)
    shape = tuple(input.shape)
    checks.in_range(op, "input", shape[2], 1, MAX_GENERAL_H)
    if shape[0] * shape[1] > MAX_TOKENS:
        _fail(op, "input", f"at most {MAX_TOKENS} tokens (batch * rows)", str(shape[0] * shape[1]))
    _check_tokens(op, "input", input, shape)
    for name, t in tokens.items():
        if t is not None:
            _check_tokens(op, name, t, shape)
    for name, t in vectors.items():
        _check_vector(op, name, t, shape[2])
    if use_nvfp4 or use_mxfp8:
        _fail(op, "use_nvfp4" if use_nvfp4 else "use_mxfp8", "False (bf16 output; the NVFP4 / MXFP8 outputs are not "
              "ported yet)", "True")
    if sf is not None:
        checks.tensor(op, "input_global_scaling_factor", sf, dtypes=(torch.float32,), shape=(1,), cuda=False)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _fail(op, "epsilon", "a float", type(eps).__name__)
    for name, t in outs.items():
        if t is not None:
            _check_tokens(op, name, t, shape)
    checks.tensor(op, "input", input, cuda=True)
    others = {k: v for k, v in {**tokens, **vectors, **outs, "input_global_scaling_factor": sf}.items()
              if v is not None}
    checks.same_device(op, "input", input, **others)


def _call(mode, input, residual, gate, scale, shift, gamma, beta, *, gate_bias=None, scale_bias=None,  # noqa: A002
          shift_bias=None, epsilon=1e-6, input_global_scaling_factor=None, residual_out=None, norm_out=None,
          general=False):
    residual_out = torch.empty(input.shape, dtype=input.dtype, device=input.device) if residual_out is None \
        else residual_out
    norm_out = torch.empty(input.shape, dtype=input.dtype, device=input.device) if norm_out is None else norm_out
    args = (input, residual, gate, scale, shift, gate_bias, scale_bias, shift_bias, gamma, beta,
            input_global_scaling_factor, residual_out, norm_out, float(epsilon), mode, general)
    if runtime.direct_call(*[a for a in args if isinstance(a, torch.Tensor)]):
        _run(*args)  # eager: the kernel straight away (a custom op's dispatch costs more host time than this runs)
        runtime.mark_written(residual_out)
        runtime.mark_written(norm_out)
    else:
        torch.ops.tirx.flashinfer_fused_dit_layernorm(*args)
    return residual_out, norm_out


def fused_dit_gate_residual_layernorm_gamma_beta(
        input: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor, gamma: torch.Tensor,  # noqa: A002
        beta: torch.Tensor, *, gate_bias: torch.Tensor | None = None, epsilon: float = 1e-6, use_nvfp4: bool = False,
        use_mxfp8: bool = False, global_scaling_factor: torch.Tensor | None = None,
        input_global_scaling_factor: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
        norm_out: torch.Tensor | None = None, sf_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_out = residual + input * (gate + gate_bias)``, ``norm_out = LayerNorm(residual_out) * gamma +
    beta`` (from the unrounded fp32 sum). bf16 ``[batch, rows, H]`` tokens (gate per token, any strides), fp32
    ``[H]`` vectors. Returns ``(residual_out, norm_out)``."""
    op = "fused_dit_gate_residual_layernorm_gamma_beta"
    _check(op, input, {"residual": residual, "gate": gate}, {"gamma": gamma, "beta": beta, "gate_bias": gate_bias},
           epsilon, use_nvfp4, use_mxfp8, input_global_scaling_factor,
           {"residual_out": residual_out, "norm_out": norm_out})
    for name, t in (("residual", residual), ("gate", gate), ("gamma", gamma), ("beta", beta)):
        if t is None:
            _fail(op, name, "a tensor", "None")
    return _call("grgb", input, residual, gate, None, None, gamma, beta, gate_bias=gate_bias, epsilon=epsilon,
                 input_global_scaling_factor=input_global_scaling_factor, residual_out=residual_out,
                 norm_out=norm_out)


def fused_dit_gate_residual_layernorm_scale_shift(
        input: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,  # noqa: A002
        shift: torch.Tensor, *, gate_bias: torch.Tensor | None = None, scale_bias: torch.Tensor | None = None,
        shift_bias: torch.Tensor | None = None, epsilon: float = 1e-6, use_nvfp4: bool = False,
        use_mxfp8: bool = False, global_scaling_factor: torch.Tensor | None = None,
        input_global_scaling_factor: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
        norm_out: torch.Tensor | None = None, sf_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_out = residual + input * (gate + gate_bias)``, ``norm_out = LayerNorm(residual_out) * (1 + scale +
    scale_bias) + shift + shift_bias``. Returns ``(residual_out, norm_out)``."""
    op = "fused_dit_gate_residual_layernorm_scale_shift"
    _check(op, input, {"residual": residual, "gate": gate, "scale": scale, "shift": shift},
           {"gate_bias": gate_bias, "scale_bias": scale_bias, "shift_bias": shift_bias}, epsilon, use_nvfp4,
           use_mxfp8, input_global_scaling_factor, {"residual_out": residual_out, "norm_out": norm_out})
    for name, t in (("residual", residual), ("gate", gate), ("scale", scale), ("shift", shift)):
        if t is None:
            _fail(op, name, "a tensor", "None")
    return _call("grss", input, residual, gate, scale, shift, None, None, gate_bias=gate_bias, scale_bias=scale_bias,
                 shift_bias=shift_bias, epsilon=epsilon, input_global_scaling_factor=input_global_scaling_factor,
                 residual_out=residual_out, norm_out=norm_out)


def fused_dit_residual_layernorm_scale_shift(
        input: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, *,  # noqa: A002
        residual: torch.Tensor | None = None, scale_bias: torch.Tensor | None = None,
        shift_bias: torch.Tensor | None = None, epsilon: float = 1e-6, use_nvfp4: bool = False,
        use_mxfp8: bool = False, global_scaling_factor: torch.Tensor | None = None,
        input_global_scaling_factor: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
        norm_out: torch.Tensor | None = None, sf_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_out = residual + input`` (``input`` without a residual), ``norm_out = LayerNorm(residual_out) *
    (1 + scale + scale_bias) + shift + shift_bias``. Returns ``(residual_out, norm_out)``."""
    op = "fused_dit_residual_layernorm_scale_shift"
    _check(op, input, {"residual": residual, "scale": scale, "shift": shift},
           {"scale_bias": scale_bias, "shift_bias": shift_bias}, epsilon, use_nvfp4, use_mxfp8,
           input_global_scaling_factor, {"residual_out": residual_out, "norm_out": norm_out})
    for name, t in (("scale", scale), ("shift", shift)):
        if t is None:
            _fail(op, name, "a tensor", "None")
    return _call("rss", input, residual, None, scale, shift, None, None, scale_bias=scale_bias, shift_bias=shift_bias,
                 epsilon=epsilon, input_global_scaling_factor=input_global_scaling_factor, residual_out=residual_out,
                 norm_out=norm_out)


def _aligned_tokens(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and all(t.shape[d] <= 1 or t.stride(d) % _VEC == 0 for d in range(2))


def uses_general(H: int, tokens: list, vectors: list) -> bool:  # noqa: N803
    """Whether a call runs the general kernel: H has no specialized kernel, or a token tensor's rows (any of its
    batches and rows) or an fp32 vector start off 16 bytes."""
    return not (_ln.specialized(H) and all(_aligned_tokens(t) for t in tokens)
                and all(v.data_ptr() % 16 == 0 for v in vectors))


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(2) == 1 else t.as_strided(t.shape, (*t.stride()[:2], 1))


_CONSTANTS: dict = {}


def _constant(value: float, H: int, device) -> torch.Tensor:  # noqa: N803
    """A cached fp32 ``[H]`` tensor of ``value`` (an absent bias: 0; an absent input scale: 1)."""
    key = (value, H, device)
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) > 64:
            _CONSTANTS.clear()
        t = _CONSTANTS[key] = torch.full((H,), value, dtype=torch.float32, device=device)
    return t


def _run(input, residual, gate, scale, shift, gate_bias, scale_bias, shift_bias, gamma, beta,  # noqa: A002
         input_global_scaling_factor, residual_out, norm_out, epsilon: float, mode: str, general: bool) -> None:
    if input.numel() == 0:
        return
    H = input.shape[2]
    dev = input.device

    def vec(t, fill):
        return _constant(fill, H, dev) if t is None else _ln.unit_vector(t.reshape(H))

    # Buffers a mode does not read are still arguments of the one kernel signature: any tensor of the right shape.
    x = _unit_last(input)
    tokens = [_unit_last(t) if t is not None else x for t in (residual, gate, scale, shift)]
    if mode == "grgb":
        vectors = [vec(gate_bias, 0.0), vec(gamma, 0.0), vec(beta, 0.0)]
    else:
        vectors = [vec(gate_bias, 0.0), vec(scale_bias, 0.0), vec(shift_bias, 0.0)]
    isf = _constant(1.0, 1, dev) if input_global_scaling_factor is None else input_global_scaling_factor
    ro, no = _unit_last(residual_out), _unit_last(norm_out)
    general = general or uses_general(H, [x, *tokens, ro, no], vectors)
    fn = _FUNCTIONS.get((mode, H, general, input.get_device()),
                        lambda: general_params({"mode": mode}) if general else compile_params(mode=mode, H=H), dev)
    fn(x, *tokens, *vectors, isf, ro, no, epsilon, int(residual is not None), 0)  # zero: see vector.after_all


from tirx_kernels.core import runtime  # noqa: E402

_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::flashinfer_fused_dit_layernorm", mutates_args=("residual_out", "norm_out"))
def _fused_dit_layernorm_op(input: torch.Tensor, residual: torch.Tensor | None, gate: torch.Tensor | None,  # noqa: A002
                            scale: torch.Tensor | None, shift: torch.Tensor | None, gate_bias: torch.Tensor | None,
                            scale_bias: torch.Tensor | None, shift_bias: torch.Tensor | None,
                            gamma: torch.Tensor | None, beta: torch.Tensor | None,
                            input_global_scaling_factor: torch.Tensor | None, residual_out: torch.Tensor,
                            norm_out: torch.Tensor, epsilon: float, norm_mode: str, general: bool) -> None:
    # ``norm_mode``, not ``mode``: torch.compile's auto_functionalized_v2 takes a ``mode`` argument of its own and a
    # custom-op argument of that name made every compiled call raise (H100 run, 2026-12-05).
    _run(input, residual, gate, scale, shift, gate_bias, scale_bias, shift_bias, gamma, beta,
         input_global_scaling_factor, residual_out, norm_out, epsilon, norm_mode, general)


@_fused_dit_layernorm_op.register_fake
def _(*args):
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
