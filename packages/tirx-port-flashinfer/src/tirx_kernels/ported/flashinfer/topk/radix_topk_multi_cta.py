# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's multi-CTA radix top-k (a row split over several CTAs) behind flashinfer.top_k.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/topk.cuh (RadixTopKMultiCTA,
# TopKDispatch) and python/flashinfer/topk.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: the same selection, but no inter-CTA spin barrier (see below).
"""Top-k of few long rows: a row is cut into ``C`` chunks, one 1024-thread CTA a chunk, grid (rows, C).

FlashInfer's multi-CTA kernel keeps every CTA of a row resident and synchronises them through global-memory
counters between radix passes; its users reported hangs when two such launches share the GPU (flashinfer #3615). Here
the passes are separate launches of one kernel (``stage`` is a run-time argument), so no CTA ever waits for another
inside a launch: stream order is the barrier. That is also what makes the op CUDA-graph safe and safe on two
streams at once (the workspace is per stream, see ``runtime.StreamWorkspace``), and what lets the CPU emulator,
which runs CTAs one after another, run it.

- stage p < P (P = key bits / 8 digit passes: 4 for fp32, 2 for fp16/bf16): each CTA histograms digit p of the keys
  of its chunk that match the digits found so far, and stores the 256 counts in the workspace ``W[row, p, c, :]``
  with plain stores (no atomics, no zeroing: every CTA rewrites its own slot every call).
- stage P: each CTA gathers the selected entries of its chunk in ascending index order at the place the counts of
  the chunks before it give, so the output is the single-CTA kernel's bit for bit (``radix_topk_single_cta``).

Every CTA of stage s first replays the selection of passes < s from the chunk counts (sum over chunks, the same
256-thread scan as ``_radix.select_bin``): a few KB read from L2 against the chunk it streams. Ties at the threshold
go to the lowest indices: the chunk counts of the last pass give each chunk how many ties lie before it, so a chunk
takes its first ``min(ties here, max(0, ties wanted - ties before))`` ties, ranked by ballots as it scans.

Cost (H100, 64 x 131072 fp32, C = 2: 128 CTAs): P + 1 = 5 launches, each reading the 33.5 MB of scores (the first
from HBM, ~11 us at 3 TB/s, the others mostly from the 50 MB L2), plus ~2 us a launch boundary: ~35-45 us on paper,
against 212 us for torch.topk. The issue's 30 us needs fewer full passes over the row: ``filtered_topk``'s plan.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import runtime

from . import radix_topk_single_cta as single

KERNEL_META = {
    "name": "radix_topk_multi_cta",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Top-k of few long rows (radix select, a row over several CTAs, one launch a digit pass)",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "public_ops": ["radix_topk_multi_cta"],
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
}

# The few-row shapes and FlashInfer's multi-CTA bench shapes (catalog 1.11), ties, a row shorter than k.
CONFIGS = [
    {"label": "f32_r1_l131072_k2048", "dtype": "float32", "M": 1, "N": 131072, "k": 2048},
    {"label": "f32_r4_l57596_k256", "dtype": "float32", "M": 4, "N": 57596, "k": 256},
    {"label": "f32_r4_l115188_k256", "dtype": "float32", "M": 4, "N": 115188, "k": 256},
    {"label": "f32_r2_l524288_k256", "dtype": "float32", "M": 2, "N": 524288, "k": 256},
    {"label": "bf16_r2_l524288_k4096", "dtype": "bfloat16", "M": 2, "N": 524288, "k": 4096},
    {"label": "f16_r8_l65536_k1024", "dtype": "float16", "M": 8, "N": 65536, "k": 1024},
    {"label": "f32_ties_r2_l100000_k3000", "dtype": "float32", "M": 2, "N": 100000, "k": 3000, "ties": True},
    {"label": "f32_r3_l9000_k4096", "dtype": "float32", "M": 3, "N": 9000, "k": 4096},
]

BENCH_CONFIGS = [
    {"label": "f32_r1_l131072_k2048", "dtype": "float32", "M": 1, "N": 131072, "k": 2048},
    {"label": "f32_r64_l131072_k2048", "dtype": "float32", "M": 64, "N": 131072, "k": 2048},
    {"label": "f32_r2_l524288_k256", "dtype": "float32", "M": 2, "N": 524288, "k": 256},
    {"label": "f32_r4_l115188_k256", "dtype": "float32", "M": 4, "N": 115188, "k": 256},
]

DEFAULTS = {"dtype": "float32", "ties": False}

MODES = single.MODES
MAX_N = 1 << 24  # chunk counts summed as exact integers; FlashInfer's rows go to 524288
# ptxas gives the kernel its 64-register cap (8 bytes spilled in the plain fp32 build, nvcc 13): one 1024-thread CTA
# an SM. Bringing it to 32 registers (2 CTAs an SM) is the first speed item for the GPU session.
CTAS_PER_SM = 1


def compile_params(dtype: str, index_dtype: str = "int64", mode: str = "plain", **_) -> dict:
    return {"dtype": dtype, "index_dtype": index_dtype, "mode": mode}


def artifact_params() -> list[dict]:
    return single.artifact_params()


def call_samples(rng) -> list[dict]:
    return single.call_samples(rng)


def sass_expect(**_) -> list[str]:
    return [r"\bATOMS\.", r"\bVOTE"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, index_dtype: str = "int64", mode: str = "plain"):
    if dtype not in single._DTYPES:
        raise ValueError(f"radix_topk_multi_cta: dtype {dtype!r} is not one of {sorted(single._DTYPES)}")
    if index_dtype not in ("int32", "int64"):
        raise ValueError(f"radix_topk_multi_cta: index_dtype {index_dtype!r} is not int32 or int64")
    if mode not in MODES:
        raise ValueError(f"radix_topk_multi_cta: mode {mode!r} is not one of {MODES}")
    return build_kernel(dtype, index_dtype, mode)


def build_kernel(dtype: str, index_dtype: str, mode: str):
    """Arguments as ``radix_topk_single_cta``'s kernel, plus the workspace ``W`` (rows, P, C, 256) int32, whose
    third dim is the number of chunks C (the grid's y), and ``stage`` (0..P)."""
    from tvm.script import tirx as T

    from . import _radix as rx

    raw_t = rx.RAW[dtype]
    key_bits = rx.KEY_BITS[dtype]
    P = key_bits // 8  # noqa: N806
    threads, R = rx.THREADS, rx.RADIX  # noqa: N806
    # Scores a lane tests per gather tile: 2, not the single-CTA kernel's 4: with the tie bookkeeping on top, 4
    # spilled 8 bytes at the 64-register cap (nvcc 13).
    E = 2  # noqa: N806
    tile = threads * E
    plain = mode == "plain"

    @T.prim_func
    def radix_topk_multi(x_ptr: T.handle, w_ptr: T.handle, v_ptr: T.handle, i_ptr: T.handle, len_ptr: T.handle,
                         aux_ptr: T.handle, aux_stride: T.int32, stage: T.int32):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        C = T.int32()
        VM = T.int32()
        VK = T.int32()
        L = T.int32()
        A = T.int32()
        x_stride = T.int32()
        X = T.match_buffer(x_ptr, (M, N), dtype, strides=(x_stride, 1), align=2)
        W = T.match_buffer(w_ptr, (M, P, C, R), "int32", align=4)
        V = T.match_buffer(v_ptr, (VM, VK), dtype, align=2)
        Ix = T.match_buffer(i_ptr, (M, K), index_dtype, align=4)
        Lens = T.match_buffer(len_ptr, (L,), "int32", align=4)
        Aux = T.match_buffer(aux_ptr, (A,), "int32", align=4)
        T.device_entry()
        T.attr({"tirx.max_registers": 64})  # 1024 threads x 64 registers: the whole register file of an SM
        Xr = T.decl_buffer((M * x_stride,), raw_t, data=X.data)
        Vr = T.decl_buffer((VM * VK,), raw_t, data=V.data)
        If = T.decl_buffer((M * K,), index_dtype, data=Ix.data)
        row, c = T.cta_id([M, C])
        tid = T.thread_id([threads])
        hist = T.alloc_shared((R,), "uint32")
        scan_tot = T.alloc_shared((rx.SCAN_WARPS,), "uint32")
        warp_tie = T.alloc_shared((rx.WARPS,), "uint32")
        warp_sel = T.alloc_shared((rx.WARPS,), "uint32")
        state = T.alloc_shared((4,), "uint32")
        sel_bin = T.alloc_shared((P,), "uint32")
        prefix = T.alloc_local((1,), "uint32")
        rem = T.alloc_local((1,), "uint32")
        acc = T.alloc_local((2,), "uint32")
        before = T.alloc_local((2,), "uint32")
        run = T.alloc_local((2,), "uint32")
        tie = T.alloc_local((E,), "uint32")
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
        chunk = (((N + C - 1) // C + (tile - 1)) // tile) * tile  # whole tiles, so tiles never straddle chunks
        lo = c * chunk
        hi = T.min(lo + chunk, n)

        if n <= K:
            # As the single-CTA kernel: every entry in index order, then index -1 / value 0 (chunk 0 writes).
            if stage == P and c == 0:
                for it in T.serial((K + (threads - 1)) // threads):
                    j = it * threads + tid
                    if j < K:
                        if j < n:
                            If[o_base + T.Cast("int64", j)] = rx.out_index(mode, index_dtype, j, row, Aux, aux_stride)
                            if plain:
                                Vr[o_base + T.Cast("int64", j)] = Xr[x_base + T.Cast("int64", j)]
                        else:
                            If[o_base + T.Cast("int64", j)] = T.Cast(index_dtype, -1)
                            if plain:
                                Vr[o_base + T.Cast("int64", j)] = T.Cast(raw_t, 0)
        else:
            # Replay the passes before this stage from every chunk's counts.
            prefix[0] = T.uint32(0)
            rem[0] = T.Cast("uint32", K)
            for p in range(P):
                if p < stage:
                    if tid < R:
                        acc[0] = T.uint32(0)
                        for cc in T.serial(C):
                            acc[0] = acc[0] + T.Cast("uint32", W[row, p, cc, tid])
                        hist[tid] = acc[0]
                    T.evaluate(T.cuda.cta_sync())
                    rx.select_bin(hist, rem[0], tid, scan_tot, state)
                    prefix[0] = prefix[0] | ((T.uint32(255) - state[0]) << (key_bits - 8 * (p + 1)))
                    rem[0] = state[1]
                    if tid == 0:
                        sel_bin[p] = state[0]
            if stage < P:
                rx.clear_hist(hist, tid)
                for p in range(P):
                    shift = key_bits - 8 * (p + 1)
                    if stage == p:
                        # A thread issues its E loads of a tile before counting them; ``tie`` holds the raw scores.
                        for it in T.serial(chunk // tile):
                            single.load_tile(tie, Xr, x_base, lo + it * tile + tid, threads, hi)
                            for j in T.unroll(E):
                                if lo + it * tile + j * threads + tid < hi:
                                    key = rx.key_of(tie[j], dtype)
                                    if p == 0:
                                        rx.count(hist, T.uint32(255) - (key >> shift))
                                    elif (key >> (shift + 8)) == (prefix[0] >> (shift + 8)):
                                        rx.count(hist, T.uint32(255) - ((key >> shift) & T.uint32(255)))
                T.evaluate(T.cuda.cta_sync())
                if tid < R:
                    W[row, stage, c, tid] = T.Cast("int32", hist[tid])
            else:
                # Selected entries in the chunks before this one: those above the threshold (bins below the chosen
                # one, each pass) and the ties they take. acc[0] -> before[0]: above (exchanged through warp_tie),
                # acc[1] -> before[1]: ties (last pass, chosen bin; through warp_sel).
                T.evaluate(T.cuda.cta_sync())
                acc[0] = T.uint32(0)
                acc[1] = T.uint32(0)
                for p in range(P):
                    for g in T.serial((c * R + (threads - 1)) // threads):
                        j = g * threads + tid
                        if j < c * R:
                            b = T.Cast("uint32", j % R)
                            h = T.Cast("uint32", W[row, p, j // R, j % R])
                            if b < sel_bin[p]:
                                acc[0] = acc[0] + h
                            if p == P - 1 and b == sel_bin[p]:
                                acc[1] = acc[1] + h
                for q in range(2):
                    acc[q] = T.cuda.warp_sum(acc[q], 32)
                if lane == 0:
                    warp_tie[warp] = acc[0]
                    warp_sel[warp] = acc[1]
                T.evaluate(T.cuda.cta_sync())
                before[0] = T.uint32(0)
                before[1] = T.uint32(0)
                for w in range(rx.WARPS):
                    before[0] = before[0] + warp_tie[w]
                    before[1] = before[1] + warp_sel[w]
                T.evaluate(T.cuda.cta_sync())
                # ties this chunk takes: the first `allowed` of its own, in index order
                allowed = T.if_then_else(rem[0] > before[1], rem[0] - before[1], T.uint32(0))
                run[0] = before[0] + T.min(rem[0], before[1])  # output place of this chunk's first entry
                run[1] = T.uint32(0)  # ties of this chunk seen in earlier tiles
                below = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)
                for t in T.serial(chunk // tile):
                    # ties: warp ballots, then their ranks within the chunk
                    tw = T.alloc_local((1,), "uint32")
                    tw[0] = T.uint32(0)
                    for j in T.unroll(E):
                        i = lo + t * tile + warp * (32 * E) + j * 32 + lane
                        tie[j] = T.uint32(0)
                        sel[j] = T.uint32(0)
                        if i < hi:
                            key = rx.key_of(Xr[x_base + T.Cast("int64", i)], dtype)
                            if key > prefix[0]:
                                sel[j] = T.uint32(1)
                            elif key == prefix[0]:
                                tie[j] = T.uint32(1)
                        ball[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), tie[j] != T.uint32(0))
                        tw[0] = tw[0] + T.Cast("uint32", T.popcount(ball[j]))
                    if lane == 0:
                        warp_tie[warp] = tw[0]
                    T.evaluate(T.cuda.cta_sync())
                    rank = T.alloc_local((1,), "uint32")
                    tsum = T.alloc_local((1,), "uint32")
                    rank[0] = run[1]
                    tsum[0] = T.uint32(0)
                    for w in range(rx.WARPS):
                        if w < warp:
                            rank[0] = rank[0] + warp_tie[w]
                        tsum[0] = tsum[0] + warp_tie[w]
                    run[1] = run[1] + tsum[0]
                    sw = T.alloc_local((1,), "uint32")
                    sw[0] = T.uint32(0)
                    for j in T.unroll(E):
                        if tie[j] != T.uint32(0) and rank[0] + T.Cast("uint32", T.popcount(ball[j] & below)) < allowed:
                            sel[j] = T.uint32(1)
                        rank[0] = rank[0] + T.Cast("uint32", T.popcount(ball[j]))
                        ball[j] = T.cuda.ballot_sync(T.uint32(0xFFFFFFFF), sel[j] != T.uint32(0))
                        sw[0] = sw[0] + T.Cast("uint32", T.popcount(ball[j]))
                    if lane == 0:
                        warp_sel[warp] = sw[0]
                    T.evaluate(T.cuda.cta_sync())
                    pos0 = T.alloc_local((1,), "uint32")
                    ssum = T.alloc_local((1,), "uint32")
                    pos0[0] = run[0]
                    ssum[0] = T.uint32(0)
                    for w in range(rx.WARPS):
                        if w < warp:
                            pos0[0] = pos0[0] + warp_sel[w]
                        ssum[0] = ssum[0] + warp_sel[w]
                    run[0] = run[0] + ssum[0]
                    for j in T.unroll(E):
                        if sel[j] != T.uint32(0):
                            pos = T.Cast("int64", pos0[0] + T.Cast("uint32", T.popcount(ball[j] & below)))
                            col = lo + t * tile + warp * (32 * E) + j * 32 + lane
                            If[o_base + pos] = rx.out_index(mode, index_dtype, col, row, Aux, aux_stride)
                            if plain:
                                # reloaded (an L1 hit) rather than kept live across the tile: registers
                                Vr[o_base + pos] = Xr[x_base + T.Cast("int64", col)]
                        pos0[0] = pos0[0] + T.Cast("uint32", T.popcount(ball[j]))

    return radix_topk_multi


# ---------------------------------------------------------------------------------------------------------
# Plan and launch (top_k in radix_topk_single_cta dispatches here)
# ---------------------------------------------------------------------------------------------------------

def plan_chunks(M: int, N: int, sm_count: int) -> int:
    """CTAs a row gets: enough for ``CTAS_PER_SM`` CTAs on every SM, at least one gather tile (4096 scores) each.
    1 means the single-CTA kernel (many rows fill the GPU by themselves; a row of one tile has nothing to split)."""
    if N > MAX_N or M <= 0:
        return 1
    tile = 1024 * 4
    return max(1, min((N + tile - 1) // tile, (CTAS_PER_SM * sm_count) // M))


_SMS: dict = {}


def sm_count(device) -> int:
    if device.index not in _SMS:
        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]


_FUNCTIONS = runtime.FunctionCache(__name__)
# Chunk counts, one int32 set per (device, stream): two streams never share one; a captured graph keeps its own.
_WORKSPACE = runtime.StreamWorkspace(n_flags=1)


def run(x: torch.Tensor, k: int, values, indices: torch.Tensor, chunks: int, mode: str = "plain", lengths=None,
        aux=None, aux_stride: int = 1) -> None:
    """``radix_topk_single_cta._run``'s contract, over ``chunks`` CTAs a row: P + 1 launches on the current
    stream, no host synchronisation; ``x`` a (rows, N) view with unit column stride."""
    M = x.shape[0]
    dev = x.device
    P = 4 if x.dtype == torch.float32 else 2  # noqa: N806  (digit passes: key bits / 8)
    ws, _ = _WORKSPACE.get(dev, M * P * chunks * 256)
    w = ws[:M * P * chunks * 256].view(torch.int32).view(M, P, chunks, 256)
    dtype = str(x.dtype)[6:]
    index_dtype = str(indices.dtype)[6:]
    fn = _FUNCTIONS.get((x.dtype, indices.dtype, mode, x.get_device()),
                        lambda: compile_params(dtype, index_dtype, mode), dev)
    if mode == "plain":
        lens = aux = single._dummy(dev, torch.int32).view(1)
    else:
        lens, values = lengths, single._dummy(dev, x.dtype)
    for stage in range(P + 1):
        fn(x, w, values, indices, lens, aux, aux_stride, stage)


# ---------------------------------------------------------------------------------------------------------
# Protocol: the single-CTA module's data, oracle and comparators; launch forces this kernel
# ---------------------------------------------------------------------------------------------------------

COMPARATORS = single.COMPARATORS
prepare_data = single.prepare_data
reference = single.reference
roofline = single.roofline
get_baselines = single.get_baselines


def launch(cfg: dict, data: dict) -> None:
    _forced(data["scores"], min(data["k"], data["scores"].shape[1]), False, data["values"], data["indices"])


# ---------------------------------------------------------------------------------------------------------
# Public op: top_k through this kernel whatever the shape (top_k itself dispatches by shape)
# ---------------------------------------------------------------------------------------------------------

def _forced(scores: torch.Tensor, k: int, sort: bool, values: torch.Tensor, indices: torch.Tensor) -> None:
    x = single._rows(scores)
    M, N = x.shape
    if k >= N:  # nothing to select: the single-CTA kernel's copy path
        single._run(scores, k, values, indices, sort=sort, dispatch=False)
        return
    run(x, k, values, indices, max(2, plan_chunks(M, N, sm_count(x.device))))
    if sort:
        from . import stable_sort_topk_by_value as sorter

        sorter.run(values, indices, k, values, indices)


@torch.library.custom_op("tirx::flashinfer_radix_topk_multi_cta", mutates_args=())
def _op(scores: torch.Tensor, k: int, sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values = scores.new_empty(scores.shape[0], k)
    indices = scores.new_empty(scores.shape[0], k, dtype=torch.int64)
    _forced(scores, k, sort, values, indices)
    return values, indices


@_op.register_fake
def _(scores, k, sort):
    return scores.new_empty(scores.shape[0], k), scores.new_empty(scores.shape[0], k, dtype=torch.int64)


def radix_topk_multi_cta(input: torch.Tensor, k: int, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: A002
    """``top_k(input, k, sorted)`` (same result, bit for bit) through this kernel whatever the shape."""
    single._check_inputs("radix_topk_multi_cta", input, k)
    if runtime.direct_call(input):
        values = input.new_empty(input.shape[0], k)
        indices = input.new_empty(input.shape[0], k, dtype=torch.int64)
        _forced(input, k, sorted, values, indices)
        return values, indices
    return torch.ops.tirx.flashinfer_radix_topk_multi_cta(input, k, sorted)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
