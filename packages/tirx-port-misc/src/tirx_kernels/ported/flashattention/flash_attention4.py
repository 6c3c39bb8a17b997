# SPDX-License-Identifier: Apache-2.0
# Port of flash-attention's Hopper attention forward (FlashAttention-3 design, arXiv 2407.08608; the hopper/ sources and
# FA4's sm90 path, flash_attn/cute) from https://github.com/Dao-AILab/flash-attention at commit
# 0251105a2fb19d2957484b7f023cd8c115286ced: read, not copied. The kernel is the TIRx generator in _fwd_kernel.py.
"""flash-attn's ``flash_attn_func`` forward for Hopper: bf16/fp16, head dims 64, 96, 128, 192, 256 and (192, 128),
causal (bottom-right aligned when Sq != Sk) or not, MHA/GQA/MQA, batch-padded [B, S, H, D]; returns (out, lse) as
flash-attn 4 does (lse fp32 [B, H, Sq], natural log; -inf and a zero output for a row that sees no key).

First correct version of issue #22: TMA producer warpgroup, two consumer warpgroups (64 query rows each) taking
turns on the tensor cores (ping-pong), each overlapping its softmax of tile n with its PV GEMM of tile n - 1, online
softmax with exp2 on the accumulator fragment, P from registers (wgmma RS); the mainloop is shared with the varlen
(``flash_attention4_varlen``) and KV-cache (``flash_attention4_kvcache``) ops. A persistent scheduler comes next;
sliding window, softcap and sink raise NotImplementedError."""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.flashattention import _fwd_kernel

KERNEL_META = {
    "name": "flash_attention4",
    "category": "ported.flashattention",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Attention forward (FA3 design: TMA producer, wgmma SS/RS, exp2 online softmax), bf16/fp16, "
                   "causal, GQA, returns LSE",
    "upstream": {
        "project": "flash-attention",
        "url": "https://github.com/Dao-AILab/flash-attention",
        "commit": "0251105a2fb19d2957484b7f023cd8c115286ced",
    },
    "reference_requirements": [
        {"package": "flash-attn-4", "import": "flash_attn.cute", "specifier": "==4.0.0b36", "baseline": "fa4"},
    ],
    "public_ops": ["flash_attn_func"],
}

# Correctness rows (GPU tests): ragged lengths, GQA/MQA, Sq != Sk both ways, every head dim.
CONFIGS = [
    {"label": "bf16_b2_h4_s1000_d128", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128},
    {"label": "bf16_b2_h4_s1000_d128_causal", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128,
     "causal": True},
    {"label": "bf16_b2_h4_s1000_d128_causal_plain", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128,
     "causal": True, "schedule": "plain"},
    {"label": "bf16_b2_h4_s1000_d128_causal_pingpong", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128,
     "causal": True, "schedule": "pingpong"},
    {"label": "fp16_b1_h8kv2_sq300_sk700_d64_causal", "dtype": "float16", "B": 1, "Sq": 300, "Sk": 700, "Hq": 8,
     "Hkv": 2, "D": 64, "causal": True},
    {"label": "bf16_b1_h16kv1_s257_d64", "B": 1, "Sq": 257, "Sk": 257, "Hq": 16, "Hkv": 1, "D": 64},
    {"label": "bf16_b1_h2_sq400_sk200_d128_causal", "B": 1, "Sq": 400, "Sk": 200, "Hq": 2, "Hkv": 2, "D": 128,
     "causal": True},
    {"label": "bf16_b3_h4kv2_sq1_sk513_d128", "B": 3, "Sq": 1, "Sk": 513, "Hq": 4, "Hkv": 2, "D": 128},
    {"label": "fp16_b1_h4_s8193_d128_causal", "dtype": "float16", "B": 1, "Sq": 8193, "Sk": 8193, "Hq": 4, "Hkv": 4,
     "D": 128, "causal": True},
    {"label": "bf16_b2_h4_s333_d96_causal", "B": 2, "Sq": 333, "Sk": 333, "Hq": 4, "Hkv": 4, "D": 96,
     "causal": True},
    {"label": "bf16_b2_h4_s333_d192", "B": 2, "Sq": 333, "Sk": 333, "Hq": 4, "Hkv": 4, "D": 192},
    {"label": "bf16_b2_h4kv1_s333_d192_dv128_causal", "B": 2, "Sq": 333, "Sk": 333, "Hq": 4, "Hkv": 1, "D": 192,
     "Dv": 128, "causal": True},
    {"label": "bf16_b1_h4_s1000_d256_causal", "B": 1, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 256,
     "causal": True},
]

# The anchor shapes (ANCHORS.md): b2 h16 s8192.
BENCH_CONFIGS = [
    {"label": "bf16_b2_h16_s8192_d64", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 64, "causal": False},
    {"label": "bf16_b2_h16_s8192_d64_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 64, "causal": True},
    {"label": "bf16_b2_h16_s8192_d128", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 128, "causal": False},
    {"label": "bf16_b2_h16_s8192_d128_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 128, "causal": True},
    {"label": "bf16_b2_h16_s8192_d128_causal_plain", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 128, "causal": True, "schedule": "plain"},
    {"label": "bf16_b2_h16_s8192_d128_causal_pingpong", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 128, "causal": True, "schedule": "pingpong"},
    {"label": "bf16_b2_h16_s8192_d256", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 256, "causal": False},
    {"label": "bf16_b2_h16_s8192_d256_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16,
     "D": 256, "causal": True},
]

DEFAULTS = {"dtype": "bfloat16", "Dv": None, "causal": False, "schedule": None, "variant": None}

# lse is fp32 but inherits the 16-bit inputs' S (identical in the oracle): the error is fp32 summation order and
# exp2/log2, ~1e-6 relative on values of a few units.
TOLERANCE = {"float32": (1e-4, 1e-4)}

# out: P is rounded to the input dtype before the PV GEMM (as in FA3/FA4), 2^-9 relative per weight in bf16. A row
# that sees few keys has an output of the size of one V row that may cancel to a small value, so its error is large
# against that value and against the RMS of the whole output (dominated by rows that average many keys): the
# default (0.01 * rms, 0.016) failed 1-39 of 1e6-9e6 elements on the H200 and H100 (2026-12-06) with rel_fro 2.1e-3
# (bf16) / 2.6e-4 (fp16), the size of the roundings. So out is judged per row (the head-dim vector): |got - want|
# <= atol * rms(want) + rtol * |want| + row * rms(want's row). A torch twin with the kernel's roundings (P rounded,
# output rounded) reaches 0.0076 (bf16) / 0.0009 (fp16) of the row RMS beyond its rtol term at 2048 causal keys;
# ``row`` keeps 4x that.
OUT_TOLERANCE = {"bfloat16": (1e-2, 1.6e-2, 3e-2), "float16": (2e-3, 4e-3, 4e-3)}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# (head_dim, head_dim_v) -> block_n: S (block_n / 2), O (Dv / 2) and P (block_n / 4) registers in the consumer's 232,
# two K/V stages in 227 KB of smem (FA3's hdim tables pick tiles of the same size class).
BLOCK_N = {(64, 64): 128, (96, 96): 128, (128, 128): 128, (192, 192): 96, (192, 128): 96, (256, 256): 64}
NUM_STAGES = 2
# _fwd_kernel.SCHEDULES: "overlap" (ping-pong + the softmax of tile n under PV of tile n - 1, FA3's design) by default;
# "pingpong" and "plain" stay as CONFIGS / BENCH_CONFIGS rows to measure each step against on the GPU.
SCHEDULE = "overlap"
# The default kernel's softmax weights by ex2.approx.ftz (one MUFU.EX2 a weight; exp2f cost 4 instructions each in the
# SASS, core.lang.softmax.update's note): fewer instructions, the same values but for weights below 2^-126.
FAST_EXP2 = True
# Schedule variants (a config's "variant"; build_fwd_kernel's knobs, over the default's), each timed against the
# product's kernel by tools/sweeps/attn_schedules.py (gpu_calls/attn.sh). None is the product default yet: see there
# for what each changes in the SASS.
_OVL2 = {"fast_exp2": True, "split_mask": True, "late_release": True}
VARIANTS = {
    "base": {"fast_exp2": False},  # the kernel before FAST_EXP2 (2026-12-07's pinned rows)
    "exp2": {"fast_exp2": True},
    "ovl2": _OVL2,
    "ovl2_n176": {**_OVL2, "block_n": 176},  # FA3's 128 x 176 tile for hd128 non-causal
    "ovl2_n192": {**_OVL2, "block_n": 192},  # 192 keys at hd64
    "ovl2_c3": {**_OVL2, "num_consumers": 3},  # FA3's hd64 tile: 3 consumer warpgroups, 192 query rows
    "exp2_c3": {"fast_exp2": True, "num_consumers": 3},
    "pp_exp2": {"schedule": "pingpong", "fast_exp2": True},
    # ovl3: ovl2 + the PV wait fenced behind the softmax (a warpgroup barrier that depends on the row sums): every
    # MUFU.EX2 of a tile before the wait in the SASS, where ovl2 left 25 of 66 (non-causal) or none (causal) there
    "ovl3": {**_OVL2, "wait_fence": True},
    "ovl3_n176": {**_OVL2, "wait_fence": True, "block_n": 176},
    "ovl3_n192": {**_OVL2, "wait_fence": True, "block_n": 192},
    "ovl3_c3": {**_OVL2, "wait_fence": True, "num_consumers": 3},
    "ovl3_re": {**_OVL2, "wait_fence": True, "rescale_early": True},  # + FA3's O rescale before the PV issue
}
_INT32_MAX = 2**31 - 1


def compile_params(**cfg) -> dict:
    """What changes the code: dtype, head dims, causal, the schedule (and a variant's name, when a config names
    one). B, S, H and the strides are run-time arguments."""
    d = int(cfg["D"])
    dv = d if cfg.get("Dv") is None else int(cfg["Dv"])
    params = {"dtype": cfg.get("dtype", "bfloat16"), "head_dim": d, "head_dim_v": dv,
              "causal": bool(cfg.get("causal")), "schedule": cfg.get("schedule") or SCHEDULE}
    if cfg.get("variant"):
        params["variant"] = cfg["variant"]
    return params


def kernel_knobs(head_dim: int, head_dim_v: int, schedule: str = SCHEDULE, variant: str | None = None) -> dict:
    """``build_fwd_kernel``'s arguments after (dtype, head dims, causal): the default's, with ``variant``'s knobs."""
    if (head_dim, head_dim_v) not in BLOCK_N:
        raise ValueError(f"flash_attention4: head dims ({head_dim}, {head_dim_v}) not one of {sorted(BLOCK_N)}")
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"flash_attention4: variant {variant!r} is not one of {sorted(VARIANTS)}")
    knobs = {"block_n": BLOCK_N[(head_dim, head_dim_v)], "num_stages": NUM_STAGES, "schedule": schedule,
             "fast_exp2": FAST_EXP2}
    return {**knobs, **VARIANTS.get(variant, {})}


def get_kernel(dtype: str, head_dim: int, head_dim_v: int, causal: bool, schedule: str = SCHEDULE,
               variant: str | None = None):
    return _fwd_kernel.build_fwd_kernel(dtype, head_dim, head_dim_v, causal,
                                        **kernel_knobs(head_dim, head_dim_v, schedule, variant))


def artifact_params() -> list[dict]:
    return [{"dtype": t, "head_dim": d, "head_dim_v": dv, "causal": c, "schedule": SCHEDULE}
            for t in _DTYPES for (d, dv) in BLOCK_N for c in (False, True)]


def call_samples(rng) -> list[dict]:
    """Every dtype, supported head-dim pair and mask, with random batch, lengths and GQA ratios."""
    out = []
    for t in _DTYPES:
        for (d, dv) in BLOCK_N:
            for c in (False, True):
                hkv = rng.choice([1, 2, 8])
                out.append({"dtype": t, "B": rng.randint(1, 4), "Sq": rng.choice([1, 17, 127, 8193]),
                            "Sk": rng.choice([1, 17, 127, 8193]), "Hq": hkv * rng.choice([1, 2, 16]), "Hkv": hkv,
                            "D": d, "Dv": dv, "causal": c})
    return out


def sass_expect(head_dim: int, head_dim_v: int, **_) -> list[str]:
    """Both GEMMs on the tensor cores: QK^T with A from smem (``gdesc``), PV with A = P from registers and V
    transposed (``.tnspB``); 4-D TMA loads; the setmaxnreg register split."""
    n = BLOCK_N[(head_dim, head_dim_v)]
    dvp = _fwd_kernel.padded(head_dim_v)
    return [rf"HGMMA\.64x{n}x16\.F32\S* R\d+, gdesc", rf"HGMMA\.64x{dvp}x16\.F32\S* R\d+, R\d+, gdesc\[UR\d+\]\.tnspB",
            r"UTMALDG\.4D", r"USETMAXREG"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def prepare_data(dtype: str, B: int, Sq: int, Sk: int, Hq: int, Hkv: int, D: int, Dv: int | None = None,  # noqa: N803
                 causal: bool = False, schedule: str | None = None, variant: str | None = None,
                 device: str = "cuda") -> dict:
    """Fresh random q, k, v and poisoned out / lse; ``schedule`` and ``variant`` (the kernel) are read by ``launch``
    from the config."""
    dv = D if Dv is None else Dv
    t = _DTYPES[dtype]
    q = torch.randn(B, Sq, Hq, D, dtype=t, device=device)
    k = torch.randn(B, Sk, Hkv, D, dtype=t, device=device)
    v = torch.randn(B, Sk, Hkv, dv, dtype=t, device=device)
    out = torch.full((B, Sq, Hq, dv), float("nan"), dtype=t, device=device)
    lse = torch.full((B, Hq, Sq), float("nan"), dtype=torch.float32, device=device)
    return {"q": q, "k": k, "v": v, "out": out, "lse": lse, "softmax_scale": 1.0 / math.sqrt(D), "causal": causal}


def attention_fp32(q, k, v, softmax_scale: float, causal: bool, q_block: int = 1024):
    """fp32 attention with flash-attn's conventions: (out [B, Sq, Hq, Dv], lse [B, Hq, Sq]), both fp32;
    causal is bottom-right aligned (key j visible to query i iff j <= i + Sk - Sq); a row that sees no key has
    out 0 and lse -inf. Query blocks of ``q_block`` bound the score matrix's memory."""
    B, Sq, Hq, _ = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    kf = k.float().transpose(1, 2).repeat_interleave(group, 1)  # [B, Hq, Sk, D]
    vf = v.float().transpose(1, 2).repeat_interleave(group, 1)
    out = torch.empty(B, Hq, Sq, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.empty(B, Hq, Sq, dtype=torch.float32, device=q.device)
    for i0 in range(0, Sq, q_block):
        qf = q[:, i0:i0 + q_block].float().transpose(1, 2)  # [B, Hq, m, D]
        s = torch.matmul(qf, kf.transpose(-1, -2)) * softmax_scale
        if causal:
            rows = torch.arange(i0, i0 + qf.shape[2], device=q.device)[:, None]
            cols = torch.arange(Sk, device=q.device)[None, :]
            s = s.masked_fill(cols > rows + (Sk - Sq), float("-inf"))
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
        total = p.sum(-1, keepdim=True)
        blk_lse = torch.where(total > 0, m + torch.log(total), torch.full_like(m, float("-inf")))
        out[:, :, i0:i0 + q_block] = torch.matmul(p / torch.where(total > 0, total, torch.ones_like(total)), vf)
        lse[:, :, i0:i0 + q_block] = blk_lse.squeeze(-1)
    return out.transpose(1, 2), lse


def reference(q, k, v, softmax_scale, causal, **_) -> dict:
    out, lse = attention_fp32(q, k, v, softmax_scale, causal)
    return {"out": out, "lse": lse}


def _compare_lse(got, want, cfg, inputs):
    """Rows that see no key must be -inf in both; the others within the fp32 tolerance."""
    empty = torch.isinf(want) & (want < 0)
    if not torch.equal(torch.isinf(got) & (got < 0), empty):
        n = int(((torch.isinf(got) & (got < 0)) != empty).sum())
        raise harness.KernelCheckError(f"{n} rows differ in being -inf (a row that sees no key)")
    return harness.compare("lse", got[~empty], want[~empty], TOLERANCE["float32"], "the fp32 oracle")


def _compare_out(got, want, cfg, inputs):
    """out within ``OUT_TOLERANCE`` of its dtype, the row term scaled by each head-dim row's RMS (see there)."""
    atol, rtol, row = OUT_TOLERANCE[str(got.dtype).replace("torch.", "")]
    return harness.compare("out", got, want, (atol, rtol), "the fp32 oracle", row=row)


COMPARATORS = {"out": _compare_out, "lse": _compare_lse}


def check_outputs_against_oracle(out, lse, want, want_lse) -> dict:
    """The run_test checks of one call, for tests that call the kernel directly (emulator, odd shapes): out at its
    dtype's tolerance, lse as ``COMPARATORS`` says; raises ``harness.KernelCheckError``."""
    return {"out": _compare_out(out, want, {}, {}), "lse": _compare_lse(lse, want_lse, {}, {})}


def launch(cfg: dict, data: dict) -> None:
    """The public op; a row naming another schedule than the default, or a variant, runs that kernel behind the same
    checks."""
    schedule = cfg.get("schedule") or SCHEDULE
    variant = cfg.get("variant")
    if schedule == SCHEDULE and not variant:
        flash_attn_func(data["q"], data["k"], data["v"], softmax_scale=data["softmax_scale"], causal=data["causal"],
                        out=(data["out"], data["lse"]))
        return
    _check_inputs(data["q"], data["k"], data["v"], data["softmax_scale"], (None, None), None, 0.0, 1,
                  (data["out"], data["lse"]))
    _run(data["q"], data["k"], data["v"], data["softmax_scale"], data["causal"], data["out"], data["lse"], schedule,
         variant)


def roofline(B: int, Sq: int, Sk: int, Hq: int, Hkv: int, D: int, Dv: int | None = None, causal: bool = False,
             dtype: str = "bfloat16", **_) -> dict:
    """FLOPs 2 B Hq (D + Dv) x the visible (query, key) pairs (all Sq Sk, or the bottom-right causal count, ~half
    when Sq = Sk as the anchors' 4 b h s^2 d / 2); bytes: q, k, v read once, out and lse written once."""
    dv = D if Dv is None else Dv
    if causal:
        pairs = sum(max(0, min(Sk, i + 1 + Sk - Sq)) for i in range(Sq)) if Sq < 65536 else Sq * Sk // 2
    else:
        pairs = Sq * Sk
    elem = 2
    nbytes = elem * B * (Sq * Hq * D + Sk * Hkv * (D + dv) + Sq * Hq * dv) + 4 * B * Hq * Sq
    return {"bytes": nbytes, "flops": 2 * B * Hq * (D + dv) * pairs}


def get_baselines(**cfg) -> dict:
    Sq, Sk, causal = int(cfg.get("Sq", 1)), int(cfg.get("Sk", 1)), bool(cfg.get("causal"))

    def sdpa(backend_name: str | None):
        def build():
            import torch.nn.functional as F  # noqa: N812
            from torch.nn.attention import SDPBackend, sdpa_kernel

            if causal and Sq != Sk:
                raise ImportError("SDPA's is_causal is top-left aligned; flash-attn's causal is bottom-right when "
                                  "Sq != Sk")
            backend = None if backend_name is None else getattr(SDPBackend, backend_name)

            def fn(data):
                q, k, v = (data[n].transpose(1, 2) for n in ("q", "k", "v"))
                gqa = q.shape[1] != k.shape[1]
                if backend is None:
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=data["softmax_scale"],
                                                       enable_gqa=gqa)
                else:
                    with sdpa_kernel(backend):
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=data["softmax_scale"],
                                                           enable_gqa=gqa)
                return {"out": o.transpose(1, 2)}
            return fn
        return build

    def fa4():
        from flash_attn.cute import flash_attn_func as fa4_func

        # FA4's sm90 path does not take every head-dim pair / GQA ratio: a failing probe on a tiny call of this
        # config's kind is reported as a missing reference (with FA4's message), not a failed check.
        d = int(cfg.get("D", 128))
        dv = d if cfg.get("Dv") is None else int(cfg["Dv"])
        t = _DTYPES[cfg.get("dtype", "bfloat16")]
        hq, hkv = int(cfg.get("Hq", 1)), int(cfg.get("Hkv", 1))
        try:
            fa4_func(*(torch.randn(1, 8, h, dd, dtype=t, device="cuda") for h, dd in ((hq, d), (hkv, d), (hkv, dv))),
                     causal=causal)
        except Exception as e:  # noqa: BLE001 -- any refusal of FA4's means "reference not available here"
            raise ImportError(f"FA4 does not run D={d} Dv={dv} Hq/Hkv={hq}/{hkv} {t}: {e}") from e

        def fn(data):
            o, lse = fa4_func(data["q"], data["k"], data["v"], softmax_scale=data["softmax_scale"],
                              causal=data["causal"])
            return {"out": o, "lse": lse}
        return fn

    return {"torch": sdpa(None), "sdpa_flash": sdpa("FLASH_ATTENTION"), "sdpa_cudnn": sdpa("CUDNN_ATTENTION"),
            "fa4": fa4}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "flash_attn_func"


def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def check_scale(op: str, softmax_scale) -> None:
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale)):
        raise checks.TirxInputError(f"{op}: argument 'softmax_scale': expected None or a finite float, got "
                                    f"{softmax_scale!r}")


def _check_options(op: str, window_size, learnable_sink, softcap, num_splits=1) -> None:
    """The flash-attn arguments no kernel of this package implements yet (every public op checks them)."""
    if tuple(window_size) not in ((None, None), (-1, -1)):
        raise NotImplementedError(f"{op}: argument 'window_size': sliding-window attention is not implemented yet "
                                  f"(got {tuple(window_size)}; only (None, None) / (-1, -1))")
    if learnable_sink is not None:
        raise NotImplementedError(f"{op}: argument 'learnable_sink': per-head sinks are not implemented yet")
    if softcap:
        raise NotImplementedError(f"{op}: argument 'softcap': logit soft-capping is not implemented yet "
                                  f"(got {softcap})")
    if num_splits not in (0, 1):
        raise NotImplementedError(f"{op}: argument 'num_splits': split-KV is not implemented yet (got {num_splits})")


def _check_inputs(q, k, v, softmax_scale, window_size, learnable_sink, softcap, num_splits, out) -> None:
    """Shapes, dtypes and the arguments this version does not implement; the device last (a CPU machine exercises
    the rest)."""
    dtypes = tuple(_DTYPES.values())
    checks.tensor(_OP, "q", q, dtypes=dtypes, ndim=4, cuda=False)
    B, Sq, Hq, D = q.shape
    checks.tensor(_OP, "k", k, dtypes=dtypes, ndim=4, cuda=False)
    checks.tensor(_OP, "v", v, dtypes=dtypes, ndim=4, cuda=False)
    checks.same_dtype(_OP, "q", q, k=k, v=v)
    Sk, Hkv = k.shape[1], k.shape[2]
    checks.tensor(_OP, "k", k, shape=(B, None, None, D), cuda=False)
    checks.tensor(_OP, "v", v, shape=(B, Sk, Hkv, None), cuda=False)
    Dv = v.shape[3]
    if (D, Dv) not in BLOCK_N:
        _fail("v" if D in {d for d, _ in BLOCK_N} else "q", f"head dims (q/k, v) in {sorted(BLOCK_N)}",
              f"({D}, {Dv})")
    if Hkv == 0 or Hq % Hkv:
        _fail("k", f"a number of heads dividing q's {Hq} (GQA/MQA)", f"{Hkv}")
    check_scale(_OP, softmax_scale)
    _check_options(_OP, window_size, learnable_sink, softcap, num_splits)
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("out", "a tuple (out, lse)", type(out).__name__)
        checks.tensor(_OP, "out[0]", out[0], shape=(B, Sq, Hq, Dv), contiguous=True, cuda=False)
        checks.same_dtype(_OP, "q", q, **{"out[0]": out[0]})
        checks.tensor(_OP, "out[1]", out[1], dtypes=(torch.float32,), shape=(B, Hq, Sq), contiguous=True, cuda=False)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if any(s > _INT32_MAX for s in t.stride()):
            _fail(name, "strides below 2**31 elements", f"strides {tuple(t.stride())}")
    # The grid is (query tiles, Hq, B): CUDA's y and z extents stop at 65535.
    if Hq > 65535:
        _fail("q", "at most 65535 heads (the grid's y extent)", f"{Hq}")
    if B > 65535:
        _fail("q", "a batch of at most 65535 (the grid's z extent)", f"{B}")
    if B * Sq * Hq * Dv > _INT32_MAX:
        _fail("q", f"an output below 2**31 elements (B * Sq * Hq * Dv = {B * Sq * Hq * Dv})", f"shape {tuple(q.shape)}")
    checks.tensor(_OP, "q", q, cuda=True)
    checks.same_device(_OP, "q", q, k=k, v=v, **({} if out is None else {"out[0]": out[0], "out[1]": out[1]}))


def check_lse_base(op: str, lse: torch.Tensor) -> None:
    """The LSE output is stored element by element (any strides of a contiguous tensor are fine: an [B, H, 1] one
    has 4-byte strides) from a 16-byte-aligned base."""
    if lse.data_ptr() % 16:
        raise checks.TirxInputError(f"{op}: argument 'out[1]': expected a data pointer aligned to 16 bytes, got "
                                    f"address 0x{lse.data_ptr():x}")


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """TMA takes a 16-byte-aligned base and 16-byte-multiple strides; anything else goes through a contiguous copy
    (flash-attn likewise copies an input whose last dim is not contiguous)."""
    esize = t.element_size()
    ok = t.data_ptr() % 16 == 0 and all(t.stride(d) * esize % 16 == 0 for d in range(3) if t.shape[d] > 1)
    return t if ok else t.contiguous()


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(q, k, v, softmax_scale: float, causal: bool, out, lse, schedule: str = SCHEDULE,
         variant: str | None = None) -> None:
    B, Sq, Hq, D = q.shape
    Sk, Dv = k.shape[1], v.shape[3]
    if B == 0 or Sq == 0 or Hq == 0:
        return
    if Sk == 0:  # no key at all: flash-attn's empty-row convention, no launch (a TMA map cannot have extent 0)
        out.zero_()
        lse.fill_(float("-inf"))
        return
    checks.aligned(_OP, "out[0]", out, 16)
    check_lse_base(_OP, lse)
    fn = _FUNCTIONS.get((q.dtype, D, Dv, causal, schedule, variant, q.get_device()),
                        lambda: compile_params(dtype=str(q.dtype)[6:], D=D, Dv=Dv, causal=causal, schedule=schedule,
                                               variant=variant),
                        q.device)
    fn(_tma_ready(q), _tma_ready(k), _tma_ready(v), out, lse, float(softmax_scale))


def _new_out(q, v):
    B, Sq, Hq, _ = q.shape
    return (torch.empty((B, Sq, Hq, v.shape[3]), dtype=q.dtype, device=q.device),
            torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device))


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
                    causal: bool = False, window_size=(None, None), learnable_sink: torch.Tensor | None = None,
                    softcap: float = 0.0, num_splits: int = 1, pack_gqa: bool | None = None,
                    deterministic: bool = False,
                    out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward with flash-attn's conventions (FA4's ``flash_attn.cute.flash_attn_func``): q [B, Sq, Hq, D],
    k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] bf16/fp16 with unit stride in the head dim, Hq a multiple of Hkv;
    (D, Dv) one of (64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256). ``softmax_scale`` defaults to
    1/sqrt(D); ``causal`` masks bottom-right aligned (key j visible to query i iff j <= i + Sk - Sq). Returns
    (out [B, Sq, Hq, Dv], lse [B, Hq, Sq] fp32, natural log), written into ``out`` = (out, lse) when given
    (contiguous). ``pack_gqa`` and ``deterministic`` change nothing here (one schedule; the forward is
    deterministic). Sliding window, softcap, learnable sink and split-KV raise NotImplementedError."""
    _check_inputs(q, k, v, softmax_scale, window_size, learnable_sink, softcap, num_splits, out)
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
    causal = bool(causal)
    if runtime.direct_call(q, k, v, *(out or ())):
        dst = out if out is not None else _new_out(q, v)
        _run(q, k, v, scale, causal, dst[0], dst[1])
        if out is not None:
            runtime.mark_written(out[0])
            runtime.mark_written(out[1])
        return tuple(dst)
    if out is None:
        return tuple(torch.ops.tirx.flash_attention4(q, k, v, scale, causal))
    torch.ops.tirx.flash_attention4_out(q, k, v, scale, causal, out[0], out[1])
    return tuple(out)


@torch.library.custom_op("tirx::flash_attention4", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                  causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _new_out(q, v)
    _run(q, k, v, softmax_scale, causal, o, lse)
    return o, lse


@_attention_op.register_fake
def _(q, k, v, softmax_scale, causal):
    return _new_out(q, v)


@torch.library.custom_op("tirx::flash_attention4_out", mutates_args=("out", "lse"))
def _attention_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool,
                      out: torch.Tensor, lse: torch.Tensor) -> None:
    _run(q, k, v, softmax_scale, causal, out, lse)


@_attention_out_op.register_fake
def _(q, k, v, softmax_scale, causal, out, lse):
    return None


run_test, run_bench = harness.bind(__name__)
__import__("tirx_kernels.ported.flashattention.flash_attention_backward")  # registers this op's autograd (issue #23)
