"""CPU plans of the MXFP4 MoE layer (SPEC §7): a wrapper on the CPU runs the FP64 reference, and
the torch.library op under opcheck and torch.compile."""
from __future__ import annotations

import pytest
import torch

from cake_moe.mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights

from .mxfp4_moe_plan_args import E, H, I, K


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


def test_cpu_plan_picks_up_weights_written_in_place():
    """As on the GPU, a CPU plan reads the bound prepared weights at each run: another bank
    copied into them gives that bank's reference."""
    from .mxfp4_moe_cases import GENERAL, make_case, random_weights, reference
    geom = GENERAL["h256_e8_k2"]
    banks = [random_weights(geom, seed=seed, device="cpu") for seed in (3, 11)]
    prepared = [prepare_cake_mxfp4_weights(b["w1"], b["w1_scale"], b["w2"], b["w2_scale"]) for b in banks]
    case = make_case(geom, 5, "balanced", seed=4, device="cpu")
    args, kw = geom.wrapper_args()
    moe = CakeMxfp4MoEWrapper(*args, **kw, device="cpu")
    plan = moe.plan(case.x, case.x_sf, case.topk_ids, case.topk_weights, prepared[0], beta=case.beta,
                    linear_beta=case.linear_beta, workspace=torch.empty(moe.get_workspace_size(5), dtype=torch.uint8),
                    output=torch.empty(5, geom.hidden, dtype=torch.bfloat16))
    first = reference(case, banks[0])
    assert torch.equal(plan.run(), first)
    for key, t in prepared[0].items():
        if isinstance(t, torch.Tensor):
            t.copy_(prepared[1][key])
    second = reference(case, banks[1])
    assert not torch.equal(first, second) and torch.equal(plan.run(), second)


def test_cpu_wrapper_refuses_other_devices():
    with pytest.raises(ValueError, match="CUDA device or the CPU"):
        CakeMxfp4MoEWrapper(E, K, H, I, device="meta")
    plan, case, _ = _cpu_layer("h256_e8_k2", 3)
    assert plan.run().device.type == "cpu"


def test_run_with_copies_what_is_not_bound():
    """The op's path: tensors other than the bound ones are copied in for the run (and the
    output out), and the bound ones get their contents back after (the op writes only output)."""
    plan, case, bank = _cpu_layer("h256_e8_k2", 4)
    want = plan.run().clone()
    other = torch.empty_like(plan.output)
    x_bytes = case.x.view(torch.uint8)
    saved = x_bytes.clone()
    x_bytes.zero_()                                             # the bound x now holds zeros
    got = plan.run_with(saved.clone(), case.x_sf.clone(), case.topk_ids.clone(), case.topk_weights.clone(), other)
    assert got is other and torch.equal(other, want)
    assert not x_bytes.any(), "the bound x must hold what it held before the op (zeros)"
    with pytest.raises(ValueError, match="topk_ids must match the bound tensor"):
        plan.run_with(saved, case.x_sf, case.topk_ids[:2], case.topk_weights, other)
    with pytest.raises(ValueError, match="topk_weights: the plan was made with it"):
        plan.run_with(saved, case.x_sf, case.topk_ids, None, other)


def test_run_with_refuses_before_it_copies():
    """Every given tensor is checked (a tensor, on the bound tensor's device, its shape and
    dtype) before the first copy: a refused call leaves the bound tensors as they were."""
    plan, case, _ = _cpu_layer("h256_e8_k2", 4)
    held = case.x.view(torch.uint8).clone()
    new_x = torch.randint(0, 256, held.shape, dtype=torch.uint8)   # another x, which a copy would write in
    other = torch.empty_like(plan.output)
    for args, match in (((new_x, case.x_sf.to("meta"), case.topk_ids, case.topk_weights, other),
                         r"x_sf is on meta, expected cpu \(the device of the bound x_sf\)"),
                        ((new_x, case.x_sf, case.topk_ids.tolist(), case.topk_weights, other),
                         "topk_ids must be a torch.Tensor"),
                        ((new_x, case.x_sf, case.topk_ids, case.topk_weights, other.to("meta")), "output is on meta")):
        with pytest.raises(ValueError, match=match):
            plan.run_with(*args)
        assert torch.equal(case.x.view(torch.uint8), held), "a refused run_with changed the bound x"


def test_plan_refuses_a_weights_dict_without_a_weight():
    plan, case, bank = _cpu_layer("h256_e8_k2", 3)
    prepared = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
    del prepared["w2_sf"]
    from .mxfp4_moe_cases import GENERAL
    args, kw = GENERAL["h256_e8_k2"].wrapper_args()
    moe = CakeMxfp4MoEWrapper(*args, **kw, device="cpu")
    with pytest.raises(ValueError, match="the weights dict lacks w2_sf"):
        moe.plan(case.x, case.x_sf, case.topk_ids, case.topk_weights, prepared, beta=case.beta,
                 linear_beta=case.linear_beta, workspace=torch.empty(moe.get_workspace_size(3), dtype=torch.uint8),
                 output=torch.empty(3, 256, dtype=torch.bfloat16))


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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_run_leaves_the_bound_tensors_as_the_graph_expects(backend):
    """The op declares only `output` as written; where a compiled graph hands it other tensors
    than the bound ones, the bound ones get their contents back after the run, so a graph that
    reads them around the op (which inductor may reorder) sees what eager code sees: the same
    plan run twice on new routes, the previous output read before a run, a bound input read
    before new values are written into it, and new FP8 tokens written into x in the graph."""
    plan, case, _ = _cpu_layer("h256_e8_k2", 5)
    plan.run()   # a previous result in the output (finite, so that the comparisons mean something)

    def twice(p, ids1, ids2):
        p._topk_ids.copy_(ids1)
        y1 = p.run().float()
        p._topk_ids.copy_(ids2)
        return y1 - p.run().float()

    def after_previous(p):
        prev = p.output.float() * 3
        return p.run().float() + prev

    def input_read_first(p, new_weights):
        old = p._inputs[3] * 3
        p._inputs[3].copy_(new_weights)
        return p.run().float() + old[:, :1]

    def new_tokens(p, x, new_x):
        x.copy_(new_x)
        return p.run().clone()

    other = _cpu_layer("h256_e8_k2", 5, seed=11)[1]
    cases = [(twice, lambda: (case.topk_ids.clone(), case.topk_ids.roll(1, 0).clone())),
             (after_previous, lambda: ()),
             (input_read_first, lambda: (case.topk_weights.flip(0).clone(),)),
             (new_tokens, lambda: (case.x, other.x))]
    for fn, args in cases:
        saved = [t.clone() for t in (case.x.view(torch.uint8), case.topk_ids, case.topk_weights, plan.output)]
        want = fn(plan, *args()).clone()
        for t, s in zip((case.x.view(torch.uint8), case.topk_ids, case.topk_weights, plan.output), saved):
            t.copy_(s)
        got = torch.compile(fn, fullgraph=True, backend=backend)(plan, *args())
        assert torch.equal(got, want), f"{fn.__name__} ({backend})"
        for t, s in zip((case.x.view(torch.uint8), case.topk_ids, case.topk_weights, plan.output), saved):
            t.copy_(s)


def test_a_collected_plan_is_forgotten():
    plan, case, _ = _cpu_layer("h256_e8_k2", 2)
    number, args = plan._number, (case.x.view(torch.uint8), case.x_sf, case.topk_ids, case.topk_weights)
    out = plan.output
    del plan
    import gc
    gc.collect()
    with pytest.raises(ValueError, match=f"no live Mxfp4MoEPlan has number {number}"):
        torch.ops.cake_moe.mxfp4_moe_run(number, *args, out)
