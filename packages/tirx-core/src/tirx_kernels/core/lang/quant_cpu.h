// SPDX-License-Identifier: Apache-2.0
// CPU stand-ins for the PTX FP8 conversions of tirx_kernels.core.lang.quant, for tirx_kernels.core.emulate
// (force-included with quant.emulate_cxxflags()). Same rule as cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32: round to
// nearest even, +-max for finite overflow and +-inf, 0x7F for NaN, sign of zero kept; the first operand goes to
// the upper byte.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

// mbits: mantissa bits, bias: exponent bias, max_code: the largest finite magnitude's code.
static inline uint32_t emu_f32_to_fp8_satfinite(float f, int mbits, int bias, uint32_t max_code, float max_val) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 24) & 0x80u;
  if (std::isnan(f)) return 0x7Fu;
  float a = std::fabs(f);
  if (a >= max_val) return sign | max_code;
  int e2;
  std::frexp(a, &e2);  // a = fr * 2**e2, fr in [0.5, 1)
  int e = e2 - 1;      // a in [2**e, 2**(e+1))
  int emin = 1 - bias;
  if (a == 0.0f || e < emin) e = emin;  // subnormal range: the quantum of the smallest normal binade
  float quantum = std::ldexp(1.0f, e - mbits);
  uint32_t q = (uint32_t)std::nearbyint(a / quantum);  // exact division (power of two); default mode is RNE
  uint32_t code;
  if (q < (1u << mbits)) {
    code = q;  // subnormal (e == emin, no implicit bit)
  } else {
    code = ((uint32_t)(e + bias) << mbits) + (q - (1u << mbits));  // q == 2**(mbits+1) carries into the exponent
  }
  if (code > max_code) code = max_code;
  return sign | code;
}

static inline void tvm_builtin_ptx_cvt_f8x2_f32_rn_satfinite_e4m3x2_f32(uint16_t& d, float a, float b) {
  d = (uint16_t)((emu_f32_to_fp8_satfinite(a, 3, 7, 0x7Eu, 448.0f) << 8) |
                 emu_f32_to_fp8_satfinite(b, 3, 7, 0x7Eu, 448.0f));
}
static inline void tvm_builtin_ptx_cvt_f8x2_f32_rn_satfinite_e5m2x2_f32(uint16_t& d, float a, float b) {
  d = (uint16_t)((emu_f32_to_fp8_satfinite(a, 2, 15, 0x7Bu, 57344.0f) << 8) |
                 emu_f32_to_fp8_satfinite(b, 2, 15, 0x7Bu, 57344.0f));
}

// 8-byte stores (an NVFP4 block's 16 codes), as T.ptx.st.global_.v2.b32.
static inline void tvm_builtin_ptx_st_vec_global_v2_b32(void* p, uint32_t a, uint32_t b) {
  if ((uintptr_t)p % 8) __builtin_trap();  // a misaligned vector store faults on the GPU
  uint32_t w[2] = {a, b};
  memcpy(p, w, 8);
}
