# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's chunked Gated DeltaNet prefill (chunk_gated_delta_rule) to Hopper.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/gdn_prefill.py and
# flashinfer/gdn_kernels/delta_rule_dsl/delta_rule_sm90.py, release v0.7.4 (commit
# 77039051b0be921788dc2784ec41423b558878ec); the algorithm as fla's chunk_gated_delta_rule (fla-core 0.6.0). Read for
# semantics only. The kernel is the TIRx generator in _kernel.py (+ _wy.py); the op is in _op.py.
"""``chunk_gated_delta_rule`` (Gated DeltaNet prefill) on Hopper: THD-packed variable-length sequences, K = V = 128,
bf16/fp16, GQA/GVA, linear or log decay, fp32 initial / final states (optionally rows of state pools).

Registered as ``gdn_prefill_sm90``: the seed's ``gdn_prefill_sm100`` (FlashInfer's Blackwell chunked prefill,
tcgen05/TMEM) redesigned for sm_90a on wgmma. Its correctness rows keep the seed's labels where the seed has them
(``hq{Hq}_hv{Hv}_s{len}x{count}``: GVA, Hk = Hq). One CTA per (state head, sequence): rows with few sequences and
heads leave SMs idle: ``use_cp=True`` hands the call to the context-parallel form (``gdn_cp_prefill_sm90``, whose
op also splits under "auto"); "auto" here is this kernel unsplit, the non-context-parallel baseline."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, delta_rule_ref, harness, runtime
from tirx_kernels.ported.flashinfer.gdn_prefill import _kernel, _op
from tirx_kernels.ported.flashinfer.gdn_prefill._op import DIM, IO, OP

KERNEL_META = {
    "name": "gdn_prefill_sm90",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Chunked Gated DeltaNet prefill (WY/UT transform per 64-token chunk on wgmma, fp32 state in "
                   "registers), THD varlen, GQA/GVA, bf16/fp16",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
        {"package": "fla-core", "import": "fla", "specifier": "==0.6.0", "baseline": "fla"},
    ],
    "public_ops": ["chunk_gated_delta_rule"],
}

# Correctness rows: the seed's head pairs and lengths (GVA), ragged batches with empty and 1-token sequences, GQA,
# fp16, log / linear / no gate, pools (state_indices, output_state_indices with -1), int64 cu_seqlens, l2 norm.
CONFIGS = [
    {"label": "hq8_hv32_s1024x8", "Hq": 8, "Hv": 32, "seqs": "1024x8"},
    {"label": "hq16_hv64_s1x8192", "Hq": 16, "Hv": 64, "seqs": "8192"},
    {"label": "hq32_hv32_s8192x16", "Hq": 32, "Hv": 32, "seqs": "8192x16"},
    {"label": "hq2_hv8_s1x65536", "Hq": 2, "Hv": 8, "seqs": "65536"},
    {"label": "ragged_hq2_hv4_init_final", "Hq": 2, "Hv": 4, "seqs": "70+0+1+64+129+1000", "init": True},
    {"label": "gqa_hq8_hk2_fp16_log_i64", "dtype": "float16", "Hq": 8, "Hv": 2, "seqs": "300+1+63+65",
     "gate": "log", "init": True, "cu_dtype": "int64"},
    {"label": "pool_hq4_hv8_nogate_nobeta", "Hq": 4, "Hv": 8, "seqs": "200+0+77+3", "gate": "none", "beta": False,
     "init": True, "pool": True},
    {"label": "pool_outidx_hq4_hv4_l2norm", "Hq": 4, "Hv": 4, "seqs": "128+5+0+260", "init": True, "pool": True,
     "out_index": True, "l2norm": True},
    {"label": "noinit_nofinal_hq16_hv16", "Hq": 16, "Hv": 16, "seqs": "4096x2+17", "final": False},
]

# The catalog's bench rows (section 1.8) and the anchor, B1 T8192 H16 (FlashInfer CuTe-DSL 156 us, fla 419 us
# on the H200; fla 910 us on the H100).
BENCH_CONFIGS = [
    {"label": "hq16_hv16_s1x8192", "Hq": 16, "Hv": 16, "seqs": "8192"},
    {"label": "hq16_hv64_s1x8192", "Hq": 16, "Hv": 64, "seqs": "8192"},
    {"label": "hq8_hv32_s1024x8", "Hq": 8, "Hv": 32, "seqs": "1024x8"},
    {"label": "hq32_hv32_s8192x16", "Hq": 32, "Hv": 32, "seqs": "8192x16"},
    {"label": "hq2_hv8_s1x65536", "Hq": 2, "Hv": 8, "seqs": "65536"},
]

DEFAULTS = {"dtype": "bfloat16", "Hk": None, "gate": "linear", "beta": True, "init": False, "final": True,
            "cu_dtype": "int32", "pool": False, "out_index": False, "l2norm": False}

# The kernel rounds Sb, Y, Delta, P, T beta and K_d to 16 bits (as FlashInfer's and fla's kernels do); on the fp64
# oracle it lands at a relative Frobenius error of ~3e-3 (bf16) / ~4e-4 (fp16) with single elements at up to ~6e-2
# (bf16) of the output's RMS (the emulated runs of tests/test_gdn_prefill_emulated.py, a torch model of the same
# roundings agrees). The fp32 states (and each baseline: fla and FlashInfer round the same way) at the same level.
TOLERANCE = {"bfloat16": (1.2e-1, 4e-2), "float16": (2e-2, 8e-3)}
STATE_TOLERANCE = {"bfloat16": (1.2e-1, 4e-2), "float16": (2e-2, 8e-3)}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def compile_params(dtype: str = "bfloat16", **_) -> dict:
    """Only the I/O dtype changes the code: lengths, heads, gates, states and indices are run-time arguments."""
    return {"io": dtype}


def get_kernel(io: str):
    return _kernel.build_kernel(io)


def artifact_params() -> list[dict]:
    return [{"io": d} for d in _kernel.IO_DTYPES]


def call_samples(rng) -> list[dict]:
    out = []
    for d in _DTYPES:
        for hq, hv in ((16, 16), (16, 32), (8, 32), (32, 8), (4, 4)) * 2:
            seqs = "+".join(str(rng.choice([0, 1, 63, 64, 65, 1000, 8192])) for _ in range(rng.randint(1, 4)))
            out.append({**DEFAULTS, "dtype": d, "Hq": hq, "Hv": hv, "seqs": seqs,
                        "gate": rng.choice(["linear", "log", "none"]), "init": rng.random() < 0.5})
    return out


def sass_expect(io: str, **_) -> list[str]:
    """The chunk GEMMs on the tensor cores (K-major SS, MN-major B, the inverse's RS), 3-D TMA loads, the register
    split."""
    return [r"HGMMA\.64x64x16\.F32", r"HGMMA\.64x128x16\.F32", r"UTMALDG\.3D", r"USETMAXREG"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def seq_lens(seqs: str) -> list[int]:
    """``"70+0+1"`` -> [70, 0, 1]; ``"1024x8"`` -> eight 1024s (terms combine: ``"4096x2+17"``)."""
    out = []
    for term in seqs.split("+"):
        length, _, count = term.partition("x")
        out += [int(length)] * int(count or 1)
    return out


def _heads(Hq, Hv, Hk=None):  # noqa: N803
    return Hq if Hk is None and Hv >= Hq else (Hv if Hk is None else Hk)


def prepare_data(dtype: str, Hq: int, Hv: int, seqs: str, Hk: int | None = None, gate: str = "linear",  # noqa: N803
                 beta: bool = True, init: bool = False, final: bool = True, cu_dtype: str = "int32",
                 pool: bool = False, out_index: bool = False, l2norm: bool = False, device: str = "cuda") -> dict:
    """Random q, v (normal), k (L2-normalised unless the op normalises), decay in (0.5, 1) as linear alpha or its
    log, beta in (0, 1), a small random initial state; a pool of 2N + 1 rows with a random slot per sequence
    (``out_index``: a separate write slot per sequence, the first one -1: not written)."""
    t = _DTYPES[dtype]
    hk = _heads(Hq, Hv, Hk)
    hs = max(Hq, Hv)
    lens = seq_lens(seqs)
    total, n = sum(lens), len(lens)
    q = torch.randn(total, Hq, 128, device=device).to(t)
    k = torch.randn(total, hk, 128, device=device)
    k = (k if l2norm else torch.nn.functional.normalize(k, dim=-1)).to(t)
    v = torch.randn(total, Hv, 128, device=device).to(t)
    alpha = 0.5 + 0.5 * torch.rand(total, hs, device=device)
    g = None if gate == "none" else (torch.log(alpha) if gate == "log" else alpha)
    b = torch.rand(total, hs, device=device) if beta else None
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(getattr(torch, cu_dtype))
    rows = 2 * n + 1 if pool else n
    h0 = torch.randn(rows, hs, 128, 128, device=device) * 0.05 if init else None
    sidx = oidx = None
    if pool:
        perm = torch.randperm(rows, device=device)
        sidx = perm[:n].to(getattr(torch, cu_dtype))
        if out_index:
            oidx = perm[n:2 * n].to(sidx.dtype)
            oidx[0] = -1
    out = torch.full((total, hs, 128), float("nan"), dtype=t, device=device)
    ht = torch.full((rows, hs, 128, 128), float("nan"), device=device) if final else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": b, "cu_seqlens": cu, "initial_state": h0, "state_indices": sidx,
            "output_state_indices": oidx, "output": out, "output_state": ht,
            "gate_domain": "log" if gate == "log" else "linear", "l2norm": l2norm}


def reference(q, k, v, g, beta, cu_seqlens, initial_state, state_indices, output_state_indices, output,
              output_state, gate_domain, l2norm, **_) -> dict:
    """The fp32 chunked oracle (core.delta_rule_ref) on packed states, gathered from / scattered to the pools; rows
    of an output pool no sequence writes stay NaN (the poison the harness fills)."""
    if l2norm:
        q, k = _op.normalize_qk(q, k)
    n = cu_seqlens.shape[0] - 1
    h0 = initial_state
    if h0 is not None and state_indices is not None:
        idx = state_indices.long()
        h0 = torch.where((idx >= 0)[:, None, None, None], h0[idx.clamp_min(0)], torch.zeros((), device=q.device))
    out, ht = delta_rule_ref.gdn_prefill_chunked(q, k, v, g, beta, None, h0, cu_seqlens, gate_domain=gate_domain)
    res = {"output": out}
    if output_state is not None:
        rows = output_state.shape[0]
        pool_out = torch.full((rows, *ht.shape[1:]), float("nan"), device=q.device)
        dst = torch.arange(n, device=q.device) if state_indices is None else state_indices.long()
        if output_state_indices is not None:
            dst = output_state_indices.long()
        keep = dst >= 0
        pool_out[dst[keep]] = ht[keep]
        res["output_state"] = pool_out
    return res


def _written_rows(inputs: dict, rows: int):
    """Rows of the output states some sequence writes: all N without a pool, else the write slots >= 0."""
    mask = torch.zeros(rows, dtype=torch.bool, device=inputs["q"].device)
    dst = inputs.get("output_state_indices")
    dst = inputs.get("state_indices") if dst is None else dst
    if dst is None:
        mask[:] = True
    else:
        dst = dst.long()
        mask[dst[dst >= 0]] = True
    return mask


def _compare_state(got, want, cfg, inputs):
    """Rows no sequence writes must keep the harness's poison (where the oracle says so: NaN there); written rows
    within the state tolerance (a baseline's unwritten rows are whatever its buffer held: not compared)."""
    written = _written_rows(inputs, got.shape[0])
    if want[~written].isnan().all() and not got[~written].isnan().all():
        raise harness.KernelCheckError("a state pool row no sequence writes was written")
    tol = STATE_TOLERANCE[cfg.get("dtype", "bfloat16")]
    return harness.compare("output_state", got[written], want[written], tol, "the reference")


COMPARATORS = {"output_state": _compare_state}


def launch(cfg: dict, data: dict) -> None:
    chunk_gated_delta_rule(data["q"], data["k"], data["v"], data["g"], data["beta"], None, data["initial_state"],
                           cu_seqlens=data["cu_seqlens"], use_qk_l2norm_in_kernel=data["l2norm"],
                           output=data["output"], output_state=data["output_state"],
                           state_indices=data["state_indices"], gate_domain=data["gate_domain"],
                           output_state_indices=data["output_state_indices"])


def roofline(Hq: int, Hv: int, seqs: str, Hk: int | None = None, init: bool = False, final: bool = True,  # noqa: N803
             dtype: str = "bfloat16", gate: str = "linear", beta: bool = True, **_) -> dict:
    """FLOPs of the chunked algorithm per token and state head (chunk C = 64, d = 128): the state products
    (K S^T, Q S^T, the state update) 3 x 2 d^2, the chunk products (K K^T, Q K^T, T beta Y, P Delta) 4 x 2 C d; the
    64 x 64 inverse is not counted. Bytes: q, k, v, g, beta read once, the output written once, states once."""
    lens = seq_lens(seqs)
    total, n = sum(lens), len(lens)
    hs, hk = max(Hq, Hv), _heads(Hq, Hv, Hk)
    flops = total * hs * (6 * 128 * 128 + 8 * 64 * 128)
    nbytes = 2 * total * 128 * (Hq + hk + Hv + hs) + 4 * total * hs * (int(gate != "none") + int(beta))
    nbytes += 4 * n * hs * 128 * 128 * (int(init) + int(final))
    return {"bytes": nbytes, "flops": flops}


def get_baselines(**cfg) -> dict:
    gqa = cfg["Hq"] > cfg["Hv"]

    def fla():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

        if gqa:
            raise ImportError("fla's chunk_gated_delta_rule has no GQA (q and k heads must be equal)")

        def fn(data):
            q, k = (_op.normalize_qk(data["q"], data["k"]) if data["l2norm"] else (data["q"], data["k"]))
            total, hs = q.shape[0], max(q.shape[1], data["v"].shape[1])
            g = data["g"]
            g = (torch.zeros(total, hs, device=q.device) if g is None
                 else (g if data["gate_domain"] == "log" else torch.log(g)))
            b = data["beta"] if data["beta"] is not None else torch.ones(total, hs, device=q.device)
            h0, sidx = data["initial_state"], data["state_indices"]
            if h0 is not None and sidx is not None:
                h0 = h0[sidx.long().clamp_min(0)].contiguous()
            o, ht = fla_gdn(q[None], k[None], data["v"][None], g[None], b[None], scale=128 ** -0.5,
                            initial_state=h0, output_final_state=True, state_v_first=True,
                            cu_seqlens=data["cu_seqlens"].long())
            res = {"output": o[0]}
            if data["output_state"] is not None:
                res["output_state"] = _scatter_states(data, ht)
            return res
        return fn

    def flashinfer(use_cp):
        def build():
            from flashinfer.gdn_prefill import chunk_gated_delta_rule as fi_gdn

            probe = {k: torch.randn(64, h, 128, device="cuda", dtype=torch.bfloat16) for k, h in
                     (("q", cfg["Hq"]), ("k", _heads(cfg["Hq"], cfg["Hv"], cfg.get("Hk"))), ("v", cfg["Hv"]))}
            try:
                fi_gdn(**probe, cu_seqlens=torch.tensor([0, 64], device="cuda", dtype=torch.int32), use_cp=use_cp)
            except Exception as e:  # noqa: BLE001 -- the CuTe-DSL stack missing or this head map refused: no reference
                raise ImportError(f"FlashInfer's sm90 chunk_gated_delta_rule does not run here: {e}") from e

            def fn(data):
                out_state = data["output_state"]
                o = fi_gdn(data["q"], data["k"], data["v"], data["g"], data["beta"], None, data["initial_state"],
                           out_state is not None, data["cu_seqlens"], data["l2norm"], output=data["output"],
                           output_state=out_state, use_cp=use_cp, state_indices=data["state_indices"],
                           gate_domain=data["gate_domain"], output_state_indices=data["output_state_indices"])
                if out_state is None:
                    return {"output": o}
                return {"output": o[0], "output_state": o[1]}
            return fn
        return build

    return {"fla": fla, "flashinfer": flashinfer("auto"), "flashinfer_nocp": flashinfer(False)}


def _scatter_states(data, ht):
    """fla's packed final states written into the output pool at the rows the call addresses, in place as a serving
    engine would (the harness hands each reference its own copy of the inputs for the correctness check)."""
    pool = data["output_state"]
    n = ht.shape[0]
    dst = torch.arange(n, device=ht.device)
    if data["state_indices"] is not None:
        dst = data["state_indices"].long()
    if data["output_state_indices"] is not None:
        dst = data["output_state_indices"].long()
    keep = dst >= 0
    pool[dst[keep]] = ht[keep]
    return pool


# ---------------------------------------------------------------------------------------------------------
# Public op (validation, the pre-passes and the launch in _op.py)
# ---------------------------------------------------------------------------------------------------------

def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
                           state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0,
                           use_cp="auto", state_indices=None, backend="auto", max_seqlen=None, *,
                           gate_domain="linear", use_gate_in_kernel=False, A_log=None, dt_bias=None,  # noqa: N803
                           beta_is_logit=False, output_state_indices=None):
    """FlashInfer 0.7.4's ``chunk_gated_delta_rule`` on Hopper: q [T, Hq, 128], k [T, Hk, 128], v [T, Hv, 128]
    (bf16/fp16, THD-packed over ``cu_seqlens``; GQA Hq > Hk = Hv or GVA Hv >= Hq = Hk), g (decay: linear alpha, or
    its natural log with ``gate_domain="log"``) and beta fp32 [T, max(Hq, Hv)] (None: ones), fp32 states
    [N, Hs, V, K] (pools with ``state_indices``). Returns ``output`` [T, Hs, 128], and the final state with
    ``output_final_state``."""
    if cu_seqlens is None:
        raise checks.TirxInputError(f"{OP}: argument 'cu_seqlens': expected the cumulative sequence lengths, got None")
    if checkpoint_every_n_tokens or state_checkpoints is not None or checkpoint_cu_starts is not None:
        raise NotImplementedError(f"{OP}: argument 'state_checkpoints': checkpoints are not implemented yet")
    if use_cp is True:  # the context-parallel form: gdn_cp_prefill_sm90 ("auto" here: this kernel, unsplit)
        from tirx_kernels.ported.flashinfer.gdn_prefill import gdn_cp_prefill_sm90

        return gdn_cp_prefill_sm90.chunk_gated_delta_rule(
            q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, output,
            output_state, state_checkpoints, checkpoint_cu_starts, checkpoint_every_n_tokens, True, state_indices,
            backend, max_seqlen, gate_domain=gate_domain, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
            dt_bias=dt_bias, beta_is_logit=beta_is_logit, output_state_indices=output_state_indices)
    if backend not in ("auto", "flashinfer"):
        raise NotImplementedError(f"{OP}: argument 'backend': only the native kernel ('auto'), got {backend!r}")
    del max_seqlen  # a launch-size hint of the context-parallel path
    g, beta, gate_domain = _op.materialize_gates(g, beta, use_gate_in_kernel, A_log, dt_bias, beta_is_logit,
                                                 gate_domain)
    if use_qk_l2norm_in_kernel:
        checks.tensor(OP, "q", q, dtypes=tuple(IO), ndim=3, cuda=False)
        checks.tensor(OP, "k", k, dtypes=tuple(IO), ndim=3, cuda=False)
        q, k = _op.normalize_qk(q, k)
    _op.check_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
                     output_state_indices, gate_domain)
    scale = DIM ** -0.5 if scale is None else float(scale)
    hs = _op.state_heads(q, v)
    n = cu_seqlens.shape[0] - 1
    if output is None:
        output = torch.empty(q.shape[0], hs, DIM, dtype=q.dtype, device=q.device)
    if output_final_state and output_state is None:
        if state_indices is not None:
            raise checks.TirxInputError(f"{OP}: argument 'output_state': expected the output pool (state_indices), "
                                        "got None")
        output_state = torch.empty(n, hs, DIM, DIM, dtype=torch.float32, device=q.device)
    args = (q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
            output_state_indices, gate_domain == "log")
    if runtime.direct_call(q, k, v, g, beta, initial_state, cu_seqlens, output, output_state, state_indices,
                           output_state_indices):
        _op.run(*args)
        runtime.mark_written(output)
        if output_state is not None:
            runtime.mark_written(output_state)
    else:
        torch.ops.tirx.gdn_prefill_sm90(*args)
    return (output, output_state) if output_final_state else output


@torch.library.custom_op("tirx::gdn_prefill_sm90", mutates_args=("output", "output_state"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor | None,
               scale: float, initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor, output: torch.Tensor,
               output_state: torch.Tensor | None, state_indices: torch.Tensor | None,
               output_state_indices: torch.Tensor | None, gate_log: bool) -> None:
    _op.run(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
            output_state_indices, gate_log)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
