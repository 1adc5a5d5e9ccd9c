"""The GPU checks the grouped-GEMM test modules share: problems, the budgets against the FP64
reference, and the launch helpers (graph replay, side streams, allocation checks, kept plans)."""
from __future__ import annotations

import torch

import cake_moe
from cake_moe.reference import grouped_gemm as ref

from .conftest import poison_
from .grouped_gemm_cases import bf16, offsets

# BF16 output rounding alone gives ~1.7e-3 relative RMS; a 2% perturbation gives ~2e-2.
BUDGET = 6e-3


def problem(sizes, n, k, seed=0, leading_zero=False, pad=16):
    """x [rows, K], w [E, N, K], g [rows, N] and the offsets of groups of `sizes` rows, with `pad`
    rows past the last group end."""
    rows = sum(sizes) + pad  # rows past the last group end must stay untouched
    e = len(sizes)
    x = bf16(rows, k, seed=seed)
    w = bf16(e, n, k, seed=seed + 1, scale=0.05)
    g = bf16(rows, n, seed=seed + 2)
    return x, w, g, offsets(sizes, leading_zero=leading_zero)


def check_rows(got, want, budget=BUDGET, poisoned=True):
    """Budget on the groups' rows, as a whole and row by row (an error confined to one small
    group moves the whole output's relative RMS too little; a row's own rounding to BF16 keeps
    it below 2^-8 = 3.9e-3 relative); with a NaN-poisoned output, rows outside every group must
    still be NaN (untouched)."""
    err = ref.rel_rms(got, want)
    assert err < budget, f"relative RMS {err:.2e} over budget {budget:.0e}"
    per_row = ref.rel_rms_rows(got, want)
    if per_row.numel():
        worst = float(per_row.max())
        assert worst < budget, f"a row's relative RMS {worst:.2e} over budget {budget:.0e}"
    written = torch.isfinite(want)
    assert not got[written].isnan().any(), "a row inside a group was not written"
    if poisoned:
        assert got[~written].isnan().all(), "a row past the last group end was written"


def check_dw(dw, want, budget=BUDGET):
    """dW within budget as a whole and expert by expert (a 2% error in one expert's dW is
    1/E of the whole: the per-expert check sees it)."""
    err = ref.rel_rms(dw, want)
    assert err < budget, f"relative RMS {err:.2e} over budget {budget:.0e}"
    if want.shape[0]:
        per_expert = ref.rel_rms_rows(dw.reshape(dw.shape[0], -1), want.reshape(want.shape[0], -1))
        e = int(per_expert.nan_to_num(float("inf")).argmax())  # (a NaN, an unwritten element, is the worst)
        assert per_expert[e] < budget, f"expert {e}: relative RMS {float(per_expert[e]):.2e} over budget {budget:.0e}"


def fwd_poisoned(x, w, offs):
    """The one-shot fwd into a NaN-poisoned output."""
    y = poison_(torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16, device="cuda"))
    return cake_moe.grouped_gemm_fwd(x, w, offs, out=y)


def dgrad_poisoned(g, w, offs):
    """The one-shot dgrad into a NaN-poisoned output."""
    dx = poison_(torch.empty(g.shape[0], w.shape[2], dtype=torch.bfloat16, device="cuda"))
    return cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)


def replayed(launch) -> torch.Tensor:
    """The output of `launch` captured in a CUDA graph and replayed into a poisoned buffer."""
    launch.launch()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.launch()
    poison_(launch.out)
    graph.replay()
    torch.cuda.synchronize()
    return launch.out


def on_side_stream(fn):
    """fn() run on a new stream, ordered after and before the current one."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn()
    torch.cuda.current_stream().wait_stream(side)
    return out


def warm_and_capture(launch, replay: bool):
    """Run ``launch`` once (its kernels load) and, with ``replay``, capture another run: the
    graph to replay, or None for eager launches."""
    launch.launch()
    if not replay:
        return None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.launch()
    return graph


def launch_without_allocating(launch, graph) -> None:
    """One launch (or replay of ``graph``), checked to allocate nothing."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    graph.replay() if graph is not None else launch.launch()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "launch() allocated"


def kept_plans() -> list:
    """The plans one-shot calls keep (not the pairs grouped_mm's backward keeps of them)."""
    from cake_moe.grouped_gemm import _kept_launches
    return [entry[0] for key, entry in _kept_launches._kept.items() if key[0] != "grads"]
