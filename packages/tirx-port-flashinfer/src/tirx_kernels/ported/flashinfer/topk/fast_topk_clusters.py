# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's cluster top-k (a thread-block cluster per row, histograms reduced over distributed shared
# memory). Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/
# fast_topk_clusters_exact.cuh, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec; the algorithm was
# read from the file at commit 3a3c46981ef9220acb7fcfcbea9b64f6424f9b80).
# Written anew in TIRx: the row is read from global memory once and stays in shared memory; the result is
# top_k's deterministic one (see below), where upstream's order and tie choice follow its atomics.
"""Top-k of rows that a cluster's shared memory holds: one cluster of ``C`` CTAs (2, 4 or 8: portable sizes) a row.

CTA ``r`` of a row's cluster owns the contiguous slice ``[r * chunk, (r + 1) * chunk)`` of the row and:

1. loads it once from global memory into its shared memory (where rows start on 16 bytes: four 1-D bulk copies,
   ``cp.async.bulk``, the whole slice in flight at once; else scalar loads), counting the first 8-bit digit of each
   key (``_radix.key_of``) in a 256-bin shared histogram as each piece lands;
2. per digit pass (4 for fp32, 2 for fp16/bf16): a cluster barrier, then every CTA sums the C histograms over
   DSMEM (``mapa`` + ``ld.shared::cluster``, ``core.lang.cluster``) and runs the same 256-bin scan
   (``_radix.select_bin``), so every CTA finds the same digit; the next pass histograms, from shared memory, the
   keys that match the digits found so far. The histograms alternate between two buffers, so one cluster barrier
   a pass suffices: a CTA clears a buffer only after the barrier that every peer reaches after its last read of it.
   After the first pass each CTA lists, in index order, the slice positions whose first digit is the chosen one or
   above (2 bytes each): the later passes and step 3 read only those (a few percent of the slice on random rows)
   instead of the whole slice;
3. counts its keys above the threshold key and its ties, exchanges the counts over DSMEM, and writes its selected
   entries, from shared memory, at the output place the CTAs before it give: ascending index order, ties at the
   threshold to the lowest indices (the CTAs before it take theirs first). A final cluster barrier keeps every CTA
   (and its shared memory) alive until its peers have read its counts.

So the result is ``top_k``'s (``radix_topk_single_cta``) bit for bit: the k largest, NaN above +inf, -0.0 equal to
+0.0, unsorted output in ascending index order, every call the same. One launch, no workspace, no host sync:
CUDA-graph safe. k >= the row's width is the single-CTA kernel's copy path; rows longer than 8 slices
(``max_row``: 131072 fp32, 196608 fp16/bf16) are not this kernel's (``top_k`` sends them elsewhere).

Cost model (H100, 64 x 131072 fp32, k 2048): C = 8, 512 CTAs of 512 threads and 96 KB of shared memory (two an SM):
33.5 MB read once from HBM (~11 us at 3 TB/s); per CTA two sweeps of its 16384 scores in shared memory (the first
digit's histogram, the candidate list), the rest over its candidates; five cluster barriers. Measured (H100,
2026-12-07): 70.6 us, and 22.3 us for one row (8 CTAs): a CTA's slice costs ~12-14 us that a second CTA on the SM
does not hide, ~1.3 SM cycles a score. Suspect: the first histogram's shared atomics, ~68 % of an N(0, 1) row in
two bins of the key's top byte; ``SPREAD`` / ``COPIES`` remove that (tools/sweeps/topk_cluster_variants.py times
them, with 192 KB slices that would hold 262144-score rows in a cluster of 8).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime

from . import radix_topk_single_cta as single

KERNEL_META = {
    "name": "fast_topk_clusters",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Top-k of rows held in a cluster's shared memory (radix select, histograms over DSMEM)",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "public_ops": ["fast_topk_clusters"],
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
}

# FlashInfer's cluster bench shapes (catalog 1.11), issue 21's speed rows, 16-bit keys, ties, a ragged row.
CONFIGS = [
    {"label": "f32_plain_b16_l4096_k256", "dtype": "float32", "M": 16, "N": 4096, "k": 256},
    {"label": "f32_plain_b64_l16384_k256", "dtype": "float32", "M": 64, "N": 16384, "k": 256},
    {"label": "f32_plain_b64_l65536_k1024", "dtype": "float32", "M": 64, "N": 65536, "k": 1024},
    {"label": "f32_r1_l131072_k2048", "dtype": "float32", "M": 1, "N": 131072, "k": 2048},
    {"label": "f32_r64_l131072_k2048", "dtype": "float32", "M": 64, "N": 131072, "k": 2048},
    {"label": "bf16_r8_l196608_k4096", "dtype": "bfloat16", "M": 8, "N": 196608, "k": 4096},
    {"label": "f16_r32_l50000_k512", "dtype": "float16", "M": 32, "N": 50000, "k": 512},
    {"label": "f32_ties_r4_l100003_k3000", "dtype": "float32", "M": 4, "N": 100003, "k": 3000, "ties": True},
]

BENCH_CONFIGS = [
    {"label": "f32_r1_l131072_k2048", "dtype": "float32", "M": 1, "N": 131072, "k": 2048},
    {"label": "f32_r64_l131072_k2048", "dtype": "float32", "M": 64, "N": 131072, "k": 2048},
    {"label": "f32_plain_b64_l65536_k1024", "dtype": "float32", "M": 64, "N": 65536, "k": 1024},
    {"label": "f32_r64_l32768_k512", "dtype": "float32", "M": 64, "N": 32768, "k": 512},
]

DEFAULTS = {"dtype": "float32", "ties": False}

THREADS = 512  # with 64 registers a thread and 96 KB of shared memory, two CTAs an SM
SLICE_BYTES = 96 * 1024  # shared memory for a CTA's slice and its candidate list (2 bytes a score)
CLUSTER_SIZES = (2, 4, 8)  # portable sizes (16 needs the non-portable opt-in)
LOAD_UNROLL = 8  # scalar loads a thread has in flight on the unaligned-row path
GATHER_ELEMS = 4  # scores a lane tests per gather tile
MIN_SLICE = 2048  # fewer scores a CTA than this: a smaller cluster (barriers cost more than they split)
# The first histogram's knobs (_cluster_radix's docstring): off until tools/gpu_calls/topk.sh has timed them on the
# H100 (the top byte of an N(0, 1) fp32 key puts ~68 % of a row in two bins: the suspected cost of this kernel).
SPREAD = False
COPIES = 1
_ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}
_RADIX = 256


def slice_capacity(dtype: str) -> int:
    """Scores a CTA holds: 16384 fp32, 24576 fp16/bf16 (a multiple of 4 pieces of whole 16-byte vectors)."""
    return SLICE_BYTES // (_ELEM[dtype] + 2) // 64 * 64


def max_row(dtype: str) -> int:
    return CLUSTER_SIZES[-1] * slice_capacity(dtype)


def chunk_of(N: int, C: int, dtype: str) -> int:  # noqa: N803
    """Scores a CTA owns: ceil(N / C) rounded up to whole 16-byte vectors (what the kernel computes)."""
    vec = 16 // _ELEM[dtype]
    return ((N + C - 1) // C + vec - 1) // vec * vec


def plan_cluster(M: int, N: int, dtype: str, sm_count: int) -> int:  # noqa: N803
    """Cluster size for (M, N): the smallest whose slices fit shared memory, raised (to 8) while the rows leave
    SMs idle and each CTA keeps at least ``MIN_SLICE`` scores. 0: the row does not fit."""
    fits = [c for c in CLUSTER_SIZES if chunk_of(N, c, dtype) <= slice_capacity(dtype)]
    if not fits or M <= 0:
        return 0
    C = fits[0]  # noqa: N806
    while C < CLUSTER_SIZES[-1] and M * C * 2 <= 2 * sm_count and chunk_of(N, 2 * C, dtype) >= MIN_SLICE:
        C *= 2  # noqa: N806
    return C


def compile_params(dtype: str, M: int = 1, N: int = 4096, cluster: int | None = None, **_) -> dict:
    """One artifact per (score dtype, cluster size); rows, width, stride and k are run-time arguments."""
    if cluster is None:
        cluster = plan_cluster(M, N, dtype, 132) or CLUSTER_SIZES[-1]
    return {"dtype": dtype, "cluster": cluster}


def artifact_params() -> list[dict]:
    return [{"dtype": d, "cluster": c} for d in _ELEM for c in CLUSTER_SIZES]


def call_samples(rng) -> list[dict]:
    """Calls this kernel serves (k < N <= max_row; k >= N is the single-CTA kernel's copy), every dtype."""
    out = []
    for d in _ELEM:
        for _ in range(8):
            N = rng.randint(2, max_row(d))  # noqa: N806
            M = rng.randint(1, 64)  # noqa: N806
            out.append({"dtype": d, "M": M, "N": N, "k": rng.randint(1, min(N - 1, single.MAX_K)),
                        "cluster": plan_cluster(M, N, d, 132)})
    return out


def sass_expect(**_) -> list[str]:
    """Shared atomics (histograms; ptxas aggregates them per warp: ATOMS.POPC.INC), cluster barriers, the DSMEM
    loads of peers' histograms (generic LD.E.128 after mapa), the slice's bulk copies, warp votes (gather)."""
    return [r"\bATOMS\.", r"\bUCGABAR_ARV", r"\bUCGABAR_WAIT", r"\bLD\.E\.128", r"\bUBLKCP\.S\.G", r"\bVOTE"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, cluster: int):
    if dtype not in _ELEM:
        raise ValueError(f"fast_topk_clusters: dtype {dtype!r} is not one of {sorted(_ELEM)}")
    if cluster not in CLUSTER_SIZES:
        raise ValueError(f"fast_topk_clusters: cluster {cluster!r} is not one of {CLUSTER_SIZES}")
    from ._cluster_radix import build_kernel

    return build_kernel(dtype, cluster, slice_capacity(dtype), THREADS, LOAD_UNROLL, GATHER_ELEMS,
                        spread=SPREAD, copies=COPIES)


# ---------------------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------------------

_FUNCTIONS = runtime.FunctionCache(__name__)


def vector_ok(x: torch.Tensor) -> bool:
    """Whether every row of ``x`` (unit column stride) starts on 16 bytes: the kernel's vector load path."""
    vec = 16 // x.element_size()
    return x.data_ptr() % 16 == 0 and (x.shape[0] <= 1 or x.stride(0) % vec == 0)


def run(x: torch.Tensor, k: int, values: torch.Tensor, indices: torch.Tensor, cluster: int) -> None:
    """One launch on the current stream, no host sync: ``x`` a (rows, N) view with unit column stride,
    ``k < N``, ``N <= max_row``; ``values`` / ``indices`` (rows, k), ``indices`` int64."""
    dtype = str(x.dtype)[6:]
    fn = _FUNCTIONS.get((x.dtype, cluster, x.get_device()), lambda: {"dtype": dtype, "cluster": cluster}, x.device)
    fn(x, values, indices, int(vector_ok(x)))


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
# Public op: top_k through this kernel (top_k itself sends few rows that fit here, see single._run)
# ---------------------------------------------------------------------------------------------------------

def _forced(scores: torch.Tensor, k: int, sort: bool, values: torch.Tensor, indices: torch.Tensor) -> None:
    x = single._rows(scores)
    M, N = x.shape  # noqa: N806
    if M == 0:
        return
    if k >= N:  # nothing to select: the single-CTA kernel's copy path
        single._run(scores, k, values, indices, sort=sort, dispatch=False)
        return
    from . import radix_topk_multi_cta as multi

    run(x, k, values, indices, plan_cluster(M, N, str(x.dtype)[6:], multi.sm_count(x.device)))
    if sort:
        from . import stable_sort_topk_by_value as sorter

        sorter.run(values, indices, k, values, indices)


def _check(op: str, scores, k) -> None:
    checks.tensor(op, "input", scores, dtypes=tuple(single._DTYPES.values()), ndim=(2,), cuda=False)
    checks.in_range(op, "input", scores.shape[-1], 1, max_row(str(scores.dtype)[6:]))
    single._check_inputs(op, scores, k)


@torch.library.custom_op("tirx::flashinfer_fast_topk_clusters", mutates_args=())
def _op(scores: torch.Tensor, k: int, sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values = scores.new_empty(scores.shape[0], k)
    indices = scores.new_empty(scores.shape[0], k, dtype=torch.int64)
    _forced(scores, k, sort, values, indices)
    return values, indices


@_op.register_fake
def _(scores, k, sort):
    return scores.new_empty(scores.shape[0], k), scores.new_empty(scores.shape[0], k, dtype=torch.int64)


def fast_topk_clusters(input: torch.Tensor, k: int, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: A002
    """``top_k(input, k, sorted)`` (the same result, bit for bit) through this kernel; rows up to ``max_row``
    (131072 fp32, 262144 fp16/bf16) scores."""
    _check("fast_topk_clusters", input, k)
    if runtime.direct_call(input):
        values = input.new_empty(input.shape[0], k)
        indices = input.new_empty(input.shape[0], k, dtype=torch.int64)
        _forced(input, k, sorted, values, indices)
        return values, indices
    return torch.ops.tirx.flashinfer_fast_topk_clusters(input, k, sorted)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
