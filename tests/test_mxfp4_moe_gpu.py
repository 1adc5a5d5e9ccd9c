"""GPU tests of family B (MXFP4 x MXFP8 SiTU routed MoE) against the FP64 reference
(SPEC §5, §7, §11): the contract geometry (ep8, tp8) over T = 1 .. 16384, general shapes,
routing regimes, route forms, every tile form, and the randomized sweep. The schedule options
that must change no bit are in test_mxfp4_moe_mainloop_gpu.py, repeatability, graphs and the
plan's costs in test_mxfp4_moe_launches_gpu.py, refusals in test_mxfp4_moe_refusals_gpu.py; the
routing kernel's tables and the token-tile choices in test_moe_route_gpu.py.

The public API is imported inside the helpers (tests/mxfp4_moe_cases.Layer), never at
collection, so the CPU suite collects these files on a build without the extension.
"""
from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch

from cake_moe.reference import moe as ref

from .conftest import RANDOM_SEEDS
from .mxfp4_moe_cases import (CONTRACT, GENERAL, REGIMES, SOLO_TOKENS, Geometry, Layer, bad_slots, local_routes,
                              make_case, reference, regime_applies, route_ids, wide_scale_weights, without_slots)
from .mxfp4_moe_checks import check_output, check_reference

pytestmark = pytest.mark.gpu


CONTRACT_TOKENS = [1, 2, 16, 17, 128, 129, 1024, 1025, 4096, 16384]


TILE_FORMS = ("n8", "n8_narrow", "n8_narrow4", "n32", "n64", "wg128", "wg128x4", "wg64x4", "wg32x4", "wg160x3", "wg96x4")


FORMS = ("fp32", "bf16", "packed")


_FORM_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "packed": None}


def _check_regime(layer: Layer, regime: str, t: int, *, seed: int, form: str = "fp32") -> None:
    """all-remote -> bitwise +0; out-of-range ids -> bitwise the output of the same routes
    with those slots made inert; everything else -> the reference (for "solo" from
    SOLO_TOKENS, expert by expert too)."""
    geom = layer.geom
    case = make_case(geom, t, regime, seed=seed, weights_dtype=_FORM_DTYPE[form], extreme_ids=form != "packed")
    got = layer.run(case)
    if regime == "remote":
        assert not got.view(torch.int16).any(), "routes to remote experts must give exact zeros"
        return
    groups = check_reference(case, got, layer.bank)
    assert groups > 0 or regime != "solo" or t < SOLO_TOKENS, "no expert was held to the per-expert budget"
    if regime == "oob":
        ids, w = (ref.unpack_routes(case.topk_ids) if form == "packed" else (case.topk_ids, case.topk_weights))
        drop = bad_slots(geom, ids)
        assert drop.any()
        ids, w = without_slots(geom, ids, w, drop)
        clean = (dataclasses.replace(case, topk_ids=ref.pack_routes(ids, w)) if form == "packed"
                 else dataclasses.replace(case, topk_ids=ids.contiguous(), topk_weights=w.contiguous()))
        assert torch.equal(layer.run(clean), got), "an out-of-range id changed the output"


@pytest.mark.parametrize("t", CONTRACT_TOKENS)
@pytest.mark.parametrize("layout", sorted(CONTRACT))
def test_contract_geometry(layers, layout, t):
    layer = layers(layout)
    case = make_case(layer.geom, t, seed=t)
    check_reference(case, layer.run(case), layer.bank)


@pytest.mark.parametrize("layout,t", [("ep8", 320), ("tp8", 512)])
def test_decode_limit_follows_the_memory_bandwidth(layers, layout, t):
    """At 5.71 (ep8 T = 320) and 9.14 (tp8 T = 512) routes per expert, between the narrow-memory
    decode limits and the H200's, the layer runs wg32x4 where DRAM bandwidth per SM is narrow (an
    H100, where it was 3.6-5.7% faster there) and n8 otherwise; either way within the budgets.
    A wrapper made with ``narrow_memory=`` the other way takes the other part's form."""
    from cake_moe import _runtime
    from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper
    layer = layers(layout)
    narrow = _runtime.ext().device_narrow_memory(layer.runner.device.index)
    assert layer.runner.narrow_memory == narrow
    case = make_case(layer.geom, t, seed=t)
    want = reference(case, layer.bank)
    args, kw = layer.geom.wrapper_args()
    other = copy.copy(layer)
    other.runner = CakeMxfp4MoEWrapper(*args, device=layer.device, narrow_memory=not narrow, **kw)
    for runs_narrow, on in ((narrow, layer), (not narrow, other)):
        d = on.runner.decide(t)
        assert (d.path, d.tile) == (("mid", "wg32x4") if runs_narrow else ("decode", "n8")), (d, runs_narrow)
        check_output(case, on.run(case), want, bank=layer.bank)


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
    check_reference(case, layer.run(case), layer.bank)


@pytest.mark.parametrize("name,t", [("i640_h256_e8_k2", 1), ("i640_h256_e8_k2", 17), ("ring_h256_i1024_e4_k2", 1),
                                    ("ring_h256_i1024_e4_k2", 12), ("tp8", 1), ("h384_ep_k8", 129)])
def test_bound_gemm_forms_are_the_decisions(layers, name, t):
    """The extension binds the GEMM forms decide() names (the wrapper reads them from
    decision.forms, `_decide.bound_gemm_tiles`): a GEMM2 of K 640 / 1024 on the narrow GEMM1's
    tiling at 2, 24 and 34 routes (decode on every sm_90 part: at most 6 routes per expert)."""
    layer = layers(name)
    plan, _ = layer.plan(make_case(layer.geom, t, seed=t + 3))

    def gemms(forms):
        return [f for f in forms if f.startswith("mxfp4_moe_gemm")]
    assert gemms(plan.forms.split(", ")) == gemms(plan.decision.forms), (plan.forms, plan.decision)
    if layer.geom.i_shard in (640, 1024):
        assert gemms(plan.decision.forms)[1] in ("mxfp4_moe_gemm2_n8_narrow", "mxfp4_moe_gemm2_n8_narrow4")


@pytest.mark.parametrize("name,t", [("h256_e8_k2", 1), ("h256_e8_k2", 17), ("h384_ep_k8", 129),
                                    ("h128_e1024_k32", 17), ("h256_tp_k4", 300), ("tp8", 129)])
@pytest.mark.parametrize("tile", TILE_FORMS)
def test_every_tile_form(layers, name, t, tile):
    """Every tile form on shapes and token counts the decision table would not give it: tiles
    with one row, a second warpgroup with no rows, half m-blocks (H = 128, 384), one K stage."""
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=t + 13)
    got = layer.run(case, tile=tile)
    check_reference(case, got, layer.bank)
    assert torch.equal(layer.run(case, tile=tile), got), f"tile {tile}: a second plan changed the bits"


@pytest.mark.parametrize("t", [1, 17, 129])
@pytest.mark.parametrize("tile", TILE_FORMS)
def test_scale_codes_above_128_every_tile_form(wide_scale_layer, t, tile):
    """UE8M0 codes above 128 (|w| > 12: 2^(code - 1) is not a BF16 value, so the conversion
    multiplies twice) next to ordinary ones, in every tile form."""
    layer = wide_scale_layer
    case = make_case(layer.geom, t, seed=t + 29)
    got = layer.run(case, tile=tile)
    check_reference(case, got, layer.bank)


_GENERAL_REGIMES = [(name, regime, FORMS[i % len(FORMS)]) for name in sorted(GENERAL)
                    for i, regime in enumerate(REGIMES) if regime_applies(GENERAL[name], regime)]


@pytest.mark.parametrize("name,regime,form", _GENERAL_REGIMES)
def test_general_routing_regimes(layers, name, regime, form):
    _check_regime(layers(name), regime, SOLO_TOKENS if regime == "solo" else 129, seed=3, form=form)


@pytest.mark.parametrize("name", ["ep8", "tp8", "h512_e40_k5"])
def test_route_weight_dtypes_and_packed_form(layers, name):
    """FP32 and BF16 route weights against the reference; the packed form carries the BF16
    weights, so it must give the BF16 run's bits."""
    layer = layers(name)
    outs = {}
    for form in FORMS:
        case = make_case(layer.geom, 129, seed=5, weights_dtype=_FORM_DTYPE[form])
        outs[form] = layer.run(case)
        check_reference(case, outs[form], layer.bank)
    assert torch.equal(outs["packed"], outs["bf16"])


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
            check_reference(case, got, layer.bank)
        assert torch.equal(layer.run(case, tile=tile, tile_sync=tile_sync), got), "a second run changed the bits"
    except AssertionError as err:
        raise AssertionError(f"{desc}: {err}") from None
    finally:
        del layer
        torch.cuda.empty_cache()
