# SPDX-License-Identifier: Apache-2.0
"""tirx-port-cudnn is installed and registered, and its linear-attention kernels are listed."""

import importlib.metadata

from tirx_kernels import registry


def test_entry_point_registered():
    eps = {e.name: e.value for e in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert eps.get("cudnn") == "tirx_kernels.ported.cudnn"


def test_forward_kernels_registered():
    names = {e.name for e in registry.list_kernels(category="ported.cudnn")}
    assert {"cudnn_sm90_gdn_prefill_f16", "cudnn_sm90_gdn_recompute_f16"} <= names
