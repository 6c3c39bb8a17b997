# SPDX-License-Identifier: Apache-2.0
# The argument contract of FlashInfer's chunk_gated_delta_rule (flashinfer/gdn_prefill.py, flashinfer-python 0.7.4,
# https://github.com/flashinfer-ai/flashinfer); read, not copied.
"""The public op of ``gdn_prefill_sm90``: FlashInfer's ``chunk_gated_delta_rule`` (the sm90 path) on the TIRx kernel.

Validation names the argument; what FlashInfer's sm90 path does outside its kernel is done here the same way:
``use_qk_l2norm_in_kernel`` normalises q and k first (fp32 sums, eps 1e-6, rounded back to the input dtype), the
raw gate of ``use_gate_in_kernel`` (-exp(A_log) softplus(g + dt_bias), a log gate) and ``beta_is_logit`` (sigmoid,
rounded to beta's dtype) are materialised in torch. Checkpoints are not implemented; the context-parallel form is
``gdn_cp_prefill_sm90`` (``use_cp=True``).
"""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.core.lang import gdn_layout as lay

OP = "chunk_gated_delta_rule"
DIM = 128
IO = {torch.bfloat16: "bfloat16", torch.float16: "float16"}  # _kernel.IO_DTYPES
INDEX = (torch.int32, torch.int64)
_GRID_Y = 65535  # sequences are the grid's y extent
_INT32_MAX = 2**31 - 1


def _fail(name: str, expected: str, got: str):
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def state_heads(q, v) -> int:
    return max(q.shape[1], v.shape[1])


def check_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
                 output_state_indices, gate_domain):
    """Shapes, dtypes, layouts and head maps; the device last (a CPU machine exercises the rest)."""
    io = tuple(IO)
    checks.tensor(OP, "q", q, dtypes=io, ndim=3, contiguous=True, cuda=False)
    total, hq, d = q.shape
    if d != DIM:
        _fail("q", f"head size {DIM}", f"shape {tuple(q.shape)}")
    checks.tensor(OP, "k", k, shape=(total, None, DIM), contiguous=True, cuda=False)
    checks.tensor(OP, "v", v, shape=(total, None, DIM), contiguous=True, cuda=False)
    checks.same_dtype(OP, "q", q, k=k, v=v)
    hk, hv = k.shape[1], v.shape[1]
    if hq == 0 or hk == 0 or hv == 0:
        _fail("q", "at least one head in q, k and v", f"heads q {hq}, k {hk}, v {hv}")
    if hq > hv and (hk != hv or hq % hv):
        _fail("k", f"GQA heads: k and v heads equal, dividing q's {hq}", f"heads k {hk}, v {hv}")
    if hv >= hq and (hk != hq or hv % hq):
        _fail("v", f"GVA heads: k heads equal to q's {hq}, v heads a multiple of them", f"heads k {hk}, v {hv}")
    hs = max(hq, hv)
    checks.tensor(OP, "cu_seqlens", cu_seqlens, dtypes=INDEX, ndim=1, contiguous=True, cuda=False)
    n = cu_seqlens.shape[0] - 1
    if n < 1:
        _fail("cu_seqlens", "at least two entries", f"shape {tuple(cu_seqlens.shape)}")
    if n > _GRID_Y:
        _fail("cu_seqlens", f"at most {_GRID_Y} sequences (the grid's y extent)", f"{n}")
    if total * max(hq, hk, hv, hs) * DIM > _INT32_MAX:
        _fail("q", "fewer than 2**31 elements per tensor", f"shape {tuple(q.shape)}")
    for name, t in (("g", g), ("beta", beta)):
        if t is not None:
            checks.tensor(OP, name, t, dtypes=(torch.float32,), shape=(total, hs), contiguous=True, cuda=False)
    if gate_domain not in ("linear", "log"):
        _fail("gate_domain", "'linear' or 'log'", repr(gate_domain))
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        _fail("scale", "None or a finite float", repr(scale))
    if output is not None:
        checks.tensor(OP, "output", output, shape=(total, hs, DIM), contiguous=True, cuda=False)
        checks.same_dtype(OP, "q", q, output=output)
    for name, idx in (("state_indices", state_indices), ("output_state_indices", output_state_indices)):
        if idx is not None:
            checks.tensor(OP, name, idx, dtypes=INDEX, shape=(n,), contiguous=True, cuda=False)
    if output_state_indices is not None and state_indices is None:
        _fail("output_state_indices", "None without state_indices", "a tensor")
    rows = None if state_indices is not None else n
    for name, st in (("initial_state", initial_state), ("output_state", output_state)):
        if st is not None:
            checks.tensor(OP, name, st, dtypes=(torch.float32,), shape=(rows, hs, DIM, DIM), contiguous=True,
                          cuda=False)
            if st.shape[0] > _INT32_MAX // (hs * DIM * DIM) + 1:
                _fail(name, "fewer than 2**31 rows of states", f"shape {tuple(st.shape)}")
    if state_indices is not None and output_state_indices is None and initial_state is not None \
            and output_state is not None and output_state.shape[0] != initial_state.shape[0]:
        _fail("output_state", f"a pool of the initial state's {initial_state.shape[0]} rows (state_indices)",
              f"shape {tuple(output_state.shape)}")
    checks.tensor(OP, "q", q, cuda=True)
    present = {name: t for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), ("cu_seqlens", cu_seqlens),
                                       ("initial_state", initial_state), ("output", output),
                                       ("output_state", output_state), ("state_indices", state_indices),
                                       ("output_state_indices", output_state_indices)) if t is not None}
    checks.same_device(OP, "q", q, **present)


def normalize_qk(q, k):
    """FlashInfer's pre-pass for ``use_qk_l2norm_in_kernel``: x rsqrt(sum x^2 + 1e-6) in fp32, rounded back."""
    def norm(x):
        xf = x.float()
        return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)
    return norm(q), norm(k)


def materialize_gates(g, beta, use_gate_in_kernel, A_log, dt_bias, beta_is_logit, gate_domain):  # noqa: N803
    """(g, beta, gate_domain) as the kernel takes them: fp32 gates, a raw gate turned into the log gate."""
    if use_gate_in_kernel:
        if g is None or A_log is None or dt_bias is None:
            raise checks.TirxInputError(f"{OP}: argument 'use_gate_in_kernel': needs g, A_log and dt_bias")
        g = -torch.exp(A_log.float()) * torch.nn.functional.softplus(g.float() + dt_bias.float())
        gate_domain = "log"
    elif A_log is not None or dt_bias is not None:
        raise checks.TirxInputError(f"{OP}: argument 'A_log': A_log and dt_bias need use_gate_in_kernel=True")
    if beta_is_logit:
        if beta is None:
            raise checks.TirxInputError(f"{OP}: argument 'beta_is_logit': needs beta")
        beta = torch.sigmoid(beta.float()).to(beta.dtype).float()
    return g, beta, gate_domain


_FUNCTIONS = runtime.FunctionCache("tirx_kernels.ported.flashinfer.gdn_prefill.gdn_prefill_sm90")
_DUMMY: dict = {}


def _dummy(device):
    t = _DUMMY.get(device)
    if t is None:
        t = _DUMMY[device] = torch.zeros(4, dtype=torch.int32, device=device)
    return t


def kernel_args(q, k, v, g, beta, scale: float, initial_state, cu_seqlens, output, output_state, state_indices,
                output_state_indices, gate_log: bool, dummy) -> tuple:
    """The kernel's arguments, in its PrimFunc's order (``dummy``: a small int32 tensor, viewed as the dtype of each
    absent one)."""
    flags = ((lay.HAS_G if g is not None else 0) | (lay.GATE_LOG if gate_log else 0)
             | (lay.HAS_BETA if beta is not None else 0)
             | (lay.CU64 if cu_seqlens.dtype == torch.int64 else 0)
             | (lay.HAS_INIT if initial_state is not None else 0)
             | (lay.HAS_FINAL if output_state is not None else 0)
             | (lay.HAS_SIDX if state_indices is not None else 0)
             | (lay.SIDX64 if state_indices is not None and state_indices.dtype == torch.int64 else 0)
             | (lay.HAS_OIDX if output_state_indices is not None else 0)
             | (lay.OIDX64 if output_state_indices is not None and output_state_indices.dtype == torch.int64 else 0))

    def flat(t):  # the fp32 tensors (g, beta, the states)
        return dummy.view(torch.float32) if t is None else t.view(-1)

    def words(idx):  # an int32 view of an int32 / int64 index tensor (the kernel reads an int64's low word)
        return dummy if idx is None else idx.view(torch.int32)

    return (q, k, v, flat(g), flat(beta), words(cu_seqlens), output.view(-1), flat(initial_state), flat(output_state),
            words(state_indices), words(output_state_indices), cu_seqlens.shape[0] - 1, flags, float(scale))


def run(q, k, v, g, beta, scale: float, initial_state, cu_seqlens, output, output_state, state_indices,
        output_state_indices, gate_log: bool) -> None:
    """Launch on validated inputs, writing ``output`` and (when given) ``output_state``."""
    if q.shape[0] == 0:  # every sequence is empty (a tensor map cannot have extent 0): states pass through
        if output_state is not None:
            _pass_states(initial_state, output_state, state_indices, output_state_indices, cu_seqlens.shape[0] - 1)
        return
    for name, t in (("q", q), ("k", k), ("v", v), ("output", output)):
        checks.aligned(OP, name, t, 16)
    io = IO[q.dtype]
    fn = _FUNCTIONS.get((io, q.get_device()), lambda: {"io": io}, q.device)
    fn(*kernel_args(q, k, v, g, beta, scale, initial_state, cu_seqlens, output, output_state, state_indices,
                    output_state_indices, gate_log, _dummy(q.device)))


def _pass_states(initial_state, output_state, state_indices, output_state_indices, n):
    rows = torch.arange(n, device=output_state.device)
    src = rows if state_indices is None else state_indices.long()
    dst = src if output_state_indices is None else output_state_indices.long()
    for i in range(n):
        if int(dst[i]) >= 0:
            ok = initial_state is not None and int(src[i]) >= 0
            output_state[int(dst[i])] = initial_state[int(src[i])] if ok else 0
