# SPDX-License-Identifier: Apache-2.0
"""The memory-bound helpers in ``core.lang`` (vector, reduce): the CUDA source of tiny kernels that use
every helper, then (where nvcc and cuobjdump exist) their SASS: 16-byte LDG/STG, shuffles, no local memory."""

import re
import shutil

import pytest

pytest.importorskip("tvm")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build  # noqa: E402
from tirx_kernels.core.lang import reduce, vector  # noqa: E402


def test_arithmetic():
    assert vector.ceil_div(2880, 8) == 360 and vector.ceil_div(16, 8) == 2
    assert vector.vector_elems("bfloat16") == 8 and vector.vector_elems("float16") == 8
    assert vector.vector_elems("float32") == 4
    assert reduce.scratch_words(32, 4) == 0 and reduce.scratch_words(160, 1) == 5 and reduce.scratch_words(64, 2) == 4
    with pytest.raises(ValueError):
        vector.elem_bytes("int8")


def _row_kernel(dtype: str, H: int, threads_per_row: int, rows: int = 1):
    """out[r] = x[r] * sum(x[r]^2) over a row of H = threads_per_row * 8 elements (one vector a thread)."""
    threads = threads_per_row * rows
    words = vector.WORDS_PER_VECTOR

    @T.prim_func
    def row_scale(x_ptr: T.handle, y_ptr: T.handle):
        M = T.int32()
        X = T.match_buffer(x_ptr, (M, H), dtype, align=16)
        Y = T.match_buffer(y_ptr, (M, H), dtype, align=16)
        T.device_entry()
        cta = T.cta_id([(M + rows - 1) // rows])
        tid = T.thread_id([threads])
        xr = T.alloc_local((words,), "uint32")
        orr = T.alloc_local((words,), "uint32")
        acc = T.alloc_local((1,), "float32")
        scratch = T.alloc_shared((max(1, reduce.scratch_words(threads_per_row, rows)),), "float32")
        row = cta * rows + tid // threads_per_row
        col = tid % threads_per_row * 8
        vector.fill(xr, 0, words)
        vector.load_v4(xr, 0, X.ptr_to([row, col]), row < M, l1_no_allocate=True)
        acc[0] = T.float32(0)
        for j in T.unroll(words):
            lo, hi = vector.unpack2(xr[j], dtype)
            acc[0] = acc[0] + lo * lo + hi * hi
        total = reduce.group_sum(acc[0], tid, threads_per_row, scratch)
        for j in T.unroll(words):
            lo, hi = vector.unpack2(xr[j], dtype)
            vector.pack2(orr, j, lo * total, hi * total, dtype)
        vector.store_v4(Y.ptr_to([row, col]), orr, 0, row < M)

    return row_scale


def _device(src: str) -> str:
    return src[src.index('extern "C" __global__'):]


@pytest.mark.parametrize("dtype, cvt", [("bfloat16", "cvt.rn.bf16x2.f32"), ("float16", "cvt.rn.f16x2.f32")])
def test_codegen_vectors_and_conversions(dtype, cvt):
    src = build.codegen(_row_kernel(dtype, 1024, 128))
    dev = _device(src)
    assert "ld.global.L1::no_allocate.v4.b32" in src and "st.global.v4.b32" in src and cvt in src
    assert dev.count("ld_vec_global_L1__no_allocate_v4_b32(") == 1 and dev.count("st_vec_global_v4_b32(") == 1
    assert "if ((" in dev or "if (" in dev  # the predicated load/store
    if dtype == "bfloat16":  # bf16 -> fp32 is a shift / a mask
        assert "<< (uint)16" in dev and "4294901760" in dev
    else:  # fp16 -> fp32 through a 16-bit reinterpret
        assert "(*(half *)" in dev


def test_group_sum_warp_only_and_multi_warp():
    warp_only = _device(build.codegen(_row_kernel("bfloat16", 128, 16, rows=8)))
    assert "warp_reduce_sum_16(" in warp_only and "cta_sync" not in warp_only
    multi = build.codegen(_row_kernel("bfloat16", 1280, 160))  # 5 warps: not a power of two
    assert "warp_reduce_sum_32(" in multi
    assert _device(multi).count("tvm_builtin_cuda_cta_sync();") == 1  # one barrier; T.cuda.cta_sum has two
    assert "__shfl_xor_sync" in multi
    with pytest.raises(ValueError):
        reduce.group_sum(None, None, 48)
    with pytest.raises(ValueError):
        reduce.group_sum(None, None, 12)


def test_after_all_ties_every_vector():
    words = vector.WORDS_PER_VECTOR

    @T.prim_func
    def ordered(x_ptr: T.handle, y_ptr: T.handle, zero: T.int32):
        X = T.match_buffer(x_ptr, (4096,), "bfloat16", align=16)
        Y = T.match_buffer(y_ptr, (4096,), "bfloat16", align=16)
        T.device_entry()
        tid = T.thread_id([128])
        xr = T.alloc_local((4 * words,), "uint32")
        dep = T.alloc_local((1,), "uint32")
        for v in T.unroll(4):
            vector.load_v4(xr, v * words, X.ptr_to([(v * 128 + tid) * 8]))
        dep[0] = vector.after_all(xr, 4 * words, zero)
        for v in T.unroll(4):
            for j in T.unroll(words):
                xr[v * words + j] = xr[v * words + j] ^ dep[0]
            vector.store_v4(Y.ptr_to([(v * 128 + tid) * 8]), xr, v * words)

    dev = _device(build.codegen(ordered))
    assert re.search(r"xr_ptr\[0\] \| xr_ptr\[4\]\) \| xr_ptr\[8\]\) \| xr_ptr\[12\]\) & \(\(uint\)zero\)", dev)


@pytest.mark.skipif(shutil.which("nvcc") is None or build.cuobjdump() is None, reason="needs nvcc and cuobjdump")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sass_128bit_accesses_no_local_memory(tmp_path, dtype):
    res = build.build_so(_row_kernel(dtype, 1280, 160), str(tmp_path / "row.so"))
    sass = build.sass(res.so_path)
    assert re.search(r"LDG\.E\.NA\.128", sass) and re.search(r"STG\.E\.128", sass)
    assert "SHFL.BFLY" in sass and "LDL" not in sass and "STL" not in sass
    (kernel,) = res.ptxas_info["kernels"].values()
    assert kernel["stack_bytes"] == 0 and kernel["spill_store_bytes"] == 0


def _policy_kernel(load_priority: str, store_priority: str):
    """y = x through 16-byte accesses carrying L2 cache policies (``.L2::cache_hint``)."""
    words = vector.WORDS_PER_VECTOR

    @T.prim_func
    def hinted_copy(x_ptr: T.handle, y_ptr: T.handle):
        X = T.match_buffer(x_ptr, (4096,), "bfloat16", align=16)
        Y = T.match_buffer(y_ptr, (4096,), "bfloat16", align=16)
        T.device_entry()
        tid = T.thread_id([512])
        xr = T.alloc_local((words,), "uint32")
        pol = T.alloc_local((2,), "uint64")
        vector.l2_policy(pol[0], load_priority)
        vector.l2_policy(pol[1], store_priority)
        vector.load_v4(xr, 0, X.ptr_to([tid * 8]), cache="evict_last", policy=pol[0])
        vector.store_v4(Y.ptr_to([tid * 8]), xr, 0, tid < 500, policy=pol[1])

    return hinted_copy


def test_l2_policy_loads_and_stores(tmp_path):
    src = build.codegen(_policy_kernel("evict_last", "evict_first"))
    assert "createpolicy.fractional.L2::evict_last.b64" in src and "createpolicy.fractional.L2::evict_first.b64" in src
    assert "ld.global.L1::evict_last.L2::cache_hint.v4.b32" in src and "st.global.L2::cache_hint.v4.b32" in src
    with pytest.raises(Exception, match="priority 'evict_sometimes' is not one of"):  # raised while parsing
        build.codegen(_policy_kernel("evict_sometimes", "evict_first"))
    if shutil.which("nvcc") is not None:  # ptxas accepts the operand order
        res = build.build_so(_policy_kernel("evict_last", "evict_first"), str(tmp_path / "hinted.so"))
        (kernel,) = res.ptxas_info["kernels"].values()
        assert kernel["spill_store_bytes"] == 0


def test_access_policies_slots_and_errors():
    acc = vector.AccessPolicies("k", {"x": "evict_last", "store": None, "w": "evict_first"})
    assert acc.slots == {"w": 0, "x": 1} and acc.count == 2
    assert vector.AccessPolicies("k", None).count == 1  # the local array always exists
    with pytest.raises(ValueError, match="k: L2 policy of access 'x'"):
        vector.AccessPolicies("k", {"x": "evict_maybe"})
