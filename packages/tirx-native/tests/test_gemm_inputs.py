# SPDX-License-Identifier: Apache-2.0
"""``gemm_nt`` input validation (CPU only): every rejected input raises ``TirxInputError`` naming the
argument; plus the module's import-time promises (no apache-tvm, literal protocol attributes)."""

import ast

import pytest
import torch

from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.gemm import fp16_bf16_gemm as mod

bf16 = torch.bfloat16


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("a, b, out, arg, what", [
    (_t(64, 64, dtype=torch.float32), _t(64, 64), None, "a", "dtype"),
    (_t(64, 64), _t(64, 64, dtype=torch.float16), None, "b", "dtype"),
    (_t(2, 64, 64), _t(64, 64), None, "a", "dimensions"),
    (_t(64, 64), _t(64), None, "b", "dimensions"),
    (_t(64, 64), _t(64, 72), None, "b", "shape"),  # K mismatch
    (_t(64, 60), _t(64, 60), None, "a", "multiple of 8"),  # K % 8
    (_t(64, 64), _t(60, 64), None, "b", "multiple of 8"),  # N % 8
    (_t(64, 128)[:, ::2], _t(64, 64), None, "a", "contiguous"),
    (_t(64, 64).t(), _t(64, 64), None, "a", "contiguous"),
    (_t(128, 64)[::2], _t(64, 64), None, "a", "contiguous"),
    (_t(64, 64), _t(128, 64)[::2], None, "b", "contiguous"),
    (_t(64, 64), _t(32, 64), _t(64, 64), "out", "shape"),
    (_t(64, 64), _t(32, 64), _t(64, 32, dtype=torch.float16), "out", "dtype"),
    (_t(64, 64), _t(32, 64), _t(64, 64)[:, :32].t(), "out", "shape"),
    (_t(64, 64), _t(32, 64), _t(32, 64).t(), "out", "unit stride"),
    (_t(64, 64), _t(32, 64), None, "a", "CUDA"),  # valid except the device
])
def test_rejected_inputs_name_the_argument(a, b, out, arg, what):
    with pytest.raises(TirxInputError, match=f"gemm_nt: argument '{arg}': expected .*{what}"):
        mod.gemm_nt(a, b, out=out)


def test_non_tensor():
    with pytest.raises(TirxInputError, match="argument 'b'"):
        mod.gemm_nt(_t(8, 8), [[0.0] * 8] * 8)


def test_fake_impl_shapes():
    # register_fake doubles as the Meta kernel: shape inference for torch.compile without a GPU
    a = torch.empty(129, 72, dtype=bf16, device="meta")
    b = torch.empty(264, 72, dtype=bf16, device="meta")
    c = torch.ops.tirx.gemm_nt(a, b)
    assert c.shape == (129, 264) and c.dtype == bf16 and c.device.type == "meta"
    schema = str(torch.ops.tirx.gemm_nt_out.default._schema)
    assert "Tensor(a!) out" in schema


def test_tile_heuristic_and_params():
    assert mod.choose_tile(4096, 4096, 4096) in mod.TILE_CONFIGS
    assert mod.choose_tile(1, 8, 8) in mod.TILE_CONFIGS
    p = mod.compile_params(**{**mod.DEFAULTS, "M": 1000, "N": 1032, "K": 1048})
    assert p == {"dtype": "bfloat16", "tile": "ws_128x256x64_s3"}
    # M, N, K are dynamic: every config of one dtype shares one artifact (per pinned tile, if any)
    def key(c):
        return tuple(sorted(mod.compile_params(**{**mod.DEFAULTS, **c}).items()))

    assert len({key(c) for c in mod.CONFIGS if "tile" not in c}) == 2
    pinned = [c for c in mod.CONFIGS if "tile" in c]
    assert len({key(c) for c in pinned}) == len({(c["dtype"], c["tile"]) for c in pinned})


def test_protocol_literals():
    tree = ast.parse(open(mod.__file__).read())
    lit = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
           for t in n.targets if isinstance(t, ast.Name) and t.id in ("KERNEL_META", "CONFIGS", "DEFAULTS")}
    assert lit["KERNEL_META"]["name"] == "fp16_bf16_gemm" and lit["KERNEL_META"]["runtime_cuda_archs"] == ["sm_90a"]
    labels = [c["label"] for c in lit["CONFIGS"]]
    assert len(labels) == len(set(labels))
    for c in lit["CONFIGS"]:
        assert c["K"] % 8 == 0 and c["N"] % 8 == 0, c["label"]
    r = mod.roofline(dtype="bfloat16", M=2, N=3, K=4)
    assert r == {"bytes": (8 + 12 + 6) * 2, "flops": 48}



def test_unknown_tile_is_rejected():
    a = torch.randn(16, 64).to(torch.bfloat16)
    with pytest.raises(TirxInputError, match="argument 'tile': expected one of"):
        mod.gemm_nt(a, a, tile="no_such_tile")
