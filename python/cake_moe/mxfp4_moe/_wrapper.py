"""``CakeMxfp4MoEWrapper``: configuration, validation and binding of the MXFP4 MoE layer.

Python checks every argument (dtype, shape, contiguity, alignment, overlap, device) and picks
the tile form from the decision table; the compiled extension binds the buffers into a plan
object whose ``run(stream)`` enqueues the five kernel forms (five launches; two more when the
routing runs over several CTAs, two more for an sm_90a wgmma decision's second GEMM pair).
Nothing here launches a kernel by itself.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

import torch

from .. import _runtime, _validate
from . import _decide, _kept_plans, _ops, _tile_cost
from ._decide import PlanDecision
from ._plan import Mxfp4MoEPlan, _capturing
from ._prepare import LAYOUT

HOST_ONLY_SM_COUNT = 132     # H100 SXM / H200: the SM count assumed when no CUDA device is visible
HOST_ONLY_CAPABILITY = (9, 0)  # and the compute capability
MAX_TOP_K = 32
MAX_EXPERTS = 1024
# H and I: 2^19 keeps a bank's row coordinates (L x 2I, L x H rows) and the finalize's column
# blocks inside the kernels' 32-bit and grid-dimension ranges (73x the contract's H)
MAX_DIM = 1 << 19
WORKSPACE_ALIGN = 256
# Route indices are int32 in the routing kernels, which step a CTA's threads past the last
# route (route = begin + r * kRouteThreads + thread): keep every such index below 2^31.
_ROUTE_THREADS = 1024   # moe::kRouteThreads
_MAX_ROUTES = 2**31 - _ROUTE_THREADS
_WEIGHT_KIND = {torch.bfloat16: 0, torch.float32: 1, None: 2}   # None: packed routes
_WEIGHT_NAMES = ("w1", "w1_sf", "w2", "w2_sf")
_CODE_MAX_NAMES = ("w1_sf_max", "w2_sf_max")  # optional in the dict: without them, two multiplies


class _Weights(NamedTuple):
    """A plan's prepared operands (checked to be tensors) and their optional largest scale codes."""
    w1: torch.Tensor
    w1_sf: torch.Tensor
    w2: torch.Tensor
    w2_sf: torch.Tensor
    w1_sf_max: torch.Tensor | None
    w2_sf_max: torch.Tensor | None


_MAX_ROUTE_CHUNKS = 64  # moe::kMaxRouteChunks (cpp/kernels/moe/params.hpp)
_MAX_SPLIT_UNITS = 128  # moe::kMaxSplitUnits
_TILE_HEADER_INTS = 4 + _MAX_SPLIT_UNITS  # moe::kTileHeaderInts: count, unit queue, tile choice, pad, the split flags
_TILE_CHOICE_AT = 2                       # moe::kTileChoiceAt: the header's int32 naming the chosen GEMM pair
_SPLIT_PARK_BYTES = 16384  # moe::kSplitParkBytes


def split_width(decision: PlanDecision, num_tokens: int, top_k: int) -> bool:
    """Whether a plan binds the width per expert (the mirror of the extension's rule,
    cpp/host/mxfp4_moe/mxfp4_moe.cpp): two GEMM pairs, the several-CTA routing, and
    no ``CAKE_MOE_TILE_SPLIT=0`` in the environment at plan time. The routing kernel may then
    list each expert's full tiles for the wider pair and its last, partly filled tile for the
    narrower one, and run both pairs."""
    return (bool(decision.alt_tile) and num_tokens * top_k >= _decide.SPLIT_MIN_ROUTES
            and _env_int("CAKE_MOE_TILE_SPLIT", 1) != 0)


def _env_int(name: str, fallback: int) -> int:
    """The integer value of environment variable ``name`` as the extension reads it (``env_or``
    in cpp/host/mxfp4_moe/mxfp4_moe.cpp: ``atoll``, so a leading integer or 0), or ``fallback``
    where it is unset or empty."""
    value = os.environ.get(name, "")
    if not value:
        return fallback
    lead = re.match(r"\s*[+-]?\d+", value)
    return int(lead.group()) if lead else 0


def _align256(n: int) -> int:
    return (n + 255) // 256 * 256


def _workspace_segments(num_tokens: int, hidden: int, inter: int, num_local: int, top_k: int) -> tuple[int, ...]:
    """Bytes of each workspace segment before padding, in order (see :func:`_workspace_bytes`)."""
    routes = num_tokens * top_k
    tiles = routes // 8 + min(num_local, routes)
    return (
        (num_local + 1) * 4,
        routes * 4,
        routes * 4,
        tiles * 8 + _TILE_HEADER_INTS * 4,
        tiles * 4,
        _MAX_ROUTE_CHUNKS * num_local * 4,
        min(_MAX_SPLIT_UNITS, tiles * -(-2 * inter // 64)) * _SPLIT_PARK_BYTES,
        num_tokens * hidden * 2,
        routes * inter * 2,
        routes * hidden * 2,
        tiles * 8 + _TILE_HEADER_INTS * 4,
    )


def _workspace_bytes(num_tokens: int, hidden: int, inter: int, num_local: int, top_k: int) -> int:
    """Workspace bytes for ``num_tokens`` tokens: the mirror of ``workspace_layout`` in
    cpp/kernels/moe/params.hpp (keep the two identical; the GPU tests compare them).

    With R = T * top_k routes, every segment is padded to 256 bytes, in this order: expert
    offsets (L+1) int32; row_token R int32; route_row R int32; the token-tile list, at most
    R // 8 + min(L, R) tiles of 8 bytes after a header of 132 int32 (the count, GEMM1's unit
    queue, the device's tile choice and split flags); one int32 per tile (GEMM1 CTAs done); 64 x
    L int32 (per-chunk expert counts of the several-CTA routing); the parking slots of GEMM1's K
    halves, 16 KiB for each of min(128, tiles x ceil(2 I / 64)) units; x_bf16 [T, H] bf16;
    act [R, I] bf16; rows [R, H] bf16; a second token-tile list with its header (the width per
    expert: ``split_width``). No segment depends on the tile form, so the total is monotonic in T.
    """
    return _workspace_offsets(num_tokens, hidden, inter, num_local, top_k)["total"]


# the segments of _workspace_segments, by the names of moe::WorkspaceLayout's fields
_SEGMENT_NAMES = ("offsets", "row_token", "route_row", "tiles", "tile_done", "route_chunks", "split_park", "x_bf16",
                  "act", "rows", "alt_tiles")


def _workspace_offsets(num_tokens: int, hidden: int, inter: int, num_local: int, top_k: int) -> dict[str, int]:
    """Each segment's byte offset in the workspace, and the total: the mirror of
    ``moe::workspace_layout`` (a CPU test holds the two equal through the extension)."""
    offsets, at = {}, 0
    for name, size in zip(_SEGMENT_NAMES, _workspace_segments(num_tokens, hidden, inter, num_local, top_k), strict=True):
        offsets[name] = at
        at += _align256(size)
    offsets["total"] = at
    return offsets


def _positive_int(value, name: str) -> int:
    value = _validate.integer(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class CakeMxfp4MoEWrapper:
    """MXFP4-weight x MXFP8-activation routed MoE with SiTU (SPEC §7, docs/mxfp4_moe.md).

    ``num_local_experts`` / ``local_expert_offset`` select expert parallelism (this rank holds
    global experts [offset, offset + L)); ``intermediate_shard`` selects MoE tensor parallelism
    (this rank holds I_shard of the intermediate columns and its output is the rank's partial
    sum). Using both at once is refused. Defaults: L = num_experts, offset 0,
    I_shard = intermediate_size.

    The SM count is read once here, from ``device`` (default: the current CUDA device); without
    a visible CUDA device the host-only default is 132 (H100 SXM / H200). ``plan()`` refuses a
    device whose SM count differs. So is whether the device's DRAM bandwidth per SM is narrow
    (``narrow_memory``: an H100 SXM; host only: False, an H200's), which moves the decode forms'
    limit down, the four-warp narrow decode tiling's up, gives a long shard's wg64x4
    decisions wg96x4 as their second form at every load, and past 96 routes per expert may bind
    wg128x4 with a narrow form for each expert's last tile; passing it takes that part's decisions
    (or the H200's) whatever the device, for host-only planning and tuning: like ``tile=``,
    another form gives results within rounding of the default's, never wrong ones. ``decide``
    and ``get_workspace_size`` are host only.
    ``device="cpu"`` makes plans of CPU tensors that run the FP64 reference (tests, CPU-only
    machines): same API and checks, no kernels.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 num_local_experts: int | None = None, local_expert_offset: int | None = None,
                 intermediate_shard: int | None = None, sm_count: int | None = None,
                 narrow_memory: bool | None = None, device: torch.device | str | int | None = None):
        e = _positive_int(num_experts, "num_experts")
        k = _positive_int(top_k, "top_k")
        h = _positive_int(hidden_size, "hidden_size")
        i = _positive_int(intermediate_size, "intermediate_size")
        num_local = e if num_local_experts is None else _positive_int(num_local_experts, "num_local_experts")
        offset = 0 if local_expert_offset is None else _validate.integer(local_expert_offset, "local_expert_offset")
        if offset < 0:
            raise ValueError(f"local_expert_offset must be an int >= 0, got {local_expert_offset!r}")
        shard = i if intermediate_shard is None else _positive_int(intermediate_shard, "intermediate_shard")
        if k > MAX_TOP_K:
            raise ValueError(f"top_k must be in [1, {MAX_TOP_K}], got {k}")
        if not k <= e <= MAX_EXPERTS:
            raise ValueError(f"num_experts must be in [top_k={k}, {MAX_EXPERTS}], got {e}")
        for name, v in (("hidden_size", h), ("intermediate_size", i)):
            if v > MAX_DIM:
                raise ValueError(f"{name} must be at most {MAX_DIM} (the kernels' 32-bit row coordinates), got {v}")
        _validate.multiple(h, 128, "hidden_size")
        # the argument the caller gave: the shard defaults to intermediate_size
        _validate.multiple(shard, 128, "intermediate_size" if intermediate_shard is None else "intermediate_shard")
        if i % shard:
            raise ValueError(f"intermediate_size ({i}) must be a multiple of intermediate_shard ({shard})")
        if offset + num_local > e:
            raise ValueError(f"local_expert_offset + num_local_experts ({offset} + {num_local}) exceeds "
                             f"num_experts ({e})")
        if num_local < e and shard < i:
            raise ValueError("expert parallelism (num_local_experts/local_expert_offset) and MoE tensor "
                             "parallelism (intermediate_shard) cannot be combined")
        self.num_experts, self.top_k, self.hidden_size, self.intermediate_size = e, k, h, i
        self.num_local_experts, self.local_expert_offset, self.intermediate_shard = num_local, offset, shard
        self.device = self._resolve_device(device)
        self._reference = self.device.type == "cpu"   # plans run the FP64 reference
        on_gpu = torch.cuda.is_available() and not self._reference
        if sm_count is None:
            sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count if on_gpu else \
                HOST_ONLY_SM_COUNT
        self.sm_count = _positive_int(sm_count, "sm_count")
        self.capability = tuple(torch.cuda.get_device_capability(self.device)) if on_gpu else HOST_ONLY_CAPABILITY
        if narrow_memory is None:   # the device's DRAM bandwidth per SM against the threshold; host only: an H200's
            narrow_memory = on_gpu and self._device_narrow_memory()
        elif not isinstance(narrow_memory, bool):
            raise ValueError(f"narrow_memory must be None, True or False, got {narrow_memory!r}")
        self.narrow_memory = narrow_memory
        self._kept = _kept_plans.KeptPlans()   # bound plans by their tensors' identities

    def _device_narrow_memory(self) -> bool:
        """The device's narrow-memory flag; False (an H200's decisions) without the compiled
        extension, where decide() and get_workspace_size() still serve and plan() refuses."""
        try:
            return bool(_runtime.ext().device_narrow_memory(self.device.index))
        except (ImportError, AttributeError):
            return False

    @staticmethod
    def _resolve_device(device: torch.device | str | int | None) -> torch.device:
        if device is None:
            return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        if isinstance(device, torch.device):
            dev = device
        elif isinstance(device, str):
            try:
                dev = torch.device(device)
            except (RuntimeError, ValueError):
                raise ValueError(f"device must name a CUDA device or the CPU ('cuda', 'cuda:N', 'cpu'), "
                                 f"got {device!r}") from None
        else:
            # an index is a CUDA device's, as "cuda:N" (torch.device(N) asks for an accelerator, and there
            # may be none on a host-only machine)
            try:
                index = _validate.integer(device, "device")
            except ValueError:
                raise ValueError(f"device must be a torch.device, a device string or a CUDA device index, got "
                                 f"{device!r} ({type(device).__name__})") from None
            if index < 0:
                raise ValueError(f"device must be a CUDA device index >= 0, got {device!r}")
            dev = torch.device("cuda", index)
        if dev.type == "cpu":
            return torch.device("cpu")
        if dev.type != "cuda":
            raise ValueError(f"device must be a CUDA device or the CPU, got {dev}")
        if dev.index is None:
            return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        if torch.cuda.is_available() and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device must name one of the {torch.cuda.device_count()} CUDA devices, got {dev}")
        return dev

    # ------------------------------------------------------------------ host-only queries

    def decide(self, num_tokens: int, *, tile: str | None = None, tile_sync: bool | None = None) -> PlanDecision:
        """The tile form ``plan()`` uses for ``num_tokens`` tokens (host only; for an sm_90a wgmma
        form also ``alt_tile``, which the device may run instead from the call's route counts);
        ``tile`` forces one of ``_decide.TILES`` (the sm_90a forms only on a compute capability
        9.0 device; a forced form has no alternative), ``tile_sync`` the per-token-tile GEMM1 ->
        GEMM2 sync (mma.sync forms only)."""
        return _decide.decide(num_tokens, self.top_k, self.num_experts, self.hidden_size, self.intermediate_shard,
                              sm90=self.capability == (9, 0), narrow_memory=self.narrow_memory, tile=tile,
                              tile_sync=tile_sync, tile_split=_env_int("CAKE_MOE_TILE_SPLIT", 1) != 0)

    def get_workspace_size(self, num_tokens: int | None = None, *, max_tokens: int | None = None) -> int:
        """Workspace bytes for ``num_tokens`` tokens (host only). The size is monotonic in T, so
        ``max_tokens=M`` gives one workspace that serves every T <= M. Pass exactly one."""
        if (num_tokens is None) == (max_tokens is None):
            raise ValueError("pass exactly one of num_tokens and max_tokens")
        name, given = ("num_tokens", num_tokens) if max_tokens is None else ("max_tokens", max_tokens)
        t = _positive_int(given, name)
        refusal = _decide.token_rows_refusal(t, self.top_k, self.hidden_size, self.intermediate_shard)
        if refusal:
            raise ValueError(f"{name}: {refusal}")
        try:
            size_fn = _runtime.ext().mxfp4_moe_workspace_bytes
        except (ImportError, AttributeError):    # no compiled extension here: the Python mirror
            size_fn = _workspace_bytes
        return int(size_fn(t, self.hidden_size, self.intermediate_shard, self.num_local_experts, self.top_k))

    # ------------------------------------------------------------------ plan

    def _weights(self, w1, w1_sf, w2, w2_sf, w1_sf_max, w2_sf_max) -> _Weights:
        """The four prepared operands and the two per-expert largest scale codes, from the dict
        of prepare_cake_mxfp4_weights, or positional with the codes as keywords (without them
        every expert converts with two multiplies)."""
        if isinstance(w1, dict):
            weights = self._weights_of_dict(w1, (w1_sf, w2, w2_sf, w1_sf_max, w2_sf_max))
        else:
            weights = (w1, w1_sf, w2, w2_sf, w1_sf_max, w2_sf_max)
        if (weights[4] is None) != (weights[5] is None):
            raise ValueError(f"{_CODE_MAX_NAMES[0]} and {_CODE_MAX_NAMES[1]} come together (both or neither)")
        w1, w1_sf, w2, w2_sf = (_validate.tensor(t, name, contiguous=False) for t, name in zip(weights, _WEIGHT_NAMES))
        return _Weights(w1, w1_sf, w2, w2_sf, weights[4], weights[5])

    def _weights_of_dict(self, w1: dict, others: tuple) -> tuple[torch.Tensor | None, ...]:
        if any(t is not None for t in others):
            raise ValueError("pass the prepared weights either as the dict or as four tensors, not both")
        if w1.get("layout") != LAYOUT:
            raise ValueError(f"w1: the weights dict must have layout {LAYOUT!r} (prepare_cake_mxfp4_weights), "
                             f"got {w1.get('layout')!r}")
        expected = {"num_local_experts": self.num_local_experts, "hidden_size": self.hidden_size,
                    "intermediate_shard": self.intermediate_shard}
        for key, value in expected.items():
            if w1.get(key) != value:
                raise ValueError(f"w1: the weights dict has {key}={w1.get(key)!r}, the wrapper expects {value}")
        missing = [name for name in _WEIGHT_NAMES if name not in w1]
        if missing:
            raise ValueError(f"w1: the weights dict lacks {', '.join(missing)} (pass prepare_cake_mxfp4_weights' dict "
                             "whole)")
        return tuple(w1[name] for name in _WEIGHT_NAMES) + tuple(w1.get(name) for name in _CODE_MAX_NAMES)

    def _check_tensors(self, tensors: dict, num_tokens: int) -> None:
        """dtype, shape, contiguity and alignment of every argument (plan() checks the devices first)."""
        t, h, k = num_tokens, self.hidden_size, self.top_k
        num_local, shard = self.num_local_experts, self.intermediate_shard
        specs = {   # name: (dtypes, shape, byte alignment)
            "x_sf": ((torch.uint8,), (t, h // 32), 0),
            "topk_ids": ((torch.int32,), (t, k), 4),
            "topk_weights": ((torch.bfloat16, torch.float32), (t, k), 4),
            "w1": ((torch.uint8,), (num_local, 2 * shard, h // 2), 16),
            "w1_sf": ((torch.uint8,), (num_local, 2 * shard, h // 32), 16),
            "w2": ((torch.uint8,), (num_local, h, shard // 2), 16),
            "w2_sf": ((torch.uint8,), (num_local, h, shard // 32), 16),
            "w1_sf_max": ((torch.uint8,), (num_local,), 0),
            "w2_sf_max": ((torch.uint8,), (num_local,), 0),
            "beta": ((torch.float32,), (num_local,), 4),
            "linear_beta": ((torch.float32,), (num_local,), 4),
            "output": ((torch.bfloat16,), (t, h), 16),
        }
        for name, (dtypes, shape, align) in specs.items():
            if name in ("topk_weights", *_CODE_MAX_NAMES) and tensors[name] is None:
                continue
            _validate.tensor(tensors[name], name, dtypes=dtypes, ndim=len(shape), align=align)
            _validate.shape(tensors[name], name, shape)
        ws = _validate.tensor(tensors["workspace"], "workspace", dtypes=(torch.uint8,), ndim=1,
                              align=0 if self._reference else WORKSPACE_ALIGN)   # the reference does not use it
        need = self.get_workspace_size(t)
        if ws.numel() < need:
            raise ValueError(f"workspace must hold at least {need} bytes for {t} tokens "
                             f"(get_workspace_size), got {ws.numel()}")

    def plan(self, x: torch.Tensor, x_sf: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor | None,
             w1: torch.Tensor | dict, w1_sf: torch.Tensor | None = None, w2: torch.Tensor | None = None,
             w2_sf: torch.Tensor | None = None, *, beta: torch.Tensor | None = None,
             linear_beta: torch.Tensor | None = None,
             workspace: torch.Tensor, output: torch.Tensor, tile: str | None = None,
             tile_sync: bool | None = None, w1_sf_max: torch.Tensor | None = None,
             w2_sf_max: torch.Tensor | None = None) -> Mxfp4MoEPlan:
        """Validate and bind caller-owned buffers for ``T = x.shape[0]`` tokens and load the
        kernels into the device's context. Enqueues nothing: the first :meth:`Mxfp4MoEPlan.run`
        may be the one a CUDA graph captures. Call it outside graph capture.

        x [T, H] float8_e4m3fn with x_sf [T, H/32] uint8 (UE8M0); topk_ids [T, top_k] int32
        global expert ids; topk_weights [T, top_k] bf16 or fp32, or None when topk_ids holds
        packed routes ``(id << 16) | bf16_bits(weight)``; the prepared weights (the dict of
        :func:`prepare_cake_mxfp4_weights` as ``w1``, or its four tensors, then with its
        ``w1_sf_max`` / ``w2_sf_max`` as keywords: without those largest scale codes the sm_90a
        forms convert with two multiplies, same bits, 2-12% slower); beta, linear_beta fp32 [L];
        workspace uint8 [>= get_workspace_size(T)], 256-byte aligned; output [T, H] bf16. Every
        tensor is contiguous and on the wrapper's device; output and workspace share no memory
        with each other or with any input. ``tile`` overrides the decision
        table's tile form (and binds that one alone) and ``tile_sync`` its GEMM1 -> GEMM2 sync
        (see :meth:`decide`). Each form is repeatable to the bit; the sm_90a wgmma forms give
        the same bits as each other, the mma.sync forms sum K in other orders and agree with
        them to rounding; ``tile_sync`` changes no bit.

        The four weight tensors must be the prepared ones: the canonical bank has the same
        shapes and dtypes (only the row order differs), so nothing can refuse it, and it gives
        wrong results; pass the dict to have its layout checked. The plan binds the tensors'
        memory: write new values in place, never ``set_`` or ``resize_`` a bound tensor. Plans
        that share a workspace must not run at the same time (on two streams unordered by
        events; ``CAKE_MOE_CHECK=1`` refuses such a run where it finds the other still going), and
        :meth:`Mxfp4MoEPlan.last_tile` reads the workspace, so it describes the last run of any
        plan bound to it.

        The wrapper keeps what it binds: called again with the same tensors (addresses, shapes,
        strides, dtypes, devices), ``tile``, ``tile_sync`` and environment, ``plan()`` skips the
        checks and the binding and returns a plan around the one bound before, so eager code may
        plan every step on its buffers (``CAKE_MOE_ONE_SHOT_CACHE=0``: check and bind every call).
        """
        if _capturing(self.device):
            raise RuntimeError("CakeMxfp4MoEWrapper.plan() cannot run during CUDA graph capture: plan outside "
                               "the capture and capture plan.run()")
        if beta is None or linear_beta is None:
            raise ValueError(f"{'beta' if beta is None else 'linear_beta'} is required (fp32 [num_local_experts]; "
                             "the SiTU defaults are 4 and 25)")
        given = (w1, w1_sf, w2, w2_sf, w1_sf_max, w2_sf_max)
        key = kept = None
        if not self._reference:
            weights = _kept_plans.weights(given)
            key = self._kept.key((x, x_sf, topk_ids, topk_weights, beta, linear_beta, workspace, output), given,
                                 weights, (tile, tile_sync, type(tile_sync)))   # (True == 1: only a bool passes)
            kept = None if key is None else self._kept.get(key)
        if kept is not None:   # these tensors passed every check below and were bound before
            return self._plan_of(kept, x, x_sf, topk_ids, topk_weights, weights, (beta, linear_beta), workspace,
                                 output)
        pw = self._weights(*given)
        tensors: dict[str, torch.Tensor | None] = {
            "x": x, "x_sf": x_sf, "topk_ids": topk_ids, "topk_weights": topk_weights, **pw._asdict(),
            "beta": beta, "linear_beta": linear_beta, "workspace": workspace, "output": output}
        # the device first: a tensor on another device is the cause of whatever else looks wrong with it
        # (a non-tensor is refused by its own check below)
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, expected {self.device} (the wrapper's device)")
        _validate.tensor(x, "x", dtypes=(torch.float8_e4m3fn,), ndim=2, align=16)
        num_tokens = x.shape[0]
        if x.shape[1] != self.hidden_size:
            raise ValueError(f"x must have hidden_size={self.hidden_size} columns, got shape {tuple(x.shape)}")
        # a refused token count is x's (T = x.shape[0]); a refused tile or tile_sync names itself
        refusal = _decide.token_count_refusal(num_tokens, self.top_k, self.hidden_size, self.intermediate_shard)
        if refusal:
            raise ValueError(f"x: {refusal}")
        decision = self.decide(num_tokens, tile=tile, tile_sync=tile_sync)
        if not decision.supported:
            raise ValueError(decision.reason)
        if num_tokens * self.top_k > _MAX_ROUTES:
            raise ValueError(f"x: T * top_k = {num_tokens * self.top_k} routes exceed the int32 route index")
        self._check_tensors(tensors, num_tokens)
        present = [(name, t) for name, t in tensors.items() if t is not None]
        _validate.no_overlap([("output", output), ("workspace", workspace)],
                             [(name, t) for name, t in present if name not in ("output", "workspace")])
        if self._reference:
            bound = _ops.ReferencePlan(x=x, x_sf=x_sf, topk_ids=topk_ids, topk_weights=topk_weights, w1=pw.w1,
                                       w1_sf=pw.w1_sf, w2=pw.w2, w2_sf=pw.w2_sf, beta=beta, linear_beta=linear_beta,
                                       output=output,
                                       num_experts=self.num_experts, num_local_experts=self.num_local_experts,
                                       local_expert_offset=self.local_expert_offset)
            entry = _kept_plans.Bound(bound, decision, None)
        else:
            entry = self._bind(pw, x, x_sf, topk_ids, topk_weights, beta, linear_beta, workspace, output, decision)
            if key is not None:
                self._kept.put(key, entry)
        return self._plan_of(entry, x, x_sf, topk_ids, topk_weights, pw, (beta, linear_beta), workspace, output)

    def _bind(self, pw: _Weights, x, x_sf, topk_ids, topk_weights, beta, linear_beta, workspace, output,
              decision: PlanDecision) -> _kept_plans.Bound:
        """The extension's plan for checked tensors (after the device's own checks)."""
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        if sms != self.sm_count:
            raise RuntimeError(f"{self.device} has {sms} SMs but this wrapper was configured for "
                               f"sm_count={self.sm_count}; build a wrapper for this device")
        cap = tuple(torch.cuda.get_device_capability(self.device))
        if cap != self.capability:
            raise RuntimeError(f"{self.device} has compute capability {cap} but this wrapper was configured "
                               f"for {self.capability}; build a wrapper for this device")
        _runtime.require_served(self.device, "mxfp4_moe")
        num_tokens = x.shape[0]
        weights_kind = _WEIGHT_KIND[None if topk_weights is None else topk_weights.dtype]
        (gemm1_tile, *alt1), (gemm2_tile, *alt2) = _decide.bound_gemm_tiles(decision)
        alt = {}
        if decision.alt_tile:
            alt = dict(gemm1_alt_tile=alt1[0], gemm2_alt_tile=alt2[0], tile_cost=_tile_cost.tile_cost_milli(decision.tile),
                       alt_tile_cost=_tile_cost.tile_cost_milli(decision.alt_tile))
        bound = _runtime.ext().mxfp4_moe_plan(
            x.view(torch.uint8), x_sf, topk_ids, topk_weights, weights_kind, pw.w1, pw.w1_sf, pw.w2, pw.w2_sf, beta,
            linear_beta, workspace, output, pw.w1_sf_max, pw.w2_sf_max, num_tokens=num_tokens, hidden=self.hidden_size,
            inter=self.intermediate_shard, num_experts=self.num_experts, num_local=self.num_local_experts,
            local_offset=self.local_expert_offset, top_k=self.top_k, gemm1_tile=gemm1_tile, gemm2_tile=gemm2_tile,
            tile_sync=decision.tile_sync, **alt)
        at = _workspace_offsets(num_tokens, self.hidden_size, self.intermediate_shard, self.num_local_experts,
                                self.top_k)
        choice_at = at["tiles"] + 4 * _TILE_CHOICE_AT   # in the tile list's header
        alt_choice_at = at["alt_tiles"] + 4 * _TILE_CHOICE_AT   # the second list's
        split = bound.split_width   # the host's own decision (split_width mirrors it; a GPU test checks)
        return _kept_plans.Bound(bound, decision, (choice_at, alt_choice_at if split else None))

    def _plan_of(self, entry: _kept_plans.Bound, x, x_sf, topk_ids, topk_weights, pw, betas: tuple,
                 workspace: torch.Tensor, output: torch.Tensor) -> Mxfp4MoEPlan:
        """The plan object around a bound plan, holding the tensors it was bound to (the extension
        holds their addresses only)."""
        w1, w1_sf, w2, w2_sf, w1_sf_max, w2_sf_max = pw
        keep = tuple(t for t in (x, x_sf, topk_ids, topk_weights, w1, w1_sf, w2, w2_sf, w1_sf_max, w2_sf_max,
                                 *betas, workspace, output) if t is not None)
        code_max = () if w1_sf_max is None or w2_sf_max is None else \
            (("w1_sf_max", w1_sf, w1_sf_max), ("w2_sf_max", w2_sf, w2_sf_max))
        return Mxfp4MoEPlan(entry.plan, decision=entry.decision, device=self.device, num_tokens=x.shape[0],
                            num_experts=self.num_experts, output=output, inputs=(x, x_sf, topk_ids, topk_weights),
                            keep=keep, code_max=() if self._reference else code_max,
                            workspace=workspace, choice_at=entry.choice_at)

    def release(self) -> None:
        """Drop the plans this wrapper keeps for the tensors it bound (plans already returned
        keep working; the next ``plan()`` of each tensor set binds anew)."""
        self._kept.clear()

    def __repr__(self) -> str:
        return (f"CakeMxfp4MoEWrapper(num_experts={self.num_experts}, top_k={self.top_k}, "
                f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_local_experts={self.num_local_experts}, local_expert_offset={self.local_expert_offset}, "
                f"intermediate_shard={self.intermediate_shard}, sm_count={self.sm_count}, "
                f"narrow_memory={self.narrow_memory}, device={self.device})")
