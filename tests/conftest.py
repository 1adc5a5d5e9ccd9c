"""Shared test plumbing: the `gpu` marker skips without CUDA (and says so), NaN poisoning."""
from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: not run here (run ci/gpu.sh on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output with NaN (floating) or 0xFF bytes before a kernel writes it."""
    if t.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return t.fill_(float("nan"))
    t.view(torch.uint8).fill_(0xFF)
    return t


@pytest.fixture
def poison():
    return poison_
