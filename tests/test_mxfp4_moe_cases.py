"""CPU checks of the family-B test data (tests/mxfp4_moe_cases.py): the routing regimes have the
properties the GPU tests rely on, and making out-of-range slots inert leaves the FP64
reference's output unchanged bit for bit (what the GPU tests then demand of the kernels)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from cake_moe.bench.mxfp4_moe import W_SCALE_CODES
from cake_moe.reference import moe as ref

from .mxfp4_moe_cases import (CONTRACT, GENERAL, REGIMES, bad_slots, local_routes, make_case, random_weights,
                              reference, regime_applies, routes, without_slots)

GEOMS = {**CONTRACT, **GENERAL}


@pytest.mark.parametrize("name", sorted(GEOMS))
@pytest.mark.parametrize("regime", REGIMES)
def test_regime_properties(name, regime):
    geom = GEOMS[name]
    if not regime_applies(geom, regime):
        with pytest.raises(ValueError):
            routes(geom, 5, regime, device="cpu")
        return
    ids, w = routes(geom, 37, regime, device="cpu", extreme_ids=True)
    assert ids.dtype == torch.int32 and ids.shape == (37, geom.top_k) and w.dtype == torch.float32
    assert torch.allclose(w.sum(dim=1), torch.ones(37))
    local = local_routes(geom, ids)
    n_local = (local >= 0).sum(dim=1)
    distinct = [len(set(row)) == geom.top_k for row in ids.tolist()]
    if regime == "remote":
        assert not (n_local > 0).any() and not bad_slots(geom, ids).any()
    elif regime == "oob":
        assert bad_slots(geom, ids).any()
    else:
        assert (n_local >= 1).all(), "every token keeps a local route"
        assert not bad_slots(geom, ids).any()
    if regime in ("balanced", "hot", "zipf", "remote"):
        assert all(distinct)
    if regime == "dup":
        assert not all(distinct)
    if regime == "hot":
        assert (ids[:, 0] == geom.offset + geom.local // 3).all()


def test_weights_are_codes_in_range():
    bank = random_weights(GENERAL["h512_e40_k5"], device="cpu")
    lo, hi = W_SCALE_CODES
    for key in ("w1_scale", "w2_scale"):
        assert bank[key].min() >= lo and bank[key].max() <= hi
    assert bank["w1"].shape == (40, 512, 256) and bank["w2"].shape == (40, 512, 128)
    assert len(bank["w1"].unique()) == 256


@pytest.mark.parametrize("name", ["h384_ep_k8", "h256_tp_k4"])
@pytest.mark.parametrize("packed", [False, True])
def test_inert_slots_leave_the_reference_bitwise_unchanged(name, packed):
    geom = GEOMS[name]
    bank = random_weights(geom, device="cpu")
    case = make_case(geom, 21, "oob", device="cpu", weights_dtype=None if packed else torch.float32,
                     extreme_ids=not packed)
    ids, w = ref.unpack_routes(case.topk_ids) if packed else (case.topk_ids, case.topk_weights)
    drop = bad_slots(geom, ids)
    assert drop.any()
    ids2, w2 = without_slots(geom, ids, w, drop)
    assert not bad_slots(geom, ids2).any()
    clean = (dataclasses.replace(case, topk_ids=ref.pack_routes(ids2, w2)) if packed
             else dataclasses.replace(case, topk_ids=ids2, topk_weights=w2))
    got = reference(case, bank)
    assert got.float().abs().sum() > 0
    assert torch.equal(reference(clean, bank), got)
