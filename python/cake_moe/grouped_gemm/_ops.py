"""The one-shot grouped-GEMM calls (eager), grouped_mm's autograd, and their torch.library ops."""
from __future__ import annotations

import torch

from .. import _config, _library, _runtime, _validate
from ._kept_launches import _keep, _kept, _kept_key, _kept_launch, _launch_kept, _one_shot, forget_all
from ._checks import _wgrad_out_dtype
from ._launch import _PER_STREAM, prepare_grouped_gemm_dgrad, prepare_grouped_gemm_fwd, prepare_grouped_gemm_wgrad


def release() -> None:
    """Drop the per-device, per-stream workspaces held for one-shot weight gradients and the
    launches one-shot calls keep (both come back as needed)."""
    forget_all()


def fwd_impl(x, w, offs, out=None, zero_unrouted_rows=False):
    return _one_shot(("fwd", zero_unrouted_rows), (x, w, offs), ("x", "w", "offs"), out,
                     lambda t, o: prepare_grouped_gemm_fwd(t[0], t[1], t[2], o,
                                                           zero_unrouted_rows=zero_unrouted_rows))


def _dgrad_key(zero_unrouted_rows: bool) -> tuple:
    return ("dgrad", zero_unrouted_rows)


def dgrad_impl(g, w, offs, out=None, zero_unrouted_rows=False):
    return _one_shot(_dgrad_key(zero_unrouted_rows), (g, w, offs), ("g", "w", "offs"), out,
                     lambda t, o: prepare_grouped_gemm_dgrad(t[0], t[1], t[2], o,
                                                             zero_unrouted_rows=zero_unrouted_rows))


def _wgrad_key(num_groups: int, out_dtype: torch.dtype, variant: str) -> tuple:
    return ("wgrad", num_groups, out_dtype, variant)


def wgrad_impl(g, x, offs, num_groups, out_dtype, variant, out=None):
    v = _config.grouped_gemm_variant(variant)
    # both go into the cache's key: checked before it is looked up
    num_groups = None if num_groups is None else _validate.integer(num_groups, "num_groups")
    out_dtype = _wgrad_out_dtype(out_dtype)
    return _one_shot(_wgrad_key(num_groups, out_dtype, v), (g, x, offs), ("g", "x", "offs"), out,
                     lambda t, o: prepare_grouped_gemm_wgrad(t[0], t[1], t[2], o, out_dtype, num_groups, v,
                                                             workspace=_PER_STREAM),
                     per_stream=True)


def _eager_grads(g, x, w, offs, need_dx: bool, need_dw: bool, variant: str) -> tuple:
    """grouped_mm's eager backward: dx by dgrad (unrouted rows zeroed), dw by wgrad in w's dtype.
    Once both calls keep their launches, the pair is kept under one key as well: a step's
    backward then reads four operands' identities and one lookup instead of six and two (each
    of them costs ~2x its tight-loop time there, run between torch's autograd work)."""
    prefix = ("grads", need_dx, need_dw, variant)
    key = _kept_key(prefix, (g, x, w, offs), None, per_stream=need_dw)
    pair = None if key is None else _kept.get(key)
    if key is not None and pair is not None:   # (the stream: the key's where wgrad runs, else the current one)
        stream = key[len(prefix)] if need_dw else _runtime.stream_handle(g.device)
        return tuple(None if kept is None else _launch_kept(kept, None, stream) for kept in pair)
    dx = dgrad_impl(g, w, offs, zero_unrouted_rows=True) if need_dx else None
    dw = wgrad_impl(g, x, offs, w.shape[0], w.dtype, variant) if need_dw else None
    if key is not None:
        # what dgrad_impl (zero_unrouted_rows=True) and wgrad_impl kept, under their own keys
        pair = (_kept_launch(_dgrad_key(True), (g, w, offs)) if need_dx else None,
                _kept_launch(_wgrad_key(w.shape[0], w.dtype, variant), (g, x, offs), True) if need_dw else None)
        if (pair[0] is not None or not need_dx) and (pair[1] is not None or not need_dw):
            _keep(key, pair)
    return dx, dw


def _op_grads(g, x, w, offs, need_dx: bool, need_dw: bool, variant: str) -> tuple:
    """grouped_mm's backward in compiled code: the torch.library ops."""
    ops = torch.ops.cake_moe
    return (ops.grouped_gemm_dgrad(g, w, offs, zero_unrouted_rows=True) if need_dx else None,
            ops.grouped_gemm_wgrad(g, x, offs, w.shape[0], w.dtype, variant) if need_dw else None)


def _grouped_mm_grads(ctx, grad, grads):
    """grouped_mm's backward: x.grad by dgrad, w.grad by wgrad in w's dtype, with the forward's
    variant; ``grads`` is :func:`_eager_grads` or :func:`_op_grads`.
    x.grad is zero in the rows in no group (no expert reads them), not left as the
    allocator's bytes: a NaN there would reach whatever sums over x's rows upstream."""
    if torch.is_grad_enabled():   # create_graph=True (else autograd runs backward without grad)
        with torch.no_grad():
            dx, dw, _, _ = _grouped_mm_grads(ctx, grad, grads)
        return (*_not_differentiable(dx, dw), None, None)
    x, w, offs = ctx.saved_tensors
    dx, dw = grads(grad.contiguous(), x, w, offs, ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                   _config.inherited_variant(ctx.variant))
    return dx, dw, None, None


class _RefuseDoubleBackward(torch.autograd.Function):
    """Passes its inputs through as views; differentiating through them raises."""

    @staticmethod
    def forward(ctx, *tensors):
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("grouped_mm's backward cannot be differentiated (double backward is not supported)")


def _not_differentiable(*grads):
    """The gradients, marked to raise if differentiated: the kernels record no graph, so a
    double backward would otherwise see constants and silently drop the second-order terms
    (@once_differentiable marks its results only when the incoming gradient requires grad)."""
    live = [t for t in grads if t is not None]
    if not live:
        return grads
    marked = iter(_RefuseDoubleBackward.apply(*[t.detach().requires_grad_() for t in live]))
    return tuple(None if t is None else next(marked) for t in grads)


class GroupedMM(torch.autograd.Function):
    """grouped_mm in eager code: the kernels of the ``cake_moe::grouped_mm`` op called directly.
    A torch.library op with autograd costs several times a Function's host time per call (tens
    of microseconds, as much as a small layer's kernel), so only compiled code goes through it."""

    @staticmethod
    def forward(ctx, x, w, offs, variant):
        ctx.save_for_backward(x, w, offs)
        ctx.variant = variant
        return fwd_impl(x, w, offs, zero_unrouted_rows=True)

    @staticmethod
    def backward(ctx, grad):
        return _grouped_mm_grads(ctx, grad, _eager_grads)


def _fwd_out(x, w, offs, out) -> None:
    fwd_impl(x, w, offs, out)


def _dgrad_out(g, w, offs, out) -> None:
    dgrad_impl(g, w, offs, out)


def _wgrad_out(g, x, offs, num_groups, variant, out) -> None:
    wgrad_impl(g, x, offs, num_groups, out.dtype, variant, out)


def _register() -> None:
    # no custom_op wrappers around each call (cake_moe._library)
    define = _library.define
    define("grouped_gemm_fwd(Tensor x, Tensor w, Tensor offs) -> Tensor", fwd_impl,
           lambda x, w, offs: x.new_empty((x.shape[0], w.shape[1])))
    # (zero_unrouted_rows: for grouped_mm's compiled backward; the grouped_mm op zeroes its own output)
    define("grouped_gemm_dgrad(Tensor g, Tensor w, Tensor offs, bool zero_unrouted_rows=False) -> Tensor",
           lambda g, w, offs, zero_unrouted_rows=False: dgrad_impl(g, w, offs, zero_unrouted_rows=zero_unrouted_rows),
           lambda g, w, offs, zero_unrouted_rows=False: g.new_empty((g.shape[0], w.shape[2])))
    define("grouped_gemm_wgrad(Tensor g, Tensor x, Tensor offs, SymInt num_groups, ScalarType out_dtype, "
           "str variant) -> Tensor", wgrad_impl,
           lambda g, x, offs, num_groups, out_dtype, variant: g.new_empty((num_groups, g.shape[1], x.shape[1]),
                                                                          dtype=out_dtype))
    # out= forms for compiled code: they write the caller's tensor (rows in no group stay
    # untouched, as in eager calls) and return nothing
    define("grouped_gemm_fwd_out(Tensor x, Tensor w, Tensor offs, Tensor(a!) out) -> ()", _fwd_out,
           lambda x, w, offs, out: None)
    define("grouped_gemm_dgrad_out(Tensor g, Tensor w, Tensor offs, Tensor(a!) out) -> ()", _dgrad_out,
           lambda g, w, offs, out: None)
    define("grouped_gemm_wgrad_out(Tensor g, Tensor x, Tensor offs, SymInt num_groups, str variant, "
           "Tensor(a!) out) -> ()", _wgrad_out, lambda g, x, offs, num_groups, variant, out: None)

    def setup_context(ctx, inputs, output):
        x, w, offs, variant = inputs
        ctx.save_for_backward(x, w, offs)
        ctx.variant = variant

    def backward(ctx, grad):
        return _grouped_mm_grads(ctx, grad, _op_grads)

    define("grouped_mm(Tensor x, Tensor w, Tensor offs, str variant) -> Tensor",
           lambda x, w, offs, variant: fwd_impl(x, w, offs, zero_unrouted_rows=True),
           lambda x, w, offs, variant: x.new_empty((x.shape[0], w.shape[1])), autograd=(backward, setup_context))


_register()
