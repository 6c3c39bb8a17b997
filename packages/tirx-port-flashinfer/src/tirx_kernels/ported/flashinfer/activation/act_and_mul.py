# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's gated activations (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/activation.cuh
# (act_and_mul_kernel) and the activation definitions of flashinfer/jit/activation.py, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: same semantics (fp32 math, one rounding), different kernel structure.
"""``out = act(x[..., :d]) * x[..., d:]`` for bf16/fp16 on Hopper, act in {silu, gelu (erf), gelu_tanh}.

Upstream runs one CTA per row (``min(d / 8, 1024)`` threads) with one 16-byte vector of gate and of up
in flight per thread per loop trip. Here a *specialized* artifact per (act, dtype, d), d a multiple of 8, serves
every row count M and any 16-byte row strides of x and out; a *general* artifact per (act, dtype)
(``_act_and_mul_general``: d, strides and alignment at run time) serves everything else: any d >= 1, rows or
pointers off 16 bytes, and a d for which a prebuilt bundle holds no specialized artifact (``general_params``).
The specialized kernel puts row blocks on blockIdx.y (at most 65535): the public op launches it once per
``rows_per_launch`` rows (one launch up to 65535 rows at d >= 1024, several only past that, each of >= 400 MB),
so its generated code is what it was; the general kernel has rows on blockIdx.x.
- A row of d / 8 output vectors is cut into ``segments`` equal segments of ``threads_per_segment``
  threads x ``vectors_per_thread`` vectors (``tile_plan``: 14336 -> 7 x 256 threads x 1, exact); short
  rows pack several rows per CTA. Each thread loads all its gate and up vectors (2 independent 16-byte
  loads a vector) before any math, then computes and stores; only vectors that can fall past d are predicated.
- d is a compile-time constant: every load of a thread is one base register plus an immediate offset, no
  division, and the tiling divides d exactly (a dynamic-d draft needed a division and carried row/column
  steps per vector). ptxas still issued only 3 of the 8 loads before the first vector's math, which then
  waited for DRAM before the other loads left (it schedules for registers), until ``vector.after_all``
  made every word depend on every load: now all 8 LDG.E.128 issue back to back (SASS, every config),
  at 40-65 registers, 0-byte stack, no spills (ptxas, nvcc 13.0).
- Sweep variants (compile params ``schedule``, the tiling keys, ``ctas_per_sm``/``pipeline``/
  ``store_cache``; tools/sweep_variants.py): other tilings, ``st.global.cs`` stores, a persistent
  grid-stride loop over tiles that loads the next tile before the current one's math, and "bulk"
  (``chunk``/``stages``/``out``/``load_hint``): a producer warp bulk-copies (row, column chunk) tiles into a
  shared-memory mbarrier ring for consumer warps. Default: "tile".
- Gate/up loads without an L1 qualifier: ``L1::no_allocate`` (the first version) cost 4 % at 32768 x 2x14336
  on the H200 (672 vs 643 us; sweep rounds 3-4, docs/measurements/2026-12-02-h200-b/); no other L1 eviction or
  store qualifier moved it further. An L2 evict_last policy on them did (round 9: 637 us, ``LOAD_POLICY``).
- Launched as a programmatic dependent (``core.lang.pdl``, ``PDL``): back-to-back small calls overlap the
  next kernel's launch with this one's tail.
- Activation math as upstream: silu ``g / (1 + e^-g)`` (exp2 + fast reciprocal), gelu with ``erff``,
  gelu_tanh with ``tanh.approx.f32``.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, runtime

KERNEL_META = {
    "name": "act_and_mul",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Gated activation act(x[..., :d]) * x[..., d:] (silu / gelu / gelu_tanh), bf16/fp16",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4"},
    ],
    "public_ops": ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"],
}

CONFIGS = [
    {"label": "silu_bf16_32768x14336", "act": "silu", "dtype": "bfloat16", "M": 32768, "d": 14336},
    {"label": "silu_bf16_4096x4096", "act": "silu", "dtype": "bfloat16", "M": 4096, "d": 4096},
    {"label": "silu_fp16_37x14336", "act": "silu", "dtype": "float16", "M": 37, "d": 14336},
    {"label": "silu_bf16_1x128", "act": "silu", "dtype": "bfloat16", "M": 1, "d": 128},
    {"label": "silu_fp16_4096x128", "act": "silu", "dtype": "float16", "M": 4096, "d": 128},
    {"label": "gelu_bf16_37x4096", "act": "gelu", "dtype": "bfloat16", "M": 37, "d": 4096},
    {"label": "gelu_fp16_4096x14336", "act": "gelu", "dtype": "float16", "M": 4096, "d": 14336},
    {"label": "gelu_bf16_1x128", "act": "gelu", "dtype": "bfloat16", "M": 1, "d": 128},
    {"label": "gelu_tanh_bf16_4096x14336", "act": "gelu_tanh", "dtype": "bfloat16", "M": 4096, "d": 14336},
    {"label": "gelu_tanh_fp16_37x128", "act": "gelu_tanh", "dtype": "float16", "M": 37, "d": 128},
    {"label": "gelu_tanh_fp16_1x4096", "act": "gelu_tanh", "dtype": "float16", "M": 1, "d": 4096},
    # The general kernel: odd d (unaligned heads and tails, gate/up/out each off 16 bytes by a per-row amount),
    # tiny rows packed many a CTA, and an aligned d forced onto it.
    {"label": "silu_bf16_37x1", "act": "silu", "dtype": "bfloat16", "M": 37, "d": 1},
    {"label": "gelu_fp16_4099x3", "act": "gelu", "dtype": "float16", "M": 4099, "d": 3},
    {"label": "gelu_tanh_bf16_37x5121", "act": "gelu_tanh", "dtype": "bfloat16", "M": 37, "d": 5121},
    {"label": "silu_fp16_5x14335", "act": "silu", "dtype": "float16", "M": 5, "d": 14335},
    {"label": "silu_bf16_333x100", "act": "silu", "dtype": "bfloat16", "M": 333, "d": 100},
    {"label": "gelu_bf16_37x4096_general", "act": "gelu", "dtype": "bfloat16", "M": 37, "d": 4096,
     "schedule": "general"},
    # Row counts past the 65535 blocks of grid y (the specialized kernel in several launches) ...
    {"label": "silu_bf16_65536x1024", "act": "silu", "dtype": "bfloat16", "M": 65536, "d": 1024},
    {"label": "silu_bf16_200000x1024", "act": "silu", "dtype": "bfloat16", "M": 200000, "d": 1024},
    {"label": "silu_bf16_65536x4096", "act": "silu", "dtype": "bfloat16", "M": 65536, "d": 4096},
    {"label": "silu_bf16_200000x4096", "act": "silu", "dtype": "bfloat16", "M": 200000, "d": 4096},
    {"label": "silu_bf16_200000x1023", "act": "silu", "dtype": "bfloat16", "M": 200000, "d": 1023},
    # ... and past 2**31 input elements (64-bit offsets; ~4.3 GB of x, ~25 GB with the fp32 oracle).
    {"label": "silu_bf16_262151x4096_big", "act": "silu", "dtype": "bfloat16", "M": 262151, "d": 4096},
    {"label": "silu_bf16_262214x4095_big", "act": "silu", "dtype": "bfloat16", "M": 262214, "d": 4095},
]

# The row (32768 x 2x14336 -> 14336, torch.compile 4.37 TB/s on ANCHORS.md) and the other two acts.
BENCH_CONFIGS = [
    {"label": "silu_bf16_32768x14336", "act": "silu", "dtype": "bfloat16", "M": 32768, "d": 14336},
    {"label": "gelu_tanh_bf16_4096x14336", "act": "gelu_tanh", "dtype": "bfloat16", "M": 4096, "d": 14336},
    {"label": "gelu_fp16_4096x14336", "act": "gelu", "dtype": "float16", "M": 4096, "d": 14336},
    {"label": "silu_bf16_4096x4096", "act": "silu", "dtype": "bfloat16", "M": 4096, "d": 4096},
    # The general kernel: an odd d against the nearest aligned d (specialized), and at an aligned d against the
    # specialized kernel (the goal: odd within 10 %, general close to specialized).
    {"label": "silu_bf16_8192x5120", "act": "silu", "dtype": "bfloat16", "M": 8192, "d": 5120},
    {"label": "silu_bf16_8192x5121", "act": "silu", "dtype": "bfloat16", "M": 8192, "d": 5121},
    {"label": "silu_bf16_8192x5120_general", "act": "silu", "dtype": "bfloat16", "M": 8192, "d": 5120,
     "schedule": "general"},
    {"label": "silu_bf16_8192x14336", "act": "silu", "dtype": "bfloat16", "M": 8192, "d": 14336},
    {"label": "silu_bf16_8192x14335", "act": "silu", "dtype": "bfloat16", "M": 8192, "d": 14335},
    {"label": "silu_bf16_8192x14336_general", "act": "silu", "dtype": "bfloat16", "M": 8192, "d": 14336,
     "schedule": "general"},
]

DEFAULTS = {"act": "silu", "dtype": "bfloat16"}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ACTS = ("silu", "gelu", "gelu_tanh")
_VEC = 8  # 16-bit elements per 16-byte vector

# (d / 8) vectors per row = segments x threads_per_segment x vectors_per_thread, rounded up; rows of <= 32
# threads are packed into CTAs of at least 128 threads.
# Sweep on the H200 (tools/sweep_variants.py, cold L2): one vector per thread won at every measured shape
# (round 1: 32768x14336 silu 673.0 us (4.19 TB/s) with 128-thread segments vs 691.5 with 2x224x4; 4096x14336
# gelu_tanh 88.4 vs 91.4; 4096x4096 silu 29.9 vs 30.7; fewer registers, 28 vs 40-44, more resident warps).
# Segments of 256 threads rather than 128 (round 11, docs/measurements/2026-12-03c-h200/sweep-round11.log): half
# the CTAs, which is what counts when few rows make the launch the cost: fp16 37 x 2x14336 from a CUDA graph
# 1.4 us vs 1.7 (FlashInfer 1.6); equal at the large shapes (32768 x 2x14336 640.2 vs 639.7, 4096 x 2x4096
# 28.3 both, gelu_tanh 4096 x 2x14336 84.8 vs 85.0).
VECTORS_PER_THREAD = 1
MAX_SEGMENT_THREADS = 256
# Gate/up loads: plain. Sweep rounds 3-4 on the H200 (32768 x 2x14336 silu, cold L2): plain 643.2 us (4.38 TB/s,
# torch.compile 642.6 in the same run), L1::evict_last / evict_unchanged 643.3-643.4, L1::no_allocate 673.5,
# L2::256B prefetch 646.9, .nc + no_allocate 672.5; store qualifiers (evict_first, no_allocate) within 0.1 %.
LOAD_CACHE = "default"
# L2 eviction priorities of the gate/up loads and the stores (``.L2::cache_hint``), sweep round 9 on the H200
# (cold L2 after the suite's 512 MiB write flush; docs/measurements/2026-12-03c-h200/sweep-round9.log): gate/up
# read L2 evict_last: 32768 x 2x14336 637.3 us vs 643.5 plain (torch.compile 642.7), 4096 x 2x4096 28.0 vs 29.7
# (torch.compile 29.6), 37 x 2x14336 4.8 vs 5.1; evict_first loads lost 1-5 %, store priorities moved < 1 %.
LOAD_POLICY = "evict_last"
STORE_POLICY = None
# Programmatic dependent launch (``core.lang.pdl``, as FlashInfer launches its activations on Hopper): fp16
# 37 x 2x14336 from a CUDA graph of back-to-back calls 1.6 us vs 1.8 without ("early" trigger equal); cold L2
# equal (643.4 vs 643.5, 29.6 vs 29.7).
PDL = "end"
MIN_CTA_THREADS = 128


def sass_expect(act: str, dtype: str, d: int | None = None, schedule: str = "tile", out: str = "reg",
                **_) -> list[str]:
    """SASS the CPU build test asserts: 16-byte loads of gate/up, 16-byte stores; for "bulk", the bulk copies
    (``UBLKCP.S.G`` / ``UBLKCP.G.S``), the mbarrier ring and 16-byte smem accesses; for "general", also the
    2-byte stores of a row's unaligned head and tail."""
    if schedule == "general":
        return [r"LDG\.E\.128", r"STG\.E\.128", r"STG\.E\.U16"]
    if schedule == "bulk":
        stores = [r"STG\.E\.128"] if out == "reg" else [r"STS\.128", r"UBLKCP\.G\.S "]
        return [r"UBLKCP\.S\.G ", r"SYNCS\.PHASECHK\.TRANS64", r"SYNCS\.ARRIVE", r"LDS\.128", *stores]
    return [r"LDG\.E\.128", r"STG\.E\.128"]


def tile_plan(d: int) -> dict:
    """``segments`` per row, ``threads_per_segment``, ``vectors_per_thread``, ``rows_per_cta`` for d."""
    nvec = d // _VEC
    want = -(-nvec // VECTORS_PER_THREAD)
    if want <= 32:
        segments, tps = 1, 1 << (want - 1).bit_length()
    else:
        segments = -(-want // MAX_SEGMENT_THREADS)
        tps = 32 * -(-want // (32 * segments))
    return {"segments": segments, "threads_per_segment": tps,
            "vectors_per_thread": -(-nvec // (segments * tps)), "rows_per_cta": max(1, MIN_CTA_THREADS // tps)}


# Schedule variants (sweeps pin them through compile params; the public op uses "tile", or "general" where "tile"
# does not apply).
# "tile": one (row, segment) tile per CTA, the grid covers every tile (``build_kernel``).
# "general": d, strides and alignment at run time, one artifact per (act, dtype) (``_act_and_mul_general``).
# "persistent": grid min(tiles, ctas_per_sm * NUM_SMS), tiles strided by the grid; with ``pipeline`` the
# next tile's loads are issued before the current tile's math and stores (``build_kernel_persistent``).
# "bulk": persistent CTAs, (row, column chunk) tiles bulk-copied into a shared-memory ring by a producer warp
# (``build_kernel_bulk``; its keys ``chunk``, ``stages``, ``out``, ``load_hint``, and ``vectors_per_thread``).
SCHEDULES = ("tile", "persistent", "bulk", "general")
TILE_KEYS = ("segments", "threads_per_segment", "vectors_per_thread", "rows_per_cta")
BULK_KEYS = ("chunk", "stages", "out", "load_hint")
VARIANT_KEYS = ("schedule", *TILE_KEYS, "ctas_per_sm", "pipeline", "store_cache", "load_cache", *BULK_KEYS,
                "load_policy", "store_policy", "pdl")
NUM_SMS = 132  # H200 SXM


def compile_params(**cfg) -> dict:
    """The specialized kernel's params for d a multiple of 8 (contiguous rows then start on 16 bytes), else the
    general kernel's; a config may pin a schedule (``"schedule": "general"``) and the sweep keys."""
    if cfg.get("schedule") == "general" or int(cfg["d"]) % _VEC:
        return general_params(cfg)
    params = {"act": cfg["act"], "dtype": cfg["dtype"], "d": int(cfg["d"])}
    params.update({k: cfg[k] for k in VARIANT_KEYS if k in cfg})
    return params


def general_params(params: dict) -> dict:
    """The general artifact, which serves every call any act_and_mul params serve (same arguments)."""
    return {"act": params["act"], "dtype": params["dtype"], "schedule": "general"}


# Bundle specializations (``artifact_params``): every catalog intermediate width (all multiples of 8) for 3 acts x
# 2 dtypes would be 45 x 6 = 270 artifacts; bf16 with silu and gelu_tanh (the gated MLPs of the catalog's models)
# is 90, and every other call runs the general artifact.
BUNDLE_ACTS = ("silu", "gelu_tanh")
BUNDLE_DTYPES = ("bfloat16",)


def artifact_params() -> list[dict]:
    """The general kernel for every (act, dtype), and the specialized one for every catalog intermediate width
    (``core.model_dims``) in ``BUNDLE_ACTS`` x ``BUNDLE_DTYPES``."""
    from tirx_kernels.core import model_dims

    out = [general_params({"act": a, "dtype": t}) for a in ACTS for t in _DTYPES]
    out += [compile_params(act=a, dtype=t, d=d) for a in BUNDLE_ACTS for t in BUNDLE_DTYPES
            for d in model_dims.intermediate_sizes() if d % _VEC == 0]
    return out


def call_samples(rng) -> list[dict]:
    """Calls the public ops can see (PROTOCOL.md; core's bundle-resolution test): every catalog intermediate width
    (whole and tensor-parallel shards), random and odd d up to 40000, every act and dtype."""
    from tirx_kernels.core import model_dims

    ds = model_dims.intermediate_sizes() + [rng.randint(1, 64) for _ in range(4)]
    ds += [rng.randint(1, 40000) for _ in range(8)] + [8 * rng.randint(1, 5000) for _ in range(4)]
    return [{"act": act, "dtype": dtype, "M": rng.choice([1, 37, 8192]), "d": d}
            for act in ACTS for dtype in _DTYPES for d in ds]


def rows_per_launch(params: dict) -> int:
    """Rows one launch of ``params``' kernel may take: the specialized kernel's row blocks are on blockIdx.y
    (<= 65535); the general kernel's on blockIdx.x (< 2**31, int32 row indices)."""
    if params.get("schedule") == "general":
        return GENERAL_MAX_ROWS
    plan = {**tile_plan(params["d"]), **{k: params[k] for k in TILE_KEYS if k in params}}
    return MAX_GRID_Y * plan["rows_per_cta"]


MAX_GRID_Y = 65535
GENERAL_MAX_ROWS = 2**31 - 1 - 256  # row = block * rows_per_cta + r stays in int32


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(act: str, dtype: str, d: int | None = None, schedule: str = "tile", ctas_per_sm: int | None = None,
               pipeline: bool = True, store_cache: str = "default", load_cache: str = LOAD_CACHE,
               load_policy: str | None = LOAD_POLICY, store_policy: str | None = STORE_POLICY,
               pdl: str | None = PDL, **tiling):
    """The kernel of ``schedule``; ``tiling`` (``TILE_KEYS``) overrides ``tile_plan(d)`` (the default), or
    for "bulk" holds ``BULK_KEYS`` and ``vectors_per_thread``. ``load_policy`` / ``store_policy`` (L2
    priorities) and ``pdl`` (``core.lang.pdl``) apply to the "tile" schedule."""
    if act not in ACTS:
        raise ValueError(f"act_and_mul: act {act!r} is not one of {ACTS}")
    if dtype not in _DTYPES:
        raise ValueError(f"act_and_mul: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if schedule == "general":
        if d is not None or ctas_per_sm is not None or tiling:
            raise ValueError("act_and_mul: the general schedule takes no d (a runtime size), ctas_per_sm or tiling")
        from ._act_and_mul_general import build_general

        return build_general(act, dtype, load_policy, store_policy, pdl)
    if d is None or d % _VEC or d <= 0:
        raise ValueError(f"act_and_mul: d={d} must be a positive multiple of {_VEC}")
    if schedule not in SCHEDULES:
        raise ValueError(f"act_and_mul: schedule {schedule!r} is not one of {SCHEDULES}")
    if schedule == "bulk":
        unknown = set(tiling) - {*BULK_KEYS, "vectors_per_thread"}
        if unknown:
            raise ValueError(f"act_and_mul: unknown compile params for schedule 'bulk': {sorted(unknown)}")
        return build_kernel_bulk(act, dtype, d, ctas_per_sm=ctas_per_sm, store_cache=store_cache, **tiling)
    unknown = set(tiling) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"act_and_mul: unknown compile params {sorted(unknown)}")
    plan = {**tile_plan(d), **tiling}
    if plan["segments"] * plan["threads_per_segment"] * plan["vectors_per_thread"] * _VEC < d:
        raise ValueError(f"act_and_mul: tiling {plan} does not cover d={d}")
    if schedule == "persistent":
        plan.pop("rows_per_cta")
        return build_kernel_persistent(act, dtype, d, **plan, ctas_per_sm=ctas_per_sm or 2, pipeline=pipeline,
                                       store_cache=store_cache, load_cache=load_cache)
    return build_kernel(act, dtype, d, **plan, store_cache=store_cache, load_cache=load_cache,
                        min_ctas_per_sm=ctas_per_sm, policies={"load": load_policy, "store": store_policy}, pdl=pdl)


def _activation(act: str, T, g, tmp, k):
    """fp32 ``act(g)``; ``tmp[k]`` is a local fp32 slot for results of statement-form PTX (tanh)."""
    if act == "silu":
        log2e = 1.4426950408889634
        return T.cuda.fdividef(g, T.float32(1) + T.exp2(g * T.float32(-log2e)))
    if act == "gelu":
        return g * T.float32(0.5) * (T.float32(1) + T.erf(g * T.float32(0.7071067811865476)))
    inner = T.float32(0.7978845608028654) * (g + T.float32(0.044715) * g * g * g)
    T.evaluate(T.ptx.tanh.approx.f32(tmp[k], inner))
    return g * (T.float32(0.5) * (T.float32(1) + tmp[k]))


def _act_vector(act: str, dtype: str, orr, gr, ur, v: int, tmp, dep=None):
    """``orr[0:4]`` <- vector ``v`` of ``act(gate) * up`` (fp32, one rounding) from the packed words
    ``gr``/``ur[4v:4v+4]``, each XOR-ed with ``dep`` first when given (``vector.after_all``)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    words = vector.WORDS_PER_VECTOR
    for j in range(words):
        g, u = gr[v * words + j], ur[v * words + j]
        if dep is not None:
            g, u = g ^ dep, u ^ dep
        g_lo, g_hi = vector.unpack2(g, dtype)
        u_lo, u_hi = vector.unpack2(u, dtype)
        vector.pack2(orr, j, _activation(act, T, g_lo, tmp, 2 * j) * u_lo,
                     _activation(act, T, g_hi, tmp, 2 * j + 1) * u_hi, dtype)


def build_kernel(act: str, dtype: str, d: int, segments: int, threads_per_segment: int,
                 vectors_per_thread: int, rows_per_cta: int, store_cache: str = "default",
                 load_cache: str = LOAD_CACHE, min_ctas_per_sm: int | None = None, policies: dict | None = None,
                 pdl: str | None = None):
    """The kernel for an explicit tiling (``get_kernel`` takes it from ``tile_plan``; sweeps call this).

    ``load_cache``: the ``vector.LOAD_CACHE`` qualifiers of the gate/up loads; ``min_ctas_per_sm``: emit
    ``__launch_bounds__(threads, min_ctas_per_sm)`` (caps registers so that many CTAs stay resident).
    ``policies``: L2 eviction priorities of the accesses "load" (gate and up) and "store" (None: no hint).
    ``pdl``: launched as a programmatic dependent (``core.lang.pdl``): every thread waits for the previous
    kernel before its loads and signals the next one after its stores ("end") or right after the wait ("early").
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import vector

    pdl_launch.check_trigger("act_and_mul", pdl)
    access = vector.AccessPolicies("act_and_mul", policies)

    tps = threads_per_segment
    vpt = vectors_per_thread
    nvec = d // _VEC
    threads = tps * rows_per_cta
    words = vector.WORDS_PER_VECTOR

    def vector_pred(v, seg, lane, row, M):
        """None where vector ``v`` is inside the row in every segment and the row exists, else the test."""
        row_ok = None if rows_per_cta == 1 else row < M
        tail = ((segments - 1) * vpt + v + 1) * tps > nvec
        col_ok = (seg * vpt + v) * tps + lane < nvec if tail else None
        if row_ok is None or col_ok is None:
            return col_ok if row_ok is None else row_ok
        return T.And(row_ok, col_ok)

    def col(v, seg, lane):
        return ((seg * vpt + v) * tps + lane) * _VEC

    def load_all(gr, ur, Xf, x_base, seg, lane, row, M, policy):
        for v in range(vpt):
            vector.load_v4(gr, v * words, Xf.ptr_to([x_base + col(v, seg, lane)]), vector_pred(v, seg, lane, row, M),
                           cache=load_cache, policy=policy)
            vector.load_v4(ur, v * words, Xf.ptr_to([x_base + d + col(v, seg, lane)]),
                           vector_pred(v, seg, lane, row, M), cache=load_cache, policy=policy)

    def compute_store(Yf, y_base, seg, lane, row, M, gr, ur, orr, tmp, dep, policy):
        for v in range(vpt):
            _act_vector(act, dtype, orr, gr, ur, v, tmp, dep[0])
            vector.store_v4(Yf.ptr_to([y_base + col(v, seg, lane)]), orr, 0, vector_pred(v, seg, lane, row, M),
                            cache=store_cache, policy=policy)

    @T.prim_func
    def act_and_mul(x_ptr: T.handle, y_ptr: T.handle, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, 2 * d), dtype, strides=(x_stride, 1), align=16)
        Y = T.match_buffer(y_ptr, (M, d), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        if min_ctas_per_sm is not None:
            T.attr({"tirx.launch_bounds_min_blocks_per_sm": min_ctas_per_sm})
        # Flat views indexed row * stride + col: TIRx 0.27 binds match_buffer strides on the host but
        # drops them from device indexing.
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        seg, row_block = T.cta_id([segments, (M + rows_per_cta - 1) // rows_per_cta])
        tid = T.thread_id([threads])
        gr = T.alloc_local((vpt * words,), "uint32")
        ur = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        tmp = T.alloc_local((2 * words,), "float32")
        dep = T.alloc_local((1,), "uint32")
        pol = T.alloc_local((access.count,), "uint64")
        access.create(pol)
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write x or read out
        row = row_block * rows_per_cta + tid // tps
        lane = tid % tps
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        load_all(gr, ur, Xf, x_base, seg, lane, row, M, access.operand(pol, "load"))
        # Every word depends on every load (``zero`` is 0): all 8 loads issue before any math.
        dep[0] = vector.after_all(gr, vpt * words, zero) | vector.after_all(ur, vpt * words, zero)
        compute_store(Yf, y_base, seg, lane, row, M, gr, ur, orr, tmp, dep, access.operand(pol, "store"))
        pdl_launch.end(pdl)

    return pdl_launch.launch(act_and_mul, pdl)


def build_kernel_persistent(act: str, dtype: str, d: int, segments: int, threads_per_segment: int,
                            vectors_per_thread: int, ctas_per_sm: int, pipeline: bool = True,
                            store_cache: str = "default", num_sms: int = NUM_SMS, load_cache: str = LOAD_CACHE):
    """Persistent tiles: ``min(M * segments, ctas_per_sm * num_sms)`` CTAs of ``threads_per_segment``
    threads; CTA ``c`` does tiles ``c, c + grid, ...`` (tile ``t``: row ``t // segments``, segment
    ``t % segments``). With ``pipeline`` the next tile's gate/up go into a second register set before the
    current tile's math and stores (plain ``ld.global``: ptxas cannot sink them below the stores), then
    move into the first. ``__launch_bounds__(threads, ctas_per_sm)`` keeps the whole grid resident.
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    tps = threads_per_segment
    vpt = vectors_per_thread
    nvec = d // _VEC
    words = vector.WORDS_PER_VECTOR
    max_grid = ctas_per_sm * num_sms

    def col_pred(v, seg, lane):
        tail = ((segments - 1) * vpt + v + 1) * tps > nvec
        return (seg * vpt + v) * tps + lane < nvec if tail else None

    def both(a, b):
        if a is None or b is None:
            return b if a is None else a
        return T.And(a, b)

    def col(v, seg, lane):
        return ((seg * vpt + v) * tps + lane) * _VEC

    def tile_rc(t):
        return (t, 0) if segments == 1 else (t // segments, t % segments)

    def load_tile(gr, ur, Xf, t, x_stride, lane, tile_ok):
        row, seg = tile_rc(t)
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        for v in range(vpt):
            pred = both(tile_ok, col_pred(v, seg, lane))
            vector.load_v4(gr, v * words, Xf.ptr_to([x_base + col(v, seg, lane)]), pred, cache=load_cache)
            vector.load_v4(ur, v * words, Xf.ptr_to([x_base + d + col(v, seg, lane)]), pred, cache=load_cache)

    def compute_store(Yf, t, y_stride, lane, gr, ur, orr, tmp):
        row, seg = tile_rc(t)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        for v in range(vpt):
            _act_vector(act, dtype, orr, gr, ur, v, tmp)
            vector.store_v4(Yf.ptr_to([y_base + col(v, seg, lane)]), orr, 0, col_pred(v, seg, lane),
                            cache=store_cache)

    @T.prim_func
    def act_and_mul(x_ptr: T.handle, y_ptr: T.handle, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, 2 * d), dtype, strides=(x_stride, 1), align=16)
        Y = T.match_buffer(y_ptr, (M, d), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas_per_sm})
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([T.min(M * segments, max_grid)])
        tid = T.thread_id([tps])
        gr = T.alloc_local((vpt * words,), "uint32")
        ur = T.alloc_local((vpt * words,), "uint32")
        gn = T.alloc_local((vpt * words,), "uint32")
        un = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        tmp = T.alloc_local((2 * words,), "float32")
        dep = T.alloc_local((1,), "uint32")
        tiles = M * segments
        grid = T.min(tiles, max_grid)
        if pipeline:
            load_tile(gr, ur, Xf, cta, x_stride, tid, None)
        for it in range((tiles - 1 - cta) // grid + 1):
            t = cta + it * grid
            if pipeline:
                load_tile(gn, un, Xf, t + grid, x_stride, tid, t + grid < tiles)
            else:
                load_tile(gr, ur, Xf, t, x_stride, tid, None)
                # Every word depends on every load (``zero`` is 0): all loads issue before any math.
                dep[0] = vector.after_all(gr, vpt * words, zero) | vector.after_all(ur, vpt * words, zero)
                for i in range(vpt * words):
                    T.buffer_store(gr, gr[i] ^ dep[0], [i])
            compute_store(Yf, t, y_stride, tid, gr, ur, orr, tmp)
            if pipeline:
                vector.copy(gr, gn, vpt * words)
                vector.copy(ur, un, vpt * words)

    return act_and_mul


# "bulk" schedule: persistent CTAs stream (row, column chunk) tiles -- the gate chunk and the up chunk, two 1-D
# TMA bulk copies completing on one full mbarrier -- through a ring of ``stages`` shared-memory stages, fed by a
# producer warp; the consumer warps compute from ``ld.shared``. A whole row (2 x 28 KB in, 28 KB out at
# d = 14336) is too coarse a ring unit: 2-3 stages of it would fill an SM's shared memory for one or two CTAs,
# so the unit is a chunk of ``chunk`` columns (default 2048: 8 KB in per stage; 14336 = 7 chunks).
BULK_OUTS = ("reg", "bulk")
BULK_MAX_CHUNK = 2048
SMEM_PER_CTA = 232448  # 227 KB: the most one CTA may use on the H200
SMEM_PER_SM = 233472  # 228 KB shared by the CTAs of an SM, 1 KB of it reserved per CTA by the driver
SMEM_RESERVED_PER_CTA = 1024
MAX_THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32
BULK_THREADS_PER_SM = 1024  # default residency


def bulk_plan(d: int, chunk: int | None = None, vectors_per_thread: int = 2, stages: int = 4,
              ctas_per_sm: int | None = None, out: str = "reg") -> dict:
    """Chunk, consumer threads, CTAs per SM and shared memory of the "bulk" schedule (ValueError if it
    cannot run): ``chunk`` columns divide d, each consumer thread holds ``vectors_per_thread`` 16-byte
    vectors of gate and of up, whole consumer warps. ``chunk`` defaults to the largest such divisor of d up
    to 2048 columns; ``ctas_per_sm`` to as many as shared memory holds up to 1024 threads an SM."""
    if out not in BULK_OUTS:
        raise ValueError(f"act_and_mul bulk: out {out!r} is not one of {BULK_OUTS}")
    if stages < 1 or vectors_per_thread < 1:
        raise ValueError(f"act_and_mul bulk: stages {stages} and vectors_per_thread {vectors_per_thread} must be >= 1")
    step = _VEC * vectors_per_thread * 32  # columns of one consumer warp
    if chunk is None:
        cands = [c for c in range(step, min(d, BULK_MAX_CHUNK) + 1, step) if d % c == 0]
        if not cands:
            raise ValueError(f"act_and_mul bulk: d={d} has no column chunk <= {BULK_MAX_CHUNK} that is a multiple of "
                             f"{step} (whole warps of {vectors_per_thread} vectors a thread)")
        chunk = cands[-1]
    if chunk <= 0 or d % chunk or chunk % step:
        raise ValueError(f"act_and_mul bulk: chunk {chunk} must divide d={d} and be a multiple of {step} columns "
                         f"(whole warps of {vectors_per_thread} 16-byte vectors a thread)")
    consumers = chunk // (_VEC * vectors_per_thread)
    threads = consumers + 32
    if threads > 1024:
        raise ValueError(f"act_and_mul bulk: {consumers} consumer threads + a producer warp exceed 1024")
    stage_bytes = 2 * chunk * 2  # gate + up; 16-byte multiples: chunk is a multiple of 8 columns
    smem = stages * stage_bytes + 2 * 8 * stages
    if smem > SMEM_PER_CTA:
        raise ValueError(f"act_and_mul bulk: {stages} stages of {stage_bytes} B exceed the {SMEM_PER_CTA} B of a CTA")
    fit = min(SMEM_PER_SM // (smem + SMEM_RESERVED_PER_CTA), MAX_THREADS_PER_SM // threads, MAX_CTAS_PER_SM)
    ctas = ctas_per_sm or max(1, min(fit, BULK_THREADS_PER_SM // threads))
    if not 1 <= ctas <= fit:
        raise ValueError(f"act_and_mul bulk: {ctas} CTAs/SM of {stages} x {stage_bytes} B stages and {threads} "
                         f"threads do not fit one SM (at most {fit})")
    return {"chunk": chunk, "vectors_per_thread": vectors_per_thread, "consumers": consumers, "threads": threads,
            "ctas_per_sm": ctas, "stage_bytes": stage_bytes, "smem_bytes": smem}


def build_kernel_bulk(act: str, dtype: str, d: int, chunk: int | None = None, vectors_per_thread: int = 2,
                      stages: int = 4, ctas_per_sm: int | None = None, out: str = "reg", num_sms: int = NUM_SMS,
                      load_hint: str | None = None, store_cache: str = "default"):
    """Persistent CTAs over tiles ``t = cta, cta + grid, ...`` (``grid = min(M * d / chunk, ctas_per_sm *
    num_sms)``; tile ``t``: row ``t // chunks``, columns ``(t % chunks) * chunk ..+chunk``) through a
    full/empty ``mbarrier.Ring`` of ``stages`` stages ``[gate chunk | up chunk]``.

    Producer (lane 0 of the last warp): for the CTA's ``j``-th tile, ``producer_acquire`` (wait on
    ``empty[j % stages]`` for the release of tile ``j - stages``, parity ``((j // stages) % 2) ^ 1``, which a
    fresh barrier passes for the first ``stages`` tiles), ``arrive_expect_tx(full, 2 * chunk * 2)`` and the two
    bulk loads. Consumers (the other warps, ``vectors_per_thread`` vectors of gate and of up a thread, vector
    ``v`` of thread ``t`` at column ``(v * consumers + t) * 8`` of the chunk: conflict-free ``ld.shared``) wait
    on ``full`` with parity ``(j // stages) % 2``, then

    - ``out="reg"``: read gate and up, compute, store with 16-byte ``st.global``;
    - ``out="bulk"``: read, compute, write the output vector over the gate vector it came from (only this
      thread touches it), ``fence.proxy.async``;

    then ``__syncwarp`` and lane 0 of each warp releases the stage (``empty`` counts one arrival per
    consumer warp). The release comes after the stores, whose issue needs the loaded values: the reads are
    complete, not merely ordered, before the producer may overwrite the stage. With ``out="bulk"`` the
    producer then owns a stage holding a finished output chunk: before refilling it with tile ``j`` it
    bulk-stores tile ``j - stages`` from its gate half, commits and waits ``wait_read(0)``; after its last
    load it waits for the release of each of the last ``min(stages, tiles)`` tiles (parity
    ``(j // stages) % 2``) and stores them, then drains.

    Phases: a stage's full barrier completes again only after the producer's next load, which follows the
    release of the stage by every consumer warp, which follows their wait: no consumer can miss a phase;
    symmetrically the producer waits on an empty barrier only for a release whose load it has issued. The
    consumers never wait for the producer's stores, the producer never touches data. Tiles past ``M`` rows
    do not exist (the tile count is ``M * chunks``); every load issued is consumed.
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import bulk, mbarrier, vector

    plan = bulk_plan(d, chunk, vectors_per_thread, stages, ctas_per_sm, out)
    chunk, vpt, nc = plan["chunk"], plan["vectors_per_thread"], plan["consumers"]
    threads, ctas, stage_bytes = plan["threads"], plan["ctas_per_sm"], plan["stage_bytes"]
    chunks = d // chunk
    words = vector.WORDS_PER_VECTOR
    max_grid = ctas * num_sms
    ring = mbarrier.Ring(stages, consumer_arrivals=nc // 32)
    if load_hint not in (None, bulk.EVICT_FIRST, bulk.EVICT_NORMAL, bulk.EVICT_LAST):
        raise ValueError(f"act_and_mul bulk: load_hint {load_hint!r}")

    def tile_rc(t):
        """(row, first column) of tile ``t >= 0`` (truncating division by the constant ``chunks``: bind the
        results to locals in the kernel body, or TIR folds them into 64-bit division of the addresses)."""
        return T.truncdiv(t, chunks), T.truncmod(t, chunks) * chunk

    def offset(row, c0, stride):
        return T.Cast("int64", row) * T.Cast("int64", stride) + c0

    def load_tile(S, full, Xf, j, row, c0, x_stride, pol):  # noqa: N803
        gate = offset(row, c0, x_stride)
        s = ring.stage(j)
        policy = None if load_hint is None else pol[0]
        ring.producer_expect(full, j, stage_bytes)
        bulk.load(S.ptr_to([s * 2 * chunk]), Xf.ptr_to([gate]), chunk * 2, full.ptr_to([s]), cache_policy=policy)
        bulk.load(S.ptr_to([s * 2 * chunk + chunk]), Xf.ptr_to([gate + d]), chunk * 2, full.ptr_to([s]),
                  cache_policy=policy)

    def store_tile(S, Yf, j, row, c0, y_stride):  # noqa: N803
        bulk.store(Yf.ptr_to([offset(row, c0, y_stride)]), S.ptr_to([ring.stage(j) * 2 * chunk]), chunk * 2)
        bulk.commit()

    def read_tile(S, j, lane, gr, ur):  # noqa: N803
        base = ring.stage(j) * 2 * chunk
        for v in range(vpt):
            col = (v * nc + lane) * _VEC
            vector.load_shared_v4(gr, v * words, S.ptr_to([base + col]))
            vector.load_shared_v4(ur, v * words, S.ptr_to([base + chunk + col]))

    def compute_out(S, Yf, j, row, c0, y_stride, lane, gr, ur, orr, tmp):  # noqa: N803
        y = offset(row, c0, y_stride)
        for v in range(vpt):
            col = (v * nc + lane) * _VEC
            _act_vector(act, dtype, orr, gr, ur, v, tmp)
            if out == "reg":
                vector.store_v4(Yf.ptr_to([y + col]), orr, 0, cache=store_cache)
            else:
                vector.store_shared_v4(S.ptr_to([ring.stage(j) * 2 * chunk + col]), orr, 0)

    @T.prim_func
    def act_and_mul(x_ptr: T.handle, y_ptr: T.handle, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, 2 * d), dtype, strides=(x_stride, 1), align=16)
        Y = T.match_buffer(y_ptr, (M, d), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": ctas})
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([T.min(M * chunks, max_grid)])
        tid = T.thread_id([threads])
        pool = T.SMEMPool()  # everything in the one dynamic pool (no static __shared__)
        S = pool.alloc((stages * 2 * chunk,), dtype, align=128)
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.commit()
        gr = T.alloc_local((vpt * words,), "uint32")
        ur = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        tmp = T.alloc_local((2 * words,), "float32")
        pol = T.alloc_local((1,), "uint64")
        tiles = M * chunks
        grid = T.min(tiles, max_grid)
        n = (tiles - 1 - cta) // grid + 1  # tiles of this CTA (>= 1: grid <= tiles)
        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()  # the last CTA-wide barrier: producer and consumers part here
        if tid >= nc:
            if tid == nc:  # producer
                if load_hint is not None:
                    bulk.create_policy(pol[0], load_hint)
                for j in T.serial(n):
                    row, c0 = tile_rc(cta + j * grid)
                    ring.producer_acquire(empty, j)
                    if out == "bulk":
                        if j >= stages:  # the stage holds tile j - stages' output: store it, wait until read
                            prow, pc0 = tile_rc(cta + (j - stages) * grid)
                            store_tile(S, Yf, j - stages, prow, pc0, y_stride)
                            bulk.wait_read(0)
                    load_tile(S, full, Xf, j, row, c0, x_stride, pol)
                if out == "bulk":
                    for j in T.serial(T.max(n - stages, 0), n):
                        row, c0 = tile_rc(cta + j * grid)
                        mbarrier.wait(empty.ptr_to([ring.stage(j)]), ring.phase(j))  # tile j released
                        store_tile(S, Yf, j, row, c0, y_stride)
                    bulk.wait_read(0)  # smem stays valid until the last store has read it
        else:
            for j in T.serial(n):
                row, c0 = tile_rc(cta + j * grid)
                ring.consumer_wait(full, j)
                read_tile(S, j, tid, gr, ur)
                compute_out(S, Yf, j, row, c0, y_stride, tid, gr, ur, orr, tmp)
                if out == "bulk":
                    bulk.fence_proxy_async()  # this thread's st.shared -> visible to the bulk store
                T.cuda.warp_sync()  # the warp's reads (and writes) of the stage are done
                if tid % 32 == 0:
                    ring.consumer_release(empty, j)

    return act_and_mul


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(act: str, dtype: str, M: int, d: int, **_) -> dict:
    g = _generator()
    t = _DTYPES[dtype]
    x = torch.randn(M, 2 * d, generator=g, device="cuda", dtype=torch.float32).to(t)
    out = torch.full((M, d), float("nan"), device="cuda", dtype=t)
    return {"x": x, "act": act, "out": out}


def _torch_act(act: str, g: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    if act == "silu":
        return F.silu(g)
    return F.gelu(g, approximate="tanh" if act == "gelu_tanh" else "none")


def reference(x, act, **_) -> dict:
    d = x.shape[-1] // 2
    xf = x.float()
    return {"out": _torch_act(act, xf[..., :d]) * xf[..., d:]}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("schedule") == "general":  # the general kernel where the public op would pick the specialized one
        _check_inputs(f"{data['act']}_and_mul", data["x"], data["out"])
        _run(data["x"], data["act"], data["out"], general=True)
        return
    _PUBLIC[data["act"]](data["x"], out=data["out"])


def roofline(act: str, dtype: str, M: int, d: int, **_) -> dict:
    elem = 2
    per_elem = {"silu": 4, "gelu": 8, "gelu_tanh": 10}[act]  # rough fp32 op count of act + the product
    return {"bytes": 3 * M * d * elem, "flops": per_elem * M * d}


def get_baselines(**cfg) -> dict:
    act = cfg.get("act", "silu")

    def torch_eager():
        def fn(data):
            x = data["x"]
            d = x.shape[-1] // 2
            return {"out": _torch_act(act, x[..., :d]) * x[..., d:]}
        return fn

    def torch_compile():
        def f(x):
            d = x.shape[-1] // 2
            return _torch_act(act, x[..., :d]) * x[..., d:]
        compiled = torch.compile(f, dynamic=False)
        return lambda data: {"out": compiled(data["x"])}

    def flashinfer():
        if int(cfg.get("d", _VEC)) % _VEC:
            # FlashInfer 0.7.4 raises ValueError unless a row of x is a 16-byte multiple (d % 4 == 0), and at
            # d % 8 == 4 its 16-byte load of up at x + d faults (misaligned address), ending the CUDA context.
            raise ImportError(f"flashinfer's act_and_mul reads d % 8 == 0 only (d={cfg['d']})")
        import flashinfer.activation

        fn = getattr(flashinfer.activation, f"{act}_and_mul")
        return lambda data: {"out": fn(data["x"])}

    out = {"torch": torch_eager, "torch.compile": torch_compile, "flashinfer": flashinfer}
    if act == "silu":
        def liger():
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            def fn(data):
                x = data["x"]
                d = x.shape[-1] // 2
                return {"out": LigerSiLUMulFunction.apply(x[..., :d], x[..., d:])}
            return fn
        out["liger"] = liger
    return out


# ---------------------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------------------

def _fail(op: str, name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


_INT32_MAX = 2**31 - 1


def _check_row_strides(op: str, name: str, t: torch.Tensor) -> None:
    for dim in range(t.dim() - 1):
        if t.shape[dim] > 1 and abs(t.stride(dim)) > _INT32_MAX:
            _fail(op, name, f"a stride of dim {dim} below 2**31 elements (the kernels take 32-bit row strides)",
                  f"strides {tuple(t.stride())}")


def _check_inputs(op: str, x, out) -> None:
    checks.tensor(op, "x", x, dtypes=tuple(_DTYPES.values()), ndim=tuple(range(1, 9)), cuda=False)
    checks.multiple_of(op, "x", x.shape[-1], 2, "the last dim is 2*d: gate and up halves")
    if x.shape[-1] > _INT32_MAX:
        _fail(op, "x", "a last dim below 2**31 (32-bit column indices)", f"shape {tuple(x.shape)}")
    _check_row_strides(op, "x", x)
    if out is not None:
        checks.tensor(op, "out", out, shape=(*x.shape[:-1], x.shape[-1] // 2), cuda=False)
        checks.same_dtype(op, "x", x, out=out)
        _check_row_strides(op, "out", out)
        try:
            out.view(-1, out.shape[-1])
        except RuntimeError:
            _fail(op, "out", "leading dims that flatten to rows without a copy",
                  f"shape {tuple(out.shape)} strides {tuple(out.stride())}")
    checks.tensor(op, "x", x, cuda=True)
    if out is not None:
        checks.same_device(op, "x", x, out=out)


def _act_and_mul(op: str, act: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    _check_inputs(op, x, out)
    if runtime.direct_call(x, out):
        # Eager: the kernel straight away, not through the custom op (its dispatch costs more host time than a
        # small activation runs: runtime.direct_call).
        return runtime.run_direct(lambda dst: _run(x, act, dst), out, lambda: _new_out(x))
    if out is None:
        return torch.ops.tirx.act_and_mul(x, act)
    torch.ops.tirx.act_and_mul_out(x, act, out)
    return out


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` in fp32, rounded to x's dtype; x (..., 2d) bf16/fp16, any d >= 1, any
    row count and row strides (unit stride in the last dim)."""
    return _act_and_mul("silu_and_mul", "silu", x, out)


def gelu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]`` with the exact (erf) GELU; shapes as ``silu_and_mul``."""
    return _act_and_mul("gelu_and_mul", "gelu", x, out)


def gelu_tanh_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` (tanh-approximated GELU); shapes as ``silu_and_mul``."""
    return _act_and_mul("gelu_tanh_and_mul", "gelu_tanh", x, out)


_PUBLIC = {"silu": silu_and_mul, "gelu": gelu_and_mul, "gelu_tanh": gelu_tanh_and_mul}


def _rows_on_16_bytes(t: torch.Tensor) -> bool:
    """Whether every row of the 2-D ``t`` starts on 16 bytes (what the specialized kernel reads and writes)."""
    return t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % _VEC == 0)


def _run(x: torch.Tensor, act: str, out: torch.Tensor, general: bool = False) -> None:
    """``out = act(gate) * up``: the specialized kernel where d is a multiple of 8 and every row of x and out
    starts on 16 bytes (unless ``general``), else the general one; ``rows_per_launch`` rows a launch."""
    if act not in ACTS:
        raise checks.TirxInputError(f"act_and_mul: argument 'act': expected one of {ACTS}, got {act!r}")
    x2d = x.reshape(-1, x.shape[-1])  # a view for any row layout the checks accept (else a copy of the input)
    out2d = out.view(-1, out.shape[-1])
    M, d = out2d.shape
    if M == 0 or d == 0:
        return
    general = general or d % _VEC != 0 or not (_rows_on_16_bytes(x2d) and _rows_on_16_bytes(out2d))
    dtype = str(x.dtype)[6:]

    def params():
        return compile_params(act=act, dtype=dtype, d=d, **({"schedule": "general"} if general else {}))

    fn = _FUNCTIONS.get((act, x.dtype, d, general, x.get_device()), params)
    step = _ROWS_PER_LAUNCH.get((d, general)) or _ROWS_PER_LAUNCH.setdefault((d, general), rows_per_launch(params()))
    if M <= step:
        fn(x2d, out2d, 0)
        return
    for r in range(0, M, step):  # only past 65535 row blocks: each launch moves >= 400 MB
        fn(x2d[r:r + step], out2d[r:r + step], 0)


_ROWS_PER_LAUNCH: dict = {}


_FUNCTIONS = runtime.FunctionCache(__name__)


def _new_out(x: torch.Tensor) -> torch.Tensor:
    return torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)


@torch.library.custom_op("tirx::act_and_mul", mutates_args=())
def _act_and_mul_op(x: torch.Tensor, act: str) -> torch.Tensor:
    out = _new_out(x)
    _run(x, act, out)
    return out


@_act_and_mul_op.register_fake
def _(x, act):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("tirx::act_and_mul_out", mutates_args=("out",))
def _act_and_mul_out_op(x: torch.Tensor, act: str, out: torch.Tensor) -> None:
    _run(x, act, out)


@_act_and_mul_out_op.register_fake
def _(x, act, out):
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
