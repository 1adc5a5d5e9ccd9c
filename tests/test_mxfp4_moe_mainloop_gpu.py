"""GPU tests of family B's schedule options, each of which must change no bit: the sm_90a tile
forms, the one-multiply scale conversion, the code ring, the per-tile sync, GEMM1's unit queue,
K halves and lookahead (SPEC §5: one set of bits per problem)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from .conftest import digest, poison_
from .fresh_interpreter import run_python
from .mxfp4_moe_cases import CONTRACT, LOOKAHEAD_CASES, Case, Layer, lookahead_case, make_case
from .mxfp4_moe_checks import SPLIT_FLAGS_AT, check_reference, routing_tables

pytestmark = pytest.mark.gpu


SM90_TILE_FORMS = ("wg128", "wg128x4", "wg64x4", "wg32x4", "wg160x3", "wg96x4")


@pytest.mark.parametrize("name,t", [("h384_ep_k8", 300), ("ring_h512_i512_e8_k2", 129), ("i640_h256_e8_k2", 200),
                                    ("ring_h256_i1024_e4_k2", 129)])
def test_sm90_tile_forms_give_the_same_bits(layers, name, t):
    """Every sm_90a wgmma form sums K in the same order (a warp owns whole rows, k16 steps in
    order, no K split; the token-tile size only changes which rows share a tile), so all give the
    same bits: the device's choice between a decision's two forms changes no bit. Resident-row
    and streamed GEMM2s, the code ring on both GEMMs."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma forms are sm_90a")
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 17)
    outs = {tile: layer.run(case, tile=tile) for tile in SM90_TILE_FORMS}
    check_reference(case, outs["wg128x4"], layer.bank)
    for tile, got in outs.items():
        assert torch.equal(got, outs["wg128x4"]), f"{tile}: other bits than wg128x4"


@pytest.mark.parametrize("t", [17, 1025])
@pytest.mark.parametrize("tile", SM90_TILE_FORMS)
@pytest.mark.parametrize("name", ["wide", "h512_e40_k5"])
def test_largest_codes_change_no_bit(layers, wide_scale_layer, name, t, tile):
    """The sm_90a forms convert an expert whose largest scale code (the prepared dict's
    w1_sf_max / w2_sf_max) is <= 128 with one multiply, any other with two; without the codes
    (the four tensors passed positionally) every expert takes two. Both are exact: the same
    bits, with experts of both kinds in one launch (the wide-scale bank)."""
    layer = wide_scale_layer if name == "wide" else layers(name)
    small = layer.prepared["w1_sf_max"] <= 128
    assert bool(small.any()) and (name != "wide" or not bool(small.all()))
    case = make_case(layer.geom, t, seed=t + 37)
    got = layer.run(case, tile=tile)
    check_reference(case, got, layer.bank)
    assert torch.equal(layer.run(case, tile=tile, positional=True), got), "the one-multiply path changed a bit"


# Every form with H a multiple of 512 (GEMM1's ring); with H = 256 only `wg160x3`, whose GEMM2
# has the ring for I = 1024 (another form there has no ring to switch).
_RING_CASES = [(name, t, tile) for name, t in (("wide", 17), ("ring_h512_i512_e8_k2", 129), ("ep8", 1025),
                                               ("tp8", 129)) for tile in SM90_TILE_FORMS]
_RING_CASES.append(("ring_h256_i1024_e4_k2", 129, "wg160x3"))


@pytest.mark.parametrize("name,t,tile", _RING_CASES)
def test_code_ring_changes_no_bit(layers, wide_scale_layer, monkeypatch, name, t, tile):
    """The sm_90a code ring (GemmParams::code_ring, sm90_code_ring.cuh): GEMM1 with H a multiple
    of 512 and the `wg160x3` GEMM2 with I one take their scale codes four stages per copy into a
    ring of their own; CAKE_MOE_CODE_RING=0 copies each stage's words with its weights instead:
    the same bits either way, repeatably."""
    layer = wide_scale_layer if name == "wide" else layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 47)
    outs = {}
    for env in ("0", ""):
        monkeypatch.setenv("CAKE_MOE_CODE_RING", env)
        outs[env] = layer.run(case, tile=tile)
        assert torch.equal(layer.run(case, tile=tile), outs[env]), f"CAKE_MOE_CODE_RING={env!r}: a rerun changed a bit"
    check_reference(case, outs[""], layer.bank)
    assert torch.equal(outs[""], outs["0"]), "the code ring changed the bits"


def _tile_synced_runs(layer: Layer, case: Case, tile: str, runs: int) -> list[torch.Tensor]:
    """The outputs of `runs` runs of one plan with the per-tile sync forced on, each into a
    poisoned output."""
    plan, out = layer.plan(case, tile=tile, tile_sync=True)
    assert plan.decision.tile_sync
    outs = []
    for _ in range(runs):
        poison_(out)
        plan.run()
        torch.cuda.synchronize()
        outs.append(out.clone())
    return outs


@pytest.mark.parametrize("name,t,tile", [("tp8", 1, "n8_narrow"), ("ep8", 4, "n8"), ("tp8", 16, "n8"),
                                         ("tp8", 129, "n8"), ("h256_e8_k2", 17, "n8_narrow"),
                                         ("h384_ep_k8", 129, "n32"), ("h512_e40_k5", 1025, "n64"),
                                         ("h128_e1024_k32", 1025, "n8")])
def test_tile_sync_changes_no_bit(layers, name, t, tile):
    """The per-token-tile GEMM1 -> GEMM2 sync, on and off, on the decode sizes the table gives it
    and on multi-wave launches it would not (where GEMM2 CTAs wait on tiles GEMM1 has not
    reached): the same bits, repeatably, within the budget."""
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 21)
    synced = _tile_synced_runs(layer, case, tile, 3)
    check_reference(case, synced[0], layer.bank)
    assert all(torch.equal(y, synced[0]) for y in synced), "a repeated tile-synced run changed the bits"
    assert torch.equal(layer.run(case, tile=tile, tile_sync=False), synced[0]), "tile_sync changed the bits"


@pytest.mark.parametrize("name,t,tile,ctas", [("tp8", 1, "n8_narrow", 37), ("ep8", 1, "n8_narrow", 100),
                                              ("ep8", 2, "n8_narrow4", 1), ("ep8", 4, "n8", 64),
                                              ("h256_e8_k2", 17, "n8_narrow", 1), ("h256_e8_k2", 17, "n8_narrow", 5),
                                              ("h384_ep_k8", 129, "n32", 7), ("h128_e1024_k32", 1025, "n8", 13)])
def test_gemm1_unit_queue_changes_no_bit(layers, monkeypatch, name, t, tile, ctas):
    """Under tile sync GEMM1 runs on the CTAs resident at once and a CTA done with its unit takes
    the next from a queue (GemmParams::unit_queue). CAKE_MOE_UNIT_QUEUE=N caps that grid at N
    CTAs, so each takes many units (with the lookahead at T = 1, 2 for its first unit only); =0
    launches one CTA per unit of the worst case. The same bits either way, within the budget."""
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 43)
    outs = {}
    for env in ("0", str(ctas), ""):
        monkeypatch.setenv("CAKE_MOE_UNIT_QUEUE", env)
        got = _tile_synced_runs(layer, case, tile, 2)
        assert torch.equal(got[0], got[1]), f"CAKE_MOE_UNIT_QUEUE={env!r}: a repeated run changed the bits"
        outs[env] = got[0]
    check_reference(case, outs["0"], layer.bank)
    assert torch.equal(outs[str(ctas)], outs["0"]), f"a grid of {ctas} GEMM1 CTAs changed the bits"
    assert torch.equal(outs[""], outs["0"]), "the resident-CTA grid changed the bits"


def _gemm1_units(layer: Layer, case: Case, tile: str) -> int:
    """GEMM1's units (token tiles x m-blocks) of a case under a tile form, from one run's tables."""
    ws = layer.workspace(case.x.shape[0])
    plan, _ = layer.plan(case, workspace=ws, tile=tile, tile_sync=True)
    plan.run()
    torch.cuda.synchronize()
    tiles = routing_tables(ws, layer.geom, case.x.shape[0])["tile_count"]
    return tiles * -(-2 * layer.geom.i_shard // (128 if tile == "n8" else 64))


def _split_grid_runs(layer: Layer, case: Case, tile: str, ctas: int, monkeypatch) -> dict:
    """Under tile sync, for CAKE_MOE_UNIT_QUEUE "0" (one CTA per piece), `ctas` and "" (the
    resident CTAs): two runs of one plan on a poisoned workspace, which must give the same bits;
    per setting the output and the K halves' split flags from the tile list's header."""
    t = case.x.shape[0]
    runs = {}
    for env in ("0", str(ctas), ""):
        monkeypatch.setenv("CAKE_MOE_UNIT_QUEUE", env)
        ws = layer.workspace(t)
        ws.fill_(0x5A)
        plan, out = layer.plan(case, workspace=ws, tile=tile, tile_sync=True)
        assert plan.decision.tile_sync
        got = []
        for _ in range(2):
            poison_(out)
            plan.run()
            torch.cuda.synchronize()
            got.append(out.clone())
        assert torch.equal(got[0], got[1]), f"CAKE_MOE_UNIT_QUEUE={env!r}: a repeated run changed the bits"
        runs[env] = (got[0], routing_tables(ws, layer.geom, t)["header"][SPLIT_FLAGS_AT - 1:])
    return runs


@pytest.mark.parametrize("name,t,tile,tail,ctas", [
    ("tp8", 1, "n8_narrow", 60, 37), ("tp8", 1, "n8_narrow", 128, 200), ("ep8", 1, "n8_narrow", 24, 64),
    ("ep8", 2, "n8_narrow4", 100, 7), ("ep8", 4, "n8", 50, 64),
    ("tp8", 16, "n8", 0, 3),  # from unit 3 on: more units than CAKE_MOE_SPLIT_MAX, none split
    ("split_h2048_e8_k2", 17, "n8_narrow", 128, 3), ("split_h2048_e8_k2", 129, "n8", 128, 5)])
def test_gemm1_k_halves(layers, monkeypatch, name, t, tile, tail, ctas):
    """Under tile sync the GEMM1 units from CAKE_MOE_SPLIT_FROM=N on (default: past the resident
    CTAs), if at most CAKE_MOE_SPLIT_MAX (default: half the SMs), are two K halves on two CTAs,
    the half to finish first parking its partial sums for the other; here the last `tail` units.
    Within the budget, repeatable, the same bits for every grid (CAKE_MOE_UNIT_QUEUE: one CTA per
    piece, a few CTAs taking many, the resident ones), and the flags show that every split
    unit's halves met and no other unit was split."""
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 61)
    monkeypatch.setenv("CAKE_MOE_SPLIT_ALL_MAX", "0")  # the second-wave rule alone
    monkeypatch.setenv("CAKE_MOE_SPLIT_FROM", "-1")
    units = _gemm1_units(layer, case, tile)
    split_from = max(units - tail, 0) if tail else 3
    split = min(tail, units)
    assert units > (128 + 3 if tail == 0 else 0), units
    monkeypatch.setenv("CAKE_MOE_SPLIT_FROM", str(split_from))
    monkeypatch.setenv("CAKE_MOE_SPLIT_MAX", "128")
    runs = _split_grid_runs(layer, case, tile, ctas, monkeypatch)
    for _, flags in runs.values():
        assert int((flags == 2 + (1 << 16)).sum()) == split and int((flags != 0).sum()) == split, flags[:split + 2]
    outs = {env: out for env, (out, _) in runs.items()}
    check_reference(case, outs["0"], layer.bank)
    assert torch.equal(outs[str(ctas)], outs["0"]), f"a grid of {ctas} GEMM1 CTAs changed the bits"
    assert torch.equal(outs[""], outs["0"]), "the resident-CTA grid changed the bits"


def _one_local_expert(case: Case) -> Case:
    """The case with every token routed to one local expert and top_k - 1 remote ones."""
    g = case.geom
    remote = [e for e in range(g.num_experts) if not g.offset <= e < g.offset + g.local][:g.top_k - 1]
    ids = torch.tensor([[g.offset + 7] + remote] * case.x.shape[0], dtype=torch.int32, device="cuda")
    return dataclasses.replace(case, topk_ids=ids)


@pytest.mark.parametrize("name,regime,t,tile,ctas", [("ep8", "one_local", 1, "n8_narrow", 37),
                                                    ("ep8", "one_local", 2, "n8_narrow4", 64),
                                                    ("split_h2048_e8_k2", "zipf", 17, "n8_narrow", 3),
                                                    ("split_h2048_e8_k2", "balanced", 2, "n8_narrow", 1)])
def test_gemm1_k_halves_short_first_wave(layers, monkeypatch, name, regime, t, tile, ctas):
    """Under tile sync, with at most CAKE_MOE_SPLIT_ALL_MAX GEMM1 units (default: the SMs, at
    most 128) every unit is two K halves (GemmParams::split_all_max): the flags show each unit's
    halves met, the bits do not depend on the grid (CAKE_MOE_UNIT_QUEUE), and the layer is
    within the budget; =0 computes the units whole (bits within rounding of the halves)."""
    layer = layers(name)
    case = make_case(layer.geom, t, "balanced" if regime == "one_local" else regime, seed=t + 83)
    if regime == "one_local":
        case = _one_local_expert(case)
    units = _gemm1_units(layer, case, tile)
    assert 0 < units <= 128, units
    runs = _split_grid_runs(layer, case, tile, ctas, monkeypatch)
    for _, flags in runs.values():
        assert int((flags[:units] == 2 + (1 << 16)).sum()) == units and int((flags != 0).sum()) == units, flags[:units + 2]
    outs = {env: out for env, (out, _) in runs.items()}
    check_reference(case, outs[""], layer.bank)
    assert torch.equal(outs[str(ctas)], outs[""]), f"a grid of {ctas} GEMM1 CTAs changed the bits"
    assert torch.equal(outs["0"], outs[""]), "one CTA per piece changed the bits"
    monkeypatch.setenv("CAKE_MOE_SPLIT_ALL_MAX", "0")
    whole = layer.run(case, tile=tile, tile_sync=True)
    check_reference(case, whole, layer.bank)


@pytest.mark.parametrize("name,regime,t,tile,packed", LOOKAHEAD_CASES)
def test_gemm1_lookahead_regimes(layers, name, regime, t, tile, packed):
    """GEMM1 with at most 32 routes names each CTA's expert from the routes before the routing
    kernel lists the tiles (the list decides; mxfp4_moe_gemm.cuh, lookahead)."""
    layer = layers(name)
    case, got = lookahead_case(layer, regime, t, tile, packed)
    assert t * layer.geom.top_k <= 32
    if regime == "remote":
        assert not got.view(torch.int16).any(), "routes to remote experts must give exact zeros"
    else:
        check_reference(case, got, layer.bank)


def test_gemm1_lookahead_reload_changes_no_bit(layers):
    """With CAKE_MOE_LOOKAHEAD_SKEW=1 every early weight request names a wrong expert (or a tile
    the list does not have): the kernel's reload and drain paths must give the same bits."""
    cases = [c for c in LOOKAHEAD_CASES if c[0] not in CONTRACT]   # small banks: the subprocess builds its own
    code = (
        "import hashlib, torch;"
        "from mxfp4_moe_cases import named_layer, lookahead_case, LOOKAHEAD_CASES, CONTRACT;"
        "[print(hashlib.sha256(lookahead_case(named_layer(n), *c)[1].view(torch.uint8).cpu().numpy()"
        ".tobytes()).hexdigest()) for n, *c in LOOKAHEAD_CASES if n not in CONTRACT]")
    printed = run_python(code, CAKE_MOE_LOOKAHEAD_SKEW="1")
    want = [digest(lookahead_case(layers(n), *c)[1]) for n, *c in cases]
    assert printed.split() == want, "the lookahead's reload path changed the bits"
