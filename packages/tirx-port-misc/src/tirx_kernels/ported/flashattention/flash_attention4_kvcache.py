# SPDX-License-Identifier: Apache-2.0
# Port of flash-attention's KV-cache attention forward (flash_attn_with_kvcache: paged KV, GQA packing, split-KV and
# its combine; the FlashAttention-3 design, arXiv 2407.08608, hopper/flash_attn_interface.py and
# flash_attn/flash_attn_interface.py for the argument conventions) from https://github.com/Dao-AILab/flash-attention at
# commit 0251105a2fb19d2957484b7f023cd8c115286ced: read, not copied. The kernels are in _fwd_decode.py.
"""flash-attn's ``flash_attn_with_kvcache`` forward for Hopper: queries (decode-sized, 1-4 a sequence, or more)
against a KV cache, paged (``block_table`` / ``page_table`` int32 [B, max_pages], pages of >= 16 rows in any order)
or contiguous ([B_cache, S_cache, Hkv, D], optionally through ``cache_batch_idx``), ``cache_seqlens`` per sequence,
causal (bottom-right) or not, MHA/GQA/MQA with the query heads of a KV head packed into the M tile, split-KV with a
combine kernel when few CTAs would cover a long cache. Returns out [B, Sq, Hq, Dv] (and lse [B, Hq, Sq] fp32 with
``return_softmax_lse``). One decode artifact per (dtype, head dims) and one combine artifact per dtype serve every
batch, length, page size, split count and mask."""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.flashattention import _fwd_decode
from tirx_kernels.ported.flashattention import flash_attention4 as fa
from tirx_kernels.ported.flashattention._fwd_mainloop import padded

KERNEL_META = {
    "name": "flash_attention4_kvcache",
    "category": "ported.flashattention",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "KV-cache attention forward (paged or contiguous cache, GQA packed into the M tile, split-KV + "
                   "combine), bf16/fp16, returns LSE",
    "upstream": {
        "project": "flash-attention",
        "url": "https://github.com/Dao-AILab/flash-attention",
        "commit": "0251105a2fb19d2957484b7f023cd8c115286ced",
    },
    "reference_requirements": [
        {"package": "flash-attn-4", "import": "flash_attn.cute", "specifier": "==4.0.0b36", "baseline": "fa4"},
    ],
    "public_ops": ["flash_attn_with_kvcache"],
}

# Correctness rows (GPU tests): decode (1-4 queries) and a longer query block, pages of 16 .. 256 rows out of order,
# contiguous caches (with and without cache_batch_idx), GQA 1..16, empty caches, forced split counts, every head dim.
CONFIGS = [
    {"label": "bf16_b4_q1_h32kv8_d128_p64", "B": 4, "Sq": 1, "Hq": 32, "Hkv": 8, "D": 128,
     "seqlens_k": [1000, 1, 0, 8193], "page_size": 64},
    {"label": "bf16_b3_q4_h16kv1_d128_p16_causal", "B": 3, "Sq": 4, "Hq": 16, "Hkv": 1, "D": 128,
     "seqlens_k": [17, 4, 3000], "page_size": 16, "causal": True},
    {"label": "bf16_b2_q2_h8kv2_d128_p256_split7", "B": 2, "Sq": 2, "Hq": 8, "Hkv": 2, "D": 128,
     "seqlens_k": [5000, 300], "page_size": 256, "num_splits": 7, "causal": True},
    {"label": "fp16_b5_q1_h4_d64_contig", "dtype": "float16", "B": 5, "Sq": 1, "Hq": 4, "Hkv": 4, "D": 64,
     "seqlens_k": [127, 1, 2049, 0, 64]},
    {"label": "bf16_b3_q3_h12kv4_d128_contig_batch_idx_causal", "B": 3, "Sq": 3, "Hq": 12, "Hkv": 4, "D": 128,
     "seqlens_k": [700, 2, 129], "cache_batch_idx": True, "causal": True},
    {"label": "bf16_b2_q17_h8kv1_d128_p32_causal", "B": 2, "Sq": 17, "Hq": 8, "Hkv": 1, "D": 128,
     "seqlens_k": [1000, 40], "page_size": 32, "causal": True},
    {"label": "bf16_b2_q1_h16kv2_d256_p64", "B": 2, "Sq": 1, "Hq": 16, "Hkv": 2, "D": 256,
     "seqlens_k": [3000, 77], "page_size": 64},
    {"label": "bf16_b2_q2_h8kv2_d192_dv128_p16_causal", "B": 2, "Sq": 2, "Hq": 8, "Hkv": 2, "D": 192, "Dv": 128,
     "seqlens_k": [513, 2000], "page_size": 16, "causal": True},
    {"label": "fp16_b2_q4_h6kv3_d96_p48", "dtype": "float16", "B": 2, "Sq": 4, "Hq": 6, "Hkv": 3, "D": 96,
     "seqlens_k": [999, 48], "page_size": 48},
    {"label": "bf16_b1_q1_h64kv1_d64_p128", "B": 1, "Sq": 1, "Hq": 64, "Hkv": 1, "D": 64,
     "seqlens_k": [20000], "page_size": 128},
]

# Decode rows judged by KV bytes/s against the copy bandwidth (ANCHORS.md): paged (page 64), 1-4 queries, KV 8192 ..
# 65536 tokens a sequence, GQA 32:8 (Llama-class); few sequences and long caches need split-KV.
BENCH_CONFIGS = [
    {"label": "bf16_b8_q1_h32kv8_d128_p64_kv8192", "B": 8, "Sq": 1, "Hq": 32, "Hkv": 8, "D": 128,
     "Sk": 8192, "page_size": 64},
    {"label": "bf16_b8_q4_h32kv8_d128_p64_kv8192_causal", "B": 8, "Sq": 4, "Hq": 32, "Hkv": 8, "D": 128,
     "Sk": 8192, "page_size": 64, "causal": True},
    {"label": "bf16_b2_q1_h32kv8_d128_p64_kv32768", "B": 2, "Sq": 1, "Hq": 32, "Hkv": 8, "D": 128,
     "Sk": 32768, "page_size": 64},
    {"label": "bf16_b1_q1_h32kv8_d128_p64_kv65536", "B": 1, "Sq": 1, "Hq": 32, "Hkv": 8, "D": 128,
     "seqlens_k": [65536], "page_size": 64},
    {"label": "bf16_b32_q1_h32kv8_d128_p64_kv8192", "B": 32, "Sq": 1, "Hq": 32, "Hkv": 8, "D": 128,
     "Sk": 8192, "page_size": 64},
    {"label": "bf16_b8_q2_h64kv4_d128_p16_kv16384", "B": 8, "Sq": 2, "Hq": 64, "Hkv": 4, "D": 128,
     "Sk": 16384, "page_size": 16},
]

DEFAULTS = {"dtype": "bfloat16", "Dv": None, "causal": False, "page_size": None, "num_splits": None,
            "cache_batch_idx": False, "seqlens_k": None, "Sk": None}
TOLERANCE = fa.TOLERANCE
COMPARATORS = fa.COMPARATORS
_DTYPES = fa._DTYPES
_INT32_MAX = 2**31 - 1
# (head_dim, head_dim_v) -> (block_n, stages, CTAs an SM): two CTAs an SM (113 KB of smem each; 64 packed query
# rows), 3 stages of 32 KB of K + V where they fit (the decode bound is HBM: bytes in flight); head dim 256 needs more
# than the 128 registers a thread of two CTAs (_fwd_decode): one CTA, three 64 KB stages.
DECODE_TILES = {(64, 64): (128, 3, 2), (96, 96): (64, 3, 2), (128, 128): (64, 3, 2), (192, 192): (32, 3, 2),
                (192, 128): (64, 2, 2), (256, 256): (64, 3, 1)}
MIN_PAGE = 16  # rows of one TMA box at least (a box never crosses a page)
MAX_SPLITS = 128


def compile_params(kernel: str = "decode", **cfg) -> dict:
    """The decode kernel: dtype, head dims (the batch, lengths, page size, split count and mask are run time); the
    combine kernel: dtype."""
    dtype = cfg.get("dtype", "bfloat16")
    if kernel == "combine":
        return {"kernel": "combine", "dtype": dtype}
    d = int(cfg["D"])
    return {"kernel": "decode", "dtype": dtype, "head_dim": d, "head_dim_v": d if cfg.get("Dv") is None
            else int(cfg["Dv"])}


def get_kernel(kernel: str, dtype: str, head_dim: int | None = None, head_dim_v: int | None = None):
    if kernel == "combine":
        return _fwd_decode.build_combine_kernel(dtype)
    if (head_dim, head_dim_v) not in DECODE_TILES:
        raise ValueError(f"flash_attention4_kvcache: head dims ({head_dim}, {head_dim_v}) not one of "
                         f"{sorted(DECODE_TILES)}")
    return _fwd_decode.build_decode_kernel(dtype, head_dim, head_dim_v, *DECODE_TILES[(head_dim, head_dim_v)])


def artifact_params() -> list[dict]:
    return [compile_params(dtype=t, D=d, Dv=dv) for t in _DTYPES for (d, dv) in DECODE_TILES] + \
        [compile_params("combine", dtype=t) for t in _DTYPES]


def call_samples(rng) -> list[dict]:
    """Every dtype and head-dim pair; decode and longer query blocks, paged (pages 16 .. 256) or contiguous, random
    GQA ratios, lengths and split counts."""
    out = []
    for t in _DTYPES:
        for (d, dv) in [*DECODE_TILES, *DECODE_TILES]:
            b = rng.randint(1, 6)
            hkv = rng.choice([1, 2, 8])
            out.append({"dtype": t, "B": b, "Sq": rng.choice([1, 2, 3, 4, 17, 300]), "Hq": hkv * rng.choice([1, 4, 16]),
                        "Hkv": hkv, "D": d, "Dv": dv, "seqlens_k": [rng.choice([0, 1, 17, 8193]) for _ in range(b)],
                        "page_size": rng.choice([None, 16, 64, 256]), "causal": rng.choice([False, True]),
                        "num_splits": rng.choice([None, 1, 5])})
    return out


def sass_expect(kernel: str, head_dim: int | None = None, head_dim_v: int | None = None, **_) -> list[str]:
    """Decode: QK^T and PV on the tensor cores (PV with P from registers, V transposed), 4-D TMA, setmaxnreg;
    combine: warp shuffles."""
    if kernel == "combine":
        return [r"SHFL\.BFLY"]
    n, _, ctas_per_sm = DECODE_TILES[(head_dim, head_dim_v)]
    dvp = padded(head_dim_v)
    # setmaxnreg only where two CTAs share an SM (head dim 256 runs one, with 255 registers from the launch)
    return [rf"HGMMA\.64x{n}x16\.F32\S* R\d+, gdesc", rf"HGMMA\.64x{dvp}x16\.F32\S* R\d+, R\d+, gdesc\[UR\d+\]\.tnspB",
            r"UTMALDG\.4D"] + ([r"USETMAXREG"] if ctas_per_sm == 2 else [])


def num_splits_heuristic(tiles: int, key_blocks: int, num_sms: int, ctas_per_sm: int = 2,
                         max_splits: int = MAX_SPLITS) -> int:
    """Splits of each (query tile, KV head, sequence)'s keys so that the grid fills the GPU: 1 when the tiles alone
    fill 80 % of the CTA slots; else the fewest splits whose last wave is within 85 % of the best wave efficiency
    (FA3's rule), at most one per key block."""
    slots = num_sms * ctas_per_sm
    if tiles <= 0 or key_blocks <= 1 or tiles >= 0.8 * slots:
        return 1
    cands = range(1, min(max_splits, key_blocks) + 1)
    eff = {s: tiles * s / (math.ceil(tiles * s / slots) * slots) for s in cands}
    best = max(eff.values())
    return next(s for s in cands if eff[s] >= 0.85 * best)


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def _lengths(B: int, seqlens_k: list | None, Sk: int | None) -> list:  # noqa: N803
    """A row's cache lengths: ``seqlens_k`` (one a sequence), or ``Sk`` for every sequence."""
    return list(seqlens_k) if seqlens_k is not None else [int(Sk)] * B


def prepare_data(dtype: str, B: int, Sq: int, Hq: int, Hkv: int, D: int, seqlens_k: list | None = None,  # noqa: N803
                 Sk: int | None = None, Dv: int | None = None, causal: bool = False, page_size: int | None = None,  # noqa: N803
                 num_splits: int | None = None, cache_batch_idx: bool = False, poison_tail: bool = False,
                 device: str = "cuda") -> dict:
    """Fresh random q and cache. Paged: a pool of pages (a few more than the sequences need, the rest random) and a
    block table of them in a random order; contiguous: a cache a little longer than the longest sequence, with
    ``cache_batch_idx`` a random permutation of a larger cache batch. Poisoned out / lse. ``poison_tail``: every
    cache slot no sequence uses holds NaN (an unwritten cache may hold any bits; the kernel must not let them in)."""
    dv = D if Dv is None else Dv
    t = _DTYPES[dtype]
    seqlens_k = _lengths(B, seqlens_k, Sk)
    g = torch.Generator().manual_seed(torch.randint(0, 2**31 - 1, (1,)).item())
    longest = max(seqlens_k, default=0)
    data = {"q": torch.randn(B, Sq, Hq, D, dtype=t, device=device),
            "cache_seqlens": torch.tensor(seqlens_k, dtype=torch.int32, device=device),
            "out": torch.full((B, Sq, Hq, dv), float("nan"), dtype=t, device=device),
            "lse": torch.full((B, Hq, Sq), float("nan"), dtype=torch.float32, device=device),
            "softmax_scale": 1.0 / math.sqrt(D), "causal": causal, "num_splits": num_splits}
    if page_size is not None:
        per_seq = max(1, -(-longest // page_size))
        num_pages = B * per_seq + 3
        table = torch.randperm(num_pages, generator=g)[:B * per_seq].reshape(B, per_seq).to(torch.int32)
        rows, cache_b = page_size, num_pages
        data["block_table"] = table.to(device)
    else:
        rows, cache_b = longest + 7, B + (2 if cache_batch_idx else 0)
        if cache_batch_idx:
            data["cache_batch_idx"] = torch.randperm(cache_b, generator=g)[:B].to(torch.int32).to(device)
    data["k_cache"] = torch.randn(cache_b, rows, Hkv, D, dtype=t, device=device)
    data["v_cache"] = torch.randn(cache_b, rows, Hkv, dv, dtype=t, device=device)
    if poison_tail:
        used = torch.zeros(cache_b, rows, dtype=torch.bool)
        for b, n in enumerate(seqlens_k):
            if page_size is not None:
                for j, page in enumerate(data["block_table"][b].tolist()):
                    used[page, :max(0, min(page_size, n - j * page_size))] = True
            else:
                used[int(data["cache_batch_idx"][b]) if cache_batch_idx else b, :n] = True
        for name in ("k_cache", "v_cache"):
            data[name][~used.to(device)] = float("nan")
    return data


def gather_kv(k_cache, v_cache, b: int, n: int, block_table=None, cache_batch_idx=None):
    """Sequence ``b``'s first ``n`` cached keys and values ([n, Hkv, D]) as the kernel addresses them."""
    if block_table is not None:
        ps = k_cache.shape[1]
        pages = block_table[b, :-(-n // ps)].long()
        return (k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n], v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n])
    idx = b if cache_batch_idx is None else int(cache_batch_idx[b])
    return k_cache[idx, :n], v_cache[idx, :n]


def reference(q, k_cache, v_cache, cache_seqlens, softmax_scale, causal, block_table=None, cache_batch_idx=None,
              **_) -> dict:
    """The fp32 oracle per sequence on the gathered cache (``flash_attention4.attention_fp32``'s conventions)."""
    b_, sq, hq, _ = q.shape
    out = torch.zeros(b_, sq, hq, v_cache.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((b_, hq, sq), float("-inf"), dtype=torch.float32, device=q.device)
    for b, n in enumerate(cache_seqlens.tolist()):
        if n == 0 or sq == 0:
            continue
        kk, vv = gather_kv(k_cache, v_cache, b, n, block_table, cache_batch_idx)
        o, s = fa.attention_fp32(q[b:b + 1], kk[None], vv[None], softmax_scale, causal)
        out[b], lse[b] = o[0], s[0]
    return {"out": out, "lse": lse}


def launch(cfg: dict, data: dict) -> None:
    flash_attn_with_kvcache(data["q"], data["k_cache"], data["v_cache"], cache_seqlens=data["cache_seqlens"],
                            cache_batch_idx=data.get("cache_batch_idx"), block_table=data.get("block_table"),
                            softmax_scale=data["softmax_scale"], causal=data["causal"],
                            num_splits=data["num_splits"] or 0, out=(data["out"], data["lse"]))


def roofline(B: int, Sq: int, Hq: int, Hkv: int, D: int, seqlens_k: list | None = None,  # noqa: N803
             Sk: int | None = None, Dv: int | None = None, causal: bool = False, **_) -> dict:  # noqa: N803
    """Bytes: the cached K and V of every sequence's length (what decode must stream), q, out and lse; FLOPs: the
    visible (query, key) pairs of each sequence."""
    dv = D if Dv is None else Dv
    flops = 0
    nbytes = 2 * B * Sq * Hq * (D + dv) + 4 * B * Hq * Sq
    for n in _lengths(B, seqlens_k, Sk):
        nbytes += 2 * n * Hkv * (D + dv)
        flops += fa.roofline(B=1, Sq=Sq, Sk=n, Hq=Hq, Hkv=Hkv, D=D, Dv=dv, causal=causal)["flops"]
    return {"bytes": nbytes, "flops": flops}


def get_baselines(**cfg) -> dict:
    def sdpa():
        import torch.nn.functional as F  # noqa: N812

        # The cache gathered per sequence, then SDPA with an explicit bottom-right mask: a correctness reference.
        def fn(data):
            q = data["q"]
            out = torch.zeros(*q.shape[:3], data["v_cache"].shape[-1], dtype=q.dtype, device=q.device)
            for b, n in enumerate(data["cache_seqlens"].tolist()):
                if n == 0:
                    continue
                kk, vv = gather_kv(data["k_cache"], data["v_cache"], b, n, data.get("block_table"),
                                   data.get("cache_batch_idx"))
                sq = q.shape[1]
                mask = None
                if data["causal"]:
                    mask = torch.arange(n, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] \
                        + (n - sq)
                    if not mask.any(-1).all():
                        return {}  # SDPA gives NaN for a row that sees no key: no reference for this config
                o = F.scaled_dot_product_attention(q[b].transpose(0, 1)[None], kk.transpose(0, 1)[None],
                                                   vv.transpose(0, 1)[None], attn_mask=mask,
                                                   scale=data["softmax_scale"], enable_gqa=q.shape[2] != kk.shape[1])
                out[b] = o[0].transpose(0, 1)
            return {"out": out}
        return fn

    def fa4():
        from flash_attn.cute import flash_attn_varlen_func as fa4_varlen

        if cfg.get("page_size") is None:
            raise ImportError("FA4's interface has no contiguous-cache form with per-sequence lengths and batch "
                              "indices here; the paged rows compare against it")
        d = int(cfg.get("D", 128))
        dv = d if cfg.get("Dv") is None else int(cfg["Dv"])
        t = _DTYPES[cfg.get("dtype", "bfloat16")]
        hq, hkv, ps = int(cfg.get("Hq", 1)), int(cfg.get("Hkv", 1)), int(cfg["page_size"])
        try:
            fa4_varlen(torch.randn(1, 1, hq, d, dtype=t, device="cuda"),
                       torch.randn(2, ps, hkv, d, dtype=t, device="cuda"),
                       torch.randn(2, ps, hkv, dv, dtype=t, device="cuda"),
                       page_table=torch.tensor([[1, 0]], dtype=torch.int32, device="cuda"),
                       seqused_k=torch.tensor([ps + 1], dtype=torch.int32, device="cuda"),
                       causal=bool(cfg.get("causal")))
        except Exception as e:  # noqa: BLE001 -- any refusal of FA4's means "reference not available here"
            raise ImportError(f"FA4 paged KV does not run D={d} Dv={dv} Hq/Hkv={hq}/{hkv} page {ps} {t}: {e}") from e

        def fn(data):
            o, lse = fa4_varlen(data["q"], data["k_cache"], data["v_cache"], page_table=data["block_table"],
                                seqused_k=data["cache_seqlens"], softmax_scale=data["softmax_scale"],
                                causal=data["causal"], return_lse=True)
            return {"out": o, "lse": lse}
        return fn

    return {"torch": sdpa, "fa4": fa4}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "flash_attn_with_kvcache"


def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def _not_implemented(name: str, what: str) -> None:
    raise NotImplementedError(f"{_OP}: argument '{name}': {what} is not implemented yet")


def _check_inputs(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table, num_splits, out) -> int:
    """Shapes, dtypes and layouts; returns the cache capacity a sequence can address (keys). The device last."""
    dtypes = tuple(_DTYPES.values())
    checks.tensor(_OP, "q", q, dtypes=dtypes, ndim=4, cuda=False)
    b_, sq, hq, d = q.shape
    checks.tensor(_OP, "k_cache", k_cache, dtypes=dtypes, ndim=4, cuda=False)
    checks.tensor(_OP, "v_cache", v_cache, dtypes=dtypes, ndim=4, cuda=False)
    checks.same_dtype(_OP, "q", q, k_cache=k_cache, v_cache=v_cache)
    pages, rows, hkv = k_cache.shape[:3]
    checks.tensor(_OP, "k_cache", k_cache, shape=(None, None, None, d), cuda=False)
    checks.tensor(_OP, "v_cache", v_cache, shape=(pages, rows, hkv, None), cuda=False)
    dv = v_cache.shape[3]
    if (d, dv) not in DECODE_TILES:
        _fail("v_cache" if d in {a for a, _ in DECODE_TILES} else "q", f"head dims (q/k, v) in {sorted(DECODE_TILES)}",
              f"({d}, {dv})")
    if hkv == 0 or hq % hkv:
        _fail("k_cache", f"a number of heads dividing q's {hq} (GQA/MQA)", f"{hkv}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        esize = t.element_size()
        if any(t.shape[i] > 1 and t.stride(i) * esize % 16 for i in range(3)) or \
                any(s > _INT32_MAX for s in t.stride()):
            _fail(name, "strides that are multiples of 16 bytes and below 2**31 elements (TMA)",
                  f"strides {tuple(t.stride())}")
    if isinstance(cache_seqlens, torch.Tensor):
        checks.tensor(_OP, "cache_seqlens", cache_seqlens, dtypes=(torch.int32,), shape=(b_,), contiguous=True,
                      cuda=False)
    elif cache_seqlens is not None and not (isinstance(cache_seqlens, int) and cache_seqlens >= 0):
        _fail("cache_seqlens", "None, an int >= 0 or an int32 tensor (batch,)", repr(cache_seqlens))
    if block_table is not None:
        checks.tensor(_OP, "block_table", block_table, dtypes=(torch.int32,), ndim=2, cuda=False)
        checks.tensor(_OP, "block_table", block_table, shape=(b_, None), cuda=False)
        if block_table.shape[1] == 0:
            _fail("block_table", "at least one page a sequence", f"shape {tuple(block_table.shape)}")
        if rows < MIN_PAGE or rows % MIN_PAGE:
            _fail("k_cache", f"pages of a multiple of {MIN_PAGE} rows (the page size, k_cache.shape[1])", f"{rows}")
        if cache_batch_idx is not None:
            _not_implemented("cache_batch_idx", "cache_batch_idx with a paged cache (block_table)")
        capacity = block_table.shape[1] * rows
    else:
        if cache_batch_idx is not None:
            checks.tensor(_OP, "cache_batch_idx", cache_batch_idx, dtypes=(torch.int32,), shape=(b_,),
                          contiguous=True, cuda=False)
        elif pages < b_:
            _fail("k_cache", f"a cache batch of at least q's {b_} (no cache_batch_idx)", f"{pages}")
        capacity = rows
    if not (isinstance(num_splits, int) and 0 <= num_splits <= MAX_SPLITS):
        _fail("num_splits", f"an int in [0, {MAX_SPLITS}] (0: the heuristic)", repr(num_splits))
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("out", "a tuple (out, lse)", type(out).__name__)
        checks.tensor(_OP, "out[0]", out[0], shape=(b_, sq, hq, dv), contiguous=True, cuda=False)
        checks.same_dtype(_OP, "q", q, **{"out[0]": out[0]})
        checks.tensor(_OP, "out[1]", out[1], dtypes=(torch.float32,), shape=(b_, hq, sq), contiguous=True, cuda=False)
    if any(s > _INT32_MAX for s in q.stride()):
        _fail("q", "strides below 2**31 elements", f"strides {tuple(q.stride())}")
    m_tiles = -(-sq * (hq // hkv) // _fwd_decode.BLOCK_M) if hkv else 0
    if m_tiles * hkv > 65535:
        _fail("q", "at most 65535 (64 packed query rows x KV head) tiles (the grid's y extent)", f"{m_tiles * hkv}")
    if b_ > 65535:
        _fail("q", "a batch of at most 65535 (the grid's z extent)", f"{b_}")
    if MAX_SPLITS * b_ * sq * hq * dv > _INT32_MAX:
        _fail("q", "at most 2**31 / 128 output elements (B * Sq * Hq * Dv, split partials included)",
              f"shape {tuple(q.shape)}")
    checks.tensor(_OP, "q", q, cuda=True)
    others = {"k_cache": k_cache, "v_cache": v_cache}
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("block_table", block_table)):
        if isinstance(t, torch.Tensor):
            others[name] = t
    if out is not None:
        others.update({"out[0]": out[0], "out[1]": out[1]})
    checks.same_device(_OP, "q", q, **others)
    return capacity


_FUNCTIONS = runtime.FunctionCache(__name__)
_KEEP: dict = {}  # (what, device[, size]) -> small constant tensors the launches take (kept: graph-safe)
_SMS: dict = {}


def _const(key, make):
    t = _KEEP.get(key)
    if t is None:
        t = _KEEP[key] = make()
    return t


def _num_sms(device) -> int:
    n = _SMS.get(device)
    if n is None:
        n = _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def _plan(q, k_cache, v_cache, block_table, num_splits: int, capacity: int) -> tuple[int, int]:
    """(box rows, splits): TMA boxes as tall as the page and the key tile allow; splits from the heuristic on the
    capacity (no device sync: the lengths stay on the GPU) unless given."""
    block_n, _, ctas_per_sm = DECODE_TILES[(q.shape[3], v_cache.shape[3])]
    box_rows = math.gcd(k_cache.shape[1], block_n) if block_table is not None else block_n
    key_blocks = -(-capacity // block_n)
    if num_splits == 0:
        hkv = k_cache.shape[2]
        tiles = q.shape[0] * hkv * -(-q.shape[1] * (q.shape[2] // hkv) // _fwd_decode.BLOCK_M)
        num_splits = num_splits_heuristic(tiles, key_blocks, _num_sms(q.device), ctas_per_sm)
    return box_rows, max(1, min(num_splits, key_blocks))


def _launch_args(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table, num_splits: int, capacity: int):
    """``_run``'s (seqlens tensor or None, seqlen for all, page table, box rows, splits) for a checked call."""
    seqlens = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    seqlen_all = capacity if cache_seqlens is None or seqlens is not None else min(int(cache_seqlens), capacity)
    if block_table is None:  # a contiguous cache is one page a sequence: the page index is the batch index
        b_ = q.shape[0]
        table = cache_batch_idx.view(b_, 1) if cache_batch_idx is not None else \
            _const(("arange", q.device, b_), lambda: torch.arange(b_, dtype=torch.int32, device=q.device).view(b_, 1))
    else:
        table = block_table
    box_rows, splits = _plan(q, k_cache, v_cache, block_table, num_splits, capacity)
    return seqlens, seqlen_all, table, box_rows, splits


def _run(q, k_cache, v_cache, seqlens, seqlen_all: int, table, box_rows: int, num_splits: int, softmax_scale: float,
         causal: bool, out, lse) -> None:
    b_, sq, hq, d = q.shape
    dv = v_cache.shape[3]
    if b_ == 0 or sq == 0 or hq == 0:
        return
    if k_cache.shape[0] == 0 or k_cache.shape[1] == 0:  # no cache at all: a row that sees no key, no launch
        out.zero_()
        lse.fill_(float("-inf"))
        return
    checks.aligned(_OP, "out[0]", out, 16)
    fa.check_lse_base(_OP, lse)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):  # TMA bases (a cache is never copied to fix one)
        if t.data_ptr() % 16:
            _fail(name, "a data pointer aligned to 16 bytes (TMA)", f"address 0x{t.data_ptr():x}")
    dev = q.get_device()
    fn = _FUNCTIONS.get(("decode", q.dtype, d, dv, dev), lambda: compile_params(dtype=str(q.dtype)[6:], D=d, Dv=dv),
                        q.device)
    use_seqlens = seqlens is not None
    if seqlens is None:
        seqlens = _const(("seqlens", q.device), lambda: torch.zeros(1, dtype=torch.int32, device=q.device))
    if num_splits == 1:
        part = _const(("part", q.device), lambda: torch.zeros(4, dtype=torch.float32, device=q.device))
        fn(fa._tma_ready(q), k_cache, v_cache, seqlens, table, out, lse, part, part, box_rows, 1, int(use_seqlens),
           seqlen_all, int(causal), float(softmax_scale))
        return
    o_part = torch.empty((num_splits, b_, sq, hq, dv), dtype=torch.float32, device=q.device)
    l_part = torch.empty((num_splits, b_, hq, sq), dtype=torch.float32, device=q.device)
    fn(fa._tma_ready(q), k_cache, v_cache, seqlens, table, out, lse, o_part.view(-1), l_part.view(-1), box_rows,
       num_splits, int(use_seqlens), seqlen_all, int(causal), float(softmax_scale))
    combine = _FUNCTIONS.get(("combine", q.dtype, dev), lambda: compile_params("combine", dtype=str(q.dtype)[6:]),
                             q.device)
    combine(o_part, l_part, out, lse)


def _new_out(q, v_cache):
    b_, sq, hq, _ = q.shape
    return (torch.empty((b_, sq, hq, v_cache.shape[3]), dtype=q.dtype, device=q.device),
            torch.empty((b_, hq, sq), dtype=torch.float32, device=q.device))


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: torch.Tensor | None = None, v: torch.Tensor | None = None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens: int | torch.Tensor | None = None,
                            cache_batch_idx: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                            block_table: torch.Tensor | None = None, softmax_scale: float | None = None,
                            causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes=None, num_splits: int = 0,
                            return_softmax_lse: bool = False, *, page_table: torch.Tensor | None = None,
                            learnable_sink: torch.Tensor | None = None,
                            out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Attention of q against a KV cache with flash-attn's conventions (FA2's positional order; FA3's ``page_table``
    is accepted for ``block_table``): q [B, Sq, Hq, D]; k_cache / v_cache [B_cache, S_cache, Hkv, D / Dv] (contiguous;
    sequence b reads row ``cache_batch_idx[b]``, default b) or [num_pages, page_size, Hkv, D / Dv] with
    ``block_table`` int32 [B, max_pages] (page_size a multiple of 16; pages in any order); bf16/fp16, unit stride in
    the head dim, 16-byte strides; ``cache_seqlens`` int or int32 [B] (default: the whole capacity). ``causal`` masks
    bottom-right (query i sees keys j <= i + cache_seqlens[b] - Sq). ``num_splits`` 0 picks the split-KV count for
    the GPU. Returns out [B, Sq, Hq, Dv], or (out, lse [B, Hq, Sq] fp32, natural log) with ``return_softmax_lse``;
    ``out`` = (out, lse) writes into given contiguous buffers. Appending ``k`` / ``v`` to the cache, rotary
    embedding, ``cache_leftpad``, ALiBi, sliding window, softcap and sinks raise NotImplementedError."""
    if block_table is not None and page_table is not None:
        _fail("page_table", "one of block_table / page_table (the same argument)", "both")
    block_table = page_table if block_table is None else block_table
    unimplemented = [("k", k, "appending new keys to the cache"), ("v", v, "appending new values to the cache"),
                     ("rotary_cos", rotary_cos, "rotary embedding"), ("rotary_sin", rotary_sin, "rotary embedding"),
                     ("cache_leftpad", cache_leftpad, "a left-padded cache"), ("alibi_slopes", alibi_slopes, "ALiBi")]
    for name, value, what in unimplemented:
        if value is not None:
            _not_implemented(name, what)
    fa._check_options(_OP, window_size, learnable_sink, softcap)
    fa.check_scale(_OP, softmax_scale)
    capacity = _check_inputs(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table, num_splits, out)
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
    args = (q, k_cache, v_cache, *_launch_args(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table,
                                               num_splits, capacity), scale, bool(causal))
    seqlens, table = args[3], args[5]
    if runtime.direct_call(q, k_cache, v_cache, seqlens, table, *(out or ())):
        dst = out if out is not None else _new_out(q, v_cache)
        _run(*args, dst[0], dst[1])
        if out is not None:
            runtime.mark_written(out[0])
            runtime.mark_written(out[1])
    elif out is None:
        dst = torch.ops.tirx.flash_attention4_kvcache(*args)
    else:
        torch.ops.tirx.flash_attention4_kvcache_out(*args, out[0], out[1])
        dst = out
    return tuple(dst) if return_softmax_lse else dst[0]


@torch.library.custom_op("tirx::flash_attention4_kvcache", mutates_args=())
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor | None,
                seqlen_all: int, table: torch.Tensor, box_rows: int, num_splits: int, softmax_scale: float,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _new_out(q, v_cache)
    _run(q, k_cache, v_cache, seqlens, seqlen_all, table, box_rows, num_splits, softmax_scale, causal, o, lse)
    return o, lse


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, seqlens, seqlen_all, table, box_rows, num_splits, softmax_scale, causal):
    return _new_out(q, v_cache)


@torch.library.custom_op("tirx::flash_attention4_kvcache_out", mutates_args=("out", "lse"))
def _kvcache_out_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor | None,
                    seqlen_all: int, table: torch.Tensor, box_rows: int, num_splits: int, softmax_scale: float,
                    causal: bool, out: torch.Tensor, lse: torch.Tensor) -> None:
    _run(q, k_cache, v_cache, seqlens, seqlen_all, table, box_rows, num_splits, softmax_scale, causal, out, lse)


@_kvcache_out_op.register_fake
def _(q, k_cache, v_cache, seqlens, seqlen_all, table, box_rows, num_splits, softmax_scale, causal, out, lse):
    return None


run_test, run_bench = harness.bind(__name__)
