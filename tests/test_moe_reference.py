"""CPU tests of the routed-MoE reference (SPEC §4, §5, §7): routing application, SiTU, finalize."""
from __future__ import annotations

import math

import pytest
import torch

from cake_moe.reference import formats as fmt
from cake_moe.reference import moe


def _layer(t=6, h=64, i=64, e=4, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    xq, xsf = fmt.quantize_mx(x, "mxfp8")
    w1q, w1s = fmt.quantize_mx(torch.randn(e, 2 * i, h, generator=g) * 0.1, "mxfp4")
    w2q, w2s = fmt.quantize_mx(torch.randn(e, h, i, generator=g) * 0.1, "mxfp4")
    w1s, w2s = w1s.reshape(e, 2 * i, h // 32), w2s.reshape(e, h, i // 32)  # canonical [L, rows, K/32]
    ids = torch.randint(0, e, (t, k), generator=g, dtype=torch.int32)
    weights = torch.rand(t, k, generator=g).to(torch.bfloat16)
    beta = torch.full((e,), moe.SITU_BETA)
    lbeta = torch.full((e,), moe.SITU_LINEAR_BETA)
    return dict(x=xq, x_sf=xsf, topk_ids=ids, topk_weights=weights, w1=w1q, w1_scale=w1s, w2=w2q, w2_scale=w2s,
                beta=beta, linear_beta=lbeta, num_experts=e)


def test_situ_matches_its_formula_and_defaults():
    g, u = torch.tensor([-3.0, 0.0, 0.5, 9.0], dtype=torch.float64), torch.tensor([2.0, -1.0, 30.0, 0.0],
                                                                                 dtype=torch.float64)
    got = moe.situ(g, u, 4.0, 25.0)
    for gi, ui, yi in zip(g.tolist(), u.tolist(), got.tolist()):
        want = (4 * math.tanh(gi / 4) / (1 + math.exp(-gi))) * (25 * math.tanh(ui / 25))
        assert yi == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_swiglu_step_clamps():
    y = moe.swiglu_step(torch.tensor([10.0, -10.0]), torch.tensor([100.0, -100.0]), 7.0)
    assert y.tolist() == pytest.approx([7.0 * 7.0, (-10.0 * torch.sigmoid(torch.tensor(-10.0)).item()) * -7.0])


def test_packed_routes_round_trip():
    ids = torch.tensor([[0, 895, 17]], dtype=torch.int32)
    w = torch.tensor([[0.5, -1.25, 3e-3]], dtype=torch.bfloat16)
    i2, w2 = moe.unpack_routes(moe.pack_routes(ids, w))
    assert torch.equal(i2, ids) and torch.equal(w2, w)


def test_local_experts_ep_and_out_of_range():
    ids = torch.tensor([[336, 447, 448, 335, -1, 5000]], dtype=torch.int32)
    local = moe.local_slot_experts(ids, num_experts=896, num_local_experts=112, local_expert_offset=336)
    assert local.tolist() == [[0, 111, -1, -1, -1, -1]]


def test_route_plan_is_stable_and_grouped():
    local = torch.tensor([[2, 0, -1], [0, 2, 2], [-1, -1, 1]])
    counts, offsets, routes = moe.route_plan(local, num_local_experts=4)
    assert counts.tolist() == [2, 1, 3, 0]
    assert offsets.tolist() == [0, 2, 3, 6, 6]
    # expert 0: routes (0,1)=1, (1,0)=3; expert 1: (2,2)=8; expert 2: (0,0)=0, (1,1)=4, (1,2)=5
    assert routes.tolist() == [1, 3, 8, 0, 4, 5]


def test_finalize_slot_order_bf16_and_empty_tokens():
    rows = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]], dtype=torch.bfloat16)
    w = torch.tensor([[0.5, 0.25], [1.0, 1.0]])
    valid = torch.tensor([[True, True], [False, False]])
    out = moe.finalize(rows, w, valid)
    assert out.dtype == torch.bfloat16 and out[0].tolist() == [1.25, 2.0]
    assert torch.equal(out[1], torch.zeros(2, dtype=torch.bfloat16))
    # the order is the slots': 2^24 + 1 rounds back to 2^24 in FP32, so the chain ends at 0 (the
    # reverse order would give 1)
    big = torch.tensor([[[2.0**24], [1.0], [-2.0**24]]], dtype=torch.bfloat16)
    out = moe.finalize(big, torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool))
    assert out.item() == 0.0


def test_layer_matches_a_direct_fp64_computation():
    """The layer against a token-by-token computation of SPEC §7's steps: FP64 GEMM1, SiTU in
    FP64 rounded to FP32, MXFP8 requantization of the intermediate, FP64 GEMM2 rounded to a BF16
    route row, the FP32 slot-order sum. Without the requantization it is ~2e-2 away."""
    p = _layer()
    got = moe.mxfp4_situ_moe(**p)
    xd = fmt.dequantize_mx(p["x"], p["x_sf"], "mxfp8").double()
    want = torch.zeros(xd.shape, dtype=torch.float32)
    plain = torch.zeros(xd.shape, dtype=torch.float64)      # the same without requantization
    for t in range(xd.shape[0]):
        for s in range(p["topk_ids"].shape[1]):
            e = int(p["topk_ids"][t, s])
            w1 = fmt.dequantize_mx(p["w1"][e], p["w1_scale"][e], "mxfp4").double()
            w2 = fmt.dequantize_mx(p["w2"][e], p["w2_scale"][e], "mxfp4").double()
            hdn = w1 @ xd[t]
            i = hdn.shape[0] // 2
            a = moe.situ(hdn[i:], hdn[:i], 4.0, 25.0).float()
            aq, asf = fmt.quantize_mx(a[None], "mxfp8")
            row = (w2 @ fmt.dequantize_mx(aq, asf, "mxfp8")[0].double()).to(torch.bfloat16)
            weight = float(p["topk_weights"][t, s].float())
            want[t] = (row.double() * weight + want[t].double()).float()
            plain[t] += weight * (w2 @ a.double())
    want = want.to(torch.bfloat16)
    err = (got.double() - want.double()).norm() / want.double().norm()
    assert err < 1e-3, err                  # measured 0: the same roundings at the same points
    assert (got.double() - plain).norm() / plain.norm() > 5e-3   # the requantization is there


def test_packed_form_all_remote_and_duplicates():
    p = _layer(seed=1)
    base = moe.mxfp4_situ_moe(**p)
    packed = dict(p, topk_ids=moe.pack_routes(p["topk_ids"], p["topk_weights"]), topk_weights=None)
    assert torch.equal(moe.mxfp4_situ_moe(**packed), base)
    remote = dict(p, num_experts=8, num_local_experts=4, local_expert_offset=4)
    assert not moe.mxfp4_situ_moe(**remote).any()  # every route is another rank's: exact zeros
    dup = dict(p)
    dup["topk_ids"] = p["topk_ids"].clone()
    dup["topk_ids"][:, 1] = dup["topk_ids"][:, 0]
    dup["topk_weights"] = p["topk_weights"].clone()
    # a duplicated expert contributes once per slot: slots 0 and 1 equal, slot 2 weighted 0
    dup["topk_weights"][:, 1] = dup["topk_weights"][:, 0]
    dup["topk_weights"][:, 2] = 0
    one = dict(p, topk_ids=p["topk_ids"][:, :1].contiguous(), topk_weights=p["topk_weights"][:, :1].contiguous())
    two = moe.mxfp4_situ_moe(**dup).double()
    single = moe.mxfp4_situ_moe(**one).double()
    assert torch.equal(two, 2 * single)     # doubling is exact in the FP32 chain and the BF16 rounding


def test_tensor_parallel_shards_sum_to_the_full_layer():
    p = _layer(i=128, seed=2)
    full = moe.mxfp4_situ_moe(**p).double()
    i = 128
    parts = []
    for r in range(2):  # two ranks of I_shard = 64 (MXFP8 blocks of 32 never straddle shards)
        rows = torch.cat([torch.arange(r * 64, (r + 1) * 64), i + torch.arange(r * 64, (r + 1) * 64)])
        shard = dict(p, w1=p["w1"][:, rows], w1_scale=p["w1_scale"][:, rows],
                     w2=p["w2"][:, :, r * 32:(r + 1) * 32].contiguous(),
                     w2_scale=p["w2_scale"][:, :, r * 2:(r + 1) * 2].contiguous())
        parts.append(moe.mxfp4_situ_moe(**shard).double())
    # only the BF16 roundings of route rows and outputs differ (measured 3.7e-3); a 2.5% error on
    # one shard's partial sum must fail the budget
    def off(a):
        return float((a + parts[1] - full).norm() / full.norm())
    assert off(parts[0]) < 6e-3
    assert off(parts[0] * 1.025) > 6e-3
