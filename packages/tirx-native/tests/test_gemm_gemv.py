# SPDX-License-Identifier: Apache-2.0
"""The skinny mma.sync GEMM tiles (gemm/_gemv.py) build on the CPU with the SASS they promise (HMMA.16816 with
an fp32 accumulator, L1-bypassing 16-byte B loads, 16-bit stores, 0 spills / 0 stack, no TMA or wgmma), their
parameters are validated, and the fragment mapping takes every K-column of a step exactly once. Numerics are
the GPU suite's job (CONFIGS rows pin these tiles on ragged shapes)."""

import pytest

from tirx_kernels.core import testing
from tirx_kernels.gemm import _gemv
from tirx_kernels.gemm import fp16_bf16_gemm as mod

GEMV = [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "gemv"]


def _params(tile):
    return {k: v for k, v in mod.TILE_CONFIGS[tile].items() if k != "kind"}


def test_fragment_words_take_each_k_column_of_a_step_once():
    # Lane q's 16-byte load holds K-columns 8q .. 8q + 7 as 4 words (pairs); mma s takes words fragment_words(s).
    seen = []
    for s in range(2):
        for q in range(4):
            for w in _gemv.fragment_words(s):
                seen += [8 * q + 2 * w, 8 * q + 2 * w + 1]
    assert sorted(seen) == list(range(_gemv.K_STEP))
    # A (B rows) and B (tokens) of one mma see the same K-columns in the same places: the same words.
    assert _gemv.fragment_words(0) != _gemv.fragment_words(1)


def test_fragment_mapping_computes_the_product():
    """Model one 32-column step of one warp as the hardware reads it (PTX ISA, mma.m16n8k16 fragments: A row
    g / g + 8, columns 2q, 2q + 1 (+ 8); B rows 2q, 2q + 1 (+ 8), column g; D rows g / g + 8, columns 2q, 2q + 1)
    from the registers the kernel loads, and check that the two mmas give B·Xᵀ over the step's 32 columns."""
    import torch

    g_ = torch.Generator().manual_seed(0)
    b = torch.randn(16, _gemv.K_STEP, generator=g_, dtype=torch.float64)  # 16 B rows (mma M) x 32 K
    x = torch.randn(8, _gemv.K_STEP, generator=g_, dtype=torch.float64)  # 8 tokens (mma N) x 32 K
    d = torch.zeros(16, 8, dtype=torch.float64)
    for s in range(2):
        a_mma = torch.full((16, 16), float("nan"), dtype=torch.float64)
        b_mma = torch.full((16, 8), float("nan"), dtype=torch.float64)
        for lane in range(32):
            g, q = lane // 4, lane % 4

            def word(rows, row, w, q=q):  # 32-bit word w (an element pair) of the lane's 16-byte load of row
                return rows[row, 8 * q + 2 * w: 8 * q + 2 * w + 2]

            w0, w1 = _gemv.fragment_words(s)
            # A registers (bw[8u + w0], bw[8u + 4 + w0], bw[8u + w1], bw[8u + 4 + w1]): rows g, g + 8.
            a_mma[g, 2 * q: 2 * q + 2] = word(b, g, w0)
            a_mma[g + 8, 2 * q: 2 * q + 2] = word(b, g + 8, w0)
            a_mma[g, 8 + 2 * q: 8 + 2 * q + 2] = word(b, g, w1)
            a_mma[g + 8, 8 + 2 * q: 8 + 2 * q + 2] = word(b, g + 8, w1)
            # B registers (xw[w0], xw[w1]): token g.
            b_mma[2 * q: 2 * q + 2, g] = word(x, g, w0)
            b_mma[8 + 2 * q: 8 + 2 * q + 2, g] = word(x, g, w1)
        assert not a_mma.isnan().any() and not b_mma.isnan().any()  # every fragment element is loaded
        d += a_mma @ b_mma
    torch.testing.assert_close(d, b @ x.T)


def test_gemv_configs_pin_gemv_tiles_on_ragged_shapes():
    pinned = [c for c in mod.CONFIGS if c.get("tile") in GEMV]
    assert {c["tile"] for c in pinned} >= {"gemv_t8_r1_k8_u4", "gemv_t16_r1_k16_u2", "gemv_t8_r2_k4_u4"}
    assert any(c["N"] % 16 for c in pinned) and any(c["K"] % _gemv.K_STEP for c in pinned)
    for c in pinned:
        assert c["M"] <= mod.TILE_CONFIGS[c["tile"]]["tokens"], c


@pytest.mark.parametrize("bad", [
    {"tokens": 4}, {"tokens": 32}, {"row_groups": 0}, {"row_groups": 17}, {"k_lanes": 3}, {"k_lanes": 32},
    {"row_groups": 4, "k_lanes": 8}, {"row_groups": 14, "k_lanes": 2},
    {"unroll": 3}, {"unroll": 16},
])
def test_gemv_rejects_bad_params(bad):
    params = {**_params("gemv_t8_r1_k8_u4"), **bad}
    with pytest.raises(ValueError):
        _gemv.build_gemv_kernel("bfloat16", **params)


def test_gemv_rejects_bad_dtype():
    with pytest.raises(ValueError):
        _gemv.build_gemv_kernel("float32", **_params("gemv_t8_r1_k8_u4"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("tile", GEMV)
def test_gemv_tile_builds(tile, dtype):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    sass = testing.build_and_check_sass(mod, "fp16_bf16_gemm", {"dtype": dtype, "tile": tile})
    assert "UTMALDG" not in sass and "HGMMA" not in sass
    # Every step's loads are issued before its mmas: the first HMMA follows every 16-byte load of the
    # first chunk (2 B rows + the token tiles, per unrolled step).
    p = _params(tile)
    loads_before = sass[:sass.index("HMMA")].count("LDG.E")
    assert loads_before >= (2 + p["tokens"] // 8) * p["unroll"], (loads_before, p)
