// SPDX-License-Identifier: Apache-2.0
// Where the GPU puts the CTAs of a persistent-GEMM-sized launch (384 threads, ~200 KB of dynamic smem: one CTA
// per SM), with and without thread-block clusters. Prints, per launch, the SM id of every CTA in order; a launch
// of 16-CTA clusters (the largest, non-portable) shows which SMs share a GPC (a cluster never spans GPCs). First it
// prints how many clusters of each size fit at once (cudaOccupancyMaxActiveClusters).
//   nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o build/probes/cta_placement tools/probes/cta_placement.cu
//   build/probes/cta_placement            (GPU host)
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  std::printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void __launch_bounds__(384, 1) record_smid(int* out, long long spin_ns) {
  extern __shared__ char smem[];
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    out[blockIdx.x] = static_cast<int>(smid);
    smem[0] = 1;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)spin_ns);
  }
}

// A launch of `grid` CTAs of 384 threads and `smem` bytes in clusters of `cluster` (plain for 1); `attr` holds the
// cluster-dimension attribute the config points at.
static cudaLaunchConfig_t launch_config(int grid, int cluster, int smem, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(384);
  cfg.dynamicSmemBytes = smem;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  return cfg;
}

// How many clusters of `cluster` CTAs of this size (one CTA per SM) the GPU holds at once: the persistent GEMM's grid
// must not exceed it (a cluster beyond it waits for a whole resident cluster's tiles). 2026-12-04's placement log
// reads 30 for 4-CTA clusters (SMs 0-119), 66 for 2-CTA ones.
static int max_active_clusters(int cluster, int smem) {
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = launch_config(cluster * 64, cluster, smem, &attr);
  cfg.numAttrs = 1;  // the query wants the cluster dimension even for 1
  int n = -1;
  CHECK(cudaOccupancyMaxActiveClusters(&n, record_smid, &cfg));
  std::printf("max active clusters of %d CTAs (%d B smem each): %d (%d SMs)\n", cluster, smem, n, n * cluster);
  return 0;
}

static int launch(int grid, int cluster, int smem, int* d_out, int* h_out) {
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = launch_config(grid, cluster, smem, &attr);
  CHECK(cudaMemset(d_out, 0xff, grid * sizeof(int)));
  CHECK(cudaLaunchKernelEx(&cfg, record_smid, d_out, 200000LL));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(h_out, d_out, grid * sizeof(int), cudaMemcpyDeviceToHost));
  std::printf("grid %d cluster %d:", grid, cluster);
  for (int i = 0; i < grid; ++i) std::printf(" %d", h_out[i]);
  std::printf("\n");
  return 0;
}

int main() {
  const int smem = 200 * 1024;
  CHECK(cudaFuncSetAttribute(record_smid, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(record_smid, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int cluster : {1, 2, 4, 8, 16})
    if (max_active_clusters(cluster, smem)) return 1;
  int *d_out, h_out[1024];
  CHECK(cudaMalloc(&d_out, sizeof(h_out)));
  for (int rep = 0; rep < 2; ++rep) {
    if (launch(132, 1, smem, d_out, h_out) || launch(128, 1, smem, d_out, h_out) ||
        launch(128, 2, smem, d_out, h_out) || launch(132, 2, smem, d_out, h_out) ||
        launch(128, 4, smem, d_out, h_out) || launch(128, 8, smem, d_out, h_out) ||
        launch(128, 16, smem, d_out, h_out))
      return 1;
  }
  return 0;
}
