"""CPU tests of `grouped_mm` (family A): variant resolution, autograd, fake tensors, the rows no
group covers, the torch.library ops and torch.compile."""
from __future__ import annotations

import pytest
import torch

import cake_moe
from cake_moe import _config
from cake_moe.reference import grouped_gemm as ref

from .grouped_gemm_cases import bf16, cpu_problem


def test_variant_resolution():
    try:
        assert _config.grouped_gemm_variant() == "det"
        cake_moe.configure(grouped_gemm_variant="fast")
        assert _config.grouped_gemm_variant() == "fast"
        torch.use_deterministic_algorithms(True)
        assert _config.grouped_gemm_variant() == "det"  # forced, logged once
        with pytest.raises(ValueError, match="deterministic"):
            _config.grouped_gemm_variant("fast")
        with pytest.raises(ValueError, match="conflicts"):
            cake_moe.configure(grouped_gemm_variant="fast")
        with pytest.raises(ValueError, match="'det' or 'fast'"):
            cake_moe.configure(grouped_gemm_variant="quick")
    finally:
        torch.use_deterministic_algorithms(False)
        cake_moe.configure(grouped_gemm_variant=None)


def test_backward_under_deterministic_mode_enabled_after_the_forward():
    """A forward run with 'fast' whose backward comes after torch.use_deterministic_algorithms
    (True): the backward runs 'det' (forced, as for the configured variant) rather than raise."""
    x, w, g, offs = cpu_problem([3, 4, 1], n=16, k=32)
    x, w = x[:8].clone().requires_grad_(), w.clone().requires_grad_()
    try:
        cake_moe.configure(grouped_gemm_variant="fast")
        y = cake_moe.grouped_mm(x, w, offs)
        torch.use_deterministic_algorithms(True)
        y.backward(g[:8])
    finally:
        torch.use_deterministic_algorithms(False)
        cake_moe.configure(grouped_gemm_variant=None)
    assert torch.equal(w.grad, ref.wgrad(g[:8], x.detach(), offs).to(torch.bfloat16))
    assert _config.inherited_variant("fast") == "fast" and _config.inherited_variant("det") == "det"


def test_fake_tensors_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(100, 64, dtype=torch.bfloat16)
        w = torch.empty(4, 32, 64, dtype=torch.bfloat16)
        offs = torch.empty(4, dtype=torch.int32)
        assert torch.ops.cake_moe.grouped_gemm_fwd(x, w, offs).shape == (100, 32)
        assert torch.ops.cake_moe.grouped_gemm_dgrad(torch.empty(100, 32, dtype=torch.bfloat16), w, offs).shape == (100, 64)
        dw = torch.ops.cake_moe.grouped_gemm_wgrad(torch.empty(100, 32, dtype=torch.bfloat16), x, offs, 4,
                                                   torch.float32, "det")
        assert dw.shape == (4, 32, 64) and dw.dtype == torch.float32


def test_autograd_on_cpu_matches_reference():
    x, w, g, offs = cpu_problem([3, 4, 1], n=16, k=32)
    rows = 8
    x = x[:rows].clone().requires_grad_()
    w = w.clone().requires_grad_()
    y = cake_moe.grouped_mm(x, w, offs)
    y.backward(g[:rows])
    assert torch.equal(x.grad, ref.dgrad(g[:rows], w.detach(), offs).to(torch.bfloat16))  # (the CPU path: the
    assert w.grad.dtype == torch.bfloat16                                                  # reference, rounded)
    assert torch.equal(w.grad, ref.wgrad(g[:rows], x.detach(), offs).to(torch.bfloat16))


def _nan_empty(monkeypatch):
    """torch.empty hands back NaN-filled floating tensors (as a caching allocator may hand back
    the blocks of freed activations), so that a row left unwritten shows."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(torch, "empty", poisoned)


@pytest.mark.parametrize("via_op", [False, True])
def test_grouped_mm_zeroes_the_rows_no_group_covers(monkeypatch, via_op):
    """grouped_mm's y and x.grad are exact zeros in the rows past the last group end (no expert
    reads them: their gradient is zero); the direct ops leave a fresh output's rows there as
    allocated, and zero them on request."""
    x, w, g, offs = cpu_problem([3, 0, 5], n=16, k=32)       # rows 8.. are in no group
    _nan_empty(monkeypatch)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = torch.ops.cake_moe.grouped_mm(xr, wr, offs, "det") if via_op else cake_moe.grouped_mm(xr, wr, offs)
    y.backward(g)
    for t in (y.detach(), xr.grad):
        assert torch.equal(t[8:], torch.zeros_like(t[8:])) and torch.isfinite(t[:8]).all()
    assert torch.equal(xr.grad[:8], cake_moe.grouped_gemm_dgrad(g, w, offs)[:8])
    assert cake_moe.grouped_gemm_dgrad(g, w, offs)[8:].isnan().all()      # as allocated
    assert torch.ops.cake_moe.grouped_gemm_dgrad(g, w, offs, True)[8:].eq(0).all()


@pytest.mark.parametrize("via_op", [False, True])
def test_grouped_mm_zeroes_the_rows_before_an_m_indptr_start(monkeypatch, via_op):
    """An m_indptr whose first entry is above 0 (or E + 1 cumulative ends against a w of E
    experts, read as one) leaves the rows before it in no group: zeros in y and x.grad, as past
    the last end, not the allocator's bytes."""
    x, w, g, _ = cpu_problem([3, 0, 5], n=16, k=32)
    _nan_empty(monkeypatch)
    for w_used, offs in ((w, torch.tensor([2, 3, 3, 8], dtype=torch.int32)),          # m_indptr from row 2
                         (w[:2], torch.tensor([3, 3, 8], dtype=torch.int32))):        # ends read as m_indptr
        xr, wr = x.clone().requires_grad_(), w_used.clone().requires_grad_()
        y = torch.ops.cake_moe.grouped_mm(xr, wr, offs, "det") if via_op else cake_moe.grouped_mm(xr, wr, offs)
        y.backward(g)
        start = int(offs[0])
        for t in (y.detach(), xr.grad):
            assert torch.equal(t[:start], torch.zeros_like(t[:start])) and torch.equal(t[8:], torch.zeros_like(t[8:]))
            assert torch.isfinite(t[start:8]).all()
        assert torch.equal(y.detach()[start:8], ref.fwd(x, w_used, offs, True)[start:8].to(torch.bfloat16))


def test_only_grouped_mm_is_differentiable_and_only_once():
    """The CPU path behaves as the kernels: the direct ops' results carry no autograd graph, and
    grouped_mm's backward cannot be differentiated again (an error, not second-order gradients
    silently missing on the GPU)."""
    x, w, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    assert not cake_moe.grouped_gemm_fwd(xr, wr, offs).requires_grad
    assert not cake_moe.grouped_gemm_wgrad(g, xr, offs).requires_grad
    # the ops (compiled code's path) alike, called directly and compiled
    ops = torch.ops.cake_moe
    assert not ops.grouped_gemm_fwd(xr, wr, offs).requires_grad
    assert not ops.grouped_gemm_dgrad(g, wr, offs).requires_grad
    assert not ops.grouped_gemm_wgrad(g, xr, offs, 3, torch.bfloat16, "det").requires_grad
    compiled = torch.compile(lambda a, b: cake_moe.grouped_gemm_fwd(a, b, offs), fullgraph=True, backend="aot_eager")
    y = compiled(xr, wr)
    assert not y.requires_grad and torch.equal(y[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])  # the groups' rows
    for call in (cake_moe.grouped_mm, lambda *a: torch.ops.cake_moe.grouped_mm(*a, "det")):
        y = call(xr, wr, offs)
        (gx,) = torch.autograd.grad(y.float().sum(), xr, create_graph=True)
        assert torch.equal(gx, torch.autograd.grad(call(xr, wr, offs).float().sum(), xr)[0])
        with pytest.raises(RuntimeError, match="double backward is not supported"):
            (gx.float().square().sum() + 0 * y.float().sum()).backward()


def test_eager_grouped_mm_is_the_function_with_the_ops_results():
    """Eager grouped_mm runs the autograd Function (not the torch.library op and its dispatch)
    and gives the op's results and gradients."""
    x, w, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    x, g = x[:8], g[:8]
    grads = []
    for call in (cake_moe.grouped_mm, lambda *a: torch.ops.cake_moe.grouped_mm(*a, "det")):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = call(xr, wr, offs)
        y.backward(g)
        grads.append((y.detach(), xr.grad, wr.grad, type(y.grad_fn).__name__))
    (y0, dx0, dw0, fn0), (y1, dx1, dw1, _) = grads
    assert fn0 == "GroupedMMBackward"
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1) and torch.equal(dw0, dw1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_moe_mlp_gives_the_eager_bits(backend):
    """torch.compile(fullgraph=True) of an MoE MLP on grouped_mm (the op, its registered backward
    through the dgrad and wgrad ops) gives eager grouped_mm's output and gradients to the bit,
    on the CPU path."""
    sizes = [5, 0, 9, 2]
    x, w13, g, offs = cpu_problem(sizes, n=64, k=32)
    w2 = bf16(len(sizes), 32, 32, seed=4, device="cpu")

    def mlp(t, a, b):   # (no elementwise op between the GEMMs: inductor would fuse its roundings)
        gate, _ = cake_moe.grouped_mm(t, a, offs).chunk(2, dim=-1)
        return cake_moe.grouped_mm(gate.contiguous(), b, offs)

    results = []
    for fn in (mlp, torch.compile(mlp, fullgraph=True, backend=backend)):
        t, a, b = (v.clone().requires_grad_() for v in (x, w13, w2))
        y = fn(t, a, b)
        y.backward(g[:, :32])
        results.append((y[:sum(sizes)], t.grad, a.grad, b.grad))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


def test_out_forms_under_torch_compile():
    """out= inside torch.compile(fullgraph=True) runs the out ops: the caller's tensors are
    written, rows past the last group end stay untouched, and the bits are the eager ones."""
    x, w, g, offs = cpu_problem([3, 0, 5], n=32, k=64)

    def step(x, w, g, offs, y, dx, dw):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=y)
        cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)
        cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw, out_dtype=torch.float32)
        return y.sum() + dx.sum() + dw.sum()

    def outs():
        return (torch.full((x.shape[0], 32), 5.0, dtype=torch.bfloat16),
                torch.full((x.shape[0], 64), 5.0, dtype=torch.bfloat16), torch.full((3, 32, 64), 5.0))

    eager, compiled = outs(), outs()
    step(x, w, g, offs, *eager)
    torch.compile(step, fullgraph=True, backend="aot_eager")(x, w, g, offs, *compiled)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert (compiled[0][8:] == 5.0).all() and (compiled[1][8:] == 5.0).all()
    for name, args in (("grouped_gemm_fwd_out", (x, w, offs, compiled[0])),
                       ("grouped_gemm_dgrad_out", (g, w, offs, compiled[1])),
                       ("grouped_gemm_wgrad_out", (g, x, offs, 3, "det", compiled[2]))):
        torch.library.opcheck(getattr(torch.ops.cake_moe, name).default, args)
        version = args[-1]._version   # an in-place write, as autograd's saved-tensor checks see it
        getattr(torch.ops.cake_moe, name)(*args)
        assert args[-1]._version > version
    # a bad out= is the eager ValueError in compiled code too (not an error of the tracer)
    with pytest.raises(ValueError, match="out must be a torch.Tensor"):
        torch.compile(lambda *a: cake_moe.grouped_gemm_wgrad(*a, out=[1]), backend="aot_eager")(g, x, offs)
