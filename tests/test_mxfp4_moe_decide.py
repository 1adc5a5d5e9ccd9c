"""CPU tests of the MXFP4 MoE decision table (python/cake_moe/mxfp4_moe/_decide.py) and its
tile-cost model (_tile_cost.py): the path and token-tile forms per token count, the rules the
routing kernel applies on the device, and the width per expert."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper, PlanDecision
from cake_moe.mxfp4_moe import _decide, _tile_cost, _wrapper

from .mxfp4_moe_cases import CONTRACT_ARGS as CONTRACT, EP8_ARGS as EP8, TP8_ARGS as TP8

def test_decide_contract_rows():
    w = CakeMxfp4MoEWrapper(**CONTRACT, **EP8, narrow_memory=False)   # an H200's table on any sm_90 part
    assert w.capability == (9, 0)   # host only: an H200 is assumed, like the SM count
    d = w.decide(1)
    assert (d.supported, d.path, d.block_n, d.tile) == (True, "decode", 8, "n8_narrow")
    assert d.forms == ("fmt_mxfp8_dequantize", "moe_route", "mxfp4_moe_gemm1_n8_narrow", "mxfp4_moe_gemm2_n8_narrow",
                       "moe_finalize")
    assert w.decide(3).tile == "n8_narrow4" and w.decide(3).forms[2] == "mxfp4_moe_gemm1_n8_narrow4"
    assert w.decide(5).tile == "n8" and w.decide(5).forms[2] == "mxfp4_moe_gemm1_n8"
    d = w.decide(10240)
    assert (d.supported, d.path, d.block_n, d.tile, d.alt_tile) == (True, "prefill", 128, "wg128x4", "wg160x3")
    assert d.forms[2:6] == ("mxfp4_moe_gemm1_wg128x4", "mxfp4_moe_gemm1_wg160x3", "mxfp4_moe_gemm2_wg128x4",
                            "mxfp4_moe_gemm2_wg160x3")
    d = w.decide(16384)
    assert (d.supported, d.path, d.block_n, d.tile, d.alt_tile) == (True, "prefill", 160, "wg160x3", "wg128x4")
    assert d.forms[2:6] == ("mxfp4_moe_gemm1_wg160x3", "mxfp4_moe_gemm1_wg128x4", "mxfp4_moe_gemm2_wg160x3",
                            "mxfp4_moe_gemm2_wg128x4")
    assert "BN=128 (wg128x4) where the device finds" in d.reason



def test_decide_token_counts():
    """Any integer T >= 1 (numpy's too) is decided; anything else is refused with the reason."""
    np = pytest.importorskip("numpy")
    w = CakeMxfp4MoEWrapper(**CONTRACT, **EP8)
    assert w.decide(np.int64(16384)) == w.decide(16384)
    for bad in (0, -3, 2.0, True, "8", None, torch.tensor(2.5)):
        d = w.decide(bad)
        assert not d.supported and "num_tokens must be an int >= 1" in d.reason and d.forms == ()


_TP8 = (CONTRACT["top_k"], CONTRACT["num_experts"], CONTRACT["hidden_size"], TP8["intermediate_shard"])


def test_decide_resident_rows_for_a_short_gemm2():
    """A four-warpgroup GEMM2 with K = the intermediate shard <= 512 keeps the token rows
    resident (tp8's 384); GEMM1, longer shards and the two-warpgroup wg128 keep their form."""
    w = CakeMxfp4MoEWrapper(**CONTRACT, **TP8)
    assert w.decide(14336).forms[2:6] == ("mxfp4_moe_gemm1_wg128x4", "mxfp4_moe_gemm1_wg160x3",
                                          "mxfp4_moe_gemm2_wg128x4_rb", "mxfp4_moe_gemm2_wg160x3_rb")
    assert w.decide(16384).forms[2:6] == ("mxfp4_moe_gemm1_wg160x3", "mxfp4_moe_gemm1_wg128x4",
                                          "mxfp4_moe_gemm2_wg160x3_rb", "mxfp4_moe_gemm2_wg128x4_rb")
    assert _decide.gemm_tiles("wg160x3", 7168, 3072, routes=4096) == ("wg160x3", "wg160x3")
    assert _decide.gemm_tiles("wg128x4", 7168, 512, routes=4096) == ("wg128x4", "wg128x4_rb")
    assert _decide.gemm_tiles("wg128x4", 512, 640, routes=4096) == ("wg128x4", "wg128x4")
    assert _decide.gemm_tiles("wg64x4", 7168, 384, routes=4096) == ("wg64x4", "wg64x4_rb")
    assert _decide.gemm_tiles("wg32x4", 7168, 384, routes=4096) == ("wg32x4", "wg32x4_rb")
    assert _decide.gemm_tiles("wg128", 7168, 384, routes=4096) == ("wg128", "wg128")


@pytest.mark.parametrize("sm90", [False, True])
@pytest.mark.parametrize("t,path,bn", [(5, "decode", 8), (336, "decode", 8), (337, "mid", 32), (1344, "mid", 32),
                                       (1345, "prefill", 64), (2688, "prefill", 64), (2689, "prefill", 128)])
def test_decide_thresholds(t, path, bn, sm90):
    """E=896, k=16, the full 3072 shard: T*k/E = T/56, so the limits 6, 24 and 48 fall at T = 336,
    1344 and 2688; above 6 an sm_90 device takes the wgmma forms (BN 32 up to 24, BN 64 up to 48,
    then BN 128), other arches stay on n32 / n64."""
    d = _decide.decide(t, *_TP8[:3], 3072, sm90=sm90)
    if bn == 128 and not sm90:
        bn = 64
    tile = f"n{bn}"
    if sm90 and bn >= 32:
        tile = {128: "wg128x4", 64: "wg64x4", 32: "wg32x4"}[bn]
    assert (d.path, d.block_n, d.forms[2]) == (path, bn, f"mxfp4_moe_gemm1_{tile}")


@pytest.mark.parametrize("t,path,tile", [(336, "decode", "n8"), (560, "decode", "n8"), (561, "mid", "wg32x4"),
                                         (1792, "mid", "wg32x4"), (1793, "prefill", "wg64x4"),
                                         (3584, "prefill", "wg64x4"), (3585, "prefill", "wg96x4"),
                                         (4800, "prefill", "wg96x4"), (5376, "prefill", "wg128x4")])
def test_decide_short_shard_thresholds_on_sm90(t, path, tile):
    """A shard <= RESIDENT_K (tp8: 384) moves the sm_90 limits to 10, 32 and 64 routes per expert
    (T = 560, 1792, 3584 at T*k/E = T/56), and past 64 the 96-token tiles serve while an
    expert's routes fit one of them (up to ~85: T = 4800; 96 at T = 5376 takes wg128x4); other
    arches keep 6, 24 (n32 / n64)."""
    d = _decide.decide(t, *_TP8, sm90=True)
    assert (d.path, d.tile, d.block_n) == (path, tile, _tile_cost.BLOCK_N_OF[tile])
    portable = _decide.decide(t, *_TP8)
    assert portable.tile == ("n8" if t <= 336 else "n32" if t <= 1344 else "n64")


@pytest.mark.parametrize("inter,t,wide,narrow", [(3072, 294, "n8", "n8"), (3072, 295, "n8", "wg32x4"),
                                                  (3072, 336, "n8", "wg32x4"), (3072, 337, "wg32x4", "wg32x4"),
                                                  (384, 462, "n8", "n8"), (384, 463, "n8", "wg32x4"),
                                                  (384, 560, "n8", "wg32x4"), (384, 561, "wg32x4", "wg32x4")])
def test_decide_decode_limit_where_memory_is_narrow(inter, t, wide, narrow):
    """Narrow DRAM per SM (an H100) moves the sm_90 decode limit from 6 to 5.25 routes per expert
    (long shards: T = 294 at T*k/E = T/56) and from 10 to 8.25 (short shards: T = 462); the other
    limits, the portable forms and a host-only wrapper (an H200 assumed) keep theirs."""
    args = (*_TP8[:3], inter)
    assert _decide.decide(t, *args, sm90=True).tile == wide
    assert _decide.decide(t, *args, sm90=True, narrow_memory=True).tile == narrow
    assert _decide.decide(t, *args, narrow_memory=True) == _decide.decide(t, *args)
    for later in (1344, 1345, 1792, 1793, 2688, 2689, 3584, 3585, 16384):
        n, w = (_decide.decide(later, *args, sm90=True, narrow_memory=m) for m in (True, False))
        assert (n.path, n.tile, n.block_n, n.tile_sync) == (w.path, w.tile, w.block_n, w.tile_sync)
    assert not CakeMxfp4MoEWrapper(**CONTRACT, **EP8, device="cpu").narrow_memory


def test_decide_decode_limit_of_a_short_k_shard_where_memory_is_narrow():
    """Where memory is narrow a shard of 512 < K <= 1024 takes the short shard's decode limit
    (8.25 routes per expert; its later crossovers stay the long shard's), 1152 and up the long
    one's (5.25); an H200 keeps 6 for all of them."""
    def tile(t, inter, narrow, e=128, h=2048):
        return _decide.decide(t, 8, e, h, inter, sm90=True, narrow_memory=narrow).tile
    for inter in (640, 768, 1024):
        assert tile(132, inter, True) == "n8_narrow4"     # 8.25 routes per expert (T * 8 / 128)
        assert tile(133, inter, True) == "wg32x4"
        assert tile(97, inter, False) == "wg32x4"          # the H200's 6
        assert tile(385, inter, True) == "wg64x4" and tile(384, inter, True) == "wg32x4"  # mid limit 24, not 32
    assert tile(84, 1152, True) == "n8_narrow4" and tile(85, 1152, True) == "wg32x4"   # 5.25
    # a short shard as before: the same decode limit, its own mid limit (32 routes per expert)
    assert tile(132, 384, True) == "n8_narrow4" and tile(133, 384, True) == "wg32x4"
    assert tile(512, 384, True) == "wg32x4" and tile(513, 384, True) == "wg64x4"


@pytest.mark.parametrize("t,wide,narrow", [(1345, "wg64x4/wg128x4", "wg64x4/wg96x4"),
                                           (2240, "wg64x4/wg128x4", "wg64x4/wg96x4"),
                                           (2241, "wg64x4/wg96x4", "wg64x4/wg96x4"),
                                           (3072, "wg128x4/wg96x4", "wg128x4/wg96x4"),
                                           (4144, "wg128x4/wg96x4", "wg128x4/wg96x4"),
                                           (4145, "wg128x4/wg160x3", "wg128x4/wg160x3"),
                                           (16384, "wg160x3/wg128x4", "wg160x3/wg128x4")])
def test_decide_long_shard_offers_wg96(t, wide, narrow):
    """A long shard's wgmma decisions take wg96x4 as the second form: wg128x4's up to 74 routes
    per expert (T = 4144 at T*k/E = T/56) instead of wg160x3, and wg64x4's past 40 (T = 2240)
    instead of wg128x4, or at every load where DRAM per SM is narrow; the table's own form
    stays, and short shards keep theirs."""
    def pair(inter, **kw):
        d = _decide.decide(t, *_TP8[:3], inter, sm90=True, **kw)
        return f"{d.tile}/{d.alt_tile}", d.forms
    got, forms = pair(3072)
    assert got == wide
    if wide.endswith("wg96x4"):
        assert forms[3] == "mxfp4_moe_gemm1_wg96x4" and forms[5] == "mxfp4_moe_gemm2_wg96x4"
    assert pair(3072, narrow_memory=True)[0] == narrow
    assert pair(384, narrow_memory=True) == pair(384)


def test_wrapper_narrow_memory_argument(monkeypatch):
    """``narrow_memory=`` takes a narrow part's decisions (or an H200's) whatever the device, for
    host-only planning; anything but None / True / False is refused. Read from a device without
    the compiled extension, the flag is an H200's (decide() still serves there)."""
    from cake_moe import _runtime

    def missing():
        raise ImportError("no extension")
    monkeypatch.setattr(_runtime, "ext", missing)
    assert CakeMxfp4MoEWrapper(**CONTRACT, **EP8, device="cpu")._device_narrow_memory() is False
    monkeypatch.undo()
    for flag in (False, True):
        w = CakeMxfp4MoEWrapper(**CONTRACT, **EP8, narrow_memory=flag, device="cpu")
        assert w.narrow_memory is flag and f"narrow_memory={flag}" in repr(w)
        assert w.decide(320).tile == ("wg32x4" if flag else "n8")
    with pytest.raises(ValueError, match="narrow_memory must be None, True or False"):
        CakeMxfp4MoEWrapper(**CONTRACT, **EP8, narrow_memory=1)


@pytest.mark.parametrize("sm90", [False, True])
@pytest.mark.parametrize("shape", [(16, 896, 7168, 3072), (16, 896, 7168, 384), (2, 8, 256, 128), (8, 64, 384, 512),
                                   (8, 64, 384, 640), (32, 1024, 128, 128)])
def test_decide_token_tiles_grow_with_t(shape, sm90, monkeypatch):
    """Whatever the shard, the table's token-tile size never shrinks as T grows (the crossovers
    are ordered), and every T is served. The one exception is the prefill choice between 128- and
    160-token tiles, which follows the expected tile costs (prefill_tile) both ways. (The table's
    own forms: the modeled pairs past SM90_PAIR_MIN_LOAD are test_decide_modeled_pair's.)"""
    monkeypatch.setattr(_decide, "SM90_PAIR_MIN_LOAD", math.inf)
    sizes = [_decide.decide(t, *shape, sm90=sm90) for t in range(1, 6000, 7)]
    assert all(d.supported for d in sizes)
    block_ns = [min(d.block_n, 128) for d in sizes]
    assert block_ns == sorted(block_ns)
    for t, d in zip(range(1, 6000, 7), sizes):
        load = _decide.routes_per_expert(t, *shape[:2])
        short = shape[3] <= _decide.RESIDENT_K
        assert (d.block_n == 160) == (sm90 and d.block_n >= 128 and _decide.prefill_tile(load, short) == "wg160x3")


# The table's prefill form by routes per expert, as the tile-cost model gives it today: from
# each load on, up to the next (a change of SM90_TILE_COST or of the expected tiles moves them;
# move them here only with a measurement). A short shard takes wg96x4 while one tile holds an
# expert's routes.
_PREFILL_RANGES = {False: [(20.0, "wg128x4"), (123.0, "wg160x3"), (162.0, "wg128x4"), (261.0, "wg160x3"),
                           (311.75, "wg128x4"), (410.5, "wg160x3"), (450.25, "wg128x4")],
                   True: [(20.0, "wg96x4"), (88.0, "wg128x4"), (123.0, "wg160x3"), (162.0, "wg128x4"),
                          (261.0, "wg160x3"), (311.75, "wg128x4"), (410.5, "wg160x3"), (450.25, "wg128x4")]}


@pytest.mark.parametrize("short", [False, True])
def test_prefill_tile_ranges(short):
    ranges = _PREFILL_RANGES[short]
    for (start, tile), (end, _) in zip(ranges, ranges[1:] + [(4000.0, "")]):
        for load in (start, (start + end) / 2, end - 0.25):
            assert _decide.prefill_tile(load, short) == tile, (load, short)


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("shape", [(16, 896, 7168, 3072), (16, 896, 7168, 384), (8, 64, 384, 256)])
def test_decide_alt_tile_for_every_sm90_wgmma_path(shape, narrow):
    """On sm_90 every wgmma decision names a second form of another token-tile size for the
    device to choose from: the next larger tile below wg64x4's range, the other wide form of
    least expected cost past it, and past SM90_PAIR_MIN_LOAD the modeled pair (where DRAM per SM
    is narrow, and where it is wide with SM90_PAIR_WIDE_MEMORY, as measured). Not the mma.sync
    paths, a forced tile, a portable device, nor 32 routes or fewer (the routing kernel's
    one-warp path lists one form's tiles)."""
    short = shape[3] <= _decide.RESIDENT_K
    for t in range(1, 30000, 97):
        d = _decide.decide(t, *shape, sm90=True, narrow_memory=narrow)
        load = _decide.routes_per_expert(t, *shape[:2])
        if d.tile in _decide.SM90_TILES and t * shape[0] > _decide.MAX_FEW_ROUTES:
            assert len(d.forms) == 7 and _tile_cost.BLOCK_N_OF[d.alt_tile] != d.block_n, (t, d)
            if (load > _decide.SM90_PAIR_MIN_LOAD and (narrow or _decide.SM90_PAIR_WIDE_MEMORY)
                    and t * shape[0] >= _decide.SPLIT_MIN_ROUTES):
                table = _decide.prefill_tile(load, short)
                assert (d.tile, d.alt_tile) == _decide.modeled_pair(
                    load, short, table, _decide.alt_tile(load, short, table, narrow), True), (t, d)
            else:
                assert d.alt_tile == _decide.alt_tile(load, short, d.tile, narrow), (t, d)
                if d.block_n < 96:
                    assert _tile_cost.BLOCK_N_OF[d.alt_tile] > d.block_n
                else:
                    assert d.alt_tile in ("wg96x4", "wg128x4", "wg160x3")
        else:
            assert d.alt_tile == "" and len(d.forms) == 5, (t, d)
        assert _decide.decide(t, *shape, sm90=False).alt_tile == ""
        assert _decide.decide(t, *shape, sm90=True, tile="wg128x4").alt_tile == ""
    assert _decide.alt_tile(24.0, False, "wg32x4") == "wg64x4"
    assert _decide.alt_tile(40.0, False, "wg64x4") == "wg128x4"
    assert _decide.alt_tile(40.0, True, "wg64x4") == "wg96x4"
    assert _decide.alt_tile(110.0, False, "wg128x4") == "wg160x3"
    assert _decide.alt_tile(73.0, True, "wg96x4") == "wg128x4"


# Past SM90_PAIR_MIN_LOAD (T > 5376 at T * k / E = T / 56): the pairs measured faster than the
# table's on an H100, same process and inputs (bench/results/2026-12-05_h100_mxfp4_moe_modeled_pairs.md;
# tp8 T = 9216 modeled only), and rows where the table's own pair stays (no candidate models 4%
# cheaper; at ep8 T = 6144 wg128x4 + wg64x4 models 3.2% and ran 8.5% slower; past
# SM90_PAIR_MAX_RANK_LOAD: ep8 T = 12288 ran 2.7% slower through the table,
# ..._h100_mxfp4_moe_modeled_pair_table_ab.md).
_MODELED = {("ep8", 5632): ("wg128x4", "wg160x3"), ("ep8", 6144): ("wg128x4", "wg160x3"),
            ("ep8", 6656): ("wg128x4", "wg64x4"), ("ep8", 7168): ("wg128x4", "wg64x4"),
            ("ep8", 8192): ("wg128x4", "wg96x4"), ("ep8", 10240): ("wg128x4", "wg160x3"),
            ("ep8", 12288): ("wg128x4", "wg160x3"), ("ep8", 16384): ("wg160x3", "wg128x4"),
            ("ep8", 20480): ("wg128x4", "wg160x3"),
            ("tp8", 5632): ("wg128x4", "wg96x4"), ("tp8", 8192): ("wg160x3", "wg128x4"), ("tp8", 9216): ("wg128x4", "wg64x4"),
            ("tp8", 10240): ("wg128x4", "wg64x4"), ("tp8", 12288): ("wg128x4", "wg96x4"),
            ("tp8", 16384): ("wg160x3", "wg128x4")}


@pytest.mark.parametrize("layout,t", sorted(_MODELED))
def test_decide_modeled_pair(layout, t, monkeypatch):
    """The two forms past SM90_PAIR_MIN_LOAD: wg128x4 and the narrow form of least modeled cost
    at the rank's load where that models SM90_PAIR_GAIN cheaper than the table's pair. Where
    DRAM per SM is narrow (measured there); a wide-memory device keeps the table's pair unless
    SM90_PAIR_WIDE_MEMORY (set: measured on an H200 too)."""
    inter = 3072 if layout == "ep8" else 384
    monkeypatch.setattr(_decide, "SM90_PAIR_WIDE_MEMORY", False)
    table = _decide.decide(t, *_TP8[:3], inter, sm90=True)
    d = _decide.decide(t, *_TP8[:3], inter, sm90=True, narrow_memory=True)
    assert (d.tile, d.alt_tile) == _MODELED[layout, t], (layout, t, d)
    assert d.block_n == _tile_cost.BLOCK_N_OF[d.tile] and d.path == "prefill"
    load = t / 56
    assert table.tile == _decide.prefill_tile(load, layout == "tp8")
    assert table.alt_tile == _decide.alt_tile(load, layout == "tp8", table.tile)
    monkeypatch.setattr(_decide, "SM90_PAIR_WIDE_MEMORY", True)
    wide = _decide.decide(t, *_TP8[:3], inter, sm90=True)
    assert (wide.tile, wide.alt_tile) == _MODELED[layout, t]


def _pair_cost_by_the_sum(load: float, wide: str, narrow: str, split: bool) -> float:
    """pair_costs' reference: each Poisson term on its own, the listing rule as written."""
    cost, bn_w, bn_n = _tile_cost.SM90_TILE_COST, _tile_cost.BLOCK_N_OF[wide], _tile_cost.BLOCK_N_OF[narrow]
    single_w = single_n = split_w = split_n = 0.0
    for n in range(int(load + 10 * math.sqrt(load) + 20)):
        p = math.exp(n * math.log(load) - load - math.lgamma(n + 1))
        single_w += p * -(-n // bn_w)
        single_n += p * -(-n // bn_n)
        full, rest = divmod(n, bn_w)
        split_w += p * (full + (rest > bn_n))
        split_n += p * (0 < rest <= bn_n)
    single = min(cost[wide] * single_w, cost[narrow] * single_n)
    both = cost[wide] * split_w + cost[narrow] * split_n
    return both if split and both * 100 < single * (100 - _tile_cost.SPLIT_GAIN_PCT) else single


@pytest.mark.parametrize("load", [40.0, 157.0, 292.6, 1071.4])
def test_pair_costs_match_the_poisson_sum(load):
    """Every pair's modeled cost (one vectorized pass) against the sum term by term, with and
    without the width per expert; at ep8 T = 6144's rank load (157) the split wg160x3 + wg32x4
    models >10% below every single form."""
    for split in (False, True):
        costs = _tile_cost.pair_costs(load, split)
        assert len(costs) == 10
        for (wide, narrow), c in costs.items():
            assert _tile_cost.BLOCK_N_OF[wide] > _tile_cost.BLOCK_N_OF[narrow]
            assert c == pytest.approx(_pair_cost_by_the_sum(load, wide, narrow, split), rel=1e-9), (wide, narrow)
    singles = [_tile_cost.SM90_TILE_COST[f] * _tile_cost.expected_tiles(157.0, _tile_cost.BLOCK_N_OF[f])
               for f in _tile_cost.SM90_TILE_COST]
    assert _tile_cost.pair_costs(157.0, True)["wg160x3", "wg32x4"] < 0.9 * min(singles)
    assert _tile_cost.pair_costs(157.0, False)["wg160x3", "wg32x4"] == pytest.approx(min(singles[0], singles[4]))
    # no candidate 4% cheaper: the table's own, in its order
    assert _decide.modeled_pair(292.6, True, "wg160x3", "wg128x4", split=True) == ("wg160x3", "wg128x4")
    assert _decide.modeled_pair(182.9, True, "wg128x4", "wg160x3", split=True) == ("wg128x4", "wg64x4")


def test_decide_modeled_pair_needs_the_width_per_expert():
    """Without the width per expert (fewer than SPLIT_MIN_ROUTES routes, or tile_split=False:
    CAKE_MOE_TILE_SPLIT=0) a decision keeps the table's pair: ep8 T = 6656 wg128x4 + wg160x3,
    not wg128x4 + wg64x4 (a single wg64x4 needs three tiles for 170 routes)."""
    args = (*_TP8[:3], 3072)
    one = _decide.decide(6656, *args, sm90=True, narrow_memory=True, tile_split=False)
    assert (one.tile, one.alt_tile) == ("wg128x4", "wg160x3")
    assert _decide.decide(6656, *args, sm90=True, narrow_memory=True).alt_tile == "wg64x4"
    few = _decide.decide(1000, 16, 112, 7168, 3072, sm90=True, narrow_memory=True)   # 16000 routes: no split
    load = _decide.routes_per_expert(1000, 16, 112)
    assert load > _decide.SM90_PAIR_MIN_LOAD
    assert (few.tile, few.alt_tile) == (_decide.prefill_tile(load, False), _decide.alt_tile(load, False, few.tile, True))


def test_device_tile_choice_rule():
    """The routing kernel's rule, mirrored: the form whose tiles cost less in total (ceil(count /
    BN) x cost per tile, summed over the local experts), ties to the table's form. The two ep8
    rows where the plan-time estimate missed (the benchmark's rank sees ~1.43x the uniform load)
    go the way they measured faster (bench/results/2026-12-03_h200_mxfp4_moe_prefill_tile_sweep.md)."""
    choose = _tile_cost.device_tile_choice
    assert choose([157] * 112, "wg128x4", "wg160x3") == "wg160x3"   # ep8 T = 6144: one 160-row tile each
    assert choose([210] * 112, "wg160x3", "wg128x4") == "wg128x4"   # ep8 T = 8192: two tiles either way
    assert choose([100] * 8, "wg160x3", "wg128x4") == "wg128x4"
    assert choose([0] * 8, "wg160x3", "wg128x4") == "wg160x3"     # no tiles: a tie
    assert choose([13 * 128], "wg128x4", "wg160x3") == "wg128x4"  # 13 x 1.0 against 11 x 1.3 = 14.3
    assert choose([10 * 160], "wg128x4", "wg160x3") == "wg128x4"  # 12.5 -> 13 against 10 x 1.3 = 13: a tie
    assert choose([96, 97], "wg96x4", "wg128x4") == "wg128x4"     # 3 x 0.85 = 2.55 against 2 x 1.0
    assert choose([96, 96], "wg96x4", "wg128x4") == "wg96x4"      # 2 x 0.85 against 2 x 1.0
    assert choose([52] * 112, "wg64x4", "wg128x4") == "wg64x4"    # 0.63 against 1.0
    assert choose([69] * 112, "wg64x4", "wg128x4") == "wg128x4"   # 2 x 0.63 against 1.0
    assert choose([33] * 112, "wg32x4", "wg64x4") == "wg64x4"     # 2 x 0.5 against 0.63
    assert [_tile_cost.tile_cost_milli(f) for f in ("wg32x4", "wg64x4", "wg96x4", "wg128x4", "wg160x3")] == \
        [500, 630, 850, 1000, 1300]


def test_device_tile_listing_rule():
    """The width per expert's rule, mirrored (moe_route.cuh, choose_listing): full tiles of the
    wider form and a last tile of at most the narrower form's rows in the narrower form's list,
    where that costs at least 2% less than the cheaper single form; else device_tile_choice."""
    listing = _tile_cost.device_tile_listing
    # 418 = 2 x 160 + 98: 2 x 1.3 + 1.0 = 3.6 against 3 x 1.3 = 3.9 and 4 x 1.0
    assert listing([418] * 112, "wg160x3", "wg128x4") == "wg160x3+wg128x4"
    assert listing([418] * 112, "wg128x4", "wg160x3") == "wg128x4+wg160x3"  # either order of the pair
    # 300 = 160 + 140: the rest needs a 160-row tile, so the split lists what wg160x3 alone does
    assert listing([300] * 8, "wg160x3", "wg128x4") == "wg160x3"
    assert listing([256] * 8, "wg160x3", "wg128x4") == "wg128x4"   # 2 x 1.0 against 2.3 (split) and 2.6
    assert listing([100] * 8, "wg160x3", "wg128x4") == "wg128x4"   # one tile: the split is wg128x4 alone
    assert listing([0] * 8, "wg160x3", "wg128x4") == "wg160x3"     # no tiles: a tie, the table's form
    # 9 x 420 (2 x 160 + 100) and 384 (2 x 160 + 64): split 10 x 3.6 = 36 against 39 and 39
    assert listing([420] * 9 + [384], "wg160x3", "wg128x4") == "wg160x3+wg128x4"
    # within the 2% margin: 260 and 384 split 2.3 + 3.6 = 5.9 against wg128x4's 3.0 + 3.0 = 6.0
    assert listing([260, 384], "wg160x3", "wg128x4") == "wg128x4"


def test_split_width_needs_two_pairs_and_the_chunked_routing(monkeypatch):
    """On by default; CAKE_MOE_TILE_SPLIT read as the extension reads it (atoll: "0" and text
    turn it off, unset or empty leave the default, a leading integer counts)."""
    d = _decide.decide(16384, 16, 896, 7168, 384, sm90=True)
    assert d.alt_tile
    monkeypatch.delenv("CAKE_MOE_TILE_SPLIT", raising=False)
    assert _wrapper.split_width(d, 16384, 16)
    for value, on in (("0", False), ("off", False), (" 0", False), ("", True), ("1", True), ("2x", True)):
        monkeypatch.setenv("CAKE_MOE_TILE_SPLIT", value)
        assert _wrapper.split_width(d, 16384, 16) == on, value
    monkeypatch.delenv("CAKE_MOE_TILE_SPLIT")
    assert _wrapper.split_width(d, 1024, 16)        # 16384 routes: the several-CTA routing
    assert not _wrapper.split_width(d, 1023, 16)    # one CTA routes them: one list
    single = _decide.decide(16384, 16, 896, 7168, 384, sm90=True, tile="wg160x3")
    assert not single.alt_tile and not _wrapper.split_width(single, 16384, 16)


# tp8 (T * k / E = T / 56 routes per expert): the faster prefill form per T, kernel time per run
# on the H200 (bench/results/2026-12-01_h200_mxfp4_moe_wg160x3.md)
_WIDE_MEASURED = {3072: "wg64x4", 4096: "wg96x4", 5120: "wg128x4", 6144: "wg128x4", 8192: "wg160x3", 10240: "wg128x4", 12288: "wg128x4",
                  16384: "wg160x3", 19456: "wg128x4", 24576: "wg160x3"}


@pytest.mark.parametrize("t,tile", sorted(_WIDE_MEASURED.items()))
def test_decide_wide_prefill_tiles_where_they_measured_faster(t, tile):
    """160-token tiles where they cut an expert's tiles by enough to pay for their ~1.2x cost per
    tile (tp8 T = 16384: two tiles of 292 routes instead of three), 96-token tiles while one
    holds an expert's routes (T = 4096: 73), 128 elsewhere (at T = 5120, 91 routes, the two
    measured within 1%)."""
    assert _decide.decide(t, *_TP8, sm90=True).tile == tile
    assert _decide.decide(t, *_TP8, sm90=False).tile == "n64"   # the portable forms are unchanged


def test_expected_tiles():
    assert _tile_cost.expected_tiles(0, 128) == 0.0
    assert _tile_cost.expected_tiles(40.0, 128) == pytest.approx(1.0, abs=1e-6)   # never 0 or 2 routes past 128
    assert _tile_cost.expected_tiles(292.6, 128) == pytest.approx(2.98, abs=0.01)
    assert _tile_cost.expected_tiles(292.6, 160) == pytest.approx(2.05, abs=0.01)
    assert _tile_cost.expected_tiles(1e6, 160) == pytest.approx(1e6 / 160 + 0.5, abs=0.01)


@pytest.mark.parametrize("load", [0.3, 7.0, 73.1, 292.6, 1170.3, 4681.1])
@pytest.mark.parametrize("block_n", [96, 128, 160])
def test_expected_tiles_matches_the_poisson_sum(load, block_n):
    """The recurrence over the counts agrees with each Poisson term computed on its own (the
    counts past 8 standard deviations, which it leaves out, weigh under 1e-6)."""
    direct = sum(math.exp(n * math.log(load) - load - math.lgamma(n + 1)) * -(-n // block_n)
                 for n in range(int(load + 10 * math.sqrt(load) + 20)))
    assert _tile_cost.expected_tiles(load, block_n) == pytest.approx(direct, rel=1e-6)


def test_decide_short_k_form_for_a_tp_shard():
    """tp8: GEMM2 reduces over the 384-wide shard, so decode takes its short-K tiling; after the
    narrow GEMM1 (T = 1) its two-K-warp variant, for K from 256 to 512."""
    w = CakeMxfp4MoEWrapper(**CONTRACT, **TP8, narrow_memory=False)
    assert w.decide(1).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow", "mxfp4_moe_gemm2_n8_shortk2")
    assert w.decide(4).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow4", "mxfp4_moe_gemm2_n8_shortk")
    assert w.decide(8).forms[2:4] == ("mxfp4_moe_gemm1_n8", "mxfp4_moe_gemm2_n8_shortk")
    assert CakeMxfp4MoEWrapper(**CONTRACT).decide(1).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow",
                                                                     "mxfp4_moe_gemm2_n8_narrow")   # ep8: K = 3072
    k2 = {inter: _decide.gemm_tiles("n8_narrow", 7168, inter, routes=16)[1]
          for inter in (128, 256, 384, 512, 640, 1024)}
    assert k2 == {128: "n8_shortk", 256: "n8_shortk2", 384: "n8_shortk2", 512: "n8_shortk2", 640: "n8_narrow",
                  1024: "n8_narrow"}
    assert _decide.gemm_tiles("n8_narrow", 256, 384, routes=16) == ("n8_shortk", "n8_shortk2")   # GEMM1 keeps its form


def test_decide_narrow_gemm2_for_a_short_k_past_512():
    """A GEMM2 of K = 640..1024 after the narrow GEMM1s keeps their tiling up to
    NARROW_GEMM2_ROUTES routes (n8_shortk would give it one CTA per 256 weight rows of each routed
    expert), then takes the short-K tiling; K <= 512 and K > SHORT_K are as before."""
    tiles = _decide.gemm_tiles
    for tile in ("n8_narrow4", "n8_narrow"):
        assert tiles(tile, 2048, 768, routes=8) == (tile, tile)
        assert tiles(tile, 2048, 1024, routes=_decide.NARROW_GEMM2_ROUTES) == (tile, tile)
        assert tiles(tile, 2048, 768, routes=_decide.NARROW_GEMM2_ROUTES + 1) == (tile, "n8_shortk")
        assert tiles(tile, 2048, 1152, routes=8) == (tile, tile)   # past SHORT_K: as it always was
    assert tiles("n8_narrow4", 7168, 384, routes=32) == ("n8_narrow4", "n8_shortk")
    assert tiles("n8", 2048, 768, routes=8) == ("n8", "n8_shortk")   # (the n8 tile itself is past the narrow range)
    # through the table: Qwen3-30B-A3B's shape on one GPU (E = 128, top_k = 8, H = 2048, I = 768), and
    # OLMoE's (E = 64, top_k = 8, H = 2048, I = 1024); both memory widths
    for narrow in (False, True):
        q = CakeMxfp4MoEWrapper(128, 8, 2048, 768, narrow_memory=narrow)
        assert q.decide(1).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow", "mxfp4_moe_gemm2_n8_narrow")
        assert q.decide(8).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow4", "mxfp4_moe_gemm2_n8_narrow4")
        assert q.decide(9).forms[3] == "mxfp4_moe_gemm2_n8_shortk"
        o = CakeMxfp4MoEWrapper(64, 8, 2048, 1024, narrow_memory=narrow)
        assert o.decide(4).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow4", "mxfp4_moe_gemm2_n8_narrow4")


def test_bound_gemm_tiles_are_the_decisions_forms():
    """What a plan binds is read from decision.forms: per GEMM the table's suffix, then the second
    form's, each gemm_tiles of its form at the call's routes (one decision of each kind)."""
    def decide(t):
        return _decide.decide(t, 8, 128, 2048, 768, sm90=True)
    for t in (1, 8, 9, 256, 4096):
        d = decide(t)
        forms = (d.tile, d.alt_tile) if d.alt_tile else (d.tile,)
        want = [_decide.gemm_tiles(f, 2048, 768, routes=t * 8) for f in forms]
        assert _decide.bound_gemm_tiles(d) == (tuple(g1 for g1, _ in want), tuple(g2 for _, g2 in want)), (t, d)
    assert len(_decide.bound_gemm_tiles(decide(256))[0]) == 2   # a wgmma decision names two forms


@pytest.mark.parametrize("sm90", [False, True])
def test_decide_narrow_forms_by_route_count(sm90):
    """The decode tile by T * top_k: n8_narrow up to 16 routes, n8_narrow4 up to 64, then n8."""
    tiles = {t: _decide.decide(t, 4, 896, 7168, 3072, sm90=sm90).tile for t in (1, 4, 5, 16, 17)}
    assert tiles == {1: "n8_narrow", 4: "n8_narrow", 5: "n8_narrow4", 16: "n8_narrow4", 17: "n8"}


@pytest.mark.parametrize("inter", [3072, 384])
def test_decide_narrow4_limit_where_memory_is_narrow(inter):
    """Narrow DRAM per SM (an H100) keeps n8_narrow4 up to 2048 routes (T = 128 at top_k 16)
    where an H200 takes n8 from 65; the narrow tiling at T = 1, the later forms and the portable
    table are the same on both."""
    args = (*_TP8[:3], inter)

    def tiles(**kw):
        return {t: _decide.decide(t, *args, **kw).tile for t in (1, 4, 5, 32, 128, 129)}
    assert tiles(sm90=True) == {1: "n8_narrow", 4: "n8_narrow4", 5: "n8", 32: "n8", 128: "n8", 129: "n8"}
    assert tiles(sm90=True, narrow_memory=True) == {1: "n8_narrow", 4: "n8_narrow4", 5: "n8_narrow4",
                                                     32: "n8_narrow4", 128: "n8_narrow4", 129: "n8"}
    assert tiles(narrow_memory=True) == tiles()
    forms = _decide.decide(128, *args, sm90=True, narrow_memory=True).forms
    assert forms[2] == "mxfp4_moe_gemm1_n8_narrow4"
    assert forms[3] == ("mxfp4_moe_gemm2_n8_narrow4" if inter > _decide.SHORT_K else "mxfp4_moe_gemm2_n8_shortk")


def test_every_token_count_is_supported():
    w = CakeMxfp4MoEWrapper(**CONTRACT)
    assert all(w.decide(t).supported for t in range(1, 20001))
    assert [w.decide(t).block_n for t in (1, 1000, 20000)] == [8, 32, 128]
    assert [_decide.decide(t, *_TP8).block_n for t in (1, 1000, 20000)] == [8, 32, 64]


@pytest.mark.parametrize("tile,bn", [("n8", 8), ("n8_narrow", 8), ("n32", 32), ("n64", 64), ("wg128", 128),
                                     ("wg128x4", 128), ("wg64x4", 64), ("wg32x4", 32), ("wg160x3", 160),
                                     ("wg96x4", 96)])
def test_decide_forced_tile(tile, bn):
    d = _decide.decide(20000, *_TP8, sm90=True, tile=tile)
    assert (d.supported, d.path, d.block_n, d.tile) == (True, "forced", bn, tile)
    gemm2 = "n8_shortk" if tile.startswith("n8") else tile    # K = 384 <= SHORT_K
    gemm2 = "n8_shortk2" if tile == "n8_narrow" else gemm2     # ... and in SHORT_K2
    gemm2 = f"{tile}_rb" if tile in _decide.RESIDENT_TILES else gemm2   # K = 384 <= RESIDENT_K
    assert d.forms[2:4] == (f"mxfp4_moe_gemm1_{tile}", f"mxfp4_moe_gemm2_{gemm2}")


def test_decide_refuses_an_sm90_tile_elsewhere_and_unknown_tiles():
    d = _decide.decide(64, *_TP8, sm90=False, tile="wg128")
    assert not d.supported and "sm_90" in d.reason and d.forms == ()
    with pytest.raises(ValueError, match="tile must be one of"):
        _decide.decide(64, *_TP8, tile="n16")


def test_decide_tile_sync_rows():
    """E=896, k=16, not sm_90: the per-tile GEMM1 -> GEMM2 sync up to T*k/E = 0.3 (T = 16), then off."""
    synced = [t for t in range(1, 400) if _decide.decide(t, *_TP8).tile_sync]
    assert synced == list(range(1, 17))
    assert "per token tile" in _decide.decide(1, *_TP8).reason
    assert not _decide.decide(17, *_TP8).tile_sync and "per token tile" not in _decide.decide(17, *_TP8).reason


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("layer", [_TP8, (8, 256, 7168, 2048), (8, 128, 4096, 1536), (8, 256, 7168, 256)])
def test_decide_tile_sync_on_every_sm90_decode_load(layer, narrow):
    """An sm_90 device, narrow DRAM bandwidth per SM (an H100) or wide (an H200), syncs GEMM1 ->
    GEMM2 per token tile on every BN 8 (decode) decision and on none of the wgmma paths; every
    other arch keeps the 0.3-routes-per-expert limit."""
    k, e = layer[0], layer[1]
    rows = [(t, _decide.decide(t, *layer, sm90=True, narrow_memory=narrow)) for t in range(1, 2049)]
    decode = [t for t, d in rows if d.block_n == 8]
    assert decode == list(range(1, len(decode) + 1)) and len(decode) > 16
    assert all(d.tile_sync == (d.block_n == 8) for _, d in rows)
    assert all("per token tile" in d.reason for _, d in rows if d.block_n == 8)
    other = [t for t in range(1, 2049) if _decide.decide(t, *layer, narrow_memory=narrow).tile_sync]
    assert other == [t for t in range(1, 2049) if t * k / e <= _decide.TILE_SYNC_MAX_LOAD]
    assert not _decide.decide(max(decode), *layer, sm90=True, narrow_memory=narrow, tile_sync=False).tile_sync


def test_decide_forced_tile_sync():
    assert _decide.decide(20000, *_TP8, tile="n64", tile_sync=True).tile_sync
    assert not _decide.decide(1, *_TP8, tile_sync=False).tile_sync
    assert _decide.decide(1, *_TP8, tile_sync=False).tile == "n8_narrow"
    d = _decide.decide(20000, *_TP8, sm90=True, tile_sync=True)   # the table's wg128x4 is persistent
    assert not d.supported and "tile_sync" in d.reason and d.forms == ()
    assert not _decide.decide(1, *_TP8, sm90=True, tile="wg32x4").tile_sync   # default: off for wgmma forms
    with pytest.raises(ValueError, match="tile_sync must be"):
        _decide.decide(1, *_TP8, tile_sync=1)


def test_decide_refuses_token_rows_past_32_bit_chunk_indices():
    """The token-row loaders index 16-byte chunks with 32 bits: T x top_k x I_shard (GEMM2's
    rows) and T x H (GEMM1's) must stay below 2^35 elements (the host plan's 64 GiB of BF16);
    from there the decision refuses, and get_workspace_size with it."""
    ep8 = (16, 896, 7168, 3072)
    last = 2**35 // (16 * 3072)
    assert _decide.decide(last, *ep8, sm90=True).supported
    d = _decide.decide(last + 1, *ep8, sm90=True)
    assert not d.supported and "2^35" in d.reason and d.forms == ()
    wide_h = (1, 8, 7168, 128)   # GEMM1's x rows bind first
    last_h = 2**35 // 7168
    assert _decide.decide(last_h, *wide_h).supported and not _decide.decide(last_h + 1, *wide_h).supported
    assert not CakeMxfp4MoEWrapper(**CONTRACT).decide(last + 1).supported
    exact = (32, 32, 128, 1024)   # T = 2^20: T x top_k x I_shard is 2^35 exactly
    assert _decide.decide(2**20 - 1, *exact).supported and not _decide.decide(2**20, *exact).supported
    wrapper = CakeMxfp4MoEWrapper(**CONTRACT)
    assert wrapper.get_workspace_size(last) > 0
    for kwargs in ({"num_tokens": last + 1}, {"max_tokens": 2**50}):
        with pytest.raises(ValueError, match="2\\^35"):
            wrapper.get_workspace_size(**kwargs)


@pytest.mark.parametrize("t", [0, -1, 2.0, True])
def test_decide_unsupported(t):
    d = CakeMxfp4MoEWrapper(**CONTRACT).decide(t)
    assert not d.supported and "num_tokens" in d.reason and d.forms == ()


def test_plan_decision_is_frozen():
    d = CakeMxfp4MoEWrapper(**CONTRACT).decide(1)
    assert isinstance(d, PlanDecision)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.block_n = 64
