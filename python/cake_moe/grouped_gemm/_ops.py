"""Validation, binding and torch.library registration of the ragged BF16 grouped GEMM."""
from __future__ import annotations

import atexit

import torch

from .. import _config, _library, _runtime, _validate
from ..reference import grouped_gemm as ref

_INT32_MAX = 2**31 - 1
_MAX_DIM = 2**31 - 256  # rows, N, K: 32-bit indices with a tile of headroom (portable_params.hpp)
_MIN_TILE = 64  # smallest tile edge of any form: bounds the tile counts kernels index in int32
# fwd / dgrad tile totals the device schedulers serve (scheduler.cuh kTileCap: their counts
# saturate there, so that malformed offsets cannot wrap them, with room for the loop indices)
_MAX_TILES = 2**31 - 2**20
_OPS = {"fwd": 0, "dgrad": 1, "wgrad": 2}
_VARIANTS = {"det": 0, "fast": 1}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _dims(n, k, num_groups) -> tuple[int, int, int]:
    """N, K and E as ints, each in the range the kernels serve (ValueError naming it if not)."""
    n, k = _validate.integer(n, "N"), _validate.integer(k, "K")
    for name, v in (("N", n), ("K", k)):
        if v <= 0 or v % 8:
            raise ValueError(f"{name} must be a positive multiple of 8 (16-byte rows), got {v}")
        if v > _MAX_DIM:
            raise ValueError(f"{name} = {v} exceeds {_MAX_DIM}, the largest the kernels' 32-bit column indices serve")
    e = 0 if num_groups is None else _validate.integer(num_groups, "num_groups")
    if e < 0 or e > _INT32_MAX // 4:
        raise ValueError(f"num_groups must be in [0, {_INT32_MAX // 4}], got {e}")
    if e * _ceil(n, _MIN_TILE) * _ceil(k, _MIN_TILE) > _INT32_MAX:
        raise ValueError(f"{e} groups of {n}x{k} weights exceed the 2^31 weight-gradient tiles")
    return n, k, e


def _max_rows(n: int, k: int, e: int) -> int:
    tiles_per_block_row = _ceil(max(n, k), _MIN_TILE)
    # fewer than _MAX_TILES tiles: the device schedulers refuse a total that reaches it
    by_tiles = ((_MAX_TILES - 1) // tiles_per_block_row - e) * _MIN_TILE
    return max(0, min(_MAX_DIM, by_tiles))   # (rows round up to whole tiles in 32 bits)


def max_grouped_rows(n: int, k: int, num_groups: int = 0) -> int:
    """The largest packed row count (sum over groups) whose fwd, dgrad and wgrad stay inside
    the kernels' 32-bit index ranges for weights [num_groups, n, k]; ValueError for
    dimensions no kernel serves (as :func:`check_grouped_dims`)."""
    return _max_rows(*_dims(n, k, num_groups))


def check_grouped_dims(n: int, k: int, *, num_groups: int | None = None, max_rows: int | None = None) -> None:
    """Raise ValueError unless weights [num_groups, n, k] with up to ``max_rows`` packed rows
    are served by fwd, dgrad and wgrad (N, K positive multiples of 8; 32-bit bounds)."""
    n, k, e = _dims(n, k, num_groups)
    if max_rows is not None:
        max_rows = _validate.integer(max_rows, "max_rows")
        if max_rows < 0:
            raise ValueError(f"max_rows must be >= 0, got {max_rows}")
        limit = _max_rows(n, k, e)
        if max_rows > limit:
            raise ValueError(f"{max_rows} rows exceed the {limit} rows served for N={n}, K={k}, E={e}")


def _offsets(offs, num_groups: int, device: torch.device) -> bool:
    """Checks offs and returns whether it is m_indptr ([E+1], leading zero)."""
    _validate.tensor(offs, "offs", dtypes=(torch.int32,), ndim=1, device=device)
    if offs.numel() == num_groups:
        return False
    if offs.numel() == num_groups + 1:
        return True
    raise ValueError(f"offs must have E={num_groups} (cumulative ends) or E+1 (m_indptr) entries, got {offs.numel()}")


def _form(form, op: str, device: torch.device) -> str:
    """``form`` if it names a grouped-GEMM ``op`` form of this build ('' picks by heuristic)
    built for the device's arch; the name is checked on the CPU path too, so that a CPU test
    refuses what the GPU build would."""
    if not isinstance(form, str):
        raise ValueError(f"form must be a str, got {form!r} ({type(form).__name__})")
    if not form:
        return form
    entry = next((f for f in _runtime.manifest()["forms"]
                  if f["name"] == form and f["family"] == "grouped_gemm" and f["params"].get("op") == op), None)
    if entry is None:
        raise ValueError(f"form {form!r} is not a grouped GEMM {op} form of this build (see `cake-moe info`)")
    if device.type == "cuda" and _runtime.device_arch(device.index) not in entry["arches"]:
        raise ValueError(f"form {form!r} does not serve grouped GEMM {op} on sm_{_runtime.device_arch(device.index)} "
                         "(see `cake-moe info`)")
    return form


def _strides_served(t: torch.Tensor) -> bool:
    """The kernels read an operand in place when each row is contiguous and the rows (and
    experts) start 16-byte multiples apart without overlapping: a column slice ``h[:, :n]`` of
    a wider tensor, a slice of the experts' rows ``w13[:, :i]``."""
    if t.is_contiguous():
        return True
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return False
    inner = t.shape[-1]
    for size, stride in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1])):
        if size > 1 and (stride % 8 or stride < inner):
            return False
        inner = stride * size if size > 1 else inner
    return True


def _bf16(t, name: str, ndim: int, device=None) -> torch.Tensor:
    _validate.tensor(t, name, dtypes=(torch.bfloat16,), ndim=ndim, device=device, contiguous=False, align=16)
    if not _strides_served(t):
        if t.stride(-1) != 1 and t.shape[-1] > 1:   # no call copies these: the layout is the caller's to choose
            raise ValueError(f"{name} must have a unit stride along its last axis (contiguous rows), got strides "
                             f"{t.stride()} for shape {tuple(t.shape)}: call .contiguous() on a transposed view "
                             "(w is [E, N, K], the layout torch._grouped_mm reads as w.transpose(-2, -1))")
        raise ValueError(f"{name} must have contiguous rows that start 16-byte multiples apart without overlap, got "
                         f"strides {t.stride()} for shape {tuple(t.shape)} (a prepared launch binds it in place; "
                         "the one-shot ops copy such a tensor first)")
    return t


def _outer(t: torch.Tensor, dim: int) -> int:
    """The element stride of an operand's outer dim as the kernels take it: 0 where the dim has
    at most one entry (the stride is never used), else the tensor's (validated) stride."""
    return t.stride(dim) if t.shape[dim] > 1 else 0


def _packed(t):
    """A one-shot operand that the kernels cannot read in place but whose last axis has a unit
    stride (an expanded or transposed-inner tensor, rows 2-byte aligned only, a start that is
    not 16-byte aligned: a column slice ``x[:, 1:]``) becomes a contiguous copy; anything else
    is left for validation to judge."""
    if (isinstance(t, torch.Tensor) and t.dim() >= 2 and t.stride(-1) == 1 and t.numel()
            and (not _strides_served(t) or t.data_ptr() % 16)):
        return t.contiguous()
    return t


class GroupedGemmLaunch:
    """A prepared grouped GEMM: arguments validated, form chosen, kernel parameters (tensor maps
    included) encoded once. :meth:`launch` enqueues on the current stream: it allocates nothing,
    never synchronises, may be captured in a CUDA graph, and reads the offsets and values that
    are in the bound tensors at run time (write new ones in place between launches)."""

    def __init__(self, op: str, plan, device: torch.device, out: torch.Tensor, keep: tuple, pre=None, cpu=None):
        self.op = op
        self.out = out
        self._plan = plan
        self._device = device
        self._keep = keep      # the bound tensors stay alive as long as the launch
        self._pre = pre        # an in-place fill that must precede the kernel (empty wgrad)
        self._cpu = cpu        # CPU tensors: the reference computes the result

    @property
    def form(self) -> str:
        """The kernel form this launch runs (see ``cake-moe info``)."""
        return self._plan.form if self._plan is not None else "cpu-reference"

    def launch(self) -> torch.Tensor:
        if self._cpu is not None:
            return self._cpu()
        if self._pre is not None:
            self._pre()
        if self._plan is not None:
            self._plan.launch(_runtime.stream_handle(self._device))
        return self.out

    def __repr__(self) -> str:
        return f"GroupedGemmLaunch(op={self.op!r}, form={self.form!r}, out={tuple(self.out.shape)})"


# ---------------------------------------------------------------------------------------------
# per-stream workspaces of the wgrad split-K reduction
# ---------------------------------------------------------------------------------------------

_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_PER_STREAM = object()  # one-shot calls: the cached workspace of the current stream


def _workspace(device: torch.device, nbytes: int) -> torch.Tensor | None:
    """Zeroed scratch for the wgrad reduction (kernels leave it zeroed). Never shared across
    streams; a launch prepared during graph capture owns a fresh one."""
    if nbytes == 0:
        return None
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)
    key = (device.index, _runtime.stream_handle(device))
    ws = _workspaces.get(key)
    if ws is None or ws.numel() < nbytes:
        ws = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        _workspaces[key] = ws
    return ws


def release() -> None:
    """Drop the per-device, per-stream workspaces held for one-shot weight gradients and the
    launches one-shot calls keep (both come back as needed)."""
    _workspaces.clear()
    _kept.clear()


# ---------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------

def _out(out, shape, dtype, device, inputs):
    """The output: a fresh tensor (it overlaps nothing, so no check), or the caller's, checked."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _validate.tensor(out, "out", dtypes=(dtype,), device=device, align=16)
    _validate.shape(out, "out", shape)
    _validate.no_overlap([("out", out)], inputs)
    return out


def _cpu_launch(op, out, compute, offs=None, leading_zero: bool = False, zero_unrouted: bool = False):
    """CPU tensors: the FP64 reference, rounded once. fwd / dgrad (``offs`` given) write only
    the groups' rows, read from offs at each launch (NaN and Inf results included), after
    zeroing the rows past the last group end if ``zero_unrouted`` (as the device does)."""
    def run():
        with torch.no_grad():   # as the kernels: the result carries no autograd graph (grouped_mm has one)
            return write(compute())

    def write(res):
        if offs is None:
            out.copy_(res)
            return out
        bounds = ref.group_bounds(offs, leading_zero, out.shape[0])
        if zero_unrouted:
            out[_last_end(offs, bounds, out.shape[0]):] = 0
        for start, end in bounds:
            out[start:end] = res[start:end].to(out.dtype)
        return out
    return GroupedGemmLaunch(op, None, out.device, out, (), cpu=run)


def _last_end(offs: torch.Tensor, bounds: list, rows: int) -> int:
    """The first row past the last group end: offs' last entry clamped into [0, rows], or 0 with
    no group (unrouted_rows.cuh reads the same)."""
    return min(max(int(offs[-1]), 0), rows) if bounds else 0


def _prepare_rows_op(op: str, a, a_name: str, w, offs, out, form: str, zero_unrouted_rows) -> GroupedGemmLaunch:
    """fwd (a = x [sum_m, K]) and dgrad (a = g [sum_m, N]) against w [E, N, K]."""
    zero = _validate.boolean(zero_unrouted_rows, "zero_unrouted_rows")
    _bf16(a, a_name, 2)
    _bf16(w, "w", 3, a.device)
    form = _form(form, op, a.device)
    e, n, k = w.shape
    a_cols, out_cols = (k, n) if op == "fwd" else (n, k)
    if a.shape[1] != a_cols:
        raise ValueError(f"{a_name} has {a.shape[1]} columns but w has {'K' if op == 'fwd' else 'N'}={a_cols}")
    check_grouped_dims(n, k, num_groups=e, max_rows=a.shape[0])
    lz = _offsets(offs, e, a.device)
    out = _out(out, (a.shape[0], out_cols), torch.bfloat16, a.device, [(a_name, a), ("w", w), ("offs", offs)])
    if a.device.type != "cuda":
        reference = ref.fwd if op == "fwd" else ref.dgrad
        return _cpu_launch(op, out, lambda: reference(a, w, offs, lz), offs, lz, zero)
    _runtime.require_served(a.device, f"grouped_gemm_{op}")
    plan = _runtime.ext().grouped_gemm_prepare(_OPS[op], 0, a.device.index, a.data_ptr(), _outer(a, 0), w.data_ptr(),
                                               _outer(w, 1), _outer(w, 0), out.data_ptr(), offs.data_ptr(), lz, e, n,
                                               k, a.shape[0], False, 0, 0, form, zero_unrouted_rows=zero)
    return GroupedGemmLaunch(op, plan, a.device, out, (a, w, offs))


def prepare_grouped_gemm_fwd(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor | None = None,
                             *, form: str = "", zero_unrouted_rows: bool = False) -> GroupedGemmLaunch:
    """Y[g_e] = X[g_e] @ W[e]^T: x [sum_m, K], w [E, N, K] bf16, offs int32 [E] or [E+1].

    Rows past the last group end are not written, so in a fresh output they hold whatever the
    allocator held; ``zero_unrouted_rows=True`` sets them to zero at each launch (one small
    kernel before the GEMM; :func:`grouped_mm` always does). ``form`` forces a kernel form by
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
    _bf16(x, "x", 2, g.device)
    if g.shape[0] != x.shape[0]:
        raise ValueError(f"g and x must have the same rows, got {g.shape[0]} and {x.shape[0]}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    n, k = g.shape[1], x.shape[1]
    _validate.tensor(offs, "offs", dtypes=(torch.int32,), ndim=1, device=g.device)
    e = offs.numel() if num_groups is None else _validate.integer(num_groups, "num_groups")
    check_grouped_dims(n, k, num_groups=e, max_rows=g.shape[0])
    lz = _offsets(offs, e, g.device)
    v = _config.grouped_gemm_variant(variant)
    form = _form(form, "wgrad", g.device)
    out = _out(out, (e, n, k), out_dtype, g.device, [("g", g), ("x", x), ("offs", offs)])
    if workspace is not None and workspace is not _PER_STREAM:   # (the CPU path never uses it: any alignment)
        _validate.tensor(workspace, "workspace", dtypes=(torch.uint8,), device=g.device,
                         align=256 if g.device.type == "cuda" else 0)
        _validate.no_overlap([("workspace", workspace)], [("g", g), ("x", x), ("offs", offs), ("out", out)])
    if g.device.type != "cuda":
        return _cpu_launch("wgrad", out, lambda: ref.wgrad(g, x, offs, lz))
    _runtime.require_served(g.device, "grouped_gemm_wgrad")
    ext = _runtime.ext()
    if g.shape[0] == 0 or e == 0:  # no rows: dW is all zeros, no kernel needed
        return GroupedGemmLaunch("wgrad", None, g.device, out, (g, x, offs), pre=out.zero_)
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
    return GroupedGemmLaunch("wgrad", plan, g.device, out, (g, x, offs, ws))


# ---------------------------------------------------------------------------------------------
# one-shot calls: their prepared launches, kept while the same tensors come back
# ---------------------------------------------------------------------------------------------

# A training loop makes the same one-shot calls with the same tensors every step (the caching
# allocator hands the same blocks back), and validating and binding them cost a call ~3x what
# enqueueing a prepared launch does. So a one-shot call keeps its launch under everything the
# preparation read: each operand's address, shape, strides, dtype and device, the op's own
# arguments (wgrad: the stream, whose workspace the launch binds) and the switches read when a
# launch is prepared. A call with the same key only allocates its output (unless it was given
# one, which is part of the key) and enqueues the kept launch pointed at it: the checks would
# decide as before, since they are functions of the key and a fresh output overlaps nothing.
# A kept launch holds addresses, not tensors (the caller holds its operands during its call);
# the wgrad's workspace is the one tensor kept with it. Calls whose operands are copied first
# (_packed) or that run on the CPU keep nothing; CAKE_MOE_ONE_SHOT_CACHE=0 turns the cache off;
# release() empties it. grouped_mm's eager backward also keeps its dgrad and wgrad launches as
# a pair under one key of its four operands (_eager_grads).
_PREPARE_SWITCHES = ("CAKE_MOE_GG_SPLIT_TAIL", "CAKE_MOE_GG_FORCE_PORTABLE")
# Room for every launch of a deep model's training step: 8 per MoE layer (fwd, dgrad, wgrad and
# the backward's pair, for w13 and w2), so 61 layers keep ~490. A full cache is emptied at once
# (each entry is a few hundred bytes of encoded parameters); at 256 such a step had refilled it
# every step.
_MAX_KEPT = 4096
_kept: dict[tuple, tuple] = {}
atexit.register(_kept.clear)  # the plans go before the extension's types do at exit


def _is_cuda(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_cuda


_identity = _runtime.tensor_identity


def _kept_key(key: tuple, tensors: tuple, out, per_stream: bool = False) -> tuple | None:
    """The key a one-shot call keeps its launch under, or None where it keeps none (an operand
    or ``out`` not on a CUDA device, CAKE_MOE_ONE_SHOT_CACHE=0, a per-stream launch during
    graph capture)."""
    if (not all(map(_is_cuda, tensors)) or (out is not None and not _is_cuda(out))
            or not _runtime.keeps_bound_work()
            or (per_stream and torch.cuda.is_current_stream_capturing())):
        return None
    stream = _runtime.stream_handle(tensors[0].device) if per_stream else None
    return (*key, stream, *map(_identity, tensors), None if out is None else _identity(out),
            *map(_runtime.env, _PREPARE_SWITCHES))


def _kept_launch(key: tuple, tensors: tuple, per_stream: bool = False) -> tuple | None:
    """What a one-shot call with these operands (and no ``out``) keeps, if it keeps a launch."""
    full = _kept_key(key, tensors, None, per_stream)
    return None if full is None else _kept.get(full)


def _keep(key: tuple, entry: tuple) -> None:
    if len(_kept) >= _MAX_KEPT:
        _kept.clear()
    _kept[key] = entry


def _launch_kept(kept: tuple, out, stream: int | None) -> torch.Tensor:
    plan, shape, dtype, device, _ = kept
    result = torch.empty(shape, dtype=dtype, device=device) if out is None else out
    plan.launch_to(_runtime.stream_handle(device) if stream is None else stream,
                   result.data_ptr())  # a fresh output overlaps nothing
    return result


def _one_shot(key: tuple, tensors: tuple, out, prepare, per_stream: bool = False) -> torch.Tensor:
    """Run ``prepare(operands, out).launch()``, or the launch kept for the same key.
    ``per_stream``: the launch binds the current stream's workspace (wgrad), so it is kept per
    stream, and not at all during graph capture (which gives a launch a workspace of its own)."""
    full = _kept_key(key, tensors, out, per_stream)
    if full is None:
        return prepare(tuple(_packed(t) for t in tensors), out).launch()
    kept = _kept.get(full)
    if kept is not None:
        return _launch_kept(kept, out, full[len(key)])   # (the key's stream, or None)
    operands = tuple(_packed(t) for t in tensors)
    launch = prepare(operands, out)
    result = launch.launch()
    if (launch._plan is not None and launch._pre is None and launch._cpu is None
            and all(a is b for a, b in zip(operands, tensors))):
        workspace = launch._keep[3] if launch.op == "wgrad" else None
        _keep(full, (launch._plan, result.shape, result.dtype, launch._device, workspace))
    # This frame can outlive the call (compute-sanitizer keeps it): it must not hold the launch,
    # whose plan would then outlive release() and the extension's teardown.
    del launch
    return result


# ---------------------------------------------------------------------------------------------
# one-shot implementations (eager) and torch.library ops
# ---------------------------------------------------------------------------------------------

def fwd_impl(x, w, offs, out=None, zero_unrouted_rows=False):
    return _one_shot(("fwd", zero_unrouted_rows), (x, w, offs), out,
                     lambda t, o: prepare_grouped_gemm_fwd(t[0], t[1], t[2], o,
                                                           zero_unrouted_rows=zero_unrouted_rows))


def _dgrad_key(zero_unrouted_rows: bool) -> tuple:
    return ("dgrad", zero_unrouted_rows)


def dgrad_impl(g, w, offs, out=None, zero_unrouted_rows=False):
    return _one_shot(_dgrad_key(zero_unrouted_rows), (g, w, offs), out,
                     lambda t, o: prepare_grouped_gemm_dgrad(t[0], t[1], t[2], o,
                                                             zero_unrouted_rows=zero_unrouted_rows))


def _wgrad_key(num_groups: int, out_dtype: torch.dtype, variant: str) -> tuple:
    return ("wgrad", num_groups, out_dtype, variant)


def wgrad_impl(g, x, offs, num_groups, out_dtype, variant, out=None):
    v = _config.grouped_gemm_variant(variant)
    return _one_shot(_wgrad_key(num_groups, out_dtype, v), (g, x, offs), out,
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
    x.grad is zero in the rows past the last group end (no expert reads them), not left as the
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
    # out= forms for compiled code: they write the caller's tensor (rows past the last group end
    # stay untouched, as in eager calls) and return nothing
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
