# SPDX-License-Identifier: Apache-2.0
"""The persistent GEMM tiles (gemm/_persistent.py) build on the CPU with the SASS they promise (every tile,
also any no CONFIGS row pins, which test_build_kernels would not reach); the ``epi_cols`` staging rounds."""


import pytest

from tirx_kernels.core import testing
from tirx_kernels.gemm import _persistent
from tirx_kernels.gemm import fp16_bf16_gemm as mod

pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")

PERSISTENT = [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "persistent"]


def test_persistent_tiles_fit_smem():
    for tile in PERSISTENT:
        c = mod.TILE_CONFIGS[tile]
        nbytes = _persistent.smem_bytes("bfloat16", c["block_m"], c["block_n"], c["block_k"], c["num_stages"],
                                        epi_cols=c.get("epi_cols"))
        assert nbytes <= _persistent.SMEM_LIMIT, (tile, nbytes)


@pytest.mark.parametrize("bad", [
    {"block_n": 320}, {"block_m": 64}, {"num_stages": 4}, {"cluster_m": 3}, {"group_m": 3, "cluster_m": 2},
    # epi_cols: a multiple of 64 dividing block_n (256), and the smem must still fit.
    {"epi_cols": 96}, {"epi_cols": 32}, {"epi_cols": 0}, {"epi_cols": 512}, {"epi_cols": 128.0},
    {"block_n": 192, "epi_cols": 128}, {"num_stages": 5, "epi_cols": 128},
    # block_n a multiple of 16, not 64: the plain NT kernel only, epi_cols dividing 192.
    {"block_n": 232}, {"block_n": 200}, {"block_n": 224, "layout": "nn"}, {"block_n": 224, "out_dtype": "float32"},
    {"block_n": 224, "epilogue": "bias", "bias_dtype": "bfloat16"}, {"block_n": 176, "epilogue": "alpha_beta"},
    {"block_n": 224, "epi_cols": 128},
    # 1 x 2 and 2 x 2 clusters and the per-warpgroup release
    {"cluster_n": 3}, {"cluster_n": 2, "cluster_m": 3}, {"cluster_n": 4, "cluster_m": 1},
    {"cluster_n": 2, "cluster_m": 2, "num_sms": 3}, {"release": "thread"},
    # stream-K: the plain unclustered NT kernel only
    {"stream_k": True, "cluster_m": 2}, {"stream_k": True, "cluster_n": 2, "cluster_m": 1},
    {"stream_k": True, "cluster_n": 2, "cluster_m": 2},
    {"stream_k": True, "layout": "nn"}, {"stream_k": True, "out_dtype": "float32"},
    {"stream_k": True, "epilogue": "bias", "bias_dtype": "bfloat16"},
    # L2 priorities of the operand loads: createpolicy's, by name
    {"load_priority": "evict_sometimes"}, {"load_priority": "L2::evict_first"},
])
def test_persistent_rejects_bad_params(bad):
    params = {**{k: v for k, v in mod.TILE_CONFIGS["persistent_128x256x64_s3_g8"].items() if k != "kind"}, **bad}
    with pytest.raises(ValueError):
        _persistent.build_persistent_kernel("bfloat16", **params)


def test_block_n_224_stages_192_columns():
    # The staging tile holds the 192 TMA-stored columns (3 boxes); the last 32 go from registers.
    assert _persistent.staged_cols(224) == 192 and _persistent.staged_cols(256) == 256
    assert _persistent.smem_bytes("bfloat16", 128, 224, 64, 4) == 4 * (128 + 224) * 128 + 128 * 192 * 2 + 64
    _persistent.build_persistent_kernel("bfloat16", **{**{k: v for k, v in mod.TILE_CONFIGS[
        "persistent_128x256x64_s3_g8"].items() if k != "kind"}, "block_n": 224, "epi_cols": 64})


def test_epi_cols_smem():
    # 128x256: 4 x 48 KB ring + 128 x 128 x 2 B staging + 8 ring barriers; without epi_cols 4 stages overflow.
    assert _persistent.smem_bytes("bfloat16", 128, 256, 64, 4, epi_cols=128) == 4 * 48 * 1024 + 32 * 1024 + 64
    assert _persistent.smem_bytes("bfloat16", 128, 256, 64, 4) > _persistent.SMEM_LIMIT
    assert _persistent.smem_bytes("bfloat16", 128, 256, 64, 3, epi_cols=256) == \
        _persistent.smem_bytes("bfloat16", 128, 256, 64, 3)


def _codegen(tile, **kw):
    from tirx_kernels.core import build

    params = {k: v for k, v in mod.TILE_CONFIGS[tile].items() if k != "kind"}
    return build.codegen(_persistent.build_persistent_kernel("bfloat16", **{**params, **kw}))


def test_epi_cols_block_n_is_the_default_kernel():
    """epi_cols = block_n is one round: the same generated CUDA as no epi_cols (today's kernel)."""
    assert _codegen("persistent_128x256x64_s3_g8", epi_cols=256) == _codegen("persistent_128x256x64_s3_g8")
    assert _codegen("persistent_128x128x64_s6_g8", epi_cols=128, out_dtype="float32") == \
        _codegen("persistent_128x128x64_s6_g8", out_dtype="float32")


_WAIT_READ = "tvm_builtin_ptx_cp_async_bulk_wait_group_async_bulk_wait_group_read_0();"


@pytest.mark.parametrize("kw, rounds", [
    ({}, 2),  # 256 columns in 2 rounds of 128
    ({"out_dtype": "float32"}, 4),  # 256 fp32 columns in 4 passes of 64
    ({"epilogue": "alpha_beta_bias", "bias_dtype": "bfloat16"}, 2),
    ({"epi_cols": 64}, 4),
])
def test_epi_cols_rounds(kw, rounds):
    """Each round of a 128x256 s4 e128 epilogue starts with the storing thread's wait for the previous stores to
    have read the staging tile (one call site per round: the rounds are unrolled) and ends in a commit."""
    src = _codegen("persistent_128x256x64_s3_g8", **{"num_stages": 4, "epi_cols": 128, **kw})
    body = src[src.index("fp16_bf16_gemm_persistent_kernel("):]
    assert body.count(_WAIT_READ) == rounds
    # The C staging tile is 128 x epi_cols 16-bit elements: the barriers follow it in the pool.
    epi = kw.get("epi_cols", 128)
    ring = 4 * (128 + 256) * 64 * 2
    assert f"[(s_ptr[0] + {(ring + 128 * epi * 2) // 8})]" in body  # full[s] in the producer's loads


@pytest.mark.parametrize("tile", PERSISTENT)
def test_persistent_tile_builds(tile):

    sass = testing.build_and_check_sass(mod, "fp16_bf16_gemm", {"dtype": "bfloat16", "tile": tile})
    if mod.cluster_ctas(tile) == 2:
        assert "UTMALDG.2D.MULTICAST" in sass


def _device_code(tile, **overrides):
    """The device source of ``tile``'s kernel, its compile params overridden (e.g. ``release``)."""
    from tirx_kernels.core import build
    from tirx_kernels.gemm import _pingpong

    params = {k: v for k, v in {**mod.TILE_CONFIGS[tile], **overrides}.items() if k != "kind"}
    kind = mod.TILE_CONFIGS[tile].get("kind")
    builder = _pingpong.build_pingpong_kernel if kind == "pingpong" else _persistent.build_persistent_kernel
    src = build.codegen(builder("bfloat16", **params))
    return src[src.index('extern "C" __global__'):]


@pytest.mark.parametrize("tile, overrides, arrivals, releasers", [
    ("persistent_128x128x64_s6_c2_g8", {}, 16, "lane_ptr[0] == 0"),  # lane 0 of 8 warps x 2 CTAs
    ("persistent_128x128x64_s6_c2_g8", {"release": "warpgroup"}, 4,
     "(lane_ptr[0] == 0) && (warp_ptr[0] < 2)"),  # 2 warpgroups x 2 CTAs
    ("persistent_128x128x64_s6_g8", {"release": "warpgroup"}, 2, "(lane_ptr[0] == 0) && (warp_ptr[0] < 1)"),
    ("pingpong_128x128x64_s6_e64_g8", {"release": "warpgroup", "cluster_n": 2}, 2,
     "(lane_ptr[0] == 0) && (warp_ptr[0] < 2)"),  # ping-pong: 1 warpgroup reads a use, x 2 CTAs
    ("persistent_128x128x64_s6_c2x2_g8_wg", {}, 8, "(lane_ptr[0] == 0) && (warp_ptr[0] < 4)"),  # 2 wgs x 4 CTAs
    ("persistent_128x128x64_s6_c2x2_g8_wg", {"release": "warp"}, 32, "lane_ptr[0] == 0"),  # 8 warps x 4 CTAs
    ("pingpong_128x192x64_s4_e64_c2x2_g8_wg", {}, 4, "(lane_ptr[0] == 0) && (warp_ptr[0] < 4)"),  # 1 wg x 4 CTAs
])
def test_ring_release_arrival_counts(tile, overrides, arrivals, releasers):
    """The empty barriers count exactly the arrivals the consumers make: one per warp and CTA (``release``
    "warp"), or one per warpgroup and CTA ("warpgroup": lane 0 of warp r arrives in CTA r)."""
    dev = _device_code(tile, **overrides)
    stages = mod.TILE_CONFIGS[tile]["num_stages"]
    # the ring's inits: num_stages full barriers of 1 arrival, num_stages empty ones of `arrivals`
    assert dev.count("mbarrier_init_init_shared__cta_b64(") == 2 * stages
    assert dev.count(f"(uint){arrivals});") == stages
    assert f"if ({releasers}) {{" in dev


def test_1x2_cluster_multicasts_a_not_b():
    """``cluster_n=2``: each CTA loads 64 of A's 128 rows and multicasts them (A's box is 64 rows); B is its
    own N-tile, loaded plainly."""
    dev = _device_code("persistent_128x128x64_s6_c2n_g8_wg")
    loads = [line for line in dev.splitlines() if "cp_async_bulk_tensor_g2s" in line and "(&(a_map))" in line]
    assert loads and all("multicast" in line and "(ushort)3" in line for line in loads)
    loads = [line for line in dev.splitlines() if "cp_async_bulk_tensor_g2s" in line and "(&(b_map))" in line]
    assert loads and not any("multicast" in line for line in loads)
    from tirx_kernels.core import build

    assert "cudaLaunchAttributeClusterDimension" in build.codegen(
        mod.get_kernel("bfloat16", "persistent_128x128x64_s6_c2n_g8_wg"))


@pytest.mark.parametrize("tile, layout", [("persistent_128x128x64_s6_c2x2_g8_wg", "nt"),
                                          ("persistent_128x128x64_s6_c2x2_g8_wg", "nn"),
                                          ("persistent_128x256x64_s3_c2x2_g8_wg", "nt"),
                                          ("pingpong_128x192x64_s4_e64_c2x2_g8_wg", "nt")])
def test_2x2_cluster_multicasts_half_of_a_and_half_of_b(tile, layout):
    """``cluster_m = cluster_n = 2``: CTA rank = 2 * rank_n + rank_m loads A rows slice rank_n into the CTAs of its
    M-tile (ranks rank_m, rank_m + 2: mask 5 << rank_m) and B slice rank_m into those of its N-tile (ranks 2 * rank_n,
    2 * rank_n + 1: mask 3 << 2 * rank_n); every load is a multicast; the launch is of 4-CTA clusters, and the grid
    never more than num_sms / 4 = 30 of them."""
    from tirx_kernels.core import build

    params = {"layout": layout} if layout != "nt" else {}
    dev = _device_code(tile, **params)
    loads = {m: [line for line in dev.splitlines() if "cp_async_bulk_tensor_g2s" in line and f"(&({m}_map))" in line]
             for m in ("a", "b")}
    assert loads["a"] and all("multicast" in line and "((ushort)(5 << (rank_ptr[0] & 1)))" in line
                              for line in loads["a"])
    assert loads["b"] and all("multicast" in line and "((ushort)(3 << ((rank_ptr[0] >> 1) * 2)))" in line
                              for line in loads["b"])
    # the slices: A rows from (rank >> 1) * 64, B rows (NT) / N-columns (NN) from (rank & 1) * block_n / 2
    half_n = mod.TILE_CONFIGS[tile]["block_n"] // 2
    assert all("((rank_ptr[0] >> 1) * 64)" in line for line in loads["a"])
    assert all(f"((rank_ptr[0] & 1) * {half_n})" in line for line in loads["b"]) if layout == "nt" else True
    host = build.codegen(mod.get_kernel("bfloat16", tile, **params))
    assert "cudaLaunchAttributeClusterDimension" in host and "auto cuda_arg_6 = 4;" in host
    assert mod.cluster_ctas(tile) == 4 and _persistent.ClusterGrid(128, half_n * 2, 8, 2, 2, 120).clusters_max == 30


@pytest.mark.parametrize("tile", ["persistent_128x128x64_s6_g8", "persistent_128x256x64_s4_e128_c2_g8",
                                  "pingpong_128x192x64_s4_e64_g8"])
def test_lean_consumer_loop(tile):
    """The consumers encode each operand's descriptor once (stage 0) and advance it inside the loop; no use-count
    division in the loop (the ring cursor); the producer prefetches the three tensor maps."""
    dev = _device_code(tile)
    assert dev.count("ptx_wgmma_encode_matrix_descriptor(") == 2
    assert dev.count("prefetch_tensormap") == 3
    nvcc_loop = dev[dev.index("wgmma_fence_fence_sync_aligned()"):dev.index("wait_group_sync_aligned_0()")]
    assert " % " not in nvcc_loop and " / " not in nvcc_loop


def test_sweep_offers_every_persistent_tile():
    """tools/gemm_sweep.py times every persistent tile (TILE_TABLE's and the candidates) above the small-M cutoff."""
    sweep = testing.load_tool("gemm_sweep", __file__)
    for m in (sweep.SMALL_M + 1, 512, 1024, 8192):
        assert set(PERSISTENT) <= set(sweep.candidate_tiles(m)), m
    assert not set(PERSISTENT) & set(sweep.candidate_tiles(sweep.SMALL_M))


def test_default_kernels_are_programmatic_dependent_launches():
    """Sweep round 10's default: the persistent, ping-pong and small-M kernels wait for the previous kernel
    (griddepcontrol.wait) and are launched with the PDL attribute, cluster dims kept; ``pdl=None`` pins a plain
    launch."""
    from tirx_kernels.core import build

    for tile in ("persistent_128x256x64_s3_c2_g8", "pingpong_128x128x64_s6_e64_g8", "smallm_128x64x64_s8_k2"):
        src = build.codegen(mod.get_kernel("bfloat16", tile))
        assert "programmaticStreamSerializationAllowed = 1" in src and "griddepcontrol.wait" in src, tile
        assert ("cudaLaunchAttributeClusterDimension" in src) == (mod.cluster_ctas(tile) == 2
                                                                  or mod.TILE_CONFIGS[tile].get("split_k", 1) > 1)
    plain = build.codegen(mod.get_kernel("bfloat16", "persistent_128x256x64_s3_c2_g8", pdl=None))
    assert "programmaticStreamSerialization" not in plain and "griddepcontrol" not in plain


def test_stream_k_kernel_takes_workspace_and_flags():
    """The stream-K kernel's arguments add the workspace and the flags, and its consumers publish / acquire them;
    the plain kernel has none of it (its generated code is unchanged by the stream-K parameter)."""
    sk = _device_code("persistent_128x128x64_s6_g8_sk")
    plain = _device_code("persistent_128x128x64_s6_g8")
    for s in ("Flags_ptr", "WS_ptr", "tvm_builtin_ptx_fence_acq_rel_gpu()", "tvm_builtin_ptx_ld_acquire_gpu_global",
              "tvm_builtin_ptx_st_relaxed_gpu_global_b32_s32", "tvm_builtin_ptx_ld_vec_global_cg_v4_f32"):
        assert s in sk and s not in plain, s
    # One flag per consumer warpgroup and CTA: published at cta * 2 + cw, waited on at c2 * 2 + cw.
    assert "Flags_ptr[((((int)blockIdx.x) * 2) + cw_ptr[0])]" in sk and "Flags_ptr[((c2 * 2) + cw_ptr[0])]" in sk


_LOAD = "async_bulk_tensor_2d_shared__cluster_global_tile_mbarrier__complete_tx__bytes"


@pytest.mark.parametrize("tile", ["persistent_128x128x64_s6_g8", "persistent_128x256x64_s4_e128_c2_g8",
                                  "persistent_128x128x64_s6_c2n_g8_wg"])
def test_load_priority_hints_every_operand_load(tile):
    """load_priority: one createpolicy in the producer and the hint on every A/B load call (multicast ones too);
    without it no load carries a hint (the plain kernels' generated code is unchanged: tools/codegen_hashes.py)."""
    import re

    plain = _codegen(tile)
    hinted = _codegen(tile, load_priority="evict_first")
    calls = re.compile(rf"tvm_builtin_ptx\w*{_LOAD}\w*\((?!uint)")  # call sites, not the helpers' definitions
    assert "cache_hint" not in plain and "createpolicy" not in plain
    n_plain = len(calls.findall(plain))
    hinted_calls = calls.findall(hinted)
    assert n_plain >= 2 and len(hinted_calls) == n_plain
    assert all("L2__cache_hint" in c for c in hinted_calls)
    assert hinted.count("createpolicy.fractional.L2::evict_first.b64") == 1
    assert len(re.findall(r"createpolicy_fractional\w*\((?!uint)", hinted)) == 1  # one call, before the producer loop
