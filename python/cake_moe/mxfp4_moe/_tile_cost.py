"""The token-tile cost model of the MXFP4 MoE layer's sm_90a forms (docs/mxfp4_moe.md, "Two
forms per decision"): what a token tile of each form costs, the expected tiles of an expert
under Poisson-spread route counts, and the routing kernel's own choice between a decision's two
forms (cpp/kernels/moe/moe_route.cuh: choose_listing; the functions named ``device_*`` mirror
it). The decision table (_decide) uses it to pick forms; plain data, host only."""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch

# Token rows per tile of every form the table (or a caller's `tile=`) can name.
BLOCK_N_OF: dict[str, int] = {"n8": 8, "n8_narrow": 8, "n8_narrow4": 8, "n32": 32, "n64": 64, "wg128": 128, "wg128x4": 128,
                               "wg64x4": 64, "wg32x4": 32, "wg160x3": 160, "wg96x4": 96}
# The cost of one token tile (all of an expert's m-blocks, both GEMMs) of each sm_90a form,
# relative to wg128x4: the layer's time is close to a fixed part plus tiles x this. wg160x3 with a
# margin over the measured; wg32x4 and wg64x4 fitted to the forced-tile rows of both layouts
# (bench/results/2026-12-01_h200_mxfp4_moe_short_shard_tiles.md: tp8 0.50 / 0.63, ep8 0.51 /
# 0.61-0.64 at 27-78 routes per expert, with each row's expected tile counts). The decision table
# keeps its measured thresholds; the device's choice between a decision's two forms uses these.
SM90_TILE_COST = {"wg32x4": 0.5, "wg64x4": 0.63, "wg96x4": 0.85, "wg128x4": 1.0, "wg160x3": 1.3}
SPLIT_GAIN_PCT = 2  # moe::kSplitGainPct: the split's second kernel pair costs a boundary and a tail


@functools.lru_cache(maxsize=1024)
def expected_tiles(load: float, block_n: int) -> float:
    """Expected token tiles of one expert whose route count is Poisson with mean ``load`` (the
    counts within 8 standard deviations; each term from the previous one, one ``exp`` per call)."""
    if load <= 0:
        return 0.0
    spread = 8.0 * math.sqrt(load) + 2.0
    lo, hi = max(0, int(load - spread)), int(load + spread) + 1
    p = math.exp(lo * math.log(load) - load - math.lgamma(lo + 1))
    total = 0.0
    for n in range(lo, hi):
        total += p * -(-n // block_n)
        p *= load / (n + 1)
    return total


# The sm_90a forms widest first, and every pair of them as (wider, narrower) indices into it.
PAIR_FORMS: tuple[str, ...] = tuple(sorted(SM90_TILE_COST, key=lambda f: BLOCK_N_OF[f], reverse=True))
_WIDE, _NARROW = (torch.tensor(ix) for ix in zip(*itertools.combinations(range(len(PAIR_FORMS)), 2)))


class PairTiles(NamedTuple):
    """Expected token tiles of one expert (tensors of float64): ``single[i]`` all in form
    PAIR_FORMS[i]; per pair (wider, narrower) of PAIR_FORMS, in combination order, the split's
    ``wide`` and ``narrow`` tiles (full tiles on the wider form, the last on the narrower where
    it fits). Linear in the count distribution, so tiles of several loads average into those of
    their mixture."""
    single: torch.Tensor
    wide: torch.Tensor
    narrow: torch.Tensor


@functools.lru_cache(maxsize=1024)
def pair_tiles(load: float) -> PairTiles:
    """PairTiles of an expert whose route count is Poisson with mean ``load > 0``: one pass over
    the counts within 8 standard deviations, all forms and pairs at once."""
    spread = 8.0 * math.sqrt(load) + 2.0
    n = torch.arange(max(0, int(load - spread)), int(load + spread) + 1, dtype=torch.float64)
    p = torch.exp(n * math.log(load) - load - torch.lgamma(n + 1))
    rows = torch.tensor([BLOCK_N_OF[f] for f in PAIR_FORMS], dtype=torch.float64)
    full = torch.floor(n / rows[_WIDE, None])
    rest = n - full * rows[_WIDE, None]
    last_narrow = (rest > 0) & (rest <= rows[_NARROW, None])
    return PairTiles(torch.ceil(n / rows[:, None]) @ p, (full + (rest > 0) * ~last_narrow) @ p, last_narrow.double() @ p)


def pair_listing_costs(tiles: PairTiles, split: bool) -> Mapping[tuple[str, str], float]:
    """The modeled tile cost per expert (SM90_TILE_COST x ``tiles``) of a decision naming each
    pair of forms (keys: pair_key): the cheaper single form's, or with the width per expert bound
    (``split``) the split listing's where that saves SPLIT_GAIN_PCT. The device chooses per call
    from the actual counts; over many experts that is close to this choice made on the expected
    costs."""
    cost = torch.tensor([SM90_TILE_COST[f] for f in PAIR_FORMS], dtype=torch.float64)
    single_each = cost * tiles.single
    best = torch.minimum(single_each[_WIDE], single_each[_NARROW])
    if split:
        both = cost[_WIDE] * tiles.wide + cost[_NARROW] * tiles.narrow
        best = torch.where(both * 100 < best * (100 - SPLIT_GAIN_PCT), both, best)
    costs = zip(_WIDE.tolist(), _NARROW.tolist(), best.tolist())
    return MappingProxyType({(PAIR_FORMS[i], PAIR_FORMS[j]): c for i, j, c in costs})


@functools.lru_cache(maxsize=1024)
def pair_costs(load: float, split: bool) -> Mapping[tuple[str, str], float]:
    """pair_listing_costs at Poisson counts of mean ``load > 0`` (a few hundred microseconds the
    first time; cached, hence read-only)."""
    return pair_listing_costs(pair_tiles(load), split)


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The key of the pair of forms ``a`` and ``b`` in pair_costs: the wider first."""
    return (a, b) if BLOCK_N_OF[a] > BLOCK_N_OF[b] else (b, a)


def tile_cost_milli(tile: str) -> int:
    """SM90_TILE_COST of a form in thousandths: the routing kernel's integer cost."""
    return round(1000 * SM90_TILE_COST[tile])


def _listing_cost(counts, form: str) -> int:
    """The routing kernel's cost of every tile in one form: sum of ceil(count / BN) x cost."""
    bn = BLOCK_N_OF[form]
    return sum(-(-int(c) // bn) for c in counts) * tile_cost_milli(form)


def device_tile_choice(counts, tile: str, alt_tile: str) -> str:
    """The form the routing kernel picks from a call's route count per local expert: ``alt_tile``
    where its tiles cost less in total (sum of ceil(count / BN) x cost per tile), else ``tile``."""
    return alt_tile if _listing_cost(counts, alt_tile) < _listing_cost(counts, tile) else tile


def device_tile_listing(counts, tile: str, alt_tile: str) -> str:
    """With the width per expert bound (``_wrapper.split_width``): the routing kernel's listing
    for a call's route count per local expert. ``tile`` or ``alt_tile`` alone as
    :func:`device_tile_choice`, or ``"TILE+ALT"``: each expert's full tiles of the wider form
    and a last tile of at most the narrower form's rows in its list, where that costs less than
    the cheaper single form by SPLIT_GAIN_PCT (cpp/kernels/moe/moe_route.cuh, choose_listing)."""
    wide, narrow = sorted((tile, alt_tile), key=lambda form: BLOCK_N_OF[form], reverse=True)
    bw, bn = BLOCK_N_OF[wide], BLOCK_N_OF[narrow]
    wide_tiles = narrow_tiles = 0
    for c in counts:
        full, rest = divmod(int(c), bw)
        wide_tiles += full + (1 if rest > bn else 0)
        narrow_tiles += 1 if 0 < rest <= bn else 0
    split = wide_tiles * tile_cost_milli(wide) + narrow_tiles * tile_cost_milli(narrow)
    single = min(_listing_cost(counts, tile), _listing_cost(counts, alt_tile))
    if split * 100 < single * (100 - SPLIT_GAIN_PCT):
        return f"{tile}+{alt_tile}"
    return device_tile_choice(counts, tile, alt_tile)
