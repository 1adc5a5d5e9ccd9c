"""Shared test plumbing: the `gpu` marker skips without CUDA (and says so), NaN poisoning, tensor
digests, the check that calls never make the host wait for the GPU, the seeds of the randomized
sweeps, and the family-B layer fixtures (built once per test module)."""
from __future__ import annotations

import contextlib
import hashlib
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def _random_seeds(spec: str) -> range:
    """Seeds of each family's randomized sweep: "N" runs seeds 0..N-1, "A:B" runs A..B-1 (a deeper
    search past the draws already run)."""
    first, _, last = spec.partition(":")
    seeds = range(int(first), int(last)) if last else range(int(first))
    if not seeds:  # an empty sweep would pass as pytest's "empty parameter set" skip
        raise ValueError(f"CAKE_TEST_RANDOM_SEEDS={spec!r} names no seed")
    return seeds


RANDOM_SEEDS = _random_seeds(os.environ.get("CAKE_TEST_RANDOM_SEEDS", "64"))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: not run here (run ci/gpu.sh on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def layers():
    """Family-B layers by name (mxfp4_moe_cases CONTRACT or GENERAL), built once per module: a
    contract bank is 3.7 GB of codes plus its prepared copy."""
    from .mxfp4_moe_cases import named_layer
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = named_layer(name)
        return cache[name]

    yield get
    cache.clear()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def wide_scale_layer():
    """H = 1024 (GEMM1 spans two decode stages and eight wgmma stages) and scale codes on both
    sides of 128 (wide_scale_weights)."""
    from .mxfp4_moe_cases import Geometry, Layer, wide_scale_weights
    geom = Geometry(1024, 256, 8, 2)
    layer = Layer(geom, bank=wide_scale_weights(geom, seed=91))
    for key in ("w1_scale", "w2_scale"):
        sf = layer.bank[key]
        assert (sf[1::4] > 128).float().mean() > 0.3 and (sf[3::4] > 128).any() and not (sf[0::2] > 128).any()
    return layer


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output with NaN (floating) or 0xFF bytes before a kernel writes it."""
    if t.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return t.fill_(float("nan"))
    t.view(torch.uint8).fill_(0xFF)
    return t


def digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes: the bits another process or run is compared against."""
    return hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


@pytest.fixture
def poison():
    return poison_


# ~0.5 s of GPU spin at the H200's clocks: longer than any call checked under host_never_waits
SPIN_CYCLES = 1_000_000_000


@contextlib.contextmanager
def host_never_waits():
    """Calls inside never make the host wait for the GPU: torch's sync debug mode raises on an
    implicit synchronisation by a torch op, and a GPU spin queued on the current stream before
    the block must still be running after it (a wait anywhere, in the extension or the driver,
    would have outlasted the spin). Warm the calls up first: a form's first call loads its
    kernel image, which is not what this checks; and torch's autograd waits for the device on
    the first two backward calls of any graph, a plain matmul's included (measured on the
    H200), so tests of backward calls warm them up twice."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    still_spinning = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_spinning, "a call waited for the GPU (the spin queued before the calls had ended)"
