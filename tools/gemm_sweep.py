#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GEMM shape x tile sweep on the GPU host: every candidate tile of ``fp16_bf16_gemm`` against cuBLAS.

    python -m tirx_kernels.build --kernel fp16_bf16_gemm --out build/artifacts   # CPU machine (+ tiles below)
    python tools/gemm_sweep.py tiles [--dtype bfloat16,float16]  # the tiles a sweep needs (build them in)
    python tools/gemm_sweep.py run [--dtype float16] --out sweep.json   # GPU host: torch + tvm-ffi + bundle
    python tools/gemm_sweep.py table sweep1.json [sweep2.json ...]      # CPU: TILE_TABLE against stored sweeps

The shapes are issue #4's: square 1024 ... 16384 and the LLM projections (N, K) of Llama-3-8B/70B, Qwen3-32B
and DeepSeek-V3 at M in {1, 16, 64, 128, 512, 2048, 8192}. Each (shape, tile) is checked against an fp32
oracle on fresh random inputs (NaN-poisoned output) before it is timed; all tiles of a shape and cuBLAS
(``F.linear``) are timed together (``bench.time_calls``: cold L2, interleaved rounds). The table reports the
best tile, cuBLAS, cuBLAS/ours, and TFLOP/s or (small M, memory-bound) TB/s of the byte model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _use_checkout_if_not_installed():
    """The installed packages first (on a staged GPU host: the wheels the artifacts were built with, like the
    tests use), the checkout's sources only where none is installed: kernel sources edited after staging
    would have another fingerprint than the staged artifacts."""
    import importlib.util

    try:
        installed = importlib.util.find_spec("tirx_kernels.gemm") is not None
    except ModuleNotFoundError:
        installed = False
    if not installed:
        for pkg in ("tirx-core", "tirx-native"):
            sys.path.insert(0, os.path.join(ROOT, "packages", pkg, "src"))


_use_checkout_if_not_installed()

PROJECTIONS = [(4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (28672, 8192), (8192, 28672),
               (7168, 2048), (2048, 7168)]
MS = [1, 16, 64, 128, 512, 2048, 8192]
SQUARES = [1024, 2048, 4096, 8192, 16384]
SMALL_M = 128  # at or below: memory-bound (B streams from DRAM), judged by TB/s
MID_MS = [256, 512, 1024]  # where split-K (small-M tiles with 128 rows) may beat too few persistent tiles


def shapes(which: str) -> list[tuple[int, int, int]]:
    out = []
    if which in ("issue", "small", "large"):
        out += [(m, n, k) for n, k in PROJECTIONS for m in MS
                if which == "issue" or (m <= SMALL_M) == (which == "small")]
    if which == "mid":
        out += [(m, n, k) for n, k in PROJECTIONS for m in MID_MS] + [(1024, 1024, 1024), (2048, 2048, 2048)]
    if which in ("issue", "square", "large"):
        out += [(s, s, s) for s in SQUARES]
    return out


def geomean(xs) -> float:
    """Geometric mean (NaN for no values)."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def candidate_tiles(M: int) -> list[str]:  # noqa: N803
    from tirx_kernels.gemm import fp16_bf16_gemm as mod

    # Above SMALL_M: every persistent tile (also the sweep-only candidates TILE_TABLE does not pick yet: 128x256
    # s4 with a 128-column staging tile, 128x192, 128x64, 128x128 c2) and the non-persistent one.
    kinds = ("small_m",) if M <= SMALL_M else ("persistent", None)
    tiles = [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") in kinds]
    if M >= 512:  # ping-pong (gemm/_pingpong.py): whole 128-row tiles per math warpgroup
        tiles += [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "pingpong"]
    if SMALL_M < M <= max(MID_MS):  # split-K with 128-row tiles
        tiles += [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "small_m" and c["block_m"] == 128]
    if M <= 16:  # the skinny mma.sync kernel (gemm/_gemv.py) serves M <= its token tile
        tiles += [t for t, c in mod.TILE_CONFIGS.items() if c.get("kind") == "gemv" and c["tokens"] >= M]
    default = mod.choose_tile(M, 4096, 4096)
    return sorted(set(tiles) | {default})


DTYPES = ("bfloat16", "float16")


def _dtype_list(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--dtype: {bad or text!r} not in {DTYPES}")
    return names


def _shape_list(text: str) -> list[tuple[int, int, int]]:
    try:
        out = [tuple(int(d) for d in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        out = []
    if not out or any(len(s) != 3 or min(s) < 1 for s in out):
        raise argparse.ArgumentTypeError(f"--only: {text!r} is not a comma-separated list of MxNxK")
    return out


def cmd_tiles(args) -> int:
    from tirx_kernels.gemm import fp16_bf16_gemm as mod

    for dtype in args.dtype:
        for t in mod.TILE_CONFIGS:
            print(json.dumps({"dtype": dtype, "tile": t}))
    return 0


def _gemm_call(mod, a, b, out, tile):
    return lambda: mod.gemm_nt(a, b, out=out, tile=tile)


def _cublas_call(F, a, b):  # noqa: N803
    return lambda: F.linear(a, b)


# Optional references beyond cuBLAS (issue #4 asks for QuACK's sm90 GEMM and max-autotune). Both compile or
# autotune per shape on first use (seconds to a minute each): use them with --shapes square or a short list.
def _quack_call(a, b):
    from quack.gemm_interface import gemm as quack_gemm  # CuTe-DSL stack (../shared/gpu/stage --cutedsl)

    bt = b.T  # QuACK takes B as (K, N); b.T is a view of our (N, K) B
    # tuned=False: QuACK's own per-shape default config (its Hopper default is 128x192 ping-pong with 2-CTA
    # clusters); tuned=True autotunes over every config, a CuTe-DSL compile each (minutes per shape).
    try:
        quack_gemm(a, bt, tuned=False)
        return lambda: quack_gemm(a, bt, tuned=False)
    except TypeError:  # a QuACK without the tuned switch
        return lambda: quack_gemm(a, bt)


def _max_autotune_call(F, a, b):  # noqa: N803
    import torch

    compiled = torch.compile(lambda x, w: F.linear(x, w), mode="max-autotune-no-cudagraphs", dynamic=False)
    return lambda: compiled(a, b)


REFERENCES = ("quack", "max-autotune")


def _ref_list(text: str) -> list[str]:
    names = [x for x in text.split(",") if x]
    bad = [n for n in names if n not in REFERENCES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown reference(s) {bad}; expected some of {list(REFERENCES)}")
    return names


def _reference_calls(refs, F, a, b, ref) -> tuple[dict, dict]:  # noqa: N803
    """{name: call} for the optional references that run and match the oracle; {name: reason} for the rest."""
    import torch

    calls, errors = {}, {}
    for name in refs:
        try:
            call = _quack_call(a, b) if name == "quack" else _max_autotune_call(F, a, b)
            got = call()
            torch.cuda.synchronize()
            err = float((got.float() - ref).norm() / ref.norm())
            if not err < 1e-2:
                raise AssertionError(f"rel. error {err:.3g}")
            calls[name] = call
        except Exception as e:  # a missing or failing reference is reported, never fatal
            errors[name] = f"{type(e).__name__}: {e}"[:160]
    return calls, errors


def cmd_run(args) -> int:
    import torch
    import torch.nn.functional as F

    from tirx_kernels.core.bench import time_calls
    from tirx_kernels.gemm import fp16_bf16_gemm as mod

    dtype = getattr(torch, args.dtype)
    rows = []
    t_start = time.time()
    print(f"{'M':>5} {'N':>6} {'K':>6} | {'best tile':34s} {'ours us':>9} {'cuBLAS us':>9} {'cuBLAS/ours':>11} "
          f"{'rate':>12} | heuristic tile (ratio)")
    for M, N, K in shapes(args.shapes):
        if args.only and (M, N, K) not in args.only:
            continue
        a = torch.randn(M, K, device="cuda").to(dtype)
        b = torch.randn(N, K, device="cuda").to(dtype)
        ref = a.float() @ b.float().T
        fns, errors = {}, {}
        for tile in candidate_tiles(M):
            out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
            call = _gemm_call(mod, a, b, out, tile)
            try:
                call()
                torch.cuda.synchronize()
                err = float((out.float() - ref).norm() / ref.norm())
                if not err < 1e-2:
                    raise AssertionError(f"rel. error {err:.3g}")
            except Exception as e:  # one bad tile must not cost the sweep
                errors[tile] = f"{type(e).__name__}: {e}"[:160]
                continue
            fns[tile] = call
        fns["cublas"] = _cublas_call(F, a, b)
        ref_calls, ref_errors = _reference_calls(args.refs, F, a, b, ref)
        fns.update(ref_calls)
        errors.update({f"ref:{k}": v for k, v in ref_errors.items()})
        times = time_calls(fns, calls=args.calls, rounds=args.rounds)
        others = {"cublas", *ref_calls}
        ours = {t: v["median_us"] for t, v in times.items() if t not in others}
        cublas = times["cublas"]["median_us"]
        heuristic = mod.choose_tile(M, N, K)
        row = {"M": M, "N": N, "K": K, "cublas_us": cublas, "tiles_us": ours, "errors": errors,
               "heuristic": heuristic, "references_us": {n: times[n]["median_us"] for n in ref_calls}}
        rows.append(row)
        if not ours:
            print(f"{M:5d} {N:6d} {K:6d} | every tile failed: {errors}")
            continue
        best = min(ours, key=ours.get)
        us = ours[best]
        rate = (f"{(M * K + N * K + M * N) * 2 / us / 1e6:6.2f} TB/s" if M <= SMALL_M
                else f"{2 * M * N * K / us / 1e6:6.0f} TF/s")
        h = f"{heuristic} ({cublas / ours[heuristic]:.3f})" if heuristic in ours else f"{heuristic} (failed)"
        print(f"{M:5d} {N:6d} {K:6d} | {best:34s} {us:9.1f} {cublas:9.1f} {cublas / us:11.3f} {rate:>12} | {h}")
        for n in ref_calls:
            print(f"      {n}: {times[n]['median_us']:.1f} us (ref/ours {times[n]['median_us'] / us:.3f})")
        for t, e in errors.items():
            print(f"      FAILED {t}: {e}")
        torch.cuda.empty_cache()
    for name, key in (("best tile", None), ("heuristic", "heuristic")):
        ratios = [r["cublas_us"] / (r["tiles_us"][r["heuristic"]] if key else min(r["tiles_us"].values()))
                  for r in rows if r["tiles_us"] and (not key or r["heuristic"] in r["tiles_us"])]
        if ratios:
            print(f"{name}: geomean cuBLAS/ours {geomean(ratios):.3f} over {len(ratios)} shapes, "
                  f"worst {min(ratios):.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "dtype": args.dtype, "gpu": torch.cuda.get_device_name(),
                       "torch": torch.__version__}, f, indent=1)
    print(f"(gemm sweep {time.time() - t_start:.0f} s)")
    return 0


def table_report(runs: list[dict], choose_tile) -> dict:
    """Score a tile table against stored sweeps (``run --out`` JSONs, all of one dtype): per file, the geomean of
    cuBLAS/ours with ``choose_tile``'s pick and with each shape's best tile, and the picks below 0.97; per shape,
    the pick's and the best tile's mean ratio over the files that timed them (a tile must be in every file of the
    shape to be "best"). Pure Python: runs on the CPU machine."""
    files, shapes = [], {}
    for run in runs:
        picked, best, low, missing = [], [], [], []
        for r in run["rows"]:
            if not r["tiles_us"]:
                continue
            key = (r["M"], r["N"], r["K"])
            pick = choose_tile(*key)
            best.append(r["cublas_us"] / min(r["tiles_us"].values()))
            shapes.setdefault(key, []).append(r)
            if pick not in r["tiles_us"]:
                missing.append(key)
                continue
            x = r["cublas_us"] / r["tiles_us"][pick]
            picked.append(x)
            if x < 0.97:
                low.append((key, round(x, 3)))
        files.append({"table": geomean(picked), "best": geomean(best), "shapes": len(picked), "below_097": low,
                      "pick_not_timed": missing})
    per_shape = []
    for key, rows in shapes.items():
        common = set.intersection(*(set(r["tiles_us"]) for r in rows))
        mean = {t: geomean([r["cublas_us"] / r["tiles_us"][t] for r in rows]) for t in common}
        pick = choose_tile(*key)
        top = max(mean, key=mean.get) if mean else None
        per_shape.append({"shape": key, "pick": pick, "pick_mean": mean.get(pick), "best": top,
                          "best_mean": mean.get(top), "runs": len(rows)})
    return {"files": files, "per_shape": per_shape}


def cmd_table(args) -> int:
    from tirx_kernels.gemm import fp16_bf16_gemm as mod

    runs = []
    for path in args.files:
        with open(path) as f:
            runs.append(json.load(f))
    rep = table_report(runs, mod.choose_tile)
    for path, f in zip(args.files, rep["files"]):
        print(f"{path}: table geomean {f['table']:.3f} over {f['shapes']} shapes (best tile {f['best']:.3f}); "
              f"below 0.97: {f['below_097'] or 'none'}" + (f"; pick not timed: {f['pick_not_timed']}"
                                                            if f["pick_not_timed"] else ""))
    for r in rep["per_shape"]:
        if r["pick_mean"] is None or r["best_mean"] > r["pick_mean"] + args.margin:
            pm = "not timed" if r["pick_mean"] is None else f"{r['pick_mean']:.3f}"
            print(f"  {'x'.join(map(str, r['shape'])):>18}: pick {r['pick']} {pm}, best {r['best']} "
                  f"{r['best_mean']:.3f} (mean over {r['runs']} runs)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiles", help="print the compile params of every tile (one JSON per line)")
    t.add_argument("--dtype", type=_dtype_list, default=["bfloat16"],
                   help="comma-separated: bfloat16 (default), float16")
    r = sub.add_parser("run", help="check and time every candidate tile per shape (GPU host)")
    r.add_argument("--shapes", choices=("issue", "small", "large", "square", "mid"), default="issue",
                   help="issue: all 61 of issue #4; small / large: its M <= 128 / M > 128 rows (large: + squares)")
    r.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="A, B and C dtype (build its tiles first)")
    r.add_argument("--calls", type=int, default=20)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--out", default="")
    r.add_argument("--only", default=[], type=_shape_list,
                   help="only these shapes of --shapes, comma-separated MxNxK (e.g. 2048x7168x2048,512x4096x14336)")
    r.add_argument("--refs", default="", type=_ref_list,
                   help="extra references, comma-separated: quack, max-autotune (slow to compile per shape)")
    tb = sub.add_parser("table", help="score TILE_TABLE against stored sweep JSONs (CPU; shapes where a tile beats "
                                      "the pick by more than --margin are listed)")
    tb.add_argument("files", nargs="+")
    tb.add_argument("--margin", type=float, default=0.015)
    args = ap.parse_args()
    return {"tiles": cmd_tiles, "run": cmd_run, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
