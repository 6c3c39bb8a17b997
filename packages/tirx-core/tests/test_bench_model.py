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


def test_slow_implementations_get_fewer_calls_per_round():
    from tirx_kernels.core import bench

    assert bench.calls_for(10.0, 30) == 30  # a 10 us call: every call
    assert bench.calls_for(20_000.0, 30) == 12  # 12 x 20 ms fill the 250 ms round budget
    assert bench.calls_for(170_000.0, 30) == bench.MIN_CALLS  # the GDN-2 forward with checkpoints: 3, not 30
    assert bench.calls_for(0.0, 30) == 30
