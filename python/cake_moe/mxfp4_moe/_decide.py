"""The tile-form decision table of the MXFP4 MoE layer (docs/mxfp4_moe.md, "Tile forms").

Plain data, host only, so it is testable without a GPU. The one input is the expected number
of routes per local expert, ``T * top_k / num_experts`` (routes spread over all E experts;
a rank sees its share of them), which sets how many token rows a GEMM tile should hold.
"""
from __future__ import annotations

from dataclasses import dataclass

ROUTE_FORM = "moe_route"
DEQUANT_FORM = "fmt_mxfp8_dequantize"
FINALIZE_FORM = "moe_finalize"

# (largest routes-per-expert estimate served, path name, BN, tile form suffix): the first row
# that fits wins. Measured on the H200 (docs/mxfp4_moe.md): BN 8 streams each expert's weights
# once up to ~6 routes per expert; BN 32 won at 18 (T = 1024, k = 16, E = 896) and BN 64 at 37.
TILE_TABLE: tuple[tuple[float, str, int, str], ...] = (
    (6, "decode", 8, "n8"),
    (24, "mid", 32, "n32"),
    (float("inf"), "prefill", 64, "n64"),
)
BLOCK_NS: tuple[int, ...] = tuple(row[2] for row in TILE_TABLE)
# With at most this many routes (T * top_k: T = 1 at top_k 16) a launch has only a few hundred
# CTAs: the narrow decode tiling (64 weight rows per CTA, eight warps splitting K) keeps more SMs
# streaming.
NARROW_ROUTES = 16
TILES: tuple[str, ...] = ("n8", "n8_narrow", "n32", "n64")
# At BN 8 a GEMM whose reduction length K is at most this uses the short-K tiling (256 weight
# rows per CTA instead of eight warps splitting K): kShortK in cpp/kernels/mxfp4_moe/params.hpp.
SHORT_K = 1024


@dataclass(frozen=True)
class PlanDecision:
    """What ``plan()`` would run for a token count: ``forms`` are the five kernels of one
    ``run()`` in launch order (``cake-moe info`` lists them); ``block_n`` the token rows per
    GEMM tile. ``supported`` is False only for a request the layer cannot serve (``reason``)."""

    supported: bool
    reason: str
    path: str
    block_n: int
    forms: tuple[str, ...]
    tile: str = ""  # form suffix of the GEMMs whose K exceeds SHORT_K


def gemm_forms(tile: str, hidden: int, inter: int) -> tuple[str, str]:
    """The GEMM1 (K = hidden) and GEMM2 (K = inter) form names of tile form ``tile``."""
    if tile not in TILES:
        raise ValueError(f"tile must be one of {TILES}, got {tile!r}")

    def suffix(k: int) -> str:
        return "n8_shortk" if tile.startswith("n8") and k <= SHORT_K else tile
    return f"mxfp4_moe_gemm1_{suffix(hidden)}", f"mxfp4_moe_gemm2_{suffix(inter)}"


def routes_per_expert(num_tokens: int, top_k: int, num_experts: int) -> float:
    """The decision input: expected routes per expert, T * top_k / E."""
    return num_tokens * top_k / num_experts


def decide(num_tokens: int, top_k: int, num_experts: int, hidden: int, inter: int) -> PlanDecision:
    """The decision for ``num_tokens`` tokens of a layer with ``hidden`` and ``inter`` (the
    rank's intermediate shard); every T >= 1 is served."""
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
        return PlanDecision(False, f"num_tokens must be an int >= 1, got {num_tokens!r}", "none", 0, ())
    load = routes_per_expert(num_tokens, top_k, num_experts)
    _, path, block_n, tile = next(row for row in TILE_TABLE if load <= row[0])
    if block_n == 8 and num_tokens * top_k <= NARROW_ROUTES:
        tile = "n8_narrow"
    reason = f"T*k/E = {load:g} routes per expert: {path} tiles of BN={block_n} token rows ({tile})"
    forms = (ROUTE_FORM, DEQUANT_FORM, *gemm_forms(tile, hidden, inter), FINALIZE_FORM)
    return PlanDecision(True, reason, path, block_n, forms, tile)
