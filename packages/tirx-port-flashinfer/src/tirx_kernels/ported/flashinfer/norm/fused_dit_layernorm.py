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
MAX_GENERAL_H = 2**30
MAX_TOKENS = 2**31 - 1 - 1024  # batch * rows in int32 (token = cta * rows_per_cta + group, below 2**31)
MAX_STRIDE = 2**31 - 1
WAN_HIDDEN = 3072  # the hidden size upstream supports (WAN 2.2 5B)
# DiT hidden sizes a bundle specializes: WAN 2.1 1.3B / SD3 1536, WAN 2.2 5B / Flux 3072, WAN 2.1 14B 5120 (the LLM
# catalog's sizes are not DiT widths; any other H runs the general kernel).
DIT_HIDDEN = (1536, WAN_HIDDEN, 5120)


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
