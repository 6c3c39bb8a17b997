# SPDX-License-Identifier: Apache-2.0
"""selective_state_update (the six flashinfer.mamba modules, one implementation): the generated CUDA run on the CPU
(``core.emulate``) against the fp32 oracle on the output and the whole state pool (rows not addressed bit-identical,
inputs unchanged), for STP and MTP, every state dtype, pad slots, dst and intermediate-state modes; on a GPU, the
harness's checks of every config row and FlashInfer 0.7.4 where installed."""

import re

import pytest
import torch

from tirx_kernels.core import artifacts
from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as ssu

SCHEDULES = ("stp_simple", "stp_vertical", "stp_horizontal", "mtp_simple", "mtp_vertical", "mtp_horizontal")


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}

    def get(params):
        key = artifacts.canonical_params(params)
        if key not in cache:
            cache[key] = emulate.compile(_shared_loads(_narrow_warp_sums(codegen(ssu.get_kernel(**params)))))
        return cache[key]
    return get


def _shared_loads(src: str) -> str:
    """cuda_cpu.h has no stand-in for ``ld.shared.v4.b32`` (yet): four word reads of the same address."""
    return re.sub(r"tvm_builtin_ptx_ld_vec_shared_v4_b32\(([^,]+), ([^,]+), ([^,]+), ([^,]+), "
                  r"tvm_builtin_cuda_cvta_generic_to_shared\((.*)\)\);",
                  lambda m: "{ const uint* q_ = (const uint*)" + m.group(5) + "; " + "".join(
                      f"{m.group(i + 1)} = q_[{i}]; " for i in range(4)) + "}", src)


def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has stand-ins for full-warp sums and maxima only: a group of < 32 lanes gets the same butterfly
    inline (the max: an int16 state's row maximum)."""
    src = re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                 lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                           "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)
    return re.sub(r"tvm_builtin_cuda_warp_reduce_max_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m)); return v; })(", src)


def make_inputs(batch=3, T=1, nheads=4, ngroups=2, dim=64, dstate=128, state_dtype=torch.bfloat16,
                dtype=torch.bfloat16, weight_dtype=torch.float32, slots=7, pad=True, z=True, bias=True,
                index_dtype=torch.int32, inter=False, dst=None, seed=0):
    """Normalized-form inputs (``ssu.kernel_args``) on the CPU; B/C/x with padded batch strides, dt the head column
    of a broadcast (batch, T, nheads, dim) view as FlashInfer passes it."""
    g = torch.Generator().manual_seed(seed)
    slots = max(slots, batch * (T + 1) + 1)  # destination slots apart from the source ones (no read-write race)

    def rn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    state = rn(slots, nheads, dim, dstate).to(state_dtype)
    x = rn(batch, T, nheads, dim + 8)[..., :dim].to(dtype)
    dt_full = rn(batch, T, nheads, scale=0.5).to(weight_dtype)
    dt = dt_full.unsqueeze(-1).expand(batch, T, nheads, dim)[..., 0]
    A = -torch.rand(nheads, generator=g) - 0.5
    Bm = rn(batch, T + 1, ngroups, dstate)[:, :T].to(dtype)
    Cm = rn(batch, T, ngroups, dstate).to(dtype)
    D = rn(nheads).to(weight_dtype)
    zt = rn(batch, T, nheads, dim).to(dtype) if z else None
    dt_bias = rn(nheads, scale=0.5).to(weight_dtype) if bias else None
    order = torch.randperm(slots, generator=g)
    perm = order[:batch].clone()
    if pad:
        perm[1] = -1
    idx = perm.to(index_dtype)
    out = torch.full((batch, T, nheads, dim), float("nan")).to(dtype)
    inter_buf = inter_idx = None
    if inter:
        cache_steps = T
        inter_buf = torch.full((batch + 2, cache_steps, nheads, dim, dstate), 7.0).to(state_dtype)
        inter_idx = torch.randperm(batch + 2, generator=g)[:batch].to(index_dtype)
    dst_t = None
    if dst == "stp":
        dst_t = order[batch:2 * batch].to(index_dtype).unsqueeze(1).expand(batch, T)
    elif dst == "mtp":
        dst_t = order[batch:batch + batch * T].reshape(batch, T).to(index_dtype)
        dst_t[0, 0] = -1
    return dict(state=state, x=x, dt=dt, A=A, B=Bm, C=Cm, D=D, z=zt, dt_bias=dt_bias, dt_softplus=True, idx=idx,
                pad_slot_id=-1, out=out, update=True, inter=inter_buf, inter_idx=inter_idx,
                cache_steps=T if inter else 0, dst=dst_t)


def run_emulated(emulated, d, schedule):
    ptrs, scalars, params, grid, block = ssu.kernel_args(**d, schedule=schedule)
    kern = emulated(params)
    named = {f"{k}_ptr": v for k, v in ptrs.items()}
    args = [named[p.name] if p.pointer else scalars[p.name] for p in kern.params]
    kern(*args, grid=grid, block=block).check()


def check(d, before, tol):
    keys = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "idx", "pad_slot_id", "update",
            "inter", "inter_idx", "cache_steps", "dst")
    want_out, want_pool, want_inter = ssu.oracle(**{k: before[k] for k in keys})
    atol, rtol = tol
    torch.testing.assert_close(d["out"].float(), want_out, atol=atol, rtol=rtol)
    written = (want_pool != before["state"]).flatten(1).any(1) | (d["state"] != before["state"]).flatten(1).any(1)
    # rows not written are bit-identical; written rows within one rounding of the oracle's fp32 state
    assert torch.equal(d["state"][~written].view(torch.uint8), before["state"][~written].view(torch.uint8))
    torch.testing.assert_close(d["state"].float(), want_pool.float(), atol=atol, rtol=rtol)
    if want_inter is not None:
        torch.testing.assert_close(d["inter"].float(), want_inter.float(), atol=atol, rtol=rtol)
    for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "idx", "inter_idx", "dst"):
        if d[k] is not None:
            assert torch.equal(d[k], before[k]), k


def _clone(d):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


TOL = {torch.bfloat16: (3e-2, 2e-2), torch.float16: (4e-3, 4e-3), torch.float32: (1e-4, 1e-4)}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_emulated_schedules(emulated, schedule):
    T = 1 if schedule.startswith("stp") else 3
    d = make_inputs(T=T)
    before = _clone(d)
    run_emulated(emulated, d, schedule)
    check(d, before, TOL[torch.bfloat16])


@pytest.mark.parametrize("schedule, kw", [
    ("stp_simple", dict(state_dtype=torch.float32)),
    ("stp_simple", dict(state_dtype=torch.float16, dtype=torch.float16, weight_dtype=torch.float16)),
    ("stp_vertical", dict(dstate=96, weight_dtype=torch.bfloat16, z=False)),
    ("stp_horizontal", dict(dstate=256, dim=128, bias=False, index_dtype=torch.int64)),
    ("stp_simple", dict(dstate=64, dim=128, ngroups=1, pad=False, state_dtype=torch.float32)),
    ("stp_simple", dict(dst="stp", index_dtype=torch.int64)),
    ("stp_horizontal", dict(state_dtype=torch.float32, dstate=96)),
    ("mtp_simple", dict(T=8, inter=True)),
    ("mtp_simple", dict(T=4, inter=True, state_dtype=torch.float32, index_dtype=torch.int64)),
    ("mtp_vertical", dict(T=2, dst="mtp", state_dtype=torch.float16, dtype=torch.float16)),
    ("mtp_horizontal", dict(T=6, dstate=256, ngroups=4, z=False)),
    ("mtp_simple", dict(T=1, dim=128, dstate=96, weight_dtype=torch.float16)),
])
def test_emulated_forms(emulated, schedule, kw):
    d = make_inputs(**kw)
    before = _clone(d)
    run_emulated(emulated, d, schedule)
    check(d, before, TOL[d["state"].dtype if d["state"].dtype != torch.float32 else d["x"].dtype])


@pytest.mark.parametrize("schedule, kw", [
    ("mtp_vertical", dict(T=3)),
    ("mtp_simple", dict(T=4, inter=True, state_dtype=torch.float32, index_dtype=torch.int64)),
    ("mtp_vertical", dict(T=2, dst="mtp", state_dtype=torch.float16, dtype=torch.float16)),
    ("mtp_horizontal", dict(T=6, dstate=256, ngroups=4, z=False)),
])
def test_token_major_variant_emulated(emulated, schedule, kw):
    """The ``token_major`` loop order (all of a thread's rows through a token, then the next token; the MTP simple
    and vertical schedules' own, forced here onto horizontal too) gives the oracle's outputs and pool in every MTP
    mode."""
    from tirx_kernels.core import emulate
    from tirx_kernels.core.build import codegen
    from tirx_kernels.ported.flashinfer.mamba import _ssu_kernel as sk

    d = make_inputs(**kw)
    before = _clone(d)
    ptrs, scalars, params, grid, block = ssu.kernel_args(**d, schedule=schedule)
    plan = {**sk.plan(params["state_dtype"], params["dstate"], params["schedule"], params["max_tokens"]),
            "token_major": True}
    kern = emulate.compile(_shared_loads(_narrow_warp_sums(codegen(sk.build_kernel(
        params["state_dtype"], params["input_dtype"], params["dstate"], params["max_tokens"], **plan)))))
    named = {f"{k}_ptr": v for k, v in ptrs.items()}
    kern(*[named[p.name] if p.pointer else scalars[p.name] for p in kern.params], grid=grid, block=block).check()
    check(d, before, TOL[d["state"].dtype if d["state"].dtype != torch.float32 else d["x"].dtype])


@pytest.mark.parametrize("state_io, schedule, knobs, kw", [
    ("bulk_store", "stp_simple", (64, 8, 4, False), dict()),
    ("bulk_store", "stp_simple", (32, 8, 2, False), dict(state_dtype=torch.float32, dstate=96,
                                                          index_dtype=torch.int64)),
    ("bulk_store", "stp_simple", (64, 8, 4, False), dict(dst="stp")),
    ("bulk_store", "mtp_simple", (32, 4, 2, True, True), dict(T=6)),
    ("bulk_store", "mtp_simple", (32, 4, 2, False, True), dict(T=5, dstate=96, state_dtype=torch.float16,
                                                               dtype=torch.float16)),
    ("bulk_store", "mtp_simple", (16, 4, 1, True), dict(T=4, inter=True)),
    ("bulk", "mtp_simple", (32, 8, 2, True), dict(T=3, dst="mtp", dstate=256, dim=128)),
    ("regs", "mtp_simple", (32, 4, 2, True, True), dict(T=6, odd_b_stride=True)),
])
def test_bulk_state_tile_emulated(state_io, schedule, knobs, kw):
    """``_ssu_kernel_tma``'s ``state_io`` (the state tile in shared memory through bulk copies on mbarriers, and the
    final store through it with ``bulk_store``; sweep variants, ``tools/sweeps/ssu_tma_schedules.py``): the oracle's
    outputs and pool with
    a pad slot, and in the destination-slot / intermediate modes that keep the vector stores. A fifth knob:
    ``stage_vectors`` (B / C staged with 16-byte loads; a B batch stride not a multiple of 8 takes the 2-byte
    loads)."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    from tirx_kernels.core import emulate
    from tirx_kernels.core.build import codegen
    from tirx_kernels.ported.flashinfer.mamba import _ssu_kernel_tma as tk
    from tirx_kernels.ported.flashinfer.mamba import _ssu_op as op

    odd = kw.pop("odd_b_stride", False)
    d = make_inputs(**kw)
    if odd:  # B's batch stride 4 elements past a multiple of 8
        b_, t_, g_, s_ = d["B"].shape
        d["B"] = torch.randn(b_ * (t_ * g_ * s_ + 4)).to(d["B"].dtype).as_strided(
            (b_, t_, g_, s_), (t_ * g_ * s_ + 4, g_ * s_, s_, 1))
    before = _clone(d)
    ptrs, scalars, params, _, _ = ssu.kernel_args(**d, schedule=schedule)
    r, lanes, rt, tm, sv = (*knobs, False)[:5]
    # the module path (hopper_cpu.h: mbarriers, bulk copies), its host function computing the launch as on the GPU
    mod = emulate.compile_module(_narrow_warp_sums(codegen(tk.build_kernel(
        params["state_dtype"], params["input_dtype"], params["dstate"], params["max_tokens"], rows_per_cta=r,
        lanes_per_row=lanes, rows_per_thread=rt, token_major=tm, state_io=state_io, stage_vectors=sv))))
    mod(*(ptrs[k] for k in op.ARG_ORDER), *(scalars[k] for k in op.SCALAR_ORDER)).check()
    check(d, before, TOL[d["state"].dtype if d["state"].dtype != torch.float32 else d["x"].dtype])


def test_bulk_state_tile_rejects_int16():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    from tirx_kernels.ported.flashinfer.mamba import _ssu_kernel_tma as tk

    with pytest.raises(ValueError, match="bulk"):
        tk.build_kernel("int16", "bfloat16", 128, 1, 64, 8, 4, state_io="bulk")
    with pytest.raises(ValueError, match="state_io"):
        tk.build_kernel("bfloat16", "bfloat16", 128, 1, 64, 8, 4, state_io="tma")


@pytest.mark.parametrize("schedule, params", [
    ("simple", ("bfloat16", "bfloat16", 128, 1)), ("simple", ("bfloat16", "bfloat16", 128, 8)),
    ("vertical", ("int16", "bfloat16", 64, 1)), ("horizontal", ("float32", "float16", 96, 8)),
    ("simple", ("float16", "float16", 256, 1, 10)),
])
def test_sweep_builder_regs_form_is_the_registered_kernel(schedule, params):
    """``_ssu_kernel_tma.build_kernel`` with its knobs off generates the registered kernels' CUDA, so that what the
    sweep times against its new variants is the product code (the two builders must not drift apart)."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    from tirx_kernels.core.build import codegen
    from tirx_kernels.ported.flashinfer.mamba import _ssu_kernel as sk
    from tirx_kernels.ported.flashinfer.mamba import _ssu_kernel_tma as tk

    state_dtype, input_dtype, dstate, max_tokens, *rounds = params
    knobs = sk.plan(state_dtype, dstate, schedule, max_tokens)
    want = codegen(sk.get_kernel(state_dtype, input_dtype, dstate, max_tokens, schedule, *rounds))
    got = codegen(tk.build_kernel(state_dtype, input_dtype, dstate, max_tokens, **knobs,
                                  philox_rounds=rounds[0] if rounds else 0))
    assert got == want


def test_emulated_no_update(emulated):
    d = make_inputs(T=1)
    d["update"] = False
    before = _clone(d)
    run_emulated(emulated, d, "stp_simple")
    check(d, before, TOL[torch.bfloat16])
    assert torch.equal(d["state"], before["state"])


# ------------------------------------------------------------------------------------------------ harness on CPU

def _module(schedule):
    import importlib

    return importlib.import_module(f"tirx_kernels.ported.flashinfer.mamba.selective_state_update_{schedule}")


@pytest.mark.parametrize("schedule, label", [
    ("stp_simple", "b37_h24_d128_s96_r3_z_pad"), ("stp_simple", "b64_h64_d64_s128_r8_i64_dst"),
    ("stp_simple", "b64_h64_d64_s128_r8_noupdate"), ("stp_vertical", "b64_h64_d64_s128_r8_state_f32"),
    ("mtp_simple", "b64_h64_d64_s128_t6_r8_inter_f32_i64"), ("mtp_simple", "b64_h64_d64_s128_t6_r8_dst"),
    ("mtp_horizontal", "b8_h64_d64_s128_t8_r8_z_pad"),
    ("stp_simple", "b37_h24_d64_s96_r3_state_i16_z_pad_dst"), ("mtp_simple", "b64_h64_d64_s128_t4_r8_state_i16"),
    ("stp_simple", "b64_h64_d64_s128_r8_state_f16_sr"),
])
def test_harness_rows_emulated(emulated, schedule, label):
    """A config row through the harness's own checks (guarded in-place pool, inputs unchanged, the comparators), the
    launch running the public op's normalization and argument building into the emulated kernel. Batches cut to 4
    (the emulator runs one host thread per CUDA thread), and heads by 4 where the groups divide too (heads a group
    kept: the kernel's head and group indexing are run-time arguments; 89 s for the t8 horizontal row at h64 on the
    2-core CI machine, 2026-12-07)."""
    import types

    from tirx_kernels.core import harness

    mod = _module(schedule)
    row = next(c for c in mod.CONFIGS if c["label"] == label)
    full = harness.full_config(mod, row)
    cut = {"batch": 4}
    if full["nheads"] % 4 == 0 and full["ngroups"] % 4 == 0:
        cut.update(nheads=full["nheads"] // 4, ngroups=full["ngroups"] // 4)
    cfg = harness.full_config(mod, {**row, **cut})

    def launch(cfg, data):
        n = ssu.normalize(*ssu.op_args(data))
        n.pop("mtp")
        run_emulated(emulated, n, schedule)

    fake = types.SimpleNamespace(KERNEL_META=mod.KERNEL_META, INPLACE=mod.INPLACE, COMPARATORS=mod.COMPARATORS,
                                 reference=mod.reference, prepare_data=lambda **c: mod.prepare_data(**c, device="cpu"),
                                 launch=launch, get_baselines=lambda **c: {})
    res = harness.check_config(fake, cfg)
    assert res["status"] == "passed"
    assert res["oracle"]["state"]["slots_written"] > 0 or cfg["disable_state_update"] or cfg.get("intermediate")
    if cfg["state_dtype"] == "int16":  # the int16 rows' scales rewritten with them
        assert res["oracle"]["state_scale"]["slots_written"] == res["oracle"]["state"]["slots_written"]


def test_int16_quantization_convention():
    """FlashInfer's int16 state encoding in the oracle: the row maximum maps to +-32767, the stored (decode) scale
    is 1 / (32767 / max), a zero row keeps scale 1, values round half to even."""
    rows = torch.tensor([[0.5, -2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.5, 3.5, -32767.0, 0.5]])
    q, scale = ssu.quantize_rows(rows)
    assert q.dtype == torch.int16 and q[0].tolist() == [8192, -32767, 16384, 0]  # 0.5 * 16383.5 = 8191.75
    assert q[1].tolist() == [0, 0, 0, 0] and scale[1].item() == 1.0
    assert q[2].tolist() == [2, 4, -32767, 0]  # enc = 1: 2.5 -> 2, 3.5 -> 4, 0.5 -> 0 (half to even)
    torch.testing.assert_close(scale[0], torch.tensor(1.0) / (torch.tensor(32767.0) / 2.0), atol=0, rtol=0)


def test_philox_stream_and_software_stochastic_rounding():
    """The oracle's Philox-4x32-10 against Random123's known-answer vector (key 0, counter 0); the fp16 rounding
    adds the 13 noise bits below fp16's mantissa and truncates (no noise: toward zero; full noise: up one ulp)."""
    from tirx_kernels.ported.flashinfer.mamba import _ssu_philox as philox

    r = philox.randint4x(0, torch.tensor([0]), 10)[:, 0].tolist()
    assert r == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    x = torch.tensor([1.0 + 2**-11, -3.14159, 1e-6, 70000.0])
    assert philox.cvt_rs_f16(x, torch.zeros(4, dtype=torch.long)).tolist() == [1.0, -3.140625, 0.0, float("inf")]
    up = philox.cvt_rs_f16(x, torch.full((4,), 0x1FFF))
    assert up[0].item() == 1.0 + 2**-10 and up[1].item() == -3.142578125


def _exact_stochastic_inputs(rounds: int, device: str = "cpu") -> dict:
    """fp16 state with rand_seed whose update is exact in fp32 (A = 0 so exp(A dt) = 1, dt = x = 1, no softplus:
    s' = s + B): any difference from the oracle is the rounding's."""
    d = make_inputs(batch=3, nheads=4, ngroups=2, dim=64, dstate=128, state_dtype=torch.float16, pad=True,
                    z=False, bias=False)
    d["A"] = torch.zeros_like(d["A"])
    d["dt"] = torch.ones_like(d["dt"])
    d["x"] = torch.ones_like(d["x"])
    d["dt_softplus"] = False
    d["rand_seed"] = torch.tensor([0x123456789ABC], dtype=torch.int64)
    d["philox_rounds"] = rounds
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


@pytest.mark.parametrize("rounds, general", [(10, False), (7, True)])
def test_stochastic_rounding_bit_exact_emulated(emulated, rounds, general):
    """fp16 state with rand_seed: the emulated kernel's stored state bit for bit equal to the torch oracle of the same
    Philox stream (``_exact_stochastic_inputs``); every row must round some value up and some down. The default 10
    rounds run the unrolled artifact; 7 the general one (``general_params``: the rounds as an argument), which the
    bundle serves every count without an artifact of its own with."""
    d = _exact_stochastic_inputs(rounds)
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
    if general:
        ptrs, scalars, params, grid, block = ssu.kernel_args(**d, schedule="stp_simple")
        assert params["philox_rounds"] == rounds and scalars["philox_rounds_arg"] == rounds
        kern = emulated(ssu.general_params(params))
        named = {f"{k}_ptr": v for k, v in ptrs.items()}
        kern(*[named[p.name] if p.pointer else scalars[p.name] for p in kern.params], grid=grid, block=block).check()
    else:
        run_emulated(emulated, d, "stp_simple")
    _, want_pool, _ = ssu.oracle(**{k: v for k, v in before.items() if k != "out"})
    assert torch.equal(d["state"].view(torch.int16), want_pool.view(torch.int16))
    slots = before["idx"][before["idx"] != before["pad_slot_id"]].long()
    exact = before["state"][slots].float()  # the fp32 s' = s + B of the live entries
    Bh = before["B"][:, 0].float().repeat_interleave(2, 1)[before["idx"] != before["pad_slot_id"]]
    exact = exact + Bh[:, :, None, :]
    got = d["state"][slots].float()
    assert bool((got > exact).any()) and bool((got < exact).any())  # rounded both ways: noise, not one direction


@pytest.mark.parametrize("change, arg", [
    (dict(state_scale=None), "state_scale"),
    (dict(state_scale="shape"), "state_scale"),
    (dict(intermediate_states_buffer="int16"), "intermediate_states_buffer"),
])
def test_int16_state_rejections_name_the_argument(change, arg):
    from tirx_kernels.core.checks import TirxInputError

    a = _fi_args(T=1 if "intermediate_states_buffer" in change else None)
    a["state"] = torch.zeros(a["state"].shape, dtype=torch.int16)
    a["state_scale"] = torch.ones(a["state"].shape[:3])
    if "state_scale" in change:
        a["state_scale"] = None if change["state_scale"] is None else torch.ones(a["state"].shape[:2])
    else:
        a["intermediate_states_buffer"] = torch.zeros((2, 1) + tuple(a["state"].shape[1:]), dtype=torch.int16)
        a["cache_steps"] = 1
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        ssu.selective_state_update(**a)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_graph_replay_refill_takes_the_broadcast_inputs(schedule):
    """The GPU graph-replay test's refill of a captured call's tensors with another prepare_data's (H200 run 1: copy_
    into the broadcast dt / A / D / dt_bias views raised), on CPU tensors: every input then holds the new values."""
    from tirx_kernels.core import harness

    mod = _module(schedule)
    cfg = harness.full_config(mod, {**mod.CONFIGS[-1], "batch": 3, "nheads": 8, "ngroups": 2})
    data, fresh = (mod.prepare_data(**cfg, device="cpu") for _ in range(2))
    expected = mod.reference(**fresh)
    harness.refill_for_replay(mod, data, fresh, expected)
    for k in ("x", "dt", "A", "D", "B", "C", "state"):
        assert torch.equal(data[k], fresh[k]), k


def test_state_comparator_goes_through_slot_blocks(monkeypatch):
    """The pool / buffer comparator in blocks of slots (a whole 2e8-element intermediate buffer compared at once ran
    the H200 out of memory under 16 workers): written slots counted over every block, a changed untouched slot and a
    wrong written one caught in the block holding it."""
    from tirx_kernels.core.harness import KernelCheckError

    monkeypatch.setattr(ssu, "COMPARE_CHUNK_ELEMS", 3 * 64)
    cmp = ssu.state_comparator("state", ssu.STATE_TOLERANCE)
    before = torch.randn(10, 4, 16).to(torch.bfloat16)
    want = before.clone()
    want[[1, 5, 8]] = torch.randn(3, 4, 16).to(torch.bfloat16)
    got = want.clone()
    assert cmp(got, want, {}, {"state": before}) == {"slots_written": 3, "slots_untouched": 7}
    for slot in (2, 7, 8):  # untouched (against its unchanged value) or written, in the second and third block
        bad = got.clone()
        bad[slot, 3, 15] += 1
        with pytest.raises(KernelCheckError, match=rf"state \(slots {slot // 3 * 3}\.\.{slot // 3 * 3 + 2}\)"):
            cmp(bad, want, {}, {"state": before})


# ------------------------------------------------------------------------------------------------ params, SASS

def test_every_dtype_and_dstate_has_a_simple_artifact_and_pinned_ones_fall_back():
    for stage in ("stp", "mtp"):
        simple = {artifacts.canonical_params(p) for p in ssu.artifact_params(f"{stage}_simple")}
        # stp: fp16 stochastic rounding too, unrolled at the default rounds and the general (rounds-argument) form
        forms = len(ssu.STATE_DTYPES) + (2 if stage == "stp" else 0)
        assert len(simple) == forms * len(ssu.INPUT_DTYPES) * len(ssu.DSTATES)
        for name in ("vertical", "horizontal"):
            for p in ssu.artifact_params(f"{stage}_{name}"):
                assert p["schedule"] == name and p["max_tokens"] == (1 if stage == "stp" else ssu.MAX_TOKENS)


@pytest.mark.parametrize("state_dtype, dstate", [("bfloat16", 96), ("float16", 64), ("float32", 256)])
def test_plan_divides_the_row(state_dtype, dstate):
    for name in ssu.SCHEDULES:
        for max_tokens in (1, ssu.MAX_TOKENS):
            p = ssu.plan(state_dtype, dstate, name, max_tokens)
            vpr = ssu._vectors_per_row(state_dtype, dstate)
            assert vpr % p["lanes_per_row"] == 0 and p["lanes_per_row"] & (p["lanes_per_row"] - 1) == 0
            threads = p["rows_per_cta"] * p["lanes_per_row"] // p["rows_per_thread"]
            assert threads % 32 == 0 and threads <= 1024
            assert ssu.DIMS[0] % p["rows_per_cta"] == 0
            if p.get("token_major"):
                assert dstate // p["lanes_per_row"] * p["rows_per_thread"] <= ssu.TOKEN_MAJOR_STATE_REGS


def test_multi_token_schedules_are_token_major_except_int16():
    assert ssu.plan("bfloat16", 128, "simple", ssu.MAX_TOKENS) == {
        "rows_per_cta": 32, "lanes_per_row": 4, "rows_per_thread": 2, "token_major": True}
    assert ssu.plan("bfloat16", 256, "simple", ssu.MAX_TOKENS)["lanes_per_row"] == 8  # 64 state registers, not 128
    assert ssu.plan("float32", 128, "horizontal", ssu.MAX_TOKENS)["token_major"]
    for state_dtype, name, tokens in (("bfloat16", "simple", 1), ("int16", "simple", ssu.MAX_TOKENS),
                                      ("int16", "horizontal", ssu.MAX_TOKENS), ("float16", "vertical", 1)):
        assert not ssu.plan(state_dtype, 128, name, tokens).get("token_major")


@pytest.mark.parametrize("schedule, params", [
    ("stp_simple", ("bfloat16", "bfloat16", 128, 1, "simple")),
    ("stp_vertical", ("float32", "bfloat16", 128, 1, "vertical")),
    ("mtp_simple", ("float32", "bfloat16", 256, 8, "simple")),
    ("mtp_horizontal", ("bfloat16", "bfloat16", 128, 8, "horizontal")),
    ("mtp_simple", ("float16", "float16", 96, 8, "simple")),
    ("stp_simple", ("int16", "bfloat16", 128, 1, "simple")),
    ("stp_simple", ("float16", "bfloat16", 128, 1, "simple", ssu.PHILOX_RUNTIME)),  # Philox state in a loop
])
def test_sass(schedule, params):
    """No spills or local memory (ptxas, nvcc 13.0: 95 registers for bf16 dstate 128, 200 for fp32 dstate 256 at
    4 rows a thread), 16-byte state loads and stores."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    mod = _module(schedule)
    sass = testing.build_and_check_sass(mod, mod.KERNEL_META["name"], ssu.kernel_params(*params))
    assert re.search(r"LDG\.E(\.[A-Z]+)*\.128", sass) and re.search(r"STG\.E(\.[A-Z]+)*\.128", sass)


# ------------------------------------------------------------------------------------------------ validation

def _fi_args(batch=2, T=None, nheads=4, dim=64, dstate=128, ngroups=2, device="cpu"):
    lead = (batch,) if T is None else (batch, T)
    return dict(
        state=torch.zeros(5, nheads, dim, dstate, dtype=torch.bfloat16, device=device),
        x=torch.zeros(*lead, nheads, dim, dtype=torch.bfloat16, device=device),
        dt=torch.zeros(*lead, nheads, 1, device=device).expand(*lead, nheads, dim),
        A=torch.zeros(nheads, 1, 1, device=device).expand(nheads, dim, dstate),
        B=torch.zeros(*lead, ngroups, dstate, dtype=torch.bfloat16, device=device),
        C=torch.zeros(*lead, ngroups, dstate, dtype=torch.bfloat16, device=device),
        D=torch.zeros(nheads, 1, device=device).expand(nheads, dim))


@pytest.mark.parametrize("change, arg", [
    (dict(state_scale=torch.zeros(1)), "state_scale"),
    (dict(rand_seed=torch.zeros(1, dtype=torch.int64)), "rand_seed"),
    (dict(cu_seqlens=torch.zeros(3, dtype=torch.int32)), "cu_seqlens"),
    (dict(algorithm="fastest"), "algorithm"),
    (dict(A=torch.zeros(4, 64, 128)), "A"),
    (dict(D=torch.zeros(4, 64)), "D"),
    (dict(state=torch.zeros(5, 4, 64, 72, dtype=torch.bfloat16)), "state"),
    (dict(state=torch.zeros(5, 4, 48, 128, dtype=torch.bfloat16)), "state"),
    (dict(state=torch.zeros(5 * 4 * 64 * 128 + 8, dtype=torch.bfloat16)[1:1 + 5 * 4 * 64 * 128].view(5, 4, 64, 128)),
     "state"),  # misaligned base: checked eagerly (and in the custom op's body under torch.compile)
    (dict(x=torch.zeros(2, 4, 64)), "x"),
    (dict(B=torch.zeros(2, 3, 128, dtype=torch.bfloat16), C=torch.zeros(2, 3, 128, dtype=torch.bfloat16)), "B"),
    (dict(state_batch_indices=torch.zeros(2)), "state_batch_indices"),
])
def test_rejected_inputs_name_the_argument(change, arg):
    from tirx_kernels.core.checks import TirxInputError

    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        ssu.selective_state_update(**{**_fi_args(), **change})


def test_cpu_tensors_are_rejected():
    from tirx_kernels.core.checks import TirxInputError

    with pytest.raises(TirxInputError, match="argument 'state'.*CUDA"):
        ssu.selective_state_update(**_fi_args())


# ------------------------------------------------------------------------------------------------ GPU

@pytest.mark.parametrize("T", [None, 3])
def test_public_op_compiles_fullgraph_to_its_custom_op(monkeypatch, T):  # noqa: N803
    """torch.compile (fullgraph) traces the public op into its custom op (H200 run 1: dynamo failed on
    ``state.data_ptr() % 16``; the bundle lookup behind the vertical fallback runs importlib / json): on CPU tensors,
    the CUDA check lifted and the launch stubbed, the compiled call reaches the op's body (which validates again,
    alignment included) with the schedule the eager call picks, and its writes land in the pool and output."""
    from tirx_kernels.core import checks
    from tirx_kernels.ported.flashinfer.mamba import _ssu_op

    real = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda *a, cuda=False, **k: real(*a, cuda=False, **k))
    calls = []

    def fake_run(schedule, n):
        calls.append(schedule)
        n["out"].fill_(3.0)
        n["state"].add_(1)

    monkeypatch.setattr(_ssu_op, "run", fake_run)
    fn = torch.compile(lambda a: ssu.selective_state_update(**a), fullgraph=True, backend="eager")
    for dstate, batch in ((128, 3), (64, 5), (256, 2)):  # the later calls recompile with symbolic sizes
        a = {**_fi_args(batch=batch, T=T, dstate=dstate), "cache_steps": T or 0}
        state = a["state"].clone()
        out = fn({**a, "state": state})
        assert calls.pop() == ("mtp" if T else "stp") + "_vertical" and not calls
        assert bool((out == 3).all()) and bool((state == a["state"] + 1).all())


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
ROWS = [(s, c["label"]) for s in SCHEDULES for c in _module(s).CONFIGS]


@gpu
@pytest.mark.parametrize("schedule, label", ROWS)
def test_gpu_config(schedule, label):
    mod = _module(schedule)
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_gpu_graph_replay(schedule):
    from tirx_kernels.core import testing

    mod = _module(schedule)
    testing.check_graph_replay(mod.KERNEL_META["name"], mod.CONFIGS[-1]["label"])


@gpu
@pytest.mark.parametrize("algorithm", ["auto", "simple", "vertical", "horizontal"])
@pytest.mark.parametrize("T", [None, 4])
def test_gpu_matches_flashinfer(algorithm, T):
    """Our op and FlashInfer's on the same call forms (3-D / 4-D x, int64 indices with a pad slot, z, dt_bias):
    out and the whole pool."""
    flashinfer = pytest.importorskip("flashinfer")
    torch.manual_seed(0)
    a = _fi_args(batch=33, T=T, nheads=16, ngroups=4, device="cuda")
    a["state"] = torch.randn_like(a["state"].float()).to(torch.bfloat16).repeat(14, 1, 1, 1)
    for k in ("x", "B", "C"):
        a[k] = torch.randn_like(a[k].float()).to(torch.bfloat16)
    a["dt"] = (torch.randn(a["dt"].shape[:-1], device="cuda") * 0.5).unsqueeze(-1).expand(a["dt"].shape)
    a["A"] = (-torch.rand(16, device="cuda") - 0.5)[:, None, None].expand(a["A"].shape)
    a["D"] = torch.randn(16, device="cuda")[:, None].expand(a["D"].shape)
    idx = torch.randperm(70, device="cuda")[:33]
    idx[3] = -1
    kw = dict(z=torch.randn_like(a["x"].float()).to(torch.bfloat16), dt_bias=torch.randn(16, device="cuda")[:, None]
              .expand(16, 64), dt_softplus=True, state_batch_indices=idx.long(), cache_steps=T or 0,
              algorithm=algorithm)
    s_ours, s_fi = a["state"].clone(), a["state"].clone()
    out = ssu.selective_state_update(**{**a, "state": s_ours}, **kw)
    try:
        ref = flashinfer.mamba.selective_state_update(**{**a, "state": s_fi}, **kw)
    except (RuntimeError, ValueError):  # an algorithm FlashInfer does not build for this call on sm90: its default
        s_fi = a["state"].clone()
        ref = flashinfer.mamba.selective_state_update(**{**a, "state": s_fi}, **{**kw, "algorithm": "auto"})
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(s_ours.float(), s_fi.float(), atol=2e-2, rtol=2e-2)


@gpu
@pytest.mark.parametrize("rounds", [10, 7, 16])
def test_gpu_stochastic_rounding_bit_exact(rounds):
    """The bundle serves stochastic rounding at every Philox rounds count (10: the unrolled artifact; others the
    general one): the stored fp16 state bit for bit the oracle's (``_exact_stochastic_inputs``)."""
    d = _exact_stochastic_inputs(rounds, "cuda")
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
    ssu.run("stp_simple", d)
    torch.cuda.synchronize()
    _, want_pool, _ = ssu.oracle(**{k: v for k, v in before.items() if k != "out"})
    assert torch.equal(d["state"].view(torch.int16), want_pool.view(torch.int16))


@gpu
def test_gpu_torch_compile_and_empty_batch():
    a = _fi_args(batch=5, device="cuda")
    a["x"] = torch.randn_like(a["x"].float()).to(torch.bfloat16)
    want_state = a["state"].clone()
    want = ssu.selective_state_update(**{**a, "state": want_state})
    got_state = a["state"].clone()
    got = torch.compile(lambda s: ssu.selective_state_update(**{**a, "state": s}), fullgraph=True)(got_state)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(got_state, want_state, atol=0, rtol=0)
    e = _fi_args(batch=0, device="cuda")
    assert ssu.selective_state_update(**e).shape == (0, 4, 64)


def test_launch_argument_order_is_the_primfuncs():
    """The public op calls the tvm-ffi function positionally: ARG_ORDER / SCALAR_ORDER must be the PrimFunc's."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to trace the kernel")
    f = ssu.get_kernel("bfloat16", "bfloat16", 128, 1, "simple")
    assert [p.name for p in f.params] == list(ssu.ARG_ORDER) + list(ssu.SCALAR_ORDER)  # buffers by name
