# SPDX-License-Identifier: Apache-2.0
"""tirx_kernels.core.emulate: generated-CUDA-shaped kernels run on the CPU: results, shuffles / shared memory /
barriers, and the faults it must report (an out-of-bounds write, a misaligned 16-byte access, a write into an
allocation's round-up)."""

import shutil

import pytest
import torch

from tirx_kernels.core import emulate

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# The shapes TIRx emits: extern "C" definition after a declaration, __restrict__ pointers, the PTX wrappers.
_ROWSUM = r"""
extern "C" __global__ void __launch_bounds__(64) rowsum_kernel(float* __restrict__ X, float* Y, int M, int n, int e);
extern "C" __global__ void __launch_bounds__(64) rowsum_kernel(float* __restrict__ X, float* Y, int M, int n, int e) {
  __shared__ alignas(64) float part[2];
  uint64_t pol;
  tvm_builtin_ptx_createpolicy_fractional_fractional_L2__evict_first_b64(pol);
  tvm_builtin_ptx_griddepcontrol_wait();
  int row = (int)blockIdx.x;
  uint a, b, c, d;
  float s = 0.0f;
  for (int k = ((int)threadIdx.x) * 4; k < n; k += 256) {
    tvm_builtin_ptx_ld_vec_global_L1__no_allocate_L2__cache_hint_v4_b32(a, b, c, d, X + (int64_t)row * n + k, pol);
    s += tvm_builtin_uint_as_float(a) + tvm_builtin_uint_as_float(b) + tvm_builtin_uint_as_float(c)
         + tvm_builtin_uint_as_float(d);
  }
  s = tvm_builtin_cuda_warp_reduce_sum_32(s);
  int warp = __shfl_sync((uint)4294967295, ((int)threadIdx.x) >> 5, 0, 32);
  if ((((int)threadIdx.x) & 31) == 0) part[warp] = s;
  tvm_builtin_cuda_cta_sync();
  if (((int)threadIdx.x) == 0) {
    float t = part[0] + part[1];
    tvm_builtin_ptx_st_vec_global_v4_b32(Y + row * 4, __float_as_uint(t), 0u, 0u, 0u);
  }
  if (((int)threadIdx.x) >= 32) return;  // exited threads hold no barrier
  tvm_builtin_cuda_cta_sync();
  if (((int)threadIdx.x) == 0 && e) Y[row * 4 + 1 + e] = 1.0f;  // e = 3: one element past the row
  tvm_builtin_ptx_griddepcontrol_launch_dependents();
}
"""


def _inputs(M=3, n=512):
    x = torch.randn(M, n)
    return x, torch.zeros(M, 4), M, n


def test_rowsum_results():
    x, y, M, n = _inputs()
    rep = emulate.launch(_ROWSUM, [x, y, M, n, 0], grid=(M,), block=(64,)).check()
    assert rep.ok and rep.misaligned == 0 and not rep.asan
    torch.testing.assert_close(y[:, 0], x.sum(1), rtol=1e-5, atol=1e-4)
    assert torch.equal(y[:, 1:], torch.zeros(M, 3))


def test_kernel_signature_parsed():
    kern = emulate.compile(_ROWSUM)
    assert kern.name == "rowsum_kernel"
    assert [(p.ctype, p.name, p.pointer) for p in kern.params] == [
        ("float*", "X", True), ("float*", "Y", True), ("int", "M", False), ("int", "n", False),
        ("int", "e", False)]
    with pytest.raises(TypeError, match="takes 5 arguments"):
        kern(1, grid=(1,), block=(64,))
    with pytest.raises(TypeError, match=r"missing \['e'\], unknown \['f'\]"):
        kern(X=1, Y=2, M=3, n=4, f=5, grid=(1,), block=(64,))


def test_arguments_by_name():
    x, y, M, n = _inputs()
    emulate.compile(_ROWSUM)(grid=(M,), block=(64,), e=0, n=n, M=M, Y=y, X=x).check()
    torch.testing.assert_close(y[:, 0], x.sum(1), rtol=1e-5, atol=1e-4)


def test_planted_out_of_bounds_write_is_caught():
    x, y, M, n = _inputs()
    # e = 3: the last row writes Y[12], one float past a 48-byte storage (past its round-up too)
    rep = emulate.launch(_ROWSUM, [x, y, M, n, 3], grid=(M,), block=(64,))
    assert not rep.ok and "heap-buffer-overflow" in rep.asan and "WRITE of size 4" in rep.asan
    with pytest.raises(emulate.EmulationError, match="AddressSanitizer"):
        rep.check()


def test_write_into_the_round_up_is_caught():
    """Y of 11 floats: the last row's 16-byte store covers element 11, in the allocation's round-up to 16 bytes
    (no fault on a GPU, but no tensor's element): reported as written past the end, 4 bytes."""
    x, _, M, n = _inputs(M=3)
    rep = emulate.launch(_ROWSUM, [x, torch.zeros(11), M, n, 0], grid=(M,), block=(64,))
    assert not rep.ok and rep.past_end == 4 and not rep.asan and not rep.misaligned
    assert emulate.launch(_ROWSUM, [x, torch.zeros(12), M, n, 0], grid=(M,), block=(64,)).ok


def test_misaligned_vector_access_is_reported():
    x, y, M, n = _inputs()
    xb = torch.randn(M * n + 1)
    rep = emulate.launch(_ROWSUM, [xb[1:], y, M, n, 0], grid=(M,), block=(64,))  # 4 bytes off 16
    assert rep.misaligned > 0 and not rep.ok and "misaligned 16-byte load" in rep.stderr


def test_views_share_their_storage():
    """Two views of one storage are one allocation: the writes land in the shared storage."""
    M, n = 2, 256
    buf = torch.zeros(M * n + M * 4)
    buf[:M * n] = torch.arange(M * n, dtype=torch.float32)
    x, y = buf[:M * n].view(M, n), buf[M * n:].view(M, 4)
    emulate.launch(_ROWSUM, [x, y, M, n, 0], grid=(M,), block=(64,)).check()
    torch.testing.assert_close(buf[M * n::4], x.sum(1))
