# SPDX-License-Identifier: Apache-2.0
"""GPU card keys and the per-card baseline: a run is only ever compared with rows pinned on its own card.

The device is an H100 on most GPU calls and an H200 on some: the same 132 SMs, but memory-bound rows run
about 1.4x faster on the H200 (4.8 vs 3.35 TB/s), so a row pinned on one card is no bar for the other.
``baseline.json`` (format ``tirx-bench-suite-baseline/2``) holds one promoted run per card::

    {"format": "tirx-bench-suite-baseline/2",
     "cards": {"H200": {<the run JSON>, "card": "H200", "promoted": {...}, "rows": [{..., "card": "H200"}]}}}

A plain run, or a baseline of format 1 (one promoted run, before cards), reads as one card: the one its
provenance names.
"""

from __future__ import annotations

BASELINE_FORMAT = "tirx-bench-suite-baseline/2"
UNKNOWN = "unknown"
# Exact device names (torch / nvidia-smi) of the SXM cards the device tool lends. Any other name (H100
# PCIe or NVL: other bandwidth and SM counts) is its own key, the full name, never lumped with these.
CARD_KEYS = {"NVIDIA H100 80GB HBM3": "H100", "NVIDIA H200": "H200"}


def card_key(gpu_name: str | None) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``, ``"NVIDIA H200"`` -> ``"H200"``; other names unchanged."""
    if not gpu_name or not gpu_name.strip():
        return UNKNOWN
    return CARD_KEYS.get(gpu_name.strip(), gpu_name.strip())


def run_card(run: dict) -> str:
    """The card a run was measured on, from its provenance."""
    return card_key(((run.get("provenance") or {}).get("gpu") or {}).get("name"))


def is_baseline(obj: dict) -> bool:
    return obj.get("format") == BASELINE_FORMAT


def _section(run: dict, card: str) -> dict:
    return {**run, "card": card, "rows": [{**r, "card": card} for r in run.get("rows", [])]}


def by_card(obj: dict | None) -> dict[str, dict]:
    """``{card: run}`` of a baseline; a plain run or a format-1 baseline is one card, its provenance's."""
    if not obj:
        return {}
    if is_baseline(obj):
        return dict(obj.get("cards", {}))
    card = run_card(obj)
    return {card: _section(obj, card)}


def pin(baseline: dict | None, run: dict, promoted: dict) -> dict:
    """The baseline with ``run`` as its card's rows: that card's earlier rows are replaced, every other card's kept.

    Replacing (not merging row by row) is right because ``promote`` only accepts a run of the whole roster.
    """
    card = run_card(run)
    pinned = by_card(baseline)
    pinned[card] = {**_section(run, card), "promoted": promoted}
    return {"format": BASELINE_FORMAT, "cards": dict(sorted(pinned.items()))}


def describe(pinned: dict[str, dict]) -> str:
    """``"H100, H200"`` or ``"no card"``: what a baseline (or run) holds, for messages."""
    return ", ".join(sorted(pinned)) or "no card"
