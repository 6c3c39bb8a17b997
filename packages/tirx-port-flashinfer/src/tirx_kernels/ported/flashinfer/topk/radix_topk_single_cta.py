# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's radix top-k (single-CTA path) and its public op flashinfer.top_k.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/topk.cuh (RadixTopK) and
# python/flashinfer/topk.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: same selection semantics, different structure (see _radix.py).
"""``top_k(scores, k, sorted=False, deterministic=False) -> (values, indices)`` over the last dim, fp32/fp16/bf16.

One CTA of 1024 threads per row; the row is read from global memory once per pass (later passes hit L2): 4 digit
passes for fp32 keys, 2 for fp16/bf16 (``_radix.py``), 4 more over the index bits only when the ties at the
threshold outnumber the places left. Then one gather pass writes the selected scores and their indices.

Result, every call (so ``deterministic=True`` costs nothing more, and is accepted for FlashInfer's signature):
the k largest scores, NaN above +inf, -0.0 equal to +0.0; among equal scores at the threshold the lowest indices
win; unsorted output lists the selected entries in ascending index order, bit-identical run to run. ``sorted=True``
sorts them by value, descending (stable: equal values keep ascending index order), in place, with
``stable_sort_topk_by_value``'s kernel. A row shorter than k (only
through the transforms' per-row lengths, or k > the row's width): its entries in index order, then index -1 and
value 0 in the places left, as FlashInfer's kernels write them. Indices are int64, as flashinfer.top_k 0.7.4
returns them (python/flashinfer/topk.py converts its kernels' int32 with ``.long()``; ours write int64 directly);
the transforms' indices are int32, as FlashInfer's.

Dispatch (``_run``): rows that do not fill the GPU by themselves (at most half as many rows as SMs) and longer than one
4096-score tile go to ``fast_topk_clusters`` (a cluster a row, the row read once into shared memory) where a
cluster's shared memory holds the row (top_k: 131072 fp32 / 196608 fp16-bf16 scores), else to
``radix_topk_multi_cta`` (a row over several CTAs, a launch a digit pass); both give this kernel's result bit for
bit. The rest run here.

``top_k_page_table_transform`` / ``top_k_ragged_transform`` (FlashInfer's DSA indexer ops) run the same kernel in
another mode: row r is ``input[r, :lengths[r]]`` (lengths clamped to [0, N]), the selected columns are written
mapped through ``src_page_table[r]`` or plus ``offsets[r]`` (int32), padded with -1 past a short row.

Not yet: staging a row in shared memory, filtering candidates after the first pass (every pass re-reads the row
from L2), FlashInfer's ``tie_break`` and ``row_to_batch`` arguments.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, runtime

KERNEL_META = {
    "name": "radix_topk_single_cta",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Top-k over rows (radix select, one 1024-thread CTA a row), fp32/fp16/bf16, deterministic",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["top_k", "top_k_page_table_transform", "top_k_ragged_transform"],
}

# The speed rows (fp32, k = 2048) and FlashInfer's test shapes; ties, constant and short rows.
CONFIGS = [
    {"label": "f32_r8_l8192_k256", "dtype": "float32", "M": 8, "N": 8192, "k": 256},
    {"label": "f32_r64_l32768_k512", "dtype": "float32", "M": 64, "N": 32768, "k": 512},
    {"label": "f32_r4_l57592_k1024", "dtype": "float32", "M": 4, "N": 57592, "k": 1024},
    {"label": "f32_r1_l131072_k2048", "dtype": "float32", "M": 1, "N": 131072, "k": 2048},
    {"label": "f16_r16_l32000_k64", "dtype": "float16", "M": 16, "N": 32000, "k": 64},
    {"label": "bf16_r16_l128256_k4096", "dtype": "bfloat16", "M": 16, "N": 128256, "k": 4096},
    {"label": "f32_ties_r32_l5000_k300", "dtype": "float32", "M": 32, "N": 5000, "k": 300, "ties": True},
    {"label": "bf16_ties_r32_l4099_k100", "dtype": "bfloat16", "M": 32, "N": 4099, "k": 100, "ties": True},
    {"label": "f32_r3_l1_k1", "dtype": "float32", "M": 3, "N": 1, "k": 1},
    {"label": "f16_r5_l77_k77", "dtype": "float16", "M": 5, "N": 77, "k": 77},
]

BENCH_CONFIGS = [
    {"label": "f32_r64_l131072_k2048", "dtype": "float32", "M": 64, "N": 131072, "k": 2048},
    {"label": "f32_r1_l131072_k2048", "dtype": "float32", "M": 1, "N": 131072, "k": 2048},
    {"label": "f32_r256_l262144_k2048", "dtype": "float32", "M": 256, "N": 262144, "k": 2048},
    {"label": "f32_r64_l32768_k512", "dtype": "float32", "M": 64, "N": 32768, "k": 512},
    {"label": "bf16_r64_l131072_k2048", "dtype": "bfloat16", "M": 64, "N": 131072, "k": 2048},
]

DEFAULTS = {"dtype": "float32", "ties": False}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_K = 4096
MAX_N = 2**30  # int32 column arithmetic in the gather (a tile's last column may pass the row by 4095)


def compile_params(dtype: str, index_dtype: str = "int64", mode: str = "plain", **_) -> dict:
    """One general artifact per (score dtype, index dtype, mode): rows, row length, stride and k are run-time args.
    top_k: int64 indices; the transforms: int32 (FlashInfer's dtypes)."""
    return {"dtype": dtype, "index_dtype": index_dtype, "mode": mode}


def artifact_params() -> list[dict]:
    return [compile_params(d, "int64", "plain") for d in _DTYPES] + [
        compile_params(d, "int32", m) for d in _DTYPES for m in ("page_table", "ragged")]


def call_samples(rng) -> list[dict]:
    """top_k's calls (int64 indices) and the transforms' (int32): every dtype, random rows, lengths and k."""
    return [{"dtype": d, "index_dtype": "int64" if m == "plain" else "int32", "mode": m, "M": rng.randint(1, 300),
             "N": rng.randint(1, 524288), "k": rng.randint(1, MAX_K)} for d in _DTYPES for m in MODES
            for _ in range(3)]


def sass_expect(dtype: str, index_dtype: str = "int64", mode: str = "plain", **_) -> list[str]:
    """SASS the CPU build test asserts: shared-memory atomics (the histograms) and warp votes (the gather)."""
    return [r"\bATOMS\.", r"\bVOTE"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

MODES = ("plain", "page_table", "ragged")


def get_kernel(dtype: str, index_dtype: str = "int64", mode: str = "plain"):
    if dtype not in _DTYPES:
        raise ValueError(f"radix_topk_single_cta: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if index_dtype not in ("int32", "int64"):
        raise ValueError(f"radix_topk_single_cta: index_dtype {index_dtype!r} is not int32 or int64")
    if mode not in MODES:
        raise ValueError(f"radix_topk_single_cta: mode {mode!r} is not one of {MODES}")
    return build_kernel(dtype, index_dtype, mode)


def load_tile(dst, Xr, x_base, first, step, end):  # noqa: N803
    """Parse-time helper of the top-k kernels' digit passes: the raw bits of scores ``first + j * step`` (j <
    ``len(dst)``; coalesced for each j) into ``dst``, 0 at or past ``end``; every load issued before any use, so a
    thread has ``len(dst)`` in flight. One load in flight a thread (1024 threads an SM) bounded the passes, which read
    the row again each time: 256 x 262144 fp32 k2048 took 1358 us on the H100 (2026-12-07)."""
    from tvm.script import tirx as T

    for j in range(int(dst.shape[0])):
        i = first + j * step
        T.buffer_store(dst, T.if_then_else(i < end, T.Cast("uint32", Xr[x_base + T.Cast("int64", T.min(i, end - 1))]),
                                           T.uint32(0)), [j])


def build_kernel(dtype: str, index_dtype: str, mode: str):
    """``mode``: "plain" writes values and indices of rows of width N; "page_table" / "ragged" read each row's
    length from ``lengths`` (clamped to [0, N]) and write only indices, mapped through ``aux`` (the page table's
    row ``row`` at ``row * aux_stride``) or offset by ``aux[row]``. The unused tensors of a mode are 1-element
    dummies the op keeps per device."""
    from tvm.script import tirx as T

    from . import _radix as rx

    raw_t = rx.RAW[dtype]
    key_bits = rx.KEY_BITS[dtype]
    threads, E = rx.THREADS, rx.GATHER_ELEMS
    tile = threads * E
    plain = mode == "plain"

    def out_index(col, row, Aux, aux_stride):  # noqa: N803
        return rx.out_index(mode, index_dtype, col, row, Aux, aux_stride)

    @T.prim_func
    def radix_topk(x_ptr: T.handle, v_ptr: T.handle, i_ptr: T.handle, len_ptr: T.handle, aux_ptr: T.handle,
                   aux_stride: T.int32):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        VM = T.int32()
        VK = T.int32()
        L = T.int32()
        A = T.int32()
        x_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, N), dtype, strides=(x_stride, 1), align=2)
        V = T.match_buffer(v_ptr, (VM, VK), dtype, align=2)
        Ix = T.match_buffer(i_ptr, (M, K), index_dtype, align=4)
        Lens = T.match_buffer(len_ptr, (L,), "int32", align=4)
        Aux = T.match_buffer(aux_ptr, (A,), "int32", align=4)
        T.device_entry()
        # ptxas, left to __launch_bounds__(1024) alone, spilled 16-20 bytes in the 16-bit and int32-index kernels
        # at 32 registers; with __maxnreg__(64) it has no stack frame but takes 57-58 registers (nvcc 13, this
        # version): one 1024-thread CTA an SM, half the warps an SM can hold.
        T.attr({"tirx.max_registers": 64})
        # Raw-bit views, indexed row * stride + col: keys come from the bits, values are copied as bits.
        Xr = T.decl_buffer((M * x_stride,), raw_t, data=X.data)
        Vr = T.decl_buffer((VM * VK,), raw_t, data=V.data)
        If = T.decl_buffer((M * K,), index_dtype, data=Ix.data)
        row = T.cta_id([M])
        tid = T.thread_id([threads])
        hist = T.alloc_shared((rx.RADIX,), "uint32")
        scan_tot = T.alloc_shared((rx.SCAN_WARPS,), "uint32")
        warp_tot = T.alloc_shared((2 * rx.WARPS,), "uint32")
        state = T.alloc_shared((4,), "uint32")
        prefix = T.alloc_local((1,), "uint32")
        rem = T.alloc_local((1,), "uint32")
        eq = T.alloc_local((1,), "uint32")
        last_tie = T.alloc_local((1,), "uint32")
        out_base = T.alloc_local((1,), "uint32")
        raws = T.alloc_local((E,), "uint32")  # 16-bit scores widened: a ushort array went to the stack
        sel = T.alloc_local((E,), "uint32")
        ball = T.alloc_local((E,), "uint32")
        lane = tid % 32
        warp = tid // 32
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        o_base = T.Cast("int64", row) * T.Cast("int64", K)
        nrow = T.alloc_local((1,), "int32")
        if plain:
            nrow[0] = N
        else:
            nrow[0] = T.min(T.max(Lens[row], 0), N)
        n = nrow[0]
        tiles = (n + (tile - 1)) // tile

        if n <= K:
            # Every entry, in index order; FlashInfer's index -1 and value 0 in the places left.
            for it in T.serial((K + (threads - 1)) // threads):
                c = it * threads + tid
                if c < K:
                    if c < n:
                        If[o_base + T.Cast("int64", c)] = out_index(c, row, Aux, aux_stride)
                        if plain:
                            Vr[o_base + T.Cast("int64", c)] = Xr[x_base + T.Cast("int64", c)]
                    else:
                        If[o_base + T.Cast("int64", c)] = T.Cast(index_dtype, -1)
                        if plain:
                            Vr[o_base + T.Cast("int64", c)] = T.Cast(raw_t, 0)
        else:
            # The threshold key, one digit a pass; bins count down (bin 255 - digit) so the scan finds the k-th
            # largest with the same ascending prefix count as the index passes below.
            # Every pass reads the row again: a thread first issues the loads of E scores (a 4096-score tile), then
            # counts them (``load_tile``); the histogram does not depend on the order.
            prefix[0] = T.uint32(0)
            rem[0] = T.Cast("uint32", K)
            for p in range(key_bits // 8):
                shift = key_bits - 8 * (p + 1)
                rx.clear_hist(hist, tid)
                for it in T.serial(tiles):
                    load_tile(raws, Xr, x_base, it * tile + tid, threads, n)
                    for j in T.unroll(E):
                        if it * tile + j * threads + tid < n:
                            key = rx.key_of(raws[j], dtype)
                            if p == 0:
                                rx.count(hist, T.uint32(255) - (key >> shift))
                            elif (key >> (shift + 8)) == (prefix[0] >> (shift + 8)):
                                rx.count(hist, T.uint32(255) - ((key >> shift) & T.uint32(255)))
                T.evaluate(T.cuda.cta_sync())
                rx.select_bin(hist, rem[0], tid, scan_tot, state)
                prefix[0] = prefix[0] | ((T.uint32(255) - state[0]) << shift)
                rem[0] = state[1]
                eq[0] = state[2]
            # Ties at the threshold beyond the places left: the lowest indices win. The index of the rem-th tie
            # (in index order) is found digit by digit as above, over the index bits.
            last_tie[0] = T.Cast("uint32", n - 1)
            if rem[0] < eq[0]:
                last_tie[0] = T.uint32(0)
                for p in range(4):
                    shift = 24 - 8 * p
                    rx.clear_hist(hist, tid)
                    for it in T.serial(tiles):
                        load_tile(raws, Xr, x_base, it * tile + tid, threads, n)
                        for j in T.unroll(E):
                            i = it * tile + j * threads + tid
                            if i < n:
                                ui = T.Cast("uint32", i)
                                if rx.key_of(raws[j], dtype) == prefix[0]:
                                    if p == 0:
                                        rx.count(hist, ui >> shift)
                                    elif (ui >> (shift + 8)) == (last_tie[0] >> (shift + 8)):
                                        rx.count(hist, (ui >> shift) & T.uint32(255))
                    T.evaluate(T.cuda.cta_sync())
                    rx.select_bin(hist, rem[0], tid, scan_tot, state)
                    last_tie[0] = last_tie[0] | (state[0] << shift)
                    rem[0] = state[1]
            # Gather in ascending index order: a warp tests 128 consecutive scores a tile (lane-strided, coalesced),
            # ballots give the places inside the warp, one barrier a tile gives the warps' (two buffers of warp
            # totals alternate, so a tile needs no second barrier).
            out_base[0] = T.uint32(0)
            for t in T.serial((n + (tile - 1)) // tile):
                for j in T.unroll(E):
                    i = t * tile + warp * (32 * E) + j * 32 + lane
                    sel[j] = T.uint32(0)
                    raws[j] = T.uint32(0)
                    if i < n:
                        raws[j] = T.Cast("uint32", Xr[x_base + T.Cast("int64", i)])
                        key = rx.key_of(raws[j], dtype)
                        if key > prefix[0] or (key == prefix[0] and T.Cast("uint32", i) <= last_tie[0]):
                            sel[j] = T.uint32(1)
                    ball[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), sel[j] != T.uint32(0))
                below = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)
                total_w = T.uint32(0)
                for j in T.unroll(E):
                    total_w = total_w + T.Cast("uint32", T.popcount(ball[j]))
                buf = (t % 2) * rx.WARPS
                if lane == 0:
                    warp_tot[buf + warp] = total_w
                T.evaluate(T.cuda.cta_sync())
                before = T.alloc_local((1,), "uint32")
                total = T.alloc_local((1,), "uint32")
                before[0] = T.uint32(0)
                total[0] = T.uint32(0)
                for w in range(rx.WARPS):
                    c = warp_tot[buf + w]
                    if w < warp:
                        before[0] = before[0] + c
                    total[0] = total[0] + c
                run = T.alloc_local((1,), "uint32")
                run[0] = out_base[0] + before[0]
                for j in T.unroll(E):
                    if sel[j] != T.uint32(0):
                        pos = T.Cast("int64", run[0] + T.Cast("uint32", T.popcount(ball[j] & below)))
                        If[o_base + pos] = out_index(t * tile + warp * (32 * E) + j * 32 + lane, row, Aux,
                                                     aux_stride)
                        if plain:
                            Vr[o_base + pos] = T.Cast(raw_t, raws[j])
                    run[0] = run[0] + T.Cast("uint32", T.popcount(ball[j]))
                out_base[0] = out_base[0] + total[0]

    return radix_topk


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte model, baselines
# ---------------------------------------------------------------------------------------------------------

# Values: compared as multisets against torch.topk (the output is in index order, not torch's); indices: the same
# multiset of scores as the oracle's (any choice among ties passes; the exact tie-break is the CPU tests' job).
def _values_as_sets(got, want, cfg, inputs):
    from tirx_kernels.core import harness

    def canon(t):
        t = t.float()
        return torch.where(t.isnan(), torch.inf, t).sort(-1, descending=True).values

    if got.shape != want.shape or not torch.equal(canon(got), canon(want)):
        raise harness.KernelCheckError("the top-k values differ from torch.topk's (as multisets per row)")
    return {"rows": int(got.shape[0])}


def _indices(got, want, cfg, inputs):
    from tirx_kernels.core import harness

    return harness.topk_indices("scores")(got, want, cfg, inputs)


COMPARATORS = {"values": _values_as_sets, "indices": _indices}


def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(dtype: str, M: int, N: int, k: int, ties: bool = False, **_) -> dict:
    x = torch.randn(M, N, generator=_generator(), device="cuda")
    if ties:
        x = (x * 4).round() / 4  # few distinct values: many ties at the threshold
    kk = min(k, N)
    return {"scores": x.to(_DTYPES[dtype]), "k": k,
            "values": torch.full((M, kk), float("nan"), device="cuda", dtype=_DTYPES[dtype]),
            "indices": torch.empty(M, kk, device="cuda", dtype=torch.int64)}


def reference(scores, k, **_) -> dict:
    v, i = torch.topk(scores.float(), min(k, scores.shape[-1]), dim=-1)
    return {"values": v, "indices": i}


def launch(cfg: dict, data: dict) -> None:
    """This kernel whatever the shape (top_k would send few long rows to radix_topk_multi_cta)."""
    _run(data["scores"], min(data["k"], data["scores"].shape[-1]), data["values"], data["indices"], dispatch=False)


def roofline(dtype: str, M: int, N: int, k: int, **_) -> dict:
    elem = torch.tensor([], dtype=_DTYPES[dtype]).element_size()
    return {"bytes": M * N * elem + M * k * (elem + 8), "flops": 0}


def get_baselines(**cfg) -> dict:
    def torch_topk():
        return lambda d: dict(zip(("values", "indices"), torch.topk(d["scores"], d["values"].shape[-1], dim=-1)))

    def flashinfer():
        import flashinfer

        return lambda d: dict(zip(("values", "indices"), flashinfer.top_k(d["scores"], d["values"].shape[-1])))

    return {"torch": torch_topk, "flashinfer": flashinfer}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _check_inputs(op: str, scores, k) -> None:
    checks.tensor(op, "input", scores, dtypes=tuple(_DTYPES.values()), ndim=(2,), cuda=False)
    checks.in_range(op, "input", scores.shape[-1], 1, MAX_N)
    if isinstance(k, bool) or not isinstance(k, int):
        raise checks.TirxInputError(f"{op}: argument 'k': expected an int, got {type(k).__name__}")
    checks.in_range(op, "k", k, 1, MAX_K)
    checks.tensor(op, "input", scores, cuda=True)


_DUMMIES: dict = {}


def _dummy(device, dtype) -> torch.Tensor:
    """A 1-element tensor for the arguments a mode does not read (kept: no allocation per call, graph-safe)."""
    key = (device, dtype)
    if key not in _DUMMIES:
        _DUMMIES[key] = torch.zeros(1, 1, device=device, dtype=dtype)
    return _DUMMIES[key]


def _rows(scores: torch.Tensor) -> torch.Tensor:
    """A view with unit column stride and a row stride the kernel accepts (one row: its width)."""
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    if scores.shape[0] <= 1:
        return scores.as_strided(scores.shape, (scores.shape[1], 1))
    return scores


def _run(scores: torch.Tensor, k: int, values, indices: torch.Tensor, mode: str = "plain", lengths=None,
         aux=None, aux_stride: int = 1, sort: bool = False, dispatch: bool = True) -> None:
    """Writes ``indices`` (M, k) (and ``values`` in plain mode) for ``scores`` (M, N); ``sort``: then sorts them
    in place by value (``stable_sort_topk_by_value``); ``dispatch=False``: this kernel whatever the shape."""
    if scores.shape[0] == 0:
        return
    if sort:
        from . import stable_sort_topk_by_value as sorter

        _run(scores, k, values, indices, mode, lengths, aux, aux_stride)
        sorter.run(values, indices, min(k, scores.shape[1]), values, indices)
        return
    x = _rows(scores)
    dev = scores.device
    M, N = x.shape
    if dispatch and k < N:
        # Few long rows: a row over several CTAs (one launch a digit pass), so the rows fill the GPU.
        from . import radix_topk_multi_cta as multi

        chunks = multi.plan_chunks(M, N, multi.sm_count(dev))
        if chunks > 1 and mode == "plain":
            # ... held by a cluster: one launch, the row read once (top_k's values and int64 indices only)
            from . import fast_topk_clusters as clusters

            cluster = clusters.plan_cluster(M, N, str(scores.dtype)[6:], multi.sm_count(dev))
            if cluster:
                clusters.run(x, k, values, indices, cluster)
                return
        if chunks > 1:
            multi.run(x, k, values, indices, chunks, mode, lengths, aux, aux_stride)
            return
    dtype = str(scores.dtype)[6:]
    index_dtype = str(indices.dtype)[6:]
    fn = _FUNCTIONS.get((scores.dtype, indices.dtype, mode, scores.get_device()),
                        lambda: compile_params(dtype, index_dtype, mode), dev)
    if mode == "plain":
        fn(x, values, indices, _dummy(dev, torch.int32).view(1), _dummy(dev, torch.int32).view(1), 1)
    else:
        fn(x, _dummy(dev, scores.dtype), indices, lengths, aux, aux_stride)


_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::flashinfer_top_k", mutates_args=())
def _top_k_op(scores: torch.Tensor, k: int, sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    M = scores.shape[0]
    values = torch.empty(M, k, device=scores.device, dtype=scores.dtype)
    indices = torch.empty(M, k, device=scores.device, dtype=torch.int64)
    _run(scores, k, values, indices, sort=sort)
    return values, indices


@_top_k_op.register_fake
def _(scores, k, sort):
    M = scores.shape[0]
    return (scores.new_empty(M, k), scores.new_empty(M, k, dtype=torch.int64))


def top_k(input: torch.Tensor, k: int, sorted: bool = False,  # noqa: A002
          deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's ``top_k``: the k largest of each row of ``input`` (M, N) fp32/fp16/bf16 -> (values (M, k),
    int64 indices (M, k)). Unsorted: ascending index order; ``sorted=True``: descending value, stable. Every call is
    deterministic (ties at the threshold to the lowest indices), so ``deterministic`` changes nothing. k > N: the
    places past N hold index -1 and value 0 (as FlashInfer's kernels write them)."""
    _check_inputs("top_k", input, k)
    if runtime.direct_call(input):
        M = input.shape[0]
        values = torch.empty(M, k, device=input.device, dtype=input.dtype)
        indices = torch.empty(M, k, device=input.device, dtype=torch.int64)
        _run(input, k, values, indices, sort=sorted)
    else:
        values, indices = torch.ops.tirx.flashinfer_top_k(input, k, sorted)
    return values, indices


def _check_lengths(op: str, name: str, t, rows: int, input) -> None:  # noqa: A002
    checks.tensor(op, name, t, dtypes=(torch.int32,), shape=(rows,), cuda=False)
    if not t.is_contiguous():
        raise checks.TirxInputError(f"{op}: argument '{name}': expected a contiguous tensor, got strides {t.stride()}")
    checks.same_device(op, "input", input, **{name: t})


def top_k_page_table_transform(input: torch.Tensor, src_page_table: torch.Tensor, lengths: torch.Tensor,  # noqa: A002
                               k: int, row_to_batch: torch.Tensor | None = None,
                               deterministic: bool = False) -> torch.Tensor:
    """FlashInfer's ``top_k_page_table_transform``: per row r, the top-k of ``input[r, :lengths[r]]`` mapped through
    ``src_page_table[r]`` -> int32 (M, k); rows shorter than k: their entries in index order, then -1. Same
    selection and order as ``top_k``. ``row_to_batch`` (a row's page-table row) is not supported yet."""
    op = "top_k_page_table_transform"
    _check_inputs(op, input, k)
    M = input.shape[0]
    if row_to_batch is not None:
        raise checks.TirxInputError(f"{op}: argument 'row_to_batch': expected None (not supported yet), got a tensor")
    checks.tensor(op, "src_page_table", src_page_table, dtypes=(torch.int32,), ndim=(2,), cuda=False)
    if src_page_table.shape[0] != M or src_page_table.shape[1] < input.shape[1] or (
            src_page_table.stride(1) != 1 and src_page_table.shape[1] > 1):
        raise checks.TirxInputError(f"{op}: argument 'src_page_table': expected ({M}, >= {input.shape[1]}) with unit "
                                    f"column stride, got {tuple(src_page_table.shape)} {src_page_table.stride()}")
    _check_lengths(op, "lengths", lengths, M, input)
    out = torch.empty(M, k, device=input.device, dtype=torch.int32)
    stride = src_page_table.stride(0) if M > 1 else src_page_table.shape[1]
    flat = src_page_table.as_strided(((M - 1) * stride + src_page_table.shape[1],), (1,))
    _run(input, k, None, out, "page_table", lengths, flat, stride)
    return out


def top_k_ragged_transform(input: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, k: int,  # noqa: A002
                           deterministic: bool = False) -> torch.Tensor:
    """FlashInfer's ``top_k_ragged_transform``: per row r, the top-k indices of ``input[r, :lengths[r]]`` plus
    ``offsets[r]`` -> int32 (M, k); rows shorter than k: their entries in index order, then -1."""
    op = "top_k_ragged_transform"
    _check_inputs(op, input, k)
    M = input.shape[0]
    _check_lengths(op, "offsets", offsets, M, input)
    _check_lengths(op, "lengths", lengths, M, input)
    out = torch.empty(M, k, device=input.device, dtype=torch.int32)
    _run(input, k, None, out, "ragged", lengths, offsets)
    return out


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
