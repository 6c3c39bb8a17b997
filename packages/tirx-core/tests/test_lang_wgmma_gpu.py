# SPDX-License-Identifier: Apache-2.0
"""Numerical micro-kernels for ``core.lang.wgmma``: one warpgroup, one CTA, one m64nN tile over a few
k-steps per case, checked against an fp32 torch matmul of the same (rounded) inputs.

Cases: SS bf16 K-major SW128 (the baseline, plus a variant that restarts a NaN accumulator with a
runtime ``scale_d`` that is false on the first k-step), SS fp16 with an MN-major B (transpose immediate,
two MN chunks so the LBO matters), RS bf16 (A in registers through ``a_frag_row``/``a_frag_col``), SS fp8
(e4m3 x e4m3 and e5m2 x e4m3), SS tf32, and SS bf16 with 32B and 64B swizzled K-major descriptors
(k-steps that cross into the next swizzle slab).

Operands are staged into shared memory by plain per-thread 4-byte copies into the canonical swizzled
layout (what a TMA box of the same swizzle writes), independently of TMA, so each kernel checks only the
descriptor (:func:`wgmma.desc_offsets`, :func:`wgmma.k_step_bytes`, :func:`wgmma.encode_desc`), the
instruction (:func:`wgmma.mma`) and the fragment maps. Every kernel writes its fp32 accumulator to global
through ``acc_row``/``acc_col``/``acc_index``. Inputs travel as raw ``int32`` words (no fp8 DLPack needed).

CPU (CI): each kernel builds to an sm_90a ``.so`` with no spills and no stack, and its SASS has the
expected HGMMA/QGMMA (``tnspB`` for the MN-major B). GPU: the GPU host has no compiler, so the kernels are
built here into a bundle (``python packages/tirx-core/tests/test_lang_wgmma_gpu.py build/lang-micro``;
carry ``build/lang-micro`` and set ``TIRX_LANG_MICRO_DIR``) that ``test_lang_wgmma_numerics.py`` runs.
"""

import dataclasses
import re
import shutil

import pytest

pytest.importorskip("tvm")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build  # noqa: E402
from tirx_kernels.core.lang import tma, wgmma  # noqa: E402

K_MAJOR, MN_MAJOR = wgmma.K_MAJOR, wgmma.MN_MAJOR
SW32, SW64, SW128 = wgmma.SWIZZLE_32B, wgmma.SWIZZLE_64B, wgmma.SWIZZLE_128B
THREADS = 128  # one warpgroup


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    a_dtype: str
    b_dtype: str
    n: int
    k: int  # total K of the tile (k // k_per_instr wgmma k-steps)
    swizzle: int = SW128  # of both smem operands
    b_major: str = K_MAJOR
    form: str = "ss"
    restart: bool = False  # accumulator starts as NaN; scale_d = (k0 + kk > 0) with k0 = 0 passed at run time
    sass: str = ""  # regex the SASS must match (once per k-step)
    tol: float = 1e-4  # |out - ref| <= tol * (|A| @ |B|) elementwise

    @property
    def ksteps(self) -> int:
        return self.k // wgmma.k_per_instr(self.a_dtype)


CASES = [
    Case("ss_bf16_sw128", "bfloat16", "bfloat16", 64, 64, sass=r"HGMMA\.64x64x16\.F32\.BF16 "),
    Case("ss_bf16_sw128_restart", "bfloat16", "bfloat16", 64, 64, restart=True,
         sass=r"HGMMA\.64x64x16\.F32\.BF16 "),
    Case("ss_fp16_mn_major_b", "float16", "float16", 128, 64, b_major=MN_MAJOR,
         sass=r"HGMMA\.64x128x16\.F32 .*tnspB"),
    Case("rs_bf16", "bfloat16", "bfloat16", 64, 64, form="rs",
         sass=r"HGMMA\.64x64x16\.F32\.BF16 R\d+, R\d+, gdesc\["),
    Case("ss_e4m3", "float8_e4m3fn", "float8_e4m3fn", 64, 128, sass=r"QGMMA\.64x64x32\.F32\.E4M3\.E4M3 ",
         tol=2e-3),
    Case("ss_e5m2_e4m3", "float8_e5m2", "float8_e4m3fn", 64, 128, sass=r"QGMMA\.64x64x32\.F32\.E5M2\.E4M3 ",
         tol=2e-3),
    Case("ss_tf32", "float32", "float32", 64, 32, sass=r"HGMMA\.64x64x8\.F32\.TF32 ", tol=1e-3),
    Case("ss_bf16_sw64", "bfloat16", "bfloat16", 64, 64, swizzle=SW64, sass=r"HGMMA\.64x64x16\.F32\.BF16 "),
    Case("ss_bf16_sw32", "bfloat16", "bfloat16", 64, 64, swizzle=SW32, sass=r"HGMMA\.64x64x16\.F32\.BF16 "),
]
_IDS = [c.name for c in CASES]


# ---------------------------------------------------------------------------------------------------------
# Layout arithmetic (plain ints on the host, PrimExprs in the kernels)
# ---------------------------------------------------------------------------------------------------------


def swizzled_byte(row, byte, rows: int, span: int):
    """Byte offset, from a 1024-aligned tile base, of byte ``byte`` of row ``row`` of a row-major
    ``rows x row_bytes`` matrix stored as ``span``-byte column slabs (one TMA box each: slab ``s`` holds
    bytes ``[s*span, (s+1)*span)`` of every row, ``span`` bytes per row), ``span``-byte swizzled:
    the 16-byte chunk index (address bits 4..) is XORed with address bits 7.. (Swizzle<1|2|3, 4, 3>)."""
    off = (byte // span) * (rows * span) + row * span + byte % span
    return off ^ (((off >> 7) & (span // 16 - 1)) << 4)


def kmajor_k_offset(kk: int, rows: int, span: int, dtype: str) -> int:
    """Start-address byte offset of k-step ``kk`` in a K-major swizzled tile of ``rows`` MN-rows:
    ``k_step_bytes`` inside a slab's row, the next slab (``rows * span`` bytes on) past it."""
    kb = kk * wgmma.k_step_bytes(K_MAJOR, SW128 if span == 128 else {32: SW32, 64: SW64}[span], dtype)
    return (kb // span) * rows * span + kb % span


def test_staging_swizzle_matches_the_tma_sw128_layout():
    for dtype in ("bfloat16", "float16"):
        eb = tma.elem_bytes(dtype)
        for row in range(16):
            for col in range(128 // eb):
                assert swizzled_byte(row, col * eb, 64, 128) == tma.sw128_offset(row, col, dtype) * eb


@pytest.mark.parametrize("span", [32, 64, 128])
def test_staging_swizzle_is_a_permutation_of_16_byte_chunks(span):
    rows, row_bytes = 64, 256
    offs = [swizzled_byte(r, b, rows, span) for r in range(rows) for b in range(0, row_bytes, 16)]
    assert sorted(offs) == list(range(0, rows * row_bytes, 16))
    # the swizzle repeats every 8 rows of one slab (span*8 bytes), so it never leaves a 1024-byte atom
    assert all(swizzled_byte(r, b, rows, span) // 1024 == (r * span + (b // span) * rows * span) // 1024
               for r in range(rows) for b in range(0, row_bytes, 16))


def _b_rows_bytes(c: Case) -> tuple[int, int]:
    """B's global/smem matrix: K-major (N, K) or MN-major (K, N), as (rows, bytes per row)."""
    eb = tma.elem_bytes(c.b_dtype)
    return (c.n, c.k * eb) if c.b_major == K_MAJOR else (c.k, c.n * eb)


# ---------------------------------------------------------------------------------------------------------
# The micro-kernel
# ---------------------------------------------------------------------------------------------------------


def _kernel(c: Case):
    span = wgmma.swizzle_span(c.swizzle)
    n, ksteps, rs = c.n, c.ksteps, c.form == "rs"
    a_row_bytes = c.k * tma.elem_bytes(c.a_dtype)
    b_rows, b_row_bytes = _b_rows_bytes(c)
    a_row_words, b_row_words = a_row_bytes // 4, b_row_bytes // 4
    a_words, b_words = wgmma.M * a_row_words, b_rows * b_row_words
    assert a_words % THREADS == 0 and b_words % THREADS == 0
    assert a_row_bytes % span == 0 and b_row_bytes % span == 0
    lbo_a, sbo_a = wgmma.desc_offsets(K_MAJOR, c.swizzle)
    if c.b_major == K_MAJOR:
        lbo_b, sbo_b = wgmma.desc_offsets(K_MAJOR, c.swizzle)

        def b_off(kk):
            return kmajor_k_offset(kk, n, span, c.b_dtype) // 4
    else:  # (K, N): span-byte MN chunks of all K rows, one after the other
        lbo_b, sbo_b = wgmma.desc_offsets(MN_MAJOR, c.swizzle, mn_chunk_bytes=span * c.k)

        def b_off(kk):
            return kk * (wgmma.k_step_bytes(MN_MAJOR, c.swizzle, c.b_dtype) // 4)

    def a_off(kk):
        return kmajor_k_offset(kk, wgmma.M, span, c.a_dtype) // 4

    def scale_d(kk, k0):  # a runtime predicate (k0 is a kernel argument, 0 at run time) for the restart case
        return k0 + kk > 0 if c.restart else True

    def a_regs(ra, kk):
        return [ra[kk * 4 + i] for i in range(4)]
    kpi = wgmma.k_per_instr(c.a_dtype)
    a_eb = tma.elem_bytes(c.a_dtype)
    nacc = wgmma.acc_regs(n)
    init = T.float32("nan") if c.restart else T.float32(0)

    @T.prim_func
    def micro(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle, k0: T.int32):
        A = T.match_buffer(a_ptr, (wgmma.M, a_row_words), "int32", align=16)
        B = T.match_buffer(b_ptr, (b_rows, b_row_words), "int32", align=16)
        C = T.match_buffer(c_ptr, (wgmma.M, n), "float32", align=16)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([THREADS])
        pool = T.SMEMPool()
        As = pool.alloc((a_words,), "int32", align=1024)
        Bs = pool.alloc((b_words,), "int32", align=1024)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        ra = T.alloc_local((4 * ksteps,), "uint32")
        da = T.alloc_local((1,), "uint64")
        db = T.alloc_local((1,), "uint64")
        warp = tid // 32
        lane = tid % 32
        # stage: one 4-byte word per thread per iteration, global row-major -> swizzled smem
        if rs:
            for kk in T.unroll(ksteps):
                for i in T.unroll(4):
                    ra[kk * 4 + i] = T.Cast("uint32", A[wgmma.a_frag_row(warp, lane, i),
                                                         (kk * kpi + wgmma.a_frag_col(lane, i, 0, c.a_dtype))
                                                         * a_eb // 4])
        else:
            for it in T.serial(a_words // THREADS):
                As[swizzled_byte((it * THREADS + tid) // a_row_words, (it * THREADS + tid) % a_row_words * 4,
                                 wgmma.M, span) // 4] = \
                    A[(it * THREADS + tid) // a_row_words, (it * THREADS + tid) % a_row_words]
        for it in T.serial(b_words // THREADS):
            Bs[swizzled_byte((it * THREADS + tid) // b_row_words, (it * THREADS + tid) % b_row_words * 4,
                             b_rows, span) // 4] = \
                B[(it * THREADS + tid) // b_row_words, (it * THREADS + tid) % b_row_words]
        tma.fence_proxy_async()  # generic-proxy smem writes -> visible to wgmma (async proxy)
        T.cuda.cta_sync()
        for i in T.unroll(nacc):
            acc[i] = init
        wgmma.fence()
        for kk in T.unroll(ksteps):
            wgmma.encode_desc(db.ptr_to([0]), Bs.ptr_to([b_off(kk)]), lbo_b, sbo_b, c.swizzle)
            if rs:
                wgmma.mma(n, acc, a_regs(ra, kk), db[0], c.a_dtype, c.b_dtype,
                          b_major=c.b_major, scale_d=scale_d(kk, k0))
            else:
                wgmma.encode_desc(da.ptr_to([0]), As.ptr_to([a_off(kk)]), lbo_a, sbo_a, c.swizzle)
                wgmma.mma(n, acc, da[0], db[0], c.a_dtype, c.b_dtype, b_major=c.b_major,
                          scale_d=scale_d(kk, k0))
        wgmma.commit()
        wgmma.wait(0)
        for j in T.unroll(n // 8):
            for r in T.unroll(2):
                for e in T.unroll(2):
                    C[wgmma.acc_row(warp, lane, r), wgmma.acc_col(lane, j, e)] = acc[wgmma.acc_index(j, r, e)]

    return micro


_built: dict[str, build.BuildResult] = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Build each case's ``.so`` once per test process."""
    def get(c: Case) -> build.BuildResult:
        if c.name not in _built:
            _built[c.name] = build.build_so(_kernel(c), str(tmp_path_factory.mktemp(c.name) / "micro.so"))
        return _built[c.name]
    return get


# ---------------------------------------------------------------------------------------------------------
# CPU: codegen + build + SASS
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_micro_kernel_builds(case, built):
    res = built(case)
    src = open(res.cu_path).read()
    dev = src[src.index('extern "C" __global__'):]
    assert wgmma.mma_name(case.n, case.a_dtype, case.b_dtype) in src
    assert ("_rs_mma_async" if case.form == "rs" else "_ss_mma_async") in dev
    assert dev.count("__shared__") == 1  # everything in the 1024-aligned pool
    assert "fence.proxy.async.shared::cta" in src
    kern = next(iter(res.ptxas_info["kernels"].values()))
    assert kern["spill_store_bytes"] == 0 and kern["spill_load_bytes"] == 0 and kern["stack_bytes"] == 0, kern
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    sass = build.sass(res.so_path)
    mmas = [ln for ln in sass.splitlines() if re.search(r"\b[HQ]GMMA\.", ln)]
    assert len(mmas) == case.ksteps, mmas
    assert all(re.search(case.sass, ln) for ln in mmas), mmas
    if case.b_major == K_MAJOR:
        assert not any("tnsp" in ln for ln in mmas), mmas
    # SS: both descriptors in one uniform-register quad (gdesc[URx]); RS: A is a register quad before it
    a_in_regs = [bool(re.search(r"R\d+, R\d+, gdesc\[", ln)) for ln in mmas]
    assert all(a_in_regs) if case.form == "rs" else not any(a_in_regs), mmas
    if case.restart:  # scale-d is a runtime uniform predicate on every instruction (not folded to !UPT)
        assert all(re.search(r"gdesc\[UR\d+\], R\d+, UP\d", ln) for ln in mmas), mmas
    # the descriptors' high words (layout type in bits 62-63: 1 = 128B, 2 = 64B, 3 = 32B; SBO in bits
    # 32-45) are compile-time constants that ptxas materializes with UMOV
    layout = {SW128: 1, SW64: 2, SW32: 3}[case.swizzle]
    sbos = [wgmma.desc_offsets(K_MAJOR, case.swizzle)[1]]
    if case.b_major == MN_MAJOR:
        sbos.append(wgmma.desc_offsets(MN_MAJOR, case.swizzle, mn_chunk_bytes=128 * case.k)[1])
    for sbo in sbos:
        assert re.search(rf"UMOV UR\d+, 0x{(layout << 30) | sbo:x} ", sass), (layout, sbo)
    assert "LDL" not in sass and "STL" not in sass


# ---------------------------------------------------------------------------------------------------------
# Prebuilt bundle for the GPU host (no compiler there): test_lang_wgmma_numerics.py runs it
# ---------------------------------------------------------------------------------------------------------


def build_bundle(out_dir: str) -> str:
    """Build every case into ``out_dir`` (``<name>.so`` + ``cases.json``: what the numerics test needs)."""
    from tirx_kernels.core import testing

    return testing.write_micro_bundle(out_dir, "cases.json", [
        (f"{c.name}.so", lambda c=c: _kernel(c),
         {"name": c.name, "a_dtype": c.a_dtype, "b_dtype": c.b_dtype, "n": c.n, "k": c.k, "m": wgmma.M,
          "b_major": "k" if c.b_major == K_MAJOR else "mn", "tol": c.tol}) for c in CASES])


def test_bundle_lists_every_case(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(build, "build_so", lambda func, path: open(path, "w").close())
    cases = json.load(open(build_bundle(str(tmp_path))))["cases"]
    assert [c["name"] for c in cases] == _IDS and all((tmp_path / c["so"]).exists() for c in cases)


if __name__ == "__main__":  # python packages/tirx-core/tests/test_lang_wgmma_gpu.py build/lang-micro
    import sys

    print(build_bundle(sys.argv[1] if len(sys.argv) > 1 else "build/lang-micro"))
