# SPDX-License-Identifier: Apache-2.0
"""``fp16_bf16_gemm``'s kernel selection: what a call's compile params are (tile, variant, C store), which artifacts a
bundle holds (``artifact_params`` / ``general_params``), the call space the bundle-resolution test samples, and
``get_kernel``, which builds the params' kernel from its schedule module (``_persistent``, ``_pingpong``,
``_small_m``, ``_gemv``, ``_ws``), with the SASS the build tests expect of it."""

from __future__ import annotations

from tirx_kernels.gemm._tile_table import TILE_TABLE, choose_tile
from tirx_kernels.gemm._tiles import (
    _DTYPES,
    EPILOGUES,
    LAYOUTS,
    PDL,
    STG_TILE,
    TILE_CONFIGS,
    VARIANT_TILE,
    cluster_ctas,
)


def is_variant(dtype: str, layout: str | None = None, out_dtype: str | None = None,
               epilogue: str | None = None) -> bool:
    """Anything but plain NT, dtype-out, no epilogue (which only the persistent kernel builds)."""
    return (layout or "nt") != "nt" or (out_dtype or dtype) != dtype or (epilogue or "none") != "none"


def _epilogue(bias, alpha: float, beta: float) -> str:
    ab = alpha != 1.0 or beta != 0.0
    if bias is None:
        return "alpha_beta" if ab else "none"
    return "alpha_beta_bias" if ab else "bias"


def stg_serves(tile: str) -> bool:
    """Whether ``tile`` builds the plain kernel with ``c_store="stg"`` (persistent, whole 64-column boxes, no
    stream-K)."""
    cfg = TILE_CONFIGS[tile]
    return cfg.get("kind") == "persistent" and cfg["block_n"] % 64 == 0 and not cfg.get("stream_k")


def c_store(dtype: str, M: int, N: int, K: int, tile: str | None = None, layout: str | None = None,  # noqa: N803
            out_dtype: str | None = None, epilogue: str | None = None, out_aligned: bool = True) -> str:
    """How C is stored: "stg" for a plain NT call whose C rows are not 16-byte aligned (odd N, or an ``out`` whose
    base or row stride is not) unless its tile is a gemv one (pinned, or picked: M <= 8, where the copy of a padded
    output costs nothing) or another kind that cannot build "stg"; else "tma" (``_run`` gives an unaligned C a
    padded output, then copies it)."""
    if (N % 8 == 0 and out_aligned) or is_variant(dtype, layout, out_dtype, epilogue):
        return "tma"
    if tile is None:
        return "tma" if TILE_CONFIGS[choose_tile(M, N, K)].get("kind") == "gemv" else "stg"
    return "stg" if stg_serves(tile) else "tma"


def compile_params(**cfg) -> dict:
    tile = cfg.get("tile") or choose_tile(cfg.get("M", 0), cfg.get("N", 0), cfg.get("K", 0))
    dtype = cfg["dtype"]
    launch = {"pdl": cfg["pdl"]} if "pdl" in cfg else {}  # a pinned launch variant (sweeps); default: PDL
    store = cfg.get("c_store") or c_store(dtype, cfg.get("M", 0), cfg.get("N", 0), cfg.get("K", 0), cfg.get("tile"),
                                          cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue"))
    if store == "stg":
        return {"dtype": dtype, "tile": cfg.get("tile") or STG_TILE, "c_store": "stg", **launch}
    if not is_variant(dtype, cfg.get("layout"), cfg.get("out_dtype"), cfg.get("epilogue")):
        return {"dtype": dtype, "tile": tile, **launch}  # the plain kernel: the same key as before variants
    picked = TILE_CONFIGS[tile]
    if not cfg.get("tile") and (picked.get("kind") != "persistent" or picked["block_n"] % 64 or picked.get("stream_k")):
        tile = VARIANT_TILE  # the variants need a persistent tile of whole 64-column store boxes, without stream-K
    epilogue = cfg.get("epilogue") or "none"
    p = {"dtype": dtype, "tile": tile, "layout": cfg.get("layout") or "nt", "out_dtype": cfg.get("out_dtype") or dtype,
         "epilogue": epilogue}
    if epilogue in ("bias", "alpha_beta_bias"):
        p["bias_dtype"] = cfg.get("bias_dtype") or dtype
    return {**p, **launch}


def variant_combinations(dtype: str) -> list[dict]:
    """Every (layout, out_dtype, epilogue, bias_dtype) variant of ``dtype``: the params keys beyond dtype/tile."""
    out = []
    for layout in LAYOUTS:
        for out_dtype in (dtype, "float32"):
            for epilogue in EPILOGUES:
                if not is_variant(dtype, layout, out_dtype, epilogue):
                    continue
                p = {"layout": layout, "out_dtype": out_dtype, "epilogue": epilogue}
                biases = (dtype, "float32") if epilogue in ("bias", "alpha_beta_bias") else (None,)
                out += [{**p, "bias_dtype": bd} if bd else p for bd in biases]
    return out


def _variant_table_tiles() -> list[str]:
    """TILE_TABLE's picks a variant keeps (persistent, whole 64-column boxes, no stream-K), without the "_ef" twins
    (their variants fall back to VARIANT_TILE)."""
    return [t for t in dict.fromkeys(row[3] for row in TILE_TABLE)
            if TILE_CONFIGS[t].get("kind") == "persistent" and TILE_CONFIGS[t]["block_n"] % 64 == 0
            and not TILE_CONFIGS[t].get("stream_k") and not TILE_CONFIGS[t].get("load_priority")]


def artifact_params() -> list[dict]:
    """Compile params a prebuilt bundle needs beyond the CONFIGS rows (M, N, K are runtime arguments):
    - every tile the heuristic can pick, for both dtypes (the plain op, aligned C rows);
    - the general variant artifacts: every variant (layout, out_dtype, epilogue, bias_dtype) on VARIANT_TILE
      (``general_params``: they serve every shape), 2 x 23 = 46;
    - the plain NT kernel with ``c_store="stg"`` on STG_TILE (C rows not 16-byte aligned), 2;
    - NT with a bias in a's dtype (nn.Linear's form) on the table's persistent tiles, so that it runs on the tile the
      plain call gets: 2 x 5 = 10."""
    plain = [{"dtype": d, "tile": t} for d in _DTYPES for t in dict.fromkeys(row[3] for row in TILE_TABLE)]
    general = [{"dtype": d, "tile": VARIANT_TILE, **v} for d in _DTYPES for v in variant_combinations(d)]
    stg = [{"dtype": d, "tile": STG_TILE, "c_store": "stg"} for d in _DTYPES]
    linear = [{"dtype": d, "tile": t, "layout": "nt", "out_dtype": d, "epilogue": "bias", "bias_dtype": d}
              for d in _DTYPES for t in _variant_table_tiles() if t != VARIANT_TILE]
    return plain + general + stg + linear


def general_params(params: dict) -> dict | None:
    """The general artifact serving every call ``params`` serves: a variant on VARIANT_TILE, the ``c_store="stg"``
    kernel on STG_TILE (sizes are runtime arguments); None for the plain kernel (its tiles are all in
    ``artifact_params``)."""
    if params.get("c_store") == "stg":
        return {**params, "tile": STG_TILE}
    if "layout" in params:
        return {**params, "tile": VARIANT_TILE}
    return None


def call_samples(rng) -> list[dict]:
    """Calls the public ops can see (PROTOCOL.md; core's bundle-resolution test): the catalog's projections (hidden x
    intermediate both ways, square, the LM heads of the catalog and GPT-2's odd 50257) at decode-to-prefill M, random
    and odd M, N, K, and every variant (layout, out_dtype, epilogue, bias_dtype) at random shapes, both dtypes."""
    from tirx_kernels.core import model_dims

    hidden, inter = model_dims.hidden_sizes(), model_dims.intermediate_sizes()
    vocab = model_dims.vocab_sizes() + [50257]
    ms = [1, 3, 8, 13, 16, 37, 64, 100, 128, 200, 256, 512, 777, 1024, 2048, 4096, 8192]

    def size():
        return rng.choice([rng.randint(1, 64), rng.randint(1, 5000), 8 * rng.randint(1, 2000)])

    out = []
    for dtype in _DTYPES:
        for h in hidden:
            for n, k in ((rng.choice(inter), h), (h, rng.choice(inter)), (rng.choice(vocab), h), (h, h)):
                out.append({"dtype": dtype, "M": rng.choice(ms), "N": n, "K": k})
        out += [{"dtype": dtype, "M": size(), "N": size(), "K": size()} for _ in range(20)]
        for v in variant_combinations(dtype):
            ab = {"alpha": 0.5, "beta": rng.choice([0.0, 2.0])} if "alpha" in v["epilogue"] else {}
            out.append({"dtype": dtype, "M": size(), "N": size(), "K": size(), **v, **ab})
    return out


def get_kernel(dtype: str, tile: str, layout: str = "nt", out_dtype: str | None = None, epilogue: str = "none",
               bias_dtype: str | None = None, pdl: str | None = PDL, c_store: str = "tma"):
    """The kernel of ``tile``; ``pdl``: programmatic dependent launch (``core.lang.pdl.TRIGGERS`` or None) of the
    persistent, ping-pong and small-M kernels (the stand-alone "ws" tile has none); ``c_store``: "stg" for C rows
    of any alignment (persistent tiles, plain NT only; gemm/_persistent.py)."""
    if dtype not in _DTYPES:
        raise ValueError(f"fp16_bf16_gemm: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    params = dict(TILE_CONFIGS[tile])
    if params.get("kind") != "persistent" and is_variant(dtype, layout, out_dtype, epilogue):
        raise ValueError(f"fp16_bf16_gemm: tile {tile!r} builds only NT, {dtype} out, no epilogue; layout "
                         f"{layout!r} / out_dtype {out_dtype!r} / epilogue {epilogue!r} need a persistent tile")
    # After the argument checks: those run (and are tested) on the GPU host, which has no TIRx compiler.
    from tirx_kernels.core.lang import pdl as pdl_launch

    pdl_launch.check_trigger("fp16_bf16_gemm", pdl)
    if c_store != "tma" and params.get("kind") != "persistent":
        raise ValueError(f"fp16_bf16_gemm: c_store {c_store!r} needs a persistent tile, not {tile!r}")
    if params.pop("kind", None) == "persistent":
        from tirx_kernels.gemm import _persistent

        store = {"c_store": c_store} if c_store != "tma" else {}
        return _persistent.build_persistent_kernel(dtype, **params, layout=layout, out_dtype=out_dtype,
                                                   epilogue=epilogue, bias_dtype=bias_dtype, pdl=pdl, **store)
    if TILE_CONFIGS[tile].get("kind") == "pingpong":
        from tirx_kernels.gemm import _pingpong

        return _pingpong.build_pingpong_kernel(dtype, **params, layout=layout, out_dtype=out_dtype,
                                               epilogue=epilogue, bias_dtype=bias_dtype, pdl=pdl)
    if TILE_CONFIGS[tile].get("kind") == "small_m":
        from tirx_kernels.gemm import _small_m

        return _small_m.build_small_m_kernel(dtype, **params, pdl=pdl)
    if TILE_CONFIGS[tile].get("kind") == "gemv":
        from tirx_kernels.gemm import _gemv

        return _gemv.build_gemv_kernel(dtype, **params, pdl=pdl)
    from tirx_kernels.gemm import _ws

    return _ws.build_ws_kernel(dtype, **params)


def sass_expect(dtype: str, tile: str, layout: str = "nt", c_store: str = "tma", **_) -> list[str]:
    """SASS the CPU build test asserts: the wgmma shape (m64n{block_n}: 64 ... 256), TMA loads/stores, register
    reconfiguration; the transposed-B wgmma for NN; the B (A) multicast of the 2x1 (1x2, 2x2) cluster tiles; the small-M
    kernel's own list (cluster barrier, DSMEM loads)."""
    cfg = TILE_CONFIGS[tile]
    if cfg.get("kind") == "small_m":
        from tirx_kernels.gemm import _small_m

        return _small_m.sass_expect(dtype, **{k: v for k, v in cfg.items() if k != "kind"})
    if cfg.get("kind") == "gemv":
        from tirx_kernels.gemm import _gemv

        return _gemv.sass_expect(dtype, **{k: v for k, v in cfg.items() if k != "kind"})
    n = cfg["block_n"]
    # c_store "stg": C from the staging tile in 16-bit st.global (STG.E.U16), no TMA store.
    out = [rf"HGMMA\.64x{n}x16\.F32" + (r"\.BF16" if dtype == "bfloat16" else r"\b"), r"UTMALDG\.2D",
           r"UTMASTG\.2D" if c_store == "tma" else r"STG\.E\.U16", r"USETMAXREG"]
    if cluster_ctas(tile) > 1:
        out.append(r"UTMALDG\.2D\.MULTICAST")
    if cfg.get("kind") == "pingpong":
        out.append(r"BAR\.ARV")  # the consumers' turn-taking (named-barrier arrive)
    if n % 64:
        out.append(r"STG\.E\b")  # the last 32 columns, stored from registers
    if cfg.get("load_priority"):
        out.append(r"UTMALDG\.2D \[UR\d+\], \[UR\d+\], desc\[UR\d+\]")  # the loads' L2 cache-policy operand
    if cfg.get("stream_k"):
        # Partials out and in (16-byte vectors; in from L2: .cg), the release fence and the flag's acquire load.
        out += [r"STG\.E\.128", r"LDG\.E\.128\.STRONG\.GPU", r"MEMBAR\.ALL\.GPU", r"LDG\.E\.STRONG\.GPU"]
    return out + ([r"tnspB"] if layout == "nn" else [])
