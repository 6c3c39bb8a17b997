# SPDX-License-Identifier: Apache-2.0
"""fp16_bf16_gemm is split by role (gemm/_tiles, _tile_table, _select, _ws, _inputs, _host, _protocol): the registered
module still names everything its callers use, its artifacts' fingerprint covers every module that decides the
generated code, and the host path loads the registered module's artifacts (CPU only)."""

import inspect
import os

from tirx_kernels.core import artifacts
from tirx_kernels.gemm import _host
from tirx_kernels.gemm import fp16_bf16_gemm as mod

PUBLIC = ["BENCH_CONFIGS", "CONFIGS", "DEFAULTS", "EPILOGUES", "EVICT_FIRST_TWINS", "GEMV_TILES", "KERNEL_META",
          "LAYOUTS", "PDL", "STG_TILE", "TILE_CONFIGS", "TILE_TABLE", "TOLERANCE", "VARIANT_TILE", "artifact_params",
          "c_store", "call_samples", "check_stream_k_residency", "choose_tile", "cluster_ctas", "compile_params",
          "gemm_nn", "gemm_nt", "general_params", "get_baselines", "get_kernel", "is_variant", "launch",
          "prepare_data", "reference", "roofline", "run_bench", "run_test", "sass_expect", "stg_serves",
          "variant_combinations", "workspace_floats"]


def test_public_names():
    missing = [n for n in PUBLIC if not hasattr(mod, n)]
    assert not missing, missing


def test_fingerprint_covers_every_role_and_schedule():
    # The schedules are imported inside get_kernel / sass_expect: the closure must still reach them, or an edit to
    # one would leave stale artifacts looking current.
    closure = {os.path.basename(p) for p in artifacts.source_closure(inspect.getsourcefile(mod))}
    need = {"fp16_bf16_gemm.py", "_tiles.py", "_tile_table.py", "_select.py", "_ws.py", "_inputs.py", "_host.py",
            "_protocol.py", "_persistent.py", "_pingpong.py", "_small_m.py", "_gemv.py"}
    assert need <= closure, sorted(need - closure)


def test_host_loads_the_registered_modules_artifacts():
    assert _host._FUNCTIONS._module_name == mod.__name__
