# SPDX-License-Identifier: Apache-2.0
"""On the GPU: the TMA / mbarrier / cluster micro-kernels of ``test_lang_tma_micro.py`` (SW128 load into a
64 KB dynamic-smem pool, rank-3/4/5 loads, OOB zero fill, a clipped TMA store with a guard band, L2 cache
hints, a 3-stage mbarrier ring, a 2-CTA multicast cluster, a 1-D bulk-copy ring) against torch slicing of fresh
random ``int32`` inputs, bit for bit. Outputs start poisoned (0xDEADBEEF), so every element the kernel should write
is checked to be written, and every element it must not write to keep the poison.

The GPU host has no compiler: the kernels come prebuilt from ``$TIRX_LANG_MICRO_DIR`` (default
``build/lang-micro``; ``tma_cases.json`` + ``tma_*.so``), made on the CPU machine with
``python packages/tirx-core/tests/test_lang_tma_micro.py build/lang-micro``. Needs only torch + tvm-ffi.
"""

import os

import pytest

from tirx_kernels.core import testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUNDLE, CASES = testing.micro_bundle_cases(ROOT, "tma_cases.json")


def expected(case, inp, poison):
    """What the kernel must leave in its (poisoned) output, from the CPU input."""
    import torch

    kind, p = case["kind"], case["params"]
    out_shape = tuple(case["out"])
    if kind in ("sw128", "ring"):
        return inp.clone()
    if kind == "strided":  # innermost-first dims/strides/box/coords -> torch order, box flattened like smem
        dims, strides, box, coords = p["dims"], p["strides"], p["box"], p["coords"]
        view = torch.as_strided(inp, size=dims[::-1], stride=(strides[::-1] + [1]))
        for d in range(len(dims)):
            assert 0 <= coords[d] and coords[d] + box[d] <= dims[d]  # in bounds (OOB is its own case)
        idx = tuple(slice(coords[d], coords[d] + box[d]) for d in reversed(range(len(dims))))
        return view[idx].reshape(-1).clone()
    if kind == "oob":
        bx = p["box"]
        rows, cols = inp.shape
        ref = torch.zeros(out_shape, dtype=torch.int32)
        for b, (cx, cy) in enumerate(p["coords"]):
            r0, r1 = max(cy, 0), min(cy + bx, rows)
            c0, c1 = max(cx, 0), min(cx + bx, cols)
            ref[b, r0 - cy:r1 - cy, c0 - cx:c1 - cx] = inp[r0:r1, c0:c1]
        return ref
    if kind == "store":  # clipped to the rows x cols map; the guard band keeps its poison
        ref = torch.full(out_shape, poison, dtype=torch.int32)
        ref[:p["rows"], :p["cols"]] = inp[:p["rows"], :p["cols"]]
        return ref
    if kind == "l2hint":
        return torch.stack([inp, inp])
    if kind == "bulk":  # rows streamed through a bulk-copy ring, complemented in smem
        return torch.bitwise_not(inp)
    if kind == "cluster":  # each CTA's slice: the full box, half of it multicast by the peer
        box = inp[p["row0"]:p["row0"] + 2 * p["half"]]
        return torch.stack([box, box])
    raise ValueError(f"unknown case kind {kind!r}")


@pytest.mark.skipif(testing.micro_skip_reason() is not None, reason=str(testing.micro_skip_reason()))
@pytest.mark.skipif(not CASES, reason=f"no prebuilt TMA micro-kernels in {BUNDLE} (build them on the CPU machine: "
                                      "python packages/tirx-core/tests/test_lang_tma_micro.py build/lang-micro)")
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_micro_kernel_numerics(case):
    import torch
    import tvm_ffi

    fn = tvm_ffi.load_module(os.path.join(BUNDLE, case["so"]))["main"]
    seed = int.from_bytes(os.urandom(8), "little") >> 1  # fresh inputs every run; printed on failure
    gen = torch.Generator().manual_seed(seed)
    poison = case["poison"]
    inp = torch.randint(-2**31, 2**31, tuple(case["inp"]), dtype=torch.int32, generator=gen)
    inp[inp == poison] = 0x1234567  # the poison marks "not written": keep it out of the data
    out = torch.full(tuple(case["out"]), poison, dtype=torch.int32, device="cuda")
    fn(inp.cuda(), out)
    torch.cuda.synchronize()
    out = out.cpu()
    ref = expected(case, inp, poison)
    bad = out != ref
    if bad.any():
        first = bad.nonzero()[0].tolist()
        unwritten = int(((out == poison) & (ref != poison)).sum())
        clobbered = int(((ref == poison) & (out != poison)).sum())
        raise AssertionError(
            f"seed {seed}: {int(bad.sum())}/{bad.numel()} words differ ({unwritten} left poisoned, {clobbered} "
            f"guard words overwritten); first at {first}: got {int(out[tuple(first)]):#x}, "
            f"want {int(ref[tuple(first)]):#x}")


def test_expected_follows_the_tma_addressing():
    """CPU: the references against plain TMA index arithmetic (element (x0..x_{r-1}) of a box at ``coords``
    is global word ``sum((coords[d] + x_d) * stride_d)``, smem word ``x0 + box0 * (x1 + box1 * (...))``;
    out-of-range coordinates read as zero)."""
    torch = pytest.importorskip("torch")
    import itertools

    inp = torch.arange(312, dtype=torch.int32)
    dims, strides, box, coords = [8, 2, 3, 2, 3], [8, 16, 52, 104], [8, 2, 2, 2, 2], [0, 0, 1, 0, 1]
    case = {"kind": "strided", "out": [128], "params": dict(dims=dims, strides=strides, box=box, coords=coords)}
    ref = expected(case, inp, 0)
    full = [1] + strides
    for x in itertools.product(*[range(b) for b in box]):
        s = 0
        for d in reversed(range(5)):
            s = s * box[d] + x[d]
        assert int(ref[s]) == sum((coords[d] + x[d]) * full[d] for d in range(5))
    inp = torch.arange(1, 20 * 24 + 1, dtype=torch.int32).reshape(20, 24)
    case = {"kind": "oob", "out": [2, 16, 16], "params": dict(box=16, coords=[[16, 12], [-8, -4]])}
    ref = expected(case, inp, 0)
    for b, (cx, cy) in enumerate(case["params"]["coords"]):
        for r, c in itertools.product(range(16), range(16)):
            inside = 0 <= cy + r < 20 and 0 <= cx + c < 24
            assert int(ref[b, r, c]) == (int(inp[cy + r, cx + c]) if inside else 0)
    case = {"kind": "store", "out": [40, 48], "params": dict(rows=36, cols=40)}
    ref = expected(case, torch.ones(48, 48, dtype=torch.int32), -7)
    assert int((ref == 1).sum()) == 36 * 40 and int((ref == -7).sum()) == 40 * 48 - 36 * 40
