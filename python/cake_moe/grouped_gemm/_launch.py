"""Prepared grouped-GEMM launches: arguments validated and bound once, enqueued many times
(``prepare_grouped_gemm_fwd/dgrad/wgrad``)."""
from __future__ import annotations

import torch

from .. import _config, _runtime, _validate
from ..reference import grouped_gemm as ref
from ._checks import _bf16, _form, _offsets, _outer, _wgrad_out_dtype, check_grouped_dims
from ._kept_launches import _workspace

_OPS = {"fwd": 0, "dgrad": 1, "wgrad": 2}
_VARIANTS = {"det": 0, "fast": 1}


class GroupedGemmLaunch:
    """A prepared grouped GEMM: arguments validated, form chosen, kernel parameters (tensor maps
    included) encoded once. :meth:`launch` enqueues on the current stream: it allocates nothing,
    never synchronises, may be captured in a CUDA graph, and reads the offsets and values that
    are in the bound tensors at run time (write new ones in place between launches).

    The buffers the launch allocated itself (``out`` where none was given, the wgrad's
    workspace) are allocated on the stream current at prepare time; a launch on another stream
    records that stream on them (``Tensor.record_stream``), so the allocator does not hand
    them out again before that stream's work is done. Keep the launch alive as long as a CUDA
    graph that captured it may replay."""

    def __init__(self, op: str, plan, device: torch.device, out: torch.Tensor, keep: tuple, pre=None, cpu=None,
                 owned: tuple = ()):
        self.op = op
        self.out = out
        self._plan = plan
        self._device = device
        self._keep = keep      # the bound tensors stay alive as long as the launch
        self._pre = pre        # an in-place fill that must precede the kernel (empty wgrad)
        self._cpu = cpu        # CPU tensors: the reference computes the result
        # the tensors allocated for this launch, and the streams their allocator knows of
        self._owned = tuple(t for t in owned if t is not None)
        self._streams = {_runtime.stream_handle(device)} if self._owned else set()

    @property
    def form(self) -> str:
        """The kernel form this launch runs (see ``cake-moe info``)."""
        return self._plan.form if self._plan is not None else "cpu-reference"

    def launch(self) -> torch.Tensor:
        if self._cpu is not None:
            return self._cpu()
        stream = _runtime.stream_handle(self._device)
        if self._owned and stream not in self._streams:
            current = torch.cuda.current_stream(self._device)
            for t in self._owned:
                t.record_stream(current)
            self._streams.add(stream)
        if self._pre is not None:
            self._pre()
        if self._plan is not None:
            self._plan.launch(stream)
        return self.out

    def __repr__(self) -> str:
        return f"GroupedGemmLaunch(op={self.op!r}, form={self.form!r}, out={tuple(self.out.shape)})"


_PER_STREAM = object()  # one-shot calls: the current stream's workspace (_kept_launches._workspace)


# ---------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------

def _out(out, shape, dtype, device, inputs, device_of: str):
    """The output: a fresh tensor (it overlaps nothing, so no check), or the caller's, checked."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _validate.tensor(out, "out", dtypes=(dtype,), device=device, align=16, device_of=device_of)
    _validate.shape(out, "out", shape)
    _validate.no_overlap([("out", out)], inputs)
    return out


def _cpu_launch(op, out, compute, offs=None, leading_zero: bool = False, zero_unrouted: bool = False):
    """CPU tensors: the FP64 reference, rounded once. fwd / dgrad (``offs`` given) write only
    the groups' rows, read from offs at each launch (NaN and Inf results included), after
    zeroing the rows in no group, before the first start and past the last end, if
    ``zero_unrouted`` (as the device does)."""
    def run():
        with torch.no_grad():   # as the kernels: the result carries no autograd graph (grouped_mm has one)
            return write(compute())

    def write(res):
        if offs is None:
            out.copy_(res)
            return out
        bounds = ref.group_bounds(offs, leading_zero, out.shape[0])
        if zero_unrouted:
            head, tail = _unrouted_bounds(offs, leading_zero, bounds, out.shape[0])
            out[:head] = 0
            out[tail:] = 0
        for start, end in bounds:
            out[start:end] = res[start:end].to(out.dtype)
        return out
    return GroupedGemmLaunch(op, None, out.device, out, (), cpu=run)


def _unrouted_bounds(offs: torch.Tensor, leading_zero: bool, bounds: list, rows: int) -> tuple[int, int]:
    """(head, tail): rows [0, head) and [tail, rows) are in no group. head is the first group's
    start (0, or m_indptr's first entry), tail the last group end (offs' last entry, at least
    head), each clamped into [0, rows]; with no group every row (unrouted_rows.cuh reads the
    same)."""
    if not bounds:
        return 0, 0
    head = min(max(int(offs[0]), 0), rows) if leading_zero else 0
    return head, max(min(max(int(offs[-1]), 0), rows), head)


def _prepare_rows_op(op: str, a, a_name: str, w, offs, out, form: str, zero_unrouted_rows) -> GroupedGemmLaunch:
    """fwd (a = x [sum_m, K]) and dgrad (a = g [sum_m, N]) against w [E, N, K]."""
    zero = _validate.boolean(zero_unrouted_rows, "zero_unrouted_rows")
    _bf16(a, a_name, 2)
    _bf16(w, "w", 3, a.device, a_name)
    if a.device.type == "cuda":   # an unbuilt arch first: NotImplementedError, whatever form is asked for
        _runtime.require_served(a.device, f"grouped_gemm_{op}")
    form = _form(form, op, a.device)
    e, n, k = w.shape
    a_cols, out_cols = (k, n) if op == "fwd" else (n, k)
    if a.shape[1] != a_cols:
        raise ValueError(f"{a_name} has {a.shape[1]} columns but w has {'K' if op == 'fwd' else 'N'}={a_cols}")
    check_grouped_dims(n, k, num_groups=e, max_rows=a.shape[0])
    lz = _offsets(offs, e, a.device, a_name)
    fresh_out = out is None
    out = _out(out, (a.shape[0], out_cols), torch.bfloat16, a.device, [(a_name, a), ("w", w), ("offs", offs)], a_name)
    if a.device.type != "cuda":
        reference = ref.fwd if op == "fwd" else ref.dgrad
        return _cpu_launch(op, out, lambda: reference(a, w, offs, lz), offs, lz, zero)
    plan = _runtime.ext().grouped_gemm_prepare(_OPS[op], 0, a.device.index, a.data_ptr(), _outer(a, 0), w.data_ptr(),
                                               _outer(w, 1), _outer(w, 0), out.data_ptr(), offs.data_ptr(), lz, e, n,
                                               k, a.shape[0], False, 0, 0, form, zero_unrouted_rows=zero)
    return GroupedGemmLaunch(op, plan, a.device, out, (a, w, offs), owned=(out,) if fresh_out else ())


def prepare_grouped_gemm_fwd(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor | None = None,
                             *, form: str = "", zero_unrouted_rows: bool = False) -> GroupedGemmLaunch:
    """Y[g_e] = X[g_e] @ W[e]^T: x [sum_m, K], w [E, N, K] bf16, offs int32 [E] or [E+1].

    Rows in no group (past the last group end, or before an ``m_indptr`` whose first entry is
    above 0) are not written, so in a fresh output they hold whatever the allocator held;
    ``zero_unrouted_rows=True`` sets them to zero at each launch (one small kernel before the
    GEMM; :func:`grouped_mm` always does). ``form`` forces a kernel form by
    name (``cake-moe info`` lists them; for tuning and benchmarks); by default the heuristic
    picks one for the device and the problem.
    """
    return _prepare_rows_op("fwd", x, "x", w, offs, out, form, zero_unrouted_rows)


def prepare_grouped_gemm_dgrad(g: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor | None = None,
                               *, form: str = "", zero_unrouted_rows: bool = False) -> GroupedGemmLaunch:
    """dX[g_e] = G[g_e] @ W[e]: g [sum_m, N], w [E, N, K] (read in place) -> dx [sum_m, K].
    ``form`` and ``zero_unrouted_rows``: as in :func:`prepare_grouped_gemm_fwd`."""
    return _prepare_rows_op("dgrad", g, "g", w, offs, out, form, zero_unrouted_rows)


def prepare_grouped_gemm_wgrad(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, out: torch.Tensor | None = None,
                               out_dtype: torch.dtype = torch.bfloat16, num_groups: int | None = None,
                               variant: str | None = None, *, workspace: torch.Tensor | None = None,
                               form: str = "") -> GroupedGemmLaunch:
    """dW[e] = G[g_e]^T @ X[g_e]: g [sum_m, N], x [sum_m, K] -> dw [E, N, K] (bf16 or fp32).

    ``num_groups`` tells offs [E] (cumulative ends) from [E+1] (m_indptr); without it offs is
    taken as E cumulative ends. Empty groups give exact zeros. The split-K reduction uses a
    zero-initialised uint8 scratch buffer that every launch leaves zeroed again: a prepared
    launch owns one (allocated here, or ``workspace=``: 256-byte aligned, overlapping no operand
    or output, never used by two launches that may run at once; of a larger buffer the launch
    uses the size it needs, so the det bits do not depend on it); one-shot calls use one per
    device and stream (see :func:`release`). The form for short bf16 groups (CTA pairs) never
    splits and takes none.
    """
    _bf16(g, "g", 2)
    _bf16(x, "x", 2, g.device, "g")
    if g.shape[0] != x.shape[0]:
        raise ValueError(f"g and x must have the same rows, got {g.shape[0]} and {x.shape[0]}")
    out_dtype = _wgrad_out_dtype(out_dtype)
    n, k = g.shape[1], x.shape[1]
    _validate.tensor(offs, "offs", dtypes=(torch.int32,), ndim=1, device=g.device, device_of="g")
    e = offs.numel() if num_groups is None else _validate.integer(num_groups, "num_groups")
    check_grouped_dims(n, k, num_groups=e, max_rows=g.shape[0])
    lz = _offsets(offs, e, g.device, "g")
    v = _config.grouped_gemm_variant(variant)
    if g.device.type == "cuda":   # an unbuilt arch first: NotImplementedError, whatever form is asked for
        _runtime.require_served(g.device, "grouped_gemm_wgrad")
    form = _form(form, "wgrad", g.device)
    fresh_out = out is None
    out = _out(out, (e, n, k), out_dtype, g.device, [("g", g), ("x", x), ("offs", offs)], "g")
    if workspace is not None and workspace is not _PER_STREAM:   # (the CPU path never uses it: any alignment)
        _validate.tensor(workspace, "workspace", dtypes=(torch.uint8,), device=g.device, device_of="g",
                         align=256 if g.device.type == "cuda" else 0)
        _validate.no_overlap([("workspace", workspace)], [("g", g), ("x", x), ("offs", offs), ("out", out)])
    if g.device.type != "cuda":
        return _cpu_launch("wgrad", out, lambda: ref.wgrad(g, x, offs, lz))
    ext = _runtime.ext()
    if g.shape[0] == 0 or e == 0:  # no rows: dW is all zeros, no kernel needed
        return GroupedGemmLaunch("wgrad", None, g.device, out, (g, x, offs), pre=out.zero_,
                                 owned=(out,) if fresh_out else ())
    nbytes = ext.grouped_gemm_workspace_bytes(_OPS["wgrad"], _VARIANTS[v], e, n, k, g.shape[0],
                                              out_dtype == torch.float32, g.device.index or 0, form)
    if workspace is None:
        ws = torch.zeros(nbytes, dtype=torch.uint8, device=g.device) if nbytes else None
    elif workspace is _PER_STREAM:
        ws = _workspace(g.device, nbytes)
    else:   # checked above but for its size, which depends on the device
        ws = workspace
        if ws.numel() < nbytes:
            raise ValueError(f"workspace must hold {nbytes} bytes, got {ws.numel()}")
    plan = ext.grouped_gemm_prepare(_OPS["wgrad"], _VARIANTS[v], g.device.index, g.data_ptr(), _outer(g, 0),
                                    x.data_ptr(), _outer(x, 0), 0, out.data_ptr(), offs.data_ptr(), lz, e, n, k,
                                    g.shape[0], out_dtype == torch.float32, ws.data_ptr() if ws is not None else 0,
                                    nbytes if ws is not None else 0, form)   # a larger buffer: the same split
    owned = ((out,) if fresh_out else ()) + ((ws,) if workspace is None else ())
    return GroupedGemmLaunch("wgrad", plan, g.device, out, (g, x, offs, ws), owned=owned)
