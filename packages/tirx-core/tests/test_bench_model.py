# SPDX-License-Identifier: Apache-2.0
"""The roofline arithmetic every bench row reports (no timing here: that needs the GPU)."""

import pytest

from tirx_kernels.core.bench import roofline_stats

CEIL = {"copy_tb_s": 4.0, "bf16_tflop_s": 800.0}


def test_memory_bound_row():
    s = roofline_stats({"bytes": 4_000_000, "flops": 1000}, us=2.0, ceil=CEIL)  # floor 1 us at 4 TB/s
    assert s["bound"] == "memory"
    assert s["tb_s"] == pytest.approx(2.0) and s["pct_of_roofline"] == pytest.approx(50.0)


def test_compute_bound_row():
    s = roofline_stats({"bytes": 1000, "flops": 2 * 4096**3}, us=200.0, ceil=CEIL)
    assert s["bound"] == "compute"
    assert s["tflop_s"] == pytest.approx(2 * 4096**3 / 200e6)
    assert s["pct_of_roofline"] == pytest.approx(100 * (2 * 4096**3 / 800e6) / 200.0)
