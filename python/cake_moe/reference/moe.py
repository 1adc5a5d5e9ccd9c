"""FP64 reference of the routed MoE layers (SPEC §4, §5, §7): routing application, SiTU, the
MXFP8 requantization of the intermediate, and the deterministic slot-order finalize.

It reproduces every quantization step of the kernels (the MXFP4 weights and MXFP8 activations
are dequantized exactly; the intermediate is requantized to MXFP8 with the round-up rule from
its FP32 value; each route's FC2 row is rounded once to BF16) and computes everything else in
FP64. Kernels are compared with it under relative-RMS budgets; ``finalize`` alone is also
usable for bitwise checks (see its note).
"""
from __future__ import annotations

import torch

from . import formats as fmt

SITU_BETA = 4.0
SITU_LINEAR_BETA = 25.0


def situ(gate: torch.Tensor, up: torch.Tensor, beta, linear_beta) -> torch.Tensor:
    """SiTU(g, u) = (beta * tanh(g / beta) * sigmoid(g)) * (lbeta * tanh(u / lbeta))."""
    return (beta * torch.tanh(gate / beta) * torch.sigmoid(gate)) * (linear_beta * torch.tanh(up / linear_beta))


def swiglu_step(gate: torch.Tensor, up: torch.Tensor, limit) -> torch.Tensor:
    """SwiGLUStep(g, u) = min(silu(g), limit) * clamp(u, -limit, limit)."""
    silu = gate * torch.sigmoid(gate)
    return torch.minimum(silu, torch.as_tensor(limit, dtype=gate.dtype)) * torch.maximum(
        torch.minimum(up, torch.as_tensor(limit, dtype=up.dtype)), -torch.as_tensor(limit, dtype=up.dtype))


def pack_routes(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """The packed int32 route form: (expert_id << 16) | bf16_bits(weight)."""
    bits = topk_weights.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    return (topk_ids.to(torch.int32) << 16) | bits


def unpack_routes(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids int32, weights bf16) of packed routes."""
    ids = packed >> 16
    weights = (packed & 0xFFFF).to(torch.int16).view(torch.bfloat16)
    return ids, weights


def local_slot_experts(topk_ids: torch.Tensor, num_experts: int, num_local_experts: int,
                       local_expert_offset: int) -> torch.Tensor:
    """Local expert index per route, or -1 where the route contributes nothing (another rank's
    expert, or an id outside [0, E))."""
    ids = topk_ids.long()
    local = ids - local_expert_offset
    ok = (ids >= 0) & (ids < num_experts) & (local >= 0) & (local < num_local_experts)
    return torch.where(ok, local, torch.full_like(local, -1))


def route_plan(local: torch.Tensor, num_local_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bookkeeping a routing kernel produces from local expert ids [T, k] (-1: no route).

    Returns (counts [L] int32, offsets [L + 1] int32 with a leading zero, routes [R] int32) where
    routes lists the flat route index t * k + slot of every valid route, grouped by expert in
    expert order and, inside an expert, in increasing (token, slot) order: a deterministic,
    stable order that the grouped GEMMs of the prefill path consume as gathered rows.
    """
    flat = local.reshape(-1).long()
    valid = flat >= 0
    counts = torch.bincount(flat[valid], minlength=num_local_experts).to(torch.int32)
    offsets = torch.zeros(num_local_experts + 1, dtype=torch.int32, device=local.device)
    offsets[1:] = counts.cumsum(0)
    idx = torch.nonzero(valid).reshape(-1)
    order = torch.sort(flat[idx], stable=True).indices
    return counts, offsets, idx[order].to(torch.int32)


def finalize(rows: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """out[t] = BF16(sum over slots k = 0..top_k-1 in order of fma(row[t, k], weight[t, k], acc)).

    rows [T, k, H] (already rounded to BF16), weights [T, k] (BF16 or FP32), valid [T, k] bool.
    The FP32 FMA chain is emulated in FP64: the product of two FP32 values is exact there and the
    sum is then rounded to FP32, which matches a fused FMA except in rare double-rounding ties.
    A token with no valid route gets exact zeros.
    """
    t, k, h = rows.shape
    acc = torch.zeros(t, h, dtype=torch.float32, device=rows.device)
    r = rows.to(torch.bfloat16).to(torch.float64)
    w = weights.to(torch.float32).to(torch.float64)
    for slot in range(k):
        term = r[:, slot] * w[:, slot, None]
        summed = (term + acc.to(torch.float64)).to(torch.float32)
        acc = torch.where(valid[:, slot, None], summed, acc)
    return acc.to(torch.bfloat16)


def situ_intermediate(x: torch.Tensor, w1: torch.Tensor, beta, linear_beta) -> torch.Tensor:
    """SiTU of one expert's FC1 for rows x [n, H] and the dequantized w1 [2I, H] (rows: up then
    gate), in x's precision: the value that is rounded to FP32 and requantized to MXFP8."""
    hid = x @ w1.T
    i = w1.shape[0] // 2
    return situ(hid[:, i:], hid[:, :i], beta, linear_beta)


def mxfp4_situ_moe(x: torch.Tensor, x_sf: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor | None,
                   w1: torch.Tensor, w1_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                   beta: torch.Tensor, linear_beta: torch.Tensor, num_experts: int,
                   num_local_experts: int | None = None, local_expert_offset: int = 0) -> torch.Tensor:
    """Family B layer (MXFP4 weights x MXFP8 activations, SiTU), canonical weight layout.

    x [T, H] float8_e4m3fn with x_sf [T, H/32] UE8M0; topk_ids [T, k] int32 global ids;
    topk_weights [T, k] BF16/FP32, or None when topk_ids holds packed routes; w1 [L, 2*I, H/2]
    MXFP4 (rows: up then gate) with w1_scale [L, 2*I, H/32]; w2 [L, H, I/2] with w2_scale
    [L, H, I/32]; beta, linear_beta FP32 [L]. With an intermediate shard (MoE TP) pass the
    rank's shard as I: the output is that rank's partial sum. Returns [T, H] BF16.
    """
    if topk_weights is None:
        topk_ids, topk_weights = unpack_routes(topk_ids)
    num_local = w1.shape[0] if num_local_experts is None else num_local_experts
    t, h = x.shape
    xd = fmt.dequantize_mx(x.view(torch.uint8).view(torch.float8_e4m3fn), x_sf, "mxfp8").double()
    local = local_slot_experts(topk_ids, num_experts, num_local, local_expert_offset)
    k = topk_ids.shape[1]
    rows = torch.zeros(t, k, h, dtype=torch.bfloat16, device=x.device)
    for e in range(num_local):
        sel = (local == e).nonzero(as_tuple=False)  # (token, slot) pairs routed to expert e
        if sel.numel() == 0:
            continue
        w1d = fmt.dequantize_mx(w1[e], w1_scale[e], "mxfp4").double()   # [2I, H]
        w2d = fmt.dequantize_mx(w2[e], w2_scale[e], "mxfp4").double()   # [H, I]
        act = situ_intermediate(xd[sel[:, 0]], w1d, float(beta[e]), float(linear_beta[e])).float()
        aq, asf = fmt.quantize_mx(act, "mxfp8")                           # MXFP8 requant, round-up
        ad = fmt.dequantize_mx(aq, asf, "mxfp8").double()
        rows[sel[:, 0], sel[:, 1]] = (ad @ w2d.T).to(torch.bfloat16)      # one rounding per route row
    return finalize(rows, topk_weights, local >= 0)
