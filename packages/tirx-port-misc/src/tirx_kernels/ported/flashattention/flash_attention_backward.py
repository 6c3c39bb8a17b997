# SPDX-License-Identifier: Apache-2.0
# Port of flash-attention's Hopper attention backward (FlashAttention-3 design, arXiv 2407.08608; the hopper/ sources
# and FA4's sm90 path, flash_attn/cute/flash_bwd_sm90.py) from https://github.com/Dao-AILab/flash-attention at commit
# 0251105a2fb19d2957484b7f023cd8c115286ced: read, not copied. Kernels: _bwd_kernel.py (main), _bwd_pre_post.py.
"""The attention backward for Hopper (issue #23): dQ, dK, dV of flash_attention4's forward, bf16/fp16, head dims 64,
96, 128, 192, 256 and (192, 128), causal (bottom-right aligned) or not, MHA/GQA/MQA, batch-padded [B, S, H, D].

The seed (upstream tirx-kernels) ships this as ``flash_attention_backward_sm100`` (FA4's Blackwell backward: 2-CTA
tcgen05, TMEM, d = 128 only); this module is its Hopper counterpart, registered as ``flash_attention_backward_sm90``,
with FA3's design instead: a preprocess (delta = rowsum(dO * O), LSE in log2, zeroed accumulators), a main kernel that
keeps a key block's dK and dV in registers while it walks the query blocks (S^T, dP^T by wgmma SS; dV, dK by wgmma RS
from registers; dQ = dS K from shared memory, accumulated in fp32 by bulk reductions; past head dim 128 the consumers
split the head dims instead, ``_bwd_kernel_wide``), and a postprocess that scales and rounds dQ (plus, where a KV
group's query heads are split over CTAs, a fixed-order sum of the dK / dV partials).

``deterministic=True`` orders the dQ additions of the key blocks (a flag per query block): bit-identical run to run.
Training: ``flash_attn_func(q, k, v, causal=...)`` with ``requires_grad`` inputs differentiates through this op
(``torch.library.register_autograd`` on ``tirx::flash_attention4``, below); the gradient of the returned LSE is
honoured. Sliding window, softcap and the learnable sink raise NotImplementedError, as the forward does.
"""

from __future__ import annotations

import importlib
import math

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.flashattention import _bwd_kernel, _bwd_kernel_wide, _bwd_pre_post

# The forward module: its op gets this backward as autograd, its fp32 oracle serves here. Imported by name, not by an
# import statement: the artifacts' source fingerprint follows import statements, and the forward's sources take no
# part in generating these kernels (nor these in the forward's, which imports this module the same way).
_fwd = importlib.import_module("tirx_kernels.ported.flashattention.flash_attention4")

KERNEL_META = {
    "name": "flash_attention_backward_sm90",
    "category": "ported.flashattention",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Attention backward (FA3 design: dK/dV in registers, wgmma SS/RS, fp32 dQ by bulk reduction, "
                   "deterministic mode), bf16/fp16, causal, GQA",
    "upstream": {
        "project": "flash-attention",
        "url": "https://github.com/Dao-AILab/flash-attention",
        "commit": "0251105a2fb19d2957484b7f023cd8c115286ced",
    },
    "reference_requirements": [
        {"package": "flash-attn-4", "import": "flash_attn.cute", "specifier": "==4.0.0b36", "baseline": "fa4"},
    ],
    "public_ops": ["flash_attn_backward"],
}

# Correctness rows (GPU tests): ragged lengths, GQA/MQA, Sq != Sk both ways, deterministic.
CONFIGS = [
    {"label": "bf16_b2_h4_s1000_d128", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128},
    {"label": "bf16_b2_h4_s1000_d128_causal", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128,
     "causal": True},
    {"label": "bf16_b2_h4_s1000_d128_causal_det", "B": 2, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 128,
     "causal": True, "deterministic": True},
    {"label": "fp16_b1_h8kv2_sq300_sk700_d64_causal", "dtype": "float16", "B": 1, "Sq": 300, "Sk": 700, "Hq": 8,
     "Hkv": 2, "D": 64, "causal": True},
    {"label": "bf16_b1_h16kv1_s257_d64", "B": 1, "Sq": 257, "Sk": 257, "Hq": 16, "Hkv": 1, "D": 64},
    {"label": "bf16_b1_h2_sq400_sk200_d128_causal", "B": 1, "Sq": 400, "Sk": 200, "Hq": 2, "Hkv": 2, "D": 128,
     "causal": True},
    {"label": "bf16_b3_h4kv2_sq1_sk513_d128", "B": 3, "Sq": 1, "Sk": 513, "Hq": 4, "Hkv": 2, "D": 128},
    {"label": "bf16_b2_h4_s333_d96_causal", "B": 2, "Sq": 333, "Sk": 333, "Hq": 4, "Hkv": 4, "D": 96,
     "causal": True},
    {"label": "fp16_b1_h4_s4097_d128_causal_det", "dtype": "float16", "B": 1, "Sq": 4097, "Sk": 4097, "Hq": 4,
     "Hkv": 4, "D": 128, "causal": True, "deterministic": True},
    {"label": "bf16_b2_h4_s333_d192", "B": 2, "Sq": 333, "Sk": 333, "Hq": 4, "Hkv": 4, "D": 192},
    {"label": "bf16_b2_h4kv1_s333_d192_dv128_causal", "B": 2, "Sq": 333, "Sk": 333, "Hq": 4, "Hkv": 1, "D": 192,
     "Dv": 128, "causal": True},
    {"label": "bf16_b1_h4_s1000_d256_causal", "B": 1, "Sq": 1000, "Sk": 1000, "Hq": 4, "Hkv": 4, "D": 256,
     "causal": True},
    {"label": "fp16_b1_h4kv2_sq200_sk700_d256_det", "dtype": "float16", "B": 1, "Sq": 200, "Sk": 700, "Hq": 4,
     "Hkv": 2, "D": 256, "deterministic": True},
]

# Small / medium / large, and the anchor shapes (ANCHORS.md): b2 h16 s8192.
BENCH_CONFIGS = [
    {"label": "bf16_b1_h16_s1024_d128_causal", "B": 1, "Sq": 1024, "Sk": 1024, "Hq": 16, "Hkv": 16, "D": 128,
     "causal": True},
    {"label": "bf16_b2_h16_s4096_d128", "B": 2, "Sq": 4096, "Sk": 4096, "Hq": 16, "Hkv": 16, "D": 128},
    {"label": "bf16_b2_h16_s8192_d64", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 64},
    {"label": "bf16_b2_h16_s8192_d64_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 64,
     "causal": True},
    {"label": "bf16_b2_h16_s8192_d128", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128},
    {"label": "bf16_b2_h16_s8192_d128_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128,
     "causal": True},
    {"label": "bf16_b2_h16_s8192_d128_causal_det", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 128,
     "causal": True, "deterministic": True},
    {"label": "bf16_b2_h16kv2_s8192_d128_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 2, "D": 128,
     "causal": True},
    {"label": "bf16_b2_h16_s8192_d256", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 256},
    {"label": "bf16_b2_h16_s8192_d256_causal", "B": 2, "Sq": 8192, "Sk": 8192, "Hq": 16, "Hkv": 16, "D": 256,
     "causal": True},
]

DEFAULTS = {"dtype": "bfloat16", "Dv": None, "causal": False, "deterministic": False}

# Gradients go through two 16-bit roundings the oracle does not have (P and dS before their GEMMs, as in every
# flash backward): a little looser than the forward's output tolerance.
TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (4e-3, 8e-3)}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256))
_INT32_MAX = 2**31 - 1


def _wide(d: int, dv: int) -> bool:
    """Head dims past 128 take the wide schedule (``_bwd_kernel_wide``: the consumers split the head dims)."""
    return max(d, dv) > 128


def plan(d: int, dv: int) -> dict:
    """The main kernel's tiles for head dims (d, dv): query rows per step, key rows per CTA, and the fp32 widths of
    the dQ accumulator and the dK / dV partials (the GEMMs' padded N)."""
    if _wide(d, dv):
        w = _bwd_kernel_wide
        return {"block_m": w.BLOCK_M, "block_n": w.BLOCK_N, "dq_width": w.wide_dim(d), "dk_width": w.wide_dim(d),
                "dv_width": w.wide_dim(dv)}
    return {"block_m": _bwd_kernel.block_m_for(d), "block_n": _bwd_kernel.BLOCK_N, "dq_width": _bwd_kernel.padded(d),
            "dk_width": _bwd_kernel.padded(d), "dv_width": _bwd_kernel.padded(dv)}


def compile_params(**cfg) -> dict:
    """The main kernel's params (what changes its code: dtype, head dims, causal); B, S, H, strides, the head split
    and deterministic mode are run-time arguments. The pre/post kernels: one artifact per dtype (``_params``)."""
    d = int(cfg["D"])
    dv = d if cfg.get("Dv") is None else int(cfg["Dv"])
    return _params("main", cfg.get("dtype", "bfloat16"), d, dv, bool(cfg.get("causal")))


def _params(kernel: str, dtype: str, d: int = 0, dv: int = 0, causal: bool = False) -> dict:
    if kernel == "main":
        return {"kernel": "main", "dtype": dtype, "head_dim": d, "head_dim_v": dv, "causal": causal}
    return {"kernel": kernel, "dtype": dtype}


def get_kernel(kernel: str, dtype: str, head_dim: int = 0, head_dim_v: int = 0, causal: bool = False):
    if kernel == "main":
        if (head_dim, head_dim_v) not in HEAD_DIMS:
            raise ValueError(f"flash_attention_backward: head dims ({head_dim}, {head_dim_v}) not one of {HEAD_DIMS}")
        if _wide(head_dim, head_dim_v):
            return _bwd_kernel_wide.build_bwd_kernel_wide(dtype, head_dim, head_dim_v, causal)
        return _bwd_kernel.build_bwd_kernel(dtype, head_dim, head_dim_v, causal, _bwd_kernel.block_m_for(head_dim))
    builders = {"pre": _bwd_pre_post.build_preprocess, "post": _bwd_pre_post.build_postprocess,
                "reduce": _bwd_pre_post.build_group_reduce}
    if kernel not in builders:
        raise ValueError(f"flash_attention_backward: kernel {kernel!r} is one of main, {', '.join(builders)}")
    return builders[kernel](dtype)


def artifact_params() -> list[dict]:
    return ([_params("main", t, d, dv, c) for t in _DTYPES for (d, dv) in HEAD_DIMS for c in (False, True)]
            + [_params(k, t) for k in ("pre", "post", "reduce") for t in _DTYPES])


def call_samples(rng) -> list[dict]:
    """Every dtype, supported head-dim pair and mask, twice, with random batch, lengths and GQA ratios (the pre/post
    kernels' artifacts are per dtype, all in ``artifact_params``)."""
    out = []
    for t in _DTYPES:
        for (d, dv) in HEAD_DIMS:
            for c in (False, True, False, True):
                hkv = rng.choice([1, 2, 8])
                out.append({"dtype": t, "B": rng.randint(1, 4), "Sq": rng.choice([1, 17, 127, 8193]),
                            "Sk": rng.choice([1, 17, 127, 8193]), "Hq": hkv * rng.choice([1, 2, 16]), "Hkv": hkv,
                            "D": d, "Dv": dv, "causal": c, "deterministic": rng.random() < 0.5})
    return out


def sass_expect(kernel: str = "main", head_dim: int = 0, head_dim_v: int = 0, **_) -> list[str]:
    """Main kernel: S^T and dP^T from smem descriptors, dV / dK with A from registers and B transposed, dQ with both
    operands transposed, 4-D TMA loads, the bulk reduction of dQ, setmaxnreg."""
    if kernel != "main":
        return []
    if _wide(head_dim, head_dim_v):  # S / dP m64n32 SS, dV / dK with A and B transposed, dQ B transposed, red.v4
        dkn = _bwd_kernel_wide.wide_dim(head_dim) // 2
        return [r"HGMMA\.64x32x16\.F32\S* R\d+, gdesc", rf"HGMMA\.64x{dkn}x16\.F32\S* R\d+, gdesc\[UR\d+\]\.tnspB",
                rf"HGMMA\.64x{dkn}x16\.F32\S* R\d+, gdesc\[UR\d+\]\.tnspA\.tnspB", r"UTMALDG\.4D",
                r"REDG?\.E\.ADD\.F32", r"USETMAXREG"]
    bm = _bwd_kernel.block_m_for(head_dim)
    dvp = _bwd_kernel.padded(head_dim_v)
    return [rf"HGMMA\.64x{bm}x16\.F32\S* R\d+, gdesc", rf"HGMMA\.64x{dvp}x16\.F32\S* R\d+, R\d+, gdesc\[UR\d+\]\.tnspB",
            r"HGMMA\.64x\d+x16\.F32\S* R\d+, gdesc\[UR\d+\]\.tnspA\.tnspB", r"UTMALDG\.4D", r"UBLKRED", r"USETMAXREG"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def prepare_data(dtype: str, B: int, Sq: int, Sk: int, Hq: int, Hkv: int, D: int, Dv: int | None = None,  # noqa: N803
                 causal: bool = False, deterministic: bool = False, device: str = "cuda") -> dict:
    """Fresh random q, k, v, dout; out and lse from the fp32 oracle (out rounded to the dtype, as the forward returns
    it); dq, dk, dv poisoned."""
    dv = D if Dv is None else Dv
    t = _DTYPES[dtype]
    q = torch.randn(B, Sq, Hq, D, dtype=t, device=device)
    k = torch.randn(B, Sk, Hkv, D, dtype=t, device=device)
    v = torch.randn(B, Sk, Hkv, dv, dtype=t, device=device)
    dout = torch.randn(B, Sq, Hq, dv, dtype=t, device=device)
    scale = 1.0 / math.sqrt(D)
    out, lse = _fwd.attention_fp32(q, k, v, scale, causal)
    return {"q": q, "k": k, "v": v, "out": out.to(t).contiguous(), "dout": dout, "lse": lse.contiguous(),
            "dq": torch.full_like(q, float("nan")), "dk": torch.full_like(k, float("nan")),
            "dv": torch.full_like(v, float("nan")), "softmax_scale": scale, "causal": causal,
            "deterministic": deterministic}


def attention_grads_fp32(q, k, v, dout, softmax_scale: float, causal: bool, dlse=None, out=None):
    """dq, dk, dv (fp32) of the fp32 oracle (``flash_attention4.attention_fp32``) by autograd, for output gradient
    ``dout`` (and ``dlse`` of the LSE output, where given).

    ``out``: the forward output the backward is given (rounded to 16 bits, as every flash backward receives it). The
    backward's delta is rowsum(dO * out) of *that* output, not of the exact one; the difference
    rowsum(dO * (O_exact - out)) enters the scores' gradient exactly as a gradient of the LSE does (d lse_i / d s_ij =
    P_ij), so it is passed to autograd as one: the oracle then computes, in fp32, the backward of the op's own inputs
    (otherwise the 16-bit rounding of ``out`` alone, ~0.4 % of delta, is a large error on rows that see few keys)."""
    with torch.enable_grad():
        qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
        o_exact, lse = _fwd.attention_fp32(qf, kf, vf, softmax_scale, causal)
        g_lse = None if dlse is None else dlse.float()
        if out is not None:
            fix = ((o_exact.detach() - out.float()) * dout.float()).sum(-1).transpose(1, 2)  # [B, Hq, Sq]
            g_lse = fix if g_lse is None else g_lse + fix
        outs, grads = [o_exact], [dout.float()]
        if g_lse is not None:
            live = torch.isfinite(lse)  # rows that see no key have a constant -inf LSE
            outs.append(torch.where(live, lse, torch.zeros_like(lse)))
            grads.append(torch.where(live, g_lse, torch.zeros_like(lse)))
        return torch.autograd.grad(outs, (qf, kf, vf), grads)


def reference(q, k, v, out, dout, softmax_scale, causal, **_) -> dict:
    dq, dk, dv = attention_grads_fp32(q, k, v, dout, softmax_scale, causal, out=out)
    return {"dq": dq, "dk": dk, "dv": dv}


def attention_grads_low_precision(q, k, v, dout, softmax_scale: float, causal: bool, dlse=None):
    """dq, dk, dv of plain attention computed by autograd in the inputs' 16-bit dtype (scores, probabilities, output
    and every gradient rounded to it): flash-attn's yardstick (``attention_ref(upcast=False)`` in its tests) for what
    16-bit attention costs; ``dlse`` [B, Hq, Sq]: a gradient of the LSE output too. Rows that see no key have zero
    gradients, as in the oracle."""
    with torch.enable_grad():
        qs, ks, vs = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))  # [B, H, S, D]
        group = qs.shape[1] // ks.shape[1]
        s = torch.matmul(qs, ks.repeat_interleave(group, 1).transpose(-1, -2)) * softmax_scale
        sq, sk = s.shape[-2:]
        if causal:
            rows = torch.arange(sq, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > rows + (sk - sq), float("-inf"))
        live = torch.isfinite(s.amax(-1, keepdim=True))
        p = torch.where(live, torch.softmax(s.masked_fill(~live, 0), -1), torch.zeros_like(s))
        outs, grads = [torch.matmul(p, vs.repeat_interleave(group, 1))], [dout.transpose(1, 2)]
        if dlse is not None:
            outs.append(torch.logsumexp(s.masked_fill(~live, 0), -1))
            grads.append(torch.where(live.squeeze(-1), dlse.to(s.dtype), torch.zeros_like(outs[-1])))
        return tuple(g.transpose(1, 2) for g in torch.autograd.grad(outs, (qs, ks, vs), grads))


_low_precision_memo: dict = {}


def _compare_grad(name: str):
    """A gradient against the oracle (or a reference) by ``harness.compare_to_low_precision``: an element-wise bound
    refused 1-12 elements in a million on the H100 (2026-12-06) at the bf16 level of error overall (rel_fro
    2.35e-3), the chance tail of a sum of ~1000 rounded terms."""
    def check(got, want, cfg, inputs):
        # dq, dk and dv of one call share one low-precision backward (held with its inputs, so identity is safe).
        args = tuple(inputs[n] for n in ("q", "k", "v", "dout"))
        if not all(a is b for a, b in zip(_low_precision_memo.get("args", ()), args)) or not _low_precision_memo:
            _low_precision_memo.clear()
            grads = attention_grads_low_precision(*args, inputs["softmax_scale"], inputs["causal"])
            _low_precision_memo.update(args=args, grads=dict(zip(("dq", "dk", "dv"), grads)))
        return harness.compare_to_low_precision(name, got, want, _low_precision_memo["grads"][name], "the reference")
    return check


COMPARATORS = {name: _compare_grad(name) for name in ("dq", "dk", "dv")}


def launch(cfg: dict, data: dict) -> None:
    flash_attn_backward(data["q"], data["k"], data["v"], data["out"], data["dout"], data["lse"],
                        softmax_scale=data["softmax_scale"], causal=data["causal"],
                        deterministic=data["deterministic"], dq=data["dq"], dk=data["dk"], dv=data["dv"])


def _pairs(Sq: int, Sk: int, causal: bool) -> int:  # noqa: N803
    if not causal:
        return Sq * Sk
    return sum(max(0, min(Sk, i + 1 + Sk - Sq)) for i in range(Sq)) if Sq < 65536 else Sq * Sk // 2


def roofline(B: int, Sq: int, Sk: int, Hq: int, Hkv: int, D: int, Dv: int | None = None, causal: bool = False,
             **_) -> dict:
    """FLOPs: five GEMMs over the visible (query, key) pairs, 2 B Hq pairs (3 D + 2 Dv) (S, dQ, dK over D; dP, dV
    over Dv: 2.5x the forward's at D = Dv, as the anchors count); bytes: q, k, v, out, dout, lse read once, dq, dk, dv
    written once."""
    dv = D if Dv is None else Dv
    nbytes = 2 * B * (2 * Sq * Hq * D + 2 * Sk * Hkv * (D + dv) + 2 * Sq * Hq * dv) + 4 * B * Hq * Sq
    return {"bytes": nbytes, "flops": 2 * B * Hq * (3 * D + 2 * dv) * _pairs(Sq, Sk, causal)}


def get_baselines(**cfg) -> dict:
    """torch SDPA's backward (default, flash and cuDNN backends; the forward runs once per data set outside the
    timed call, ``retain_graph``) and FA4's ``_flash_attn_bwd`` (from out and lse as given)."""
    Sq, Sk, causal = int(cfg.get("Sq", 1)), int(cfg.get("Sk", 1)), bool(cfg.get("causal"))

    def sdpa(backend_name: str | None):
        def build():
            import torch.nn.functional as F  # noqa: N812
            from torch.nn.attention import SDPBackend, sdpa_kernel

            if causal and Sq != Sk:
                raise ImportError("SDPA's is_causal is top-left aligned; flash-attn's causal is bottom-right when "
                                  "Sq != Sk")
            backend = None if backend_name is None else getattr(SDPBackend, backend_name)
            graph = {}

            def forward(data):
                q, k, v = (data[n].detach().transpose(1, 2).requires_grad_() for n in ("q", "k", "v"))
                kw = {"is_causal": causal, "scale": data["softmax_scale"], "enable_gqa": q.shape[1] != k.shape[1]}
                with torch.enable_grad():
                    if backend is None:
                        o = F.scaled_dot_product_attention(q, k, v, **kw)
                    else:
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(q, k, v, **kw)
                return o, (q, k, v), data["dout"].transpose(1, 2)

            def fn(data):
                if graph.get("data") is not data:
                    graph.update(data=data, fwd=forward(data))
                o, leaves, g = graph["fwd"]
                dq, dk, dv = torch.autograd.grad(o, leaves, g, retain_graph=True)
                return {"dq": dq.transpose(1, 2), "dk": dk.transpose(1, 2), "dv": dv.transpose(1, 2)}
            return fn
        return build

    def fa4():
        from flash_attn.cute.interface import _flash_attn_bwd

        d = int(cfg.get("D", 128))
        dv = d if cfg.get("Dv") is None else int(cfg["Dv"])
        t = _DTYPES[cfg.get("dtype", "bfloat16")]
        hq, hkv = int(cfg.get("Hq", 1)), int(cfg.get("Hkv", 1))
        det = bool(cfg.get("deterministic"))
        try:  # FA4's sm90 backward does not take every head dim / GQA ratio (or mode): a refusal is a missing reference
            x = [torch.randn(1, 128, h, dd, dtype=t, device="cuda") for h, dd in ((hq, d), (hkv, d), (hkv, dv))]
            o = torch.randn(1, 128, hq, dv, dtype=t, device="cuda")
            _flash_attn_bwd(*x, o, torch.randn_like(o), torch.zeros(1, hq, 128, device="cuda"), 1.0 / math.sqrt(d),
                            causal, deterministic=det)
        except Exception as e:  # noqa: BLE001 -- any refusal of FA4's means "reference not available here"
            raise ImportError(f"FA4 backward does not run D={d} Dv={dv} Hq/Hkv={hq}/{hkv} {t} "
                              f"deterministic={det}: {e}") from e

        def fn(data):
            dq, dk, dv_ = _flash_attn_bwd(data["q"], data["k"], data["v"], data["out"], data["dout"], data["lse"],
                                          data["softmax_scale"], data["causal"],
                                          deterministic=data["deterministic"])[:3]
            return {"dq": dq, "dk": dk, "dv": dv_}
        return fn

    return {"torch": sdpa(None), "sdpa_flash": sdpa("FLASH_ATTENTION"), "sdpa_cudnn": sdpa("CUDNN_ATTENTION"),
            "fa4": fa4}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "flash_attn_backward"


def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def _check_inputs(q, k, v, out, dout, lse, dlse, softmax_scale, window_size, learnable_sink, softcap, dq, dk,
                  dv) -> None:
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
    if (D, Dv) not in HEAD_DIMS:
        _fail("v" if D in {d for d, _ in HEAD_DIMS} else "q", f"head dims (q/k, v) in {list(HEAD_DIMS)}",
              f"({D}, {Dv})")
    if Hkv == 0 or Hq % Hkv:
        _fail("k", f"a number of heads dividing q's {Hq} (GQA/MQA)", f"{Hkv}")
    checks.tensor(_OP, "out", out, dtypes=dtypes, shape=(B, Sq, Hq, Dv), cuda=False)
    checks.tensor(_OP, "dout", dout, dtypes=dtypes, shape=(B, Sq, Hq, Dv), inner_contiguous=False, cuda=False)
    checks.same_dtype(_OP, "q", q, out=out, dout=dout)
    checks.tensor(_OP, "lse", lse, dtypes=(torch.float32,), shape=(B, Hq, Sq), inner_contiguous=False, cuda=False)
    if dlse is not None:
        checks.tensor(_OP, "dlse", dlse, dtypes=(torch.float32,), shape=(B, Hq, Sq), inner_contiguous=False,
                      cuda=False)
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale)):
        _fail("softmax_scale", "None or a finite float", repr(softmax_scale))
    if tuple(window_size) not in ((None, None), (-1, -1)):
        raise NotImplementedError(f"{_OP}: argument 'window_size': sliding-window attention is not implemented yet "
                                  f"(got {tuple(window_size)}; only (None, None) / (-1, -1))")
    if learnable_sink is not None:
        raise NotImplementedError(f"{_OP}: argument 'learnable_sink': per-head sinks (and their gradient) are not "
                                  "implemented yet")
    if softcap:
        raise NotImplementedError(f"{_OP}: argument 'softcap': logit soft-capping is not implemented yet "
                                  f"(got {softcap})")
    for name, g, ref in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if g is not None:
            checks.tensor(_OP, name, g, shape=tuple(ref.shape), contiguous=True, cuda=False)
            checks.same_dtype(_OP, "q", q, **{name: g})
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        if any(s > _INT32_MAX for s in t.stride()):
            _fail(name, "strides below 2**31 elements", f"strides {tuple(t.stride())}")
    # The main grid is (Hkv x head splits, B, key blocks); the pre/post grids (query blocks, Hq, B).
    if Hq > 65535:
        _fail("q", "at most 65535 heads (the grid's y extent)", f"{Hq}")
    if B > 65535:
        _fail("q", "a batch of at most 65535 (the grid's y extent)", f"{B}")
    if -(-Sk // plan(D, Dv)["block_n"]) > 65535:
        _fail("k", f"at most 65535 key blocks of {plan(D, Dv)['block_n']} (the grid's z extent)", f"{Sk} keys")
    tiles = plan(D, Dv)
    widest = max(tiles["dk_width"], tiles["dv_width"])
    if B * Hq * (Sq + tiles["block_m"]) * tiles["dq_width"] > _INT32_MAX or B * Sk * Hq * widest > _INT32_MAX:
        _fail("q", "a dQ accumulator and dK / dV partials below 2**31 elements", f"shape {tuple(q.shape)}")
    checks.tensor(_OP, "q", q, cuda=True)
    checks.same_device(_OP, "q", q, k=k, v=v, out=out, dout=dout, lse=lse,
                       **{n: t for n, t in (("dlse", dlse), ("dq", dq), ("dk", dk), ("dv", dv)) if t is not None})


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """Unit stride in the head dim, 16-byte-aligned base and non-zero 16-byte-multiple strides (what TMA and the
    vector loads take); anything else (an expanded ``dout`` of stride 0 included) goes through a contiguous copy."""
    esize = t.element_size()
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
        t.stride(d) > 0 and t.stride(d) * esize % 16 == 0 for d in range(3) if t.shape[d] > 1)
    return t if ok else t.contiguous()


def head_splits(B: int, Sk: int, Hq: int, Hkv: int, block_n: int = _bwd_kernel.BLOCK_N,  # noqa: N803
                causal: bool = False, sm_count: int = 132) -> int:
    """How many CTAs share a KV group's query heads: the fewest (a divisor of the group) that give the grid two CTAs
    per SM (causal: four, the key blocks' work differs up to 2x from the mean), so that the longest-first launch order
    leaves a short tail; 1 writes dK / dV directly, more write fp32 partials (B Sk Hkv splits (D + Dv) x 4 bytes,
    written and read once) that the group reduce sums."""
    group = Hq // Hkv
    n_blocks = -(-Sk // block_n)
    target = (4 if causal else 2) * sm_count
    for s in range(1, group + 1):
        if group % s == 0 and n_blocks * Hkv * B * s >= target:
            return s
    return group


def run_kernels(call, q, k, v, out, dout, lse, dlse, softmax_scale: float, causal: bool, deterministic: bool, dq, dk,
                dv, splits: int | None = None, sm_count: int = 132) -> None:
    """The backward's launches: ``call(kernel, *args)`` runs kernel ``kernel`` ('pre', 'main', 'post', 'reduce')
    with its arguments (the op passes loaded artifacts, the emulator test its CPU module). Allocates the workspaces
    (fp32 LSE / delta / dQ accumulator, order flags, dK / dV partials) on ``q``'s device."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    tiles = plan(D, Dv)
    bm, dp = tiles["block_m"], tiles["dq_width"]
    m_blocks = -(-Sq // bm)
    sq_pad = m_blocks * bm
    f32 = {"dtype": torch.float32, "device": q.device}
    lse2 = torch.empty(B, Hq, sq_pad, **f32)
    dlt = torch.empty(B, Hq, sq_pad, **f32)
    dqacc = torch.empty(B, Hq, sq_pad * dp, **f32)
    sem = torch.empty(B, Hq, m_blocks, dtype=torch.int32, device=q.device)
    call("pre", out, dout, lse, lse if dlse is None else dlse, lse2, dlt, dqacc, sem, int(dlse is not None), bm, dp)
    splits = head_splits(B, Sk, Hq, Hkv, tiles["block_n"], causal, sm_count) if splits is None else splits
    if (Hq // Hkv) % splits:
        raise ValueError(f"flash_attention_backward: {splits} head splits do not divide the group of {Hq // Hkv}")
    shape = (B, Sk, Hkv * splits) if splits > 1 else (1, 1, 1)
    dkacc = torch.empty(*shape, tiles["dk_width"], **f32)
    dvacc = torch.empty(*shape, tiles["dv_width"], **f32)
    call("main", q, k, v, dout, lse2, dlt, dqacc, sem, dk, dv, dkacc, dvacc, float(softmax_scale), splits,
         int(deterministic))
    call("post", dqacc, dq, float(softmax_scale), bm, dp)
    if splits > 1:
        call("reduce", dkacc, dk)
        call("reduce", dvacc, dv)


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(q, k, v, out, dout, lse, dlse, softmax_scale: float, causal: bool, deterministic: bool, dq, dk, dv) -> None:
    B, Sq, Hq, D = q.shape
    Sk, Dv = k.shape[1], v.shape[3]
    if B == 0 or Hq == 0:
        return
    if Sq == 0 or Sk == 0:  # no query: no gradient reaches k, v; no key: the output is constant 0
        dq.zero_()
        dk.zero_()
        dv.zero_()
        return
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        checks.aligned(_OP, name, g, 16)
    dtype = str(q.dtype)[6:]
    dev = q.get_device()

    def call(kernel, *args):
        key = (kernel, q.dtype, D, Dv, causal, dev) if kernel == "main" else (kernel, q.dtype, dev)
        fn = _FUNCTIONS.get(key, lambda: _params(kernel, dtype, D, Dv, causal), q.device)
        fn(*args)

    run_kernels(call, _tma_ready(q), _tma_ready(k), _tma_ready(v), _tma_ready(out), _tma_ready(dout),
                _flat(lse), None if dlse is None else _flat(dlse), softmax_scale, causal, deterministic, dq, dk, dv,
                sm_count=_sm_count(dev))


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor at a 16-byte-aligned address (``lse`` / ``dlse``, read by the preprocess)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


_SM_COUNTS: dict = {}


def _sm_count(device_index: int) -> int:
    if device_index not in _SM_COUNTS:
        _SM_COUNTS[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return _SM_COUNTS[device_index]


def _new_grads(q, k, v):
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)


def flash_attn_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                        lse: torch.Tensor, softmax_scale: float | None = None, causal: bool = False,
                        window_size=(None, None), softcap: float = 0.0, learnable_sink: torch.Tensor | None = None,
                        deterministic: bool = False, dlse: torch.Tensor | None = None, dq: torch.Tensor | None = None,
                        dk: torch.Tensor | None = None,
                        dv: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of attention (FA4's ``_flash_attn_bwd`` argument order and conventions): q, k, v as
    ``flash_attn_func`` takes them, ``out`` and ``lse`` [B, Hq, Sq] (fp32, natural log) as it returned them, ``dout``
    the gradient of ``out``, ``dlse`` (optional) that of ``lse``. ``causal`` bottom-right aligned. ``deterministic``
    orders the fp32 dQ accumulation (bit-identical results run to run; costs some speed). Written into ``dq``,
    ``dk``, ``dv`` (contiguous) when given. Sliding window, softcap and learnable sink raise NotImplementedError."""
    _check_inputs(q, k, v, out, dout, lse, dlse, softmax_scale, window_size, learnable_sink, softcap, dq, dk, dv)
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
    causal, deterministic = bool(causal), bool(deterministic)
    given = (dq, dk, dv)
    if runtime.direct_call(q, k, v, out, dout, lse, dlse, dq, dk, dv):
        dst = tuple(g if g is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
                    for g, x in zip(given, (q, k, v)))
        _run(q, k, v, out, dout, lse, dlse, scale, causal, deterministic, *dst)
        for g in given:
            if g is not None:
                runtime.mark_written(g)
        return dst
    if all(g is None for g in given):
        return tuple(torch.ops.tirx.flash_attention_backward(q, k, v, out, dout, lse, dlse, scale, causal,
                                                             deterministic))
    fresh = _new_grads(q, k, v)
    dst = tuple(g if g is not None else f for g, f in zip(given, fresh))
    torch.ops.tirx.flash_attention_backward_out(q, k, v, out, dout, lse, dlse, scale, causal, deterministic, *dst)
    return dst


@torch.library.custom_op("tirx::flash_attention_backward", mutates_args=())
def _backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                 lse: torch.Tensor, dlse: torch.Tensor | None, softmax_scale: float, causal: bool,
                 deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _new_grads(q, k, v)
    _run(q, k, v, out, dout, lse, dlse, softmax_scale, causal, deterministic, dq, dk, dv)
    return dq, dk, dv


@_backward_op.register_fake
def _(q, k, v, out, dout, lse, dlse, softmax_scale, causal, deterministic):
    return _new_grads(q, k, v)


@torch.library.custom_op("tirx::flash_attention_backward_out", mutates_args=("dq", "dk", "dv"))
def _backward_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                     lse: torch.Tensor, dlse: torch.Tensor | None, softmax_scale: float, causal: bool,
                     deterministic: bool, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
    _run(q, k, v, out, dout, lse, dlse, softmax_scale, causal, deterministic, dq, dk, dv)


@_backward_out_op.register_fake
def _(q, k, v, out, dout, lse, dlse, softmax_scale, causal, deterministic, dq, dk, dv):
    return None


# ---------------------------------------------------------------------------------------------------------
# Autograd of the forward op (tirx::flash_attention4): flash_attn_func(..., requires_grad inputs) trains
# ---------------------------------------------------------------------------------------------------------

def _forward_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale, ctx.causal = softmax_scale, causal


def _forward_backward(ctx, dout, dlse):
    """The forward's backward: this op on the saved q, k, v, out, lse; deterministic where torch asks for it
    (``torch.use_deterministic_algorithms``)."""
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.tirx.flash_attention_backward(q, k, v, out, dout, lse, dlse, ctx.softmax_scale,
                                                         ctx.causal, torch.are_deterministic_algorithms_enabled())
    return dq, dk, dv, None, None


torch.library.register_autograd("tirx::flash_attention4", _forward_backward, setup_context=_forward_setup_context)

run_test, run_bench = harness.bind(__name__)
