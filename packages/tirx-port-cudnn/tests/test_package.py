# SPDX-License-Identifier: Apache-2.0
"""tirx-port-cudnn is installed and registered, and (as its README says) ships no kernel yet."""

import importlib.metadata

from tirx_kernels import registry


def test_entry_point_registered():
    eps = {e.name: e.value for e in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert eps.get("cudnn") == "tirx_kernels.ported.cudnn"


def test_no_kernels_yet():
    assert registry.list_kernels(category="ported.cudnn") == []
