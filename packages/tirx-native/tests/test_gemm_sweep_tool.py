# SPDX-License-Identifier: Apache-2.0
"""``tools/gemm_sweep.py table``: scoring a tile table against stored sweeps (CPU, synthetic sweep rows)."""

import argparse
import math

import pytest

from tirx_kernels.core import testing


def _sweep_module():
    return testing.load_tool("gemm_sweep", __file__)


def _row(m, cublas, tiles):
    return {"M": m, "N": 64, "K": 64, "cublas_us": cublas, "tiles_us": tiles}


def test_table_report_scores_picks_best_tiles_and_low_rows():
    sweep = _sweep_module()
    runs = [
        {"rows": [_row(1, 10.0, {"a": 8.0, "b": 10.0}), _row(2, 10.0, {"a": 12.5, "b": 9.0})]},
        {"rows": [_row(1, 10.0, {"a": 10.0, "b": 12.5}), _row(2, 10.0, {"a": 11.0, "b": 10.0}),
                  _row(3, 10.0, {})]},  # a shape every tile failed on is left out
    ]

    def choose(m, n, k):
        return "a"

    rep = sweep.table_report(runs, choose)
    f0, f1 = rep["files"]
    assert f0["shapes"] == 2 and math.isclose(f0["table"], math.sqrt(10 / 8 * 10 / 12.5))
    assert math.isclose(f0["best"], math.sqrt(10 / 8 * 10 / 9))
    assert f0["below_097"] == [((2, 64, 64), 0.8)]
    assert [k for k, _ in f1["below_097"]] == [(2, 64, 64)]
    shapes = {r["shape"]: r for r in rep["per_shape"]}
    assert set(shapes) == {(1, 64, 64), (2, 64, 64)}
    # Shape 2: "b" beats the pick in both runs; its mean is the geomean of its two ratios.
    assert shapes[(2, 64, 64)]["best"] == "b" and shapes[(2, 64, 64)]["runs"] == 2
    assert math.isclose(shapes[(2, 64, 64)]["best_mean"], math.sqrt(10 / 9 * 10 / 10))
    assert shapes[(1, 64, 64)]["best"] == "a" and shapes[(1, 64, 64)]["pick"] == "a"


def test_table_report_flags_a_pick_no_run_timed():
    sweep = _sweep_module()
    rep = sweep.table_report([{"rows": [_row(1, 10.0, {"b": 10.0})]}], lambda m, n, k: "a")
    assert rep["files"][0]["pick_not_timed"] == [(1, 64, 64)] and rep["files"][0]["shapes"] == 0
    assert rep["per_shape"][0]["pick_mean"] is None


def test_only_shapes_parse_and_reject_bad_text():
    gemm_sweep = _sweep_module()
    assert gemm_sweep._shape_list("2048x7168x2048,512x4096x14336") == [(2048, 7168, 2048), (512, 4096, 14336)]
    for bad in ("", "2048x7168", "2048x7168x0", "axbxc"):
        with pytest.raises(argparse.ArgumentTypeError, match="--only"):
            gemm_sweep._shape_list(bad)
