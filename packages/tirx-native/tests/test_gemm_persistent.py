# SPDX-License-Identifier: Apache-2.0
"""The persistent GEMM tiles (gemm/_persistent.py) build on the CPU with the SASS they promise: also the
tiles no CONFIGS row pins yet (2-CTA cluster, 128x128), which test_build_kernels does not reach."""


import pytest

from tirx_kernels.core import testing
from tirx_kernels.gemm import _persistent
from tirx_kernels.gemm import fp16_bf16_gemm as mod

pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")

PERSISTENT = [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "persistent"]


def test_persistent_tiles_fit_smem():
    for tile in PERSISTENT:
        c = mod.TILE_CONFIGS[tile]
        nbytes = _persistent.smem_bytes("bfloat16", c["block_m"], c["block_n"], c["block_k"], c["num_stages"])
        assert nbytes <= _persistent.SMEM_LIMIT, (tile, nbytes)


@pytest.mark.parametrize("bad", [
    {"block_n": 320}, {"block_m": 64}, {"num_stages": 4}, {"cluster_m": 3}, {"group_m": 3, "cluster_m": 2},
])
def test_persistent_rejects_bad_params(bad):
    params = {**{k: v for k, v in mod.TILE_CONFIGS["persistent_128x256x64_s3_g8"].items() if k != "kind"}, **bad}
    with pytest.raises(ValueError):
        _persistent.build_persistent_kernel("bfloat16", **params)


@pytest.mark.parametrize("tile", PERSISTENT)
def test_persistent_tile_builds(tile):

    sass = testing.build_and_check_sass(mod, "fp16_bf16_gemm", {"dtype": "bfloat16", "tile": tile})
    if mod.TILE_CONFIGS[tile]["cluster_m"] == 2:
        assert "UTMALDG.2D.MULTICAST" in sass
