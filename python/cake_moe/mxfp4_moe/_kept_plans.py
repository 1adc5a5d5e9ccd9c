"""The bound plans a wrapper keeps, so that ``plan()`` called again with the same tensors (eager
code that plans every step on the same buffers) skips the checks and the binding.

A key holds every tensor argument's identity (address, shape, strides, dtype, device), the
weights dict's layout fields, ``tile`` and ``tile_sync``, and the environment the extension
reads when it binds: everything the checks and the binding read. A call whose key is kept
would pass every check and bind the same plan, so it gets the kept one. The extension's plan
holds addresses, not tensors: a kept plan keeps no memory alive, and tensors that come back at
the same addresses with the same layout (as a caching allocator's do) find it.
"""
from __future__ import annotations

import atexit
import weakref
from typing import Any, NamedTuple

from .. import _runtime
from ._decide import PlanDecision

# What the extension's make_plan reads from the environment (cpp/host/mxfp4_moe/mxfp4_moe.cpp,
# std::getenv and env_or; CAKE_MOE_TILE_SPLIT also by split_width): a test checks the source.
PLAN_SWITCHES = ("CAKE_MOE_TILE_SPLIT", "CAKE_MOE_CODE_RING", "CAKE_MOE_UNIT_QUEUE", "CAKE_MOE_SPLIT_FROM",
                 "CAKE_MOE_SPLIT_MAX", "CAKE_MOE_SPLIT_ALL_MAX", "CAKE_MOE_LOOKAHEAD_SKEW")
CACHE_SWITCH = _runtime.KEEP_SWITCH   # "0": bind anew on every call (the grouped GEMM's switch too)
# A full cache is emptied at once. An entry is the extension's plan (its kernel parameters and
# tensor maps: a few KB) and its key (~4.4 KB): some 30 MB of host memory at the cap. One
# wrapper may serve every MoE layer of a model (they share the configuration), with an entry per
# layer and token count: 4096 hold a 61-layer model's decode steps at 64 token counts (a cache
# smaller than what a step cycles through would be emptied again before any entry is found).
MAX_KEPT = 4096
_DICT_FIELDS = ("layout", "num_local_experts", "hidden_size", "intermediate_shard")
_WEIGHT_NAMES = ("w1", "w1_sf", "w2", "w2_sf", "w1_sf_max", "w2_sf_max")


class Bound(NamedTuple):
    """What a plan object is made around: the extension's plan (or the CPU reference's), the
    decision it was bound for, and where its tile choices sit in the workspace."""
    plan: Any
    decision: PlanDecision
    choice_at: tuple[int, int | None] | None


def weights(given: tuple) -> tuple:
    """plan()'s six weight arguments as tensors: the prepared dict's, or as given."""
    w1 = given[0]
    return tuple(w1.get(name) for name in _WEIGHT_NAMES) if isinstance(w1, dict) else given


class KeptPlans:
    def __init__(self) -> None:
        self._plans: dict[tuple, Bound] = {}
        _every.add(self)

    def __len__(self) -> int:
        return len(self._plans)

    @staticmethod
    def key(tensors: tuple, given: tuple, weights: tuple, options: tuple) -> tuple | None:
        """The key of a plan() call (``tensors``: its other tensor arguments, ``given``: its six
        weight arguments, ``weights``: :func:`weights` of them, ``options``: tile and tile_sync),
        or None where nothing is kept for it (the switch is off, or an argument is not a tensor:
        the checks name it)."""
        if not _runtime.keeps_bound_work():
            return None
        w1 = given[0]
        if isinstance(w1, dict):
            # the positional weights stay in the key: given beside the dict, they are refused
            fields: tuple | None = tuple(w1.get(name) for name in _DICT_FIELDS)
            tensors = (*tensors, *weights, *given[1:])
        else:
            fields = None
            tensors = (*tensors, *given)
        try:
            identities = [None if t is None else _runtime.tensor_identity(t) for t in tensors]
        except AttributeError:
            return None
        return (fields, options, *identities, *map(_runtime.env, PLAN_SWITCHES))

    def get(self, key: tuple) -> Bound | None:
        try:
            return self._plans.get(key)
        except TypeError:   # an unhashable tile or dict field: the checks refuse it
            return None

    def put(self, key: tuple, bound: Bound) -> None:
        if len(self._plans) >= MAX_KEPT:
            self._plans.clear()
        try:
            self._plans[key] = bound
        except TypeError:   # a field the checks let through but that cannot be a key: keep nothing
            pass

    def clear(self) -> None:
        self._plans.clear()


_every: weakref.WeakSet[KeptPlans] = weakref.WeakSet()


@atexit.register
def clear_all() -> None:
    """Empty every wrapper's cache: at exit, before the extension's types go (nanobind reports
    plans still alive then as leaks; a wrapper may live as long as the interpreter)."""
    for kept in list(_every):
        kept.clear()
