"""The package's functional ``cake_moe::*`` ops: defined on one torch.library fragment.

``torch.library.custom_op`` runs every call through Python wrappers (an autograd kernel, an
aliasing check of the results) that cost ~20 us of host time per call on a server CPU, several
times the call itself; compiled code pays that at every op it runs. An op defined here has its
CPU and CUDA kernels registered directly (the dispatcher's Python trampoline, ~3 us) and a
fallthrough at the Autograd key: as the eager functions' results, its results carry no autograd
graph (the kernels record none, and the CPU path runs its reference under no_grad).
Ops that mutate an argument or have a backward (``grouped_mm``, the ``*_out`` forms,
``mxfp4_moe_run``) stay ``custom_op``s, which bump the version counters of what they mutate.
"""
from __future__ import annotations

from typing import Callable

import torch

# The registrations live as long as this fragment does: keep it for the life of the process.
_LIB = torch.library.Library("cake_moe", "FRAGMENT")


def functional_op(schema: str, impl: Callable, fake: Callable) -> None:
    """Define ``cake_moe::<schema>`` with ``impl`` as its CPU and CUDA kernel and ``fake`` as its
    fake (meta) implementation for tracing."""
    name = schema[:schema.index("(")]
    _LIB.define(schema)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, impl, key)
    _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(f"cake_moe::{name}", fake, lib=_LIB)
