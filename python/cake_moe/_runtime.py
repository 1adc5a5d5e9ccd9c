"""The compiled extension, the manifest, and the device/stream plumbing every op shares.

Importing cake_moe loads no kernel and touches no GPU: the extension's driver table and each
kernel image are loaded on first use.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import threading
from typing import Any

import torch

_EXT_IMPORT_ERROR: BaseException | None = None
try:
    from . import _ext  # type: ignore[attr-defined]
except ImportError as e:  # a source tree without a build: references still work
    _ext = None
    _EXT_IMPORT_ERROR = e


def ext():
    """The compiled extension module; raises ImportError with the cause when it is missing."""
    if _ext is None:
        # a module that is simply absent (a source tree without a build) needs no cause quoted;
        # one that is present but fails to load (a missing library, an ABI mismatch) does
        absent = importlib.util.find_spec(f"{__package__}._ext") is None
        raise ImportError(
            "cake_moe's compiled extension (cake_moe._ext) is "
            + ("not built here (a source tree?)" if absent else f"present but failed to load ({_EXT_IMPORT_ERROR})")
            + "; install the package with `pip install .`")
    return _ext


@functools.lru_cache(maxsize=None)
def manifest() -> dict[str, Any]:
    """The build manifest embedded in the extension (forms, arches, SHA-256 per image)."""
    return json.loads(ext().manifest_json())


def built_arches() -> list[str]:
    return list(manifest()["archs"])


def driver_status() -> tuple[bool, int, str]:
    """(driver usable, driver version, reason when not)."""
    return tuple(ext().driver_status())


# The arches a build may name (CAKE_MOE_CUDA_ARCHS; cpp/kernels/forms.py ALL_ARCHES).
BUILDABLE_ARCHES = ("90a", "100a", "103a", "107a")


@functools.lru_cache(maxsize=None)
def device_arch(index: int) -> str:
    """'90a'-style arch name of CUDA device `index` (as the extension sees it)."""
    return ext().device_arch(index)


def unserved_reason(index: int) -> str | None:
    """Why CUDA device ``index`` cannot run this build's kernels (no kernels for its arch), or None."""
    arch = device_arch(index)
    if arch in built_arches():
        return None
    served = f"this cake-moe build has kernels for sm_{', sm_'.join(built_arches())}, but cuda:{index} " \
             f"({torch.cuda.get_device_name(index)}) is sm_{arch}"
    if arch in BUILDABLE_ARCHES:
        return f"{served}; rebuild with CAKE_MOE_CUDA_ARCHS including {arch}"
    return f"{served}, which cake-moe does not build for (it builds sm_{', sm_'.join(BUILDABLE_ARCHES)})"


def require_served(device: torch.device, what: str) -> None:
    """NotImplementedError when this build has no kernels for the device's arch."""
    why = unserved_reason(device.index if device.index is not None else torch.cuda.current_device())
    if why:
        raise NotImplementedError(f"{what}: {why}")


# os.environ.get of an unset name raises and catches a KeyError inside (~1 us on a server CPU,
# three such reads per one-shot call). On POSIX os.environ keeps its values in a dict of bytes,
# updated on every assignment and deletion through os.environ; the per-call paths read that.
_ENV_BYTES: dict | None = getattr(os.environ, "_data", None) if os.name == "posix" else None


def env(name: str) -> str | None:
    """os.environ.get(name), without the exception an unset name costs."""
    if _ENV_BYTES is None:
        return os.environ.get(name)
    value = _ENV_BYTES.get(name.encode())
    return None if value is None else os.fsdecode(value)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds


def stream_handle(device: torch.device) -> int:
    """The caller's current CUDA stream on `device`, as the integer handle kernels launch on.
    (The raw query skips building a torch.cuda.Stream object: a few microseconds per call.)"""
    if _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


_PER_THREAD_STREAM = 2   # CU_STREAM_PER_THREAD (cudaStreamPerThread)


def stream_thread(handle: int | None) -> int | None:
    """What a cache keyed by stream handle must add to the key: the thread for the per-thread
    default stream's handle (the same on every thread, a different stream on each; reachable
    through ``torch.cuda.ExternalStream``), else None."""
    return threading.get_ident() if handle == _PER_THREAD_STREAM else None


_current_index = getattr(torch._C, "_cuda_getDevice", None)  # absent from CPU-only builds


def capturing(device: torch.device) -> bool:
    """Whether the current stream of CUDA `device` (the one its launches go to) captures a CUDA
    graph; ``torch.cuda.is_current_stream_capturing`` asks about the current device's stream.
    (The raw device query skips torch.cuda.current_device's initialisation check: it runs in
    every one-shot wgrad's key.)"""
    current = _current_index() if _current_index is not None else torch.cuda.current_device()
    if device.index is None or device.index == current:
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device.index):
        return torch.cuda.is_current_stream_capturing()


KEEP_SWITCH = "CAKE_MOE_ONE_SHOT_CACHE"


def keeps_bound_work() -> bool:
    """Whether one-shot grouped-GEMM calls and MoE ``plan()`` keep what they bind for the same
    tensors (``CAKE_MOE_ONE_SHOT_CACHE=0``: they check and bind every call)."""
    return env(KEEP_SWITCH) != "0"


def tensor_identity(t: torch.Tensor) -> tuple:
    """What a kept launch or plan depends on of a tensor it binds: address, shape, strides,
    dtype and device (its values are read at run time)."""
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device()


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a 1-byte tensor (float8 dtypes do not cross DLPack everywhere)."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)
