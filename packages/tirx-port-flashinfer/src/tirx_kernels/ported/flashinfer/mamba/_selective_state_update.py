# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Mamba-2 selective_state_update (single-token and multi-token decode).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/mamba/selective_state_update.py
# and include/flashinfer/mamba/kernel_selective_state_update_{stp,mtp_simple}.cuh, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). Read for semantics only; written anew in TIRx.
"""The one implementation behind the six ``selective_state_update_{stp,mtp}_{simple,vertical,horizontal}`` modules,
split by role: the TIRx kernel generator and its schedules (_ssu_kernel.py, whose docstring gives the math and the
schedule), the host side (_ssu_op.py: launch arguments, fp32 oracle, public op) and, here, the protocol pieces the
registered modules bind to their schedule (_registered.py). The names tests and modules use are re-exported."""

from __future__ import annotations

import os

import torch

from tirx_kernels.ported.flashinfer.mamba._ssu_kernel import (  # noqa: F401
    _DTYPES,
    DIMS,
    DSTATES,
    INPUT_DTYPES,
    MAX_PHILOX_ROUNDS,
    MAX_TOKENS,
    MTP_SCHEDULES,
    PHILOX_RUNTIME,
    SCHEDULES,
    STATE_DTYPES,
    TOKEN_MAJOR_STATE_REGS,
    WEIGHT_KINDS,
    _vectors_per_row,
    build_kernel,
    get_kernel,
    kernel_params,
    plan,
)
from tirx_kernels.ported.flashinfer.mamba._ssu_op import (  # noqa: F401
    ARG_ORDER,
    OP,
    SCALAR_ORDER,
    custom_op_body,
    kernel_args,
    normalize,
    oracle,
    pick_schedule,
    quantize_rows,
    run,
    schedule_is_stp,
    schedule_name,
    selective_state_update,
)

# ---------------------------------------------------------------------------------------------------------
# Protocol pieces the six modules share (each passes its schedule)
# ---------------------------------------------------------------------------------------------------------

DEFAULTS = {"nheads": 64, "dim": 64, "dstate": 128, "ngroups": 8, "state_dtype": "bfloat16", "dtype": "bfloat16",
            "weight_dtype": "float32", "z": False, "dt_bias": True, "dt_softplus": True, "pad": False,
            "index_dtype": "int32", "intermediate": False, "dst": False, "disable_state_update": False}
# The schedules of the vertical / horizontal names bundle the common state dtypes only; other calls of those
# algorithms run the simple schedule (``pick_schedule``).
_PINNED_STATES = ("bfloat16", "float32")
_PINNED_DSTATES = (64, 128, 256)


# FlashInfer's default philox_rounds: the unrolled stochastic-rounding artifacts; other counts run the general one
PHILOX_DEFAULT_ROUNDS = 10


def compile_params(schedule: str, **cfg) -> dict:
    """The params the public op loads for a config (``stochastic``: an fp16 state rounded with ``philox_rounds``,
    default 10, Philox rounds)."""
    rounds = cfg.get("philox_rounds", PHILOX_DEFAULT_ROUNDS) if cfg.get("stochastic") else 0
    return kernel_params(cfg["state_dtype"], cfg["dtype"], cfg["dstate"],
                         1 if schedule_is_stp(schedule) else MAX_TOKENS, schedule_name(schedule), rounds)


def general_params(params: dict) -> dict | None:
    """The artifact serving a stochastic-rounding call whose rounds count has no unrolled artifact: the same kernel
    with the rounds as an argument (``PHILOX_RUNTIME``); None for round-to-nearest params."""
    if params.get("philox_rounds", 0) > 0:
        return {**params, "philox_rounds": PHILOX_RUNTIME}
    return None


def artifact_params(schedule: str) -> list[dict]:
    """simple: every (state dtype, input dtype, dstate), so every valid call has an artifact, and (stp) fp16
    stochastic rounding at the default 10 rounds (unrolled) and at any count (``general_params``); the pinned
    vertical / horizontal schedules: the common ones (the op runs other calls, stochastic ones too, on simple)."""
    if schedule_name(schedule) == "simple":
        forms = [(s, i, d) for s in STATE_DTYPES for i in INPUT_DTYPES for d in DSTATES]
    else:
        forms = [(s, "bfloat16", d) for s in _PINNED_STATES for d in _PINNED_DSTATES]
    out = [compile_params(schedule, state_dtype=s, dtype=i, dstate=d) for s, i, d in forms]
    if schedule == "stp_simple":
        out += [kernel_params("float16", i, d, 1, "simple", r) for r in (PHILOX_DEFAULT_ROUNDS, PHILOX_RUNTIME)
                for i in INPUT_DTYPES for d in DSTATES]
    return out


def call_samples(schedule: str, rng) -> list[dict]:
    """Calls the public op routes to this schedule: every dtype and dstate (simple), the pinned forms (others);
    stp_simple: stochastic rounding of an fp16 state at the default and at random rounds counts too."""
    out = []
    for p in artifact_params(schedule):
        if "philox_rounds" in p:
            continue
        for _ in range(2 if schedule_name(schedule) == "simple" else 4):
            out.append({**DEFAULTS, "state_dtype": p["state_dtype"], "dtype": p["input_dtype"],
                        "dstate": p["dstate"], "batch": rng.choice([1, 7, 64, 256]), "dim": rng.choice(DIMS),
                        "weight_dtype": rng.choice(sorted(WEIGHT_KINDS_NAMES)),
                        **({} if schedule_is_stp(schedule) else {"T": rng.randint(1, MAX_TOKENS)})})
    if schedule == "stp_simple":
        out += [{**DEFAULTS, "state_dtype": "float16", "dtype": i, "dstate": d, "batch": rng.choice([1, 7, 64]),
                 "stochastic": True, "philox_rounds": rng.choice([PHILOX_DEFAULT_ROUNDS,
                                                                   rng.randint(1, MAX_PHILOX_ROUNDS)])}
                for i in INPUT_DTYPES for d in DSTATES]
    return out


WEIGHT_KINDS_NAMES = ("float32", "bfloat16", "float16")


def _generator(device: str) -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def prepare_data(schedule: str, batch: int, nheads: int, dim: int, dstate: int, ngroups: int, state_dtype: str,
                 dtype: str, weight_dtype: str, z: bool, dt_bias: bool, dt_softplus: bool, pad: bool,
                 index_dtype: str, intermediate: bool, dst: bool, disable_state_update: bool, T: int = 1,  # noqa: N803
                 slots: int | None = None, device: str = "cuda", stochastic: bool = False,
                 philox_rounds: int = PHILOX_DEFAULT_ROUNDS, **_) -> dict:
    """FlashInfer's call forms: the pool holds ``slots`` (default batch + 3, more with dst) slots, the batch reads
    distinct random ones (entry 1 the pad slot with ``pad``) and writes elsewhere with ``dst``; dt / A / D / dt_bias
    are the broadcast per-head views FlashInfer takes."""
    g = _generator(device)
    mtp = not schedule_is_stp(schedule)
    slots = slots or (batch * (1 + (T if mtp else 1)) if dst else batch) + 3
    it, wt, st = _DTYPES[dtype], _DTYPES[weight_dtype], _DTYPES[state_dtype]
    lead = (batch, T) if mtp else (batch,)

    def rn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    order = torch.randperm(slots, generator=g, device=device)
    index_t = getattr(torch, index_dtype)
    idx = order[:batch].clone()
    if pad and batch > 1:
        idx[1] = -1
    data = {
        "state": (torch.randint(-32767, 32768, (slots, nheads, dim, dstate), generator=g, device=device,
                                dtype=torch.int32).to(st)
                  if st == torch.int16 else rn(slots, nheads, dim, dstate).to(st)),
        "x": rn(*lead, nheads, dim).to(it),
        "dt": rn(*lead, nheads, scale=0.5).to(wt).unsqueeze(-1).expand(*lead, nheads, dim),
        "A": (-torch.rand(nheads, generator=g, device=device) - 0.5)[:, None, None].expand(nheads, dim, dstate),
        "B": rn(*lead, ngroups, dstate).to(it),
        "C": rn(*lead, ngroups, dstate).to(it),
        "D": rn(nheads).to(wt)[:, None].expand(nheads, dim),
        "z": rn(*lead, nheads, dim).to(it) if z else None,
        "dt_bias": rn(nheads, scale=0.5).to(wt)[:, None].expand(nheads, dim) if dt_bias else None,
        "dt_softplus": bool(dt_softplus),
        "state_batch_indices": idx.to(index_t),
        "pad_slot_id": -1,
        "out": torch.empty(*lead, nheads, dim, dtype=it, device=device),
        "disable_state_update": bool(disable_state_update),
        "dst_state_batch_indices": None,
    }
    if dst:
        d = order[batch:batch + batch * (T if mtp else 1)].to(index_t)
        data["dst_state_batch_indices"] = d.reshape(batch, T) if mtp else d
    if mtp:
        # always present (INPLACE names it): a stand-in of one entry where the config writes no intermediate states
        entries = batch + 2 if intermediate else 1
        steps = T if intermediate else 1
        data["intermediate_states_buffer"] = torch.full((entries, steps, nheads, dim if intermediate else 1,
                                                         dstate if intermediate else 1), 7.0, device=device).to(st)
        data["intermediate_state_indices"] = (torch.randperm(entries, generator=g, device=device)[:batch].to(index_t)
                                              if intermediate else None)
        data["cache_steps"] = T if intermediate else 0
        data["intermediate"] = bool(intermediate)
    if schedule_name(schedule) == "simple":
        # the simple modules' INPLACE names it: an int16 pool's per-row decode scales (values ~ randn), else a
        # one-element stand-in the op does not see
        quant = st == torch.int16
        data["state_scale"] = (torch.rand(slots, nheads, dim, generator=g, device=device) + 0.5) / 32767 \
            if quant else torch.full((1, 1, 1), 7.0, device=device)
        data["quantized"] = quant
    if stochastic:  # fp16 state, stochastic rounding: FlashInfer's device-side seed (default rounds: 10)
        data["rand_seed"] = torch.randint(0, 2**62, (1,), generator=g, device=device, dtype=torch.int64)
        data["philox_rounds"] = int(philox_rounds)
    return data


_OP_KEYS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "state_batch_indices",
            "pad_slot_id", "out", "disable_state_update", "intermediate_states_buffer",
            "intermediate_state_indices", "cache_steps", "dst_state_batch_indices", "state_scale", "rand_seed",
            "philox_rounds")


def op_args(data: dict) -> tuple:
    """The public op's arguments of a ``prepare_data`` dict (the stand-in intermediate buffer left out)."""
    a = {k: data.get(k) for k in _OP_KEYS}
    a["cache_steps"] = a["cache_steps"] or 0
    if not data.get("intermediate", False):
        a["intermediate_states_buffer"] = None
    if not data.get("quantized", False):
        a["state_scale"] = None
    a["philox_rounds"] = a["philox_rounds"] or 10
    return tuple(a[k] for k in _OP_KEYS)


def reference(**data) -> dict:
    """The fp32 oracle on the whole pool (and intermediate buffer): ``out`` in fp32, the pool and buffer in their
    dtypes (unwritten rows as they were)."""
    args = list(op_args(data))
    args[_OP_KEYS.index("out")] = data["out"]
    n = normalize(*args)
    want = oracle(**{k: v for k, v in n.items() if k not in ("out", "mtp")})
    want_out, pool, inter = want[:3]
    res = {"out": want_out.reshape(data["out"].shape), "state": pool}
    if "state_scale" in data:
        res["state_scale"] = want[3] if len(want) > 3 else data["state_scale"]
    if "intermediate_states_buffer" in data:
        res["intermediate_states_buffer"] = inter if inter is not None else data["intermediate_states_buffer"]
    return res


def launch(schedule: str, cfg: dict, data: dict) -> None:
    selective_state_update(**dict(zip(_OP_KEYS, op_args(data))), algorithm=schedule_name(schedule))


def roofline(schedule: str, batch: int, nheads: int, dim: int, dstate: int, ngroups: int, state_dtype: str,
             dtype: str, z: bool, pad: bool, intermediate: bool, disable_state_update: bool, T: int = 1,  # noqa: N803
             **_) -> dict:
    """State bytes read once and written once (per token into the intermediate buffer), plus x / z / B / C / out."""
    T = T if not schedule_is_stp(schedule) else 1  # noqa: N806
    live = batch - (1 if pad and batch > 1 else 0)
    row = nheads * dim * dstate * _DTYPES[state_dtype].itemsize
    writes = T if intermediate else (0 if disable_state_update else 1)
    es = _DTYPES[dtype].itemsize
    inputs = batch * T * (nheads * dim * (3 if z else 2) + 2 * ngroups * dstate) * es
    return {"bytes": live * row * (1 + writes) + inputs, "flops": 6 * batch * T * nheads * dim * dstate}


def _row_bits(t: torch.Tensor, lead: int) -> torch.Tensor:
    return t.reshape(lead, -1).contiguous().view(torch.uint8)


# elements a comparator step holds (its fp32 copies and isclose temporaries ~ 20 bytes an element: ~320 MiB): an
# intermediate buffer of the b64 t6 rows has 2e8 elements, whose whole-buffer comparison ran out of memory beside
# 15 other pytest workers on the H200 (torch.testing's isclose raised inside assert_close)
COMPARE_CHUNK_ELEMS = 1 << 24


def state_comparator(key: str, tol: dict):
    """A pool / buffer comparator: slots the oracle does not write bit-identical to the input, written ones within
    the state dtype's tolerance; slot blocks of ``COMPARE_CHUNK_ELEMS`` elements at a time."""
    def compare(got, want, cfg, inputs):
        from tirx_kernels.core import harness

        before = inputs[key]
        lead = before.shape[0]
        atol, rtol = tol[str(before.dtype)[6:]]
        g, w, b = (t.reshape(lead, -1) for t in (got, want, before))
        step = max(1, COMPARE_CHUNK_ELEMS // max(1, g.shape[1]))
        n_written = 0
        for s0 in range(0, lead, step):
            gs, ws, bs = g[s0:s0 + step], w[s0:s0 + step], b[s0:s0 + step]
            rows = gs.shape[0]
            got_bits, before_bits = _row_bits(gs, rows), _row_bits(bs, rows)
            written = (got_bits != before_bits).any(1) | (_row_bits(ws.to(before.dtype), rows) != before_bits).any(1)
            if not torch.equal(got_bits[~written], before_bits[~written]):
                raise harness.KernelCheckError(f"{key}: a slot the call does not address changed")
            try:
                torch.testing.assert_close(gs[written].float(), ws[written].float(), atol=atol, rtol=rtol)
            except AssertionError as e:
                raise harness.KernelCheckError(f"{key} (slots {s0}..{s0 + rows - 1}): {str(e)[:600]}") from None
            n_written += int(written.sum())
        return {"slots_written": n_written, "slots_untouched": lead - n_written}
    return compare


# the catalog's test tolerances (flashinfer tests/mamba): 2e-2 on bf16 / fp16 state, 2e-3 on fp32
# int16: one unit (the rounding of a value a few fp32 ulps away); its fp32 scales: 1e-5 relative
STATE_TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (2e-2, 2e-2), "float32": (2e-3, 2e-3), "int16": (1.0, 0.0)}
SCALE_TOLERANCE = {"float32": (0.0, 1e-5)}
OUT_TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (2e-2, 2e-2), "float32": (2e-3, 2e-3)}


def get_baselines(schedule: str, **cfg) -> dict:
    """FlashInfer 0.7.4's op on copies of the pool (and intermediate buffer), its own schedule choice: upstream's
    algorithms compute the same thing, and not every one builds for every call on sm90."""
    def flashinfer():
        import flashinfer.mamba

        def fn(d):
            a = dict(zip(_OP_KEYS, op_args(d)))
            if a["dt"].stride(-2) != 1:  # its kernels check dt's head stride (H200, 2026-12-07d)
                raise ImportError("FlashInfer 0.7.4 takes dt tied over dim (head stride 1, dim stride 0); this "
                                  f"config's dt has strides {tuple(a['dt'].stride())}")
            st = a["state"]
            inter = a["intermediate_states_buffer"]
            a["out"] = torch.empty_like(d["out"])
            out = flashinfer.mamba.selective_state_update(**a)
            res = {"out": out, "state": st}
            if "intermediate_states_buffer" in d:
                res["intermediate_states_buffer"] = inter if inter is not None else d["intermediate_states_buffer"]
            return res
        return fn

    return {"flashinfer": flashinfer}
