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
- Sweep variants (compile params, the tiling keys, ``ctas_per_sm``/``store_cache``/cache and L2 policies;
  tools/sweep_variants.py): other tilings, ``st.global.cs`` stores. The schedules that lost to "tile" (a
  persistent grid-stride loop over tiles, and "bulk": a producer warp bulk-copying tiles into a shared-memory
  mbarrier ring) are in tools/sweeps/act_and_mul_variants.py.
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
from tirx_kernels.core.op import OutOp

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


def sass_expect(act: str, dtype: str, d: int | None = None, schedule: str = "tile", **_) -> list[str]:
    """SASS the CPU build test asserts: 16-byte loads of gate/up, 16-byte stores; for "general", also the
    2-byte stores of a row's unaligned head and tail."""
    if schedule == "general":
        return [r"LDG\.E\.128", r"STG\.E\.128", r"STG\.E\.U16"]
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
# The sweep-only schedules that lost ("persistent", "bulk") live in tools/sweeps/act_and_mul_variants.py.
SCHEDULES = ("tile", "general")
TILE_KEYS = ("segments", "threads_per_segment", "vectors_per_thread", "rows_per_cta")
VARIANT_KEYS = ("schedule", *TILE_KEYS, "ctas_per_sm", "store_cache", "load_cache", "load_policy", "store_policy",
                "pdl")


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
               store_cache: str = "default", load_cache: str = LOAD_CACHE, load_policy: str | None = LOAD_POLICY,
               store_policy: str | None = STORE_POLICY, pdl: str | None = PDL, **tiling):
    """The kernel of ``schedule``; ``tiling`` (``TILE_KEYS``) overrides ``tile_plan(d)`` (the default).
    ``load_policy`` / ``store_policy`` (L2 priorities) and ``pdl`` (``core.lang.pdl``) apply to both schedules."""
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
    unknown = set(tiling) - set(TILE_KEYS)
    if unknown:
        raise ValueError(f"act_and_mul: unknown compile params {sorted(unknown)}")
    plan = {**tile_plan(d), **tiling}
    if plan["segments"] * plan["threads_per_segment"] * plan["vectors_per_thread"] * _VEC < d:
        raise ValueError(f"act_and_mul: tiling {plan} does not cover d={d}")
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
    return _CUSTOM_OP(x, act, out=out)  # eager: the kernel straight away (runtime.direct_call), else the custom op


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


def _new_out(x: torch.Tensor, act: str) -> torch.Tensor:
    return torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)


# tirx::act_and_mul(x, act) and tirx::act_and_mul_out(x, act, out), their fakes and the eager direct path.
_CUSTOM_OP = OutOp("act_and_mul", {"x": torch.Tensor, "act": str}, run=_run, new_out=_new_out)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
