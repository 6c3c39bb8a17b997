# SPDX-License-Identifier: Apache-2.0
"""The Hopper helpers in ``core.lang`` (wgmma, tma, mbarrier): pure arithmetic, then the CUDA source of a
tiny kernel that uses every helper, then (where nvcc and cuobjdump exist) its SASS."""

import itertools
import shutil

import pytest

pytest.importorskip("tvm")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build  # noqa: E402
from tirx_kernels.core.lang import mbarrier, tma, wgmma  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# Arithmetic (plain ints through the same helpers the kernels trace)
# ---------------------------------------------------------------------------------------------------------


def test_instr_names():
    assert wgmma.instr_name(256, "bfloat16") == "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"
    assert wgmma.instr_name(64, "float16") == "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"
    assert wgmma.acc_regs(256) == 128
    for bad in ((260, "bfloat16"), (0, "bfloat16"), (128, "float32")):
        with pytest.raises(ValueError):
            wgmma.instr_name(*bad)


@pytest.mark.parametrize("n", [64, 256])
def test_accumulator_fragment_covers_tile_once(n):
    seen = set()
    for warp, lane, j, r, e in itertools.product(range(4), range(32), range(n // 8), range(2), range(2)):
        assert 0 <= wgmma.acc_index(j, r, e) < wgmma.acc_regs(n)
        seen.add((wgmma.acc_row(warp, lane, r), wgmma.acc_col(lane, j, e)))
    assert seen == set(itertools.product(range(64), range(n)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sw128_is_a_permutation_within_each_row(dtype):
    per_row = 128 // tma.elem_bytes(dtype)
    for row in range(16):
        offs = sorted(tma.sw128_offset(row, c, dtype) for c in range(per_row))
        assert offs == list(range(row * per_row, (row + 1) * per_row))
    # 16-byte chunk c of row r lands in chunk c ^ (r % 8)
    assert tma.sw128_offset(3, 8, "bfloat16") == 3 * 64 + (1 ^ 3) * 8


def test_sw128_staging_of_accumulators_is_bank_conflict_free():
    # one warp's 4-byte writes of column block j, row half r: 8 rows x 4 words -> 32 distinct banks
    for j, r in itertools.product(range(8), range(2)):
        banks = {(tma.sw128_offset(wgmma.acc_row(0, lane, r), wgmma.acc_col(lane, j), "bfloat16") * 2 // 4) % 32
                 for lane in range(32)}
        assert len(banks) == 32


def test_ring_stage_and_phase():
    assert [mbarrier.stage(k, 3) for k in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [mbarrier.phase(k, 3) for k in range(7)] == [0, 0, 0, 1, 1, 1, 0]


# ---------------------------------------------------------------------------------------------------------
# A tiny kernel using every helper: one 64x64 output tile per CTA, K in one 64-wide box
# ---------------------------------------------------------------------------------------------------------

def _tiny_kernel(dtype="bfloat16", cluster=False):
    n = 64

    @T.prim_func
    def tiny(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
        M = T.int32()
        K = T.int32()  # one 64-wide box of K is used; dynamic to exercise the int64 stride
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, (n, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, n), dtype, align=16)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        c_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, K, 64, 64, dtype)
        tma.encode_2d(b_map, B.data, n, K, K, n, 64, dtype)
        tma.encode_2d(c_map, C.data, M, n, n, 64, 64, dtype)
        T.device_entry()
        mt = T.cta_id([(M + 63) // 64])
        rank = T.int32(0)
        if cluster:
            rank = T.cta_id_in_cluster([2])
        tid = T.thread_id([128])
        pool = T.SMEMPool()
        As = pool.alloc((64 * 64,), dtype, align=1024)
        Bs = pool.alloc((n * 64,), dtype, align=1024)
        Cs = pool.alloc((64 * n // 2,), "uint32", align=1024)
        bar = pool.alloc((2,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((wgmma.acc_regs(n),), "float32")
        da = T.alloc_local((1,), "uint64")
        db = T.alloc_local((1,), "uint64")
        pk = T.alloc_local((1,), "uint32")
        ra = T.alloc_local((1,), "uint32")
        if tid == 0:
            mbarrier.init(bar.ptr_to([0]), 1)
            mbarrier.init(bar.ptr_to([1]), 2)
            mbarrier.fence_init()
        if cluster:
            T.cuda.cluster_sync()
        else:
            T.cuda.cta_sync()
        if tid == 0:
            mbarrier.arrive_expect_tx(bar.ptr_to([0]), (64 + n) * 64 * 2)
            tma.load_2d(As.ptr_to([0]), a_map, 0, mt * 64, bar.ptr_to([0]))
            if cluster:
                tma.load_2d(Bs.ptr_to([0]), b_map, 0, 0, bar.ptr_to([0]), multicast_mask=3)
            else:
                tma.load_2d(Bs.ptr_to([0]), b_map, 0, 0, bar.ptr_to([0]))
        mbarrier.wait(bar.ptr_to([0]), 0)
        for i in T.unroll(wgmma.acc_regs(n)):
            acc[i] = T.float32(0)
        wgmma.fence()
        for kk in T.unroll(4):
            wgmma.encode_desc_kmajor_sw128(da.ptr_to([0]), As.ptr_to([kk * 16]))
            wgmma.encode_desc_kmajor_sw128(db.ptr_to([0]), Bs.ptr_to([kk * 16]))
            wgmma.mma_ss(n, dtype, acc, da[0], db[0])
        wgmma.commit()
        wgmma.wait(0)
        warp = tid // 32
        lane = tid % 32
        for j in T.unroll(n // 8):
            for r in T.unroll(2):
                T.evaluate(T.ptx.cvt.rn.bf16x2.f32(pk[0], acc[wgmma.acc_index(j, r, 1)],
                                                   acc[wgmma.acc_index(j, r, 0)]))
                Cs[tma.sw128_offset(wgmma.acc_row(warp, lane, r), wgmma.acc_col(lane, j), dtype) // 2] = pk[0]
        tma.fence_proxy_async()
        T.cuda.cta_sync()
        if tid == 0:
            tma.store_2d(c_map, 0, mt * 64, Cs.ptr_to([0]))
            tma.store_commit()
            tma.store_wait(0)
            if cluster:
                mbarrier.arrive_remote(bar.ptr_to([1]), 1 - rank, ra[0])
            else:
                mbarrier.arrive(bar.ptr_to([1]))
        if cluster:
            T.cuda.cluster_sync()

    return tiny


@pytest.fixture(scope="module")
def tiny_source():
    return build.codegen(_tiny_kernel())


def _device_source(src: str) -> str:
    return src[src.index('extern "C" __global__'):]


def test_codegen_emits_every_helper(tiny_source):
    src = tiny_source
    for text in (
        "mbarrier.init.shared::cta.b64",
        "fence.mbarrier_init.release.cluster",
        "fence.proxy.async.shared::cta",
        "mbarrier.arrive.expect_tx.shared::cta.b64",
        "mbarrier.try_wait.parity",
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "wgmma.fence.sync.aligned",
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
        "wgmma.commit_group.sync.aligned",
        "wgmma.wait_group.sync.aligned 0",
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group",
        "cp.async.bulk.commit_group",
        "cp.async.bulk.wait_group 0",
        "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
        "static_cast<CUtensorMapSwizzle>(3)",
        "const __grid_constant__ CUtensorMap a_map",
    ):
        assert text in src, text
    dev = _device_source(src)
    # descriptor: LBO 1, SBO 64 (1024 B), 128B swizzle
    assert dev.count("ptx_wgmma_encode_matrix_descriptor(") >= 8 and ", 1, 64, 3);" in dev
    # the row stride is widened before the byte multiply
    assert "(((int64_t)K) * (int64_t)2)" in src
    # everything shared lives in the pool: no static __shared__ (it would move the pool off 1024 B)
    assert "__shared__ __align__" in dev and dev.count("__shared__") == 1


def test_codegen_cluster_multicast_and_remote_arrive():
    src = build.codegen(_tiny_kernel(cluster=True))  # PTX text sits in helper definitions above the kernel
    assert ".multicast::cluster" in src
    assert "mapa.shared::cluster.u32" in src
    assert "mbarrier.arrive.shared::cluster.b64" in src
    # default semantics: a .release.cluster remote arrive costs a GPU-wide fence
    assert "mbarrier.arrive.release.cluster" not in src
    assert "cudaLaunchAttributeClusterDimension" in src


def test_fp16_instruction():
    src = build.codegen(_tiny_kernel(dtype="float16"))
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in src
    assert "CU_TENSOR_MAP_DATA_TYPE_FLOAT16" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_tiny_kernel_sass(tmp_path):
    res = build.build_so(_tiny_kernel(), str(tmp_path / "tiny.so"))
    kern = next(iter(res.ptxas_info["kernels"].values()))
    assert kern["spill_store_bytes"] == 0 and kern["spill_load_bytes"] == 0
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = build.sass(res.so_path)
    for op in ("HGMMA.64x64x16.F32.BF16", "UTMALDG.2D", "UTMASTG.2D", "SYNCS"):
        assert op in sass, op
    assert "LDL" not in sass and "STL" not in sass
