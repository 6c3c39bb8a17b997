# SPDX-License-Identifier: Apache-2.0
"""C = A·Bᵀ for bf16/fp16 on Hopper: A (M, K), B (N, K), C (M, N), K contiguous, fp32 accumulation.

Public ops: ``gemm_nt`` (A·Bᵀ) and ``gemm_nn`` (A·B, B (K, N) row-major), both with an optional
``alpha * acc + beta * C + bias[n]`` epilogue and bf16/fp16/fp32 output; those variants run the persistent
kernel (``gemm/_persistent.py``; ``docs/gemm.md`` "Layouts, output dtype, epilogue"). The plain kernel:

Warp-specialized TMA + wgmma kernel (one launch per call, M, N, K dynamic):
- 384 threads: warpgroup 0 is the TMA producer (setmaxnreg 40, one thread issues), warpgroups 1-2 are
  consumers (setmaxnreg 232), each owning 64 rows of the 128x256 CTA tile with a 128-register
  m64n256k16 fp32 accumulator.
- A ``num_stages`` full/empty mbarrier ring of 128x64 A and 256x64 B tiles, 128B-swizzled, in one
  ``T.SMEMPool`` (every shared buffer, barriers included: the pool is 1024-aligned only then).
- Epilogue: fp32 -> bf16/fp16 pairs into a SW128 staging tile, then TMA stores of 64x64 boxes.
- Ragged shapes: TMA zero-fills load boxes past M/N/K (so the K tail adds zeros) and clips store boxes
  past M/N. TMA needs 16-byte global strides; any M, N, K >= 1 works through ``_run``'s odd-shape plan
  (K % 8: A and B zero-padded along K; C rows not 16-byte aligned: the persistent kernel's ``c_store="stg"``
  stores for the plain NT call, else a 16-byte-aligned padded output copied into ``out``; docs/gemm.md
  "Any M, N, K").

The tile (``TILE_TABLE``, or ``tile=``) picks the kernel: ``persistent_*`` (``gemm/_persistent.py``: the
persistent form of the above, grouped raster, optional 2-CTA B multicast), ``pingpong_*`` (``gemm/_pingpong.py``:
each math warpgroup whole tiles, alternately, so one's epilogue overlaps the other's mainloop), ``smallm_*``
(``gemm/_small_m.py``: split-K over a cluster, M <= 128), ``gemv_*`` (``gemm/_gemv.py``: mma.sync fed by 16-byte
loads of B, M <= 16), ``ws_*`` (this module's non-persistent kernel below). ``packages/tirx-native/docs/gemm.md``
tells how each got its place in the table, with the measurements.

Measured: the same design in examples/gemm_ws_pipelined.py ran at 646-688 TFLOP/s at 4096³ on the H200
against cuBLAS 678-773 in the same rounds, bit-identical to torch.
"""

from __future__ import annotations

import math
import os

import torch

from tirx_kernels.core import checks, runtime

KERNEL_META = {
    "name": "fp16_bf16_gemm",
    "category": "gemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "C = A @ B^T (or A @ B), bf16/fp16 in, bf16/fp16/fp32 out, fp32 accumulate, optional "
                   "bias and alpha/beta epilogue; warp-specialized TMA + wgmma",
    "public_ops": ["gemm_nt", "gemm_nn"],
}

CONFIGS = [
    {"label": "bf16_4096x4096x4096", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096},
    {"label": "fp16_4096x4096x4096", "dtype": "float16", "M": 4096, "N": 4096, "K": 4096},
    {"label": "bf16_1024x1024x1024", "dtype": "bfloat16", "M": 1024, "N": 1024, "K": 1024},
    {"label": "fp16_1024x1024x1024", "dtype": "float16", "M": 1024, "N": 1024, "K": 1024},
    {"label": "bf16_1000x1032x1048", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048},
    {"label": "fp16_1000x1032x1048", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048},
    {"label": "bf16_1x4096x4096", "dtype": "bfloat16", "M": 1, "N": 4096, "K": 4096},
    {"label": "bf16_129x264x72", "dtype": "bfloat16", "M": 129, "N": 264, "K": 72},
    {"label": "fp16_129x264x72", "dtype": "float16", "M": 129, "N": 264, "K": 72},
    {"label": "bf16_300x520x24", "dtype": "bfloat16", "M": 300, "N": 520, "K": 24},
    {"label": "bf16_8192x8192x8192", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192},
    # The persistent kernel (gemm/_persistent.py), pinned until the H200 run confirms it.
    {"label": "bf16_4096x4096x4096_persistent", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_1000x1032x1048_persistent", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "fp16_129x264x72_persistent", "dtype": "float16", "M": 129, "N": 264, "K": 72,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_8192x8192x8192_persistent", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_300x520x24_persistent_c2", "dtype": "bfloat16", "M": 300, "N": 520, "K": 24,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_4096x4096x4096_persistent_c2", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_8192x8192x8192_persistent_c2", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_4096x4096x4096_persistent_128x128", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x128x64_s6_g8"},
    {"label": "fp16_1000x1032x1048_persistent_128x128", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048,
     "tile": "persistent_128x128x64_s6_g8"},
    # Layout / output dtype / epilogue variants (persistent kernel only). NN: B is (K, N). alpha/beta rows
    # read C_in (random, copied into the output by `launch`); bias is random.
    {"label": "bf16_4096x4096x4096_nn", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096, "layout": "nn",
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "fp16_1000x1032x1048_nn", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048, "layout": "nn",
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_129x264x72_out_fp32", "dtype": "bfloat16", "M": 129, "N": 264, "K": 72, "out_dtype": "float32",
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_1000x1032x1048_bias", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048, "epilogue": "bias",
     "bias_dtype": "bfloat16", "tile": "persistent_128x256x64_s3_g8"},
    {"label": "fp16_300x520x24_alpha_beta_bias", "dtype": "float16", "M": 300, "N": 520, "K": 24,
     "epilogue": "alpha_beta_bias", "bias_dtype": "float32", "alpha": 0.5, "beta": -1.5,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_1024x1024x1024_nn_alpha_beta", "dtype": "bfloat16", "M": 1024, "N": 1024, "K": 1024,
     "layout": "nn", "epilogue": "alpha_beta", "alpha": 1.5, "beta": 0.75, "tile": "persistent_128x256x64_s3_g8"},
    # The NN B multicast (2-CTA cluster) and the fp32 two-pass epilogue on the 128x128 tile.
    {"label": "bf16_300x520x24_nn_c2", "dtype": "bfloat16", "M": 300, "N": 520, "K": 24, "layout": "nn",
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "fp16_1000x1032x1048_nn_out_fp32_128x128", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048,
     "layout": "nn", "out_dtype": "float32", "tile": "persistent_128x128x64_s6_g8"},
    # The sweep's candidate tiles (not in TILE_TABLE yet), on ragged shapes: M = 300 is 3 M-tiles (odd: the
    # c2 tiles' last cluster has a CTA past M), N = 520 ends 8 columns into an N-tile (for 128x256 e128: the
    # last tile's second epilogue round lies wholly past N), K = 136 is 3 K-tiles (the rings wrap across tiles).
    {"label": "bf16_300x520x136_persistent_s4_e128", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x256x64_s4_e128_g8"},
    {"label": "fp16_300x520x136_persistent_s4_e128_c2", "dtype": "float16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x256x64_s4_e128_c2_g8"},
    {"label": "bf16_300x520x136_persistent_128x192", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x192x64_s4_g8"},
    {"label": "bf16_1000x1032x1048_persistent_128x64", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048,
     "tile": "persistent_128x64x64_s8_g8"},
    {"label": "bf16_300x520x136_persistent_128x128_c2", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x128x64_s6_c2_g8"},
    # One ring release per consumer warpgroup ("_wg") and 1 x 2 clusters ("_c2n", A multicast). N = 520 is 5
    # N-tiles of 128: odd, so the last 1 x 2 cluster has a CTA past N (zero-filled B, no stores); 2000 x 1544 x
    # 1048: 16 x 13 tiles of 128 = 16 x 7 clusters on 66 (1-2 each, 17 K-tiles).
    {"label": "bf16_300x520x136_persistent_128x128_c2n_wg", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x128x64_s6_c2n_g8_wg"},
    {"label": "bf16_2000x1544x1048_persistent_128x128_c2n_wg", "dtype": "bfloat16", "M": 2000, "N": 1544,
     "K": 1048, "tile": "persistent_128x128x64_s6_c2n_g8_wg"},
    # The lean consumer loop (descriptors advanced from stage 0's, a running ring cursor): many tiles per CTA with
    # K-tile counts that are not multiples of the stage count (17 of 6, 4 of 4, 17 of 8), so the cursor wraps
    # mid-tile and across tiles; NN (the MN-major B descriptor advanced) with an epilogue; fp32 out.
    {"label": "bf16_2000x1544x1048_persistent_128x128_cursor", "dtype": "bfloat16", "M": 2000, "N": 1544, "K": 1048,
     "tile": "persistent_128x128x64_s6_g8"},
    {"label": "fp16_4000x4104x200_persistent_s4_e128_cursor", "dtype": "float16", "M": 4000, "N": 4104, "K": 200,
     "tile": "persistent_128x256x64_s4_e128_g8"},
    {"label": "bf16_2900x4104x1048_persistent_s4_e128_c2_cursor", "dtype": "bfloat16", "M": 2900, "N": 4104,
     "K": 1048, "tile": "persistent_128x256x64_s4_e128_c2_g8"},
    {"label": "bf16_2000x3136x200_persistent_128x224_cursor", "dtype": "bfloat16", "M": 2000, "N": 3136, "K": 200,
     "tile": "persistent_128x224x64_s4_g8"},
    {"label": "bf16_1000x1032x1048_nn_bias_128x64_cursor", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048,
     "layout": "nn", "epilogue": "bias", "bias_dtype": "bfloat16", "tile": "persistent_128x64x64_s8_g8"},
    {"label": "fp16_2000x1544x136_out_fp32_128x192_cursor", "dtype": "float16", "M": 2000, "N": 1544, "K": 136,
     "out_dtype": "float32", "tile": "persistent_128x192x64_s4_g8"},
    {"label": "bf16_2000x1544x1048_pingpong_128x128_cursor", "dtype": "bfloat16", "M": 2000, "N": 1544, "K": 1048,
     "tile": "pingpong_128x128x64_s6_e64_g8"},
    {"label": "fp16_4000x4104x200_pingpong_128x192_cursor", "dtype": "float16", "M": 4000, "N": 4104, "K": 200,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "bf16_300x520x136_nn_alpha_beta_bias_c2n_wg", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "layout": "nn", "epilogue": "alpha_beta_bias", "bias_dtype": "float32", "alpha": 0.5, "beta": -1.5,
     "tile": "persistent_128x128x64_s6_c2n_g8_wg"},
    # 224-column tiles (the last 32 columns stored from registers). N = 200: the one tile's register-stored
    # columns 192..223 reach past N (8 in, 24 out); N = 1112: the 5th N-tile stores 3 boxes, its tail 24 in;
    # 2000 x 3136: 16 x 14 = 224 tiles on 132 CTAs (the ring wraps across tiles); 512 x 7168 x 2048 the shape
    # the tile is for.
    {"label": "bf16_300x200x136_persistent_128x224", "dtype": "bfloat16", "M": 300, "N": 200, "K": 136,
     "tile": "persistent_128x224x64_s4_g8"},
    {"label": "fp16_1000x1112x1048_persistent_128x224", "dtype": "float16", "M": 1000, "N": 1112, "K": 1048,
     "tile": "persistent_128x224x64_s4_g8"},
    {"label": "bf16_2000x3136x200_persistent_128x224", "dtype": "bfloat16", "M": 2000, "N": 3136, "K": 200,
     "tile": "persistent_128x224x64_s4_g8"},
    {"label": "bf16_512x7168x2048_persistent_128x224", "dtype": "bfloat16", "M": 512, "N": 7168, "K": 2048,
     "tile": "persistent_128x224x64_s4_g8"},
    # 176-column tiles (the last 48 columns from registers), cooperative in 2x1 clusters and ping-pong: N = 520 ends
    # 40 columns into the 3rd N-tile's register columns (tail 480..527: 40 in, 8 out); M = 300 is 3 M-tiles (odd: the
    # c2 tile's last cluster has a CTA past M); 2000 x 1544: the last N-tile's tail has 8 columns in; 2048 x 7168 x
    # 2048 the shape the tile is for (656 tiles on 132 CTAs).
    {"label": "fp16_300x520x136_persistent_128x176_c2", "dtype": "float16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x176x64_s5_c2_g8"},
    {"label": "bf16_2048x7168x2048_persistent_128x176_c2", "dtype": "bfloat16", "M": 2048, "N": 7168, "K": 2048,
     "tile": "persistent_128x176x64_s5_c2_g8"},
    {"label": "bf16_2000x1544x1048_pingpong_128x176", "dtype": "bfloat16", "M": 2000, "N": 1544, "K": 1048,
     "tile": "pingpong_128x176x64_s5_e64_g8"},
    {"label": "fp16_300x520x136_pingpong_128x176", "dtype": "float16", "M": 300, "N": 520, "K": 136,
     "tile": "pingpong_128x176x64_s5_e64_g8"},
    {"label": "bf16_2048x7168x2048_pingpong_128x176", "dtype": "bfloat16", "M": 2048, "N": 7168, "K": 2048,
     "tile": "pingpong_128x176x64_s5_e64_g8"},
    # Stream-K (``_sk``): every split a schedule makes. 512x4096x1048 on 128x128: 128 tiles of 17 K-steps on 132 CTAs
    # (16-17 steps each: tiles split 2- and 3-way, middle ranges inside one tile); 2000x3136x200: 400 tiles of 4
    # steps = 2 data-parallel waves + 136 stream-K tiles, ragged M and N; 129x264x72 on 128x256: 4 tiles x 2 steps
    # = 8 CTAs of one step (every tile split in two, N ends 8 columns into the second N-tile); 300x520x136 on
    # 128x224 (register-stored tail); the shapes the tiles were built for (512x4096x14336, 2048x7168x2048,
    # 512x7168x2048 in fp16).
    {"label": "bf16_512x4096x1048_sk_128x128", "dtype": "bfloat16", "M": 512, "N": 4096, "K": 1048,
     "tile": "persistent_128x128x64_s6_g8_sk"},
    {"label": "fp16_2000x3136x200_sk_128x128", "dtype": "float16", "M": 2000, "N": 3136, "K": 200,
     "tile": "persistent_128x128x64_s6_g8_sk"},
    {"label": "bf16_129x264x72_sk_128x256", "dtype": "bfloat16", "M": 129, "N": 264, "K": 72,
     "tile": "persistent_128x256x64_s4_e128_g8_sk"},
    {"label": "bf16_300x520x136_sk_128x224", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x224x64_s4_g8_sk"},
    {"label": "bf16_512x4096x14336_sk_128x128", "dtype": "bfloat16", "M": 512, "N": 4096, "K": 14336,
     "tile": "persistent_128x128x64_s6_g8_sk"},
    {"label": "bf16_2048x7168x2048_sk_128x256", "dtype": "bfloat16", "M": 2048, "N": 7168, "K": 2048,
     "tile": "persistent_128x256x64_s4_e128_g8_sk"},
    {"label": "fp16_512x7168x2048_sk_128x224", "dtype": "float16", "M": 512, "N": 7168, "K": 2048,
     "tile": "persistent_128x224x64_s4_g8_sk"},
    # 2 x 2 clusters ("_c2x2": A and B both multicast, each CTA loading half of each; 30 clusters on 120 SMs).
    # 300 x 520: 3 x 5 tiles of 128 (odd both ways: the last cluster row has CTAs past M, the last cluster column CTAs
    # past N, one CTA past both); 300 x 104: one N-tile, so half of every cluster lies past N; 2000 x 1544 x 1048:
    # 8 x 7 cluster tiles on 30 clusters (1-2 each, 17 K-tiles wrapping the ring across tiles); NN (B's MN-major boxes
    # multicast by slice) with the general epilogue; the ping-pong kernel; two of the shapes the tiles are for.
    {"label": "bf16_300x520x136_persistent_128x128_c2x2", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x128x64_s6_c2x2_g8_wg"},
    {"label": "fp16_300x104x136_persistent_128x128_c2x2", "dtype": "float16", "M": 300, "N": 104, "K": 136,
     "tile": "persistent_128x128x64_s6_c2x2_g8_wg"},
    {"label": "bf16_2000x1544x1048_persistent_128x128_c2x2", "dtype": "bfloat16", "M": 2000, "N": 1544, "K": 1048,
     "tile": "persistent_128x128x64_s6_c2x2_g8_wg"},
    {"label": "fp16_300x520x136_nn_alpha_beta_bias_c2x2", "dtype": "float16", "M": 300, "N": 520, "K": 136,
     "layout": "nn", "epilogue": "alpha_beta_bias", "bias_dtype": "float32", "alpha": 0.5, "beta": -1.5,
     "tile": "persistent_128x128x64_s6_c2x2_g8_wg"},
    {"label": "fp16_4000x4104x200_persistent_128x256_c2x2", "dtype": "float16", "M": 4000, "N": 4104, "K": 200,
     "tile": "persistent_128x256x64_s3_c2x2_g8_wg"},
    {"label": "bf16_2000x1544x1048_pingpong_128x192_c2x2", "dtype": "bfloat16", "M": 2000, "N": 1544, "K": 1048,
     "tile": "pingpong_128x192x64_s4_e64_c2x2_g8_wg"},
    {"label": "fp16_300x520x136_pingpong_128x192_c2x2", "dtype": "float16", "M": 300, "N": 520, "K": 136,
     "tile": "pingpong_128x192x64_s4_e64_c2x2_g8_wg"},
    {"label": "bf16_512x4096x14336_persistent_128x128_c2x2", "dtype": "bfloat16", "M": 512, "N": 4096, "K": 14336,
     "tile": "persistent_128x128x64_s6_c2x2_g8_wg"},
    {"label": "bf16_8192x8192x8192_persistent_128x256_c2x2", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_c2x2_g8_wg"},
    # 112-column ping-pong tiles (the last 48 columns from registers): N = 520 is 5 N-tiles (the 5th ends 8 columns
    # into its register columns; odd: the last 1 x 2 cluster has a CTA past N); 2000 x 1544 x 1048: 16 x 14 tiles on
    # 132 CTAs (both consumers of a CTA take tiles); 512 x 7168 x 2048 the shape they are for.
    {"label": "bf16_300x520x136_pingpong_128x112", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "pingpong_128x112x64_s6_e64_g8"},
    {"label": "fp16_2000x1544x1048_pingpong_128x112_c2n", "dtype": "float16", "M": 2000, "N": 1544, "K": 1048,
     "tile": "pingpong_128x112x64_s6_e64_c2n_g8_wg"},
    {"label": "bf16_300x520x136_pingpong_128x112_c2n", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "pingpong_128x112x64_s6_e64_c2n_g8_wg"},
    {"label": "bf16_512x7168x2048_pingpong_128x112", "dtype": "bfloat16", "M": 512, "N": 7168, "K": 2048,
     "tile": "pingpong_128x112x64_s6_e64_g8"},
    {"label": "bf16_37x520x1048_smallm_224_k2", "dtype": "bfloat16", "M": 37, "N": 520, "K": 1048,
     "tile": "smallm_64x224x64_s6_k2"},
    {"label": "fp16_100x1112x200_smallm_128x224_k4", "dtype": "float16", "M": 100, "N": 1112, "K": 200,
     "tile": "smallm_128x224x64_s5_k4"},
    {"label": "bf16_1x28672x8192_smallm_224_k1", "dtype": "bfloat16", "M": 1, "N": 28672, "K": 8192,
     "tile": "smallm_64x224x64_s6_k1"},
    {"label": "bf16_128x7168x2048_smallm_128x224_k4", "dtype": "bfloat16", "M": 128, "N": 7168, "K": 2048,
     "tile": "smallm_128x224x64_s5_k4"},
    # block_k 128 / 256 (2 / 4 boxes a stage): K = 1048 is 9 stages of 128, the last one's second box wholly
    # past K (not loaded, not multiplied); K = 136 one stage of 256 with boxes at 0/64/128 (partial)/192 (past
    # K); K = 72 over split 4 at 128: one stage, three idle ranks.
    {"label": "bf16_37x520x1048_smallm_bk128_k2", "dtype": "bfloat16", "M": 37, "N": 520, "K": 1048,
     "tile": "smallm_64x128x128_s4_k2"},
    {"label": "fp16_100x1112x1048_smallm_128x128_bk128_k4", "dtype": "float16", "M": 100, "N": 1112, "K": 1048,
     "tile": "smallm_128x128x128_s3_k4"},
    {"label": "bf16_16x600x136_smallm_bk256_k2", "dtype": "bfloat16", "M": 16, "N": 600, "K": 136,
     "tile": "smallm_64x128x256_s2_k2"},
    {"label": "bf16_5x520x72_smallm_224_bk128_k4", "dtype": "bfloat16", "M": 5, "N": 520, "K": 72,
     "tile": "smallm_64x224x128_s3_k4"},
    {"label": "bf16_1x28672x8192_smallm_224_bk128_k1", "dtype": "bfloat16", "M": 1, "N": 28672, "K": 8192,
     "tile": "smallm_64x224x128_s3_k1"},
    # 64-column small-M tiles: N = 264 / 200 end mid-tile, K = 1048 mid-stage.
    {"label": "bf16_100x264x1048_smallm_128x64_k2", "dtype": "bfloat16", "M": 100, "N": 264, "K": 1048,
     "tile": "smallm_128x64x64_s8_k2"},
    {"label": "fp16_37x200x520_smallm_64x64_k2", "dtype": "float16", "M": 37, "N": 200, "K": 520,
     "tile": "smallm_64x64x64_s12_k2"},
    # epi_cols with the general epilogue: fp32 out in 4 passes of 64 columns; alpha/beta/bias loading C_in
    # round by round.
    {"label": "bf16_300x520x136_out_fp32_s4_e128", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "out_dtype": "float32", "tile": "persistent_128x256x64_s4_e128_g8"},
    # NN (MN-major B) on the tiles TILE_TABLE now picks for variants too (the op keeps the table's tile for a
    # variant when it is a persistent one).
    {"label": "bf16_300x520x136_nn_s4_e128", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136, "layout": "nn",
     "tile": "persistent_128x256x64_s4_e128_g8"},
    {"label": "fp16_300x520x136_nn_128x192", "dtype": "float16", "M": 300, "N": 520, "K": 136, "layout": "nn",
     "tile": "persistent_128x192x64_s4_g8"},
    {"label": "bf16_1000x1032x1048_nn_bias_128x64", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1048,
     "layout": "nn", "epilogue": "bias", "bias_dtype": "bfloat16", "tile": "persistent_128x64x64_s8_g8"},
    {"label": "bf16_300x520x136_alpha_beta_bias_s4_e128", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "epilogue": "alpha_beta_bias", "bias_dtype": "bfloat16", "alpha": 0.5, "beta": -1.5,
     "tile": "persistent_128x256x64_s4_e128_g8"},
    # The ping-pong kernel (gemm/_pingpong.py), pinned until the H200 run confirms it. Ragged M/N/K; the
    # 300x520, 1000x776 and 1000x1032 rows give each CTA one tile (consumer 1 idle; 1048 = 17 K-tiles wraps the
    # ring); from 2000x1544 on there are more tiles than the 132 CTAs, so consumers alternate: 208 tiles of
    # 128x128 (1-2 per CTA), 312 (2-3), 704 of 128x192 (5-6, with k_tiles = 4 = num_stages: the parity case
    # the consumers' turn-taking exists for), 704 and 2752 at 4096^3 / 8192^3.
    {"label": "bf16_300x520x136_pingpong_128x128", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "pingpong_128x128x64_s6_e64_g8"},
    {"label": "fp16_300x520x136_pingpong_128x192", "dtype": "float16", "M": 300, "N": 520, "K": 136,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "bf16_1000x776x200_pingpong_128x192", "dtype": "bfloat16", "M": 1000, "N": 776, "K": 200,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "bf16_2000x1544x72_pingpong_128x128", "dtype": "bfloat16", "M": 2000, "N": 1544, "K": 72,
     "tile": "pingpong_128x128x64_s6_e64_g8"},
    {"label": "fp16_3000x1544x136_pingpong_128x128", "dtype": "float16", "M": 3000, "N": 1544, "K": 136,
     "tile": "pingpong_128x128x64_s6_e64_g8"},
    {"label": "bf16_4000x4104x200_pingpong_128x192", "dtype": "bfloat16", "M": 4000, "N": 4104, "K": 200,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "fp16_1000x1032x1048_pingpong_128x192", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "bf16_4096x4096x4096_pingpong_128x192", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "bf16_4096x4096x4096_pingpong_128x128", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "pingpong_128x128x64_s6_e64_g8"},
    {"label": "bf16_8192x8192x8192_pingpong_128x192", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    # 2-CTA clusters: 3 M-tiles (the second CTA of the last cluster past M); 2900x4104: 23 M-tiles -> 12 x 22 =
    # 264 cluster tiles on 66 clusters (4 each, both consumers), padding CTAs past M again.
    {"label": "bf16_300x520x136_pingpong_128x192_c2", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "pingpong_128x192x64_s4_e64_c2_g8"},
    {"label": "fp16_2900x4104x200_pingpong_128x192_c2", "dtype": "float16", "M": 2900, "N": 4104, "K": 200,
     "tile": "pingpong_128x192x64_s4_e64_c2_g8"},
    {"label": "bf16_8192x8192x8192_pingpong_128x192_c2", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "pingpong_128x192x64_s4_e64_c2_g8"},
    {"label": "bf16_2900x4104x200_pingpong_128x192_c2_wg", "dtype": "bfloat16", "M": 2900, "N": 4104, "K": 200,
     "tile": "pingpong_128x192x64_s4_e64_c2_g8_wg"},
    # The small-M split-K cluster kernel (gemm/_small_m.py), pinned until the H200 run confirms it.
    {"label": "bf16_1x4096x4096_smallm_k4", "dtype": "bfloat16", "M": 1, "N": 4096, "K": 4096,
     "tile": "smallm_64x128x64_s8_k4"},
    {"label": "bf16_16x14336x4096_smallm_k2", "dtype": "bfloat16", "M": 16, "N": 14336, "K": 4096,
     "tile": "smallm_64x128x64_s8_k2"},
    {"label": "fp16_64x4096x14336_smallm_k4", "dtype": "float16", "M": 64, "N": 4096, "K": 14336,
     "tile": "smallm_64x128x64_s8_k4"},
    {"label": "bf16_128x14336x4096_smallm_k2", "dtype": "bfloat16", "M": 128, "N": 14336, "K": 4096,
     "tile": "smallm_128x128x64_s6_k2"},
    {"label": "bf16_128x14336x4096_smallm_256_k2", "dtype": "bfloat16", "M": 128, "N": 14336, "K": 4096,
     "tile": "smallm_128x256x64_s4_k2"},
    {"label": "bf16_2x2048x7168_smallm_k8", "dtype": "bfloat16", "M": 2, "N": 2048, "K": 7168,
     "tile": "smallm_64x128x64_s8_k8"},
    # Ragged: K = 1048 is 17 K-tiles (4/4/4/5 over the ranks, the last one partial), N = 520 ends 8 columns
    # into its 5th N-tile, M = 37 inside one M-tile.
    {"label": "bf16_37x520x1048_smallm_k4", "dtype": "bfloat16", "M": 37, "N": 520, "K": 1048,
     "tile": "smallm_64x128x64_s8_k4"},
    {"label": "fp16_37x520x1048_smallm_k1", "dtype": "float16", "M": 37, "N": 520, "K": 1048,
     "tile": "smallm_64x128x64_s8_k1"},
    # Tiny K: 2 K-tiles over 4 (8) ranks, so some ranks stream nothing and contribute zeros; M = 100 is a
    # partial 128-row tile (two 64-row tiles, the second partial, at block_m 64).
    {"label": "bf16_100x264x72_smallm_k4", "dtype": "bfloat16", "M": 100, "N": 264, "K": 72,
     "tile": "smallm_128x128x64_s6_k4"},
    {"label": "bf16_100x264x72_smallm_k8", "dtype": "bfloat16", "M": 100, "N": 264, "K": 72,
     "tile": "smallm_64x128x64_s8_k8"},
    {"label": "fp16_129x520x1048_smallm_256_k2", "dtype": "float16", "M": 129, "N": 520, "K": 1048,
     "tile": "smallm_128x256x64_s4_k2"},
    # The skinny mma.sync kernel (gemm/_gemv.py). N = 520 ends 8 rows into a 16-row warp (and into the second
    # row group of a 32-row CTA); K = 1048 = 4 chunks of 256 + 24 (a partial step), K = 200 over 16 K-lanes of
    # 64 (12 lanes idle), K = 72 one partial chunk; M = 1 / 5 / 13 fill part of an 8 / 16-token tile.
    {"label": "bf16_1x4096x4096_gemv_t8", "dtype": "bfloat16", "M": 1, "N": 4096, "K": 4096,
     "tile": "gemv_t8_r1_k8_u4"},
    {"label": "bf16_5x520x1048_gemv_t8_r2", "dtype": "bfloat16", "M": 5, "N": 520, "K": 1048,
     "tile": "gemv_t8_r2_k4_u4"},
    {"label": "fp16_16x1112x200_gemv_t16_k16", "dtype": "float16", "M": 16, "N": 1112, "K": 200,
     "tile": "gemv_t16_r1_k16_u2"},
    {"label": "bf16_13x264x72_gemv_t16_p256", "dtype": "bfloat16", "M": 13, "N": 264, "K": 72,
     "tile": "gemv_t16_r1_k8_u4_p256"},
    {"label": "fp16_8x520x1048_gemv_t8_u8_p256", "dtype": "float16", "M": 8, "N": 520, "K": 1048,
     "tile": "gemv_t8_r1_k4_u8_p256"},
    {"label": "bf16_16x2056x7168_gemv_t16_r2_p256", "dtype": "bfloat16", "M": 16, "N": 2056, "K": 7168,
     "tile": "gemv_t16_r2_k4_u4_p256"},
    {"label": "fp16_3x6152x1048_gemv", "dtype": "float16", "M": 3, "N": 6152, "K": 1048},
    # The M <= 8, N = 6144 pick: N = 6152 ends 8 rows into the last 32-row CTA, K = 2056 8 columns into a step.
    {"label": "bf16_7x6152x2056_gemv_t8_r2_p256", "dtype": "bfloat16", "M": 7, "N": 6152, "K": 2056,
     "tile": "gemv_t8_r2_k4_u4_p256"},
    # The L2 evict_first loads ("_ef" tiles): ragged M / N / K (3 M-tiles, 8 columns into the last N-tile, the
    # 224 tile's register tail 8 in; rings wrapping across tiles), an epilogue variant on such a tile, and the shapes
    # the tiles are picked for.
    {"label": "bf16_300x520x136_persistent_128x128_ef", "dtype": "bfloat16", "M": 300, "N": 520, "K": 136,
     "tile": "persistent_128x128x64_s6_g8_ef"},
    {"label": "fp16_1000x1112x1048_persistent_128x224_ef", "dtype": "float16", "M": 1000, "N": 1112, "K": 1048,
     "tile": "persistent_128x224x64_s4_g8_ef"},
    {"label": "bf16_2000x1544x136_persistent_128x192_ef", "dtype": "bfloat16", "M": 2000, "N": 1544, "K": 136,
     "tile": "persistent_128x192x64_s4_g8_ef"},
    {"label": "fp16_1000x1032x1048_bias_128x128_ef", "dtype": "float16", "M": 1000, "N": 1032, "K": 1048,
     "epilogue": "bias", "bias_dtype": "float32", "tile": "persistent_128x128x64_s6_g8_ef"},
    {"label": "bf16_512x4096x14336_persistent_128x128_ef", "dtype": "bfloat16", "M": 512, "N": 4096, "K": 14336,
     "tile": "persistent_128x128x64_s6_g8_ef"},
    {"label": "bf16_512x6144x4096_persistent_128x192_ef", "dtype": "bfloat16", "M": 512, "N": 6144, "K": 4096,
     "tile": "persistent_128x192x64_s4_g8_ef"},
    # Any M, N, K (docs/gemm.md "Any M, N, K"; the harness's out is contiguous, so odd N means unaligned C rows).
    # Plain NT, odd N: c_store "stg" on STG_TILE (129 x 1001: one M-tile and a row past it, the 4th N-tile's second
    # staged round 105 columns in; 257 x 50257: an LM head's N, ragged M; 13 x 1001: a small-M pick, also "stg");
    # M <= 8: the gemv pick into a padded output (5 x 3 x 7 with odd K, 1 x 1 x 1). Odd K (zero-padded): 1000 x 1032
    # x 1001 on the table's tile. Variants into a padded output on VARIANT_TILE: NN with odd N (B padded too) and
    # odd K, alpha/beta reading out through it; NT bias + alpha/beta + fp32 out with N, K odd.
    {"label": "bf16_129x1001x136_stg", "dtype": "bfloat16", "M": 129, "N": 1001, "K": 136},
    {"label": "fp16_129x1001x136_stg", "dtype": "float16", "M": 129, "N": 1001, "K": 136},
    {"label": "bf16_257x50257x136_stg", "dtype": "bfloat16", "M": 257, "N": 50257, "K": 136},
    {"label": "bf16_13x1001x72_stg", "dtype": "bfloat16", "M": 13, "N": 1001, "K": 72},
    {"label": "bf16_5x3x7_gemv_padded", "dtype": "bfloat16", "M": 5, "N": 3, "K": 7},
    {"label": "bf16_1x1x1_gemv_padded", "dtype": "bfloat16", "M": 1, "N": 1, "K": 1},
    {"label": "bf16_3x1001x1001_gemv_padded", "dtype": "bfloat16", "M": 3, "N": 1001, "K": 1001},
    {"label": "bf16_1000x1032x1001_odd_k", "dtype": "bfloat16", "M": 1000, "N": 1032, "K": 1001},
    {"label": "bf16_300x77x72_nn_padded", "dtype": "bfloat16", "M": 300, "N": 77, "K": 72, "layout": "nn",
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_300x77x73_nn_alpha_beta_padded", "dtype": "bfloat16", "M": 300, "N": 77, "K": 73, "layout": "nn",
     "epilogue": "alpha_beta", "alpha": 1.5, "beta": 0.75,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_2000x1003x1001_alpha_beta_bias_out_fp32", "dtype": "bfloat16", "M": 2000, "N": 1003, "K": 1001,
     "out_dtype": "float32", "epilogue": "alpha_beta_bias", "bias_dtype": "float32", "alpha": 0.5, "beta": -1.5,
     "tile": "persistent_128x256x64_s3_g8"},
]

# Square sizes and one LLM projection; the persistent/cluster variants side by side in the same run.
BENCH_CONFIGS = [
    {"label": "bf16_4096x4096x4096", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096},
    {"label": "bf16_8192x8192x8192", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192},
    {"label": "bf16_4096x4096x4096_persistent", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_8192x8192x8192_persistent", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_g8"},
    {"label": "bf16_4096x4096x4096_persistent_c2", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_8192x8192x8192_persistent_c2", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "persistent_128x256x64_s3_c2_g8"},
    {"label": "bf16_4096x4096x4096_persistent_128x128", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "persistent_128x128x64_s6_g8"},
    # Ping-pong (built, not yet measured).
    {"label": "bf16_4096x4096x4096_pingpong_128x192", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "bf16_8192x8192x8192_pingpong_128x192", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "pingpong_128x192x64_s4_e64_g8"},
    {"label": "bf16_4096x4096x4096_pingpong_128x128", "dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096,
     "tile": "pingpong_128x128x64_s6_e64_g8"},
    {"label": "bf16_8192x8192x8192_pingpong_128x192_c2", "dtype": "bfloat16", "M": 8192, "N": 8192, "K": 8192,
     "tile": "pingpong_128x192x64_s4_e64_c2_g8"},
    {"label": "bf16_4096x14336x4096", "dtype": "bfloat16", "M": 4096, "N": 14336, "K": 4096},
    # An LM head's odd N (c_store "stg" on STG_TILE) against the nearest aligned N (the table's tile): within 10 %.
    {"label": "bf16_4096x50264x4096", "dtype": "bfloat16", "M": 4096, "N": 50264, "K": 4096},
    {"label": "bf16_4096x50257x4096", "dtype": "bfloat16", "M": 4096, "N": 50257, "K": 4096},
    {"label": "bf16_4096x50264x4096_s4_e128", "dtype": "bfloat16", "M": 4096, "N": 50264, "K": 4096,
     "tile": "persistent_128x256x64_s4_e128_g8"},  # STG_TILE with TMA stores: the price of "stg" alone
    {"label": "bf16_8192x50264x4096", "dtype": "bfloat16", "M": 8192, "N": 50264, "K": 4096},
    {"label": "bf16_8192x50257x4096", "dtype": "bfloat16", "M": 8192, "N": 50257, "K": 4096},
    {"label": "bf16_128x14336x4096", "dtype": "bfloat16", "M": 128, "N": 14336, "K": 4096},
    # Small M (memory-bound: judge by TB/s of B streamed), the split-K cluster kernel beside the default.
    {"label": "bf16_1x14336x4096_smallm_k2", "dtype": "bfloat16", "M": 1, "N": 14336, "K": 4096,
     "tile": "smallm_64x128x64_s8_k2"},
    {"label": "bf16_16x14336x4096_smallm_k2", "dtype": "bfloat16", "M": 16, "N": 14336, "K": 4096,
     "tile": "smallm_64x128x64_s8_k2"},
    {"label": "bf16_64x14336x4096_smallm_k2", "dtype": "bfloat16", "M": 64, "N": 14336, "K": 4096,
     "tile": "smallm_64x128x64_s8_k2"},
    {"label": "bf16_64x14336x4096_smallm_256_k2", "dtype": "bfloat16", "M": 64, "N": 14336, "K": 4096,
     "tile": "smallm_64x256x64_s5_k2"},
    {"label": "bf16_128x14336x4096_smallm_k2", "dtype": "bfloat16", "M": 128, "N": 14336, "K": 4096,
     "tile": "smallm_128x128x64_s6_k2"},
    {"label": "bf16_128x14336x4096_smallm_256_k2", "dtype": "bfloat16", "M": 128, "N": 14336, "K": 4096,
     "tile": "smallm_128x256x64_s4_k2"},
    {"label": "bf16_1x4096x14336_smallm_k4", "dtype": "bfloat16", "M": 1, "N": 4096, "K": 14336,
     "tile": "smallm_64x128x64_s8_k4"},
    {"label": "bf16_16x4096x14336_smallm_k4", "dtype": "bfloat16", "M": 16, "N": 4096, "K": 14336,
     "tile": "smallm_64x128x64_s8_k4"},
    {"label": "bf16_64x4096x14336_smallm_k4", "dtype": "bfloat16", "M": 64, "N": 4096, "K": 14336,
     "tile": "smallm_64x128x64_s8_k4"},
    {"label": "bf16_128x4096x14336_smallm_k4", "dtype": "bfloat16", "M": 128, "N": 4096, "K": 14336,
     "tile": "smallm_128x128x64_s6_k4"},
    {"label": "bf16_128x4096x4096_smallm_k4", "dtype": "bfloat16", "M": 128, "N": 4096, "K": 4096,
     "tile": "smallm_128x128x64_s6_k4"},
]

DEFAULTS = {"dtype": "bfloat16"}

# Output rounding: bf16 2^-9 relative (half ulp), fp16 2^-12; atol is a fraction of the oracle's RMS.
TOLERANCE = {"bfloat16": (1e-2, 1.6e-2), "float16": (2e-3, 4e-3),
             # fp32 out: only the accumulation order differs from the fp32 oracle of the same inputs.
             "float32": (1e-4, 1e-3)}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_OUT_DTYPES = {**_DTYPES, "float32": torch.float32}
_OP = "gemm_nt"
# Compile-parameter values beyond the plain NT, 16-bit-out, no-epilogue kernel (gemm/_persistent.py only).
LAYOUTS = ("nt", "nn")
EPILOGUES = ("none", "bias", "alpha_beta", "alpha_beta_bias")
# The tile a variant gets when the caller pins none and choose_tile's pick is not a persistent one.
VARIANT_TILE = "persistent_128x256x64_s3_g8"
# The plain NT call whose C rows are not 16-byte aligned (odd N: LM heads of 50257 columns) and whose pick is not a
# gemv tile: C leaves the staging tile through per-element st.global (gemm/_persistent.py c_store="stg"), on the
# 4-stage 128x256 tile (within 1-2 % of the table's large-M picks, docs/gemm.md section "Any M, N, K").
STG_TILE = "persistent_128x256x64_s4_e128_g8"
# Programmatic dependent launch (``core.lang.pdl``) of the persistent, ping-pong and small-M kernels: every thread
# waits for the previous kernel after the barrier setup, before any TMA load or store; the next kernel is signalled
# after the last store. Sweep round 10 on the H200 (docs/measurements/2026-12-03c-h200/sweep-round10.log): 1024^3
# from a CUDA graph of back-to-back calls 5.0 us vs 5.7 plain (cuBLAS 5.4; trigger right after the wait: 5.1);
# cold L2 unchanged within the rounds' spread (1 x 4096 x 4096 18.5 vs 18.5, 128 x 4096 x 4096 17.5 vs 17.4,
# 4096^3 177.4 vs 177.5).
PDL = "end"

# ---------------------------------------------------------------------------------------------------------
# Tile configurations and the heuristic that picks one
# ---------------------------------------------------------------------------------------------------------

# block_m = 2 consumer warpgroups x 64 rows; block_k = 64 elements = one 128-byte swizzle row.
# 3 stages x (16 KB A + 32 KB B) + 64 KB C staging = 208 KB of the 227 KB of smem per CTA.
TILE_CONFIGS = {
    "ws_128x256x64_s3": {"block_m": 128, "block_n": 256, "block_k": 64, "num_stages": 3},
    # Persistent (gemm/_persistent.py): grid = min(tiles, num_sms) CTAs looping over tiles in a grouped
    # raster of group_m M-tiles; the ring runs across tiles and the TMA-store epilogue overlaps the next
    # tile's loads. num_sms = 132 is the H200's SM count (a compile parameter, not a device query).
    # 3 x 48 KB ring + 64 KB staging = 208 KB.
    "persistent_128x256x64_s3_g8": {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                    "num_stages": 3, "cluster_m": 1, "group_m": 8, "num_sms": 132},
    # The same with 2-CTA clusters along M, each CTA loading half of B and multicasting it to both.
    "persistent_128x256x64_s3_c2_g8": {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                       "num_stages": 3, "cluster_m": 2, "group_m": 8, "num_sms": 132},
    # Half-width tiles: twice the tiles (less wave quantisation for mid sizes), 6 x 32 KB ring + 32 KB
    # staging = 224 KB.
    "persistent_128x128x64_s6_g8": {"kind": "persistent", "block_m": 128, "block_n": 128, "block_k": 64,
                                    "num_stages": 6, "cluster_m": 1, "group_m": 8, "num_sms": 132},
    # Candidates for the GPU sweep (tools/gemm_sweep.py), not measured yet; TILE_TABLE picks none of them.
    # A 4th stage for 128x256 (large shapes: 8192^3 and the M >= 2048 projections run at 700-740 TFLOP/s on
    # s3): the staging tile shrinks to 128 x 128 (epi_cols; each consumer stores its 64 x 256 slab in two
    # rounds), so 4 x 48 KB ring + 32 KB staging = 224 KB.
    "persistent_128x256x64_s4_e128_g8": {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                         "num_stages": 4, "cluster_m": 1, "group_m": 8, "num_sms": 132,
                                         "epi_cols": 128},
    # The same with the 2-CTA cluster's B multicast (s3_c2 is bound by the same 3 stages).
    "persistent_128x256x64_s4_e128_c2_g8": {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                            "num_stages": 4, "cluster_m": 2, "group_m": 8, "num_sms": 132,
                                            "epi_cols": 128},
    # 128x192: 512x6144x4096 has 4 x 32 = 128 tiles (one wave of 132) instead of 192 tiles of 128x128 = 1.45
    # waves (0.82x cuBLAS); also 256/512 x 6144 x 2048-4096 rows. 4 x 40 KB ring + 48 KB staging = 208 KB.
    "persistent_128x192x64_s4_g8": {"kind": "persistent", "block_m": 128, "block_n": 192, "block_k": 64,
                                    "num_stages": 4, "cluster_m": 1, "group_m": 8, "num_sms": 132},
    # 128x64: 1024^3 has 8 x 16 = 128 tiles (one wave) instead of 64 of 128x128 (half the SMs idle; 0.80-0.83x
    # cuBLAS); 512x2048x7168 likewise 128 tiles. 8 x 24 KB ring + 16 KB staging = 208 KB (9 stages do not fit).
    "persistent_128x64x64_s8_g8": {"kind": "persistent", "block_m": 128, "block_n": 64, "block_k": 64,
                                   "num_stages": 8, "cluster_m": 1, "group_m": 8, "num_sms": 132},
    # 128x224 (block_n a multiple of 32: the last 32 columns stored from registers): N = 7168 / 14336 / 28672
    # are 32 / 64 / 128 such tiles, so 512 x 7168 x 2048 is 128 tiles (one wave; 128x128: 224 = 1.7 waves) and
    # 512 x 28672 x 8192 512 tiles (3.9 waves; 128x256: 448 = 3.4). 4 x 44 KB ring + 48 KB staging = 224 KB.
    "persistent_128x224x64_s4_g8": {"kind": "persistent", "block_m": 128, "block_n": 224, "block_k": 64,
                                    "num_stages": 4, "cluster_m": 1, "group_m": 8, "num_sms": 132},
    # 128x128 with B multicast: the heuristic's tile for M <= 1024 and the mid shapes loads 32 KB per
    # k-step for half the math of 128x256, so halving B's L2 -> SM traffic may matter more here (e.g.
    # 1024 x 6144/14336 x 4096, 2048^3). 6 x 32 KB ring + 32 KB staging = 224 KB.
    "persistent_128x128x64_s6_c2_g8": {"kind": "persistent", "block_m": 128, "block_n": 128, "block_k": 64,
                                       "num_stages": 6, "cluster_m": 2, "group_m": 8, "num_sms": 132},
    # Ping-pong (gemm/_pingpong.py): the persistent grid and raster, but each math warpgroup takes whole tiles
    # (two m64 accumulators), alternately, so one's epilogue overlaps the other's mainloop. Each consumer has
    # its own 128 x epi_cols staging buffer. 6 x 32 KB ring + 2 x 16 KB staging = 224 KB (229 472 B); 128x192:
    # 4 x 40 KB + 2 x 16 KB = 192 KB (196 672 B; a 5th stage would need 237 568). 128x256 would need 2 x 128
    # accumulator registers of the consumers' 240: not built.
    # Sweep candidates of 2026-12-03 (fifth session): cuBLAS's nvjet kernels run every mid-size shape in 2-CTA
    # clusters (128x128 2x1, 176x128 1x2, 128x64 1x2; docs/measurements/2026-12-03d-h200/ncu-mid.csv) where our
    # 2x1 tiles were 2-8 % slower than unclustered ones. "_wg": one ring release per consumer warpgroup and CTA
    # (mbarrier.Ring.consumer_release_warpgroup) instead of one per warp; "_c2n": 1 x 2 clusters (two N-tiles
    # of one M-tile share A, multicast). Of ten such tiles swept twice (docs/measurements/2026-12-03e-h200) none
    # beat the unclustered / per-warp-release tiles by more than the run-to-run spread (one run, one shape:
    # 128x192 c2 wg at 8192x14336x4096 +3 %); these two stay as candidates, the rest were removed.
    "persistent_128x128x64_s6_c2n_g8_wg": {"kind": "persistent", "block_m": 128, "block_n": 128, "block_k": 64,
                                           "num_stages": 6, "cluster_m": 1, "cluster_n": 2, "group_m": 8,
                                           "num_sms": 132, "release": "warpgroup"},
    "pingpong_128x192x64_s4_e64_c2_g8_wg": {"kind": "pingpong", "block_m": 128, "block_n": 192, "block_k": 64,
                                            "num_stages": 4, "epi_cols": 64, "cluster_m": 2, "group_m": 8,
                                            "num_sms": 132, "release": "warpgroup"},
    # 176-column tiles, cuBLAS's width at 2048 x 7168 x 2048 and 512 x 28672 x 8192 (nvjet 176x128 "1x2" = our
    # 128 x 176 in 2x1 clusters, docs/measurements/2026-12-03d-h200/ncu-mid.csv): N = 7168 / 14336 / 28672 are 41 /
    # 82 / 163 N-tiles (99-100 % filled), so 2048 x 7168 is 656 tiles = 4.97 waves of 132 (128x256: 448 = 3.39,
    # 128x224: 512 = 3.88) and 512 x 28672 652 = 4.94 (128x224: 3.88). The last 48 columns go from the registers.
    # 5 x 38 KB ring + 32 KB staging (persistent; ping-pong: 2 x 16 KB) = 222 KB (227 408 B). Swept 2026-12-03f
    # (docs/measurements/2026-12-03f-h200): the ping-pong tile wins those two rows (2048x7168x2048 0.943 / 0.936
    # [ping-pong 128x128 0.928 / 0.924], 512x28672x8192 0.954 / 0.973 [128x224 0.923 / 0.947]) but runs 5-7 % below
    # 128x192 per FLOP elsewhere; the cooperative 176 tiles lost everywhere (2048x7168x2048 0.88 unclustered, 0.86
    # c2). Kept: the ping-pong tile (TILE_TABLE) and the c2 cooperative one (the GPU rows of the register tail in a
    # cluster); the unclustered cooperative and the c2 ping-pong ones were removed.
    "persistent_128x176x64_s5_c2_g8": {"kind": "persistent", "block_m": 128, "block_n": 176, "block_k": 64,
                                       "num_stages": 5, "cluster_m": 2, "group_m": 8, "num_sms": 132},
    "pingpong_128x176x64_s5_e64_g8": {"kind": "pingpong", "block_m": 128, "block_n": 176, "block_k": 64,
                                      "num_stages": 5, "epi_cols": 64, "group_m": 8, "num_sms": 132},
    "pingpong_128x128x64_s6_e64_g8": {"kind": "pingpong", "block_m": 128, "block_n": 128, "block_k": 64,
                                      "num_stages": 6, "epi_cols": 64, "group_m": 8, "num_sms": 132},
    "pingpong_128x192x64_s4_e64_g8": {"kind": "pingpong", "block_m": 128, "block_n": 192, "block_k": 64,
                                      "num_stages": 4, "epi_cols": 64, "group_m": 8, "num_sms": 132},
    # 112 columns, cuBLAS's tile at 512 x 7168 x 2048 (nvjet 128 x 112 in 1 x 2 clusters, docs/gemm.md section 14),
    # sweep candidates: 64 N-tiles, so 256 tiles, two per SM on all but a few of the 132, each CTA's second tile's
    # mainloop hiding the first one's epilogue, where the table's 128x224 (0.961-0.965x cuBLAS in the 2026-12-04 final
    # sweep) is one tile per SM with nothing to overlap. The last 48 columns go from the registers. 6 x 30 KB ring +
    # 2 x 16 KB staging = 212 KB (7 stages: 242 KB). The 1 x 2 form ("_c2n", A multicast) is cuBLAS's cluster.
    "pingpong_128x112x64_s6_e64_g8": {"kind": "pingpong", "block_m": 128, "block_n": 112, "block_k": 64,
                                      "num_stages": 6, "epi_cols": 64, "group_m": 8, "num_sms": 132},
    "pingpong_128x112x64_s6_e64_c2n_g8_wg": {"kind": "pingpong", "block_m": 128, "block_n": 112, "block_k": 64,
                                             "num_stages": 6, "epi_cols": 64, "cluster_n": 2, "group_m": 8,
                                             "num_sms": 132, "release": "warpgroup"},
    # QuACK's Hopper default shape: 128x192 ping-pong with 2-CTA clusters along M (B multicast).
    "pingpong_128x192x64_s4_e64_c2_g8": {"kind": "pingpong", "block_m": 128, "block_n": 192, "block_k": 64,
                                         "num_stages": 4, "epi_cols": 64, "cluster_m": 2, "group_m": 8,
                                         "num_sms": 132},
    # Stream-K ("_sk", gemm/_persistent.py stream_k; sweep candidates, TILE_TABLE picks none): the last full wave
    # and the partial one split evenly over the 132 CTAs along K, each tile's partials added by the CTA that holds
    # its first K-step (fp32 workspace and flags from fp16_bf16_gemm._run). Built for the rows where waves cost: one
    # wave of 128 tiles on 132 SMs (512 x 4096 x 14336 on 128x128, 512 x 7168 x 2048 on 128x224: 3 % idle) and
    # 2048 x 7168 x 2048 (448 tiles of 128x256 = 3.39 waves). Measured (2026-12-03g run B, cold L2, the 29 shapes
    # with M >= 512, four _sk tiles against the same tiles without stream-K): slower in 89 of the 116 pairs (geomean
    # 0.91x; 512 x 8192 x 28672 0.53x, 1024^3 0.78x), 0.72-1.02x at the rows it was for, and at no shape faster than
    # the best tile without it: the finisher adds its partials serially at the end of the launch (1-3 us), and the
    # CTAs sharing an A or B panel now run at different K offsets, so the panels are read from DRAM again instead of
    # from L2 (docs/gemm.md section 15). Kept as candidates with the GPU rows of the mechanism (128x192 removed).
    **{f"{t}_sk": {**cfg, "stream_k": True} for t, cfg in (
        ("persistent_128x256x64_s4_e128_g8", {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                              "num_stages": 4, "cluster_m": 1, "group_m": 8, "num_sms": 132,
                                              "epi_cols": 128}),
        ("persistent_128x128x64_s6_g8", {"kind": "persistent", "block_m": 128, "block_n": 128, "block_k": 64,
                                         "num_stages": 6, "cluster_m": 1, "group_m": 8, "num_sms": 132}),
        ("persistent_128x224x64_s4_g8", {"kind": "persistent", "block_m": 128, "block_n": 224, "block_k": 64,
                                         "num_stages": 4, "cluster_m": 1, "group_m": 8, "num_sms": 132}))},
    # 2 x 2 clusters ("_c2x2", sweep candidates; TILE_TABLE picks none until the H200 has timed them). At the mid-M
    # rows the time tracks the L2 sectors the SMs' loads cost, and the per-GPC L2 request coalescer merges identical
    # reads only of SMs in one GPC; a 2-CTA cluster's neighbours land in other GPCs, so our 2x1 tiles lost the
    # merging the unclustered ones get (47 % -> 3-26 % of sectors; cuBLAS 74 %; docs/gemm.md section 16). A cluster
    # of 2 x 2 tiles is one GPC by construction, and each CTA loads half of its A and half of its B tile, multicast
    # to the two CTAs that share it: half the L2 requests of an unclustered CTA (2x1: three quarters), and half the
    # L2 -> SM crossbar reads per FLOP, which matters where the board sits at its power cap (8192^3: 690-697 W of
    # 700). One ring release per consumer warpgroup and CTA (lane 0 of warp r arrives in CTA r: 4 CTAs, 4 warps).
    # The price: this H200 holds at most 30 clusters of 4 at once, 120 of its 132 SMs (the 4-CTA launches of
    # docs/measurements/2026-12-04-h200/run2-cta-placement.log place 30 clusters on SMs 0-119 and start the 31st only
    # when one ends; our reading of its 8- and 16-CTA launches: seven GPCs of 16-18 SMs hold four 4-CTA clusters each,
    # the eighth, of 8-10 SMs, two), so num_sms = 120, and
    # a tile must save more than the 9 % of SMs it gives up. Built to measure that, at the large shapes (power-bound)
    # and at 128x128 (the L2-sector experiment of section 16).
    **{f"{t}_c2x2_g8_wg": {**cfg, "cluster_m": 2, "cluster_n": 2, "group_m": 8, "num_sms": 120,
                          "release": "warpgroup"} for t, cfg in (
        ("persistent_128x128x64_s6", {"kind": "persistent", "block_m": 128, "block_n": 128, "block_k": 64,
                                      "num_stages": 6}),
        # 3 stages: with 4 (epi_cols 128) ptxas spills 4 bytes in the producer's setup under its 40 registers.
        ("persistent_128x256x64_s3", {"kind": "persistent", "block_m": 128, "block_n": 256, "block_k": 64,
                                      "num_stages": 3}),
        ("pingpong_128x192x64_s4_e64", {"kind": "pingpong", "block_m": 128, "block_n": 192, "block_k": 64,
                                        "num_stages": 4, "epi_cols": 64}))},
    # Small M (gemm/_small_m.py, memory-bound: stream B once): one CTA per (M-tile, N-tile, K-slice), the
    # split_k K-slices of a tile one cluster, reduced through DSMEM. block_m 64 = 1 consumer warpgroup
    # (M <= 64), 128 = 2 (M <= 128). Rings of 192-200 KB = the bytes in flight per SM.
    # CTAs = M-tiles x ceil(N / block_n) x split_k, e.g. N=4096: 32 x 4 = 128; N=14336: 112 x 2 = 224.
    "smallm_64x128x64_s8_k1": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 64,
                               "num_stages": 8, "split_k": 1},
    "smallm_64x128x64_s8_k2": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 64,
                               "num_stages": 8, "split_k": 2},
    "smallm_64x128x64_s8_k4": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 64,
                               "num_stages": 8, "split_k": 4},
    "smallm_64x128x64_s8_k8": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 64,
                               "num_stages": 8, "split_k": 8},
    "smallm_64x256x64_s5_k2": {"kind": "small_m", "block_m": 64, "block_n": 256, "block_k": 64,
                               "num_stages": 5, "split_k": 2},
    "smallm_128x128x64_s6_k2": {"kind": "small_m", "block_m": 128, "block_n": 128, "block_k": 64,
                                "num_stages": 6, "split_k": 2},
    "smallm_128x128x64_s6_k4": {"kind": "small_m", "block_m": 128, "block_n": 128, "block_k": 64,
                                "num_stages": 6, "split_k": 4},
    "smallm_128x128x64_s6_k8": {"kind": "small_m", "block_m": 128, "block_n": 128, "block_k": 64,
                                "num_stages": 6, "split_k": 8},
    # 224 columns: N = 7168 / 14336 / 28672 are 32 / 64 / 128 N-tiles, so split 4 / 2 / 1 is 128 CTAs (one
    # wave of 132) where 256 columns give 112 or 224 (0.85 / 1.7 waves; 28672 x 8192 ran at 0.92-0.95x cuBLAS).
    # Rings: 6 x 36 KB, 5 x 44 KB.
    "smallm_64x224x64_s6_k1": {"kind": "small_m", "block_m": 64, "block_n": 224, "block_k": 64,
                               "num_stages": 6, "split_k": 1},
    "smallm_64x224x64_s6_k2": {"kind": "small_m", "block_m": 64, "block_n": 224, "block_k": 64,
                               "num_stages": 6, "split_k": 2},
    "smallm_64x224x64_s6_k4": {"kind": "small_m", "block_m": 64, "block_n": 224, "block_k": 64,
                               "num_stages": 6, "split_k": 4},
    "smallm_128x224x64_s5_k1": {"kind": "small_m", "block_m": 128, "block_n": 224, "block_k": 64,
                                "num_stages": 5, "split_k": 1},
    "smallm_128x224x64_s5_k2": {"kind": "small_m", "block_m": 128, "block_n": 224, "block_k": 64,
                                "num_stages": 5, "split_k": 2},
    "smallm_128x224x64_s5_k4": {"kind": "small_m", "block_m": 128, "block_n": 224, "block_k": 64,
                                "num_stages": 5, "split_k": 4},
    # block_k 128 / 256 (sweep candidates): a stage is 2 / 4 SW128 boxes per operand, so each B row is read as
    # 256 / 512 contiguous bytes at a time (DRAM locality) with the same bytes in flight as the 64-column rings
    # above (64x128: 4 x 48 KB = 8 x 24 KB; 64x224: 3 x 72 KB; 128x128: 3 x 64 KB).
    "smallm_64x128x128_s4_k1": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 128,
                                "num_stages": 4, "split_k": 1},
    "smallm_64x128x128_s4_k2": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 128,
                                "num_stages": 4, "split_k": 2},
    "smallm_64x128x128_s4_k4": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 128,
                                "num_stages": 4, "split_k": 4},
    "smallm_64x128x256_s2_k2": {"kind": "small_m", "block_m": 64, "block_n": 128, "block_k": 256,
                                "num_stages": 2, "split_k": 2},
    "smallm_64x224x128_s3_k1": {"kind": "small_m", "block_m": 64, "block_n": 224, "block_k": 128,
                                "num_stages": 3, "split_k": 1},
    "smallm_64x224x128_s3_k2": {"kind": "small_m", "block_m": 64, "block_n": 224, "block_k": 128,
                                "num_stages": 3, "split_k": 2},
    "smallm_64x224x128_s3_k4": {"kind": "small_m", "block_m": 64, "block_n": 224, "block_k": 128,
                                "num_stages": 3, "split_k": 4},
    "smallm_128x128x128_s3_k2": {"kind": "small_m", "block_m": 128, "block_n": 128, "block_k": 128,
                                 "num_stages": 3, "split_k": 2},
    "smallm_128x128x128_s3_k4": {"kind": "small_m", "block_m": 128, "block_n": 128, "block_k": 128,
                                 "num_stages": 3, "split_k": 4},
    # 128 x 256: A (re-read from L2 by every N-tile) is a third of the smem fill instead of a half.
    "smallm_128x256x64_s4_k2": {"kind": "small_m", "block_m": 128, "block_n": 256, "block_k": 64,
                                "num_stages": 4, "split_k": 2},
    # 64 columns (sweep candidates for the short DRAM-bound rows, 15-20 us: 4096x4096 and 7168x2048 at M = 64-128,
    # 0.89-0.95x cuBLAS): at M = 128 one 128-row M-tile reads each B tile once where 64x128 reads it twice, and
    # N = 4096 / 7168 are 64 / 112 N-tiles (x split 2 / 1 = 128 / 112 CTAs). Rings 8 x 24 KB, 12 x 16 KB.
    "smallm_128x64x64_s8_k1": {"kind": "small_m", "block_m": 128, "block_n": 64, "block_k": 64,
                               "num_stages": 8, "split_k": 1},
    "smallm_128x64x64_s8_k2": {"kind": "small_m", "block_m": 128, "block_n": 64, "block_k": 64,
                               "num_stages": 8, "split_k": 2},
    "smallm_128x64x64_s8_k4": {"kind": "small_m", "block_m": 128, "block_n": 64, "block_k": 64,
                               "num_stages": 8, "split_k": 4},
    "smallm_64x64x64_s12_k1": {"kind": "small_m", "block_m": 64, "block_n": 64, "block_k": 64,
                               "num_stages": 12, "split_k": 1},
    "smallm_64x64x64_s12_k2": {"kind": "small_m", "block_m": 64, "block_n": 64, "block_k": 64,
                               "num_stages": 12, "split_k": 2},
}

# The skinny kernel (gemm/_gemv.py): M <= tokens (8 or 16), mma.sync fed by 16-byte loads of B. CTA =
# row_groups x k_lanes warps over 16 * row_groups B rows, each warp K-chunks of 32 * unroll columns. TILE_TABLE
# picks gemv_t16_r1_k8_u4_p256 and gemv_t16_r2_k4_u4_p256; the others are sweep candidates. Measured and dropped
# (2026-12-03d runs 1-2): unroll 8 with 8 K-lanes, 16 K-lanes of 4 steps, 2 row groups of 8 K-lanes (within
# 1-5 % of these, never the best), and one wave of ~128 CTAs (4 / 7 / 14 row groups at N = 8192 / 14336 /
# 28672: 1x28672x8192 130.8-136.3 us vs 122.9, 1x8192x28672 133.3-306 vs 124.8).
GEMV_TILES = {
    f"gemv_t{t}_r{r}_k{k}_u{u}": {"kind": "gemv", "tokens": t, "row_groups": r, "k_lanes": k, "unroll": u}
    for t in (8, 16) for r, k, u in ((1, 8, 4), (2, 4, 4), (1, 16, 2))
}
# The same with B's L2 fetches in 256-byte blocks (``.L2::256B``: 4 load steps of a row at once).
GEMV_TILES.update({
    f"gemv_t{t}_r{r}_k{k}_u{u}_p256": {"kind": "gemv", "tokens": t, "row_groups": r, "k_lanes": k, "unroll": u,
                                       "b_cache": "stream_l2_256"}
    for t in (8, 16) for r, k, u in ((1, 8, 4), (1, 16, 2), (1, 4, 8), (2, 4, 4))
})
TILE_CONFIGS.update(GEMV_TILES)

# "_ef": every A/B load L2 evict_first (gemm/_persistent.py load_priority). Where one wave holds every tile (512 x
# 4096 / 6144 / 7168 on 128 / 192 / 224 columns) each panel slice is dead once its K-step is read, and evict_first
# lets it leave L2 before the dirty lines of the kernel before (the bench's cold-L2 fill). Probe of 2026-12-04
# (tools/probes/gemm_l2_hints.py, docs/measurements/2026-12-04-h200/run2-l2hints.log), cuBLAS/ours without ->
# with: 512x4096x14336 0.953 -> 0.967, 512x6144x4096 0.990 -> 1.027, 512x7168x2048 0.959 -> 0.965; 4096^3 and
# 16384^3 unchanged, 2048x7168x2048 / 512x28672x8192 (ping-pong) -1 %, 8192^3 in 2-CTA clusters -3 %: not for the
# large shapes. Two sweeps over every M >= 512 shape (run4-sweep{A,B}.json) agree: TILE_TABLE's M = 512 rows.
EVICT_FIRST_TWINS = ["persistent_128x128x64_s6_g8", "persistent_128x192x64_s4_g8", "persistent_128x224x64_s4_g8",
                     "persistent_128x256x64_s4_e128_g8", "persistent_128x64x64_s8_g8"]
TILE_CONFIGS.update({f"{t}_ef": {**TILE_CONFIGS[t], "load_priority": "evict_first"} for t in EVICT_FIRST_TWINS})

# (max M, max N, max K, tile): the first row that fits wins (``choose_tile``; ``gemm_nt(..., tile=)`` pins one).
TILE_TABLE = [
    # First match wins: (max M, max N, max K, tile[, n_div]); a row with n_div matches only when N % n_div == 0
    # (the 224-column tiles: N = 7168 / 14336 / 28672 are whole numbers of them). Picked from the H200 sweeps of
    # 2026-12-02/03 (tools/gemm_sweep.py, cold L2, every candidate tile of a shape and cuBLAS interleaved in one
    # run; the latest raw rows: docs/measurements/2026-12-03-h200/run{1,2}-gemm-*.json). The
    # numbers after a row are its tile's time over the best tile's at the shapes that put it there (the
    # previous pick's in brackets); differences under ~2 % are within run-to-run noise.
    # M <= 128, memory-bound: B streams from DRAM. M <= 16: the skinny mma.sync kernel (gemm/_gemv.py) with
    # .L2::256B B fetches; 2026-12-03d run 2 (docs/measurements/2026-12-03d-h200/run2-gemm-issue.json), cuBLAS/ours,
    # [the split-K cluster kernel's best]. M = 1 (all 8 projections): 4096^2 1.255 [1.11], 14336x4096 1.110,
    # 4096x14336 1.137, 6144x4096 1.158, 28672x8192 1.014 [0.988], 8192x28672 1.000 [0.948], 7168x2048 1.137,
    # 2048x7168 1.260 (geomean 1.130; the best t8 tile 1.123, without .L2::256B 1.094).
    # Refined on the mean of three sweeps at the final kernels (2026-12-03d run 2, final, again; `tools/gemm_sweep.py
    # table`): two row groups of 4 K-lanes at N = 6144 (1x6144x4096 1.196 [r1 k8 1.148]).
    (8, 4096, None, "gemv_t16_r1_k8_u4_p256"),
    (8, 6144, None, "gemv_t8_r2_k4_u4_p256"),
    (8, None, None, "gemv_t16_r1_k8_u4_p256"),
    # M = 16: 4096^2 1.240 [1.08], 4096x14336 1.112; the split-K cluster kernel at N = 2048 (16x2048x7168, three-run
    # mean 1.146 [gemv 1.113]); two row groups of 4 K-lanes at N = 6144 (6144x4096 1.112 [r1 k8 1.051]) and
    # 14336x4096 (1.060 [1.012]), one of 8 at 7168x2048 (three-run mean 1.103 [r2 k4 1.051]).
    (16, 2048, None, "smallm_64x128x64_s8_k4"),
    (16, 4096, None, "gemv_t16_r1_k8_u4_p256"),
    (16, 6144, None, "gemv_t16_r2_k4_u4_p256"),
    (16, 7168, None, "gemv_t16_r1_k8_u4_p256"),
    # The rest of M <= 128: the split-K cluster kernel (gemm/_small_m.py). M <= 64 is one 64-row M-tile
    # whatever M is; the M <= 16 rows (N >= 8192 here) were chosen on the geomean over M = 1, 16, 64, the
    # 16 < M <= 64 rows on M = 64 (two runs: 2026-12-03b run 1, 2026-12-03d run 1; cuBLAS/ours of each).
    (16, 8192, None, "smallm_64x128x64_s8_k2"),    # 16x8192x28672: 0.998 [gemv r1 k8 0.968, r2 k4 0.984]
    (16, 16384, None, "gemv_t16_r2_k4_u4_p256"),   # 16x14336x4096 (above)
    (16, None, None, "smallm_64x224x128_s3_k1"),   # 16x28672x8192: 0.970 [gemv 0.940]
    (64, 2048, None, "smallm_64x128x64_s8_k4"),    # 64x2048x7168: 1.10 / 1.11
    (64, 4096, None, "smallm_64x64x64_s12_k2"),    # 4096x4096 1.06 / 1.06 [64x128 k2 1.00]; x14336 1.15 / 1.16 [1.05]
    (64, 7168, None, "smallm_64x64x64_s12_k1"),    # 6144x4096 1.06 / 1.09 [1.02]; 7168x2048 1.00 / 1.04 [0.94]
    (64, 8192, None, "smallm_64x128x128_s4_k2"),   # 8192x28672 1.05 / 1.08 [64x128x64 k2 1.07]
    (64, 16384, None, "smallm_64x128x128_s4_k1"),  # 14336x4096 1.07 / 1.08 [64x224x128 k2 1.03]
    (64, None, None, "smallm_64x224x128_s3_k1"),   # 28672x8192 1.02 / 1.00
    (128, 2048, None, "smallm_128x128x64_s6_k4"),  # 1.00
    # M = 128, N <= 7168: 128x64 tiles read each B tile once (64x128 read it twice, once per 64-row M-tile).
    # 2026-12-03b run 1 (docs/measurements/2026-12-03b-h200/gemm-issue.json), cuBLAS/ours:
    (128, 4096, None, "smallm_128x64x64_s8_k2"),   # 4096x4096: 1.07 [64x128 k2 0.85]; x14336: 1.13 [128x224 k4 1.05]
    (128, 7168, None, "smallm_128x64x64_s8_k1"),   # 6144x4096: 1.01 [64x128 k1 1.00]; 7168x2048: 1.01 [0.98]
    (128, 8192, None, "smallm_64x128x64_s8_k1"),   # 8192x28672 (128 CTAs): 1.02
    (128, 16384, None, "smallm_64x224x64_s6_k1"),  # 128x14336x4096: 2 x 64 = 128 CTAs, 1.00 [128x256 k2 1.08]
    (128, None, None, "smallm_128x224x64_s5_k1"),  # 128x28672x8192: 128 CTAs, 1.00, 1.01x cuBLAS [ws 0.99x]
    # 128 < M <= 1024: wave quantisation decides. Split-K or 128x64 tiles where 128x128 tiles number <= 64,
    # 224 columns where N is a multiple (512 x 7168 / 14336: 128 / 256 tiles, whole waves of 132), 128x192 for
    # N=6144 (4 x 32 = 128 tiles at M=512), 128x256 with a 4th stage (epi_cols=128) where its tiles fill the
    # SMs, 128x128 where they would not.
    (256, 2048, None, "smallm_128x224x64_s5_k4"),  # 256x2048x7168: 1.00 [128x128 k2 1.06]
    (256, 4096, None, "smallm_128x128x64_s6_k2"),  # 256x4096x4096 1.00; x14336 1.00
    (256, 8192, None, "persistent_128x128x64_s6_g8"),  # N=6144/7168/8192: 1.00
    (256, 16384, None, "smallm_128x224x64_s5_k1", 224),  # 256x14336x4096: 1.00 [128x256 s4 e128 1.06]
    (256, None, None, "persistent_128x224x64_s4_g8", 224),  # 256x28672x8192: 1.00 [1.09]
    (256, None, None, "persistent_128x256x64_s4_e128_g8"),
    # M = 512, one wave of tiles: the L2 evict_first loads ("_ef"), two sweeps of 2026-12-04 (docs/measurements/
    # 2026-12-04-h200/run4-sweep{A,B}.json), mean cuBLAS/ours [the previous pick's]: 512x2048x7168 128x64 ef 1.092
    # [split-K 128x64 k1 1.021; five sweeps of 2026-12-03 had it 1.031 against 128x64 persistent 1.007].
    (512, 2048, None, "persistent_128x64x64_s8_g8_ef"),
    (1024, 1024, None, "persistent_128x64x64_s8_g8"),  # 1024^3: 128 tiles, 1.00 vs 1.20-1.22 (128x128)
    # 512x7168x2048 / 512x14336x4096: 1.00 [1.03 / 1.10]; evict_first (2026-12-04): 0.956 / 1.117 [0.952 / 1.109].
    (512, 16384, None, "persistent_128x224x64_s4_g8_ef", 224),
    (1024, 8192, None, "persistent_128x224x64_s4_g8", 224),  # 1024x7168x2048: 1.00 [128x256 s4 e128 1.06]
    (1024, 2048, None, "persistent_128x128x64_s6_g8"),  # 1024x2048x7168: 1.00
    # 512x4096x{4096,14336}: 1.00; evict_first (2026-12-04): 0.985 / 0.964 [0.972 / 0.952].
    (512, 4096, None, "persistent_128x128x64_s6_g8_ef"),
    (1024, 4096, None, "persistent_128x256x64_s4_e128_g8"),  # 1024x4096x{4096,14336}: 1.00
    (512, 6144, None, "persistent_128x192x64_s4_g8_ef"),  # 512x6144x4096, evict_first (2026-12-04): 1.010 [0.971]
    (1024, 6144, None, "persistent_128x192x64_s4_g8"),  # 512x6144x4096: 1.00 vs 1.20-1.22 (128x128)
    (512, 7168, None, "persistent_128x128x64_s6_g8"),
    (1024, 8192, None, "persistent_128x256x64_s4_e128_g8"),  # 512/1024x8192x28672 1.00
    (512, 16384, None, "persistent_128x256x64_s4_e128_g8"),
    # From here on: the mean cuBLAS/ours over three issue sweeps (2026-12-03b run 1, 2026-12-03d runs 1-2) of each
    # tile, [the previous pick's].
    # 512x28672x8192: ping-pong 128x176 (163 N-tiles: 4.94 waves), 2026-12-03f runs A / B 0.954 / 0.973 [128x224
    # 0.923 / 0.947].
    (512, None, None, "pingpong_128x176x64_s5_e64_g8"),
    (1024, 16384, None, "pingpong_128x128x64_s6_e64_g8"),  # 1024x14336x4096: 1.00 vs 1.02 (128x128)
    (1024, None, None, "ws_128x256x64_s3"),  # 1024x28672x8192: 1.00 in two runs [128x256 s4 e128 1.04-1.06]
    # M > 1024: compute-bound. Ping-pong (gemm/_pingpong.py: one warpgroup's epilogue under the other's
    # mainloop) where K is short at M = 2048, so the epilogue is a larger share of each tile; otherwise 128x256
    # with 4 stages (epi_cols 128), with 2-CTA clusters at N = 8192, K <= 8192.
    (2048, 2048, 2048, "persistent_128x256x64_s4_e128_g8"),  # 2048^3: 0.993 [ping-pong 0.967] (three-run means)
    # 2048x7168x2048: ping-pong 128x176 (cuBLAS's width; 656 tiles = 4.97 waves), 2026-12-03f runs A / B 0.943 /
    # 0.936 [ping-pong 128x128 0.928 / 0.924].
    (2048, None, 2048, "pingpong_128x176x64_s5_e64_g8"),
    (2048, 6144, None, "persistent_128x256x64_s4_e128_g8"),  # 2048 x 4096/6144 x 4096-14336: 0.998-1.007
    (2048, 8192, None, "ws_128x256x64_s3"),  # 2048x8192x28672: 0.985 [s4 e128 0.955]
    # 2048x28672x8192: 2-CTA clusters, five-run mean 1.003 [s4 e128 0.984] (2026-12-03d final/run 2/again,
    # 2026-12-03e runs 1-2); 2048x14336x4096 stays on s4 e128 (0.999 [c2 0.992]).
    (2048, None, 4096, "persistent_128x256x64_s4_e128_g8"),
    (2048, None, None, "persistent_128x256x64_s4_e128_c2_g8"),
    # M = 8192 refined on the three-run means at the final kernels: ping-pong 128x192 at N = 6144 / 7168, K <= 4096
    # (8192x6144x4096 1.029 [s4 e128 1.003], x7168x2048 1.022 [1.005]), 2-CTA clusters at K > 8192 (8192x4096x14336
    # 1.028 [1.005]). The N = 6144 / 7168, K <= 4096 row in 2-CTA clusters since 2026-12-03f: 8192x6144x4096 five-run
    # mean 1.026 [unclustered 1.002], 8192x7168x2048 six-run 1.024 [1.025].
    (None, 4096, 4096, "persistent_128x256x64_s4_e128_g8"),
    (None, 7168, 4096, "pingpong_128x192x64_s4_e64_c2_g8"),
    (None, 7168, 8192, "persistent_128x256x64_s4_e128_g8"),
    (None, 7168, None, "persistent_128x256x64_s4_e128_c2_g8"),
    # (The 4096 / 8192 rows above: 128x256 s4 e128 at M = 8192, 0.994-1.019 [ping-pong 128x128 / s3: 8192x4096x4096
    # 0.972, x2048x7168 0.970]; 4096^3 1.000.)
    (None, 8192, 8192, "persistent_128x256x64_s4_e128_c2_g8"),  # 8192^3: 1.074 [s3 1.051, s4 e128 1.041]
    # 8192x14336x4096: 128x256 s4 e128 in 2-CTA clusters, six-run mean 1.014 [ping-pong 128x192 c2 0.995]
    # (2026-12-03e runs 1-2, final, again; 2026-12-03f runs A-B).
    (None, 16384, 4096, "persistent_128x256x64_s4_e128_c2_g8"),
    # 8192x28672x8192: ping-pong 128x192, mean of eight sweeps 1.007 [128x256 s4 e128 0.991] (2026-12-03e final /
    # again / runs 1-2, 2026-12-03f run A / final, 2026-12-03g runs A-B).
    (None, None, 8192, "pingpong_128x192x64_s4_e64_g8"),
    (None, None, None, "persistent_128x256x64_s4_e128_g8"),  # 8192 x 8192 x 28672 1.019 [s3 1.011], 16384^3 1.000
    # [s3 1.008] (the 8-run means of the row above: 8192x8192x28672 and 16384^3 stay here)
]


def cluster_ctas(tile: str) -> int:
    """CTAs per cluster of ``tile`` (2x1 or 1x2 clusters: 2; 2x2: 4; otherwise 1)."""
    cfg = TILE_CONFIGS[tile]
    return cfg.get("cluster_m", 1) * cfg.get("cluster_n", 1)


def sass_expect(dtype: str, tile: str, layout: str = "nt", c_store: str = "tma", **_) -> list[str]:
    """SASS the CPU build test asserts: the wgmma shape (m64n{block_n}: 64 ... 256), TMA loads/stores, register
    reconfiguration; the transposed-B wgmma for NN; the B (A) multicast of the 2x1 (1x2, 2x2) cluster tiles; the small-M
    kernel's own list (cluster barrier, DSMEM loads)."""
    cfg = TILE_CONFIGS[tile]
    if cfg.get("kind") == "small_m":
        from tirx_kernels.gemm import _small_m

        return _small_m.sass_expect(dtype, **{k: v for k, v in cfg.items() if k != "kind"})
    if cfg.get("kind") == "gemv":
        from tirx_kernels.gemm import _gemv

        return _gemv.sass_expect(dtype, **{k: v for k, v in cfg.items() if k != "kind"})
    n = cfg["block_n"]
    # c_store "stg": C from the staging tile in 16-bit st.global (STG.E.U16), no TMA store.
    out = [rf"HGMMA\.64x{n}x16\.F32" + (r"\.BF16" if dtype == "bfloat16" else r"\b"), r"UTMALDG\.2D",
           r"UTMASTG\.2D" if c_store == "tma" else r"STG\.E\.U16", r"USETMAXREG"]
    if cluster_ctas(tile) > 1:
        out.append(r"UTMALDG\.2D\.MULTICAST")
    if cfg.get("kind") == "pingpong":
        out.append(r"BAR\.ARV")  # the consumers' turn-taking (named-barrier arrive)
    if n % 64:
        out.append(r"STG\.E\b")  # the last 32 columns, stored from registers
    if cfg.get("load_priority"):
        out.append(r"UTMALDG\.2D \[UR\d+\], \[UR\d+\], desc\[UR\d+\]")  # the loads' L2 cache-policy operand
    if cfg.get("stream_k"):
        # Partials out and in (16-byte vectors; in from L2: .cg), the release fence and the flag's acquire load.
        out += [r"STG\.E\.128", r"LDG\.E\.128\.STRONG\.GPU", r"MEMBAR\.ALL\.GPU", r"LDG\.E\.STRONG\.GPU"]
    return out + ([r"tnspB"] if layout == "nn" else [])


def variant_combinations(dtype: str) -> list[dict]:
    """Every (layout, out_dtype, epilogue, bias_dtype) variant of ``dtype``: the params keys beyond dtype/tile."""
    out = []
    for layout in LAYOUTS:
        for out_dtype in (dtype, "float32"):
            for epilogue in EPILOGUES:
                if not is_variant(dtype, layout, out_dtype, epilogue):
                    continue
                p = {"layout": layout, "out_dtype": out_dtype, "epilogue": epilogue}
                biases = (dtype, "float32") if epilogue in ("bias", "alpha_beta_bias") else (None,)
                out += [{**p, "bias_dtype": bd} if bd else p for bd in biases]
    return out


def _variant_table_tiles() -> list[str]:
    """TILE_TABLE's picks a variant keeps (persistent, whole 64-column boxes, no stream-K), without the "_ef" twins
    (their variants fall back to VARIANT_TILE)."""
    return [t for t in dict.fromkeys(row[3] for row in TILE_TABLE)
            if TILE_CONFIGS[t].get("kind") == "persistent" and TILE_CONFIGS[t]["block_n"] % 64 == 0
            and not TILE_CONFIGS[t].get("stream_k") and not TILE_CONFIGS[t].get("load_priority")]


def artifact_params() -> list[dict]:
    """Compile params a prebuilt bundle needs beyond the CONFIGS rows (M, N, K are runtime arguments):
    - every tile the heuristic can pick, for both dtypes (the plain op, aligned C rows);
    - the general variant artifacts: every variant (layout, out_dtype, epilogue, bias_dtype) on VARIANT_TILE
      (``general_params``: they serve every shape), 2 x 23 = 46;
    - the plain NT kernel with ``c_store="stg"`` on STG_TILE (C rows not 16-byte aligned), 2;
    - NT with a bias in a's dtype (nn.Linear's form) on the table's persistent tiles, so that it runs on the tile the
      plain call gets: 2 x 5 = 10."""
    plain = [{"dtype": d, "tile": t} for d in _DTYPES for t in dict.fromkeys(row[3] for row in TILE_TABLE)]
    general = [{"dtype": d, "tile": VARIANT_TILE, **v} for d in _DTYPES for v in variant_combinations(d)]
    stg = [{"dtype": d, "tile": STG_TILE, "c_store": "stg"} for d in _DTYPES]
    linear = [{"dtype": d, "tile": t, "layout": "nt", "out_dtype": d, "epilogue": "bias", "bias_dtype": d}
              for d in _DTYPES for t in _variant_table_tiles() if t != VARIANT_TILE]
    return plain + general + stg + linear


def general_params(params: dict) -> dict | None:
    """The general artifact serving every call ``params`` serves: a variant on VARIANT_TILE, the ``c_store="stg"``
    kernel on STG_TILE (sizes are runtime arguments); None for the plain kernel (its tiles are all in
    ``artifact_params``)."""
    if params.get("c_store") == "stg":
        return {**params, "tile": STG_TILE}
    if "layout" in params:
        return {**params, "tile": VARIANT_TILE}
    return None


def choose_tile(M: int, N: int, K: int) -> str:
    for max_m, max_n, max_k, tile, *n_div in TILE_TABLE:
        if ((max_m is None or M <= max_m) and (max_n is None or N <= max_n) and (max_k is None or K <= max_k)
                and (not n_div or N % n_div[0] == 0)):
            return tile
    raise AssertionError("TILE_TABLE has no catch-all row")


def is_variant(dtype: str, layout: str | None = None, out_dtype: str | None = None,
               epilogue: str | None = None) -> bool:
    """Anything but plain NT, dtype-out, no epilogue (which only the persistent kernel builds)."""
    return (layout or "nt") != "nt" or (out_dtype or dtype) != dtype or (epilogue or "none") != "none"


def stg_serves(tile: str) -> bool:
    """Whether ``tile`` builds the plain kernel with ``c_store="stg"`` (persistent, whole 64-column boxes, no
    stream-K)."""
    cfg = TILE_CONFIGS[tile]
    return cfg.get("kind") == "persistent" and cfg["block_n"] % 64 == 0 and not cfg.get("stream_k")


def c_store(dtype: str, M: int, N: int, K: int, tile: str | None = None, layout: str | None = None,  # noqa: N803
            out_dtype: str | None = None, epilogue: str | None = None, out_aligned: bool = True) -> str:
    """How C is stored: "stg" for a plain NT call whose C rows are not 16-byte aligned (odd N, or an ``out`` whose
    base or row stride is not) unless its tile is a gemv one (pinned, or picked: M <= 8, where the copy of a padded
    output costs nothing) or another kind that cannot build "stg"; else "tma" (``_run`` gives an unaligned C a
    padded output, then copies it)."""
    if (N % 8 == 0 and out_aligned) or is_variant(dtype, layout, out_dtype, epilogue):
        return "tma"
    if tile is None:
        return "tma" if TILE_CONFIGS[choose_tile(M, N, K)].get("kind") == "gemv" else "stg"
    return "stg" if stg_serves(tile) else "tma"


def compile_params(**cfg) -> dict:
    tile = cfg.get("tile") or choose_tile(cfg.get("M", 0), cfg.get("N", 0), cfg.get("K", 0))
    dtype = cfg["dtype"]
    launch = {"pdl": cfg["pdl"]} if "pdl" in cfg else {}  # a pinned launch variant (sweeps); default: PDL
    store = cfg.get("c_store") or c_store(dtype, cfg.get("M", 0), cfg.get("N", 0), cfg.get("K", 0), cfg.get("tile"),
                                          cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue"))
    if store == "stg":
        return {"dtype": dtype, "tile": cfg.get("tile") or STG_TILE, "c_store": "stg", **launch}
    if not is_variant(dtype, cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue")):
        return {"dtype": dtype, "tile": tile, **launch}  # the plain kernel: the same key as before variants
    picked = TILE_CONFIGS[tile]
    if not cfg.get("tile") and (picked.get("kind") != "persistent" or picked["block_n"] % 64 or picked.get("stream_k")):
        tile = VARIANT_TILE  # the variants need a persistent tile of whole 64-column store boxes, without stream-K
    epilogue = cfg.get("epilogue") or "none"
    p = {"dtype": dtype, "tile": tile, "layout": cfg.get("layout") or "nt", "out_dtype": cfg.get("out_dtype") or dtype,
         "epilogue": epilogue}
    if epilogue in ("bias", "alpha_beta_bias"):
        p["bias_dtype"] = cfg.get("bias_dtype") or dtype
    return {**p, **launch}


def call_samples(rng) -> list[dict]:
    """Calls the public ops can see (PROTOCOL.md; core's bundle-resolution test): the catalog's projections (hidden x
    intermediate both ways, square, the LM heads of the catalog and GPT-2's odd 50257) at decode-to-prefill M, random
    and odd M, N, K, and every variant (layout, out_dtype, epilogue, bias_dtype) at random shapes, both dtypes."""
    from tirx_kernels.core import model_dims

    hidden, inter = model_dims.hidden_sizes(), model_dims.intermediate_sizes()
    vocab = model_dims.vocab_sizes() + [50257]
    ms = [1, 3, 8, 13, 16, 37, 64, 100, 128, 200, 256, 512, 777, 1024, 2048, 4096, 8192]

    def size():
        return rng.choice([rng.randint(1, 64), rng.randint(1, 5000), 8 * rng.randint(1, 2000)])

    out = []
    for dtype in _DTYPES:
        for h in hidden:
            for n, k in ((rng.choice(inter), h), (h, rng.choice(inter)), (rng.choice(vocab), h), (h, h)):
                out.append({"dtype": dtype, "M": rng.choice(ms), "N": n, "K": k})
        out += [{"dtype": dtype, "M": size(), "N": size(), "K": size()} for _ in range(20)]
        for v in variant_combinations(dtype):
            ab = {"alpha": 0.5, "beta": rng.choice([0.0, 2.0])} if "alpha" in v["epilogue"] else {}
            out.append({"dtype": dtype, "M": size(), "N": size(), "K": size(), **v, **ab})
    return out


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, tile: str, layout: str = "nt", out_dtype: str | None = None, epilogue: str = "none",
               bias_dtype: str | None = None, pdl: str | None = PDL, c_store: str = "tma"):
    """The kernel of ``tile``; ``pdl``: programmatic dependent launch (``core.lang.pdl.TRIGGERS`` or None) of the
    persistent, ping-pong and small-M kernels (the stand-alone "ws" tile has none); ``c_store``: "stg" for C rows
    of any alignment (persistent tiles, plain NT only; gemm/_persistent.py)."""
    if dtype not in _DTYPES:
        raise ValueError(f"fp16_bf16_gemm: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    params = dict(TILE_CONFIGS[tile])
    if params.get("kind") != "persistent" and is_variant(dtype, layout, out_dtype, epilogue):
        raise ValueError(f"fp16_bf16_gemm: tile {tile!r} builds only NT, {dtype} out, no epilogue; layout "
                         f"{layout!r} / out_dtype {out_dtype!r} / epilogue {epilogue!r} need a persistent tile")
    # After the argument checks: those run (and are tested) on the GPU host, which has no TIRx compiler.
    from tirx_kernels.core.lang import pdl as pdl_launch

    pdl_launch.check_trigger("fp16_bf16_gemm", pdl)
    if c_store != "tma" and params.get("kind") != "persistent":
        raise ValueError(f"fp16_bf16_gemm: c_store {c_store!r} needs a persistent tile, not {tile!r}")
    if params.pop("kind", None) == "persistent":
        from tirx_kernels.gemm import _persistent

        store = {"c_store": c_store} if c_store != "tma" else {}
        return _persistent.build_persistent_kernel(dtype, **params, layout=layout, out_dtype=out_dtype,
                                                   epilogue=epilogue, bias_dtype=bias_dtype, pdl=pdl, **store)
    if TILE_CONFIGS[tile].get("kind") == "pingpong":
        from tirx_kernels.gemm import _pingpong

        return _pingpong.build_pingpong_kernel(dtype, **params, layout=layout, out_dtype=out_dtype,
                                               epilogue=epilogue, bias_dtype=bias_dtype, pdl=pdl)
    if TILE_CONFIGS[tile].get("kind") == "small_m":
        from tirx_kernels.gemm import _small_m

        return _small_m.build_small_m_kernel(dtype, **params, pdl=pdl)
    if TILE_CONFIGS[tile].get("kind") == "gemv":
        from tirx_kernels.gemm import _gemv

        return _gemv.build_gemv_kernel(dtype, **params, pdl=pdl)
    return _build_kernel(dtype, **params)


def _build_kernel(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, tma, wgmma

    elem = tma.elem_bytes(dtype)
    assert block_m == 2 * wgmma.M and block_k * elem == 128 and block_n % 64 == 0
    a_tile = block_m * block_k  # elements per stage
    b_tile = block_n * block_k
    stage_bytes = (a_tile + b_tile) * elem  # full boxes, also when they reach past M/N/K
    k_steps = block_k // 16
    nacc = wgmma.acc_regs(block_n)
    store_cols = 128 // elem  # one SW128 store box is 64 rows x 128 bytes
    store_rows = wgmma.M
    num_consumer_warps = 8
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    @T.prim_func
    def fp16_bf16_gemm(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, (N, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, N), dtype, strides=(ldc, 1), align=16)
        # Host: tensor maps with this call's dims (rows/cols past the edge: zero-fill on load, clip on store).
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        c_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, K, block_m, block_k, dtype)
        tma.encode_2d(b_map, B.data, N, K, K, block_n, block_k, dtype)
        tma.encode_2d(c_map, C.data, M, N, ldc, store_rows, store_cols, dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        # M tiles along x (fastest): neighbouring CTAs share one B tile (256 rows of B) in L2.
        mt, nt = T.cta_id([(M + block_m - 1) // block_m, (N + block_n - 1) // block_n])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + block_k - 1) // block_k

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_tile,), dtype, align=1024)
        Bs = pool.alloc((num_stages * b_tile,), dtype, align=1024)
        Cs = pool.alloc((block_m * block_n * elem // 4,), "uint32", align=1024)  # packed pairs, SW128
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")

        if tid == 0:
            for s in range(num_stages):
                mbarrier.init(full.ptr_to([s]), 1)  # the producer's arrive.expect_tx
                mbarrier.init(empty.ptr_to([s]), num_consumer_warps)  # lane 0 of each consumer warp
            mbarrier.fence_init()
        T.cuda.cta_sync()

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            T.ptx["setmaxnreg.dec.sync.aligned.u32"](40)
            if tid == 0:
                for k in range(k_tiles):
                    s = mbarrier.stage(k, num_stages)
                    mbarrier.wait(empty.ptr_to([s]), mbarrier.phase(k, num_stages) ^ 1)
                    mbarrier.arrive_expect_tx(full.ptr_to([s]), stage_bytes)
                    tma.load_2d(As.ptr_to([s * a_tile]), a_map, k * block_k, mt * block_m, full.ptr_to([s]))
                    tma.load_2d(Bs.ptr_to([s * b_tile]), b_map, k * block_k, nt * block_n, full.ptr_to([s]))
        else:
            # Math warpgroups: each owns rows [64*cw, 64*cw + 64) of the CTA tile.
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](232)
            cw = wg - 1
            ct = tid - 128 * wg
            warp = ct // 32
            lane = ct % 32
            for i in T.unroll(nacc):
                acc[i] = T.float32(0)
            for k in range(k_tiles):
                s = mbarrier.stage(k, num_stages)
                mbarrier.wait(full.ptr_to([s]), mbarrier.phase(k, num_stages))
                wgmma.fence()
                for kk in T.unroll(k_steps):
                    wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]),
                                                   As.ptr_to([s * a_tile + cw * wgmma.M * block_k + kk * 16]))
                    wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([s * b_tile + kk * 16]))
                    wgmma.mma_ss(block_n, dtype, acc, desc_a[0], desc_b[0])
                wgmma.commit()
                # NOTES: keep one group in flight; once it is down to one, tile k-1's wgmmas have read
                # their smem, so release that stage (the last stage is never released: nothing waits).
                wgmma.wait(1)
                if k > 0 and lane == 0:
                    mbarrier.arrive(empty.ptr_to([mbarrier.stage(k + num_stages - 1, num_stages)]))
            wgmma.wait(0)

            # Epilogue: this warpgroup's 64 x block_n slab as block_n/64 SW128 boxes of 64 x 64.
            cs_base = cw * wgmma.M * block_n
            for j in T.unroll(block_n // 8):
                for r in T.unroll(2):
                    T.evaluate(cvt_pack(packed[0], acc[wgmma.acc_index(j, r, 1)], acc[wgmma.acc_index(j, r, 0)]))
                    row = wgmma.acc_row(warp, lane, r)
                    col = wgmma.acc_col(lane, j)
                    box = j * 8 // store_cols
                    Cs[(cs_base + box * store_rows * store_cols
                        + tma.sw128_offset(row, col % store_cols, dtype)) // 2] = packed[0]
            tma.fence_proxy_async()
            T.cuda.warpgroup_sync(1 + cw)
            row0 = mt * block_m + cw * wgmma.M
            if ct == 0 and row0 < M:
                for box in range(block_n // store_cols):
                    # Boxes wholly past N are skipped rather than relying on a fully clipped store.
                    if nt * block_n + box * store_cols < N:
                        tma.store_2d(c_map, nt * block_n + box * store_cols, row0,
                                     Cs.ptr_to([(cs_base + box * store_rows * store_cols) // 2]))
                tma.store_commit()
                tma.store_wait(0)

    return fp16_bf16_gemm


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(dtype: str, M: int, N: int, K: int, layout: str = "nt", out_dtype: str | None = None,
                 epilogue: str = "none", bias_dtype: str | None = None, alpha: float = 1.0, beta: float = 0.0,
                 **_) -> dict:
    """Inputs and the (NaN-poisoned by the harness) output ``c``. Variants add ``layout`` / ``alpha`` /
    ``beta`` (plain values), a random ``bias`` and, where beta reads the output, a random ``c_in`` that
    ``launch`` copies into ``c`` first (the harness poisons ``c`` itself); both are scaled like the product
    (RMS ~ sqrt(K)) so that they matter."""
    g = _generator()
    t = _DTYPES[dtype]
    a = torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    b = torch.randn(*((N, K) if layout == "nt" else (K, N)), generator=g, device="cuda", dtype=torch.float32).to(t)
    ot = _OUT_DTYPES[out_dtype or dtype]
    c = torch.full((M, N), float("nan"), device="cuda", dtype=ot)
    data = {"a": a, "b": b, "c": c}
    if not is_variant(dtype, layout, out_dtype, epilogue):
        return data
    data["layout"] = layout
    scale = max(K, 1) ** 0.5
    if epilogue in ("bias", "alpha_beta_bias"):
        bias = torch.randn(N, generator=g, device="cuda", dtype=torch.float32) * scale
        data["bias"] = bias.to(_OUT_DTYPES[bias_dtype or dtype])
    if epilogue in ("alpha_beta", "alpha_beta_bias"):
        data["alpha"], data["beta"] = float(alpha), float(beta)
        if beta != 0:
            data["c_in"] = (torch.randn(M, N, generator=g, device="cuda", dtype=torch.float32) * scale).to(ot)
    return data


def reference(a, b, layout: str = "nt", bias=None, c_in=None, alpha: float = 1.0, beta: float = 0.0, **_) -> dict:
    """fp32 oracle: alpha * (a @ op(b)) + beta * c_in + bias."""
    r = a.float() @ (b.float().T if layout == "nt" else b.float())
    if alpha != 1.0:
        r = r * alpha
    if c_in is not None and beta != 0:
        r = r + beta * c_in.float()
    if bias is not None:
        r = r + bias.float()
    return {"c": r}


def launch(cfg: dict, data: dict) -> None:
    if "c_in" in data:  # beta reads the output: it must hold C_in (the harness poisoned it)
        data["c"].copy_(data["c_in"])
    if not is_variant(cfg["dtype"], cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue")):
        gemm_nt(data["a"], data["b"], out=data["c"], tile=cfg.get("tile"))
        return
    op = gemm_nn if data.get("layout") == "nn" else gemm_nt
    op(data["a"], data["b"], out=data["c"], bias=data.get("bias"), alpha=data.get("alpha", 1.0),
       beta=data.get("beta", 0.0), out_dtype=data["c"].dtype, tile=cfg.get("tile"))


def roofline(dtype: str, M: int, N: int, K: int, out_dtype: str | None = None, epilogue: str = "none",
             bias_dtype: str | None = None, beta: float = 0.0, **_) -> dict:
    elem = 2
    out_elem = 4 if out_dtype == "float32" else 2
    c_bytes = M * N * out_elem * (2 if epilogue in ("alpha_beta", "alpha_beta_bias") and beta != 0 else 1)
    bias_bytes = N * (4 if bias_dtype == "float32" else 2) if epilogue in ("bias", "alpha_beta_bias") else 0
    return {"bytes": (M * K + N * K) * elem + c_bytes + bias_bytes, "flops": 2 * M * N * K}


def get_baselines(**cfg) -> dict:
    plain = not is_variant(cfg["dtype"], cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue"))
    fp32_out = cfg.get("out_dtype") == "float32"
    out_t = _OUT_DTYPES[cfg.get("out_dtype") or cfg["dtype"]]

    def cublas():
        import torch.nn.functional as F

        if plain:
            return lambda data: {"c": F.linear(data["a"], data["b"])}

        def variant(data):
            # cuBLAS GEMM in the input dtype (fp32 GEMM of the upcast inputs for fp32 out), epilogue in fp32.
            a, b = (data["a"].float(), data["b"].float()) if fp32_out else (data["a"], data["b"])
            r = (F.linear(a, b) if data.get("layout", "nt") == "nt" else a @ b).float() * data.get("alpha", 1.0)
            if "c_in" in data:
                r = r + data["beta"] * data["c_in"].float()
            if "bias" in data:
                r = r + data["bias"].float()
            return {"c": r.to(out_t)}  # (the baseline sees the inputs only, not "c")

        return variant

    return {"cublas": cublas}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _fail(op: str, name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def _scalar(op: str, name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        _fail(op, name, "a finite Python float", repr(v))
    return float(v)


def _check_inputs(a, b, out, op: str = _OP, layout: str = "nt", bias=None, alpha=1.0, beta=0.0,
                  out_dtype=None, tile=None) -> tuple[float, float]:
    """Validate every argument (shape/dtype -> layout -> device); returns (alpha, beta) as floats."""
    checks.tensor(op, "a", a, dtypes=tuple(_DTYPES.values()), ndim=2, contiguous=True, cuda=False)
    checks.tensor(op, "b", b, ndim=2, cuda=False)
    checks.same_dtype(op, "a", a, b=b)
    if layout == "nt":
        checks.tensor(op, "b", b, shape=(None, a.shape[1]), contiguous=True, cuda=False)
        n = b.shape[0]
    else:
        checks.tensor(op, "b", b, shape=(a.shape[1], None), contiguous=True, cuda=False)
        n = b.shape[1]
    if out_dtype is not None and out_dtype not in (a.dtype, torch.float32):
        _fail(op, "out_dtype", f"None, {str(a.dtype).replace('torch.', '')} (the dtype of 'a') or float32",
              out_dtype)
    alpha = _scalar(op, "alpha", alpha)
    beta = _scalar(op, "beta", beta)
    if out is not None:
        checks.tensor(op, "out", out, shape=(a.shape[0], n), cuda=False)
        if out_dtype is None:
            checks.same_dtype(op, "a", a, out=out)
        elif out.dtype != out_dtype:
            _fail(op, "out", f"dtype {str(out_dtype).replace('torch.', '')} (out_dtype)",
                  str(out.dtype).replace("torch.", ""))
    elif beta != 0:
        _fail(op, "beta", "0 when 'out' is not given (beta != 0 reads out as C_in)", beta)
    if bias is not None:
        checks.tensor(op, "bias", bias, dtypes=(a.dtype, torch.float32), cuda=False)
        checks.tensor(op, "bias", bias, shape=(n,), cuda=False)
    if tile is not None and TILE_CONFIGS[tile].get("kind") == "gemv" and a.shape[0] > TILE_CONFIGS[tile]["tokens"]:
        _fail(op, "tile", f"a tile serving M = {a.shape[0]} rows of 'a' (a gemv tile serves M <= its "
              f"{TILE_CONFIGS[tile]['tokens']} tokens)", repr(tile))
    if tile is not None and TILE_CONFIGS[tile].get("kind") == "small_m" and n % 8:
        # (its reduction stores 4-column units: the last 1-7 columns of an odd N would be lost)
        _fail(op, "tile", f"a tile serving N = {n} (small-M tiles need N % 8 == 0)", repr(tile))
    if tile is not None and (TILE_CONFIGS[tile].get("kind") != "persistent" or TILE_CONFIGS[tile].get("stream_k")):
        od = out.dtype if out is not None else (out_dtype or a.dtype)
        if layout != "nt" or od != a.dtype or _epilogue(bias, alpha, beta) != "none":
            _fail(op, "tile", "a persistent tile without stream-K (layout nn, out_dtype float32, bias, alpha and "
                  "beta need the persistent kernel's epilogue)", repr(tile))
    checks.tensor(op, "a", a, cuda=True)
    others = {k: v for k, v in (("b", b), ("out", out), ("bias", bias)) if v is not None}
    checks.same_device(op, "a", a, **others)
    return alpha, beta


def _gemm(layout: str, a, b, out, bias, alpha, beta, out_dtype, tile):
    op = "gemm_" + layout
    if tile is not None and tile not in TILE_CONFIGS:
        raise checks.TirxInputError(f"{op}: argument 'tile': expected one of {sorted(TILE_CONFIGS)}, got {tile!r}")
    alpha, beta = _check_inputs(a, b, out, op, layout, bias, alpha, beta, out_dtype, tile)
    if runtime.direct_call(a, b, out, bias):
        # Eager: the kernel straight away, not through the custom op below (its dispatch costs more host time than
        # a small GEMM runs: runtime.direct_call). Without `out`, beta is 0 (checked above).
        return runtime.run_direct(lambda dst: _run(a, b, dst, tile, layout, bias, alpha, beta), out,
                                  lambda: _new_out(layout, a, b, out_dtype))
    if out is None:
        if layout == "nt":
            return torch.ops.tirx.gemm_nt(a, b, tile, bias, alpha, out_dtype)
        return torch.ops.tirx.gemm_nn(a, b, tile, bias, alpha, out_dtype)
    if layout == "nt":
        torch.ops.tirx.gemm_nt_out(a, b, out, tile, bias, alpha, beta)
    else:
        torch.ops.tirx.gemm_nn_out(a, b, out, tile, bias, alpha, beta)
    return out


def gemm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, bias: torch.Tensor | None = None,
            alpha: float = 1.0, beta: float = 0.0, out_dtype: torch.dtype | None = None,
            tile: str | None = None) -> torch.Tensor:
    """``alpha * (a @ b.T) + beta * out + bias`` for bf16/fp16 ``a`` (M, K), ``b`` (N, K), both contiguous;
    any M, N, K >= 0; fp32 accumulation.

    - ``out`` (M, N; unit column stride, any row stride): written when given; its dtype is
      ``out_dtype`` (default: ``a``'s dtype; ``torch.float32`` for an fp32 output).
    - ``bias`` (N,), ``a``'s dtype or float32: added to every row.
    - ``alpha`` / ``beta``: fp32 scalars. ``beta != 0`` reads ``out`` as C_in, so ``out`` must be given;
      ``beta == 0`` never reads it (it may hold NaN).
    - ``tile`` pins a ``TILE_CONFIGS`` entry instead of ``choose_tile``'s pick (for tuning and benchmarks).
      The plain call (no bias, alpha 1, beta 0, output in ``a``'s dtype) runs the plain kernel; the other
      forms need a persistent tile (``VARIANT_TILE`` unless pinned).
    """
    return _gemm("nt", a, b, out, bias, alpha, beta, out_dtype, tile)


def gemm_nn(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *, bias: torch.Tensor | None = None,
            alpha: float = 1.0, beta: float = 0.0, out_dtype: torch.dtype | None = None,
            tile: str | None = None) -> torch.Tensor:
    """``alpha * (a @ b) + beta * out + bias`` for bf16/fp16 ``a`` (M, K), ``b`` (K, N) row-major (N
    contiguous), both contiguous; any M, N, K. Same keyword arguments as :func:`gemm_nt`; always
    the persistent kernel (B is an MN-major wgmma operand)."""
    return _gemm("nn", a, b, out, bias, alpha, beta, out_dtype, tile)


def _epilogue(bias, alpha: float, beta: float) -> str:
    ab = alpha != 1.0 or beta != 0.0
    if bias is None:
        return "alpha_beta" if ab else "none"
    return "alpha_beta_bias" if ab else "bias"


# Stream-K tiles take a workspace, one partial tile per CTA and one flag per consumer warpgroup and CTA
# (gemm/_persistent.py, stream_k): the function cache appends it to their calls.
_STREAM_K_MAX_CTAS = 132
_WORKSPACE = runtime.StreamWorkspace(n_flags=2 * _STREAM_K_MAX_CTAS)


def workspace_floats(tile: str) -> int:
    """fp32 workspace a stream-K tile's launch needs: one block_m x block_n partial per CTA (0 for other tiles)."""
    cfg = TILE_CONFIGS[tile]
    if not cfg.get("stream_k"):
        return 0
    if cfg["num_sms"] > _STREAM_K_MAX_CTAS:
        raise ValueError(f"fp16_bf16_gemm: tile {tile!r}: the stream-K flags are sized for {_STREAM_K_MAX_CTAS} CTAs")
    return cfg["num_sms"] * cfg["block_m"] * cfg["block_n"]


def check_stream_k_residency(tile: str, sm_count: int) -> None:
    """Stream-K CTAs wait on each other's partials (flags), so all ``num_sms`` of them must be resident at once:
    on a part with fewer SMs (H100 PCIe: 114; H20; a MIG slice) the launch would deadlock. Refuse instead."""
    need = TILE_CONFIGS[tile].get("num_sms", 0)
    if TILE_CONFIGS[tile].get("stream_k") and sm_count < need:
        raise checks.TirxInputError(
            f"gemm: argument 'tile': expected a tile whose CTAs all fit this GPU ({sm_count} SMs), got stream-K tile "
            f"{tile!r}, which needs {need} CTAs resident at once")


def _with_workspace(fn, params: dict):
    """``fn`` itself, or for a stream-K tile ``fn`` with this device and stream's workspace and flags appended
    (after checking, once per device, that the device can hold every CTA of the tile at once)."""
    floats = workspace_floats(params["tile"])
    if not floats:
        return fn
    checked: set = set()

    def call(a, *args):
        if a.device.index not in checked:
            check_stream_k_residency(params["tile"], torch.cuda.get_device_properties(a.device).multi_processor_count)
            checked.add(a.device.index)
        return fn(a, *args, *_WORKSPACE.get(a.device, floats))

    return call


_FUNCTIONS = runtime.FunctionCache(__name__, bind=_with_workspace)


def _out_cols(layout: str, b) -> int:
    """N: B's rows for NT, its columns for NN."""
    return b.shape[0] if layout == "nt" else b.shape[1]


def _new_out(layout: str, a: torch.Tensor, b: torch.Tensor, out_dtype) -> torch.Tensor:
    """The (M, N) output a call without ``out`` returns."""
    return torch.empty((a.shape[0], _out_cols(layout, b)), dtype=out_dtype or a.dtype, device=a.device)


def _tma_rows(t: torch.Tensor) -> bool:
    """Whether a TMA tensor map can address ``t``'s rows: base and row stride multiples of 16 bytes."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def _run(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tile: str | None = None, layout: str = "nt",
         bias: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> None:
    op = "gemm_" + layout
    M, K = a.shape
    N = out.shape[1]
    if M == 0 or N == 0:
        return
    if K == 0:  # a tensor map cannot have a zero extent: out = beta * out + bias
        if beta == 0:
            out.zero_()
        else:
            out.mul_(beta)
        if bias is not None:
            out.add_(bias)
        return
    # The odd-shape plan (docs/gemm.md "Any M, N, K"). TMA needs 16-byte row strides: K % 8 pads A and B along K
    # with zeros (they add nothing; a copy of both operands, for a shape no model has); NN pads B's N columns (its
    # rows), so the kernel's N is then a multiple of 8 and its C the padded output below.
    if K % 8:
        a = torch.nn.functional.pad(a, (0, -K % 8))
        b = torch.nn.functional.pad(b, (0, -K % 8) if layout == "nt" else (0, 0, 0, -K % 8))
    if layout == "nn" and N % 8:
        b = torch.nn.functional.pad(b, (0, -N % 8))
    checks.aligned(op, "a", a)
    checks.aligned(op, "b", b)
    epilogue = _epilogue(bias, alpha, beta)
    name = {t: str(t).replace("torch.", "") for t in (a.dtype, out.dtype)}
    store = c_store(name[a.dtype], M, N, a.shape[1], tile, layout, name[out.dtype], epilogue, _tma_rows(out))
    if store == "tma" and (N % 8 or not _tma_rows(out)):
        # C rows not 16-byte aligned and no "stg" kernel for the call (a variant, or a gemv tile at M <= 8): the
        # kernel writes a 16-byte-aligned padded output (NT: a view of its first N columns, so the kernel's N is
        # N), copied into out after (one extra pass over C).
        n_kernel = _out_cols(layout, b)
        padded = torch.empty((M, -(-N // 8) * 8), dtype=out.dtype, device=out.device)
        dst = padded[:, :n_kernel]
        if beta != 0:
            dst[:, :N].copy_(out)
        if bias is not None and n_kernel != N:
            bias = torch.nn.functional.pad(bias, (0, n_kernel - N))
        _launch(op, a, b, dst, tile, layout, bias, alpha, beta, epilogue, "tma")
        out.copy_(padded[:, :N])
        return
    if store == "tma":
        checks.aligned(op, "out", out)
    _launch(op, a, b, out, tile, layout, bias, alpha, beta, epilogue, store)


def _launch(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tile: str | None, layout: str,
            bias: torch.Tensor | None, alpha: float, beta: float, epilogue: str, store: str) -> None:
    """The kernel call on operands the tensor maps can address (K % 8 == 0; C rows 16-byte aligned unless
    ``store`` is "stg")."""
    M, K = a.shape
    N = out.shape[1]
    bias_dtype = None if bias is None else bias.dtype

    def params_of():
        return compile_params(dtype=str(a.dtype).replace("torch.", ""), M=M, N=N, K=K, tile=tile, layout=layout,
                              out_dtype=str(out.dtype).replace("torch.", ""), epilogue=epilogue,
                              bias_dtype=None if bias is None else str(bias_dtype).replace("torch.", ""),
                              c_store=store)

    # What picks the kernel: the tile (choose_tile of M, N, K unless pinned), the variant and the C store; the device
    # for the arch check. One dict lookup per call after the first (runtime.FunctionCache).
    fn = _FUNCTIONS.get((layout, a.dtype, out.dtype, bias_dtype, epilogue, M, N, K, tile, store, a.get_device()),
                        params_of, a.device)
    args = [a, b, out]
    if bias is not None:
        args.append(bias)
    if epilogue in ("alpha_beta", "alpha_beta_bias"):
        args += [alpha, beta]
    fn(*args)


def _register(layout: str):
    """``tirx::gemm_{layout}`` (returns a new tensor) and ``tirx::gemm_{layout}_out`` (writes ``out``)."""
    name = "gemm_" + layout

    @torch.library.custom_op(f"tirx::{name}", mutates_args=(),
                             schema="(Tensor a, Tensor b, str? tile=None, Tensor? bias=None, float alpha=1.0, "
                                    "ScalarType? out_dtype=None) -> Tensor")
    def functional(a, b, tile=None, bias=None, alpha=1.0, out_dtype=None):
        out = _new_out(layout, a, b, out_dtype)
        _run(a, b, out, tile, layout, bias, alpha, 0.0)
        return out

    @functional.register_fake
    def _(a, b, tile=None, bias=None, alpha=1.0, out_dtype=None):
        return a.new_empty((a.shape[0], _out_cols(layout, b)), dtype=out_dtype or a.dtype)

    @torch.library.custom_op(f"tirx::{name}_out", mutates_args=("out",),
                             schema="(Tensor a, Tensor b, Tensor(a!) out, str? tile=None, Tensor? bias=None, "
                                    "float alpha=1.0, float beta=0.0) -> ()")
    def with_out(a, b, out, tile=None, bias=None, alpha=1.0, beta=0.0):
        _run(a, b, out, tile, layout, bias, alpha, beta)

    @with_out.register_fake
    def _(a, b, out, tile=None, bias=None, alpha=1.0, beta=0.0):
        return None

    return functional, with_out


_gemm_nt_op, _gemm_nt_out_op = _register("nt")
_gemm_nn_op, _gemm_nn_out_op = _register("nn")


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
