# SPDX-License-Identifier: Apache-2.0
"""Provenance of a run: source state, GPU, driver, CUDA, torch/TVM/reference versions, timer and protocol.

Everything here degrades to ``None`` with a reason rather than raising: a CPU machine has no GPU, a
GPU host may have no ``.git`` (then a source stamp written where the tree was committed stands in,
see ``stamp``), a runtime-only host has no apache-tvm.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import sys

STAMP_FORMAT = 1
DEFAULT_STAMP_PATHS = (os.path.join(".gpu", "source-stamp.json"), os.path.join("build", "source-stamp.json"))
# Distributions whose versions every run records when installed (plus every package of every lock).
RUNTIME_DISTS = ("torch", "apache-tvm", "apache-tvm-ffi", "triton", "nvidia-cutlass-dsl", "kcoral", "numpy")


def _run(cmd: list[str], cwd: str | None = None, timeout: float = 30) -> str:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True, timeout=timeout).stdout


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------------------
# Source state
# ------------------------------------------------------------------------------------------------------

def _git_files(root: str) -> list[str]:
    out = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root)
    return sorted(p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p)))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_state(root: str, prefer_stamp: bool = False) -> dict:
    """``{"commit", "dirty", "dirty_files", "source"}`` from git, else from a source stamp, else unknown.

    With ``prefer_stamp`` (a run) a source stamp wins over a git checkout whose HEAD is another commit: the
    device tool copies the working tree with the *base* commit's ``.git``, so git there reports every file
    changed since that base as dirty (seen on the H200 host, 2026-12-02) while the stamp, written where the
    staged tree was committed, verifies the files themselves.
    """
    git = None
    try:
        commit = _run(["git", "rev-parse", "HEAD"], cwd=root).strip()
        status = _run(["git", "status", "--porcelain=v1", "--untracked-files=normal"], cwd=root)
        files = [line[3:] for line in status.splitlines() if line.strip()]
        git = {"commit": commit, "dirty": bool(files), "dirty_files": files[:50], "source": "git"}
    except (OSError, subprocess.SubprocessError) as e:
        git_error = f"{type(e).__name__}: {e}".strip()
    stamp = find_stamp(root) if (git is None or prefer_stamp) else None
    if stamp:
        state = verify_stamp(root, stamp)
        if git is None or git["commit"] != state["commit"]:
            return state
    if git is not None:
        return git
    return {"commit": None, "dirty": None, "dirty_files": [], "source": "unavailable",
            "reason": f"no git checkout ({git_error[:200]}) and no source stamp "
                      f"(python -m tirx_kernels.bench_suite stamp, where the tree is committed)"}


def write_stamp(root: str, out: str) -> dict:
    """Record commit, dirty flag and a sha256 of every tracked / unignored file (for hosts without .git)."""
    state = git_state(root)
    if state["source"] != "git":
        raise RuntimeError(f"stamp needs a git checkout: {state.get('reason')}")
    out_rel = os.path.relpath(os.path.abspath(out), root)
    files = {p: _sha256(os.path.join(root, p)) for p in _git_files(root) if p != out_rel}
    stamp = {"format": STAMP_FORMAT, "commit": state["commit"], "dirty": state["dirty"],
             "dirty_files": [f for f in state["dirty_files"] if f != out_rel], "created": now(), "files": files}
    stamp["dirty"] = bool(stamp["dirty_files"])
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(stamp, f, indent=1, sort_keys=True)
    return stamp


def find_stamp(root: str) -> str | None:
    env = os.environ.get("TIRX_KERNELS_SOURCE_STAMP")
    for p in ([env] if env else []) + [os.path.join(root, p) for p in DEFAULT_STAMP_PATHS]:
        if p and os.path.isfile(p):
            return p
    return None


def verify_stamp(root: str, path: str) -> dict:
    """The stamp's commit; dirty if it was stamped dirty or any stamped file differs here now."""
    with open(path) as f:
        stamp = json.load(f)
    changed = [p for p, digest in stamp.get("files", {}).items()
               if not os.path.isfile(os.path.join(root, p)) or _sha256(os.path.join(root, p)) != digest]
    # Source files that appeared since the stamp (new kernels, configs) make the tree dirty too.
    known = set(stamp.get("files", {}))
    for top in ("packages", "config", "tools"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "build")
                           and not d.endswith(".egg-info")]
            for fn in filenames:
                rel = os.path.relpath(os.path.join(dirpath, fn), root)
                if fn.endswith((".py", ".yaml", ".json", ".toml", ".sh")) and rel not in known:
                    changed.append(rel)
    files = list(stamp.get("dirty_files", [])) + sorted(changed)
    return {"commit": stamp.get("commit"), "dirty": bool(files), "dirty_files": files[:50],
            "source": f"stamp:{os.path.relpath(path, root)}", "stamped": stamp.get("created")}


# ------------------------------------------------------------------------------------------------------
# GPU, driver, CUDA
# ------------------------------------------------------------------------------------------------------

def _norm_uuid(u) -> str | None:
    if u is None:
        return None
    s = str(u)
    return s if s.startswith(("GPU-", "MIG-")) else f"GPU-{s}"


def gpu_info() -> dict:
    """Name, UUID, driver and CUDA of the current device; every field ``None`` without one, with a reason."""
    info = {"name": None, "uuid": None, "driver": None, "cuda_driver": None, "cuda_runtime": None,
            "compute_capability": None, "sm_count": None, "memory_gib": None, "clocks_max_sm_mhz": None,
            "source": []}
    try:
        import torch

        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            dev = torch.cuda.current_device()
            p = torch.cuda.get_device_properties(dev)
            info.update(name=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                        memory_gib=round(p.total_memory / 2**30, 1), uuid=_norm_uuid(getattr(p, "uuid", None)))
            info["source"].append("torch")
        else:
            info["reason"] = "torch sees no CUDA device"
    except Exception as e:  # torch missing or broken: nvidia-smi may still answer
        info["reason"] = f"torch: {type(e).__name__}: {e}"
    try:
        rows = _run(["nvidia-smi", "--query-gpu=index,name,uuid,driver_version,clocks.max.sm",
                     "--format=csv,noheader,nounits"], timeout=20).strip().splitlines()
        table = [[c.strip() for c in r.split(",")] for r in rows if r.strip()]
        match = [r for r in table if info["uuid"] and r[2] == info["uuid"]] or table[:1]
        if match:
            _, name, uuid, driver, clk = match[0][:5]
            info.update(name=info["name"] or name, uuid=info["uuid"] or uuid, driver=driver)
            info["clocks_max_sm_mhz"] = int(clk) if clk.isdigit() else None
            info["source"].append("nvidia-smi")
        m = re.search(r"CUDA Version:\s*([0-9.]+)", _run(["nvidia-smi"], timeout=20))
        info["cuda_driver"] = m.group(1) if m else None
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        info.setdefault("reason", f"nvidia-smi: {type(e).__name__}")
    return info


def device_uuid() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return _norm_uuid(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None))
    except Exception:
        pass
    return None


# ------------------------------------------------------------------------------------------------------
# Versions
# ------------------------------------------------------------------------------------------------------

def dist_version(name: str) -> dict | None:
    """``{"version", "commit"?}`` of an installed distribution, or None."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    out = {"version": dist.version}
    try:
        raw = dist.read_text("direct_url.json")
        d = json.loads(raw) if raw else {}
        if d.get("vcs_info", {}).get("commit_id"):
            out["commit"] = d["vcs_info"]["commit_id"]
        elif d.get("dir_info", {}).get("editable"):
            out["editable"] = True
    except (ValueError, OSError):
        pass
    return out


def reference_packages(root: str | None) -> list[str]:
    names = set()
    if root:
        try:
            from tirx_kernels.core import reference_lock

            for pkg, lock in reference_lock.load_all(root).items():
                if pkg == "tirx-core":  # runner pins, not references
                    continue
                names.update(r["package"] for r in lock["requirements"])
        except Exception:
            pass
    try:
        from tirx_kernels import registry

        for e in registry.scan().values():
            names.update(r["package"] for r in e.meta.get("reference_requirements", []))
    except Exception:
        pass
    return sorted(names)


def versions(root: str | None) -> dict:
    from tirx_kernels import registry

    tirx = {}
    for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP):
        if getattr(ep, "dist", None) is not None:
            tirx[ep.dist.name] = dist_version(ep.dist.name)
    tirx["tirx-core"] = dist_version("tirx-core")
    out = {"python": platform.python_version(), "tirx": dict(sorted(tirx.items())),
           "runtime": {n: dist_version(n) for n in RUNTIME_DISTS},
           "references": {n: dist_version(n) for n in reference_packages(root)}}
    try:
        from tirx_kernels.core import build

        out["nvcc"] = build.nvcc_version()
    except Exception:
        out["nvcc"] = None
    return out


def artifacts_info() -> dict:
    """Where compiled kernels come from: a prebuilt bundle ($TIRX_KERNELS_ARTIFACTS) and who built it."""
    d = os.environ.get("TIRX_KERNELS_ARTIFACTS")
    info = {"bundle": d, "cache": os.environ.get("TIRX_KERNELS_CACHE")}
    if d and os.path.exists(os.path.join(d, "manifest.json")):
        try:
            with open(os.path.join(d, "manifest.json")) as f:
                man = json.load(f)
            info.update(tvm=man.get("tvm"), nvcc=man.get("nvcc"), arch=man.get("arch"),
                        n_artifacts=len(man.get("artifacts", [])))
        except (OSError, ValueError) as e:
            info["error"] = str(e)
    return info


# ------------------------------------------------------------------------------------------------------
# Timer and protocol
# ------------------------------------------------------------------------------------------------------

def timer_protocol(rounds: int) -> dict:
    from tirx_kernels.core import bench

    return {
        "module": "tirx_kernels.core.bench",
        "cold_l2": True,
        "flush_bytes": bench.FLUSH_BYTES,
        "calls_per_round": 30,
        "warmup_calls": 3,
        "rounds": rounds,
        "interleaved": True,
        "statistic": "median over rounds of the per-round median",
        "graph_threshold_us": bench.GRAPH_THRESHOLD_US,
        "graph_calls": 100,
        "graph_rule": "if any implementation of a row has a cold-L2 median under the threshold, every "
                      "implementation of that row is timed again from a CUDA graph of back-to-back calls "
                      "(L2 then warm), so one row compares like with like",
        "ceilings": "measured in the same process: device-to-device copy of 1 GiB (bytes read + written) and "
                    "cuBLAS bf16 8192^3 (core.bench.ceilings)",
        "roofline": "pct_of_roofline = time of the kernel's byte (or FLOP) model at the ceiling / our time, "
                    "for whichever bound is larger",
        "description": "cold L2 (512 MiB overwritten before every timed call, only the call between the events), "
                       "warm-up, median of 30 calls per round, implementations interleaved in every round",
    }


def protocol() -> dict:
    return {"kernel_protocol": "packages/tirx-core/PROTOCOL.md", "timed_call": "mod.launch(cfg, data)",
            "inputs": "mod.prepare_data(**cfg): fresh random inputs, NaN-poisoned outputs",
            "references": "mod.get_baselines(**cfg)[name]() -> fn(data); probed once before timing",
            "ratio": "ref_over_ours = reference us / our us (> 1: ours is faster)"}


def environment(root: str | None) -> dict:
    """Everything about the measuring host (the part a kcoral server reports for itself)."""
    return {"host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                     "python": sys.version.split()[0]},
            "gpu": gpu_info(), "versions": versions(root), "artifacts": artifacts_info(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def collect(root: str, rounds: int, env: dict | None = None) -> dict:
    """Run provenance: source state here, the measuring environment (local, or as the server reported it)."""
    env = env if env is not None else environment(root)
    return {"git": git_state(root, prefer_stamp=True), **env, "timer": timer_protocol(rounds), "protocol": protocol(),
            "collected": now()}
