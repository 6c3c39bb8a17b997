# SPDX-License-Identifier: Apache-2.0
"""tirx-port-misc is installed and registered: the flash-attention entry point serves flash_attention4 and its
backward; the misc entry point (DeepEP, fast.cu, MSA) ships no kernel yet."""

import importlib.metadata

from tirx_kernels import registry


def test_entry_points_registered():
    eps = {e.name: e.value for e in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert eps.get("misc") == "tirx_kernels.ported.misc"
    assert eps.get("flashattention") == "tirx_kernels.ported.flashattention"


def test_kernels():
    assert registry.list_kernels(category="ported.misc") == []
    names = [e.name for e in registry.list_kernels(category="ported.flashattention")]
    assert {"flash_attention4", "flash_attention_backward_sm90"} <= set(names), names
