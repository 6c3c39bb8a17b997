# SPDX-License-Identifier: Apache-2.0
# Port of cuDNN Frontend's chunked GDN-1 backward (cudnn_sm100_gdn_bprop_f16) to Hopper.
# Upstream: cudnn-frontend (https://github.com/NVIDIA/cudnn-frontend), python/cudnn/linear_attention/frost/kernel/
# gdn_bprop_f16.py and frost/gdn_engine.py, release v1.28.0 (commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082); the
# chunked algorithm as fla's chunk_gated_delta_rule_bwd (fla-core 0.6.0). Read for semantics only.
"""``gdn_bprop``: the backward of the chunked Gated DeltaNet (GDN-1) over THD-packed sequences, K = V = 128, bf16/fp16,
from the forward's per-chunk state checkpoints: dq, dk, dv, dg (d loss / d log-gate), dbeta and the initial state's
gradient.

Registered as ``cudnn_sm90_gdn_bprop_f16`` (the seed's ``cudnn_sm100_gdn_bprop_f16``: tcgen05/TMEM on Blackwell).
Status: the sequential step -- the reverse walk of the state gradient over chunks, with each chunk's own term
dO^T X -- is the TIRx wgmma kernel ``_bwd_state_kernel`` (TMA tiles one chunk ahead, two CTAs of 64 value rows per
sequence and head); the chunk-parallel steps around it (the WY recompute from the checkpoints before, dq / dk / dv /
dbeta / dg after) are batched torch (fp32, TF32 matmuls) in ``_bwd_chunks``, in slabs of sequences. The fused wgmma
form of those steps (cuDNN's one-kernel schedule) is the next step; until then this op is correct, not fast (no GPU
timing yet). Not CUDA-graph capturable: it reads ``cu_seqlens`` on the host (torch.compile sees the custom op).

Training: ``_bwd_autograd.chunk_gdn_train`` ties this package's forward (checkpoints every 64 tokens, or the recompute
kernel in the backward) to this op in a ``torch.autograd.Function``.
"""

from __future__ import annotations

import math
import sys

import torch

from tirx_kernels.core import checks, harness, references, runtime
from tirx_kernels.ported.cudnn.linear_attention import _bwd_chunks as ch
from tirx_kernels.ported.cudnn.linear_attention import _bwd_gates as gates
from tirx_kernels.ported.cudnn.linear_attention import _bwd_oracle as orc
from tirx_kernels.ported.cudnn.linear_attention import _bwd_state_kernel as sk
from tirx_kernels.ported.cudnn.linear_attention._fwd_common import tf32_matmuls

KERNEL_META = {
    "name": "cudnn_sm90_gdn_bprop_f16",
    "category": "ported.cudnn",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Chunked Gated DeltaNet (GDN-1) backward from per-chunk state checkpoints: dq, dk, dv, dg, dbeta, "
                   "dstate0 (state-gradient walk on wgmma, chunk-parallel steps in torch), THD varlen, GQA/GVA, "
                   "bf16/fp16",
    "upstream": {
        "project": "cudnn-frontend",
        "url": "https://github.com/NVIDIA/cudnn-frontend",
        "commit": "1dbd2c09432dfd6cbf13a0ad85a071446398c082",
    },
    "reference_requirements": [
        {"package": "fla-core", "import": "fla", "specifier": "==0.6.0", "baseline": "fla"},
    ],
    "public_ops": ["gdn_bprop"],
}

# Correctness rows: ragged batches with empty and 1-token sequences, chunk-boundary lengths, GQA / GVA, fp16, an
# initial state and a final-state gradient, int64 cu_seqlens; plus the smallest upstream perf row.
CONFIGS = [
    {"label": "ragged_h2_init_dfinal", "H": 2, "seqs": "70+0+1+64+129", "init": True, "dfinal": True},
    {"label": "ragged_gva_hq1_hv2", "H": 1, "Hv": 2, "seqs": "3+200+0+65", "init": True},
    {"label": "gqa_hq4_hv2_fp16_i64", "dtype": "float16", "H": 4, "Hv": 2, "seqs": "128+1+63", "dfinal": True,
     "cu_dtype": "int64"},
    {"label": "noinit_h4_s1000x3", "H": 4, "seqs": "1000x3"},
    {"label": "perf_basic_b1_s2048_h16", "H": 16, "seqs": "2048"},
]

# cuDNN's default perf rows for the GDN bprop (catalog section 2.3).
BENCH_CONFIGS = [
    {"label": "perf_basic_b1_s2048_h16", "H": 16, "seqs": "2048"},
    {"label": "perf_basic_b1_s8192_h16", "H": 16, "seqs": "8192"},
    {"label": "perf_b4_s32768_h64", "H": 64, "seqs": "32768x4"},
]

DEFAULTS = {"dtype": "bfloat16", "Hv": None, "init": False, "dfinal": False, "cu_dtype": "int32"}

# The kernel's inputs are the checkpoints rounded to the I/O dtype (the oracle differentiates the exact fp32
# forward) and it rounds dS and Y to 16 bits inside the walk; measured on the emulated rows (tests).
TOLERANCE = {"bfloat16": (4e-2, 4e-2), "float16": (1e-2, 1e-2), "float32": (4e-2, 4e-2)}
OP = "gdn_bprop"
IO = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
INDEX = (torch.int32, torch.int64)
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_SLAB_TILES = 16384  # (chunk, head) tiles a torch slab holds: 1 GiB per fp32 [V, K] tensor


def compile_params(dtype: str = "bfloat16", **_) -> dict:
    """Only the I/O dtype changes the code: lengths and heads are run-time arguments."""
    return {"io": dtype}


def get_kernel(io: str):
    return sk.build_kernel(io, ch.CHUNK)


def artifact_params() -> list[dict]:
    return [{"io": d} for d in sk.IO_DTYPES]


def call_samples(rng) -> list[dict]:
    """Both I/O dtypes, MHA / GQA / GVA heads, ragged lengths around the chunk size, optional states, both index
    dtypes: only the dtype picks the artifact."""
    out = []
    for d in _DTYPES:
        for hq, hv in ((1, 1), (4, 4), (16, 16), (64, 64), (8, 2), (2, 8), (4, 16)) * 2:
            seqs = "+".join(str(rng.choice([0, 1, 63, 64, 65, 300, 2048, 8192])) for _ in range(rng.randint(1, 4)))
            out.append({**DEFAULTS, "dtype": d, "H": hq, "Hv": hv, "seqs": seqs, "init": rng.random() < 0.5,
                        "dfinal": rng.random() < 0.5, "cu_dtype": rng.choice(["int32", "int64"])})
    return out


def sass_expect(io: str, **_) -> list[str]:
    """Both walk products on the tensor cores (A from registers), the K_d / W tiles by TMA."""
    return [r"HGMMA\.64x64x16\.F32", r"HGMMA\.64x128x16\.F32", r"UTMALDG\.2D"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def seq_lens(seqs: str) -> list[int]:
    """``"70+0+1"`` -> [70, 0, 1]; ``"1024x8"`` -> eight 1024s."""
    out = []
    for term in seqs.split("+"):
        length, _, count = term.partition("x")
        out += [int(length)] * int(count or 1)
    return out


def prepare_data(dtype: str, H: int, seqs: str, Hv: int | None = None, init: bool = False,  # noqa: N803
                 dfinal: bool = False, cu_dtype: str = "int32", device: str = "cuda") -> dict:
    """q, k (L2-normalised), v, dO (normal), log gate log(U(0.9, 1)), beta U(0, 1); the checkpoints from the fp32
    chunked forward (rounded to the I/O dtype, as the forward kernel writes them); gradients poisoned."""
    t = _DTYPES[dtype]
    hq = H
    hv = H if Hv is None else Hv
    ho = max(hq, hv)
    lens = seq_lens(seqs)
    total, n = sum(lens), len(lens)
    q = torch.randn(total, hq, 128, device=device).to(t)
    k = torch.nn.functional.normalize(torch.randn(total, hq, 128, device=device), dim=-1).to(t)
    v = torch.randn(total, hv, 128, device=device).to(t)
    g = torch.log(0.9 + 0.1 * torch.rand(total, ho, device=device))
    beta = torch.rand(total, ho, device=device)
    do = torch.randn(total, ho, 128, device=device).to(t)
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(getattr(torch, cu_dtype))
    h0 = torch.randn(n, ho, 128, 128, device=device) * 0.05 if init else None
    dfs = torch.randn(n, ho, 128, 128, device=device) * 0.05 if dfinal else None
    _, _, ckpt = orc.forward_checkpoints(q, k, v, g, beta, cu, None, h0)
    nan = float("nan")
    data = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "do": do, "state_checkpoints": ckpt.to(t),
            "cu_seqlens": cu, "initial_state": h0, "d_final_state": dfs,
            "dq": torch.full_like(q, nan), "dk": torch.full_like(k, nan), "dv": torch.full_like(v, nan),
            "dg": torch.full_like(g, nan), "dbeta": torch.full_like(beta, nan),
            "d_initial_state": torch.full((n, ho, 128, 128), nan, device=device) if init else None}
    return data


def reference(q, k, v, g, beta, do, cu_seqlens, initial_state, d_final_state, **_) -> dict:
    """Autograd of sum(o * dO) + sum(final * d_final_state) through the fp32 chunked forward (exact states)."""
    return orc.autograd_grads(q, k, v, g, beta, do, cu_seqlens, None, initial_state, d_final_state)


def launch(cfg: dict, data: dict) -> None:
    gdn_bprop(data["q"], data["k"], data["v"], data["g"], data["beta"], data["do"], data["state_checkpoints"],
              data["cu_seqlens"], initial_state=data["initial_state"], d_final_state=data["d_final_state"],
              dq=data["dq"], dk=data["dk"], dv=data["dv"], dg=data["dg"], dbeta=data["dbeta"],
              d_initial_state=data["d_initial_state"])


def roofline(H: int, seqs: str, Hv: int | None = None, dtype: str = "bfloat16", **_) -> dict:  # noqa: N803
    """FLOPs of the chunked backward per token and state head (C = 64, d = 128): the state-side products (K S^T,
    Q S^T recomputed; dO S, dS' K_d^T, Y W / dD^T W, D dS', dH S, dO^T Q) 8 x 2 d^2 and the chunk products (K K^T,
    Q K^T, T rhs, P D, P^T dO, Tm^T dD, dO D^T, drhs D^T, dQK K, dQK^T Q, dKK K x 2) 12 x 2 C d. Bytes: q, k, v, dO,
    gates, the checkpoints read, dq, dk, dv, dg, dbeta written."""
    lens = seq_lens(seqs)
    total = sum(lens)
    hv = H if Hv is None else Hv
    ho = max(H, hv)
    flops = total * ho * (16 * 128 * 128 + 24 * 64 * 128)
    chunks = sum(-(-n // 64) for n in lens)
    nbytes = 2 * 2 * total * 128 * (2 * H + hv + ho) // 2 + 4 * 2 * 2 * total * ho
    nbytes += 2 * chunks * ho * 128 * 128
    return {"bytes": nbytes, "flops": flops}


def get_baselines(**cfg) -> dict:
    """fla 0.6.0's chunk_gated_delta_rule backward, a reference only where it agrees with the oracle: Triton >= 3.4
    miscompiles it on Hopper (fla issues 640, 984), so the builder checks fla's gradients on a small probe and the
    first call on a data set checks them on the row, against the fp32 oracle; a disagreement refuses the reference
    (ImportError: skipped with the reason). Its forward runs once per data set; the timed call is the backward
    (``torch.autograd.grad`` with the graph retained)."""
    def fla():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

        if cfg.get("Hv") not in (None, cfg["H"]):
            raise ImportError("fla's chunk_gated_delta_rule takes equal q / k / v heads here")
        graphs: dict = {}

        def forward(data):
            leaves = [data[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")]
            h0 = data["initial_state"]
            if h0 is not None:
                h0 = h0.detach().clone().requires_grad_(True)
                leaves.append(h0)
            o, ht = fla_gdn(*(x[None] for x in leaves[:5]), scale=128 ** -0.5, initial_state=h0,
                            output_final_state=True, state_v_first=True, cu_seqlens=data["cu_seqlens"].long())
            loss = (o[0].float() * data["do"].float()).sum()
            if data["d_final_state"] is not None:
                loss = loss + (ht.float() * data["d_final_state"]).sum()
            return loss, leaves

        def grads(loss, leaves):
            # fla >= 0.6 refuses the miscompiling Tritons itself (H100 run, 2026-12-07)
            with references.refused_upstream("Triton", "fla's backward refuses this Triton on Hopper"):
                got = torch.autograd.grad(loss, leaves, retain_graph=True)
            res = dict(zip(("dq", "dk", "dv", "dg", "dbeta"), got[:5]))
            if len(got) > 5:
                res["d_initial_state"] = got[5]
            return res

        def agree(data, res, what):
            try:
                harness.check_outputs(sys.modules[__name__], res, reference(**data), "the fp32 oracle", cfg, data)
            except harness.KernelCheckError as e:
                raise ImportError(f"fla's backward disagrees with the fp32 oracle {what} (Triton >= 3.4 on Hopper, "
                                  f"fla issues 640 / 984): {str(e)[:300]}") from None

        # A small ragged probe of this row's dtype and heads first: a miscompiled fla is refused at build time (the
        # bench's warm-up would not survive an error raised inside the timed function).
        probe = prepare_data(cfg.get("dtype", "bfloat16"), cfg["H"], "100+37", init=True, dfinal=True)
        agree(probe, grads(*forward(probe)), "on a 100+37-token probe")

        def fn(data):
            key = id(data["q"])
            if key not in graphs:
                loss, leaves = forward(data)
                res = grads(loss, leaves)
                agree(data, res, "on this row")
                graphs.clear()
                graphs[key] = (loss, leaves)
                return res
            return grads(*graphs[key])
        return fn
    return {"fla": fla}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _fail(name: str, expected: str, got: str):
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def check_inputs(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale, initial_state, d_final_state):
    """Shapes, dtypes, head maps; the device last (a CPU machine exercises the rest). The checkpoint count needs
    the lengths: checked in the op body (one host read of cu_seqlens)."""
    io = tuple(IO)
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
    for name, t in (("g", g), ("beta", beta)):
        checks.tensor(OP, name, t, dtypes=(torch.float32,), shape=(total, ho), contiguous=True, cuda=False)
    checks.tensor(OP, "do", do, shape=(total, ho, ch.DIM), contiguous=True, cuda=False)
    checks.same_dtype(OP, "q", q, do=do)
    checks.tensor(OP, "state_checkpoints", state_checkpoints, shape=(None, ho, ch.DIM, ch.DIM), contiguous=True,
                  cuda=False)
    checks.same_dtype(OP, "q", q, state_checkpoints=state_checkpoints)
    checks.tensor(OP, "cu_seqlens", cu_seqlens, dtypes=INDEX, ndim=1, contiguous=True, cuda=False)
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
    present = {name: t for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), ("do", do),
                                       ("state_checkpoints", state_checkpoints), ("cu_seqlens", cu_seqlens),
                                       ("initial_state", initial_state), ("d_final_state", d_final_state))
               if t is not None}
    checks.same_device(OP, "q", q, **present)


_FUNCTIONS = runtime.FunctionCache(__name__)
_DUMMY: dict = {}


def _dummy(device):
    t = _DUMMY.get(device)
    if t is None:
        t = _DUMMY[device] = torch.zeros(4, dtype=torch.float32, device=device)
    return t


def kernel_scan(io: str, fn=None, functions=None):
    """The reverse state walk on the TIRx kernel, in the ``scan`` form ``_bwd_oracle.chunked_grads`` takes
    (``fn``: the loaded / emulated function; default the runtime's artifact from ``functions``, this module's
    function cache unless given)."""
    def scan(cmap, f, d_final_state):
        dev = f["X"].device
        hs = f["X"].shape[1]
        if fn is None:
            call = (functions or _FUNCTIONS).get((io, f["X"].get_device()), lambda: {"io": io}, dev)
        else:
            call = fn
        dt = _DTYPES[io]
        kd, w, x, do = (f[name].to(dt).contiguous() for name in ("Kd", "W", "X", "dO"))
        dS = torch.empty(cmap.n_chunks, hs, ch.DIM, ch.DIM, dtype=torch.float32, device=dev)
        d0 = torch.empty(cmap.n_seqs, hs, ch.DIM, ch.DIM, dtype=torch.float32, device=dev)
        ccu = torch.tensor(cmap.chunk_cu, dtype=torch.int32, device=dev)
        dfs = None if d_final_state is None else d_final_state.float().contiguous()
        if cmap.n_chunks == 0:  # every sequence empty: the gradient passes through
            d0.copy_(dfs if dfs is not None else torch.zeros_like(d0))
            return dS, d0
        gc = f["gam_c"].float()
        gc = (gc[..., None].expand(*gc.shape, ch.DIM) if gc.dim() == 2 else gc).contiguous()  # per key channel
        res = call(*sk.kernel_args(kd, w, x, do, gc, ccu, dfs, dS, d0, _dummy(dev)))
        if hasattr(res, "check"):
            res.check()
        return dS, d0
    return scan


def slabs(lens: list[int], ho: int, chunk: int = ch.CHUNK, max_tiles: int = _SLAB_TILES):
    """Runs of consecutive sequences holding at most ``max_tiles`` (chunk, head) tiles (at least one sequence)."""
    start, tiles = 0, 0
    for i, n in enumerate(lens):
        t = -(-n // chunk) * ho
        if i > start and tiles + t > max_tiles:
            yield start, i
            start, tiles = i, 0
        tiles += t
    yield start, len(lens)


def check_checkpoints(op: str, state_checkpoints, lens, chunk: int, layout: str) -> list[int]:
    if layout not in ch.LAYOUTS:
        raise checks.TirxInputError(f"{op}: argument 'checkpoint_layout': expected one of {ch.LAYOUTS}, got "
                                    f"{layout!r}")
    counts = ch.checkpoint_counts(lens, chunk, layout)
    if state_checkpoints.shape[0] != sum(counts):
        rule = (f"ceil(len / {chunk}) per sequence: the state entering each chunk" if layout == "pre_chunk" else
                f"(len - 1) // {chunk} per sequence: the states entering chunks 1 ..")
        raise checks.TirxInputError(f"{op}: argument 'state_checkpoints': expected {sum(counts)} rows ({rule}), "
                                    f"got shape {tuple(state_checkpoints.shape)}")
    return counts


def run(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale, initial_state, d_final_state, dq, dk, dv, dg,
        dbeta, d_initial_state, fn=None, layout: str = "pre_chunk") -> None:
    """Validated inputs -> the gradients written into the given buffers (``fn``: an emulated kernel for tests)."""
    with tf32_matmuls():
        _run(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale, initial_state, d_final_state, dq, dk, dv,
             dg, dbeta, d_initial_state, fn, layout)


def _run(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale, initial_state, d_final_state, dq, dk, dv, dg,
         dbeta, d_initial_state, fn, layout) -> None:
    io = IO[q.dtype]
    lens = ch.lengths(cu_seqlens)
    counts = check_checkpoints(OP, state_checkpoints, lens, ch.CHUNK, layout)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    ck = [0]
    for c in counts:
        ck.append(ck[-1] + c)
    for a, b in slabs(lens, max(q.shape[1], v.shape[1])):
        t0, t1 = cu[a], cu[b]
        sub_cu = torch.tensor([x - t0 for x in cu[a:b + 1]], dtype=torch.int32, device=q.device)
        dfs = None if d_final_state is None else d_final_state[a:b]
        h0 = None if initial_state is None or layout == "pre_chunk" else initial_state[a:b]
        res = orc.chunked_grads(q[t0:t1], k[t0:t1], v[t0:t1], g[t0:t1], beta[t0:t1], do[t0:t1], sub_cu,
                                state_checkpoints[ck[a]:ck[b]], scale, h0, dfs, torch.float32,
                                scan=kernel_scan(io, fn), layout=layout)
        dq[t0:t1] = res["dq"].to(dq.dtype)
        dk[t0:t1] = res["dk"].to(dk.dtype)
        dv[t0:t1] = res["dv"].to(dv.dtype)
        dg[t0:t1] = res["dg"]
        dbeta[t0:t1] = res["dbeta"]
        if d_initial_state is not None:
            d_initial_state[a:b] = res["d_initial_state"].to(d_initial_state.dtype)


def gdn_bprop(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale=None, initial_state=None,
              d_final_state=None, dq=None, dk=None, dv=None, dg=None, dbeta=None, d_initial_state=None,
              checkpoint_layout: str = "pre_chunk", *, log_gate: bool = True, safe_gate: bool = False,
              a_log=None, dt_bias=None, d_a_log=None, d_dt_bias=None):
    """cuDNN's chunked GDN backward (``chunk_gdn_bwd``) on Hopper: q [T, HQ, 128], k [T, HK, 128], v [T, HV, 128],
    dO [T, HO, 128] (bf16/fp16, THD-packed over ``cu_seqlens``; HO = max(HQ, HV), each of HQ, HK, HV dividing it),
    g (natural-log decay) and beta fp32 [T, HO], ``state_checkpoints`` [sum ceil(len / 64), HO, V, K] in the I/O
    dtype (the state entering every 64-token chunk, as this package's prefill / recompute write them),
    ``d_final_state`` [N, HO, V, K]. Returns (dq, dk, dv at the q / k / v heads, dg, dbeta fp32 [T, HO],
    d_initial_state fp32 [N, HO, V, K] or None). ``checkpoint_layout="cudnn"``: cuDNN's backward ABI instead,
    [sum (len - 1) // 64, HO, V, K], the states entering chunks 1 .. of each sequence, chunk 0 reading
    ``initial_state`` (zero without); with the default layout ``initial_state`` only asks for d_initial_state.
    Gates as upstream: g the natural-log decay (``log_gate``), the raw decay alpha (``log_gate=False``: dg is
    d / d alpha), or the safe gate's raw input (``safe_gate``: log decay -exp(a_log) softplus(g + dt_bias), a_log and
    dt_bias fp32 [HO]; dg is d / d g and the return gains d_a_log, d_dt_bias)."""
    if checkpoint_layout not in ch.LAYOUTS:
        raise checks.TirxInputError(f"{OP}: argument 'checkpoint_layout': expected one of {ch.LAYOUTS}, got "
                                    f"{checkpoint_layout!r}")
    check_inputs(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale, initial_state, d_final_state)
    scale = ch.DIM ** -0.5 if scale is None else float(scale)
    n = cu_seqlens.shape[0] - 1
    ho = max(q.shape[1], v.shape[1])
    plain = log_gate and not safe_gate
    if safe_gate:
        for name, t in (("a_log", a_log), ("dt_bias", dt_bias)):
            if t is None:
                _fail(name, "a tensor with safe_gate=True", "None")
            checks.tensor(OP, name, t, dtypes=(torch.float32,), shape=(ho,), contiguous=True)
        d_a_log = torch.empty_like(a_log) if d_a_log is None else d_a_log
        d_dt_bias = torch.empty_like(dt_bias) if d_dt_bias is None else d_dt_bias
    elif a_log is not None or dt_bias is not None:
        _fail("a_log", "None without safe_gate=True", "a tensor")
    g_in, g = g, gates.scalar_log_decay(g, log_gate, safe_gate, a_log, dt_bias).contiguous()
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    dg = torch.empty_like(g) if dg is None else dg
    dg_log = dg if plain else torch.empty_like(g)
    dbeta = torch.empty_like(beta) if dbeta is None else dbeta
    if d_initial_state is None and initial_state is not None:
        d_initial_state = torch.empty(n, ho, ch.DIM, ch.DIM, dtype=torch.float32, device=q.device)
    for name, t, ref in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v), ("dg", dg, g), ("dbeta", dbeta, beta)):
        checks.tensor(OP, name, t, dtypes=(ref.dtype,), shape=tuple(ref.shape), contiguous=True)
    if d_initial_state is not None:
        checks.tensor(OP, "d_initial_state", d_initial_state, dtypes=(torch.float32,),
                      shape=(n, ho, ch.DIM, ch.DIM), contiguous=True)
    outs = (dq, dk, dv, dg_log, dbeta, d_initial_state)
    if runtime.direct_call(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, d_final_state, *outs):
        with torch.no_grad():
            run(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale, initial_state, d_final_state, *outs,
                layout=checkpoint_layout)
        for t in outs:
            if t is not None:
                runtime.mark_written(t)
    else:
        torch.ops.tirx.cudnn_sm90_gdn_bprop_f16(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale,
                                                initial_state, d_final_state, *outs, checkpoint_layout)
    if plain:
        return dq, dk, dv, dg, dbeta, d_initial_state
    d_raw, da, ddt = gates.scalar_gate_grads(dg_log, g_in, log_gate, safe_gate, a_log, dt_bias)
    dg.copy_(d_raw)
    if not safe_gate:
        return dq, dk, dv, dg, dbeta, d_initial_state
    d_a_log.copy_(da)
    d_dt_bias.copy_(ddt)
    return dq, dk, dv, dg, dbeta, d_initial_state, d_a_log, d_dt_bias


@torch.library.custom_op("tirx::cudnn_sm90_gdn_bprop_f16",
                         mutates_args=("dq", "dk", "dv", "dg", "dbeta", "d_initial_state"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               do: torch.Tensor, state_checkpoints: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
               initial_state: torch.Tensor | None, d_final_state: torch.Tensor | None, dq: torch.Tensor,
               dk: torch.Tensor, dv: torch.Tensor, dg: torch.Tensor, dbeta: torch.Tensor,
               d_initial_state: torch.Tensor | None, checkpoint_layout: str) -> None:
    """The op's body (host reads of cu_seqlens: eager inside a compiled graph, not CUDA-graph capturable)."""
    run(q, k, v, g, beta, do, state_checkpoints, cu_seqlens, scale, initial_state, d_final_state, dq, dk, dv, dg,
        dbeta, d_initial_state, layout=checkpoint_layout)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
