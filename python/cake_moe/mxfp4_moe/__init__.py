"""Family B: MXFP4-weight x MXFP8-activation routed MoE with the SiTU activation (SPEC §7).

One layer: the MXFP8 tokens [T, H] are routed to their top_k experts, multiplied by the
expert's MXFP4 ``w1`` (up and gate, FP32 accumulation), passed through
SiTU(gate, up; beta, linear_beta), requantized to MXFP8, multiplied by ``w2``, and each route's
BF16 row is summed per token in slot order with its routing weight (bitwise repeatable).
Expert parallel (``num_local_experts`` / ``local_expert_offset``) or MoE tensor parallel
(``intermediate_shard``) layouts are served; ids outside [0, E) contribute nothing.

>>> weights = prepare_cake_mxfp4_weights(w1, w1_scale, w2, w2_scale)     # once, pure torch
>>> moe = CakeMxfp4MoEWrapper(num_experts, top_k, hidden_size, intermediate_size)
>>> workspace = torch.empty(moe.get_workspace_size(max_tokens=T), dtype=torch.uint8, device="cuda")
>>> plan = moe.plan(x, x_sf, topk_ids, topk_weights, weights, beta=beta, linear_beta=linear_beta,
...                 workspace=workspace, output=out)                       # outside graph capture
>>> plan.run()                                                             # graph-capturable

The kernel layout of the weights and the tile-form table are described in docs/mxfp4_moe.md;
the FP64 reference is ``cake_moe.reference.moe.mxfp4_situ_moe`` (canonical weights).
"""
from __future__ import annotations

from ._decide import PlanDecision
from ._plan import Mxfp4MoEPlan
from ._prepare import prepare_cake_mxfp4_weights, unprepare_cake_mxfp4_weights
from ._wrapper import CakeMxfp4MoEWrapper

__all__ = ["prepare_cake_mxfp4_weights", "unprepare_cake_mxfp4_weights", "CakeMxfp4MoEWrapper", "Mxfp4MoEPlan",
           "PlanDecision"]
