# SPDX-License-Identifier: Apache-2.0
"""RMSNorm over the last dim for bf16/fp16 on Hopper: ``out = x * rsqrt(mean(x²) + eps) * weight``.

Semantics of FlashInfer's ``rmsnorm``: statistics and products in fp32, one rounding to x's dtype at the
end. x is (..., H), weight (H,) of x's dtype, eps a runtime scalar, any H >= 1 and any row strides (unit column
stride). Two kinds of artifact, with the same arguments (``compile_params`` picks, ``general_params`` maps the
first to the second, ``artifact_params`` lists what a bundle holds):
- specialized, one per (dtype, H) for H % 8 == 0 in [16, 16384] (every catalog size of ``core.model_dims``):
  H is a compile-time constant, rows and weight 16-byte aligned; M and the row strides are runtime arguments.
  Everything below describes this kernel.
- general (``_rmsnorm_general``), one per dtype: H, strides and alignments at run time; serves every other H
  and every call whose rows, weight or output do not start on 16 bytes.

Design (memory-bound: 2 bytes read + 2 written per element, the weight stays in L1/L2):
- A row is split over ``threads_per_row`` threads, each holding ``vectors_per_thread`` 16-byte vectors of
  x *and* of the weight in registers (packed words), all loads issued before any math (``vector.after_all``
  ties the sum of squares to the weight words); x is read exactly once. Vector ``v`` of lane ``l`` covers
  columns ``(v * threads_per_row + l) * 8 ..+8``: consecutive lanes, consecutive 16 bytes. Only the last
  vector of a thread can fall past H, so only it is predicated (``col < H``).
- Rows of <= 32 threads are reduced with shuffles only, several rows per CTA (CTAs of >= 128 threads);
  wider rows take one CTA per row (or two for H <= 2048) and one shared-memory exchange
  (``reduce.group_sum``, one barrier).
- x loads carry an L1 qualifier chosen per H (``x_load_cache``, measured): ``L1::no_allocate`` up to
  H = 5120 (every CTA on an SM reads the same weight, which should stay in L1 while x streams past),
  ``L1::evict_last`` above; and L2 eviction priorities (``row_access``, measured): x read L2 evict_last up to
  H = 7168; above, torch.compile's two passes (x read evict_last, re-read evict_first after the reduction,
  weight evict_last), which reached torch.compile at 32768 x 8192 (252.7 us, 4.25 TB/s).
- Launched as a programmatic dependent (``core.lang.pdl``, ``PDL``): every thread waits for the previous kernel
  before its first global access and signals the next after its stores, so back-to-back calls overlap one's
  launch with the other's tail (32x128 in a CUDA graph: 0.8 us vs 1.1).
- ptxas (nvcc 13.0), every config: 28-65 registers, 0-byte stack, no spills; SASS has only
  LDG.E.NA.128 / LDG.E.EL.128 / LDG.E.EF.128 (x) / LDG.E(.EL).128 (weight) / STG.E.128 global accesses, the
  first pass's loads ahead of the first FFMA.

- Sweep variants (compile params ``threads_per_row``/``ctas_per_sm``/``store_cache``/cache and L2 policies;
  tools/sweep_variants.py). The schedules that lost to "row" ("persistent" rows, and "bulk": rows through a
  shared-memory ring of 1-D TMA bulk copies; sweep rounds 1-2 and 7) are in tools/sweeps/rmsnorm_variants.py.

Measured (examples/rmsnorm_bf16.py, the same structure with 256 threads and the weight loaded after the
reduction): 32768x8192 bf16 at 4.04 TB/s (98 % of copy) on the H200, 8192x4096 at 3.57 TB/s.
"""

from __future__ import annotations

import os
import sys

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.core.op import OutOp

KERNEL_META = {
    "name": "rmsnorm",
    "category": "norm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "RMSNorm over the last dim (fp32 statistics), bf16/fp16, M and row strides dynamic",
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
        {"package": "liger-kernel", "import": "liger_kernel", "specifier": "==0.8.5", "baseline": "liger"},
        {"package": "quack-kernels", "import": "quack", "specifier": "==0.6.5", "baseline": "quack"},
    ],
    "public_ops": ["rmsnorm"],
}

# x_row_stride / out_row_stride (elements) default to H; M=1 and M=37 catch tail rows of multi-row CTAs.
CONFIGS = [
    {"label": "bf16_8192x4096", "dtype": "bfloat16", "M": 8192, "H": 4096},
    {"label": "bf16_32768x8192", "dtype": "bfloat16", "M": 32768, "H": 8192},
    {"label": "bf16_4113x8192", "dtype": "bfloat16", "M": 4113, "H": 8192},
    {"label": "bf16_32x128", "dtype": "bfloat16", "M": 32, "H": 128},
    {"label": "bf16_37x128", "dtype": "bfloat16", "M": 37, "H": 128},
    {"label": "bf16_1x16384", "dtype": "bfloat16", "M": 1, "H": 16384},
    {"label": "bf16_4113x2880", "dtype": "bfloat16", "M": 4113, "H": 2880},
    {"label": "bf16_37x5120", "dtype": "bfloat16", "M": 37, "H": 5120},
    {"label": "bf16_37x1024", "dtype": "bfloat16", "M": 37, "H": 1024},
    {"label": "bf16_8192x7168", "dtype": "bfloat16", "M": 8192, "H": 7168},
    {"label": "bf16_37x2880_strided", "dtype": "bfloat16", "M": 37, "H": 2880,
     "x_row_stride": 3072, "out_row_stride": 2944},
    {"label": "fp16_8192x4096", "dtype": "float16", "M": 8192, "H": 4096},
    {"label": "fp16_37x128", "dtype": "float16", "M": 37, "H": 128},
    {"label": "fp16_1x2880", "dtype": "float16", "M": 1, "H": 2880},
    {"label": "fp16_4113x5120", "dtype": "float16", "M": 4113, "H": 5120},
    {"label": "fp16_37x16384", "dtype": "float16", "M": 37, "H": 16384},
    {"label": "fp16_37x7168_strided", "dtype": "float16", "M": 37, "H": 7168, "x_row_stride": 7680},
    # The general kernel (one artifact per dtype, so these rows cost two builds): odd / tiny / long H, H > 16384,
    # rows whose 16-byte alignment changes from row to row (odd strides), x and out aligned differently (odd,
    # unequal strides: element-wise stores), an aligned H with odd strides (routed to the general kernel), and
    # rows longer than one register pass (two passes over x: 16392, 65537, 262144).
    {"label": "bf16_37x1", "dtype": "bfloat16", "M": 37, "H": 1},
    {"label": "fp16_37x7", "dtype": "float16", "M": 37, "H": 7},
    {"label": "bf16_37x111", "dtype": "bfloat16", "M": 37, "H": 111},
    {"label": "bf16_37x1544", "dtype": "bfloat16", "M": 37, "H": 1544},
    {"label": "bf16_37x3001", "dtype": "bfloat16", "M": 37, "H": 3001},
    {"label": "fp16_37x3001", "dtype": "float16", "M": 37, "H": 3001},
    {"label": "bf16_3x16392", "dtype": "bfloat16", "M": 3, "H": 16392},
    {"label": "fp16_3x65537", "dtype": "float16", "M": 3, "H": 65537},
    {"label": "bf16_1x262144", "dtype": "bfloat16", "M": 1, "H": 262144},
    {"label": "bf16_3x262144", "dtype": "bfloat16", "M": 3, "H": 262144},
    {"label": "bf16_37x3001_strided_odd", "dtype": "bfloat16", "M": 37, "H": 3001,
     "x_row_stride": 3011, "out_row_stride": 3005},
    {"label": "fp16_37x111_strided_odd", "dtype": "float16", "M": 37, "H": 111, "x_row_stride": 113},
    {"label": "fp16_37x7_strided_odd", "dtype": "float16", "M": 37, "H": 7, "x_row_stride": 9, "out_row_stride": 11},
    {"label": "bf16_37x2880_strided_odd", "dtype": "bfloat16", "M": 37, "H": 2880, "x_row_stride": 2883},
    {"label": "fp16_3x16392_strided_odd", "dtype": "float16", "M": 3, "H": 16392,
     "x_row_stride": 16397, "out_row_stride": 16395},
]

# The benchmark rows of the issue (and ANCHORS.md): two large memory-bound rows, a ragged M, a tiny one.
BENCH_CONFIGS = [
    {"label": "bf16_8192x4096", "dtype": "bfloat16", "M": 8192, "H": 4096},
    {"label": "bf16_32768x8192", "dtype": "bfloat16", "M": 32768, "H": 8192},
    {"label": "bf16_4113x8192", "dtype": "bfloat16", "M": 4113, "H": 8192},
    {"label": "bf16_32x128", "dtype": "bfloat16", "M": 32, "H": 128},
    {"label": "bf16_8192x7168", "dtype": "bfloat16", "M": 8192, "H": 7168},
    {"label": "fp16_4113x5120", "dtype": "float16", "M": 4113, "H": 5120},
    # Issue 19: an odd H (the general kernel) against the nearest aligned one (specialized, and the general kernel
    # pinned by "schedule"), 1544, and a long row (two passes, see _rmsnorm_general).
    {"label": "bf16_8192x3000", "dtype": "bfloat16", "M": 8192, "H": 3000},
    {"label": "bf16_8192x3001", "dtype": "bfloat16", "M": 8192, "H": 3001},
    {"label": "bf16_8192x3000_general", "dtype": "bfloat16", "M": 8192, "H": 3000, "schedule": "general"},
    # sweep candidates of the general kernel's shape (default: 128 threads x 8 vectors, 8 CTAs an SM): 4 vectors
    # (46 registers, 11 CTAs an SM; rows > 4096 take two passes), 64 threads (63 registers, 16 CTAs: 16 rows in
    # flight an SM; rows > 4096 take two passes)
    {"label": "bf16_8192x3001_general_v4", "dtype": "bfloat16", "M": 8192, "H": 3001, "schedule": "general",
     "vectors_per_thread": 4, "ctas_per_sm": 10},
    {"label": "bf16_8192x3001_general_t64", "dtype": "bfloat16", "M": 8192, "H": 3001, "schedule": "general",
     "threads_per_row": 64, "ctas_per_sm": 16},
    {"label": "bf16_8192x1544", "dtype": "bfloat16", "M": 8192, "H": 1544},
    {"label": "bf16_1024x262144", "dtype": "bfloat16", "M": 1024, "H": 262144},
]

DEFAULTS = {"dtype": "bfloat16", "eps": 1e-6}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_OP = "rmsnorm"
_VEC = 8  # 16-bit elements per 16-byte vector
MIN_H, MAX_H = 16, 16384  # the specialized kernels (H % 8 == 0 too)
# The general kernel takes H, M and the row strides as int32 arguments and computes columns in int32 (with a
# chunk of headroom); row offsets are 64-bit, so M * H may exceed 2**31.
MAX_GENERAL_H = 2**30
MAX_ROWS = MAX_STRIDE = 2**31 - 1

# ---------------------------------------------------------------------------------------------------------
# Row plan: how a row of H elements is spread over threads
# ---------------------------------------------------------------------------------------------------------

# (max H, 16-byte vectors of x each thread holds). Fewer, wider-spread vectors for small rows keep the CTA
# count up; 4 vectors (64 B of x + 64 B of weight, 32 registers) for large rows keep enough bytes in flight
# per SM with a full 2048 threads resident. The example at 32768x8192 (256 threads x 4) reached 98 % of copy.
# Sweep on the H200 (tools/sweep_variants.py, cold L2): 2 vectors with more threads beat 4 at H=4096
# (256 thr: 36.8 us vs 37.3 at 8192 rows) and H=8192 (512 thr: 263.7 us, 4.07 TB/s, vs 274.5 at 32768 rows);
# 1 vector (1024 thr) lost badly at 8192 (351.7 us); 4 stayed best at 5120 fp16 (23.6 vs 24.6 with 2).
VECTORS_PER_THREAD = [(256, 1), (4096, 2), (7168, 4), (8192, 2), (MAX_H, 4)]
MIN_CTA_THREADS = 128  # rows of <= 32 threads are packed into CTAs of at least this many threads

# (max H, L1 qualifier of the x loads): sweep rounds 3-5 on the H200 (cold L2; logs in
# docs/measurements/2026-12-02-h200-b/). 32768x8192: L1::evict_last 259.2 us, plain 259.9, L1::no_allocate
# 263.5 (torch.compile 252.5; two passes over x as torch.compile does: 262.4); 8192x7168: evict_last
# 60.2-60.7, no_allocate 60.9-62.0; 8192x4096: no_allocate 36.0-36.1, evict_last 36.8-37.5; fp16 4113x5120:
# equal (23.8).
X_LOAD_CACHE = [(5120, "stream"), (MAX_H, "evict_last")]


def x_load_cache(H: int) -> str:
    return next(c for max_h, c in X_LOAD_CACHE if H <= max_h)


# (max H, how the row kernel touches memory by default): L2 eviction priorities (``.L2::cache_hint``), sweep
# round 8 on the H200 (docs/measurements/2026-12-03b-h200/sweep-round8.log, cold L2 after a 512 MiB *write*
# flush, whose dirty lines fill L2). Up to H = 7168 one pass with x read L2 evict_last: 8192x4096 36.2 us vs 37.7
# without (liger 37.1), 8192x7168 58.8 vs 60.8 (torch.compile 59.4), fp16 4113x5120 equal (24.4).
# Above, torch.compile's (Inductor's) two passes: x read L1+L2 evict_last, reduced, re-read L1+L2 evict_first
# (the lines leave L2 first once used), weight evict_last: 32768x8192 252.7 us vs 259.0 one-pass (torch.compile
# 252.7, both at the 4.25 TB/s copy ceiling). The same pattern without the L2 policies (round 5) ran 262-264:
# the policies, not the second pass, are what made Inductor's kernel faster.
_TWO_PASS = {"load_cache": "evict_last", "reload_cache": "evict_first", "x_policy": "evict_last",
             "reload_policy": "evict_first", "weight_policy": "evict_last"}
ROW_ACCESS = [(7168, {"x_policy": "evict_last"}), (MAX_H, _TWO_PASS)]
# Programmatic dependent launch of the row kernel (``core.lang.pdl``; FlashInfer launches its norms so on Hopper):
# wait before the first global access, signal the next kernel after the stores. Sweep round 9 on the H200
# (docs/measurements/2026-12-03c-h200/sweep-round9.log): 32x128 from a CUDA graph of back-to-back calls 0.8 us
# vs 1.1 without (liger 1.4, FlashInfer's CUDA kernel 1.6; "early" trigger equal); cold L2 8192x4096 35.4 vs
# 36.1, 32768x8192 252.8 vs 252.5, 37x8192 5.1 both (equal within the rounds' spread).
PDL = "end"
ACCESS_KEYS = ("load_cache", "reload_cache", "x_policy", "reload_policy", "weight_policy", "store_policy")


def row_access(H: int) -> dict:
    """The default cache qualifiers and L2 policies of the row kernel at H (``ACCESS_KEYS`` -> value)."""
    plan = dict(next(a for max_h, a in ROW_ACCESS if H <= max_h))
    plan.setdefault("load_cache", x_load_cache(H))
    return plan


def sass_expect(dtype: str, H: int | None = None, schedule: str = "row", **_) -> list[str]:
    """SASS the CPU build test asserts: 16-byte loads of x and weight, 16-byte stores; for "general", 16-byte
    accesses for the middle of a row (x past L1, the weight through it) and 2-byte ones for its unaligned ends."""
    if schedule == "general":
        return [r"LDG\.E\.NA\.128", r"LDG\.E\.128", r"STG\.E\.128", r"LDG\.E\.U16", r"STG\.E\.U16"]
    return [r"LDG\.E(\.NA|\.EL|\.EF)?\.128", r"STG\.E\.128"]


def row_plan(H: int) -> dict:
    """``threads_per_row``, ``rows_per_cta``, ``vectors_per_thread`` for rows of H elements.

    Rows of more than 32 threads use whole warps, as few as the target vectors per thread allows, so
    that most rows divide exactly (5120 -> 5 warps x 4 vectors, 7168 -> 7 warps x 4); rows of <= 32
    threads use a power of two (shuffle groups).
    """
    nvec = H // _VEC
    target = next(v for max_h, v in VECTORS_PER_THREAD if H <= max_h)
    want = -(-nvec // target)
    if want <= 32:
        threads_per_row = max(2, 1 << (want - 1).bit_length())
    else:
        threads_per_row = 32 * -(-want // 32)
    return {"threads_per_row": threads_per_row,
            "rows_per_cta": max(1, MIN_CTA_THREADS // threads_per_row),
            "vectors_per_thread": -(-nvec // threads_per_row)}


# Schedules (sweeps pin them through compile params; the public op uses "row" where H is specialized).
# "row": one row (or several short rows) per CTA, the grid covers M (``build_kernel``); "general": any H and
# alignment (``_rmsnorm_general``). The sweep-only schedules that lost ("persistent", "bulk") live in
# tools/sweeps/rmsnorm_variants.py.
SCHEDULES = ("row", "general")
VARIANT_KEYS = ("schedule", "threads_per_row", "rows_per_cta", "ctas_per_sm", "store_cache", "load_cache",
                "weight_late", "reload_cache", "x_policy", "reload_policy", "weight_policy", "store_policy", "pdl")
GENERAL_KEYS = ("threads_per_row", "vectors_per_thread", "ctas_per_sm")  # the general kernel's sweep knobs


def specialized(H: int) -> bool:
    """Whether H has specialized kernels (rows that also start on 16 bytes use them; ``_run``)."""
    return H % _VEC == 0 and MIN_H <= H <= MAX_H


def compile_params(**cfg) -> dict:
    """The specialized params where H has them, else (or with ``schedule="general"``) the general params."""
    if cfg.get("schedule") == "general" or not specialized(int(cfg["H"])):
        return {"dtype": cfg["dtype"], "schedule": "general", **{k: cfg[k] for k in GENERAL_KEYS if k in cfg}}
    params = {"dtype": cfg["dtype"], "H": int(cfg["H"])}
    params.update({k: cfg[k] for k in VARIANT_KEYS if k in cfg})
    return params


def general_params(params: dict) -> dict:
    """The general artifact's params: it serves every call any rmsnorm params serve."""
    return {"dtype": params["dtype"], "schedule": "general"}


def artifact_params() -> list[dict]:
    """What a bundle holds besides the CONFIGS rows: the general kernel of each dtype and the specialized kernel
    of every catalog hidden size and head dim that has one."""
    from tirx_kernels.core import model_dims

    sizes = sorted({H for H in model_dims.hidden_sizes() + model_dims.head_dims() if specialized(H)})
    return [p for dtype in _DTYPES for p in
            [general_params({"dtype": dtype})] + [compile_params(dtype=dtype, H=H) for H in sizes]]


def call_samples(rng) -> list[dict]:
    """Calls the public op can see (PROTOCOL.md; core's bundle-resolution test): every catalog hidden size and head
    dim, random H up to 262144 (odd ones among them), both dtypes, decode-to-prefill M."""
    from tirx_kernels.core import model_dims

    sizes = model_dims.hidden_sizes() + model_dims.head_dims()
    sizes += [rng.randint(1, 64) for _ in range(5)] + [rng.randint(1, 20000) for _ in range(10)]
    sizes += [8 * rng.randint(2, 2048) for _ in range(10)] + [rng.randint(16385, 262144) for _ in range(3)]
    return [{"dtype": dtype, "M": rng.choice([1, 37, 4096]), "H": H} for dtype in _DTYPES for H in sizes]


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, H: int | None = None, schedule: str = "row", threads_per_row: int | None = None,
               rows_per_cta: int | None = None, ctas_per_sm: int | None = None, store_cache: str = "default",
               load_cache: str | None = None, weight_late: bool = False, reload_cache: str | None = None,
               x_policy: str | None = None, reload_policy: str | None = None, weight_policy: str | None = None,
               store_policy: str | None = None, pdl: str | None = PDL, vectors_per_thread: int | None = None):
    """The kernel of ``schedule``; unset plan entries come from ``row_plan`` (the default variant). ``pdl``
    (row and general schedules): programmatic dependent launch, ``core.lang.pdl.TRIGGERS`` or None.
    ``schedule="general"``: the general kernel (``_rmsnorm_general``; H is a runtime argument, None here), with
    ``threads_per_row``, ``vectors_per_thread``, ``ctas_per_sm`` as sweep knobs."""
    if dtype not in _DTYPES:
        raise ValueError(f"rmsnorm: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if schedule == "general":
        if H is not None:
            raise ValueError(f"rmsnorm: the general kernel takes H at run time, got H={H}")
        from . import _rmsnorm_general as _general
        from ._rmsnorm_general import build_general

        return build_general(dtype, pdl, threads_per_row or _general.THREADS, vectors_per_thread or _general.VECTORS,
                             ctas_per_sm)
    if H % _VEC or not MIN_H <= H <= MAX_H:
        raise ValueError(f"rmsnorm: H={H} must be a multiple of {_VEC} in [{MIN_H}, {MAX_H}]")
    if schedule not in SCHEDULES:
        raise ValueError(f"rmsnorm: schedule {schedule!r} is not one of {SCHEDULES}")
    plan = row_plan(H)
    tpr = threads_per_row or plan["threads_per_row"]
    access = dict(zip(ACCESS_KEYS, (load_cache, reload_cache, x_policy, reload_policy, weight_policy, store_policy)))
    if all(v is None for v in access.values()):  # no access variant pinned: the measured default
        access.update(row_access(H))
    access["load_cache"] = access["load_cache"] or x_load_cache(H)
    rows = rows_per_cta or (plan["rows_per_cta"] if threads_per_row is None else max(1, MIN_CTA_THREADS // tpr))
    return build_kernel(dtype, H, tpr, rows, store_cache, load_cache=access["load_cache"],
                        min_ctas_per_sm=ctas_per_sm, weight_late=weight_late, reload_cache=access["reload_cache"],
                        policies={"x": access["x_policy"], "reload": access["reload_policy"],
                                  "weight": access["weight_policy"], "store": access["store_policy"]}, pdl=pdl)


# Row pieces every schedule shares (plain Python run while a prim_func is parsed; they emit statements).
# Vector ``v`` of lane ``l`` of a row spread over ``tpr`` threads covers columns ``(v * tpr + l) * 8 ..+8``.

def _col_pred(v: int, lane, tpr: int, H: int):
    """None where vector ``v`` of every lane lies inside the row, else the test ``col < H``."""
    return (v * tpr + lane) * _VEC < H if (v + 1) * tpr * _VEC > H else None


def _sum_squares(acc, xr, nwords: int, dtype: str, base: int = 0):
    """``acc[0] += sum(x^2)`` over the packed words ``xr[base:base+nwords]`` (fp32)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    for i in range(base, base + nwords):
        lo, hi = vector.unpack2(xr[i], dtype)
        T.buffer_store(acc, acc[0] + lo * lo + hi * hi, [0])


def _scale_vector(orr, xr, wr, v: int, rs, dtype: str, x_base: int | None = None):
    """``orr[0:4]`` <- vector ``v`` of ``x * rs * w``, rounded once; x of the vector at ``xr[x_base:+4]``
    (default ``4 * v``: every vector of the thread held in ``xr``)."""
    from tirx_kernels.core.lang import vector

    words = vector.WORDS_PER_VECTOR
    xb = v * words if x_base is None else x_base
    for j in range(words):
        x_lo, x_hi = vector.unpack2(xr[xb + j], dtype)
        w_lo, w_hi = vector.unpack2(wr[v * words + j], dtype)
        vector.pack2(orr, j, x_lo * rs * w_lo, x_hi * rs * w_hi, dtype)


def build_kernel(dtype: str, H: int, threads_per_row: int, rows_per_cta: int, store_cache: str = "default",
                 load_cache: str = "stream", min_ctas_per_sm: int | None = None, weight_late: bool = False,
                 reload_cache: str | None = None, policies: dict | None = None, pdl: str | None = None):
    """The kernel for an explicit plan (``get_kernel`` takes it from ``row_plan``; sweeps call this).

    ``load_cache``: ``vector.LOAD_CACHE`` qualifiers of the x loads. ``min_ctas_per_sm``: emit
    ``__launch_bounds__(threads, min_ctas_per_sm)`` (a register cap). ``weight_late``: load the weight
    after the reduction instead of with x (fewer live registers; its L1/L2 latency is then exposed).
    ``reload_cache``: two passes over x, as torch.compile's reduction does: x is not held across the
    reduction but loaded again after it (an L1/L2 hit) with these qualifiers, together with the weight.
    ``policies``: L2 eviction priorities (``vector.L2_PRIORITIES``, None = no ``.L2::cache_hint``) of the
    accesses "x" (first read), "reload", "weight" and "store". ``pdl``: launched as a programmatic dependent
    (``core.lang.pdl``): every thread waits for the previous kernel before its first global access, and
    signals the next one after its stores ("end") or right after the wait ("early").
    """
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("rmsnorm", pdl)
    access = vector.AccessPolicies("rmsnorm", policies)
    weight_late = weight_late or reload_cache is not None

    tpr = threads_per_row
    vpt = vector.ceil_div(H // _VEC, tpr)
    threads = tpr * rows_per_cta
    words = vector.WORDS_PER_VECTOR
    scratch_len = max(1, reduce.scratch_words(tpr, rows_per_cta))
    inv_h = 1.0 / H

    def row_pred(row, M):
        """None when every CTA row exists (one row per CTA), else ``row < M`` for the tail CTA."""
        return None if rows_per_cta == 1 else row < M

    def vector_pred(v, lane, row_ok):
        """None where vector ``v`` of every lane is inside the row (and the row exists), else the test."""
        col_ok = _col_pred(v, lane, tpr, H)
        if row_ok is None or col_ok is None:
            return col_ok if row_ok is None else row_ok
        return T.And(row_ok, col_ok)

    def load_row(regs, buf, base, lane, row_ok, cache, policy=None):
        for v in range(vpt):
            pred = vector_pred(v, lane, row_ok)
            if pred is not None:
                vector.fill(regs, v * words, words)  # masked vectors add 0 to the sum of squares
            vector.load_v4(regs, v * words, buf.ptr_to([base + (v * tpr + lane) * _VEC]), pred, cache=cache,
                           policy=policy)

    def scale_store(buf, base, lane, row_ok, xr, wr, orr, rs, policy=None):
        for v in range(vpt):
            _scale_vector(orr, xr, wr, v, rs, dtype)
            vector.store_v4(buf.ptr_to([base + (v * tpr + lane) * _VEC]), orr, 0, vector_pred(v, lane, row_ok),
                            cache=store_cache, policy=policy)

    @T.prim_func
    def rmsnorm(x_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, eps: T.float32, zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, strides=(x_stride, 1), align=16)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (M, H), dtype, strides=(y_stride, 1), align=16)
        T.device_entry()
        if min_ctas_per_sm is not None:
            T.attr({"tirx.launch_bounds_min_blocks_per_sm": min_ctas_per_sm})
        # Flat views indexed row * stride + col: TIRx 0.27 binds match_buffer strides on the host but
        # drops them from device indexing (it addresses X[r, c] as r * H + c).
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        cta = T.cta_id([(M + rows_per_cta - 1) // rows_per_cta])
        tid = T.thread_id([threads])
        xr = T.alloc_local((vpt * words,), "uint32")
        wr = T.alloc_local((vpt * words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        acc = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((scratch_len,), "float32")
        pol = T.alloc_local((access.count,), "uint64")
        access.create(pol)
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write x or read out

        # Loads: the weight, then the row of x, all issued before any math. Without the ``after_all``
        # dependency below ptxas sank the weight loads below the sum of squares (SASS of H=4096: 4
        # LDG.E.NA.128 of x, the FMAs, then 4 LDG.E.128), exposing their L1/L2 latency after x arrived.
        row = cta * rows_per_cta + tid // tpr
        lane = tid % tpr
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        if weight_late:
            load_row(xr, Xf, x_base, lane, row_pred(row, M), load_cache, access.operand(pol, "x"))
            acc[0] = T.cuda.uint_as_float(vector.after_all(xr, vpt * words, zero))  # 0.0, after all of x
        else:
            load_row(wr, Wt, 0, lane, None, "default", access.operand(pol, "weight"))
            load_row(xr, Xf, x_base, lane, row_pred(row, M), load_cache, access.operand(pol, "x"))
            acc[0] = T.cuda.uint_as_float(vector.after_all(wr, vpt * words, zero))  # 0.0, after the weight

        # Sum of squares in fp32 over the row, then the reciprocal RMS.
        _sum_squares(acc, xr, vpt * words, dtype)
        total = reduce.group_sum(acc[0], tid, tpr, scratch)
        rs = T.rsqrt(total * T.float32(inv_h) + eps)
        if weight_late:
            load_row(wr, Wt, 0, lane, None, "default", access.operand(pol, "weight"))
        if reload_cache is not None:
            load_row(xr, Xf, x_base, lane, row_pred(row, M), reload_cache, access.operand(pol, "reload"))

        # out = x * rs * w, rounded once.
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        scale_store(Yf, y_base, lane, row_pred(row, M), xr, wr, orr, rs, access.operand(pol, "store"))
        pdl_launch.end(pdl)

    return pdl_launch.launch(rmsnorm, pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _rows(M: int, H: int, row_stride: int | None, t: torch.dtype, fill: float | None, g=None) -> torch.Tensor:
    stride = row_stride or H
    if fill is None:
        base = torch.randn(M, stride, generator=g, device="cuda", dtype=torch.float32).to(t)
    else:
        base = torch.full((M, stride), fill, device="cuda", dtype=t)
    return base[:, :H]


def prepare_data(dtype: str, M: int, H: int, eps: float = 1e-6, x_row_stride: int | None = None,
                 out_row_stride: int | None = None, **_) -> dict:
    g = _generator()
    t = _DTYPES[dtype]
    x = _rows(M, H, x_row_stride, t, None, g)
    weight = torch.randn(H, generator=g, device="cuda", dtype=torch.float32).to(t)
    out = _rows(M, H, out_row_stride, t, float("nan"))
    return {"x": x, "weight": weight, "eps": eps, "out": out}


def reference(x, weight, eps, **_) -> dict:
    xf = x.float()
    return {"out": xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("schedule") == "general":  # the general kernel (its knobs too) at any H, to compare with specialized
        _run(data["x"], data["weight"], float(data["eps"]), data["out"], pinned=compile_params(**cfg))
        return
    rmsnorm(data["x"], data["weight"], data["eps"], out=data["out"])


def roofline(dtype: str, M: int, H: int, **_) -> dict:
    elem = 2
    return {"bytes": 2 * M * H * elem + H * elem, "flops": 3 * M * H}


# Shapes a library baseline cannot take (read from their sources, not run here): reported as a missing reference
# (the harness records an ImportError raised by a builder as "skipped" with its reason), not as our failure.
LIGER_MAX_H = 65536  # liger's Triton kernel holds a row in one block of at most 65536 elements
QUACK_H_MULTIPLE = 8  # quack 0.6.x assumes 16-byte aligned rows and weight (from_dlpack(assumed_align=16))


def _unsupported(name: str, why: str):
    raise ImportError(f"{name} does not take this shape: {why}")


def get_baselines(**cfg) -> dict:
    H = cfg.get("H", 0)

    def torch_eager():
        import torch.nn.functional as F

        return lambda d: {"out": F.rms_norm(d["x"], (d["x"].shape[-1],), d["weight"], d["eps"])}

    def torch_compile():
        import torch.nn.functional as F

        fn = torch.compile(lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps), dynamic=False)
        return lambda d: {"out": fn(d["x"], d["weight"], d["eps"])}

    # The library baselines get contiguous rows (a no-op for the contiguous configs, so benchmarks are
    # unaffected): their stride support is theirs to document, not ours to test.
    def flashinfer():
        import flashinfer.norm

        return lambda d: {"out": flashinfer.norm.rmsnorm(d["x"].contiguous(), d["weight"], d["eps"])}

    def liger():
        if H > LIGER_MAX_H:
            _unsupported("liger", f"H={H} > {LIGER_MAX_H}")
        from liger_kernel.transformers.functional import liger_rms_norm

        # casting_mode "gemma": everything in fp32, one rounding (the default "llama" rounds x * rstd to
        # x's dtype before the weight product).
        return lambda d: {"out": liger_rms_norm(d["x"].contiguous(), d["weight"], d["eps"], offset=0.0,
                                                casting_mode="gemma")}

    def quack():
        if H % QUACK_H_MULTIPLE:
            _unsupported("quack", f"H={H} is not a multiple of {QUACK_H_MULTIPLE}")
        import quack

        return lambda d: {"out": quack.rmsnorm(d["x"].contiguous(), d["weight"], eps=d["eps"])}

    return {"torch": torch_eager, "torch.compile": torch_compile, "flashinfer": flashinfer, "liger": liger,
            "quack": quack}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def _check_rows(name: str, t: torch.Tensor) -> None:
    """The kernels take the row count and the row stride as int32 arguments."""
    rows = t.numel() // max(1, t.shape[-1])
    if rows > MAX_ROWS:
        _fail(name, f"at most {MAX_ROWS} rows (the leading dims' product)", str(rows))
    for d in range(t.dim() - 1):
        if t.shape[d] > 1 and not 0 <= t.stride(d) <= MAX_STRIDE:
            _fail(name, f"strides of the leading dims in [0, {MAX_STRIDE}]", f"strides {tuple(t.stride())}")


def _check_inputs(x, weight, eps, out) -> None:
    checks.tensor(_OP, "x", x, dtypes=tuple(_DTYPES.values()), ndim=tuple(range(1, 9)), cuda=False)
    H = x.shape[-1]
    checks.in_range(_OP, "x", H, 1, MAX_GENERAL_H)
    checks.tensor(_OP, "weight", weight, shape=(H,), cuda=False)
    checks.same_dtype(_OP, "x", x, weight=weight)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _fail("eps", "a float", type(eps).__name__)
    _check_rows("x", x)
    if out is not None:
        checks.tensor(_OP, "out", out, shape=tuple(x.shape), cuda=False)
        checks.same_dtype(_OP, "x", x, out=out)
        _check_rows("out", out)
        try:
            out.view(-1, H)
        except RuntimeError:
            _fail("out", "leading dims that flatten to rows without a copy",
                  f"shape {tuple(out.shape)} strides {tuple(out.stride())}")
    checks.tensor(_OP, "x", x, cuda=True)
    checks.tensor(_OP, "weight", weight, cuda=True)
    checks.same_device(_OP, "x", x, weight=weight, **({} if out is None else {"out": out}))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None):
    """``x * rsqrt(mean(x.float()**2, -1) + eps) * weight`` in fp32, rounded to x's dtype.

    x (..., H) bf16/fp16, 1 <= H <= 2**30, unit last-dim stride, any row strides; weight (H,) of the same dtype;
    ``out`` (same shape and dtype, any row strides) when given.
    """
    _check_inputs(x, weight, eps, out)
    return _CUSTOM_OP(x, weight, float(eps), out=out)  # eager: the kernel directly (runtime.direct_call)


def _aligned_rows(t: torch.Tensor) -> bool:
    """Rows (2-D) start on 16 bytes: what the specialized kernels read with 16-byte vectors only."""
    return t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % _VEC == 0)


def uses_general(x2d: torch.Tensor, weight: torch.Tensor, out2d: torch.Tensor) -> bool:
    """Whether a call runs the general kernel: H has no specialized kernel, or a row of x or out or the weight
    does not start on 16 bytes."""
    return not (specialized(x2d.shape[1]) and _aligned_rows(x2d) and _aligned_rows(out2d)
                and weight.data_ptr() % 16 == 0)


def _unit_columns(t: torch.Tensor) -> torch.Tensor:
    """A 2-D view with column stride 1 (the checks leave the stride of a size-1 last dim free; the kernels'
    argument checks do not)."""
    return t if t.stride(1) == 1 else t.as_strided(t.shape, (t.stride(0), 1))


def _run(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,
         pinned: dict | None = None) -> None:
    """The kernel on 2-D views; ``pinned``: the params of a general kernel to run (bench rows), else the call picks."""
    H = x.shape[-1]
    x2d = _unit_columns(x.reshape(-1, H))  # a view for any row layout the checks accept (copies only exotic 3-D)
    out2d = _unit_columns(out.view(-1, H))
    weight = weight if weight.stride(0) == 1 else weight.as_strided((H,), (1,))
    if x2d.shape[0] == 0:
        return
    if pinned is not None:
        runtime.get_function(sys.modules[__name__], pinned)(x2d, weight, out2d, eps, 0)
        return
    dtype = str(x.dtype)[6:]
    general = uses_general(x2d, weight, out2d)
    fn = _FUNCTIONS.get((x.dtype, H, general, x.get_device()),
                        lambda: general_params({"dtype": dtype}) if general else compile_params(dtype=dtype, H=H))
    fn(x2d, weight, out2d, eps, 0)  # zero: see vector.after_all


_FUNCTIONS = runtime.FunctionCache(__name__)


def _new_out(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


# tirx::rmsnorm(x, weight, eps) and tirx::rmsnorm_out(x, weight, eps, out), their fakes and the eager direct path.
_CUSTOM_OP = OutOp("rmsnorm", {"x": torch.Tensor, "weight": torch.Tensor, "eps": float}, run=_run, new_out=_new_out)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
