# SPDX-License-Identifier: Apache-2.0
"""``runtime.direct_call`` / ``mark_written`` / ``FunctionCache``: the public ops' eager hot path (CPU)."""

import pytest
import torch

from tirx_kernels.core import runtime


def test_direct_call_plain_tensors_and_parameters():
    a = torch.randn(4, 4)
    w = torch.nn.Parameter(torch.randn(4), requires_grad=False)
    assert runtime.direct_call(a, None, w)
    assert runtime.direct_call()


def test_direct_call_leaves_autograd_to_the_custom_op():
    a = torch.randn(4, 4, requires_grad=True)
    assert not runtime.direct_call(torch.randn(4), a)
    with torch.no_grad():
        assert runtime.direct_call(a)
    with torch.inference_mode():
        assert runtime.direct_call(torch.randn(3))


def test_direct_call_refuses_fake_and_subclass_tensors_and_tracing(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(4, 4)
    assert not runtime.direct_call(fake)

    class Sub(torch.Tensor):
        pass

    assert not runtime.direct_call(torch.randn(2).as_subclass(Sub))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not runtime.direct_call(torch.randn(2))


def test_mark_written_bumps_the_version_counter():
    out = torch.empty(3)
    v = out._version
    runtime.mark_written(out)
    assert out._version == v + 1
    with torch.inference_mode():
        inf = torch.empty(3)
    runtime.mark_written(inf)  # no version counter: nothing to bump, no error


def test_function_cache_loads_once_per_key_and_stays_bounded(monkeypatch):
    loads = []

    def fake_get_function(module, params, device=None):
        loads.append(params)
        return ("fn", params["n"])

    monkeypatch.setattr(runtime, "get_function", fake_get_function)
    cache = runtime.FunctionCache(__name__, max_entries=2)
    assert cache.get((1,), lambda: {"n": 1}) == ("fn", 1)
    assert cache.get((1,), lambda: pytest.fail("params resolved again for a cached key")) == ("fn", 1)
    assert cache.get((2,), lambda: {"n": 2}) == ("fn", 2)
    assert len(loads) == 2
    cache.get((3,), lambda: {"n": 3})  # full: cleared, then (3,) stored
    cache.get((1,), lambda: {"n": 1})
    assert [p["n"] for p in loads] == [1, 2, 3, 1]


def test_run_direct_writes_out_or_a_new_tensor():
    out = torch.zeros(3)
    v = out._version
    assert runtime.run_direct(lambda dst: dst.fill_(2.0), out, lambda: pytest.fail("allocated despite out")) is out
    assert out.tolist() == [2.0, 2.0, 2.0] and out._version > v
    new = runtime.run_direct(lambda dst: dst.fill_(1.0), None, lambda: torch.empty(2))
    assert new.tolist() == [1.0, 1.0]
