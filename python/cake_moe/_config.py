"""Process-wide settings: ``cake_moe.configure(...)``."""
from __future__ import annotations

import logging

import torch

_log = logging.getLogger("cake_moe")
_VARIANTS = ("det", "fast")
_state: dict[str, object] = {"grouped_gemm_variant": None, "warned_forced_det": False}


def configure(*, grouped_gemm_variant: str | None = None) -> None:
    """Set process-wide defaults.

    ``grouped_gemm_variant``: ``"det"`` (every output reduced in a fixed order, bitwise
    repeatable; the default) or ``"fast"`` (the weight gradient may add a split-K tail with FP32
    atomics). ``torch.use_deterministic_algorithms(True)`` forces ``det``; asking for ``fast``
    while it is on raises ValueError. ``None`` restores the default.
    """
    if grouped_gemm_variant is not None:
        if grouped_gemm_variant not in _VARIANTS:
            raise ValueError(f"grouped_gemm_variant must be 'det' or 'fast', got {grouped_gemm_variant!r}")
        if grouped_gemm_variant == "fast" and torch.are_deterministic_algorithms_enabled():
            raise ValueError("grouped_gemm_variant='fast' conflicts with torch.use_deterministic_algorithms(True)")
    _state["grouped_gemm_variant"] = grouped_gemm_variant


def grouped_gemm_variant(requested: str | None = None) -> str:
    """The variant a grouped-GEMM call runs: the explicit request, else the configured one,
    else ``det``; deterministic mode forces ``det`` (logged once) and refuses an explicit
    ``fast``."""
    if requested is not None and requested not in _VARIANTS:
        raise ValueError(f"variant must be 'det' or 'fast', got {requested!r}")
    deterministic = torch.are_deterministic_algorithms_enabled()
    if requested == "fast" and deterministic:
        raise ValueError("variant='fast' was requested under torch.use_deterministic_algorithms(True)")
    return inherited_variant(str(requested or _state["grouped_gemm_variant"] or "det"))


def inherited_variant(variant: str) -> str:
    """A variant chosen before (the configured one, or a forward's for its backward): ``det``
    while deterministic algorithms are enabled (logged once), else itself."""
    if variant == "fast" and torch.are_deterministic_algorithms_enabled():
        if not _state["warned_forced_det"]:
            _log.warning("cake_moe: deterministic algorithms are enabled; grouped GEMM runs the 'det' variant")
            _state["warned_forced_det"] = True
        return "det"
    return variant
