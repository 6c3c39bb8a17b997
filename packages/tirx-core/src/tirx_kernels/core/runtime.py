# SPDX-License-Identifier: Apache-2.0
"""Load compiled kernels: bundle (``$TIRX_KERNELS_ARTIFACTS``) -> cache -> build where the compiler exists.

Needs only torch and apache-tvm-ffi at run time. The loaded function takes torch tensors (DLPack)
and launches on torch's current CUDA stream (tvm-ffi reads it per call), so CUDA-graph capture works.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading

from . import artifacts
from .arch import check_arch

_lock = threading.Lock()
_loaded: dict[tuple[str, str], object] = {}
_modules: list = []  # keep tvm-ffi modules alive for the life of the process


class ArtifactNotFoundError(RuntimeError):
    """No prebuilt artifact matches, and this machine cannot build one."""


def compiler_available() -> bool:
    return importlib.util.find_spec("tvm") is not None


def candidate_params(module, params: dict) -> list[dict]:
    """The artifacts that can serve a call whose preferred compile params are ``params``, best first: ``params``
    itself (a specialized artifact, e.g. rmsnorm at one hidden size), then the module's general artifact for it
    (``general_params(params)``, sizes as runtime arguments), when the module defines one and it differs."""
    out = [params]
    general = getattr(module, "general_params", None)
    if general is not None:
        g = general(dict(params))
        if g is not None and artifacts.canonical_params(g) != artifacts.canonical_params(params):
            out.append(g)
    return out


def artifact_location(module, params: dict) -> tuple[str, str]:
    """``(path of the .so, tvm-ffi function name)`` serving (module's kernel, params): the bundle's specialized
    artifact, else the bundle's general one (:func:`candidate_params`), else the cache, building it where the
    compiler exists."""
    name = module.KERNEL_META["name"]
    fp = artifacts.fingerprint(module)
    why = "TIRX_KERNELS_ARTIFACTS is not set"
    bundle = os.environ.get("TIRX_KERNELS_ARTIFACTS")
    if bundle:
        whys = []
        for cand in candidate_params(module, params):
            entry, w = artifacts.find_entry_in_bundle(bundle, name, cand, fp)
            if entry:
                return os.path.join(bundle, entry["file"]), entry["function"]
            whys.append(f"{artifacts.canonical_params(cand)}: {w}")
        why = "; ".join(whys)
    if not compiler_available():
        raise ArtifactNotFoundError(
            f"no artifact for kernel '{name}' with params {artifacts.canonical_params(params)} "
            f"(fingerprint {fp}): {why}, and apache-tvm is not installed to build one. On a machine with "
            f"apache-tvm and nvcc run: python -m tirx_kernels.build --kernel {name} --out DIR, then set "
            "TIRX_KERNELS_ARTIFACTS=DIR here")
    so, info = artifacts.build_cached(module, name, params)
    return so, info["function"]


def artifact_path(module, params: dict) -> str:
    """The ``.so`` holding (module's kernel, params) (:func:`artifact_location`)."""
    return artifact_location(module, params)[0]


_libs: dict[str, object] = {}


def get_function(module, params: dict, device=None):
    """The callable kernel for ``params`` (checks the arch of ``device``, default torch's current device; loads
    each ``.so`` once per process)."""
    check_arch(module.KERNEL_META, device)
    key = (module.__name__, artifacts.canonical_params(params))
    fn = _loaded.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _loaded.get(key)
        if fn is None:
            import tvm_ffi

            path, function = artifact_location(module, params)
            lib = _libs.get(path)
            if lib is None:
                lib = _libs[path] = tvm_ffi.load_module(path)
                _modules.append(lib)
            fn = lib[function]
            _loaded[key] = fn
    return fn


class FunctionCache:
    """A public op's hot path to its loaded kernels: ``key`` (a tuple of what picks the kernel — dtypes, the
    dims the params depend on, the device index) -> function. The first call per key runs ``params_of()`` and
    :func:`get_function` (arch check, params canonicalised, bundle lookup: ~15-25 us of host time); later calls
    are one dict lookup. Bounded: cleared when it holds ``max_entries`` keys (a GEMM's shapes are keys).
    ``bind(fn, params)``, where given, wraps the loaded function once per key (e.g. appending the scratch
    arguments the picked kernel takes: ``fp16_bf16_gemm``'s stream-K workspace)."""

    def __init__(self, module_name: str, max_entries: int = 4096, bind=None):
        self._module_name = module_name
        self._max = max_entries
        self._bind = bind
        self._fns: dict = {}

    def get(self, key: tuple, params_of, device=None):
        """``device``: the tensors' device, whose arch is checked on the first call per key (default: torch's
        current device); put its index in ``key``."""
        fn = self._fns.get(key)
        if fn is None:
            params = params_of()
            fn = get_function(sys.modules[self._module_name], params, device)
            if self._bind is not None:
                fn = self._bind(fn, params)
            if len(self._fns) >= self._max:
                self._fns.clear()
            self._fns[key] = fn
        return fn


def direct_call(*tensors) -> bool:
    """Whether a public op may run its kernel directly instead of through its ``torch.library`` custom op: eager
    mode (not traced by torch.compile / export), plain tensors or parameters (no fake, functional or subclass
    tensors; ``None`` entries are skipped), and nothing for autograd to record. Eager dispatch through the custom
    op costs more host time than a small kernel runs (H200 host, torch 2.11: ``gemm_nt`` 99-110 us per call, the
    tvm-ffi call itself 6 us; ``docs/measurements/2026-12-03f-h200/host-probe.log``); the custom op stays the
    path torch.compile sees, and the one autograd sees (it records no gradient: an error at backward, as
    before)."""
    import torch

    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            return False
        if grad and t.requires_grad:
            return False
    return True


def flat_view(t):
    """The 1-D view from ``t``'s first element over every element it addresses (strides >= 0): what kernels that
    index with explicit strides take. A contiguous tensor is flattened (1 us on the host against 4 us for the span
    and ``as_strided``, a dozen of them a decode call: 2026-12-07, tools/probes/decode_latency.py). An empty
    tensor gives an empty view (it addresses nothing)."""
    if t.is_contiguous() or not t.numel():
        return t.flatten()
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return t.as_strided((span,), (1,))


@contextlib.contextmanager
def autograd_inside_custom_op():
    """Record and differentiate with torch autograd inside a ``torch.library`` custom op's body.

    A custom op's body runs below the Autograd dispatch keys (they are in the thread's excluded set), so a graph
    built there is not recorded: ``torch.autograd.grad`` raises "element 0 of tensors does not require grad" even
    under ``torch.enable_grad()``. Eager calls take the direct path and never saw it; under torch.compile the op is
    the path (H100, 2026-12-07: ``cudnn_sm90_gdn2_bprop_f16`` under ``torch.compile(fullgraph=True)``). Inside, the
    backend Autograd keys are taken off the excluded set and grad mode is on; both are restored on exit."""
    import torch

    keys = torch._C.DispatchKey
    with torch._C._PreserveDispatchKeyGuard():
        for key in (keys.AutogradCPU, keys.AutogradCUDA, keys.AutogradOther, keys.AutogradFunctionality):
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
        with torch.enable_grad():
            yield


def run_direct(run, out, new_out):
    """A public op's direct call, once :func:`direct_call` allowed it: ``run(dst)`` writes the result into ``out``,
    or into ``new_out()`` when no ``out`` was given (the op's own allocation, the one its functional custom op
    makes); a given ``out`` is marked written (:func:`mark_written`). Returns what was written."""
    dst = new_out() if out is None else out
    run(dst)
    if out is not None:
        mark_written(out)
    return dst


def mark_written(out) -> None:
    """Bump ``out``'s version counter after a direct call wrote it, as the custom op's in-place dispatch does (so
    autograd still detects an overwritten saved tensor). Inference tensors have no version counter."""
    import torch

    if not out.is_inference():
        torch.autograd.graph.increment_version(out)


class LaunchPlans:
    """A public op's host path memoized per call signature.

    Validation, normalization and argument building of a decode-sized op are hundreds of Python calls: Mamba's
    selective_state_update spent 156 us of host work a call on the H100 host against an 8.6 us kernel at batch 1
    (2026-12-07e), so an eager decode step was host-bound. All they decide is a function of the arguments' metadata
    (shapes, strides, dtypes, devices, 16-byte alignment, which tensors share a start address) and the non-tensor
    arguments: :meth:`signature`. The first valid call of a signature records its launch (:meth:`record`: kernel,
    scalars, and for each pointer argument the argument it is a flat view of, or a constant stand-in); later calls
    :meth:`replay` it with flat views of their own tensors. A signature is None (never memoized) for empty tensors
    (they may share addresses) and tensor subclasses; a launch whose pointer is no view of an argument's start is not
    recorded. Only eager direct calls should use it (torch.compile traces the op's custom op instead)."""

    def __init__(self, limit: int = 512):
        self._plans: dict = {}
        self.limit = limit  # signatures kept (a serving process sees a handful: one per batch size and mode)

    def __len__(self) -> int:
        return len(self._plans)

    @staticmethod
    def signature(args: tuple, *extra):
        import torch

        sig, starts = list(extra), {}
        for i, a in enumerate(args):
            if type(a) is torch.Tensor:
                if a.numel() == 0:
                    return None
                p = a.data_ptr()
                sig.append((a.shape, a.stride(), a.dtype, a.get_device(), p % 16, starts.setdefault(p, i)))
            elif isinstance(a, torch.Tensor):
                return None
            else:
                sig.append(a)
        return tuple(sig)

    def get(self, key):
        return None if key is None else self._plans.get(key)

    def record(self, key, fn, pointers, scalars, args: tuple, constants=()):
        """Memoize the launch ``fn(*pointers, *scalars)`` of the call on ``args`` under ``key``; returns the plan, or
        None where a pointer is neither a 1-D view from an argument's start nor one of ``constants``."""
        if key is None:
            return None
        import torch

        by_start = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                by_start.setdefault(a.data_ptr(), i)
        recipe = []
        for p in pointers:
            if any(p is c for c in constants):
                recipe.append((None, 0, None, False, p))
                continue
            i = by_start.get(p.data_ptr())
            if i is None or p.dim() != 1:
                return None
            a = args[i]
            nbytes = p.numel() * p.element_size()
            if nbytes % a.element_size():
                return None
            elems = nbytes // a.element_size()
            recipe.append((i, elems, p.dtype, a.is_contiguous() and a.numel() == elems, None))
        if len(self._plans) >= self.limit:
            self._plans.clear()
        plan = self._plans[key] = (fn, tuple(recipe), tuple(scalars))
        return plan

    @staticmethod
    def replay(plan, args: tuple) -> None:
        fn, recipe, scalars = plan
        ptrs = []
        for i, elems, dtype, flat, constant in recipe:
            if constant is not None:
                ptrs.append(constant)
                continue
            a = args[i]
            v = a.view(-1) if flat else a.as_strided((elems,), (1,))
            ptrs.append(v if v.dtype == dtype else v.view(dtype))
        fn(*ptrs, *scalars)


class StreamWorkspace:
    """Scratch memory an op's kernels reuse across calls (stream-K partials and flags): one set per (device,
    stream), so kernels running concurrently on two streams never share it. ``get`` returns a float32 buffer of at
    least ``floats`` elements (contents undefined between calls) and ``n_flags`` int32 flags, zeroed once at
    allocation, that every kernel using them leaves zeroed (``core.lang.grid_flags``: the one reader of a flag puts
    it back to 0), so a call costs no memset.

    CUDA-graph safe: a captured graph keeps the addresses it was captured with, so no buffer handed out is ever
    freed or reused for something else while the process lives. A set outgrown by a larger call is retired (kept
    alive, never handed out again), sizes round up to powers of two so a stream retires at most ~30 buffers, and
    the per-stream table is unbounded (one small entry per stream that ever ran a stream-K call)."""

    def __init__(self, n_flags: int):
        self._n_flags = n_flags
        self._sets: dict = {}
        self._retired: list = []

    def get(self, device, floats: int):
        import torch

        key = (device.index, torch.cuda.current_stream(device).cuda_stream)
        ws, flags = self._sets.get(key, (None, None))
        if ws is None or ws.numel() < floats:
            if ws is not None:
                self._retired.append(ws)
            ws = torch.empty(1 << max(floats - 1, 0).bit_length(), dtype=torch.float32, device=device)
            if flags is None:
                flags = torch.zeros(self._n_flags, dtype=torch.int32, device=device)
            self._sets[key] = (ws, flags)
        return ws, flags
