# SPDX-License-Identifier: Apache-2.0
"""The model-dimension catalog a prebuilt bundle specializes for (``core/data/model_dims.json``).

Kernels whose code is specialized on a size (rmsnorm's hidden size, act_and_mul's intermediate width) build
one artifact per catalog size into the bundle, beside a general artifact that takes the size at run time, so a
GPU host without the compiler runs every valid call (the specialized one where the bundle has it).
"""

from __future__ import annotations

import functools
import json
import os

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "model_dims.json")


@functools.cache
def catalog() -> dict:
    """``{"tensor_parallel": [...], "models": {name: {"hidden", "intermediate": [...], "head_dim", ...}}}``."""
    with open(_PATH) as f:
        return json.load(f)


def models() -> dict:
    return catalog()["models"]


def hidden_sizes() -> list[int]:
    """Every model's hidden size, sorted, once each."""
    return sorted({m["hidden"] for m in models().values()})


def head_dims() -> list[int]:
    return sorted({m["head_dim"] for m in models().values()})


def intermediate_sizes(sharded: bool = True) -> list[int]:
    """Every model's MLP / expert intermediate width; with ``sharded``, also each width split over the catalog's
    tensor-parallel degrees (where it divides evenly), as a TP rank's activation sees it."""
    tps = catalog()["tensor_parallel"] if sharded else [1]
    out = set()
    for m in models().values():
        for width in m["intermediate"]:
            for tp in tps:
                if width % tp == 0:
                    out.add(width // tp)
    return sorted(out)


def vocab_sizes() -> list[int]:
    return sorted({m["vocab"] for m in models().values()})
