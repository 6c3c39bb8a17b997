# SPDX-License-Identifier: Apache-2.0
# Test and bench scaffolding shared by the ports of DeepGEMM's SM90 GEMMs (deepseek-ai/DeepGEMM
# 54e22612409371d6364144b69086735beb54e98b: tests/test_fp8_fp4.py, tests/test_einsum.py, tests/test_hyperconnection.py
# compare against the same references). No kernel code: the builders are _fp8_gemm_kernel / _tf32_hc_prenorm_kernel.
"""What the DeepGEMM ops' ``prepare_data`` / ``get_baselines`` share: the seeded generator of fresh inputs, and the
baseline builders (the fp32 oracle, a ``deep_gemm`` call into a fresh output, cuBLASLt's blockwise
``torch._scaled_mm`` behind its probe, and the host-side plans made once per data so that timed calls do no sync)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from . import _fp8_gemm_op as O


def cuda_generator() -> tuple[torch.Generator, int]:
    """``(generator on cuda, seed)``: ``TIRX_SEED`` where set (a failing run replays), else a fresh random seed."""
    seed = int(os.environ.get("TIRX_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    return torch.Generator(device="cuda").manual_seed(seed), seed


def oracle_baseline(reference: Callable) -> Callable:
    """The ``torch`` baseline: the module's fp32 (or fp64) oracle on the data."""
    def build():
        return lambda d: reference(**d)

    return build


def deepgemm_baseline(call: Callable, out: str | tuple[str, ...] = "d") -> Callable:
    """The ``deepgemm`` baseline: ``call(deep_gemm, data, *fresh)`` into fresh tensors like ``data[name]`` for each
    name of ``out``; where ``call`` returns a tensor, that one is the (first) result instead."""
    names = (out,) if isinstance(out, str) else tuple(out)

    def build():
        import deep_gemm

        def run(d):
            fresh = [torch.empty_like(d[n]) for n in names]
            got = call(deep_gemm, d, *fresh)
            if got is not None:
                fresh[0] = got
            return dict(zip(names, fresh))

        return run

    return build


def planned(keys: Sequence[str], plan: Callable, run: Callable) -> Callable:
    """``run(data, plan(data))`` with the plan made once per data (keyed by the addresses of ``data[k]`` for ``k`` in
    ``keys``): host-side layouts and copies stay out of the timed calls."""
    plans = {}

    def go(d):
        key = tuple(d[k].data_ptr() for k in keys)
        if key not in plans:
            plans[key] = plan(d)
        return run(d, plans[key])

    return go


def cublas_baseline(keys: Sequence[str], plan: Callable, run: Callable, one_by_one: bool = False) -> Callable:
    """The ``cublas`` baseline: cuBLASLt's blockwise ``torch._scaled_mm`` (a missing reference where the probe fails:
    ``one_by_one`` for 1x128 scales on both operands), run through a plan made once per data (``planned``)."""
    def build():
        O.scaled_mm_probe(one_by_one=one_by_one)
        return planned(keys, plan, run)

    return build


def m_major(sf: torch.Tensor) -> torch.Tensor:
    """``sf`` [rows, kb] as the M-major copy cuBLASLt's blockwise scales take (stride (1, rows))."""
    return sf.t().contiguous().t()
