# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Gated DeltaNet decode, bf16 state pool, one token (the wide-vector T = 1 kernel).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/gdn_decode.py
# (gated_delta_rule_decode_pretranspose) and flashinfer/gdn_kernels/gdn_decode_bf16_state.py, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the TIRx generator in _gdn_decode.py.
"""gated_delta_rule_decode_pretranspose with a bf16 state pool ``[pool, HV, 128, 128]`` (K-last), T = 1: the state
read once and written once with 16-byte vectors, fp32 math, q/k L2 norm in the kernel; negative indices read and
write slot 0 (upstream's null buffer)."""

from __future__ import annotations

import os

import torch

from tirx_kernels.ported.flashinfer.gdn_decode import _gdn_decode as _impl

KERNEL_META = {
    "name": "gdn_decode_bf16_wide_vec_t1",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Gated DeltaNet decode, one token, bf16 state pool in place, fp32 math",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["gated_delta_rule_decode_pretranspose"],
}

CONFIGS = [
    {"label": "b64_h16_hv32", "batch": 64},
    {"label": "b1_h16_hv32", "batch": 1},
    {"label": "b8_h16_hv16_pad", "batch": 8, "n_vheads": 16, "pad": True},
    {"label": "b33_h8_hv32_out_idx_i64", "batch": 33, "n_heads": 8, "out_index": True, "index_dtype": "int64"},
    {"label": "b64_h16_hv32_fp16", "batch": 64, "dtype": "float16"},
    {"label": "b64_h16_hv32_nol2norm_bias_bf16", "batch": 64, "use_qk_l2norm": False, "bias_dtype": "bfloat16"},
    {"label": "b19_h4_hv32_ab_f16", "batch": 19, "n_heads": 4, "ab_dtype": "float16"},
]

BENCH_CONFIGS = [
    {"label": "b1_h16_hv32", "batch": 1},
    {"label": "b64_h16_hv32", "batch": 64},
    {"label": "b256_h16_hv32", "batch": 256},
]

DEFAULTS = {
    "n_heads": 16,
    "n_vheads": 32,
    "dtype": "bfloat16",
    "ab_dtype": "bfloat16",
    "bias_dtype": "float32",
    "use_qk_l2norm": True,
    "pad": False,
    "out_index": False,
    "index_dtype": "int32",
}

# The pool is updated in place; its untouched slots are checked bit for bit.
INPLACE = {"initial_state": "initial_state"}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def compile_params(dtype: str, **_) -> dict:
    return {"input_dtype": dtype}


def get_kernel(input_dtype: str):
    return _impl.get_kernel(input_dtype)


def artifact_params() -> list[dict]:
    return [{"input_dtype": d} for d in _impl.INPUT_DTYPES]


def call_samples(rng) -> list[dict]:
    return [{**DEFAULTS, "dtype": d, "batch": rng.choice([1, 3, 64, 512]), "n_heads": h, "n_vheads": hv}
            for d in _impl.INPUT_DTYPES for h, hv in ((16, 32), (8, 32), (16, 16), (4, 8), (32, 64)) for _ in range(2)]


def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(batch: int, n_heads: int, n_vheads: int, dtype: str, ab_dtype: str, bias_dtype: str,
                 use_qk_l2norm: bool, pad: bool, out_index: bool, index_dtype: str, device: str = "cuda",
                 **_) -> dict:
    """A pool of 2 batch + 2 slots (slot 0 the null buffer); distinct source slots, destinations apart from them."""
    g = _generator() if device == "cuda" else torch.Generator().manual_seed(0)
    t, it = _DTYPES[dtype], getattr(torch, index_dtype)
    slots = 2 * batch + 2

    def rn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    order = torch.randperm(slots - 1, generator=g, device=device) + 1
    idx = order[:batch].clone()
    if pad and batch > 1:
        idx[1] = -1
    return {
        "q": rn(batch, 1, n_heads, 128).to(t), "k": rn(batch, 1, n_heads, 128).to(t),
        "v": rn(batch, 1, n_vheads, 128).to(t), "A_log": rn(n_vheads, scale=0.5),
        "a": rn(batch, 1, n_vheads).to(_DTYPES[ab_dtype]), "dt_bias": rn(n_vheads, scale=0.5).to(_DTYPES[bias_dtype]),
        "b": rn(batch, 1, n_vheads).to(_DTYPES[ab_dtype]),
        "initial_state": rn(slots, n_vheads, 128, 128, scale=0.3).to(torch.bfloat16),
        "initial_state_indices": idx.to(it),
        "output_state_indices": order[batch:2 * batch].to(it) if out_index else None,
        "use_qk_l2norm": bool(use_qk_l2norm),
        "output": torch.empty(batch, 1, n_vheads, 128, dtype=t, device=device),
    }


def _normalized(data: dict) -> dict:
    return _impl.normalize(data["q"], data["k"], data["v"], None, data["A_log"], data["a"], data["dt_bias"],
                           data["b"], None, data["output"], data["use_qk_l2norm"], data["initial_state"],
                           data["initial_state_indices"], data["output_state_indices"])


def reference(**data) -> dict:
    n = _normalized(data)
    out, pool = _impl.oracle(**{k: v for k, v in n.items() if k != "out"})
    return {"output": out.unsqueeze(1), "initial_state": pool}


def launch(cfg: dict, data: dict) -> None:
    gated_delta_rule_decode_pretranspose(data["q"], data["k"], data["v"], None, data["A_log"], data["a"],
                                         data["dt_bias"], data["b"], output=data["output"],
                                         use_qk_l2norm=data["use_qk_l2norm"], initial_state=data["initial_state"],
                                         initial_state_indices=data["initial_state_indices"],
                                         output_state_indices=data["output_state_indices"])


def roofline(batch: int, n_heads: int, n_vheads: int, dtype: str, **_) -> dict:
    """The state read and written once (bf16), q / k / v / out once."""
    es = _DTYPES[dtype].itemsize
    return {"bytes": batch * (n_vheads * 128 * 128 * 2 * 2 + (2 * n_heads + 2 * n_vheads) * 128 * es),
            "flops": 8 * batch * n_vheads * 128 * 128}


def _pool_comparator(got, want, cfg, inputs):
    from tirx_kernels.core import harness

    before = inputs["initial_state"]
    lead = before.shape[0]

    def bits(t):
        return t.reshape(lead, -1).contiguous().view(torch.uint8)

    gb, bb = bits(got), bits(before)
    written = (gb != bb).any(1) | (bits(want.to(before.dtype)) != bb).any(1)
    if not torch.equal(gb[~written], bb[~written]):
        raise harness.KernelCheckError("initial_state: a slot the call does not address changed")
    try:
        torch.testing.assert_close(got[written].float(), want[written].float(), atol=2e-2, rtol=2e-2)
    except AssertionError as e:
        raise harness.KernelCheckError(f"initial_state: {str(e)[:600]}") from None
    return {"slots_written": int(written.sum()), "slots_untouched": int((~written).sum())}


COMPARATORS = {"initial_state": _pool_comparator}


def get_baselines(**cfg) -> dict:
    def flashinfer():
        import flashinfer.gdn_decode

        def fn(d):
            pool = d["initial_state"].clone()
            out, _ = flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(
                d["q"], d["k"], d["v"], None, d["A_log"], d["a"], d["dt_bias"], d["b"],
                output=torch.empty_like(d["output"]), use_qk_l2norm=d["use_qk_l2norm"], initial_state=pool,
                initial_state_indices=d["initial_state_indices"], output_state_indices=d["output_state_indices"])
            return {"output": out, "initial_state": pool}
        return fn

    return {"flashinfer": flashinfer}


def gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,  # noqa: N803
                                         use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
                                         output_state_indices=None, intermediate_states_buffer=None,
                                         disable_state_update=False, backend="auto"):
    """FlashInfer 0.7.4's GDN decode for one token with a bf16 state (``state`` [B, HV, V, K] or the pool
    ``initial_state`` with ``initial_state_indices``); returns ``(output, state)``, the state updated in place."""
    import sys

    return _impl.gated_delta_rule_decode_pretranspose(
        sys.modules[__name__], q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
        initial_state_indices, output_state_indices, intermediate_states_buffer, disable_state_update, backend)


@torch.library.custom_op("tirx::gdn_decode_bf16_wide_vec_t1", mutates_args=("pool", "output"))
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
        a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor, idx: torch.Tensor, out_idx: torch.Tensor | None,
        output: torch.Tensor, scale: float, use_qk_l2norm: bool) -> None:
    import sys

    _impl.custom_op_body(sys.modules[__name__], q, k, v, pool, A_log, a, dt_bias, b, idx, out_idx, output, scale,
                         use_qk_l2norm)


@_op.register_fake
def _(*args) -> None:
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
