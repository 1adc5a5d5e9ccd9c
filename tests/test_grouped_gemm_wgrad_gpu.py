"""GPU tests of the grouped GEMM's weight gradient (SPEC §6): det and fast, BF16 and FP32
outputs, the splitting and cluster-pair forms, the workspace."""
from __future__ import annotations

import pytest
import torch

import cake_moe
from cake_moe.reference import grouped_gemm as ref

from .conftest import poison_
from .grouped_gemm_cases import LAYERS, PATTERNS, random_sizes
from .grouped_gemm_checks import BUDGET, check_dw, on_side_stream, problem, replayed

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("nk", [(256, 512), (200, 264)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_wgrad_patterns(pattern, nk, out_dtype):
    n, k = nk
    sizes = PATTERNS[pattern]
    x, w, g, offs = problem(sizes, n, k)
    dw = poison_(torch.empty(len(sizes), n, k, dtype=out_dtype, device="cuda"))
    cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw, out_dtype=out_dtype)
    want = ref.wgrad(g, x, offs)
    check_dw(dw, want, BUDGET / (50 if out_dtype == torch.float32 else 1))
    for e, size in enumerate(sizes):
        if size == 0:
            assert torch.equal(dw[e], torch.zeros_like(dw[e])), "an empty group's dW must be exactly zero"


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("which", ["w13", "w2"])
def test_wgrad_moe_layers(layer, which):
    h, i, e = layer
    n, k = (2 * i, h) if which == "w13" else (h, i)
    x, w, g, offs = problem(random_sizes(4096, e, seed=h * 3 + i), n, k, seed=e + 1)
    check_dw(cake_moe.grouped_gemm_wgrad(g, x, offs), ref.wgrad(g, x, offs))


def test_wgrad_det_repeatable_and_fast_within_budget():
    sizes = random_sizes(8192, 8, seed=21)
    x, w, g, offs = problem(sizes, 512, 768, seed=7, pad=0)
    d0 = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    for _ in range(3):   # each repeat into a poisoned output of its own
        assert torch.equal(cake_moe.grouped_gemm_wgrad(g, x, offs, out=poison_(torch.empty_like(d0)), variant="det"), d0)
    assert torch.equal(on_side_stream(lambda: cake_moe.grouped_gemm_wgrad(
        g, x, offs, out=poison_(torch.empty_like(d0)), variant="det")), d0)
    want = ref.wgrad(g, x, offs)
    assert ref.rel_rms(cake_moe.grouped_gemm_wgrad(g, x, offs, variant="fast"), want) < BUDGET
    fast32 = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="fast", out_dtype=torch.float32)
    assert fast32.dtype == torch.float32 and ref.rel_rms(fast32, want) < 1e-4  # no bf16 rounding
    # fast gives det's bits for fwd and dgrad (they have one variant), set globally or per call
    cake_moe.configure(grouped_gemm_variant="fast")
    try:
        y_fast, dx_fast = cake_moe.grouped_gemm_fwd(x, w, offs), cake_moe.grouped_gemm_dgrad(g, w, offs)
    finally:
        cake_moe.configure(grouped_gemm_variant=None)
    assert torch.equal(y_fast, cake_moe.grouped_gemm_fwd(x, w, offs))
    assert torch.equal(dx_fast, cake_moe.grouped_gemm_dgrad(g, w, offs))
    grads = {}
    for variant in ("det", "fast"):
        xv, wv = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = cake_moe.grouped_mm(xv, wv, offs, variant=variant)
        y.backward(g)
        grads[variant] = (y.detach(), xv.grad, wv.grad)
    assert torch.equal(grads["fast"][0], grads["det"][0]) and torch.equal(grads["fast"][1], grads["det"][1])
    assert ref.rel_rms(grads["fast"][2], want) < BUDGET and torch.equal(grads["det"][2], d0)


@pytest.mark.parametrize("variant", ["det", "fast"])
def test_wgrad_non_finite_inputs_give_non_finite_outputs_exactly_where_the_reference_does(variant):
    # group 0 (300 rows) ends in a shifted last k-block: its rows 236..255 are loaded twice and
    # their second G copy is zeroed; group 1 (40 rows) takes the zeroing of both operands
    sizes = [300, 40]
    x, w, g, offs = problem(sizes, 128, 256, seed=3, pad=0)
    x[240, 5] = float("inf")   # a row of the repeated band
    x[10, 7] = float("-inf")   # a row read once
    g[250, 9] = float("inf")   # a repeated row of G (its zeroed copy must not matter)
    g[310, 3] = float("nan")   # group 1
    got = cake_moe.grouped_gemm_wgrad(g, x, offs, variant=variant, out_dtype=torch.float32)
    want = ref.wgrad(g, x, offs)
    assert torch.equal(torch.isfinite(got).cpu(), torch.isfinite(want).cpu())
    assert (~torch.isfinite(want)).sum() > 0 and ref.rel_rms(got, want) < 1e-4


def test_prepared_wgrad_graph_replay_and_empty_rows():
    x, w, g, offs = problem([50, 0, 70], 128, 256, pad=0)
    launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out_dtype=torch.float32)
    want = launch.launch().clone()
    assert torch.equal(replayed(launch), want)
    empty = torch.empty(0, 128, dtype=torch.bfloat16, device="cuda")
    dw = cake_moe.grouped_gemm_wgrad(empty, torch.empty(0, 256, dtype=torch.bfloat16, device="cuda"),
                                     torch.zeros(3, dtype=torch.int32, device="cuda"))
    assert dw.shape == (3, 128, 256) and not dw.any()


@pytest.mark.parametrize("variant", ["det", "fast"])
def test_wgrad_default_form_by_rows_per_group(variant):
    """The default wgrad takes the cluster-pair form when groups average at most 512 rows and the
    output is bf16; longer groups and FP32 outputs take the splitting form. Both give the
    reference's answer. Only the splitting form holds a split-K workspace (also when named on
    short groups); the pair form never splits and gets none."""
    n, k = 256, 512
    for sizes, pair in (([300, 0, 700, 500], True), ([2048, 0, 1500, 2600], False)):
        x, w, g, offs = problem(sizes, n, k, seed=5, pad=0)
        for dtype in (torch.bfloat16, torch.float32):
            launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, out_dtype=dtype)
            paired = pair and dtype == torch.bfloat16
            assert launch.form == f"gg_sm90_wgrad_{variant}" + ("_c2" if paired else ""), (sizes, dtype, launch.form)
            workspace = launch._keep[3]
            assert (workspace is None) == paired, (sizes, dtype)
            assert ref.rel_rms(launch.launch(), ref.wgrad(g, x, offs)) < BUDGET / (50 if dtype == torch.float32 else 1)
        named = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, form=f"gg_sm90_wgrad_{variant}")
        assert named._keep[3] is not None and named._keep[3].numel() > 0
        portable = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, form="gg_portable_wgrad")
        assert portable._keep[3] is None, "the portable form splits no K: no workspace"
        assert ref.rel_rms(portable.launch(), ref.wgrad(g, x, offs)) < BUDGET
        other = "fast" if variant == "det" else "det"
        for suffix in ("", "_c2"):
            with pytest.raises(ValueError, match=f"is the {other} variant's wgrad; this call asks for variant '{variant}'"):
                cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, form=f"gg_sm90_wgrad_{other}{suffix}")


def test_wgrad_det_bits_do_not_depend_on_the_workspace_size():
    """A caller's workspace larger than the wgrad needs splits the groups as the default one
    does (the kernel is told the size it needs), so its det bits are the one-shot call's: a
    captured training step with a buffer of its own matches the eager step. Groups of 32768
    rows split along the rows, where the slots that fit would set the chunk length. A
    workspace that overlaps an operand or the output is refused."""
    x, w, g, offs = problem([32768, 0, 32768], 2048, 4096, seed=9, pad=0)
    want = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    nbytes = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant="det")._keep[3].numel()
    for extra in (256, nbytes):
        ws = torch.zeros(nbytes + extra, dtype=torch.uint8, device="cuda")
        got = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant="det", workspace=ws).launch()
        assert torch.equal(got, want), f"a workspace {extra} bytes larger changed the det bits"
    ws = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    out = ws[:w.numel() * 2].view(torch.bfloat16).view(w.shape)
    with pytest.raises(ValueError, match="overlap"):
        cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out=out, variant="det", workspace=ws)


def test_one_shot_wgrad_keeps_the_workspaces_of_the_last_eight_streams():
    """A loop that takes a new stream each step (torch's pool hands its streams out in turn)
    keeps the workspaces of the 8 streams used last; the launches one-shot calls and
    grouped_mm's backward keep bind only those, and every step, on a kept launch or on one
    bound anew after its stream's workspace was dropped, gives the same det bits."""
    from cake_moe.grouped_gemm import _kept_launches
    cake_moe.release()
    x, w, g, offs = problem([1500, 0, 2600, 2048], 256, 512, seed=31, pad=0)
    assert cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant="det")._keep[3] is not None, "not a splitting form"
    want = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    streams = [torch.cuda.Stream() for _ in range(12)]
    assert len({s.cuda_stream for s in streams}) == len(streams)
    for _ in range(2):   # the second round finds every stream's workspace dropped
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                dw = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
                again = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")   # the kept launch
                xv, wv = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
                cake_moe.grouped_mm(xv, wv, offs, variant="det").backward(g)
            torch.cuda.current_stream().wait_stream(s)
            assert torch.equal(dw, want) and torch.equal(again, want) and torch.equal(wv.grad, want)
            held = {id(t) for t in _kept_launches._workspaces.values()}
            launches = [e for entry in _kept_launches._kept.values() for e in _kept_launches.launches_of(entry)]
            bound = {id(e[4]) for e in launches if e[4] is not None}
            assert len(held) <= 8 and bound and bound <= held, (len(held), len(bound))
    assert len(_kept_launches._workspaces) == 8
    cake_moe.release()


@pytest.mark.parametrize("variant", ["det", "fast"])
@pytest.mark.parametrize("pattern", ["mixed", "ragged6", "tiny", "all_empty", "one_hot"])
@pytest.mark.parametrize("nk", [(256, 512), (200, 264), (384, 136)])
def test_wgrad_cluster_pair_forms(variant, pattern, nk):
    """The cluster-pair wgrad forms (CTA pairs multicasting X): within budget, exact zeros for
    empty groups, untouched outside dW; N with an odd count of 128-row tiles (a pair's second
    half past N) and K with a partial last 256-column tile. Groups under 2048 rows are not split
    by the default form either, and each tile then sums the same products in the same order:
    the pair form must give the default form's bits there."""
    n, k = nk
    sizes = PATTERNS[pattern]
    x, w, g, offs = problem(sizes, n, k, seed=11)
    guarded = poison_(torch.empty(len(sizes) + 2, n, k, dtype=torch.bfloat16, device="cuda"))
    dw = guarded[1:-1]  # one poisoned expert's worth of guard on either side
    launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out=dw, variant=variant,
                                                 form=f"gg_sm90_wgrad_{variant}_c2")
    assert launch.form == f"gg_sm90_wgrad_{variant}_c2"
    launch.launch()
    want = ref.wgrad(g, x, offs)
    assert guarded[0].isnan().all() and guarded[-1].isnan().all(), "a write outside dW"
    assert not dw.isnan().any(), "a dW element was not written"
    check_dw(dw, want)
    for e, size in enumerate(sizes):
        if size == 0:
            assert torch.equal(dw[e], torch.zeros_like(dw[e])), "an empty group's dW must be exactly zero"
    if max(sizes) < 2048:
        unpaired = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, form=f"gg_sm90_wgrad_{variant}")
        assert torch.equal(dw, unpaired.launch())
    with pytest.raises(ValueError, match="bf16 only"):
        cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out_dtype=torch.float32, variant=variant,
                                            form=f"gg_sm90_wgrad_{variant}_c2")
