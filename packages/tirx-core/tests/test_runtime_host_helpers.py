# SPDX-License-Identifier: Apache-2.0
"""Host helpers of ``core.runtime``: ``autograd_inside_custom_op`` (a VJP inside a custom op's body works eagerly
through the op and under torch.compile, and leaves the caller's dispatch state as it was) and ``flat_view``."""

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
