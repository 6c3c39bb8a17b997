# SPDX-License-Identifier: Apache-2.0
# Port of flash-attention's Hopper FP8 attention forward (FlashAttention-3, arXiv 2407.08608 sec. 3.3; the hopper/
# sources of https://github.com/Dao-AILab/flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced and its
# flash_attn_func FP8 API): read, not copied. The seed's block-scaled formats (hao-ai-lab/flash-attention-fp4
# @5aa37a96, an sm_103a FP4-MMA kernel) arrive here as NVFP4 / MXFP8 K/V inputs, dequantized to FP8 (Hopper has no
# FP4 MMA). The kernel is the TIRx generator in _fwd_fp8.py, the K/V preparation in _fwd_fp8_prepass.py.
"""``flash_attn_fp8_func``: attention forward for Hopper with Q, K, V in FP8 e4m3 (FA3's FP8 path), or K/V in NVFP4 /
MXFP8 (``kv_format``), head dims 64, 128 and 256, causal (bottom-right aligned when Sq != Sk) or not, MHA/GQA/MQA,
batch-padded [B, S, H, D]; returns (out bf16 [B, Sq, Hq, D], lse fp32 [B, Hq, Sq], natural log; -inf and a zero
output for a row that sees no key).

The attention kernel is the bf16 kernel's mainloop (``_fwd_mainloop``: TMA producer, two consumer warpgroups in
ping-pong with the softmax of tile n under PV of tile n - 1) with k32 FP8 wgmma for both GEMMs and P quantized to e4m3
in registers; V reaches it transposed (8-bit wgmma takes K-major operands only) by a TIRx pre-pass kernel that reads
and writes V once (``_fwd_fp8_transpose``), and NVFP4 / MXFP8 K/V are decoded and requantized to e4m3 with a
per-(batch, kv head) descale by another one-pass kernel before it (``_fwd_fp8_requant``; ``_fwd_fp8_prepass`` is the
torch specification of both, and the path under torch.compile). Byte model at b2 h16 s8192 hd128: the transpose moves
67 MB (~22 us at 3 TB/s), the NVFP4 requantization of K and V 105 MB (~35 us), against ~1.1 ms of attention at
1000 TFLOP/s: 2 % / 5 %."""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, harness, quant_ref, runtime
from tirx_kernels.ported.flashattention import _fwd_fp8, _fwd_fp8_check, _fwd_fp8_requant, _fwd_fp8_transpose
from tirx_kernels.ported.flashattention import _fwd_fp8_prepass as prepass
from tirx_kernels.ported.flashattention.flash_attention4 import _tma_ready, check_lse_base, check_scale

KERNEL_META = {
    "name": "flash_attention4_fp4",
    "category": "ported.flashattention",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "FP8 attention forward (FA3's FP8 path: e4m3 QK^T and PV wgmma, P in registers), NVFP4/MXFP8 "
                   "K/V dequantized to FP8, causal, GQA, returns LSE",
    "upstream": {
        "project": "flash-attention",
        "url": "https://github.com/Dao-AILab/flash-attention",
        "commit": "0251105a2fb19d2957484b7f023cd8c115286ced",
    },
    "public_ops": ["flash_attn_fp8_func"],
}

# Correctness rows (GPU tests): ragged lengths (1, 17, 127, 8193), GQA 1..16, Sq != Sk both ways, every head dim,
# every K/V format.
CONFIGS = [
    {"label": "e4m3_b2_h4_s1000_d128", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128},
    {"label": "e4m3_b2_h4_s1000_d128_causal", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128,
     "causal": True},
    {"label": "e4m3_b1_h8kv2_sq300_sk700_d128_causal", "B": 1, "Sq": 300, "Sk": 700, "Hq": 8, "Hkv": 2, "D": 128,
     "causal": True},
    {"label": "e4m3_b1_h2_sq400_sk200_d128_causal", "B": 1, "Sq": 400, "Sk": 200, "Hq": 2, "Hkv": 2, "D": 128,
     "causal": True},
    {"label": "e4m3_b3_h4kv2_sq1_sk513_d128", "B": 3, "Sq": 1, "Sk": 513, "Hq": 4, "Hkv": 2, "D": 128},
    {"label": "e4m3_b2_h16kv1_sq17_sk127_d128", "B": 2, "Sq": 17, "Sk": 127, "Hq": 16, "Hkv": 1, "D": 128},
    {"label": "e4m3_b1_h4_s8193_d128_causal", "B": 1, "Sq": 8193, "Sk": 8193, "Hq": 4, "Hkv": 4, "D": 128,
     "causal": True},
    {"label": "e4m3_b2_h4kv2_s1000_d64", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 2, "D": 64},
    {"label": "mxfp8_b1_h4_sq127_sk333_d64_causal", "B": 1, "Sq": 127, "Sk": 333, "Hq": 4, "Hkv": 4, "D": 64,
     "causal": True, "kv_format": "mxfp8"},
    {"label": "e4m3_b2_h4_s333_d256", "B": 2, "Sq": 333, "Sk": 333, "Hq": 4, "Hkv": 4, "D": 256},
    {"label": "e4m3_b1_h4kv1_s1000_d256_causal", "B": 1, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 1, "D": 256,
     "causal": True},
    {"label": "e4m3_b2_h2_sq127_sk17_d256_causal", "B": 2, "Sq": 127, "Sk": 17, "Hq": 2, "Hkv": 2, "D": 256,
     "causal": True},
    {"label": "nvfp4_b2_h4kv2_s1000_d128_causal", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 2, "D": 128,
     "causal": True, "kv_format": "nvfp4"},
    {"label": "nvfp4_b1_h4_sq127_sk8193_d256", "B": 1, "Sq": 127, "Sk": 8193, "Hq": 4, "Hkv": 4, "D": 256,
     "kv_format": "nvfp4"},
    {"label": "mxfp8_b2_h4_s1000_d128", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128,
     "kv_format": "mxfp8"},
    {"label": "mxfp8_b1_h8kv1_s333_d256_causal", "B": 1, "Sq": 333, "Sk": 333, "Hq": 8, "Hkv": 1, "D": 256,
     "causal": True, "kv_format": "mxfp8"},
]

# The anchor shape (ANCHORS.md: FA3 paper FP8 1008 TFLOP/s at hd128, 1171 at hd256 on the H100): b2 h16 s8192; the
# NVFP4 / MXFP8 rows minus the e4m3 row of the same shape are what their pre-pass costs.
BENCH_CONFIGS = [
    {"label": "e4m3_b2_h16_s8192_d128", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128},
    {"label": "e4m3_b2_h16_s8192_d128_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128,
     "causal": True},
    {"label": "e4m3_b2_h16_s8192_d64", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 64},
    {"label": "e4m3_b2_h16_s8192_d256", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 256},
    {"label": "e4m3_b2_h16_s8192_d256_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 256,
     "causal": True},
    # hd256's other spill-free variants beside 128 keys + overlap at 240 registers: 128 keys + pingpong and 64-key
    # tiles (4 stages) + overlap, both at 232.
    {"label": "e4m3_b2_h16_s8192_d256_pingpong", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 256,
     "schedule": "pingpong", "consumer_regs": 232},
    {"label": "e4m3_b2_h16_s8192_d256_bn64_overlap", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 256,
     "block_n": 64, "schedule": "overlap", "consumer_regs": 232},
    {"label": "e4m3_b2_h16_s8192_d128_pingpong", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128,
     "schedule": "pingpong"},
    {"label": "nvfp4_b2_h16_s8192_d128", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128,
     "kv_format": "nvfp4"},
    {"label": "mxfp8_b2_h16_s8192_d128", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128,
     "kv_format": "mxfp8"},
]

DEFAULTS = {"causal": False, "kv_format": "e4m3", "schedule": None, "block_n": None, "consumer_regs": None}
COMPARATORS = _fwd_fp8_check.COMPARATORS

# head_dim -> (block_n, stages, schedule, consumer registers): FA3's FP8 tile for hd256 is 128 x 128; V^T rows are
# one key tile of block_n bytes (a swizzle span), so block_n is 64 or 128 here (FA3 takes 224 keys at hd128 with an
# in-kernel transpose). hd256 x 128 keys under "overlap" (P of tile n - 1, S of tile n and O live together: 208
# fragment registers) spilled 48 bytes with 232 consumer registers and none with FA3's 240 (producer 24; ptxas,
# 2026-12-06); "pingpong" at 232 and 64-key tiles are bench rows beside it.
TILES = {64: (128, 2, "overlap", 232), 128: (128, 2, "overlap", 232), 256: (128, 2, "overlap", 240)}
SCHEDULE = "overlap"  # the mainloop's default; TILES names each head dim's
_INT32_MAX = 2**31 - 1
_OP = "flash_attn_fp8_func"
E4M3 = torch.float8_e4m3fn


def compile_params(**cfg) -> dict:
    """What changes the code: head dim, causal, the tile and schedule (TILES unless a row names others). B, S, H,
    strides and the scales are run-time arguments."""
    d = int(cfg["D"])
    block_n, _, schedule, regs = TILES.get(d, (None, None, SCHEDULE, 232))
    return {"head_dim": d, "causal": bool(cfg.get("causal")), "schedule": cfg.get("schedule") or schedule,
            "block_n": int(cfg.get("block_n") or block_n or 0), "consumer_regs": int(cfg.get("consumer_regs") or regs)}


def get_kernel(head_dim: int, causal: bool = False, schedule: str = SCHEDULE, block_n: int | None = None,
               consumer_regs: int = 232, kind: str = "attention"):
    """``kind``: "attention", "transpose_v" (the V pre-pass kernel of ``_fwd_fp8_transpose``) or "requant_nvfp4" /
    "requant_mxfp8" (``_fwd_fp8_requant``)."""
    if head_dim not in TILES:
        raise ValueError(f"flash_attention4_fp4: head_dim {head_dim} not one of {sorted(TILES)}")
    if kind == "transpose_v":
        return _fwd_fp8_transpose.build_transpose_v_kernel(head_dim)
    if kind.startswith("requant_"):
        return _fwd_fp8_requant.build_requant_kernel(kind.removeprefix("requant_"), head_dim)
    tile_n, stages, _, _ = TILES[head_dim]
    block_n = block_n or tile_n
    if block_n != tile_n:  # a narrower key tile (a bench row): twice the stages in the same smem
        stages = stages * tile_n // block_n
    return _fwd_fp8.build_fp8_fwd_kernel(head_dim, causal, block_n, stages, schedule, consumer_regs)


def artifact_params() -> list[dict]:
    return [compile_params(D=d, causal=c) for d in TILES for c in (False, True)] + \
        [transpose_params(d) for d in TILES] + [requant_params(f, d) for f in _fwd_fp8_requant.FORMATS for d in TILES]


def transpose_params(d: int) -> dict:
    """The V pre-pass kernel's artifact params."""
    return {"head_dim": d, "kind": "transpose_v"}


def requant_params(kv_format: str, d: int) -> dict:
    """The NVFP4 / MXFP8 -> e4m3 kernel's artifact params."""
    return {"head_dim": d, "kind": f"requant_{kv_format}"}


def call_samples(rng) -> list[dict]:
    """Every head dim, mask and K/V format, with random batch, lengths and GQA ratios."""
    out = []
    for d in list(TILES) * 2:
        for c in (False, True):
            for fmt in prepass.KV_FORMATS:
                hkv = rng.choice([1, 2, 8])
                out.append({"B": rng.randint(1, 4), "Sq": rng.choice([1, 17, 127, 8193]),
                            "Sk": rng.choice([1, 17, 127, 8193]), "Hq": hkv * rng.choice([1, 2, 16]), "Hkv": hkv,
                            "D": d, "causal": c, "kv_format": fmt})
    return out


def sass_expect(head_dim: int, block_n: int = 0, kind: str = "attention", **_) -> list[str]:
    """Both GEMMs are FP8 wgmma (QGMMA) k32: QK^T from two smem descriptors, PV with P from registers and V^T from
    smem (no transpose bit: 8-bit operands are K-major); 4-D TMA loads; the setmaxnreg register split. The V
    transpose: byte permutes and 16-byte stores."""
    if kind == "transpose_v":
        return [r"PRMT", r"STG\.E\.128"]
    if kind.startswith("requant_"):
        return [r"F2FP\.SATFINITE\.E4M3", r"STG\.E\.128"]
    n = block_n
    return [rf"QGMMA\.64x{n}x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[UR\d+\]", rf"QGMMA\.64x{head_dim}x32\.F32\.E4M3\.E4M3 "
            rf"R\d+, R\d+, gdesc\[UR\d+\]", r"UTMALDG\.4D", r"USETMAXREG"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def _realistic(*shape, device):
    """Gaussian values with a per-head scale spread over 1/4 .. 4 and a few outlier channels (x 8), the shape FP8
    attention meets in practice (FA3 sec. 4.3 tests with outliers too)."""
    x = torch.randn(*shape, device=device)
    x = x * torch.exp2(torch.empty(shape[0], 1, shape[2], 1, device=device).uniform_(-2, 2))
    x[..., :: max(shape[-1] // 4, 1)] *= 8.0
    return x


def encode_kv(x: torch.Tensor, kv_format: str) -> dict:
    """fp32 K or V [B, S, Hkv, D] -> the op's inputs for ``kv_format`` (keys: data, scale, global_scale, descale)."""
    B, S, H, D = x.shape
    if kv_format == "e4m3":
        data, descale = prepass.quantize_per_head(x)
        return {"data": data, "scale": None, "global_scale": None, "descale": descale}
    rows = x.reshape(-1, D)
    if kv_format == "nvfp4":
        gs = (448.0 * 6.0 / rows.abs().amax()).float()
        packed, sf = quant_ref.nvfp4_quantize(rows, gs, layout="linear")
        return {"data": packed.view(B, S, H, D // 2), "scale": sf.view(B, S, H, D // 16).view(E4M3),
                "global_scale": gs, "descale": None}
    codes, sf = quant_ref.mxfp8_quantize(rows, layout="linear")
    return {"data": codes.view(B, S, H, D).view(E4M3), "scale": sf.view(B, S, H, D // 32), "global_scale": None,
            "descale": None}


def prepare_data(B: int, Sq: int, Sk: int, Hq: int, Hkv: int, D: int, causal: bool = False,  # noqa: N803
                 kv_format: str = "e4m3", schedule: str | None = None, block_n: int | None = None,
                 consumer_regs: int | None = None, device: str = "cuda") -> dict:
    """Fresh random e4m3 Q (descale per (batch, kv head)) and K/V in ``kv_format``; poisoned out / lse (``schedule``
    ``block_n`` and ``consumer_regs``, a kernel variant, are read by ``launch`` from the config)."""
    q32 = _realistic(B, Sq, Hkv, (Hq // Hkv) * D, device=device)
    q, q_descale = prepass.quantize_per_head(q32)
    k, v = encode_kv(_realistic(B, Sk, Hkv, D, device=device), kv_format), \
        encode_kv(_realistic(B, Sk, Hkv, D, device=device), kv_format)
    return {"q": q.view(B, Sq, Hq, D), "k": k["data"], "v": v["data"], "q_descale": q_descale,
            "k_descale": k["descale"], "v_descale": v["descale"], "k_scale": k["scale"], "v_scale": v["scale"],
            "k_global_scale": k["global_scale"], "v_global_scale": v["global_scale"], "kv_format": kv_format,
            "softmax_scale": 1.0 / math.sqrt(D), "causal": causal,
            "out": torch.full((B, Sq, Hq, D), float("nan"), dtype=torch.bfloat16, device=device),
            "lse": torch.full((B, Hq, Sq), float("nan"), dtype=torch.float32, device=device)}


def kernel_inputs(q, k, v, q_descale=None, k_descale=None, v_descale=None, kv_format="e4m3", k_scale=None,
                  v_scale=None, k_global_scale=None, v_global_scale=None, with_vt: bool = True, **_) -> dict:
    """What the attention kernel reads: e4m3 q, k, v, the three fp32 [B, Hkv] descales and (``with_vt``, torch's
    ``transpose_v``) V^T; the op transposes with its TIRx kernel instead (``_transpose_v``)."""
    B, Hkv = q.shape[0], k.shape[2]
    ones = torch.ones((B, Hkv), dtype=torch.float32, device=q.device)
    ke, kd = prepass.dequantize_kv(k, kv_format, k_scale, k_global_scale)
    ve, vd = prepass.dequantize_kv(v, kv_format, v_scale, v_global_scale)

    def descale(user, derived):
        d = ones if user is None else user.float().expand(B, Hkv)
        return (d if derived is None else d * derived).contiguous()

    return {"q": q, "k": ke, "v": ve, "vt": prepass.transpose_v(ve) if with_vt else None,
            "q_descale": descale(q_descale, None), "k_descale": descale(k_descale, kd),
            "v_descale": descale(v_descale, vd)}


def reference(softmax_scale, causal, **data) -> dict:
    """The fp32 oracle on what the kernel computes with: the e4m3 Q/K/V (after the pre-pass) times their descales."""
    out, lse = _fwd_fp8_check.oracle(kernel_inputs(**data), softmax_scale, causal)
    return {"out": out, "lse": lse}


def launch(cfg: dict, data: dict) -> None:
    """The public op (a row naming another schedule or key tile runs that kernel variant behind the same checks)."""
    keys = ("q_descale", "k_descale", "v_descale", "kv_format", "k_scale", "v_scale", "k_global_scale",
            "v_global_scale")
    flash_attn_fp8_func(data["q"], data["k"], data["v"], causal=data["causal"], softmax_scale=data["softmax_scale"],
                        out=(data["out"], data["lse"]), variant=(cfg.get("schedule"), cfg.get("block_n"),
                                                                      cfg.get("consumer_regs")),
                        **{n: data[n] for n in keys})


def roofline(B: int, Sq: int, Sk: int, Hq: int, Hkv: int, D: int, causal: bool = False, kv_format: str = "e4m3",
             **_) -> dict:
    """FLOPs 4 B Hq D x the visible (query, key) pairs (the anchors' convention); bytes: q, k, v read once at their
    format's size, out (bf16) and lse written once."""
    if causal:
        pairs = sum(max(0, min(Sk, i + 1 + Sk - Sq)) for i in range(Sq)) if Sq < 65536 else Sq * Sk // 2
    else:
        pairs = Sq * Sk
    kv_elem = {"e4m3": 1.0, "nvfp4": 0.5 + 1 / 16, "mxfp8": 1.0 + 1 / 32}[kv_format]
    nbytes = B * Sq * Hq * D + int(kv_elem * 2 * B * Sk * Hkv * D) + 2 * B * Sq * Hq * D + 4 * B * Hq * Sq
    return {"bytes": nbytes, "flops": 4 * B * Hq * D * pairs}


def get_baselines(**cfg) -> dict:
    """Speed references: torch SDPA (cuDNN / flash backends) in bf16 on the dequantized inputs (no FP8 attention
    runs on Hopper in torch; FA3's FP8 has no wheel for this Python: ANCHORS.md)."""
    Sq, Sk, causal = int(cfg.get("Sq", 1)), int(cfg.get("Sk", 1)), bool(cfg.get("causal"))

    def sdpa(backend_name: str | None):
        def build():
            import torch.nn.functional as F  # noqa: N812
            from torch.nn.attention import SDPBackend, sdpa_kernel

            if causal and Sq != Sk:
                raise ImportError("SDPA's is_causal is top-left aligned; flash-attn's causal is bottom-right when "
                                  "Sq != Sk")
            backend = None if backend_name is None else getattr(SDPBackend, backend_name)
            cache = {}

            def fn(data):
                if "qkv" not in cache:  # the bf16 inputs are the reference's own data, made once outside the timing
                    inp = kernel_inputs(**data)
                    B, Sq_, Hq, D = inp["q"].shape
                    Hkv = inp["k"].shape[2]
                    qf = (inp["q"].float().view(B, Sq_, Hkv, -1) * inp["q_descale"][:, None, :, None]).view(
                        B, Sq_, Hq, D)
                    kf = inp["k"].float() * inp["k_descale"][:, None, :, None]
                    vf = inp["v"].float() * inp["v_descale"][:, None, :, None]
                    cache["qkv"] = [t.to(torch.bfloat16).transpose(1, 2) for t in (qf, kf, vf)]
                q, k, v = cache["qkv"]
                gqa = q.shape[1] != k.shape[1]
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=data["softmax_scale"],
                                                       enable_gqa=gqa)
                return {"out": o.transpose(1, 2)}
            return fn
        return build

    return {"sdpa_flash": sdpa("FLASH_ATTENTION"), "sdpa_cudnn": sdpa("CUDNN_ATTENTION")}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def _check_inputs(q, k, v, q_descale, k_descale, v_descale, softmax_scale, kv_format, k_scale, v_scale,
                  k_global_scale, v_global_scale, out) -> None:
    """Shapes, dtypes, formats; the device last (a CPU machine exercises the rest)."""
    checks.tensor(_OP, "q", q, dtypes=(E4M3,), ndim=4, cuda=False)
    B, Sq, Hq, D = q.shape
    if D not in TILES:
        _fail("q", f"a head dim in {sorted(TILES)}", f"{D}")
    if kv_format not in prepass.KV_FORMATS:
        _fail("kv_format", f"one of {prepass.KV_FORMATS}", repr(kv_format))
    kv_dtype, kv_d = {"e4m3": (E4M3, D), "nvfp4": (torch.uint8, D // 2), "mxfp8": (E4M3, D)}[kv_format]
    checks.tensor(_OP, "k", k, dtypes=(kv_dtype,), ndim=4, cuda=False)
    Sk, Hkv = k.shape[1], k.shape[2]
    checks.tensor(_OP, "k", k, shape=(B, None, None, kv_d), cuda=False)
    checks.tensor(_OP, "v", v, dtypes=(kv_dtype,), shape=(B, Sk, Hkv, kv_d), cuda=False)
    if Hkv == 0 or Hq % Hkv:
        _fail("k", f"a number of heads dividing q's {Hq} (GQA/MQA)", f"{Hkv}")
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is not None:
            checks.tensor(_OP, name, t, dtypes=(torch.float32,), shape=(B, Hkv), cuda=False)
    if kv_format == "e4m3":
        for name, t in (("k_scale", k_scale), ("v_scale", v_scale), ("k_global_scale", k_global_scale),
                        ("v_global_scale", v_global_scale)):
            if t is not None:
                _fail(name, "None for kv_format='e4m3' (its scale is k_descale / v_descale)", type(t).__name__)
    else:
        block, sf_dtypes = {"nvfp4": (16, (E4M3, torch.uint8)), "mxfp8": (32, (torch.uint8,))}[kv_format]
        for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
            checks.tensor(_OP, name, t, dtypes=sf_dtypes, shape=(B, Sk, Hkv, D // block), cuda=False)
        if kv_format == "nvfp4":
            for name, t in (("k_global_scale", k_global_scale), ("v_global_scale", v_global_scale)):
                if t is None or (isinstance(t, torch.Tensor) and t.numel() != 1):
                    _fail(name, "a float or a one-element tensor (NVFP4 value = e2m1 * scale / global_scale)",
                          repr(t) if t is None else f"shape {tuple(t.shape)}")
    check_scale(_OP, softmax_scale)
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("out", "a tuple (out, lse)", type(out).__name__)
        checks.tensor(_OP, "out[0]", out[0], dtypes=(torch.bfloat16,), shape=(B, Sq, Hq, D), contiguous=True,
                      cuda=False)
        checks.tensor(_OP, "out[1]", out[1], dtypes=(torch.float32,), shape=(B, Hq, Sq), contiguous=True, cuda=False)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if any(s > _INT32_MAX for s in t.stride()):
            _fail(name, "strides below 2**31 elements", f"strides {tuple(t.stride())}")
    if Hq > 65535:
        _fail("q", "at most 65535 heads (the grid's y extent)", f"{Hq}")
    if B > 65535:
        _fail("q", "a batch of at most 65535 (the grid's z extent)", f"{B}")
    if B * Sq * Hq * D > _INT32_MAX or B * Hkv * D * (Sk + 15) > _INT32_MAX:
        _fail("q", "an output and a V^T below 2**31 elements", f"shape {tuple(q.shape)}, k {tuple(k.shape)}")
    checks.tensor(_OP, "q", q, cuda=True)
    checks.same_device(_OP, "q", q, k=k, v=v, **({} if out is None else {"out[0]": out[0], "out[1]": out[1]}))


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(inp: dict, softmax_scale: float, causal: bool, out, lse, variant=(None, None, None)) -> None:
    q, k = inp["q"], inp["k"]
    B, Sq, Hq, D = q.shape
    if B == 0 or Sq == 0 or Hq == 0:
        return
    if k.shape[1] == 0:  # no key: flash-attn's empty-row convention, no launch (a TMA map cannot have extent 0)
        out.zero_()
        lse.fill_(float("-inf"))
        return
    checks.aligned(_OP, "out[0]", out, 16)
    check_lse_base(_OP, lse)
    fn = _FUNCTIONS.get((D, causal, variant, q.get_device()),
                        lambda: compile_params(D=D, causal=causal, schedule=variant[0], block_n=variant[1],
                                               consumer_regs=variant[2]), q.device)
    vt = inp["vt"] if inp.get("vt") is not None else _transpose_v(inp["v"])
    fn(_tma_ready(q.view(torch.uint8)), _tma_ready(k.view(torch.uint8)), vt.view(torch.uint8),
       inp["q_descale"], inp["k_descale"], inp["v_descale"], out, lse, float(softmax_scale))


def _transpose_v(v: torch.Tensor) -> torch.Tensor:
    """V^T by the TIRx pre-pass kernel (``_fwd_fp8_transpose``; same bytes as ``prepass.transpose_v``)."""
    B, Sk, H, D = v.shape
    src = v.view(torch.uint8)
    if src.data_ptr() % 16 or any(src.stride(i) % 4 for i in range(3)):
        src = src.contiguous()
    vt = torch.empty((B, H, D, (Sk + prepass.KEY_GROUP - 1) // prepass.KEY_GROUP * prepass.KEY_GROUP),
                     dtype=torch.uint8, device=v.device)
    _FUNCTIONS.get(("transpose_v", D, v.get_device()), lambda: transpose_params(D), v.device)(src, vt)
    return vt


def _requantize_kv(x: torch.Tensor, kv_format: str, scale: torch.Tensor, global_scale) -> tuple:
    """NVFP4 / MXFP8 K or V -> (e4m3, descale [B, Hkv]) by the TIRx kernel (the bytes of ``prepass.dequantize_kv``)."""
    B, S, H, _ = x.shape
    D = x.shape[3] * (2 if kv_format == "nvfp4" else 1)
    mult, descale = prepass.head_factors(kv_format, scale, global_scale)
    src = x.view(torch.uint8).contiguous()
    if src.data_ptr() % 16:
        src = src.clone()
    out = torch.empty((B, S, H, D), dtype=torch.uint8, device=x.device)
    fn = _FUNCTIONS.get((f"requant_{kv_format}", D, x.get_device()), lambda: requant_params(kv_format, D), x.device)
    fn(src, scale.view(torch.uint8).contiguous().view(-1), mult.view(-1), out)
    return out.view(E4M3), descale


def flash_attn_fp8_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor | None = None,
                        k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
                        causal: bool = False, softmax_scale: float | None = None, kv_format: str = "e4m3",
                        k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                        k_global_scale=None, v_global_scale=None,
                        out: tuple[torch.Tensor, torch.Tensor] | None = None,
                        variant: tuple = (None, None, None)) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 attention forward with flash-attn's FP8 conventions (FA3's ``flash_attn_func`` with e4m3 inputs).

    - q: float8_e4m3fn [B, Sq, Hq, D], D in (64, 128, 256); ``q_descale``, ``k_descale``, ``v_descale``: fp32 [B, Hkv]
      (None: 1): the true Q of head h is ``q[:, :, h] * q_descale[:, h // (Hq // Hkv)]``, likewise K and V.
    - ``kv_format="e4m3"``: k, v float8_e4m3fn [B, Sk, Hkv, D].
    - ``kv_format="nvfp4"``: k, v uint8 [B, Sk, Hkv, D / 2] packed e2m1 (element 2i in the low nibble), ``k_scale`` /
      ``v_scale`` e4m3 [B, Sk, Hkv, D / 16] (float8_e4m3fn or its bytes), ``k_global_scale`` / ``v_global_scale`` a
      float or one-element tensor: value = e2m1 * scale / global_scale (FlashInfer's NVFP4 convention).
    - ``kv_format="mxfp8"``: k, v float8_e4m3fn [B, Sk, Hkv, D], ``k_scale`` / ``v_scale`` uint8 ue8m0 [B, Sk, Hkv,
      D / 32]: value = e4m3 * 2 ** (code - 127).
      NVFP4 / MXFP8 K/V are decoded and requantized to e4m3 with a per-(batch, kv head) descale (amax / 448) before
      the kernel, times ``k_descale`` / ``v_descale`` when given.
    ``softmax_scale`` defaults to 1/sqrt(D); ``causal`` masks bottom-right aligned (key j visible to query i iff
    j <= i + Sk - Sq). Returns (out bf16 [B, Sq, Hq, D], lse fp32 [B, Hq, Sq], natural log of the descaled scores),
    written into ``out`` = (out, lse) when given (contiguous). ``variant`` = (schedule, block_n, consumer_regs)
    picks a kernel variant other than ``TILES``' (measurements)."""
    _check_inputs(q, k, v, q_descale, k_descale, v_descale, softmax_scale, kv_format, k_scale, v_scale,
                  k_global_scale, v_global_scale, out)
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
    direct = runtime.direct_call(q, k, v, *(out or ()))
    if k.shape[1] == 0 and kv_format != "e4m3":  # no key, no scale to take a head's maximum of: pass bytes through
        kv_format, k, v = "e4m3", k.new_empty((*k.shape[:3], q.shape[3]), dtype=E4M3), \
            v.new_empty((*v.shape[:3], q.shape[3]), dtype=E4M3)
        k_scale = v_scale = k_global_scale = v_global_scale = None
    if direct and kv_format != "e4m3":  # the TIRx requantization (torch's under torch.compile)
        ke, kd = _requantize_kv(k, kv_format, k_scale, k_global_scale)
        ve, vd = _requantize_kv(v, kv_format, v_scale, v_global_scale)
        inp = kernel_inputs(q, ke, ve, q_descale, k_descale if kd is None else _times(k_descale, kd),
                            v_descale if vd is None else _times(v_descale, vd), with_vt=False)
    else:
        inp = kernel_inputs(q, k, v, q_descale, k_descale, v_descale, kv_format, k_scale, v_scale, k_global_scale,
                            v_global_scale, with_vt=False)
    causal, variant = bool(causal), tuple(variant)
    args = [inp[n] for n in ("q", "k", "v", "q_descale", "k_descale", "v_descale")]
    if direct:
        dst = out if out is not None else _new_out(q)
        _run(inp, scale, causal, dst[0], dst[1], variant)
        if out is not None:
            runtime.mark_written(out[0])
            runtime.mark_written(out[1])
        return tuple(dst)
    # torch.compile / export: the pre-pass above is traced as torch ops; the kernel is the custom op.
    if out is None:
        return tuple(torch.ops.tirx.flash_attention4_fp4(*args, scale, causal))
    torch.ops.tirx.flash_attention4_fp4_out(*args, scale, causal, out[0], out[1])
    return tuple(out)


def _times(user, derived):
    return derived if user is None else (user.float() * derived).contiguous()


def _new_out(q):
    B, Sq, Hq, D = q.shape
    return (torch.empty((B, Sq, Hq, D), dtype=torch.bfloat16, device=q.device),
            torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device))


def _prepared(q, k, v, q_descale, k_descale, v_descale) -> dict:
    return {"q": q, "k": k, "v": v, "q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}


@torch.library.custom_op("tirx::flash_attention4_fp4", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor,
                  k_descale: torch.Tensor, v_descale: torch.Tensor, softmax_scale: float,
                  causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _new_out(q)
    _run(_prepared(q, k, v, q_descale, k_descale, v_descale), softmax_scale, causal, o, lse)
    return o, lse


@_attention_op.register_fake
def _(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal):
    return _new_out(q)


@torch.library.custom_op("tirx::flash_attention4_fp4_out", mutates_args=("out", "lse"))
def _attention_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor,
                      k_descale: torch.Tensor, v_descale: torch.Tensor, softmax_scale: float, causal: bool,
                      out: torch.Tensor, lse: torch.Tensor) -> None:
    _run(_prepared(q, k, v, q_descale, k_descale, v_descale), softmax_scale, causal, out, lse)


@_attention_out_op.register_fake
def _(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, out, lse):
    return None


run_test, run_bench = harness.bind(__name__)
