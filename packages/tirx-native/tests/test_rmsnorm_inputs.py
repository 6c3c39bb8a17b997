# SPDX-License-Identifier: Apache-2.0
"""``rmsnorm`` input validation (CPU only): every rejected input raises ``TirxInputError`` naming the
argument; the row plan; the module's import-time promises (no apache-tvm, literal protocol attributes)."""

import ast
import re

import pytest
import torch

from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.norm import rmsnorm as mod

bf16 = torch.bfloat16


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("x, w, out, arg, what", [
    (_t(4, 128, dtype=torch.float32), _t(128), None, "x", "dtype"),
    (_t(4, 128), _t(128, dtype=torch.float16), None, "weight", "dtype"),
    (_t(4, 0), _t(0), None, "x", r"value in \[1, 1073741824\]"),
    (_t(4, 128), _t(136), None, "weight", "shape"),
    (_t(4, 128), _t(2, 128), None, "weight", "shape"),
    (_t(4, 256)[:, ::2], _t(128), None, "x", "unit stride"),
    (_t(4, 128), _t(256)[::2], None, "weight", "unit stride"),
    (_t(4, 128), _t(128), _t(4, 136), "out", "shape"),
    (_t(4, 128), _t(128), _t(4, 128, dtype=torch.float16), "out", "dtype"),
    (_t(2, 4, 128), _t(128), _t(4, 2, 128).transpose(0, 1), "out", "flatten"),
    (_t(4, 128), _t(128), None, "x", "CUDA"),  # valid except the device
])
def test_rejected_inputs_name_the_argument(x, w, out, arg, what):
    with pytest.raises(TirxInputError, match=f"rmsnorm: argument '{arg}': expected .*{what}"):
        mod.rmsnorm(x, w, 1e-6, out=out)


def test_bad_eps_and_non_tensor():
    with pytest.raises(TirxInputError, match="argument 'eps'"):
        mod.rmsnorm(_t(4, 128), _t(128), "1e-6")
    with pytest.raises(TirxInputError, match="argument 'weight'"):
        mod.rmsnorm(_t(4, 128), [0.0] * 128)


@pytest.mark.parametrize("x, out", [
    (_t(4, 3072)[:, :2880], _t(4, 2944)[:, :2880]),  # 16-byte row strides != H
    (_t(4, 132)[:, :128], _t(4, 132)[:, :128]),  # 264-byte rows (the general kernel; test_rmsnorm_general.py)
    (_t(4, 124), None),  # H % 8 != 0
    (_t(2, 16392), None),  # H > 16384
])
def test_strided_rows_and_any_h_pass_the_shape_checks(x, out):
    with pytest.raises(TirxInputError, match="argument 'x': expected a CUDA tensor"):
        mod.rmsnorm(x, _t(x.shape[-1]), out=out)


def test_fake_impl_shapes():
    x = torch.empty(3, 37, 4096, dtype=bf16, device="meta")
    w = torch.empty(4096, dtype=bf16, device="meta")
    y = torch.ops.tirx.rmsnorm(x, w, 1e-6)
    assert y.shape == x.shape and y.dtype == bf16 and y.device.type == "meta"
    assert re.search(r"Tensor\(a\d*!\) out", str(torch.ops.tirx.rmsnorm_out.default._schema))


@pytest.mark.parametrize("H", [16, 128, 256, 1024, 2048, 2880, 4096, 5120, 7168, 8192, 11008, 16384])
def test_row_plan_covers_the_row(H):
    p = mod.row_plan(H)
    tpr, rpc, vpt = p["threads_per_row"], p["rows_per_cta"], p["vectors_per_thread"]
    assert tpr * vpt * 8 >= H > tpr * (vpt - 1) * 8  # every vector slot but the last is full
    assert vpt <= 4 and tpr * rpc <= 1024
    assert (tpr <= 32 and tpr & (tpr - 1) == 0) or tpr % 32 == 0


def test_plans_of_the_configs():
    assert mod.row_plan(4096) == {"threads_per_row": 256, "rows_per_cta": 1, "vectors_per_thread": 2}
    assert mod.row_plan(8192) == {"threads_per_row": 512, "rows_per_cta": 1, "vectors_per_thread": 2}
    assert mod.row_plan(5120)["threads_per_row"] == 160  # 5 warps x 4 vectors: exact
    assert mod.row_plan(7168)["threads_per_row"] == 224
    assert mod.row_plan(128) == {"threads_per_row": 16, "rows_per_cta": 8, "vectors_per_thread": 1}
    assert mod.row_plan(1024) == {"threads_per_row": 64, "rows_per_cta": 2, "vectors_per_thread": 2}


def test_protocol_literals():
    tree = ast.parse(open(mod.__file__).read())
    lit = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
           for t in n.targets if isinstance(t, ast.Name) and t.id in ("KERNEL_META", "CONFIGS", "DEFAULTS")}
    assert lit["KERNEL_META"]["name"] == "rmsnorm" and lit["KERNEL_META"]["category"] == "norm"
    labels = [c["label"] for c in lit["CONFIGS"]]
    assert len(labels) == len(set(labels))
    for c in lit["CONFIGS"]:
        for key in ("x_row_stride", "out_row_stride"):
            assert c.get(key, c["H"]) >= c["H"], c["label"]
    assert any(c["H"] % 8 for c in lit["CONFIGS"]) and any(c.get("x_row_stride", 8) % 8 for c in lit["CONFIGS"])
    for shape in ("8192x4096", "32768x8192", "4113x8192", "32x128"):
        assert f"bf16_{shape}" in labels
    assert any("x_row_stride" in c for c in lit["CONFIGS"])
    assert mod.compile_params(**{**mod.DEFAULTS, **lit["CONFIGS"][0]}) == {"dtype": "bfloat16", "H": 4096}
    assert mod.roofline(dtype="bfloat16", M=3, H=128) == {"bytes": 2 * 3 * 128 * 2 + 128 * 2, "flops": 3 * 3 * 128}

