# SPDX-License-Identifier: Apache-2.0
"""merge_state / merge_state_in_place / merge_states: input validation, params and bundle coverage, the build
(16-byte loads, no spills), the generated CUDA run on the CPU (``core.emulate``) against the fp32 oracle, and
on a GPU graph replay and the public ops on odd layouts (every config against the oracle and FlashInfer 0.7.4 runs
in this package's test_gpu.py)."""

from __future__ import annotations

import random
import re
import shutil

import pytest
import torch

from tirx_kernels.core import checks
from tirx_kernels.ported.flashinfer.cascade import merge_state as mod

NEG_INF = float("-inf")


# ------------------------------------------------------------------------------------------------ validation

def _v(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("call, arg", [
    (lambda: mod.merge_state(_v(4, 2, 60), torch.zeros(4, 2), _v(4, 2, 60), torch.zeros(4, 2)), "v_a"),
    (lambda: mod.merge_state(_v(4, 2, 1032), torch.zeros(4, 2), _v(4, 2, 1032), torch.zeros(4, 2)), "v_a"),
    (lambda: mod.merge_state(_v(4, 2, 64), torch.zeros(4, 2), _v(4, 2, 64, dtype=torch.float16),
                             torch.zeros(4, 2)), "v_b"),
    (lambda: mod.merge_state(_v(4, 2, 64), torch.zeros(4, 2), _v(4, 3, 64), torch.zeros(4, 2)), "v_b"),
    (lambda: mod.merge_state(_v(4, 2, 64), torch.zeros(4, 2, dtype=torch.float16), _v(4, 2, 64),
                             torch.zeros(4, 2)), "s_a"),
    (lambda: mod.merge_state(_v(4, 2, 64), torch.zeros(4, 2), _v(4, 2, 64), torch.zeros(4, 3)), "s_b"),
    (lambda: mod.merge_state(_v(4, 2, 64).float(), torch.zeros(4, 2), _v(4, 2, 64), torch.zeros(4, 2)), "v_a"),
    # Alignment is checked where the kernel is launched (fake tensors under torch.compile have no address).
    (lambda: mod._run("merge_state", (_v(4, 2, 128)[..., 1:65], torch.zeros(4, 2), _v(4, 2, 64),
                                      torch.zeros(4, 2)), (_v(4, 2, 64), torch.zeros(4, 2))), "v_a"),
    (lambda: mod._run("merge_state_in_place", (_v(4, 2, 64), torch.zeros(4, 2), _v(4, 2, 72)[..., 4:68],
                                               torch.zeros(4, 2), None), None), "v_other"),
    (lambda: mod._run("merge_states", (_v(4, 3, 2, 64), torch.zeros(4, 3, 2)),
                      (_v(4, 2, 65)[..., 1:], torch.zeros(4, 2))), "out[0]"),
    (lambda: mod.merge_state(_v(4, 2, 64), torch.zeros(4, 2), _v(4, 2, 64), torch.zeros(4, 2),
                             out=(_v(4, 2, 32), torch.zeros(4, 2))), "out[0]"),
    (lambda: mod.merge_state_in_place(_v(4, 2, 64), torch.zeros(4, 2), _v(4, 2, 64), torch.zeros(4, 2),
                                      mask=torch.ones(5, dtype=torch.bool)), "mask"),
    (lambda: mod.merge_state_in_place(_v(4, 2, 64), torch.zeros(4, 2), _v(4, 2, 64), torch.zeros(4, 2),
                                      mask=torch.ones(4, dtype=torch.int32)), "mask"),
    (lambda: mod.merge_states(_v(4, 3, 2, 12), torch.zeros(4, 3, 2)), "v"),
    (lambda: mod.merge_states(_v(4, 3, 2, 64), torch.zeros(4, 2, 2)), "s"),
    (lambda: mod.merge_states(_v(4, 3, 2, 64), torch.zeros(4, 3, 2)), "v"),  # valid, but on the CPU
])
def test_invalid_inputs_name_the_argument(call, arg):
    with pytest.raises(checks.TirxInputError, match=re.escape(f"argument '{arg}'")):
        call()


# ------------------------------------------------------------------------------------------------ params, bundle

def test_one_artifact_per_op_and_dtype_serves_every_call():
    want = {(p["op"], p["dtype"]) for p in mod.artifact_params()}
    assert want == {(op, t) for op in mod.OPS for t in ("bfloat16", "float16")}
    for cfg in mod.call_samples(random.Random(0)) + mod.CONFIGS + mod.BENCH_CONFIGS:
        p = mod.compile_params(**cfg)
        assert (p["op"], p["dtype"]) in want and set(p) == {"op", "dtype"}


@pytest.mark.parametrize("D, lt", [(8, 0), (16, 1), (64, 3), (72, 4), (128, 4), (200, 5), (256, 5), (512, 6),
                                   (1024, 7)])
def test_threads_per_row(D, lt):
    assert mod.log2_threads_per_row(D) == lt
    assert (1 << lt) * 8 >= D and (lt == 0 or (1 << (lt - 1)) * 8 < D)


def test_positions_per_launch_keeps_rows_in_int32():
    for H in (1, 7, 32, 128, 2**20):
        assert mod.positions_per_launch(H) * H + mod.THREADS <= 2**31 - 1
        assert mod.positions_per_launch(H) + 2 * mod.THREADS <= 2**31 - 1  # + a CTA's span of positions


def _rows_of(S, H, D, op, rpt):
    """The (position, head) rows ``plan``'s geometry gives each thread, the kernels' index math in Python."""
    g = mod.plan(S, H, D, op, rpt)
    lt, lh, lp, lu = g["lt"], g["lh"], g["lp"], g["lu"]
    rows = []
    for bx in range(g["grid"][0]):
        for by in range(g["grid"][1]):
            for tid in range(0, mod.THREADS, 1 << lt):  # lane 0 of each row slot
                slot = tid >> lt
                head = (by << lh) + (slot & ((1 << lh) - 1))
                for u in range(1 << lu):
                    pos = (bx << (lp + lu)) + (slot >> lh) + (u << lp)
                    if pos < S and head < H:
                        rows.append((pos, head))
    return g, rows


@pytest.mark.parametrize("op", mod.OPS)
@pytest.mark.parametrize("S, H, D", [(1, 1, 8), (37, 8, 64), (37, 3, 200), (5, 2, 1024), (128, 32, 128),
                                     (2048, 32, 128), (7, 40, 128), (9, 129, 64), (3, 1, 512)])
@pytest.mark.parametrize("rpt", [None, 1, 2])
def test_plan_covers_every_row_once(op, S, H, D, rpt):
    g, rows = _rows_of(S, H, D, op, rpt)
    assert sorted(rows) == [(p, h) for p in range(S) for h in range(H)]
    assert g["lt"] + g["lh"] + g["lp"] == 7 and g["grid"][1] <= mod.MAX_GRID_Y
    if op == "merge_states" or rpt == 1:
        assert g["lu"] == 0
    elif rpt == 2:
        assert g["lu"] == 1


def test_plan_heads_fill_the_cta_and_two_rows_only_on_large_grids():
    """H = 32, D = 128: 8 heads a CTA, one position; 512 CTAs at s128 (one row a thread), 4096 at s2048 (two)."""
    assert mod.plan(128, 32, 128) == {"lt": 4, "lh": 3, "lp": 0, "lu": 0, "grid": (128, 4)}
    assert mod.plan(2048, 32, 128) == {"lt": 4, "lh": 3, "lp": 0, "lu": 1, "grid": (1024, 4)}
    assert mod.plan(37, 3, 64)["lh"] == 2  # 4 head slots for 3 heads, 4 positions a CTA
    assert mod.heads_per_launch(128) == mod.MAX_GRID_Y << 3
    with pytest.raises(ValueError):
        mod.plan(1, 1, 64, rows_per_thread=3)


# ------------------------------------------------------------------------------------------------ build

@pytest.mark.parametrize("op", mod.OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_builds_with_16_byte_loads_and_no_spills(op, dtype):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build the kernel")
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    from tirx_kernels.core import testing

    sass = testing.build_and_check_sass(mod, "merge_state", mod.compile_params(op=op, dtype=dtype))
    loads = len(re.findall(r"LDG\.E\.128", sass))
    # merge_states: one trip's states; the others: one row a thread (2 states) and, on its own path, two rows.
    assert loads == (mod.STATES_PER_TRIP if op == "merge_states" else 2 + 2 * mod.ROWS_PER_THREAD), loads
    # The (position, head block) grid: no integer division (the flat grid's row // H put a signed division,
    # ~99 SASS instructions, before the first load; its I2F / MUFU.RCP / IMAD.HI sequence).
    head = sass[:sass.index("LDG.E.128")]
    assert not re.search(r"\bMUFU\.RCP\b|\bI2F", head), "a division before the first vector load"


# ------------------------------------------------------------------------------------------------ CPU emulation

def _host_values(src: str, params, env: dict) -> dict:
    """The kernel's scalar arguments that TIRx's host code computes (``cse_vN = expr;``), evaluated in ``env``."""
    out = dict(env)
    for p in params:
        if p.pointer or p.name in out:
            continue
        for expr in re.findall(rf"\b{p.name} = ([^;]*);", src):
            try:
                out[p.name] = int(eval(expr, {}, dict(out)))  # int arithmetic of the host wrapper: * >> + ( )
                break
            except NameError:
                continue
        else:
            raise KeyError(f"no host value for kernel argument {p.name}")
    return out


@pytest.fixture(scope="module")
def emulated():
    """Each op's generated CUDA compiled for the CPU (bf16 and fp16): (kernel, host source)."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import build, emulate

    out = {}
    for op in mod.OPS:
        for dtype in ("bfloat16", "float16"):
            # cuda_cpu.h has no CUDART_INF_F (math_constants.h): the same value under the host compiler's name.
            src = build.codegen(mod.get_kernel(op, dtype)).replace("CUDART_INF_F", "__builtin_inff()")
            out[op, dtype] = (emulate.compile(src), src)
    return out


def _strided(shape, pad_last: int, dtype, g, off: int = 0):
    """Random values of ``shape`` inside a larger buffer (last dim ``pad_last`` wider, ``off`` elements in),
    the buffer ending with the view's last element; returns (view, buffer)."""
    strides, acc = [], 1
    for i, n in enumerate(reversed(shape)):
        strides.append(acc)
        acc *= n + (pad_last if i == 0 else 0)
    strides = tuple(reversed(strides))
    size = off + sum((n - 1) * s for n, s in zip(shape, strides)) + 1 if all(shape) else off + 1
    buf = torch.randn(size, generator=g).to(dtype)
    return buf.as_strided(shape, strides, off), buf


def _lse(shape, g, strided: bool, neg_inf_every: int = 0):
    s, buf = _strided(shape, 3 if strided else 0, torch.float32, g, 1 if strided else 0)
    s.mul_(3)
    if neg_inf_every:
        flat = torch.arange(s.numel()).view(shape)
        s[flat % neg_inf_every == 0] = NEG_INF
    return s, buf


def _check_merged(v_out, s_out, want_v, want_s):
    torch.testing.assert_close(v_out.float(), want_v, atol=2e-2, rtol=1e-2)
    assert torch.equal(s_out == NEG_INF, want_s == NEG_INF)
    fin = want_s != NEG_INF
    torch.testing.assert_close(s_out[fin], want_s[fin], atol=1e-4, rtol=1e-5)


CASES = [  # S, H, D, strided (v rows padded, s strided, offsets), -inf every k-th row (0: none)
    (3, 2, 64, False, 0), (5, 3, 128, True, 0), (7, 1, 8, False, 0), (2, 5, 200, True, 3), (3, 2, 1024, False, 2),
    (4, 3, 512, True, 0), (1, 1, 72, False, 1), (6, 4, 256, False, 4),
]


def _pair_inputs(S, H, D, strided, ninf, dtype, g):
    pad = 8 if strided else 0
    va, vab = _strided((S, H, D), pad, dtype, g, 8 if strided else 0)
    vb, vbb = _strided((S, H, D), 2 * pad, dtype, g)
    sa, sab = _lse((S, H), g, strided, ninf)
    sb, sbb = _lse((S, H), g, strided, ninf and ninf + 1)
    return (va, sa, vb, sb), (vab, sab, vbb, sbb)


def _geometry_args(geo: dict) -> dict:
    return {"log2_tpr": geo["lt"], "log2_hpc": geo["lh"], "log2_ppc": geo["lp"], "log2_rpt": geo["lu"]}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("S, H, D, strided, ninf", CASES)
@pytest.mark.parametrize("rpt", [1, 2])
def test_merge_state_emulated(emulated, dtype, S, H, D, strided, ninf, rpt):
    g = torch.Generator().manual_seed(S * 1000 + D)
    t = getattr(torch, dtype)
    (va, sa, vb, sb), bufs = _pair_inputs(S, H, D, strided, ninf, t, g)
    before = [b.clone() for b in bufs]
    vo, vob = _strided((S, H, D), 8 if strided else 0, t, g, 8 if strided else 0)
    so, sob = _strided((S, H), 5 if strided else 0, torch.float32, g, 3 if strided else 0)
    vob.fill_(float("nan"))
    sob.fill_(float("nan"))
    kern, src = emulated["merge_state", dtype]
    geo = mod.plan(S, H, D, "merge_state", rpt)
    env = {"S": S, "H": H, "D": D, **_geometry_args(geo), "zero": 0, "VA_ptr": va, "SA_ptr": sa, "VB_ptr": vb,
           "SB_ptr": sb, "VO_ptr": vo, "SO_ptr": so}
    for name, ten in (("va", va), ("vb", vb), ("vo", vo), ("sa", sa), ("sb", sb), ("so", so)):
        env[name + "0"], env[name + "1"] = ten.stride(0), ten.stride(1)
    args = _host_values(src, kern.params, env)
    kern(grid=geo["grid"], block=(mod.THREADS,), **{p.name: args[p.name] for p in kern.params}).check()
    want = mod.reference(v_a=va, s_a=sa, v_b=vb, s_b=sb)
    _check_merged(vo, so, want["v"], want["s"])
    for b, b0 in zip(bufs, before):
        assert torch.equal(b.view(torch.uint8), b0.view(torch.uint8))
    for view, buf in ((vo, vob), (so, sob)):
        written = torch.zeros(buf.shape, dtype=torch.bool)
        written.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
        assert buf[~written].isnan().all(), "written outside the output view"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("S, H, D, strided, ninf", CASES[:6])
@pytest.mark.parametrize("rpt", [1, 2])
def test_merge_state_in_place_emulated(emulated, dtype, masked, S, H, D, strided, ninf, rpt):
    g = torch.Generator().manual_seed(S * 1000 + D + masked)
    t = getattr(torch, dtype)
    (v, s, vb, sb), bufs = _pair_inputs(S, H, D, strided, ninf, t, g)
    v0, s0 = v.clone(), s.clone()
    vbuf_before = bufs[0].clone()
    other_before = [bufs[2].clone(), bufs[3].clone()]
    mask = (torch.rand(S, generator=g) < 0.5) if masked else None
    kern, src = emulated["merge_state_in_place", dtype]
    geo = mod.plan(S, H, D, "merge_state_in_place", rpt)
    mk = mask.view(torch.uint8) if masked else torch.ones(1, dtype=torch.uint8)
    env = {"S": S, "H": H, "D": D, "SM": mk.shape[0], **_geometry_args(geo), "zero": 0, "use_mask": int(masked),
           "V_ptr": v, "SS_ptr": s, "VB_ptr": vb, "SB_ptr": sb, "MK_ptr": mk, "m0": 1}
    for name, ten in (("v", v), ("vb", vb), ("s", s), ("sb", sb)):
        env[name + "0"], env[name + "1"] = ten.stride(0), ten.stride(1)
    args = _host_values(src, kern.params, env)
    kern(grid=geo["grid"], block=(mod.THREADS,), **{p.name: args[p.name] for p in kern.params}).check()
    want = mod.reference(v=v0, s=s0, v_other=vb, s_other=sb, mask=mask)
    _check_merged(v, s, want["v"], want["s"])
    if masked:  # untouched positions keep their bits
        keep = ~mask
        assert torch.equal(v[keep].view(torch.int16), v0[keep].view(torch.int16))
        assert torch.equal(s[keep], s0[keep])
    assert torch.equal(bufs[2], other_before[0]) and torch.equal(bufs[3], other_before[1])
    outside = torch.ones(bufs[0].shape, dtype=torch.bool)
    outside.as_strided(v.shape, v.stride(), v.storage_offset()).fill_(False)
    assert torch.equal(bufs[0][outside].view(torch.int16), vbuf_before[outside].view(torch.int16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("S, N, H, D, strided, ninf", [
    (3, 5, 2, 64, False, 0), (4, 1, 3, 128, True, 0), (3, 0, 2, 64, False, 0), (2, 7, 3, 200, True, 3),
    (3, 4, 2, 1024, False, 2), (2, 9, 2, 512, True, 5), (3, 3, 2, 8, False, 1), (5, 8, 4, 128, False, 0),
])
def test_merge_states_emulated(emulated, dtype, S, N, H, D, strided, ninf):
    g = torch.Generator().manual_seed(S * 1000 + N * 10 + D)
    t = getattr(torch, dtype)
    v, vbuf = _strided((S, N, H, D), 8 if strided else 0, t, g, 8 if strided else 0)
    s, sbuf = _lse((S, N, H), g, strided, ninf)
    before = (vbuf.clone(), sbuf.clone())
    vo, vob = _strided((S, H, D), 8 if strided else 0, t, g)
    so, sob = _strided((S, H), 2 if strided else 0, torch.float32, g)
    vob.fill_(float("nan"))
    sob.fill_(float("nan"))
    kern, src = emulated["merge_states", dtype]
    geo = mod.plan(S, H, D, "merge_states")
    env = {"S": S, "N": N, "H": H, "D": D, **_geometry_args(geo), "zero": 0, "V_ptr": v, "SS_ptr": s,
           "VO_ptr": vo, "SO_ptr": so, "vo0": vo.stride(0), "vo1": vo.stride(1), "so0": so.stride(0),
           "so1": so.stride(1)}
    for i in range(3):
        env[f"v{i}"], env[f"s{i}"] = v.stride(i), s.stride(i)
    args = _host_values(src, kern.params, env)
    kern(grid=geo["grid"], block=(mod.THREADS,), **{p.name: args[p.name] for p in kern.params}).check()
    want = mod.reference(v_all=v, s_all=s)
    _check_merged(vo, so, want["v"], want["s"])
    assert torch.equal(vbuf.view(torch.int16), before[0].view(torch.int16)) and torch.equal(sbuf, before[1])
    for view, buf in ((vo, vob), (so, sob)):
        written = torch.zeros(buf.shape, dtype=torch.bool)
        written.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
        assert buf[~written].isnan().all(), "written outside the output view"


def test_oracle_empty_rows():
    v = torch.randn(2, 3, 1, 8)
    s = torch.full((2, 3, 1), NEG_INF)
    s[1, 2] = 0.5
    out = mod.reference(v_all=v, s_all=s)
    assert torch.equal(out["v"][0], torch.zeros(1, 8)) and out["s"][0].item() == NEG_INF
    torch.testing.assert_close(out["v"][1], v[1, 2]) and torch.testing.assert_close(out["s"][1], s[1, 2])


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", ["bf16_s37_h8_d128", "inplace_fp16_s37_h8_d512_mask", "states_fp16_s37_n5_h8_d128"])
def test_graph_replay_gpu(label):
    from tirx_kernels.core import testing

    testing.check_graph_replay("merge_state", label)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_public_ops_odd_layouts_gpu(dtype):
    """Public ops against the oracle: odd D, broadcast heads (stride 0), views, out=, 0 rows, mask as uint8."""
    dev = "cuda"
    S, H, D = 33, 5, 72
    va = torch.randn(S, H, 2 * D, device=dev).to(dtype)[..., :D]
    vb = torch.randn(S, 1, D, device=dev).to(dtype).expand(S, H, D)
    sa = torch.randn(H, S, device=dev).t()
    sb = torch.randn(S, H, device=dev)
    v, s = mod.merge_state(va, sa, vb, sb)
    want = mod.reference(v_a=va, s_a=sa, v_b=vb, s_b=sb)
    _check_merged(v, s, want["v"], want["s"])
    vin, sin = va.clone(), sa.clone()
    mask = (torch.arange(S, device=dev) % 2).to(torch.uint8)
    mod.merge_state_in_place(vin, sin, vb, sb, mask=mask)
    want = mod.reference(v=va, s=sa, v_other=vb, s_other=sb, mask=mask)
    _check_merged(vin, sin, want["v"], want["s"])
    vs = torch.randn(S, 6, H, D, device=dev).to(dtype)
    ss = torch.randn(S, 6, H, device=dev)
    out = (torch.empty(S, H, D, device=dev, dtype=dtype), torch.empty(S, H, device=dev))
    mod.merge_states(vs, ss, out=out)
    want = mod.reference(v_all=vs, s_all=ss)
    _check_merged(out[0], out[1], want["v"], want["s"])
    v0, s0 = mod.merge_state(va[:0], sa[:0], vb[:0], sb[:0])
    assert v0.shape == (0, H, D) and s0.shape == (0, H)


@gpu
def test_torch_compile_gpu():
    dev = "cuda"
    va, vb = (torch.randn(9, 4, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
    sa, sb = (torch.randn(9, 4, device=dev) for _ in range(2))
    f = torch.compile(lambda a, b, c, d: mod.merge_state(a, b, c, d), fullgraph=True)
    v, s = f(va, sa, vb, sb)
    want = mod.reference(v_a=va, s_a=sa, v_b=vb, s_b=sb)
    _check_merged(v, s, want["v"], want["s"])
