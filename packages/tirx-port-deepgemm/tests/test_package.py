# SPDX-License-Identifier: Apache-2.0
"""tirx-port-deepgemm is installed and registered, and the registry lists its kernels."""

import importlib.metadata

from tirx_kernels import registry


def test_entry_point_registered():
    eps = {e.name: e.value for e in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert eps.get("deepgemm") == "tirx_kernels.ported.deepgemm"


def test_kernels_listed():
    names = {k["name"] if isinstance(k, dict) else getattr(k, "name", k)
             for k in registry.list_kernels(category="ported.deepgemm")}
    assert {"deepgemm_per_token_cast_to_fp8", "deepgemm_per_block_cast_to_fp8", "deepgemm_sm90_fp8_gemm_1d2d"} <= names
