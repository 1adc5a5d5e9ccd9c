"""GPU tests of family B's plans and runs (SPEC §7): bitwise repeatable runs, streams and
processes, graph replay, a plan that enqueues nothing, compiled runs, workspaces, no allocation
and no host waits in run(), kept plans."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from .conftest import digest, host_never_waits, poison_
from .fresh_interpreter import run_python
from .mxfp4_moe_cases import call_plan, make_case, plan_args
from .mxfp4_moe_checks import check_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name,t", [("h512_e40_k5", 17), ("h512_e40_k5", 1025), ("ep8", 16), ("tp8", 1025)])
def test_bitwise_repeatable_runs_and_streams(layers, name, t):
    layer = layers(name)
    case = make_case(layer.geom, t, "zipf", seed=11)
    plan, out = layer.plan(case)
    poison_(out)
    plan.run()
    torch.cuda.synchronize()
    y0 = out.clone()
    check_reference(case, y0, layer.bank)
    for _ in range(3):
        poison_(out)
        plan.run()
        torch.cuda.synchronize()
        assert torch.equal(out, y0), "a repeated run changed the bits"
    poison_(out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(out, y0), "a run on a side stream changed the bits"
    assert torch.equal(layer.run(case), y0), "a second plan on other buffers changed the bits"


def test_bitwise_repeatable_across_processes(layers):
    layer = layers("h512_e40_k5")
    code = (
        "import hashlib, torch;"
        "from mxfp4_moe_cases import make_case, named_layer;"
        "layer = named_layer('h512_e40_k5');"
        "y = layer.run(make_case(layer.geom, 1025, 'zipf', seed=11));"
        "print(hashlib.sha256(y.view(torch.uint8).cpu().numpy().tobytes()).hexdigest())")
    printed = run_python(code)
    want = digest(layer.run(make_case(layer.geom, 1025, "zipf", seed=11)))
    assert printed.strip().splitlines()[-1] == want, "another process computed other bits"


@pytest.mark.parametrize("name,t", [("h512_e40_k5", 17), ("h384_ep_k8", 1025), ("tp8", 16),
                                    ("h128_e1024_k32", 1025)])   # the last: routing over several CTAs
def test_graph_replay_follows_new_values(layers, name, t):
    """Serving captures run() once and replays it every step after writing the step's
    activations and routes into the bound tensors: the replay must equal an eager run on the
    new values, bit for bit."""
    layer = layers(name)
    case = make_case(layer.geom, t, seed=21)
    plan, out = layer.plan(case)
    plan.run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run()
    new = dataclasses.replace(make_case(layer.geom, t, "zipf", seed=22), beta=case.beta,
                              linear_beta=case.linear_beta)
    for dst, src in ((case.x, new.x), (case.x_sf, new.x_sf), (case.topk_ids, new.topk_ids),
                     (case.topk_weights, new.topk_weights)):
        dst.copy_(src)
    poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, layer.run(new)), "graph replay differs from an eager run on the same values"
    check_reference(new, out, layer.bank)


_FIRST_CAPTURE_CASES = [("h512_e40_k5", 17), ("h384_ep_k8", 2048)]


def test_plan_runs_nothing_and_a_capture_may_come_first(layers):
    """plan() binds and loads every kernel into the context but enqueues nothing (its output
    stays poisoned), so a fresh process may capture the plan's very first run() under lazy
    module loading, and the replay gives an eager run's bits."""
    code = (
        "import hashlib, torch;"
        "from mxfp4_moe_cases import make_case, named_layer;"
        "from conftest import poison_\n"
        f"for name, t in {_FIRST_CAPTURE_CASES!r}:\n"
        "    layer = named_layer(name); case = make_case(layer.geom, t, 'zipf', seed=31)\n"
        "    out = poison_(torch.empty(case.x.shape, dtype=torch.bfloat16, device='cuda'))\n"
        "    plan, _ = layer.plan(case, output=out); torch.cuda.synchronize()\n"
        "    untouched = bool(out.isnan().all())\n"
        "    g = torch.cuda.CUDAGraph()\n"
        "    with torch.cuda.graph(g):\n"
        "        plan.run()\n"
        "    g.replay(); torch.cuda.synchronize()\n"
        "    print(name, t, untouched, len(plan.decision.forms),"
        " hashlib.sha256(out.view(torch.uint8).cpu().numpy().tobytes()).hexdigest())")
    printed = run_python(code, CUDA_MODULE_LOADING="LAZY")
    rows = [line.split() for line in printed.strip().splitlines()[-len(_FIRST_CAPTURE_CASES):]]
    assert [(r[0], int(r[1])) for r in rows] == _FIRST_CAPTURE_CASES
    assert [r[2] for r in rows] == ["True"] * len(rows), "plan() wrote the output (it ran the layer)"
    assert rows[-1][3] == "7", "the last case must bind two pairs of forms"
    for (name, t), row in zip(_FIRST_CAPTURE_CASES, rows):
        layer = layers(name)
        want = digest(layer.run(make_case(layer.geom, t, "zipf", seed=31)))
        assert row[4] == want, f"{name} T={t}: a first run captured in a graph gave other bits"


@pytest.mark.parametrize("backend,mode", [("aot_eager", None), ("inductor", "reduce-overhead")])
def test_compiled_run_gives_the_eager_bits(layers, backend, mode):
    """plan.run() inside torch.compile(fullgraph=True) is the op cake_moe::mxfp4_moe_run: the
    eager bits, new routes written into the bound tensors picked up, also under the compiler's
    CUDA graphs; opcheck passes on the GPU plan."""
    layer = layers("h512_e40_k5")
    case = make_case(layer.geom, 17, seed=71)
    plan, out = layer.plan(case)
    eager = plan.run().clone()
    torch.library.opcheck(torch.ops.cake_moe.mxfp4_moe_run.default,
                          (plan._number, case.x.view(torch.uint8), case.x_sf, case.topk_ids, case.topk_weights, out))

    def step(p):
        return p.run().float() * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend, mode=mode)
    for _ in range(3):   # reduce-overhead records its graph on a later call
        poison_(out)
        assert torch.equal(compiled(plan), eager.float() * 2)
    new = make_case(layer.geom, 17, "zipf", seed=72)
    case.topk_ids.copy_(new.topk_ids)
    case.topk_weights.copy_(new.topk_weights)
    got = compiled(plan)
    assert torch.equal(got, plan.run().float() * 2)
    assert not torch.equal(got, eager.float() * 2), "the new routes were not used"


def test_one_workspace_serves_every_smaller_t(layers):
    """get_workspace_size(max_tokens=M) covers every T <= M (and the bits do not depend on
    which workspace a plan got)."""
    layer = layers("h512_e40_k5")
    ws = torch.empty(layer.runner.get_workspace_size(max_tokens=1025), dtype=torch.uint8, device="cuda")
    for t in (1, 17, 1025):
        case = make_case(layer.geom, t, seed=61 + t)
        assert torch.equal(layer.run(case, workspace=ws), layer.run(case))


def test_route_rows_past_two_to_the_31_elements(layers):
    """tp8 at T = 32768: the route rows ([T * top_k, H] BF16, GEMM2's output and the finalize's
    input) hold 3.76e9 elements, past 2^31, so every offset into them needs 64 bits. The tokens
    are a T = 16384 case's twice over; a token's output depends on its own inputs only and every
    wgmma form gives the same bits, so both halves must equal that case's output bit for bit."""
    layer = layers("tp8")
    case = make_case(layer.geom, 16384, "zipf", seed=41)
    twice = dataclasses.replace(case, **{f: torch.cat([getattr(case, f)] * 2).contiguous()
                                         for f in ("x", "x_sf", "topk_ids", "topk_weights")})
    t2 = twice.x.shape[0]
    assert t2 * layer.geom.top_k * layer.geom.hidden > 2**31
    want = layer.run(case).clone()
    assert want.isfinite().all() and want.view(torch.int16).any()
    got = layer.run(twice)
    assert torch.equal(got[:t2 // 2], want), "the first half differs from the T = 16384 run"
    assert torch.equal(got[t2 // 2:], want), "the second half differs from the T = 16384 run"


@pytest.mark.parametrize("name,t", [("h512_e40_k5", 1025), ("tp8", 16), ("h128_e1024_k32", 1025)])
def test_run_allocates_nothing(layers, name, t):
    layer = layers(name)
    plan, _ = layer.plan(make_case(layer.geom, t, seed=31))
    plan.run()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(3):
        plan.run()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "run() allocated"


@pytest.mark.parametrize("name,t", [("tp8", 1), ("h512_e40_k5", 1025)])
def test_plan_and_run_never_make_the_host_wait(layers, name, t):
    """Neither plan() nor run() synchronises with the host once warm: the routes are counted
    and sorted on the device."""
    layer = layers(name)
    case = make_case(layer.geom, t, seed=37)
    ws = layer.workspace(t)
    layer.plan(case, workspace=ws)[0].run()
    with host_never_waits():
        plan, _ = layer.plan(case, workspace=ws)
        plan.run()
        plan.run()


@pytest.mark.parametrize("name,t", [("tp8", 1), ("h512_e40_k5", 1025)])
def test_a_kept_plan_gives_a_new_plans_bits(layers, monkeypatch, name, t):
    """plan() with the same tensors again returns a plan around the one bound before, whose runs
    give the bits of a plan checked and bound anew (CAKE_MOE_ONE_SHOT_CACHE=0) for those tensors;
    and kept plans of two token counts that share one workspace, run in turn, each keep theirs."""
    layer = layers(name)
    monkeypatch.delenv("CAKE_MOE_ONE_SHOT_CACHE", raising=False)
    a = plan_args(layer, t)
    first = call_plan(layer, a)
    kept = call_plan(layer, a)
    assert kept._plan is first._plan
    kept.run()
    torch.cuda.synchronize()
    want = a["output"].clone()
    assert want.isfinite().all() and want.view(torch.int16).any()
    monkeypatch.setenv("CAKE_MOE_ONE_SHOT_CACHE", "0")
    fresh = call_plan(layer, a)
    monkeypatch.delenv("CAKE_MOE_ONE_SHOT_CACHE")
    assert fresh._plan is not first._plan
    poison_(a["output"])
    fresh.run()
    torch.cuda.synchronize()
    assert torch.equal(a["output"], want), "a kept plan's bits differ from a new plan's"
    small = plan_args(layer, 17)
    ws = torch.empty(layer.runner.get_workspace_size(max_tokens=t + 17), dtype=torch.uint8, device="cuda")
    plans = []
    for args in (a, small, a, small):
        args["workspace"] = ws
        plans.append(call_plan(layer, args))
    assert plans[2]._plan is plans[0]._plan and plans[3]._plan is plans[1]._plan
    outs = []
    for plan in plans:
        poison_(plan.output)
        plan.run()
        torch.cuda.synchronize()
        outs.append(plan.output.clone())
    assert torch.equal(outs[0], want) and torch.equal(outs[2], want)
    assert torch.equal(outs[1], outs[3]) and torch.equal(outs[1], layer.run(make_case(layer.geom, 17, seed=41)))
