# SPDX-License-Identifier: Apache-2.0
"""Run a TIRx kernel's generated CUDA on the CPU, for checks of index arithmetic, predicates and alignment on a
machine without a GPU.

API (stable: other kernels' tests use it)::

    from tirx_kernels.core import emulate

    kern = emulate.compile(func)            # a TIRx PrimFunc, or generated CUDA source (str); name= picks a kernel
    rep = kern(x, w, out, H, M, 1e-6, grid=(M,), block=(128,))   # the kernel's arguments, in its order
    rep = kern(grid=(M,), block=(128,), X_ptr=x, ...)        # or by the generated parameter names (kern.params)
    rep.check()                              # raises EmulationError unless the run was clean
    # or in one call: emulate.launch(func, args, grid=..., block=...) -> Report

Arguments: a CPU ``torch.Tensor`` (or numpy array) for each pointer parameter -- the kernel gets the address of
the tensor's first element, and its whole storage is the allocation (views at offsets or with padding behave as on
the GPU; tensors sharing a storage share one allocation; an allocation is rounded up to 16 bytes, as on the GPU,
where an aligned vector holding one valid byte stays inside it); Python ints / floats for scalar parameters,
converted to the parameter's C type. The storages are written back after the run (results land in the tensors).

What it does: cuts the ``extern "C" __global__`` definition out of the CUDA, compiles it with g++ (C++20,
AddressSanitizer) after ``cuda_cpu.h`` (stand-ins for the CUDA builtins and the TIRx PTX wrappers row kernels
call: 16-byte vector ld/st with any cache hint, shuffles, warp reductions, __syncthreads, shared memory, bf16/f16
conversions; PDL and L2 cache policies as no-ops), and runs it: CTAs one after another, one host thread per CUDA
thread. Each allocation is a buffer of its size rounded up to 16 bytes, so AddressSanitizer reports any access past
that (scalar or vector, read or write, before or after); a write into the round-up is reported (``past_end``), and
16-byte accesses are checked for 16-byte alignment.

Hopper kernels (wgmma, TMA, mbarriers, clusters): the *module path* runs a whole generated module, host function
included, so a built kernel needs no extra input::

    mod = emulate.compile_module(func)      # a TIRx PrimFunc, or build.codegen(func)'s source
    rep = mod(a, b, c)                       # the tvm-ffi function's arguments: CPU tensors, ints, floats
    rep.check()                              # or emulate.run(func, a, b, c, hang_timeout=30.0)
    mods = emulate.compile_module(build.codegen_many({"f": f, "g": g}))   # one compile for several functions:
    mods(x, y, function="g")                 # ``function=`` picks one (default: main, else the first listed)

The module's own host code runs (``host_cpu.h``): its argument checks (a tensor arrives as a CUDA DLTensor with the
tensor's shape and strides), its ``cuTensorMapEncodeTiled`` calls (which fill the 128-byte ``CUtensorMap`` with
the map's address, dims, byte strides, box, element size, swizzle and OOB fill; the driver's argument rules are
checked) and its launch (grid, block, dynamic shared memory against the 227 KB / cudaFuncSetAttribute limits,
the cluster dimension attribute). Then (``hopper_cpu.h``): the CTAs of one cluster run at once, one host thread
per CUDA thread, clusters one after another, so a grid whose CTAs wait for each other across clusters (stream-K
flags) cannot run. Each CTA has its own shared memory, exactly the launch's size under AddressSanitizer, filled
with 0xa5 garbage, static ``__shared__`` first at shared address 0x400 and the dynamic part after it as on the GPU.
PTX wrappers of the generated source become stand-ins by instruction text; modelled:

- wgmma.mma_async m64nNkK, f32 accumulators, SS and RS (A fragments gathered from the warpgroup at issue),
  bf16 / f16 / tf32 (low 13 mantissa bits dropped) / e4m3 / e5m2 (exact decode), the transpose (MN-major)
  immediates, scale-a/b, scale-d; descriptors decoded as the PTX ISA defines them (start address, LBO, SBO, layout
  type none / 32B / 64B / 128B; base_offset ignored: tiles sit on their swizzle repeat). Products summed in double
  and added to the f32 accumulator per instruction: compare with a tolerance, not bitwise. A wgmma is one
  warpgroup-wide operation: the k-th wgmma each of the 128 threads issues is one instruction, recorded at issue
  (accumulator addresses, RS registers) and computed for the whole warpgroup by the first thread whose
  ``wgmma.wait_group`` retires its group (commit_group groups them), from the shared memory of that moment (it
  waits, if need be, for the rest of the warpgroup to issue it). So one thread may give a stage back right after its
  wait (as on the GPU), while a stage released *before* the wait, or accumulators read before it, give wrong values
  here as they may there. Operands that differ across the warpgroup, or a thread returning with unretired wgmma, are
  faults.
- cp.async.bulk.tensor 1-5D tiled loads (OOB elements zero-filled, or NaN with the NaN fill; 16-byte chunks
  swizzled by the shared address; ``.multicast::cluster`` into every CTA of the mask, complete_tx on the mbarrier at
  the same offset in each) and stores (clipped to the tensor), both whole at issue; bulk commit/wait_group no-ops.
- mbarrier init / arrive (local, remote through ``mapa``) / arrive.expect_tx / complete_tx / parity wait: phase,
  pending arrivals and a signed tx-count per barrier; more arrivals than expected, or a barrier used before its
  init, is a fault.
- 1-D cp.async.bulk loads (complete_tx) and stores; ldmatrix / stmatrix m8n8 x1/x2/x4 (.trans) .b16 (warp
  collectives through the shuffle exchange); ld/st.shared.v4, ld.shared::cluster.v4 (a mapa address reads the peer).
- global atomics: red.global.add (f32 scalar / .v2 / .v4, s32, u32), the bulk reduction cp.reduce.async.bulk
  .add.f32 (whole at issue), 32-bit flags (ld.acquire / ld.relaxed, st.relaxed / st.release), all sequentially
  consistent; a flag chain completes where each CTA waits only for CTAs of a lower index (they ran before it).
- bar.sync / bar.arrive named barriers with thread counts, __syncthreads (exited threads drop out),
  barrier.cluster arrive/wait, %cluster_ctarank; fences, setmaxnreg, griddepcontrol, prefetches as no-ops.

Not modelled (a wrapper whose PTX has no stand-in faults naming it; add one to ``hopper_cpu.h`` or a pattern to
``_module.py``'s ``_standin``): wgmma with f16 accumulators or integer inputs, im2col / interleaved tensor maps,
element strides, TMA tensor reductions, mbarrier try_wait with a time limit, elect.sync in a partial warp (it elects
lane 0: every lane of a warp counts as active), a CTA waiting for a flag of a CTA with a higher index (the clusters
run one after another: stream-K's partial-tile handshake cannot complete), memory-model ordering (every
stand-in is sequentially consistent, so a missing fence is not caught), timing (a kernel is correct here in one
interleaving of its threads, not in all).

Outcomes: ``Report.ok`` as above; ``rc 88`` a fault (``EMU fault ...`` in ``stderr``: a shared address outside the
CTA, a misaligned TMA box, a PTX wrapper with no stand-in -- named with its instruction); ``rc 3`` the host function
raised (its message in ``stderr``); ``Report.hang``: no thread made progress for ``hang_timeout`` seconds while some
waited -- every waiter prints what it waits for (mbarrier address, parity, pending arrivals, tx-count).
Cost: a 384-thread persistent GEMM of 300 x 520 x 136 (15 CTAs) runs in about a second after a ~20 s compile.

Limits: a builtin without a stand-in fails the compile (add it to cuda_cpu.h); the device code must be host-
compilable C++ (no inline asm outside the wrappers); float math is the host's (the kernel's fp32 expressions, but
no FMA contraction and libm's tanhf/expf for the approximate PTX ones: compare with a tolerance). Executables are
cached by source under ``$TIRX_EMULATE_CACHE`` (default ``~/.cache/tirx_kernels/emulate``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

HEADER = Path(__file__).with_name("cuda_cpu.h")
CXXFLAGS = ["-std=c++20", "-O1", "-fno-strict-aliasing", "-pthread", "-w", "-fsanitize=address",
            "-fno-omit-frame-pointer"]
_INT_TYPES = {"int", "int32_t", "uint", "unsigned", "unsigned int", "uint32_t", "int64_t", "uint64_t", "long",
              "long long", "bool", "short", "ushort", "char", "uchar"}
_FLOAT_TYPES = {"float", "double"}
_DEF = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)\s*\{')


class EmulationError(AssertionError):
    """The emulated run was not clean (an out-of-bounds or misaligned access, a crash, a timeout)."""


@dataclasses.dataclass
class Report:
    returncode: int
    misaligned: int  # 16-byte accesses off 16 bytes
    past_end: int  # bytes written in an allocation's round-up to 16 bytes (outside the tensor's storage)
    asan: str  # AddressSanitizer's report ('' when none)
    stderr: str
    hang: bool = False  # the module path's hang detector ended the run (no thread made progress)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.misaligned and not self.past_end and not self.asan

    def check(self) -> Report:
        if not self.ok:
            raise EmulationError(f"emulated kernel failed (rc {self.returncode}{', hang' if self.hang else ''}, "
                                 f"{self.misaligned} misaligned, "
                                 f"{self.past_end} written past the end):\n"
                                 + (self.asan or self.stderr)[-4000:])
        return self


@dataclasses.dataclass
class _Param:
    ctype: str
    name: str
    pointer: bool


def kernel_source(source: str, name: str | None = None) -> tuple[str, list[_Param], str]:
    """The (name, parameters, host-compilable definition) of a ``__global__`` kernel in generated CUDA."""
    defs = [m for m in _DEF.finditer(source)]
    if name is not None:
        defs = [m for m in defs if m.group(1) == name]
    names = sorted({m.group(1) for m in defs})
    if len(names) != 1:
        raise ValueError(f"expected one kernel definition{f' named {name}' if name else ''}, found {names}")
    m = defs[0]
    end = source.index("\n}\n", m.start()) + 3
    body = source[m.start():end]
    # Shared memory: one static per kernel, shared by the CTA's host threads (CTAs run one after another).
    body = re.sub(r"extern __shared__ (alignas\(\d+\) )?(\w+) (\w+)\[\];", r"\1static \2 \3[1 << 18];", body)
    body = re.sub(r"__shared__ (alignas\(\d+\) )", r"\1static ", body).replace("__shared__", "static")
    params = []
    for p in filter(None, (s.strip() for s in m.group(2).split(","))):
        decl = p.replace("__restrict__", " ")
        pname = re.findall(r"\w+", decl)[-1]
        ctype = " ".join(decl[:decl.rindex(pname)].split())
        params.append(_Param(ctype, pname, "*" in ctype))
    return m.group(1), params, body


def _driver(name: str, params: list[_Param]) -> str:
    args = []
    for i, p in enumerate(params):
        if p.pointer:
            args.append(f"({p.ctype})slot_ptr[{i}]")
        elif p.ctype in _FLOAT_TYPES:
            args.append(f"({p.ctype})slot_f[{i}]")
        elif p.ctype in _INT_TYPES:
            args.append(f"({p.ctype})slot_i[{i}]")
        else:
            raise ValueError(f"kernel {name}: parameter {p.name} of type {p.ctype!r} is not emulated")
    n = max(1, len(params))
    return f"""
#include <thread>
#include <vector>
static char* slot_ptr[{n}]; static int64_t slot_i[{n}]; static double slot_f[{n}];
static void emu_kernel() {{ {name}({", ".join(args)}); }}
static int64_t rd(FILE* f) {{ int64_t v; if (fread(&v, 8, 1, f) != 1) abort(); return v; }}
int main(int argc, char** argv) {{
  FILE* in = fopen(argv[1], "rb");
  int64_t g[3], b[3];
  for (auto& v : g) v = rd(in);
  for (auto& v : b) v = rd(in);
  int64_t nargs = rd(in), nbufs = rd(in);
  std::vector<char*> bufs(nbufs); std::vector<int64_t> sizes(nbufs);
  for (int64_t k = 0; k < nbufs; ++k) {{
    sizes[k] = rd(in);
    // Rounded up to 16 bytes as on the GPU (an aligned vector holding a valid byte stays in the allocation); the
    // round-up is poisoned and checked after the run.
    int64_t cap = std::max<int64_t>(16, (sizes[k] + 15) / 16 * 16);
    if (posix_memalign((void**)&bufs[k], 256, cap)) abort();
    if (fread(bufs[k], 1, sizes[k], in) != (size_t)sizes[k]) abort();
    memset(bufs[k] + sizes[k], 0xa5, cap - sizes[k]);
  }}
  for (int64_t i = 0; i < nargs; ++i) {{
    int64_t kind = rd(in), a = rd(in), c = rd(in);
    if (kind == 0) slot_ptr[i] = bufs[a] + c;
    else if (kind == 1) slot_i[i] = a;
    else memcpy(&slot_f[i], &a, 8);
  }}
  fclose(in);
  gridDim = {{(unsigned)g[0], (unsigned)g[1], (unsigned)g[2]}};
  blockDim = {{(unsigned)b[0], (unsigned)b[1], (unsigned)b[2]}};
  int nthreads = (int)(b[0] * b[1] * b[2]), nwarps = (nthreads + 31) / 32;
  for (unsigned bz = 0; bz < gridDim.z; ++bz) for (unsigned by = 0; by < gridDim.y; ++by)
  for (unsigned bx = 0; bx < gridDim.x; ++bx) {{
    std::barrier<> cta_bar(nthreads);
    std::barrier<>* warp_bar = static_cast<std::barrier<>*>(::operator new[](sizeof(std::barrier<>) * nwarps));
    for (int w = 0; w < nwarps; ++w) new (&warp_bar[w]) std::barrier<>(std::min(32, nthreads - 32 * w));
    std::vector<uint64_t> slots(nthreads);
    std::vector<std::thread> ts;
    for (int t = 0; t < nthreads; ++t)
      ts.emplace_back([=, &cta_bar, &slots] {{
        emu_cta_bar = &cta_bar;
        emu_warp_bar = warp_bar;
        emu_warp_slots = slots.data();
        blockIdx = {{bx, by, bz}};
        threadIdx = {{(unsigned)(t % b[0]), (unsigned)(t / b[0] % b[1]), (unsigned)(t / (b[0] * b[1]))}};
        emu_kernel();
        emu_warp_bar[t >> 5].arrive_and_drop();  // a returned thread holds no barrier
        emu_cta_bar->arrive_and_drop();
      }});
    for (auto& th : ts) th.join();
    for (int w = 0; w < nwarps; ++w) warp_bar[w].~barrier();
    ::operator delete[](warp_bar);
  }}
  long past_end = 0;
  for (int64_t k = 0; k < nbufs; ++k)
    for (int64_t i = sizes[k]; i < (sizes[k] + 15) / 16 * 16; ++i)
      if ((uchar)bufs[k][i] != 0xa5 && past_end++ < 8)
        fprintf(stderr, "EMU write past the end of buffer %ld\\n", (long)k);
  FILE* out = fopen(argv[2], "wb");
  for (int64_t k = 0; k < nbufs; ++k) fwrite(bufs[k], 1, sizes[k], out);
  fclose(out);
  fprintf(stderr, "EMU done misaligned=%ld past_end=%ld\\n", (long)emu_misaligned.load(), past_end);
  return 0;
}}
"""


def _cache_dir() -> Path:
    return Path(os.environ.get("TIRX_EMULATE_CACHE", Path.home() / ".cache" / "tirx_kernels" / "emulate"))


class Kernel:
    """A kernel compiled for the CPU; call it with the kernel's arguments and ``grid=`` / ``block=``."""

    def __init__(self, name: str, params: list[_Param], exe: Path):
        self.name, self.params, self.exe = name, params, exe

    def __call__(self, *args, grid, block, timeout: float = 600, **named) -> Report:
        import torch

        if named:
            if args:
                raise TypeError(f"{self.name}: arguments by position or by name, not both")
            missing = [p.name for p in self.params if p.name not in named]
            extra = sorted(set(named) - {p.name for p in self.params})
            if missing or extra:
                raise TypeError(f"{self.name}: missing {missing}, unknown {extra}; parameters "
                                f"{[p.name for p in self.params]}")
            args = tuple(named[p.name] for p in self.params)
        if len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        if not 1 <= block[0] * block[1] * block[2] <= 1024:
            raise ValueError(f"block {block}: 1..1024 threads")
        storages, slots = {}, []  # storage data_ptr -> (index, uint8 view of the whole storage)
        for p, a in zip(self.params, args):
            if p.pointer:
                t = torch.from_numpy(a) if not isinstance(a, torch.Tensor) else a
                if t.device.type != "cpu":
                    raise ValueError(f"argument {p.name}: a CPU tensor, got {t.device}")
                st = t.untyped_storage()
                if st.data_ptr() not in storages:
                    whole = torch.empty(0, dtype=torch.uint8).set_(st, 0, (st.nbytes(),))
                    storages[st.data_ptr()] = (len(storages), whole)
                slots.append((0, storages[st.data_ptr()][0], t.storage_offset() * t.element_size()))
            elif p.ctype in _FLOAT_TYPES:
                slots.append((2, struct.unpack("<q", struct.pack("<d", float(a)))[0], 0))
            else:
                slots.append((1, int(a), 0))
        bufs = [whole for _, whole in sorted(storages.values(), key=lambda e: e[0])]
        with tempfile.TemporaryDirectory(prefix="tirx_emu_") as tmp:
            inp, outp = Path(tmp) / "in", Path(tmp) / "out"
            with open(inp, "wb") as f:
                f.write(struct.pack("<8q", *grid, *block, len(slots), len(bufs)))
                for whole in bufs:
                    f.write(struct.pack("<q", whole.numel()))
                    f.write(whole.numpy().tobytes())
                for s in slots:
                    f.write(struct.pack("<3q", *s))
            env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}
            try:
                run = subprocess.run([str(self.exe), str(inp), str(outp)], capture_output=True, text=True,
                                     timeout=timeout, env=env)
            except subprocess.TimeoutExpired as e:
                raise EmulationError(f"{self.name}: no result in {timeout} s (a barrier not every thread reaches?)") \
                    from e
            if run.returncode == 0:
                data = outp.read_bytes()
                pos = 0
                for whole in bufs:
                    n = whole.numel()
                    whole.copy_(torch.frombuffer(bytearray(data[pos:pos + n]), dtype=torch.uint8))
                    pos += n
        asan = run.stderr[run.stderr.find("==ERROR: AddressSanitizer"):] if "AddressSanitizer" in run.stderr else ""
        done = re.search(r"EMU done misaligned=(\d+) past_end=(\d+)", run.stderr)
        misaligned = int(done.group(1)) if done else len(re.findall("EMU misaligned", run.stderr))
        return Report(run.returncode, misaligned, int(done.group(2)) if done else 0, asan, run.stderr)


def compile(func_or_source, name: str | None = None) -> Kernel:  # noqa: A001 - the module's verb
    """Compile a kernel (a TIRx PrimFunc or its generated CUDA) for the CPU; cached by source."""
    source = func_or_source
    if not isinstance(source, str):
        from tirx_kernels.core import build

        source = build.codegen(func_or_source)
    kname, params, body = kernel_source(source, name)
    gxx = shutil.which(os.environ.get("CXX", "g++"))
    if gxx is None:
        raise RuntimeError("tirx_kernels.core.emulate needs g++ (C++20, AddressSanitizer)")
    text = f'#include "{HEADER}"\n{body}\n{_driver(kname, params)}'
    key = hashlib.sha256((text + HEADER.read_text() + " ".join(CXXFLAGS)).encode()).hexdigest()[:20]
    exe = _cache_dir() / f"{kname}-{key}"
    if not exe.exists():
        exe.parent.mkdir(parents=True, exist_ok=True)
        src = exe.with_suffix(".cpp")
        src.write_text(text)
        tmp = exe.with_name(exe.name + f".{os.getpid()}.tmp")
        res = subprocess.run([gxx, *CXXFLAGS, "-o", str(tmp), str(src)], capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"emulate: g++ failed for {kname} (a builtin without a stand-in in cuda_cpu.h?):\n"
                               + res.stderr[-4000:])
        os.replace(tmp, exe)  # atomic: parallel test workers may compile the same kernel
    return Kernel(kname, params, exe)


def launch(func_or_source, args, *, grid, block, name: str | None = None, timeout: float = 600) -> Report:
    """``compile(func_or_source, name)(*args, grid=grid, block=block)``."""
    return compile(func_or_source, name)(*args, grid=grid, block=block, timeout=timeout)


def compile_module(func_or_source):
    """Compile a whole generated module (a TIRx PrimFunc or ``build.codegen``'s source: device kernels and the
    tvm-ffi host function) for the CPU; call the result with the function's arguments. Cached by source."""
    from tirx_kernels.core.emulate import _module

    return _module.compile_module(func_or_source, CXXFLAGS)


def run(func_or_source, *args, timeout: float = 600, hang_timeout: float = 30.0, function: str | None = None) \
        -> Report:
    """``compile_module(func_or_source)(*args, timeout=..., hang_timeout=..., function=...)``."""
    return compile_module(func_or_source)(*args, timeout=timeout, hang_timeout=hang_timeout, function=function)
