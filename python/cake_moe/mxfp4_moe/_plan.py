"""``Mxfp4MoEPlan``: a bound MXFP4 MoE layer for one token count (made by
``CakeMxfp4MoEWrapper.plan``), its debug checks and its path under ``torch.compile``."""
from __future__ import annotations

import torch

from .. import _runtime, _validate
from . import _ops
from ._decide import PlanDecision
from ._prepare import scale_code_max

_BIG_SCALE_CODE = 128   # codes above need the two-multiply conversion (weight_fragments.cuh kBigScaleCode)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available() and _runtime.capturing(device)


def _check_mode() -> bool:
    """Debug mode (env CAKE_MOE_CHECK=1): every run() synchronises and validates expert ids."""
    return _runtime.env("CAKE_MOE_CHECK") == "1"


# Debug mode's record of each workspace's last run: (device index, address) -> an event recorded
# after it. A run that finds that event still pending after its own checks synchronised its
# stream is not ordered after that run (plans sharing a workspace must not run at once). Emptied
# when full: a forgotten workspace only loses the check of its next run.
_MAX_WORKSPACE_RUNS = 1024
_workspace_runs: dict[tuple[int, int], torch.cuda.Event] = {}


# x, x_sf, topk_ids, topk_weights (None: packed routes)
_Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"]


class Mxfp4MoEPlan:
    """A bound MXFP4 MoE layer for one token count. :meth:`run` enqueues dequantize, route,
    GEMM1, GEMM2 and finalize on the current stream (with an sm_90a wgmma form, each GEMM beside
    the second form the routing kernel may choose: ``decision.alt_tile``, :meth:`last_tile`): no
    allocation, no host synchronisation, capturable in a CUDA graph. It reads the values in the
    bound tensors at run time, so new tokens, routes or weights written in place are picked up
    by the next run (or replay); new scales need their largest codes (``w1_sf_max`` /
    ``w2_sf_max``, when bound) written too. Plans that share a workspace must run in order:
    on one stream, or on streams ordered by events.
    Under ``torch.compile`` :meth:`run` is the op ``cake_moe::mxfp4_moe_run`` (``fullgraph=True``
    works); a plan made on a CPU wrapper runs the FP64 reference instead of the kernels.

    With ``CAKE_MOE_CHECK=1`` in the environment (a debug mode), every run outside graph
    capture first synchronises and raises ValueError if an expert id is outside [0, E), or if a
    bound largest code says <= 128 for an expert whose scales hold a larger one, and
    RuntimeError if the last run on its workspace (by any plan, on another stream) has not
    finished although the current stream has (the two runs are not ordered).
    """

    def __init__(self, plan, *, decision: PlanDecision, device: torch.device, num_tokens: int, num_experts: int,
                 output: torch.Tensor, inputs: _Inputs, keep: tuple[torch.Tensor, ...],
                 code_max: tuple[tuple[str, torch.Tensor, torch.Tensor], ...] = (),
                 workspace: torch.Tensor | None = None, choice_at: tuple[int, int | None] | None = None):
        self._plan = plan
        self._reference = isinstance(plan, _ops.ReferencePlan)   # a CPU wrapper's plan: no stream
        self._device = device
        self._num_experts = num_experts
        # x (as its bytes: float8 tensors cannot be compared by the op checks), x_sf, topk_ids,
        # topk_weights (None: packed routes)
        self._inputs = (_runtime.as_bytes(inputs[0]), *inputs[1:])
        self._x = inputs[0]   # as given (FP8): a compiled run() views it as bytes inside the graph
        self._topk_ids = inputs[2]
        self._packed = inputs[3] is None
        self._keep = keep        # the extension holds raw pointers: the tensors live as long as the plan
        self._code_max = code_max  # (name, scales [L, rows, cols], largest codes [L]) bound to the kernels
        # byte offsets in the workspace of the int32 naming the pair the routing kernel chose and,
        # with the width per expert, of the alt pair's word (0: it ran); read by last_tile() only
        self._workspace, self._choice_at = workspace, choice_at
        # its key in _workspace_runs (debug mode), None without a CUDA workspace
        self._workspace_key = ((workspace.get_device(), workspace.data_ptr())
                               if workspace is not None and workspace.is_cuda else None)
        self.decision = decision
        self.num_tokens = num_tokens
        self.output = output
        self._number = _ops.register(self)   # how the torch.library op finds this plan

    @property
    def forms(self) -> str:
        """The kernel forms this plan launches, as the extension reports them."""
        return self._plan.forms

    def last_tile(self) -> str:
        """The tile form of the last run: ``decision.tile``, or where the decision names an
        ``alt_tile``, the one of the two that the routing kernel chose from that run's route
        counts, or ``"TILE+ALT"`` where it ran both (the width per expert, ``split_width``).
        Reads the workspace, so it waits for the device (every stream of it, whichever ran the
        plan): for diagnostics and benchmarks, not for the serving path."""
        if not self.decision.alt_tile or self._workspace is None or self._choice_at is None:
            return self.decision.tile
        choice_at, alt_choice_at = self._choice_at
        first_runs = self._word(choice_at) == 0
        if alt_choice_at is None:
            return self.decision.tile if first_runs else self.decision.alt_tile
        alt_runs = self._word(alt_choice_at) == 0
        if first_runs and alt_runs:
            return f"{self.decision.tile}+{self.decision.alt_tile}"
        return self.decision.tile if first_runs else self.decision.alt_tile

    def _word(self, at: int) -> int:
        assert self._workspace is not None
        if self._workspace.is_cuda:
            torch.cuda.synchronize(self._workspace.device)
        return int(self._workspace[at:at + 4].view(torch.int32).item())   # synchronises

    def _check_ids(self) -> None:
        ids = self._topk_ids >> 16 if self._packed else self._topk_ids
        bad = int(((ids < 0) | (ids >= self._num_experts)).sum().item())    # synchronises
        if bad:
            raise ValueError(f"topk_ids holds {bad} expert id(s) outside [0, {self._num_experts}) "
                             "(CAKE_MOE_CHECK=1; without it such routes contribute nothing)")

    def _check_code_max(self) -> None:
        for name, scales, code_max in self._code_max:
            actual = scale_code_max(scales)
            stale = int(((actual > _BIG_SCALE_CODE) & (code_max <= _BIG_SCALE_CODE)).sum().item())  # synchronises
            if stale:
                raise ValueError(f"{name} says <= {_BIG_SCALE_CODE} for {stale} expert(s) whose scales hold a larger "
                                 "code: after writing new scales, write their largest codes too (the "
                                 f"{name} of a new prepare_cake_mxfp4_weights) (CAKE_MOE_CHECK=1)")

    def _check_workspace_order(self) -> None:
        """After a check synchronised the current stream: the workspace's last run must be done."""
        last = _workspace_runs.get(self._workspace_key) if self._workspace_key is not None else None
        if last is not None and not last.query():
            raise RuntimeError("the last run on this plan's workspace (on another stream) has not finished and the "
                               "current stream does not wait for it: plans that share a workspace must run in "
                               "order, on one stream or on streams ordered by events (CAKE_MOE_CHECK=1)")

    def _note_workspace_run(self) -> None:
        if self._workspace_key is None:
            return
        if len(_workspace_runs) >= _MAX_WORKSPACE_RUNS:
            _workspace_runs.clear()
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self._device))
        _workspace_runs[self._workspace_key] = done

    def run(self) -> torch.Tensor:
        """Enqueue the layer on the current stream; returns the bound output tensor."""
        if torch.compiler.is_compiling():
            # x viewed as bytes here, in the graph: the FP8 tensor and a uint8 view of it as two
            # graph inputs would be aliased inputs of two dtypes, which AOTAutograd refuses
            # when a compiled step writes new tokens into x
            torch.ops.cake_moe.mxfp4_moe_run(self._number, _runtime.as_bytes(self._x), *self._inputs[1:], self.output)
            return self.output
        checking = _check_mode() and not _capturing(self._device)
        if checking:
            self._check_ids()          # these synchronise the current stream
            self._check_code_max()
            self._check_workspace_order()
        self._plan.run(0 if self._reference else _runtime.stream_handle(self._device))
        if checking:
            self._note_workspace_run()
        return self.output

    def run_with(self, x: torch.Tensor, x_sf: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor | None, output: torch.Tensor) -> torch.Tensor:
        """:meth:`run` on the given tensors: each one that is not the bound tensor (same shape
        and dtype; ``x`` may be given as its uint8 bytes) is copied into it first, and the bound
        output into ``output`` after; then the bound tensors it filled get their contents back,
        so that no tensor but ``output`` changes (the op ``cake_moe::mxfp4_moe_run``, which runs
        this, declares only ``output`` as written: a compiled graph may read a bound tensor
        after the op and expect what it held before). With the bound tensors it is
        :meth:`run`, with no copy."""
        given = (_runtime.as_bytes(x) if isinstance(x, torch.Tensor) else x, x_sf, topk_ids, topk_weights, output)
        for name, t, bound in zip(("x", "x_sf", "topk_ids", "topk_weights", "output"), given,
                                  (*self._inputs, self.output)):
            if (t is None) != (bound is None):
                raise ValueError(f"{name}: the plan was made {'without' if bound is None else 'with'} it")
            if t is not None and bound is not None:
                _validate.tensor(t, name, contiguous=False, device=bound.device, device_of=f"the bound {name}")
                if t.shape != bound.shape or t.dtype != bound.dtype:
                    raise ValueError(f"{name} must match the bound tensor: {tuple(bound.shape)} {bound.dtype}, "
                                     f"got {tuple(t.shape)} {t.dtype}")
        restore = []   # (bound tensor, what it held): put back whatever happens after the first copy
        try:
            for t, bound in zip(given[:4], self._inputs):
                if t is not None and bound is not None and (t.data_ptr(), t.stride()) != (bound.data_ptr(), bound.stride()):
                    restore.append((bound, bound.clone()))
                    bound.copy_(t)
            other_output = (output.data_ptr(), output.stride()) != (self.output.data_ptr(), self.output.stride())
            if other_output:
                restore.append((self.output, self.output.clone()))
            self.run()
            if other_output:
                output.copy_(self.output)
        finally:
            for bound, held in restore:
                bound.copy_(held)
        return output

    def __repr__(self) -> str:
        return (f"Mxfp4MoEPlan(num_tokens={self.num_tokens}, path={self.decision.path!r}, "
                f"block_n={self.decision.block_n}, forms={self.forms!r})")
