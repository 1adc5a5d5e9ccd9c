"""CPU test of the family-B benchmark's naive PyTorch layer, the peer its speed-ups are quoted
against: it must compute the layer the FP64 reference computes (up to the BF16 intermediate it
keeps where the layer requantizes to MXFP8), with routes to other ranks' experts and ids out of
range contributing nothing. The GPU module times it beside ours."""
from __future__ import annotations

import pytest
import torch

from cake_moe.bench import mxfp4_moe as bench_moe
from cake_moe.bench import timing
from cake_moe.reference import moe as ref

pytestmark = pytest.mark.skipif(timing.torch_grouped_mm() is None,
                                reason="this torch has no torch._grouped_mm, the naive layer's GEMM")

E, K, H, I, L, T = 12, 4, 128, 64, 5, 9


def _layer(offset: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    bank = bench_moe.random_bank(L, I, gen, h=H)
    beta, linear_beta = bench_moe.random_situ(L, gen)
    x, x_sf, ids, weights = bench_moe.random_inputs(T, L, offset, gen, h=H, e=E, k=K)
    ids[0, 0], ids[1, 1], ids[2, 2] = -1, E, 2**31 - 1       # out of range: contribute nothing
    ids[3] = (offset + L) % E                                 # every route on another rank's expert
    w13 = bench_moe.dequantize_bf16(bank["w1"], bank["w1_scale"])
    w2 = bench_moe.dequantize_bf16(bank["w2"], bank["w2_scale"])
    want = ref.mxfp4_situ_moe(x, x_sf, ids, weights, bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"],
                              beta=beta, linear_beta=linear_beta, num_experts=E, num_local_experts=L,
                              local_expert_offset=offset)
    return (x, x_sf, ids, weights, w13, w2, beta, linear_beta), want.double()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("offset", [0, 3, 7])
def test_naive_layer_is_the_reference_layer(offset):
    args, want = _layer(offset, seed=11 + offset)
    got = bench_moe.naive_layer(*args, num_experts=E, offset=offset)
    assert got.dtype == torch.bfloat16 and got.shape == (T, H)
    assert torch.count_nonzero(got[3]) == 0 and torch.count_nonzero(want[3]) == 0
    # the BF16 intermediate against the requantized one: a few percent, as on the GPU
    assert _rel(got, want) < 0.06
    # and the check can fail: the same layer with its experts one place off is far from it
    assert _rel(bench_moe.naive_layer(*args, num_experts=E, offset=offset + 1), want) > 0.5
