"""The launches one-shot grouped-GEMM calls keep while the same tensors come back, and the
per-stream workspaces of the wgrad's split-K reduction that those launches bind."""
from __future__ import annotations

import atexit
import threading

import torch

from .. import _runtime, _validate
from ._checks import _packed

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
            or (per_stream and _runtime.capturing(tensors[0].device))):
        return None
    stream = _runtime.stream_handle(tensors[0].device) if per_stream else None
    return (*key, stream, *map(_identity, tensors), None if out is None else _identity(out),
            *map(_runtime.env, _PREPARE_SWITCHES), _runtime.stream_thread(stream))


def _kept_launch(key: tuple, tensors: tuple, per_stream: bool = False) -> tuple | None:
    """What a one-shot call with these operands (and no ``out``) keeps, if it keeps a launch."""
    full = _kept_key(key, tensors, None, per_stream)
    return None if full is None else _kept.get(full)


def _keep(key: tuple, entry: tuple) -> None:
    """Keep ``entry`` under ``key``, unless a workspace it binds was let go since the call took
    it (release(), or another thread's call making room): kept, it would outlive the bound."""
    with _lock:
        if any(kept[4] is not None and not _held(kept[4]) for kept in launches_of(entry)):
            return
        if len(_kept) >= _MAX_KEPT:
            _kept.clear()
        _kept[key] = entry


def launches_of(entry: tuple) -> tuple:
    """The kept launches in an entry: itself (plan, shape, dtype, device, workspace), or those of
    grouped_mm's backward pair (two launches or None)."""
    return tuple(kept for kept in entry if kept is not None) if len(entry) == 2 else (entry,)


def _forget_launches_binding(workspace: torch.Tensor) -> None:
    """Drop the kept launches (and backward pairs) that bind ``workspace``, which is let go
    (the caller holds _lock)."""
    for key, entry in list(_kept.items()):
        if any(kept[4] is workspace for kept in launches_of(entry)):
            del _kept[key]


# ---------------------------------------------------------------------------------------------
# per-stream workspaces of the wgrad split-K reduction
# ---------------------------------------------------------------------------------------------

_workspaces: dict[tuple[int, int, int | None], torch.Tensor] = {}
# Streams whose workspace is kept at once per device, the least recently used dropped first.
# A loop that takes a new torch.cuda.Stream() each step walks through torch's pool of streams
# (32 per priority); unbounded, it would keep a workspace (tens of MB at MoE sizes) for each.
_MAX_STREAM_WORKSPACES = 8
# Guards _workspaces and _kept together where one-shot calls of several threads change both: a
# workspace let go takes its launches along, and a launch is kept only while its workspace is held.
_lock = threading.Lock()


def _held(workspace: torch.Tensor) -> bool:
    return any(ws is workspace for ws in _workspaces.values())


def _workspace(device: torch.device, nbytes: int) -> torch.Tensor | None:
    """Zeroed scratch for the wgrad reduction (kernels leave it zeroed). Never shared across
    streams; a launch prepared during graph capture owns a fresh one.

    Each stream's launches kept by one-shot calls bind its current workspace and no other: a
    larger one replaces it with the launches that bound the smaller, and a workspace dropped
    for want of room goes with its launches. Freeing one is safe without a sync: it was
    allocated on its own stream, so the caching allocator hands its block out again only to
    that stream's later work."""
    if nbytes == 0:
        return None
    if _runtime.capturing(device):
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)
    stream = _runtime.stream_handle(device)
    key = (device.index, stream, _runtime.stream_thread(stream))
    ws = _workspaces.get(key)   # (one dict read: the lock guards the changes below)
    if ws is None or ws.numel() < nbytes:
        ws = torch.zeros(nbytes, dtype=torch.uint8, device=device)   # (allocated outside the lock)
    with _lock:
        old = _workspaces.pop(key, None)
        if old is not None and old is not ws:
            _forget_launches_binding(old)
        _workspaces[key] = ws   # the most recently used last
        on_device = [k for k in _workspaces if k[0] == key[0]]
        for oldest in on_device[:max(0, len(on_device) - _MAX_STREAM_WORKSPACES)]:
            _forget_launches_binding(_workspaces.pop(oldest))
    return ws


def forget_all() -> None:
    """release(): let every workspace and kept launch go."""
    with _lock:
        _workspaces.clear()
        _kept.clear()


def _launch_kept(kept: tuple, out, stream: int | None) -> torch.Tensor:
    plan, shape, dtype, device, _ = kept
    result = torch.empty(shape, dtype=dtype, device=device) if out is None else out
    plan.launch_to(_runtime.stream_handle(device) if stream is None else stream,
                   result.data_ptr())  # a fresh output overlaps nothing
    return result


def _operands(tensors: tuple, names: tuple, out) -> tuple:
    """The operands the kernels read: each tensor, or its contiguous copy (_packed). A copied
    operand's own memory is checked against ``out`` here, since prepare() sees only the copy."""
    operands = tuple(_packed(t) for t in tensors)
    if isinstance(out, torch.Tensor):
        _validate.no_overlap([("out", out)], [(n, t) for n, t, o in zip(names, tensors, operands) if o is not t])
    return operands


def _one_shot(key: tuple, tensors: tuple, names: tuple, out, prepare, per_stream: bool = False) -> torch.Tensor:
    """Run ``prepare(operands, out).launch()``, or the launch kept for the same key (``names``:
    the tensors' argument names, for errors). ``per_stream``: the launch binds the current
    stream's workspace (wgrad), so it is kept per stream, and not at all during graph capture
    (which gives a launch a workspace of its own)."""
    full = _kept_key(key, tensors, out, per_stream)
    if full is None:
        return prepare(_operands(tensors, names, out), out).launch()
    kept = _kept.get(full)
    if kept is not None:
        return _launch_kept(kept, out, full[len(key)])   # (the key's stream, or None)
    operands = _operands(tensors, names, out)
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
