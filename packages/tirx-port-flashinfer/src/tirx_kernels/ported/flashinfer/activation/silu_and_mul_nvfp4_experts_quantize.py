# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's silu_and_mul_scaled_nvfp4_experts_quantize (SiLU-and-mul fused with per-expert NVFP4
# quantization of a masked [experts, rows, 2K] activation).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), flashinfer/activation.py and
# flashinfer/quantization/fp4_quantization.py (silu_and_mul_scaled_nvfp4_experts_quantize_sm100), which run TRT-LLM's
# cvt_fp16_to_fp4_expert (csrc/nv_internal/tensorrt_llm/kernels/quantization.cuh, quantization_utils.cuh:
# silu_and_mul, cvt_warp_fp16_to_fp4 with UE8M0_SF=false), release v0.7.4 (commit
# 77039051b0be921788dc2784ec41423b558878ec). Written anew in TIRx for sm_90a (upstream's kernel body is SM100-only).
"""``a`` (E, M, 2K) bf16/fp16 with ``mask`` (E,) int32 valid rows per expert and ``a_global_sf`` (E,) fp32: for
every valid row ``h = silu(a[..., :K]) * a[..., K:]`` (fp32, ``silu(v) = v / (1 + exp(-v))``, rounded to the
dtype), then NVFP4 as TRT-LLM's recipe: per 16 elements SF = e4m3(gs_e * (amax / 6)), codes = e2m1(h / (SF /
gs_e)). Codes (E, M, K/2) uint8; SF per expert in the 128x4 swizzled layout (M padded to 128, K/16 to 4), expert
``e``'s at byte ``e * padded_M * padded_K/16``. Returned as upstream's views: codes ``(M, K/2, E)`` (batch last),
SF ``(32, 4, padded_M/128, 4, padded_K/64, E)`` float8_e4m3fn.

Rows at or past ``mask[e]`` (clamped to [0, M]) are not written, neither their codes nor their SF, and neither is
the SF padding: upstream's kernel stops at the mask (``break``) and its outputs come from ``torch.empty``.

One artifact per dtype, K at run time: a CTA takes ``BLOCKS_PER_CTA`` consecutive 16-element blocks of one expert's
rows (row-major over (row, block)), each thread ``UNROLL`` blocks with every load issued before any math; CTAs past
the expert's valid rows exit at once. Launched as a programmatic dependent (``core.lang.pdl``).
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, runtime

from ..norm import _fp4_rows

KERNEL_META = {
    "name": "silu_and_mul_nvfp4_experts_quantize",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "SiLU-and-mul fused with per-expert NVFP4 quantization of masked expert rows (swizzled 128x4 SF)",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "public_ops": ["silu_and_mul_scaled_nvfp4_experts_quantize"],
}

# The catalog's rows (E in {4, 8, 128}, M in {16, 128, 512, 2048}, K in {2048, 4096}) plus ragged masks, a mask past
# M, an empty expert, odd K / 16 (SF columns padded) and M not a multiple of 128.
CONFIGS = [
    {"label": "fp16_b8_m16_k2048", "dtype": "float16", "E": 8, "M": 16, "K": 2048},
    {"label": "bf16_b8_m512_k2048", "dtype": "bfloat16", "E": 8, "M": 512, "K": 2048},
    {"label": "bf16_b4_m128_k4096", "dtype": "bfloat16", "E": 4, "M": 128, "K": 4096},
    {"label": "fp16_b4_m2048_k4096", "dtype": "float16", "E": 4, "M": 2048, "K": 4096},
    {"label": "bf16_b128_m16_k2048", "dtype": "bfloat16", "E": 128, "M": 16, "K": 2048},
    {"label": "fp16_b4_m100_k2048_full", "dtype": "float16", "E": 4, "M": 100, "K": 2048, "mask": "full"},
    {"label": "bf16_b3_m37_k80_ragged", "dtype": "bfloat16", "E": 3, "M": 37, "K": 80, "mask": "ragged"},
    {"label": "bf16_b5_m200_k1536_edges", "dtype": "bfloat16", "E": 5, "M": 200, "K": 1536, "mask": "edges"},
    {"label": "fp16_b2_m7_k16_gs", "dtype": "float16", "E": 2, "M": 7, "K": 16, "gs": 0.02},
]

BENCH_CONFIGS = [
    {"label": "fp16_b8_m16_k2048", "dtype": "float16", "E": 8, "M": 16, "K": 2048},
    {"label": "bf16_b8_m512_k2048", "dtype": "bfloat16", "E": 8, "M": 512, "K": 2048},
    {"label": "fp16_b128_m2048_k2048", "dtype": "float16", "E": 128, "M": 2048, "K": 2048},
]

DEFAULTS = {"dtype": "bfloat16", "mask": "random", "gs": None}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
BLOCK = 16  # NVFP4 elements per scale factor
_VEC = 8
_WORDS = 4
THREADS = 256
UNROLL = 2  # blocks a thread holds: 2 x (2 gate + 2 up) 16-byte vectors in flight
BLOCKS_PER_CTA = THREADS * UNROLL
MAX_BLOCKS = 2**31 - 1 - BLOCKS_PER_CTA  # int32 (row, block) indices within an expert
PDL = "end"


def compile_params(**cfg) -> dict:
    """One artifact per dtype: E, M and K are runtime sizes."""
    return {"dtype": cfg["dtype"]}


def artifact_params() -> list[dict]:
    return [{"dtype": t} for t in _DTYPES]


def call_samples(rng) -> list[dict]:
    """Expert counts, rows and K (catalog intermediate sizes that are multiples of 16, and random ones)."""
    from tirx_kernels.core import model_dims

    ks = [k for k in model_dims.intermediate_sizes() if k % BLOCK == 0] + [BLOCK * rng.randint(1, 1024)
                                                                            for _ in range(6)]
    return [{"dtype": t, "E": rng.choice([1, 8, 128]), "M": rng.randint(1, 4096), "K": k} for t in _DTYPES for k in ks]


def sass_expect(dtype: str, **_) -> list[str]:
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.64", r"STG\.E\.U8"]


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(dtype: str, pdl: str | None = PDL):
    if dtype not in _DTYPES:
        raise ValueError(f"silu_and_mul_nvfp4_experts_quantize: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    return build_kernel(dtype, pdl)


def build_kernel(dtype: str, pdl: str | None = PDL):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import vector

    pdl_launch.check_trigger("silu_and_mul_nvfp4_experts_quantize", pdl)
    wpb = BLOCK // 2  # words of a block
    quantizer = _fp4_rows.BlockQuantizer(dtype, BLOCK, "e4m3", True, values="words", recipe="trtllm")

    def position(first, u, tid, nb):
        """(index over the expert's (row, block) pairs, row, block) of this thread's ``u``-th block."""
        idx = first + u * THREADS + tid
        return idx, T.truncdiv(idx, nb), T.truncmod(idx, nb)

    def load_blocks(gr, ur, Af, first, tid, nb, limit, e, M, K):  # noqa: N803
        """Gate and up words of this thread's blocks (16-byte loads, every one issued before any math)."""
        for u in range(UNROLL):
            idx, row, b = position(first, u, tid, nb)
            base = (T.Cast("int64", e) * T.Cast("int64", M) + T.Cast("int64", row)) * T.Cast("int64", 2 * K) \
                + T.Cast("int64", b * BLOCK)
            for k in range(BLOCK // _VEC):
                vector.load_v4(gr, (u * 2 + k) * _WORDS, Af.ptr_to([base + k * _VEC]), idx < limit)
                vector.load_v4(ur, (u * 2 + k) * _WORDS, Af.ptr_to([base + T.Cast("int64", K) + k * _VEC]),
                               idx < limit)

    def silu_mul(hr, gr, ur):
        """``hr <- silu(gate) * up`` in fp32 (``v / (1 + exp(-v))``, as TRT-LLM), rounded to the dtype."""
        for i in range(UNROLL * wpb):
            g_lo, g_hi = vector.unpack2(gr[i], dtype)
            u_lo, u_hi = vector.unpack2(ur[i], dtype)
            vector.pack2(hr, i, g_lo / (T.float32(1) + T.exp(-g_lo)) * u_lo,
                         g_hi / (T.float32(1) + T.exp(-g_hi)) * u_hi, dtype)

    def quantize_blocks(hr, first, tid, nb, limit, e, M, gs, Y64, Sf, sf_base):  # noqa: N803
        for u in range(UNROLL):
            idx, row, b = position(first, u, tid, nb)
            y_row = (T.Cast("int64", e) * T.Cast("int64", M) + T.Cast("int64", row)) * T.Cast("int64", nb)
            quantizer.block(hr, hr, u * wpb, T.float32(1), gs, Y64, Sf, y_row, row, b, nb, idx < limit, sf_base)

    @T.prim_func
    def silu_and_mul_nvfp4_experts_quantize(a_ptr: T.handle, m_ptr: T.handle, g_ptr: T.handle, y_ptr: T.handle,
                                            s_ptr: T.handle, M: T.int32, K: T.int32, sf_len: T.int32,
                                            tiles: T.int32, zero: T.int32):
        # Flat buffers (the sizes checked by the public op); every offset is 64-bit.
        E = T.int32()
        a_len = T.int64()
        y_len = T.int64()
        s_len = T.int64()
        Af = T.match_buffer(a_ptr, (a_len,), dtype, align=16)
        Mask = T.match_buffer(m_ptr, (E,), "int32")
        G = T.match_buffer(g_ptr, (E,), "float32")
        Y64 = T.match_buffer(y_ptr, (y_len,), "uint64", align=8)
        Sf = T.match_buffer(s_ptr, (s_len,), "uint8")
        T.device_entry()
        tile, e = T.cta_id([tiles, E])
        tid = T.thread_id([THREADS])
        gr = T.alloc_local((UNROLL * wpb,), "uint32")
        ur = T.alloc_local((UNROLL * wpb,), "uint32")
        hr = T.alloc_local((UNROLL * wpb,), "uint32")
        quantizer.alloc()
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write a, mask or gs

        nb = K // BLOCK
        limit = T.max(T.min(Mask[e], M), 0) * nb  # the expert's valid (row, block) pairs
        first = tile * BLOCKS_PER_CTA
        with T.If(first < limit):
            with T.Then():
                load_blocks(gr, ur, Af, first, tid, nb, limit, e, M, K)
                gr[0] = gr[0] ^ vector.after_all(ur, UNROLL * wpb, zero)  # 0: the math waits for every load
                silu_mul(hr, gr, ur)
                sf_base = T.Cast("int64", e) * T.Cast("int64", sf_len)
                quantize_blocks(hr, first, tid, nb, limit, e, M, G[e], Y64, Sf, sf_base)
        pdl_launch.end(pdl)

    return pdl_launch.launch(silu_and_mul_nvfp4_experts_quantize, pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator(device="cuda") -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def make_mask(kind: str, E: int, M: int, g: torch.Generator) -> torch.Tensor:  # noqa: N803
    """Valid rows per expert: "full" (M), "random" (0..M), "ragged" (random, one expert empty, one full) or "edges"
    (0, M, past M, negative, 1, M - 1, ...)."""
    if kind == "full":
        return torch.full((E,), M, dtype=torch.int32)
    if kind == "edges":
        return torch.tensor([[0, M, M + 5, -3, 1, M - 1, 129, 127][i % 8] for i in range(E)], dtype=torch.int32)
    mask = torch.randint(0, M + 1, (E,), generator=g, dtype=torch.int32)
    if kind == "ragged" and E >= 2:
        mask[0], mask[-1] = 0, M
    return mask


def sf_bytes_per_expert(M: int, K: int) -> int:  # noqa: N803
    return _fp4_rows.sf_rows(M, True) * _fp4_rows.sf_cols(K // BLOCK, True)


def prepare_data(dtype: str, E: int, M: int, K: int, mask: str = "random", gs: float | None = None,  # noqa: N803
                 **_) -> dict:
    g = _generator()
    a = torch.randn(E, M, 2 * K, generator=g, device="cuda", dtype=torch.float32).to(_DTYPES[dtype])
    valid = make_mask(mask, E, M, torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=g,
                                                                                  device="cuda"))))
    if gs is None:  # a per-expert global scale as a calibration would set it: 448 * 6 / amax
        h = silu_and_mul_ref(a)
        scale = (448.0 * 6.0 / h.abs().amax(dim=(1, 2)).clamp_min(1e-6)).float()
    else:
        scale = torch.full((E,), gs, dtype=torch.float32, device="cuda")
    return {"a": a, "mask": valid.cuda(), "a_global_sf": scale,
            "x_q": torch.empty(E, M, K // 2, dtype=torch.uint8, device="cuda"),
            "sf": torch.empty(E, sf_bytes_per_expert(M, K), dtype=torch.uint8, device="cuda")}


def silu_and_mul_ref(a: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in fp32 as the kernel orders it, rounded to a's dtype, returned as fp32."""
    K = a.shape[-1] // 2
    g, u = a[..., :K].float(), a[..., K:].float()
    return (g / (1 + torch.exp(-g)) * u).to(a.dtype).float()


def reference(a, mask, a_global_sf, **_) -> dict:
    """Codes and SF of the oracle's encoders (TRT-LLM's recipe) for every row; the comparators read only the valid
    rows (the kernel leaves the others untouched, as upstream)."""
    E, M, K2 = a.shape
    K = K2 // 2
    h = silu_and_mul_ref(a).reshape(E * M, K)
    gs = a_global_sf.float().repeat_interleave(M)
    codes, sf = _fp4_rows.encode_rows(h, BLOCK, "e4m3", gs, False, recipe="trtllm")
    per_expert = sf.view(torch.uint8).view(E, M, -1)
    swz = torch.stack([_fp4_rows.quant_ref.sf_swizzle(per_expert[e], "128x4") for e in range(E)])
    return {"x_q": codes.view(E, M, K // 2), "sf": swz}


def _valid_rows(mask, E: int, M: int) -> torch.Tensor:  # noqa: N803
    """(E, M) bool: rows below the expert's mask (clamped to [0, M])."""
    return torch.arange(M, device=mask.device).view(1, M) < mask.long().clamp(0, M).view(E, 1)


def codes_close(got, want, cfg, inputs) -> dict:
    E, M, _ = got.shape
    rows = _valid_rows(inputs["mask"], E, M)
    return _fp4_rows.codes_close(got[rows], want[rows], cfg, inputs)


def scales_close(got, want, cfg, inputs) -> dict:
    E, M = inputs["a"].shape[:2]
    nb = inputs["a"].shape[-1] // 2 // BLOCK
    rows = _valid_rows(inputs["mask"], E, M).cpu()
    r = torch.arange(M).view(M, 1)
    c = torch.arange(nb).view(1, nb)
    kt = (nb + 3) // 4
    off = ((r // 128) * kt * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4)
    sel = [got[e].view(torch.uint8)[off.to(got.device)][rows[e].to(got.device)] for e in range(E)]
    ref = [want[e].view(torch.uint8)[off.to(want.device)][rows[e].to(want.device)] for e in range(E)]
    return _fp4_rows.scales_close(torch.cat([s.reshape(-1) for s in sel]), torch.cat([s.reshape(-1) for s in ref]),
                                  cfg, inputs)


COMPARATORS = {"x_q": codes_close, "sf": scales_close}


def launch(cfg: dict, data: dict) -> None:
    _run(data["a"], data["mask"], data["a_global_sf"], data["x_q"], data["sf"])


def roofline(dtype: str, E: int, M: int, K: int, mask: str = "random", **_) -> dict:  # noqa: N803
    """Bytes of the valid rows (the kernel reads and writes nothing else): the expected half for random masks."""
    rows = E * M if mask == "full" else E * M // 2
    return {"bytes": rows * (4 * K + K // 2 + K // BLOCK) + 8 * E, "flops": 8 * rows * K}


def get_baselines(**cfg) -> dict:
    """torch: the oracle in torch ops (FlashInfer's kernel needs SM100)."""
    def torch_eager():
        return lambda d: reference(**d)

    return {"torch": torch_eager}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "silu_and_mul_scaled_nvfp4_experts_quantize"


def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def _check_inputs(a, mask, a_global_sf) -> None:
    checks.tensor(_OP, "a", a, dtypes=tuple(_DTYPES.values()), ndim=3, contiguous=True, cuda=False)
    E, M, K2 = a.shape
    if K2 % (2 * BLOCK) or K2 == 0:
        _fail("a", f"a last dim 2K with K a positive multiple of {BLOCK}", f"2K={K2} (K={K2 / 2:g})")
    if M * (K2 // 2 // BLOCK) > MAX_BLOCKS:
        _fail("a", f"at most {MAX_BLOCKS} scale blocks per expert", str(M * (K2 // 2 // BLOCK)))
    checks.tensor(_OP, "mask", mask, dtypes=(torch.int32,), shape=(E,), contiguous=True, cuda=False)
    checks.tensor(_OP, "a_global_sf", a_global_sf, dtypes=(torch.float32,), shape=(E,), contiguous=True, cuda=False)
    checks.tensor(_OP, "a", a, cuda=True)
    checks.same_device(_OP, "a", a, mask=mask, a_global_sf=a_global_sf)


def silu_and_mul_scaled_nvfp4_experts_quantize(a: torch.Tensor, mask: torch.Tensor, a_global_sf: torch.Tensor):
    """FlashInfer's op: returns ``(x_q, sf)`` as upstream's views: codes ``(M, K/2, E)`` uint8 (physically (E, M,
    K/2)), SF ``(32, 4, padded_M/128, 4, padded_K/64, E)`` float8_e4m3fn. Rows at or past ``mask[e]`` are left
    unwritten (as upstream)."""
    _check_inputs(a, mask, a_global_sf)
    E, M, K2 = a.shape
    K = K2 // 2
    x_q = torch.empty(E, M, K // 2, dtype=torch.uint8, device=a.device)
    sf = torch.empty(E, sf_bytes_per_expert(M, K), dtype=torch.uint8, device=a.device)
    if runtime.direct_call(a, mask, a_global_sf):
        _run(a, mask, a_global_sf, x_q, sf)
    else:
        torch.ops.tirx.silu_and_mul_nvfp4_experts_quantize(a, mask, a_global_sf, x_q, sf)
    padded_m, padded_k = _fp4_rows.sf_rows(M, True), _fp4_rows.sf_cols(K // BLOCK, True)
    sf6 = sf.view(torch.float8_e4m3fn).view(E, padded_m // 128, padded_k // 4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)
    return x_q.permute(1, 2, 0), sf6


def _run(a, mask, a_global_sf, x_q, sf) -> None:
    _fp4_rows.check_alignment(_OP, x_q=x_q)
    if a.numel() == 0:
        return
    if a.data_ptr() % 16:
        a = a.clone()
    fn = _FUNCTIONS.get((a.dtype, a.get_device()), lambda: compile_params(dtype=str(a.dtype)[6:]), a.device)
    E, M, K2 = a.shape
    K = K2 // 2
    fn(a.view(-1), mask, a_global_sf, x_q.view(torch.uint8).view(-1).view(torch.uint64), sf.view(torch.uint8).view(-1),
       M, K, sf_bytes_per_expert(M, K), tiles(M, K), 0)  # zero: see vector.after_all


def tiles(M: int, K: int) -> int:  # noqa: N803
    """CTAs per expert: enough for M full rows (those past the mask exit at once)."""
    return max(1, -(-M * (K // BLOCK) // BLOCKS_PER_CTA))


_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::silu_and_mul_nvfp4_experts_quantize", mutates_args=("x_q", "sf"))
def _experts_quantize_op(a: torch.Tensor, mask: torch.Tensor, a_global_sf: torch.Tensor, x_q: torch.Tensor,
                         sf: torch.Tensor) -> None:
    _run(a, mask, a_global_sf, x_q, sf)


@_experts_quantize_op.register_fake
def _(a, mask, a_global_sf, x_q, sf):
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
