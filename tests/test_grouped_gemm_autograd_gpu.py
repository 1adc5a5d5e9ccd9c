"""GPU tests of `grouped_mm` (SPEC §6): autograd, torch.compile and the torch.library ops."""
from __future__ import annotations

import pytest
import torch

import cake_moe
from cake_moe.reference import grouped_gemm as ref

from .conftest import poison_
from .grouped_gemm_cases import bf16
from .grouped_gemm_checks import BUDGET, check_rows, kept_plans, problem

pytestmark = pytest.mark.gpu


def test_grouped_mm_autograd_and_compile():
    sizes = [100, 0, 37, 211]
    x, w, g, offs = problem(sizes, 64, 128, pad=0)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = cake_moe.grouped_mm(xr, wr, offs)
    y.backward(g)
    assert ref.rel_rms(y, ref.fwd(x, w, offs)) < BUDGET
    assert ref.rel_rms(xr.grad, ref.dgrad(g, w, offs)) < BUDGET
    assert wr.grad.dtype == torch.bfloat16 and ref.rel_rms(wr.grad, ref.wgrad(g, x, offs)) < BUDGET

    class MoEMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w13 = torch.nn.Parameter(bf16(4, 256, 128, seed=3, scale=0.05))
            self.w2 = torch.nn.Parameter(bf16(4, 128, 128, seed=4, scale=0.05))

        def forward(self, t, o):
            h = cake_moe.grouped_mm(t, self.w13, o)
            gate, up = h.chunk(2, dim=-1)
            return cake_moe.grouped_mm((torch.nn.functional.silu(gate) * up).contiguous(), self.w2, o)

    model = MoEMLP().cuda()
    compiled = torch.compile(model, fullgraph=True)
    t = bf16(sum(sizes), 128, seed=8)
    out_eager = model(t, offs)
    out_eager.float().square().mean().backward()
    eager_grads = [p.grad.double() for p in (model.w13, model.w2)]
    model.zero_grad(set_to_none=True)
    out_comp = compiled(t, offs)
    assert ref.rel_rms(out_comp, out_eager.double()) < BUDGET
    out_comp.float().square().mean().backward()
    for p, want in zip((model.w13, model.w2), eager_grads):
        assert p.grad is not None and ref.rel_rms(p.grad, want) < BUDGET, "the compiled backward's gradient"


def test_autograd_steps_reuse_their_launches():
    """Eager grouped_mm steps on the same tensors run the fwd, dgrad and wgrad launches the first
    step prepared (into each step's new gradients): three kept launches, the same gradients."""
    cake_moe.release()
    x, w, g, offs = problem([300, 0, 1, 700], 128, 256, seed=24, pad=0)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    grads = []
    for _ in range(3):
        cake_moe.grouped_mm(xl, wl, offs).backward(g)
        grads.append((xl.grad, wl.grad))
        xl.grad = wl.grad = None
    plans = kept_plans()
    assert len(plans) == 3
    from cake_moe.grouped_gemm import _kept_launches
    (pair,) = [entry for key, entry in _kept_launches._kept.items() if key[0] == "grads"]
    assert [kept[0] for kept in pair] == plans[1:]   # the backward's dgrad and wgrad under one key
    cake_moe.grouped_mm(xl, wl, offs).backward(g)
    assert kept_plans() == plans
    for dx, dw in grads[1:]:
        assert torch.equal(dx, grads[0][0]) and torch.equal(dw, grads[0][1])


@pytest.mark.parametrize("call", ["function", "op"])
def test_grouped_mm_zeroes_the_rows_no_group_covers(monkeypatch, call):
    """grouped_mm's y and x.grad are exact zeros in the rows past the last group end, even where
    the allocator hands back NaN blocks (torch.empty poisoned here), step after step: from the
    second step on the one-shot calls run the launches the first kept, pointed at each step's
    fresh outputs, the zeroing kernel included; the groups' rows keep the plain GEMMs' bits."""
    cake_moe.release()
    sizes = [100, 0, 37, 211]
    x, w, g, offs = problem(sizes, 64, 128, seed=31, pad=40)
    end = sum(sizes)
    want_y, want_dx = cake_moe.grouped_gemm_fwd(x, w, offs), cake_moe.grouped_gemm_dgrad(g, w, offs)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison_(empty(*a, **k)))
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    for step in range(3):
        xr.grad = wr.grad = None
        y = (cake_moe.grouped_mm(xr, wr, offs) if call == "function"
             else torch.ops.cake_moe.grouped_mm(xr, wr, offs, "det"))
        y.backward(g)
        for got, want in ((y.detach(), want_y), (xr.grad, want_dx)):
            assert not got[end:].view(torch.int16).any(), (step, "a row past the last group end is not +0")
            assert torch.equal(got[:end], want[:end]), step
        if step == 0:
            plans = kept_plans()
        assert kept_plans() == plans, "a later step prepared a launch of its own"
    assert cake_moe.grouped_gemm_dgrad(g, w, offs)[end:].isnan().all()   # the direct op leaves them
    cake_moe.release()


def test_eager_grouped_mm_gives_the_ops_bits():
    """Eager grouped_mm (the autograd Function) and the torch.library op that compiled code
    runs give the same bits: output, x.grad and (det) w.grad."""
    x, w, g, offs = problem([300, 0, 1, 700], 256, 512, seed=17, pad=0)
    results, names = [], []
    for call in (cake_moe.grouped_mm, lambda *a: torch.ops.cake_moe.grouped_mm(*a, "det")):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = call(xr, wr, offs)
        y.backward(g)
        results.append((y.detach(), xr.grad, wr.grad))
        names.append(type(y.grad_fn).__name__)
    assert names[0] == "GroupedMMBackward", "eager grouped_mm must run the autograd Function"
    for eager, op, what in zip(*results, ("output", "x.grad", "w.grad")):
        assert torch.equal(eager, op), f"eager grouped_mm and the op differ in {what}"
    assert ref.rel_rms(results[0][2], ref.wgrad(g, x.detach(), offs)) < BUDGET


def test_out_forms_under_torch_compile():
    """out= in compiled code (the *_out ops): eager bits, untouched padding rows, opcheck."""
    x, w, g, offs = problem([100, 0, 37, 211], 64, 128)

    def step(x, w, g, offs, y, dx, dw):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=y)
        cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)
        cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw)
        return dw

    def outs():
        return (poison_(torch.empty(x.shape[0], 64, dtype=torch.bfloat16, device="cuda")),
                poison_(torch.empty(x.shape[0], 128, dtype=torch.bfloat16, device="cuda")),
                poison_(torch.empty(4, 64, 128, dtype=torch.bfloat16, device="cuda")))

    eager, compiled = outs(), outs()
    step(x, w, g, offs, *eager)
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True)(x, w, g, offs, *compiled)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))    # NaN padding rows included
    check_rows(compiled[0], ref.fwd(x, w, offs))
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_fwd_out.default, (x, w, offs, compiled[0]))
