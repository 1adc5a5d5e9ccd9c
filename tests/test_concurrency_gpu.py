"""GPU test of concurrent use: threads on streams of their own (as a serving process's request
threads or autograd's device thread use the library) give the bits of one thread's calls, and
raise nothing. The work runs in a fresh interpreter (tests/concurrency_worker.py), so the
threads' first calls also race to load the kernels, to fill the one-shot launch cache and to
allocate the per-stream wgrad workspaces. What it cannot show: that the wgrad's workspaces must
be per stream. Its persistent kernels fill the GPU, so two streams' launches barely overlap: the
worker run with one workspace patched in for every stream still gave one thread's bits (10
threads, 2 runs, H200)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "concurrency_worker.py")


@pytest.mark.parametrize("threads, repeats", [(20, 4)])
def test_threads_on_their_own_streams_give_one_threads_bits(threads, repeats):
    out = subprocess.run([sys.executable, WORKER, str(threads), str(repeats)], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    forms = report["wgrad_forms"]
    assert forms["wgrad"].endswith("_c2") and not forms["wgrad_split"].endswith("_c2"), forms
    sets = len(report["serial"]["fwd"])
    for op, per_set in report["threaded"].items():
        serial = report["serial"][op]
        assert report["finite"][op], f"{op}: a single-thread result is not finite and nonzero"
        assert len(set(serial)) == sets, f"{op}: the input sets give the same bits, so a swap would not show"
        assert report["kept"][op] == serial, f"{op}: the launches the threads kept give other bits"
        for s, digests in enumerate(per_set):
            assert len(digests) == repeats * (threads // (len(report["threaded"]) * sets)), f"{op}: missing results"
            assert set(digests) == {serial[s]}, f"{op}: a threaded call on input set {s} differs from one thread's"
