# SPDX-License-Identifier: Apache-2.0
"""core.op.OutOp on the CPU: the two custom ops' schemas, their fakes (torch.library.opcheck), the eager direct path
(no dispatch) and the custom-op path (autograd in play), ``out=`` written in place."""

import torch

from tirx_kernels.core import op

_RUNS = []


def _run(x, scale, out):
    _RUNS.append(x.shape)
    torch.mul(x, scale, out=out)


_SCALE = op.OutOp("_test_op_scale", {"x": torch.Tensor, "scale": float}, run=_run,
                  new_out=lambda x, scale: torch.empty_like(x))


def test_schemas():
    assert str(torch.ops.tirx._test_op_scale.default._schema) == "tirx::_test_op_scale(Tensor x, float scale) -> Tensor"
    assert str(torch.ops.tirx._test_op_scale_out.default._schema) == \
        "tirx::_test_op_scale_out(Tensor x, float scale, Tensor(a2!) out) -> ()"


def test_opcheck():
    x = torch.randn(3, 5)
    torch.library.opcheck(_SCALE.functional, (x, 2.0))
    torch.library.opcheck(_SCALE.in_place, (x, 2.0, torch.empty(3, 5)))


def test_direct_and_out():
    x = torch.randn(4, 6)
    torch.testing.assert_close(_SCALE(x, 3.0), x * 3)
    out = torch.full((4, 6), float("nan"))
    v = out._version
    assert _SCALE(x, 0.5, out=out) is out and out._version > v  # written, and marked written
    torch.testing.assert_close(out, x * 0.5)


def test_custom_op_path_under_autograd():
    x = torch.randn(2, 3, requires_grad=True)
    y = _SCALE(x, 2.0)  # through tirx::_test_op_scale (direct_call refuses a tensor that requires grad)
    torch.testing.assert_close(y, x.detach() * 2)


def test_compiles():
    fn = torch.compile(lambda t: _SCALE(t, 4.0), backend="eager", fullgraph=True)
    x = torch.randn(7)
    torch.testing.assert_close(fn(x), x * 4)
