# SPDX-License-Identifier: Apache-2.0
# Port of the sorted-output epilogue of FlashInfer's top-k (flashinfer.top_k(..., sorted=True)).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/topk.cuh and
# python/flashinfer/topk.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: a bitonic sort in shared memory, one CTA a row.
"""``stable_sort_topk_by_value(values, indices, valid, out_values, out_indices)``: each row's first ``valid``
entries sorted by value, descending, stable (equal values keep their input order: top_k's selection is in ascending
index order, so ties come out lowest index first, bit-identical run to run). NaN sorts above +inf and -0.0 equals
+0.0, as in the selection (``_radix.key_of``). Entries past ``valid`` (top_k's -1 / 0 padding) are copied as they
are. In place (out = in) is safe: a CTA reads its whole row before it writes.

One 1024-thread CTA a row sorts 64-bit words ``key << 32 | ~position`` (larger word first: higher value, then the
earlier position) over the next power of two >= valid (<= 4096: 32 KB of shared memory), unused slots 0, which sorts
below every real word (the smallest key, -inf's, is 0x007FFFFF). Then each thread fetches the entries its output
places name from global memory (L2: the row was just read) and writes them after a barrier. log2(n)(log2(n)+1)/2
compare-exchange steps of two pairs a thread, one barrier each: 78 steps at k = 4096, 45 at k = 512.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, runtime

KERNEL_META = {
    "name": "stable_sort_topk_by_value",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "The sorted-output epilogue of top-k: a row's selection sorted by value, descending, stable",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "public_ops": ["stable_sort_topk_by_value"],
}

# Catalog 1.11's bench shapes; heavy ties; a valid count short of k (padding copied) and a non-power of two.
CONFIGS = [
    {"label": "f32_r4_k128", "dtype": "float32", "M": 4, "k": 128},
    {"label": "f32_r64_k256", "dtype": "float32", "M": 64, "k": 256},
    {"label": "f32_r64_k2048", "dtype": "float32", "M": 64, "k": 2048},
    {"label": "bf16_ties_r16_k4096", "dtype": "bfloat16", "M": 16, "k": 4096, "ties": True},
    {"label": "f16_r8_k1000_v777", "dtype": "float16", "M": 8, "k": 1000, "valid": 777},
]
BENCH_CONFIGS = [
    {"label": "f32_r4_k128", "dtype": "float32", "M": 4, "k": 128},
    {"label": "f32_r64_k256", "dtype": "float32", "M": 64, "k": 256},
    {"label": "f32_r64_k2048", "dtype": "float32", "M": 64, "k": 2048},
]
DEFAULTS = {"dtype": "float32", "ties": False, "valid": None}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_K = 4096
THREADS = 1024


def compile_params(dtype: str, index_dtype: str = "int64", **_) -> dict:
    return {"dtype": dtype, "index_dtype": index_dtype}


def artifact_params() -> list[dict]:
    return [compile_params(d, i) for d in _DTYPES for i in ("int32", "int64")]


def call_samples(rng) -> list[dict]:
    return [{"dtype": d, "index_dtype": i, "M": rng.randint(1, 300), "k": rng.randint(1, MAX_K)}
            for d in _DTYPES for i in ("int32", "int64") for _ in range(4)]


def sass_expect(**_) -> list[str]:
    return [r"\bBAR\.SYNC"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, index_dtype: str = "int64"):
    if dtype not in _DTYPES:
        raise ValueError(f"stable_sort_topk_by_value: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if index_dtype not in ("int32", "int64"):
        raise ValueError(f"stable_sort_topk_by_value: index_dtype {index_dtype!r} is not int32 or int64")
    return build_kernel(dtype, index_dtype)


def build_kernel(dtype: str, index_dtype: str):
    from tvm.script import tirx as T

    from . import _radix as rx

    raw_t = rx.RAW[dtype]
    per = MAX_K // THREADS  # output places (and compare-exchange pairs, at most 2) a thread

    @T.prim_func
    def sort_topk(v_ptr: T.handle, i_ptr: T.handle, ov_ptr: T.handle, oi_ptr: T.handle, valid: T.int32):
        M = T.int32()
        K = T.int32()
        V = T.match_buffer(v_ptr, (M, K), dtype, align=2)
        Ix = T.match_buffer(i_ptr, (M, K), index_dtype, align=4)
        OV = T.match_buffer(ov_ptr, (M, K), dtype, align=2)
        OI = T.match_buffer(oi_ptr, (M, K), index_dtype, align=4)
        T.device_entry()
        Vr = T.decl_buffer((M * K,), raw_t, data=V.data)
        OVr = T.decl_buffer((M * K,), raw_t, data=OV.data)
        row = T.cta_id([M])
        tid = T.thread_id([THREADS])
        words = T.alloc_shared((MAX_K,), "uint64")
        log_n = T.alloc_local((1,), "int32")
        keep_v = T.alloc_local((per,), "uint32")  # 16-bit values widened, as in the selection kernels
        keep_i = T.alloc_local((per,), index_dtype)
        base = T.Cast("int64", row) * T.Cast("int64", K)
        n = T.min(T.max(valid, 0), K)
        # the sorted length: the next power of two >= n (>= 2)
        log_n[0] = 1
        while (1 << log_n[0]) < n:
            log_n[0] = log_n[0] + 1
        size = 1 << log_n[0]
        for r in T.unroll(per):
            s = r * THREADS + tid
            if s < size:
                words[s] = T.uint64(0)
                if s < n:
                    key = rx.key_of(Vr[base + T.Cast("int64", s)], dtype)
                    words[s] = (T.Cast("uint64", key) << T.uint64(32)) | T.Cast("uint64", T.uint32(0xFFFFFFFF) -
                                                                                  T.Cast("uint32", s))
        T.evaluate(T.cuda.cta_sync())
        # Bitonic network, larger word first: block `blk` (2^(a+1) wide) descending where its index bit is clear.
        for a in T.serial(log_n[0]):
            for b in T.serial(a + 1):
                stride = 1 << (a - b)
                for r in T.unroll(per // 2):
                    q = r * THREADS + tid
                    if q < (size >> 1):
                        lo = ((q >> (a - b)) << (a - b + 1)) | (q & (stride - 1))
                        hi = lo + stride
                        x = words[lo]
                        y = words[hi]
                        desc = (lo & (2 << a)) == 0
                        if (x < y) == desc:
                            words[lo] = y
                            words[hi] = x
                T.evaluate(T.cuda.cta_sync())
        for r in T.unroll(per):
            s = r * THREADS + tid
            if s < K:
                src = T.Cast("int64", s)
                if s < n:
                    src = T.Cast("int64", T.uint32(0xFFFFFFFF) - T.Cast("uint32", words[s] & T.uint64(0xFFFFFFFF)))
                keep_v[r] = T.Cast("uint32", Vr[base + src])
                keep_i[r] = Ix[T.Cast("int64", row), src]
        T.evaluate(T.cuda.cta_sync())  # every read of the row before any write: in place is safe
        for r in T.unroll(per):
            s = r * THREADS + tid
            if s < K:
                OVr[base + T.Cast("int64", s)] = T.Cast(raw_t, keep_v[r])
                OI[T.Cast("int64", row), T.Cast("int64", s)] = keep_i[r]

    return sort_topk


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(dtype: str, M: int, k: int, ties: bool = False, valid=None, **_) -> dict:
    """A top-k's output: random values (few distinct ones with ``ties``), distinct random indices."""
    g = _generator()
    v = torch.randn(M, k, generator=g, device="cuda")
    if ties:
        v = (v * 4).round() / 4
    i = torch.randperm(1 << 20, generator=g, device="cuda")[:M * k].view(M, k)
    return {"in_values": v.to(_DTYPES[dtype]), "in_indices": i, "valid": k if valid is None else valid,
            "values": torch.full((M, k), float("nan"), device="cuda", dtype=_DTYPES[dtype]),
            "indices": torch.full((M, k), -7, device="cuda", dtype=torch.int64)}


def reference(in_values, in_indices, valid, **_) -> dict:
    """torch's stable descending sort of the first ``valid`` columns (NaN first, -0.0 equal to +0.0)."""
    head = in_values[:, :valid].float()
    order = torch.sort(torch.where(head.isnan(), torch.inf, head), dim=-1, descending=True, stable=True).indices
    # NaN above +inf: a second stable pass that moves NaN to the front keeps the rest in order
    nan_first = torch.sort(head.gather(-1, order).isnan().int(), dim=-1, descending=True, stable=True).indices
    order = order.gather(-1, nan_first)
    return {"values": torch.cat([in_values[:, :valid].gather(-1, order).float(), in_values[:, valid:].float()], -1),
            "indices": torch.cat([in_indices[:, :valid].gather(-1, order), in_indices[:, valid:]], -1)}


def _exact(got, want, cfg, inputs):
    from tirx_kernels.core import harness

    if not torch.equal(got.float().nan_to_num(7.0), want.float().nan_to_num(7.0)):
        raise harness.KernelCheckError("the sorted top-k differs from torch's stable sort")
    return {"rows": int(got.shape[0])}


COMPARATORS = {"values": _exact, "indices": _exact}


def launch(cfg: dict, data: dict) -> None:
    stable_sort_topk_by_value(data["in_values"], data["in_indices"], data["valid"], data["values"], data["indices"])


def roofline(dtype: str, M: int, k: int, **_) -> dict:
    elem = torch.tensor([], dtype=_DTYPES[dtype]).element_size()
    return {"bytes": 2 * M * k * (elem + 8), "flops": 0}


def get_baselines(**cfg) -> dict:
    def torch_sort():
        def run(d):
            v, i = d["in_values"], d["in_indices"]
            n = min(max(d["valid"], 0), v.shape[-1])
            s, o = torch.sort(v[:, :n], dim=-1, descending=True, stable=True)
            # the columns past valid (top_k's padding) as they are, as the op leaves them
            return {"values": torch.cat([s, v[:, n:]], -1),
                    "indices": torch.cat([i[:, :n].gather(-1, o), i[:, n:]], -1)}
        return run

    return {"torch": torch_sort}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_FUNCTIONS = runtime.FunctionCache(__name__)


def stable_sort_topk_by_value(values: torch.Tensor, indices: torch.Tensor, valid: int,
                              out_values: torch.Tensor, out_indices: torch.Tensor) -> None:
    """Writes ``values``/``indices`` (M, k) sorted by value (descending, stable) over the first ``valid``
    columns into ``out_values``/``out_indices`` (may be the inputs themselves)."""
    op = "stable_sort_topk_by_value"
    checks.tensor(op, "values", values, dtypes=tuple(_DTYPES.values()), ndim=(2,), cuda=False)
    checks.in_range(op, "values", values.shape[-1], 1, MAX_K)
    checks.tensor(op, "indices", indices, dtypes=(torch.int32, torch.int64), shape=tuple(values.shape), cuda=False)
    checks.tensor(op, "out_values", out_values, dtypes=(values.dtype,), shape=tuple(values.shape), cuda=False)
    checks.tensor(op, "out_indices", out_indices, dtypes=(indices.dtype,), shape=tuple(values.shape), cuda=False)
    if isinstance(valid, bool) or not isinstance(valid, int):
        raise checks.TirxInputError(f"{op}: argument 'valid': expected an int, got {type(valid).__name__}")
    for name, t in (("values", values), ("indices", indices), ("out_values", out_values),
                    ("out_indices", out_indices)):
        if not t.is_contiguous():
            raise checks.TirxInputError(f"{op}: argument '{name}': expected a contiguous tensor, got strides "
                                        f"{t.stride()}")
    checks.tensor(op, "values", values, cuda=True)
    if runtime.direct_call(values, indices, out_values, out_indices):
        run(values, indices, valid, out_values, out_indices)
        runtime.mark_written(out_values)
        runtime.mark_written(out_indices)
    else:
        torch.ops.tirx.flashinfer_stable_sort_topk_by_value(values, indices, valid, out_values, out_indices)


@torch.library.custom_op("tirx::flashinfer_stable_sort_topk_by_value", mutates_args=("out_values", "out_indices"))
def _sort_op(values: torch.Tensor, indices: torch.Tensor, valid: int, out_values: torch.Tensor,
             out_indices: torch.Tensor) -> None:
    run(values, indices, valid, out_values, out_indices)


@_sort_op.register_fake
def _(values, indices, valid, out_values, out_indices):
    return None


def run(values, indices, valid: int, out_values, out_indices) -> None:
    """The launch without the checks (top_k's sorted output calls it in place)."""
    if values.shape[0] == 0:
        return
    dtype, index_dtype = str(values.dtype)[6:], str(indices.dtype)[6:]
    fn = _FUNCTIONS.get((values.dtype, indices.dtype, values.get_device()),
                        lambda: compile_params(dtype, index_dtype), values.device)
    fn(values, indices, out_values, out_indices, valid)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
