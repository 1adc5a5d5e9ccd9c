"""GPU tests of family B (MXFP4 x MXFP8 SiTU routed MoE) against the FP64 reference
(SPEC §5, §7, §11): the contract geometry (ep8, tp8) over T = 1 .. 16384, general shapes,
routing regimes, route forms, bitwise determinism, graph replay, refusals and allocation. The
routing kernel's tables and the token-tile choices are tested in test_moe_route_gpu.py.

The public API is imported inside the helpers (tests/mxfp4_moe_cases.Layer), never at
collection, so the CPU suite collects this file on a build without the extension.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import subprocess
import sys

import pytest
import torch

from cake_moe.reference import moe as ref

from .conftest import RANDOM_SEEDS, host_never_waits, poison_
from .mxfp4_moe_cases import (CONTRACT, GENERAL, LOOKAHEAD_CASES, REGIMES, SPLIT_FLAGS_AT, Case, Geometry, Layer,
                              bad_slots, check_output, local_routes, lookahead_case, make_case, reference,
                              regime_applies, route_ids, routing_tables, wide_scale_weights, without_slots)

pytestmark = pytest.mark.gpu

CONTRACT_TOKENS = [1, 2, 16, 17, 128, 129, 1024, 1025, 4096, 16384]
TILE_FORMS = ("n8", "n8_narrow", "n8_narrow4", "n32", "n64", "wg128", "wg128x4", "wg64x4", "wg32x4", "wg160x3", "wg96x4")
FORMS = ("fp32", "bf16", "packed")
_FORM_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "packed": None}


def _check_regime(layer: Layer, regime: str, t: int, *, seed: int, form: str = "fp32") -> None:
    """all-remote -> bitwise +0; out-of-range ids -> bitwise the output of the same routes
    with those slots made inert; everything else -> the reference."""
    geom = layer.geom
    case = make_case(geom, t, regime, seed=seed, weights_dtype=_FORM_DTYPE[form], extreme_ids=form != "packed")
    got = layer.run(case)
    if regime == "remote":
        assert not got.view(torch.int16).any(), "routes to remote experts must give exact zeros"
        return
    check_output(case, got, reference(case, layer.bank))
    if regime == "oob":
        ids, w = (ref.unpack_routes(case.topk_ids) if form == "packed" else (case.topk_ids, case.topk_weights))
        drop = bad_slots(geom, ids)
        assert drop.any()
        ids, w = without_slots(geom, ids, w, drop)
        clean = (dataclasses.replace(case, topk_ids=ref.pack_routes(ids, w)) if form == "packed"
                 else dataclasses.replace(case, topk_ids=ids.contiguous(), topk_weights=w.contiguous()))
        assert torch.equal(layer.run(clean), got), "an out-of-range id changed the output"


# --- accuracy --------------------------------------------------------------------------------

@pytest.mark.parametrize("t", CONTRACT_TOKENS)
@pytest.mark.parametrize("layout", sorted(CONTRACT))
def test_contract_geometry(layers, layout, t):
    layer = layers(layout)
    case = make_case(layer.geom, t, seed=t)
    check_output(case, layer.run(case), reference(case, layer.bank))


_CONTRACT_REGIMES = [(layout, regime, t) for layout in sorted(CONTRACT) for regime in REGIMES if regime != "balanced"
                     if regime_applies(CONTRACT[layout], regime) for t in (16, 1025)]
_CONTRACT_REGIMES += [(layout, regime, 16384) for layout in sorted(CONTRACT) for regime in ("hot", "zipf")]


@pytest.mark.parametrize("layout,regime,t", _CONTRACT_REGIMES)
def test_contract_routing_regimes(layers, layout, regime, t):
    _check_regime(layers(layout), regime, t, seed=100 + t)


@pytest.mark.parametrize("t", [1, 17, 129, 1025])
@pytest.mark.parametrize("name", sorted(GENERAL))
def test_general_shapes(layers, name, t):
    layer = layers(name)
    case = make_case(layer.geom, t, seed=t + 7)
    check_output(case, layer.run(case), reference(case, layer.bank))


@pytest.mark.parametrize("name,t", [("h256_e8_k2", 1), ("h256_e8_k2", 17), ("h384_ep_k8", 129),
                                    ("h128_e1024_k32", 17), ("h256_tp_k4", 300), ("tp8", 129)])
@pytest.mark.parametrize("tile", TILE_FORMS)
def test_every_tile_form(layers, name, t, tile):
    """Every tile form on shapes and token counts the decision table would not give it: tiles
    with one row, a second warpgroup with no rows, half m-blocks (H = 128, 384), one K stage."""
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 13)
    got = layer.run(case, tile=tile)
    check_output(case, got, reference(case, layer.bank))
    assert torch.equal(layer.run(case, tile=tile), got), f"tile {tile}: a second plan changed the bits"


_SM90_TILES = ("wg128", "wg128x4", "wg64x4", "wg32x4", "wg160x3", "wg96x4")


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
    outs = {tile: layer.run(case, tile=tile) for tile in _SM90_TILES}
    check_output(case, outs["wg128x4"], reference(case, layer.bank))
    for tile, got in outs.items():
        assert torch.equal(got, outs["wg128x4"]), f"{tile}: other bits than wg128x4"


@pytest.fixture(scope="module")
def wide_scale_layer():
    """H = 1024 (GEMM1 spans two decode stages and eight wgmma stages) and scale codes on both
    sides of 128 (wide_scale_weights)."""
    geom = Geometry(1024, 256, 8, 2)
    layer = Layer(geom, bank=wide_scale_weights(geom, seed=91))
    for key in ("w1_scale", "w2_scale"):
        sf = layer.bank[key]
        assert (sf[1::4] > 128).float().mean() > 0.3 and (sf[3::4] > 128).any() and not (sf[0::2] > 128).any()
    return layer


@pytest.mark.parametrize("t", [1, 17, 129])
@pytest.mark.parametrize("tile", TILE_FORMS)
def test_scale_codes_above_128_every_tile_form(wide_scale_layer, t, tile):
    """UE8M0 codes above 128 (|w| > 12: 2^(code - 1) is not a BF16 value, so the conversion
    multiplies twice) next to ordinary ones, in every tile form."""
    layer = wide_scale_layer
    case = make_case(layer.geom, t, seed=t + 29)
    got = layer.run(case, tile=tile)
    check_output(case, got, reference(case, layer.bank))


SM90_TILE_FORMS = ("wg128", "wg128x4", "wg64x4", "wg32x4", "wg160x3", "wg96x4")


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
    check_output(case, got, reference(case, layer.bank))
    assert torch.equal(layer.run(case, tile=tile, positional=True), got), "the one-multiply path changed a bit"


@pytest.mark.parametrize("tile", SM90_TILE_FORMS)
@pytest.mark.parametrize("name,t", [("wide", 17), ("ring_h512_i512_e8_k2", 129), ("ep8", 1025), ("tp8", 129),
                                    ("ring_h256_i1024_e4_k2", 129)])
def test_code_ring_changes_no_bit(layers, wide_scale_layer, monkeypatch, name, t, tile):
    """The sm_90a code ring (GemmParams::code_ring, sm90_code_ring.cuh): GEMM1 with H a multiple
    of 512 and the `wg160x3` GEMM2 with I one take their scale codes four stages per copy into a
    ring of their own; CAKE_MOE_CODE_RING=0 copies each stage's words with its weights instead:
    the same bits either way, repeatably (a form without the ring copies the words both times)."""
    layer = wide_scale_layer if name == "wide" else layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 47)
    outs = {}
    for env in ("0", ""):
        monkeypatch.setenv("CAKE_MOE_CODE_RING", env)
        outs[env] = layer.run(case, tile=tile)
        assert torch.equal(layer.run(case, tile=tile), outs[env]), f"CAKE_MOE_CODE_RING={env!r}: a rerun changed a bit"
    check_output(case, outs[""], reference(case, layer.bank))
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
    check_output(case, synced[0], reference(case, layer.bank))
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
    check_output(case, outs["0"], reference(case, layer.bank))
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
    check_output(case, outs["0"], reference(case, layer.bank))
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
    check_output(case, outs[""], reference(case, layer.bank))
    assert torch.equal(outs[str(ctas)], outs[""]), f"a grid of {ctas} GEMM1 CTAs changed the bits"
    assert torch.equal(outs["0"], outs[""]), "one CTA per piece changed the bits"
    monkeypatch.setenv("CAKE_MOE_SPLIT_ALL_MAX", "0")
    whole = layer.run(case, tile=tile, tile_sync=True)
    check_output(case, whole, reference(case, layer.bank))


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
        check_output(case, got, reference(case, layer.bank))


def _run_python(code: str, **env: str) -> str:
    """Runs `code` in a fresh interpreter (tests/ as its argv[1]) with `env` added; returns its stdout."""
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))],
                         capture_output=True, text=True, env=dict(os.environ, **env))
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_gemm1_lookahead_reload_changes_no_bit(layers):
    """With CAKE_MOE_LOOKAHEAD_SKEW=1 every early weight request names a wrong expert (or a tile
    the list does not have): the kernel's reload and drain paths must give the same bits."""
    cases = [c for c in LOOKAHEAD_CASES if c[0] not in CONTRACT]   # small banks: the subprocess builds its own
    code = (
        "import sys, hashlib, torch; sys.path.insert(0, sys.argv[1]);"
        "from mxfp4_moe_cases import named_layer, lookahead_case, LOOKAHEAD_CASES, CONTRACT;"
        "[print(hashlib.sha256(lookahead_case(named_layer(n), *c)[1].view(torch.uint8).cpu().numpy()"
        ".tobytes()).hexdigest()) for n, *c in LOOKAHEAD_CASES if n not in CONTRACT]")
    printed = _run_python(code, CAKE_MOE_LOOKAHEAD_SKEW="1")
    want = [_digest(lookahead_case(layers(n), *c)[1]) for n, *c in cases]
    assert printed.split() == want, "the lookahead's reload path changed the bits"


_GENERAL_REGIMES = [(name, regime, FORMS[i % len(FORMS)]) for name in sorted(GENERAL)
                    for i, regime in enumerate(REGIMES) if regime_applies(GENERAL[name], regime)]


@pytest.mark.parametrize("name,regime,form", _GENERAL_REGIMES)
def test_general_routing_regimes(layers, name, regime, form):
    _check_regime(layers(name), regime, 129, seed=3, form=form)


@pytest.mark.parametrize("name", ["ep8", "tp8", "h512_e40_k5"])
def test_route_weight_dtypes_and_packed_form(layers, name):
    """FP32 and BF16 route weights against the reference; the packed form carries the BF16
    weights, so it must give the BF16 run's bits."""
    layer = layers(name)
    outs = {}
    for form in FORMS:
        case = make_case(layer.geom, 129, seed=5, weights_dtype=_FORM_DTYPE[form])
        outs[form] = layer.run(case)
        check_output(case, outs[form], reference(case, layer.bank))
    assert torch.equal(outs["packed"], outs["bf16"])


# --- determinism, streams, graphs ------------------------------------------------------------

def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("name,t", [("h512_e40_k5", 17), ("h512_e40_k5", 1025), ("ep8", 16), ("tp8", 1025)])
def test_bitwise_repeatable_runs_and_streams(layers, name, t):
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=11)
    plan, out = layer.plan(case)
    poison_(out)
    plan.run()
    torch.cuda.synchronize()
    y0 = out.clone()
    check_output(case, y0, reference(case, layer.bank))
    for _ in range(3):
        poison_(out)
        plan.run()
        torch.cuda.synchronize()
        assert torch.equal(out, y0), "a repeated run changed the bits"
    poison_(out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(out, y0), "a run on a side stream changed the bits"
    assert torch.equal(layer.run(case), y0), "a second plan on other buffers changed the bits"


def test_bitwise_repeatable_across_processes(layers):
    layer = layers("h512_e40_k5")
    code = (
        "import sys, hashlib, torch; sys.path.insert(0, sys.argv[1]);"
        "from mxfp4_moe_cases import make_case, named_layer;"
        "layer = named_layer('h512_e40_k5');"
        "y = layer.run(make_case(layer.geom, 1025, 'zipf', seed=11));"
        "print(hashlib.sha256(y.view(torch.uint8).cpu().numpy().tobytes()).hexdigest())")
    printed = _run_python(code)
    want = _digest(layer.run(make_case(layer.geom, 1025, "zipf", seed=11)))
    assert printed.strip().splitlines()[-1] == want, "another process computed other bits"


@pytest.mark.parametrize("name,t", [("h512_e40_k5", 17), ("h384_ep_k8", 1025), ("tp8", 16),
                                    ("h128_e1024_k32", 1025)])   # the last: routing over several CTAs
def test_graph_replay_follows_new_values(layers, name, t):
    """Serving captures run() once and replays it every step after writing the step's
    activations and routes into the bound tensors: the replay must equal an eager run on the
    new values, bit for bit."""
    layer = layers(name)
    case = make_case(layer.geom, t, seed=21)
    plan, out = layer.plan(case)
    plan.run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run()
    new = dataclasses.replace(make_case(layer.geom, t, "zipf", seed=22), beta=case.beta,
                              linear_beta=case.linear_beta)
    for dst, src in ((case.x, new.x), (case.x_sf, new.x_sf), (case.topk_ids, new.topk_ids),
                     (case.topk_weights, new.topk_weights)):
        dst.copy_(src)
    poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, layer.run(new)), "graph replay differs from an eager run on the same values"
    check_output(new, out, reference(new, layer.bank))


# (layer, T): one pair of forms; two pairs and the several-CTA routing (16384 routes)
_FIRST_CAPTURE_CASES = [("h512_e40_k5", 17), ("h384_ep_k8", 2048)]


def test_plan_runs_nothing_and_a_capture_may_come_first(layers):
    """plan() binds and loads every kernel into the context but enqueues nothing (its output
    stays poisoned), so a fresh process may capture the plan's very first run() under lazy
    module loading, and the replay gives an eager run's bits."""
    code = (
        "import sys, hashlib, torch; sys.path.insert(0, sys.argv[1]);"
        "from mxfp4_moe_cases import make_case, named_layer;"
        "from conftest import poison_\n"
        f"for name, t in {_FIRST_CAPTURE_CASES!r}:\n"
        "    layer = named_layer(name); case = make_case(layer.geom, t, 'zipf', seed=31)\n"
        "    out = poison_(torch.empty(case.x.shape, dtype=torch.bfloat16, device='cuda'))\n"
        "    plan, _ = layer.plan(case, output=out); torch.cuda.synchronize()\n"
        "    untouched = bool(out.isnan().all())\n"
        "    g = torch.cuda.CUDAGraph()\n"
        "    with torch.cuda.graph(g):\n"
        "        plan.run()\n"
        "    g.replay(); torch.cuda.synchronize()\n"
        "    print(name, t, untouched, len(plan.decision.forms),"
        " hashlib.sha256(out.view(torch.uint8).cpu().numpy().tobytes()).hexdigest())")
    printed = _run_python(code, CUDA_MODULE_LOADING="LAZY")
    rows = [line.split() for line in printed.strip().splitlines()[-len(_FIRST_CAPTURE_CASES):]]
    assert [(r[0], int(r[1])) for r in rows] == _FIRST_CAPTURE_CASES
    assert [r[2] for r in rows] == ["True"] * len(rows), "plan() wrote the output (it ran the layer)"
    assert rows[-1][3] == "7", "the last case must bind two pairs of forms"
    for (name, t), row in zip(_FIRST_CAPTURE_CASES, rows):
        layer = layers(name)
        want = _digest(layer.run(make_case(layer.geom, t, "zipf", seed=31)))
        assert row[4] == want, f"{name} T={t}: a first run captured in a graph gave other bits"


@pytest.mark.parametrize("backend,mode", [("aot_eager", None), ("inductor", "reduce-overhead")])
def test_compiled_run_gives_the_eager_bits(layers, backend, mode):
    """plan.run() inside torch.compile(fullgraph=True) is the op cake_moe::mxfp4_moe_run: the
    eager bits, new routes written into the bound tensors picked up, also under the compiler's
    CUDA graphs; opcheck passes on the GPU plan."""
    layer = layers("h512_e40_k5")
    case = make_case(layer.geom, 17, seed=71)
    plan, out = layer.plan(case)
    eager = plan.run().clone()
    torch.library.opcheck(torch.ops.cake_moe.mxfp4_moe_run.default,
                          (plan._number, case.x.view(torch.uint8), case.x_sf, case.topk_ids, case.topk_weights, out))

    def step(p):
        return p.run().float() * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend, mode=mode)
    for _ in range(3):   # reduce-overhead records its graph on a later call
        poison_(out)
        assert torch.equal(compiled(plan), eager.float() * 2)
    new = make_case(layer.geom, 17, "zipf", seed=72)
    case.topk_ids.copy_(new.topk_ids)
    case.topk_weights.copy_(new.topk_weights)
    got = compiled(plan)
    assert torch.equal(got, plan.run().float() * 2)
    assert not torch.equal(got, eager.float() * 2), "the new routes were not used"


def test_one_workspace_serves_every_smaller_t(layers):
    """get_workspace_size(max_tokens=M) covers every T <= M (and the bits do not depend on
    which workspace a plan got)."""
    layer = layers("h512_e40_k5")
    ws = torch.empty(layer.runner.get_workspace_size(max_tokens=1025), dtype=torch.uint8, device="cuda")
    for t in (1, 17, 1025):
        case = make_case(layer.geom, t, seed=61 + t)
        assert torch.equal(layer.run(case, workspace=ws), layer.run(case))


def test_route_rows_past_two_to_the_31_elements(layers):
    """tp8 at T = 32768: the route rows ([T * top_k, H] BF16, GEMM2's output and the finalize's
    input) hold 3.76e9 elements, past 2^31, so every offset into them needs 64 bits. The tokens
    are a T = 16384 case's twice over; a token's output depends on its own inputs only and every
    wgmma form gives the same bits, so both halves must equal that case's output bit for bit."""
    layer = layers("tp8")
    case = make_case(layer.geom, 16384, "zipf", seed=41)
    twice = dataclasses.replace(case, **{f: torch.cat([getattr(case, f)] * 2).contiguous()
                                         for f in ("x", "x_sf", "topk_ids", "topk_weights")})
    t2 = twice.x.shape[0]
    assert t2 * layer.geom.top_k * layer.geom.hidden > 2**31
    want = layer.run(case).clone()
    assert want.isfinite().all() and want.view(torch.int16).any()
    got = layer.run(twice)
    assert torch.equal(got[:t2 // 2], want), "the first half differs from the T = 16384 run"
    assert torch.equal(got[t2 // 2:], want), "the second half differs from the T = 16384 run"


@pytest.mark.parametrize("name,t", [("h512_e40_k5", 1025), ("tp8", 16), ("h128_e1024_k32", 1025)])
def test_run_allocates_nothing(layers, name, t):
    layer = layers(name)
    plan, _ = layer.plan(make_case(layer.geom, t, seed=31))
    plan.run()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(3):
        plan.run()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "run() allocated"


@pytest.mark.parametrize("name,t", [("tp8", 1), ("h512_e40_k5", 1025)])
def test_plan_and_run_never_make_the_host_wait(layers, name, t):
    """Neither plan() nor run() synchronises with the host once warm: the routes are counted
    and sorted on the device."""
    layer = layers(name)
    case = make_case(layer.geom, t, seed=37)
    ws = layer.workspace(t)
    layer.plan(case, workspace=ws)[0].run()
    with host_never_waits():
        plan, _ = layer.plan(case, workspace=ws)
        plan.run()
        plan.run()


@pytest.mark.parametrize("name,t", [("tp8", 1), ("h512_e40_k5", 1025)])
def test_a_kept_plan_gives_a_new_plans_bits(layers, monkeypatch, name, t):
    """plan() with the same tensors again returns a plan around the one bound before, whose runs
    give the bits of a plan checked and bound anew (CAKE_MOE_ONE_SHOT_CACHE=0) for those tensors;
    and kept plans of two token counts that share one workspace, run in turn, each keep theirs."""
    layer = layers(name)
    monkeypatch.delenv("CAKE_MOE_ONE_SHOT_CACHE", raising=False)
    a = _plan_args(layer, t)
    first = _call_plan(layer, a)
    kept = _call_plan(layer, a)
    assert kept._plan is first._plan
    kept.run()
    torch.cuda.synchronize()
    want = a["output"].clone()
    assert want.isfinite().all() and want.view(torch.int16).any()
    monkeypatch.setenv("CAKE_MOE_ONE_SHOT_CACHE", "0")
    fresh = _call_plan(layer, a)
    monkeypatch.delenv("CAKE_MOE_ONE_SHOT_CACHE")
    assert fresh._plan is not first._plan
    poison_(a["output"])
    fresh.run()
    torch.cuda.synchronize()
    assert torch.equal(a["output"], want), "a kept plan's bits differ from a new plan's"
    small = _plan_args(layer, 17)
    ws = torch.empty(layer.runner.get_workspace_size(max_tokens=t + 17), dtype=torch.uint8, device="cuda")
    plans = []
    for args in (a, small, a, small):
        args["workspace"] = ws
        plans.append(_call_plan(layer, args))
    assert plans[2]._plan is plans[0]._plan and plans[3]._plan is plans[1]._plan
    outs = []
    for plan in plans:
        poison_(plan.output)
        plan.run()
        torch.cuda.synchronize()
        outs.append(plan.output.clone())
    assert torch.equal(outs[0], want) and torch.equal(outs[2], want)
    assert torch.equal(outs[1], outs[3]) and torch.equal(outs[1], layer.run(make_case(layer.geom, 17, seed=41)))


# --- refusals --------------------------------------------------------------------------------

def _plan_args(layer: Layer, t: int) -> dict:
    case = make_case(layer.geom, t, seed=41)
    p = layer.prepared
    return dict(x=case.x, x_sf=case.x_sf, topk_ids=case.topk_ids, topk_weights=case.topk_weights, w1=p["w1"],
                w1_sf=p["w1_sf"], w2=p["w2"], w2_sf=p["w2_sf"], beta=case.beta, linear_beta=case.linear_beta,
                workspace=layer.workspace(t), output=poison_(torch.empty(t, layer.geom.hidden, dtype=torch.bfloat16,
                                                                         device="cuda")))


def _call_plan(layer: Layer, a: dict, runner=None):
    return (runner or layer.runner).plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], a["w1"], a["w1_sf"], a["w2"],
                             a["w2_sf"], beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"],
                             output=a["output"])


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
def test_plan_refused_during_capture(layers):
    layer = layers("h256_e8_k2")
    a = _plan_args(layer, 17)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"plan\(\) cannot run during CUDA graph capture"):
        with torch.cuda.graph(graph):
            _call_plan(layer, a)
    torch.cuda.synchronize()
    assert a["output"].isnan().all(), "a refused plan() wrote the output"


def test_plan_refuses_another_sm_count(layers):
    from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper
    layer = layers("h256_e8_k2")
    args, kw = layer.geom.wrapper_args()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    other = CakeMxfp4MoEWrapper(*args, sm_count=sms + 4, **kw)
    a = _plan_args(layer, 17)
    with pytest.raises(RuntimeError, match="SM"):
        _call_plan(layer, a, runner=other)
    assert a["output"].isnan().all(), "a refused plan() wrote the output"


def test_debug_mode_refuses_out_of_range_ids(layers, monkeypatch):
    """CAKE_MOE_CHECK=1 validates ids and raises (SPEC §5); valid routes still run."""
    layer = layers("h256_e8_k2")
    monkeypatch.setenv("CAKE_MOE_CHECK", "1")
    with pytest.raises(ValueError, match="(?i)outside"):
        layer.run(make_case(layer.geom, 17, "oob", seed=51))
    case = make_case(layer.geom, 17, seed=52)
    check_output(case, layer.run(case), reference(case, layer.bank))


def _output_in_workspace(a: dict) -> None:
    t, h = a["output"].shape
    a["output"] = a["workspace"][256:256 + 2 * t * h].view(torch.bfloat16).view(t, h)


def _x_in_output(a: dict) -> None:
    t, h = a["x"].shape
    a["x"] = a["output"].view(-1).view(torch.uint8)[:t * h].view(t, h).view(torch.float8_e4m3fn)


def _small_workspace(a: dict) -> None:
    a["workspace"] = a["workspace"][:a["workspace"].numel() // 2]


def _cpu_workspace(a: dict) -> None:
    """A host workspace at a 256-byte aligned address, so that the device check (not the
    alignment check) is the one that refuses it."""
    n = a["workspace"].numel()
    raw = torch.empty(n + 256, dtype=torch.uint8)
    start = -raw.data_ptr() % 256
    a["workspace"] = raw[start:start + n]


_BAD = {   # name: (how the arguments go wrong, what the ValueError says)
    "topk_ids on cpu": (lambda a: a.update(topk_ids=a["topk_ids"].cpu()), "topk_ids is on cpu"),
    "x_sf on cpu": (lambda a: a.update(x_sf=a["x_sf"].cpu()), "x_sf is on cpu"),
    "w2 on cpu": (lambda a: a.update(w2=a["w2"].cpu()), "w2 is on cpu"),
    "beta on cpu": (lambda a: a.update(beta=a["beta"].cpu()), "beta is on cpu"),
    "workspace on cpu": (_cpu_workspace, "workspace is on cpu"),
    "output on cpu": (lambda a: a.update(output=a["output"].cpu()), "output is on cpu"),
    "output inside workspace": (_output_in_workspace, "output and workspace overlap"),
    "x inside output": (_x_in_output, "output and x overlap"),
    "workspace too small": (_small_workspace, "workspace must hold at least"),
}


@pytest.mark.parametrize("name,tiles,match", [
    ("h256_e8_k2", ("wg128x4_rb", "wg128x4_rb"), "is a GEMM2 form"),
    ("h256_e8_k2", ("n8_shortk2", "n8_shortk2"), "is a GEMM2 form"),
    ("ep8", ("wg32x4", "wg32x4_rb"), "shard <= 512"),   # I = 3072: more K than the resident slots
])
def test_native_plan_refuses_resident_row_forms_outside_their_domain(layers, monkeypatch, name, tiles, match):
    """The host's own check, behind the decision table (which never hands it these pairs): the
    resident-rows forms and `n8_shortk2` are GEMM2 forms, a resident-rows one for a shard of at
    most 512. Refused before any launch."""
    from cake_moe.mxfp4_moe import _decide
    layer = layers(name)
    a = _plan_args(layer, 17)
    monkeypatch.setattr(_decide, "gemm_tiles", lambda tile, hidden, inter: tiles)
    with pytest.raises(ValueError, match=match):
        _call_plan(layer, a)
    torch.cuda.synchronize()
    assert a["output"].isnan().all(), "a refused plan() wrote the output"


@pytest.mark.parametrize("what", sorted(_BAD))
def test_plan_value_errors(layers, what):
    """Refused before any launch, and nothing written."""
    layer = layers("h256_e8_k2")
    a = _plan_args(layer, 17)
    spoil, match = _BAD[what]
    spoil(a)
    a["output"].fill_(float("nan"))
    with pytest.raises(ValueError, match=match):
        _call_plan(layer, a)
    torch.cuda.synchronize()
    assert a["output"].isnan().all(), "a refused plan() wrote the output"


# --- randomized sweep ------------------------------------------------------------------------

def _random_problem(seed: int) -> tuple[Geometry, int, str, str, str | None, bool | None, bool]:
    """One seeded draw over the whole contract (SPEC §7): H and I shard multiples of 128, E up to
    1024, top_k up to 32, plain / expert-parallel / tensor-parallel ranks, T up to 8192, every
    routing regime and route form, every tile form (or the table's), the tile sync forced either
    way where a form allows it, and the two-multiply scale path on some draws. Returns
    (geometry, T, regime, route form, tile, tile_sync, wide scale codes)."""
    r = random.Random(seed)
    h, i = 128 * r.randint(1, 12), 128 * r.randint(1, 10)
    if r.random() < 0.15:
        h = 2048 + 128 * r.randint(0, 4)  # two K stages of the narrow GEMM1: K halves possible
    e_max = max(1, min(1024, (1 << 28) // (h * i)))  # a bank of at most ~256 MB of codes
    e = min(e_max, int(round(2 ** r.uniform(0, 10))))
    k = r.randint(1, min(32, e))
    layout = r.choice(["plain", "ep", "tp"])
    if layout == "ep" and e > 1:
        local = r.randint(1, e)
        geom = Geometry(h, i, e, k, num_local=local, offset=r.randint(0, e - local))
    elif layout == "tp" and i % 256 == 0:
        geom = Geometry(h, i, e, k, shard=i // r.choice([d for d in (2, 4, 8) if i % (128 * d) == 0]))
    else:
        geom = Geometry(h, i, e, k)
    t = r.choice([1, 2, 3, 4, 5, 8, 16, 17]) if r.random() < 0.5 else int(2 ** r.uniform(0, 11))
    if r.random() < 0.05:
        t = r.randint(2049, 8192)  # many token tiles per expert: the persistent forms' schedules
    regimes = [g for g in REGIMES if regime_applies(geom, g)
               and not (g == "remote" and geom.num_experts - geom.local < geom.top_k)]
    tile = r.choice((None,) * 4 + TILE_FORMS)
    sync_ok = tile is not None and not tile.startswith("wg")  # the table's form may be a wgmma one
    tile_sync = r.choice([None, False] + ([True] if sync_ok else []))
    regime = r.choice(regimes)
    if seed % 4 == 3 and "remote" in regimes:
        regime = "remote"   # drawn rarely otherwise (1 in 6 of the EP ranks with a remote expert)
    return geom, t, regime, r.choice(FORMS), tile, tile_sync, r.random() < 0.25


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_layers(seed):
    """Seeded random layers over the contract's whole domain against the FP64 reference (the
    `_check` budget, exact zeros for tokens without a local route, every element written; with
    no local route at all, the whole output +0), run twice for the same bits. The draw is in
    the failure message, so a failing seed reproduces."""
    geom, t, regime, form, tile, tile_sync, wide = _random_problem(seed)
    desc = f"{geom} T={t} regime={regime} form={form} tile={tile} tile_sync={tile_sync} wide_codes={wide}"
    bank = wide_scale_weights(geom, seed=seed) if wide else None
    layer = Layer(geom, seed=seed, bank=bank)
    case = make_case(geom, t, regime, seed=seed + 1000, weights_dtype=_FORM_DTYPE[form],
                     extreme_ids=regime == "oob" and form != "packed")
    try:
        got = layer.run(case, tile=tile, tile_sync=tile_sync)
        if (local_routes(geom, route_ids(case)) < 0).all():  # no local route at all: nothing to perturb
            assert not got.view(torch.int16).any(), "a token without a local route is not exactly zero"
        else:
            check_output(case, got, reference(case, layer.bank))
        assert torch.equal(layer.run(case, tile=tile, tile_sync=tile_sync), got), "a second run changed the bits"
    except AssertionError as err:
        raise AssertionError(f"{desc}: {err}") from None
    finally:
        del layer
        torch.cuda.empty_cache()
