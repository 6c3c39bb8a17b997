// SPDX-License-Identifier: Apache-2.0
// CPU emulation of rmsnorm's general kernel, from its generated CUDA (test_rmsnorm_general.py writes the kernel's
// function to kernel.inc): one std::thread per CUDA thread, one CTA (row) at a time, the few PTX builtins it calls
// emulated below. 16-byte accesses abort when misaligned, so the test proves the head/tail peeling, the weight's
// shifted loads and the store-path choice for layouts a GPU run would need many configs for, on a machine without
// one. Build with -DFP16 for the float16 kernel, -DTHREADS=n for CTAs of n threads. Exit status: the number of failed cases (0: all pass).
#include <barrier>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
typedef unsigned int uint;
typedef unsigned short ushort;
struct nv_bfloat16 { uint16_t x; };
struct Idx { int x; };
thread_local Idx threadIdx, blockIdx;
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
static std::barrier<>* g_bar;
static float g_wbuf[1024];
static int __shfl_sync(uint, int v, int, int) { return v; }
static void tvm_builtin_ptx_griddepcontrol_wait() {}
static void tvm_builtin_ptx_griddepcontrol_launch_dependents() {}
static void tvm_builtin_ptx_createpolicy_fractional_fractional_L2__evict_first_b64(uint64_t& p) { p = 1; }
static void tvm_builtin_ptx_createpolicy_fractional_fractional_L2__evict_last_b64(uint64_t& p) { p = 2; }
static void chk(const void* a) {
  if ((uintptr_t)a % 16) { fprintf(stderr, "misaligned vector access %p\n", a); abort(); }
}
static void tvm_builtin_ptx_ld_vec_global_v4_b32(uint& a, uint& b, uint& c, uint& d, const void* p) {
  chk(p); uint w[4]; memcpy(w, p, 16); a = w[0]; b = w[1]; c = w[2]; d = w[3];
}
static void tvm_builtin_ptx_ld_vec_global_L1__no_allocate_L2__cache_hint_v4_b32(uint& a, uint& b, uint& c, uint& d,
                                                                               const void* p, uint64_t) {
  tvm_builtin_ptx_ld_vec_global_v4_b32(a, b, c, d, p);
}
static void tvm_builtin_ptx_st_vec_global_v4_b32(const void* p, uint a, uint b, uint c, uint d) {
  chk(p); uint w[4] = {a, b, c, d}; memcpy((void*)p, w, 16);
}
static float tvm_builtin_uint_as_float(uint u) { float f; memcpy(&f, &u, 4); return f; }
static uint16_t to_bf16(float f) {
  uint u; memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return u >> 16;
}
static void tvm_builtin_ptx_cvt_bf16x2_f32_rn_bf16x2_f32(uint& d, float a, float b) {
  d = ((uint)to_bf16(a) << 16) | to_bf16(b);
}
static void tvm_builtin_cuda_cta_sync() { g_bar->arrive_and_wait(); }
// The kernel calls both from converged code: every thread of the CTA reaches them, so CTA barriers stand in for the
// warp's shuffles (the summation order differs from the GPU's butterfly: the tolerance covers it).
static float tvm_builtin_cuda_warp_reduce_sum_32(float v) {
  int t = threadIdx.x;
  g_wbuf[t] = v;
  g_bar->arrive_and_wait();
  float s = 0;
  for (int i = 0; i < 32; ++i) s += g_wbuf[(t & ~31) + i];
  g_bar->arrive_and_wait();
  return s;
}
#ifndef THREADS  // the kernel's CTA size (-DTHREADS=64 for a threads_per_row=64 build)
#define THREADS 128
#endif
static float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#ifdef FP16  // fp16 conversions through the compiler's _Float16 (round to nearest even, as cvt.rn)
typedef _Float16 half;
static uint16_t to_f16(float f) { _Float16 h = (_Float16)f; uint16_t u; memcpy(&u, &h, 2); return u; }
static void tvm_builtin_ptx_cvt_f16x2_f32_rn_f16x2_f32(uint& d, float a, float b) {
  d = ((uint)to_f16(a) << 16) | to_f16(b);
}
#include "kernel.inc"
static float bf(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
#define TO_ELEM to_f16
#define POISON 0x7e01
#define ELEM half
#define TOL_A 2e-3
#define TOL_R 4e-3
#else
#include "kernel.inc"
static float bf(uint16_t h) { uint u = (uint)h << 16; float f; memcpy(&f, &u, 4); return f; }
#define TO_ELEM to_bf16
#define POISON 0x7fc1
#define ELEM nv_bfloat16
#define TOL_A 1e-2
#define TOL_R 1.6e-2
#endif

// One case: x rows at element offset x_off (from a 16-byte aligned base), row stride xs; weight at w_off; out at
// o_off with row stride os. Returns the number of mismatches.
static int run_case(int M, int H, long x_off, long xs, long w_off, long o_off, long os, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  long xn = x_off + (M - 1) * xs + H + 8, on = o_off + (M - 1) * os + H + 64, wn = w_off + H + 8;
  uint16_t* xb = (uint16_t*)aligned_alloc(64, ((xn * 2 + 63) / 64) * 64);
  uint16_t* ob = (uint16_t*)aligned_alloc(64, ((on * 2 + 63) / 64) * 64);
  uint16_t* wb = (uint16_t*)aligned_alloc(64, ((wn * 2 + 63) / 64) * 64);
  for (long i = 0; i < xn; ++i) xb[i] = TO_ELEM(nd(rng));
  for (long i = 0; i < wn; ++i) wb[i] = TO_ELEM(nd(rng));
  for (long i = 0; i < on; ++i) ob[i] = POISON;  // NaN poison
  ELEM* X = (ELEM*)(xb + x_off);
  ELEM* W = (ELEM*)(wb + w_off);
  ELEM* Y = (ELEM*)(ob + o_off);
  const int threads = THREADS;
  std::barrier<> bar(threads);
  g_bar = &bar;
  for (int b = 0; b < M; ++b) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([=] { threadIdx.x = t; blockIdx.x = b; rmsnorm_kernel(W, X, Y, H, M, 1e-6f, (int)xs, (int)os, 0); });
    for (auto& th : ts) th.join();
  }
  int bad = 0;
  std::vector<char> written(on, 0);
  for (long r = 0; r < M; ++r) {
    double ss = 0;
    for (int c = 0; c < H; ++c) { double v = bf(xb[x_off + r * xs + c]); ss += v * v; }
    double rs = 1.0 / sqrt(ss / H + 1e-6);
    for (int c = 0; c < H; ++c) {
      long i = o_off + r * os + c;
      written[i] = 1;
      double ref = bf(xb[x_off + r * xs + c]) * rs * bf(wb[w_off + c]);
      double got = bf(ob[i]);
      if (!(fabs(got - ref) <= TOL_A + TOL_R * fabs(ref))) {
        if (bad < 5) fprintf(stderr, "  row %d col %d: got %g want %g\n", r, c, got, ref);
        ++bad;
      }
    }
  }
  for (long i = 0; i < on; ++i)
    if (!written[i] && ob[i] != POISON) { if (bad < 5) fprintf(stderr, "  guard %ld written\n", i); ++bad; }
  free(xb); free(ob); free(wb);
  return bad;
}

int main() {
  // M, H, x offset (elements past a 16-byte boundary), x row stride, weight offset, out offset, out row stride:
  // odd / tiny / long H, rows whose alignment changes per row, x and out aligned differently, unaligned weight,
  // aligned H with odd strides, one register pass (8184, 8185) and several (8192 + offsets, 16392 ... 262144).
  struct C { int M, H; long x_off, xs, w_off, o_off, os; };
  std::vector<C> cases = {
    {3, 1, 0, 1, 0, 0, 1}, {5, 1, 3, 1, 5, 7, 3}, {4, 7, 0, 7, 0, 0, 7}, {4, 7, 1, 9, 3, 5, 11},
    {9, 111, 0, 111, 0, 0, 111}, {9, 111, 0, 113, 2, 0, 111}, {9, 3001, 0, 3001, 0, 0, 3001},
    {9, 3001, 1, 3001, 0, 1, 3001}, {9, 3001, 3, 3013, 5, 0, 3002}, {3, 3000, 0, 3000, 0, 0, 3000},
    {3, 2880, 1, 2888, 0, 0, 2880}, {3, 4096, 0, 4096, 1, 0, 4096}, {2, 8184, 0, 8184, 0, 0, 8184},
    {2, 8185, 7, 8185, 0, 7, 8185}, {2, 8192, 1, 8193, 0, 1, 8193}, {3, 16392, 0, 16397, 0, 0, 16395},
    {2, 20000, 2, 20001, 6, 4, 20003}, {3, 65537, 0, 65537, 0, 0, 65537}, {1, 262144, 0, 262144, 0, 0, 262144},
    {2, 16, 0, 16, 0, 0, 16}, {8, 9, 7, 17, 3, 5, 13},
  };
  int total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    C c = cases[i];
    int bad = run_case(c.M, c.H, c.x_off, c.xs, c.w_off, c.o_off, c.os, 19 + i);
    printf("M=%d H=%d x_off=%ld xs=%ld w_off=%ld o_off=%ld os=%ld: %s\n", c.M, c.H, c.x_off, c.xs, c.w_off, c.o_off,
           c.os, bad ? "FAIL" : "ok");
    total += bad;
  }
  return total ? 1 : 0;
}
