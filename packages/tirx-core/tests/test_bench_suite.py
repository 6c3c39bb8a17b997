# SPDX-License-Identifier: Apache-2.0
"""The bench suite on CPU: rosters, promote, ratio_diff, status, provenance, row logic, kcoral plumbing.

No timing here: the rows' numbers are synthetic, and the measuring path runs with core.bench's
timers replaced by fakes.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tirx_kernels import registry
from tirx_kernels.bench_suite import cards, cli, compare, promote, provenance, report, roster
from tirx_kernels.bench_suite import run as run_mod
from tirx_kernels.core import artifacts
from tirx_kernels.core.reference_lock import repo_root

ROOT = repo_root(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def entries():
    return registry.scan()


@pytest.fixture()
def tmp_root(tmp_path):
    """A root holding a copy of the repo's rosters (promote writes bench_suite/ here)."""
    shutil.copytree(os.path.join(ROOT, "config"), tmp_path / "config")
    (tmp_path / "packages" / "tirx-core").mkdir(parents=True)
    return str(tmp_path)


H100 = "NVIDIA H100 80GB HBM3"


def synthetic_run(root: str, entries, gpu: str = "NVIDIA H200", slower: float = 1.0) -> dict:
    """A clean, complete, retry-free run of every roster row of every registered kernel (on ``gpu``)."""
    rosters = {k: v for k, v in roster.load_all(root).items() if k in entries}
    rows = []
    for i, r in enumerate(roster.select(rosters)):
        us = (10.0 + 7 * i) * slower
        refs = {"refA": {"us": us * 1.2, "ref_over_ours": 1.2, "timer": "events-cold-l2", "rounds_us": [us * 1.2] * 5},
                "refB": {"us": us * 0.9, "ref_over_ours": 0.9, "timer": "events-cold-l2", "rounds_us": [us * 0.9] * 5}}
        rows.append({"kernel": r.kernel, "config": r.config, "role": r.role, "package": r.package,
                     "rationale": r.rationale, "status": "ok", "errors": [], "us": us, "timer": "events-cold-l2",
                     "rounds_us": [us] * 5, "tflop_s": 1.0, "tb_s": 3.5, "bound": "memory", "pct_of_roofline": 82.0,
                     "references": refs, "fingerprint": artifacts.fingerprint(entries[r.kernel].path),
                     "attempts": 1, "retries": 0, "device_uuid": "GPU-1234"})
    env = {"host": {"hostname": "h200"}, "gpu": {"name": gpu, "uuid": "GPU-1234", "driver": "580.1",
                                                  "cuda_driver": "13.0", "cuda_runtime": "13.0", "sm_count": 132},
           "versions": {"python": "3.12.0", "nvcc": None, "tirx": {},
                        "runtime": {"torch": {"version": "2.11.0+cu130"}, "apache-tvm-ffi": {"version": "0.1.15.post2"},
                                    "apache-tvm": None},
                        "references": {"flashinfer-python": {"version": "0.7.4"}}},
           "artifacts": {"bundle": "/x", "tvm": "0.27.0", "nvcc": "13.0"}}
    prov = provenance.collect(root, 5, env)
    prov["git"] = {"commit": "a" * 40, "dirty": False, "dirty_files": [], "source": "git"}
    prov["ceilings"] = {"copy_tb_s": 4.27 / slower, "bf16_tflop_s": 750.0}
    return {"format": run_mod.RUN_FORMAT, "created": "2026-12-02T00:00:00Z", "argv": [], "mode": "local",
            "server": None, "with_references": True, "options": {"rounds": 5, "retries_allowed": 0},
            "complete": True, "missing_rows": [], "provenance": prov, "rows": rows,
            "summary": run_mod.summarize(rows)}


def write(tmp_path, name: str, obj) -> str:
    p = os.path.join(str(tmp_path), name)
    with open(p, "w") as f:
        json.dump(obj, f)
    return p


# ---------------------------------------------------------------------------------------------------------
# Rosters
# ---------------------------------------------------------------------------------------------------------

def test_repo_rosters_are_valid_against_the_registry(entries):
    rosters = roster.load_all(ROOT)
    assert {"rmsnorm", "act_and_mul", "fp16_bf16_gemm"} <= set(rosters)
    for name, ros in rosters.items():
        assert 1 <= len(ros.rows) <= roster.MAX_ROWS
        assert len({r.role for r in ros.rows}) == len(ros.rows)
        assert all(r.role in roster.ROLES and r.rationale for r in ros.rows)
        assert os.path.relpath(ros.path, ROOT) == os.path.join("config", ros.package, f"{name}.yaml")
        if name in entries:
            roster.validate(ros, entries[name])  # labels exist, package matches


def test_brief_rows(entries):
    rosters = roster.load_all(ROOT)
    assert [r.config for r in rosters["rmsnorm"].rows] == ["bf16_32x128", "bf16_8192x4096", "bf16_32768x8192"]
    assert [r.config for r in rosters["fp16_bf16_gemm"].rows] == [
        "bf16_1024x1024x1024", "bf16_4096x4096x4096", "bf16_8192x8192x8192"]


def test_roster_references_exist_in_get_baselines(entries):
    from tirx_kernels.core.harness import find_config, full_config

    for name, ros in roster.load_all(ROOT).items():
        if name not in entries:
            continue
        mod = registry.load(name)
        for row in ros.rows:
            have = mod.get_baselines(**full_config(mod, find_config(mod, row.config, bench=True)))
            assert set(row.references or []) <= set(have), (name, row.config, sorted(have))


def _roster_file(tmp_path, text: str, package="tirx-native", name="rmsnorm"):
    d = tmp_path / "config" / package
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.yaml"
    p.write_text(text)
    return str(p)


GOOD = """kernel: rmsnorm
package: tirx-native
rows:
  - role: small
    config: bf16_32x128
    rationale: tiny
"""


@pytest.mark.parametrize("text, match", [
    (GOOD + "".join(f"  - role: {r}\n    config: c{r}\n    rationale: x\n" for r in ("medium", "large", "small")),
     "at most 3"),
    (GOOD + "  - role: small\n    config: bf16_8192x4096\n    rationale: again\n", "appears twice"),
    (GOOD.replace("role: small", "role: huge"), "not one of"),
    (GOOD.replace("    rationale: tiny\n", ""), "rationale"),
    (GOOD.replace("kernel: rmsnorm", "kernel: other"), "file is named"),
    (GOOD.replace("package: tirx-native", "package: tirx-core"), "lives in config/tirx-native"),
    (GOOD + "extra: 1\n", "unknown key"),
    ("kernel: rmsnorm\npackage: tirx-native\nrows: []\n", "non-empty"),
    (GOOD.replace("rows:", "references: flashinfer\nrows:"), "list of reference names"),
])
def test_roster_shape_errors(tmp_path, text, match):
    with pytest.raises(roster.RosterError, match=match):
        roster.parse(_roster_file(tmp_path, text))


def test_roster_unknown_label_and_wrong_package(tmp_path, entries):
    ros = roster.parse(_roster_file(tmp_path, GOOD.replace("bf16_32x128", "bf16_no_such")))
    with pytest.raises(roster.RosterError, match="has no config 'bf16_no_such'"):
        roster.validate(ros, entries["rmsnorm"])
    ros = roster.parse(_roster_file(tmp_path, GOOD.replace("tirx-native", "tirx-port-misc"), package="tirx-port-misc"))
    with pytest.raises(roster.RosterError, match="registered by tirx-native"):
        roster.validate(ros, entries["rmsnorm"])


def test_row_references_override_and_selection(tmp_path):
    text = GOOD.replace("rows:", "references: [torch, liger]\nrows:") + \
        "  - role: large\n    config: bf16_32768x8192\n    rationale: big\n    references: [torch]\n"
    ros = roster.parse(_roster_file(tmp_path, text))
    assert [(r.role, r.references) for r in ros.rows] == [("small", ["torch", "liger"]), ("large", ["torch"])]
    rows = roster.select({"rmsnorm": ros}, roles=["large"])
    assert [r.config for r in rows] == ["bf16_32768x8192"]
    with pytest.raises(roster.RosterError, match="no roster for nope"):
        roster.select({"rmsnorm": ros}, kernels=["nope"])


def test_mini_yaml_matches_pyyaml_on_the_repo_rosters():
    yaml = pytest.importorskip("yaml")
    for path in roster.roster_files(ROOT):
        text = open(path).read()
        assert roster.mini_yaml(text, path) == yaml.safe_load(text), path


# ---------------------------------------------------------------------------------------------------------
# promote
# ---------------------------------------------------------------------------------------------------------

def test_promote_writes_baseline_json_md_and_chart(tmp_root, tmp_path, entries):
    run = synthetic_run(tmp_root, entries)
    assert promote.problems(run, tmp_root, entries) == []
    res = promote.promote(write(tmp_path, "run.json", run), tmp_root, entries)
    base = json.load(open(res["json"]))
    assert base["format"] == cards.BASELINE_FORMAT and list(base["cards"]) == ["H200"] and res["card"] == "H200"
    h200 = base["cards"]["H200"]
    assert h200["rows"] == [{**r, "card": "H200", "promotion": 0} for r in run["rows"]]
    assert h200["promoted"]["from"] == "run.json"
    md = open(res["md"]).read()
    assert "## H200: NVIDIA H200" in md
    for kernel in {r["kernel"] for r in run["rows"]}:
        assert f"| {kernel} |" in md and f"- **{kernel}**" in md
    first = run["rows"][0]
    assert f"`{first['config']}`" in md
    # fastest reference is refB (0.9x), others listed with their ratio
    assert "| refB |" in md and "refA" in md and "82 %" in md
    assert "`" + "a" * 40 + "`" in md and "NVIDIA H200" in md
    if importlib.util.find_spec("matplotlib"):
        assert res["png"] and os.path.getsize(res["png"]) > 1000 and "baseline.png" in md
    else:
        assert res["png"] is None and "Chart skipped" in md


def test_a_reference_not_installed_is_pinned_as_skipped_with_its_reason(tmp_root, tmp_path, entries):
    run = synthetic_run(tmp_root, entries)
    run["rows"][0]["skipped_references"] = {"fa4": "ImportError: No module named 'flash_attn.cute'"}
    assert promote.problems(run, tmp_root, entries) == []
    res = promote.promote(write(tmp_path, "run.json", run), tmp_root, entries)
    assert "fa4: not installed" in open(res["md"]).read()
    assert "reference skipped:" in report.summary_table(run) and "flash_attn.cute" in report.summary_table(run)


def test_markdown_notes_a_skipped_chart(tmp_root, entries, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    base = cards.pin(None, synthetic_run(tmp_root, entries), {"at": "now", "from": "run.json"})
    res = promote.write_baseline(base, os.path.join(tmp_root, "bench_suite"))
    assert res["png"] is None and "matplotlib" in res["chart_note"]
    assert "_Chart skipped: matplotlib is not installed" in open(res["md"]).read()


def _mutated(run, how):
    r = copy.deepcopy(run)
    how(r)
    return r


@pytest.mark.parametrize("how, match", [
    (lambda r: r["provenance"]["git"].update(dirty=True, dirty_files=["x.py"]), "dirty tree \\(x.py"),
    (lambda r: r["provenance"]["git"].update(dirty=True, dirty_files=["bench_suite/baseline.json", "x.py"]),
     "dirty tree"),
    (lambda r: r["provenance"]["git"].update(dirty=True, dirty_files=[]), "dirty tree \\(state unknown"),
    (lambda r: r["provenance"]["git"].update(commit=None, dirty=None, reason="no git"), "commit is unknown"),
    (lambda r: r["rows"][0].update(status="failed", errors=[{"where": "liger", "reason": "liger missing"}]),
     "status failed: liger missing"),
    (lambda r: r["rows"][1].update(retries=2, retry_reasons=["CUDA error"]), "2 retries"),
    (lambda r: r["rows"].pop(), "roster row missing from the run"),
    (lambda r: r.update(with_references=False), "without --with-references"),
    (lambda r: r["options"].update(rounds=3), "3 rounds"),
    (lambda r: r["rows"][0].update(fingerprint="0" * 16), "stale"),
    (lambda r: r["rows"].append({**r["rows"][0], "config": "bf16_not_in_roster"}), "no longer list"),
])
def test_promote_refuses(tmp_root, tmp_path, entries, how, match):
    run = _mutated(synthetic_run(tmp_root, entries), how)
    path = write(tmp_path, "run.json", run)
    with pytest.raises(promote.PromoteError, match=match):
        promote.promote(path, tmp_root, entries)
    assert not os.path.exists(os.path.join(tmp_root, "bench_suite", "baseline.json"))


def _split(run, at):
    a, b = copy.deepcopy(run), copy.deepcopy(run)
    a["rows"], b["rows"] = run["rows"][:at], run["rows"][at:]
    b["provenance"]["gpu"]["uuid"] = "GPU-other-host"
    return a, b


def test_promote_joins_the_parts_of_one_cards_run(tmp_root, tmp_path, entries):
    run = synthetic_run(tmp_root, entries)
    a, b = _split(run, 2)
    paths = [write(tmp_path, "part1.json", a), write(tmp_path, "part2.json", b)]
    # One part alone lacks the other's rows.
    with pytest.raises(promote.PromoteError, match="roster row missing from the run"):
        promote.promote(paths[0], tmp_root, entries)
    assert cli.main(["promote", *paths, "--root", tmp_root]) == 0
    h200 = json.load(open(os.path.join(tmp_root, "bench_suite", "baseline.json")))["cards"]["H200"]
    assert [(r["kernel"], r["config"]) for r in h200["rows"]] == [(r["kernel"], r["config"]) for r in run["rows"]]
    assert [p["from"] for p in h200["parts"]] == ["part1.json", "part2.json"]
    assert h200["parts"][1]["gpu"]["uuid"] == "GPU-other-host"
    assert h200["promoted"]["from"] == "part1.json + part2.json"


def _only(run, kernels):
    out = copy.deepcopy(run)
    out["rows"] = [r for r in out["rows"] if r["kernel"] in kernels]
    return out


def test_partial_promote_pins_the_kernels_it_holds_and_keeps_the_cards_others(tmp_root, tmp_path, entries):
    full = synthetic_run(tmp_root, entries)
    assert cli.main(["promote", write(tmp_path, "full.json", full), "--root", tmp_root]) == 0
    names = sorted({r["kernel"] for r in full["rows"]})
    first, rest = names[0], names[1:]
    later = synthetic_run(tmp_root, entries, slower=2.0)
    later["provenance"]["gpu"]["uuid"] = "GPU-next-session"
    part = _only(later, {first})
    # Without --partial the subset is refused (rows of the other kernels missing); with it, pinned.
    assert cli.main(["promote", write(tmp_path, "part.json", part), "--root", tmp_root]) == 1
    assert cli.main(["promote", write(tmp_path, "part.json", part), "--root", tmp_root, "--partial"]) == 0
    base = json.load(open(os.path.join(tmp_root, "bench_suite", "baseline.json")))
    h200 = base["cards"]["H200"]
    got = {(r["kernel"], r["config"]): r for r in h200["rows"]}
    assert set(got) == {(r["kernel"], r["config"]) for r in full["rows"]}
    assert [p["from"] for p in h200["promotions"]] == ["full.json", "part.json"]
    assert h200["promotions"][1]["kernels"] == [first]
    for r in full["rows"]:
        pinned = got[(r["kernel"], r["config"])]
        assert pinned["promotion"] == (1 if r["kernel"] == first else 0)
        assert pinned["us"] == (r["us"] * 2 if r["kernel"] == first else r["us"])
        assert cards.row_provenance(h200, pinned)["gpu"]["uuid"] == ("GPU-next-session" if r["kernel"] == first
                                                                     else "GPU-1234")
    md = open(os.path.join(tmp_root, "bench_suite", "baseline.md")).read()
    assert "come from 2 promotions" in md and "GPU-next-session" in md
    assert all(it["up_to_date"] for it in compare.status(tmp_root, base, entries, card="H200"))
    # ratio_diff judges each row under its own environment: the full run against this baseline differs only in the
    # re-pinned kernel's rows (its host and its times), every other row passes.
    res = compare.ratio_diff(base, full)
    failed = {r["kernel"] for r in res["rows"] if not r["passed"]}
    assert failed == {first}
    # Re-pinning every other kernel drops the first promotion, which no row uses any more.
    assert cli.main(["promote", write(tmp_path, "rest.json", _only(later, set(rest))), "--root", tmp_root,
                     "--partial"]) == 0
    h200 = json.load(open(os.path.join(tmp_root, "bench_suite", "baseline.json")))["cards"]["H200"]
    assert [p["from"] for p in h200["promotions"]] == ["part.json", "rest.json"]
    assert {r["promotion"] for r in h200["rows"]} == {0, 1}


def test_partial_promote_takes_a_kernel_whole_or_not_at_all(tmp_root, tmp_path, entries):
    run = synthetic_run(tmp_root, entries)
    kernel = run["rows"][0]["kernel"]
    part = _only(run, {kernel})
    part["rows"] = part["rows"][:-1]
    found = promote.problems(part, tmp_root, entries, partial=True)
    assert found and all("roster row missing from the run" in p and kernel in p for p in found)
    empty = _only(run, set())
    assert "the run holds no rows" in promote.problems(empty, tmp_root, entries, partial=True)


@pytest.mark.parametrize("how, match", [
    (lambda a, b: b["provenance"]["gpu"].update(name="NVIDIA H100 80GB HBM3"), "different cards"),
    (lambda a, b: b["provenance"]["git"].update(commit="b" * 40), "different source states"),
    (lambda a, b: b["rows"].append(copy.deepcopy(a["rows"][0])), "measured by both part1.json and part2.json"),
])
def test_promote_refuses_parts_that_do_not_join(tmp_root, tmp_path, entries, how, match):
    a, b = _split(synthetic_run(tmp_root, entries), 2)
    how(a, b)
    with pytest.raises(promote.PromoteError, match=match):
        promote.promote([write(tmp_path, "part1.json", a), write(tmp_path, "part2.json", b)], tmp_root, entries)
    assert not os.path.exists(os.path.join(tmp_root, "bench_suite", "baseline.json"))


def test_promote_refuses_a_kernel_without_roster(tmp_root, entries):
    os.remove(os.path.join(tmp_root, "config", "tirx-native", "rmsnorm.yaml"))
    run = synthetic_run(tmp_root, entries)
    assert any("rmsnorm has no roster" in p for p in promote.problems(run, tmp_root, entries))


def test_promote_refuses_while_the_registry_skips_a_module(tmp_root, entries, monkeypatch):
    problem = registry.Problem("/x/bad.py", "/x/bad.py: KERNEL_META is missing key 'category'", "bad_kernel")
    monkeypatch.setattr(registry, "problems", lambda *a, **k: [problem])
    found = promote.problems(synthetic_run(tmp_root, entries), tmp_root, entries)
    assert found == ["the registry skipped a module: /x/bad.py: KERNEL_META is missing key 'category'"]


def test_promote_cli_exit_codes(tmp_root, tmp_path, entries):
    run = synthetic_run(tmp_root, entries)
    bad = _mutated(run, lambda r: r["rows"][0].update(retries=1))
    assert cli.main(["promote", write(tmp_path, "bad.json", bad), "--root", tmp_root]) == 1
    assert cli.main(["promote", write(tmp_path, "good.json", run), "--root", tmp_root]) == 0
    assert os.path.exists(os.path.join(tmp_root, "bench_suite", "baseline.md"))


# ---------------------------------------------------------------------------------------------------------
# ratio_diff
# ---------------------------------------------------------------------------------------------------------

def test_ratio_diff_same_run_passes_and_small_noise_passes(tmp_root, entries):
    before = synthetic_run(tmp_root, entries)
    after = _mutated(before, lambda r: [x.update(us=x["us"] * 1.005) for x in r["rows"]])
    res = compare.ratio_diff(before, after)
    assert res["passed"] and all(abs(r["ratio"] - 1.005) < 1e-9 for r in res["rows"])


def test_ratio_diff_fails_a_slower_row(tmp_root, entries):
    before = synthetic_run(tmp_root, entries)
    after = _mutated(before, lambda r: r["rows"][2].update(us=r["rows"][2]["us"] * 1.01))
    res = compare.ratio_diff(before, after)
    failed = [r for r in res["rows"] if not r["passed"]]
    assert not res["passed"] and len(failed) == 1 and ">= 1.01" in failed[0]["reasons"][0]


def test_ratio_diff_fails_every_row_on_a_different_gpu_or_version(tmp_root, entries):
    before = synthetic_run(tmp_root, entries)
    for how, what in ((lambda r: r["provenance"]["gpu"].update(uuid="GPU-other"), "gpu:uuid"),
                      (lambda r: r["provenance"]["versions"]["runtime"]["torch"].update(version="2.12"),
                       "runtime:torch"),
                      (lambda r: r["provenance"]["versions"]["references"].update({"flashinfer-python": None}),
                       "references:flashinfer-python")):
        res = compare.ratio_diff(before, _mutated(before, how))
        assert not res["passed"] and all(not r["passed"] for r in res["rows"])
        assert any(what in d for d in res["environment_differences"])


def test_ratio_diff_source_change_and_missing_rows(tmp_root, entries):
    before = synthetic_run(tmp_root, entries)
    after = _mutated(before, lambda r: r["rows"][0].update(fingerprint="f" * 16))
    assert not compare.ratio_diff(before, after)["passed"]
    res = compare.ratio_diff(before, after, allow_source_change=True)
    assert res["passed"] and "kernel source" in res["rows"][0]["notes"][0] or res["passed"]
    gone = _mutated(before, lambda r: r["rows"].pop(0))
    assert not compare.ratio_diff(before, gone)["passed"]
    failed = _mutated(before, lambda r: r["rows"][0].update(status="failed"))
    assert not compare.ratio_diff(before, failed)["passed"]


def test_ratio_diff_cli(tmp_root, tmp_path, entries, capsys):
    before = synthetic_run(tmp_root, entries)
    slow = _mutated(before, lambda r: r["rows"][0].update(us=r["rows"][0]["us"] * 1.5))
    b, a = write(tmp_path, "b.json", before), write(tmp_path, "a.json", slow)
    assert cli.main(["ratio_diff", b, b]) == 0
    assert cli.main(["ratio_diff", b, a]) == 1
    assert "FAIL" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------------------

def test_status_up_to_date_missing_and_stale(tmp_root, entries):
    base = synthetic_run(tmp_root, entries)
    items = {i["kernel"]: i for i in compare.status(tmp_root, base, entries)}
    rostered = set(roster.load_all(tmp_root)) & set(entries)
    assert all(items[k]["up_to_date"] for k in rostered)
    stale = _mutated(base, lambda r: r["rows"][0].update(fingerprint="0" * 16))
    k0, c0 = base["rows"][0]["kernel"], base["rows"][0]["config"]
    it = {i["kernel"]: i for i in compare.status(tmp_root, stale, entries)}[k0]
    assert it["stale"] == [c0] and not it["up_to_date"]
    gone = _mutated(base, lambda r: r["rows"].pop(0))
    it = {i["kernel"]: i for i in compare.status(tmp_root, gone, entries)}[k0]
    assert it["missing"] == [c0]
    none = compare.status(tmp_root, None, entries)
    assert all(not i["up_to_date"] for i in none)


def test_status_cli_check(tmp_root, tmp_path, entries):
    assert cli.main(["status", "--root", tmp_root]) == 0
    assert cli.main(["status", "--root", tmp_root, "--check"]) == 1
    path = write(tmp_path, "base.json", synthetic_run(tmp_root, entries))
    rostered = set(roster.load_all(tmp_root))
    if set(entries) <= rostered:
        assert cli.main(["status", "--root", tmp_root, "--check", "--baseline", path]) == 0


# ---------------------------------------------------------------------------------------------------------
# Evidence per card
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), (" NVIDIA H200 ", "H200"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA H100 NVL", "NVIDIA H100 NVL"), (None, "unknown"),
    ("", "unknown"),
])
def test_card_key(name, key):
    assert cards.card_key(name) == key


def test_named_card_ignores_case():
    """``--card h100`` once read "no h100 rows pinned" beside a baseline holding H100 (2026-12-07)."""
    assert cards.named_card("h100", ["H200"]) == "H100" and cards.named_card(" h200 ", []) == "H200"
    assert cards.named_card("nvidia h100 pcie", ["NVIDIA H100 PCIe"]) == "NVIDIA H100 PCIe"
    assert cards.named_card("NVIDIA H100 80GB HBM3") == "H100" and cards.named_card(None) is None


def test_promote_keeps_the_other_cards_rows(tmp_root, tmp_path, entries):
    h200, h100 = synthetic_run(tmp_root, entries), synthetic_run(tmp_root, entries, H100, slower=1.4)
    promote.promote(write(tmp_path, "h200.json", h200), tmp_root, entries)
    res = promote.promote(write(tmp_path, "h100.json", h100), tmp_root, entries)
    base = json.load(open(res["json"]))
    assert list(base["cards"]) == ["H100", "H200"] and res["card"] == "H100"
    assert [r["us"] for r in base["cards"]["H200"]["rows"]] == [r["us"] for r in h200["rows"]]
    assert [r["us"] for r in base["cards"]["H100"]["rows"]] == [r["us"] for r in h100["rows"]]
    assert all(r["card"] == "H100" for r in base["cards"]["H100"]["rows"])
    again = _mutated(h200, lambda r: [x.update(us=x["us"] * 0.9) for x in r["rows"]])
    base = promote.promote(write(tmp_path, "again.json", again), tmp_root, entries)["baseline"]
    assert base["cards"]["H200"]["promoted"]["from"] == "again.json"
    assert [r["us"] for r in base["cards"]["H200"]["rows"]] == [r["us"] for r in again["rows"]]
    assert base["cards"]["H100"]["promoted"]["from"] == "h100.json"


def test_promote_migrates_a_one_run_baseline(tmp_root, tmp_path, entries):
    """A format-1 baseline (one promoted run, no cards) keeps its rows under its provenance's card."""
    old = {**synthetic_run(tmp_root, entries), "promoted": {"at": "2026-12-03T21:53:34Z", "from": "old.json"}}
    os.makedirs(os.path.join(tmp_root, "bench_suite"))
    write(os.path.join(tmp_root, "bench_suite"), "baseline.json", old)
    base = promote.promote(write(tmp_path, "h100.json", synthetic_run(tmp_root, entries, H100)), tmp_root,
                           entries)["baseline"]
    assert list(base["cards"]) == ["H100", "H200"] and base["cards"]["H200"]["promoted"]["from"] == "old.json"


def test_promote_refuses_a_run_without_a_gpu_name(tmp_root, entries):
    run = _mutated(synthetic_run(tmp_root, entries), lambda r: r["provenance"]["gpu"].update(name=None))
    assert any("GPU is unknown" in p for p in promote.problems(run, tmp_root, entries))


def _two_card_baseline(tmp_root, entries) -> dict:
    base = cards.pin(None, synthetic_run(tmp_root, entries), {"at": "t1", "from": "h200.json"})
    return cards.pin(base, synthetic_run(tmp_root, entries, H100, slower=1.4), {"at": "t2", "from": "h100.json"})


def test_ratio_diff_refuses_another_cards_rows(tmp_root, tmp_path, entries, capsys):
    h200_only = cards.pin(None, synthetic_run(tmp_root, entries), {"at": "t1", "from": "h200.json"})
    h100_run = synthetic_run(tmp_root, entries, H100, slower=1.4)
    res = compare.ratio_diff(h200_only, h100_run)
    assert not res["passed"] and res["rows"] == [] and res["cards"] == []
    assert "no H100 rows pinned in the before baseline (it holds H200)" in res["refused"]
    res = compare.ratio_diff(synthetic_run(tmp_root, entries), h100_run)  # two runs on different cards
    assert not res["passed"] and "no H100 rows in the before run (it holds H200)" in res["refused"]
    assert cli.main(["ratio_diff", write(tmp_path, "b.json", h200_only), write(tmp_path, "a.json", h100_run)]) == 1
    assert "REFUSED: nothing compared: no H100 rows pinned" in capsys.readouterr().out


def test_ratio_diff_compares_a_run_with_its_own_cards_rows(tmp_root, entries):
    base = _two_card_baseline(tmp_root, entries)
    h100_run = synthetic_run(tmp_root, entries, H100, slower=1.4)
    res = compare.ratio_diff(base, h100_run)
    assert res["passed"] and res["cards"] == ["H100"] and all(r["card"] == "H100" for r in res["rows"])
    assert all(abs(r["ratio"] - 1.0) < 1e-9 for r in res["rows"])
    assert res["not_compared"] == ["no H200 rows in the after run (it holds H100)"]
    # the H200 rows are 1.4x faster, yet an H200 run only meets them, never the H100 rows
    assert compare.ratio_diff(base, synthetic_run(tmp_root, entries))["passed"]
    slow = _mutated(h100_run, lambda r: r["rows"][0].update(us=r["rows"][0]["us"] * 1.05))
    res = compare.ratio_diff(base, slow, card="H100")
    assert not res["passed"] and [r["passed"] for r in res["rows"]].count(False) == 1
    assert compare.ratio_diff(base, h100_run, card="H200")["refused"]


def test_status_per_card(tmp_root, tmp_path, entries, capsys):
    base = _two_card_baseline(tmp_root, entries)
    rostered = set(roster.load_all(tmp_root)) & set(entries)
    items = compare.status(tmp_root, base, entries)
    assert {i["card"] for i in items} == {"H100", "H200"}
    assert all(i["up_to_date"] for i in items if i["kernel"] in rostered)
    k0 = base["cards"]["H100"]["rows"][0]["kernel"]
    base["cards"]["H100"]["rows"][0]["fingerprint"] = "0" * 16
    by = {(i["card"], i["kernel"]): i for i in compare.status(tmp_root, base, entries)}
    assert by[("H100", k0)]["stale"] and by[("H200", k0)]["up_to_date"]
    h200_only = cards.pin(None, synthetic_run(tmp_root, entries), {"at": "t1", "from": "h200.json"})
    items = compare.status(tmp_root, h200_only, entries, card="H100")
    assert {i["card"] for i in items} == {"H100"} and all(not i["up_to_date"] for i in items)
    path = write(tmp_path, "base.json", h200_only)
    assert cli.main(["status", "--root", tmp_root, "--baseline", path, "--card", "H100", "--check"]) == 1
    assert "card H100: no H100 rows pinned (the baseline holds H200)" in capsys.readouterr().out
    if set(entries) <= set(roster.load_all(tmp_root)):
        assert cli.main(["status", "--root", tmp_root, "--baseline", path, "--card", "H200", "--check"]) == 0
        assert cli.main(["status", "--root", tmp_root, "--baseline", path, "--card", "h200", "--check"]) == 0


def test_baseline_md_has_one_section_per_card(tmp_root, entries):
    res = promote.write_baseline(_two_card_baseline(tmp_root, entries), os.path.join(tmp_root, "bench_suite"))
    md = open(res["md"]).read()
    h100, h200 = md.index("## H100: NVIDIA H100 80GB HBM3"), md.index("## H200: NVIDIA H200")
    assert md.count("\n## H1") + md.count("\n## H2") == 2
    assert "| ceilings (H100 run) | copy 3.05 TB/s" in md[h100:h200]  # 4.27 / 1.4: each card its own ceilings
    assert "| ceilings (H200 run) | copy 4.27 TB/s" in md[h200:]
    assert "ours µs (H100)" in md[h100:h200] and "ours µs (H200)" in md[h200:]


def test_repo_baseline_is_pinned_per_card():
    with open(os.path.join(ROOT, "bench_suite", "baseline.json")) as f:
        base = json.load(f)
    assert cards.is_baseline(base) and base["cards"]
    for card, run in base["cards"].items():
        assert card == run["card"] == cards.run_card(run)
        assert all(r["card"] == card for r in run["rows"]) and run["provenance"]["ceilings"]
    with open(os.path.join(ROOT, "bench_suite", "baseline.md")) as f:
        md = f.read()
    assert all(f"## {card}: " in md for card in base["cards"])


# ---------------------------------------------------------------------------------------------------------
# provenance
# ---------------------------------------------------------------------------------------------------------

def test_provenance_fields_present():
    p = provenance.collect(ROOT, 5)
    for key in ("git", "host", "gpu", "versions", "artifacts", "timer", "protocol", "collected"):
        assert key in p, key
    for key in ("name", "uuid", "driver", "cuda_driver", "cuda_runtime"):
        assert key in p["gpu"], key  # None allowed on a CPU machine
    assert p["versions"]["runtime"]["torch"]["version"]
    assert "apache-tvm" in p["versions"]["runtime"] and "apache-tvm-ffi" in p["versions"]["runtime"]
    assert "flashinfer-python" in p["versions"]["references"]  # installed or None, always listed
    assert "tirx-core" in p["versions"]["tirx"]
    assert p["timer"]["cold_l2"] and p["timer"]["rounds"] == 5 and p["timer"]["flush_bytes"] >= 256 * 2**20
    assert set(p["git"]) >= {"commit", "dirty", "source"}
    json.dumps(p)


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def no_caller_git(monkeypatch):
    """The repos below are temporary ones: the caller's GIT_DIR / GIT_WORK_TREE (the GPU host's runs set GIT_DIR to a
    missing directory so that nothing reads the snapshot's absent .git) would point git, and git_state, elsewhere."""
    for k in [k for k in os.environ if k.startswith("GIT_")]:
        monkeypatch.delenv(k)


def _committed_repo(tmp_path, message="c"):
    """A git repo with one committed source file, ``packages/tirx-core/a.py`` (``x = 1``)."""
    repo = tmp_path / "repo"
    (repo / "packages" / "tirx-core").mkdir(parents=True)
    (repo / "packages" / "tirx-core" / "a.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", message)
    return repo


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_source_stamp_stands_in_for_git(tmp_path, no_caller_git):
    repo = _committed_repo(tmp_path)
    state = provenance.git_state(str(repo))
    assert state["source"] == "git" and state["dirty"] is False and len(state["commit"]) == 40
    provenance.write_stamp(str(repo), str(repo / "build" / "source-stamp.json"))
    shutil.rmtree(repo / ".git")
    st = provenance.git_state(str(repo))
    assert st["source"].startswith("stamp:") and st["commit"] == state["commit"] and st["dirty"] is False
    (repo / "packages" / "tirx-core" / "a.py").write_text("x = 2\n")
    (repo / "packages" / "tirx-core" / "new.py").write_text("")
    st = provenance.git_state(str(repo))
    assert st["dirty"] is True and set(st["dirty_files"]) == {"packages/tirx-core/a.py", "packages/tirx-core/new.py"}
    os.remove(repo / "build" / "source-stamp.json")
    st = provenance.git_state(str(repo))
    assert st["commit"] is None and st["dirty"] is None and "stamp" in st["reason"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stamp_wins_over_a_stale_git_head(tmp_path, no_caller_git):
    """The device tool carries the base commit's .git with a newer tree: a run trusts the stamp."""
    repo = _committed_repo(tmp_path, "base")
    shutil.copytree(repo / ".git", tmp_path / "base.git")
    (repo / "packages" / "tirx-core" / "a.py").write_text("x = 2\n")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-am", "new")
    new = provenance.git_state(str(repo))["commit"]
    provenance.write_stamp(str(repo), str(repo / "build" / "source-stamp.json"))
    shutil.rmtree(repo / ".git")
    shutil.copytree(tmp_path / "base.git", repo / ".git")  # the stale .git of the device copy
    assert provenance.git_state(str(repo))["dirty"] is True  # git alone: a.py differs from base
    st = provenance.git_state(str(repo), prefer_stamp=True)
    assert st["source"].startswith("stamp:") and st["commit"] == new and st["dirty"] is False


# ---------------------------------------------------------------------------------------------------------
# Row logic with fake timers (no GPU), retries, the run JSON
# ---------------------------------------------------------------------------------------------------------

class FakeModule:
    KERNEL_META = {"name": "fake", "runtime_cuda_archs": ["sm_90a"]}

    def __init__(self, us):
        self.us = us

    def prepare_data(self, **cfg):
        return {"x": 1}

    def launch(self, cfg, data):
        pass

    def roofline(self, **cfg):
        return {"bytes": 4.27e6, "flops": 0}  # 1 us at 4.27 TB/s

    def get_baselines(self, **cfg):
        def ok():
            return lambda data: {"out": 1}

        def missing():
            raise ImportError("No module named 'liger_kernel'")

        def broken():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"fast": ok, "liger": missing, "broken": broken}


@pytest.fixture()
def fake_timers(monkeypatch):
    import torch

    from tirx_kernels.core import arch, bench

    calls = {"graph": []}

    def time_calls(fns, rounds=5, **kw):
        return {n: {"median_us": FakeModule.current.us[n], "rounds_us": [FakeModule.current.us[n]] * rounds,
                    "timer": "events-cold-l2"} for n in fns}

    def time_graph(fn, rounds=5, **kw):
        calls["graph"].append(fn)
        return {"median_us": 1.0, "rounds_us": [1.0] * rounds, "timer": "graph"}

    monkeypatch.setattr(bench, "time_calls", time_calls)
    monkeypatch.setattr(bench, "time_graph", time_graph)
    monkeypatch.setattr(bench, "ceilings", lambda: {"copy_tb_s": 4.27, "bf16_tflop_s": 750.0})
    monkeypatch.setattr(arch, "check_arch", lambda meta, device=None: "sm_90a")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return calls


def test_enabled_reference_that_raises_or_is_unknown_fails_the_row_with_its_reason(fake_timers):
    FakeModule.current = FakeModule({"ours": 20.0, "fast": 30.0})
    r = run_mod.measure_row(FakeModule.current, {}, True, ["fast", "liger", "broken", "nope"], rounds=5)
    where = {e["where"]: e["reason"] for e in r["errors"]}
    assert set(where) == {"broken", "nope"}
    assert "illegal memory access" in where["broken"]
    assert "has no such entry" in where["nope"]
    # Not installed here: skipped with its reason, not timed, not an error.
    assert "No module named 'liger_kernel'" in r["skipped_references"]["liger"]
    assert "liger" not in r["references"]
    assert r["references"]["fast"]["ref_over_ours"] == pytest.approx(1.5)
    assert r["timer"] == "events-cold-l2" and not fake_timers["graph"]
    assert r["bound"] == "memory" and r["pct_of_roofline"] == pytest.approx(5.0)
    assert len(r["rounds_us"]) == 5


def test_without_references_nothing_but_ours_runs(fake_timers):
    FakeModule.current = FakeModule({"ours": 20.0})
    r = run_mod.measure_row(FakeModule.current, {}, False, None, rounds=7)
    assert r["references"] == {} and r["errors"] == [] and len(r["rounds_us"]) == 7


def test_sub_threshold_row_is_graph_timed_for_every_implementation(fake_timers):
    FakeModule.current = FakeModule({"ours": 50.0, "fast": 6.0})
    r = run_mod.measure_row(FakeModule.current, {}, True, ["fast"], rounds=5)
    assert len(fake_timers["graph"]) == 2
    assert r["timer"] == "graph" and r["references"]["fast"]["timer"] == "graph"
    assert r["cold_l2_us"] == 50.0 and r["references"]["fast"]["cold_l2_us"] == 6.0


class FlakyExecutor:
    mode, server = "local", None

    def __init__(self, fail_times):
        self.fail_times = fail_times

    def measure(self, spec):
        if self.fail_times:
            self.fail_times -= 1
            return {"kernel": spec["kernel"], "config": spec["config"], "status": "error",
                    "errors": [{"where": "ours", "reason": "CUDA error: transient"}]}
        return {"kernel": spec["kernel"], "config": spec["config"], "status": "ok", "errors": [], "us": 5.0}


def test_a_kernel_the_registry_skipped_fails_its_row(monkeypatch):
    problem = registry.Problem("/x/bad.py", "/x/bad.py: KERNEL_META is missing key 'category'", "bad_kernel")
    monkeypatch.setattr(registry, "scan", lambda *a, **k: {})
    monkeypatch.setattr(registry, "problems", lambda *a, **k: [problem])
    row = run_mod.measure_spec({"kernel": "bad_kernel", "config": "c"})
    assert row["status"] == "failed" and "skipped its module: /x/bad.py: KERNEL_META" in row["errors"][0]["reason"]
    assert run_mod.measure_spec({"kernel": "other", "config": "c"})["status"] == "skipped"


def test_select_runs_kernels_in_the_order_asked():
    rosters = roster.load_all(ROOT)
    asked = [k for k in ("rmsnorm", "act_and_mul", "fp16_bf16_gemm") if k in rosters][::-1]
    order = list(dict.fromkeys(r.kernel for r in roster.select(rosters, asked)))
    assert order == asked and asked != sorted(asked)
    assert list(dict.fromkeys(r.kernel for r in roster.select(rosters))) == sorted(rosters)


def test_retries_are_recorded_and_exhausted_retries_fail():
    rows = roster.select(roster.load_all(ROOT), ["rmsnorm"], ["small"])
    res = run_mod.run_rows(rows, FlakyExecutor(1), False, 5, retries=2, progress=False)
    assert res[0]["status"] == "ok" and res[0]["retries"] == 1 and res[0]["retry_reasons"] == ["CUDA error: transient"]
    res = run_mod.run_rows(rows, FlakyExecutor(5), False, 5, retries=1, progress=False)
    assert res[0]["status"] == "failed" and res[0]["attempts"] == 2


def test_run_json_records_rows_and_completeness(tmp_path):
    rows = roster.select(roster.load_all(ROOT), ["rmsnorm"])
    results = run_mod.run_rows(rows, FlakyExecutor(0), True, 5, progress=False)
    run = run_mod.build_run(ROOT, rows, results, FlakyExecutor(0), True, 5, 0, {"kernel": ["rmsnorm"]},
                            {"gpu": {}, "versions": {}})
    assert run["format"] == run_mod.RUN_FORMAT and run["summary"]["ok"] == len(rows) == len(run["rows"])
    assert run["complete"] is False and run["missing_rows"]  # the other kernels' rows were not selected
    assert {"role", "rationale", "attempts", "retries", "enabled_references"} <= set(run["rows"][0])
    assert "rmsnorm" in report.summary_table(run)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU host this would benchmark for real")
def test_cli_run_on_cpu_skips_every_row_with_its_reason(tmp_path):
    out = str(tmp_path / "run.json")
    assert cli.main(["run", "--kernel", "rmsnorm", "--with-references", "--out", out, "--no-progress"]) == 0
    run = json.load(open(out))
    assert run["summary"]["skipped"] == len(run["rows"]) == 3
    assert all("CUDA" in r["errors"][0]["reason"] and r["fingerprint"] for r in run["rows"])
    assert run["provenance"]["gpu"]["uuid"] is None and run["provenance"]["timer"]["rounds"] == 5


# ---------------------------------------------------------------------------------------------------------
# kcoral remote mode: the program, and a real (CPU) kcoral server when its front end is installed
# ---------------------------------------------------------------------------------------------------------

def test_kcoral_program_shape():
    pytest.importorskip("kcoral")
    from tirx_kernels.bench_suite import remote

    p = remote.build_program("bench_row", json.dumps({"kernel": "rmsnorm"}))
    ops = [i["op"] for i in p.instructions]
    assert ops == ["upload", "get_function", "run", "return"]
    assert "measure_spec" in p.instructions[0]["source"]
    compile(remote.ENTRY_SOURCE, "<entry>", "exec")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def kcoral_cpu_server():
    for mod in ("kcoral", "fastapi", "uvicorn"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"the kcoral server needs {mod}")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--sandbox", "none",
                             "--host", "127.0.0.1", "--port", str(port), "--log-dir", "", "--disk-cache-dir", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import kcoral

    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                kcoral.Client(url).health()
                break
            except Exception:
                if proc.poll() is not None:
                    pytest.skip("the kcoral server exited at start")
                time.sleep(0.5)
        else:
            pytest.skip("the kcoral server did not become ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_kcoral_rows_round_trip_through_a_cpu_server(kcoral_cpu_server):
    from tirx_kernels.bench_suite import remote

    with pytest.raises(remote.RemoteError, match="no GPU workers"):
        remote.KcoralExecutor(kcoral_cpu_server)
    ex = remote.KcoralExecutor(kcoral_cpu_server, require_gpu=False)
    env = ex.environment(ROOT)
    assert env["kcoral"]["url"] == kcoral_cpu_server and "gpu" in env and "versions" in env
    rows = roster.select(roster.load_all(ROOT), ["rmsnorm"], ["small"])
    res = run_mod.run_rows(rows, ex, True, 5, progress=False)
    ex.close()
    assert res[0]["status"] == "skipped" and "CUDA" in res[0]["errors"][0]["reason"], res[0]  # no GPU there
    assert res[0]["fingerprint"] == artifacts.fingerprint(registry.scan()["rmsnorm"].path)
    assert res[0]["kcoral"]["request_id"]


# ---------------------------------------------------------------------------------------------------------
# Parts: one run JSON per kernel, resumable, time-boxed, a watchdog per kernel
# ---------------------------------------------------------------------------------------------------------

class SlowExecutor(FlakyExecutor):
    """Rows of ``slow`` take ``delay`` seconds."""

    def __init__(self, slow=(), delay=0.0):
        super().__init__(0)
        self.slow, self.delay, self.seen = set(slow), delay, []

    def measure(self, spec):
        self.seen.append(spec["kernel"])
        if spec["kernel"] in self.slow:
            time.sleep(self.delay)
        return super().measure(spec)


def _two_kernels():
    return roster.select(roster.load_all(ROOT), ["rmsnorm", "act_and_mul"])


def test_parts_are_one_run_per_kernel_and_a_second_call_resumes(tmp_path):
    rows, env = _two_kernels(), {"gpu": {}, "versions": {}}
    parts = str(tmp_path / "parts")
    res = run_mod.run_parts(ROOT, rows, SlowExecutor(), True, 5, 0, parts, env, progress=False)
    assert sorted(res["written"]) == ["act_and_mul", "rmsnorm"]
    for k in ("rmsnorm", "act_and_mul"):
        part = json.load(open(os.path.join(parts, f"{k}.json")))
        assert {r["kernel"] for r in part["rows"]} == {k}
        assert len(part["rows"]) == len([r for r in rows if r.kernel == k])
    again = SlowExecutor()
    res = run_mod.run_parts(ROOT, rows, again, True, 5, 0, parts, env, progress=False)
    assert res["written"] == [] and sorted(res["done_before"]) == ["act_and_mul", "rmsnorm"] and again.seen == []


def test_parts_start_no_kernel_past_the_time_limit(tmp_path):
    res = run_mod.run_parts(ROOT, _two_kernels(), SlowExecutor(), True, 5, 0, str(tmp_path / "p"),
                            {"gpu": {}, "versions": {}}, time_limit=0.0, progress=False)
    assert res["written"] == [] and sorted(res["not_started"]) == ["act_and_mul", "rmsnorm"]


def test_a_kernel_past_its_timeout_is_marked_and_skipped_on_the_next_call(tmp_path):
    rows, env, parts = _two_kernels(), {"gpu": {}, "versions": {}}, str(tmp_path / "p")
    first = rows[0].kernel
    exits = []

    def fake_exit(code):  # the real one is os._exit: the process ends inside the stuck call
        exits.append(code)

    run_mod.run_parts(ROOT, rows, SlowExecutor({first}, delay=0.6), True, 5, 0, parts, env, kernel_timeout=0.2,
                      progress=False, exit_fn=fake_exit)
    assert exits == [124]
    marker = json.load(open(os.path.join(parts, f"{first}.json.timeout")))
    assert marker["kernel"] == first and marker["kernel_timeout_s"] == 0.2
    os.remove(os.path.join(parts, f"{first}.json"))  # the real exit ends the process before the part is written
    res = run_mod.run_parts(ROOT, rows, SlowExecutor(), True, 5, 0, parts, env, progress=False)
    assert res["timed_out_before"] == [first]


def test_cli_parts_refuses_a_role_or_out_selection(tmp_path, capsys):
    assert cli.main(["run", "--parts", str(tmp_path), "--role", "small", "--no-progress"]) == 2
    assert cli.main(["run", "--time-limit", "5", "--no-progress"]) == 2
    assert "--parts" in capsys.readouterr().err


def test_status_names_cheapest_first(tmp_root, tmp_path, entries, capsys):
    base = _two_card_baseline(tmp_root, entries)
    rostered = sorted(set(roster.load_all(tmp_root)) & set(entries))
    assert compare.needing_by_cost(compare.status(tmp_root, base, entries), base) == []
    if len(rostered) < 2:
        pytest.skip("needs two rostered kernels")
    slow, cheap = rostered[0], rostered[1]
    for run in base["cards"].values():
        for r in run["rows"]:
            r["elapsed_s"] = {slow: 90.0, cheap: 2.0}.get(r["kernel"], 5.0)
            if r["kernel"] in (slow, cheap) and run is base["cards"]["H100"]:
                r["fingerprint"] = "0" * 16  # stale on the H100 only
    items = compare.status(tmp_root, base, entries, card="H100")
    assert compare.needing_by_cost(items, base) == [cheap, slow]
    assert compare.needing_by_cost(compare.status(tmp_root, base, entries, card="H200"), base) == []
    path = write(tmp_path, "base.json", base)
    assert cli.main(["status", "--root", tmp_root, "--baseline", path, "--card", "H100", "--names"]) == 0
    assert capsys.readouterr().out.split() == [cheap, slow]


def test_promote_takes_a_tree_dirty_only_in_measurement_records(tmp_root, tmp_path, entries):
    """A run staged before the last promotion was committed: only bench_suite/baseline.*, docs/ and README.md
    differ from the stamped commit, none of which a measurement reads."""
    records = ["bench_suite/baseline.json", "bench_suite/baseline.md", "docs/measurements/x/README.md", "README.md"]
    run = _mutated(synthetic_run(tmp_root, entries),
                   lambda r: r["provenance"]["git"].update(dirty=True, dirty_files=records))
    promote.promote(write(tmp_path, "run.json", run), tmp_root, entries)
    assert os.path.exists(os.path.join(tmp_root, "bench_suite", "baseline.json"))
    assert promote.source_dirty({"dirty": True, "dirty_files": records + ["packages/tirx-core/a.py"]})
    assert promote.source_dirty({"dirty": None, "dirty_files": []})
