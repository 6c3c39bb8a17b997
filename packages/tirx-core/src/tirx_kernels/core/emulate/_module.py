# SPDX-License-Identifier: Apache-2.0
"""The module path of ``tirx_kernels.core.emulate``: a whole generated TIRx module (device kernels + tvm-ffi host
function) compiled for the CPU with ``cuda_cpu.h`` + ``hopper_cpu.h`` + ``host_cpu.h`` and called like the
``tvm_ffi`` function it would be on the GPU. The documentation is the package docstring (``emulate/__init__.py``).

Source rewriting done here: each kernel's shared memory becomes per-CTA (static ``__shared__`` declarations a struct
at the start of the CTA's shared window, ``extern __shared__`` the dynamic part after it, as the GPU lays them out);
each PTX wrapper the generated source defines and the headers do not is replaced by a stand-in made from its
instruction text (wgmma.mma_async, cp.async.bulk.tensor loads / stores / prefetches, hints and fences), or by one
that fails the run naming the instruction; the host function is kept whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
HEADERS = [HERE / "cuda_cpu.h", HERE / "hopper_cpu.h", HERE / "host_cpu.h"]
_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)\s*\{')
_WRAPPER = re.compile(r"^(?:static )?(?:inline )?__forceinline__ __device__ ([\w ]+?[\s\*&]+)(\w+)\(([^)]*)\)\s*\{",
                      re.M)
_ASM = re.compile(r'asm(?: volatile)?\s*\(\s*"((?:[^"\\]|\\.)*)"')
_STATIC_SMEM = re.compile(r"__shared__\s+(?:(?:alignas|__align__)\((\d+)\)\s+)?([\w:]+)\s+(\w+)((?:\[\d+\])*);")
_EXTERN_SMEM = re.compile(r"extern __shared__\s+(?:(?:alignas|__align__)\((\d+)\)\s+)?([\w:]+)\s+(\w+)\[\];")
_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.(\w+)\.(\w+)\.(\w+)")
_TYPES = {"bf16": "EMU_BF16", "f16": "EMU_F16", "tf32": "EMU_TF32", "e4m3": "EMU_E4M3", "e5m2": "EMU_E5M2"}
# instructions with no effect to model on the CPU (no outputs): register reallocation, fences (every stand-in is
# sequentially consistent), PDL, prefetches, bulk-group bookkeeping (loads and stores complete at issue)
_NOOPS = ("setmaxnreg.", "fence.", "griddepcontrol.", "prefetch.", "cp.async.bulk.prefetch.",
          "cp.async.bulk.commit_group", "cp.async.bulk.wait_group", "wgmma.fence")
EXIT_HANG, EXIT_FAULT = 86, 88
# global atomics: red.add (scalar / .v2 / .v4; any .sem / .scope, L2 hint operand ignored), 32-bit flag ld / st
_RED = re.compile(r"red(?:\.relaxed|\.release)?(?:\.cta|\.cluster|\.gpu|\.sys)?(?:\.global)?\.add"
                  r"(?:\.L2::cache_hint)?(?:\.(v2|v4))?\.(f32|s32|u32) ")
_ATOMIC_TYPES = {"f32": "float", "s32": "int32_t", "u32": "uint32_t"}
_LD_FLAG = re.compile(r"ld\.(?:acquire|relaxed|volatile)(?:\.cta|\.cluster|\.gpu|\.sys)?\.global\.[bsu]32 ")
_ST_FLAG = re.compile(r"st\.(?:release|relaxed|volatile)(?:\.cta|\.cluster|\.gpu|\.sys)?\.global\.[bsu]32 ")


def _params(text: str) -> list[tuple[str, str]]:
    """(type, name) of each parameter of a C parameter list."""
    out = []
    for p in filter(None, (s.strip() for s in text.split(","))):
        name = re.findall(r"\w+", p)[-1]
        out.append((p[:p.rindex(name)].strip(), name))
    return out


def _standin(name: str, params_text: str, asm: str) -> str:
    """A C++ definition of wrapper ``name`` from its PTX text; one that faults naming the instruction if none."""
    params = _params(params_text)
    names = [n for _, n in params]
    head = f"static inline void {name}({params_text})"
    m = _WGMMA.search(asm)
    if m:
        n, k, dtype, ta, tb = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4), m.group(5)
        if dtype != "f32" or ta not in _TYPES or tb not in _TYPES:
            return f'{head} {{ emu_fault("wgmma with {dtype} accumulators / {ta} x {tb} is not emulated"); }}'
        nd = n // 2
        d, rest = names[:nd], names[nd:]
        rs = "_rs_" in name
        a_regs = rest[:4] if rs else []
        a_desc = "0" if rs else rest[0]
        bdesc, scale_d = (rest[4], rest[5]) if rs else (rest[1], rest[2])
        imms = [int(x) for x in re.findall(r"-?\d+", asm.split("wgmma.mma_async", 1)[1].split("ps0,", 1)[1])]
        scale_a, scale_b = imms[0], imms[1]
        tn = imms[2:] if not rs else [0, *imms[2:]]
        tn_a, tn_b = (tn + [0, 0])[:2]
        areg = f"uint32_t a_[4] = {{{', '.join(a_regs)}}};" if rs else "const uint32_t* a_ = nullptr;"
        return (f"{head} {{ float* d_[{nd}] = {{{', '.join('&' + x for x in d)}}}; {areg}\n"
                f"  emu_wgmma_issue(d_, {nd}, {n}, {k}, {_TYPES[ta]}, {_TYPES[tb]}, {str(rs).lower()}, {a_desc}, a_, "
                f"{bdesc}, {scale_d}, {scale_a}, {scale_b}, {tn_a}, {tn_b}); }}")
    m = re.match(r"cp\.async\.bulk\.tensor\.(\d)d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                 r"(\.multicast::cluster)?(\.L2::cache_hint)?", asm)
    if m:
        r = int(m.group(1))
        dst, tmap, coords, mbar = names[0], names[1], names[2:2 + r], names[2 + r]
        mask = names[3 + r] if m.group(2) else "0"
        return (f"{head} {{ int32_t c_[{r}] = {{{', '.join(coords)}}}; emu_tma_load({dst}, {tmap}, c_, {r}, {mbar}, "
                f"{mask}); }}")
    m = re.match(r"cp\.async\.bulk\.tensor\.(\d)d\.global\.shared::cta\.tile\.bulk_group", asm)
    if m:
        r = int(m.group(1))
        tmap, coords, src = names[0], names[1:1 + r], names[1 + r]
        return f"{head} {{ int32_t c_[{r}] = {{{', '.join(coords)}}}; emu_tma_store({tmap}, c_, {r}, {src}); }}"
    m = re.match(r"(ld|st)matrix\.sync\.aligned\.m8n8\.x([124])(\.trans)?\.shared(?:::cta)?\.b16", asm)
    if m:
        n, trans = int(m.group(2)), str(bool(m.group(3))).lower()
        if m.group(1) == "ld":
            return (f"{head} {{ uint32_t* d_[{n}] = {{{', '.join('&' + x for x in names[:n])}}}; "
                    f"emu_ldmatrix(d_, {n}, {trans}, {names[n]}); }}")
        return (f"{head} {{ uint32_t v_[{n}] = {{{', '.join(names[1:1 + n])}}}; "
                f"emu_stmatrix({names[0]}, v_, {n}, {trans}); }}")
    if asm.startswith("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"):
        return f"{head} {{ emu_bulk_load({names[0]}, (const void*)({names[1]}), {names[2]}, {names[3]}); }}"
    if asm.startswith("cp.async.bulk.global.shared::cta.bulk_group"):
        return f"{head} {{ emu_bulk_store((void*)({names[0]}), {names[1]}, {names[2]}); }}"
    if asm.startswith("cp.reduce.async.bulk.global.shared::cta.bulk_group") and asm.split(" ")[0].endswith(".add.f32"):
        return f"{head} {{ emu_bulk_reduce_add_f32((void*)({names[0]}), {names[1]}, {names[2]}); }}"
    m = _RED.match(asm)
    if m:
        n, ctype = int((m.group(1) or "v1")[1]), _ATOMIC_TYPES[m.group(2)]
        return (f"{head} {{ {ctype} v_[{n}] = {{{', '.join(names[1:1 + n])}}}; "
                f"emu_red_add(({ctype}*)({names[0]}), v_, {n}, \"{asm.split(' ')[0]}\"); }}")
    if _LD_FLAG.match(asm):
        return f"{head} {{ {names[0]} = emu_ld_flag((const void*)({names[1]})); }}"
    if _ST_FLAG.match(asm):
        return f"{head} {{ emu_st_flag((void*)({names[0]}), (uint32_t)({names[1]})); }}"
    if asm.startswith(_NOOPS) and "wgmma.fence" not in asm[1:] and not any("&" in t for t, _ in params):
        return f"{head} {{}}"
    text = asm.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")[:200]
    return f'{head} {{ emu_fault("no CPU stand-in for the PTX of {name}: {text}"); }}'


def _kernel_body(m: re.Match, source: str) -> tuple[str, str]:
    """(statics struct + info, host-compilable kernel definition) for the kernel at ``m``."""
    name = m.group(1)
    end = source.index("\n}\n", m.start()) + 3
    body = source[m.start():end]
    fields = []

    def static(sm):
        align, ctype, var, dims = sm.group(1) or "16", sm.group(2), sm.group(3), sm.group(4)
        fields.append(f"  alignas({align}) {ctype} {var}{dims};")
        return f"auto& {var} = ((emu_statics_{name}*)emu_cta->smem)->{var};"

    dyn_align = [16]

    def extern(sm):
        dyn_align[0] = max(16, int(sm.group(1) or 16))
        return f"{sm.group(2)}* {sm.group(3)} = ({sm.group(2)}*)(emu_cta->smem + emu_dyn_offset_{name});"

    body = _EXTERN_SMEM.sub(extern, body)
    body = _STATIC_SMEM.sub(static, body)
    if "__shared__" in body:
        raise ValueError(f"emulate: a __shared__ declaration of kernel {name} not understood")
    struct_ = (f"struct emu_statics_{name} {{\n" + "\n".join(fields) + "\n};\n" if fields else "")
    size = f"sizeof(emu_statics_{name})" if fields else "0"
    a = dyn_align[0]
    info = (f"{struct_}static const size_t emu_static_smem_{name} = {size};\n"
            f"static const size_t emu_dyn_offset_{name} = (emu_static_smem_{name} + {a - 1}) / {a} * {a};\n")
    return info, body


def module_source(source: str) -> str:
    """The C++ translation unit (after the headers) running the generated module ``source`` on the CPU."""
    kernels = list(_KERNEL.finditer(source))
    if not kernels:
        raise ValueError("emulate: no kernel definition in the source")
    host_at = source.find("#include <tvm/ffi/c_api.h>")
    if host_at < 0 or "__tvm_ffi_" not in source[host_at:]:
        raise ValueError("emulate: no tvm-ffi host function in the source (generated by build.codegen?)")
    headers = "\n".join(h.read_text() for h in HEADERS)
    # names the headers' macros define (EMU_POLICY(x) -> tvm_builtin_ptx_createpolicy_x, ...)
    for macro, prefix in re.findall(r"#define (\w+)\(name\)(?:[^\n]|\\\n)*?(\w+)##name", headers):
        headers += "".join(f"\n{prefix}{arg}(" for arg in re.findall(rf"^{macro}\((\w+)\)", headers, re.M))
    prelude = source[:kernels[0].start()]
    standins = []
    for w in _WRAPPER.finditer(prelude):
        name = w.group(2)
        if re.search(rf"\b{name}\s*\(", headers):
            continue
        body = prelude[w.end():prelude.find("\n}", w.end())]
        asm = _ASM.search(body)
        if asm is None and "asm" not in body:  # plain CUDA C++ (e.g. __syncwarp()): cuda_cpu.h's builtins serve
            standins.append(f"static inline {w.group(1).strip()} {name}({w.group(3)}) {{{body}\n}}")
            continue
        standins.append(_standin(name, w.group(3), asm.group(1).strip() if asm else "(no asm)"))
    parts, registry = ["\n".join(standins)], []
    seen = set()
    for m in kernels:
        if m.group(1) in seen:
            continue
        seen.add(m.group(1))
        info, body = _kernel_body(m, source)
        parts += [info, body]
        registry.append(f"  emu_kernels[emu_nkernels++] = {{(const void*)&{m.group(1)}, emu_static_smem_{m.group(1)}, "
                        f"emu_dyn_offset_{m.group(1)}, 48 * 1024}};")
    host = "\n".join(ln for ln in source[host_at:].splitlines() if not ln.lstrip().startswith("#include"))
    parts.append(host)
    parts.append("static void emu_register() {\n" + "\n".join(registry) + "\n}\n")
    functions = functions_of(source)
    parts.append("typedef int32_t (*EmuFn)(void*, void*, int, void*);\n"
                 f"static EmuFn emu_functions[] = {{{', '.join(f'(EmuFn)__tvm_ffi_{f}' for f in functions)}}};\n")
    return "\n".join(parts) + _DRIVER


def functions_of(source: str) -> list[str]:
    """The tvm-ffi functions a generated module exports (``main`` first)."""
    names = re.findall(r"^TVM_DLL int32_t __tvm_ffi_(\w+)\(void\* \w+, void\* args, int(?:32_t)? num_args", source,
                       re.M)
    return (["main"] if "main" in names else []) + sorted(set(names) - {"main"})


_DRIVER = r"""
static int64_t rd(FILE* f) { int64_t v; if (fread(&v, 8, 1, f) != 1) abort(); return v; }
int main(int argc, char** argv) {
  FILE* in = fopen(argv[1], "rb");
  int64_t nargs = rd(in), nbufs = rd(in), hang_ms = rd(in), fn = rd(in);
  emu_hang_s = hang_ms / 1000.0;
  std::vector<char*> bufs(nbufs); std::vector<int64_t> sizes(nbufs);
  for (int64_t k = 0; k < nbufs; ++k) {
    sizes[k] = rd(in);
    int64_t cap = std::max<int64_t>(16, (sizes[k] + 15) / 16 * 16);  // the GPU's 16-byte round-up, poisoned
    if (posix_memalign((void**)&bufs[k], 256, cap)) abort();
    if (fread(bufs[k], 1, sizes[k], in) != (size_t)sizes[k]) abort();
    memset(bufs[k] + sizes[k], 0xa5, cap - sizes[k]);
  }
  std::vector<TVMFFIAny> anys(std::max<int64_t>(nargs, 1));
  std::vector<DLTensor> tensors(std::max<int64_t>(nargs, 1));
  std::vector<std::vector<int64_t>> dims(nargs);
  for (int64_t i = 0; i < nargs; ++i) {
    int64_t kind = rd(in);
    memset(&anys[i], 0, sizeof(TVMFFIAny));
    if (kind == 0) {
      int64_t buf = rd(in), off = rd(in), code = rd(in), bits = rd(in), ndim = rd(in);
      dims[i].resize(2 * ndim);
      for (auto& v : dims[i]) v = rd(in);
      DLTensor& t = tensors[i];
      t.data = bufs[buf] + off;
      t.device = {kDLCUDA, 0};
      t.ndim = (int32_t)ndim;
      t.dtype = {(uint8_t)code, (uint8_t)bits, 1};
      t.shape = dims[i].data();
      t.strides = dims[i].data() + ndim;
      t.byte_offset = 0;
      anys[i].type_index = 7;  // kTVMFFIDLTensorPtr
      anys[i].v_ptr = &t;
    } else if (kind == 1) {
      anys[i].type_index = 1;  // kTVMFFIInt
      anys[i].v_int64 = rd(in);
    } else {
      anys[i].type_index = 3;  // kTVMFFIFloat
      int64_t bitsv = rd(in);
      memcpy(&anys[i].v_float64, &bitsv, 8);
    }
  }
  fclose(in);
  emu_register();
  TVMFFIAny result{};
  if (emu_functions[fn](nullptr, anys.data(), (int)nargs, &result) != 0) {
    fprintf(stderr, "EMU host function failed\n");
    return 3;
  }
  long past_end = 0;
  for (int64_t k = 0; k < nbufs; ++k)
    for (int64_t i = sizes[k]; i < (sizes[k] + 15) / 16 * 16; ++i)
      if ((uchar)bufs[k][i] != 0xa5 && past_end++ < 8)
        fprintf(stderr, "EMU write past the end of buffer %ld\n", (long)k);
  FILE* out = fopen(argv[2], "wb");
  for (int64_t k = 0; k < nbufs; ++k) fwrite(bufs[k], 1, sizes[k], out);
  fclose(out);
  fprintf(stderr, "EMU done misaligned=%ld past_end=%ld\n", (long)emu_misaligned.load(), past_end);
  return 0;
}
"""

# torch dtype -> DLPack (code, bits)
_DL = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64), "int8": (0, 8),
       "int16": (0, 16), "int32": (0, 32), "int64": (0, 64), "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32),
       "uint64": (1, 64), "bool": (6, 8), "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8)}


class Module:
    """A generated module compiled for the CPU; call it with the TIRx function's arguments (CPU tensors, ints,
    floats), as the ``tvm_ffi`` function would be called on the GPU."""

    def __init__(self, exe: Path, functions: list[str]):
        self.exe, self.functions = exe, functions

    def __call__(self, *args, timeout: float = 600, hang_timeout: float = 30.0, function: str | None = None):
        import torch

        from tirx_kernels.core.emulate import EmulationError, Report

        function = function or self.functions[0]
        if function not in self.functions:
            raise ValueError(f"function {function!r}: the module exports {self.functions}")
        storages, recs = {}, []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type != "cpu":
                    raise ValueError(f"argument {i}: a CPU tensor, got {a.device}")
                dt = str(a.dtype).removeprefix("torch.")
                if dt not in _DL:
                    raise ValueError(f"argument {i}: dtype {dt} has no DLPack code here")
                st = a.untyped_storage()
                if st.data_ptr() not in storages:
                    storages[st.data_ptr()] = (len(storages),
                                               torch.empty(0, dtype=torch.uint8).set_(st, 0, (st.nbytes(),)))
                recs.append(struct.pack("<6q", 0, storages[st.data_ptr()][0], a.storage_offset() * a.element_size(),
                                        *_DL[dt], a.dim()) + struct.pack(f"<{2 * a.dim()}q", *a.shape, *a.stride()))
            elif isinstance(a, bool | int):
                recs.append(struct.pack("<2q", 1, int(a)))
            elif isinstance(a, float):
                recs.append(struct.pack("<q", 2) + struct.pack("<d", a))
            else:
                raise TypeError(f"argument {i}: a CPU tensor, int or float, got {type(a).__name__}")
        bufs = [whole for _, whole in sorted(storages.values(), key=lambda e: e[0])]
        with tempfile.TemporaryDirectory(prefix="tirx_emu_") as tmp:
            inp, outp = Path(tmp) / "in", Path(tmp) / "out"
            with open(inp, "wb") as f:
                f.write(struct.pack("<4q", len(args), len(bufs), int(hang_timeout * 1000),
                                    self.functions.index(function)))
                for whole in bufs:
                    f.write(struct.pack("<q", whole.numel()))
                    f.write(whole.numpy().tobytes())
                for r in recs:
                    f.write(r)
            env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}
            try:
                run = subprocess.run([str(self.exe), str(inp), str(outp)], capture_output=True, text=True,
                                     timeout=timeout, env=env)
            except subprocess.TimeoutExpired as e:
                raise EmulationError(f"{self.exe.name}: no result in {timeout} s") from e
            if run.returncode == 0:
                data, pos = outp.read_bytes(), 0
                for whole in bufs:
                    n = whole.numel()
                    whole.copy_(torch.frombuffer(bytearray(data[pos:pos + n]), dtype=torch.uint8))
                    pos += n
        asan = run.stderr[run.stderr.find("==ERROR: AddressSanitizer"):] if "AddressSanitizer" in run.stderr else ""
        done = re.search(r"EMU done misaligned=(\d+) past_end=(\d+)", run.stderr)
        misaligned = int(done.group(1)) if done else len(re.findall("EMU misaligned", run.stderr))
        return Report(run.returncode, misaligned, int(done.group(2)) if done else 0, asan, run.stderr,
                      hang=run.returncode == EXIT_HANG)


def compile_module(func_or_source, cxxflags: list[str]) -> Module:
    source = func_or_source
    if not isinstance(source, str):
        from tirx_kernels.core import build

        source = build.codegen(func_or_source)
    gxx = shutil.which(os.environ.get("CXX", "g++"))
    if gxx is None:
        raise RuntimeError("tirx_kernels.core.emulate needs g++ (C++20, AddressSanitizer)")
    text = "".join(f'#include "{h}"\n' for h in HEADERS) + module_source(source)
    key = hashlib.sha256((text + "".join(h.read_text() for h in HEADERS) + " ".join(cxxflags)).encode()) \
        .hexdigest()[:20]
    from tirx_kernels.core.emulate import _cache_dir

    kname = _KERNEL.search(source).group(1)
    exe = _cache_dir() / f"{kname}-mod-{key}"
    if not exe.exists():
        exe.parent.mkdir(parents=True, exist_ok=True)
        src = exe.with_suffix(".cpp")
        src.write_text(text)
        tmp = exe.with_name(exe.name + f".{os.getpid()}.tmp")
        res = subprocess.run([gxx, *cxxflags, "-o", str(tmp), str(src)], capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"emulate: g++ failed for {kname} ({src}):\n" + res.stderr[-4000:])
        os.replace(tmp, exe)
    return Module(exe, functions_of(source))
