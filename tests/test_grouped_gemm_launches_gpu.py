"""GPU tests of the grouped GEMM's launches (SPEC §6): repeatable bits across streams, graphs and
processes, prepared launches that follow new offsets, the launches one-shot calls keep, no host
waits."""
from __future__ import annotations

import pytest
import torch

import cake_moe
from cake_moe.reference import grouped_gemm as ref

from .conftest import digest, host_never_waits, poison_
from .fresh_interpreter import run_python
from .grouped_gemm_cases import bf16, offsets, random_sizes
from .grouped_gemm_checks import (
    BUDGET, check_dw, check_rows, dgrad_poisoned, fwd_poisoned, kept_plans, launch_without_allocating,
    on_side_stream, problem, replayed, warm_and_capture)

pytestmark = pytest.mark.gpu


def test_det_bitwise_repeatable_streams_graphs_processes():
    sizes = random_sizes(6000, 8, seed=11)
    x, w, g, offs = problem(sizes, 512, 1024, seed=5, pad=0)
    y0 = cake_moe.grouped_gemm_fwd(x, w, offs)
    d0 = cake_moe.grouped_gemm_dgrad(g, w, offs)
    w0 = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    for _ in range(3):   # each repeat into a poisoned output of its own (no freed block of y0's bits)
        assert torch.equal(fwd_poisoned(x, w, offs), y0)
        assert torch.equal(dgrad_poisoned(g, w, offs), d0)
        dw = poison_(torch.empty_like(w0))
        assert torch.equal(cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw, variant="det"), w0)
    assert torch.equal(on_side_stream(lambda: fwd_poisoned(x, w, offs)), y0)
    assert torch.equal(replayed(cake_moe.prepare_grouped_gemm_fwd(x, w, offs)), y0)
    code = (
        "import torch, cake_moe, hashlib;"
        "from grouped_gemm_cases import bf16, offsets, random_sizes;"
        "s = random_sizes(6000, 8, seed=11); r = sum(s); o = offsets(s);"
        "x = bf16(r, 1024, seed=5); w = bf16(8, 512, 1024, seed=6, scale=0.05); g = bf16(r, 512, seed=7);"
        "h = lambda t: hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest();"
        "print(h(cake_moe.grouped_gemm_fwd(x, w, o)), h(cake_moe.grouped_gemm_dgrad(g, w, o)),"
        " h(cake_moe.grouped_gemm_wgrad(g, x, o, variant='det')))")
    assert run_python(code).split() == [digest(y0), digest(d0), digest(w0)]


@pytest.mark.parametrize("op", ["fwd", "dgrad", "wgrad_det", "wgrad_fast", "wgrad_det_c2"])
@pytest.mark.parametrize("replay", [False, True], ids=["eager", "graph"])
def test_prepared_launch_follows_new_offsets_without_allocating(op, replay):
    """A prepared launch, called again or captured once and replayed, reads the offsets and
    values now in its bound tensors, allocating nothing: every op, the wgrad's splitting form
    (det and fast) and its pair form, over group patterns that empty and refill groups."""
    x, w, g, offs = problem([100, 200, 300], 128, 256, seed=9)
    if op == "fwd":
        launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs)
    elif op == "dgrad":
        launch = cake_moe.prepare_grouped_gemm_dgrad(g, w, offs)
    else:
        variant = op.split("_")[1]
        launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, form="gg_sm90_" + op)
        assert launch.form == "gg_sm90_" + op
    graph = warm_and_capture(launch, replay)
    for sizes in ([600, 0, 0], [0, 1, 599], [5, 5, 5], [0, 0, 0]):
        offs.copy_(offsets(sizes))
        x.copy_(bf16(*x.shape, seed=sum(sizes[:2])))
        g.copy_(bf16(*g.shape, seed=sum(sizes[:2]) + 1))
        poison_(launch.out)
        launch_without_allocating(launch, graph)
        if op == "fwd":
            check_rows(launch.out, ref.fwd(x, w, offs))
        elif op == "dgrad":
            check_rows(launch.out, ref.dgrad(g, w, offs))
        else:
            assert not launch.out.isnan().any(), (sizes, "a dW element was not written")
            check_dw(launch.out, ref.wgrad(g, x, offs))
            for e, size in enumerate(sizes):
                assert size or not launch.out[e].view(torch.int16).any(), (sizes, "an empty group's dW is not +0")


def test_one_shot_calls_keep_their_launch_and_follow_the_tensors():
    """A one-shot call with the operands of an earlier one enqueues the launch that call prepared
    (the same plan object), which reads the offsets and values now in the tensors; another
    tensor, or another shape or strides at a kept address, prepares its own launch."""
    cake_moe.release()
    x, w, g, offs = problem([100, 200, 300], 128, 256, seed=21)
    y = poison_(torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16, device="cuda"))
    check_rows(cake_moe.grouped_gemm_fwd(x, w, offs, out=y), ref.fwd(x, w, offs))
    (plan,) = kept_plans()
    for sizes in ([600, 0, 0], [0, 1, 599], [5, 5, 5]):
        offs.copy_(offsets(sizes))
        x.copy_(bf16(*x.shape, seed=sum(sizes[:2])))
        poison_(y)
        check_rows(cake_moe.grouped_gemm_fwd(x, w, offs, out=y), ref.fwd(x, w, offs))
        assert kept_plans() == [plan], "the same call prepared a new launch"
    # the same address with fewer rows, then with wider row strides: launches of their own
    x_short = x[:-16]
    y_short = poison_(torch.empty(x_short.shape[0], w.shape[1], dtype=torch.bfloat16, device="cuda"))
    check_rows(cake_moe.grouped_gemm_fwd(x_short, w, offs, out=y_short), ref.fwd(x_short, w, offs))
    wide = bf16(x.shape[0], 2 * x.shape[1], seed=22)
    x_strided = wide[:, :x.shape[1]]
    assert x_strided.data_ptr() == wide.data_ptr()
    check_rows(cake_moe.grouped_gemm_fwd(x_strided, w, offs), ref.fwd(x_strided, w, offs), poisoned=False)
    wide_rows = wide.view(2 * x.shape[0], x.shape[1])[: x.shape[0]]  # same address and shape, contiguous
    check_rows(cake_moe.grouped_gemm_fwd(wide_rows, w, offs), ref.fwd(wide_rows, w, offs), poisoned=False)
    assert len(kept_plans()) == 4
    # dgrad and wgrad keep theirs alike; a kept launch writes each call's fresh output (another
    # address while the last one lives); release() drops every kept launch
    dx = cake_moe.grouped_gemm_dgrad(g, w, offs)
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs)
    plans = kept_plans()
    assert len(plans) == 6
    rows = int(offs[-1])  # the groups' rows (the rest of a fresh output is never written)
    for _ in range(2):
        dx2, dw2 = cake_moe.grouped_gemm_dgrad(g, w, offs), cake_moe.grouped_gemm_wgrad(g, x, offs)
        assert dx2.data_ptr() != dx.data_ptr() and dw2.data_ptr() != dw.data_ptr()
        assert torch.equal(dx2[:rows], dx[:rows]) and torch.equal(dw2, dw)
    assert kept_plans() == plans
    check_rows(dx, ref.dgrad(g, w, offs), poisoned=False)
    assert ref.rel_rms(dw, ref.wgrad(g, x, offs, False)) < BUDGET
    cake_moe.release()
    assert not kept_plans()


def test_one_shot_calls_keep_nothing_for_copied_operands_or_when_switched_off(monkeypatch):
    """An operand the call copies first (an expanded w) leaves no launch behind, and neither does
    any call under CAKE_MOE_ONE_SHOT_CACHE=0; both give the kept path's bits."""
    cake_moe.release()
    x, w, _, offs = problem([100, 200, 300], 128, 256, seed=23, pad=0)
    w_expanded = w[:1].expand(3, -1, -1)
    got = cake_moe.grouped_gemm_fwd(x, w_expanded, offs)
    assert not kept_plans()
    assert torch.equal(got, cake_moe.grouped_gemm_fwd(x, w_expanded.contiguous(), offs))
    assert len(kept_plans()) == 1
    cake_moe.release()
    monkeypatch.setenv("CAKE_MOE_ONE_SHOT_CACHE", "0")
    assert torch.equal(cake_moe.grouped_gemm_fwd(x, w_expanded.contiguous(), offs), got)
    assert not kept_plans()


def test_calls_never_make_the_host_wait():
    """Offsets are read on the device only: no call of the API (one-shot, prepared, autograd)
    synchronises with the host once warm."""
    x, w, g, offs = problem([300, 0, 1, 700], 256, 512, seed=13)
    indptr = offsets([300, 0, 1, 700], leading_zero=True)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()

    def calls():
        cake_moe.grouped_gemm_fwd(x, w, offs)
        cake_moe.grouped_gemm_dgrad(g, w, offs)
        for variant in ("det", "fast"):
            cake_moe.grouped_gemm_wgrad(g, x, offs, variant=variant)
            cake_moe.grouped_gemm_wgrad(g, x, offs, out_dtype=torch.float32, variant=variant)
        cake_moe.grouped_mm_bf16(x, w, indptr)
        cake_moe.grouped_mm(xl, wl, offs).backward(g)
        launches = (cake_moe.prepare_grouped_gemm_fwd(x, w, offs), cake_moe.prepare_grouped_gemm_dgrad(g, w, offs),
                    cake_moe.prepare_grouped_gemm_wgrad(g, x, offs))
        for launch in launches:
            launch.launch()

    calls()
    calls()  # torch's autograd itself waits on the first two backward calls (see host_never_waits)
    with host_never_waits():
        calls()


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("form", ["", "gg_portable"])
@pytest.mark.parametrize("leading_zero", [False, True])
@pytest.mark.parametrize("replay", [False, True], ids=["eager", "graph"])
def test_prepared_zero_unrouted_rows_follows_new_offsets(op, form, leading_zero, replay):
    """zero_unrouted_rows=True: every launch (eager or graph-replayed) zeroes the rows in no
    group before the GEMM: past the current last end (offs' last entry in both conventions) and
    before an m_indptr's first start above 0, each clamped into the rows (malformed offsets that
    give a group rows outside those bounds keep its values), allocating nothing and writing
    nothing outside the output (guard rows either side); no group zeroes every row."""
    x, w, g, _ = problem([100, 200, 300], 128, 256, seed=33, pad=24)
    a, prepare = (x, cake_moe.prepare_grouped_gemm_fwd) if op == "fwd" else (g, cake_moe.prepare_grouped_gemm_dgrad)
    name = f"{form}_{op}" if form else ""
    rows, cols, guard = a.shape[0], w.shape[1 if op == "fwd" else 2], 8
    buf = poison_(torch.empty(rows + 2 * guard, cols, dtype=torch.bfloat16, device="cuda"))
    offs = offsets([100, 200, 300], leading_zero=leading_zero)
    launch = prepare(a, w, offs, buf[guard:guard + rows], form=name, zero_unrouted_rows=True)
    plain = prepare(a, w, offs, form=name)
    graph = warm_and_capture(launch, replay)
    cases = [[100, 300, 600], [600, 600, 600], [0, 0, 0], [100, 400, 250], [50, 60, -5], [10, 20, rows + 99]]
    for ends in cases + ([[40, 100, 300, 600], [700, 100, 300, 600]] if leading_zero else []):   # rows 0-39 / all in no group
        offs.copy_(torch.tensor(ends if len(ends) == offs.numel() else [0, *ends], dtype=torch.int32))
        poison_(buf)
        launch_without_allocating(launch, graph)
        assert buf[:guard].isnan().all() and buf[guard + rows:].isnan().all(), (ends, "wrote outside the output")
        poison_(plain.out)
        want = plain.launch()
        covered = torch.zeros(rows, dtype=torch.bool, device="cuda")
        for start, stop in ref.group_bounds(offs, leading_zero, rows=rows):
            covered[start:stop] = True
        head = min(max(ends[0], 0), rows) if len(ends) == offs.numel() and leading_zero else 0
        zero_from = max(min(max(ends[-1], 0), rows), head)
        assert torch.equal(launch.out[covered], want[covered]), ends
        r = torch.arange(rows, device="cuda")
        outside = ~covered & ((r < head) | (r >= zero_from))
        assert not launch.out[outside].view(torch.int16).any(), (ends, "an uncovered row outside the groups is not +0")
        assert launch.out[~covered & ~outside].isnan().all(), (ends, "a row between the groups was zeroed")
    none = prepare(a, w[:0], offs[:int(leading_zero)], form=name, zero_unrouted_rows=True)
    poison_(none.out)
    assert not none.launch().view(torch.int16).any(), "no group: every row is +0"


def test_prepared_launch_on_another_stream_keeps_its_buffers_from_the_allocator():
    """A launch prepared on one stream and run on another records that stream on the buffers it
    allocated (out, the wgrad's workspace): dropped while the other stream still runs, they are
    not handed out again on the preparing stream until it is done. The other stream sleeps first
    so that the wgrad is still queued when the launch goes."""
    x, w, g, offs = problem([2048, 0, 1500, 2600], 256, 512, seed=5, pad=0)
    want = ref.wgrad(g, x, offs)
    launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant="det", form="gg_sm90_wgrad_det")
    ws, out = launch._keep[3], launch.out
    assert ws is not None and ws.numel() > 0, "the splitting form owns a workspace"
    spots = {t.data_ptr(): t.numel() * t.element_size() for t in (ws, out)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        launch.launch()
        kept = out.clone()      # on the side stream, after the wgrad
    del launch, ws, out
    again = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in spots.values()]
    assert not {t.data_ptr() for t in again} & spots.keys(), "a buffer in use on the side stream was handed out"
    side.synchronize()
    check_dw(kept, want)
