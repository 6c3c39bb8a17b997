# SPDX-License-Identifier: Apache-2.0
"""Every registered kernel module satisfies the protocol of PROTOCOL.md (runs on CPU)."""

import importlib
import inspect
import json
import subprocess
import sys

import pytest

from tirx_kernels import registry
from tirx_kernels.core import harness

ENTRIES = registry.list_kernels()
REQUIRED = ("compile_params", "get_kernel", "prepare_data", "reference", "launch", "roofline")


def test_some_kernels_are_registered():
    assert ENTRIES, "no kernel package is installed"


@pytest.fixture(params=ENTRIES, ids=[e.name for e in ENTRIES])
def entry(request):
    return request.param


def test_literals_match_the_imported_module(entry):
    mod = importlib.import_module(entry.module)
    assert mod.KERNEL_META == entry.meta
    assert mod.CONFIGS == entry.configs


def test_protocol_functions(entry):
    mod = importlib.import_module(entry.module)
    for name in REQUIRED:
        assert callable(getattr(mod, name, None)), f"{entry.module} lacks {name}()"
    assert getattr(mod.run_test, "__tirx_harness__", None) == entry.module, "run_test must come from harness.bind"
    assert getattr(mod.run_bench, "__tirx_harness__", None) == entry.module, "run_bench must come from harness.bind"
    for op in entry.meta.get("public_ops", []):
        assert callable(getattr(mod, op, None)), f"public op {op} missing from {entry.module}"
    assert entry.meta.get("public_ops"), "KERNEL_META['public_ops'] must name the public op(s)"
    if hasattr(mod, "get_baselines"):
        for cfg in entry.configs[:1]:
            baselines = mod.get_baselines(**harness.full_config(mod, cfg))
            assert all(callable(b) for b in baselines.values())


def test_every_config_has_params_and_a_roofline(entry):
    mod = importlib.import_module(entry.module)
    for cfg in entry.configs + (entry.bench_configs or []):
        full = harness.full_config(mod, cfg)
        params = mod.compile_params(**full)
        json.dumps(params)  # canonical, serializable cache key
        model = mod.roofline(**full)
        assert model.get("bytes", 0) > 0 or model.get("flops", 0) > 0, cfg["label"]


def test_get_kernel_returns_a_primfunc(entry):
    tvm = pytest.importorskip("tvm", reason="apache-tvm is needed to trace kernels")
    mod = importlib.import_module(entry.module)
    params = mod.compile_params(**harness.full_config(mod, entry.configs[0]))
    f = mod.get_kernel(**params)
    assert isinstance(f, (tvm.tirx.PrimFunc, tvm.IRModule))


def test_module_imports_without_the_compiler(entry):
    """A GPU host runs prebuilt artifacts with no apache-tvm: importing the kernel must not need it."""
    code = ("import sys; sys.modules['tvm'] = None\n"
            f"import importlib; m = importlib.import_module({entry.module!r}); print(m.KERNEL_META['name'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_public_ops_are_custom_ops(entry):
    import torch

    mod = importlib.import_module(entry.module)
    src = inspect.getsource(mod)
    # Directly, or through core.op.OutOp (which registers the custom ops and their fakes).
    assert "torch.library" in src or "OutOp(" in src, "public ops go through torch.library custom ops"
    assert "register_fake" in src or "OutOp(" in src, "custom ops need fake implementations for torch.compile"
    assert hasattr(torch.ops, "tirx")


def test_harness_hooks_name_real_tensors(entry):
    """INPLACE / WORKSPACES / GRADIENTS / COMPARATORS name tensors prepare_data returns; a roofline's ceiling is
    one the bench measures (harness hooks, PROTOCOL.md)."""
    from tirx_kernels.core import bench

    mod = importlib.import_module(entry.module)
    for cfg in entry.configs + (entry.bench_configs or []):
        assert mod.roofline(**harness.full_config(mod, cfg)).get("ceiling", "bf16") in bench.COMPUTE_CEILINGS
    if getattr(mod, "GRADIENTS", None):
        assert callable(getattr(mod, "launch_autograd", None)), "GRADIENTS needs launch_autograd(cfg, data)"
    declared = [*getattr(mod, "INPLACE", {}).values(), *getattr(mod, "INPLACE", {}),
                *getattr(mod, "WORKSPACES", ()), *getattr(mod, "GRADIENTS", ()), *getattr(mod, "COMPARATORS", {})]
    if declared:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("prepare_data makes CUDA tensors: the names are checked on the GPU")
        # A name must come back from some config (an optional output, e.g. add_rmsnorm_fp4quant's second scale
        # layout, exists only in the configs that ask for it).
        missing = set(declared)
        for cfg in entry.configs:
            data = mod.prepare_data(**harness.full_config(mod, cfg))
            missing -= set(data) | set(mod.reference(**data))
            del data
            if not missing:
                break
        assert not missing, f"{entry.module}: hooks name {sorted(missing)}, which no config's data / reference return"
