"""docs/usage.md's Python blocks run as written, in order, in one namespace: on the CPU here
(the calls run the FP64 references) and on the GPU in ci/gpu.sh (the kernels)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

_DOC = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
_DEVICE_LINE = 'dev = "cuda" if torch.cuda.is_available() else "cpu"'


def _blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", _DOC.read_text(), flags=re.S)
    assert len(blocks) >= 3 and _DEVICE_LINE in blocks[0]
    return blocks


def _run(device: str) -> dict:
    namespace: dict = {}
    for i, block in enumerate(_blocks()):
        code = block.replace(_DEVICE_LINE, f"dev = {device!r}")
        exec(compile(code, f"{_DOC.name} block {i + 1}", "exec"), namespace)
    return namespace


def test_usage_doc_runs_on_the_cpu():
    ns = _run("cpu")
    assert ns["out"].device.type == "cpu" and ns["rel_rms"] == 0   # the CPU wrapper runs the reference itself
    assert ns["w13"].grad.isfinite().all() and ns["w13"].grad.abs().sum() > 0


@pytest.mark.gpu
def test_usage_doc_runs_on_the_gpu():
    ns = _run("cuda")
    assert ns["out"].is_cuda and ns["rel_rms"] < 1e-2
    assert ns["w13"].grad.isfinite().all() and ns["w13"].grad.abs().sum() > 0
    torch.cuda.synchronize()
