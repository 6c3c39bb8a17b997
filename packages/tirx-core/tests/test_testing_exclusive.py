# SPDX-License-Identifier: Apache-2.0
"""Large configs run one at a time across pytest-xdist workers (``testing.exclusive_if_large``), small ones freely."""

import multiprocessing
import time
import types

from tirx_kernels.core import testing


def _mod(nbytes):
    return types.SimpleNamespace(roofline=lambda **cfg: {"bytes": nbytes})


def _hold(nbytes, seconds, log):
    with testing.exclusive_if_large(_mod(nbytes), {}):
        log.append(("in", time.monotonic()))
        time.sleep(seconds)
        log.append(("out", time.monotonic()))


def _spans(nbytes):
    with multiprocessing.Manager() as m:
        logs = [m.list(), m.list()]
        ps = [multiprocessing.Process(target=_hold, args=(nbytes, 0.5, log)) for log in logs]
        for p in ps:
            p.start()
        for p in ps:
            p.join(30)
        return [(dict(log)["in"], dict(log)["out"]) for log in logs]


def test_large_configs_do_not_overlap():
    (a0, a1), (b0, b1) = sorted(_spans(testing.EXCLUSIVE_FROM_BYTES))
    assert b0 >= a1 - 1e-3


def test_small_configs_run_side_by_side():
    (a0, a1), (b0, b1) = sorted(_spans(testing.EXCLUSIVE_FROM_BYTES - 1))
    assert b0 < a1


def test_a_roofline_that_raises_counts_as_small():
    bad = types.SimpleNamespace(roofline=lambda **cfg: 1 / 0)
    with testing.exclusive_if_large(bad, {}):
        pass
