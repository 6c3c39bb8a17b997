# SPDX-License-Identifier: Apache-2.0
"""The scaffolding the DeepGEMM ops share (``_fp8_gemm_common``, the check / launch helpers of ``_fp8_gemm_op``), on
CPU: the baseline builders (a stand-in ``deep_gemm`` module), plans made once per data, and every registered module's
baseline names."""

import sys
import types

import pytest
import torch

from tirx_kernels.core import checks
from tirx_kernels.ported.deepgemm import _fp8_gemm_common as F
from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O


def test_oracle_and_deepgemm_baselines(monkeypatch):
    seen = []
    def gemm(d, out, sq=None):  # what a deep_gemm call does: fill its outputs in place, return nothing
        seen.append(out)
        out.fill_(d["v"])
        if sq is not None:
            sq.fill_(-d["v"])

    fake = types.SimpleNamespace(gemm=gemm)
    monkeypatch.setitem(sys.modules, "deep_gemm", fake)
    data = {"d": torch.zeros(2, 3), "sq": torch.zeros(2), "v": 5.0}
    assert F.oracle_baseline(lambda d, sq, v: {"d": d + v})()(data)["d"].eq(5).all()
    out = F.deepgemm_baseline(lambda dg, d, o: dg.gemm(d, o))()(data)
    assert out["d"].eq(5).all() and out["d"] is not data["d"] and data["d"].eq(0).all()  # a fresh output
    two = F.deepgemm_baseline(lambda dg, d, o, s: dg.gemm(d, o, s), out=("d", "sq"))()(data)
    assert two["d"].eq(5).all() and two["sq"].eq(-5).all()
    replaced = F.deepgemm_baseline(lambda dg, d, o: o + 1)()(data)  # a returned tensor is the result
    assert replaced["d"].shape == (2, 3)


def test_plans_once_per_data():
    made = []
    run = F.planned(("a",), lambda d: made.append(1) or len(made), lambda d, plan: plan)
    a, b = torch.zeros(4), torch.zeros(4)
    assert [run({"a": a}), run({"a": a}), run({"a": b})] == [1, 1, 2]
    sf = torch.randn(5, 3)
    mm = F.m_major(sf)
    assert torch.equal(mm, sf) and mm.stride() == (1, 5)


def test_op_helpers():
    assert O.tile_artifacts() == [{"tile": t} for t in O.TILES]
    assert O.tile_artifacts(accumulate=True) == [{"tile": t, "accumulate": a} for t in O.TILES for a in (False, True)]
    d, c = torch.zeros(2, 4), torch.ones(2, 4)
    O.c_or_zero(c, d)
    assert d.eq(1).all()
    O.c_or_zero(None, d)
    assert d.eq(0).all()
    O.check_even_strides("op", torch.zeros(4, 8))
    with pytest.raises(checks.TirxInputError, match="argument 'd'.*even b and h strides"):
        O.check_even_strides("op", torch.zeros(3, 3, 7), "even b and h strides")
    with pytest.raises(checks.TirxInputError, match="argument 'recipe_b'"):
        O.check_sm100_recipes("op", None, (1, 128, 128))
    with pytest.raises(checks.TirxInputError, match="argument 'd.shape\\[1\\]'"):
        O.check_rows("op", "k", 32, "d.shape[1]", 12)
    with pytest.raises(checks.TirxInputError, match="argument 'b'"):
        O.operand_pairs("op", (torch.zeros(2, 16).to(O.E4M3), torch.ones(2, 1)), torch.zeros(2), 2, 2)


def test_kernel_function_key():
    got = []

    class Cache:
        def get(self, key, params_of, device=None):
            got.append((key, params_of(), device))

    O.kernel_function(Cache(), torch.zeros(1), tile="128x64_s8", accumulate=True)
    assert got == [(("128x64_s8", True, -1), {"tile": "128x64_s8", "accumulate": True}, torch.device("cpu"))]


@pytest.mark.parametrize("name, extra", [("fp8_gemm_1d2d", ()), ("fp8_gemm_1d1d", ()),
                                         ("m_grouped_fp8_gemm_contiguous", ()), ("m_grouped_fp8_gemm_masked", ()),
                                         ("k_grouped_fp8_gemm_contiguous", ()), ("fp8_bmm", ("bf16",)),
                                         ("tf32_hc_prenorm_gemm", ("tf32", "fp32"))])
def test_baseline_names(name, extra):
    import importlib

    mod = importlib.import_module(f"tirx_kernels.ported.deepgemm.{name}")
    names = set(mod.get_baselines(**mod.CONFIGS[-1]))
    want = {"torch", "deepgemm"} | set(extra) | (set() if name.startswith("tf32") else {"cublas"})
    assert names == want
