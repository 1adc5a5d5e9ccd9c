"""The tile-form decision table of the MXFP4 MoE layer (docs/mxfp4_moe.md, "Tile forms").

Plain data, host only, so it is testable without a GPU. The one input is the expected number
of routes per local expert, ``T * top_k / num_experts`` (routes spread over all E experts;
a rank sees its share of them), which sets how many token rows a GEMM tile should hold.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import _validate
from ._tile_cost import BLOCK_N_OF, SM90_TILE_COST, expected_tiles, pair_costs, pair_key

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
# Up to this many routes (T = 2..4 at top_k 16) the four-warp narrow tiling (64 weight rows, four
# warps splitting K, four CTAs per SM: twice n8's CTAs for the same warps) balances the launch
# better than n8. Measured on the H200, same inputs (bench/results/
# 2026-12-01_h200_mxfp4_moe_narrow4.md): 1.7-5.3% faster at T = 2..4 in both contract layouts,
# within 1% at 6 and 8, and 7-8% slower than n8_narrow at T = 1.
NARROW4_ROUTES = 64
# sm_90 devices run the prefill path on a wgmma form (128 token rows per tile) once an expert
# expects more than this many routes; the mma.sync forms serve every arch. Measured on the H200
# (docs/mxfp4_moe.md): n64 wins at 36.6 routes per expert (T = 2048) in both contract layouts,
# wg128 at 73 (T = 4096); at 54.9 (T = 3072) wg128 wins ep8 by 1.38x and loses tp8 by 1.25x.
# The table runs wg128x4 (the same kernel on four warpgroups): 7-10% faster than wg128 at 73 and
# 292 routes per expert (T = 4096, 16384) in both layouts. Between the mid rows' limit (24) and
# 48 an sm_90 device runs wg64x4 (64-token tiles, four warpgroups) instead of n64: 1.36x (tp8)
# and 1.50x (ep8) faster at 36.6 (T = 2048); below 24 the tiles stay 32 rows (n32 beat wg64x4 by
# 3-8% at 18.3, T = 1024), and at 54.9 (T = 3072) wg128x4 won ep8 by 1.24x, wg64x4 tp8 by 1.31x.
# In the mid rows (6-24) an sm_90 device runs wg32x4 (32-token tiles, four warpgroups) instead of
# n32 (bench/results/2026-11-30_h200_mxfp4_moe_mid.md, T = 512-1344): 7-8% faster on tp8, within
# 1% on ep8 (2521 vs 2516 us at T = 1024, 2187 vs 2204 at 512).
PREFILL_WG_MIN_LOAD = 48
SM90_MID_WG_MIN_LOAD = 24
# A short intermediate shard (inter <= RESIDENT_K: GEMM2 is a resident-rows or short-K form, and
# an expert's weights are few) moves every sm_90 crossover up. Measured on the H200 at tp8 (I =
# 384), same runs, after the one-multiply conversion (bench/results/
# 2026-12-01_h200_mxfp4_moe_short_shard_tiles.md): n8 beat wg32x4 at 6.9, 8.0 and 9.1 routes per
# expert (1.31x, 1.17x, 1.07x) and lost at 11.4 (0.91x); wg32x4 beat wg64x4 at 27.4 (1.04x) and lost
# at 36.6; wg64x4 beat wg128x4 at 54.9 and 64.0 (1.34x, 1.07x) and lost at 73.1 (0.88x). ep8
# (I = 3072) in the same runs kept the thresholds above (6.9: wg32x4 1.12x over n8; 27.4: wg64x4
# 1.50x over wg32x4; 54.9: wg128x4 1.21x over wg64x4).
SM90_SHORT_SHARD_LOADS = (10, 32, 64)  # the largest loads served by n8, wg32x4 and wg64x4
# Where DRAM bandwidth per SM is narrow (an H100 SXM: `_ext.device_narrow_memory`, the threshold
# the grouped GEMM's tile choice reads too) the decode forms, held there by the bandwidth (0.87-0.94
# of the copy bandwidth at 2-5 routes per expert), lose to wg32x4 at fewer routes per expert.
# Measured on an H100 80GB HBM3, each row's two forms on the same inputs (bench/results/
# 2026-12-05_h100_mxfp4_moe_decode_mid.md, two runs): ep8 (long shard) n8 won at 4.57 routes per
# expert (1.09x) and lost at 5.71 (0.95x, 0.96x); tp8 (short shard) won at 6.86 (1.12x), was even
# at 8.0 (0.98x, 1.04x) and lost at 9.14 (0.96x, 0.94x); the limits below are where the time
# ratio, interpolated linearly (the runs' mean), crosses 1. The H200 keeps 6 and 10 (above).
SM90_NARROW_MEMORY_DECODE_LOADS = (5.25, 8.25)  # the largest loads n8 serves there: long shard, short shard
# There a shard of at most this K takes the short shard's decode limit (its later crossovers stay
# the long shard's), most likely because the wgmma forms' per-tile fill and epilogue weigh more
# on GEMM2 mainloops this short. Measured on an H100, each row's decode form (n8_narrow4 / n8, synced) against
# wg32x4 on the same inputs (`ci/moe_gemm_pairs.py layer`, bench/results/
# 2026-12-06_h100_mxfp4_moe_decode_limit_layers.md): at 8 routes per expert the decode form won
# by 14% (E128 k8 H2048 I768), 12% (E64 k8 H2048 I1024) and 8% (E128 k8 H4096 shard 768); at 10
# it was within 1% on the first two; at 12 wg32x4 won by 10-20% on all three. With a shard of
# 1536 (H 4096) the decode form won by 3.5% at 6 and lost by 13% at 8, with 2048 (H 7168) it lost
# by 27% at 6: those keep the long shard's limit. The H200 keeps its limits until measured.
SM90_NARROW_MEMORY_SHORT_DECODE_K = 1024
# There the four-warp narrow tiling also stays ahead of n8 past NARROW4_ROUTES: on an H100, same
# inputs, two runs each (bench/results/2026-12-05_h100_mxfp4_moe_decode_forms.md,
# ..._h100_mxfp4_moe_narrow4_limit.md and ..._h100_mxfp4_moe_narrow4_to_128.md), n8_narrow4 ran
# 0.3-1.2% faster than n8 on all 18 row pairs at T = 6..32 (96-512 routes, both contract
# layouts), 0.3-0.8% faster on all 12 at T = 48..96, and at T = 128 (2048 routes) even on ep8
# (+-0.1%) and 0.2-0.4% faster on tp8; past that it was not measured. On the H200 it was 1.3%
# slower to 0.6% faster at T = 8 and 12 (2026-12-01_h200_mxfp4_moe_narrow4.md): it keeps 64.
SM90_NARROW_MEMORY_NARROW4_ROUTES = 2048
# A long shard's wgmma decisions offer the device wg96x4 as well (short shards have it among
# their prefill forms): as wg128x4's second form (instead of wg160x3) up to the first load below,
# where even an expert-parallel rank's ~1.43x load leaves few experts past 128 routes (wg160x3's
# case) and many within one 96-row tile, and as wg64x4's (instead of wg128x4) from the second
# (where DRAM per SM is narrow, at every load). Measured on the ep8 rank, the table before and
# after in turn on the same inputs, two runs each (bench/results/
# 2026-12-05_h100_mxfp4_moe_wg96_long_shard_ab.md, ..._h200_mxfp4_moe_wg96_long_shard_ab.md):
# the H200 4-14% faster at 45.7-73.1 routes per expert (T = 2560..4096) and 3-6% slower at 36.6
# (T = 2048, wg64x4's pair; the ratio, interpolated linearly, crosses 1 at ~40); the H100 1.6-13.4%
# faster at 36.6-73.1, even at 77.7 and 3-31% slower at 82.3-96 with the first limit at 96.
# (Found by forcing each form on the H100: ..._h100_mxfp4_moe_mid_sweep.md.)
SM90_LONG_SHARD_WG96_LOADS = (74, 40)  # wg128x4's alt up to, wg64x4's alt above
SM90_TILES: tuple[str, ...] = ("wg128", "wg128x4", "wg64x4", "wg32x4", "wg160x3", "wg96x4")
# The token-row loaders of the GEMMs address a row's 16-byte chunks with 32-bit indices
# (stage_loader.cuh, Loader::b_src: row x K / 8), so GEMM1's x rows (T x H elements) and GEMM2's
# intermediate rows at the route list's capacity (T x top_k x I_shard) stay below 2^35 elements
# (as BF16, below the 64 GiB the host plan's check_sizes allows): from there a plan is refused
# rather than run with wrapped offsets. (At the contract geometry the bound is T = 699050 for ep8
# and 4.79 million for tp8, past what an H200's memory holds.)
MAX_TOKEN_ROW_ELEMENTS = 2**35


def token_rows_refusal(num_tokens: int, top_k: int, hidden: int, inter: int) -> str | None:
    """Why ``num_tokens`` tokens cannot be served by the GEMMs' 32-bit row indexing, or None."""
    token_rows = max(num_tokens * hidden, num_tokens * top_k * inter)
    if token_rows < MAX_TOKEN_ROW_ELEMENTS:
        return None
    return (f"T = {num_tokens}: the GEMMs' token rows would hold {token_rows} elements (T x H, T x top_k x "
            "I_shard), not below the 2^35 their 32-bit chunk indices reach; split the batch")


def token_count_refusal(num_tokens, top_k: int, hidden: int, inter: int) -> str | None:
    """Why ``num_tokens`` is not a token count any plan serves (not an int >= 1, or past the
    GEMMs' 32-bit row indexing), or None."""
    try:
        t = _validate.integer(num_tokens, "num_tokens")
    except ValueError:
        t = 0
    if t < 1:
        return f"num_tokens must be an int >= 1, got {num_tokens!r}"
    return token_rows_refusal(t, top_k, hidden, inter)


# The prefill GEMMs' time follows the number of token tiles per expert: each tile converts the
# expert's weights once. `wg160x3` (160-token tiles on three warpgroups, 192 weight rows per
# item) costs ~1.2x `wg128x4` per tile and takes fewer tiles where an expert's routes just pass a
# multiple of 128 (292 routes: two tiles instead of three). Measured on the H200, kernel time per
# run at T = 2048..24576 in both contract layouts (bench/results/
# 2026-12-01_h200_mxfp4_moe_wg160x3.md): with equal tile counts wg160x3 is 1.16-1.25x slower; with
# fewer it wins by up to 1.28x (tp8 T = 8192: 5724 vs 7315 us; T = 16384: 10447 vs 11744). The
# rule of prefill_tile (expected tiles under Poisson-spread counts times the per-tile cost,
# _tile_cost.SM90_TILE_COST) picked the faster form on all 16 measured rows.
# `wg96x4` (96-token tiles, four warpgroups) costs ~0.8x `wg128x4` per tile (tp8, one tile per
# expert: T = 3072 2999 vs 3805 us, T = 4096 3127 vs 3921; bench/results/
# 2026-12-01_h200_mxfp4_moe_wg96.md), so a short shard takes it while an expert's routes fit one
# 96-row tile (tp8 T = 4096: 73 routes). The long shard keeps wg128x4 there: the only long-shard
# rank measured (the benchmark's ep8, whose experts see 1.43x T*k/E: 105 routes at T = 4096)
# needs two 96-row tiles and ran 1.35x slower.
NARROW_PREFILL_MAX_LOAD = 96
# Past wg64x4's range the table's two forms (prefill_tile and its alt_tile) give way to wg128x4
# with a narrow second form (SM90_PAIR_CANDIDATES) where the tile-cost model (_tile_cost) says
# that costs at least SM90_PAIR_GAIN less (modeled_pair): with the width per expert each expert's
# last, partly filled tile then runs on 64 or 96 rows where its count sits just past a multiple
# of 128 (ep8 T = 6656: ~170 routes per expert, 128 + 42). Measured first on an H100 (then on an
# H200: SM90_PAIR_WIDE_MEMORY below), the table's pair and these in one process on the same
# inputs (bench/results/2026-12-05_h100_mxfp4_moe_modeled_pairs.md): ep8 T = 6656 / 7168 / 7680 /
# 8192 / 12288 10.0 / 7.3 / 2.4 / 2.3 / 4.2% faster, tp8 T = 5632 / 10240 / 12288 5.1 / 7.1 /
# 3.4%. Why only these pairs and a 4% margin: the model overstates a split's gain (0.3-1.0x of it
# reached the layer; at ep8 T = 6144 wg128x4 + wg64x4 modeled 3.2% faster and ran 8.5% slower),
# and the pairs that won most on the benchmark's evenly spread counts with a 160- or 32-row form
# (wg160x3 + wg32x4: ep8 T = 6144 -7.4%, T = 12288 -10.1%) hinge on the counts' exact spread: the
# same model with per-expert loads spread by 25-50% (as real routers give) puts them up to 7%
# behind the table at the rank's 1.43x and 3-18% at 1.13x (natural dispatch), where wg128x4 with
# wg64x4 / wg96x4 stays 0.9-10.7% ahead at both (docs/mxfp4_moe.md, "The modeled pair").
SM90_PAIR_CANDIDATES: tuple[tuple[str, str], ...] = (("wg128x4", "wg64x4"), ("wg128x4", "wg96x4"))
SM90_PAIR_GAIN = 0.04
# Up to two full wg128x4 tiles per expert at the rank's load: past it the narrow last tile is a
# smaller share of an expert's work, and through the table (ci/ab_decide.sh, package copies in
# turn, H100, bench/results/2026-12-05_h100_mxfp4_moe_modeled_pair_table_ab.md) ep8 T = 12288
# (314 routes per expert at the rank) ran 2.7% slower with wg64x4 (modeled 5.7% faster; the
# one-process --alts run of the day before had it 4.2% faster), T = 20480 (523) 3.0% faster,
# inside the A/B's order bias (the same decision read up to 2.4% apart). The rows under it won:
# ep8 T = 6656 / 7168 9.7 / 6.5%, tp8 T = 10240 7.6%.
SM90_PAIR_MAX_RANK_LOAD = 256.0
# Also where DRAM per SM is wide (an H200): through the table (ci/ab_decide.sh, package copies
# in turn, two runs each, H200, bench/results/2026-12-06_h200_mxfp4_moe_pair_wide_memory_ab.md)
# the rows whose decision it changes ran 4.9-9.7% faster (ep8 T = 6656 / 7168 / 8192, tp8
# T = 5632 / 10240) and the others within 1%. False keeps an H200 on the table's pairs.
SM90_PAIR_WIDE_MEMORY = True
# From here (where a short shard's wg96x4 stops serving one tile per expert) up: below, the
# table's measured limits stand (the model favours wg96x4 / wg64x4 over wg128x4 where an H200 ran
# them 3-6% slower: ep8 T = 2048, ..._h200_mxfp4_moe_wg96_long_shard_ab.md).
SM90_PAIR_MIN_LOAD = NARROW_PREFILL_MAX_LOAD
# And only with the width per expert (every measured row had it): without it a pair is a choice
# between two single forms, which the table makes from measured limits (the model's single
# wg96x4 at two tiles per expert ran 3.9% slower than the table's pair at ep8 T = 6144).
# An expert-parallel rank (a long shard, by the table's convention) sees more routes per local
# expert than T * top_k / E: every token it is sent has at least one local route (the contract's
# ep8 rank: 1.43x).
LONG_SHARD_RANK_LOAD = 1.43
SM90_MID_PREFILL = (SM90_MID_WG_MIN_LOAD, "prefill", BLOCK_N_OF["wg64x4"], "wg64x4")
SM90_MID = "wg32x4"  # the mid rows' form on sm_90 (BN 32, like n32)
TILES: tuple[str, ...] = tuple(BLOCK_N_OF)
# At BN 8 a GEMM whose reduction length K is at most this uses the short-K tiling (256 weight
# rows per CTA instead of eight warps splitting K). The host binds the two GEMM forms it is given.
SHORT_K = 1024
# After the narrow GEMM1 (T * top_k <= NARROW_ROUTES) a GEMM2 whose K is in this range takes
# `n8_shortk2`: 256 weight rows per CTA like `n8_shortk`, on eight warps, two splitting each
# 256-wide K stage, so the GEMM2 chains of the tiles GEMM1 finishes last are shorter. Measured on
# the H200 at tp8 (K = 384; bench/results/2026-12-02_h200_mxfp4_moe_shortk2_pairs.md): T = 1
# 1.6-2.6% faster (three passes); after the wider GEMM1s (T = 2..16) 3-7% slower, so only the
# narrow tile binds it. (From K = 256: a stage's 128-byte weight box fits the row.)
SHORT_K2 = (256, 512)
# With at most this many routes (the narrow decode tilings' range on every device) a GEMM2 whose
# K lies past SHORT_K2 up to SHORT_K keeps the narrow GEMM1's own tiling instead of n8_shortk:
# the short-K tiling gives such a launch one CTA per 256 weight rows of each routed expert (64
# CTAs at T = 1 of a 128-expert top-8 layer of H = 2048), each streaming its 6-8 K stages alone.
# Measured on an H100, same inputs (`ci/moe_gemm_pairs.py layer`, bench/results/
# 2026-12-06_h100_mxfp4_moe_short_gemm2.md): four layers with a shard of 768 or 1024 ran 12-30%
# faster at T = 1, 7-15% at T = 2, 2.5-15% at T = 4 and -7.5..+0.5% at T = 8 (top_k 6 and 8); past
# 64 routes n8_shortk stayed within -5..+4% of them. (At a K of 256..512 the narrow forms lose:
# tp8's GEMM2 as n8_narrow4 ran 6% slower at T = 1.)
NARROW_GEMM2_ROUTES = 64
# A four-warpgroup GEMM2 whose K (the intermediate shard) is at most this keeps each token tile's
# rows resident in shared memory (every stage of K in its own ring slot) and walks a contiguous
# range of items, so consecutive items reuse the rows and only the weights stream: `<tile>_rb`.
RESIDENT_K = 512
RESIDENT_TILES: tuple[str, ...] = ("wg128x4", "wg64x4", "wg32x4", "wg160x3", "wg96x4")
# Up to this many routes per expert a plan whose GEMMs are both mma.sync forms synchronizes GEMM1
# -> GEMM2 per token tile (GEMM2's CTAs stream their first weight stages while GEMM1 finishes,
# then wait only for their own tile). Measured on the H200, same run (bench/results/
# 2026-11-30_h200_mxfp4_moe_tile_sync.md): 4-8% faster at T = 1 and 4 (0.018 and 0.071 routes per
# expert), 2-3% at T = 16 (0.29), even at T = 28 (0.5), 1-2% slower at T = 64 (1.14), where
# GEMM1 fills the GPU.
TILE_SYNC_MAX_LOAD = 0.3
# Where DRAM bandwidth per SM is narrow (an H100 SXM) the sm_90 decode tiles (BN 8) sync at every
# load. Measured on an H100 80GB HBM3 with the unit queue that runs under the sync, same inputs
# (bench/results/2026-12-06_h100_mxfp4_moe_tile_sync_layers.md): four other layers (`cake-moe
# bench mxfp4-moe --layer`) 1.2-17.4% faster at T = 16..128 and +0.1% at 256; the contract's ep8
# 0-2.6% faster at T = 24..288, tp8 0.4-2.9% at T = 24..48, within 0.2% at 64..192 and
# +0.5..+1.1% at 256 / 288 (two runs).
SM90_NARROW_MEMORY_DECODE_SYNC = True
# The same on a wide-memory sm_90 part. Measured on the H200, same run, forced on against off
# (bench/results/2026-12-07_h200_mxfp4_moe_tile_sync_layers.md): the E256 k8 H7168 I2048 32-expert
# rank 9.8 / 5.3 / 1.3 / 1.3% faster at T = 16 / 32 / 64 / 128; the contract's ep8 -0.5..+0.3% at
# T = 24..256, tp8 -0.2..+1.1% at T = 24..32 (within the noise of one run). Not timed there yet:
# the H200's later decode rows (tp8 T = 64..560, ep8 T = 288..336).
SM90_WIDE_MEMORY_DECODE_SYNC = True
# moe::kMaxFewRoutes: up to this many routes the routing kernel takes its one-warp path.
MAX_FEW_ROUTES = 32
# moe::kRouteChunkMin: from 4x this many routes the routing runs over several CTAs, and a plan with
# two forms binds the width per expert (unless CAKE_MOE_TILE_SPLIT=0: _wrapper.split_width).
ROUTE_CHUNK_MIN = 4096
SPLIT_MIN_ROUTES = 4 * ROUTE_CHUNK_MIN


@dataclass(frozen=True)
class PlanDecision:
    """What ``plan()`` would run for a token count: ``forms`` are the kernel forms of one
    ``run()`` in pipeline order, as ``cake-moe info`` lists them (the routing form is one launch,
    or three from 16384 routes; at most 32 routes it is launched ahead of the dequantize);
    ``block_n`` the token rows per GEMM tile. With ``alt_tile`` (the sm_90a wgmma paths) the plan
    binds a second GEMM pair of that tile form, each GEMM followed by its alternative (seven forms): the routing kernel picks the pair from the actual counts
    (``_tile_cost.device_tile_choice``) and the other pair's kernels exit at once. ``supported`` is False
    only for a request the layer cannot serve (``reason``)."""

    supported: bool
    reason: str
    path: str
    block_n: int
    forms: tuple[str, ...]
    tile: str = ""  # form suffix of the GEMMs whose K exceeds SHORT_K
    tile_sync: bool = False  # GEMM2 waits per token tile for GEMM1 (TILE_SYNC_MAX_LOAD, SM90_*_DECODE_SYNC)
    alt_tile: str = ""  # the second wgmma tile form the device may run instead of ``tile``


def gemm_tiles(tile: str, hidden: int, inter: int, *, routes: int) -> tuple[str, str]:
    """The GEMM1 (K = hidden) and GEMM2 (K = inter) form suffixes of tile form ``tile`` for
    ``routes`` routes (T * top_k): the BN 8 forms take the short-K tiling for a K of at most
    SHORT_K (the narrow tile's GEMM2 its two-K-warp variant for a K in SHORT_K2; a narrow tile's
    GEMM2 of a K past SHORT_K2 keeps the narrow tiling up to NARROW_GEMM2_ROUTES), and a
    four-warpgroup GEMM2 its resident-rows form for a K of at most RESIDENT_K."""
    if tile not in TILES:
        raise ValueError(f"tile must be one of {TILES}, got {tile!r}")

    def suffix(k: int) -> str:
        return "n8_shortk" if tile.startswith("n8") and k <= SHORT_K else tile
    if tile in RESIDENT_TILES and inter <= RESIDENT_K:
        gemm2 = f"{tile}_rb"
    elif tile == "n8_narrow" and SHORT_K2[0] <= inter <= SHORT_K2[1]:
        gemm2 = "n8_shortk2"
    elif tile in ("n8_narrow", "n8_narrow4") and inter > SHORT_K2[1] and routes <= NARROW_GEMM2_ROUTES:
        gemm2 = tile
    else:
        gemm2 = suffix(inter)
    return suffix(hidden), gemm2


def gemm_forms(tile: str, hidden: int, inter: int, *, routes: int) -> tuple[str, str]:
    """The GEMM1 and GEMM2 form names of tile form ``tile`` for ``routes`` routes."""
    t1, t2 = gemm_tiles(tile, hidden, inter, routes=routes)
    return f"mxfp4_moe_gemm1_{t1}", f"mxfp4_moe_gemm2_{t2}"


def bound_gemm_tiles(decision: PlanDecision) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The GEMM1 and GEMM2 form suffixes a plan of ``decision`` binds, as decide() named them in
    ``decision.forms`` (gemm_forms at the call's routes): the table's form first, then the
    second form's where there is one."""
    def suffixes(gemm: str) -> tuple[str, ...]:
        prefix = f"mxfp4_moe_{gemm}_"
        return tuple(f.removeprefix(prefix) for f in decision.forms if f.startswith(prefix))
    return suffixes("gemm1"), suffixes("gemm2")


def routes_per_expert(num_tokens: int, top_k: int, num_experts: int) -> float:
    """The decision input: expected routes per expert, T * top_k / E."""
    return num_tokens * top_k / num_experts


def _by_expected_cost(forms: list[str], load: float) -> list[str]:
    return sorted(forms, key=lambda f: SM90_TILE_COST[f] * expected_tiles(load, BLOCK_N_OF[f]))


def _wide_prefill(load: float, short_shard: bool) -> list[str]:
    return ["wg128x4", "wg160x3"] + (["wg96x4"] if short_shard and load <= NARROW_PREFILL_MAX_LOAD else [])


def prefill_tile(load: float, short_shard: bool) -> str:
    """The table's sm_90a prefill form past wg64x4's range: the one of least expected cost
    (SM90_TILE_COST x expected tiles) of wg128x4, wg160x3 and, for a short shard while one tile
    can hold an expert's routes, wg96x4."""
    return _by_expected_cost(_wide_prefill(load, short_shard), load)[0]


def modeled_pair(load: float, short_shard: bool, tile: str, alt: str, split: bool) -> tuple[str, str]:
    """The two forms of a prefill decision (past wg64x4's range): the table's (``tile``,
    ``alt``), or the one of SM90_PAIR_CANDIDATES of least pair_costs at the rank's load
    (LONG_SHARD_RANK_LOAD for a long shard) where that models at least SM90_PAIR_GAIN cheaper,
    up to SM90_PAIR_MAX_RANK_LOAD routes per expert at the rank."""
    rank_load = load * (1.0 if short_shard else LONG_SHARD_RANK_LOAD)
    if rank_load > SM90_PAIR_MAX_RANK_LOAD:
        return tile, alt
    costs = pair_costs(rank_load, split)
    best = min(SM90_PAIR_CANDIDATES, key=lambda pair: costs[pair_key(*pair)])
    if costs[pair_key(*best)] > (1.0 - SM90_PAIR_GAIN) * costs[pair_key(tile, alt)]:
        return tile, alt
    return best


def alt_tile(load: float, short_shard: bool, tile: str, narrow_memory: bool = False) -> str:
    """The second form of an sm_90a wgmma decision, which the device runs instead where the
    call's actual counts make it cheaper (_tile_cost.device_tile_choice): past wg64x4's range the other
    wide form of least expected cost, or wg96x4 for wg128x4 up to the first of
    SM90_LONG_SHARD_WG96_LOADS; below it the next larger token tile (wg32x4 -> wg64x4 -> wg96x4
    for a short shard, past the second of SM90_LONG_SHARD_WG96_LOADS or where DRAM per SM is
    narrow, else wg128x4), since a rank's load runs above the T * k / E estimate wherever tokens
    reach it by expert-parallel dispatch (every token has a local route: ~1.43x at the
    contract's ep8)."""
    if tile == "wg32x4":
        return "wg64x4"
    if tile == "wg64x4":
        wg96 = short_shard or narrow_memory or load > SM90_LONG_SHARD_WG96_LOADS[1]
        return "wg96x4" if wg96 and load <= NARROW_PREFILL_MAX_LOAD else "wg128x4"
    if tile == "wg128x4" and load <= SM90_LONG_SHARD_WG96_LOADS[0]:
        return "wg96x4"
    return _by_expected_cost([f for f in _wide_prefill(load, short_shard) if f != tile], load)[0]


def _sm90_form(load: float, inter: int, narrow_memory: bool, split: bool) -> tuple[str, int, str, str]:
    """(path, block_n, tile, alt_tile) of an sm_90 device for ``load`` routes per expert: the
    wgmma paths name a second form for the device to choose from (alt_tile); ``split``: the
    plan would bind the width per expert (the several-CTA routing)."""
    short = inter <= RESIDENT_K
    decode_max: float
    if short:
        decode_max, mid_max, wg64_max = SM90_SHORT_SHARD_LOADS
    else:
        decode_max, mid_max, wg64_max = TILE_TABLE[0][0], SM90_MID_WG_MIN_LOAD, PREFILL_WG_MIN_LOAD
    if narrow_memory:
        decode_max = SM90_NARROW_MEMORY_DECODE_LOADS[1 if inter <= SM90_NARROW_MEMORY_SHORT_DECODE_K else 0]
    if load > wg64_max:
        tile = prefill_tile(load, short)
        alt = alt_tile(load, short, tile, narrow_memory)
        if split and load > SM90_PAIR_MIN_LOAD and (narrow_memory or SM90_PAIR_WIDE_MEMORY):
            tile, alt = modeled_pair(load, short, tile, alt, split)
        return "prefill", BLOCK_N_OF[tile], tile, alt
    if load > mid_max:
        return (*SM90_MID_PREFILL[1:], alt_tile(load, short, SM90_MID_PREFILL[3], narrow_memory))
    if load > decode_max:
        return "mid", BLOCK_N_OF[SM90_MID], SM90_MID, alt_tile(load, short, SM90_MID)
    return (*TILE_TABLE[0][1:], "")


def decide(num_tokens: int, top_k: int, num_experts: int, hidden: int, inter: int, *, sm90: bool = False,
           narrow_memory: bool = False, tile: str | None = None, tile_sync: bool | None = None,
           tile_split: bool = True) -> PlanDecision:
    """The decision for ``num_tokens`` tokens of a layer with ``hidden`` and ``inter`` (the
    rank's intermediate shard); every T >= 1 is served up to MAX_TOKEN_ROW_ELEMENTS. ``sm90``:
    the device runs the sm_90a forms; ``narrow_memory``: its DRAM bandwidth per SM is narrow (an
    H100 SXM), which moves the sm_90 decode limit down (SM90_NARROW_MEMORY_DECODE_LOADS; a shard
    of at most SM90_NARROW_MEMORY_SHORT_DECODE_K takes the short shard's), the four-warp narrow
    tiling's up (SM90_NARROW_MEMORY_NARROW4_ROUTES) and a long shard's wg96x4 second form down
    to every wg64x4 load (SM90_LONG_SHARD_WG96_LOADS), and past SM90_PAIR_MIN_LOAD binds the
    modeled pair (modeled_pair; SM90_PAIR_WIDE_MEMORY: elsewhere too). ``tile`` forces a tile form
    (benchmarks and tests); an sm_90a form needs ``sm90``. ``tile_sync`` forces the per-tile
    GEMM1 -> GEMM2 sync on or off (it never changes a bit of the result); True needs an mma.sync
    tile form (not one of SM90_TILES). ``tile_split``: a plan of two forms may bind the width per
    expert (False under CAKE_MOE_TILE_SPLIT=0), which the modeled pairs need. Every sm_90 decode
    decision syncs per tile (SM90_NARROW_MEMORY_DECODE_SYNC, SM90_WIDE_MEMORY_DECODE_SYNC); other
    archs up to TILE_SYNC_MAX_LOAD."""
    refusal = token_count_refusal(num_tokens, top_k, hidden, inter)
    if refusal:
        return PlanDecision(False, refusal, "none", 0, ())
    num_tokens = _validate.integer(num_tokens, "num_tokens")   # a numpy integer as an int
    load = routes_per_expert(num_tokens, top_k, num_experts)
    routes = num_tokens * top_k
    alt = ""
    if sm90:
        split = tile_split and routes >= SPLIT_MIN_ROUTES
        path, block_n, chosen, alt = _sm90_form(load, inter, narrow_memory, split)
    else:
        _, path, block_n, chosen = next(row for row in TILE_TABLE if load <= row[0])
    if routes <= MAX_FEW_ROUTES:
        alt = ""  # the few-route routing path lists one form's tiles
    narrow4_max = SM90_NARROW_MEMORY_NARROW4_ROUTES if sm90 and narrow_memory else NARROW4_ROUTES
    if block_n == 8 and routes <= narrow4_max:
        chosen = "n8_narrow" if routes <= NARROW_ROUTES else "n8_narrow4"
    if tile is not None:
        if tile not in TILES:
            raise ValueError(f"tile must be one of {TILES}, got {tile!r}")
        if tile in SM90_TILES and not sm90:
            return PlanDecision(False, f"tile {tile!r} is an sm_90a form; this device is not sm_90", "none", 0, ())
        chosen, path, alt = tile, "forced", ""
        block_n = BLOCK_N_OF[tile]
    sync_ok = chosen not in SM90_TILES
    if tile_sync is None:
        every_load = sm90 and block_n == 8 and (SM90_NARROW_MEMORY_DECODE_SYNC if narrow_memory
                                                else SM90_WIDE_MEMORY_DECODE_SYNC)
        tile_sync = sync_ok and (load <= TILE_SYNC_MAX_LOAD or every_load)
    elif not isinstance(tile_sync, bool):
        raise ValueError(f"tile_sync must be None, True or False, got {tile_sync!r}")
    elif tile_sync and not sync_ok:
        return PlanDecision(False, f"tile_sync needs an mma.sync tile form; {chosen!r} is a persistent sm_90a "
                            "form", "none", 0, ())
    reason = (f"T*k/E = {load:g} routes per expert: {path} tiles of BN={block_n} token rows ({chosen})"
              + (f", or of BN={BLOCK_N_OF[alt]} ({alt}) where the device finds the call's route counts make "
                 "them cheaper" if alt else "")
              + (", GEMM2 waits per token tile" if tile_sync else ""))
    gemm1, gemm2 = gemm_forms(chosen, hidden, inter, routes=routes)
    forms: tuple[str, ...]
    if alt:
        alt1, alt2 = gemm_forms(alt, hidden, inter, routes=routes)
        forms = (DEQUANT_FORM, ROUTE_FORM, gemm1, alt1, gemm2, alt2, FINALIZE_FORM)
    else:
        forms = (DEQUANT_FORM, ROUTE_FORM, gemm1, gemm2, FINALIZE_FORM)
    return PlanDecision(True, reason, path, block_n, forms, chosen, tile_sync, alt)
