# SPDX-License-Identifier: Apache-2.0
# Port of flash-attention's varlen attention forward (flash_attn_varlen_func; the FlashAttention-3 design, arXiv
# 2407.08608, and FA4's interface, flash_attn/cute/interface.py) from https://github.com/Dao-AILab/flash-attention at
# commit 0251105a2fb19d2957484b7f023cd8c115286ced: read, not copied. The kernel is _fwd_kernel.build_varlen_kernel.
"""flash-attn's ``flash_attn_varlen_func`` forward for Hopper: sequences of any lengths packed along the first
dimension (THD), bf16/fp16, the head dims of ``flash_attention4``, causal (bottom-right aligned per sequence) or not,
MHA/GQA/MQA, optional ``seqused_k``; returns (out [total_q, Hq, Dv], lse [Hq, total_q] fp32, natural log) as FA4
does. One artifact per (dtype, head dims, causal, schedule): the batch, the lengths and the strides are run-time
arguments, so every batch of sequences runs on it."""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.flashattention import _fwd_kernel
from tirx_kernels.ported.flashattention import flash_attention4 as fa

KERNEL_META = {
    "name": "flash_attention4_varlen",
    "category": "ported.flashattention",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Varlen (packed THD) attention forward, FA3 design, bf16/fp16, causal per sequence, GQA, "
                   "seqused_k, returns LSE",
    "upstream": {
        "project": "flash-attention",
        "url": "https://github.com/Dao-AILab/flash-attention",
        "commit": "0251105a2fb19d2957484b7f023cd8c115286ced",
    },
    "reference_requirements": [
        {"package": "flash-attn-4", "import": "flash_attn.cute", "specifier": "==4.0.0b36", "baseline": "fa4"},
    ],
    "public_ops": ["flash_attn_varlen_func"],
}

# Correctness rows (GPU tests): the ragged lengths (1, 17, 127, 8193), empty sequences (queries, keys or
# both), Sq != Sk per sequence both ways, GQA/MQA, seqused_k, every head-dim pair.
CONFIGS = [
    {"label": "bf16_ragged_h4kv2_d128_causal", "seqlens_q": [1, 17, 0, 127, 1000], "seqlens_k": [1, 17, 0, 127, 1000],
     "Hq": 4, "Hkv": 2, "D": 128, "causal": True},
    {"label": "bf16_ragged_h4kv2_d128", "seqlens_q": [300, 1, 0, 77, 5], "seqlens_k": [500, 130, 9, 0, 5],
     "Hq": 4, "Hkv": 2, "D": 128},
    {"label": "bf16_ragged_h4kv2_d128_causal_sq_ne_sk", "seqlens_q": [300, 1, 200, 77], "seqlens_k": [500, 130, 9, 0],
     "Hq": 4, "Hkv": 2, "D": 128, "causal": True},
    {"label": "bf16_seqused_h8kv1_d128_causal", "seqlens_q": [100, 50, 1], "seqlens_k": [400, 300, 64],
     "seqused_k": [350, 0, 64], "Hq": 8, "Hkv": 1, "D": 128, "causal": True},
    {"label": "fp16_ragged_h16kv1_d64_causal", "dtype": "float16", "seqlens_q": [129, 257, 3],
     "seqlens_k": [300, 257, 3], "Hq": 16, "Hkv": 1, "D": 64, "causal": True},
    {"label": "bf16_long_h2_d128_causal", "seqlens_q": [8193, 1, 4096], "seqlens_k": [8193, 1, 4096], "Hq": 2,
     "Hkv": 2, "D": 128, "causal": True},
    {"label": "bf16_ragged_h4_d96_causal", "seqlens_q": [333, 0, 65], "seqlens_k": [333, 7, 65], "Hq": 4, "Hkv": 4,
     "D": 96, "causal": True},
    {"label": "bf16_ragged_h4kv1_d192_dv128", "seqlens_q": [333, 17], "seqlens_k": [200, 333], "Hq": 4, "Hkv": 1,
     "D": 192, "Dv": 128},
    {"label": "fp16_ragged_h4_d256_causal", "dtype": "float16", "seqlens_q": [200, 1000], "seqlens_k": [200, 1000],
     "Hq": 4, "Hkv": 4, "D": 256, "causal": True},
    {"label": "bf16_ragged_h4kv2_d128_causal_plain", "seqlens_q": [1, 17, 0, 127, 1000],
     "seqlens_k": [1, 17, 0, 127, 1000], "Hq": 4, "Hkv": 2, "D": 128, "causal": True, "schedule": "plain"},
]

# A packed prefill batch: 16 sequences, 32768 tokens (a chat/prefill mix of lengths, fixed so rows are comparable).
BENCH_CONFIGS = [
    {"label": "bf16_mix16_t32768_h16_d128_causal", "Hq": 16, "Hkv": 16, "D": 128, "causal": True,
     "seqlens_q": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896],
     "seqlens_k": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896]},
    {"label": "bf16_mix16_t32768_h16_d128", "Hq": 16, "Hkv": 16, "D": 128, "causal": False,
     "seqlens_q": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896],
     "seqlens_k": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896]},
    {"label": "bf16_mix16_t32768_h32kv8_d128_causal", "Hq": 32, "Hkv": 8, "D": 128, "causal": True,
     "seqlens_q": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896],
     "seqlens_k": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896]},
    {"label": "bf16_mix16_t32768_h16_d64_causal", "Hq": 16, "Hkv": 16, "D": 64, "causal": True,
     "seqlens_q": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896],
     "seqlens_k": [4096, 512, 2048, 1024, 8192, 256, 3072, 1536,
                   2560, 768, 4096, 128, 1024, 2048, 512, 896]},
]

DEFAULTS = {"dtype": "bfloat16", "Dv": None, "causal": False, "schedule": None, "seqused_k": None}
TOLERANCE = fa.TOLERANCE
COMPARATORS = fa.COMPARATORS
SCHEDULE = fa.SCHEDULE
_DTYPES = fa._DTYPES
_INT32_MAX = 2**31 - 1


def compile_params(**cfg) -> dict:
    """What changes the code: dtype, head dims, causal, schedule. The batch, lengths and strides are run time."""
    return fa.compile_params(**cfg)


def get_kernel(dtype: str, head_dim: int, head_dim_v: int, causal: bool, schedule: str = SCHEDULE):
    if (head_dim, head_dim_v) not in fa.BLOCK_N:
        raise ValueError(f"flash_attention4_varlen: head dims ({head_dim}, {head_dim_v}) not one of "
                         f"{sorted(fa.BLOCK_N)}")
    return _fwd_kernel.build_varlen_kernel(dtype, head_dim, head_dim_v, causal, fa.BLOCK_N[(head_dim, head_dim_v)],
                                           fa.NUM_STAGES, schedule)


def artifact_params() -> list[dict]:
    return fa.artifact_params()


def call_samples(rng) -> list[dict]:
    """Every dtype, supported head-dim pair and mask, with random batches of ragged (and empty) sequences."""
    out = []
    for t in _DTYPES:
        for (d, dv) in fa.BLOCK_N:
            for c in (False, True):
                b = rng.randint(1, 6)
                hkv = rng.choice([1, 2, 8])
                out.append({"dtype": t, "seqlens_q": [rng.choice([0, 1, 17, 127, 8193]) for _ in range(b)],
                            "seqlens_k": [rng.choice([0, 1, 17, 127, 8193]) for _ in range(b)],
                            "Hq": hkv * rng.choice([1, 2, 16]), "Hkv": hkv, "D": d, "Dv": dv, "causal": c})
    return out


def sass_expect(**params) -> list[str]:
    """As ``flash_attention4``, with 3-D TMA loads (packed rows)."""
    return [p.replace("UTMALDG\\.4D", "UTMALDG\\.3D") for p in fa.sass_expect(**params)]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def _cu(lengths, device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
    return torch.tensor(cu, dtype=torch.int32, device=device)


def prepare_data(dtype: str, seqlens_q: list, seqlens_k: list, Hq: int, Hkv: int, D: int,  # noqa: N803
                 Dv: int | None = None, causal: bool = False, schedule: str | None = None,
                 seqused_k: list | None = None, poison_unused: bool = False, device: str = "cuda") -> dict:
    """Fresh random packed q, k, v, their cu_seqlens (and seqused_k), poisoned out / lse. ``poison_unused``: the
    keys past each sequence's ``seqused_k`` hold NaN (memory the caller never wrote; the kernel must not let it in)."""
    dv = D if Dv is None else Dv
    t = _DTYPES[dtype]
    tq, tk = sum(seqlens_q), sum(seqlens_k)
    data = {"q": torch.randn(tq, Hq, D, dtype=t, device=device), "k": torch.randn(tk, Hkv, D, dtype=t, device=device),
            "v": torch.randn(tk, Hkv, dv, dtype=t, device=device), "cu_seqlens_q": _cu(seqlens_q, device),
            "cu_seqlens_k": _cu(seqlens_k, device),
            "out": torch.full((tq, Hq, dv), float("nan"), dtype=t, device=device),
            "lse": torch.full((Hq, tq), float("nan"), dtype=torch.float32, device=device),
            "max_seqlen_q": max(seqlens_q, default=0), "max_seqlen_k": max(seqlens_k, default=0),
            "softmax_scale": 1.0 / math.sqrt(D), "causal": causal}
    if seqused_k is not None:
        data["seqused_k"] = torch.tensor(seqused_k, dtype=torch.int32, device=device)
        if poison_unused:
            start = 0
            for n, u in zip(seqlens_k, seqused_k):
                data["k"][start + u:start + n] = float("nan")
                data["v"][start + u:start + n] = float("nan")
                start += n
    return data


def _sequences(cu_seqlens_q, cu_seqlens_k, seqused_k):
    """(query start, query count, key start, key count) of every sequence, read on the host."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    return [(cq[b], cq[b + 1] - cq[b], ck[b], ck[b + 1] - ck[b] if used is None else used[b])
            for b in range(len(cq) - 1)]


def attention_varlen_fp32(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale: float, causal: bool,
                          seqused_k=None):
    """The fp32 oracle per sequence (``flash_attention4.attention_fp32``'s conventions): out [total_q, Hq, Dv] and
    lse [Hq, total_q]; a sequence with no key gives out 0 and lse -inf."""
    tq, hq = q.shape[0], q.shape[1]
    out = torch.zeros(tq, hq, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((hq, tq), float("-inf"), dtype=torch.float32, device=q.device)
    for qs, nq, ks, nk in _sequences(cu_seqlens_q, cu_seqlens_k, seqused_k):
        if nq == 0 or nk == 0:
            continue
        o, s = fa.attention_fp32(q[None, qs:qs + nq], k[None, ks:ks + nk], v[None, ks:ks + nk], softmax_scale, causal)
        out[qs:qs + nq] = o[0]
        lse[:, qs:qs + nq] = s[0]
    return out, lse


def reference(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, seqused_k=None, **_) -> dict:
    out, lse = attention_varlen_fp32(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, seqused_k)
    return {"out": out, "lse": lse}


def launch(cfg: dict, data: dict) -> None:
    """The public op; a row naming another schedule than the default runs that kernel variant behind the same
    checks."""
    args = (data["q"], data["k"], data["v"], data["cu_seqlens_q"], data["cu_seqlens_k"])
    kw = {"max_seqlen_q": data["max_seqlen_q"], "seqused_k": data.get("seqused_k"),
          "softmax_scale": data["softmax_scale"], "causal": data["causal"]}
    schedule = cfg.get("schedule") or SCHEDULE
    if schedule == SCHEDULE:
        flash_attn_varlen_func(*args, max_seqlen_k=data["max_seqlen_k"], **kw, out=(data["out"], data["lse"]))
        return
    _check_inputs(*args, data.get("seqused_k"), (None, None), None, 0.0, 1, (data["out"], data["lse"]))
    _run(*args, out=data["out"], lse=data["lse"], schedule=schedule, **kw)


def roofline(seqlens_q: list, seqlens_k: list, Hq: int, Hkv: int, D: int, Dv: int | None = None,  # noqa: N803
             causal: bool = False, seqused_k: list | None = None, **_) -> dict:
    """``flash_attention4.roofline`` summed over the sequences (keys: seqused_k where given)."""
    used = seqlens_k if seqused_k is None else seqused_k
    flops = nbytes = 0
    for sq, uk in zip(seqlens_q, used):
        m = fa.roofline(B=1, Sq=sq, Sk=uk, Hq=Hq, Hkv=Hkv, D=D, Dv=Dv, causal=causal)
        flops += m["flops"]
        nbytes += m["bytes"]
    return {"bytes": max(nbytes, 1), "flops": flops}


def get_baselines(**cfg) -> dict:
    def sdpa():
        import torch.nn.functional as F  # noqa: N812

        # One SDPA call per sequence with an explicit bottom-right mask: a correctness reference, not a timing one.
        def fn(data):
            q, k, v = data["q"], data["k"], data["v"]
            out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
            for qs, nq, ks, nk in _sequences(data["cu_seqlens_q"], data["cu_seqlens_k"], data.get("seqused_k")):
                if nq == 0 or nk == 0:
                    continue
                qq, kk, vv = (x[s:s + n].transpose(0, 1)[None] for x, s, n in ((q, qs, nq), (k, ks, nk), (v, ks, nk)))
                mask = None
                if data["causal"]:
                    mask = torch.arange(nk, device=q.device)[None, :] <= torch.arange(nq, device=q.device)[:, None] \
                        + (nk - nq)
                    if not mask.any(-1).all():
                        return {}  # SDPA gives NaN for a row that sees no key: no reference for this config
                o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=data["softmax_scale"],
                                                   enable_gqa=qq.shape[1] != kk.shape[1])
                out[qs:qs + nq] = o[0].transpose(0, 1)
            return {"out": out}
        return fn

    def fa4():
        from flash_attn.cute import flash_attn_varlen_func as fa4_varlen

        d = int(cfg.get("D", 128))
        dv = d if cfg.get("Dv") is None else int(cfg["Dv"])
        t = _DTYPES[cfg.get("dtype", "bfloat16")]
        hq, hkv = int(cfg.get("Hq", 1)), int(cfg.get("Hkv", 1))
        cu = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
        try:
            fa4_varlen(*(torch.randn(8, h, dd, dtype=t, device="cuda") for h, dd in ((hq, d), (hkv, d), (hkv, dv))),
                       cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=8, max_seqlen_k=8,
                       causal=bool(cfg.get("causal")))
        except Exception as e:  # noqa: BLE001 -- any refusal of FA4's means "reference not available here"
            raise ImportError(f"FA4 varlen does not run D={d} Dv={dv} Hq/Hkv={hq}/{hkv} {t}: {e}") from e

        def fn(data):
            o, lse = fa4_varlen(data["q"], data["k"], data["v"], cu_seqlens_q=data["cu_seqlens_q"],
                                cu_seqlens_k=data["cu_seqlens_k"], max_seqlen_q=data["max_seqlen_q"],
                                max_seqlen_k=data["max_seqlen_k"], seqused_k=data.get("seqused_k"),
                                softmax_scale=data["softmax_scale"], causal=data["causal"], return_lse=True)
            return {"out": o, "lse": lse}
        return fn

    return {"torch": sdpa, "fa4": fa4}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "flash_attn_varlen_func"


def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, window_size, learnable_sink, softcap, num_splits,
                  out, seqused_q=None, max_seqlen_q=None, softmax_scale=None) -> None:
    """Shapes, dtypes and the arguments this version does not implement; the device last (a CPU machine exercises
    the rest)."""
    dtypes = tuple(_DTYPES.values())
    checks.tensor(_OP, "q", q, dtypes=dtypes, ndim=3, cuda=False)
    tq, hq, d = q.shape
    checks.tensor(_OP, "k", k, dtypes=dtypes, ndim=3, cuda=False)
    checks.tensor(_OP, "v", v, dtypes=dtypes, ndim=3, cuda=False)
    checks.same_dtype(_OP, "q", q, k=k, v=v)
    tk, hkv = k.shape[0], k.shape[1]
    checks.tensor(_OP, "k", k, shape=(None, None, d), cuda=False)
    checks.tensor(_OP, "v", v, shape=(tk, hkv, None), cuda=False)
    dv = v.shape[2]
    if (d, dv) not in fa.BLOCK_N:
        _fail("v" if d in {a for a, _ in fa.BLOCK_N} else "q", f"head dims (q/k, v) in {sorted(fa.BLOCK_N)}",
              f"({d}, {dv})")
    if hkv == 0 or hq % hkv:
        _fail("k", f"a number of heads dividing q's {hq} (GQA/MQA)", f"{hkv}")
    checks.tensor(_OP, "cu_seqlens_q", cu_seqlens_q, dtypes=(torch.int32,), ndim=1, contiguous=True, cuda=False)
    nb = cu_seqlens_q.shape[0] - 1
    if nb < 0:
        _fail("cu_seqlens_q", "shape (batch + 1,)", "shape (0,)")
    checks.tensor(_OP, "cu_seqlens_k", cu_seqlens_k, dtypes=(torch.int32,), shape=(nb + 1,), contiguous=True,
                  cuda=False)
    if seqused_k is not None:
        checks.tensor(_OP, "seqused_k", seqused_k, dtypes=(torch.int32,), shape=(nb,), contiguous=True, cuda=False)
    if seqused_q is not None:
        raise NotImplementedError(f"{_OP}: argument 'seqused_q': per-sequence query counts are not implemented yet")
    if max_seqlen_q is not None and not (isinstance(max_seqlen_q, int) and 0 <= max_seqlen_q <= _INT32_MAX):
        _fail("max_seqlen_q", "None or an int in [0, 2**31)", repr(max_seqlen_q))
    fa._check_options(_OP, window_size, learnable_sink, softcap, num_splits)
    fa.check_scale(_OP, softmax_scale)
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("out", "a tuple (out, lse)", type(out).__name__)
        checks.tensor(_OP, "out[0]", out[0], shape=(tq, hq, dv), contiguous=True, cuda=False)
        checks.same_dtype(_OP, "q", q, **{"out[0]": out[0]})
        checks.tensor(_OP, "out[1]", out[1], dtypes=(torch.float32,), shape=(hq, tq), contiguous=True, cuda=False)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if any(s > _INT32_MAX for s in t.stride()):
            _fail(name, "strides below 2**31 elements", f"strides {tuple(t.stride())}")
    # The grid is (query tiles, Hq, batch): CUDA's y and z extents stop at 65535.
    if hq > 65535:
        _fail("q", "at most 65535 heads (the grid's y extent)", f"{hq}")
    if nb > 65535:
        _fail("cu_seqlens_q", "a batch of at most 65535 (the grid's z extent)", f"{nb}")
    if tq * hq * dv > _INT32_MAX:
        _fail("q", f"an output below 2**31 elements (total_q * Hq * Dv = {tq * hq * dv})", f"shape {tuple(q.shape)}")
    checks.tensor(_OP, "q", q, cuda=True)
    others = {"k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}
    if seqused_k is not None:
        others["seqused_k"] = seqused_k
    if out is not None:
        others.update({"out[0]": out[0], "out[1]": out[1]})
    checks.same_device(_OP, "q", q, **others)


_FUNCTIONS = runtime.FunctionCache(__name__)
_NO_SEQUSED: dict = {}  # device -> a 1-element int32 tensor standing in for seqused_k (kept: graph-safe)


def _no_seqused(device) -> torch.Tensor:
    t = _NO_SEQUSED.get(device)
    if t is None:
        t = _NO_SEQUSED[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return t


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, softmax_scale: float, causal: bool, out, lse,
         schedule: str = SCHEDULE) -> None:
    tq, hq, d = q.shape
    dv = v.shape[2]
    nb = cu_seqlens_q.shape[0] - 1
    if nb <= 0 or tq == 0 or hq == 0:
        return
    if k.shape[0] == 0:  # no key at all: flash-attn's empty-row convention, no launch (a TMA map cannot have extent 0)
        out.zero_()
        lse.fill_(float("-inf"))
        return
    if max_seqlen_q is None:  # what the grid needs; flash-attn asks the caller for it (this costs a host sync)
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
    if max_seqlen_q == 0:
        return
    checks.aligned(_OP, "out[0]", out, 16)
    fa.check_lse_base(_OP, lse)
    fn = _FUNCTIONS.get((q.dtype, d, dv, causal, schedule, q.get_device()),
                        lambda: compile_params(dtype=str(q.dtype)[6:], D=d, Dv=dv, causal=causal, schedule=schedule),
                        q.device)
    used = _no_seqused(q.device) if seqused_k is None else seqused_k
    fn(fa._tma_ready(q), fa._tma_ready(k), fa._tma_ready(v), cu_seqlens_q, cu_seqlens_k, used, out, lse,
       int(max_seqlen_q), int(seqused_k is not None), float(softmax_scale))


def _new_out(q, v):
    return (torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype, device=q.device),
            torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device))


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                           seqused_q: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
                           softmax_scale: float | None = None, causal: bool = False, window_size=(None, None),
                           learnable_sink: torch.Tensor | None = None, softcap: float = 0.0, num_splits: int = 1,
                           pack_gqa: bool | None = None, deterministic: bool = False, return_lse: bool = True,
                           out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention forward with flash-attn's conventions (FA3's positional order, FA4's keywords): q
    [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] bf16/fp16, unit stride in the head dim, Hq a multiple
    of Hkv, (D, Dv) as ``flash_attn_func``; ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 [B + 1] (sequence b: rows
    cu[b] .. cu[b + 1] - 1; empty sequences allowed); ``seqused_k`` int32 [B] (keys of sequence b:
    cu_seqlens_k[b] .. + seqused_k[b] - 1). ``max_seqlen_q`` (at least the longest query sequence) sizes the grid; left
    None it is read from ``cu_seqlens_q`` (a host sync); ``max_seqlen_k`` is not needed. ``causal`` masks bottom-right
    aligned in each sequence. Returns (out [total_q, Hq, Dv], lse [Hq, total_q] fp32, natural log; -inf and out 0 for a
    row that sees no key), written into ``out`` = (out, lse) when given (contiguous); the LSE is always computed
    (``return_lse`` changes nothing). ``seqused_q``, sliding window, softcap, learnable sink and split-KV raise
    NotImplementedError."""
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, window_size, learnable_sink, softcap, num_splits,
                  out, seqused_q, max_seqlen_q, softmax_scale)
    scale = 1.0 / math.sqrt(q.shape[2]) if softmax_scale is None else float(softmax_scale)
    causal = bool(causal)
    if runtime.direct_call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, *(out or ())):
        dst = out if out is not None else _new_out(q, v)
        _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, scale, causal, dst[0], dst[1])
        if out is not None:
            runtime.mark_written(out[0])
            runtime.mark_written(out[1])
        return tuple(dst)
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item()) if cu_seqlens_q.shape[0] > 1 else 0
    if out is None:
        return tuple(torch.ops.tirx.flash_attention4_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                            max_seqlen_q, scale, causal))
    torch.ops.tirx.flash_attention4_varlen_out(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, scale,
                                               causal, out[0], out[1])
    return tuple(out)


@torch.library.custom_op("tirx::flash_attention4_varlen", mutates_args=())
def _varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, seqused_k: torch.Tensor | None, max_seqlen_q: int, softmax_scale: float,
               causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _new_out(q, v)
    _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, softmax_scale, causal, o, lse)
    return o, lse


@_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, softmax_scale, causal):
    return _new_out(q, v)


@torch.library.custom_op("tirx::flash_attention4_varlen_out", mutates_args=("out", "lse"))
def _varlen_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, seqused_k: torch.Tensor | None, max_seqlen_q: int,
                   softmax_scale: float, causal: bool, out: torch.Tensor, lse: torch.Tensor) -> None:
    _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, softmax_scale, causal, out, lse)


@_varlen_out_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, softmax_scale, causal, out, lse):
    return None


run_test, run_bench = harness.bind(__name__)
