# SPDX-License-Identifier: Apache-2.0
"""``fp16_bf16_gemm``'s tile configurations: every tile a call can pick or pin (``TILE_CONFIGS``: the plain "ws"
kernel, ``persistent_*``, ``pingpong_*``, ``smallm_*``, ``gemv_*`` and their "_ef" twins), the dtypes, the variant
values and the default tiles of the variants and of unaligned C rows. ``_tile_table.py`` picks among them."""

from __future__ import annotations

import torch

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_OUT_DTYPES = {**_DTYPES, "float32": torch.float32}
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
    # its first K-step (fp32 workspace and flags from _host._run). Built for the rows where waves cost: one
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


def cluster_ctas(tile: str) -> int:
    """CTAs per cluster of ``tile`` (2x1 or 1x2 clusters: 2; 2x2: 4; otherwise 1)."""
    cfg = TILE_CONFIGS[tile]
    return cfg.get("cluster_m", 1) * cfg.get("cluster_n", 1)
