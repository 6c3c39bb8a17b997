# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's context-parallel chunked Gated DeltaNet prefill (chunk_gated_delta_rule with use_cp, the
# cp_delta_rule_dsl kernels) to Hopper. Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer),
# python/flashinfer/gdn_prefill.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec). Read for
# semantics only. The phases are in _cp.py, the kernels in _kernel.py (+ _wy.py), the checks in _op.py.
"""``chunk_gated_delta_rule`` with context parallelism (``gdn_cp_prefill_sm90``): the seed's ``gdn_cp_prefill_sm100``
on Hopper. Rows with few sequences x state heads leave most SMs idle in ``gdn_prefill_sm90`` (one CTA walks a whole
sequence); here each sequence is cut into P segments (``_cp.segments_for``: a cost model over the SM count): a
transition kernel computes every segment's affine map in parallel, a torch scan chains them, and the prefill
kernel reruns each segment from its true start state. ``use_cp="auto"`` picks P = 1 (the plain kernel) where the
row already fills the machine. Same contract as gdn_prefill_sm90, plus fp16 / bf16 states (converted through fp32
around the kernels)."""

from __future__ import annotations

import functools

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.flashinfer.gdn_prefill import _cp, _kernel, _op
from tirx_kernels.ported.flashinfer.gdn_prefill import gdn_prefill_sm90 as base
from tirx_kernels.ported.flashinfer.gdn_prefill._op import DIM, IO, OP

KERNEL_META = {
    "name": "gdn_cp_prefill_sm90",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Context-parallel chunked Gated DeltaNet prefill (segments of a sequence on different CTAs: "
                   "per-segment affine state maps, an fp32 scan, a rerun from the true states), THD varlen, GQA/GVA",
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

# The seed's bench rows (fp16; f16 states), issue 26's B * H < 132 rows, and ragged / pooled rows with the split
# forced ("segments") so every phase runs on a short batch. Random decays in (0.5, 1) make a segment's transition M
# vanish within a few chunks (0.75^64); the rows without a gate keep it O(1) (only the delta rule's contraction),
# so the maps and the scan are checked there.
CONFIGS = [
    {"label": "fp16_q1_k1_v1_s2048_none_i32", "dtype": "float16", "Hq": 1, "Hv": 1, "seqs": "2048", "final": False},
    {"label": "fp16_q16_k16_v16_s4096+4096_init_f16_i64", "dtype": "float16", "Hq": 16, "Hv": 16, "seqs": "4096x2",
     "init": True, "final": False, "state_dtype": "float16", "cu_dtype": "int64"},
    {"label": "fp16_q16_k16_v64_s192+64_initfinal_f16_i64", "dtype": "float16", "Hq": 16, "Hv": 64,
     "seqs": "192+64", "init": True, "state_dtype": "float16", "cu_dtype": "int64"},
    {"label": "hq2_hv8_s1x65536", "Hq": 2, "Hv": 8, "seqs": "65536"},
    {"label": "hq16_hv16_s1x8192", "Hq": 16, "Hv": 16, "seqs": "8192"},
    {"label": "ragged_hq2_hv4_init_final_p3", "Hq": 2, "Hv": 4, "seqs": "1000+0+1+64+129", "init": True,
     "segments": 3},
    {"label": "gqa_hq8_hk2_fp16_log_pool_outidx_p4", "dtype": "float16", "Hq": 8, "Hv": 2, "seqs": "700+1+0+300",
     "gate": "log", "init": True, "pool": True, "out_index": True, "cu_dtype": "int64", "segments": 4},
    {"label": "nogate_bf16state_p4", "Hq": 4, "Hv": 4, "seqs": "1000+77", "gate": "none", "init": True,
     "state_dtype": "bfloat16", "segments": 4},
    {"label": "nogate_nobeta_p2", "Hq": 4, "Hv": 4, "seqs": "300+77", "gate": "none", "beta": False, "init": True,
     "segments": 2},
    {"label": "nogate_hq2_hv8_s1x16384_p16", "Hq": 2, "Hv": 8, "seqs": "16384", "gate": "none", "init": True,
     "segments": 16},
]

# The seed's rows and issue 26's, and forced splits of the latter (the cost model's candidates: _cp.PHASE1_COST is
# calibrated from them).
BENCH_CONFIGS = [
    {"label": "hq2_hv8_s1x65536", "Hq": 2, "Hv": 8, "seqs": "65536"},
    {"label": "hq2_hv8_s1x65536_p8", "Hq": 2, "Hv": 8, "seqs": "65536", "segments": 8},
    {"label": "hq2_hv8_s1x65536_p16", "Hq": 2, "Hv": 8, "seqs": "65536", "segments": 16},
    {"label": "hq2_hv8_s1x65536_p32", "Hq": 2, "Hv": 8, "seqs": "65536", "segments": 32},
    {"label": "hq16_hv16_s1x8192", "Hq": 16, "Hv": 16, "seqs": "8192"},
    {"label": "hq16_hv16_s1x8192_p4", "Hq": 16, "Hv": 16, "seqs": "8192", "segments": 4},
    {"label": "hq16_hv16_s1x8192_p8", "Hq": 16, "Hv": 16, "seqs": "8192", "segments": 8},
    {"label": "hq16_hv16_s1x8192_p16", "Hq": 16, "Hv": 16, "seqs": "8192", "segments": 16},
    {"label": "fp16_q1_k1_v1_s2048_none_i32", "dtype": "float16", "Hq": 1, "Hv": 1, "seqs": "2048", "final": False},
    {"label": "fp16_q16_k16_v16_s4096+4096_init_f16_i64", "dtype": "float16", "Hq": 16, "Hv": 16, "seqs": "4096x2",
     "init": True, "final": False, "state_dtype": "float16", "cu_dtype": "int64"},
    {"label": "fp16_q16_k16_v64_s192+64_initfinal_f16_i64", "dtype": "float16", "Hq": 16, "Hv": 64,
     "seqs": "192+64", "init": True, "state_dtype": "float16", "cu_dtype": "int64"},
]

DEFAULTS = {**base.DEFAULTS, "state_dtype": "float32", "segments": None}

# The prefill kernel's roundings (gdn_prefill_sm90.TOLERANCE); the transition maps and the fp32 scan add the same
# 16-bit roundings of the state once more per segment boundary (the emulated runs: within the same bounds).
TOLERANCE = base.TOLERANCE
STATE_TOLERANCE = base.STATE_TOLERANCE
STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
COMPARATORS = {"output_state": base._compare_state}


def call_samples(rng) -> list[dict]:
    """The one-kernel prefill's call space (dtypes, head maps, ragged lengths, gates, initial states) with this op's
    own axes: the state dtype and a forced split or the cost model's choice."""
    return [{**call, "state_dtype": rng.choice(list(STATE_DTYPES)), "segments": rng.choice([None, 1, 2, 5, 16])}
            for call in base.call_samples(rng)]


def compile_params(dtype: str = "bfloat16", **_) -> dict:
    """The transition kernel's params (phase 3 runs gdn_prefill_sm90's artifact of the same dtype)."""
    return {"io": dtype}


def get_kernel(io: str):
    return _kernel.build_kernel(io, transition=True)


def artifact_params() -> list[dict]:
    return [{"io": d} for d in _kernel.IO_DTYPES]


def sass_expect(io: str, **_) -> list[str]:
    return base.sass_expect(io)


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines (gdn_prefill_sm90's, with the state dtype)
# ---------------------------------------------------------------------------------------------------------

def prepare_data(state_dtype: str = "float32", segments: int | None = None, **cfg) -> dict:
    data = base.prepare_data(**cfg)
    t = STATE_DTYPES[state_dtype]
    for key in ("initial_state", "output_state"):
        if data[key] is not None:
            data[key] = data[key].to(t)
    data["segments"] = segments
    return data


def reference(**data) -> dict:
    res = base.reference(**data)
    if "output_state" in res:
        res["output_state"] = res["output_state"].to(data["output_state"].dtype).float()
    return res


def launch(cfg: dict, data: dict) -> None:
    chunk_gated_delta_rule(data["q"], data["k"], data["v"], data["g"], data["beta"], None, data["initial_state"],
                           cu_seqlens=data["cu_seqlens"], use_qk_l2norm_in_kernel=data["l2norm"],
                           output=data["output"], output_state=data["output_state"],
                           state_indices=data["state_indices"], gate_domain=data["gate_domain"],
                           output_state_indices=data["output_state_indices"],
                           use_cp=True if data["segments"] else "auto", segments=data["segments"])


def roofline(**cfg) -> dict:
    return base.roofline(**cfg)


def _fp32_states(data: dict) -> dict:
    """A baseline's view of the data: fp32 states (the output pool a fresh fp32 copy, cast back by the caller)."""
    d = dict(data)
    for key in ("initial_state", "output_state"):
        if d[key] is not None:
            d[key] = d[key].float()
    return d


def get_baselines(**cfg) -> dict:
    """fla and FlashInfer (auto: its context-parallel form where it picks it; nocp: never), gdn_prefill_sm90's
    references on fp32 copies of the states, and gdn_prefill_sm90: the non-context-parallel kernel of this
    package."""
    refs = base.get_baselines(**cfg)

    def wrap(build):
        def built():
            fn = build()

            def call(data):
                return fn(_fp32_states(data))
            return call
        return built

    def plain():
        def fn(data):
            d = _fp32_states(data)
            base.launch(cfg, d)
            res = {"output": d["output"]}
            if d["output_state"] is not None:
                res["output_state"] = d["output_state"]
            return res
        return fn

    return {"fla": wrap(refs["fla"]), "flashinfer": wrap(refs["flashinfer"]),
            "flashinfer_nocp": wrap(refs["flashinfer_nocp"]), "gdn_prefill_sm90": plain}


# ---------------------------------------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------------------------------------

_FUNCTIONS = runtime.FunctionCache(__name__)


@functools.lru_cache(maxsize=16)
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _check_states(initial_state, output_state):
    for name, st in (("initial_state", initial_state), ("output_state", output_state)):
        if st is not None and st.dtype not in STATE_DTYPES.values():
            checks.tensor(OP, name, st, dtypes=tuple(STATE_DTYPES.values()))


def _run(q, k, v, g, beta, scale: float, initial_state, cu_seqlens, output, output_state, state_indices,
         output_state_indices, gate_log: bool, use_cp, segments: int | None) -> None:
    """Validated inputs (fp32 states) through the plain kernel (P = 1) or the three phases."""
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        if use_cp is True:
            raise checks.TirxInputError(f"{OP}: argument 'use_cp': the context-parallel form reads cu_seqlens on the "
                                        "host (its plan), which a CUDA graph capture cannot; use 'auto' or False")
        use_cp = False  # "auto" in a capture: the plain kernel
    if q.shape[0] == 0 or use_cp is False:
        _op.run(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
                output_state_indices, gate_log)
        return
    cu_host = [int(x) for x in cu_seqlens.cpu()]
    P = segments or _cp.segments_for([b - a for a, b in zip(cu_host, cu_host[1:])], _op.state_heads(q, v),  # noqa: N806
                                     _sms(q.get_device()))
    if use_cp is True:
        P = max(P, 2)  # noqa: N806
    if P < 2:
        _op.run(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
                output_state_indices, gate_log)
        return
    for name, t in (("q", q), ("k", k), ("v", v), ("output", output)):
        checks.aligned(OP, name, t, 16)
    io = IO[q.dtype]
    transition = _FUNCTIONS.get((io, q.get_device()), lambda: {"io": io}, q.device)
    prefill = _op._FUNCTIONS.get((io, q.get_device()), lambda: {"io": io}, q.device)
    _cp.run(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
            output_state_indices, gate_log, P, cu_host, transition, prefill, _op._dummy(q.device))


def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
                           state_checkpoints=None, checkpoint_cu_starts=None, checkpoint_every_n_tokens=0,
                           use_cp="auto", state_indices=None, backend="auto", max_seqlen=None, *,
                           gate_domain="linear", use_gate_in_kernel=False, A_log=None, dt_bias=None,  # noqa: N803
                           beta_is_logit=False, output_state_indices=None, segments=None):
    """FlashInfer 0.7.4's ``chunk_gated_delta_rule`` (gdn_prefill_sm90's contract) with its context-parallel form:
    ``use_cp`` "auto" (split where the cost model gains), True (split, at least 2 segments), False (never);
    ``segments`` (this port's): the segment count per sequence. States may be fp32, fp16 or bf16 (the kernels run
    on fp32 copies of the rows a call reads / writes). Returns ``output`` [T, Hs, 128] (and the final state)."""
    if cu_seqlens is None:
        raise checks.TirxInputError(f"{OP}: argument 'cu_seqlens': expected the cumulative sequence lengths, got None")
    if checkpoint_every_n_tokens or state_checkpoints is not None or checkpoint_cu_starts is not None:
        raise NotImplementedError(f"{OP}: argument 'state_checkpoints': checkpoints are not implemented yet")
    if backend not in ("auto", "flashinfer"):
        raise NotImplementedError(f"{OP}: argument 'backend': only the native kernel ('auto'), got {backend!r}")
    if use_cp not in ("auto", True, False):
        raise checks.TirxInputError(f"{OP}: argument 'use_cp': expected 'auto', True or False, got {use_cp!r}")
    if segments is not None and (not isinstance(segments, int) or not 1 <= segments <= _cp.MAX_SEGMENTS):
        raise checks.TirxInputError(f"{OP}: argument 'segments': expected None or 1 .. {_cp.MAX_SEGMENTS}, "
                                    f"got {segments!r}")
    del max_seqlen
    g, beta, gate_domain = _op.materialize_gates(g, beta, use_gate_in_kernel, A_log, dt_bias, beta_is_logit,
                                                 gate_domain)
    if use_qk_l2norm_in_kernel:
        checks.tensor(OP, "q", q, dtypes=tuple(IO), ndim=3, cuda=False)
        checks.tensor(OP, "k", k, dtypes=tuple(IO), ndim=3, cuda=False)
        q, k = _op.normalize_qk(q, k)
    _check_states(initial_state, output_state)
    h0 = initial_state if initial_state is None or initial_state.dtype == torch.float32 else initial_state.float()
    ht = output_state if output_state is None or output_state.dtype == torch.float32 else \
        torch.empty(output_state.shape, dtype=torch.float32, device=output_state.device)
    _op.check_inputs(q, k, v, g, beta, scale, h0, cu_seqlens, output, ht, state_indices, output_state_indices,
                     gate_domain)
    scale = DIM ** -0.5 if scale is None else float(scale)
    hs = _op.state_heads(q, v)
    n = cu_seqlens.shape[0] - 1
    if output is None:
        output = torch.empty(q.shape[0], hs, DIM, dtype=q.dtype, device=q.device)
    if output_final_state and output_state is None:
        if state_indices is not None:
            raise checks.TirxInputError(f"{OP}: argument 'output_state': expected the output pool (state_indices), "
                                        "got None")
        output_state = ht = torch.empty(n, hs, DIM, DIM, dtype=torch.float32, device=q.device)
    args = (q, k, v, g, beta, scale, h0, cu_seqlens, output, ht, state_indices, output_state_indices,
            gate_domain == "log")
    if runtime.direct_call(q, k, v, g, beta, h0, cu_seqlens, output, ht, state_indices, output_state_indices):
        _run(*args, use_cp, segments)
        runtime.mark_written(output)
        if ht is not None:
            runtime.mark_written(ht)
    else:
        torch.ops.tirx.gdn_cp_prefill_sm90(*args, str(use_cp), segments or 0)
    if ht is not output_state:  # a 16-bit pool: only the rows the call writes change
        rows = _written(ht, cu_seqlens, state_indices, output_state_indices)
        output_state[rows] = ht[rows].to(output_state.dtype)
    return (output, output_state) if output_final_state else output


@torch.library.custom_op("tirx::gdn_cp_prefill_sm90", mutates_args=("output", "output_state"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor | None,
               scale: float, initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor, output: torch.Tensor,
               output_state: torch.Tensor | None, state_indices: torch.Tensor | None,
               output_state_indices: torch.Tensor | None, gate_log: bool, use_cp: str, segments: int) -> None:
    _run(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
         output_state_indices, gate_log, {"True": True, "False": False}.get(use_cp, "auto"), segments or None)


@_custom_op.register_fake
def _(*args) -> None:
    return None


def _written(ht, cu_seqlens, state_indices, output_state_indices):
    n = cu_seqlens.shape[0] - 1
    dst = output_state_indices if output_state_indices is not None else state_indices
    if dst is None:
        return torch.arange(n, device=ht.device)
    dst = dst.long()
    return dst[dst >= 0]


run_test, run_bench = harness.bind(__name__)
