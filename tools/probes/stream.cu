// SPDX-License-Identifier: Apache-2.0
// Probe: which streaming pattern (threads per CTA, 16-B vectors in flight per thread, sequential chunks per CTA,
// reduce-before-store, two passes) moves x -> y fastest on the H200 under the suite's write-flush cold L2.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <string>
#include <cuda_runtime.h>

__device__ __forceinline__ uint4 ld(const uint4* a) {
  uint4 v; asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(a)); return v; }
__device__ __forceinline__ uint4 ld_na(const uint4* a) {
  uint4 v; asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(a)); return v; }
__device__ __forceinline__ uint4 ld_el(const uint4* a) {
  uint4 v; asm volatile("ld.global.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(a)); return v; }
__device__ __forceinline__ void st(uint4* a, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory"); }

template <int T> __device__ __forceinline__ float block_sum(float v, float* sm) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  if (T > 32) {
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < T / 32 ? sm[threadIdx.x] : 0.f;
    if (threadIdx.x < 32) for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    if (threadIdx.x == 0) sm[32] = v;
    __syncthreads();
    v = sm[32];
  }
  return v;
}
__device__ __forceinline__ float sq(uint4 a) { return __uint_as_float(a.x) * 1e-30f + __uint_as_float(a.w) * 1e-30f; }
__device__ __forceinline__ uint4 scale(uint4 a, float s) { a.x ^= __float_as_uint(s) & 1; return a; }

// MODE 0: plain copy, V vectors a thread issued together, IT chunks after one another.
// MODE 1: reduce-then-store (today's rmsnorm row kernel): all IT*V vectors in registers, block sum, then stores.
// MODE 2: two passes (Inductor's looped reduction): pass 1 reads IT chunks and accumulates, block sum,
//         pass 2 re-reads (L1/L2) and stores.  LD: 0 plain, 1 no_allocate, 2 evict_last (pass-1 loads).
template <int T, int V, int IT, int MODE, int LD>
__global__ void __launch_bounds__(T) stream_k(const uint4* __restrict__ x, uint4* __restrict__ y) {
  __shared__ float sm[33];
  const size_t base = (size_t)blockIdx.x * (T * V * IT) + threadIdx.x;
  if (MODE == 0) {
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      uint4 r[V];
#pragma unroll
      for (int v = 0; v < V; ++v) r[v] = LD == 1 ? ld_na(x + base + (it * V + v) * T) : ld(x + base + (it * V + v) * T);
#pragma unroll
      for (int v = 0; v < V; ++v) st(y + base + (it * V + v) * T, r[v]);
    }
  } else if (MODE == 1) {
    uint4 r[IT * V];
    float acc = 0.f;
#pragma unroll
    for (int v = 0; v < IT * V; ++v) r[v] = LD == 1 ? ld_na(x + base + v * T) : LD == 2 ? ld_el(x + base + v * T) : ld(x + base + v * T);
#pragma unroll
    for (int v = 0; v < IT * V; ++v) acc += sq(r[v]);
    float s = block_sum<T>(acc, sm);
#pragma unroll
    for (int v = 0; v < IT * V; ++v) st(y + base + v * T, scale(r[v], s));
  } else {
    float acc = 0.f;
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      uint4 r[V];
#pragma unroll
      for (int v = 0; v < V; ++v) r[v] = LD == 2 ? ld_el(x + base + (it * V + v) * T) : ld(x + base + (it * V + v) * T);
#pragma unroll
      for (int v = 0; v < V; ++v) acc += sq(r[v]);
    }
    float s = block_sum<T>(acc, sm);
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      uint4 r[V];
#pragma unroll
      for (int v = 0; v < V; ++v) r[v] = ld_na(x + base + (it * V + v) * T);
#pragma unroll
      for (int v = 0; v < V; ++v) st(y + base + (it * V + v) * T, scale(r[v], s));
    }
  }
}

struct Cfg { const char* name; void (*k)(const uint4*, uint4*); int t, per_cta_vecs; };
#define C(T, V, IT, M, L) Cfg{#T "thr x" #V "v x" #IT "it mode" #M " ld" #L, stream_k<T, V, IT, M, L>, T, T * V * IT}

int main() {
  const size_t FL = 512ull << 20;
  char* flush; uint4 *x, *y;
  cudaMalloc(&flush, FL); cudaMalloc(&x, 520ull << 20); cudaMalloc(&y, 520ull << 20);
  cudaMemset(x, 0x3c, 520ull << 20); cudaMemset(y, 0, 520ull << 20);
  cudaEvent_t e0[30], e1[30];
  for (int i = 0; i < 30; ++i) { cudaEventCreate(&e0[i]); cudaEventCreate(&e1[i]); }
  std::vector<Cfg> cfgs = {
    // plain copies
    C(128, 1, 1, 0, 0), C(128, 2, 1, 0, 0), C(128, 4, 1, 0, 0), C(128, 8, 1, 0, 0),
    C(256, 1, 1, 0, 0), C(256, 2, 1, 0, 0), C(256, 4, 1, 0, 0), C(256, 1, 4, 0, 0),
    C(512, 1, 1, 0, 0), C(512, 2, 1, 0, 0), C(512, 4, 1, 0, 0), C(1024, 1, 1, 0, 0), C(1024, 2, 1, 0, 0),
    C(512, 2, 1, 0, 1), C(128, 4, 1, 0, 1),
    // reduce-then-store, 16 KB a CTA (one H=8192 bf16 row) and 8 KB (H=4096)
    C(512, 2, 1, 1, 0), C(512, 2, 1, 1, 1), C(512, 2, 1, 1, 2), C(256, 4, 1, 1, 0), C(1024, 1, 1, 1, 0),
    C(256, 2, 1, 1, 0), C(256, 2, 1, 1, 1), C(512, 1, 1, 1, 0), C(128, 4, 1, 1, 0), C(128, 8, 1, 1, 0),
    // two passes, 16 KB and 8 KB a CTA
    C(256, 1, 4, 2, 0), C(256, 1, 4, 2, 2), C(128, 1, 8, 2, 0), C(512, 1, 2, 2, 0), C(256, 2, 2, 2, 0),
    C(256, 1, 2, 2, 0), C(128, 1, 4, 2, 0), C(128, 2, 2, 2, 0), C(1024, 1, 1, 2, 0),
  };
  size_t sizes[3] = {512ull << 20, 64ull << 20, 112ull << 20};  // 32768x8192, 8192x4096, 8192x7168 bf16
  for (size_t bytes : sizes) {
    printf("== copy %zu MiB (read + write), write-flush cold L2, median us (TB/s)\n", bytes >> 20);
    std::vector<std::pair<float, std::string>> res;
    auto timeit = [&](auto launch) {
      std::vector<float> t;
      for (int rep = 0; rep < 3; ++rep) {
        for (int i = 0; i < 30; ++i) { cudaMemsetAsync(flush, i, FL); cudaEventRecord(e0[i]); launch(); cudaEventRecord(e1[i]); }
        cudaDeviceSynchronize();
        for (int i = 2; i < 30; ++i) { float ms; cudaEventElapsedTime(&ms, e0[i], e1[i]); t.push_back(ms * 1e3f); }
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    for (int pass = 0; pass < 2; ++pass)  // two passes over the list: see run-to-run spread
      for (auto& c : cfgs) {
        if (bytes % ((size_t)c.per_cta_vecs * 16)) continue;
        int grid = bytes / ((size_t)c.per_cta_vecs * 16);
        float us = timeit([&] { c.k<<<grid, c.t>>>(x, y); });
        res.push_back({us, std::string(c.name) + (pass ? " (2nd)" : "")});
      }
    float us = timeit([&] { cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice); });
    res.push_back({us, "cudaMemcpyAsync D2D"});
    std::sort(res.begin(), res.end());
    for (auto& r : res) printf("  %8.1f us  %5.2f TB/s  %s\n", r.first, 2.0 * bytes / r.first / 1e6, r.second.c_str());
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("status %s\n", cudaGetErrorString(e));
  return e != cudaSuccess;
}
