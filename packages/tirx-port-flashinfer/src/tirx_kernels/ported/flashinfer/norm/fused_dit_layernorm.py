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
same thread). Output bf16, or quantized as upstream (``use_nvfp4`` with ``global_scaling_factor``, ``use_mxfp8``;
SM100-only there): ``norm_out`` int32 codes ``[B, R, H/8]`` / ``[B, R, H/4]`` and the scales in ``sf_out`` (uint8,
FlashInfer's 128x4 tiles per batch; as upstream the ops return ``(residual_out, norm_out)``, so a caller who wants
the scales passes ``sf_out``): see ``_dit_layernorm_quant``, which also runs the quantized kernel (H % 16 / % 32, any
strides, one CTA a token).

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

from tirx_kernels.core import checks, quant_ref
from tirx_kernels.ported.flashinfer.norm import _dit_layernorm_quant as Q
from tirx_kernels.ported.flashinfer.norm import _fp4_rows
from tirx_kernels.ported.flashinfer.norm import layernorm as _ln
from tirx_kernels.ported.flashinfer.norm._dit_layernorm_kernels import (
    _VEC,
    GENERAL_THREADS,  # noqa: F401 - the general kernel's block size, read by tests and launch tools from here
    PDL,
    _gated,
    _modulated,
    build_general,
    build_kernel,
)

KERNEL_META = {
    "name": "flashinfer_fused_dit_layernorm",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DiT LayerNorm fused with residual / gate and adaLN scale-shift (modes grgb, rss, grss), bf16 / "
                   "NVFP4 / MXFP8 output",
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
    # quantized norm_out (use_nvfp4 / use_mxfp8)
    {"label": "grss_b2_r1920_nvfp4", "mode": "grss", "B": 2, "R": 1920, "H": 3072, "out": "nvfp4"},
    {"label": "rss_b1_r768_mxfp8", "mode": "rss", "B": 1, "R": 768, "H": 3072, "out": "mxfp8"},
    {"label": "grgb_b2_r77_h1536_nvfp4", "mode": "grgb", "B": 2, "R": 77, "H": 1536, "out": "nvfp4"},
    {"label": "grss_b3_r130_h160_mxfp8_per_batch", "mode": "grss", "B": 3, "R": 130, "H": 160, "out": "mxfp8",
     "per_batch": True},
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
MAX_GENERAL_H = 2**30
MAX_TOKENS = 2**31 - 1 - 1024  # batch * rows in int32 (token = cta * rows_per_cta + group, below 2**31)
MAX_STRIDE = 2**31 - 1
WAN_HIDDEN = 3072  # the hidden size upstream supports (WAN 2.2 5B)
# DiT hidden sizes a bundle specializes: WAN 2.1 1.3B / SD3 1536, WAN 2.2 5B / Flux 3072, WAN 2.1 14B 5120 (the LLM
# catalog's sizes are not DiT widths; any other H runs the general kernel).
DIT_HIDDEN = (1536, WAN_HIDDEN, 5120)


def compile_params(**cfg) -> dict:
    mode = cfg.get("mode", "grgb")
    if cfg.get("out") in Q.QUANT_FORMATS:  # one quantized kernel per (mode, format), H at run time
        return {"mode": mode, "out": cfg["out"]}
    if cfg.get("schedule") == "general" or not _ln.specialized(int(cfg["H"])):
        return {"mode": mode, "schedule": "general"}
    return {"mode": mode, "H": int(cfg["H"])}


def general_params(params: dict) -> dict:
    if "out" in params:
        return dict(params)
    return {"mode": params["mode"], "schedule": "general"}


def artifact_params() -> list[dict]:
    """Per mode: the general kernel, the specialized one of each DiT hidden size, the quantized ones."""
    return [p for mode in MODES
            for p in [general_params({"mode": mode})] + [{"mode": mode, "H": H} for H in DIT_HIDDEN]
            + [{"mode": mode, "out": fmt} for fmt in Q.QUANT_FORMATS]]


def call_samples(rng) -> list[dict]:
    from tirx_kernels.core import model_dims

    sizes = model_dims.hidden_sizes() + list(DIT_HIDDEN) + [rng.randint(1, 64) for _ in range(3)]
    sizes += [rng.randint(1, 20000) for _ in range(6)] + [8 * rng.randint(2, 2048) for _ in range(4)]
    plain = [{"mode": mode, "B": rng.choice([1, 2, 4]), "R": rng.choice([1, 768, 1920]), "H": H}
             for mode in MODES for H in sizes]
    return plain + [{**c, "H": 32 * max(1, c["H"] // 32), "out": fmt} for c in plain for fmt in Q.QUANT_FORMATS]


def sass_expect(mode: str, H: int | None = None, schedule: str | None = None, out: str | None = None,
                **_) -> list[str]:
    if out is not None:
        return [r"LDG\.E\.U16", r"STG\.E\.U16", r"STG\.E\.U8"]
    if schedule == "general":
        return [r"LDG\.E\.U16", r"STG\.E\.U16"]
    return [r"LDG\.E\.NA\.128", r"LDG\.E\.128", r"STG\.E\.128"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx functions
# ---------------------------------------------------------------------------------------------------------

def get_kernel(mode: str, H: int | None = None, schedule: str | None = None, pdl: str | None = PDL,
               out: str | None = None):
    if mode not in MODES:
        raise ValueError(f"fused_dit_layernorm: mode {mode!r} is not one of {MODES}")
    if out is not None:
        if H is not None or schedule is not None:
            raise ValueError(f"fused_dit_layernorm: the quantized kernel takes H at run time, got H={H}, "
                             f"schedule={schedule!r}")
        return Q.build_quantized(mode, out, pdl)
    if schedule == "general":
        if H is not None:
            raise ValueError(f"fused_dit_layernorm: the general kernel takes H at run time, got H={H}")
        return build_general(mode, pdl)
    if schedule is not None:
        raise ValueError(f"fused_dit_layernorm: schedule {schedule!r} is not None or 'general'")
    if H is None or not _ln.specialized(H):
        raise ValueError(f"fused_dit_layernorm: H={H} must be a multiple of {_VEC} in [{_ln.MIN_H}, {_ln.MAX_H}]")
    return build_kernel(mode, H, pdl=pdl, **_ln.row_plan(H))



# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(mode: str, B: int, R: int, H: int, eps: float = 1e-6, residual: bool = True,  # noqa: N803
                 per_batch: bool = False, row_pad: int = 0, input_scale: float | None = None, out: str | None = None,
                 **_) -> dict:
    """WAN's layout: gate / scale / shift are views of one temb ``[B, R, 6, H]`` (row stride ``6 * H``; with
    ``per_batch`` a ``[B, 1, 6, H]`` temb broadcast over the rows); ``row_pad`` pads input and residual rows.
    ``out``: quantized norm_out (codes poisoned 0x7F7F7F7F, sf_out 0xCD; NVFP4's global scale from the oracle's
    amax, 448 * 6 / amax)."""
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
    if out is None:
        data["norm_out"] = torch.full((B, R, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        return data
    data["out"] = out
    data["norm_out"] = torch.full(Q.norm_out_shape(B, R, H, out), 0x7F7F7F7F, device="cuda", dtype=torch.int32)
    data["sf_out"] = torch.full(Q.sf_out_shape(B, R, H, out), 0xCD, device="cuda", dtype=torch.uint8)
    if out == "nvfp4":
        amax = _normalized_oracle(**data).abs().amax().clamp_min(1e-12)
        data["global_scaling_factor"] = (448.0 * 6.0 / amax).reshape(1).float()
    return data


def reference(mode, input, eps, out=None, global_scaling_factor=None, **kw) -> dict:  # noqa: A002
    """fp32 oracle: residual_out is x rounded to bf16; norm_out uses the unrounded x (quantized with ``out``:
    rounded to bf16, then ``_dit_layernorm_quant.encode``)."""
    x, y = _oracle(mode, input, eps, **kw)
    res = {"residual_out": x.to(torch.bfloat16).float(), "norm_out": y}
    if out is not None:
        res["norm_out"], res["sf_out"] = Q.encode(y, out, global_scaling_factor)
    return res


def _normalized_oracle(mode, input, eps, **kw) -> torch.Tensor:  # noqa: A002
    return _oracle(mode, input, eps, **kw)[1]


def _oracle(mode, input, eps, residual=None, gate=None, gate_bias=None, scale=None, shift=None,  # noqa: A002
            scale_bias=None, shift_bias=None, gamma=None, beta=None, input_global_scaling_factor=None,
            **_) -> tuple:
    """fp32 ``(x, norm_out)``."""
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
    return x, y


_OPTIONAL = ("gate_bias", "scale_bias", "shift_bias", "input_global_scaling_factor")


def launch(cfg: dict, data: dict) -> None:
    mode = data["mode"]
    kw = {k: data[k] for k in _OPTIONAL if data.get(k) is not None}
    outs = {"residual_out": data["residual_out"], "norm_out": data["norm_out"], "epsilon": data["eps"]}
    if data.get("out") is not None:
        outs.update(sf_out=data["sf_out"], use_nvfp4=data["out"] == "nvfp4", use_mxfp8=data["out"] == "mxfp8",
                    global_scaling_factor=data.get("global_scaling_factor"))
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
             out: str | None = None, **_) -> dict:
    """Token tensors read once (input, residual, gate / scale / shift), both outputs written once (quantized:
    codes and scales), vectors once."""
    mods = (1 if _gated(mode) else 0) + (2 if _modulated(mode) else 0)
    tokens = B * R * H
    norm_bytes = 2 * tokens if out is None else tokens // (2 if out == "nvfp4" else 1) + tokens // Q.block_of(out)
    return {"bytes": 2 * tokens * (1 + residual) + norm_bytes + 2 * (B if per_batch else B * R) * H * mods
            + 4 * 3 * H, "flops": 12 * tokens}


def _quantized_close(got, want, cfg, inputs) -> dict:
    """Codes of a quantized norm_out: within one step of the oracle's on at most 1 % (the kernel's statistics and
    bf16 rounding are not torch's, as for the bf16 output's tolerance); NVFP4 by e2m1 nibble, MXFP8 by e4m3 byte."""
    from tirx_kernels.core.harness import KernelCheckError

    if cfg.get("out") == "nvfp4":
        return _fp4_rows.codes_close(got.view(torch.uint8), want.view(torch.uint8), cfg, inputs)
    if got.shape != want.shape:
        raise KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")

    def rank(t):
        b = t.contiguous().view(torch.uint8).long()
        return torch.where(b >= 128, -(b & 127), b)

    off = (rank(got) - rank(want)).abs()
    share = float((off > 0).float().mean()) if off.numel() else 0.0
    if (off > 1).any() or share > _fp4_rows.MAX_OFF_SHARE:
        raise KernelCheckError(f"{int((off > 1).sum())} e4m3 codes more than one step off, {share:.2%} off (allowed "
                               f"{_fp4_rows.MAX_OFF_SHARE:.0%} one step)")
    return {"codes_one_step_off": share}


def _norm_out_close(got, want, cfg, inputs) -> dict:
    if cfg.get("out") is None:
        import sys

        from tirx_kernels.core import harness

        mod = sys.modules[__name__]
        return harness.compare("flashinfer_fused_dit_layernorm[norm_out]", got, want, harness.tolerance(mod, got),
                               "the oracle")
    return _quantized_close(got, want, cfg, inputs)


def _sf_out_close(got, want, cfg, inputs) -> dict:
    """The scale bytes of real rows and blocks (the padding is not written, as upstream) within one step."""
    B, R = inputs["input"].shape[:2]  # noqa: N806
    nb = inputs["input"].shape[2] // Q.block_of(cfg["out"])

    def valid(t):
        flat = t.reshape(B, -1).cpu()
        return torch.stack([quant_ref.sf_unswizzle(flat[i], R, nb, "128x4") for i in range(B)]).reshape(-1)

    return _fp4_rows.scales_close(valid(got), valid(want), cfg, inputs)


COMPARATORS = {"norm_out": _norm_out_close, "sf_out": _sf_out_close}


def get_baselines(**cfg) -> dict:
    mode = cfg.get("mode", "grgb")

    def as_returned(outs):
        return outs if cfg.get("out") else {k: v.to(torch.bfloat16) for k, v in outs.items()}

    def torch_eager():
        return lambda d: as_returned(reference(**d))

    def torch_compile():
        fn = torch.compile(lambda d: reference(**d), dynamic=False)
        return lambda d: as_returned(fn(d))

    def flashinfer():
        import flashinfer.diffusion_ops as dops

        if cfg.get("out"):  # upstream's converters print "not supported pre-Blackwell" and write nothing on sm90
            raise ImportError(f"flashinfer's {cfg['out']} DiT LayerNorm output needs SM100")

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


def _check(op: str, input, tokens: dict, vectors: dict, eps, use_nvfp4, use_mxfp8, sf, outs: dict,  # noqa: A002
           gsf=None, sf_out=None) -> str:
    """Every argument (naming the one at fault); returns the output format ("bf16", "nvfp4" or "mxfp8")."""
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
    fmt = _check_format(op, shape, use_nvfp4, use_mxfp8, gsf, outs, sf_out)
    if sf is not None:
        checks.tensor(op, "input_global_scaling_factor", sf, dtypes=(torch.float32,), shape=(1,), cuda=False)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _fail(op, "epsilon", "a float", type(eps).__name__)
    for name, t in outs.items():
        if t is not None and (fmt == "bf16" or name != "norm_out"):
            _check_tokens(op, name, t, shape)
    checks.tensor(op, "input", input, cuda=True)
    others = {k: v for k, v in {**tokens, **vectors, **outs, "input_global_scaling_factor": sf,
                                "global_scaling_factor": gsf if fmt == "nvfp4" else None, "sf_out": sf_out}.items()
              if v is not None}
    checks.same_device(op, "input", input, **others)
    return fmt


def _check_format(op: str, shape, use_nvfp4, use_mxfp8, gsf, outs: dict, sf_out) -> str:
    """Upstream's output-format arguments: at most one of use_nvfp4 / use_mxfp8, H a multiple of the scale block,
    NVFP4's global scale, and given quantized outputs of upstream's shapes and dtypes, contiguous."""
    if use_nvfp4 and use_mxfp8:
        _fail(op, "use_mxfp8", "False with use_nvfp4=True (one output format)", "True")
    fmt = "nvfp4" if use_nvfp4 else "mxfp8" if use_mxfp8 else "bf16"
    if fmt == "bf16":
        return fmt
    blk = Q.block_of(fmt)
    if shape[2] % blk:
        _fail(op, "input", f"H a multiple of {blk} for the {fmt} output", f"H={shape[2]}")
    if fmt == "nvfp4":
        if gsf is None:
            _fail(op, "global_scaling_factor", "a float32 tensor of shape (1,) (required for NVFP4 output)", "None")
        checks.tensor(op, "global_scaling_factor", gsf, dtypes=(torch.float32,), shape=(1,), cuda=False)
    if outs.get("norm_out") is not None:
        checks.tensor(op, "norm_out", outs["norm_out"], dtypes=(torch.int32,),
                      shape=Q.norm_out_shape(*shape, fmt), contiguous=True, cuda=False)
    if sf_out is not None:
        checks.tensor(op, "sf_out", sf_out, dtypes=(torch.uint8,), shape=Q.sf_out_shape(*shape, fmt),
                      contiguous=True, cuda=False)
    return fmt


def _call(mode, input, residual, gate, scale, shift, gamma, beta, *, gate_bias=None, scale_bias=None,  # noqa: A002
          shift_bias=None, epsilon=1e-6, input_global_scaling_factor=None, residual_out=None, norm_out=None,
          general=False, fmt="bf16", global_scaling_factor=None, sf_out=None):
    dev = input.device
    residual_out = torch.empty(input.shape, dtype=input.dtype, device=dev) if residual_out is None \
        else residual_out
    if fmt == "bf16":
        norm_out = torch.empty(input.shape, dtype=input.dtype, device=dev) if norm_out is None else norm_out
        sf_out = torch.empty(0, dtype=torch.uint8, device=dev)  # the one signature: unused
    else:
        if norm_out is None:
            norm_out = torch.empty(Q.norm_out_shape(*input.shape, fmt), dtype=torch.int32, device=dev)
        if sf_out is None:  # upstream's ops return (residual_out, norm_out): the scales only reach a given sf_out
            sf_out = torch.empty(Q.sf_out_shape(*input.shape, fmt), dtype=torch.uint8, device=dev)
    gsf = global_scaling_factor if fmt == "nvfp4" else _fp4_rows.unit_scale(dev)
    args = (input, residual, gate, scale, shift, gate_bias, scale_bias, shift_bias, gamma, beta,
            input_global_scaling_factor, residual_out, norm_out, sf_out, gsf, float(epsilon), mode, general, fmt)
    if runtime.direct_call(*[a for a in args if isinstance(a, torch.Tensor)]):
        _run(*args)  # eager: the kernel straight away (a custom op's dispatch costs more host time than this runs)
        runtime.mark_written(residual_out)
        runtime.mark_written(norm_out)
        runtime.mark_written(sf_out)
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
    fmt = _check(op, input, {"residual": residual, "gate": gate},
                 {"gamma": gamma, "beta": beta, "gate_bias": gate_bias}, epsilon, use_nvfp4, use_mxfp8,
                 input_global_scaling_factor, {"residual_out": residual_out, "norm_out": norm_out},
                 global_scaling_factor, sf_out)
    for name, t in (("residual", residual), ("gate", gate), ("gamma", gamma), ("beta", beta)):
        if t is None:
            _fail(op, name, "a tensor", "None")
    return _call("grgb", input, residual, gate, None, None, gamma, beta, gate_bias=gate_bias, epsilon=epsilon,
                 input_global_scaling_factor=input_global_scaling_factor, residual_out=residual_out,
                 norm_out=norm_out, fmt=fmt,
                 global_scaling_factor=global_scaling_factor, sf_out=sf_out)


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
    fmt = _check(op, input, {"residual": residual, "gate": gate, "scale": scale, "shift": shift},
           {"gate_bias": gate_bias, "scale_bias": scale_bias, "shift_bias": shift_bias}, epsilon, use_nvfp4,
           use_mxfp8, input_global_scaling_factor, {"residual_out": residual_out, "norm_out": norm_out},
           global_scaling_factor, sf_out)
    for name, t in (("residual", residual), ("gate", gate), ("scale", scale), ("shift", shift)):
        if t is None:
            _fail(op, name, "a tensor", "None")
    return _call("grss", input, residual, gate, scale, shift, None, None, gate_bias=gate_bias, scale_bias=scale_bias,
                 shift_bias=shift_bias, epsilon=epsilon, input_global_scaling_factor=input_global_scaling_factor,
                 residual_out=residual_out, norm_out=norm_out, fmt=fmt,
                 global_scaling_factor=global_scaling_factor, sf_out=sf_out)


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
    fmt = _check(op, input, {"residual": residual, "scale": scale, "shift": shift},
           {"scale_bias": scale_bias, "shift_bias": shift_bias}, epsilon, use_nvfp4, use_mxfp8,
           input_global_scaling_factor, {"residual_out": residual_out, "norm_out": norm_out},
           global_scaling_factor, sf_out)
    for name, t in (("scale", scale), ("shift", shift)):
        if t is None:
            _fail(op, name, "a tensor", "None")
    return _call("rss", input, residual, None, scale, shift, None, None, scale_bias=scale_bias, shift_bias=shift_bias,
                 epsilon=epsilon, input_global_scaling_factor=input_global_scaling_factor, residual_out=residual_out,
                 norm_out=norm_out, fmt=fmt,
                 global_scaling_factor=global_scaling_factor, sf_out=sf_out)


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
         input_global_scaling_factor, residual_out, norm_out, sf_out, global_scaling_factor, epsilon: float, mode: str,
         general: bool, fmt: str = "bf16") -> None:
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
    ro = _unit_last(residual_out)
    if fmt != "bf16":  # the quantized kernel: H, strides and alignment at run time
        fn = _FUNCTIONS.get((mode, fmt, input.get_device()), lambda: {"mode": mode, "out": fmt}, dev)
        fn(x, *tokens, *vectors, isf, ro, norm_out.view(-1).view(torch.uint32), sf_out.view(-1),
           global_scaling_factor, epsilon, int(residual is not None))
        return
    no = _unit_last(norm_out)
    general = general or uses_general(H, [x, *tokens, ro, no], vectors)
    fn = _FUNCTIONS.get((mode, H, general, input.get_device()),
                        lambda: general_params({"mode": mode}) if general else compile_params(mode=mode, H=H), dev)
    fn(x, *tokens, *vectors, isf, ro, no, epsilon, int(residual is not None), 0)  # zero: see vector.after_all


from tirx_kernels.core import runtime  # noqa: E402

_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::flashinfer_fused_dit_layernorm", mutates_args=("residual_out", "norm_out",
                                                                                "sf_out"))
def _fused_dit_layernorm_op(input: torch.Tensor, residual: torch.Tensor | None, gate: torch.Tensor | None,  # noqa: A002
                            scale: torch.Tensor | None, shift: torch.Tensor | None, gate_bias: torch.Tensor | None,
                            scale_bias: torch.Tensor | None, shift_bias: torch.Tensor | None,
                            gamma: torch.Tensor | None, beta: torch.Tensor | None,
                            input_global_scaling_factor: torch.Tensor | None, residual_out: torch.Tensor,
                            norm_out: torch.Tensor, sf_out: torch.Tensor, global_scaling_factor: torch.Tensor,
                            epsilon: float, norm_mode: str, general: bool, norm_format: str) -> None:
    # ``norm_mode``, not ``mode``: torch.compile's auto_functionalized_v2 takes a ``mode`` argument of its own and a
    # custom-op argument of that name made every compiled call raise (H100 run, 2026-12-05).
    _run(input, residual, gate, scale, shift, gate_bias, scale_bias, shift_bias, gamma, beta,
         input_global_scaling_factor, residual_out, norm_out, sf_out, global_scaling_factor, epsilon, norm_mode,
         general, norm_format)


@_fused_dit_layernorm_op.register_fake
def _(*args):
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
