# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's attention-state merges (merge_state, merge_state_in_place, merge_states).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/attention/cascade.cuh
# (MergeStateKernel, MergeStateInPlaceKernel, MergeStatesKernel), attention/state.cuh (state_t) and
# python/flashinfer/cascade.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: same semantics (fp32 math, one rounding of v), different kernel structure.
"""Merging partial attention states (v, base-2 log-sum-exp s) of disjoint key sets, bf16/fp16 v, fp32 s.

``w_k = exp2(s_k - max_j s_j)``, ``v = sum_k w_k v_k / sum_k w_k``, ``s = max_j s_j + log2(sum_k w_k)``.

One artifact per (op, dtype) serves every call: S, H, D and every stride are run-time arguments. A row (one
position, one head) is ``2**log2_tpr`` consecutive threads of a 128-thread CTA (the power of two >= D / 8;
D = 64 .. 1024 in multiples of 8 takes 8 .. 128 lanes), one 16-byte vector of every state a thread, so a CTA
holds ``128 >> log2_tpr`` whole rows; only the in-place op needs that (a row's lanes all read s before lane 0
writes it: one ``__syncthreads`` between), the others just use it. The grid is (position blocks, head blocks),
so a thread finds its row with shifts, no division (``plan``); a thread of the pair / in-place kernels takes
two rows on large grids. Each thread issues its LSE loads and all its 16-byte vector loads before any math
(``vector.after_all``); merge_states takes 4 states a loop trip. Offsets are 64-bit (position x stride + head x
stride); a call of more than ~2**31 rows runs in several launches. The TIRx functions are in
``_merge_state_kernels.py``; this module holds the geometry, the harness protocol and the public ops.

-inf LSE (an empty key set): its weight is 0. Where every state of a row is -inf, v = 0 and s = -inf (what
FlashInfer's merge_states gives for zero states; its two-state kernels give NaN there, ``-inf - -inf``, and its
merge_states gives NaN whenever the first state is -inf: those edge rows skip the FlashInfer comparison).
Launched as a programmatic dependent (``core.lang.pdl``), as the other row kernels.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, harness, runtime

KERNEL_META = {
    "name": "merge_state",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Merge attention states (v, base-2 LSE): merge_state, merge_state_in_place, merge_states",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4"},
    ],
    "public_ops": ["merge_state", "merge_state_in_place", "merge_states"],
}

CONFIGS = [
    {"label": "bf16_s37_h8_d64", "op": "merge_state", "dtype": "bfloat16", "S": 37, "H": 8, "D": 64},
    {"label": "bf16_s37_h8_d128", "op": "merge_state", "dtype": "bfloat16", "S": 37, "H": 8, "D": 128},
    {"label": "bf16_s37_h8_d256", "op": "merge_state", "dtype": "bfloat16", "S": 37, "H": 8, "D": 256},
    {"label": "bf16_s37_h8_d512", "op": "merge_state", "dtype": "bfloat16", "S": 37, "H": 8, "D": 512},
    {"label": "fp16_s37_h8_d64", "op": "merge_state", "dtype": "float16", "S": 37, "H": 8, "D": 64},
    {"label": "fp16_s37_h8_d128", "op": "merge_state", "dtype": "float16", "S": 37, "H": 8, "D": 128},
    {"label": "fp16_s37_h8_d256", "op": "merge_state", "dtype": "float16", "S": 37, "H": 8, "D": 256},
    {"label": "fp16_s37_h8_d512", "op": "merge_state", "dtype": "float16", "S": 37, "H": 8, "D": 512},
    # The upstream test shape, odd D (lanes past D / 8 idle), the largest D, no rows.
    {"label": "fp16_s512_h32_d128", "op": "merge_state", "dtype": "float16", "S": 512, "H": 32, "D": 128},
    {"label": "bf16_s37_h3_d200", "op": "merge_state", "dtype": "bfloat16", "S": 37, "H": 3, "D": 200},
    {"label": "bf16_s5_h2_d1024", "op": "merge_state", "dtype": "bfloat16", "S": 5, "H": 2, "D": 1024},
    {"label": "bf16_s0_h8_d128", "op": "merge_state", "dtype": "bfloat16", "S": 0, "H": 8, "D": 128},
    # -inf LSE rows (one side, both sides) and strided rows (v of a [S, H, 2D] buffer, s of [S, 2H]).
    {"label": "bf16_s37_h8_d128_neginf", "op": "merge_state", "dtype": "bfloat16", "S": 37, "H": 8, "D": 128,
     "edge": "neg_inf"},
    {"label": "fp16_s37_h8_d128_strided", "op": "merge_state", "dtype": "float16", "S": 37, "H": 8, "D": 128,
     "strided": True},
    # merge_state_in_place: with and without mask, -inf rows, strided.
    {"label": "inplace_bf16_s37_h8_d128", "op": "merge_state_in_place", "dtype": "bfloat16", "S": 37, "H": 8,
     "D": 128},
    {"label": "inplace_fp16_s37_h8_d512_mask", "op": "merge_state_in_place", "dtype": "float16", "S": 37, "H": 8,
     "D": 512, "mask": True},
    {"label": "inplace_fp16_s512_h32_d128_mask", "op": "merge_state_in_place", "dtype": "float16", "S": 512,
     "H": 32, "D": 128, "mask": True},
    {"label": "inplace_bf16_s37_h8_d64_neginf", "op": "merge_state_in_place", "dtype": "bfloat16", "S": 37, "H": 8,
     "D": 64, "edge": "neg_inf"},
    {"label": "inplace_bf16_s37_h8_d256_strided", "op": "merge_state_in_place", "dtype": "bfloat16", "S": 37,
     "H": 8, "D": 256, "strided": True},
    # merge_states: N states, N = 0 and 1, -inf states, strided.
    {"label": "states_fp16_s37_n5_h8_d128", "op": "merge_states", "dtype": "float16", "S": 37, "N": 5, "H": 8,
     "D": 128},
    {"label": "states_bf16_s512_n16_h32_d128", "op": "merge_states", "dtype": "bfloat16", "S": 512, "N": 16,
     "H": 32, "D": 128},
    {"label": "states_bf16_s37_n3_h8_d512", "op": "merge_states", "dtype": "bfloat16", "S": 37, "N": 3, "H": 8,
     "D": 512},
    {"label": "states_bf16_s37_n1_h8_d64", "op": "merge_states", "dtype": "bfloat16", "S": 37, "N": 1, "H": 8,
     "D": 64},
    {"label": "states_fp16_s37_n0_h8_d64", "op": "merge_states", "dtype": "float16", "S": 37, "N": 0, "H": 8,
     "D": 64},
    {"label": "states_fp16_s37_n6_h8_d128_neginf", "op": "merge_states", "dtype": "float16", "S": 37, "N": 6,
     "H": 8, "D": 128, "edge": "neg_inf"},
    {"label": "states_bf16_s37_n5_h8_d256_strided", "op": "merge_states", "dtype": "bfloat16", "S": 37, "N": 5,
     "H": 8, "D": 256, "strided": True},
]

BENCH_CONFIGS = [
    {"label": "bf16_s16384_h32_d128", "op": "merge_state", "dtype": "bfloat16", "S": 16384, "H": 32, "D": 128},
    {"label": "fp16_s128_h32_d128", "op": "merge_state", "dtype": "float16", "S": 128, "H": 32, "D": 128},
    {"label": "fp16_s2048_h32_d128", "op": "merge_state", "dtype": "float16", "S": 2048, "H": 32, "D": 128},
    {"label": "inplace_bf16_s16384_h32_d128", "op": "merge_state_in_place", "dtype": "bfloat16", "S": 16384,
     "H": 32, "D": 128},
    {"label": "states_bf16_s2048_n8_h32_d128", "op": "merge_states", "dtype": "bfloat16", "S": 2048, "N": 8,
     "H": 32, "D": 128},
]

DEFAULTS = {"op": "merge_state", "dtype": "bfloat16"}

# The in-place op overwrites its inputs v and s; the out-of-place ops name their outputs v and s too (their
# inputs are v_a/s_a/v_b/s_b and v_all/s_all) and prepare_data fills them with NaN, so one module-wide mapping
# serves all three and the out-of-place outputs are still checked for being written everywhere.
INPLACE = {"v": "v", "s": "s"}

OPS = ("merge_state", "merge_state_in_place", "merge_states")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_VEC = 8  # 16-bit elements per 16-byte vector
THREADS = 128
LOG2_THREADS = 7
MAX_D = _VEC * THREADS  # one vector a thread, a row inside one CTA
STATES_PER_TRIP = 4  # merge_states: vector loads in flight a thread
ROWS_PER_THREAD = 2  # the most rows a thread of the pair / in-place kernels takes (lu <= 1)
MAX_GRID_Y = 65535
# A thread of the pair / in-place kernels takes 2 rows where the 1-row grid would have more CTAs than this
# (s2048 h32 d128: 8192 CTAs -> 4096, ~2 waves of 16 resident 128-thread CTAs on 132 SMs; s128: 512 CTAs keep
# 1 row a thread, the latency-bound case). Not yet timed against the alternative: tools/gpu_calls/merge.sh times
# both (a bench config's ``rows_per_thread``).
TWO_ROWS_ABOVE_CTAS = 1024
PDL = "end"
_NEG_INF = float("-inf")


def sass_expect(**_) -> list[str]:
    return [r"LDG\.E\.128", r"STG\.E\.128"]


def compile_params(**cfg) -> dict:
    """One artifact per (op, dtype): S, H, D and strides are run-time arguments."""
    return {"op": cfg["op"], "dtype": cfg["dtype"]}


def artifact_params() -> list[dict]:
    return [compile_params(op=op, dtype=t) for op in OPS for t in _DTYPES]


def call_samples(rng) -> list[dict]:
    """Every op and dtype, the catalog head dims and random multiples of 8 up to MAX_D."""
    from tirx_kernels.core import model_dims

    ds = list(model_dims.head_dims()) + [8 * rng.randint(1, MAX_D // 8) for _ in range(6)] + [8, MAX_D]
    return [{"op": op, "dtype": t, "S": rng.choice([0, 1, 37, 16384]), "N": rng.randint(0, 9),
             "H": rng.randint(1, 64), "D": d} for op in OPS for t in _DTYPES for d in ds]


def log2_threads_per_row(D: int) -> int:
    """Lanes of a row: the power of two >= D / 8."""
    return max(0, (D // _VEC - 1).bit_length())


def plan(S: int, H: int, D: int, op: str = "merge_state", rows_per_thread: int | None = None) -> dict:
    """The launch geometry (``_merge_state_kernels``' docstring): ``lt, lh, lp, lu`` (log2 of the lanes a row,
    the heads a CTA, the positions a CTA slice, the rows a thread) and ``grid`` (x, y) for S positions of H heads
    (``_run`` launches H > MAX_GRID_Y << lh in several head ranges). ``rows_per_thread`` (1 or 2; the pair and
    in-place ops) overrides the choice by grid size."""
    lt = log2_threads_per_row(D)
    lh = min(LOG2_THREADS - lt, max(0, (H - 1).bit_length()))
    lp = LOG2_THREADS - lt - lh
    gy = -(-H // (1 << lh))
    if op == "merge_states":
        lu = 0
    elif rows_per_thread is None:
        lu = int(-(-S // (1 << lp)) * gy > TWO_ROWS_ABOVE_CTAS)
    elif rows_per_thread in (1, 2):
        lu = rows_per_thread - 1
    else:
        raise ValueError(f"merge_state: rows_per_thread must be 1 or 2, got {rows_per_thread!r}")
    return {"lt": lt, "lh": lh, "lp": lp, "lu": lu, "grid": (-(-S // (1 << (lp + lu))), gy)}


def get_kernel(op: str, dtype: str, pdl: str | None = PDL):
    if op not in OPS:
        raise ValueError(f"merge_state: op {op!r} is not one of {OPS}")
    if dtype not in _DTYPES:
        raise ValueError(f"merge_state: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    from ._merge_state_kernels import build

    return build(op, dtype, pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _randn(g, shape, dtype, strided: bool, last_pad: int):
    """Random values of ``shape``; ``strided``: a view into a buffer whose last dim is ``last_pad`` times wider
    (rows keep 16-byte alignment: the pad multiplies a multiple of 8)."""
    if not strided:
        return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    full = torch.randn((*shape[:-1], shape[-1] * last_pad), generator=g, device="cuda", dtype=torch.float32)
    return full.to(dtype)[..., :shape[-1]]


def _lse(g, shape, strided: bool, edge: str | None, every: int = 3):
    """Base-2 LSEs of a few units' spread (weights from ~1e-3 to 1); ``edge="neg_inf"``: every ``every``-th row
    (flat over positions and heads) -inf, so two tensors with every = 3 and 2 share the -inf rows 6k."""
    s = (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * 3).contiguous()
    if edge == "neg_inf":
        idx = torch.arange(s.numel(), device="cuda").view(shape)
        s[idx % every == 0] = _NEG_INF
    if strided:
        full = torch.full((*shape[:-1], 2 * shape[-1]), 7.0, device="cuda")
        full[..., :shape[-1]] = s
        return full[..., :shape[-1]]
    return s


def prepare_data(op: str, dtype: str, S: int, H: int, D: int, N: int = 2, edge: str | None = None,
                 strided: bool = False, mask: bool = False, **_) -> dict:
    g = _generator()
    t = _DTYPES[dtype]
    if op == "merge_states":
        data = {"v_all": _randn(g, (S, N, H, D), t, strided, 2), "s_all": _lse(g, (S, N, H), strided, edge)}
        if edge == "neg_inf" and S and N:
            data["s_all"][: S // 2, :] = _NEG_INF  # rows with every state empty
    else:
        a, b = ("v", "v_other") if op == "merge_state_in_place" else ("v_a", "v_b")
        data = {a: _randn(g, (S, H, D), t, strided, 2), "s" + a[1:]: _lse(g, (S, H), strided, edge),
                b: _randn(g, (S, H, D), t, strided, 3), "s" + b[1:]: _lse(g, (S, H), strided, edge, 2)}
        if op == "merge_state_in_place":
            data["mask"] = (torch.rand(S, generator=g, device="cuda") < 0.6) if mask else None
            return data
    data["v"] = torch.full((S, H, D), float("nan"), device="cuda", dtype=t)
    data["s"] = torch.full((S, H), float("nan"), device="cuda")
    return data


def _merge_fp32(vs: torch.Tensor, ss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: ``vs`` [S, K, H, D], ``ss`` [S, K, H] -> (v [S, H, D], s [S, H]) in fp32; all-empty rows
    (every LSE -inf, or K = 0) give v = 0, s = -inf."""
    vs, ss = vs.float(), ss.float()
    if ss.shape[1] == 0:
        return vs.new_zeros(vs.shape[0], *vs.shape[2:]), ss.new_full((ss.shape[0], ss.shape[2]), _NEG_INF)
    m = ss.amax(dim=1)
    ms = torch.where(m == _NEG_INF, torch.zeros_like(m), m)
    w = torch.exp2(ss - ms[:, None])
    d = w.sum(dim=1)
    v = (w[..., None] * vs).sum(dim=1) / torch.where(d > 0, d, torch.ones_like(d))[..., None]
    return v, ms + torch.log2(d)


def reference(v_a=None, s_a=None, v_b=None, s_b=None, v=None, s=None, v_other=None, s_other=None, mask=None,
              v_all=None, s_all=None, **_) -> dict:
    if v_all is not None:
        out_v, out_s = _merge_fp32(v_all, s_all)
    elif v_a is not None:
        out_v, out_s = _merge_fp32(torch.stack([v_a, v_b], 1), torch.stack([s_a, s_b], 1))
    else:
        out_v, out_s = _merge_fp32(torch.stack([v, v_other], 1), torch.stack([s, s_other], 1))
        if mask is not None:
            keep = ~mask.bool()
            out_v[keep] = v[keep].float()
            out_s[keep] = s[keep].float()
    return {"v": out_v, "s": out_s}


def _compare_lse(got, want, cfg, inputs):
    """s may be -inf (an all-empty row): -inf exactly where the oracle has it, the rest within 1e-5 relative
    (plus 1e-4 absolute: log2 of a sum of a few weights in fp32)."""
    inf_w, inf_g = want == _NEG_INF, got == _NEG_INF
    if not torch.equal(inf_w, inf_g):
        raise harness.KernelCheckError(f"-inf at {int((inf_w != inf_g).sum())} rows where the oracle differs")
    g, w = got[~inf_w], want[~inf_w]
    if not torch.isfinite(g).all():
        raise harness.KernelCheckError(f"{int((~torch.isfinite(g)).sum())} non-finite values")
    bad = (g - w).abs() > 1e-4 + 1e-5 * w.abs()
    if bad.any():
        raise harness.KernelCheckError(f"{int(bad.sum())} of {g.numel()} values beyond 1e-4 + 1e-5*|ref| "
                                       f"(max diff {(g - w).abs().max().item():.3g})")
    return {"max_abs": (g - w).abs().max().item() if g.numel() else 0.0, "neg_inf_rows": int(inf_w.sum())}


COMPARATORS = {"s": _compare_lse}


def launch(cfg: dict, data: dict) -> None:
    op = cfg["op"]
    if cfg.get("rows_per_thread") is not None:  # the geometry knob (timing): the kernel without the public op
        rpt = cfg["rows_per_thread"]
        if op == "merge_state_in_place":
            _run(op, (data["v"], data["s"], data["v_other"], data["s_other"], data["mask"]), None, rpt)
        elif op == "merge_states":
            _run(op, (data["v_all"], data["s_all"]), (data["v"], data["s"]), rpt)
        else:
            _run(op, (data["v_a"], data["s_a"], data["v_b"], data["s_b"]), (data["v"], data["s"]), rpt)
        return
    if op == "merge_state_in_place":
        merge_state_in_place(data["v"], data["s"], data["v_other"], data["s_other"], mask=data["mask"])
    elif op == "merge_states":
        merge_states(data["v_all"], data["s_all"], out=(data["v"], data["s"]))
    else:
        merge_state(data["v_a"], data["s_a"], data["v_b"], data["s_b"], out=(data["v"], data["s"]))


def roofline(op: str, dtype: str, S: int, H: int, D: int, N: int = 2, **_) -> dict:
    """Each state read once, the merged state written once (2-byte v, 4-byte s); at least 1 byte, so that the
    empty (S = 0) correctness row still has a model."""
    k = N if op == "merge_states" else 2
    row = D * 2 + 4
    return {"bytes": max(1, (k + 1) * S * H * row), "flops": 3 * k * S * H * D}


def get_baselines(**cfg) -> dict:
    op, D = cfg.get("op", "merge_state"), int(cfg.get("D", 128))

    def torch_fn(compiled: bool):
        def f(vs, ss):
            return _merge_fp32(vs, ss)

        g = torch.compile(f, dynamic=False) if compiled else f

        def fn(data):
            if op == "merge_states":
                v, s = g(data["v_all"], data["s_all"])
            elif op == "merge_state":
                v, s = g(torch.stack([data["v_a"], data["v_b"]], 1), torch.stack([data["s_a"], data["s_b"]], 1))
            else:
                v, s = g(torch.stack([data["v"], data["v_other"]], 1), torch.stack([data["s"], data["s_other"]], 1))
                if data["mask"] is not None:
                    keep = ~data["mask"].bool()
                    v[keep], s[keep] = data["v"][keep].float(), data["s"][keep]
            return {"v": v.to(data["v"].dtype), "s": s}
        return fn

    def flashinfer():
        if cfg.get("edge") == "neg_inf":
            raise ImportError("flashinfer's merges give NaN where every state of a row is -inf (and merge_states "
                              "where the first is); this config's edge rows have them")
        if int(cfg.get("S", 1)) == 0 or (op == "merge_states" and int(cfg.get("N", 2)) == 0):
            raise ImportError("flashinfer's merges are not run on an empty grid (S = 0) or with no states (N = 0)")
        if D not in (64, 128, 256, 512):
            raise ImportError(f"flashinfer's merge kernels take D in 64, 128, 256, 512 (D={D})")
        import flashinfer.cascade as fc

        def fn(data):
            if op == "merge_states":
                v, s = fc.merge_states(data["v_all"].contiguous(), data["s_all"].contiguous())
            elif op == "merge_state":
                v, s = fc.merge_state(*(data[k].contiguous() for k in ("v_a", "s_a", "v_b", "s_b")))
            else:
                v, s = data["v"].contiguous(), data["s"].contiguous()  # in place, as ours (no per-call copy)
                mask = {} if data["mask"] is None else {"mask": data["mask"].contiguous()}
                fc.merge_state_in_place(v, s, data["v_other"].contiguous(), data["s_other"].contiguous(), **mask)
            return {"v": v, "s": s}
        return fn

    return {"torch": lambda: torch_fn(False), "torch.compile": lambda: torch_fn(True), "flashinfer": flashinfer}


# ---------------------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------------------

_INT32_MAX = 2**31 - 1


def _fail(op: str, name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def _check_v(op: str, name: str, t, ndim: int, cuda: bool = False) -> None:
    checks.tensor(op, name, t, dtypes=tuple(_DTYPES.values()), ndim=ndim, cuda=cuda)
    D = t.shape[-1]
    if D % _VEC or not _VEC <= D <= MAX_D:
        _fail(op, name, f"a head dim (last dim) that is a multiple of {_VEC} in [{_VEC}, {MAX_D}]",
              f"shape {tuple(t.shape)}")
    _check_strides(op, name, t)


def _check_s(op: str, name: str, t, shape) -> None:
    checks.tensor(op, name, t, dtypes=(torch.float32,), shape=shape, inner_contiguous=False, cuda=False)
    _check_strides(op, name, t)


def _check_strides(op: str, name: str, t) -> None:
    for dim in range(t.dim()):
        if t.shape[dim] > 1 and not 0 <= t.stride(dim) <= _INT32_MAX:
            _fail(op, name, f"non-negative strides below 2**31 elements (dim {dim})", f"strides {tuple(t.stride())}")
    if t.dim() and t.shape[-1] > _INT32_MAX:
        _fail(op, name, "sizes below 2**31", f"shape {tuple(t.shape)}")


def _check_out(op: str, out, v_ref, S: int, H: int, D: int) -> None:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        _fail(op, "out", "a pair (v, s) of tensors", type(out).__name__)
    checks.tensor(op, "out[0]", out[0], shape=(S, H, D), cuda=False)
    checks.same_dtype(op, "v", v_ref, **{"out[0]": out[0]})
    _check_strides(op, "out[0]", out[0])
    _check_s(op, "out[1]", out[1], (S, H))


def _devices(op: str, ref_name: str, ref, **others) -> None:
    checks.tensor(op, ref_name, ref, cuda=True)
    checks.same_device(op, ref_name, ref, **{k: v for k, v in others.items() if v is not None})


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states: v_a, v_b [S, H, D] bf16/fp16 (D a multiple of 8 in [8, 1024], unit stride in
    D, 16-byte aligned rows), s_a, s_b [S, H] fp32 base-2 LSEs (any strides). Returns (v [S, H, D], s [S, H] fp32),
    written into ``out`` when given."""
    op = "merge_state"
    _check_v(op, "v_a", v_a, 3)
    S, H, D = v_a.shape
    _check_v(op, "v_b", v_b, 3)
    checks.tensor(op, "v_b", v_b, shape=(S, H, D), cuda=False)
    checks.same_dtype(op, "v_a", v_a, v_b=v_b)
    _check_s(op, "s_a", s_a, (S, H))
    _check_s(op, "s_b", s_b, (S, H))
    if out is not None:
        _check_out(op, out, v_a, S, H, D)
    _devices(op, "v_a", v_a, s_a=s_a, v_b=v_b, s_b=s_b, **({} if out is None else {"out[0]": out[0],
                                                                                     "out[1]": out[1]}))
    if runtime.direct_call(v_a, s_a, v_b, s_b, *(out or ())):
        dst = out if out is not None else _new_out(v_a, S, H, D)
        _run("merge_state", (v_a, s_a, v_b, s_b), dst)
        if out is not None:
            runtime.mark_written(out[0])
            runtime.mark_written(out[1])
        return tuple(dst)
    if out is None:
        return tuple(torch.ops.tirx.merge_state(v_a, s_a, v_b, s_b))
    torch.ops.tirx.merge_state_out(v_a, s_a, v_b, s_b, out[0], out[1])
    return tuple(out)


def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor,
                         mask: torch.Tensor | None = None) -> None:
    """Merge (v_other, s_other) into (v, s) in place; shapes as ``merge_state``. ``mask`` [S] bool/uint8: the
    positions with mask 0 are left untouched (FlashInfer's per-position mask)."""
    op = "merge_state_in_place"
    _check_v(op, "v", v, 3)
    S, H, D = v.shape
    _check_v(op, "v_other", v_other, 3)
    checks.tensor(op, "v_other", v_other, shape=(S, H, D), cuda=False)
    checks.same_dtype(op, "v", v, v_other=v_other)
    _check_s(op, "s", s, (S, H))
    _check_s(op, "s_other", s_other, (S, H))
    if mask is not None:
        checks.tensor(op, "mask", mask, dtypes=(torch.bool, torch.uint8), shape=(S,), inner_contiguous=False,
                      cuda=False)
        _check_strides(op, "mask", mask)
    _devices(op, "v", v, s=s, v_other=v_other, s_other=s_other, mask=mask)
    if runtime.direct_call(v, s, v_other, s_other, mask):
        _run(op, (v, s, v_other, s_other, mask), None)
        runtime.mark_written(v)
        runtime.mark_written(s)
        return
    torch.ops.tirx.merge_state_in_place(v, s, v_other, s_other, mask)


def merge_states(v: torch.Tensor, s: torch.Tensor,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge N states: v [S, N, H, D] bf16/fp16, s [S, N, H] fp32 -> (v [S, H, D], s [S, H]); N = 0 gives
    v = 0, s = -inf."""
    op = "merge_states"
    _check_v(op, "v", v, 4)
    S, N, H, D = v.shape
    _check_s(op, "s", s, (S, N, H))
    if out is not None:
        _check_out(op, out, v, S, H, D)
    _devices(op, "v", v, s=s, **({} if out is None else {"out[0]": out[0], "out[1]": out[1]}))
    if runtime.direct_call(v, s, *(out or ())):
        dst = out if out is not None else _new_out(v, S, H, D)
        _run(op, (v, s), dst)
        if out is not None:
            runtime.mark_written(out[0])
            runtime.mark_written(out[1])
        return tuple(dst)
    if out is None:
        return tuple(torch.ops.tirx.merge_states(v, s))
    torch.ops.tirx.merge_states_out(v, s, out[0], out[1])
    return tuple(out)


def _new_out(v: torch.Tensor, S: int, H: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((S, H, D), dtype=v.dtype, device=v.device),
            torch.empty((S, H), dtype=torch.float32, device=v.device))


_FUNCTIONS = runtime.FunctionCache(__name__)
_DUMMY_MASK: dict = {}


def positions_per_launch(H: int) -> int:
    """Positions one launch takes: its S * H rows, and the position index plus a CTA's span (<= 256 positions),
    stay in int32."""
    return max(1, (_INT32_MAX - 2 * THREADS) // H)


def heads_per_launch(D: int) -> int:
    """Heads one launch takes: its head blocks (``2**lh`` heads, all of a CTA's row slots where H is this
    large) stay within grid y's 65535."""
    return MAX_GRID_Y << (LOG2_THREADS - log2_threads_per_row(D))


_V_ARGS = {"merge_state": ("v_a", "v_b"), "merge_state_in_place": ("v", "v_other"), "merge_states": ("v",)}


def _run(op: str, args: tuple, out, rows_per_thread: int | None = None) -> None:
    """Launch ``op``'s kernel on validated tensors, ``positions_per_launch`` positions and ``heads_per_launch``
    heads a launch, with ``plan``'s geometry. The 16-byte alignment of the v rows is checked here, on real tensors
    (a fake tensor under torch.compile has no address)."""
    v0 = args[0]
    S, H, D = v0.shape[0], v0.shape[-2], v0.shape[-1]
    if S == 0 or H == 0:
        return
    named = dict(zip(_V_ARGS[op], args[::2]))
    if out is not None:
        named["out[0]"] = out[0]
    for name, t in named.items():
        checks.aligned(op, name, t, 16)
    fn = _FUNCTIONS.get((op, v0.dtype, v0.get_device()),
                        lambda: compile_params(op=op, dtype=str(v0.dtype)[6:]), v0.device)
    s_step, h_step = positions_per_launch(H), heads_per_launch(D)
    for h in range(0, H, h_step):
        hs = slice(h, h + h_step)
        for r in range(0, S, s_step):
            ps = slice(r, r + s_step)
            g = plan(min(S - r, s_step), min(H - h, h_step), D, op, rows_per_thread)
            geo = (g["lt"], g["lh"], g["lp"])
            if op == "merge_state_in_place":
                v, s, vo, so, mask = args
                if mask is None:
                    m, use = _DUMMY_MASK.get(v.device), 0
                    if m is None:
                        m = _DUMMY_MASK.setdefault(v.device, torch.ones(1, dtype=torch.uint8, device=v.device))
                else:
                    m, use = mask[ps].view(torch.uint8), 1
                fn(v[ps, hs], s[ps, hs], vo[ps, hs], so[ps, hs], m, use, *geo, g["lu"], 0)
            elif op == "merge_states":
                v, s = args
                fn(v[ps, :, hs], s[ps, :, hs], out[0][ps, hs], out[1][ps, hs], *geo, 0)
            else:
                fn(*(a[ps, hs] for a in args), out[0][ps, hs], out[1][ps, hs], *geo, g["lu"], 0)


@torch.library.custom_op("tirx::merge_state", mutates_args=())
def _merge_state_op(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor,
                    s_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = _new_out(v_a, *v_a.shape)
    _run("merge_state", (v_a, s_a, v_b, s_b), out)
    return out


@_merge_state_op.register_fake
def _(v_a, s_a, v_b, s_b):
    return v_a.new_empty(v_a.shape), s_a.new_empty(v_a.shape[:2])


@torch.library.custom_op("tirx::merge_state_out", mutates_args=("v_out", "s_out"))
def _merge_state_out_op(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                        v_out: torch.Tensor, s_out: torch.Tensor) -> None:
    _run("merge_state", (v_a, s_a, v_b, s_b), (v_out, s_out))


@_merge_state_out_op.register_fake
def _(v_a, s_a, v_b, s_b, v_out, s_out):
    return None


@torch.library.custom_op("tirx::merge_state_in_place", mutates_args=("v", "s"))
def _merge_state_in_place_op(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor,
                             mask: torch.Tensor | None) -> None:
    _run("merge_state_in_place", (v, s, v_other, s_other, mask), None)


@_merge_state_in_place_op.register_fake
def _(v, s, v_other, s_other, mask):
    return None


@torch.library.custom_op("tirx::merge_states", mutates_args=())
def _merge_states_op(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    S, _n, H, D = v.shape
    out = _new_out(v, S, H, D)
    _run("merge_states", (v, s), out)
    return out


@_merge_states_op.register_fake
def _(v, s):
    S, _n, H, D = v.shape
    return v.new_empty((S, H, D)), s.new_empty((S, H))


@torch.library.custom_op("tirx::merge_states_out", mutates_args=("v_out", "s_out"))
def _merge_states_out_op(v: torch.Tensor, s: torch.Tensor, v_out: torch.Tensor, s_out: torch.Tensor) -> None:
    _run("merge_states", (v, s), (v_out, s_out))


@_merge_states_out_op.register_fake
def _(v, s, v_out, s_out):
    return None


run_test, run_bench = harness.bind(__name__)
