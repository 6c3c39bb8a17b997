# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Mamba-2 selective_state_update (single-token and multi-token decode).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/mamba/selective_state_update.py
# and include/flashinfer/mamba/kernel_selective_state_update_{stp,mtp_simple}.cuh, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). Read for semantics only; written anew in TIRx.
"""selective_state_update's host side: the launch arguments of one call, the fp32 oracle, and the public op
(FlashInfer's argument forms validated and normalized, the registered schedule picked, the kernel launched). The
kernel generator is _ssu_kernel.py; the protocol pieces the six registered modules share are
_selective_state_update.py."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.ported.flashinfer.mamba import _ssu_philox as _philox
from tirx_kernels.ported.flashinfer.mamba._ssu_kernel import (
    _DTYPES,
    DSTATES,
    HAS_BIAS,
    HAS_DST,
    HAS_INDEX,
    HAS_INTER_INDEX,
    HAS_Z,
    INDEX64,
    INPUT_DTYPES,
    INT16_MAX,
    INTERMEDIATE,
    MAX_PHILOX_ROUNDS,
    MAX_TOKENS,
    SCHEDULES,
    SOFTPLUS,
    SOFTPLUS_THRESHOLD,
    STATE_DTYPES,
    UPDATE,
    WEIGHT_KINDS,
    kernel_params,
    plan,
)

# ---------------------------------------------------------------------------------------------------------
# Launch arguments (shared by the public op and the CPU emulation tests)
# ---------------------------------------------------------------------------------------------------------

_INT32_MAX = 2**31 - 1
_ONE_INT32: dict = {}


_flat = runtime.flat_view  # the 1-D view over every element a strided tensor addresses


def _as_u16(t: torch.Tensor) -> torch.Tensor:
    return _flat(t).view(torch.int16)


def _as_i32(t: torch.Tensor) -> torch.Tensor:
    return _flat(t).view(torch.int32)


def _stand_in_index(device) -> torch.Tensor:
    key = str(device)
    if key not in _ONE_INT32:
        _ONE_INT32[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _ONE_INT32[key]


ARG_ORDER = ("S", "X", "DT", "A", "Bm", "Cm", "Dv", "BIAS", "Z", "OUT", "IDX", "DST", "INTER", "IIDX", "SC",
             "SEED")
SCALAR_ORDER = ("batch", "nheads", "dim", "heads_per_group", "ntokens", "state_stride", "x_sb", "x_st", "dt_sb",
                "dt_st", "b_sb", "b_st", "c_sb", "c_st", "z_sb", "z_st", "o_sb", "o_st", "idx_s", "dst_sb", "dst_st",
                "inter_idx_s", "cache_steps", "weight_kind", "flags", "pad_slot_id", "scale_sb", "zero",
                "philox_rounds_arg")


def kernel_args(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, out, update,  # noqa: N803
                inter, inter_idx, cache_steps, dst, schedule, state_scale=None, rand_seed=None, philox_rounds=0):
    """(pointers by buffer name, scalars by name, params, grid, block) of one launch. Tensors in the normalized
    forms: state (slots, nheads, dim, dstate); x, z, out (batch, T, nheads, dim); dt (batch, T, nheads) (the head
    column of FlashInfer's broadcast dim); B, C (batch, T, ngroups, dstate); A, D, dt_bias (nheads,); idx (batch,),
    dst (batch, T) with stride 0 on T for one slot a request, inter_idx (batch,); state_scale (slots, nheads, dim)
    fp32 with an int16 state."""
    batch, T_, nheads, dim = x.shape
    dstate = state.shape[3]
    ngroups = B.shape[2]
    index64 = any(t is not None and t.dtype == torch.int64 for t in (idx, dst, inter_idx))
    flags = ((HAS_INDEX if idx is not None else 0) | (HAS_DST if dst is not None else 0)
             | (HAS_BIAS if dt_bias is not None else 0) | (HAS_Z if z is not None else 0)
             | (SOFTPLUS if dt_softplus else 0) | (UPDATE if update else 0)
             | (INTERMEDIATE if inter is not None else 0) | (HAS_INTER_INDEX if inter_idx is not None else 0)
             | (INDEX64 if index64 else 0))
    stand_in = _stand_in_index(x.device)
    ptrs = {"S": _flat(state), "X": _flat(x), "DT": _as_u16(dt), "A": _flat(A), "Bm": _flat(B), "Cm": _flat(C),
            "Dv": _as_u16(D), "BIAS": _as_u16(dt_bias if dt_bias is not None else D),
            "Z": _flat(z if z is not None else x), "OUT": _flat(out),
            "IDX": _as_i32(idx) if idx is not None else stand_in, "DST": _as_i32(dst) if dst is not None else stand_in,
            "INTER": _flat(inter if inter is not None else state),
            "IIDX": _as_i32(inter_idx) if inter_idx is not None else stand_in,
            "SC": _flat(state_scale) if state_scale is not None else _flat(A),
            "SEED": _as_i32(rand_seed) if rand_seed is not None else stand_in}
    zt = z if z is not None else x
    scalars = {"batch": batch, "nheads": nheads, "dim": dim, "heads_per_group": nheads // ngroups, "ntokens": T_,
               "state_stride": state.stride(0), "x_sb": x.stride(0), "x_st": x.stride(1), "dt_sb": dt.stride(0),
               "dt_st": dt.stride(1), "b_sb": B.stride(0), "b_st": B.stride(1), "c_sb": C.stride(0),
               "c_st": C.stride(1), "z_sb": zt.stride(0), "z_st": zt.stride(1), "o_sb": out.stride(0),
               "o_st": out.stride(1), "idx_s": idx.stride(0) if idx is not None else 0,
               "dst_sb": dst.stride(0) if dst is not None else 0, "dst_st": dst.stride(1) if dst is not None else 0,
               "inter_idx_s": inter_idx.stride(0) if inter_idx is not None else 0, "cache_steps": cache_steps,
               "weight_kind": WEIGHT_KINDS[dt.dtype], "flags": flags, "pad_slot_id": pad_slot_id,
               "scale_sb": state_scale.stride(0) if state_scale is not None else 0, "zero": 0,
               "philox_rounds_arg": philox_rounds if rand_seed is not None else 0}
    max_tokens = 1 if T_ == 1 and schedule_is_stp(schedule) else MAX_TOKENS
    name = schedule_name(schedule)
    params = kernel_params(str(state.dtype)[6:], str(x.dtype)[6:], dstate, max_tokens, name,
                           philox_rounds if rand_seed is not None else 0)
    p = plan(params["state_dtype"], dstate, name, max_tokens)
    grid = (batch, nheads * (dim // p["rows_per_cta"]))
    block = (p["rows_per_cta"] * p["lanes_per_row"] // p["rows_per_thread"],)
    return ptrs, scalars, params, grid, block


def schedule_is_stp(schedule: str) -> bool:
    return schedule.startswith("stp_")


def schedule_name(schedule: str) -> str:
    """``stp_simple`` -> ``simple``."""
    return schedule.split("_", 1)[1]


# ---------------------------------------------------------------------------------------------------------
# The fp32 oracle
# ---------------------------------------------------------------------------------------------------------

def quantize_rows(s: torch.Tensor) -> tuple:
    """FlashInfer's int16 state encoding of fp32 rows (last dim): ``(int16 rows, fp32 decode scales)``, the scale
    1 / (32767 / max |row|) (1 for a zero row), values rounded to nearest even and clipped to +-32767."""
    rmax = s.abs().amax(-1)
    enc = torch.where(rmax == 0, torch.ones_like(rmax), torch.tensor(INT16_MAX, dtype=torch.float32) / rmax)
    q = torch.round((s * enc[..., None]).clamp(-INT16_MAX, INT16_MAX)).to(torch.int16)
    return q, 1.0 / enc


def oracle(state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False, idx=None,  # noqa: N803
           pad_slot_id=-1, update=True, inter=None, inter_idx=None, cache_steps=0, dst=None, state_scale=None,
           rand_seed=None, philox_rounds=0):
    """The recurrence in fp32 on the normalized forms (``kernel_args``): ``(out fp32, state pool, inter)``, the pool
    and inter in their dtypes with only the written rows changed. Vectorized over the batch (source slots distinct,
    destinations apart from the sources, as a serving engine's indices are). An int16 pool (with ``state_scale``)
    returns ``(out, pool, inter, new state_scale)``."""
    batch, T_, nheads, dim = x.shape
    dstate = state.shape[3]
    hpg = nheads // B.shape[2]
    pool = state.clone()
    inter_out = inter.clone() if inter is not None else None
    slots = idx.long() if idx is not None else torch.arange(batch, device=x.device)
    live = slots != pad_slot_id
    s = torch.zeros(batch, nheads, dim, dstate, device=x.device)
    s[live] = state[slots[live]].float()
    if state_scale is not None:
        s[live] = s[live] * state_scale[slots[live]][..., None].float()
        scales = state_scale.clone()

    def put(where, rows, src):
        if state_scale is not None:
            pool[where], scales[where] = quantize_rows(rows)
        elif rand_seed is not None:  # stochastic rounding, counters at the source slot's element offsets
            row = torch.arange(nheads * dim, device=x.device).reshape(nheads, dim) * dstate
            offsets = src.long()[:, None, None] * state.stride(0) + row
            pool[where] = _philox.round_rows(rows, int(rand_seed.reshape(-1)[0]), offsets, philox_rounds)
        else:
            pool[where] = rows.to(pool.dtype)
    out = torch.empty(batch, T_, nheads, dim, dtype=torch.float32, device=x.device)
    for t in range(T_):
        d = dt[:, t].float() + (dt_bias.float() if dt_bias is not None else 0)  # (batch, nheads)
        if dt_softplus:
            d = torch.where(d <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(d)), d)
        dA = torch.exp(A.float() * d)
        Bh = B[:, t].float().repeat_interleave(hpg, 1)  # (batch, nheads, dstate)
        Ch = C[:, t].float().repeat_interleave(hpg, 1)
        xv = x[:, t].float()  # (batch, nheads, dim)
        s = s * dA[..., None, None] + (d[..., None] * xv)[..., None] * Bh[:, :, None, :]
        y = (s * Ch[:, :, None, :]).sum(-1) + D.float()[:, None] * xv
        if z is not None:
            zv = z[:, t].float()
            y = y * zv * torch.sigmoid(zv)
        out[:, t] = y
        if inter is not None:
            ic = inter_idx.long() if inter_idx is not None else slots
            inter_out.view(-1, nheads, dim, dstate)[ic[live] * cache_steps + t] = s[live].to(inter.dtype)
        elif dst is not None and update and (t == T_ - 1 or dst.stride(1) != 0):
            ds = dst[:, t].long()
            ok = live & (ds != pad_slot_id)
            put(ds[ok], s[ok], slots[ok])
    if inter is None and dst is None and update:
        put(slots[live], s[live], slots[live])
    return (out, pool, inter_out) if state_scale is None else (out, pool, inter_out, scales)


# ---------------------------------------------------------------------------------------------------------
# The public op (FlashInfer 0.7.4's signature)
# ---------------------------------------------------------------------------------------------------------

OP = "selective_state_update"
_ALGORITHMS = {"auto": "simple", "simple": "simple", "vertical": "vertical", "horizontal": "horizontal",
               "async_horizontal": "simple"}  # upstream folds async_horizontal into simple too
# "auto": the vertical schedule where the simple one leaves SMs idle (fewer than this many 64-row CTAs)
VERTICAL_BELOW_CTAS = 264


def _fail(name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def _misaligned(t: torch.Tensor) -> bool:
    """``t.data_ptr() % 16 != 0``; False while torch.compile traces (dynamo cannot trace ``data_ptr() % 16``): the
    custom op's eager body runs ``normalize`` again on the real tensors and checks it there."""
    return not torch.compiler.is_compiling() and t.data_ptr() % 16 != 0


def _head_column(name: str, t: torch.Tensor, lead: int, nheads: int, dim: int) -> torch.Tensor:
    """FlashInfer's broadcast per-head tensors (``(..., nheads, dim)`` with stride 0 on dim, unit stride on heads):
    the head column, ``(..., nheads)``."""
    if t.dim() != lead + 2 or tuple(t.shape[lead:]) != (nheads, dim):
        _fail(name, f"{lead + 2} dims ending in (nheads={nheads}, dim={dim})", f"shape {tuple(t.shape)}")
    if dim > 1 and t.stride(-1) != 0:
        _fail(name, "stride 0 on dim (one value a head, broadcast, as FlashInfer requires)", f"strides {t.stride()}")
    col = t[..., 0]
    if nheads > 1 and col.stride(-1) != 1:
        _fail(name, "unit stride on heads", f"strides {t.stride()}")
    return col


def normalize(state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False,  # noqa: N803, C901
              state_batch_indices=None, pad_slot_id=-1, out=None, disable_state_update=False,
              intermediate_states_buffer=None, intermediate_state_indices=None, cache_steps=0,
              dst_state_batch_indices=None, state_scale=None, rand_seed=None, philox_rounds=10) -> dict:
    """FlashInfer's argument forms validated and brought to ``kernel_args``'s normalized ones (views, no copies);
    ``out`` must already be the output tensor. Returns kernel_args' keyword arguments plus ``mtp``."""
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D)):
        if not isinstance(t, torch.Tensor):
            _fail(name, "a tensor", type(t).__name__)
    mtp = cache_steps >= 1 or x.dim() == 4
    if state.dim() == 3:
        state = state.unsqueeze(1)
    if A.dim() == 2:
        A = A.unsqueeze(0)  # noqa: N806
    if D.dim() == 1:
        D = D.unsqueeze(0)  # noqa: N806
    if dt_bias is not None and dt_bias.dim() == 1:
        dt_bias = dt_bias.unsqueeze(0)

    def lift(t):
        """FlashInfer's (batch, dim) -> (batch, 1, dim), then a token dim: (batch, T, nheads, dim) for every call
        (T = 1 for a single-token one)."""
        if t is None:
            return None
        t = t.unsqueeze(1) if t.dim() == 2 else t
        return t.unsqueeze(1) if t.dim() == 3 else t

    x, dt, B, C, z, out = (lift(t) for t in (x, dt, B, C, z, out))  # noqa: N806
    if state.dim() != 4:
        _fail("state", "(slots, nheads, dim, dstate)", f"shape {tuple(state.shape)}")
    slots, nheads, dim, dstate = state.shape
    checks.tensor(OP, "state", state, dtypes=tuple(_DTYPES[d] for d in STATE_DTYPES), cuda=False)
    if dstate not in DSTATES:
        _fail("state", f"dstate (its last dim) one of {DSTATES}", dstate)
    if dim % SCHEDULES["simple"]["rows_per_cta"] or dim == 0:
        _fail("state", f"dim (its third dim) a positive multiple of {SCHEDULES['simple']['rows_per_cta']}", dim)
    if state.stride(3) != 1 or state.stride(2) != dstate or state.stride(1) != dim * dstate:
        _fail("state", "contiguous (nheads, dim, dstate) blocks", f"strides {state.stride()}")
    es = state.element_size()
    if _misaligned(state) or (state.stride(0) * es) % 16 or not 0 < state.stride(0) <= _INT32_MAX:
        _fail("state", "16-byte aligned slots (base and slot stride) with an int32 slot stride",
              f"strides {state.stride()}" + ("" if torch.compiler.is_compiling() else
                                              f", data_ptr % 16 = {state.data_ptr() % 16}"))
    lead = 2
    if x.dim() != 4 or tuple(x.shape[2:]) != (nheads, dim):
        _fail("x", f"(batch, [T,] nheads={nheads}, dim={dim})", f"shape {tuple(x.shape)}")
    batch, T_ = x.shape[:2]
    if not 1 <= T_ <= MAX_TOKENS:
        _fail("x", f"1..{MAX_TOKENS} tokens a request", T_)
    checks.tensor(OP, "x", x, dtypes=tuple(_DTYPES[d] for d in INPUT_DTYPES), cuda=False)
    for name, t, width in (("x", x, dim), ("z", z, dim), ("out", out, dim), ("B", B, dstate), ("C", C, dstate)):
        if t is None:
            continue
        groups = B.shape[2] if name in ("B", "C") and B.dim() == 4 else nheads
        if t.dim() != 4 or tuple(t.shape) != (batch, T_, groups, width):
            _fail(name, f"shape {(batch, T_, groups, width)} (as x)", f"shape {tuple(t.shape)}")
        if t.dtype != x.dtype:
            _fail(name, f"dtype {x.dtype} (x's)", t.dtype)
        if width > 1 and (t.stride(3) != 1 or t.stride(2) != width):
            _fail(name, "rows contiguous in their last two dims", f"strides {t.stride()}")
        if not all(0 <= st <= _INT32_MAX for st in t.stride()):
            _fail(name, "non-negative int32 strides", f"strides {t.stride()}")
    ngroups = B.shape[2]
    if ngroups == 0 or nheads % ngroups:
        _fail("B", f"ngroups dividing nheads={nheads}", ngroups)
    dt_col = _head_column("dt", dt, lead, nheads, dim)
    if dt.dtype not in WEIGHT_KINDS:
        _fail("dt", f"one of {sorted(map(str, WEIGHT_KINDS))}", dt.dtype)
    if A.dim() != 3 or tuple(A.shape) != (nheads, dim, dstate) or A.dtype != torch.float32:
        _fail("A", f"float32 (nheads, dim, dstate) = {(nheads, dim, dstate)}", f"{A.dtype} {tuple(A.shape)}")
    if (dim > 1 and A.stride(1) != 0) or (dstate > 1 and A.stride(2) != 0) or (nheads > 1 and A.stride(0) != 1):
        _fail("A", "strides (1, 0, 0) (one value a head, broadcast)", f"strides {A.stride()}")
    A_col = A[:, 0, 0]  # noqa: N806
    D_col = _head_column("D", D, 0, nheads, dim)  # noqa: N806
    bias_col = _head_column("dt_bias", dt_bias, 0, nheads, dim) if dt_bias is not None else None
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None and t.dtype != dt.dtype:
            _fail(name, f"dtype {dt.dtype} (dt's)", t.dtype)

    def index(name, t, two_d_ok):
        if t is None:
            return None
        if t.dtype not in (torch.int32, torch.int64):
            _fail(name, "int32 or int64", t.dtype)
        if t.dim() not in ((1, 2) if two_d_ok else (1,)) or t.shape[0] < batch:
            _fail(name, f"(batch >= {batch},)" + (" or (batch, T)" if two_d_ok else ""), f"shape {tuple(t.shape)}")
        return t

    idx = index("state_batch_indices", state_batch_indices, True)
    if idx is not None:
        idx = idx[:batch, 0] if idx.dim() == 2 else idx[:batch]
    dst = index("dst_state_batch_indices", dst_state_batch_indices, mtp)
    if dst is not None:
        if dst.dim() == 2:
            if dst.shape[1] < T_:
                _fail("dst_state_batch_indices", f"(batch, T >= {T_})", f"shape {tuple(dst.shape)}")
            dst = dst[:batch, :T_]
        else:
            dst = dst[:batch].unsqueeze(1).expand(batch, T_)
    inter = inter_idx = None
    if intermediate_states_buffer is not None and mtp:
        if dst is not None:
            _fail("intermediate_states_buffer", "None with dst_state_batch_indices (mutually exclusive)", "a tensor")
        inter = intermediate_states_buffer
        if inter.dtype != state.dtype or not inter.is_contiguous() or _misaligned(inter):
            _fail("intermediate_states_buffer", f"a contiguous, 16-byte aligned {state.dtype} tensor",
                  f"{inter.dtype}, strides {inter.stride()}")
        if cache_steps < T_ or inter.numel() % (nheads * dim * dstate):
            _fail("intermediate_states_buffer", f"(entries, cache_steps >= T={T_}, nheads, dim, dstate)",
                  f"shape {tuple(inter.shape)}, cache_steps {cache_steps}")
        inter_idx = index("intermediate_state_indices", intermediate_state_indices, False)
        inter_idx = inter_idx[:batch] if inter_idx is not None else None
    dtypes = {t.dtype for t in (idx, dst, inter_idx) if t is not None}
    if len(dtypes) > 1:
        _fail("dst_state_batch_indices", "the dtype of state_batch_indices (one index dtype a call)", dtypes)
    # upstream: a multi-token call with destination indices writes every step, whatever disable_state_update says
    update = not disable_state_update or (mtp and dst is not None)
    quant = state.dtype == torch.int16
    if quant != (state_scale is not None):
        _fail("state_scale", "a float32 (slots, nheads, dim) tensor exactly when state is int16",
              "None" if state_scale is None else f"a tensor with a {state.dtype} state")
    if quant:
        if state_scale.dim() == 4 and state_scale.shape[-1] == 1:
            state_scale = state_scale[..., 0]
        if tuple(state_scale.shape) != (slots, nheads, dim) or state_scale.dtype != torch.float32 or \
                state_scale.stride(2) != 1 or state_scale.stride(1) != dim or \
                not 0 < state_scale.stride(0) <= _INT32_MAX:
            _fail("state_scale", f"float32 (slots, nheads, dim) = {(slots, nheads, dim)}, rows contiguous",
                  f"{state_scale.dtype} {tuple(state_scale.shape)} strides {state_scale.stride()}")
        if inter is not None:
            _fail("intermediate_states_buffer", "None with an int16 state (intermediate_state_scales not ported)",
                  "a tensor")
    if rand_seed is not None:
        if not isinstance(rand_seed, torch.Tensor) or rand_seed.numel() != 1 or rand_seed.dtype != torch.int64:
            _fail("rand_seed", "a one-element int64 tensor", rand_seed if not isinstance(rand_seed, torch.Tensor)
                  else f"{rand_seed.dtype} numel {rand_seed.numel()}")
        if state.dtype != torch.float16 or mtp:
            _fail("rand_seed", "None unless the state is float16 and the call single-token (stochastic rounding "
                  "of multi-token calls not ported)", f"a seed with a {state.dtype} state, mtp={mtp}")
        if not 0 < int(philox_rounds) <= MAX_PHILOX_ROUNDS:
            _fail("philox_rounds", f"1..{MAX_PHILOX_ROUNDS} with rand_seed", philox_rounds)
        philox_rounds = _constant(int(philox_rounds), tuple(range(1, MAX_PHILOX_ROUNDS + 1)))
    return dict(state_scale=state_scale, rand_seed=rand_seed, philox_rounds=int(philox_rounds) if rand_seed is not None
                else 0, state=state, x=x, dt=dt_col, A=A_col, B=B, C=C, D=D_col, z=z, dt_bias=bias_col,
                dt_softplus=bool(dt_softplus), idx=idx, pad_slot_id=int(pad_slot_id), out=out, update=update,
                inter=inter, inter_idx=inter_idx, cache_steps=int(cache_steps) if inter is not None else 0, dst=dst,
                mtp=mtp)


def module_of(schedule: str):
    import importlib

    return importlib.import_module(f"{__package__}.selective_state_update_{schedule}")


_FUNCTIONS: dict = {}
_SERVED: dict = {}


def serves(schedule: str, params: dict) -> bool:
    """Whether the schedule's module has ``params`` among its bundled artifacts (artifact_params and its rows)."""
    return _served(schedule, tuple(sorted(params.items())))


@torch.compiler.assume_constant_result
def _served(schedule: str, key: tuple) -> bool:
    """``serves`` on the params' sorted items. torch.compile runs it rather than traces it (importlib, json), and
    its result is a constant of the call's dtypes and dstate, which the trace guards on."""
    from tirx_kernels.core import artifacts, harness

    if schedule not in _SERVED:
        mod = module_of(schedule)
        rows = [mod.compile_params(**harness.full_config(mod, c)) for c in mod.CONFIGS + mod.BENCH_CONFIGS]
        _SERVED[schedule] = {artifacts.canonical_params(p) for p in mod.artifact_params() + rows}
    return artifacts.canonical_params(dict(key)) in _SERVED[schedule]


@torch.compiler.assume_constant_result
def _registered(schedule: str) -> bool:
    """Import the schedule's module, which registers its ``tirx::selective_state_update_<schedule>`` custom op (a
    compiled call reaches the op before any eager call imported it)."""
    module_of(schedule)
    return True


def pick_schedule(algorithm: str, n: dict) -> str:
    """The registered schedule a call runs: ``algorithm`` (``auto``: vertical where simple's CTAs would not fill
    the GPU), falling back to simple where that schedule's module bundles no artifact for the call."""
    stage = "mtp" if n["mtp"] else "stp"
    name = _ALGORITHMS[algorithm]
    batch, _, nheads, dim = n["x"].shape
    if algorithm == "auto" and batch * nheads * (dim // SCHEDULES["simple"]["rows_per_cta"]) < VERTICAL_BELOW_CTAS:
        name = "vertical"
    schedule = f"{stage}_{name}"
    if name != "simple" and not serves(schedule, call_params(schedule, n)):
        schedule = f"{stage}_simple"
    return schedule


def _constant(value, choices: tuple):
    """``value`` as the equal Python int of ``choices`` (a symbolic size under torch.compile becomes a constant the
    trace guards on), else ``value``."""
    for c in choices:
        if value == c:
            return c
    return value


def call_params(schedule: str, n: dict) -> dict:
    return kernel_params(str(n["state"].dtype)[6:], str(n["x"].dtype)[6:], _constant(n["state"].shape[3], DSTATES),
                         1 if schedule_is_stp(schedule) else MAX_TOKENS, schedule_name(schedule),
                         n["philox_rounds"] if n.get("rand_seed") is not None else 0)


_TVM_ORDER = ARG_ORDER + SCALAR_ORDER


def _function(schedule: str, params: dict, device):
    key = (schedule, artifacts_key(params), device.index)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = runtime.get_function(module_of(schedule), params, device)
    return fn


def _launch(schedule: str, n: dict) -> tuple:
    """``(fn, pointers, scalars)`` of the launch on normalized arguments (``normalize``), in the kernel's order."""
    kw = {k: v for k, v in n.items() if k != "mtp"}
    ptrs, scalars, params, _, _ = kernel_args(**kw, schedule=schedule)
    return (_function(schedule, params, n["x"].device), [ptrs[k] for k in ARG_ORDER],
            [scalars[k] for k in SCALAR_ORDER])


def run(schedule: str, n: dict, plans_key=None, args: tuple = ()) -> None:
    """Launch the schedule's kernel on normalized arguments (``normalize``); with ``plans_key`` (a signature of
    ``_PLANS``) the launch is also recorded for later calls on ``args`` of that signature."""
    if n["x"].shape[0] == 0:
        return
    fn, pointers, scalars = _launch(schedule, n)
    if plans_key is not None:
        _PLANS.record(plans_key, fn, pointers, scalars, args, constants=(_stand_in_index(n["x"].device),))
    fn(*pointers, *scalars)


# The host path memoized per call signature (``runtime.LaunchPlans``): 156 us of host work a call on the H100 host
# against an 8.6 us kernel at batch 1 (2026-12-07e, op_breakdown --host); 33 against 67-72 us a call replayed on the
# CPU machine with the launch stubbed.
_PLANS = runtime.LaunchPlans()


def artifacts_key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def _unsupported(**kw) -> None:
    for name, (value, ok) in kw.items():
        if not ok:
            _fail(name, "its default (not supported by this port yet)", repr(value) if value is None
                  or isinstance(value, (int, str)) else type(value).__name__)


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,  # noqa: N803
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, z: torch.Tensor | None = None,
                           dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                           state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                           state_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                           disable_state_update: bool = False,
                           intermediate_states_buffer: torch.Tensor | None = None,
                           intermediate_state_indices: torch.Tensor | None = None,
                           intermediate_state_scales: torch.Tensor | None = None,
                           rand_seed: torch.Tensor | None = None, philox_rounds: int = 10, cache_steps: int = 0,
                           algorithm: str = "auto", dst_state_batch_indices: torch.Tensor | None = None,
                           cu_seqlens: torch.Tensor | None = None, num_accepted_tokens: torch.Tensor | None = None,
                           backend: str = "auto") -> torch.Tensor:
    """Mamba-2 selective state update (FlashInfer 0.7.4's ``flashinfer.mamba.selective_state_update``): updates
    ``state`` in place and returns ``out`` (x's shape). An int16 ``state`` takes its fp32 per-row ``state_scale``
    (slots, nheads, dim), rewritten with the new rows. ``rand_seed`` (a one-element int64 tensor, read on the
    device) rounds an fp16 state stochastically with ``philox_rounds`` Philox rounds (single-token calls).
    Not supported yet (a ``TirxInputError`` names them): ``rand_seed`` on multi-token calls,
    ``intermediate_state_scales`` (so no intermediate buffer with an int16 state), varlen ``cu_seqlens`` and
    ``num_accepted_tokens``."""
    _unsupported(intermediate_state_scales=(intermediate_state_scales, intermediate_state_scales is None),
                 cu_seqlens=(cu_seqlens, cu_seqlens is None),
                 num_accepted_tokens=(num_accepted_tokens, num_accepted_tokens is None),
                 algorithm=(algorithm, algorithm in _ALGORITHMS), backend=(backend, backend in ("auto", "flashinfer")))
    if out is None:
        if not isinstance(x, torch.Tensor):
            _fail("x", "a tensor", type(x).__name__)
        xs = x.unsqueeze(1) if x.dim() == 2 else x
        out = torch.empty_like(xs.unsqueeze(1) if cache_steps >= 1 and xs.dim() == 3 else xs)
    args = (state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), state_batch_indices, int(pad_slot_id), out,
            bool(disable_state_update), intermediate_states_buffer, intermediate_state_indices, int(cache_steps),
            dst_state_batch_indices, state_scale, rand_seed, int(philox_rounds))
    direct = runtime.direct_call(*[t for t in args if isinstance(t, torch.Tensor)])
    key = _PLANS.signature(args, algorithm) if direct else None
    plan = _PLANS.get(key)
    if plan is not None:
        _PLANS.replay(plan, args)
    else:
        n = normalize(*args)
        for name, t in (("state", n["state"]), ("x", n["x"])):
            checks.tensor(OP, name, t, cuda=True)
        checks.same_device(OP, "state", n["state"], x=n["x"], B=n["B"], C=n["C"], out=n["out"])
        schedule = pick_schedule(algorithm, n)
        if not direct:
            _registered(schedule)
            getattr(torch.ops.tirx, f"selective_state_update_{schedule}")(*args)
            return out
        run(schedule, n, key, args)
    runtime.mark_written(state)
    runtime.mark_written(out)
    if state_scale is not None:
        runtime.mark_written(state_scale)
    return out


def custom_op_body(schedule: str, *args) -> None:
    """What a module's ``tirx::selective_state_update_<schedule>`` custom op runs (the public op's arguments)."""
    run(schedule, normalize(*args))
