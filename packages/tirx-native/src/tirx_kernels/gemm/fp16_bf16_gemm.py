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
loads of B, M <= 16), ``ws_*`` (``gemm/_ws.py``: the non-persistent kernel above). ``packages/tirx-native/docs/gemm.md``
tells how each got its place in the table, with the measurements.

Measured: the same design in examples/gemm_ws_pipelined.py ran at 646-688 TFLOP/s at 4096³ on the H200
against cuBLAS 678-773 in the same rounds, bit-identical to torch.

This module is the registered kernel (KERNEL_META, CONFIGS, the public ops and their custom ops); the rest lives
beside it by role: ``_tiles.py`` (TILE_CONFIGS), ``_tile_table.py`` (TILE_TABLE, choose_tile), ``_select.py``
(compile params, bundle artifacts, get_kernel), ``_inputs.py`` (argument checks), ``_host.py`` (odd-shape plan,
kernel call, stream-K workspace), ``_protocol.py`` (data, oracle, roofline, baselines).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.gemm._host import (  # noqa: F401 (re-exported: the module's public names)
    _new_out,
    _out_cols,
    _run,
    check_stream_k_residency,
    workspace_floats,
)
from tirx_kernels.gemm._inputs import _check_inputs
from tirx_kernels.gemm._protocol import get_baselines, launch, prepare_data, reference, roofline  # noqa: F401
from tirx_kernels.gemm._select import (  # noqa: F401
    artifact_params,
    c_store,
    call_samples,
    compile_params,
    general_params,
    get_kernel,
    is_variant,
    sass_expect,
    stg_serves,
    variant_combinations,
)
from tirx_kernels.gemm._tile_table import TILE_TABLE, choose_tile  # noqa: F401
from tirx_kernels.gemm._tiles import (  # noqa: F401
    EPILOGUES,
    EVICT_FIRST_TWINS,
    GEMV_TILES,
    LAYOUTS,
    PDL,
    STG_TILE,
    TILE_CONFIGS,
    VARIANT_TILE,
    cluster_ctas,
)

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


# ---------------------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------------------

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
