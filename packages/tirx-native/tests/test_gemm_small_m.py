# SPDX-License-Identifier: Apache-2.0
"""The small-M split-K cluster GEMM tiles (gemm/_small_m.py) build on the CPU with the SASS they promise
(wgmma shape, TMA loads, cluster barrier and DSMEM loads when split, 0 spills / 0 stack), their parameters
are validated, they fit in shared memory, and the K-slice / reduction-share arithmetic covers everything
exactly once. Numerics are the GPU suite's job (every CONFIGS row pins one of these tiles)."""


import pytest

from tirx_kernels.core import testing
from tirx_kernels.gemm import _small_m
from tirx_kernels.gemm import fp16_bf16_gemm as mod

SMALL_M = [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "small_m"]


def _params(tile):
    return {k: v for k, v in mod.TILE_CONFIGS[tile].items() if k != "kind"}


def test_small_m_tiles_exist_and_fit_smem():
    assert len(SMALL_M) >= 4
    for tile in SMALL_M:
        p = _params(tile)
        nbytes = _small_m.smem_bytes("bfloat16", p["block_m"], p["block_n"], p["block_k"], p["num_stages"])
        assert nbytes <= _small_m.SMEM_LIMIT, (tile, nbytes)
        # The fp32 partial tile reuses the ring: it must fit inside the region before the barriers.
        assert _small_m.partial_bytes(p["block_m"], p["block_n"]) <= nbytes - 2 * p["num_stages"] * 8
        _small_m.check_params("bfloat16", **p)


def test_small_m_configs_pin_small_m_tiles():
    pinned = {c["tile"] for c in mod.CONFIGS if c.get("tile") in SMALL_M}
    assert len(pinned) >= 4
    for c in mod.CONFIGS + mod.BENCH_CONFIGS:
        if c.get("tile") in SMALL_M:
            assert c["N"] % 8 == 0 and c["K"] % 8 == 0, c


@pytest.mark.parametrize("bad", [
    {"block_m": 96}, {"block_m": 256}, {"block_n": 320}, {"block_n": 80}, {"block_n": 32}, {"block_k": 32},
    {"block_k": 192}, {"split_k": 3}, {"split_k": 16}, {"num_stages": 1}, {"num_stages": 12},
    {"block_n": 256, "num_stages": 6},
])
def test_small_m_rejects_bad_params(bad):
    params = {**_params("smallm_64x128x64_s8_k4"), **bad}
    with pytest.raises(ValueError):
        _small_m.build_small_m_kernel("bfloat16", **params)


def test_small_m_rejects_bad_dtype():
    with pytest.raises(ValueError):
        _small_m.build_small_m_kernel("float32", **_params("smallm_64x128x64_s8_k4"))


@pytest.mark.parametrize("split_k", _small_m.SPLITS)
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 7, 16, 17, 64, 112, 224, 449])
def test_k_slices_partition_the_k_tiles(split_k, k_tiles):
    seen = []
    for rank in range(split_k):
        first, count = _small_m.k_slice(rank, k_tiles, split_k)
        assert count >= 0
        seen += list(range(first, first + count))
    assert seen == list(range(k_tiles))  # in rank order, contiguous, each once
    counts = [_small_m.k_slice(r, k_tiles, split_k)[1] for r in range(split_k)]
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("split_k", _small_m.SPLITS)
@pytest.mark.parametrize("rows, cols", [(1, 128), (1, 8), (37, 128), (37, 8), (64, 256), (100, 24), (128, 128)])
def test_reduction_shares_cover_each_unit_once(split_k, rows, cols):
    units = rows * (cols // _small_m.UNIT)
    seen = []
    for rank in range(split_k):
        first, last, _ = _small_m.unit_share(units, rank, split_k)
        seen += list(range(first, max(first, last)))
    assert seen == list(range(units))


@pytest.mark.parametrize("tile", SMALL_M)
def test_small_m_cluster_launch_in_host_code(tile):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    from tirx_kernels.core import build

    src = build.codegen(mod.get_kernel("bfloat16", tile))
    split_k = mod.TILE_CONFIGS[tile]["split_k"]
    assert ("cudaLaunchAttributeClusterDimension" in src) == (split_k > 1)
    if split_k > 1:
        assert "mapa.shared::cluster.u32" in src and "ld.shared::cluster.v4.f32" in src
        assert "val.clusterDim.x" in src


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("tile", SMALL_M)
def test_small_m_tile_builds(tile, dtype):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    sass = testing.build_and_check_sass(mod, "fp16_bf16_gemm", {"dtype": dtype, "tile": tile})
    if mod.TILE_CONFIGS[tile]["split_k"] == 1:
        assert "UCGABAR" not in sass
