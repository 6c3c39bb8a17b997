# SPDX-License-Identifier: Apache-2.0
"""flashinfer_rmsnorm: params and bundle coverage, input validation, the row kernel's generated CUDA run on the CPU
(``core.emulate``: every output element against the fp32 oracle, nothing outside the rows written, accesses inside
their allocations, vector accesses aligned) at odd H, misaligned and strided rows, and split rows (both phases);
on a GPU, the harness's checks of every config, views at every alignment, FlashInfer.

The emulation helpers here also serve test_rmsnorm_quant.py and test_fused_add_rmsnorm_quant.py (same kernel)."""

import random
import re
import shutil

import pytest
import torch

from tirx_kernels.core import artifacts, model_dims, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import _row_plan as plan
from tirx_kernels.ported.flashinfer.norm import rmsnorm as mod

bf16 = torch.bfloat16

# CPU stand-ins for the PTX the FP8 path adds to what core/emulate/cuda_cpu.h covers: the 8-byte store, rcp.approx
# (exact here) and cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (round to nearest even over the finite codes, saturating).
EXTRA_HEADER = r"""
static inline void tvm_builtin_ptx_st_vec_global_v2_b32(const void* p, uint32_t a, uint32_t b) {
  if ((uintptr_t)p % 8 && emu_misaligned++ < 8) fprintf(stderr, "EMU misaligned 8-byte store at %p\n", p);
  uint32_t w[2] = {a, b};
  memcpy((void*)p, w, 8);
}
static inline void tvm_builtin_ptx_rcp_approx_ftz_f32(float& d, float v) { d = 1.0f / v; }
static inline uint32_t emu_fp8(float x, int mbits, int bias, int max_code) {
  if (std::isnan(x)) return 0x7f;
  uint32_t sign = std::signbit(x) ? 0x80 : 0;
  double a = std::fabs((double)x), best = 1e300;
  int code = 0;
  for (int c = 0; c <= max_code; ++c) {
    int e = c >> mbits, m = c & ((1 << mbits) - 1);
    double v = e == 0 ? std::ldexp((double)m, 1 - bias - mbits)
                      : std::ldexp(1.0 + std::ldexp((double)m, -mbits), e - bias);
    double d = std::fabs(v - a);
    if (d < best || (d == best && (c & 1) == 0)) { best = d; code = c; }
  }
  return sign | code;
}
static inline void tvm_builtin_ptx_cvt_f8x2_f32_rn_satfinite_e4m3x2_f32(uint16_t& d, float hi, float lo) {
  d = (uint16_t)((emu_fp8(hi, 3, 7, 0x7e) << 8) | emu_fp8(lo, 3, 7, 0x7e));
}
static inline void tvm_builtin_ptx_cvt_f8x2_f32_rn_satfinite_e5m2x2_f32(uint16_t& d, float hi, float lo) {
  d = (uint16_t)((emu_fp8(hi, 2, 15, 0x7b) << 8) | emu_fp8(lo, 2, 15, 0x7b));
}
"""


def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a group of < 32 lanes (rows packed in a warp, the
    specialized kernel at small H) gets the same butterfly inline, over its own width."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


def emulated_rows():
    """``get(dtype, gemma, residual, out_dtype, H=None)`` -> the row kernel compiled for the CPU (cached): the
    general one, or the specialized one at H."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    import tempfile
    from pathlib import Path

    from tirx_kernels.core import emulate
    from tirx_kernels.core.build import codegen

    header = Path(tempfile.mkdtemp()) / "cuda_cpu_fp8.h"
    header.write_text(f'#include "{emulate.HEADER}"\n{EXTRA_HEADER}')
    cache = {}

    def get(dtype, gemma, residual=False, out_dtype=None, H=None):
        key = (dtype, gemma, residual, out_dtype, H)
        if key not in cache:
            src = _narrow_warp_sums(codegen(mod.rows_kernel(dtype, gemma, residual=residual, out_dtype=out_dtype, H=H,
                                                            schedule=None if H else "general")))
            saved, emulate.HEADER = emulate.HEADER, header
            try:
                cache[key] = emulate.compile(src)
            finally:
                emulate.HEADER = saved
        return cache[key]
    return get


def _view(M, H, off, stride, dtype, g, fill=None):
    buf = torch.randn(off + (M - 1) * stride + H, generator=g).to(dtype) if fill is None else \
        torch.full((off + (M - 1) * stride + H,), fill, dtype=dtype)
    return buf, buf.as_strided((M, H), (stride, 1), off)


def run_rows_emulated(kern, M, H, *, dtype=bf16, gemma=False, residual=False, out_dtype=None, scale=1.0,
                      x=(0, None), r=(0, None), y=(0, None), w_off=0, sm_count=132, specialized=False):
    """The op's launches (``run_rows``' split plan for ``sm_count`` SMs, or with ``specialized`` the specialized
    kernel's one launch over its row plan's grid; scalars by name) on buffers that end with their last element;
    returns (out view, out buffer, want dict, the buffers for the untouched checks)."""
    g = torch.Generator().manual_seed(H * 7 + M)
    x_off, x_stride = x[0], x[1] or H
    r_off, r_stride = r[0], r[1] or H
    y_off, y_stride = y[0], y[1] or H
    xb, xv = _view(M, H, x_off, x_stride, dtype, g)
    rb, rv = _view(M, H, r_off, r_stride, dtype, g) if residual else (xb, xv)
    wb = torch.randn(w_off + H, generator=g).to(dtype)
    w = wb[w_off:]
    if out_dtype is None:
        yb, yv = _view(M, H, y_off, y_stride, dtype, g, fill=float("nan"))
    else:
        yb, yv = _view(M, H, y_off, y_stride, torch.uint8, g, fill=0x5A)
    sc = torch.tensor([scale], dtype=torch.float32)
    x_in = (xv.float() + rv.float()) if residual else xv.float()
    want = {"out": mod.normalized(x_in, w, 1e-6, gemma), "residual": x_in.to(dtype).float() if residual else None}
    before = {"x": xb.clone(), "r": rb.clone(), "w": wb.clone()}
    span, S = (-(-H // 8), 1) if specialized else mod.split_plan(M, H, sm_count)
    if specialized:
        p = plan.row_plan(H)
        grid, block = (-(-M // p["rows_per_cta"]),), (p["threads_per_row"] * p["rows_per_cta"],)
    else:
        grid, block = (M, S), (mod.THREADS,)
    ws = torch.full((M * S + 1,), float("nan"))
    phases = [0] if S == 1 else [1, 2]
    for phase in phases:
        wsv = ws[:1].view(1, 1) if phase == 0 else ws[:M * S].view(M, S)
        scalars = {"M": M, "H": H, "S": wsv.shape[1], "cse_v1": wsv.numel(), "eps": 1e-6, "phase": phase,
                   "span": span, "x_stride": x_stride, "r_stride": r_stride, "y_stride": y_stride, "zero": 0}
        ptrs = {"X_ptr": xv, "R_ptr": rv, "Wt_ptr": w, "Y_ptr": yv, "Sc_ptr": sc, "WS_ptr": wsv}
        args = {p.name: ptrs[p.name] if p.pointer else scalars[p.name] for p in kern.params}
        kern(grid=grid, block=block, **args).check()
    return {"y": yv, "yb": yb, "y_view": (y_off, y_stride), "x": xv, "xb": xb, "x_view": (x_off, x_stride),
            "r": rv, "rb": rb, "r_view": (r_off, r_stride), "wb": wb, "want": want, "before": before, "S": S}


def outside(buf, M, H, off, stride):
    inside = torch.zeros(buf.shape, dtype=torch.bool)
    inside.as_strided((M, H), (stride, 1), off).fill_(True)
    return ~inside


def check_untouched(res, M, H, residual):
    """Inputs unchanged (the residual outside its rows), the out buffer unchanged outside its rows."""
    b = res["before"]
    assert torch.equal(res["wb"], b["w"])
    if residual:
        mask = outside(res["rb"], M, H, *res["r_view"])
        assert torch.equal(res["rb"][mask], b["r"][mask])
        assert torch.equal(res["xb"], b["x"])
    elif res["xb"].data_ptr() != res["yb"].data_ptr():
        assert torch.equal(res["xb"], b["x"])
    yb = res["yb"]
    pad = yb[outside(yb, M, H, *res["y_view"])]
    assert (pad.isnan().all() if yb.is_floating_point() else (pad == 0x5A).all())


# ------------------------------------------------------------------------------------------------ params

def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    rng = random.Random(0)
    for call in mod.call_samples(rng):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call
    for cfg in mod.CONFIGS + mod.BENCH_CONFIGS:  # build --all adds the configs' own params (H 1024, 3072 here)
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**cfg))]
        assert bundled & set(cands), cfg
    # both kernels of every catalog size: the specialized one, and the general one it falls back to
    assert {"schedule": "general", "dtype": "bfloat16", "gemma": True} in mod.artifact_params()
    assert {mod.compile_params(dtype="float16", gemma=g, H=H)["H"] for g in (False, True)
            for H in model_dims.hidden_sizes()} <= {p.get("H") for p in mod.artifact_params()}


def test_compile_params():
    assert mod.compile_params(dtype="bfloat16", H=4096, M=3) == {"dtype": "bfloat16", "gemma": False, "H": 4096}
    general = {"dtype": "float16", "gemma": True, "schedule": "general"}
    for H in (4095, 8, 16392, 65536):
        assert mod.compile_params(dtype="float16", gemma=True, H=H) == general
    assert mod.compile_params(dtype="float16", gemma=True, H=4096, schedule="general") == general
    assert mod.general_params({"dtype": "float16", "gemma": True, "H": 4096}) == general
    with pytest.raises(ValueError, match="takes H at run time"):
        mod.get_kernel("bfloat16", False, 4096, schedule="general")
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.get_kernel("bfloat16", False, 4095)


def test_uses_general():
    """The specialized kernel takes a call only where H has one and every row and the weight are on its vectors."""
    x = torch.zeros(4, 4096 + 8, dtype=bf16)
    w = torch.zeros(4096 + 8, dtype=bf16)
    y = torch.zeros(4, 4096, dtype=bf16)
    y8 = torch.zeros(4, 4096 + 8, dtype=torch.uint8)
    assert not mod.uses_general(x[:, :4096], x[:, :4096], w[:4096], y)
    assert not mod.uses_general(x[:, 8:], x[:, 8:], w[8:], y8[:, 8:])  # FP8 out rows: 8 bytes suffice
    assert mod.uses_general(x[:, 1:4097], x[:, 1:4097], w[:4096], y)  # x off 16 bytes
    assert mod.uses_general(x[:, :4096], x[:, :4096], w[1:4097], y)  # the weight
    assert mod.uses_general(x[:, :4096], x[:, 1:4097], w[:4096], y)  # the residual
    assert mod.uses_general(x[:, :4096], x[:, :4096], w[:4096], y8[:, 4:4100])  # FP8 out off 8 bytes
    z = torch.zeros(4, 4100, dtype=bf16)
    assert mod.uses_general(z[:, :4096], z[:, :4096], w[:4096], y)  # row stride 4100: rows 2.. off 16 bytes
    assert mod.uses_general(z[:, :4095], z[:, :4095], w[:4095], y[:, :4095])  # odd H
    assert not mod.uses_general(z[:1, :4096], z[:1, :4096], w[:4096], y[:1])  # one row: its stride is never used


@pytest.mark.parametrize("M, H, sms", [(1, 1, 132), (3, 65536, 132), (3, 1048576, 132), (989, 16384, 132),
                                       (32, 4096, 132), (1, 8193, 132), (2, 1048577, 78)])
def test_split_plan_covers_the_row(M, H, sms):
    span, S = mod.split_plan(M, H, sms)
    chunks = -(-H // 8)
    assert span * S >= chunks > span * (S - 1)  # every span holds a chunk
    assert S == 1 and span == chunks or span % mod.SLAB == 0


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_rmsnorm"
    assert len(mod.KERNEL_META["upstream"]["commit"]) == 40
    labels = [c["label"] for c in mod.CONFIGS + mod.BENCH_CONFIGS]
    assert len(labels) == len(set(labels))
    assert {111, 500, 1024, 3072, 4096, 8192, 16384} <= {c["H"] for c in mod.CONFIGS}
    assert {1, 19, 99, 989} <= {c["M"] for c in mod.CONFIGS}


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args, kw, arg", [
    ((_t(4, 64, dtype=torch.float32), _t(64)), {}, "input"),
    ((_t(4, 64), _t(32)), {}, "weight"),
    ((_t(4, 64), _t(64, dtype=torch.float16)), {}, "weight"),
    ((_t(4, 0), _t(0)), {}, "input"),
    ((_t(4, 64), _t(64)), {"out": _t(4, 32)}, "out"),
    ((_t(4, 64), _t(64)), {"out": _t(64, 4).t()}, "out"),
    ((_t(4, 64), _t(64)), {"eps": "1e-6"}, "eps"),
    ((_t(4, 64), _t(64)), {}, "input"),  # CPU tensors
])
def test_rejected_inputs_name_the_argument(args, kw, arg):
    for op in (mod.rmsnorm, mod.gemma_rmsnorm):
        with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
            op(*args, **kw)


# ------------------------------------------------------------------------------------------------ CPU emulation

@pytest.fixture(scope="module")
def emulated():
    return emulated_rows()


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("M, H, x, y, w_off, sms", [
    (5, 128, (0, None), (0, None), 0, 132), (3, 4096, (0, 4608), (0, 4160), 0, 132),
    (19, 111, (3, 113), (0, None), 5, 132), (2, 500, (0, 503), (1, 500), 0, 132), (7, 3, (1, 5), (2, 3), 1, 132),
    (5, 1, (0, 1), (0, 1), 0, 132), (3, 4095, (0, None), (0, None), 0, 132), (2, 8200, (0, None), (0, None), 0, 132),
    (4, 16, (8, 24), (0, 16), 8, 132), (2, 20001, (0, None), (0, None), 0, 132),
    # split rows: both phases, aligned and element-wise, a span's last slab partial
    (3, 24576, (0, None), (0, None), 0, 132), (2, 20001, (1, 20003), (0, None), 0, 132),
    (1, 9000, (0, None), (0, None), 0, 4),
])
def test_rows_emulated(emulated, gemma, M, H, x, y, w_off, sms):
    res = run_rows_emulated(emulated("bfloat16", gemma), M, H, gemma=gemma, x=x, y=y, w_off=w_off, sm_count=sms)
    torch.testing.assert_close(res["y"].float(), res["want"]["out"], atol=2e-2, rtol=1.6e-2)
    check_untouched(res, M, H, False)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("M, H, x, y", [
    (5, 128, (0, None), (0, None)), (37, 128, (8, 136), (0, 144)),  # rows packed in a CTA: its tail rows masked
    (3, 4096, (0, 4608), (0, 4160)), (2, 2880, (0, None), (0, None)),  # a lane's last vector past H
    (3, 24, (0, 32), (0, 24)), (1, 16384, (0, None), (0, None)), (2, 5120, (0, None), (8, 5128)),
])
def test_specialized_rows_emulated(emulated, gemma, M, H, x, y):
    res = run_rows_emulated(emulated("bfloat16", gemma, H=H), M, H, gemma=gemma, x=x, y=y, specialized=True)
    torch.testing.assert_close(res["y"].float(), res["want"]["out"], atol=2e-2, rtol=1.6e-2)
    check_untouched(res, M, H, False)


def test_specialized_matches_the_general_bits(emulated):
    """Same arithmetic, expression for expression: the specialized kernel's output equals the general one's."""
    got = run_rows_emulated(emulated("float16", True, H=3584), 9, 3584, dtype=torch.float16, gemma=True,
                            specialized=True)["y"]
    want = run_rows_emulated(emulated("float16", True), 9, 3584, dtype=torch.float16, gemma=True)["y"]
    assert torch.equal(got, want)


def test_rows_emulated_fp16_in_place(emulated):
    kern = emulated("float16", False)
    res = run_rows_emulated(kern, 3, 77, dtype=torch.float16, x=(1, 80), y=(2, 81))
    torch.testing.assert_close(res["y"].float(), res["want"]["out"], atol=2e-3, rtol=4e-3)
    check_untouched(res, 3, 77, False)


def test_split_rows_take_two_phases():
    assert mod.split_plan(3, 24576, 132)[1] > 1 and mod.split_plan(3, 1048576, 132)[1] > 1
    assert mod.split_plan(989, 16384, 132)[1] == 1


# ------------------------------------------------------------------------------------------------ SASS

@pytest.mark.parametrize("params", [{"dtype": "bfloat16", "gemma": False, "schedule": "general"},
                                    {"dtype": "float16", "gemma": True, "schedule": "general"},
                                    {"dtype": "bfloat16", "gemma": False, "H": 4096},
                                    {"dtype": "float16", "gemma": True, "H": 128}])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_rmsnorm", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("H", [1, 7, 8, 111, 128, 500, 4095, 4096, 16384, 16392, 65536])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_any_alignment_and_stride(H, dtype):
    torch.manual_seed(H)
    M = 33 if H < 65536 else 3
    gemma = H % 2 == 1
    op = mod.gemma_rmsnorm if gemma else mod.rmsnorm
    atol, rtol = (2e-2, 1.6e-2) if dtype == torch.bfloat16 else (2e-3, 4e-3)
    w = torch.randn(H, device="cuda").to(dtype)
    for x_off, x_pad, y_off, y_pad in [(0, 0, 0, 0), (1, 3, 0, 0), (0, 0, 3, 1), (7, 8, 7, 8)]:
        xb = torch.randn(M, x_off + H + x_pad, device="cuda").to(dtype)
        yb = torch.full((M, y_off + H + y_pad), float("nan"), device="cuda", dtype=dtype)
        x, y = xb[:, x_off:x_off + H], yb[:, y_off:y_off + H]
        want = mod.normalized(x.float(), w, 1e-6, gemma)
        op(x, w, 1e-6, out=y)
        torch.testing.assert_close(y.float(), want, atol=atol, rtol=rtol)
        pad = torch.ones_like(yb, dtype=torch.bool)
        pad[:, y_off:y_off + H] = False
        assert yb[pad].isnan().all()
        torch.testing.assert_close(op(x, w).float(), want, atol=atol, rtol=rtol)


@gpu
def test_gpu_matches_flashinfer_and_3d():
    flashinfer = pytest.importorskip("flashinfer")
    for gemma in (False, True):
        for M, H in [(1, 4096), (19, 111), (99, 1024), (989, 8192)]:
            x = torch.randn(M, H, device="cuda").to(bf16)
            w = torch.randn(H, device="cuda").to(bf16)
            ours = (mod.gemma_rmsnorm if gemma else mod.rmsnorm)(x, w)
            theirs = (flashinfer.norm.gemma_rmsnorm if gemma else flashinfer.norm.rmsnorm)(x, w)
            torch.testing.assert_close(ours, theirs, atol=1e-2, rtol=1e-2)
    x = torch.randn(4, 8, 128, device="cuda").to(bf16)
    w = torch.randn(128, device="cuda").to(bf16)
    torch.testing.assert_close(mod.rmsnorm(x, w), flashinfer.norm.rmsnorm(x, w), atol=1e-2, rtol=1e-2)


@gpu
def test_gpu_empty_and_compile():
    e = torch.empty(0, 64, device="cuda", dtype=bf16)
    assert mod.rmsnorm(e, torch.ones(64, device="cuda", dtype=bf16)).shape == (0, 64)
    x = torch.randn(8, 4096, device="cuda").to(bf16)
    w = torch.randn(4096, device="cuda").to(bf16)
    got = torch.compile(lambda a, b: mod.gemma_rmsnorm(a, b), fullgraph=True)(x, w)
    torch.testing.assert_close(got.float(), mod.normalized(x.float(), w, 1e-6, True), atol=2e-2, rtol=1.6e-2)


def test_harness_wiring_on_cpu():
    """reference's keys and the strided out through the harness's checks on CPU (a launch writing the oracle)."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(dtype, M, H, eps=1e-6, gemma=False, input_row_stride=None, **_):
        t = getattr(torch, dtype)
        return {"input": torch.randn(M, input_row_stride or H).to(t)[:, :H], "weight": torch.randn(H).to(t),
                "eps": eps, "gemma": gemma, "out": torch.empty(M, H, dtype=t)}

    def launch(cfg, data):
        data["out"].copy_(mod.reference(**data)["out"])

    fake = types.SimpleNamespace(KERNEL_META=mod.KERNEL_META, reference=mod.reference, prepare_data=prepare_data,
                                 launch=launch, get_baselines=lambda **cfg: {})
    for cfg in ({"dtype": "bfloat16", "M": 5, "H": 64, "gemma": True},
                {"dtype": "float16", "M": 3, "H": 111, "input_row_stride": 120}):
        assert harness.check_config(fake, cfg)["status"] == "passed"


# graph replay looks its rows up in CONFIGS (bf16_32x4096, a BENCH_CONFIGS row, raised KeyError on the H200)
REPLAY_LABELS = ["bf16_19x4096_strided", "bf16_3x65536_split"]


def test_replay_labels_are_config_rows():
    from tirx_kernels.core import harness

    for label in REPLAY_LABELS:
        harness.find_config(mod, label)


@gpu
@pytest.mark.parametrize("label", REPLAY_LABELS)
def test_gpu_graph_replay(label):
    """Captured in a CUDA graph (the split rows' two launches and workspace too), replayed on new inputs."""
    from tirx_kernels.core import testing

    testing.check_graph_replay("flashinfer_rmsnorm", label)
