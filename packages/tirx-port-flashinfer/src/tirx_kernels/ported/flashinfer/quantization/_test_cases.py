# SPDX-License-Identifier: Apache-2.0
"""The CPU tests every block quantizer shares (``nvfp4_quantize``, ``mxfp4_quantize``, ``mxfp8_quantize``), for their
test modules (pytest; not imported by the package): subclass ``BlockQuantCases`` as ``Test<Format>`` with the
format, the module, its public-op call and its oracle. Bundle resolution, protocol literals, input validation, the
scale-layout names, and the generated CUDA run on the CPU (``core.emulate``) bit for bit against ``core.quant_ref``
(every layout, ragged M, zero / inf / NaN / midpoint / subnormal rows, the swizzled padding zeroed)."""

from __future__ import annotations

import random

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.quantization import _block_quant as B

GLOBAL_SCALE = 448.0 * 6.0 / 30.0  # nvfp4's global scale in the emulated rows (the MX formats take none)


class BlockQuantCases:
    FMT: str = ""
    MOD = None
    BENCH_LABELS = {"fp16_128x4_m128_k1024", "fp16_linear_m4096_k4096", "fp16_128x4_m16384_k7168"}  # every format's
    BAD_K: int = 0  # a row width the format refuses

    def call(self, x, layout="128x4"):
        """The public op on ``x`` with the scale layout ``layout``: ``(codes, scales)``."""
        raise NotImplementedError

    def ref(self, x, gs, layout):
        """``core.quant_ref``'s ``(codes, scales)`` (``gs``: nvfp4's global scale)."""
        raise NotImplementedError

    def test_every_call_resolves_to_a_bundled_artifact(self):
        mod = self.MOD
        bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
        for call in mod.call_samples(random.Random(0)):
            cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
            assert bundled & set(cands), call

    def test_protocol_literals(self):
        mod = self.MOD
        assert mod.KERNEL_META["name"] == f"{self.FMT}_quantize" and len(mod.KERNEL_META["upstream"]["commit"]) == 40
        labels = [c["label"] for c in mod.CONFIGS]
        assert len(labels) == len(set(labels))
        assert {c["label"] for c in mod.BENCH_CONFIGS} == self.BENCH_LABELS

    @pytest.mark.parametrize("make, what", [
        (lambda k: torch.zeros(4, k, dtype=torch.bfloat16), "K={k}"),
        (lambda k: torch.zeros(4, 64), "dtype"),
        (lambda k: torch.zeros(2, 4, 64, dtype=torch.bfloat16), "dimensions"),
        (lambda k: torch.zeros(4, 64, dtype=torch.bfloat16), "CUDA"),
    ], ids=["K", "dtype", "ndim", "cpu"])
    def test_rejected_inputs_name_the_argument(self, make, what):
        with pytest.raises(TirxInputError, match=f"argument 'input'.*{what.format(k=self.BAD_K)}"):
            self.call(make(self.BAD_K))

    def test_layout_names(self):
        assert B.layout_name("op", 0) == "128x4" and B.layout_name("op", 1) == "8x4"
        assert B.layout_name("op", 2) == "linear" and B.layout_name("op", "layout_linear") == "linear"
        with pytest.raises(TirxInputError, match="sfLayout"):
            B.layout_name("op", "64x4")

    @pytest.fixture(scope="class")
    @classmethod
    def emulation(cls):
        pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
        import shutil

        if shutil.which("g++") is None:
            pytest.skip("no g++ to compile the emulation")

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("layout", B.LAYOUTS)
    @pytest.mark.parametrize("M, K", [(1, 64), (37, 96), (130, 160)])
    def test_emulated_bit_exact(self, emulation, dtype, layout, M, K):  # noqa: N803
        block = B.block_of(self.FMT)
        K = K // block * block  # noqa: N806
        x = B.special_rows(M, K, dtype)
        gs = torch.tensor([GLOBAL_SCALE])
        codes, sf = B.emulate_quantize(x, gs if self.FMT == "nvfp4" else None, self.FMT, layout)
        want_codes, want_sf = self.ref(x, gs, layout)
        assert torch.equal(codes.view(torch.uint8), want_codes)
        assert torch.equal(sf.view(-1), want_sf.view(-1))  # padding included: zeros in the swizzled layouts
        assert sf.shape == ((M, K // block) if layout == "linear" else (want_sf.numel(),))
