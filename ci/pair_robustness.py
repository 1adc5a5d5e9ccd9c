"""Family B, CPU only: how a decision's pair of sm_90a forms fares when the rank's route counts
are not what the decision table assumes. For each contract row past SM90_PAIR_MIN_LOAD, the
modeled tile cost (SM90_TILE_COST x expected tiles under the routing kernel's listing rule, as
`_tile_cost.pair_costs`) of the pair the table binds where DRAM per SM is narrow and of any
pairs named, relative to the table's own pair, under scenarios: the rank's load at a factor of
T*k/E (a long shard: 1.43, the benchmark's expert-parallel rank, and 1.13, natural dispatch of
uniform routes) and each expert's mean load spread by a coefficient of variation (Gamma; 0 =
the benchmark's even spread).

    python ci/pair_robustness.py
    python ci/pair_robustness.py --tokens 6144 12288 --pairs wg160x3+wg32x4

The figures docs/mxfp4_moe.md ("The modeled pair") quotes come from it.
"""
from __future__ import annotations

import argparse
import math
import unittest.mock
from collections.abc import Mapping

import torch

from cake_moe.mxfp4_moe import _decide, _tile_cost

LAYOUTS = {"ep8": (3072, (1.43, 1.13)), "tp8": (384, (1.0,))}
SPREADS = (0.0, 0.25, 0.5)
NODES = 24  # equal-probability nodes of the Gamma spread


def spread_nodes(cv: float) -> list[float]:
    """Mean-1 Gamma quantiles at NODES equal-probability midpoints (from a seeded sample)."""
    if cv == 0:
        return [1.0]
    shape = torch.tensor(1.0 / cv**2, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    sample = torch._standard_gamma(shape.expand(40000), generator=gen).sort().values / shape
    return [float(sample[int((i + 0.5) * len(sample) / NODES)]) for i in range(NODES)]


def spread_costs(load: float, cv: float) -> Mapping[tuple[str, str], float]:
    """pair_costs with each expert's mean load spread by ``cv``: the expected tiles averaged
    over the spread first, then the routing kernel's choice among its listings (one choice for
    all experts, as the device makes it)."""
    nodes = [_tile_cost.pair_tiles(load * g) for g in spread_nodes(cv)]
    mean = _tile_cost.PairTiles(*(sum(field) / len(nodes) for field in zip(*nodes)))
    return _tile_cost.pair_listing_costs(mean, split=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+",
                    default=[5632, 6144, 6656, 7168, 7680, 8192, 9216, 10240, 11264, 12288, 16384, 20480])
    ap.add_argument("--pairs", default="", help="comma list of A+B: also score these pairs")
    args = ap.parse_args()
    named = [tuple(p.split("+")) for p in args.pairs.split(",") if p]
    k, e, h = 16, 896, 7168
    for layout, (inter, skews) in LAYOUTS.items():
        short = inter <= _decide.RESIDENT_K
        for t in args.tokens:
            load = _decide.routes_per_expert(t, k, e)
            if load <= _decide.SM90_PAIR_MIN_LOAD:
                continue
            tile = _decide.prefill_tile(load, short)
            table = (tile, _decide.alt_tile(load, short, tile, True))
            with unittest.mock.patch.object(_decide, "SM90_PAIR_MIN_LOAD", math.inf):  # the table alone
                off = _decide.decide(t, k, e, h, inter, sm90=True, narrow_memory=True)
            assert (off.tile, off.alt_tile) == table, (off, table)
            d = _decide.decide(t, k, e, h, inter, sm90=True, narrow_memory=True)
            scenarios = [(s, cv) for s in skews for cv in SPREADS]
            costs = [spread_costs(load * s, cv) for s, cv in scenarios]
            head = "  ".join(f"x{s}/cv{cv}" for s, cv in scenarios)
            print(f"{layout} T={t} table {'+'.join(table)}   ({head})")
            for pair in [(d.tile, d.alt_tile)] + named:
                rel = [c[_tile_cost.pair_key(*pair)] / c[_tile_cost.pair_key(*table)] - 1 for c in costs]
                label = "bound" if pair == (d.tile, d.alt_tile) else "named"
                print(f"  {label} {'+'.join(pair):18} " + "  ".join(f"{r:+7.1%}" for r in rel))


if __name__ == "__main__":
    main()
