# SPDX-License-Identifier: Apache-2.0
# Port of cuDNN Frontend's chunked GDN-2 backward (cudnn_sm100_gdn2_bprop_f16) to Hopper.
# Upstream: cudnn-frontend (https://github.com/NVIDIA/cudnn-frontend), python/cudnn/linear_attention/frost/kernel/
# gdn2_bprop_f16.py (chunk_gdn2_bwd_sm100), release v1.28.0 (commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082). Read
# for semantics only.
"""``gdn2_bprop``: the backward of Gated DeltaNet v2 (per-key-channel decay and erase gate beta, per-value-channel
write gate w) over THD-packed sequences, K = V = 128, bf16/fp16, from the forward's 16-token-chunk state checkpoints:
dq, dk, dv, dg (d loss / d log-decay, per key channel), dbeta, dw and the initial state's gradient.

Registered as ``cudnn_sm90_gdn2_bprop_f16`` (the seed's ``cudnn_sm100_gdn2_bprop_f16``). Status as GDN-1's
``gdn_bprop``: the reverse walk of the state gradient is the TIRx wgmma kernel (``_bwd_state_kernel`` at 16-token
chunks, decay per key channel); the chunk-parallel steps are batched torch (``_bwd2_chunks``: the chunk function's
vector-Jacobian product), in slabs of sequences. Correct, not yet fast; no runnable reference besides the oracle
(fla has no GDN-2). The op takes q / k as given (cuDNN's in-kernel L2 norm is the caller's pre-pass here).
"""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.cudnn.linear_attention import _bwd2_chunks as c2
from tirx_kernels.ported.cudnn.linear_attention import _bwd_chunks as ch
from tirx_kernels.ported.cudnn.linear_attention import _bwd_gates as gates
from tirx_kernels.ported.cudnn.linear_attention import _bwd_state_kernel as sk
from tirx_kernels.ported.cudnn.linear_attention import gdn_bprop_f16 as gdn1

KERNEL_META = {
    "name": "cudnn_sm90_gdn2_bprop_f16",
    "category": "ported.cudnn",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Chunked Gated DeltaNet v2 backward (per-key decay and erase gate, per-value write gate) from "
                   "16-token checkpoints: dq, dk, dv, dg, dbeta, dw, dstate0 (state-gradient walk on wgmma, "
                   "chunk-parallel steps in torch), THD varlen, GQA/GVA, bf16/fp16",
    "upstream": {
        "project": "cudnn-frontend",
        "url": "https://github.com/NVIDIA/cudnn-frontend",
        "commit": "1dbd2c09432dfd6cbf13a0ad85a071446398c082",
    },
    "public_ops": ["gdn2_bprop"],
}

CONFIGS = [
    {"label": "ragged_h2_init_dfinal", "H": 2, "seqs": "20+0+1+17", "init": True, "dfinal": True},
    {"label": "ragged_gva_hq1_hv2_i64", "H": 1, "Hv": 2, "seqs": "3+50+0+17", "init": True, "cu_dtype": "int64"},
    {"label": "gqa_hq4_hv2_fp16", "dtype": "float16", "H": 4, "Hv": 2, "seqs": "64+1+15", "dfinal": True},
    {"label": "perf_basic_b1_s2048_h16", "H": 16, "seqs": "2048"},
]

# cuDNN's perf rows (catalog section 2.3) without its in-kernel L2 norm of q / k (the inputs come normalised).
BENCH_CONFIGS = [
    {"label": "perf_basic_b1_s2048_h16", "H": 16, "seqs": "2048"},
    {"label": "perf_b1_s8192_h16", "H": 16, "seqs": "8192"},
    {"label": "perf_b4_s8192_h64", "H": 64, "seqs": "8192x4"},
]

DEFAULTS = {"dtype": "bfloat16", "Hv": None, "init": False, "dfinal": False, "cu_dtype": "int32"}
# As GDN-1's: 16-bit checkpoints, dS and Y rounded in the walk; dbeta / dw come back in the I/O dtype (cuDNN's ABI).
TOLERANCE = {"bfloat16": (4e-2, 4e-2), "float16": (1e-2, 1e-2), "float32": (4e-2, 4e-2)}
OP = "gdn2_bprop"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# (chunk, head) tiles of one torch step of the chunk-parallel work (the pairwise decays are [16, 16, 128] fp32 a
# tile: 0.5 GiB a tensor); the walk takes sequences in runs of up to 4x that many tiles (R and dS' [V, K] fp32 each).
_SLAB_TILES = 4096
_FUNCTIONS = runtime.FunctionCache(__name__)


def compile_params(dtype: str = "bfloat16", **_) -> dict:
    return {"io": dtype}


def get_kernel(io: str):
    return sk.build_kernel(io, c2.CHUNK)


def artifact_params() -> list[dict]:
    return [{"io": d} for d in sk.IO_DTYPES]


def call_samples(rng) -> list[dict]:
    """Both I/O dtypes, MHA / GQA / GVA heads, ragged lengths around the chunk size, optional states, both index
    dtypes: only the dtype picks the artifact."""
    out = []
    for d in _DTYPES:
        for hq, hv in ((1, 1), (4, 4), (16, 16), (64, 64), (8, 2), (2, 8), (4, 16)) * 2:
            seqs = "+".join(str(rng.choice([0, 1, 15, 16, 17, 300, 2048])) for _ in range(rng.randint(1, 4)))
            out.append({**DEFAULTS, "dtype": d, "H": hq, "Hv": hv, "seqs": seqs, "init": rng.random() < 0.5,
                        "dfinal": rng.random() < 0.5, "cu_dtype": rng.choice(["int32", "int64"])})
    return out


def sass_expect(io: str, **_) -> list[str]:
    return [r"HGMMA\.64x16x16\.F32", r"HGMMA\.64x128x16\.F32", r"UTMALDG\.2D"]


def prepare_data(dtype: str, H: int, seqs: str, Hv: int | None = None, init: bool = False,  # noqa: N803
                 dfinal: bool = False, cu_dtype: str = "int32", device: str = "cuda") -> dict:
    """q, k (L2-normalised), v, dO normal; log decay log(U(0.9, 1)) per key channel; beta, w U(0, 1) in the I/O
    dtype; the checkpoints from the fp32 token recurrence, rounded to the I/O dtype; gradients poisoned."""
    t = _DTYPES[dtype]
    hv = H if Hv is None else Hv
    ho = max(H, hv)
    lens = gdn1.seq_lens(seqs)
    total, n = sum(lens), len(lens)
    q = torch.randn(total, H, 128, device=device).to(t)
    k = torch.nn.functional.normalize(torch.randn(total, H, 128, device=device), dim=-1).to(t)
    v = torch.randn(total, hv, 128, device=device).to(t)
    g = torch.log(0.9 + 0.1 * torch.rand(total, ho, 128, device=device))
    beta = torch.rand(total, ho, 128, device=device).to(t)
    w = torch.rand(total, ho, 128, device=device).to(t)
    do = torch.randn(total, ho, 128, device=device).to(t)
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(getattr(torch, cu_dtype))
    h0 = torch.randn(n, ho, 128, 128, device=device) * 0.05 if init else None
    dfs = torch.randn(n, ho, 128, 128, device=device) * 0.05 if dfinal else None
    ckpt = c2.checkpoints_from_recurrence(q, k, v, g, beta, w, cu, None, h0, torch.float32)
    nan = float("nan")
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "w": w, "do": do, "state_checkpoints": ckpt.to(t),
            "cu_seqlens": cu, "initial_state": h0, "d_final_state": dfs,
            "dq": torch.full_like(q, nan), "dk": torch.full_like(k, nan), "dv": torch.full_like(v, nan),
            "dg": torch.full_like(g, nan), "dbeta": torch.full_like(beta, nan), "dw": torch.full_like(w, nan),
            "d_initial_state": torch.full((n, ho, 128, 128), nan, device=device) if init else None}


def reference(q, k, v, g, beta, w, do, cu_seqlens, initial_state, d_final_state, **_) -> dict:
    """Autograd of sum(o * dO) + sum(final * d_final_state) through the fp32 token recurrence (exact states)."""
    return c2.autograd_grads(q, k, v, g, beta, w, do, cu_seqlens, None, initial_state, d_final_state,
                             torch.float32)


def launch(cfg: dict, data: dict) -> None:
    gdn2_bprop(data["q"], data["k"], data["v"], data["g"], data["beta"], data["w"], data["do"],
               data["state_checkpoints"], data["cu_seqlens"], initial_state=data["initial_state"],
               d_final_state=data["d_final_state"], dq=data["dq"], dk=data["dk"], dv=data["dv"], dg=data["dg"],
               dbeta=data["dbeta"], dw=data["dw"], d_initial_state=data["d_initial_state"])


def roofline(H: int, seqs: str, Hv: int | None = None, **_) -> dict:  # noqa: N803
    """GDN-1's product count at C = 16 plus the per-channel pairwise decays (K K^T and Q K^T weighted per channel:
    4 C^2 d FLOPs each way); bytes as GDN-1's plus the per-channel gates (g fp32, beta, w 16-bit) and their
    gradients, checkpoints every 16 tokens."""
    lens = gdn1.seq_lens(seqs)
    total = sum(lens)
    hv = H if Hv is None else Hv
    ho = max(H, hv)
    flops = total * ho * (16 * 128 * 128 + 24 * 16 * 128 + 16 * 16 * 128)
    chunks = sum(-(-n // 16) for n in lens)
    nbytes = 2 * total * 128 * (2 * H + hv + ho) * 2 + total * ho * 128 * (4 + 2 + 2) * 2
    nbytes += 2 * chunks * ho * 128 * 128
    return {"bytes": nbytes, "flops": flops}


def get_baselines(**cfg) -> dict:
    """None runnable: fla has no GDN-2 and cuDNN's GDN-2 backward is Blackwell-only (the oracle is the check)."""
    return {}


def _fail(name: str, expected: str, got: str):
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def check_inputs(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale, d_final_state, initial_state=None):
    io = (torch.bfloat16, torch.float16)
    checks.tensor(OP, "q", q, dtypes=io, ndim=3, contiguous=True, cuda=False)
    total, hq, d = q.shape
    if d != ch.DIM:
        _fail("q", f"head size {ch.DIM}", f"shape {tuple(q.shape)}")
    checks.tensor(OP, "k", k, shape=(total, None, ch.DIM), contiguous=True, cuda=False)
    checks.tensor(OP, "v", v, shape=(total, None, ch.DIM), contiguous=True, cuda=False)
    checks.same_dtype(OP, "q", q, k=k, v=v)
    hk, hv = k.shape[1], v.shape[1]
    ho = max(hq, hv)
    for name, n in (("q", hq), ("k", hk), ("v", hv)):
        if n < 1 or ho % n:
            _fail(name, f"a head count dividing max(HQ, HV) = {ho}", f"{n} heads")
    checks.tensor(OP, "g", g, dtypes=(torch.float32,), shape=(total, ho, ch.DIM), contiguous=True, cuda=False)
    for name, t in (("beta", beta), ("w", w), ("do", do)):
        checks.tensor(OP, name, t, shape=(total, ho, ch.DIM), contiguous=True, cuda=False)
        checks.same_dtype(OP, "q", q, **{name: t})
    checks.tensor(OP, "state_checkpoints", state_checkpoints, shape=(None, ho, ch.DIM, ch.DIM), contiguous=True,
                  cuda=False)
    checks.same_dtype(OP, "q", q, state_checkpoints=state_checkpoints)
    checks.tensor(OP, "cu_seqlens", cu_seqlens, dtypes=(torch.int32, torch.int64), ndim=1, contiguous=True,
                  cuda=False)
    n = cu_seqlens.shape[0] - 1
    if n < 1:
        _fail("cu_seqlens", "at least two entries", f"shape {tuple(cu_seqlens.shape)}")
    for name, st in (("initial_state", initial_state), ("d_final_state", d_final_state)):
        if st is not None:
            checks.tensor(OP, name, st, dtypes=(torch.float32,) + io, shape=(n, ho, ch.DIM, ch.DIM),
                          contiguous=True, cuda=False)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale != 0):
        _fail("scale", "None or a finite nonzero float", repr(scale))
    checks.tensor(OP, "q", q, cuda=True)
    present = {name: t for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), ("w", w), ("do", do),
                                       ("state_checkpoints", state_checkpoints), ("cu_seqlens", cu_seqlens),
                                       ("initial_state", initial_state), ("d_final_state", d_final_state))
               if t is not None}
    checks.same_device(OP, "q", q, **present)


def run(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale, d_final_state, dq, dk, dv, dg, dbeta, dw,
        d_initial_state, fn=None, initial_state=None, layout: str = "pre_chunk") -> None:
    """Validated inputs -> the gradients written into the given buffers (``fn``: an emulated kernel for tests)."""
    with gdn1.tf32_matmuls():
        _run(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale, d_final_state, dq, dk, dv, dg, dbeta, dw,
             d_initial_state, fn, initial_state, layout)


def _run(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale, d_final_state, dq, dk, dv, dg, dbeta, dw,
         d_initial_state, fn, initial_state, layout) -> None:
    io = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[q.dtype]
    lens = ch.lengths(cu_seqlens)
    counts = gdn1.check_checkpoints(OP, state_checkpoints, lens, c2.CHUNK, layout)
    cu, ck = [0], [0]
    for n, c in zip(lens, counts):
        cu.append(cu[-1] + n)
        ck.append(ck[-1] + c)
    ho = max(q.shape[1], v.shape[1])
    for a, b in gdn1.slabs(lens, ho, c2.CHUNK, 4 * _SLAB_TILES):
        t0, t1 = cu[a], cu[b]
        sub_cu = torch.tensor([x - t0 for x in cu[a:b + 1]], dtype=torch.int32, device=q.device)
        dfs = None if d_final_state is None else d_final_state[a:b]
        res = c2.chunked_grads(q[t0:t1], k[t0:t1], v[t0:t1], g[t0:t1], beta[t0:t1], w[t0:t1], do[t0:t1], sub_cu,
                               state_checkpoints[ck[a]:ck[b]], scale, dfs, torch.float32,
                               scan=gdn1.kernel_scan(io, fn, _FUNCTIONS), max_tiles=_SLAB_TILES,
                               initial_state=None if initial_state is None or layout == "pre_chunk"
                               else initial_state[a:b], layout=layout)
        for name, dst in (("dq", dq), ("dk", dk), ("dv", dv), ("dg", dg), ("dbeta", dbeta), ("dw", dw)):
            dst[t0:t1] = res[name].to(dst.dtype)
        if d_initial_state is not None:
            d_initial_state[a:b] = res["d_initial_state"]


def gdn2_bprop(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale=None, initial_state=None,
               d_final_state=None, dq=None, dk=None, dv=None, dg=None, dbeta=None, dw=None, d_initial_state=None,
               checkpoint_layout: str = "pre_chunk", *, safe_gate: bool = False, a_log=None, dt_bias=None,
               gate_lower_bound: float = gates.DEFAULT_LOWER_BOUND, d_a_log=None, d_dt_bias=None):
    """cuDNN's chunked GDN-2 backward (``chunk_gdn2_bwd``) on Hopper: q [T, HQ, 128], k [T, HK, 128], v [T, HV, 128]
    (bf16/fp16, THD over ``cu_seqlens``; HO = max(HQ, HV)), g fp32 [T, HO, 128] (natural-log decay per key channel),
    beta [T, HO, 128] and w [T, HO, 128] (post-sigmoid erase / write gates) and dO [T, HO, 128] in the I/O dtype,
    ``state_checkpoints`` [sum ceil(len / 16), HO, V, K] (the state entering every 16-token chunk). Returns (dq, dk,
    dv at the q / k / v heads, dg fp32, dbeta, dw in the I/O dtype, d_initial_state fp32 [N, HO, V, K] or None);
    ``checkpoint_layout="cudnn"``: cuDNN's backward ABI, [sum (len - 1) // 16, HO, V, K], the states entering chunks
    1 .. (chunk 0 reads ``initial_state``, zero without); with the default ``initial_state`` only asks for the last
    output. ``safe_gate``: g is the raw gate of the log decay lower_bound * sigmoid(exp(a_log) (g + dt_bias)) (a_log
    fp32 [HO], dt_bias fp32 [HO, 128]); dg is d / d g and the return gains d_a_log, d_dt_bias."""
    if checkpoint_layout not in ch.LAYOUTS:
        raise checks.TirxInputError(f"{OP}: argument 'checkpoint_layout': expected one of {ch.LAYOUTS}, got "
                                    f"{checkpoint_layout!r}")
    check_inputs(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale, d_final_state, initial_state)
    scale = ch.DIM ** -0.5 if scale is None else float(scale)
    n = cu_seqlens.shape[0] - 1
    ho = max(q.shape[1], v.shape[1])
    if safe_gate:
        for name, t, shape in (("a_log", a_log, (ho,)), ("dt_bias", dt_bias, (ho, ch.DIM))):
            if t is None:
                _fail(name, "a tensor with safe_gate=True", "None")
            checks.tensor(OP, name, t, dtypes=(torch.float32,), shape=shape, contiguous=True)
        d_a_log = torch.empty_like(a_log) if d_a_log is None else d_a_log
        d_dt_bias = torch.empty_like(dt_bias) if d_dt_bias is None else d_dt_bias
    elif a_log is not None or dt_bias is not None:
        _fail("a_log", "None without safe_gate=True", "a tensor")
    g_in, g = g, gates.channel_log_decay(g, safe_gate, a_log, dt_bias, gate_lower_bound).contiguous()
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    dg = torch.empty_like(g) if dg is None else dg
    dg_log = torch.empty_like(g) if safe_gate else dg
    dbeta = torch.empty_like(beta) if dbeta is None else dbeta
    dw = torch.empty_like(w) if dw is None else dw
    if d_initial_state is None and initial_state is not None:
        d_initial_state = torch.empty(n, ho, ch.DIM, ch.DIM, dtype=torch.float32, device=q.device)
    for name, t, ref in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v), ("dg", dg, g), ("dbeta", dbeta, beta),
                         ("dw", dw, w)):
        checks.tensor(OP, name, t, dtypes=(ref.dtype,), shape=tuple(ref.shape), contiguous=True)
    if d_initial_state is not None:
        checks.tensor(OP, "d_initial_state", d_initial_state, dtypes=(torch.float32,),
                      shape=(n, ho, ch.DIM, ch.DIM), contiguous=True)
    outs = (dq, dk, dv, dg_log, dbeta, dw, d_initial_state)
    if runtime.direct_call(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, d_final_state, *outs):
        run(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale, d_final_state, *outs,
            initial_state=initial_state, layout=checkpoint_layout)
        for t in outs:
            if t is not None:
                runtime.mark_written(t)
    else:
        torch.ops.tirx.cudnn_sm90_gdn2_bprop_f16(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale,
                                                 initial_state, d_final_state, *outs, checkpoint_layout)
    if not safe_gate:
        return dq, dk, dv, dg, dbeta, dw, d_initial_state
    d_raw, da, ddt = gates.channel_gate_grads(dg_log, g_in, safe_gate, a_log, dt_bias, gate_lower_bound)
    dg.copy_(d_raw)
    d_a_log.copy_(da)
    d_dt_bias.copy_(ddt)
    return dq, dk, dv, dg, dbeta, dw, d_initial_state, d_a_log, d_dt_bias


@torch.library.custom_op("tirx::cudnn_sm90_gdn2_bprop_f16",
                         mutates_args=("dq", "dk", "dv", "dg", "dbeta", "dw", "d_initial_state"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               w: torch.Tensor, do: torch.Tensor, state_checkpoints: torch.Tensor, cu_seqlens: torch.Tensor,
               scale: float, initial_state: torch.Tensor | None, d_final_state: torch.Tensor | None,
               dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, dg: torch.Tensor, dbeta: torch.Tensor,
               dw: torch.Tensor, d_initial_state: torch.Tensor | None, checkpoint_layout: str) -> None:
    run(q, k, v, g, beta, w, do, state_checkpoints, cu_seqlens, scale, d_final_state, dq, dk, dv, dg, dbeta, dw,
        d_initial_state, initial_state=initial_state, layout=checkpoint_layout)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
