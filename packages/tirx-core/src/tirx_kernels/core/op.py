# SPDX-License-Identifier: Apache-2.0
"""The public-op skeleton every memory-bound port shares: a functional custom op ``tirx::<name>`` (returns a new
output) and an in-place one ``tirx::<name>_out`` (writes ``out``), their fake (meta) implementations, and the eager
direct path that skips the custom op's dispatch (``runtime.direct_call`` / ``run_direct``).

    _OP = op.OutOp("act_and_mul", {"x": torch.Tensor, "act": str},
                   run=lambda x, act, out: _run(x, act, out),          # writes out; launches the kernels
                   new_out=lambda x, act: torch.empty(...))            # the output a call without ``out`` gets

    def silu_and_mul(x, out=None):
        _check_inputs("silu_and_mul", x, out)                           # TirxInputError before any dispatch
        return _OP(x, "silu", out=out)

``new_out`` also serves as the fake: under torch.compile's fake mode ``torch.empty`` makes a fake tensor of the
same shape, dtype and device. The ops are registered once per process at construction (module import).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from tirx_kernels.core import runtime


class OutOp:
    """``tirx::<name>`` and ``tirx::<name>_out`` over ``run(*args, out)``; call it as ``op(*args, out=None)``.

    ``params``: the op's arguments (name -> annotation: ``torch.Tensor``, ``float``, ``int``, ``str``, ``bool`` or
    optional forms torch.library accepts), in call order, without ``out``."""

    def __init__(self, name: str, params: dict, run: Callable[..., None], new_out: Callable[..., object]):
        self.name, self.run, self.new_out = name, run, new_out
        args = [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for k, t in params.items()]
        out_arg = inspect.Parameter("out", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)

        def functional(*a):
            out = new_out(*a)
            run(*a, out)
            return out

        def in_place(*a):
            run(*a[:-1], a[-1])

        functional.__signature__ = inspect.Signature(args, return_annotation=torch.Tensor)
        in_place.__signature__ = inspect.Signature([*args, out_arg], return_annotation=None)
        self.functional = torch.library.custom_op(f"tirx::{name}", mutates_args=())(functional)
        self.functional.register_fake(lambda *a: new_out(*a))
        self.in_place = torch.library.custom_op(f"tirx::{name}_out", mutates_args=("out",))(in_place)
        self.in_place.register_fake(lambda *a: None)

    def __call__(self, *args, out=None):
        """Eager with plain tensors: ``run`` directly (``runtime.direct_call``); traced or with autograd in play:
        the custom op. Returns the output (``out`` when given)."""
        if runtime.direct_call(*[a for a in args if isinstance(a, torch.Tensor)], out):
            return runtime.run_direct(lambda dst: self.run(*args, dst), out, lambda: self.new_out(*args))
        if out is None:
            return self.functional(*args)
        self.in_place(*args, out)
        return out
