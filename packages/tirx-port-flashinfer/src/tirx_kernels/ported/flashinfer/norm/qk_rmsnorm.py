# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's per-head RMSNorm of q / k (rmsnorm and gemma_rmsnorm on a 3-D input).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), include/flashinfer/norm.cuh
# (QKRMSNormKernel) and python/flashinfer/norm.py (rmsnorm / gemma_rmsnorm, input.dim() == 3), release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: same semantics (fp32 statistics, one rounding), different kernel structure.
"""``out[b, n] = input[b, n] * rsqrt(mean(input[b, n]**2) + eps) * w`` (Gemma: ``* (1 + w)``) for every head of
a (batch, num_heads, head_dim) bf16/fp16 tensor: what FlashInfer's ``rmsnorm`` / ``gemma_rmsnorm`` do with a 3-D
input (q or k before RoPE). Out of place (``out=`` optional), unit stride in head_dim, any batch and head strides
(a head-sliced view of a fused qkv projection), weight (head_dim,).

Two kinds of artifact with the same arguments (``input, weight, out, eps, zero``):
- specialized, per (dtype, gemma, H) for H % 8 == 0 in [16, 1024], heads and weight on 16 bytes: a head is spread
  over a power-of-two group of ``threads_per_head`` <= 32 threads holding its 16-byte vectors (and the weight's) in
  registers, loads issued before any math, a shuffle-only reduction; ``heads_per_cta`` heads pack a CTA of 256
  threads (H = 128: 16 threads a head, 16 heads a CTA). Head ``j`` of the flattened (batch, head) order lives at
  ``(j / N) * stride_b + (j % N) * stride_n`` (64-bit).
- general, per (dtype, gemma): any H >= 1, any alignment; one warp per head (4 a CTA), element-wise coalesced
  accesses in two passes (the sum of squares, then the scaled head).
Both launch as programmatic dependents (``core.lang.pdl``); ``enable_pdl`` is accepted for FlashInfer's signature.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, op

KERNEL_META = {
    "name": "flashinfer_qk_rmsnorm",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Per-head RMSNorm (and Gemma's (1 + w) form) of a (batch, heads, head_dim) q/k, bf16/fp16",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["qk_rmsnorm", "gemma_qk_rmsnorm"],
}

# B in {1, 19, 99} x N in {4, 7, 16} x H in {64, 128, 256} (a cover, both variants and dtypes), head-sliced views of
# a fused qkv row (batch stride > N * H), and the general kernel (odd H, H > 1024).
CONFIGS = [
    {"label": "bf16_1x4x64", "dtype": "bfloat16", "B": 1, "N": 4, "H": 64},
    {"label": "bf16_19x7x128", "dtype": "bfloat16", "B": 19, "N": 7, "H": 128},
    {"label": "bf16_99x16x256", "dtype": "bfloat16", "B": 99, "N": 16, "H": 256},
    {"label": "fp16_19x16x64", "dtype": "float16", "B": 19, "N": 16, "H": 64},
    {"label": "fp16_99x4x128", "dtype": "float16", "B": 99, "N": 4, "H": 128},
    {"label": "gemma_bf16_99x7x256", "dtype": "bfloat16", "B": 99, "N": 7, "H": 256, "gemma": True},
    {"label": "gemma_fp16_1x16x128", "dtype": "float16", "B": 1, "N": 16, "H": 128, "gemma": True},
    {"label": "bf16_19x4x512", "dtype": "bfloat16", "B": 19, "N": 4, "H": 512},
    {"label": "bf16_989x16x128", "dtype": "bfloat16", "B": 989, "N": 16, "H": 128},
    {"label": "bf16_19x8x128_qkv_slice", "dtype": "bfloat16", "B": 19, "N": 8, "H": 128, "batch_stride": 2048},
    {"label": "gemma_bf16_19x7x96_head_stride", "dtype": "bfloat16", "B": 19, "N": 7, "H": 96, "gemma": True,
     "batch_stride": 1000, "head_stride": 136},
    {"label": "bf16_19x7x111", "dtype": "bfloat16", "B": 19, "N": 7, "H": 111},
    {"label": "fp16_3x5x2001", "dtype": "float16", "B": 3, "N": 5, "H": 2001, "gemma": True},
]

BENCH_CONFIGS = [
    {"label": "bf16_8192x32x128", "dtype": "bfloat16", "B": 8192, "N": 32, "H": 128},
    {"label": "bf16_8192x8x128", "dtype": "bfloat16", "B": 8192, "N": 8, "H": 128},
    {"label": "bf16_32x32x128", "dtype": "bfloat16", "B": 32, "N": 32, "H": 128},
    {"label": "gemma_bf16_32x32x128", "dtype": "bfloat16", "B": 32, "N": 32, "H": 128, "gemma": True},
    {"label": "fp16_16x64x128", "dtype": "float16", "B": 16, "N": 64, "H": 128},
    {"label": "bf16_8192x16x256", "dtype": "bfloat16", "B": 8192, "N": 16, "H": 256},
    {"label": "bf16_8192x32x64", "dtype": "bfloat16", "B": 8192, "N": 32, "H": 64},
]

DEFAULTS = {"dtype": "bfloat16", "eps": 1e-6, "gemma": False}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_VEC = 8
_WORDS = 4
MIN_H, MAX_H = 16, 1024  # specialized: a head in one <= 32-thread group, <= 4 vectors a thread
CTA_THREADS = 256
GENERAL_HEADS_PER_CTA = 4  # one warp a head
MAX_GENERAL_H = 2**30
MAX_HEADS = 2**31 - 1 - CTA_THREADS  # batch * heads in int32 (head index = cta * heads_per_cta + group)
MAX_STRIDE = 2**31 - 1
PDL = "end"


def specialized(H: int) -> bool:
    return H % _VEC == 0 and MIN_H <= H <= MAX_H


def head_plan(H: int) -> dict:
    """``threads_per_head`` (a power of two, 2..32), ``vectors_per_thread`` (1..4), ``heads_per_cta``."""
    nvec = H // _VEC
    tpr = min(32, max(2, 1 << (nvec - 1).bit_length()))
    return {"threads_per_head": tpr, "vectors_per_thread": -(-nvec // tpr), "heads_per_cta": CTA_THREADS // tpr}


def compile_params(**cfg) -> dict:
    gemma = bool(cfg.get("gemma", False))
    if cfg.get("schedule") == "general" or not specialized(int(cfg["H"])):
        return {"dtype": cfg["dtype"], "gemma": gemma, "schedule": "general"}
    return {"dtype": cfg["dtype"], "gemma": gemma, "H": int(cfg["H"])}


def general_params(params: dict) -> dict:
    return {"dtype": params["dtype"], "gemma": bool(params.get("gemma", False)), "schedule": "general"}


def artifact_params() -> list[dict]:
    """The general kernel of each (dtype, gemma) and the specialized one of every catalog head dim."""
    from tirx_kernels.core import model_dims

    sizes = sorted({H for H in model_dims.head_dims() if specialized(H)})
    return [p for dtype in _DTYPES for gemma in (False, True) for p in
            [general_params({"dtype": dtype, "gemma": gemma})]
            + [compile_params(dtype=dtype, gemma=gemma, H=H) for H in sizes]]


def call_samples(rng) -> list[dict]:
    from tirx_kernels.core import model_dims

    sizes = model_dims.head_dims() + [rng.randint(1, 64) for _ in range(4)] + [rng.randint(1, 4096) for _ in range(6)]
    sizes += [8 * rng.randint(2, 128) for _ in range(6)]
    return [{"dtype": dtype, "gemma": gemma, "B": rng.choice([1, 19, 4096]), "N": rng.choice([1, 8, 32]), "H": H}
            for dtype in _DTYPES for gemma in (False, True) for H in sizes]


def sass_expect(dtype: str, gemma: bool = False, H: int | None = None, schedule: str | None = None,
                **_) -> list[str]:
    if schedule == "general":
        return [r"LDG\.E\.U16", r"STG\.E\.U16"]
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.128"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx functions
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, gemma: bool = False, H: int | None = None, schedule: str | None = None,
               pdl: str | None = PDL):
    if dtype not in _DTYPES:
        raise ValueError(f"qk_rmsnorm: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if schedule == "general":
        if H is not None:
            raise ValueError(f"qk_rmsnorm: the general kernel takes H at run time, got H={H}")
        return build_general(dtype, gemma, pdl)
    if schedule is not None:
        raise ValueError(f"qk_rmsnorm: schedule {schedule!r} is not None or 'general'")
    if H is None or not specialized(H):
        raise ValueError(f"qk_rmsnorm: H={H} must be a multiple of {_VEC} in [{MIN_H}, {MAX_H}]")
    return build_kernel(dtype, gemma, H, pdl=pdl, **head_plan(H))


def _factor(T, w, gemma: bool):
    return T.float32(1) + w if gemma else w


def _head_offsets(T, j, N, sb, sn, yb, yn):  # noqa: N803
    """64-bit element offsets of head ``j`` (flattened batch-major, >= 0) in input and out (truncating division:
    both operands are non-negative, so no floor-division sign fix-ups)."""
    b = T.Cast("int64", T.truncdiv(j, N))
    n = T.Cast("int64", T.truncmod(j, N))
    return b * T.Cast("int64", sb) + n * T.Cast("int64", sn), b * T.Cast("int64", yb) + n * T.Cast("int64", yn)


def build_kernel(dtype: str, gemma: bool, H: int, threads_per_head: int, vectors_per_thread: int,
                 heads_per_cta: int, pdl: str | None = PDL):
    """The specialized kernel: heads of a compile-time H, shuffles only."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("qk_rmsnorm", pdl)
    tpr, vpt = threads_per_head, vectors_per_thread
    threads = tpr * heads_per_cta
    inv_h = 1.0 / H

    def vector_pred(v, lane, head_ok):
        col_ok = (v * tpr + lane) * _VEC < H if (v + 1) * tpr * _VEC > H else None
        return head_ok if col_ok is None else T.And(head_ok, col_ok)

    def load(regs, buf, base, lane, head_ok):
        for v in range(vpt):
            vector.fill(regs, v * _WORDS, _WORDS)  # masked vectors (past the head or the last head) add 0
            vector.load_v4(regs, v * _WORDS, buf.ptr_to([base + (v * tpr + lane) * _VEC]),
                           vector_pred(v, lane, head_ok))

    def sum_squares(acc, xr):
        for i in range(vpt * _WORDS):
            lo, hi = vector.unpack2(xr[i], dtype)
            T.buffer_store(acc, acc[0] + lo * lo + hi * hi, [0])

    def scale_store(Yf, base, lane, head_ok, xr, wr, orr, rs):  # noqa: N803
        for v in range(vpt):
            for j in range(_WORDS):
                x_lo, x_hi = vector.unpack2(xr[v * _WORDS + j], dtype)
                w_lo, w_hi = vector.unpack2(wr[v * _WORDS + j], dtype)
                vector.pack2(orr, j, x_lo * rs * _factor(T, w_lo, gemma), x_hi * rs * _factor(T, w_hi, gemma), dtype)
            vector.store_v4(Yf.ptr_to([base + (v * tpr + lane) * _VEC]), orr, 0, vector_pred(v, lane, head_ok))

    @T.prim_func
    def qk_rmsnorm(x_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, eps: T.float32, zero: T.int32):
        B = T.int32()
        N = T.int32()
        xb = T.int32()
        xn = T.int32()
        yb = T.int32()
        yn = T.int32()
        X = T.match_buffer(x_ptr, (B, N, H), dtype, strides=(xb, xn, 1), align=16)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=16)
        Y = T.match_buffer(y_ptr, (B, N, H), dtype, strides=(yb, yn, 1), align=16)
        T.device_entry()
        # Flat views (TIRx drops match_buffer strides from device indexing); their extent only names the buffer.
        Xf = T.decl_buffer((B * xb,), dtype, data=X.data)
        Yf = T.decl_buffer((B * yb,), dtype, data=Y.data)
        cta = T.cta_id([(B * N + heads_per_cta - 1) // heads_per_cta])
        tid = T.thread_id([threads])
        xr = T.alloc_local((vpt * _WORDS,), "uint32")
        wr = T.alloc_local((vpt * _WORDS,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        acc = T.alloc_local((1,), "float32")
        pdl_launch.begin(pdl)

        j = cta * heads_per_cta + tid // tpr
        lane = tid % tpr
        head_ok = j < B * N
        x_base, y_base = _head_offsets(T, T.min(j, B * N - 1), N, xb, xn, yb, yn)
        load(wr, Wt, 0, lane, T.bool(True))
        load(xr, Xf, x_base, lane, head_ok)
        acc[0] = T.cuda.uint_as_float(vector.after_all(wr, vpt * _WORDS, zero))  # 0.0, after the weight
        sum_squares(acc, xr)
        total = reduce.group_sum(acc[0], tid, tpr)
        rs = T.rsqrt(total * T.float32(inv_h) + eps)
        scale_store(Yf, y_base, lane, head_ok, xr, wr, orr, rs)
        pdl_launch.end(pdl)

    return pdl_launch.launch(qk_rmsnorm, pdl)


def build_general(dtype: str, gemma: bool, pdl: str | None = PDL):
    """The general kernel: H and every stride at run time, one warp per head, element-wise, two passes."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("qk_rmsnorm", pdl)
    heads = GENERAL_HEADS_PER_CTA

    def element(buf, idx):
        return vector.unpack2(T.Cast("uint32", T.reinterpret("uint16", buf[idx])), dtype)[0]

    @T.prim_func
    def qk_rmsnorm(x_ptr: T.handle, w_ptr: T.handle, y_ptr: T.handle, eps: T.float32, zero: T.int32):
        B = T.int32()
        N = T.int32()
        H = T.int32()
        xb = T.int32()
        xn = T.int32()
        yb = T.int32()
        yn = T.int32()
        X = T.match_buffer(x_ptr, (B, N, H), dtype, strides=(xb, xn, 1), align=2)
        Wt = T.match_buffer(w_ptr, (H,), dtype, align=2)
        Y = T.match_buffer(y_ptr, (B, N, H), dtype, strides=(yb, yn, 1), align=2)
        T.device_entry()
        Xf = T.decl_buffer((B * xb,), dtype, data=X.data)
        Yf = T.decl_buffer((B * yb,), dtype, data=Y.data)
        cta = T.cta_id([(B * N + heads - 1) // heads])
        tid = T.thread_id([32 * heads])
        acc = T.alloc_local((1,), "float32")
        pair = T.alloc_local((1,), "uint32")
        pdl_launch.begin(pdl)

        j = cta * heads + tid // 32
        lane = tid % 32
        x_base, y_base = _head_offsets(T, T.min(j, B * N - 1), N, xb, xn, yb, yn)
        trips = T.Select(j < B * N, (H + 31) // 32, 0)  # a warp past the last head only joins the shuffles
        acc[0] = T.float32(0)
        for i in T.serial(trips):
            c = i * 32 + lane
            if c < H:
                x = element(Xf, x_base + T.Cast("int64", c))
                acc[0] = acc[0] + x * x
        total = reduce.warp_sum(acc[0])
        rs = T.rsqrt(total * (T.float32(1) / T.Cast("float32", H)) + eps)
        for i in T.serial(trips):
            c = i * 32 + lane
            if c < H:
                x = element(Xf, x_base + T.Cast("int64", c))
                vector.pack2(pair, 0, x * rs * _factor(T, element(Wt, T.Cast("int64", c)), gemma), T.float32(0),
                             dtype)
                Yf[y_base + T.Cast("int64", c)] = T.reinterpret(dtype, T.Cast("uint16", pair[0]))
        pdl_launch.end(pdl)

    return pdl_launch.launch(qk_rmsnorm, pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte/FLOP model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator() -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(dtype: str, B: int, N: int, H: int, eps: float = 1e-6, gemma: bool = False,  # noqa: N803
                 batch_stride: int | None = None, head_stride: int | None = None, **_) -> dict:
    g = _generator()
    t = _DTYPES[dtype]
    sn = head_stride or H
    sb = batch_stride or N * sn
    base = torch.randn(B * sb, generator=g, device="cuda", dtype=torch.float32).to(t)
    return {"input": base.as_strided((B, N, H), (sb, sn, 1)),
            "weight": torch.randn(H, generator=g, device="cuda", dtype=torch.float32).to(t), "eps": eps,
            "gemma": bool(gemma), "out": torch.full((B, N, H), float("nan"), device="cuda", dtype=t)}


def reference(input, weight, eps, gemma=False, **_) -> dict:  # noqa: A002
    x = input.float()
    w = weight.float() + 1 if gemma else weight.float()
    return {"out": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w}


def launch(cfg: dict, data: dict) -> None:
    fn = gemma_qk_rmsnorm if data["gemma"] else qk_rmsnorm
    fn(data["input"], data["weight"], data["eps"], out=data["out"])


def roofline(dtype: str, B: int, N: int, H: int, **_) -> dict:  # noqa: N803
    return {"bytes": 2 * B * N * H * 2 + H * 2, "flops": 4 * B * N * H}


def get_baselines(**cfg) -> dict:
    gemma = bool(cfg.get("gemma", False))

    def _torch_fn(x, w, eps):
        xf = x.float()
        wf = w.float() + 1 if gemma else w.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * wf).to(x.dtype)

    def torch_eager():
        return lambda d: {"out": _torch_fn(d["input"], d["weight"], d["eps"])}

    def torch_compile():
        fn = torch.compile(_torch_fn, dynamic=False)
        return lambda d: {"out": fn(d["input"], d["weight"], d["eps"])}

    def flashinfer():
        import flashinfer.norm

        if not gemma:
            return lambda d: {"out": flashinfer.norm.rmsnorm(d["input"], d["weight"], d["eps"])}

        # FlashInfer 0.7.4's gemma_rmsnorm takes 2-D input only ("input must be a 2D tensor", H100 2026-12-05): the
        # heads as rows (a view of a contiguous input; a copy of a strided one).
        def gemma_2d(d):
            x = d["input"]
            return {"out": flashinfer.norm.gemma_rmsnorm(x.reshape(-1, x.shape[-1]), d["weight"],
                                                         d["eps"]).view(x.shape)}

        return gemma_2d

    return {"torch": torch_eager, "torch.compile": torch_compile, "flashinfer": flashinfer}


# ---------------------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------------------

def _fail(name: str, op_name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{op_name}: argument '{name}': expected {expected}, got {got}")


def _check_heads(op_name: str, name: str, t: torch.Tensor) -> None:
    if t.shape[2] > 1 and t.stride(2) != 1:
        _fail(name, op_name, "a unit stride in head_dim", f"strides {tuple(t.stride())}")
    if t.shape[0] * t.shape[1] > MAX_HEADS:
        _fail(name, op_name, f"at most {MAX_HEADS} heads (batch * num_heads)", str(t.shape[0] * t.shape[1]))
    for d in range(2):
        if t.shape[d] > 1 and not 0 < t.stride(d) <= MAX_STRIDE:
            _fail(name, op_name, f"batch and head strides in [1, {MAX_STRIDE}]", f"strides {tuple(t.stride())}")


def _check_inputs(op_name: str, input, weight, eps, out) -> None:  # noqa: A002
    checks.tensor(op_name, "input", input, dtypes=tuple(_DTYPES.values()), ndim=(3,), cuda=False)
    H = input.shape[-1]
    checks.in_range(op_name, "input", H, 1, MAX_GENERAL_H)
    checks.tensor(op_name, "weight", weight, shape=(H,), cuda=False)
    checks.same_dtype(op_name, "input", input, weight=weight)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        _fail("eps", op_name, "a float", type(eps).__name__)
    _check_heads(op_name, "input", input)
    if out is not None:
        checks.tensor(op_name, "out", out, shape=tuple(input.shape), cuda=False)
        checks.same_dtype(op_name, "input", input, out=out)
        _check_heads(op_name, "out", out)
    checks.tensor(op_name, "input", input, cuda=True)
    checks.same_device(op_name, "input", input, weight=weight, **({} if out is None else {"out": out}))


def qk_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,  # noqa: A002
               out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """Per-head RMSNorm of a (batch, num_heads, head_dim) bf16/fp16 tensor (FlashInfer's ``rmsnorm`` on 3-D input):
    fp32 statistics, one rounding. Any head_dim >= 1, any batch / head strides; ``out`` optional (same shape)."""
    _check_inputs("qk_rmsnorm", input, weight, eps, out)
    return _OP(input, weight, float(eps), False, out=out)


def gemma_qk_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,  # noqa: A002
                     out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """As ``qk_rmsnorm`` with Gemma's ``(1 + weight)`` (FlashInfer's ``gemma_rmsnorm`` on 3-D input)."""
    _check_inputs("gemma_qk_rmsnorm", input, weight, eps, out)
    return _OP(input, weight, float(eps), True, out=out)


def _aligned(t: torch.Tensor) -> bool:
    """Every head starts on 16 bytes (what the specialized kernel reads and writes with 16-byte vectors)."""
    return t.data_ptr() % 16 == 0 and all(t.shape[d] <= 1 or t.stride(d) % _VEC == 0 for d in range(2))


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(2) == 1 else t.as_strided(t.shape, (*t.stride()[:2], 1))


def _run(input, weight, eps: float, gemma: bool, out) -> None:  # noqa: A002
    H = input.shape[-1]
    if input.numel() == 0:
        return
    x, y = _unit_last(input), _unit_last(out)
    weight = weight if weight.stride(0) == 1 else weight.as_strided((H,), (1,))
    dtype = str(input.dtype)[6:]
    general = not (specialized(H) and _aligned(x) and _aligned(y) and weight.data_ptr() % 16 == 0)
    fn = _FUNCTIONS.get((input.dtype, H, gemma, general, input.get_device()),
                        lambda: general_params({"dtype": dtype, "gemma": gemma}) if general
                        else compile_params(dtype=dtype, gemma=gemma, H=H), input.device)
    fn(x, weight, y, eps, 0)  # zero: see vector.after_all


from tirx_kernels.core import runtime  # noqa: E402

_FUNCTIONS = runtime.FunctionCache(__name__)
# core.op.OutOp registers the torch.library custom ops tirx::flashinfer_qk_rmsnorm and tirx::flashinfer_qk_rmsnorm_out
# (their register_fake from new_out) and takes the eager direct path around them.
_OP = op.OutOp("flashinfer_qk_rmsnorm", {"input": torch.Tensor, "weight": torch.Tensor, "eps": float, "gemma": bool},
               run=_run, new_out=lambda input, weight, eps, gemma: torch.empty(  # noqa: A006
                   input.shape, dtype=input.dtype, device=input.device))

from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
