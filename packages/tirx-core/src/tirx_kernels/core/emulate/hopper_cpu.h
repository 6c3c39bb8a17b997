// SPDX-License-Identifier: Apache-2.0
// CPU stand-ins for the Hopper (sm_90a) machinery of TIRx kernels, for tirx_kernels.core.emulate's module path
// (compiled after cuda_cpu.h): shared memory per CTA, the CTAs of a cluster at once, mbarriers with a phase /
// pending-arrival / tx-count model, named and cluster barriers, TMA tiled loads and stores through tensor maps the
// emulated host code encodes, and wgmma (SS and RS; bf16 / f16 / tf32 / e4m3 / e5m2 into f32) read from shared
// memory through decoded matrix descriptors. Semantics follow the PTX ISA; what is not modelled is listed in the
// Python module's docstring.
//
// Timing model: a TMA load or store runs whole at issue (then completes its bytes on the mbarrier); a wgmma is
// recorded at issue and computed when a wgmma.wait_group retires its group, from the shared memory of that moment,
// so a kernel that releases a stage or reads its accumulators before the wait sees wrong values here as it may on
// the GPU. A blocking wait that sees no progress anywhere for emu_hang_s seconds ends the run as a reported hang.
#pragma once
#include <cstdarg>
#include <climits>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#define __grid_constant__
#define __align__(n) alignas(n)
#define EMU_SMEM_BASE 0x400u     // the first byte of a CTA's shared window (the GPU reserves the first 1 KB)
#define EMU_EXIT_HANG 86
#define EMU_EXIT_FAULT 88

struct CUtensorMap_st { alignas(64) unsigned char opaque[128]; };
typedef CUtensorMap_st CUtensorMap;

// ---------------------------------------------------------------------------------------------------------
// Faults, progress and hangs
// ---------------------------------------------------------------------------------------------------------
static std::atomic<uint64_t> emu_progress{0};  // bumped by every arrival, completion and barrier release
static std::atomic<bool> emu_hung{false};
static std::atomic<int> emu_waiting{0}, emu_hang_reported{0};  // threads in emu_block; of them, reported
static double emu_hang_s = 30.0;

[[noreturn]] static void emu_fault(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] static void emu_fault(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "EMU fault (block %u,%u,%u thread %u,%u,%u): %s\n", blockIdx.x, blockIdx.y, blockIdx.z,
          threadIdx.x, threadIdx.y, threadIdx.z, msg);
  fflush(stderr);
  _exit(EMU_EXIT_FAULT);
}

static void emu_futex_wait(std::atomic<uint32_t>* w, uint32_t v, long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT_PRIVATE, v, &ts, nullptr, 0);
}
static void emu_futex_wake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Block until done() (re-checked whenever *word changes); describe() prints what the thread waits for. No progress
// anywhere for emu_hang_s: every waiter prints its line and the process exits with EMU_EXIT_HANG.
template <class Done, class Describe>
static void emu_block(std::atomic<uint32_t>* word, Done done, Describe describe) {
  using clk = std::chrono::steady_clock;
  uint64_t seen = emu_progress.load();
  auto since = clk::now();
  struct Count {
    Count() { emu_waiting.fetch_add(1); }
    ~Count() { emu_waiting.fetch_sub(1); }
  } count;
  for (;;) {
    uint32_t v = word->load();
    if (done()) return;
    if (emu_hung.load()) {
      describe();
      emu_hang_reported.fetch_add(1);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    emu_futex_wait(word, v, 20);
    uint64_t p = emu_progress.load();
    if (p != seen) {
      seen = p;
      since = clk::now();
    } else if (std::chrono::duration<double>(clk::now() - since).count() > emu_hang_s) {
      bool first = !emu_hung.exchange(true);
      describe();
      emu_hang_reported.fetch_add(1);
      if (first) {
        for (int i = 0; i < 500 && emu_hang_reported.load() < emu_waiting.load(); ++i)  // the others' lines
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        fprintf(stderr, "EMU hang: no thread made progress for %.1f s\n", emu_hang_s);
        fflush(stderr);
        _exit(EMU_EXIT_HANG);
      }
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// CTAs, clusters, shared memory
// ---------------------------------------------------------------------------------------------------------
struct EmuBarrier {  // a counting barrier: named barriers, __syncthreads, barrier.cluster
  std::mutex mu;
  int arrived = 0;
  std::atomic<uint32_t> gen{0};
};

struct EmuCluster;
struct EmuCta {
  char* smem = nullptr;  // shared address EMU_SMEM_BASE
  size_t smem_bytes = 0;
  unsigned rank = 0;  // %cluster_ctarank
  int nthreads = 0;
  int live = 0;  // threads not yet exited (under bars[0].mu)
  EmuCluster* cluster = nullptr;
  EmuBarrier bars[16];
  std::unique_ptr<struct EmuWgState> wg[8];  // wgmma collectives of each whole warpgroup
};
struct EmuCluster {
  int size = 1;
  EmuCta* ctas[16] = {};
  int live = 0;  // under bar.mu
  EmuBarrier bar;
};
static thread_local EmuCta* emu_cta;
static thread_local uint32_t emu_cluster_gen;  // generation seen at barrier.cluster.arrive

static inline int emu_nthreads() { return (int)(blockDim.x * blockDim.y * blockDim.z); }

// A shared::cta address is EMU_SMEM_BASE + offset; a shared::cluster one from mapa carries (rank + 1) << 24.
static inline uint32_t emu_cluster_tag(unsigned rank) { return (rank + 1u) << 24; }

static char* emu_smem_at(uint32_t addr, size_t n, const char* what) {
  EmuCta* cta = emu_cta;
  if (addr >> 24) {
    unsigned rank = (addr >> 24) - 1;
    if (rank >= (unsigned)cta->cluster->size)
      emu_fault("%s: shared::cluster address 0x%x names CTA rank %u of a %d-CTA cluster", what, addr, rank,
                cta->cluster->size);
    cta = cta->cluster->ctas[rank];
    addr &= 0xffffffu;
  }
  if (addr < EMU_SMEM_BASE || addr - EMU_SMEM_BASE + n > cta->smem_bytes)
    emu_fault("%s: shared address 0x%x (+%zu bytes) outside the CTA's 0x%x..0x%zx", what, addr, n, EMU_SMEM_BASE,
              EMU_SMEM_BASE + cta->smem_bytes);
  return cta->smem + (addr - EMU_SMEM_BASE);
}

static inline unsigned int __cvta_generic_to_shared(const void* p) {
  const char* c = static_cast<const char*>(p);
  if (c < emu_cta->smem || c > emu_cta->smem + emu_cta->smem_bytes)
    emu_fault("cvta.to.shared of %p, not in this CTA's shared memory", p);
  return EMU_SMEM_BASE + (unsigned)(c - emu_cta->smem);
}
static inline unsigned int tvm_builtin_cuda_cvta_generic_to_shared(void* p) { return __cvta_generic_to_shared(p); }
static inline unsigned int tvm_builtin_cluster_ctaid_x() { return emu_cta->rank; }

// --- counting barriers. expected < 0: every thread not yet exited (of the CTA, or of the cluster).
static void emu_bar_release(EmuBarrier& b) {
  b.arrived = 0;
  b.gen.fetch_add(1);
  emu_progress.fetch_add(1);
  emu_futex_wake(&b.gen);
}
static void emu_bar_arrive(EmuBarrier& b, int expected, const int* live, bool wait, const char* what, int id) {
  std::unique_lock<std::mutex> lk(b.mu);
  int need = expected < 0 ? *live : expected;
  uint32_t g = b.gen.load();
  if (++b.arrived >= need) {
    emu_bar_release(b);
    return;
  }
  emu_progress.fetch_add(1);
  lk.unlock();
  if (wait)
    emu_block(&b.gen, [&] { return b.gen.load() != g; }, [&] {
      fprintf(stderr, "EMU hang: block %u thread %u waits at %s %d (%d of %d arrived)\n", blockIdx.x, threadIdx.x,
              what, id, b.arrived, expected < 0 ? *live : expected);
    });
}
static void emu_bar_sync_named(uint32_t id, int count, bool wait) {
  if (id >= 16) emu_fault("bar %u: named barriers are 0..15", id);
  if (count % 32) emu_fault("bar %u: thread count %d is not a multiple of 32", id, count);
  emu_bar_arrive(emu_cta->bars[id], count, nullptr, wait, "named barrier", (int)id);
}
static void emu_syncthreads() { emu_bar_arrive(emu_cta->bars[0], -1, &emu_cta->live, true, "__syncthreads", 0); }
static inline void tvm_builtin_ptx_bar_sync_count_sync(uint32_t id, uint32_t count) {
  emu_bar_sync_named(id, (int)count, true);
}
static inline void tvm_builtin_ptx_bar_arrive_arrive(uint32_t id, uint32_t count) {
  emu_bar_sync_named(id, (int)count, false);
}
static inline void tvm_builtin_cuda_warpgroup_sync(int id) { emu_bar_sync_named((uint32_t)id, 128, true); }

static void emu_cluster_arrive() {
  EmuCluster* c = emu_cta->cluster;
  emu_cluster_gen = c->bar.gen.load();
  emu_bar_arrive(c->bar, -1, &c->live, false, "barrier.cluster", 0);
}
static void emu_cluster_wait() {
  EmuCluster* c = emu_cta->cluster;
  uint32_t g = emu_cluster_gen;
  emu_block(&c->bar.gen, [&] { return c->bar.gen.load() != g; }, [&] {
    fprintf(stderr, "EMU hang: block %u thread %u waits at barrier.cluster (%d of %d arrived)\n", blockIdx.x,
            threadIdx.x, c->bar.arrived, c->live);
  });
}
static inline void tvm_builtin_cuda_cluster_sync() { emu_cluster_arrive(); emu_cluster_wait(); }
static inline void tvm_builtin_ptx_barrier_cluster_arrive_cluster_arrive() { emu_cluster_arrive(); }
static inline void tvm_builtin_ptx_barrier_cluster_arrive_cluster_arrive_relaxed() { emu_cluster_arrive(); }
static inline void tvm_builtin_ptx_barrier_cluster_wait_cluster_wait() { emu_cluster_wait(); }

// A returning thread leaves every barrier that counts live threads (CUDA's exited threads hold none).
static void emu_thread_exit() {
  EmuCta* cta = emu_cta;
  {
    std::lock_guard<std::mutex> lk(cta->bars[0].mu);
    --cta->live;
    if (cta->bars[0].arrived && cta->bars[0].arrived >= cta->live) emu_bar_release(cta->bars[0]);
  }
  {
    EmuCluster* c = cta->cluster;
    std::lock_guard<std::mutex> lk(c->bar.mu);
    --c->live;
    if (c->bar.arrived && c->bar.arrived >= c->live) emu_bar_release(c->bar);
  }
  emu_progress.fetch_add(1);
}

// ---------------------------------------------------------------------------------------------------------
// mbarrier: the 8 bytes in shared memory hold a tag and an index into this table (state kept beside them)
// ---------------------------------------------------------------------------------------------------------
struct EmuMbar {
  std::mutex mu;
  std::atomic<uint32_t> phase{0};  // completed phases; the current phase's parity is phase & 1
  int expected = 0, pending = 0;
  int64_t tx = 0;
  uint32_t addr = 0;
};
#define EMU_MBAR_TAG 0x4d424152u  // "MBAR"
static EmuMbar emu_mbars[1 << 16];
static std::atomic<uint32_t> emu_mbar_next{0};

static EmuMbar& emu_mbar(uint32_t addr, const char* what) {
  char* p = emu_smem_at(addr, 8, what);
  if (addr % 8) emu_fault("%s: mbarrier address 0x%x is not 8-byte aligned", what, addr);
  uint64_t w;
  memcpy(&w, p, 8);
  if ((w >> 32) != EMU_MBAR_TAG || (w & 0xffffffffu) >= emu_mbar_next.load())
    emu_fault("%s: no initialised mbarrier at shared address 0x%x", what, addr);
  return emu_mbars[w & 0xffffffffu];
}
static void emu_mbar_init(uint32_t addr, uint32_t count) {
  char* p = emu_smem_at(addr, 8, "mbarrier.init");
  if (addr % 8) emu_fault("mbarrier.init: address 0x%x is not 8-byte aligned", addr);
  if (count < 1 || count > (1u << 20) - 1) emu_fault("mbarrier.init: count %u outside 1..2^20-1", count);
  uint32_t i = emu_mbar_next.fetch_add(1);
  if (i >= (1u << 16)) emu_fault("mbarrier.init: more than 65536 barriers in one launch");
  EmuMbar& b = emu_mbars[i];
  b.expected = b.pending = (int)count;
  b.tx = 0;
  b.addr = addr;
  uint64_t w = ((uint64_t)EMU_MBAR_TAG << 32) | i;
  memcpy(p, &w, 8);
}
static void emu_mbar_try_complete(EmuMbar& b) {  // under b.mu
  if (b.pending == 0 && b.tx == 0) {
    b.pending = b.expected;
    b.phase.fetch_add(1);
    emu_futex_wake(&b.phase);
  }
  emu_progress.fetch_add(1);
}
static void emu_mbar_arrive(uint32_t addr, uint32_t count, int64_t expect_tx, const char* what) {
  EmuMbar& b = emu_mbar(addr, what);
  std::lock_guard<std::mutex> lk(b.mu);
  b.tx += expect_tx;
  b.pending -= (int)count;
  if (b.pending < 0)
    emu_fault("%s: more arrivals than the %d the mbarrier at 0x%x expects in its phase", what, b.expected, addr);
  emu_mbar_try_complete(b);
}
static void emu_mbar_complete_tx(uint32_t addr, int64_t bytes) {
  EmuMbar& b = emu_mbar(addr, "complete_tx");
  std::lock_guard<std::mutex> lk(b.mu);
  b.tx -= bytes;
  emu_mbar_try_complete(b);
}
static bool emu_mbar_test(uint32_t addr, uint32_t parity) {
  return (emu_mbar(addr, "mbarrier.test_wait").phase.load() & 1u) != (parity & 1u);
}
static void emu_mbar_wait(uint32_t addr, uint32_t parity) {
  EmuMbar& b = emu_mbar(addr, "mbarrier.try_wait");
  emu_block(&b.phase, [&] { return (b.phase.load() & 1u) != (parity & 1u); }, [&] {
    fprintf(stderr, "EMU hang: block %u thread %u waits on the mbarrier at shared 0x%x for parity %u (phase %u "
            "in progress: %d of %d arrivals pending, tx-count %ld)\n", blockIdx.x, threadIdx.x, addr, parity & 1u,
            b.phase.load() & 1u, b.pending, b.expected, (long)b.tx);
  });
}

static inline void tvm_builtin_ptx_mbarrier_init_init_shared__cta_b64(uint32_t addr, uint32_t count) {
  emu_mbar_init(addr, count);
}
static inline void tvm_builtin_ptx_mbarrier_arrive_nocount_arrive_shared__cta_b64(uint32_t addr) {
  emu_mbar_arrive(addr, 1, 0, "mbarrier.arrive");
}
static inline void tvm_builtin_ptx_mbarrier_arrive_nocount_arrive_shared__cluster_b64(uint32_t addr) {
  emu_mbar_arrive(addr, 1, 0, "mbarrier.arrive.shared::cluster");
}
static inline void tvm_builtin_ptx_mbarrier_arrive_expect_tx_arrive_expect_tx_shared__cta_b64(uint32_t addr,
                                                                                               uint32_t tx) {
  emu_mbar_arrive(addr, 1, tx, "mbarrier.arrive.expect_tx");
}
static inline void tvm_builtin_cuda_mbarrier_wait(void* bar, int parity) {
  emu_mbar_wait(__cvta_generic_to_shared(bar), (uint32_t)parity);
}
static inline void tvm_builtin_ptx_mapa_u32_shared__cluster_u32(uint32_t& d, uint32_t a, uint32_t rank) {
  d = emu_cluster_tag(rank) | (a & 0xffffffu);
}

// ld.shared::cluster of 16 bytes (a shared::cta address reads this CTA, a mapa one the peer's)
static inline void tvm_builtin_ptx_ld_vec_shared__cluster_v4_f32(float& a, float& b, float& c, float& d,
                                                                 uint32_t addr) {
  if (addr % 16) emu_fault("ld.shared::cluster.v4: address 0x%x is not 16-byte aligned", addr);
  float w[4];
  memcpy(w, emu_smem_at(addr, 16, "ld.shared::cluster"), 16);
  a = w[0], b = w[1], c = w[2], d = w[3];
}

// ld / st.shared of 16 bytes
static inline void tvm_builtin_ptx_ld_vec_shared_v4_b32(uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d,
                                                        uint32_t addr) {
  if (addr % 16) emu_fault("ld.shared.v4: address 0x%x is not 16-byte aligned", addr);
  uint32_t w[4];
  memcpy(w, emu_smem_at(addr, 16, "ld.shared.v4"), 16);
  a = w[0], b = w[1], c = w[2], d = w[3];
}
static inline void tvm_builtin_ptx_st_vec_shared_v4_b32(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                                        uint32_t d) {
  if (addr % 16) emu_fault("st.shared.v4: address 0x%x is not 16-byte aligned", addr);
  uint32_t w[4] = {a, b, c, d};
  memcpy(emu_smem_at(addr, 16, "st.shared.v4"), w, 16);
}

// ldmatrix / stmatrix m8n8 .b16 (warp collectives): lanes 8i..8i+7 give the row addresses of matrix i; lane l
// holds row l/4, columns 2(l%4) and 2(l%4)+1 of each matrix (low half first); .trans swaps rows and columns.
static void emu_ldmatrix(uint32_t** d, int n, bool trans, uint32_t addr) {
  int lane = emu_tid() & 31;
  for (int i = 0; i < n; ++i) {
    if (!trans) {
      uint32_t row = emu_shfl(addr, 8 * i + lane / 4);
      memcpy(d[i], emu_smem_at(row + 4 * (lane % 4), 4, "ldmatrix"), 4);
    } else {
      uint32_t r0 = emu_shfl(addr, 8 * i + 2 * (lane % 4)), r1 = emu_shfl(addr, 8 * i + 2 * (lane % 4) + 1);
      uint16_t lo, hi;
      memcpy(&lo, emu_smem_at(r0 + 2 * (lane / 4), 2, "ldmatrix"), 2);
      memcpy(&hi, emu_smem_at(r1 + 2 * (lane / 4), 2, "ldmatrix"), 2);
      *d[i] = lo | (uint32_t)hi << 16;
    }
  }
  __syncwarp();  // every lane has read before any later store of the warp
}
static void emu_stmatrix(uint32_t addr, const uint32_t* v, int n, bool trans) {
  int lane = emu_tid() & 31;
  for (int i = 0; i < n; ++i) {
    if (!trans) {
      uint32_t row = emu_shfl(addr, 8 * i + lane / 4);
      memcpy(emu_smem_at(row + 4 * (lane % 4), 4, "stmatrix"), &v[i], 4);
    } else {
      uint32_t r0 = emu_shfl(addr, 8 * i + 2 * (lane % 4)), r1 = emu_shfl(addr, 8 * i + 2 * (lane % 4) + 1);
      uint16_t lo = (uint16_t)v[i], hi = (uint16_t)(v[i] >> 16);
      memcpy(emu_smem_at(r0 + 2 * (lane / 4), 2, "stmatrix"), &lo, 2);
      memcpy(emu_smem_at(r1 + 2 * (lane / 4), 2, "stmatrix"), &hi, 2);
    }
  }
  __syncwarp();
}

// elect.sync: the lowest active lane of the full mask -- lane 0 here, where every lane of a warp counts as active
static inline uint32_t tvm_builtin_elect_one_sync() { return (emu_tid() & 31) == 0; }

// --- no-ops on the CPU: fences (every stand-in is sequentially consistent), register reallocation, PDL, hints
static inline void tvm_builtin_ptx_fence_proxy_proxy_async_shared__cta() {}
static inline void tvm_builtin_ptx_fence_proxy_proxy_async() {}
static inline void tvm_builtin_ptx_fence_mbarrier_init_mbarrier_init_release_cluster() {}
static inline void tvm_builtin_ptx_prefetch_tensormap(const void*) {}
static inline void tvm_builtin_ptx_cp_async_bulk_commit_group_async_bulk_commit_group() {}
static inline void tvm_builtin_ptx_cp_async_bulk_wait_group_async_bulk_wait_group_0() {}
static inline void tvm_builtin_ptx_cp_async_bulk_wait_group_async_bulk_wait_group_read_0() {}
static inline void tvm_builtin_ptx_wgmma_fence_fence_sync_aligned() {}

// ---------------------------------------------------------------------------------------------------------
// Swizzle (the same function of the shared address for TMA and wgmma: 16-byte chunk bits 4.. XOR bits 7..)
// ---------------------------------------------------------------------------------------------------------
static inline uint32_t emu_swizzle(uint32_t addr, int span) {  // span 16 (none), 32, 64, 128 bytes
  uint32_t mask = (uint32_t)(span / 16 - 1);
  return addr ^ (((addr >> 7) & mask) << 4);
}

// ---------------------------------------------------------------------------------------------------------
// Tensor maps: cuTensorMapEncodeTiled (host stand-in, host_cpu part of the driver) writes this into the 128 bytes
// ---------------------------------------------------------------------------------------------------------
struct EmuTmap {
  uint32_t magic;
  uint8_t rank, esize, dtype, swizzle_span, interleave, oob_nan, is_float, pad0;
  uint16_t box[5];
  uint8_t estr[5];
  char* base;
  uint64_t dims[5];
  uint64_t strides[5];  // bytes; strides[0] = element size
};
static_assert(sizeof(EmuTmap) <= 128, "EmuTmap must fit a CUtensorMap");
#define EMU_TMAP_MAGIC 0x544d4150u  // "TMAP"

static const EmuTmap& emu_tmap(const void* p) {
  const EmuTmap* m = static_cast<const EmuTmap*>(p);
  if (m->magic != EMU_TMAP_MAGIC) emu_fault("TMA: the tensor-map operand %p is not an encoded tensor map", p);
  return *m;
}

// Walk the box: f(smem byte offset of the element in the unswizzled box image, global pointer or null when OOB).
template <class F>
static void emu_tmap_walk(const EmuTmap& m, const int32_t* c, F f) {
  uint32_t idx[5] = {0, 0, 0, 0, 0};
  uint32_t total = 1;
  for (int d = 0; d < m.rank; ++d) total *= m.box[d];
  for (uint32_t e = 0; e < total; ++e) {
    bool in = true;
    int64_t off = 0;
    for (int d = 0; d < m.rank; ++d) {
      int64_t x = (int64_t)c[d] + idx[d];
      if (x < 0 || x >= (int64_t)m.dims[d]) in = false;
      off += x * (int64_t)m.strides[d];
    }
    f((uint32_t)e * m.esize, in ? m.base + off : nullptr);
    for (int d = 0; d < m.rank && ++idx[d] == m.box[d]; ++d) idx[d] = 0;
  }
}

static void emu_tma_load(uint32_t dst, const void* tmap, const int32_t* coords, int rank, uint32_t mbar,
                         uint32_t mask) {
  const EmuTmap& m = emu_tmap(tmap);
  if (rank != m.rank) emu_fault("TMA load: %dD instruction on a rank-%d tensor map", rank, m.rank);
  if (dst % 128) emu_fault("TMA load: shared destination 0x%x is not 128-byte aligned", dst);
  if (dst >> 24) emu_fault("TMA load: destination 0x%x must be a shared::cta address of this CTA", dst);
  uint32_t bytes = m.esize;
  for (int d = 0; d < m.rank; ++d) bytes *= m.box[d];
  std::vector<char> img(bytes);
  emu_tmap_walk(m, coords, [&](uint32_t o, const char* g) {
    if (g) memcpy(&img[o], g, m.esize);
    else if (m.oob_nan && m.is_float) memset(&img[o], 0xff, m.esize);  // NaN fill (any NaN pattern)
    else memset(&img[o], 0, m.esize);
  });
  unsigned self = emu_cta->rank;
  uint32_t targets = mask ? mask : (1u << self);
  for (unsigned r = 0; r < 16; ++r) {
    if (!(targets >> r & 1u)) continue;
    uint32_t tag = mask ? emu_cluster_tag(r) : 0;
    for (uint32_t o = 0; o < bytes; o += 16) {  // the swizzle permutes 16-byte chunks
      uint32_t a = emu_swizzle(dst + o, m.swizzle_span);
      memcpy(emu_smem_at(tag | a, std::min<uint32_t>(16, bytes - o), "TMA load"), &img[o],
             std::min<uint32_t>(16, bytes - o));
    }
    emu_mbar_complete_tx(tag | (mbar & 0xffffffu), bytes);
  }
}

static void emu_tma_store(const void* tmap, const int32_t* coords, int rank, uint32_t src) {
  const EmuTmap& m = emu_tmap(tmap);
  if (rank != m.rank) emu_fault("TMA store: %dD instruction on a rank-%d tensor map", rank, m.rank);
  if (src % 128) emu_fault("TMA store: shared source 0x%x is not 128-byte aligned", src);
  emu_tmap_walk(m, coords, [&](uint32_t o, char* g) {
    if (!g) return;  // clipped at the tensor's edge
    uint32_t a = emu_swizzle(src + o, m.swizzle_span);
    memcpy(g, emu_smem_at(a, m.esize, "TMA store"), m.esize);
  });
  emu_progress.fetch_add(1);
}

// 1-D bulk copies (cp.async.bulk, no tensor map): 16-byte aligned, sizes a multiple of 16
static void emu_bulk_load(uint32_t dst, const void* src, uint32_t n, uint32_t mbar) {
  if (dst % 16 || (uintptr_t)src % 16 || n % 16)
    emu_fault("cp.async.bulk load: shared 0x%x, global %p, %u bytes: not all 16-byte multiples", dst, src, n);
  memcpy(emu_smem_at(dst, n, "cp.async.bulk load"), src, n);
  emu_mbar_complete_tx(mbar, n);
}
static void emu_bulk_store(void* dst, uint32_t src, uint32_t n) {
  if (src % 16 || (uintptr_t)dst % 16 || n % 16)
    emu_fault("cp.async.bulk store: global %p, shared 0x%x, %u bytes: not all 16-byte multiples", dst, src, n);
  memcpy(dst, emu_smem_at(src, n, "cp.async.bulk store"), n);
  emu_progress.fetch_add(1);
}

// Global atomics between threads and CTAs: red.global.add (scalar, .v2, .v4), ld.acquire / ld.relaxed and
// st.relaxed / st.release of a 32-bit flag, and the bulk reduction cp.reduce.async.bulk .add.f32 (whole at issue).
// std::atomic_ref: sequentially consistent, like every stand-in; a spin on a flag yields the host thread.
template <typename T>
static void emu_red_add(T* p, const T* v, int n, const char* what) {
  if ((uintptr_t)p % (sizeof(T) * n)) emu_fault("%s: address %p is not %zu-byte aligned", what, (void*)p, sizeof(T) * n);
  for (int i = 0; i < n; ++i) std::atomic_ref<T>(p[i]).fetch_add(v[i]);
  emu_progress.fetch_add(1);
}
static uint32_t emu_ld_flag(const void* p) {
  if ((uintptr_t)p % 4) emu_fault("ld.acquire/relaxed.global.b32: address %p is not 4-byte aligned", p);
  std::this_thread::yield();
  return std::atomic_ref<uint32_t>(*(uint32_t*)p).load();
}
static void emu_st_flag(void* p, uint32_t v) {
  if ((uintptr_t)p % 4) emu_fault("st.relaxed/release.global.b32: address %p is not 4-byte aligned", p);
  std::atomic_ref<uint32_t>(*(uint32_t*)p).store(v);
  emu_progress.fetch_add(1);
}
static void emu_bulk_reduce_add_f32(void* dst, uint32_t src, uint32_t n) {
  if (src % 16 || (uintptr_t)dst % 16 || n % 16)
    emu_fault("cp.reduce.async.bulk .add.f32: global %p, shared 0x%x, %u bytes: not all 16-byte multiples", dst, src, n);
  float v[4];
  for (uint32_t i = 0; i < n; i += 16) {
    memcpy(v, emu_smem_at(src + i, 16, "cp.reduce.async.bulk"), 16);
    emu_red_add((float*)((char*)dst + i), v, 4, "cp.reduce.async.bulk");
  }
}

// ---------------------------------------------------------------------------------------------------------
// wgmma: m64nNkK, f32 accumulators, A from a descriptor (SS) or registers (RS), B from a descriptor
// ---------------------------------------------------------------------------------------------------------
enum EmuType : uint8_t { EMU_BF16, EMU_F16, EMU_TF32, EMU_E4M3, EMU_E5M2 };
static inline int emu_type_bytes(int t) { return t == EMU_TF32 ? 4 : (t == EMU_BF16 || t == EMU_F16) ? 2 : 1; }

static double emu_fp8(uint8_t v, bool e5m2) {
  int s = v >> 7, e, m;
  double r;
  if (e5m2) {
    e = (v >> 2) & 31, m = v & 3;
    if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
    r = e ? ldexp(1.0 + m / 4.0, e - 15) : ldexp(m / 4.0, -14);
  } else {  // e4m3fn: no infinities, S.1111.111 is NaN
    e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return NAN;
    r = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
  }
  return s ? -r : r;
}
static double emu_decode(const void* p, int t) {
  switch (t) {
    case EMU_BF16: { uint16_t h; memcpy(&h, p, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4);
                     return f; }
    case EMU_F16: { _Float16 h; memcpy(&h, p, 2); return (double)h; }
    case EMU_TF32: { uint32_t u; memcpy(&u, p, 4); u &= ~0x1fffu; float f; memcpy(&f, &u, 4); return f; }
    case EMU_E4M3: return emu_fp8(*(const uint8_t*)p, false);
    default: return emu_fp8(*(const uint8_t*)p, true);
  }
}

// Shared address of element (mn, k) of the operand a descriptor names; `kbytes` = k * element bytes (< 32).
// Layouts (PTX ISA, wgmma shared-memory matrix layouts; T = 16 bytes, S = swizzle span):
//   K-major, no swizzle: 8x16-byte core matrices; SBO steps 8 MN-rows, LBO steps 16 bytes of K.
//   K-major, S-swizzled: MN-row r at S*(r%8) + SBO*(r/8), K contiguous along the row (LBO unused).
//   MN-major, no swizzle: 16 bytes of MN per K-row, K-rows 16 bytes apart; SBO steps 16 bytes of MN, LBO 8 K-rows.
//   MN-major, S-swizzled: S bytes of MN per K-row, K-rows S apart; LBO steps S bytes of MN, SBO 8 K-rows.
// The swizzle is then applied to the address (so the tile's base must sit on the pattern's 8*S-byte repeat).
static inline uint32_t emu_desc_addr(uint64_t desc, int mn, int k, int esize, bool mn_major) {
  uint32_t start = (uint32_t)(desc & 0x3fff) << 4;
  uint32_t lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4;
  uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
  static const int spans[4] = {16, 128, 64, 32};  // layout_type 0 none, 1 = 128B, 2 = 64B, 3 = 32B
  int span = spans[(desc >> 62) & 3];
  uint32_t kb = (uint32_t)(k * esize), off;
  if (!mn_major) {
    if (span == 16) off = (mn / 8) * sbo + (kb / 16) * lbo + (mn % 8) * 16 + kb % 16;
    else off = (mn / 8) * sbo + (mn % 8) * span + kb;
  } else {
    uint32_t mnb = (uint32_t)(mn * esize);
    if (span == 16) off = (mnb / 16) * sbo + (k / 8) * lbo + (k % 8) * 16 + mnb % 16;
    else off = (mnb / span) * lbo + (k / 8) * sbo + (k % 8) * span + mnb % span;
  }
  return emu_swizzle(start + off, span);
}

// A wgmma is one warpgroup-wide operation: the k-th wgmma.mma_async each thread of a warpgroup issues is one
// collective instruction. Each thread adds its part (accumulator addresses, RS A registers); the first thread whose
// wgmma.wait_group retires it computes the whole warpgroup's result (waiting, if need be, until all 128 threads
// have issued it), as on the GPU, where one warp's wait means the warpgroup's operation is complete -- so a kernel
// may give a stage back from one thread after its wait (mbarrier.Ring.consumer_release_warpgroup).
struct EmuWgPart {
  float* d0 = nullptr;         // accumulators, when contiguous (the usual acc[0 .. n/2))
  std::vector<float*> d;       // else each one
  uint32_t areg[4] = {};
  bool present = false;
};
struct EmuWgOp {
  int n = 0, k = 0, nd = 0, parts = 0, retired = 0;
  uint8_t ta = 0, tb = 0;
  bool rs = false, scale_d = false, tnsp_a = false, tnsp_b = false, done = false;
  int scale_a = 1, scale_b = 1;
  uint64_t adesc = 0, bdesc = 0;
  EmuWgPart part[128];
  float* acc(int t, int i) { return part[t].d0 ? part[t].d0 + i : part[t].d[i]; }
};
struct EmuWgState {  // one per warpgroup of a CTA (EmuCta::wg)
  std::mutex mu;
  std::atomic<uint32_t> changed{0};
  std::deque<std::unique_ptr<EmuWgOp>> ops;  // collective ops from sequence number `base` on
  uint64_t base = 0;
};
static thread_local uint64_t emu_wg_seq;             // this thread's next wgmma's sequence number
static thread_local std::deque<uint64_t> emu_wg_ops;  // issued and not retired, oldest first
static thread_local std::deque<int> emu_wg_groups;    // committed groups' op counts, oldest first
static thread_local int emu_wg_uncommitted;

static EmuWgState& emu_wg_state();

static void emu_wgmma_compute(EmuWgOp& op) {
  int ea = emu_type_bytes(op.ta), eb = emu_type_bytes(op.tb);
  int per_reg = 4 / ea;  // A elements per 32-bit register (RS)
  for (int t = 0; t < 128; ++t) {
    int warp = t >> 5, lane = t & 31;
    double a[2][32];  // this thread's two A rows
    for (int r = 0; r < 2; ++r) {
      int row = warp * 16 + lane / 4 + 8 * r;
      for (int kk = 0; kk < op.k; ++kk) {
        if (op.rs) {
          int half = kk / (op.k / 2), within = kk % (op.k / 2), src = within / per_reg, e = within % per_reg;
          uint32_t reg = op.part[(t & ~3) + src].areg[half * 2 + r];
          a[r][kk] = emu_decode(reinterpret_cast<const char*>(&reg) + e * ea, op.ta);
        } else {
          uint32_t addr = emu_desc_addr(op.adesc, row, kk, ea, op.tnsp_a);
          a[r][kk] = emu_decode(emu_smem_at(addr, ea, "wgmma A"), op.ta);
        }
      }
    }
    for (int i = 0; i < op.nd; ++i) {
      int j = i / 4, r = (i / 2) % 2, e = i % 2;
      int col = 8 * j + 2 * (lane % 4) + e;
      double s = 0;
      for (int kk = 0; kk < op.k; ++kk) {
        uint32_t addr = emu_desc_addr(op.bdesc, col, kk, eb, op.tnsp_b);
        s += a[r][kk] * emu_decode(emu_smem_at(addr, eb, "wgmma B"), op.tb);
      }
      s *= op.scale_a * op.scale_b;
      float* d = op.acc(t, i);
      *d = (float)(op.scale_d ? (double)*d + s : s);
    }
  }
}

static void emu_wgmma_issue(float** d, int nd, int n, int k, int ta, int tb, bool rs, uint64_t adesc,
                            const uint32_t* areg, uint64_t bdesc, uint32_t scale_d, int scale_a, int scale_b,
                            int tnsp_a, int tnsp_b) {
  if (nd != n / 2) emu_fault("wgmma m64n%dk%d: %d accumulators, expected %d", n, k, nd, n / 2);
  EmuWgState& st = emu_wg_state();
  std::lock_guard<std::mutex> lk(st.mu);
  uint64_t seq = emu_wg_seq++;
  if (seq < st.base) emu_fault("wgmma: issued after its warpgroup retired the instruction");
  while (st.ops.size() <= seq - st.base) st.ops.push_back(std::make_unique<EmuWgOp>());
  EmuWgOp& op = *st.ops[seq - st.base];
  if (op.parts == 0) {
    op.n = n, op.k = k, op.nd = nd, op.ta = (uint8_t)ta, op.tb = (uint8_t)tb, op.rs = rs, op.scale_d = scale_d != 0;
    op.tnsp_a = tnsp_a != 0, op.tnsp_b = tnsp_b != 0, op.scale_a = scale_a, op.scale_b = scale_b;
    op.adesc = rs ? 0 : adesc, op.bdesc = bdesc;
  } else if (op.n != n || op.k != k || op.ta != ta || op.tb != tb || op.rs != rs || op.bdesc != bdesc ||
             (!rs && op.adesc != adesc) || op.scale_d != (scale_d != 0)) {
    emu_fault("wgmma #%lu: shape, types, descriptors or scale-d differ across the warpgroup", (unsigned long)seq);
  }
  EmuWgPart& part = op.part[emu_tid() & 127];
  bool contiguous = true;
  for (int i = 0; i < nd; ++i) contiguous = contiguous && d[i] == d[0] + i;
  if (contiguous) part.d0 = d[0];
  else part.d.assign(d, d + nd);
  if (rs) memcpy(part.areg, areg, 16);
  part.present = true;
  ++op.parts;
  emu_wg_ops.push_back(seq);
  ++emu_wg_uncommitted;
  st.changed.fetch_add(1);
  emu_progress.fetch_add(1);
  emu_futex_wake(&st.changed);
}
static inline void tvm_builtin_ptx_wgmma_commit_group_commit_group_sync_aligned() {
  emu_wg_groups.push_back(emu_wg_uncommitted);
  emu_wg_uncommitted = 0;
}
static void emu_wgmma_retire(uint64_t seq) {
  EmuWgState& st = emu_wg_state();
  std::unique_lock<std::mutex> lk(st.mu);
  EmuWgOp* op = st.ops[seq - st.base].get();
  if (!op->done) {
    lk.unlock();
    emu_block(&st.changed, [&] { std::lock_guard<std::mutex> g(st.mu); return op->parts == 128; }, [&] {
      fprintf(stderr, "EMU hang: block %u thread %u waits in wgmma.wait_group for its warpgroup's wgmma #%lu "
              "(%d of 128 threads issued it)\n", blockIdx.x, threadIdx.x, (unsigned long)seq, op->parts);
    });
    lk.lock();
    if (!op->done) {
      emu_wgmma_compute(*op);
      op->done = true;
      emu_progress.fetch_add(1);
    }
  }
  if (++op->retired == 128)
    while (!st.ops.empty() && st.ops.front()->retired == 128) {
      st.ops.pop_front();
      ++st.base;
    }
}
static void emu_wgmma_wait(int pending) {
  while ((int)emu_wg_groups.size() > pending) {
    for (int i = emu_wg_groups.front(); i > 0; --i) {
      emu_wgmma_retire(emu_wg_ops.front());
      emu_wg_ops.pop_front();
    }
    emu_wg_groups.pop_front();
  }
}
static inline void tvm_builtin_ptx_wgmma_wait_group_wait_group_sync_aligned_0() { emu_wgmma_wait(0); }
static inline void tvm_builtin_ptx_wgmma_wait_group_wait_group_sync_aligned_1() { emu_wgmma_wait(1); }

// The descriptor TIRx's T.cuda.wgmma.encode_matrix_descriptor writes (swizzle in CUtensorMapSwizzle numbering).
static inline void ptx_wgmma_encode_matrix_descriptor(uint64_t* desc, void* addr, int ldo, int sdo, int swizzle) {
  static const uint64_t layout[4] = {0, 3, 2, 1};  // none, 32B, 64B, 128B -> the descriptor's layout_type
  uint64_t a = __cvta_generic_to_shared(addr);
  *desc = ((a >> 4) & 0x3fff) | ((uint64_t)(ldo & 0x3fff) << 16) | ((uint64_t)(sdo & 0x3fff) << 32) |
          (layout[swizzle & 3] << 62);
}

static EmuWgState& emu_wg_state() {
  int wg = emu_tid() >> 7;
  if (!emu_cta->wg[wg]) emu_fault("wgmma: warpgroup %d is not a whole warpgroup of this CTA", wg);
  return *emu_cta->wg[wg];
}

// ---------------------------------------------------------------------------------------------------------
// Launch: the CTAs of one cluster at once (one std::thread per CUDA thread), clusters one after another
// ---------------------------------------------------------------------------------------------------------
struct EmuLaunch {
  unsigned grid[3], block[3], cluster[3];
  size_t dyn_smem, static_smem, dyn_offset;
};

template <class Body>
static int emu_launch(const EmuLaunch& L, Body body) {
  int nthreads = (int)(L.block[0] * L.block[1] * L.block[2]), nwarps = (nthreads + 31) / 32;
  int csize = (int)(L.cluster[0] * L.cluster[1] * L.cluster[2]);
  for (int d = 0; d < 3; ++d)
    if (L.grid[d] % L.cluster[d]) emu_fault("launch: grid %u not a multiple of the cluster dim %u", L.grid[d],
                                            L.cluster[d]);
  gridDim = {L.grid[0], L.grid[1], L.grid[2]};
  blockDim = {L.block[0], L.block[1], L.block[2]};
  for (unsigned cz = 0; cz < L.grid[2]; cz += L.cluster[2])
  for (unsigned cy = 0; cy < L.grid[1]; cy += L.cluster[1])
  for (unsigned cx = 0; cx < L.grid[0]; cx += L.cluster[0]) {
    EmuCluster cl;
    cl.size = csize;
    cl.live = csize * nthreads;
    std::vector<std::unique_ptr<EmuCta>> ctas;
    std::vector<std::vector<uint64_t>> slots(csize, std::vector<uint64_t>(nthreads));
    std::vector<std::barrier<>*> warp_bars;
    for (int r = 0; r < csize; ++r) {
      auto cta = std::make_unique<EmuCta>();
      cta->smem_bytes = L.dyn_offset + L.dyn_smem;
      // exact size: AddressSanitizer reports any access past the shared memory the launch asked for
      if (posix_memalign((void**)&cta->smem, 1024, std::max<size_t>(cta->smem_bytes, 1))) abort();
      memset(cta->smem, 0xa5, cta->smem_bytes);  // shared memory starts as garbage, not zeros
      cta->rank = (unsigned)r;
      cta->nthreads = cta->live = nthreads;
      cta->cluster = &cl;
      for (int w = 0; w * 128 + 128 <= nthreads; ++w) cta->wg[w] = std::make_unique<EmuWgState>();
      auto* wb = static_cast<std::barrier<>*>(::operator new[](sizeof(std::barrier<>) * nwarps));
      for (int w = 0; w < nwarps; ++w) new (&wb[w]) std::barrier<>(std::min(32, nthreads - 32 * w));
      warp_bars.push_back(wb);
      cl.ctas[r] = cta.get();
      ctas.push_back(std::move(cta));
    }
    std::vector<std::thread> ts;
    for (int r = 0; r < csize; ++r) {
      unsigned bx = cx + r % L.cluster[0], by = cy + r / L.cluster[0] % L.cluster[1],
               bz = cz + r / (L.cluster[0] * L.cluster[1]);
      for (int t = 0; t < nthreads; ++t)
        ts.emplace_back([&, r, t, bx, by, bz] {
          emu_cta = cl.ctas[r];
          emu_warp_bar = warp_bars[r];
          emu_warp_slots = slots[r].data();
          emu_syncthreads_hook = emu_syncthreads;
          blockIdx = {bx, by, bz};
          threadIdx = {(unsigned)(t % L.block[0]), (unsigned)(t / L.block[0] % L.block[1]),
                       (unsigned)(t / (L.block[0] * L.block[1]))};
          emu_wg_seq = 0;
          emu_wg_ops.clear();
          emu_wg_groups.clear();
          emu_wg_uncommitted = 0;
          body();
          if (!emu_wg_ops.empty())
            emu_fault("the thread returned with %zu wgmma issued and not retired by a wgmma.wait_group",
                      emu_wg_ops.size());
          emu_warp_bar[t >> 5].arrive_and_drop();
          emu_thread_exit();
        });
    }
    for (auto& th : ts) th.join();
    for (int r = 0; r < csize; ++r) {
      for (int w = 0; w < nwarps; ++w) warp_bars[r][w].~barrier();
      ::operator delete[](warp_bars[r]);
      free(ctas[r]->smem);
    }
  }
  return 0;
}
