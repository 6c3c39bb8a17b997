# SPDX-License-Identifier: Apache-2.0
"""selective_state_update's launch plans (the host path memoized per call signature, ``runtime.LaunchPlans``): on the
CPU, with the kernel function replaced by a recorder, every config row of the six registered modules is called
three times (the plan made, replayed on the same tensors, replayed on fresh tensors of the same signature) and each
launch's arguments must be exactly those the uncached path builds for that call: the same kernel params, scalars,
and for every pointer the same start address, dtype and length."""

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as ssu
from tirx_kernels.ported.flashinfer.mamba import _ssu_op as op

SCHEDULES = ("stp_simple", "stp_vertical", "stp_horizontal", "mtp_simple", "mtp_vertical", "mtp_horizontal")


@pytest.fixture
def recorder(monkeypatch):
    calls = []

    def get_function(mod, params, device):
        def fn(*a):
            calls.append((mod.__name__, op.artifacts_key(params), a))
        return fn

    tensor_check = op.checks.tensor

    def on_cpu(o, name, t, cuda=False, **kw):  # the CPU stands in for the GPU here
        return tensor_check(o, name, t, **kw, cuda=False)

    monkeypatch.setattr(op.runtime, "get_function", get_function)
    monkeypatch.setattr(op, "_FUNCTIONS", {})
    monkeypatch.setattr(op, "_PLANS", op.runtime.LaunchPlans())
    monkeypatch.setattr(op.checks, "tensor", on_cpu)
    return calls


def _expected(d: dict, algorithm: str):
    """(module, params key, pointer args, scalars) the uncached path launches for the call on ``d``'s tensors."""
    args = list(ssu.op_args(d))
    args[ssu._OP_KEYS.index("out")] = d["out"]
    n = op.normalize(*args)
    schedule = op.pick_schedule(algorithm, n)
    kw = {k: v for k, v in n.items() if k != "mtp"}
    ptrs, scalars, params, _, _ = op.kernel_args(**kw, schedule=schedule)
    return (op.module_of(schedule).__name__, op.artifacts_key(params), [ptrs[k] for k in op.ARG_ORDER],
            [scalars[k] for k in op.SCALAR_ORDER])


def _call_and_check(calls, d, algorithm):
    before = len(calls)
    op.selective_state_update(**dict(zip(ssu._OP_KEYS, ssu.op_args(d))), algorithm=algorithm)
    assert len(calls) == before + 1
    mod_name, params, got = calls[-1]
    want_mod, want_params, want_ptrs, want_scalars = _expected(d, algorithm)
    assert (mod_name, params) == (want_mod, want_params)
    n_ptr = len(op.ARG_ORDER)
    assert list(got[n_ptr:]) == want_scalars
    for name, g, w in zip(op.ARG_ORDER, got[:n_ptr], want_ptrs):
        assert (g.data_ptr(), g.dtype, g.shape, g.stride()) == (w.data_ptr(), w.dtype, w.shape, w.stride()), name


def _rows():
    for schedule in SCHEDULES:
        mod = op.module_of(schedule)
        for cfg in mod.CONFIGS:
            yield pytest.param(schedule, cfg["label"], id=f"{schedule}-{cfg['label']}")


@pytest.mark.parametrize("schedule, label", list(_rows()))
def test_replayed_launch_is_the_uncached_one(recorder, schedule, label):
    mod = op.module_of(schedule)
    cfg = harness.full_config(mod, {**next(c for c in mod.CONFIGS if c["label"] == label), "batch": 3})
    algorithm = op.schedule_name(schedule)
    first = mod.prepare_data(**cfg, device="cpu")
    _call_and_check(recorder, first, algorithm)  # makes the plan
    assert len(op._PLANS) == 1, "the call was not memoized"
    _call_and_check(recorder, first, algorithm)  # replays it on the same tensors
    _call_and_check(recorder, mod.prepare_data(**cfg, device="cpu"), algorithm)  # and on fresh ones
    assert len(op._PLANS) == 1


def test_aliasing_is_part_of_the_signature(recorder):
    """B and C the same tensor, then distinct tensors of the same metadata: not the same plan (a replay would pass
    the first argument's address for both)."""
    mod = op.module_of("stp_simple")
    cfg = harness.full_config(mod, {**mod.CONFIGS[0], "batch": 2})
    d = mod.prepare_data(**cfg, device="cpu")
    d["C"] = d["B"]
    _call_and_check(recorder, d, "simple")
    d2 = mod.prepare_data(**cfg, device="cpu")
    _call_and_check(recorder, d2, "simple")
    assert len(op._PLANS) == 2


def test_misaligned_call_is_not_replayed(recorder):
    """A call whose x starts off a 16-byte boundary has its own signature, so validation runs for it."""
    mod = op.module_of("stp_simple")
    cfg = harness.full_config(mod, {**mod.CONFIGS[0], "batch": 2})
    d = mod.prepare_data(**cfg, device="cpu")
    _call_and_check(recorder, d, "simple")
    d2 = mod.prepare_data(**cfg, device="cpu")
    buf = torch.empty(d2["state"].numel() + 1, dtype=d2["state"].dtype)
    d2["state"] = buf[1:].view_as(d2["state"]).copy_(d2["state"])  # 2 bytes off
    with pytest.raises(op.checks.TirxInputError, match="state"):
        op.selective_state_update(**dict(zip(ssu._OP_KEYS, ssu.op_args(d2))), algorithm="simple")
