# SPDX-License-Identifier: Apache-2.0
"""``fp16_bf16_gemm``'s harness protocol hooks (PROTOCOL.md): inputs, the fp32 oracle, ``launch``, the byte/FLOP
model and the cuBLAS baseline."""

from __future__ import annotations

import os

import torch

from tirx_kernels.gemm._select import is_variant
from tirx_kernels.gemm._tiles import _DTYPES, _OUT_DTYPES


def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(dtype: str, M: int, N: int, K: int, layout: str = "nt", out_dtype: str | None = None,
                 epilogue: str = "none", bias_dtype: str | None = None, alpha: float = 1.0, beta: float = 0.0,
                 **_) -> dict:
    """Inputs and the (NaN-poisoned by the harness) output ``c``. Variants add ``layout`` / ``alpha`` /
    ``beta`` (plain values), a random ``bias`` and, where beta reads the output, a random ``c_in`` that
    ``launch`` copies into ``c`` first (the harness poisons ``c`` itself); both are scaled like the product
    (RMS ~ sqrt(K)) so that they matter."""
    g = _generator()
    t = _DTYPES[dtype]
    a = torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    b = torch.randn(*((N, K) if layout == "nt" else (K, N)), generator=g, device="cuda", dtype=torch.float32).to(t)
    ot = _OUT_DTYPES[out_dtype or dtype]
    c = torch.full((M, N), float("nan"), device="cuda", dtype=ot)
    data = {"a": a, "b": b, "c": c}
    if not is_variant(dtype, layout, out_dtype, epilogue):
        return data
    data["layout"] = layout
    scale = max(K, 1) ** 0.5
    if epilogue in ("bias", "alpha_beta_bias"):
        bias = torch.randn(N, generator=g, device="cuda", dtype=torch.float32) * scale
        data["bias"] = bias.to(_OUT_DTYPES[bias_dtype or dtype])
    if epilogue in ("alpha_beta", "alpha_beta_bias"):
        data["alpha"], data["beta"] = float(alpha), float(beta)
        if beta != 0:
            data["c_in"] = (torch.randn(M, N, generator=g, device="cuda", dtype=torch.float32) * scale).to(ot)
    return data


def reference(a, b, layout: str = "nt", bias=None, c_in=None, alpha: float = 1.0, beta: float = 0.0, **_) -> dict:
    """fp32 oracle: alpha * (a @ op(b)) + beta * c_in + bias."""
    r = a.float() @ (b.float().T if layout == "nt" else b.float())
    if alpha != 1.0:
        r = r * alpha
    if c_in is not None and beta != 0:
        r = r + beta * c_in.float()
    if bias is not None:
        r = r + bias.float()
    return {"c": r}


def launch(cfg: dict, data: dict) -> None:
    from tirx_kernels.gemm.fp16_bf16_gemm import gemm_nn, gemm_nt

    if "c_in" in data:  # beta reads the output: it must hold C_in (the harness poisoned it)
        data["c"].copy_(data["c_in"])
    if not is_variant(cfg["dtype"], cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue")):
        gemm_nt(data["a"], data["b"], out=data["c"], tile=cfg.get("tile"))
        return
    op = gemm_nn if data.get("layout") == "nn" else gemm_nt
    op(data["a"], data["b"], out=data["c"], bias=data.get("bias"), alpha=data.get("alpha", 1.0),
       beta=data.get("beta", 0.0), out_dtype=data["c"].dtype, tile=cfg.get("tile"))


def roofline(dtype: str, M: int, N: int, K: int, out_dtype: str | None = None, epilogue: str = "none",
             bias_dtype: str | None = None, beta: float = 0.0, **_) -> dict:
    elem = 2
    out_elem = 4 if out_dtype == "float32" else 2
    c_bytes = M * N * out_elem * (2 if epilogue in ("alpha_beta", "alpha_beta_bias") and beta != 0 else 1)
    bias_bytes = N * (4 if bias_dtype == "float32" else 2) if epilogue in ("bias", "alpha_beta_bias") else 0
    return {"bytes": (M * K + N * K) * elem + c_bytes + bias_bytes, "flops": 2 * M * N * K}


def get_baselines(**cfg) -> dict:
    plain = not is_variant(cfg["dtype"], cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue"))
    fp32_out = cfg.get("out_dtype") == "float32"
    out_t = _OUT_DTYPES[cfg.get("out_dtype") or cfg["dtype"]]

    def cublas():
        import torch.nn.functional as F

        if plain:
            return lambda data: {"c": F.linear(data["a"], data["b"])}

        def variant(data):
            # cuBLAS GEMM in the input dtype (fp32 GEMM of the upcast inputs for fp32 out), epilogue in fp32.
            a, b = (data["a"].float(), data["b"].float()) if fp32_out else (data["a"], data["b"])
            r = (F.linear(a, b) if data.get("layout", "nt") == "nt" else a @ b).float() * data.get("alpha", 1.0)
            if "c_in" in data:
                r = r + data["beta"] * data["c_in"].float()
            if "bias" in data:
                r = r + data["bias"].float()
            return {"c": r.to(out_t)}  # (the baseline sees the inputs only, not "c")

        return variant

    return {"cublas": cublas}
