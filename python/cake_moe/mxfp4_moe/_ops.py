"""The MXFP4 MoE layer as a ``torch.library`` op, and the plan that runs the reference on CPU.

``Mxfp4MoEPlan.run()`` (``_plan.py``) calls the extension directly in eager mode (no dispatcher
on the hot path). Under ``torch.compile`` it becomes the op ``cake_moe::mxfp4_moe_run(plan, x,
x_sf, topk_ids, topk_weights, output)``: ``plan`` is the plan's registry number, the tensors are
the ones it bound (``x`` as its uint8 bytes), and the op mutates ``output`` only. A compiler may
hand the op other tensors with the same values (a functionalized copy, a CUDA-graph static
input): the op copies such inputs into the bound buffers before the run and the bound output
into the given one after it, so the result never depends on which buffers the compiled graph
passes.
"""
from __future__ import annotations

import itertools
import weakref

from .. import _library
from ..reference import moe as ref
from ._prepare import LAYOUT, unprepare_cake_mxfp4_weights

_plans: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_numbers = itertools.count(1)


def register(plan) -> int:
    """A number for ``plan`` that the op finds it by, for as long as the plan lives."""
    number = next(_numbers)
    _plans[number] = plan
    return number


class ReferencePlan:
    """Stands in for the extension's plan when the wrapper's device is the CPU: ``run`` writes
    the FP64 reference of the layer (``cake_moe.reference.moe.mxfp4_situ_moe``) for the bound
    tensors into the bound output. The canonical weights are recovered from the bound prepared
    ones at each run, so weights written in place are picked up as by the GPU plan."""

    forms = "cpu-reference"

    def __init__(self, *, x, x_sf, topk_ids, topk_weights, w1, w1_sf, w2, w2_sf, beta, linear_beta, output,
                 num_experts: int, num_local_experts: int, local_expert_offset: int):
        self._prepared = dict(layout=LAYOUT, w1=w1, w1_sf=w1_sf, w2=w2, w2_sf=w2_sf)
        self._inputs = (x, x_sf, topk_ids, topk_weights)
        self._beta, self._linear_beta, self._output = beta, linear_beta, output
        self._layout = (num_experts, num_local_experts, local_expert_offset)

    def run(self, stream: int) -> None:
        num_experts, num_local, offset = self._layout
        weights = unprepare_cake_mxfp4_weights(self._prepared)
        out = ref.mxfp4_situ_moe(*self._inputs, *weights, beta=self._beta, linear_beta=self._linear_beta,
                                 num_experts=num_experts, num_local_experts=num_local, local_expert_offset=offset)
        self._output.copy_(out)


def _run(plan: int, x, x_sf, topk_ids, topk_weights, output) -> None:
    bound = _plans.get(plan)
    if bound is None:
        raise ValueError(f"plan: no live Mxfp4MoEPlan has number {plan} (plans are numbered when made and "
                         "forgotten when collected)")
    bound.run_with(x, x_sf, topk_ids, topk_weights, output)


def _register() -> None:
    # without custom_op's per-call wrappers (cake_moe._library): they cost ~40 us of host time a call
    _library.define("mxfp4_moe_run(SymInt plan, Tensor x, Tensor x_sf, Tensor topk_ids, Tensor? topk_weights, "
                    "Tensor(a!) output) -> ()", _run, lambda plan, x, x_sf, topk_ids, topk_weights, output: None)


_register()
