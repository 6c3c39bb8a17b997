# SPDX-License-Identifier: Apache-2.0
"""Host helpers of ``core.runtime``: ``LaunchPlans``, ``autograd_inside_custom_op`` (a VJP inside a custom op's body
works eagerly through the op and under torch.compile, and leaves the caller's dispatch state as it was) and
``flat_view``."""

import pytest
import torch

from tirx_kernels.core import runtime


def _vjp_body(x, out, guarded: bool):
    ctx = runtime.autograd_inside_custom_op() if guarded else torch.enable_grad()
    with ctx:
        leaf = x.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad((leaf * leaf * leaf).sum(), [leaf])
    out.copy_(g)


@torch.library.custom_op("tirx_test::cube_vjp_guarded", mutates_args=("out",))
def _guarded(x: torch.Tensor, out: torch.Tensor) -> None:
    _vjp_body(x, out, True)


@torch.library.custom_op("tirx_test::cube_vjp_plain", mutates_args=("out",))
def _plain(x: torch.Tensor, out: torch.Tensor) -> None:
    _vjp_body(x, out, False)


for _op in (_guarded, _plain):
    _op.register_fake(lambda x, out: None)


def _call(op, x):
    out = torch.empty_like(x)
    op(x, out)
    return out


def test_without_the_guard_the_custom_op_body_records_nothing():
    with pytest.raises(RuntimeError, match="does not require grad"):
        _call(_plain, torch.randn(5))


def test_the_guard_gives_the_vjp_eagerly_and_compiled():
    x = torch.randn(5)
    torch.testing.assert_close(_call(_guarded, x), 3 * x * x)
    compiled = torch.compile(lambda t: _call(_guarded, t), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), 3 * x * x)


def test_the_caller_keeps_its_dispatch_state_and_grad_mode():
    before = str(torch._C._dispatch_tls_local_exclude_set())
    with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
        inner = str(torch._C._dispatch_tls_local_exclude_set())
        with runtime.autograd_inside_custom_op():
            assert torch.is_grad_enabled()
        assert str(torch._C._dispatch_tls_local_exclude_set()) == inner and not torch.is_grad_enabled()
    assert str(torch._C._dispatch_tls_local_exclude_set()) == before


def test_flat_view_spans_what_a_strided_tensor_addresses():
    t = torch.arange(60.0).view(3, 4, 5)
    f = runtime.flat_view(t)
    assert f.shape == (60,) and f.data_ptr() == t.data_ptr()
    s = t[:, 1:3]  # strides (20, 5, 1): from element 5 to element 54
    g = runtime.flat_view(s)
    assert g.data_ptr() == s.data_ptr() and g.shape == (50,) and torch.equal(g, t.view(-1)[5:55])
    for i, j, k in ((0, 0, 0), (2, 1, 4), (1, 0, 3)):
        assert g[i * 20 + j * 5 + k] == s[i, j, k]
    assert runtime.flat_view(torch.empty(0, 4)[:, 1:]).shape == (0,)
    assert runtime.flat_view(torch.tensor(3.0)).shape == (1,)


def test_launch_plans_replay_views_of_each_calls_own_tensors():
    """runtime.LaunchPlans: a recorded launch replays with flat views (same start, length, dtype) of the new call's
    tensors, constants as they were; a pointer that is no view of an argument's start is not recorded; the
    signature separates aliasing, alignment and non-tensor arguments, and is None for empty tensors."""
    plans = runtime.LaunchPlans(limit=2)
    got = []

    def fn(*a):
        got.append(a)

    const = torch.zeros(1, dtype=torch.int32)

    def call(x, w, flag):
        args = (x, w, flag)
        key = plans.signature(args, "algo")
        plan = plans.get(key)
        if plan is None:
            ptrs = [x.flatten(), w.as_strided((w.shape[0] * w.stride(0) - w.stride(0) + w.shape[1],), (1,)),
                    x.flatten().view(torch.int16), const]
            plan = plans.record(key, fn, ptrs, [flag, 7], args, constants=(const,))
        plans.replay(plan, args)
        return got[-1]

    x = torch.randn(4, 8)
    w = torch.randn(3, 16)[:, :5]  # strided rows
    first = call(x, w, 1)
    x2, w2 = torch.randn(4, 8), torch.randn(3, 16)[:, :5]
    second = call(x2, w2, 1)
    assert len(plans) == 1
    for a, b in zip(first[:3], second[:3]):
        assert a.shape == b.shape and a.dtype == b.dtype
    assert second[0].data_ptr() == x2.data_ptr() and second[1].data_ptr() == w2.data_ptr()
    assert torch.equal(second[1], w2.as_strided((37,), (1,))) and second[2].dtype == torch.int16
    assert second[3] is const and second[4:] == (1, 7)
    assert plans.signature((x, x, 1)) != plans.signature((x, x2, 1))  # aliasing
    assert plans.signature((x, w, 1)) != plans.signature((x, w, 2))  # scalars
    assert plans.signature((x[:, 1:], w, 1)) != plans.signature((x[:, :7], w, 1))  # alignment (and strides)
    assert plans.signature((torch.empty(0), w, 1)) is None
    key = plans.signature((x, w, 3), "algo")
    assert plans.record(key, fn, [torch.randn(3)], [], (x, w, 3)) is None  # not a view of an argument
    for flag in (4, 5):  # the limit: the table is cleared, never unbounded
        plans.record(plans.signature((x, w, flag)), fn, [x.flatten()], [], (x, w, flag))
    assert len(plans) <= 2
