# SPDX-License-Identifier: Apache-2.0
"""runtime.StreamWorkspace never frees or re-hands-out a buffer a captured CUDA graph may still write."""

import types

import torch

from tirx_kernels.core import runtime


def _fake_streams(monkeypatch):
    current = {"stream": 1}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(
        cuda_stream=current["stream"]))
    return current


def test_outgrown_buffers_stay_alive_and_are_not_reused(monkeypatch):
    current = _fake_streams(monkeypatch)
    ws = runtime.StreamWorkspace(n_flags=8)
    dev = torch.device("cpu")
    small, flags = ws.get(dev, 1000)
    assert small.numel() == 1024 and flags.numel() == 8 and not flags.any()
    again, flags2 = ws.get(dev, 900)
    assert again.data_ptr() == small.data_ptr() and flags2 is flags  # same stream, fits: reused
    big, flags3 = ws.get(dev, 5000)
    assert big.numel() == 8192 and big.data_ptr() != small.data_ptr() and flags3 is flags
    assert any(t is small for t in ws._retired)  # a graph captured with `small` can still replay safely
    current["stream"] = 2
    other, other_flags = ws.get(dev, 100)
    assert other.data_ptr() not in (small.data_ptr(), big.data_ptr()) and other_flags is not flags


def test_many_streams_never_drop_a_live_set(monkeypatch):
    current = _fake_streams(monkeypatch)
    ws = runtime.StreamWorkspace(n_flags=2)
    dev = torch.device("cpu")
    first = ws.get(dev, 16)[0]
    for s in range(2, 40):
        current["stream"] = s
        ws.get(dev, 16)
    current["stream"] = 1
    assert ws.get(dev, 16)[0] is first
