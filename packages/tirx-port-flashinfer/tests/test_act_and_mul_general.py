# SPDX-License-Identifier: Apache-2.0
"""act_and_mul for every d and row count: params resolution against the bundle (``artifact_params`` /
``general_params``), launch grids within CUDA's limits, the general kernel's chunk/shift/predicate arithmetic
replayed on the CPU, the public op's row-chunked launches, the general kernel's SASS; and, on a GPU, views with
every alignment and odd strides against the fp32 oracle with poisoned padding."""

import random

import pytest
import torch

from tirx_kernels.core import artifacts, model_dims, runtime
from tirx_kernels.ported.flashinfer.activation import _act_and_mul_general as gen
from tirx_kernels.ported.flashinfer.activation import act_and_mul as mod

GRID_X_MAX, GRID_Y_MAX = 2**31 - 1, 65535
_ACTS_DTYPES = [(a, t) for a in mod.ACTS for t in ("bfloat16", "float16")]


def _sample_ds() -> list[int]:
    rng = random.Random(0)
    ds = set(range(1, 300)) | {rng.randrange(1, 40001) for _ in range(400)}
    for d in model_dims.intermediate_sizes() + [c["d"] for c in mod.CONFIGS + mod.BENCH_CONFIGS]:
        ds |= {d - 1, d, d + 1}
    return sorted(d for d in ds if d >= 1)


# ------------------------------------------------------------------------------------------------ params

def test_every_d_resolves_to_a_bundled_artifact():
    """Every (act, dtype, d) the public op can ask for has a candidate (its own params, else the general ones)
    that ``python -m tirx_kernels.build --all`` puts in the bundle (``artifact_params``)."""
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for act, dtype in _ACTS_DTYPES:
        for d in _sample_ds():
            for general in (False, True):
                params = mod.compile_params(act=act, dtype=dtype, d=d, **({"schedule": "general"} if general else {}))
                cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, params)]
                assert bundled & set(cands), (act, dtype, d, cands)


def test_compile_params_specialized_where_they_apply():
    assert mod.compile_params(act="silu", dtype="bfloat16", d=14336, M=5) == {"act": "silu", "dtype": "bfloat16",
                                                                              "d": 14336}
    general = {"act": "silu", "dtype": "bfloat16", "schedule": "general"}
    assert mod.compile_params(act="silu", dtype="bfloat16", d=14335, M=5) == general
    assert mod.compile_params(act="silu", dtype="bfloat16", d=4096, schedule="general") == general
    assert mod.general_params({"act": "silu", "dtype": "bfloat16", "d": 4096}) == general
    with pytest.raises(ValueError, match="general schedule takes no d"):
        mod.get_kernel("silu", "bfloat16", 4096, schedule="general")


def test_artifact_params_count():
    """6 general + catalog widths x bf16 x {silu, gelu_tanh} (all 3 acts x 2 dtypes would be 270: too many)."""
    params = mod.artifact_params()
    keys = [artifacts.canonical_params(p) for p in params]
    widths = [d for d in model_dims.intermediate_sizes() if d % 8 == 0]
    assert len(keys) == len(set(keys)) == 6 + 2 * len(widths) <= 150
    assert sum(p.get("schedule") == "general" for p in params) == 6


# ------------------------------------------------------------------------------------------------ grids

def _tile_grid(d: int, M: int) -> tuple[int, int]:
    plan = mod.tile_plan(d)
    return plan["segments"], -(-M // plan["rows_per_cta"])


@pytest.mark.parametrize("M", [65536, 200000, 2**31, 2**31 + 12345])
def test_specialized_launches_stay_within_grid_limits(M):
    """The public op launches the specialized kernel on ``rows_per_launch`` rows at a time: grid y <= 65535."""
    for d in sorted({d for d in _sample_ds() if d % 8 == 0}):
        step = mod.rows_per_launch(mod.compile_params(act="silu", dtype="bfloat16", d=d))
        gx, gy = _tile_grid(d, min(M, step))
        assert gx <= GRID_X_MAX and gy <= GRID_Y_MAX, (d, M, step)
        assert _tile_grid(d, step + 1)[1] > GRID_Y_MAX  # no more launches than needed


@pytest.mark.parametrize("M", [1, 65536, 200000, 2**31 - 1])
def test_general_grid_within_limits(M):
    step = mod.rows_per_launch(mod.general_params({"act": "silu", "dtype": "bfloat16"}))
    for d in _sample_ds() + [2**27, 2**28 + 3, 2**30 - 1]:
        for aligned in (True, False):
            p = gen.plan(d, aligned)
            gx, gy = p["grid"](min(M, step))
            assert 1 <= gx <= GRID_X_MAX and 1 <= gy <= GRID_Y_MAX, (d, M, p)
            assert p["segments"] * p["width"] >= p["cmax"] and p["width"] <= gen.THREADS
            assert gx * p["rows_per_cta"] < 2**31  # int32 row index of the last CTA's rows


def test_general_plan_examples():
    # One row per CTA in 7 and 8 segments: 14336 aligned = 1792 chunks = 7 x 256; 14335 needs 1793.
    assert gen.plan(14336) | {"grid": None} == {"cmax": 1792, "rows_per_cta": 1, "segments": 7, "width": 256,
                                                "grid": None}
    assert gen.plan(14335)["cmax"] == 1793 and gen.plan(14336, rows_aligned=False)["cmax"] == 1793
    p = gen.plan(5121)
    assert (p["cmax"], p["segments"], p["width"]) == (641, 3, 256)
    assert gen.plan(1024)["rows_per_cta"] == 2 and gen.plan(3)["rows_per_cta"] == 128
    assert gen.plan(1)["rows_per_cta"] == 256  # one chunk (two columns at most) a row
    # chunks_per_thread=2: lanes count pairs of chunks (641 chunks -> 321 lanes, 2 segments; 200 -> 100 lanes, 2 rows)
    p = gen.plan(5121, chunks_per_thread=2)
    assert (p["cmax"], p["segments"], p["width"], p["grid"](3)) == (641, 2, 256, (3, 2))
    assert gen.plan(1600, chunks_per_thread=2)["rows_per_cta"] == 2


# ------------------------------------------------------------------------------------------------ replay

def _replay_general(M, d, x_off, x_stride, y_off, y_stride, max_grid_y=GRID_Y_MAX):
    """Run the general kernel's index arithmetic (the expressions of ``build_general``) for every CTA and thread
    on a flat memory whose element i holds i: check each load is 16-byte aligned and lies in a 16-byte block
    holding an element of the row's source half, each out element is written once with (its gate's, its up's)
    addresses, nothing else is written. ``x_off`` / ``y_off``: element offsets of x / out in memory."""
    cmax = d >> 3 if d % 8 == 0 and y_stride % 8 == 0 else (d + 14) >> 3
    lg = gen.lanes_log2(cmax)
    segs = (cmax + 255) // 256
    grid_y = min(segs, max_grid_y)
    gx, gy = (M + (256 >> lg) - 1) >> (8 - lg), grid_y
    if max_grid_y == GRID_Y_MAX:
        assert gen.plan(d, y_stride % 8 == 0)["grid"](M) == (gx, gy)
    written = {}

    def load(addr, lo, hi):
        """The aligned vector at ``addr``: it must hold one of the elements lo..hi-1 (the row's half)."""
        assert addr % 8 == 0 and lo - 8 < addr < hi, (addr, lo, hi)
        return list(range(addr, addr + 8))

    for bx in range(gx):
        for by in range(gy):
            for tid in range(256):
                row = bx * (256 >> lg) + (tid >> lg)
                lane = tid & ((1 << lg) - 1)
                if row >= M:
                    continue
                xb, yb = x_off + row * x_stride, y_off + row * y_stride  # element addresses of the rows
                ag, ao = xb & 7, yb & 7
                sg, su = (ag - ao) & 7, (ag + d - ao) & 7
                chunks = (ao + d + 7) >> 3
                for k in range((by << lg) + lane, chunks, grid_y << lg):
                    c0 = (k << 3) - ao
                    words = {}
                    for name, base, s in (("g", xb, sg), ("u", xb + d, su)):
                        w = [None] * 16
                        if c0 + 8 - s > 0:
                            w[:8] = load(base + c0 - s, base, base + d)
                        if s > 0 and c0 + 8 - s < d:
                            w[8:] = load(base + c0 - s + 8, base, base + d)
                        words[name] = w[s:s + 8]  # shift_down's result, element by element
                    full = c0 >= 0 and c0 + 8 <= d
                    assert (yb + c0) % 8 == 0 or not full  # 16-byte stores
                    for e in range(8):
                        if 0 <= c0 + e < d:
                            addr = yb + c0 + e
                            assert addr not in written, ("twice", row, c0 + e)
                            g, u = words["g"][e], words["u"][e]
                            assert (g, u) == (xb + c0 + e, xb + d + c0 + e), (row, c0 + e, g, u)
                            written[addr] = row
    assert len(written) == M * d


@pytest.mark.parametrize("d", [1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1023, 1024, 2049, 5121])
def test_general_arithmetic_contiguous(d):
    M = 19 if d < 1000 else 3
    for x_off, y_off in [(0, 0), (1, 3), (7, 5), (4, 4)]:
        _replay_general(M, d, x_off, 2 * d, y_off, d)


@pytest.mark.parametrize("d, x_stride, y_stride", [(8, 24, 8), (16, 33, 19), (100, 213, 101), (600, 1208, 600),
                                                   (1792, 3584, 1800), (3, 6, 4), (3, 7, 5)])
def test_general_arithmetic_strided(d, x_stride, y_stride):
    for x_off, y_off in [(0, 0), (3, 0), (0, 6), (5, 1)]:
        _replay_general(9, d, x_off, x_stride, y_off, y_stride)


def test_general_arithmetic_random_layouts():
    rng = random.Random(1)
    for _ in range(60):
        d = rng.choice([rng.randrange(1, 40), rng.randrange(1, 3000)])
        x_stride = 2 * d + rng.choice([0, 0, rng.randrange(0, 17)])
        y_stride = d + rng.choice([0, 0, rng.randrange(0, 17)])
        _replay_general(rng.randrange(1, 6), d, rng.randrange(0, 8), x_stride, rng.randrange(0, 8), y_stride)


def test_general_arithmetic_segment_loop():
    """Past 65535 segments (d > 134M) blockIdx.y strides over them: replayed with a grid-y cap of 2."""
    _replay_general(2, 5 * 2048 + 3, 1, 2 * (5 * 2048 + 3), 2, 5 * 2048 + 3, max_grid_y=2)
    _replay_general(2, 3 * 2048, 0, 2 * 3 * 2048, 0, 3 * 2048, max_grid_y=2)


# ------------------------------------------------------------------------------------------------ public op

class _Recorder:
    """Stands in for ``mod._FUNCTIONS``: records the params asked for and each launch's (rows, x / out pointer)."""

    def __init__(self):
        self.calls, self.params = [], []

    def get(self, key, params_of, device=None):
        self.params.append(params_of())

        def fn(x, out, zero):
            assert zero == 0 and x.shape[0] == out.shape[0]
            self.calls.append((x.shape[0], x.data_ptr(), out.data_ptr()))
        return fn


@pytest.mark.parametrize("M, d, general, launches", [
    (65536, 1024, False, 2), (200000, 1024, False, 4), (200000, 4096, False, 4), (2**31 + 5, 2048, False, 32769),
    (200000, 1023, True, 1), (200000, 8, False, 1), (37, 14336, False, 1),
])
def test_public_op_launches_row_chunks(monkeypatch, M, d, general, launches):
    """``_run`` (meta tensors, a recording kernel): one launch per ``rows_per_launch`` rows, each at its row
    offset; the specialized kernel for aligned d, the general one otherwise."""
    rec = _Recorder()
    monkeypatch.setattr(mod, "_FUNCTIONS", rec)
    x = torch.empty(M, 2 * d, dtype=torch.bfloat16, device="meta")
    out = torch.empty(M, d, dtype=torch.bfloat16, device="meta")
    mod._run(x, "silu", out)
    assert len(rec.calls) == launches and sum(c[0] for c in rec.calls) == M
    step = rec.calls[0][0]
    assert all(c[1] == i * step * 2 * d * 2 and c[2] == i * step * d * 2 for i, c in enumerate(rec.calls))
    assert (rec.params[0].get("schedule") == "general") == general


def test_public_op_picks_general_for_rows_off_16_bytes(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(mod, "_FUNCTIONS", rec)
    buf = torch.empty(4, 2 * 4096 + 8, dtype=torch.bfloat16, device="meta")
    for x in (buf[:, 8:8200], buf[:, 1:8193], buf[:, :8192]):
        mod._run(x, "gelu", torch.empty(4, 4096, dtype=torch.bfloat16, device="meta"))
    assert [p.get("schedule") for p in rec.params] == [None, "general", None]
    out_odd = torch.empty(4, 4096 + 3, dtype=torch.bfloat16, device="meta")[:, :4096]  # out rows off 16 bytes
    mod._run(buf[:, :8192], "gelu", out_odd)
    assert rec.params[-1].get("schedule") == "general"


# ------------------------------------------------------------------------------------------------ builds

@pytest.mark.parametrize("act, dtype", [("silu", "bfloat16"), ("gelu", "float16"), ("gelu_tanh", "bfloat16")])
def test_general_builds(act, dtype):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    from tirx_kernels.core import testing

    params = mod.general_params({"act": act, "dtype": dtype})
    sass = testing.build_and_check_sass(mod, "act_and_mul", params)  # no spills / stack / local memory
    _, info = artifacts.build_cached(mod, "act_and_mul", params)
    (kernel,) = info["ptxas"]["kernels"].values()
    assert kernel["registers"] <= 64, kernel  # >= 4 CTAs of 256 threads an SM
    assert sass.count("LDG.E.128") == 4  # gate and up: two aligned vectors each, predicated
    assert sass.count("STG.E.128") == 1 and sass.count("STG.E.U16") == 8  # a full chunk; a head/tail element-wise
    assert "LDG.E.U16" not in sass and "LDL" not in sass


# ------------------------------------------------------------------------------------------------ CPU emulation

@pytest.fixture(scope="module")
def emulated():
    """The general kernel's generated CUDA compiled for the CPU (``core.emulate``), per activation."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    kernels = {(act, gen.CHUNKS_PER_THREAD): emulate.compile(
        mod.get_kernel(**mod.general_params({"act": act, "dtype": "bfloat16"}))) for act in ("silu", "gelu_tanh")}
    # the odd-d knob's other value (tools/sweeps/odd_sizes.py; 2: two chunks a thread, three aligned vectors a source)
    other = 3 - gen.CHUNKS_PER_THREAD
    kernels["silu", other] = emulate.compile(gen.build_general("silu", "bfloat16", mod.LOAD_POLICY, mod.STORE_POLICY,
                                                               mod.PDL, chunks_per_thread=other))
    return kernels


@pytest.mark.parametrize("act, chunks_per_thread", [("silu", 1), ("silu", 2), ("gelu_tanh", gen.CHUNKS_PER_THREAD)])
@pytest.mark.parametrize("M, d, x_off, x_stride, y_off, y_stride", [
    (5, 1, 0, 2, 0, 1), (7, 3, 1, 6, 3, 3), (300, 2, 1, 4, 7, 2), (33, 17, 2, 40, 6, 19),
    (9, 8, 0, 16, 3, 8), (9, 8, 5, 16, 0, 8), (4, 100, 3, 213, 1, 101), (3, 1024, 0, 2048, 3, 1024),
    (3, 4096, 0, 8192, 0, 4096), (2, 4096, 1, 8192, 2, 4100), (2, 2049, 1, 4098, 1, 2049),
    (3, 5121, 0, 10242, 0, 5121), (2, 14335, 7, 28670, 5, 14335),
])
def test_general_kernel_emulated(emulated, act, chunks_per_thread, M, d, x_off, x_stride, y_off, y_stride):
    """The launch the host code makes (its grid and scalar arguments), on buffers that end with their last
    element: every out element against the fp32 oracle, nothing else written, no access outside an allocation,
    every 16-byte access aligned."""
    g = torch.Generator().manual_seed(d)
    xb = torch.randn(x_off + (M - 1) * x_stride + 2 * d, generator=g).to(torch.bfloat16)
    x = xb.as_strided((M, 2 * d), (x_stride, 1), x_off)
    yb = torch.full((y_off + (M - 1) * y_stride + d,), float("nan"), dtype=torch.bfloat16)
    out = yb.as_strided((M, d), (y_stride, 1), y_off)
    x_before = xb.clone()
    gx, gy = gen.plan(d, y_stride % 8 == 0, chunks_per_thread)["grid"](M)
    emulated[act, chunks_per_thread](x, out, M, d & 7, y_stride & 7, d >> 3, (d + 14) >> 3, d, x_stride, y_stride, 0,
                  grid=(gx, gy), block=(gen.THREADS,)).check()
    torch.testing.assert_close(out.float(), _oracle(act, x), atol=1e-3, rtol=1e-2)
    written = torch.zeros_like(yb, dtype=torch.bool)
    written.as_strided((M, d), (y_stride, 1), y_off).fill_(True)
    assert yb[~written].isnan().all() and torch.equal(xb, x_before)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


def _oracle(act, x):
    return mod.reference(x, act)["out"]


@gpu
@pytest.mark.parametrize("d", [1, 2, 3, 7, 8, 9, 15, 16, 17, 100, 1000, 1024, 4095, 4096, 5121])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_any_alignment_and_stride(d, dtype):
    """x and out as views at every element offset 0..7 inside padded rows (odd row strides too), 33 rows: the
    oracle's values where out is, the NaN poison untouched everywhere else."""
    torch.manual_seed(d)
    act = ("silu", "gelu", "gelu_tanh")[d % 3]
    atol, rtol = (2e-2, 1.6e-2) if dtype == torch.bfloat16 else (2e-3, 4e-3)  # the harness's, atol absolute
    M = 33
    for x_off, x_pad, y_off, y_pad in [(0, 0, 0, 0), (1, 3, 0, 0), (0, 0, 3, 1), (5, 7, 2, 9), (7, 8, 7, 8)]:
        xbuf = torch.randn(M, x_off + 2 * d + x_pad, device="cuda").to(dtype)
        x = xbuf[:, x_off:x_off + 2 * d]
        ybuf = torch.full((M, y_off + d + y_pad), float("nan"), device="cuda", dtype=dtype)
        out = ybuf[:, y_off:y_off + d]
        mod._PUBLIC[act](x, out=out)
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), _oracle(act, x), atol=atol, rtol=rtol)
        poison = torch.ones_like(ybuf, dtype=torch.bool)
        poison[:, y_off:y_off + d] = False
        assert ybuf[poison].isnan().all(), (x_off, x_pad, y_off, y_pad)
        got = mod._PUBLIC[act](x)  # a fresh contiguous out
        torch.testing.assert_close(got.float(), _oracle(act, x), atol=atol, rtol=rtol)


@gpu
def test_gpu_general_matches_specialized():
    """At an aligned d the general kernel computes what the specialized one does (the same fp32 expressions: at
    most one bf16 unit apart, where nvcc contracts differently)."""
    x = torch.randn(257, 2 * 4096, device="cuda").to(torch.bfloat16)
    for act in mod.ACTS:
        a = torch.empty(257, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.empty_like(a)
        mod._run(x, act, a)
        mod._run(x, act, b, general=True)
        torch.cuda.synchronize()
        torch.testing.assert_close(a, b, atol=0, rtol=2**-7, msg=act)


@gpu
def test_gpu_leading_dims_and_empty():
    x = torch.randn(3, 5, 2 * 77, device="cuda").to(torch.float16)
    torch.testing.assert_close(mod.silu_and_mul(x).float(), _oracle("silu", x), atol=2e-3, rtol=2e-3)
    assert mod.silu_and_mul(torch.empty(0, 2 * 5, device="cuda", dtype=torch.bfloat16)).shape == (0, 5)
    assert mod.gelu_and_mul(torch.ones(1, 2, device="cuda", dtype=torch.bfloat16)).shape == (1, 1)
