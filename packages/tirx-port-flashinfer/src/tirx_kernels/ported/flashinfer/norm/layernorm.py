# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's layernorm (bf16 rows, fp32 gamma and beta).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/norm (layernorm),
# include/flashinfer/norm.cuh (generalLayerNorm) and flashinfer/norm/kernels/layernorm.py (its CuTe-DSL path), release
# v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec); read at fb28d7242b3506a2348265962041acc1fb56cca4.
# Written anew in TIRx: same semantics (fp32 mean, then the fp32 mean of squared deviations, one rounding), different
# structure.
"""``out = (x - mean) * rsqrt(var + eps) * gamma + beta`` over the last dim of bf16 rows ``x`` (M, H), gamma and beta
fp32 (H,): FlashInfer's ``layernorm(input, gemma, beta, eps)`` (its gamma argument is spelled ``gemma``).

Statistics as upstream, in two passes over the row: ``mean = sum(x) / H``, then ``var = sum((x - mean)**2) / H`` (no
``E[x**2] - mean**2``, which cancels catastrophically in fp32 for rows with a large mean). The output is rounded to
bf16 once. Rows may have any row stride (the CuTe-DSL path upstream takes one; the CUDA path assumes contiguous
rows); ``out=`` is optional (any row stride too).

Two kinds of artifact with the same arguments (``input, gamma, beta, out, eps, zero``):
- specialized, per H for H % 8 == 0 in [16, 16384], rows, out, gamma and beta on 16 bytes: a row is spread over
  ``threads_per_row`` threads holding ``vectors_per_thread`` 16-byte vectors of x in registers (loads issued before
  any math, ``vector.after_all``); both sums are over the held words, so x is read from DRAM once. gamma and beta
  (8 KB to 64 KB, shared by every row, L1/L2-resident) are loaded as fp32 words after the reductions, vector by
  vector, so they cost no registers while the row is held. Rows of <= 32 threads are packed several to a CTA and
  reduced with shuffles; wider rows take one CTA and one shared-memory exchange per sum.
- general (``schedule="general"``): H, strides and alignment at run time, one CTA of ``GENERAL_THREADS`` per row,
  element by element (coalesced 2-byte accesses): rows up to ``GENERAL_THREADS * GENERAL_HELD`` = 4096 held in
  registers, longer ones in three passes (sum, squared deviations, output; the second and third from L1/L2).
  Serves odd H (FlashInfer's tests use H = 129), H > 16384, unaligned views.
Both launch as programmatic dependents (``core.lang.pdl``). ptxas (nvcc 13.0, sm_90a): specialized 32 (H = 128),
40 (4096), 58 (16384) registers, general 46; no spills, no stack.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, op

KERNEL_META = {
    "name": "flashinfer_layernorm",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "LayerNorm of bf16 rows with fp32 gamma / beta, two-pass fp32 statistics",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["layernorm"],
}

# FlashInfer's test sizes (M in {1, 2, 3, 128} x H in {128, 129, 1024, 16384}, a cover), a large mean (the two-pass
# variance), strided rows, and the general kernel pinned at an aligned H.
CONFIGS = [
    {"label": "bf16_1x128", "dtype": "bfloat16", "M": 1, "H": 128},
    {"label": "bf16_2x129", "dtype": "bfloat16", "M": 2, "H": 129},
    {"label": "bf16_3x1024", "dtype": "bfloat16", "M": 3, "H": 1024},
    {"label": "bf16_128x16384", "dtype": "bfloat16", "M": 128, "H": 16384},
    {"label": "bf16_128x128", "dtype": "bfloat16", "M": 128, "H": 128},
    {"label": "bf16_3x129", "dtype": "bfloat16", "M": 3, "H": 129},
    {"label": "bf16_1x16384", "dtype": "bfloat16", "M": 1, "H": 16384},
    {"label": "bf16_128x1024", "dtype": "bfloat16", "M": 128, "H": 1024},
    {"label": "bf16_128x129", "dtype": "bfloat16", "M": 128, "H": 129},
    {"label": "bf16_2x16384", "dtype": "bfloat16", "M": 2, "H": 16384},
    {"label": "bf16_99x4096_mean100", "dtype": "bfloat16", "M": 99, "H": 4096, "mean": 100.0},
    {"label": "bf16_19x4096_strided", "dtype": "bfloat16", "M": 19, "H": 4096, "input_row_stride": 4608},
    {"label": "bf16_19x500_strided_odd", "dtype": "bfloat16", "M": 19, "H": 500, "input_row_stride": 503},
    {"label": "bf16_3x20001", "dtype": "bfloat16", "M": 3, "H": 20001},
    {"label": "bf16_128x1024_general", "dtype": "bfloat16", "M": 128, "H": 1024, "schedule": "general"},
]

BENCH_CONFIGS = [
    {"label": "bf16_8192x4096", "dtype": "bfloat16", "M": 8192, "H": 4096},
    {"label": "bf16_32768x8192", "dtype": "bfloat16", "M": 32768, "H": 8192},
    {"label": "bf16_32x4096", "dtype": "bfloat16", "M": 32, "H": 4096},
    {"label": "bf16_128x16384", "dtype": "bfloat16", "M": 128, "H": 16384},
    {"label": "bf16_8192x3072", "dtype": "bfloat16", "M": 8192, "H": 3072},
    {"label": "bf16_8192x4095", "dtype": "bfloat16", "M": 8192, "H": 4095},
]

DEFAULTS = {"dtype": "bfloat16", "eps": 1e-6}

_DTYPE = "bfloat16"
_VEC = 8  # bf16 elements per 16-byte vector
_WORDS = 4  # 32-bit words per 16-byte vector
MIN_H, MAX_H = 16, 16384  # the specialized kernels (H % 8 == 0 too)
MAX_GENERAL_H = 2**30  # int32 column indices in the general kernel
MAX_STRIDE = 2**31 - 1  # int32 strides; row offsets are 64-bit
MAX_ROWS = MAX_STRIDE - 1024  # int32 row index = cta * rows_per_cta + group stays below 2**31
MIN_CTA_THREADS = 128  # rows of <= 32 threads are packed into CTAs of at least this many threads
GENERAL_THREADS = 256
GENERAL_HELD = 16  # elements of a row a thread of the general kernel holds: rows to 4096 are read once
# (max H, 16-byte vectors of x a thread holds): only x is held through the reductions (4 words a vector), so 4
# vectors stay far from the register limit of a full SM; 16384 = 512 threads x 4 vectors.
VECTORS_PER_THREAD = [(256, 1), (4096, 2), (MAX_H, 4)]
PDL = "end"
# x is read once: past L1 (L1::no_allocate), so that gamma and beta, which every row on an SM reads again (8 bytes a
# column to x's 2), stay there. The native rmsnorm measured the same qualifier best for its weight up to H = 5120.
X_CACHE = "stream"


def specialized(H: int) -> bool:
    """Whether H has specialized kernels (calls whose rows, out, gamma and beta start on 16 bytes use them)."""
    return H % _VEC == 0 and MIN_H <= H <= MAX_H


def row_plan(H: int) -> dict:
    """``threads_per_row`` (a power of two up to 32, else whole warps), ``vectors_per_thread``, ``rows_per_cta``."""
    nvec = H // _VEC
    target = next(v for max_h, v in VECTORS_PER_THREAD if H <= max_h)
    want = -(-nvec // target)
    tpr = max(2, 1 << (want - 1).bit_length()) if want <= 32 else 32 * -(-want // 32)
    return {"threads_per_row": tpr, "vectors_per_thread": -(-nvec // tpr),
            "rows_per_cta": max(1, MIN_CTA_THREADS // tpr)}


def compile_params(**cfg) -> dict:
    """``{"H": H}`` where H has a specialized kernel (unless ``schedule="general"``), else the general params."""
    if cfg.get("schedule") == "general" or not specialized(int(cfg["H"])):
        return {"schedule": "general"}
    return {"H": int(cfg["H"])}


def general_params(params: dict) -> dict:
    """The general artifact serves every call."""
    return {"schedule": "general"}


def artifact_params() -> list[dict]:
    """The general kernel and the specialized one of every catalog hidden size (and of WAN's 3072)."""
    from tirx_kernels.core import model_dims

    sizes = sorted({H for H in model_dims.hidden_sizes() + [3072] if specialized(H)})
    return [general_params({})] + [compile_params(H=H) for H in sizes]


def call_samples(rng) -> list[dict]:
    """Calls the public op can see (PROTOCOL.md): catalog hidden sizes, FlashInfer's, random and odd H."""
    from tirx_kernels.core import model_dims

    sizes = model_dims.hidden_sizes() + [128, 129, 1024, 3072, 16384] + [rng.randint(1, 64) for _ in range(4)]
    sizes += [rng.randint(1, 20000) for _ in range(8)] + [8 * rng.randint(2, 2048) for _ in range(6)]
    sizes += [rng.randint(16385, 65536) for _ in range(2)]
    return [{"dtype": _DTYPE, "M": rng.choice([1, 3, 128, 4096]), "H": H} for H in sizes]


def sass_expect(H: int | None = None, schedule: str | None = None, **_) -> list[str]:
    """SASS the CPU build test asserts: 16-byte loads and stores; 2-byte ones in the general kernel."""
    if schedule == "general":
        return [r"LDG\.E\.U16", r"STG\.E\.U16"]
    return [r"LDG\.E\.NA\.128", r"LDG\.E\.128", r"STG\.E\.128"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx functions
# ---------------------------------------------------------------------------------------------------------

def get_kernel(H: int | None = None, schedule: str | None = None, pdl: str | None = PDL):
    if schedule == "general":
        if H is not None:
            raise ValueError(f"layernorm: the general kernel takes H at run time, got H={H}")
        return build_general(pdl)
    if schedule is not None:
        raise ValueError(f"layernorm: schedule {schedule!r} is not None or 'general'")
    if H is None or not specialized(H):
        raise ValueError(f"layernorm: H={H} must be a multiple of {_VEC} in [{MIN_H}, {MAX_H}]")
    return build_kernel(H, pdl=pdl, **row_plan(H))


def fp32_pair(T, words, i):
    """The fp32 values of words ``i`` and ``i + 1`` of a local uint32 buffer loaded from fp32 memory."""
    return T.cuda.uint_as_float(words[i]), T.cuda.uint_as_float(words[i + 1])


def load_fp32_chunk(T, words, buf, c0, pred=None):
    """``words[0:8]`` <- the 8 fp32 values ``buf[c0 .. c0 + 8]`` (two 16-byte loads as raw words)."""
    from tirx_kernels.core.lang import vector

    vector.load_v4(words, 0, buf.ptr_to([c0]), pred)
    vector.load_v4(words, _WORDS, buf.ptr_to([c0 + 4]), pred)


def build_kernel(H: int, threads_per_row: int, vectors_per_thread: int, rows_per_cta: int, pdl: str | None = PDL):
    """The specialized kernel (H a compile-time multiple of 8; rows, out, gamma and beta on 16 bytes)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("layernorm", pdl)
    tpr, vpt = threads_per_row, vectors_per_thread
    threads = tpr * rows_per_cta
    words = reduce.scratch_words(tpr, rows_per_cta)  # one half of scratch per sum
    inv_h = 1.0 / H

    def col_pred(v, lane):
        """None where vector ``v`` of every lane is inside the row, else the test."""
        return (v * tpr + lane) * _VEC < H if (v + 1) * tpr * _VEC > H else None

    def both(a, b):
        if a is None or b is None:
            return b if a is None else a
        return T.And(a, b)

    def row_pred(row, M):  # noqa: N803
        """None when every CTA row exists (one row per CTA), else ``row < M`` for the tail CTA."""
        return None if rows_per_cta == 1 else row < M

    def load_row(xr, Xf, x_base, lane, row_ok, acc, zero):  # noqa: N803
        """``xr`` <- the thread's vectors of the row (0 past its end); ``acc[0]`` <- their sum."""
        for v in range(vpt):
            pred = both(row_ok, col_pred(v, lane))
            if pred is not None:
                vector.fill(xr, v * _WORDS, _WORDS)  # masked vectors add 0 to the sum
            vector.load_v4(xr, v * _WORDS, Xf.ptr_to([x_base + (v * tpr + lane) * _VEC]), pred, cache=X_CACHE)
        T.buffer_store(acc, T.cuda.uint_as_float(vector.after_all(xr, vpt * _WORDS, zero)), [0])  # 0.0, after all
        for i in range(vpt * _WORDS):
            lo, hi = vector.unpack2(xr[i], _DTYPE)
            T.buffer_store(acc, acc[0] + lo + hi, [0])

    def squared_deviations(xr, lane, mean, acc, part):
        """``acc[0]`` <- the sum of ``(x - mean)**2`` over the held words; a vector past the row's end adds nothing
        (its words are 0, but ``(0 - mean)**2`` is not)."""
        T.buffer_store(acc, T.float32(0), [0])
        for v in range(vpt):
            T.buffer_store(part, T.float32(0), [0])
            for j in range(_WORDS):
                lo, hi = vector.unpack2(xr[v * _WORDS + j], _DTYPE)
                T.buffer_store(part, part[0] + (lo - mean) * (lo - mean) + (hi - mean) * (hi - mean), [0])
            pred = col_pred(v, lane)
            T.buffer_store(acc, acc[0] + (part[0] if pred is None else T.Select(pred, part[0], T.float32(0))), [0])

    def scale_store(Yf, y_base, G, Bt, lane, row_ok, xr, gw, bw, orr, mean, rs):  # noqa: N803
        """out <- (x - mean) * rs * gamma + beta, rounded once; gamma and beta loaded vector by vector."""
        for v in range(vpt):
            c0 = (v * tpr + lane) * _VEC
            load_fp32_chunk(T, gw, G, c0, col_pred(v, lane))
            load_fp32_chunk(T, bw, Bt, c0, col_pred(v, lane))
            for j in range(_WORDS):
                lo, hi = vector.unpack2(xr[v * _WORDS + j], _DTYPE)
                g_lo, g_hi = fp32_pair(T, gw, 2 * j)
                b_lo, b_hi = fp32_pair(T, bw, 2 * j)
                vector.pack2(orr, j, (lo - mean) * rs * g_lo + b_lo, (hi - mean) * rs * g_hi + b_hi, _DTYPE)
            vector.store_v4(Yf.ptr_to([y_base + c0]), orr, 0, both(row_ok, col_pred(v, lane)))

    @T.prim_func
    def layernorm(x_ptr: T.handle, g_ptr: T.handle, b_ptr: T.handle, y_ptr: T.handle, eps: T.float32,
                  zero: T.int32):
        M = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), _DTYPE, strides=(x_stride, 1), align=16)
        G = T.match_buffer(g_ptr, (H,), "float32", align=16)
        Bt = T.match_buffer(b_ptr, (H,), "float32", align=16)
        Y = T.match_buffer(y_ptr, (M, H), _DTYPE, strides=(y_stride, 1), align=16)
        T.device_entry()
        # Flat views indexed row * stride + col (TIRx drops match_buffer strides from device indexing).
        Xf = T.decl_buffer((M * x_stride,), _DTYPE, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), _DTYPE, data=Y.data)
        cta = T.cta_id([(M + rows_per_cta - 1) // rows_per_cta])
        tid = T.thread_id([threads])
        xr = T.alloc_local((vpt * _WORDS,), "uint32")
        gw = T.alloc_local((2 * _WORDS,), "uint32")
        bw = T.alloc_local((2 * _WORDS,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        acc = T.alloc_local((1,), "float32")
        part = T.alloc_local((1,), "float32")
        stat = T.alloc_local((2,), "float32")
        scratch = T.alloc_shared((max(1, 2 * words),), "float32")
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write the rows

        row = cta * rows_per_cta + tid // tpr
        lane = tid % tpr
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        load_row(xr, Xf, x_base, lane, row_pred(row, M), acc, zero)
        stat[0] = reduce.group_sum(acc[0], tid, tpr, scratch) * T.float32(inv_h)  # the mean
        squared_deviations(xr, lane, stat[0], acc, part)
        stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, tpr, scratch, words) * T.float32(inv_h) + eps)
        scale_store(Yf, y_base, G, Bt, lane, row_pred(row, M), xr, gw, bw, orr, stat[0], stat[1])
        pdl_launch.end(pdl)

    return pdl_launch.launch(layernorm, pdl)


def element(T, buf, idx):
    """fp32 value of one bf16 element (through its bits, as the vector path unpacks)."""
    from tirx_kernels.core.lang import vector

    return vector.unpack2(T.Cast("uint32", T.reinterpret("uint16", buf[idx])), _DTYPE)[0]


def store_element(T, buf, idx, value, pair):
    """``buf[idx]`` <- ``value`` rounded to bf16 (``pair``: a uint32 local for the conversion)."""
    from tirx_kernels.core.lang import vector

    vector.pack2(pair, 0, value, T.float32(0), _DTYPE)
    T.buffer_store(buf, T.reinterpret(_DTYPE, T.Cast("uint16", pair[0])), [idx])


def build_general(pdl: str | None = PDL, threads: int = GENERAL_THREADS, held: int = GENERAL_HELD):
    """The general kernel: H, strides and alignment at run time; one CTA of ``threads`` per row, element-wise
    (coalesced 2-byte accesses). Rows of up to ``threads * held`` elements are read once into registers (element
    ``k * threads + tid`` in slot ``k``); longer rows (a CTA-uniform branch) in three passes over memory (sum,
    squared deviations, output), the second and third from L1/L2."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce

    pdl_launch.check_trigger("layernorm", pdl)
    words = reduce.scratch_words(threads, 1)

    def col(k, tid):
        return k * threads + tid

    def load_held(xv, Xf, x_base, tid, H):  # noqa: N803
        """``xv[k]`` <- element ``k * threads + tid`` (0 past the row), every load before any math; the sum."""
        for k in range(held):
            T.buffer_store(xv, T.float32(0), [k])
            with T.If(col(k, tid) < H):
                with T.Then():
                    T.buffer_store(xv, element(T, Xf, x_base + T.Cast("int64", col(k, tid))), [k])
        total = xv[0]
        for k in range(1, held):
            total = total + xv[k]
        return total

    def held_deviations(xv, tid, H, mean):  # noqa: N803
        total = T.float32(0)
        for k in range(held):
            d = xv[k] - mean
            total = total + T.Select(col(k, tid) < H, d * d, T.float32(0))
        return total

    def store_held(Yf, y_base, G, Bt, xv, tid, H, mean, rs, pair):  # noqa: N803
        for k in range(held):
            c = col(k, tid)
            with T.If(c < H):
                with T.Then():
                    store_element(T, Yf, y_base + T.Cast("int64", c), (xv[k] - mean) * rs * G[c] + Bt[c], pair)

    @T.prim_func
    def layernorm(x_ptr: T.handle, g_ptr: T.handle, b_ptr: T.handle, y_ptr: T.handle, eps: T.float32,
                  zero: T.int32):
        M = T.int32()
        H = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, H), _DTYPE, strides=(x_stride, 1), align=2)
        G = T.match_buffer(g_ptr, (H,), "float32", align=4)
        Bt = T.match_buffer(b_ptr, (H,), "float32", align=4)
        Y = T.match_buffer(y_ptr, (M, H), _DTYPE, strides=(y_stride, 1), align=2)
        T.device_entry()
        Xf = T.decl_buffer((M * x_stride,), _DTYPE, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), _DTYPE, data=Y.data)
        row = T.cta_id([M])
        tid = T.thread_id([threads])
        xv = T.alloc_local((held,), "float32")
        acc = T.alloc_local((1,), "float32")
        stat = T.alloc_local((2,), "float32")
        pair = T.alloc_local((1,), "uint32")
        scratch = T.alloc_shared((2 * words,), "float32")
        pdl_launch.begin(pdl)

        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        if H <= threads * held:
            acc[0] = load_held(xv, Xf, x_base, tid, H)
            stat[0] = reduce.group_sum(acc[0], tid, threads, scratch) / T.Cast("float32", H)  # the mean
            acc[0] = held_deviations(xv, tid, H, stat[0])
            stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, threads, scratch, words) / T.Cast("float32", H) + eps)
            store_held(Yf, y_base, G, Bt, xv, tid, H, stat[0], stat[1], pair)
        else:
            trips = (H + (threads - 1)) // threads
            acc[0] = T.float32(0)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    acc[0] = acc[0] + element(T, Xf, x_base + T.Cast("int64", c))
            stat[0] = reduce.group_sum(acc[0], tid, threads, scratch) / T.Cast("float32", H)  # the mean
            acc[0] = T.float32(0)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    d = element(T, Xf, x_base + T.Cast("int64", c)) - stat[0]
                    acc[0] = acc[0] + d * d
            stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, threads, scratch, words) / T.Cast("float32", H) + eps)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    x = element(T, Xf, x_base + T.Cast("int64", c))
                    store_element(T, Yf, y_base + T.Cast("int64", c), (x - stat[0]) * stat[1] * G[c] + Bt[c],
                                  pair)
        pdl_launch.end(pdl)

    return pdl_launch.launch(layernorm, pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(M: int, H: int, eps: float = 1e-6, mean: float = 0.0, input_row_stride: int | None = None,
                 **_) -> dict:
    g = _generator()
    x = torch.randn(M, input_row_stride or H, generator=g, device="cuda", dtype=torch.float32) + mean
    return {"input": x.to(torch.bfloat16)[:, :H],
            "gemma": torch.randn(H, generator=g, device="cuda", dtype=torch.float32),
            "beta": torch.randn(H, generator=g, device="cuda", dtype=torch.float32), "eps": eps,
            "out": torch.full((M, H), float("nan"), device="cuda", dtype=torch.bfloat16)}


def reference(input, gemma, beta, eps, **_) -> dict:  # noqa: A002
    """fp32 oracle (two-pass statistics in fp32 by torch)."""
    return {"out": torch.nn.functional.layer_norm(input.float(), (input.shape[-1],), gemma.float(), beta.float(),
                                                  eps)}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("schedule") == "general":  # the general kernel where the public op would pick the specialized one
        _run(data["input"], data["gemma"], data["beta"], float(data["eps"]), data["out"], general=True)
        return
    layernorm(data["input"], data["gemma"], data["beta"], data["eps"], out=data["out"])


def roofline(M: int, H: int, **_) -> dict:
    return {"bytes": 2 * M * H * 2 + 2 * H * 4, "flops": 7 * M * H}


def get_baselines(**cfg) -> dict:
    def _torch_fn(x, g, b, eps):
        return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), g, b, eps).to(x.dtype)

    def torch_eager():
        return lambda d: {"out": _torch_fn(d["input"], d["gemma"], d["beta"], d["eps"])}

    def torch_compile():
        fn = torch.compile(_torch_fn, dynamic=False)
        return lambda d: {"out": fn(d["input"], d["gemma"], d["beta"], d["eps"])}

    def flashinfer():
        import flashinfer.norm

        return lambda d: {"out": flashinfer.norm.layernorm(d["input"], d["gemma"], d["beta"], d["eps"])}

    return {"torch": torch_eager, "torch.compile": torch_compile, "flashinfer": flashinfer}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"layernorm: argument '{name}': expected {expected}, got {got}")


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.shape[0] > MAX_ROWS:
        _fail(name, f"at most {MAX_ROWS} rows", str(t.shape[0]))
    if t.shape[0] > 1 and not 0 < t.stride(0) <= MAX_STRIDE:
        _fail(name, f"a row stride in [1, {MAX_STRIDE}]", f"strides {tuple(t.stride())}")


def _check_inputs(input, gemma, beta, eps, out) -> None:  # noqa: A002
    checks.tensor("layernorm", "input", input, dtypes=(torch.bfloat16,), ndim=(2,), cuda=False)
    H = input.shape[1]
    checks.in_range("layernorm", "input", H, 1, MAX_GENERAL_H)
    checks.tensor("layernorm", "gemma", gemma, dtypes=(torch.float32,), shape=(H,), cuda=False)
    checks.tensor("layernorm", "beta", beta, dtypes=(torch.float32,), shape=(H,), cuda=False)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _fail("eps", "a float", type(eps).__name__)
    _check_rows("input", input)
    if out is not None:
        checks.tensor("layernorm", "out", out, dtypes=(torch.bfloat16,), shape=tuple(input.shape), cuda=False)
        _check_rows("out", out)
    checks.tensor("layernorm", "input", input, cuda=True)
    checks.same_device("layernorm", "input", input, gemma=gemma, beta=beta, **({} if out is None else {"out": out}))


def layernorm(input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-6,  # noqa: A002
              out: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm of bf16 rows (M, H), any row stride: ``(x - mean) * rsqrt(var + eps) * gemma + beta`` with fp32
    ``gemma`` (FlashInfer's name for gamma) and ``beta`` (H,); fp32 two-pass statistics, one rounding. Returns
    ``out`` (a new contiguous tensor unless given)."""
    _check_inputs(input, gemma, beta, eps, out)
    return _OP(input, gemma, beta, float(eps), out=out)


def _aligned_rows(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % _VEC == 0)


def _unit_columns(t: torch.Tensor) -> torch.Tensor:
    """A view with column stride 1 (a size-1 last dim may have any stride; the kernel's checks want 1)."""
    return t if t.stride(1) == 1 else t.as_strided(t.shape, (t.stride(0), 1))


def unit_vector(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(0) == 1 else t.as_strided(t.shape, (1,))


def uses_general(x: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether a call runs the general kernel: H has no specialized kernel, or a row or a vector is off 16 bytes."""
    return not (specialized(x.shape[1]) and _aligned_rows(x) and _aligned_rows(out)
                and gemma.data_ptr() % 16 == 0 and beta.data_ptr() % 16 == 0)


def _run(input, gemma, beta, eps: float, out, general: bool = False) -> None:  # noqa: A002
    if input.shape[0] == 0:
        return
    H = input.shape[1]
    x, y = _unit_columns(input), _unit_columns(out)
    gemma, beta = unit_vector(gemma), unit_vector(beta)
    general = general or uses_general(x, gemma, beta, y)
    fn = _FUNCTIONS.get((H, general, input.get_device()),
                        lambda: general_params({}) if general else compile_params(H=H), input.device)
    fn(x, gemma, beta, y, eps, 0)  # zero: see vector.after_all


from tirx_kernels.core import runtime  # noqa: E402

_FUNCTIONS = runtime.FunctionCache(__name__)
# core.op.OutOp registers the torch.library custom ops tirx::flashinfer_layernorm and tirx::flashinfer_layernorm_out
# (their register_fake from new_out) and takes the eager direct path around them.
_OP = op.OutOp("flashinfer_layernorm", {"input": torch.Tensor, "gemma": torch.Tensor, "beta": torch.Tensor,
                                        "eps": float},
               run=_run, new_out=lambda input, gemma, beta, eps: torch.empty(  # noqa: A006
                   input.shape, dtype=input.dtype, device=input.device))

from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
