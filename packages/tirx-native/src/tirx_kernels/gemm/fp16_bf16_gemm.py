# SPDX-License-Identifier: Apache-2.0
"""C = A·Bᵀ for bf16/fp16 on Hopper: A (M, K), B (N, K), C (M, N), K contiguous, fp32 accumulation.

Warp-specialized TMA + wgmma kernel (one launch per call, M, N, K dynamic):
- 384 threads: warpgroup 0 is the TMA producer (setmaxnreg 40, one thread issues), warpgroups 1-2 are
  consumers (setmaxnreg 232), each owning 64 rows of the 128x256 CTA tile with a 128-register
  m64n256k16 fp32 accumulator.
- A ``num_stages`` full/empty mbarrier ring of 128x64 A and 256x64 B tiles, 128B-swizzled, in one
  ``T.SMEMPool`` (every shared buffer, barriers included: the pool is 1024-aligned only then).
- Epilogue: fp32 -> bf16/fp16 pairs into a SW128 staging tile, then TMA stores of 64x64 boxes.
- Ragged shapes: TMA zero-fills load boxes past M/N/K (so the K tail adds zeros) and clips store boxes
  past M/N. TMA needs 16-byte global strides, hence K % 8 == 0 and N % 8 == 0 (checked by ``gemm_nt``).

Measured: the same design in examples/gemm_ws_pipelined.py ran at 646-688 TFLOP/s at 4096³ on the H200
against cuBLAS 678-773 in the same rounds, bit-identical to torch.
"""

from __future__ import annotations

import os
import sys

import torch

from tirx_kernels.core import checks

KERNEL_META = {
    "name": "fp16_bf16_gemm",
    "category": "gemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "C = A @ B^T, bf16/fp16 in and out, fp32 accumulate; warp-specialized TMA + wgmma",
    "public_ops": ["gemm_nt"],
}

CONFIGS = [
    {"label": "bf16_4096x4096x4096", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096},
    {"label": "fp16_4096x4096x4096", "dtype": "float16", "M": 4096, "N": 4096, "K": 4096},
    {"label": "bf16_1024x1024x1024", "dtype": "bfloat16", "M": 1024, "N": 1024, "K": 1024},
    {"label": "fp16_1024x1024x1024", "dtype": "float16", "M": 1024, "N": 1024, "K": 1024},
    {"label": "bf16_1000x1032x1048", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048},
    {"label": "fp16_1000x1032x1048", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048},
    {"label": "bf16_1x4096x4096", "dtype": "bfloat16", "M": 1, "N": 4096, "K": 4096},
    {"label": "bf16_129x264x72", "dtype": "bfloat16", "M": 129, "N": 264, "K": 72},
    {"label": "fp16_129x264x72", "dtype": "float16", "M": 129, "N": 264, "K": 72},
    {"label": "bf16_300x520x24", "dtype": "bfloat16", "M": 300, "N": 520, "K": 24},
    {"label": "bf16_8192x8192x8192", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192},
    # The persistent kernel (gemm/_persistent.py), pinned until the H200 run confirms it.
    {"label": "bf16_4096x4096x4096_persistent", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_1000x1032x1048_persistent", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "fp16_129x264x72_persistent", "dtype": "float16", "M": 129, "N": 264, "K": 72,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_8192x8192x8192_persistent", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_300x520x24_persistent_c2", "dtype": "bfloat16", "M": 300, "N": 520, "K": 24,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_4096x4096x4096_persistent_c2", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_8192x8192x8192_persistent_c2", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_4096x4096x4096_persistent_128x128", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x128x64_s6_g8"},
    {"label": "fp16_1000x1032x1048_persistent_128x128", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048,
     "tile": "persistent_128x128x64_s6_g8"},
]

# Square sizes and one LLM projection; the persistent/cluster variants side by side in the same run.
BENCH_CONFIGS = [
    {"label": "bf16_4096x4096x4096", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096},
    {"label": "bf16_8192x8192x8192", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192},
    {"label": "bf16_4096x4096x4096_persistent", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_8192x8192x8192_persistent", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_4096x4096x4096_persistent_c2", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_8192x8192x8192_persistent_c2", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_4096x4096x4096_persistent_128x128", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x128x64_s6_g8"},
    {"label": "bf16_4096x14336x4096", "dtype": "bfloat16", "M": 4096, "N": 14336, "K": 4096},
    {"label": "bf16_128x14336x4096", "dtype": "bfloat16", "M": 128, "N": 14336, "K": 4096},
]

DEFAULTS = {"dtype": "bfloat16"}

# Output rounding: bf16 2^-9 relative (half ulp), fp16 2^-12; atol is a fraction of the oracle's RMS.
TOLERANCE = {"bfloat16": (1e-2, 1.6e-2), "float16": (2e-3, 4e-3)}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_OP = "gemm_nt"

# ---------------------------------------------------------------------------------------------------------
# Tile configurations and the heuristic that picks one
# ---------------------------------------------------------------------------------------------------------

# block_m = 2 consumer warpgroups x 64 rows; block_k = 64 elements = one 128-byte swizzle row.
# 3 stages x (16 KB A + 32 KB B) + 64 KB C staging = 208 KB of the 227 KB of smem per CTA.
TILE_CONFIGS = {
    "ws_128x256x64_s3": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3},
    # Persistent (gemm/_persistent.py): grid = min(tiles, num_sms) CTAs looping over tiles in a grouped
    # raster of group_m M-tiles; the ring runs across tiles and the TMA-store epilogue overlaps the next
    # tile's loads. num_sms = 132 is the H200's SM count (a compile parameter, not a device query).
    # 3 x 48 KB ring + 64 KB staging = 208 KB.
    "persistent_128x256x64_s3_g8": {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                    "num_stages": 3, "cluster_m": 1, "group_m": 8, "num_sms": 132},
    # The same with 2-CTA clusters along M, each CTA loading half of B and multicasting it to both.
    "persistent_128x256x64_s3_c2_g8": {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                       "num_stages": 3, "cluster_m": 2, "group_m": 8, "num_sms": 132},
    # Half-width tiles: twice the tiles (less wave quantisation for mid sizes), 6 x 32 KB ring + 32 KB
    # staging = 224 KB.
    "persistent_128x128x64_s6_g8": {"kind": "persistent", "block_m": 128, "block_n": 128, "block_k": 64,
                                    "num_stages": 6, "cluster_m": 1, "group_m": 8, "num_sms": 132},
}

# (max M, max N, max K, tile): the first row that fits wins. One config for now; the table is where
# small-M / small-N tiles go when they exist.
TILE_TABLE = [
    (None, None, None, "ws_128x256x64_s3"),
]


def sass_expect(dtype: str, tile: str) -> list[str]:
    """SASS the CPU build test asserts: the wgmma shape, TMA loads/stores, register reconfiguration."""
    n = TILE_CONFIGS[tile]["block_n"]
    return [rf"HGMMA\.64x{n}x16\.F32" + (r"\.BF16" if dtype == "bfloat16" else r"\b"), r"UTMALDG\.2D",
            r"UTMASTG\.2D", r"USETMAXREG"]


def choose_tile(M: int, N: int, K: int) -> str:
    for max_m, max_n, max_k, tile in TILE_TABLE:
        if (max_m is None or M <= max_m) and (max_n is None or N <= max_n) and (max_k is None or K <= max_k):
            return tile
    raise AssertionError("TILE_TABLE has no catch-all row")


def compile_params(**cfg) -> dict:
    tile = cfg.get("tile") or choose_tile(cfg.get("M", 0), cfg.get("N", 0), cfg.get("K", 0))
    return {"dtype": cfg["dtype"], "tile": tile}


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, tile: str):
    if dtype not in _DTYPES:
        raise ValueError(f"fp16_bf16_gemm: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    params = dict(TILE_CONFIGS[tile])
    if params.pop("kind", None) == "persistent":
        from tirx_kernels.gemm import _persistent

        return _persistent.build_persistent_kernel(dtype, **params)
    return _build_kernel(dtype, **params)


def _build_kernel(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, tma, wgmma

    elem = tma.elem_bytes(dtype)
    assert block_m == 2 * wgmma.M and block_k * elem == 128 and block_n % 64 == 0
    a_tile = block_m * block_k  # elements per stage
    b_tile = block_n * block_k
    stage_bytes = (a_tile + b_tile) * elem  # full boxes, also when they reach past M/N/K
    k_steps = block_k // 16
    nacc = wgmma.acc_regs(block_n)
    store_cols = 128 // elem  # one SW128 store box is 64 rows x 128 bytes
    store_rows = wgmma.M
    num_consumer_warps = 8
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    @T.prim_func
    def fp16_bf16_gemm(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, (N, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, N), dtype, strides=(ldc, 1), align=16)
        # Host: tensor maps with this call's dims (rows/cols past the edge: zero-fill on load, clip on store).
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        c_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, K, block_m, block_k, dtype)
        tma.encode_2d(b_map, B.data, N, K, K, block_n, block_k, dtype)
        tma.encode_2d(c_map, C.data, M, N, ldc, store_rows, store_cols, dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        # M tiles along x (fastest): neighbouring CTAs share one B tile (256 rows of B) in L2.
        mt, nt = T.cta_id([(M + block_m - 1) // block_m, (N + block_n - 1) // block_n])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + block_k - 1) // block_k

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_tile,), dtype, align=1024)
        Bs = pool.alloc((num_stages * b_tile,), dtype, align=1024)
        Cs = pool.alloc((block_m * block_n * elem // 4,), "uint32", align=1024)  # packed pairs, SW128
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")

        if tid == 0:
            for s in range(num_stages):
                mbarrier.init(full.ptr_to([s]), 1)  # the producer's arrive.expect_tx
                mbarrier.init(empty.ptr_to([s]), num_consumer_warps)  # lane 0 of each consumer warp
            mbarrier.fence_init()
        T.cuda.cta_sync()

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            T.ptx["setmaxnreg.dec.sync.aligned.u32"](40)
            if tid == 0:
                for k in range(k_tiles):
                    s = mbarrier.stage(k, num_stages)
                    mbarrier.wait(empty.ptr_to([s]), mbarrier.phase(k, num_stages) ^ 1)
                    mbarrier.arrive_expect_tx(full.ptr_to([s]), stage_bytes)
                    tma.load_2d(As.ptr_to([s * a_tile]), a_map, k * block_k, mt * block_m, full.ptr_to([s]))
                    tma.load_2d(Bs.ptr_to([s * b_tile]), b_map, k * block_k, nt * block_n, full.ptr_to([s]))
        else:
            # Math warpgroups: each owns rows [64*cw, 64*cw + 64) of the CTA tile.
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](232)
            cw = wg - 1
            ct = tid - 128 * wg
            warp = ct // 32
            lane = ct % 32
            for i in T.unroll(nacc):
                acc[i] = T.float32(0)
            for k in range(k_tiles):
                s = mbarrier.stage(k, num_stages)
                mbarrier.wait(full.ptr_to([s]), mbarrier.phase(k, num_stages))
                wgmma.fence()
                for kk in T.unroll(k_steps):
                    wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]),
                                                   As.ptr_to([s * a_tile + cw * wgmma.M * block_k + kk * 16]))
                    wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([s * b_tile + kk * 16]))
                    wgmma.mma_ss(block_n, dtype, acc, desc_a[0], desc_b[0])
                wgmma.commit()
                # NOTES: keep one group in flight; once it is down to one, tile k-1's wgmmas have read
                # their smem, so release that stage (the last stage is never released: nothing waits).
                wgmma.wait(1)
                if k > 0 and lane == 0:
                    mbarrier.arrive(empty.ptr_to([mbarrier.stage(k + num_stages - 1, num_stages)]))
            wgmma.wait(0)

            # Epilogue: this warpgroup's 64 x block_n slab as block_n/64 SW128 boxes of 64 x 64.
            cs_base = cw * wgmma.M * block_n
            for j in T.unroll(block_n // 8):
                for r in T.unroll(2):
                    T.evaluate(cvt_pack(packed[0], acc[wgmma.acc_index(j, r, 1)], acc[wgmma.acc_index(j, r, 0)]))
                    row = wgmma.acc_row(warp, lane, r)
                    col = wgmma.acc_col(lane, j)
                    box = j * 8 // store_cols
                    Cs[(cs_base + box * store_rows * store_cols
                        + tma.sw128_offset(row, col % store_cols, dtype)) // 2] = packed[0]
            tma.fence_proxy_async()
            T.cuda.warpgroup_sync(1 + cw)
            row0 = mt * block_m + cw * wgmma.M
            if ct == 0 and row0 < M:
                for box in range(block_n // store_cols):
                    # Boxes wholly past N are skipped rather than relying on a fully clipped store.
                    if nt * block_n + box * store_cols < N:
                        tma.store_2d(c_map, nt * block_n + box * store_cols, row0,
                                     Cs.ptr_to([(cs_base + box * store_rows * store_cols) // 2]))
                tma.store_commit()
                tma.store_wait(0)

    return fp16_bf16_gemm


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(dtype: str, M: int, N: int, K: int, **_) -> dict:
    g = _generator()
    t = _DTYPES[dtype]
    a = torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    b = torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=t)
    return {"a": a, "b": b, "c": c}


def reference(a, b, **_) -> dict:
    return {"c": a.float() @ b.float().T}


def launch(cfg: dict, data: dict) -> None:
    gemm_nt(data["a"], data["b"], out=data["c"], tile=cfg.get("tile"))


def roofline(dtype: str, M: int, N: int, K: int, **_) -> dict:
    elem = 2
    return {"bytes": (M * K + N * K + M * N) * elem, "flops": 2 * M * N * K}


def get_baselines(**cfg) -> dict:
    def cublas():
        import torch.nn.functional as F

        return lambda data: {"c": F.linear(data["a"], data["b"])}

    return {"cublas": cublas}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _check_inputs(a, b, out) -> None:
    checks.tensor(_OP, "a", a, dtypes=tuple(_DTYPES.values()), ndim=2, contiguous=True, cuda=False)
    checks.tensor(_OP, "b", b, ndim=2, cuda=False)
    checks.same_dtype(_OP, "a", a, b=b)
    checks.tensor(_OP, "b", b, shape=(None, a.shape[1]), contiguous=True, cuda=False)
    # TMA: global row strides must be multiples of 16 bytes.
    checks.multiple_of(_OP, "a", a.shape[1], 8, "K: TMA needs 16-byte row strides")
    checks.multiple_of(_OP, "b", b.shape[0], 8, "N: C's rows need 16-byte strides for the TMA store")
    if out is not None:
        checks.tensor(_OP, "out", out, shape=(a.shape[0], b.shape[0]), cuda=False)
        checks.same_dtype(_OP, "a", a, out=out)
    checks.tensor(_OP, "a", a, cuda=True)
    checks.same_device(_OP, "a", a, b=b, **({} if out is None else {"out": out}))


def gemm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
            tile: str | None = None) -> torch.Tensor:
    """``a @ b.T`` for bf16/fp16 ``a`` (M, K), ``b`` (N, K), both contiguous; K and N multiples of 8.

    Writes ``out`` (M, N, same dtype, unit column stride, 16-byte row stride) when given. ``tile`` pins a
    ``TILE_CONFIGS`` entry instead of ``choose_tile``'s pick (for tuning and benchmarks).
    """
    if tile is not None and tile not in TILE_CONFIGS:
        raise checks.TirxInputError(f"{_OP}: argument 'tile': expected one of {sorted(TILE_CONFIGS)}, got {tile!r}")
    _check_inputs(a, b, out)
    if out is None:
        return torch.ops.tirx.gemm_nt(a, b, tile)
    torch.ops.tirx.gemm_nt_out(a, b, out, tile)
    return out


def _run(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tile: str | None = None) -> None:
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return
    if K == 0:  # a tensor map cannot have a zero extent
        out.zero_()
        return
    checks.aligned(_OP, "a", a)
    checks.aligned(_OP, "b", b)
    checks.aligned(_OP, "out", out)
    from tirx_kernels.core import runtime

    dtype = str(a.dtype).replace("torch.", "")
    fn = runtime.get_function(sys.modules[__name__], compile_params(dtype=dtype, M=M, N=N, K=K, tile=tile))
    fn(a, b, out)


@torch.library.custom_op("tirx::gemm_nt", mutates_args=(), schema="(Tensor a, Tensor b, str? tile=None) -> Tensor")
def _gemm_nt_op(a: torch.Tensor, b: torch.Tensor, tile: str | None = None) -> torch.Tensor:
    out = torch.empty((a.shape[0], b.shape[0]), dtype=a.dtype, device=a.device)
    _run(a, b, out, tile)
    return out


@_gemm_nt_op.register_fake
def _(a, b, tile=None):
    return a.new_empty((a.shape[0], b.shape[0]))


@torch.library.custom_op("tirx::gemm_nt_out", mutates_args=("out",),
                         schema="(Tensor a, Tensor b, Tensor(a!) out, str? tile=None) -> ()")
def _gemm_nt_out_op(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tile: str | None = None) -> None:
    _run(a, b, out, tile)


@_gemm_nt_out_op.register_fake
def _(a, b, out, tile=None):
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
