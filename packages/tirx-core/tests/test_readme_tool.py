# SPDX-License-Identifier: Apache-2.0
"""tools/readme_kernels.py: the README's performance table is made from the pinned baseline (one row per kernel and
card, stale rows marked, unregistered kernels left out), and ``--check`` fails when the table no longer matches."""

import copy
import importlib.util
import json
import os
import sys
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
_spec = importlib.util.spec_from_file_location("tirx_readme_tool", os.path.join(ROOT, "tools", "readme_kernels.py"))
readme = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(readme)


def _row(kernel, config, role, us, fp="fp-now", refs=None, status="ok"):
    return {"kernel": kernel, "config": config, "role": role, "us": us, "fingerprint": fp, "status": status,
            "references": {k: {"us": v} for k, v in (refs or {}).items()}}


def _baseline(rows_h100, rows_h200=None):
    def run(card, name, rows):
        return {"card": card, "provenance": {"gpu": {"name": name}}, "promoted": {"at": "2026-12-05T16:37:23Z"},
                "rows": rows}
    cards = {"H100": run("H100", "NVIDIA H100 80GB HBM3", rows_h100)}
    if rows_h200 is not None:
        cards["H200"] = run("H200", "NVIDIA H200", rows_h200)
    return {"format": "tirx-bench-suite-baseline/2", "cards": cards}


ENTRIES = {"rmsnorm": types.SimpleNamespace(path="/x/rmsnorm.py"), "gemm": types.SimpleNamespace(path="/x/gemm.py")}


def _fp(path):
    return "fp-now"


def test_one_row_per_kernel_and_card_with_the_fastest_reference():
    base = _baseline(
        [_row("rmsnorm", "bf16_32x128", "small", 1.0, refs={"flashinfer": 1.1}),
         _row("rmsnorm", "bf16_32768x8192", "large", 357.7, refs={"torch.compile": 358.7, "liger": 359.0}),
         _row("gemm", "bf16_a", "small", 5.0), _row("gemm", "bf16_b", "medium", 176.0, refs={"cublas": 176.2})],
        [_row("rmsnorm", "bf16_32768x8192", "large", 251.8, fp="fp-old", refs={"torch.compile": 251.0})])
    text = readme.render_perf(base, ENTRIES, _fp)
    assert text.startswith(readme.PERF_BEGIN) and text.endswith(readme.PERF_END)
    h100, h200 = text.split("**H200**")
    assert "**H100** (NVIDIA H100 80GB HBM3; pinned 2026-12-05)" in h100
    assert "| `rmsnorm` | `bf16_32768x8192` | 357.7 | torch.compile 358.7 | 1.00 |" in h100
    assert "bf16_32x128" not in h100  # the large row only
    assert "| `gemm` | `bf16_b` | 176.0 | cublas 176.2 | 1.00 |" in h100  # no large row: the roster's last
    assert "| `rmsnorm` | `bf16_32768x8192` | 251.8 (stale) | torch.compile 251.0 | 1.00 |" in h200
    assert "gemm" not in h200


def test_unregistered_failed_and_reference_less_rows():
    base = _baseline([_row("gone_kernel", "a", "large", 1.0), _row("gemm", "b", "large", 2.0, status="failed"),
                      _row("rmsnorm", "c", "large", 4.0)])
    text = readme.render_perf(base, ENTRIES, _fp)
    assert "| `rmsnorm` | `c` | 4.0 | — | — |" in text
    assert "Left out: `gemm` (failed), `gone_kernel` (not registered)." in text
    assert "No run is pinned yet" in readme.render_perf({"format": "tirx-bench-suite-baseline/2", "cards": {}},
                                                        ENTRIES, _fp)


def test_check_fails_on_a_stale_table_and_write_fixes_it(tmp_path, capsys):
    with open(readme.BASELINE, encoding="utf-8") as f:
        pinned = json.load(f)
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(pinned))
    page = tmp_path / "README.md"
    page.write_text(f"# t\n\n{readme.render()}\n\ntext\n\n{readme.PERF_BEGIN}\nold\n{readme.PERF_END}\n\nend\n")
    args = ["--readme", str(page), "--baseline", str(base)]
    assert readme.main(["--check", *args]) == 1
    assert "performance table does not match" in capsys.readouterr().out
    assert readme.main(["--write", *args]) == 0
    assert readme.main(["--check", *args]) == 0
    text = page.read_text()
    assert text.startswith("# t\n") and text.endswith("\n\nend\n") and "\ntext\n" in text
    # A re-pinned run (another µs) makes the committed table stale.
    newer = copy.deepcopy(pinned)
    card = sorted(newer["cards"])[0]
    large = [r for r in newer["cards"][card]["rows"] if r.get("role") == "large" and r.get("status") == "ok"]
    large[0]["us"] *= 0.5
    base.write_text(json.dumps(newer))
    assert readme.main(["--check", *args]) == 1
