# SPDX-License-Identifier: Apache-2.0
"""16-byte global vector access and packed 16-bit float <-> fp32 conversion for ``@T.prim_func`` bodies.

Memory-bound kernels keep data as packed ``uint32`` words in ``T.alloc_local`` buffers: one 16-byte vector
is 4 words = 8 bf16/fp16 values, moved with one ``LDG.E.128`` / ``STG.E.128``. The helpers are plain
Python run while the prim_func is parsed: statements go through ``T.evaluate`` (a bare ``T.ptx.*`` call in
a helper is dropped), expressions are returned. Python-level arguments (``dtype``, ``pred=None``) choose
the code at parse time, so a kernel can unroll with ``for v in range(n)`` inside a helper and predicate
only the vectors that can fall past the end of a row.
"""

from __future__ import annotations

from tvm.script import tirx as T

from . import tma

VECTOR_BYTES = 16
WORDS_PER_VECTOR = 4  # uint32 words per 16-byte vector

_ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def ceil_div(a, b):
    """``ceil(a / b)`` for Python ints (static shapes) and non-negative TIR expressions alike."""
    return (a + b - 1) // b


def elem_bytes(dtype: str) -> int:
    if dtype not in _ELEM_BYTES:
        raise ValueError(f"vector: unsupported dtype {dtype!r}; expected one of {sorted(_ELEM_BYTES)}")
    return _ELEM_BYTES[dtype]


def vector_elems(dtype: str) -> int:
    """Elements per 16-byte vector: 8 for bf16/fp16."""
    return VECTOR_BYTES // elem_bytes(dtype)


def _guarded(call, pred):
    if pred is None:
        T.evaluate(call)
    else:
        with T.If(pred):
            with T.Then():
                T.evaluate(call)


# Cache qualifiers of a 16-byte global load (``load_v4(..., cache=...)``): the PTX text between
# ``ld.global`` and ``.v4.b32``. "stream" (L1::no_allocate) is what streaming kernels used first; the
# others are sweep candidates (tools/sweep_variants.py) measured against it on the H200.
LOAD_CACHE = {
    "default": "",
    "stream": ".L1::no_allocate",
    "nc": ".nc",
    "nc_stream": ".nc.L1::no_allocate",
    "l2_256": ".L2::256B",
    "stream_l2_256": ".L1::no_allocate.L2::256B",
    "nc_stream_l2_256": ".nc.L1::no_allocate.L2::256B",
    "evict_first": ".L1::evict_first",
    "evict_last": ".L1::evict_last",
    "evict_unchanged": ".L1::evict_unchanged",
    "cg": ".cg",  # L2 only, never a (stale) L1 line: data another SM wrote during this launch
}

# What a 16-byte vector's four 32-bit registers hold (``load_v4`` / ``store_v4``): packed words, or fp32 values.
WORDS = {"uint32": "b32", "float32": "f32"}


def load_v4(regs, base, ptr, pred=None, *, l1_no_allocate: bool = False, cache: str | None = None, policy=None,
            dtype: str = "uint32"):
    """``regs[base:base+4] <- 16 bytes at ptr`` (``ld.global.v4.b32``; ``dtype="float32"``: ``.f32`` into fp32
    locals), only where ``pred`` holds.

    ``ptr`` must be 16-byte aligned (``X.ptr_to([...])``). Where ``pred`` is false the words keep their
    previous value: zero them first (``fill``) when they feed a reduction. ``l1_no_allocate`` streams data
    read once past L1 so that it does not evict data that is reused (e.g. the RMSNorm weight); ``cache``
    (a ``LOAD_CACHE`` name) overrides it with any of the qualifier sets there. ``policy``: an L2 cache
    policy (a ``uint64`` from :func:`l2_policy`) passed as the ``.L2::cache_hint`` operand.
    """
    if cache is None:
        cache = "stream" if l1_no_allocate else "default"
    if cache not in LOAD_CACHE:
        raise ValueError(f"vector.load_v4: cache {cache!r} is not one of {sorted(LOAD_CACHE)}")
    ops = [regs[base], regs[base + 1], regs[base + 2], regs[base + 3], ptr]
    hint = _cache_hint(ops, policy)
    _guarded(T.ptx[f"ld.global{LOAD_CACHE[cache]}{hint}.v4.{WORDS[dtype]}"](*ops), pred)


def _cache_hint(ops: list, policy) -> str:
    """The ``.L2::cache_hint`` qualifier, its policy operand appended to ``ops``, where ``policy`` is given."""
    if policy is None:
        return ""
    ops.append(policy)
    return ".L2::cache_hint"


# L2 eviction priorities of an ``l2_policy``: ``tma.create_policy``'s, named without the "L2::" level.
L2_PRIORITIES = tuple(p.removeprefix("L2::") for p in (tma.EVICT_FIRST, tma.EVICT_LAST, tma.EVICT_NORMAL))


def l2_policy(policy, priority: str):
    """``policy`` (a ``uint64`` local element) <- an L2 cache policy giving every access made with it the
    eviction ``priority`` (one of ``L2_PRIORITIES``; ``tma.create_policy``); pass it as ``policy=`` to
    :func:`load_v4` / :func:`store_v4`."""
    if priority not in L2_PRIORITIES:
        raise ValueError(f"vector.l2_policy: priority {priority!r} is not one of {L2_PRIORITIES}")
    tma.create_policy(policy, f"L2::{priority}")


class AccessPolicies:
    """The L2 policies of a kernel's named accesses (``{"x": "evict_last", "store": None, ...}``; None: no
    ``.L2::cache_hint``): one ``createpolicy`` per hinted access into a ``uint64`` local array of ``count``
    slots (``pol = T.alloc_local((policies.count,), "uint64")``; at least one slot, so the array always exists)."""

    def __init__(self, kernel: str, policies: dict | None):
        self.policies = {k: v for k, v in (policies or {}).items() if v is not None}
        for name, priority in self.policies.items():
            if priority not in L2_PRIORITIES:
                raise ValueError(f"{kernel}: L2 policy of access {name!r}: {priority!r} is not one of {L2_PRIORITIES}")
        self.slots = {name: i for i, name in enumerate(sorted(self.policies))}
        self.count = max(1, len(self.slots))

    def create(self, pol):
        """``pol[slot]`` <- the policy of every hinted access (at the top of the kernel)."""
        for name, i in self.slots.items():
            l2_policy(pol[i], self.policies[name])

    def operand(self, pol, name: str):
        """The ``policy=`` operand of access ``name`` for :func:`load_v4` / :func:`store_v4`; None: no hint."""
        return pol[self.slots[name]] if name in self.slots else None


# Cache qualifiers of a 16-byte global store (``store_v4(..., cache=...)``); "cs" is st.global.cs
# (cache-streaming, evict-first), which lost 1-2 % on the H200 for rmsnorm and act_and_mul (sweep round 1).
STORE_CACHE = {
    "default": "",
    "cs": ".cs",
    "no_allocate": ".L1::no_allocate",
    "evict_first": ".L1::evict_first",
}


def store_v4(ptr, regs, base, pred=None, *, cache: str = "default", policy=None, dtype: str = "uint32"):
    """``16 bytes at ptr <- regs[base:base+4]`` (``st.global.v4.b32``; ``dtype="float32"``: ``.f32`` from fp32
    locals), only where ``pred`` holds.

    ``cache`` is a ``STORE_CACHE`` name (the qualifiers after ``st.global``); ``policy`` an L2 cache policy
    (:func:`l2_policy`) passed as the ``.L2::cache_hint`` operand.
    """
    if cache not in STORE_CACHE:
        raise ValueError(f"vector.store_v4: cache {cache!r} is not one of {sorted(STORE_CACHE)}")
    ops = [ptr, regs[base], regs[base + 1], regs[base + 2], regs[base + 3]]
    hint = _cache_hint(ops, policy)
    _guarded(T.ptx[f"st.global{STORE_CACHE[cache]}{hint}.v4.{WORDS[dtype]}"](*ops), pred)


def load_shared_v4(regs, base, smem_ptr, pred=None):
    """``regs[base:base+4] <- 16 bytes of shared memory`` (``ld.shared.v4.b32``, SASS ``LDS.128``), only
    where ``pred`` holds. A warp reading 32 consecutive 16-byte vectors is conflict-free (4 wavefronts)."""
    _guarded(T.ptx.ld.shared.v4.b32(regs[base], regs[base + 1], regs[base + 2], regs[base + 3], smem_ptr), pred)


def store_shared_v4(smem_ptr, regs, base, pred=None):
    """``16 bytes of shared memory <- regs[base:base+4]`` (``st.shared.v4.b32``, SASS ``STS.128``)."""
    _guarded(T.ptx.st.shared.v4.b32(smem_ptr, regs[base], regs[base + 1], regs[base + 2], regs[base + 3]), pred)


def copy(dst, src, count, dst_base=0, src_base=0):
    """``dst[dst_base:+count] = src[src_base:+count]`` (register moves between local word buffers)."""
    for i in range(count):
        T.buffer_store(dst, src[src_base + i], [dst_base + i])


def fill(regs, base, count, value=0):
    """``regs[base:base+count] = value`` (uint32 words)."""
    for i in range(count):
        T.buffer_store(regs, T.uint32(value), [base + i])


def unpack2(word, dtype: str):
    """The two fp32 values (low half, high half) of a packed 32-bit word of two bf16 or fp16."""
    if dtype == "bfloat16":
        # bf16 is the top half of an fp32: a shift / a mask, no conversion instruction.
        return (T.cuda.uint_as_float(word << T.uint32(16)),
                T.cuda.uint_as_float(word & T.uint32(0xFFFF0000)))
    if dtype == "float16":
        # nvcc turns the reinterpret of a 16-bit register into one HADD2.F32 per half.
        return (T.Cast("float32", T.reinterpret("float16", T.Cast("uint16", word))),
                T.Cast("float32", T.reinterpret("float16", T.Cast("uint16", word >> T.uint32(16)))))
    raise ValueError(f"vector.unpack2: dtype must be 'bfloat16' or 'float16', got {dtype!r}")


def pack2(regs, idx, lo, hi, dtype: str):
    """``regs[idx] <- (lo, hi)`` rounded to nearest-even bf16/fp16 (one ``cvt.rn.{bf16x2,f16x2}.f32``).

    ``lo`` lands in the low half (the lower address), as ``unpack2`` reads it.
    """
    if dtype == "bfloat16":
        T.evaluate(T.ptx.cvt.rn.bf16x2.f32(regs[idx], hi, lo))
    elif dtype == "float16":
        T.evaluate(T.ptx.cvt.rn.f16x2.f32(regs[idx], hi, lo))
    else:
        raise ValueError(f"vector.pack2: dtype must be 'bfloat16' or 'float16', got {dtype!r}")


def after_all(regs, count, opaque_zero):
    """A uint32 that is 0 at run time but depends on every word ``regs[0:count]`` (OR-ed, AND-ed with
    ``opaque_zero``, a kernel argument the host passes as 0).

    XOR it into each word before use and no math can start before every load into ``regs`` has been
    issued. ptxas otherwise schedules for registers: in an elementwise kernel (act_and_mul, 8 loads a
    thread) it issued 3 loads, ran the first vector's math, which waits for DRAM, and only then issued
    the rest (SASS), so a thread had ~3 loads in flight instead of 8. One word per 16-byte vector suffices.
    """
    acc = regs[0]
    for i in range(WORDS_PER_VECTOR, count, WORDS_PER_VECTOR):
        acc = acc | regs[i]
    return acc & T.Cast("uint32", opaque_zero)
