// SPDX-License-Identifier: Apache-2.0
// CPU stand-ins for what TIRx row kernels' device code calls, for tirx_kernels.core.emulate: the kernel's own
// function (cut from the generated CUDA) is compiled after this header. One std::thread per CUDA thread of the
// CTA being run, CTAs one after another, so __syncthreads is a CTA barrier and a shuffle a warp barrier around an
// exchange buffer; a thread that returns drops out of both (CUDA's exited threads do not hold a barrier).
// Global memory is the driver's exact-size allocations under AddressSanitizer, so any out-of-bounds byte is caught;
// 16-byte accesses also check their alignment (reported, the run goes on).
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

typedef unsigned int uint;
typedef unsigned char uchar;
typedef unsigned short ushort;
struct nv_bfloat16 { uint16_t x; };
typedef _Float16 half;
struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define CUDART_INF_F __builtin_inff()
#define CUDART_NAN_F __builtin_nanf("")
using std::max;
using std::min;

static std::atomic<long> emu_misaligned{0};
// Per thread, set by the driver to its CTA's objects (the CTAs of a cluster run at once, each with its own).
static thread_local std::barrier<>* emu_cta_bar;   // __syncthreads (row-kernel driver)
static thread_local std::barrier<>* emu_warp_bar;  // one per warp of the CTA
static thread_local uint64_t* emu_warp_slots;      // a shuffle's exchange buffer, one slot per thread of the CTA
static thread_local void (*emu_syncthreads_hook)() = nullptr;  // the Hopper driver's CTA barrier (hopper_cpu.h)

static inline int emu_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

static void emu_check16(const void* p, const char* what) {
  if ((uintptr_t)p % 16 && emu_misaligned++ < 8)
    fprintf(stderr, "EMU misaligned 16-byte %s at %p (block %u,%u,%u thread %u,%u,%u)\n", what, p, blockIdx.x,
            blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
}

// --- barriers and shuffles (every thread of the CTA / every lane of the warp must reach them, as on the GPU)
static inline void __syncthreads() { if (emu_syncthreads_hook) emu_syncthreads_hook(); else emu_cta_bar->arrive_and_wait(); }
static inline void tvm_builtin_cuda_cta_sync() { __syncthreads(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_bar[emu_tid() >> 5].arrive_and_wait(); }

template <class T>
static T emu_shfl(T v, int src_lane) {
  int t = emu_tid(), base = t & ~31;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  emu_warp_slots[t] = bits;
  __syncwarp();
  bits = emu_warp_slots[base + (src_lane & 31)];
  __syncwarp();  // nobody overwrites a slot before every lane has read
  T r;
  memcpy(&r, &bits, sizeof(T));
  return r;
}
template <class T>
static T __shfl_sync(unsigned, T v, int src, int width = 32) {
  int lane = emu_tid() & 31;
  return emu_shfl(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T>
static T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  int lane = emu_tid() & 31, src = lane ^ mask;
  return emu_shfl(v, src >= ((lane & ~(width - 1)) + width) ? lane : src);
}
template <class T>
static T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = emu_tid() & 31, src = lane + (int)delta;
  return emu_shfl(v, src >= ((lane & ~(width - 1)) + width) ? lane : src);
}
template <class T>
static T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = emu_tid() & 31, src = lane - (int)delta;
  return emu_shfl(v, src < (lane & ~(width - 1)) ? lane : src);
}
template <class T>  // the generated butterfly, in the GPU's order (bit-exact sums)
static T tvm_builtin_cuda_warp_reduce_sum_32(T v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
template <class T>
static T tvm_builtin_cuda_warp_reduce_max_32(T v) {
  for (int m = 16; m > 0; m >>= 1) v = std::max(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// --- integer and float intrinsics
static inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float tvm_builtin_cuda_fdividef(float a, float b) { return a / b; }
static inline float tvm_builtin_uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned tvm_builtin_float_as_uint(float f) { return __float_as_uint(f); }
static inline void tvm_builtin_ptx_tanh_approx_f32(float& d, float a) { d = tanhf(a); }
static inline void tvm_builtin_ptx_ex2_approx_ftz_f32(float& d, float a) { d = exp2f(a); }

// --- conversions (cvt.rn: round to nearest even; the first operand goes to the upper half)
static inline uint32_t emu_bf16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fff;
  return (u + 0x7fff + ((u >> 16) & 1)) >> 16;
}
static inline uint32_t emu_f16_rn(float f) { _Float16 h = (_Float16)f; uint16_t u; memcpy(&u, &h, 2); return u; }
static inline void tvm_builtin_ptx_cvt_bf16x2_f32_rn_bf16x2_f32(uint32_t& d, float a, float b) {
  d = (emu_bf16_rn(a) << 16) | emu_bf16_rn(b);
}
static inline void tvm_builtin_ptx_cvt_f16x2_f32_rn_f16x2_f32(uint32_t& d, float a, float b) {
  d = (emu_f16_rn(a) << 16) | emu_f16_rn(b);
}

// --- PDL and L2 cache policies: no-ops on the CPU
static inline void tvm_builtin_ptx_griddepcontrol_wait() {}
static inline void tvm_builtin_ptx_griddepcontrol_launch_dependents() {}
#define EMU_POLICY(name) \
  static inline void tvm_builtin_ptx_createpolicy_##name(uint64_t& p) { p = 0; }
EMU_POLICY(fractional_fractional_L2__evict_first_b64)
EMU_POLICY(fractional_fractional_L2__evict_last_b64)
EMU_POLICY(fractional_fractional_L2__evict_normal_b64)
EMU_POLICY(fractional_fractional_L2__evict_unchanged_b64)

// --- 16-byte global accesses, every cache-hint spelling (an L2 policy operand, if any, comes last and is ignored)
template <class... Policy>
static inline void emu_ld16(uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d, const void* p, Policy...) {
  emu_check16(p, "load");
  uint32_t w[4];
  memcpy(w, p, 16);
  a = w[0]; b = w[1]; c = w[2]; d = w[3];
}
template <class... Policy>
static inline void emu_st16(const void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d, Policy...) {
  emu_check16(p, "store");
  uint32_t w[4] = {a, b, c, d};
  memcpy((void*)p, w, 16);
}
#define EMU_LD16(name) \
  template <class... P> static inline void tvm_builtin_ptx_ld_vec_global_##name(uint32_t& a, uint32_t& b, \
      uint32_t& c, uint32_t& d, const void* p, P... q) { emu_ld16(a, b, c, d, p, q...); }
#define EMU_ST16(name) \
  template <class... P> static inline void tvm_builtin_ptx_st_vec_global_##name(const void* p, uint32_t a, \
      uint32_t b, uint32_t c, uint32_t d, P... q) { emu_st16(p, a, b, c, d, q...); }
EMU_LD16(v4_b32)
EMU_LD16(L2__cache_hint_v4_b32)
EMU_LD16(L1__no_allocate_v4_b32)
EMU_LD16(L1__no_allocate_L2__cache_hint_v4_b32)
EMU_LD16(L1__evict_last_v4_b32)
EMU_LD16(L1__evict_last_L2__cache_hint_v4_b32)
EMU_LD16(nc_v4_b32)
EMU_LD16(nc_L1__no_allocate_v4_b32)
EMU_LD16(nc_L1__no_allocate_L2__cache_hint_v4_b32)
EMU_ST16(v4_b32)
EMU_ST16(L2__cache_hint_v4_b32)
EMU_ST16(L1__no_allocate_v4_b32)
EMU_ST16(L1__no_allocate_L2__cache_hint_v4_b32)

// --- 8-byte global stores (alignment reported like the 16-byte ones)
template <class... P>
static inline void tvm_builtin_ptx_st_vec_global_v2_b32(const void* p, uint32_t a, uint32_t b, P...) {
  if ((uintptr_t)p % 8 && emu_misaligned++ < 8)
    fprintf(stderr, "EMU misaligned 8-byte store at %p (block %u thread %u)\n", p, blockIdx.x, threadIdx.x);
  uint32_t w[2] = {a, b};
  memcpy((void*)p, w, 8);
}
