"""GPU tests of the shared MoE routing (cpp/kernels/moe/moe_route.cuh) as the MXFP4 layer drives
it: the routing kernel's tables against a model of them, the device's choice between a
decision's two token-tile forms, and the width per expert (a tile list per form, both run).

The public API is imported inside the helpers (tests/mxfp4_moe_cases.Layer), never at
collection, so the CPU suite collects this file on a build without the extension.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from .conftest import poison_
from .mxfp4_moe_cases import LOOKAHEAD_CASES, Case, Geometry, few_routes_case, local_routes, make_case, route_ids
from .mxfp4_moe_checks import SPLIT_FLAGS_AT, TILE_CHOICE_AT, check_reference, routing_tables

pytestmark = pytest.mark.gpu


def _case_with_local_counts(geom: Geometry, t: int, per_expert: int, seed: int) -> Case:
    """A case whose routes give each local expert exactly ``per_expert`` routes (the rest name
    remote experts), in random slots: the route counts, and so the device's prefill tile choice,
    are set by construction."""
    case = make_case(geom, t, seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed)
    n, local = t * geom.top_k, per_expert * geom.local
    remote = [e for e in range(geom.num_experts) if not geom.offset <= e < geom.offset + geom.local]
    assert remote and local <= n
    ids = torch.arange(n, device="cuda") // per_expert + geom.offset
    fill = torch.tensor(remote, device="cuda")[torch.randint(0, len(remote), (n,), device="cuda", generator=g)]
    ids = torch.where(torch.arange(n, device="cuda") < local, ids, fill)
    ids = ids[torch.randperm(n, device="cuda", generator=g)].to(torch.int32).view(t, geom.top_k).contiguous()
    return dataclasses.replace(case, topk_ids=ids)


# h384_ep_k8 (16 local experts, I = 256, k = 8: T / 8 routes per expert expected). Per T the
# table's pair and two per-expert route counts that the device's rule sends to different forms
# of it: T = 200 wg32x4 / wg64x4 (30: one 32-row tile; 40: two, against one 64-row tile), 400
# wg64x4 / wg96x4, 1024 wg160x3 / wg128x4 (100 fit one tile of either, 128 is cheaper; 150 one
# 160-row tile or two 128-row ones), 2048 wg128x4 / wg160x3 (16384 routes: the several-CTA routing).
@pytest.mark.parametrize("t,counts,pair", [(200, (30, 40), ("wg32x4", "wg64x4")),
                                           (400, (60, 90), ("wg64x4", "wg96x4")),
                                           (1024, (100, 150), ("wg160x3", "wg128x4")),
                                           (2048, (100, 150), ("wg128x4", "wg160x3"))])
def test_device_tile_choice(layers, t, counts, pair):
    """The routing kernel picks one of the decision's two wgmma forms from the call's route
    counts: each run's bits are those of the chosen form forced, the choice follows the counts
    the routes set (sum of ceil(count / BN) x cost per tile), and a replayed graph follows new
    routes across the two forms without a new plan."""
    from cake_moe.mxfp4_moe import _decide, _tile_cost
    layer = layers("h384_ep_k8")
    geom = layer.geom
    low, high = counts
    cases = _cases_with_local_counts(geom, t, counts, seed=40)
    bound = _bindable(cases[low])
    plan, out = layer.plan(bound)
    d = plan.decision
    assert (d.tile, d.alt_tile) == pair, d
    assert len(d.forms) == 7 and _decide.gemm_forms(d.alt_tile, geom.hidden, geom.i_shard,
                                                                routes=t * geom.top_k)[0] in plan.forms
    want = {}
    for n, case in cases.items():
        choice = _tile_cost.device_tile_choice([n] * geom.local, d.tile, d.alt_tile)
        assert choice == (min if n == low else max)(pair, key=_tile_cost.BLOCK_N_OF.get)  # more routes: wider
        forced = layer.run(case, tile=choice)
        check_reference(case, forced, layer.bank)
        auto_plan, auto_out = layer.plan(case)
        poison_(auto_out)
        auto_plan.run()
        torch.cuda.synchronize()
        assert auto_plan.last_tile() == choice
        assert torch.equal(auto_out, forced), f"{n} routes per expert: not the bits of {choice} forced"
        want[n] = (choice, forced)
    _check_replays_follow(plan, out, bound, [(n, cases[n], *want[n]) for n in (high, low, high)])


_ROUTED_INPUTS = ("x", "x_sf", "topk_ids", "topk_weights")


def _cases_with_local_counts(geom: Geometry, t: int, counts, seed: int) -> dict[int, Case]:
    """_case_with_local_counts per count, all with the first one's beta and linear_beta (a plan
    binds those once; _check_replays_follow rewrites only the routed inputs)."""
    cases = {n: _case_with_local_counts(geom, t, n, seed=seed + n) for n in counts}
    first = cases[counts[0]]
    return {n: dataclasses.replace(c, beta=first.beta, linear_beta=first.linear_beta) for n, c in cases.items()}


def _bindable(case: Case) -> Case:
    """A copy of case with its own routed inputs, for a plan bound once and rewritten later."""
    return dataclasses.replace(case, **{f: getattr(case, f).clone() for f in _ROUTED_INPUTS})


def _check_replays_follow(plan, out: torch.Tensor, bound: Case, runs) -> None:
    """One capture of plan (bound to ``bound``'s inputs), replayed once per (label, case, tile,
    bits) of runs with ``case``'s routed inputs written into the bound ones: each replay reports
    ``tile`` (plan.last_tile()) and gives ``bits``, without a new plan."""
    plan.run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run()
    for label, case, tile, bits in runs:
        for f in _ROUTED_INPUTS:
            getattr(bound, f).copy_(getattr(case, f))
        poison_(out)
        graph.replay()
        torch.cuda.synchronize()
        assert plan.last_tile() == tile, label
        assert torch.equal(out, bits), f"replay with {label} routes per expert: not the bits of {tile}"


# h384_ep_k8 at T = 2048 (16384 routes: the several-CTA routing) binds wg128x4 and wg160x3. Per
# local expert 260 routes = 160 + 100 (split: 1.3 + 1.0 against 2 x 1.3 and 3 x 1.0), 100 (one
# 128-row tile) and 150 (one 160-row tile). ep8 at T = 8192 binds the two the other way round
# (wg160x3 first, the table's own pair: the modeled pair is held off, since it binds wg128x4 and
# wg96x4 there): the narrower form's list is then the second one.
# The modeled pairs (SM90_PAIR_MIN_LOAD) with a narrow last-tile form: ep8 T = 6656 binds wg128x4
# and wg64x4 (170 = 128 + 42), T = 8192 wg128x4 and wg96x4 (200 = 128 + 72).
@pytest.mark.parametrize("name,t,n,want,pair", [
    ("h384_ep_k8", 2048, 260, "wg128x4+wg160x3", "table"), ("h384_ep_k8", 2048, 100, "wg128x4", "table"),
    ("h384_ep_k8", 2048, 150, "wg160x3", "table"), ("ep8", 8192, 260, "wg160x3+wg128x4", "table"),
    ("ep8", 6656, 170, "wg128x4+wg64x4", "wg128x4+wg64x4"), ("ep8", 8192, 200, "wg128x4+wg96x4", "wg128x4+wg96x4")])
def test_width_per_expert(layers, monkeypatch, name, t, n, want, pair):
    """The width per expert (on by default): the routing kernel lists each expert's full tiles of
    the wider form (wg160x3) and its last tile of at most the narrower form's rows for the
    narrower, or one form's tiles alone, by the rule _tile_cost.device_tile_listing mirrors, and each
    listing gives the bits of wg160x3 forced alone (every wgmma form gives the same bits).
    CAKE_MOE_TILE_SPLIT=0 keeps one list (device_tile_choice), with the same bits."""
    from cake_moe.mxfp4_moe import _decide, _tile_cost
    from cake_moe.mxfp4_moe._wrapper import split_width
    monkeypatch.delenv("CAKE_MOE_TILE_SPLIT", raising=False)
    if pair == "table":
        monkeypatch.setattr(_decide, "SM90_PAIR_MIN_LOAD", float("inf"))
    else:   # the modeled pair on any sm_90 part (the H200 keeps the table's unless told)
        monkeypatch.setattr(_decide, "SM90_PAIR_WIDE_MEMORY", True)
    layer = layers(name)
    geom = layer.geom
    case = _case_with_local_counts(geom, t, n, seed=60 + n)
    forced = layer.run(case, tile="wg160x3")
    check_reference(case, forced, layer.bank)
    ws = layer.workspace(t)
    ws.fill_(0xA5)
    plan, out = layer.plan(case, workspace=ws)
    d = plan.decision
    assert f"{d.tile}+{d.alt_tile}" == pair if pair != "table" else {d.tile, d.alt_tile} == {"wg128x4", "wg160x3"}, d
    assert "+" not in want or want == f"{d.tile}+{d.alt_tile}", d  # plan.last_tile() names the table's first
    assert split_width(d, t, geom.top_k) and plan._plan.split_width, "the mirror and the host must agree"
    assert _tile_cost.device_tile_listing([n] * geom.local, d.tile, d.alt_tile) == want
    for _ in range(2):  # the second run: the lists and words of the first are rewritten
        poison_(out)
        plan.run()
        torch.cuda.synchronize()
        assert plan.last_tile() == want
        assert torch.equal(out, forced), f"{n} routes per expert: not the bits of wg160x3 forced"
        _check_tile_lists(routing_tables(ws, geom, t), [n] * geom.local, d, split=True)
    monkeypatch.setenv("CAKE_MOE_TILE_SPLIT", "0")
    one_plan, one_out = layer.plan(case)   # (a modeled pair needs the split: off, the table's pair)
    one = one_plan.decision
    assert not split_width(one, t, geom.top_k) and not one_plan._plan.split_width
    assert pair == "table" or {one.tile, one.alt_tile} == {"wg128x4", "wg160x3"}, one
    poison_(one_out)
    one_plan.run()
    torch.cuda.synchronize()
    assert one_plan.last_tile() == _tile_cost.device_tile_choice([n] * geom.local, one.tile, one.alt_tile)
    assert torch.equal(one_out, forced), "CAKE_MOE_TILE_SPLIT=0 changed the bits"


def test_width_per_expert_graph_replay(layers, monkeypatch):
    """One captured plan follows new routes across the width per expert's listings (split, the
    first form alone, the second alone): the words and lists the routing kernel writes, not the
    plan, decide which pairs run."""
    from cake_moe.mxfp4_moe import _tile_cost
    monkeypatch.delenv("CAKE_MOE_TILE_SPLIT", raising=False)
    layer = layers("h384_ep_k8")
    geom = layer.geom
    t, counts = 2048, (260, 100, 150)
    cases = _cases_with_local_counts(geom, t, counts, seed=70)
    bound = _bindable(cases[counts[0]])
    plan, out = layer.plan(bound)
    d = plan.decision
    listing = {n: _tile_cost.device_tile_listing([n] * geom.local, d.tile, d.alt_tile) for n in counts}
    assert sorted(listing.values()) == ["wg128x4", "wg128x4+wg160x3", "wg160x3"], listing
    forced = {n: layer.run(cases[n], tile="wg160x3") for n in counts}
    _check_replays_follow(plan, out, bound, [(n, cases[n], listing[n], forced[n]) for n in (*counts, counts[0])])


def _want_tile_lists(counts: list[int], d, split: bool):
    """The token-tile lists ((expert, first row) per tile) and choice words the routing kernel
    writes for route counts per local expert under decision d: ((first list, its word), None),
    or with the width per expert ``split`` ((first list, word), (second list, word)); a pair
    runs where its word is 0 (moe_route.cuh, publish_offsets and publish_offsets_split)."""
    from cake_moe.mxfp4_moe import _tile_cost
    bn_of = _tile_cost.BLOCK_N_OF
    starts = [sum(counts[:e]) for e in range(len(counts))]

    def listed(rows_of) -> list[tuple[int, int]]:  # rows_of(count): an expert's tiles' first rows
        return [(e, starts[e] + r) for e, c in enumerate(counts) for r in rows_of(c)]

    def every(bn: int):
        return lambda c: range(0, c, bn)

    if not d.alt_tile:
        return (listed(every(d.block_n)), 0), None
    if not split:
        chosen = _tile_cost.device_tile_choice(counts, d.tile, d.alt_tile)
        return (listed(every(bn_of[chosen])), int(chosen == d.alt_tile)), None
    listing = _tile_cost.device_tile_listing(counts, d.tile, d.alt_tile)
    if "+" not in listing:
        whole, first = listed(every(bn_of[listing])), listing == d.tile
        return (whole if first else [], int(not first)), ([] if first else whole, int(first))
    wide, narrow = sorted((d.tile, d.alt_tile), key=bn_of.get, reverse=True)
    bw, bn = bn_of[wide], bn_of[narrow]

    def last_narrow(c: int) -> bool:  # the expert's last tile takes the narrower form
        return 0 < c % bw <= bn

    lists = {wide: listed(lambda c: range(0, c - c % bw if last_narrow(c) else c, bw)),
             narrow: listed(lambda c: [c - c % bw] if last_narrow(c) else [])}
    return (lists[d.tile], 0), (lists[d.alt_tile], 0)


def _check_tile_lists(got: dict, counts: list[int], d, split: bool) -> None:
    (tiles, word), alt = _want_tile_lists(counts, d, split)
    assert int(got["header"][TILE_CHOICE_AT - 1]) == word
    assert got["tile_count"] == len(tiles)
    assert [tuple(x) for x in got["tiles"].tolist()] == tiles
    if alt is not None:
        alt_tiles, alt_word = alt
        assert int(got["alt_header"][TILE_CHOICE_AT - 1]) == alt_word
        assert got["alt_tile_count"] == len(alt_tiles)
        assert [tuple(x) for x in got["alt_tiles"].tolist()] == alt_tiles


@pytest.mark.parametrize("name,regime,t,tile,packed", LOOKAHEAD_CASES + [
    ("h512_e40_k5", "dup", 9, None, False), ("h512_e40_k5", "hot", 700, None, False),
    ("h512_e40_k5", "balanced", 4000, None, True)])  # 45 routes, one CTA; 3500; 20000 over several CTAs
def test_routing_bookkeeping(layers, name, regime, t, tile, packed):
    """The routing kernel's tables against a model of them: offsets are the exclusive prefix of
    the local routes per expert; each expert's rows hold exactly its routes (in route order up to
    32 routes, where one warp places them; unspecified order beyond) and name their tokens; the
    tile list runs in ascending expert order, ceil(count / BN) tiles each, counters zeroed."""
    layer = layers(name)
    geom = layer.geom
    case = few_routes_case(geom, regime, t, packed)
    ws = layer.workspace(t)
    ws.fill_(0xA5)
    plan, _ = layer.plan(case, workspace=ws, tile=tile)
    plan.run()
    torch.cuda.synchronize()
    got = routing_tables(ws, geom, t)
    local = local_routes(geom, route_ids(case)).reshape(-1).cpu()
    counts = torch.bincount(local[local >= 0], minlength=geom.local)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    assert torch.equal(got["offsets"].long(), offsets)
    route_row = got["route_row"]
    assert torch.equal(route_row < 0, local < 0), "a route's row is -1 exactly when it contributes nothing"
    for e in torch.nonzero(counts).flatten().tolist():
        routes = torch.nonzero(local == e).flatten()
        rows = route_row[routes].long()
        want_rows = torch.arange(int(offsets[e]), int(offsets[e + 1]))
        if local.numel() <= 32:
            assert torch.equal(rows, want_rows), f"expert {e}: rows not in route order"
        else:
            assert torch.equal(rows.sort().values, want_rows), f"expert {e}: rows are not its own"
        assert torch.equal(got["row_token"][rows].long(), routes // geom.top_k)
    # the tile lists: one form's, one of two prefill forms chosen from the counts, or the width
    # per expert's two lists
    from cake_moe.mxfp4_moe._wrapper import split_width
    split = split_width(plan.decision, t, geom.top_k)
    assert plan._plan.split_width == split, "the Python mirror of the host's width-per-expert rule disagrees"
    _check_tile_lists(got, counts.tolist(), plan.decision, split)
    flags = got["header"][SPLIT_FLAGS_AT - 1:]  # zeroed by the routing kernel; a K-halved unit's: two claims + published
    assert bool(((flags == 0) | (flags == 2 + (1 << 16))).all()), flags[flags != 0]
    done = got["tile_done"]  # zeroed by the routing kernel; with the tile sync every GEMM1 CTA then counts in
    if plan.decision.tile_sync:
        assert done.numel() == 0 or (bool((done == done[0]).all()) and 0 < int(done[0]) <= 1024), done
    else:
        assert not done.any()
