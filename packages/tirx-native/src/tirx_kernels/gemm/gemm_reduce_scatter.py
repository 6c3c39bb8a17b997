# SPDX-License-Identifier: Apache-2.0
"""GEMM + reduce-scatter for tensor parallelism: each of ``W`` ranks holds ``a`` [M, K / W] and ``w`` [N, K / W]
(the K shards of a row-parallel projection); rank r returns rows ``r * M / W ...`` of the sum over ranks of
``a @ w^T``, [M / W, N], the reduction overlapped with the GEMM tile by tile. Any world size; with no process group,
one rank. No NVLink multicast (no ``multimem.ld_reduce``, unlike the upstream TP4 kernel): W plain peer loads.

Design (the owner reduces with peer loads after per-tile flags; re-derived for this GEMM):
- Each rank's partial product goes to its symmetric-memory workspace: ``fp16_bf16_gemm``'s persistent kernel built
  with ``sync="publish_tiles"`` (``gemm/_persistent.py``) writes P [M, N] (16-bit) and, once a tile's TMA stores are
  written, adds to the tile's int32 flag after P (system scope). Its M-tiles are rotated to start at shard
  ``rank + 1`` and end with its own, so every shard has one producer at a time early on.
- The owner of a shard sums it over the ranks (``gemm/_peer_reduce.py``): per GEMM tile, wait for the tile's flag of
  every rank (rank - 1 first, the order they produce it), then 16-byte loads of each rank's P through its
  workspace's byte offset (``core.lang.peer``), fp32 sums, one rounding.
- Overlap: the reduce (``REDUCE_CTAS`` CTAs) runs on a side stream beside a GEMM built for ``GEMM_CTAS`` = SMs -
  ``REDUCE_CTAS`` persistent CTAs, so both are resident at once whatever the launch order: the reduce's waits end
  because every rank's GEMM never waits. Where the device has fewer SMs than both need, the reduce runs after the
  GEMM (no overlap, still correct). One rank is the plain product: ``fp16_bf16_gemm.gemm_nt`` into ``out``.
- Per call: the flags are zeroed, then a barrier (every rank's flags zero) before any GEMM writes, and a closing
  barrier (no peer still reads this rank's P when the next op writes the group's workspace); buffers are reused.

``simulate_ranks`` runs W ranks on one GPU (all workspaces in one allocation): every rank's GEMM first, then every
rank's reduce (a reduce must not hold SMs a later rank's GEMM needs), so it checks the protocol, not the overlap.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.gemm import _dist

KERNEL_META = {
    "name": "gemm_reduce_scatter",
    "category": "gemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "partial GEMM a @ w^T per rank (persistent TMA + wgmma, per-tile system-scope flags) and the "
                   "owner's reduction of its row shard over NVLink peer loads, overlapped; any world size",
    "public_ops": ["gemm_reduce_scatter"],
}

# The catalog's shapes (M = 8192, fp16, K the full reduction dim, N the output width): world size 1 on one GPU, and
# 4 / 8 ranks simulated on one GPU (the multi-GPU runs: tests/test_distributed_gemm_gpu.py).
CONFIGS = [
    {"label": "tp1_m8192_n4096_k12288_fp16", "dtype": "float16", "M": 8192, "N": 4096, "K": 12288, "world_size": 1},
    {"label": "tp1_m8192_n5120_k25600_fp16", "dtype": "float16", "M": 8192, "N": 5120, "K": 25600, "world_size": 1},
    {"label": "tp1_m8192_n8192_k28672_fp16", "dtype": "float16", "M": 8192, "N": 8192, "K": 28672, "world_size": 1},
    {"label": "tp1_m8192_n16384_k53248_fp16", "dtype": "float16", "M": 8192, "N": 16384, "K": 53248,
     "world_size": 1},
    {"label": "tp4sim_m8192_n4096_k12288_fp16", "dtype": "float16", "M": 8192, "N": 4096, "K": 12288,
     "world_size": 4},
    {"label": "tp8sim_m8192_n8192_k28672_fp16", "dtype": "float16", "M": 8192, "N": 8192, "K": 28672,
     "world_size": 8},
    # Small and ragged: 3 ranks of 100 output rows (shards end inside M-tiles), N = 200, K / W = 48.
    {"label": "tp3sim_m300_n200_k144_bf16", "dtype": "bfloat16", "M": 300, "N": 200, "K": 144, "world_size": 3},
]

DEFAULTS = {"dtype": "float16", "world_size": 1}
# The sum of W rounded partials (16-bit), then one more rounding: a little looser than one GEMM's.
TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (3e-3, 5e-3)}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
WIDE_TILE, NARROW_TILE = "persistent_128x256x64_s4_e128_g8", "persistent_128x128x64_s6_g8"
TILES = (WIDE_TILE, NARROW_TILE)
REDUCE_CTAS = 12  # reduce CTAs beside the GEMM (unmeasured: the GPU sweep sets it)
GEMM_CTAS = 132 - REDUCE_CTAS  # the GEMM's persistent CTAs (132-SM H100 SXM / H200)
NUM_CONSUMERS = 2  # adds per tile flag (gemm/_persistent.py: one per consumer warpgroup)


def choose_tile(n: int) -> str:
    return WIDE_TILE if n >= 2048 else NARROW_TILE


def compile_params(**cfg) -> dict:
    """The partial GEMM's params (the reduce's: :func:`reduce_params`)."""
    return {"dtype": cfg["dtype"], "tile": cfg.get("tile") or choose_tile(cfg.get("N", 0)), "part": "gemm"}


def reduce_params(dtype: str, tile: str) -> dict:
    return {"dtype": dtype, "tile": tile, "part": "reduce"}


def call_samples(rng) -> list[dict]:
    out = []
    for dtype in _DTYPES:
        for w in (1, 2, 4, 8):
            for n in (rng.randint(1, 255) * 8, rng.randint(256, 4096) * 8, rng.randint(1, 8192) * 8):
                out.append({"dtype": dtype, "M": w * rng.randint(1, 2048), "N": n, "K": 8 * w * rng.randint(1, 2048),
                            "world_size": w})
    return out


def artifact_params() -> list[dict]:
    return [p for d in _DTYPES for t in TILES for p in (compile_params(dtype=d, tile=t), reduce_params(d, t))]


def _tile_params(tile: str) -> dict:
    from tirx_kernels.gemm import fp16_bf16_gemm

    if tile not in TILES:
        raise ValueError(f"gemm_reduce_scatter: tile {tile!r} is not one of {TILES}")
    return {k: v for k, v in fp16_bf16_gemm.TILE_CONFIGS[tile].items() if k != "kind"}


def get_kernel(dtype: str, tile: str, part: str = "gemm", **_):
    """``part="gemm"``: the partial GEMM publishing its tiles, ``fn(a, w, p, flags, m_rotate)`` on ``GEMM_CTAS``
    CTAs; ``part="reduce"``: ``gemm/_peer_reduce.py``'s ``fn(p, flags, deltas, out, rank, ctas)``."""
    if dtype not in _DTYPES:
        raise ValueError(f"gemm_reduce_scatter: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    params = _tile_params(tile)
    if part == "reduce":
        from tirx_kernels.gemm import _peer_reduce

        return _peer_reduce.build_peer_reduce_kernel(dtype, params["block_m"], params["block_n"], NUM_CONSUMERS)
    if part != "gemm":
        raise ValueError(f"gemm_reduce_scatter: part {part!r} is not 'gemm' or 'reduce'")
    from tirx_kernels.gemm import _persistent

    return _persistent.build_persistent_kernel(dtype, **{**params, "num_sms": GEMM_CTAS}, sync="publish_tiles")


def sass_expect(dtype: str, tile: str, part: str = "gemm", **_) -> list[str]:
    """The GEMM's SASS and its system-scope release (fence + reduction); the reduce's acquire and 16-byte loads."""
    if part == "reduce":
        return [r"LDG\.E\.STRONG\.SYS", r"LDG\.E\.NA\.128", r"STG\.E\.128"]
    n = _tile_params(tile)["block_n"]
    return [rf"HGMMA\.64x{n}x16\.F32", r"UTMALDG\.2D", r"UTMASTG\.2D", r"MEMBAR\.ALL\.SYS",
            r"REDG\.E\.ADD\.S32\.STRONG\.SYS"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def prepare_data(dtype: str, M: int, N: int, K: int, world_size: int = 1, **_) -> dict:  # noqa: N803
    """Each rank's K shard: ``a`` [W, M, K / W], ``w`` [W, N, K / W]; the output: the ranks' [M / W, N] row shards
    stacked, [M, N]."""
    t = _DTYPES[dtype]
    k = K // world_size
    a = torch.randn(world_size, M, k, device="cuda").to(t)
    w = (torch.randn(world_size, N, k, device="cuda") / K ** 0.5).to(t)
    return {"a": a, "w": w, "out": torch.full((M, N), float("nan"), device="cuda", dtype=t)}


def reference(a, w, **_) -> dict:
    """fp32 oracle of the unsharded GEMM: the sum over ranks of a[r] @ w[r]^T."""
    return {"out": torch.einsum("rmk,rnk->mn", a.float(), w.float())}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("world_size", 1) == 1:
        gemm_reduce_scatter(data["a"][0], data["w"][0], out=data["out"], tile=cfg.get("tile"))
    else:
        simulate_ranks(data["a"], data["w"], data["out"], tile=cfg.get("tile"))


def roofline(dtype: str, M: int, N: int, K: int, world_size: int = 1, **_) -> dict:  # noqa: N803
    return {"bytes": (M * K + N * K + M * N * (1 + 2 * world_size)) * 2, "flops": 2 * M * N * K}


def get_baselines(**cfg) -> dict:
    def cublas():
        import torch.nn.functional as F

        # One GPU: cuBLAS per rank, the partials summed in fp32 (what an NCCL reduce-scatter does on one GPU, in
        # the partials' dtype). Multi-GPU: cuBLAS + NCCL reduce_scatter in tests/test_distributed_gemm_gpu.py.
        def run(data):
            a, w = data["a"], data["w"]
            total = sum(F.linear(a[r], w[r]).float() for r in range(a.shape[0]))
            return {"out": total.to(a.dtype)}

        return run

    return {"cublas": cublas}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_FUNCTIONS = runtime.FunctionCache(__name__)
_OP = "gemm_reduce_scatter"


def _check(a, w, world: int, out) -> None:
    checks.tensor(_OP, "a", a, dtypes=tuple(_DTYPES.values()), ndim=2, contiguous=True)
    checks.tensor(_OP, "w", w, dtypes=(a.dtype,), ndim=2, shape=(None, a.shape[1]), contiguous=True)
    checks.same_device(_OP, "a", a, w=w)
    checks.multiple_of(_OP, "a.shape[1]", a.shape[1], 8, "K / world size: 16-byte TMA rows")
    checks.multiple_of(_OP, "w.shape[0]", w.shape[0], 8, "N: 16-byte rows of the partial and the output")
    checks.multiple_of(_OP, "a.shape[0]", a.shape[0], world, "M: equal row shards")
    if out is not None:
        checks.tensor(_OP, "out", out, dtypes=(a.dtype,), shape=(a.shape[0] // world, w.shape[0]), contiguous=True)
        checks.same_device(_OP, "a", a, out=out)
        checks.aligned(_OP, "out", out)


def layout(M: int, N: int, tile: str) -> tuple[int, int, int]:  # noqa: N803
    """``(flag offset in int32 words, flag count, workspace bytes)``: P [M, N] 16-bit, then one flag per tile."""
    p = _tile_params(tile)
    n_flags = -(-M // p["block_m"]) * -(-N // p["block_n"])
    p_bytes = -(-M * N * 2 // 128) * 128
    return p_bytes // 4, n_flags, p_bytes + n_flags * 4


def _functions(a, tile):
    dtype = str(a.dtype).replace("torch.", "")
    dev = a.get_device()
    gemm = _FUNCTIONS.get((a.dtype, tile, "gemm", dev), lambda: compile_params(dtype=dtype, tile=tile), a.device)
    red = _FUNCTIONS.get((a.dtype, tile, "reduce", dev), lambda: reduce_params(dtype, tile), a.device)
    return gemm, red


def _views(ws: torch.Tensor, M: int, N: int, tile: str, dtype) -> tuple:  # noqa: N803
    """P and the flags inside one rank's workspace (a byte tensor)."""
    flag_off, n_flags, nbytes = layout(M, N, tile)
    p = ws[:M * N * 2].view(dtype).view(M, N)
    flags = ws[flag_off * 4:nbytes].view(torch.int32)
    return p, flags


def gemm_then_reduce(a, w, p, flags, deltas, out, rank: int, world: int, tile: str, overlap: bool = True,
                     steps: str = "both") -> None:
    """One rank's step on the current stream (flags already zero on every rank): the partial GEMM into ``p``
    (publishing tiles), and the reduce of shard ``rank`` into ``out``, beside it on a side stream where both fit
    (``overlap``), else after it. ``steps``: "gemm" / "reduce" only (the single-GPU simulation)."""
    gemm, red = _functions(a, tile)
    m_rotate = (rank + 1) % world * (a.shape[0] // world) // _tile_params(tile)["block_m"]
    if steps == "both" and overlap:
        cur = torch.cuda.current_stream()
        side = _dist.side_stream(a.device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            red(p, flags, deltas, out, rank, REDUCE_CTAS)  # resident beside the GEMM's GEMM_CTAS
        gemm(a, w, p, flags, m_rotate)
        cur.wait_stream(side)
        return
    if steps != "reduce":
        gemm(a, w, p, flags, m_rotate)
    if steps != "gemm":
        red(p, flags, deltas, out, rank, REDUCE_CTAS)


def _fits(device) -> bool:
    return torch.cuda.get_device_properties(device).multi_processor_count >= GEMM_CTAS + REDUCE_CTAS


_DELTAS: dict = {}


def _peer_deltas(symm, rank: int, device) -> torch.Tensor:
    """Each peer's workspace address minus this rank's (int64, on the device), made once per workspace: a host
    list copied per call cannot be captured in a CUDA graph."""
    ptrs = tuple(symm.buffer_ptrs)
    key = (ptrs, rank, str(device))
    if key not in _DELTAS:
        _DELTAS[key] = torch.tensor([p - ptrs[rank] for p in ptrs], dtype=torch.int64, device=device)
    return _DELTAS[key]


def _gemm_reduce_scatter(a, w, group, out, tile):
    name, rank, world = _dist.group_rank_size(group)
    M, N = a.shape[0], w.shape[0]  # noqa: N806
    out = out if out is not None else a.new_empty((M // world, N))
    if world == 1:
        # One rank: the plain product, straight into ``out`` by the library GEMM (its own tile choice). The partial
        # GEMM on GEMM_CTAS publishing its tiles, then a 12-CTA copy of P, ran 2015 us against cuBLAS's 1264 at
        # m8192 n4096 k12288 fp16 (H200, 2026-12-07d).
        from tirx_kernels.gemm import fp16_bf16_gemm

        fp16_bf16_gemm.gemm_nt(a, w, out, tile=tile)
        return out
    tile = tile or choose_tile(N)
    _, _, nbytes = layout(M, N, tile)
    symm = _dist.symm_workspace(name, nbytes)
    ws = symm.get_buffer(rank, (nbytes,), torch.uint8)
    p, flags = _views(ws, M, N, tile, a.dtype)
    deltas = _peer_deltas(symm, rank, a.device)
    flags.zero_()
    symm.barrier()  # every rank's flags zero
    gemm_then_reduce(a, w, p, flags, deltas, out, rank, world, tile, overlap=_fits(a.device))
    # Every peer done reading this rank's P: the next op on this group's workspace (any op: torch keeps one per group)
    # may write it before its own first barrier.
    symm.barrier()
    return out


def gemm_reduce_scatter(a: torch.Tensor, w: torch.Tensor, group=None, *, out: torch.Tensor | None = None,
                        tile: str | None = None) -> torch.Tensor:
    """Rows ``rank * M / W ...`` of the sum over the ranks of ``group`` of ``a @ w^T``: this rank's ``a`` [M, k] and
    ``w`` [N, k] (fp16 / bf16; k and N multiples of 8, M of the world size). ``group``: a ``torch.distributed``
    ProcessGroup with symmetric memory, or None (this rank alone: the plain product)."""
    name, _, world = _dist.group_rank_size(group)
    _check(a, w, world, out)
    if tile is not None and tile not in TILES:
        checks._fail(_OP, "tile", f"one of {TILES}", repr(tile))
    if out is None and not runtime.direct_call(a, w):
        return torch.ops.tirx.gemm_reduce_scatter(a, w, name, tile)
    return _gemm_reduce_scatter(a, w, group, out, tile)


@torch.library.custom_op("tirx::gemm_reduce_scatter", mutates_args=(),
                         schema="(Tensor a, Tensor w, str? group_name=None, str? tile=None) -> Tensor")
def _gemm_reduce_scatter_op(a, w, group_name=None, tile=None):
    group = None
    if group_name is not None:
        from torch.distributed import distributed_c10d

        group = distributed_c10d._resolve_process_group(group_name)
    return _gemm_reduce_scatter(a, w, group, None, tile)


@_gemm_reduce_scatter_op.register_fake
def _(a, w, group_name=None, tile=None):
    world = 1
    if group_name is not None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        world = dist.get_world_size(distributed_c10d._resolve_process_group(group_name))
    return a.new_empty((a.shape[0] // world, w.shape[0]))


def simulate_ranks(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: str | None = None) -> None:
    """``W = a.shape[0]`` ranks on one GPU: rank r's K shard is ``a[r]`` [M, K / W], ``w[r]`` [N, K / W]; it writes
    rows ``r * M / W ...`` of ``out``. Every rank's GEMM, then every rank's reduce (each on its own stream)."""
    world, M, N = a.shape[0], a.shape[1], w.shape[1]  # noqa: N806
    tile = tile or choose_tile(N)
    for r in range(world):
        _check(a[r], w[r], world, out[r * M // world:(r + 1) * M // world])
    _, _, nbytes = layout(M, N, tile)
    stride = -(-nbytes // 4096) * 4096
    ws = torch.empty(world, stride, dtype=torch.uint8, device=a.device)
    views = [_views(ws[r], M, N, tile, a.dtype) for r in range(world)]
    for _, flags in views:
        flags.zero_()
    cur = torch.cuda.current_stream()
    streams = [_dist.side_stream(a.device, 300 + r) for r in range(world)]
    for steps in ("gemm", "reduce"):
        for r, s in enumerate(streams):
            s.wait_stream(cur)
            # made on the device: a host list's copy cannot be captured in a CUDA graph
            deltas = (torch.arange(world, dtype=torch.int64, device=a.device) - r) * stride
            with torch.cuda.stream(s):
                shard = out[r * M // world:(r + 1) * M // world]
                gemm_then_reduce(a[r], w[r], views[r][0], views[r][1], deltas, shard, r, world, tile, steps=steps)
            deltas.record_stream(s)
        for s in streams:
            cur.wait_stream(s)


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
