# SPDX-License-Identifier: Apache-2.0
"""``silu_and_mul`` / ``gelu_and_mul`` / ``gelu_tanh_and_mul`` input validation (CPU only): every rejected
input raises ``TirxInputError`` naming the argument; the tile plan; import-time promises."""

import ast
import re

import pytest
import torch

from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.activation import act_and_mul as mod

bf16 = torch.bfloat16
OPS = {"silu_and_mul": mod.silu_and_mul, "gelu_and_mul": mod.gelu_and_mul, "gelu_tanh_and_mul": mod.gelu_tanh_and_mul}


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("x, out, arg, what", [
    (_t(4, 256, dtype=torch.float32), None, "x", "dtype"),
    (_t(4, 256, dtype=torch.int16), None, "x", "dtype"),
    (_t(4, 263), None, "x", "multiple of 2"),  # no gate/up halves
    (_t(4, 512)[:, ::2], None, "x", "unit stride"),
    (_t(4, 256), _t(4, 256), "out", "shape"),
    (_t(4, 256), _t(5, 128), "out", "shape"),
    (_t(4, 256), _t(4, 128, dtype=torch.float16), "out", "dtype"),
    (_t(2, 4, 256), _t(4, 2, 128).transpose(0, 1), "out", "flatten"),
    (_t(4, 256), None, "x", "CUDA"),  # valid except the device
    # Accepted since the general kernel (valid except the device): any even last dim, any row stride and offset.
    (_t(4, 264), None, "x", "CUDA"),  # d = 132
    (_t(4, 2), None, "x", "CUDA"),  # d = 1
    (_t(4, 264)[:, :256], None, "x", "CUDA"),
    (_t(4, 260)[:, 1:257], None, "x", "CUDA"),  # rows and data pointer off 16 bytes
    (_t(4, 256), _t(4, 132)[:, 3:131], "x", "CUDA"),
    (_t(3, 5, 2 * 4099), None, "x", "CUDA"),
])
def test_rejected_inputs_name_the_argument(op, x, out, arg, what):
    with pytest.raises(TirxInputError, match=f"{op}: argument '{arg}': expected .*{what}"):
        OPS[op](x, out=out)


def test_big_inputs_get_past_validation():
    """More than 2**31 elements (64-bit offsets) is valid: only the device check refuses a meta tensor (no
    storage), as it would any CPU one."""
    x = torch.empty(2**31 // 8192 + 7, 8192, dtype=bf16, device="meta")
    with pytest.raises(TirxInputError, match="expected a CUDA tensor"):
        mod.silu_and_mul(x)
    with pytest.raises(TirxInputError, match="stride of dim 0 below 2\\*\\*31"):
        mod.silu_and_mul(torch.empty(2, 8, dtype=bf16, device="meta").as_strided((2, 8), (2**31, 1)))


def test_non_tensor():
    with pytest.raises(TirxInputError, match="argument 'x'"):
        mod.silu_and_mul([[0.0] * 16])


def test_fake_impl_shapes():
    x = torch.empty(3, 37, 2 * 4096, dtype=bf16, device="meta")
    y = torch.ops.tirx.act_and_mul(x, "gelu_tanh")
    assert y.shape == (3, 37, 4096) and y.dtype == bf16 and y.device.type == "meta"
    assert re.search(r"Tensor\(a\d*!\) out", str(torch.ops.tirx.act_and_mul_out.default._schema))


@pytest.mark.parametrize("d", [8, 16, 128, 1024, 4096, 11008, 14336, 28672])
def test_tile_plan_covers_the_row(d):
    p = mod.tile_plan(d)
    seg, tps, vpt, rpc = p["segments"], p["threads_per_segment"], p["vectors_per_thread"], p["rows_per_cta"]
    nvec = d // 8
    assert seg * tps * vpt >= nvec > seg * tps * vpt - tps  # at most the last vector slot is partly empty
    assert vpt <= mod.VECTORS_PER_THREAD and tps <= mod.MAX_SEGMENT_THREADS and tps * rpc <= 1024
    assert (tps <= 32 and tps & (tps - 1) == 0) or tps % 32 == 0


def test_bench_shape_divides_exactly():
    assert mod.tile_plan(14336) == {"segments": 7, "threads_per_segment": 256, "vectors_per_thread": 1,
                                    "rows_per_cta": 1}


def test_protocol_literals():
    tree = ast.parse(open(mod.__file__).read())
    lit = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
           for t in n.targets if isinstance(t, ast.Name) and t.id in ("KERNEL_META", "CONFIGS", "DEFAULTS")}
    meta = lit["KERNEL_META"]
    assert meta["name"] == "act_and_mul" and meta["category"] == "ported.flashinfer"
    assert meta["upstream"]["project"] == "flashinfer"
    labels = [c["label"] for c in lit["CONFIGS"]]
    assert len(labels) == len(set(labels)) and "silu_bf16_32768x14336" in labels
    assert {c["act"] for c in lit["CONFIGS"]} == set(mod.ACTS)
    assert {c["dtype"] for c in lit["CONFIGS"]} == {"bfloat16", "float16"}
    assert mod.compile_params(**lit["CONFIGS"][0]) == {"act": "silu", "dtype": "bfloat16", "d": 14336}
    assert mod.roofline(act="silu", dtype="bfloat16", M=2, d=8)["bytes"] == 3 * 2 * 8 * 2

