// SPDX-License-Identifier: Apache-2.0
// CPU stand-ins for what the host half of a TIRx module calls (the tvm-ffi C ABI, the CUDA runtime launch, the
// driver's tensor-map encode), so tirx_kernels.core.emulate runs a built module's own host function: its argument
// checks, its tensor-map encodes and its launch arithmetic (grid, cluster, dynamic shared memory) are the real ones;
// cudaLaunchKernelEx runs the kernel through hopper_cpu.h's emu_launch.
#pragma once

// --- tvm-ffi / DLPack (only the fields the generated host code touches)
struct DLDevice { int32_t device_type, device_id; };
struct DLDataType { uint8_t code, bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct TVMFFIAny {
  int32_t type_index;
  union { uint32_t zero_padding; uint32_t small_str_len; };
  union { int64_t v_int64; double v_float64; void* v_ptr; const char* v_c_str; };
};
enum { kDLCPU = 1, kDLCUDA = 2 };
#define TVM_FFI_DLL_EXPORT
#define TVM_DLL
#define TVM_FFI_SAFE_CALL_BEGIN() try {
#define TVM_FFI_SAFE_CALL_END() } catch (...) { fprintf(stderr, "EMU host: exception\n"); return -1; } return 0
static void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int n) {
  fprintf(stderr, "EMU host error %s: ", kind);
  for (int i = 0; i < n; ++i) fputs(parts[i], stderr);
  fputc('\n', stderr);
}
static void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* msg) {
  fprintf(stderr, "EMU host error %s: %s\n", kind, msg);
}
struct EmuCheckFail {  // TVM_FFI_CHECK(cond, Kind) << "message": a failed check ends the call with its message
  const char* kind;
  template <class T> EmuCheckFail& operator<<(const T&) { return *this; }
  EmuCheckFail& operator<<(const char* s) { fprintf(stderr, "%s", s); return *this; }
  ~EmuCheckFail() noexcept(false) { fprintf(stderr, " (EMU host error %s)\n", kind); throw 1; }
};
#define TVM_FFI_CHECK(cond, kind) if (cond) {} else EmuCheckFail{#kind}
namespace tvm { namespace ffi { struct CUDADeviceGuard { explicit CUDADeviceGuard(int64_t) {} }; } }
typedef void* cudaStream_t;
static void* TVMFFIEnvGetStream(int32_t, int32_t) { return nullptr; }

// --- CUDA runtime
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorCudartUnloading = 4 };
struct dim3 { unsigned x = 1, y = 1, z = 1; dim3(size_t a = 1, size_t b = 1, size_t c = 1) : x(a), y(b), z(c) {} };
enum cudaLaunchAttributeID { cudaLaunchAttributeClusterDimension = 4,
                             cudaLaunchAttributeProgrammaticStreamSerialization = 5 };
union cudaLaunchAttributeValue {
  struct { unsigned x, y, z; } clusterDim;
  int programmaticStreamSerializationAllowed;
  char pad[64];
};
struct cudaLaunchAttribute { cudaLaunchAttributeID id; cudaLaunchAttributeValue val; };
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
                         cudaFuncAttributeNonPortableClusterSizeAllowed = 16 };
static const char* cudaGetErrorString(cudaError_t e) { return e ? "invalid argument" : "no error"; }
static cudaError_t cudaGetLastError() { return cudaSuccess; }
static cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }

struct EmuKernelInfo { const void* fn; size_t static_smem, dyn_offset; int max_dyn_smem; };
static EmuKernelInfo emu_kernels[64];
static int emu_nkernels;
static EmuKernelInfo& emu_kernel_info(const void* fn) {
  for (int i = 0; i < emu_nkernels; ++i) if (emu_kernels[i].fn == fn) return emu_kernels[i];
  emu_fault("launch of a kernel the emulator did not register");
}
template <class F>
static cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value > 232448 - (int)emu_kernel_info((const void*)fn).static_smem) return cudaErrorInvalidValue;
    emu_kernel_info((const void*)fn).max_dyn_smem = value;
  }
  return cudaSuccess;
}

template <class... P, class... A>
static cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* cfg, void (*kernel)(P...), A... args) {
  EmuKernelInfo& info = emu_kernel_info((const void*)kernel);
  EmuLaunch L{{cfg->gridDim.x, cfg->gridDim.y, cfg->gridDim.z}, {cfg->blockDim.x, cfg->blockDim.y, cfg->blockDim.z},
              {1, 1, 1}, cfg->dynamicSmemBytes, info.static_smem, info.dyn_offset};
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == cudaLaunchAttributeClusterDimension) {
      L.cluster[0] = cfg->attrs[i].val.clusterDim.x;
      L.cluster[1] = cfg->attrs[i].val.clusterDim.y;
      L.cluster[2] = cfg->attrs[i].val.clusterDim.z;
    }
  unsigned nthreads = L.block[0] * L.block[1] * L.block[2], csize = L.cluster[0] * L.cluster[1] * L.cluster[2];
  // what the GPU rejects with "invalid argument"
  if (nthreads < 1 || nthreads > 1024 || (int)cfg->dynamicSmemBytes > info.max_dyn_smem || csize < 1 ||
      csize > 16 || L.grid[0] * L.grid[1] * L.grid[2] == 0) {
    fprintf(stderr, "EMU launch rejected: %u threads, %zu B dynamic shared memory (limit %d), cluster of %u\n",
            nthreads, cfg->dynamicSmemBytes, info.max_dyn_smem, csize);
    return cudaErrorInvalidValue;
  }
  return emu_launch(L, [&] { kernel(args...); });
}

// --- the driver's tensor-map encode (tiled), with the driver's argument rules
typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;
enum CUtensorMapDataType {
  CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, CU_TENSOR_MAP_DATA_TYPE_UINT16, CU_TENSOR_MAP_DATA_TYPE_UINT32,
  CU_TENSOR_MAP_DATA_TYPE_INT32, CU_TENSOR_MAP_DATA_TYPE_UINT64, CU_TENSOR_MAP_DATA_TYPE_INT64,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ
};
typedef int CUtensorMapInterleave;
typedef int CUtensorMapSwizzle;
typedef int CUtensorMapL2promotion;
typedef int CUtensorMapFloatOOBfill;
static CUresult cuGetErrorString(CUresult, const char** s) { *s = "CUDA_ERROR_INVALID_VALUE (emulated encode)"; return 0; }

static CUresult emu_encode_fail(const char* why) {
  fprintf(stderr, "EMU cuTensorMapEncodeTiled: %s\n", why);
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* gaddr,
                                       const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                       const cuuint32_t* estr, CUtensorMapInterleave interleave,
                                       CUtensorMapSwizzle swizzle, CUtensorMapL2promotion,
                                       CUtensorMapFloatOOBfill oob) {
  static const int esize[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  static const int spans[] = {16, 32, 64, 128};
  if ((int)dtype < 0 || (int)dtype > 12) return emu_encode_fail("data type");
  if (rank < 1 || rank > 5) return emu_encode_fail("rank outside 1..5");
  if ((uintptr_t)gaddr % 16) return emu_encode_fail("global address not 16-byte aligned");
  if (interleave != 0) return emu_encode_fail("interleaved layouts are not emulated");
  if (swizzle < 0 || swizzle > 3) return emu_encode_fail("swizzle mode");
  EmuTmap m{};
  m.magic = EMU_TMAP_MAGIC;
  m.rank = (uint8_t)rank;
  m.esize = (uint8_t)esize[dtype];
  m.dtype = (uint8_t)dtype;
  m.swizzle_span = (uint8_t)spans[swizzle];
  m.oob_nan = oob != 0;
  m.is_float = dtype >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  m.base = static_cast<char*>(gaddr);
  m.strides[0] = m.esize;
  for (cuuint32_t d = 0; d < rank; ++d) {
    if (dims[d] < 1 || dims[d] > (1ull << 32)) return emu_encode_fail("dimension outside 1..2^32");
    if (box[d] < 1 || box[d] > 256) return emu_encode_fail("box extent outside 1..256");
    if (estr[d] != 1) return emu_encode_fail("element strides other than 1 are not emulated");
    m.dims[d] = dims[d];
    m.box[d] = (uint16_t)box[d];
    m.estr[d] = 1;
    if (d > 0) {
      if (strides[d - 1] % 16 || strides[d - 1] >= (1ull << 40)) return emu_encode_fail("stride not a multiple "
                                                                                        "of 16 below 2^40");
      m.strides[d] = strides[d - 1];
    }
  }
  if (box[0] * m.esize % 16) return emu_encode_fail("inner box extent not a multiple of 16 bytes");
  if (swizzle && box[0] * m.esize > (cuuint32_t)spans[swizzle])
    return emu_encode_fail("inner box extent larger than the swizzle span");
  memset(map, 0, sizeof(CUtensorMap));
  memcpy(map, &m, sizeof m);
  return CUDA_SUCCESS;
}
