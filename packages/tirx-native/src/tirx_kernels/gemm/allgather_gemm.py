# SPDX-License-Identifier: Apache-2.0
"""All-gather + GEMM for tensor parallelism: each of ``W`` ranks holds a row shard ``a_shard`` [M / W, K] of A and
its column shard ``w`` [N / W, K] of W; every rank returns the gathered A [M, K] and ``out = A @ w^T`` [M, N / W],
the gather overlapped with the GEMM tile by tile. Any world size; with no process group, one rank (the gathered A
is a copy of ``a_shard``).

Design (the pull scheme of torch's native async-TP all-gather matmul and of Flux's AG+GEMM, re-derived for this
GEMM; no NVSHMEM, no multicast):
- Each rank copies its shard into its symmetric-memory workspace; a barrier; then a side stream *pulls* the shards
  into the local gathered A, its own first, then ranks ``rank + 1, rank + 2, ...``, each shard in ``chunks`` of whole
  M-tiles, by copy engine (``Tensor.copy_`` between a peer buffer and local memory: a DMA over NVLink, no SM), each
  copy followed by its int32 flag, written by the stream's front end (``_dist.signal``: cuStreamWriteValue32, which
  fences at system scope first).
- The GEMM is ``fp16_bf16_gemm``'s persistent kernel (``gemm/_persistent.py``) built with ``sync="wait_rows"``: its
  M-tile order is rotated to start at this rank's own shard and to continue in the copy order, and before a tile's
  first A load its producer thread spins (``ld.acquire.sys``) on the flags of the chunks of rows the tile covers.
- Deadlock-free whatever the residency: the GEMM waits only for copy-engine work that needs no SM, and the copies
  wait only for the barrier that precedes the GEMM on every rank. A closing barrier keeps the next call from
  overwriting a workspace a peer is still reading.
- The flags are zeroed per call (a memset before the copies), so calls reuse every buffer; under CUDA graph capture
  the signals become memset nodes.

``simulate_ranks`` runs ``W`` ranks on one GPU (all shards in one allocation, each simulated rank on a stream of its
own with its own copy stream): the same copy-and-flag protocol and GEMM, for single-GPU tests of every world size.
Multi-GPU runs need ``torch.distributed`` with NCCL and symmetric memory (tests/test_distributed_gemm_gpu.py).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.gemm import _dist

KERNEL_META = {
    "name": "allgather_gemm",
    "category": "gemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "all-gather of A's row shards over NVLink (copy engine, per-chunk flags) overlapped with the "
                   "persistent TMA + wgmma GEMM A @ W_shard^T, any world size",
    "public_ops": ["allgather_gemm"],
}

# The catalog's shapes (M = 8192, fp16; N x K of the Llama-3 8B / 70B / 405B and Qwen3-32B-class projections): world
# size 1 on one GPU, and 4 / 8 ranks simulated on one GPU (the multi-GPU runs: tests/test_distributed_gemm_gpu.py).
CONFIGS = [
    {"label": "tp1_m8192_n24576_k4096_fp16", "dtype": "float16", "M": 8192, "N": 24576, "K": 4096, "world_size": 1},
    {"label": "tp1_m8192_n51200_k5120_fp16", "dtype": "float16", "M": 8192, "N": 51200, "K": 5120, "world_size": 1},
    {"label": "tp1_m8192_n57344_k8192_fp16", "dtype": "float16", "M": 8192, "N": 57344, "K": 8192, "world_size": 1},
    {"label": "tp1_m8192_n106496_k16384_fp16", "dtype": "float16", "M": 8192, "N": 106496, "K": 16384,
     "world_size": 1},
    {"label": "tp4sim_m8192_n24576_k4096_fp16", "dtype": "float16", "M": 8192, "N": 24576, "K": 4096,
     "world_size": 4},
    {"label": "tp8sim_m8192_n57344_k8192_fp16", "dtype": "float16", "M": 8192, "N": 57344, "K": 8192,
     "world_size": 8},
    # Small and ragged: 3 ranks of 100 rows (shards and copy chunks end inside M-tiles), N / W = 200.
    {"label": "tp3sim_m300_n600_k136_bf16", "dtype": "bfloat16", "M": 300, "N": 600, "K": 136, "world_size": 3},
    {"label": "tp1_m1000_n1032_k1048_bf16", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048, "world_size": 1},
]

DEFAULTS = {"dtype": "float16", "world_size": 1}
TOLERANCE = {"bfloat16": (1e-2, 1.6e-2), "float16": (2e-3, 4e-3)}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# The persistent unclustered tiles the wait hook builds on (fp16_bf16_gemm.TILE_CONFIGS): 128 x 256 with a 4th
# stage for wide shards, 128 x 128 below 2048 columns a rank.
WIDE_TILE, NARROW_TILE = "persistent_128x256x64_s4_e128_g8", "persistent_128x128x64_s6_g8"
TILES = (WIDE_TILE, NARROW_TILE)


def choose_tile(n_local: int) -> str:
    return WIDE_TILE if n_local >= 2048 else NARROW_TILE


def compile_params(**cfg) -> dict:
    tile = cfg.get("tile") or choose_tile(cfg.get("N", 0) // cfg.get("world_size", 1))
    return {"dtype": cfg["dtype"], "tile": tile}


def call_samples(rng) -> list[dict]:
    """Any M, N, K the checks allow: the tile depends on N / W only."""
    out = []
    for dtype in _DTYPES:
        for w in (1, 2, 4, 8):
            for n_local in (rng.randint(1, 255) * 8, rng.randint(256, 4096) * 8, rng.randint(1, 8192) * 8):
                out.append({"dtype": dtype, "M": w * rng.randint(1, 2048), "N": n_local * w,
                            "K": 8 * rng.randint(1, 2048), "world_size": w})
    return out


def artifact_params() -> list[dict]:
    return [{"dtype": d, "tile": t} for d in _DTYPES for t in TILES]


def _tile_params(tile: str) -> dict:
    from tirx_kernels.gemm import fp16_bf16_gemm

    if tile not in TILES:
        raise ValueError(f"allgather_gemm: tile {tile!r} is not one of {TILES}")
    return {k: v for k, v in fp16_bf16_gemm.TILE_CONFIGS[tile].items() if k != "kind"}


def get_kernel(dtype: str, tile: str):
    """The persistent GEMM with the row-flag wait: ``fn(a_full, w, out, flags, shard_rows, chunk_rows, m_rotate)``."""
    if dtype not in _DTYPES:
        raise ValueError(f"allgather_gemm: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    params = _tile_params(tile)
    from tirx_kernels.gemm import _persistent

    return _persistent.build_persistent_kernel(dtype, **params, sync="wait_rows")


def sass_expect(dtype: str, tile: str, **_) -> list[str]:
    """The GEMM's own (HGMMA, TMA, setmaxnreg) and the flag's system-scope acquire load."""
    n = _tile_params(tile)["block_n"]
    return [rf"HGMMA\.64x{n}x16\.F32", r"UTMALDG\.2D", r"UTMASTG\.2D", r"USETMAXREG", r"LDG\.E\.STRONG\.SYS"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def prepare_data(dtype: str, M: int, N: int, K: int, world_size: int = 1, **_) -> dict:  # noqa: N803
    """A [M, K] (the concatenated shards), W [N, K] (the concatenated column shards); outputs: each rank's gathered
    A [world_size, M, K] and the ranks' outputs side by side, [M, N] (rank r's [M, N / W] is columns r * N / W ...)."""
    t = _DTYPES[dtype]
    a = torch.randn(M, K, device="cuda").to(t)
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(t)
    gathered = torch.full((world_size, M, K), float("nan"), device="cuda", dtype=t)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=t)
    return {"a": a, "w": w, "gathered": gathered, "out": out}


def reference(a, w, gathered, **_) -> dict:
    """fp32 oracle of the unsharded GEMM; every rank's gathered A is A itself (bit-exact)."""
    return {"gathered": a.unsqueeze(0).expand(gathered.shape[0], -1, -1), "out": a.float() @ w.float().T}


def _bit_exact(got, want, cfg, inputs):
    from tirx_kernels.core import harness

    return harness.bit_exact(got, want, cfg, inputs)


COMPARATORS = {"gathered": _bit_exact}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("world_size", 1) == 1:
        allgather_gemm(data["a"], data["w"], out=data["out"], gathered=data["gathered"][0], tile=cfg.get("tile"))
    else:
        simulate_ranks(data["a"], data["w"], cfg["world_size"], data["gathered"], data["out"], tile=cfg.get("tile"))


def roofline(dtype: str, M: int, N: int, K: int, world_size: int = 1, **_) -> dict:  # noqa: N803
    return {"bytes": (M * K * (1 + world_size) + N * K + M * N) * 2, "flops": 2 * M * N * K}


def get_baselines(**cfg) -> dict:
    w_size = cfg.get("world_size", 1)

    def cublas():
        import torch.nn.functional as F

        # One GPU: the NCCL all-gather of one rank is a copy; cuBLAS per rank shard of W (the sum of the ranks'
        # work, run back to back). Multi-GPU: cuBLAS + NCCL all_gather in tests/test_distributed_gemm_gpu.py.
        def run(data):
            a, w = data["a"], data["w"]
            gathered = a.unsqueeze(0).repeat(w_size, 1, 1)
            outs = [F.linear(gathered[r], ws) for r, ws in enumerate(w.chunk(w_size))]
            return {"gathered": gathered, "out": torch.cat(outs, dim=1)}

        return run

    return {"cublas": cublas}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_FUNCTIONS = runtime.FunctionCache(__name__)
_OP = "allgather_gemm"


def _check(a_shard, w, world: int, out, gathered) -> None:
    checks.tensor(_OP, "a_shard", a_shard, dtypes=tuple(_DTYPES.values()), ndim=2, contiguous=True)
    checks.tensor(_OP, "w", w, dtypes=(a_shard.dtype,), ndim=2, shape=(None, a_shard.shape[1]), contiguous=True)
    checks.same_device(_OP, "a_shard", a_shard, w=w)
    checks.multiple_of(_OP, "a_shard.shape[1]", a_shard.shape[1], 8, "K: 16-byte TMA rows")
    checks.multiple_of(_OP, "w.shape[0]", w.shape[0], 8, "N / world size: 16-byte output rows")
    m = a_shard.shape[0] * world
    if out is not None:
        checks.tensor(_OP, "out", out, dtypes=(a_shard.dtype,), shape=(m, w.shape[0]))
        checks.same_device(_OP, "a_shard", a_shard, out=out)
        checks.aligned(_OP, "out", out)
    if gathered is not None:
        checks.tensor(_OP, "gathered", gathered, dtypes=(a_shard.dtype,), shape=(m, a_shard.shape[1]),
                      contiguous=True)
        checks.same_device(_OP, "a_shard", a_shard, gathered=gathered)


def _gemm_fn(a, w, tile):
    dtype = str(a.dtype).replace("torch.", "")
    tile = tile or choose_tile(w.shape[0])
    params = {"dtype": dtype, "tile": tile}
    return _FUNCTIONS.get((a.dtype, tile, a.get_device()), lambda: params, a.device), _tile_params(tile)["block_m"]


def pull_and_gemm(sources: list, rank: int, w: torch.Tensor, out: torch.Tensor, gathered: torch.Tensor,
                  tile: str | None = None, copy_stream: torch.cuda.Stream | None = None) -> None:
    """One rank's step on the current stream: copy ``sources[p]`` (rank p's shard, local or a peer buffer) into
    rows ``p * shard ...`` of ``gathered`` on ``copy_stream``, own shard first, then ``rank + 1, ...``, each chunk
    followed by its flag; the GEMM ``gathered @ w^T -> out`` waits for the flags tile by tile."""
    world, shard = len(sources), sources[0].shape[0]
    fn, block_m = _gemm_fn(gathered, w, tile)
    chunk = _dist.chunk_rows(shard, block_m)
    per_shard = -(-shard // chunk)
    cur = torch.cuda.current_stream()
    side = copy_stream or _dist.side_stream(gathered.device)
    flags = torch.zeros(world * per_shard, dtype=torch.int32, device=gathered.device)
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        for i in range(world):
            src = (rank + i) % world
            for c in range(per_shard):
                r0, r1 = c * chunk, min(shard, (c + 1) * chunk)
                gathered[src * shard + r0:src * shard + r1].copy_(sources[src][r0:r1])
                _dist.signal(flags, src * per_shard + c)
    flags.record_stream(side)
    if not _dist.can_signal_without_sms():
        cur.wait_stream(side)  # fill kernels signal: no overlap (a spinning GEMM could hold every SM)
    fn(gathered, w, out, flags, shard, chunk, rank * shard // block_m)
    cur.wait_stream(side)


def local_gemm(a_shard, w, out, gathered, tile=None) -> None:
    """One rank alone: the gathered A is a copy of ``a_shard``, made before the GEMM on the current stream, and the
    GEMM's flags are set up front, so it never waits. (The overlapped protocol rests on the copies needing no SM; a
    same-device copy may run as a kernel, which a persistent GEMM spinning on every SM would starve: allgather_gemm's
    one-GPU bench rows ran past 200 s twice on the H100, 2026-12-07b / c. Here a copy of M x K beside an M x N x K
    GEMM has nothing worth overlapping.)"""
    fn, block_m = _gemm_fn(gathered, w, tile)
    shard = a_shard.shape[0]
    chunk = _dist.chunk_rows(shard, block_m)
    gathered.copy_(a_shard)
    flags = torch.ones(-(-shard // chunk), dtype=torch.int32, device=gathered.device)
    fn(gathered, w, out, flags, shard, chunk, 0)


def _allgather_gemm(a_shard, w, group, out, gathered, tile):
    name, rank, world = _dist.group_rank_size(group)
    m, k = a_shard.shape[0] * world, a_shard.shape[1]
    out = out if out is not None else a_shard.new_empty((m, w.shape[0]))
    gathered = gathered if gathered is not None else a_shard.new_empty((m, k))
    if world == 1:
        local_gemm(a_shard, w, out, gathered, tile)
        return gathered, out
    symm = _dist.symm_workspace(name, a_shard.numel() * a_shard.element_size())
    symm.get_buffer(rank, a_shard.shape, a_shard.dtype).copy_(a_shard)
    symm.barrier()  # every shard in its workspace
    sources = [symm.get_buffer(p, a_shard.shape, a_shard.dtype) for p in range(world)]
    pull_and_gemm(sources, rank, w, out, gathered, tile)
    symm.barrier()  # every peer done reading this rank's workspace before the next call rewrites it
    return gathered, out


def allgather_gemm(a_shard: torch.Tensor, w: torch.Tensor, group=None, *, out: torch.Tensor | None = None,
                   gathered: torch.Tensor | None = None, tile: str | None = None):
    """``(gathered A [W * m, K], gathered A @ w^T [W * m, n])`` for this rank's ``a_shard`` [m, K] and ``w`` [n, K]
    (fp16 / bf16, K and n multiples of 8) over the ranks of ``group`` (a ``torch.distributed`` ProcessGroup with
    symmetric memory; None: this rank alone)."""
    name, _, world = _dist.group_rank_size(group)
    _check(a_shard, w, world, out, gathered)
    if tile is not None and tile not in TILES:
        checks._fail(_OP, "tile", f"one of {TILES}", repr(tile))
    if out is None and gathered is None and not runtime.direct_call(a_shard, w):
        return torch.ops.tirx.allgather_gemm(a_shard, w, name, tile)
    return _allgather_gemm(a_shard, w, group, out, gathered, tile)


@torch.library.custom_op("tirx::allgather_gemm", mutates_args=(),
                         schema="(Tensor a_shard, Tensor w, str? group_name=None, str? tile=None) -> (Tensor, Tensor)")
def _allgather_gemm_op(a_shard, w, group_name=None, tile=None):
    group = None
    if group_name is not None:
        from torch.distributed import distributed_c10d

        group = distributed_c10d._resolve_process_group(group_name)
    return _allgather_gemm(a_shard, w, group, None, None, tile)


@_allgather_gemm_op.register_fake
def _(a_shard, w, group_name=None, tile=None):
    world = 1
    if group_name is not None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        world = dist.get_world_size(distributed_c10d._resolve_process_group(group_name))
    m = a_shard.shape[0] * world
    return a_shard.new_empty((m, a_shard.shape[1])), a_shard.new_empty((m, w.shape[0]))


def simulate_ranks(a: torch.Tensor, w: torch.Tensor, world_size: int, gathered: torch.Tensor, out: torch.Tensor,
                   tile: str | None = None) -> None:
    """``world_size`` ranks on one GPU: rank r holds rows r * M / W ... of ``a`` and rows r * N / W ... of ``w``;
    it gathers into ``gathered[r]`` and writes columns r * N / W ... of ``out``, each rank on its own stream with its
    own copy stream (no rank waits for another: every shard is in memory before the first copy)."""
    checks.multiple_of(_OP, "a.shape[0]", a.shape[0], world_size, "M: equal row shards")
    checks.multiple_of(_OP, "w.shape[0]", w.shape[0], world_size, "N: equal column shards")
    shards, w_shards = a.chunk(world_size), w.chunk(world_size)
    n_local = w.shape[0] // world_size
    cur = torch.cuda.current_stream()
    streams = [_dist.side_stream(a.device, 100 + r) for r in range(world_size)]
    for r, s in enumerate(streams):
        s.wait_stream(cur)
        with torch.cuda.stream(s):
            _check(shards[r], w_shards[r], world_size, out[:, r * n_local:(r + 1) * n_local], gathered[r])
            pull_and_gemm(list(shards), r, w_shards[r], out[:, r * n_local:(r + 1) * n_local], gathered[r], tile,
                          _dist.side_stream(a.device, 200 + r))
    for s in streams:
        cur.wait_stream(s)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
