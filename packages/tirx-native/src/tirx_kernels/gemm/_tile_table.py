# SPDX-License-Identifier: Apache-2.0
"""``fp16_bf16_gemm``'s tile heuristic: ``TILE_TABLE`` (first matching row wins, each row with the measurements that
put it there) and ``choose_tile``. The tiles themselves: ``_tiles.py``."""

from __future__ import annotations

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


def choose_tile(M: int, N: int, K: int) -> str:
    for max_m, max_n, max_k, tile, *n_div in TILE_TABLE:
        if ((max_m is None or M <= max_m) and (max_n is None or N <= max_n) and (max_k is None or K <= max_k)
                and (not n_div or N % n_div[0] == 0)):
            return tile
    raise AssertionError("TILE_TABLE has no catch-all row")
