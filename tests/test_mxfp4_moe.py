"""CPU tests of the MXFP4 MoE host side (SPEC §7, docs/mxfp4_moe.md): the prepared weight layout,
the decision table, the workspace size, and every refusal of the wrapper reachable without a GPU.
The binding contract is checked against a stand-in for the compiled extension."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from cake_moe import _runtime
from cake_moe.mxfp4_moe import (CakeMxfp4MoEWrapper, Mxfp4MoEPlan, PlanDecision, prepare_cake_mxfp4_weights,
                                unprepare_cake_mxfp4_weights)
from cake_moe.mxfp4_moe import _decide, _wrapper
from cake_moe.reference import moe as ref

E, K, H, I = 8, 2, 256, 128          # small geometry for plan() checks
CONTRACT = dict(num_experts=896, top_k=16, hidden_size=7168, intermediate_size=3072)
EP8 = dict(num_local_experts=112, local_expert_offset=336)
TP8 = dict(intermediate_shard=384)


def _bank(num_local: int, hidden: int, inter: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((num_local, 2 * inter, hidden // 2), (num_local, 2 * inter, hidden // 32),
              (num_local, hidden, inter // 2), (num_local, hidden, inter // 32))
    return tuple(torch.randint(0, 256, s, generator=g, dtype=torch.uint8) for s in shapes)


# --- prepared layout -------------------------------------------------------------------------

def _nibble(row: list[int], element: int) -> int:
    byte = row[element // 2]
    return byte >> 4 if element % 2 else byte & 0xF


def _bit(r: int, h: int, b: int) -> int:
    """The doc's bit table: bit b (0 mantissa, 1-2 exponent, 3 sign) of register slot r, half h
    of a prepared 32-bit word."""
    if r < 3:
        return ((6, 7, 8, 15)[b] + 16 * h - (0, 10, 13)[r]) % 32
    return (3, 4, 0, 1)[b] + 16 * h


def _slow_prepare_rows(canonical: torch.Tensor, canon_row, weights: bool) -> torch.Tensor:
    """The doc's formulas, one element at a time: prepared row P of expert e is canonical row
    canon_row(P); with ``weights``, slot (q, wi, p) of chunk c (word 8q + 4wi of the chunk's bytes)
    holds canonical element 64c + 16s + 8h + 2q + odd, R = 4wi + p%4, s = R//2, h = R%2,
    odd = p//4, its bits spread by the bit table (register slot p%4, half p//4)."""
    num_local, rows, cols = canonical.shape
    out = torch.empty_like(canonical)
    for e in range(num_local):
        src = canonical[e].tolist()
        for prow in range(rows):
            row = src[canon_row(prow)]
            if not weights:
                out[e, prow] = torch.tensor(row, dtype=torch.uint8)
                continue
            new = [0] * cols
            for c in range(cols // 32):
                for q in range(4):
                    for wi in range(2):
                        for p in range(8):
                            r = 4 * wi + p % 4
                            element = 64 * c + 16 * (r // 2) + 8 * (r % 2) + 2 * q + p // 4
                            v = _nibble(row, element)
                            for b in range(4):
                                pos = _bit(p % 4, p // 4, b)
                                new[32 * c + 8 * q + 4 * wi + pos // 8] |= ((v >> b) & 1) << (pos % 8)
            out[e, prow] = torch.tensor(new, dtype=torch.uint8)
    return out


def _w1_row(inter: int):
    def canon(prow: int) -> int:
        g, p = divmod(prow, 64)
        b, r = divmod(p, 16)
        return 32 * g + 4 * r + b if r < 8 else inter + 32 * g + 4 * (r - 8) + b
    return canon


def _w2_row(prow: int) -> int:
    g, p = divmod(prow, 64)
    b, r = divmod(p, 16)
    return 64 * g + 8 * (r % 8) + 2 * b + r // 8


@pytest.mark.parametrize("hidden,inter", [(128, 128), (256, 384)])
def test_prepare_matches_the_doc_formulas_element_by_element(hidden, inter):
    w1, w1s, w2, w2s = _bank(2, hidden, inter, seed=hidden + inter)
    p = prepare_cake_mxfp4_weights(w1, w1s, w2, w2s)
    assert not torch.equal(p["w1"], w1) and not torch.equal(p["w2"], w2)
    assert torch.equal(p["w1"], _slow_prepare_rows(w1, _w1_row(inter), weights=True))
    assert torch.equal(p["w1_sf"], _slow_prepare_rows(w1s, _w1_row(inter), weights=False))
    assert torch.equal(p["w2"], _slow_prepare_rows(w2, _w2_row, weights=True))
    assert torch.equal(p["w2_sf"], _slow_prepare_rows(w2s, _w2_row, weights=False))


def test_bit_table_is_a_permutation_and_matches_the_module():
    from cake_moe.mxfp4_moe import _prepare
    slots = [(r, h, b) for r in range(4) for h in range(2) for b in range(4)]
    assert sorted(_bit(*x) for x in slots) == list(range(32))
    assert all(_prepare.bit_position(*x) == _bit(*x) for x in slots)


def _extract(word: int, r: int) -> int:
    """The kernel's extraction of register slot r (weight_fragments.cuh), in Python."""
    rotl = lambda x, k: ((x << k) | (x >> (32 - k))) & 0xFFFFFFFF if k else x  # noqa: E731
    if r < 3:
        return rotl(word, (0, 10, 13)[r]) & 0x81C081C0
    return (((word & 0x001B001B) * 0x4108) & 0xFFFFFFFF) & 0x81C081C0


def test_kernel_extraction_yields_the_bf16_patterns():
    """Every slot's nibble comes out as the BF16x2 pattern 2^-126 * E2M1 (magnitude at bits 6-8,
    sign at 15, + 16 for the high half), whatever the other slots hold."""
    g = torch.Generator().manual_seed(7)
    for _ in range(200):
        nibbles = torch.randint(0, 16, (8,), generator=g).tolist()
        word = 0
        for p, v in enumerate(nibbles):
            for b in range(4):
                word |= ((v >> b) & 1) << _bit(p % 4, p // 4, b)
        for r in range(4):
            lo, hi = nibbles[r], nibbles[r + 4]
            want = ((lo & 7) << 6) | ((lo >> 3) << 15) | ((hi & 7) << 22) | ((hi >> 3) << 31)
            assert _extract(word, r) == want


def test_prepare_pairs_up_and_gate_of_one_column():
    """Prepared w1 rows r and r + 8 of a group are up and gate of the same intermediate column;
    the scale rows move with them (the scale column here carries the canonical row number)."""
    inter = 128
    w1, _, w2, w2s = _bank(1, 128, inter)
    w1s = torch.arange(2 * inter, dtype=torch.int32).to(torch.uint8).view(1, -1, 1).repeat(1, 1, 4)
    canon_row = prepare_cake_mxfp4_weights(w1, w1s, w2, w2s)["w1_sf"][0, :, 0].long()
    assert canon_row[:8].tolist() == [0, 4, 8, 12, 16, 20, 24, 28]
    assert canon_row[8:16].tolist() == [inter + j for j in (0, 4, 8, 12, 16, 20, 24, 28)]
    assert canon_row[16:24].tolist() == [1, 5, 9, 13, 17, 21, 25, 29]
    assert sorted(canon_row.tolist()) == list(range(2 * inter))


@pytest.mark.parametrize("shape", [(3, 256, 128), (2, 384, 640), (2, 7168, 3072)])
def test_prepare_round_trip(shape):
    num_local, hidden, inter = shape
    bank = _bank(num_local, hidden, inter, seed=sum(shape))
    before = [t.clone() for t in bank]
    p = prepare_cake_mxfp4_weights(*bank)
    assert p["layout"] == "cake_mma_v3"
    assert (p["num_local_experts"], p["hidden_size"], p["intermediate_shard"]) == shape
    for name, canonical in zip(("w1", "w1_sf", "w2", "w2_sf"), bank):
        t = p[name]
        assert t.dtype == torch.uint8 and t.shape == canonical.shape and t.is_contiguous()
        assert t.data_ptr() != canonical.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(bank, before)), "prepare modified its inputs"
    back = unprepare_cake_mxfp4_weights(p)
    assert all(torch.equal(a, b) for a, b in zip(back, bank))


def test_prepare_accepts_non_contiguous_inputs():
    bank = _bank(2, 256, 128)
    wide = torch.zeros(2, 256, 256, dtype=torch.uint8)
    wide[:, :, :128] = bank[0]
    p = prepare_cake_mxfp4_weights(wide[:, :, :128], *bank[1:])
    assert torch.equal(p["w1"], prepare_cake_mxfp4_weights(*bank)["w1"])


def _bad_bank(what: str):
    w1, w1s, w2, w2s = _bank(2, 256, 128)
    return {
        "w1 dtype": (w1.view(torch.int8), w1s, w2, w2s),
        "w1_scale 2-D": (w1, w1s[0], w2, w2s),
        "w2 shape": (w1, w1s, w2[:, :, :32], w2s),
        "w2_scale shape": (w1, w1s, w2, w2s[:1]),
        "w1_scale shape": (w1, w1s[:, :128], w2, w2s),
        "hidden size": (w1[:, :, :32], w1s[:, :, :4], w2[:, :128], w2s[:, :128]),
        "intermediate size": (w1[:, :128], w1s[:, :128], w2[:, :, :32], w2s[:, :, :2]),
        "w2 device": (w1, w1s, w2.to("meta"), w2s),
        "w1 not a tensor": (w1.numpy(), w1s, w2, w2s),
    }[what]


@pytest.mark.parametrize("what,match", [
    ("w1 dtype", "w1 must have dtype torch.uint8"), ("w1_scale 2-D", "w1_scale must be 3-D"),
    ("w2 shape", "w2 must have shape"), ("w2_scale shape", "w2_scale must have shape"),
    ("w1_scale shape", "w1_scale must have shape"), ("hidden size", "hidden size H"),
    ("intermediate size", "intermediate size I"), ("w2 device", "w2 is on meta"),
    ("w1 not a tensor", "w1 must be a torch.Tensor"),
])
def test_prepare_refuses(what, match):
    with pytest.raises(ValueError, match=match):
        prepare_cake_mxfp4_weights(*_bad_bank(what))


def test_unprepare_refuses_what_prepare_did_not_make():
    with pytest.raises(ValueError, match="layout"):
        unprepare_cake_mxfp4_weights({"w1": None})
    with pytest.raises(ValueError, match="layout"):
        unprepare_cake_mxfp4_weights(_bank(1, 128, 128))


# --- decision table --------------------------------------------------------------------------

def test_decide_contract_rows():
    w = CakeMxfp4MoEWrapper(**CONTRACT, **EP8)
    assert w.capability == (9, 0)   # host only: an H200 is assumed, like the SM count
    d = w.decide(1)
    assert (d.supported, d.path, d.block_n, d.tile) == (True, "decode", 8, "n8_narrow")
    assert d.forms == ("fmt_mxfp8_dequantize", "moe_route", "mxfp4_moe_gemm1_n8_narrow", "mxfp4_moe_gemm2_n8_narrow",
                       "moe_finalize")
    assert w.decide(3).tile == "n8_narrow4" and w.decide(3).forms[2] == "mxfp4_moe_gemm1_n8_narrow4"
    assert w.decide(5).tile == "n8" and w.decide(5).forms[2] == "mxfp4_moe_gemm1_n8"
    d = w.decide(12288)
    assert (d.supported, d.path, d.block_n, d.tile, d.alt_tile) == (True, "prefill", 128, "wg128x4", "wg160x3")
    assert d.forms[2:6] == ("mxfp4_moe_gemm1_wg128x4", "mxfp4_moe_gemm1_wg160x3", "mxfp4_moe_gemm2_wg128x4",
                            "mxfp4_moe_gemm2_wg160x3")
    d = w.decide(16384)
    assert (d.supported, d.path, d.block_n, d.tile, d.alt_tile) == (True, "prefill", 160, "wg160x3", "wg128x4")
    assert d.forms[2:6] == ("mxfp4_moe_gemm1_wg160x3", "mxfp4_moe_gemm1_wg128x4", "mxfp4_moe_gemm2_wg160x3",
                            "mxfp4_moe_gemm2_wg128x4")
    assert "BN=128 (wg128x4) where the device finds" in d.reason


_TP8 = (CONTRACT["top_k"], CONTRACT["num_experts"], CONTRACT["hidden_size"], TP8["intermediate_shard"])


def test_decide_resident_rows_for_a_short_gemm2():
    """A four-warpgroup GEMM2 with K = the intermediate shard <= 512 keeps the token rows
    resident (tp8's 384); GEMM1, longer shards and the two-warpgroup wg128 keep their form."""
    w = CakeMxfp4MoEWrapper(**CONTRACT, **TP8)
    assert w.decide(12288).forms[2:6] == ("mxfp4_moe_gemm1_wg128x4", "mxfp4_moe_gemm1_wg160x3",
                                          "mxfp4_moe_gemm2_wg128x4_rb", "mxfp4_moe_gemm2_wg160x3_rb")
    assert w.decide(16384).forms[2:6] == ("mxfp4_moe_gemm1_wg160x3", "mxfp4_moe_gemm1_wg128x4",
                                          "mxfp4_moe_gemm2_wg160x3_rb", "mxfp4_moe_gemm2_wg128x4_rb")
    assert _decide.gemm_tiles("wg160x3", 7168, 3072) == ("wg160x3", "wg160x3")
    assert _decide.gemm_tiles("wg128x4", 7168, 512) == ("wg128x4", "wg128x4_rb")
    assert _decide.gemm_tiles("wg128x4", 512, 640) == ("wg128x4", "wg128x4")
    assert _decide.gemm_tiles("wg64x4", 7168, 384) == ("wg64x4", "wg64x4_rb")
    assert _decide.gemm_tiles("wg32x4", 7168, 384) == ("wg32x4", "wg32x4_rb")
    assert _decide.gemm_tiles("wg128", 7168, 384) == ("wg128", "wg128")


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
    assert (d.path, d.tile, d.block_n) == (path, tile, _decide.BLOCK_N_OF[tile])
    portable = _decide.decide(t, *_TP8)
    assert portable.tile == ("n8" if t <= 336 else "n32" if t <= 1344 else "n64")


@pytest.mark.parametrize("sm90", [False, True])
@pytest.mark.parametrize("shape", [(16, 896, 7168, 3072), (16, 896, 7168, 384), (2, 8, 256, 128), (8, 64, 384, 512),
                                   (8, 64, 384, 640), (32, 1024, 128, 128)])
def test_decide_token_tiles_grow_with_t(shape, sm90):
    """Whatever the shard, the token-tile size never shrinks as T grows (the crossovers are
    ordered), and every T is served. The one exception is the prefill choice between 128- and
    160-token tiles, which follows the expected tile costs (prefill_tile) both ways."""
    sizes = [_decide.decide(t, *shape, sm90=sm90) for t in range(1, 6000, 7)]
    assert all(d.supported for d in sizes)
    block_ns = [min(d.block_n, 128) for d in sizes]
    assert block_ns == sorted(block_ns)
    for t, d in zip(range(1, 6000, 7), sizes):
        load = _decide.routes_per_expert(t, *shape[:2])
        short = shape[3] <= _decide.RESIDENT_K
        assert (d.block_n == 160) == (sm90 and d.block_n >= 128 and _decide.prefill_tile(load, short) == "wg160x3")


@pytest.mark.parametrize("shape", [(16, 896, 7168, 3072), (16, 896, 7168, 384), (8, 64, 384, 256)])
def test_decide_alt_tile_for_every_sm90_wgmma_path(shape):
    """On sm_90 every wgmma decision names a second form of another token-tile size for the
    device to choose from: the next larger tile below wg64x4's range, the other wide form of
    least expected cost past it. Not the mma.sync paths, a forced tile, a portable device, nor
    32 routes or fewer (the routing kernel's one-warp path lists one form's tiles)."""
    short = shape[3] <= _decide.RESIDENT_K
    for t in range(1, 30000, 97):
        d = _decide.decide(t, *shape, sm90=True)
        load = _decide.routes_per_expert(t, *shape[:2])
        if d.tile in _decide.SM90_TILES and t * shape[0] > _decide.MAX_FEW_ROUTES:
            assert d.alt_tile == _decide.alt_tile(load, short, d.tile) and len(d.forms) == 7, (t, d)
            assert _decide.BLOCK_N_OF[d.alt_tile] != d.block_n
            if d.block_n < 96:
                assert _decide.BLOCK_N_OF[d.alt_tile] > d.block_n
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


def test_device_tile_choice_rule():
    """The routing kernel's rule, mirrored: the form whose tiles cost less in total (ceil(count /
    BN) x cost per tile, summed over the local experts), ties to the table's form. The two ep8
    rows where the plan-time estimate missed (the benchmark's rank sees ~1.43x the uniform load)
    go the way they measured faster (bench/results/2026-12-03_h200_mxfp4_moe_prefill_tile_sweep.md)."""
    choose = _decide.device_tile_choice
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
    assert [_decide.tile_cost_milli(f) for f in ("wg32x4", "wg64x4", "wg96x4", "wg128x4", "wg160x3")] == \
        [500, 630, 850, 1000, 1300]


def test_device_tile_listing_rule():
    """The width per expert's rule, mirrored (moe_route.cuh, choose_listing): full tiles of the
    wider form and a last tile of at most the narrower form's rows in the narrower form's list,
    where that costs at least 2% less than the cheaper single form; else device_tile_choice."""
    listing = _decide.device_tile_listing
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
    assert _decide.expected_tiles(0, 128) == 0.0
    assert _decide.expected_tiles(40.0, 128) == pytest.approx(1.0, abs=1e-6)   # never 0 or 2 routes past 128
    assert _decide.expected_tiles(292.6, 128) == pytest.approx(2.98, abs=0.01)
    assert _decide.expected_tiles(292.6, 160) == pytest.approx(2.05, abs=0.01)
    assert _decide.expected_tiles(1e6, 160) == pytest.approx(1e6 / 160 + 0.5, abs=0.01)


@pytest.mark.parametrize("load", [0.3, 7.0, 73.1, 292.6, 1170.3, 4681.1])
@pytest.mark.parametrize("block_n", [96, 128, 160])
def test_expected_tiles_matches_the_poisson_sum(load, block_n):
    """The recurrence over the counts agrees with each Poisson term computed on its own (the
    counts past 8 standard deviations, which it leaves out, weigh under 1e-6)."""
    direct = sum(math.exp(n * math.log(load) - load - math.lgamma(n + 1)) * -(-n // block_n)
                 for n in range(int(load + 10 * math.sqrt(load) + 20)))
    assert _decide.expected_tiles(load, block_n) == pytest.approx(direct, rel=1e-6)


def test_decide_short_k_form_for_a_tp_shard():
    """tp8: GEMM2 reduces over the 384-wide shard, so decode takes its short-K tiling; after the
    narrow GEMM1 (T = 1) its two-K-warp variant, for K from 256 to 512."""
    w = CakeMxfp4MoEWrapper(**CONTRACT, **TP8)
    assert w.decide(1).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow", "mxfp4_moe_gemm2_n8_shortk2")
    assert w.decide(4).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow4", "mxfp4_moe_gemm2_n8_shortk")
    assert w.decide(8).forms[2:4] == ("mxfp4_moe_gemm1_n8", "mxfp4_moe_gemm2_n8_shortk")
    assert CakeMxfp4MoEWrapper(**CONTRACT).decide(1).forms[2:4] == ("mxfp4_moe_gemm1_n8_narrow",
                                                                     "mxfp4_moe_gemm2_n8_narrow")   # ep8: K = 3072
    k2 = {inter: _decide.gemm_tiles("n8_narrow", 7168, inter)[1] for inter in (128, 256, 384, 512, 640, 1024)}
    assert k2 == {128: "n8_shortk", 256: "n8_shortk2", 384: "n8_shortk2", 512: "n8_shortk2", 640: "n8_shortk",
                  1024: "n8_shortk"}
    assert _decide.gemm_tiles("n8_narrow", 256, 384) == ("n8_shortk", "n8_shortk2")   # GEMM1 keeps its form


@pytest.mark.parametrize("sm90", [False, True])
def test_decide_narrow_forms_by_route_count(sm90):
    """The decode tile by T * top_k: n8_narrow up to 16 routes, n8_narrow4 up to 64, then n8."""
    tiles = {t: _decide.decide(t, 4, 896, 7168, 3072, sm90=sm90).tile for t in (1, 4, 5, 16, 17)}
    assert tiles == {1: "n8_narrow", 4: "n8_narrow", 5: "n8_narrow4", 16: "n8_narrow4", 17: "n8"}


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


@pytest.mark.parametrize("sm90", [False, True])
def test_decide_tile_sync_rows(sm90):
    """E=896, k=16: the per-tile GEMM1 -> GEMM2 sync up to T*k/E = 0.3 (T = 16), then off."""
    synced = [t for t in range(1, 400) if _decide.decide(t, *_TP8, sm90=sm90).tile_sync]
    assert synced == list(range(1, 17))
    assert "per token tile" in _decide.decide(1, *_TP8).reason
    assert not _decide.decide(17, *_TP8).tile_sync and "per token tile" not in _decide.decide(17, *_TP8).reason


def test_decide_forced_tile_sync():
    assert _decide.decide(20000, *_TP8, tile="n64", tile_sync=True).tile_sync
    assert not _decide.decide(1, *_TP8, tile_sync=False).tile_sync
    assert _decide.decide(1, *_TP8, tile_sync=False).tile == "n8_narrow"
    d = _decide.decide(20000, *_TP8, sm90=True, tile_sync=True)   # the table's wg128x4 is persistent
    assert not d.supported and "tile_sync" in d.reason and d.forms == ()
    assert not _decide.decide(1, *_TP8, sm90=True, tile="wg32x4").tile_sync   # default: off for wgmma forms
    with pytest.raises(ValueError, match="tile_sync must be"):
        _decide.decide(1, *_TP8, tile_sync=1)


@pytest.mark.parametrize("t", [0, -1, 2.0, True])
def test_decide_unsupported(t):
    d = CakeMxfp4MoEWrapper(**CONTRACT).decide(t)
    assert not d.supported and "num_tokens" in d.reason and d.forms == ()


def test_plan_decision_is_frozen():
    d = CakeMxfp4MoEWrapper(**CONTRACT).decide(1)
    assert isinstance(d, PlanDecision)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.block_n = 64


# --- workspace -------------------------------------------------------------------------------

def test_workspace_formula_by_hand():
    # T=1, H=I=128, L=1, k=1: one tile (8 B + the 528-byte header: 3 units of 256 bytes), four
    # 64-row GEMM1 units of 16 KiB parking slots (256 units), the second tile list as the first
    # (3 units), the other eight segments one unit each
    assert _wrapper._workspace_bytes(1, 128, 128, 1, 1) == (8 + 3 + 256 + 3) * 256
    # T=100, H=256, I=128, L=4, k=2: R=200, 29 tiles, 29 x 4 parking slots
    t, h, i, l, k = 100, 256, 128, 4, 2
    segs = [20, 800, 800, (25 + 4) * 8 + 528, (25 + 4) * 4, 64 * l * 4, 116 * 16384, t * h * 2, 200 * i * 2,
            200 * h * 2, (25 + 4) * 8 + 528]
    assert _wrapper._workspace_bytes(t, h, i, l, k) == sum(-(-s // 256) * 256 for s in segs)


@pytest.mark.parametrize("layout", [EP8, TP8, {}])
def test_workspace_monotonic_and_formula(layout):
    w = CakeMxfp4MoEWrapper(**CONTRACT, **layout)
    ts = sorted({1, 2, 7, 8, 9, 63, 64, 65, 1000, 4095, 4096, 16384, 20000, *range(1, 20001, 97)})
    sizes = [w.get_workspace_size(t) for t in ts]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    for t, s in zip(ts, sizes):
        assert s == _wrapper._workspace_bytes(t, 7168, w.intermediate_shard, w.num_local_experts, 16)
        assert s % 256 == 0
    assert w.get_workspace_size(max_tokens=16384) == w.get_workspace_size(16384)


def test_workspace_extension_matches_python_formula():
    try:
        fn = _runtime.ext().mxfp4_moe_workspace_bytes
    except (ImportError, AttributeError):
        pytest.skip("the compiled extension (with mxfp4_moe_workspace_bytes) is not available here")
    for t in (1, 5, 8, 100, 337, 2689, 16384):
        for h, i, l, k in ((7168, 3072, 112, 16), (7168, 384, 896, 16), (256, 128, 8, 2)):
            assert fn(t, h, i, l, k) == _wrapper._workspace_bytes(t, h, i, l, k)


@pytest.mark.parametrize("kwargs,match", [
    ({}, "exactly one"), ({"num_tokens": 4, "max_tokens": 8}, "exactly one"),
    ({"num_tokens": 0}, "num_tokens"), ({"max_tokens": -1}, "max_tokens"), ({"num_tokens": 1.5}, "num_tokens"),
])
def test_workspace_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CakeMxfp4MoEWrapper(**CONTRACT).get_workspace_size(**kwargs)


# --- wrapper construction --------------------------------------------------------------------

def test_wrapper_defaults_and_layouts():
    w = CakeMxfp4MoEWrapper(**CONTRACT)
    assert (w.num_local_experts, w.local_expert_offset, w.intermediate_shard) == (896, 0, 3072)
    ep = CakeMxfp4MoEWrapper(**CONTRACT, **EP8)
    assert (ep.num_local_experts, ep.local_expert_offset, ep.intermediate_shard) == (112, 336, 3072)
    tp = CakeMxfp4MoEWrapper(**CONTRACT, **TP8)
    assert (tp.num_local_experts, tp.intermediate_shard) == (896, 384)
    assert CakeMxfp4MoEWrapper(**CONTRACT, sm_count=148).sm_count == 148
    if not torch.cuda.is_available():
        assert w.sm_count == _wrapper.HOST_ONLY_SM_COUNT == 132
        assert w.device == torch.device("cuda", 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(**EP8, **TP8), "cannot be combined"),
    (dict(hidden_size=7168 + 64), "hidden_size must be a multiple of 128"),
    (dict(intermediate_shard=3072 // 2 + 64), "intermediate_shard must be a multiple of 128"),
    (dict(intermediate_shard=1280), "multiple of intermediate_shard"),
    (dict(top_k=0), "top_k"), (dict(top_k=33), "top_k must be in"),
    (dict(num_experts=8, top_k=16), "num_experts must be in"), (dict(num_experts=1025), "num_experts must be in"),
    (dict(num_local_experts=112, local_expert_offset=800), "exceeds"),
    (dict(num_local_experts=897), "exceeds"),
    (dict(local_expert_offset=-1), "local_expert_offset"),
    (dict(num_local_experts=0), "num_local_experts"),
    (dict(hidden_size=True), "hidden_size"), (dict(intermediate_size=3072.0), "intermediate_size"),
    (dict(sm_count=0), "sm_count"), (dict(device="meta"), "CUDA device or the CPU"),
])
def test_wrapper_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CakeMxfp4MoEWrapper(**{**CONTRACT, **kwargs})


def test_repr_names_the_layout():
    assert "local_expert_offset=336" in repr(CakeMxfp4MoEWrapper(**CONTRACT, **EP8))


# --- plan(): refusals without a GPU ----------------------------------------------------------

def _aligned_bytes(n: int, align: int = 256) -> torch.Tensor:
    buf = torch.zeros(n + align, dtype=torch.uint8)
    off = (-buf.data_ptr()) % align
    return buf[off:off + n]


def _plan_args(t: int = 5, packed: bool = False) -> tuple[CakeMxfp4MoEWrapper, dict]:
    w = CakeMxfp4MoEWrapper(E, K, H, I, sm_count=132)
    g = torch.Generator().manual_seed(t)
    prepared = prepare_cake_mxfp4_weights(*_bank(E, H, I))
    ids = torch.randint(0, E, (t, K), generator=g, dtype=torch.int32)
    weights = torch.rand(t, K, generator=g).to(torch.bfloat16)
    a = dict(x=torch.randn(t, H, generator=g).to(torch.float8_e4m3fn),
             x_sf=torch.full((t, H // 32), 127, dtype=torch.uint8),
             topk_ids=ref.pack_routes(ids, weights) if packed else ids, topk_weights=None if packed else weights,
             w1=prepared["w1"], w1_sf=prepared["w1_sf"], w2=prepared["w2"], w2_sf=prepared["w2_sf"],
             beta=torch.full((E,), 4.0), linear_beta=torch.full((E,), 25.0),
             workspace=_aligned_bytes(w.get_workspace_size(t)), output=torch.empty(t, H, dtype=torch.bfloat16))
    return w, a


def _call(w: CakeMxfp4MoEWrapper, a: dict, **kw):
    return w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], a["w1"], a["w1_sf"], a["w2"], a["w2_sf"],
                  beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"], **kw)


def _set(**changes):
    return lambda a: a.update(changes)


def _with(name, fn):
    return lambda a: a.update({name: fn(a[name])})


_BAD_PLAN = {
    "beta None": (_set(beta=None), "beta is required"),
    "linear_beta None": (_set(linear_beta=None), "linear_beta is required"),
    "x dtype": (_with("x", lambda x: x.to(torch.bfloat16)), "x must have dtype"),
    "x 3-D": (_with("x", lambda x: x.view(1, *x.shape)), "x must be 2-D"),
    "x columns": (_with("x", lambda x: torch.cat([x.view(torch.uint8)] * 2, 1).view(torch.float8_e4m3fn)),
                  "hidden_size"),
    "x no tokens": (_with("x", lambda x: x[:0]), "num_tokens"),
    "x non-contiguous": (_with("x", lambda x: x.view(torch.uint8).t().contiguous().t().view(torch.float8_e4m3fn)),
                         "x must be contiguous"),
    "x_sf shape": (_with("x_sf", lambda s: s[:, :4].contiguous()), "x_sf must have shape"),
    "x_sf dtype": (_with("x_sf", lambda s: s.view(torch.float8_e8m0fnu)), "x_sf must have dtype"),
    "topk_ids dtype": (_with("topk_ids", lambda t: t.long()), "topk_ids must have dtype"),
    "topk_ids top_k": (_with("topk_ids", lambda t: t[:, :1].contiguous()), "topk_ids must have shape"),
    "topk_weights dtype": (_with("topk_weights", lambda t: t.half()), "topk_weights must have dtype"),
    "topk_weights tokens": (_with("topk_weights", lambda t: t[:2].contiguous()), "topk_weights must have shape"),
    "w1 shape": (_with("w1", lambda t: t[:, :128].contiguous()), "w1 must have shape"),
    "w1 experts": (_with("w1", lambda t: t[:4].contiguous()), "w1 must have shape"),
    "w1_sf dtype": (_with("w1_sf", lambda t: t.view(torch.int8)), "w1_sf must have dtype"),
    "w2 shape": (_with("w2", lambda t: t.transpose(1, 2).contiguous()), "w2 must have shape"),
    "w2_sf 2-D": (_with("w2_sf", lambda t: t[0]), "w2_sf must be 3-D"),
    "beta dtype": (_with("beta", lambda t: t.double()), "beta must have dtype"),
    "linear_beta length": (_with("linear_beta", lambda t: t[:3]), "linear_beta must have shape"),
    "workspace small": (_with("workspace", lambda t: t[:-1]), "workspace must hold"),
    "workspace 2-D": (_with("workspace", lambda t: t.view(1, -1)), "workspace must be 1-D"),
    "workspace misaligned": (_with("workspace", lambda t: _aligned_bytes(t.numel() + 16)[16:]), "256-byte aligned"),
    "output dtype": (_with("output", lambda t: t.float()), "output must have dtype"),
    "output shape": (_with("output", lambda t: t[:, :128].contiguous()), "output must have shape"),
    "output misaligned": (_with("output", lambda t: torch.empty(t.numel() + 4, dtype=t.dtype)[4:].view(t.shape)),
                          "output must be 16-byte aligned"),
    "output inside workspace": (lambda a: a.update(output=a["workspace"][256:256 + 2 * 5 * H].view(torch.bfloat16)
                                                   .view(5, H)), "overlap"),
    "x inside output": (lambda a: a.update(x=a["output"].view(torch.uint8).view(-1)[:5 * H].view(5, H)
                                           .view(torch.float8_e4m3fn)), "overlap"),
    "workspace over beta": (lambda a: a.update(beta=a["workspace"][:4 * E].view(torch.float32)), "overlap"),
}


@pytest.mark.parametrize("what", sorted(_BAD_PLAN))
def test_plan_refuses(what):
    change, match = _BAD_PLAN[what]
    w, a = _plan_args()
    change(a)
    with pytest.raises(ValueError, match=match):
        _call(w, a)


@pytest.mark.parametrize("packed", [False, True])
def test_plan_checks_the_device_last(packed):
    """Well-formed CPU tensors pass every other check and are refused for their device."""
    w, a = _plan_args(packed=packed)
    with pytest.raises(ValueError, match=r"x is on cpu, expected cuda:0"):
        _call(w, a)


def test_prepare_records_each_experts_largest_scale_code():
    bank = list(_bank(3, 256, 128, seed=5))
    for sf in (bank[1], bank[3]):
        sf.clamp_(max=127)
    bank[1][1, 7, 3] = 200   # w1_scale of expert 1
    bank[3][2, 0, 0] = 129   # w2_scale of expert 2
    p = prepare_cake_mxfp4_weights(*bank)
    for key, scale in (("w1_sf_max", bank[1]), ("w2_sf_max", bank[3])):
        got = p[key]
        assert got.dtype == torch.uint8 and got.shape == (3,) and got.is_contiguous()
        assert got.tolist() == [int(scale[e].max()) for e in range(3)]
    assert p["w1_sf_max"][1] == 200 and p["w2_sf_max"][2] == 129


def test_plan_checks_the_largest_scale_codes():
    w, a = _plan_args()
    prepared = prepare_cake_mxfp4_weights(*_bank(E, H, I))
    common = dict(beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    args = (a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"])
    one = {k: v for k, v in prepared.items() if k != "w2_sf_max"}
    with pytest.raises(ValueError, match="w1_sf_max.*w2_sf_max.*or neither"):
        w.plan(*args, one, **common)
    with pytest.raises(ValueError, match="w1_sf_max and w2_sf_max come together"):
        w.plan(*args, prepared["w1"], prepared["w1_sf"], prepared["w2"], prepared["w2_sf"],
               w1_sf_max=prepared["w1_sf_max"], **common)
    with pytest.raises(ValueError, match="either as the dict or as four tensors"):
        w.plan(*args, prepared, w1_sf_max=prepared["w1_sf_max"], w2_sf_max=prepared["w2_sf_max"], **common)
    with pytest.raises(ValueError, match=r"w1_sf_max must have shape \(8,\)"):
        w.plan(*args, {**prepared, "w1_sf_max": prepared["w1_sf_max"][:2]}, **common)
    with pytest.raises(ValueError, match="w2_sf_max must have dtype"):
        w.plan(*args, {**prepared, "w2_sf_max": prepared["w2_sf_max"].int()}, **common)
    with pytest.raises(ValueError, match="is on cpu"):   # well formed: refused only for the device
        w.plan(*args, prepared, **common)


def test_plan_accepts_the_prepared_dict():
    w, a = _plan_args()
    prepared = dict(w1=a["w1"], w1_sf=a["w1_sf"], w2=a["w2"], w2_sf=a["w2_sf"], layout="cake_mma_v3",
                    num_local_experts=E, hidden_size=H, intermediate_shard=I)
    common = dict(beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    with pytest.raises(ValueError, match="is on cpu"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, **common)
    with pytest.raises(ValueError, match="either as the dict or as four tensors"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, a["w1_sf"], **common)
    with pytest.raises(ValueError, match="layout"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], {**prepared, "layout": "canonical"}, **common)
    with pytest.raises(ValueError, match="intermediate_shard"):
        w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], {**prepared, "intermediate_shard": 256}, **common)


def test_plan_refused_during_capture(monkeypatch):
    w, a = _plan_args()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="captur"):
        _call(w, a)


# --- the binding contract, against a stand-in extension --------------------------------------

class _FakeBound:
    forms = "moe_route,fmt_mxfp8_dequantize,mxfp4_moe_gemm1_n8,mxfp4_moe_gemm2_n8,moe_finalize"
    split_width = False

    def __init__(self):
        self.streams = []

    def run(self, stream):
        self.streams.append(stream)


class _FakeExt:
    def __init__(self):
        self.calls = []

    def mxfp4_moe_plan(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return _FakeBound()


@pytest.fixture
def fake_ext(monkeypatch):
    """plan() with the device, SM-count and arch queries answered for CPU tensors and the
    extension replaced by a recorder."""
    ext = _FakeExt()
    monkeypatch.setattr(_runtime, "ext", lambda: ext)
    monkeypatch.setattr(_runtime, "require_served", lambda device, what: None)
    monkeypatch.setattr(_runtime, "stream_handle", lambda device: 1234)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"multi_processor_count": 132})())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    return ext


def _cpu_wrapper_args(packed: bool = False, t: int = 5):
    w, a = _plan_args(t=t, packed=packed)
    w.device = torch.device("cpu")
    return w, a


@pytest.mark.parametrize("packed,kind", [(False, 0), (True, 2)])
def test_plan_binding_call(fake_ext, packed, kind):
    w, a = _cpu_wrapper_args(packed=packed)
    plan = _call(w, a)
    (args, kwargs), = fake_ext.calls
    assert args[0].dtype == torch.uint8 and args[0].data_ptr() == a["x"].data_ptr()
    assert args[1] is a["x_sf"] and args[2] is a["topk_ids"] and args[3] is a["topk_weights"]
    assert args[4] == kind
    assert args[5:] == (a["w1"], a["w1_sf"], a["w2"], a["w2_sf"], a["beta"], a["linear_beta"], a["workspace"],
                        a["output"], None, None)   # positional weights: no largest scale codes
    assert kwargs == dict(num_tokens=5, hidden=H, inter=I, num_experts=E, num_local=E, local_offset=0, top_k=K,
                          gemm1_tile="n8_shortk", gemm2_tile="n8_shortk",   # H = 256, I = 128: both K short
                          tile_sync=False)                                  # 5 * 2 / 8 = 1.25 routes per expert
    assert isinstance(plan, Mxfp4MoEPlan)
    assert plan._plan.streams == [], "plan() enqueues nothing"
    assert plan.run() is a["output"] and plan._plan.streams == [1234]
    assert plan.num_tokens == 5 and plan.decision.block_n == 8 and "gemm1_n8" in plan.forms
    assert any(t is a["workspace"] for t in plan._keep) and any(t is a["w2"] for t in plan._keep)


def test_plan_binding_passes_the_dicts_largest_codes(fake_ext):
    w, a = _cpu_wrapper_args()
    prepared = prepare_cake_mxfp4_weights(*(t.clone() for t in _bank(E, H, I)))
    w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, beta=a["beta"],
           linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    (args, _), = fake_ext.calls
    assert args[5] is prepared["w1"] and args[8] is prepared["w2_sf"]
    assert args[13] is prepared["w1_sf_max"] and args[14] is prepared["w2_sf_max"]
    # the four tensors positionally, the largest codes as keywords: the same binding
    w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared["w1"], prepared["w1_sf"], prepared["w2"],
           prepared["w2_sf"], beta=a["beta"], linear_beta=a["linear_beta"], workspace=a["workspace"],
           output=a["output"], w1_sf_max=prepared["w1_sf_max"], w2_sf_max=prepared["w2_sf_max"])
    args2, _ = fake_ext.calls[-1]
    assert args2[13] is prepared["w1_sf_max"] and args2[14] is prepared["w2_sf_max"]


def test_plan_binding_fp32_weights_and_tile(fake_ext):
    w, a = _cpu_wrapper_args(t=400)   # 400 * 2 / 8 = 100 routes per expert -> prefill (BN 128)
    a["topk_weights"] = a["topk_weights"].float()
    plan = _call(w, a)
    (args, kwargs), = fake_ext.calls
    # I = 128 <= RESIDENT_K: GEMM2 keeps its token rows resident
    assert args[4] == 1 and (kwargs["gemm1_tile"], kwargs["gemm2_tile"]) == ("wg128x4", "wg128x4_rb")
    assert plan.decision.path == "prefill"


def test_plan_tile_sync(fake_ext):
    w, a = _cpu_wrapper_args(t=1)   # 1 * 2 / 8 = 0.25 routes per expert: the table syncs per tile
    plan = _call(w, a)
    assert fake_ext.calls[-1][1]["tile_sync"] is True and plan.decision.tile_sync
    plan = _call(w, a, tile_sync=False)
    assert fake_ext.calls[-1][1]["tile_sync"] is False and not plan.decision.tile_sync
    with pytest.raises(ValueError, match="tile_sync needs an mma.sync"):
        _call(w, a, tile="wg64x4", tile_sync=True)


def test_plan_forced_tile(fake_ext):
    w, a = _cpu_wrapper_args(t=200)
    plan = _call(w, a, tile="n32")
    (_, kwargs), = fake_ext.calls
    assert (kwargs["gemm1_tile"], kwargs["gemm2_tile"]) == ("n32", "n32")
    assert plan.decision.path == "forced" and plan.decision.block_n == 32


def test_plan_refuses_an_sm90_tile_on_another_arch(fake_ext):
    w, a = _cpu_wrapper_args(t=200)
    w.capability = (10, 0)
    torch.cuda.get_device_capability = lambda device: (10, 0)  # fake_ext's monkeypatch restores it
    with pytest.raises(ValueError, match="sm_90a form"):
        _call(w, a, tile="wg128")
    assert _call(w, a) is not None and fake_ext.calls[-1][1]["gemm1_tile"] == "n64"


def test_plan_refuses_another_capability(fake_ext):
    w, a = _cpu_wrapper_args()
    w.capability = (10, 0)
    with pytest.raises(RuntimeError, match="compute capability"):
        _call(w, a)
    assert fake_ext.calls == []


def test_plan_refuses_another_sm_count(fake_ext):
    w, a = _cpu_wrapper_args()
    w.sm_count = 148
    with pytest.raises(RuntimeError, match="132 SMs"):
        _call(w, a)
    assert fake_ext.calls == []


def test_check_mode_finds_stale_largest_codes(fake_ext, monkeypatch):
    w, a = _cpu_wrapper_args()
    bank = [t.clone() for t in _bank(E, H, I)]
    for sf in (bank[1], bank[3]):
        sf.clamp_(max=124)
    prepared = prepare_cake_mxfp4_weights(*bank)
    plan = w.plan(a["x"], a["x_sf"], a["topk_ids"], a["topk_weights"], prepared, beta=a["beta"],
                  linear_beta=a["linear_beta"], workspace=a["workspace"], output=a["output"])
    monkeypatch.setenv("CAKE_MOE_CHECK", "1")
    plan.run()                                   # codes and their largest values agree
    prepared["w2_sf"][3, 5, 1] = 200             # new scales written in place, w2_sf_max not
    prepared["w2_sf"][6, 0, 0] = 129
    runs = len(plan._plan.streams)
    with pytest.raises(ValueError, match=r"w2_sf_max says <= 128 for 2 expert\(s\)"):
        plan.run()
    assert len(plan._plan.streams) == runs, "nothing is launched after a failed check"
    prepared["w2_sf_max"].copy_(prepared["w2_sf"].reshape(E, -1).amax(dim=1))
    plan.run()                                   # the largest codes written too: accepted


@pytest.mark.parametrize("packed", [False, True])
def test_check_mode_counts_bad_ids(fake_ext, monkeypatch, packed):
    w, a = _cpu_wrapper_args(packed=packed)
    plan = _call(w, a)
    monkeypatch.setenv("CAKE_MOE_CHECK", "1")
    plan.run()                                   # every id valid
    bad = torch.tensor([E, -1], dtype=torch.int32)
    if packed:
        a["topk_ids"][0] = ref.pack_routes(bad, torch.ones(2))
    else:
        a["topk_ids"][0] = bad
    runs = len(plan._plan.streams)
    with pytest.raises(ValueError, match=r"2 expert id\(s\) outside \[0, 8\)"):
        plan.run()
    assert len(plan._plan.streams) == runs, "nothing is launched after a failed check"
    monkeypatch.delenv("CAKE_MOE_CHECK")
    plan.run()                                   # without the debug mode the kernels drop them


# --- CPU plans and the torch.library op ------------------------------------------------------

def _cpu_layer(name: str, t: int, *, regime: str = "balanced", weights_dtype=torch.float32, seed: int = 3):
    """(plan, case, bank) of a general geometry on a CPU wrapper (the reference runs)."""
    from .mxfp4_moe_cases import GENERAL, make_case, random_weights
    geom = GENERAL[name]
    bank = random_weights(geom, seed=seed, device="cpu")
    case = make_case(geom, t, regime, seed=seed + 1, device="cpu", weights_dtype=weights_dtype)
    args, kw = geom.wrapper_args()
    moe = CakeMxfp4MoEWrapper(*args, **kw, device="cpu")
    prepared = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
    out = torch.full((t, geom.hidden), float("nan"), dtype=torch.bfloat16)
    plan = moe.plan(case.x, case.x_sf, case.topk_ids, case.topk_weights, prepared, beta=case.beta,
                    linear_beta=case.linear_beta, workspace=torch.empty(moe.get_workspace_size(t), dtype=torch.uint8),
                    output=out)
    return plan, case, bank


@pytest.mark.parametrize("name,regime,weights_dtype", [("h256_e8_k2", "balanced", torch.float32),
                                                        ("h384_ep_k8", "oob", torch.bfloat16),
                                                        ("h256_tp_k4", "dup", None)])
def test_cpu_plan_runs_the_reference(name, regime, weights_dtype):
    """A CPU wrapper's plan takes the same arguments and checks, and run() writes the FP64
    reference of its bound tensors (expert parallel, tensor parallel, packed routes)."""
    from .mxfp4_moe_cases import reference
    plan, case, bank = _cpu_layer(name, 6, regime=regime, weights_dtype=weights_dtype)
    assert plan.forms == "cpu-reference" and plan.output.isnan().all(), "plan() on CPU runs nothing"
    assert torch.equal(plan.run(), reference(case, bank))
    case.topk_ids.copy_(case.topk_ids.flip(0))                  # new routes written in place
    assert torch.equal(plan.run(), reference(case, bank))


def test_cpu_wrapper_refuses_other_devices():
    with pytest.raises(ValueError, match="CUDA device or the CPU"):
        CakeMxfp4MoEWrapper(E, K, H, I, device="meta")
    plan, case, _ = _cpu_layer("h256_e8_k2", 3)
    assert plan.run().device.type == "cpu"


def test_run_with_copies_what_is_not_bound():
    """The op's path: tensors other than the bound ones are copied in (and the output out)."""
    plan, case, bank = _cpu_layer("h256_e8_k2", 4)
    want = plan.run().clone()
    other = torch.empty_like(plan.output)
    x_bytes = case.x.view(torch.uint8)
    saved = x_bytes.clone()
    x_bytes.zero_()                                             # the bound x now holds zeros
    got = plan.run_with(saved.clone(), case.x_sf.clone(), case.topk_ids.clone(), case.topk_weights.clone(), other)
    assert got is other and torch.equal(other, want) and torch.equal(x_bytes, saved)
    with pytest.raises(ValueError, match="topk_ids must match the bound tensor"):
        plan.run_with(saved, case.x_sf, case.topk_ids[:2], case.topk_weights, other)
    with pytest.raises(ValueError, match="topk_weights: the plan was made with it"):
        plan.run_with(saved, case.x_sf, case.topk_ids, None, other)


@pytest.mark.parametrize("weights_dtype", [torch.float32, None])
def test_torch_library_opcheck_on_cpu(weights_dtype):
    plan, case, _ = _cpu_layer("h256_e8_k2", 5, weights_dtype=weights_dtype)
    torch.library.opcheck(torch.ops.cake_moe.mxfp4_moe_run.default,
                          (plan._number, case.x.view(torch.uint8), case.x_sf, case.topk_ids, case.topk_weights,
                           plan.output))


def test_compiled_run_fullgraph_on_cpu():
    """torch.compile(fullgraph=True) of a function calling plan.run(): the same bits as eager,
    and new routes written into the bound tensor are picked up."""
    from .mxfp4_moe_cases import reference
    plan, case, bank = _cpu_layer("h256_e8_k2", 5)

    def step(p):
        return p.run().float() * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(plan), reference(case, bank).float() * 2)
    case.topk_ids.copy_(case.topk_ids.roll(1, 0))
    assert torch.equal(compiled(plan), reference(case, bank).float() * 2)


def test_a_collected_plan_is_forgotten():
    plan, case, _ = _cpu_layer("h256_e8_k2", 2)
    number, args = plan._number, (case.x.view(torch.uint8), case.x_sf, case.topk_ids, case.topk_weights)
    out = plan.output
    del plan
    import gc
    gc.collect()
    with pytest.raises(ValueError, match=f"no live Mxfp4MoEPlan has number {number}"):
        torch.ops.cake_moe.mxfp4_moe_run(number, *args, out)
