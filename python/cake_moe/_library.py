"""The package's ``cake_moe::*`` ops, defined on one torch.library fragment.

``torch.library.custom_op`` runs every call through Python wrappers (an autograd kernel, an
aliasing check of the results, for an op that writes an argument an ADInplaceOrView kernel)
that cost ~15-40 us of host time per call on a server CPU, several times the call itself;
compiled code pays that at every op it runs. An op defined here has its CPU and CUDA kernels
registered directly (the dispatcher's Python trampoline, ~3-4 us). Without a registered
backward it has a fallthrough at the Autograd key: as the eager functions' results, its results
carry no autograd graph (the kernels record none, and the CPU path runs its reference under
no_grad). An argument the schema marks written (``Tensor(a!)``) has its version counter bumped
by the kernel, as an in-place op does, so that autograd still sees the write.
"""
from __future__ import annotations

from typing import Callable

import torch

# The registrations live as long as this fragment does: keep it for the life of the process.
_LIB = torch.library.Library("cake_moe", "FRAGMENT")


def _bumping(impl: Callable, written: list[int]) -> Callable:
    def kernel(*args, **kwargs):
        result = impl(*args, **kwargs)
        for i in written:
            if not args[i].is_inference():   # (inference tensors keep no version counter)
                torch.autograd.graph.increment_version(args[i])
        return result
    return kernel


def define(schema: str, impl: Callable, fake: Callable, *,
           autograd: tuple[Callable, Callable] | None = None) -> None:
    """Define ``cake_moe::<schema>`` with ``impl`` as its CPU and CUDA kernel and ``fake`` as its
    fake (meta) implementation for tracing; ``autograd``: its ``(backward, setup_context)``, as
    ``torch.library.register_autograd`` takes them (without: its results record no graph)."""
    name = schema[:schema.index("(")]
    _LIB.define(schema)
    arguments = getattr(torch.ops.cake_moe, name).default._schema.arguments
    written = [i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
    kernel = _bumping(impl, written) if written else impl
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, kernel, key)
    torch.library.register_fake(f"cake_moe::{name}", fake)
    if autograd is None:
        _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")
    else:
        backward, setup_context = autograd
        torch.library.register_autograd(f"cake_moe::{name}", backward, setup_context=setup_context)
