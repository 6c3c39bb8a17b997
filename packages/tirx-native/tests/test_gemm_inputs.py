# SPDX-License-Identifier: Apache-2.0
"""``gemm_nt`` input validation (CPU only): every rejected input raises ``TirxInputError`` naming the
argument; plus the module's import-time promises (no apache-tvm, literal protocol attributes)."""

import ast

import pytest
import torch

from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.gemm import _select, _tile_table
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
    (_t(64, 60), _t(64, 60), None, "a", "CUDA"),  # K % 8: accepted (valid except the device)
    (_t(64, 64), _t(60, 64), None, "a", "CUDA"),  # N % 8: accepted
    (_t(64, 64), _t(61, 64), _t(64, 72)[:, :61], "a", "CUDA"),  # an out whose rows are not 16-byte aligned
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
    kind = {t: c.get("kind") for t, c in mod.TILE_CONFIGS.items()}
    assert mod.TILE_TABLE[-1][:3] == (None, None, None)  # a catch-all row
    assert kind[mod.choose_tile(1, 4096, 4096)] == "gemv"
    assert kind[mod.choose_tile(16, 7168, 2048)] == "gemv"
    assert kind[mod.choose_tile(1, 28672, 8192)] == "gemv"
    assert kind[mod.choose_tile(16, 28672, 8192)] == "small_m"
    assert mod.choose_tile(17, 4096, 4096) == "smallm_64x64x64_s12_k2"
    # A gemv tile computes M <= tokens rows only: no table row may give it more.
    for max_m, _, _, tile, *_ in mod.TILE_TABLE:
        if kind[tile] == "gemv":
            assert max_m is not None and max_m <= mod.TILE_CONFIGS[tile]["tokens"], (max_m, tile)
    assert kind[mod.choose_tile(128, 14336, 4096)] == "small_m"
    # M = 512, one wave of tiles: the L2 evict_first twins (M = 1024 keeps the plain tiles).
    assert mod.choose_tile(512, 4096, 4096) == "persistent_128x128x64_s6_g8_ef"
    assert mod.choose_tile(512, 6144, 4096) == "persistent_128x192x64_s4_g8_ef"
    assert mod.choose_tile(1024, 6144, 4096) == "persistent_128x192x64_s4_g8"
    assert mod.choose_tile(512, 2048, 7168) == "persistent_128x64x64_s8_g8_ef"
    assert mod.choose_tile(4096, 4096, 4096) == "persistent_128x256x64_s4_e128_g8"
    assert mod.choose_tile(8192, 4096, 4096) == "persistent_128x256x64_s4_e128_g8"
    assert mod.choose_tile(8192, 8192, 8192) == "persistent_128x256x64_s4_e128_c2_g8"
    assert mod.choose_tile(2048, 7168, 2048) == "pingpong_128x176x64_s5_e64_g8"
    assert mod.choose_tile(512, 28672, 8192) == "pingpong_128x176x64_s5_e64_g8"
    assert mod.choose_tile(8192, 14336, 4096) == "persistent_128x256x64_s4_e128_c2_g8"
    assert mod.choose_tile(8192, 28672, 8192) == "pingpong_128x192x64_s4_e64_g8"
    assert mod.choose_tile(8192, 8192, 28672) == "persistent_128x256x64_s4_e128_g8"
    # n_div rows: the 224-column tile only where N is a whole number of them.
    assert all(len(row) == 4 or (len(row) == 5 and isinstance(row[4], int)) for row in mod.TILE_TABLE)
    assert mod.choose_tile(512, 7168, 2048) == "persistent_128x224x64_s4_g8_ef"
    assert mod.choose_tile(512, 7000, 2048) == "persistent_128x128x64_s6_g8"
    assert mod.choose_tile(128, 28672, 8192) == "smallm_128x224x64_s5_k1"
    p = mod.compile_params(**{**mod.DEFAULTS, "M": 1000, "N": 1032, "K": 1048})
    assert p == {"dtype": "bfloat16", "tile": "persistent_128x128x64_s6_g8"}
    # M, N, K are runtime arguments: an unpinned config's artifact is the heuristic tile's, and a bundle
    # carries every tile the heuristic can pick for both dtypes.
    for c in mod.CONFIGS:
        if "tile" not in c and c["N"] % 8 == 0:  # (odd N: test_gemm_any_shape.py)
            assert mod.compile_params(**{**mod.DEFAULTS, **c})["tile"] == mod.choose_tile(c["M"], c["N"], c["K"])
    table_tiles = {row[3] for row in mod.TILE_TABLE}
    assert {(p["dtype"], p["tile"]) for p in mod.artifact_params() if "layout" not in p and "c_store" not in p} == {
        (d, t) for d in ("bfloat16", "float16") for t in table_tiles}

    def key(c):
        return tuple(sorted(mod.compile_params(**{**mod.DEFAULTS, **c}).items()))

    pinned = [c for c in mod.CONFIGS if "tile" in c]
    variant_keys = ("layout", "out_dtype", "epilogue", "bias_dtype")
    assert len({key(c) for c in pinned}) == len({(c["dtype"], c["tile"], *(c.get(k) for k in variant_keys))
                                                 for c in pinned})


def test_protocol_literals():
    tree = ast.parse(open(mod.__file__).read())
    lit = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
           for t in n.targets if isinstance(t, ast.Name) and t.id in ("KERNEL_META", "CONFIGS", "DEFAULTS")}
    assert lit["KERNEL_META"]["name"] == "fp16_bf16_gemm" and lit["KERNEL_META"]["runtime_cuda_archs"] == ["sm_90a"]
    labels = [c["label"] for c in lit["CONFIGS"]]
    assert len(labels) == len(set(labels))
    for c in lit["CONFIGS"]:
        assert min(c["M"], c["N"], c["K"]) >= 1, c["label"]  # any size (odd N / K: test_gemm_any_shape.py)
    r = mod.roofline(dtype="bfloat16", M=2, N=3, K=4)
    assert r == {"bytes": (8 + 12 + 6) * 2, "flops": 48}



def test_unknown_tile_is_rejected():
    a = torch.randn(16, 64).to(torch.bfloat16)
    with pytest.raises(TirxInputError, match="argument 'tile': expected one of"):
        mod.gemm_nt(a, a, tile="no_such_tile")


# ---------------------------------------------------------------------------------------------------------
# gemm_nn and the epilogue / output-dtype arguments of both ops
# ---------------------------------------------------------------------------------------------------------

f32 = torch.float32


@pytest.mark.parametrize("a, b, out, arg, what", [
    (_t(64, 64), _t(72, 64), None, "b", "shape"),  # B (K, N): K mismatch
    (_t(64, 64), _t(64, 60), None, "a", "CUDA"),  # N % 8 (B's rows): accepted (valid except the device)
    (_t(64, 64), _t(64, 128)[:, ::2], None, "b", "unit stride"),
    (_t(64, 64), _t(32, 64).t(), None, "b", "unit stride"),  # an NT-style B passed to gemm_nn
    (_t(64, 64), _t(128, 32)[::2], None, "b", "contiguous"),
    (_t(64, 64), _t(64, 32, dtype=torch.float16), None, "b", "dtype"),
    (_t(64, 64), _t(64, 32), _t(32, 64), "out", "shape"),
    (_t(64, 64), _t(64, 32), _t(64, 32, dtype=f32), "out", "dtype"),  # fp32 out needs out_dtype=float32
    (_t(64, 64), _t(64, 32), None, "a", "CUDA"),
])
def test_nn_rejected_inputs_name_the_argument(a, b, out, arg, what):
    with pytest.raises(TirxInputError, match=f"gemm_nn: argument '{arg}': expected .*{what}"):
        mod.gemm_nn(a, b, out=out)


@pytest.mark.parametrize("op", ["gemm_nt", "gemm_nn"])
@pytest.mark.parametrize("kwargs, arg, what", [
    ({"bias": _t(40)}, "bias", "shape \\(32\\)"),
    ({"bias": _t(32, 1)}, "bias", "shape"),
    ({"bias": _t(32, dtype=torch.float16)}, "bias", "dtype bfloat16 or float32"),
    ({"bias": _t(64)[::2]}, "bias", "unit stride"),
    ({"bias": [0.0] * 32}, "bias", "torch.Tensor"),
    ({"beta": 0.5}, "beta", "0 when 'out' is not given"),
    ({"alpha": float("nan")}, "alpha", "finite"),
    ({"alpha": torch.tensor(2.0)}, "alpha", "finite Python float"),
    ({"beta": True, "out": _t(64, 32)}, "beta", "finite Python float"),
    ({"out_dtype": torch.float16}, "out_dtype", "bfloat16 .*or float32"),
    ({"out_dtype": f32, "out": _t(64, 32)}, "out", "dtype float32 \\(out_dtype\\)"),
    ({"out_dtype": f32, "out": _t(64, 32, dtype=f32), "tile": "ws_128x256x64_s3"}, "tile", "persistent"),
    ({"bias": _t(32), "tile": "ws_128x256x64_s3"}, "tile", "persistent"),
    ({"alpha": 2.0, "tile": "ws_128x256x64_s3"}, "tile", "persistent"),
    ({"bias": _t(32, dtype=f32), "alpha": 0.5, "beta": -1.0, "out": _t(64, 32, dtype=f32), "out_dtype": f32},
     "a", "CUDA"),  # valid except the device
])
def test_epilogue_args_rejected(op, kwargs, arg, what):
    a = _t(64, 64)
    b = _t(32, 64) if op == "gemm_nt" else _t(64, 32)
    if op == "gemm_nn" and arg == "tile":
        kwargs = {k: v for k, v in kwargs.items() if k not in ("bias", "alpha")}  # NN alone needs persistent
    with pytest.raises(TirxInputError, match=f"{op}: argument '{arg}': expected .*{what}"):
        getattr(mod, op)(a, b, **kwargs)


def test_gemv_tile_rejects_more_rows_than_its_tokens():
    # A gemv tile computes M <= tokens rows: pinned on a taller A it would leave rows unwritten.
    with pytest.raises(TirxInputError, match="gemm_nt: argument 'tile': expected a tile serving M = 9 rows"):
        mod.gemm_nt(_t(9, 64), _t(32, 64), tile="gemv_t8_r1_k16_u2")
    with pytest.raises(TirxInputError, match="argument 'a': expected a CUDA tensor"):  # M = 8 passes the tile check
        mod.gemm_nt(_t(8, 64), _t(32, 64), tile="gemv_t8_r1_k16_u2")


def test_plain_nt_accepts_ws_tile_but_nn_does_not():
    a, b = _t(64, 64), _t(32, 64)
    with pytest.raises(TirxInputError, match="argument 'a': expected a CUDA tensor"):  # past the tile check
        mod.gemm_nt(a, b, tile="ws_128x256x64_s3")
    with pytest.raises(TirxInputError, match="gemm_nn: argument 'tile': expected a persistent tile"):
        mod.gemm_nn(a, b.t().contiguous(), tile="ws_128x256x64_s3")


def test_fake_impls_of_the_new_ops():
    a = torch.empty(129, 72, dtype=bf16, device="meta")
    b_nn = torch.empty(72, 264, dtype=bf16, device="meta")
    c = torch.ops.tirx.gemm_nn(a, b_nn)
    assert c.shape == (129, 264) and c.dtype == bf16 and c.device.type == "meta"
    c = torch.ops.tirx.gemm_nn(a, b_nn, None, None, 2.0, f32)
    assert c.shape == (129, 264) and c.dtype == f32
    b_nt = torch.empty(264, 72, dtype=bf16, device="meta")
    bias = torch.empty(264, dtype=f32, device="meta")
    c = torch.ops.tirx.gemm_nt(a, b_nt, bias=bias, alpha=0.5, out_dtype=f32)
    assert c.shape == (129, 264) and c.dtype == f32
    for name in ("gemm_nt_out", "gemm_nn_out"):
        schema = str(getattr(torch.ops.tirx, name).default._schema)
        assert "Tensor(a!) out" in schema and "Tensor? bias=None" in schema
        assert "float alpha=1." in schema and "float beta=0." in schema
    assert "ScalarType? out_dtype=None" in str(torch.ops.tirx.gemm_nn.default._schema)


def test_variant_compile_params():
    base = {"dtype": "bfloat16", "M": 4096, "N": 4096, "K": 4096}
    # The plain kernel keeps its artifact key: no variant keys at all.
    assert mod.compile_params(**base, layout="nt", out_dtype="bfloat16", epilogue="none") == \
        mod.compile_params(**base)
    # A variant takes the table's tile where that is a persistent one (4096^3: 128x256 s4 e128) ...
    p = mod.compile_params(**base, layout="nn")
    assert p == {"dtype": "bfloat16", "tile": mod.choose_tile(4096, 4096, 4096), "layout": "nn",
                 "out_dtype": "bfloat16", "epilogue": "none"}
    assert mod.TILE_CONFIGS[p["tile"]]["kind"] == "persistent"
    # ... and VARIANT_TILE where the table picks another kernel (ping-pong at 2048 x 7168 x 2048, split-K at M=64,
    # gemv at M=1).
    for m, n, k in ((2048, 7168, 2048), (64, 4096, 4096), (1, 4096, 4096)):
        assert mod.TILE_CONFIGS[mod.choose_tile(m, n, k)]["kind"] != "persistent"
        assert mod.compile_params(dtype="bfloat16", M=m, N=n, K=k, layout="nn")["tile"] == mod.VARIANT_TILE
    assert mod.TILE_CONFIGS[mod.VARIANT_TILE]["kind"] == "persistent"
    p = mod.compile_params(**base, epilogue="bias", tile="persistent_128x128x64_s6_g8")
    assert p["tile"] == "persistent_128x128x64_s6_g8" and p["bias_dtype"] == "bfloat16"
    p = mod.compile_params(**base, out_dtype="float32", epilogue="alpha_beta")
    assert p["out_dtype"] == "float32" and "bias_dtype" not in p


def test_config_rows_match_what_the_op_compiles():
    """A row's epilogue is the one the public op derives from its arguments, so the build test builds the
    artifact the GPU run loads."""
    for c in mod.CONFIGS:
        epi = c.get("epilogue", "none")
        bias = object() if epi in ("bias", "alpha_beta_bias") else None
        assert _select._epilogue(bias, c.get("alpha", 1.0), c.get("beta", 0.0)) == epi, c["label"]
        if mod.is_variant(c["dtype"], c.get("layout"), c.get("out_dtype"), epi):
            assert mod.TILE_CONFIGS[c["tile"]]["kind"] == "persistent", c["label"]


def test_variant_roofline():
    r = mod.roofline(dtype="bfloat16", M=2, N=3, K=4, out_dtype="float32", epilogue="alpha_beta_bias",
                     bias_dtype="float32", beta=1.0)
    assert r == {"bytes": (8 + 12) * 2 + 2 * 6 * 4 + 3 * 4, "flops": 48}


def test_ws_kernel_rejects_variants():
    with pytest.raises(ValueError, match="need a persistent tile"):
        mod.get_kernel("bfloat16", "ws_128x256x64_s3", layout="nn")


def test_variant_avoids_register_tail_tiles(monkeypatch):
    # A persistent tile whose last 32 columns are stored from registers (128x224) builds only the plain kernel:
    # a variant on a shape the table gives such a tile falls back to VARIANT_TILE; the plain op keeps it.
    monkeypatch.setattr(_tile_table, "TILE_TABLE", [(None, None, None, "persistent_128x224x64_s4_g8")])
    base = {"dtype": "bfloat16", "M": 512, "N": 7168, "K": 2048}
    assert mod.compile_params(**base)["tile"] == "persistent_128x224x64_s4_g8"
    assert mod.compile_params(**base, epilogue="bias")["tile"] == mod.VARIANT_TILE


def test_stream_k_tiles_take_only_the_plain_call(monkeypatch):
    # Stream-K tiles build only the plain NT kernel: pinned with nn / bias / fp32 out they are a named input error,
    # and a variant on a shape the table gives such a tile falls back to VARIANT_TILE.
    a, b = _t(64, 64), _t(32, 64)
    tile = "persistent_128x128x64_s6_g8_sk"
    with pytest.raises(TirxInputError, match="argument 'a': expected a CUDA tensor"):  # past the tile check
        mod.gemm_nt(a, b, tile=tile)
    with pytest.raises(TirxInputError, match="gemm_nt: argument 'tile': expected a persistent tile without stream-K"):
        mod.gemm_nt(a, b, bias=_t(32), tile=tile)
    with pytest.raises(TirxInputError, match="gemm_nn: argument 'tile': expected a persistent tile without stream-K"):
        mod.gemm_nn(a, b.t().contiguous(), tile=tile)
    monkeypatch.setattr(_tile_table, "TILE_TABLE", [(None, None, None, tile)])
    base = {"dtype": "bfloat16", "M": 512, "N": 4096, "K": 14336}
    assert mod.compile_params(**base)["tile"] == tile
    assert mod.compile_params(**base, out_dtype="float32")["tile"] == mod.VARIANT_TILE


def test_stream_k_workspace_sizes():
    # One fp32 partial tile per CTA for stream-K tiles, nothing for the others.
    assert mod.workspace_floats("persistent_128x256x64_s4_e128_g8_sk") == 132 * 128 * 256
    assert mod.workspace_floats("persistent_128x224x64_s4_g8_sk") == 132 * 128 * 224
    assert mod.workspace_floats("persistent_128x256x64_s4_e128_g8") == 0
    assert mod.workspace_floats("smallm_64x128x64_s8_k2") == 0


def test_stream_k_refuses_a_gpu_that_cannot_hold_all_its_ctas():
    """Stream-K CTAs wait on each other (issue 29): on fewer SMs than the tile's num_sms, refuse, never hang."""
    from tirx_kernels.core import checks
    from tirx_kernels.gemm import fp16_bf16_gemm as g

    sk = next(t for t, c in g.TILE_CONFIGS.items() if c.get("stream_k"))
    g.check_stream_k_residency(sk, 132)  # an H100 / H200 SXM holds them all
    with pytest.raises(checks.TirxInputError, match="114 SMs"):
        g.check_stream_k_residency(sk, 114)  # H100 PCIe
    g.check_stream_k_residency("persistent_128x256x64_s4_e128_g8", 16)  # no inter-CTA waits: any SM count
