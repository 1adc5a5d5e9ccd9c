"""GPU tests of family A (ragged BF16 grouped GEMM) against the FP64 reference (SPEC §6, §11)."""
from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys

import pytest
import torch

import cake_moe
from cake_moe.reference import grouped_gemm as ref
from cake_moe.bench.grouped_gemm import SM90_TILES  # every sm_90a fwd/dgrad tile form

from .conftest import RANDOM_SEEDS, host_never_waits, poison_
from .grouped_gemm_cases import LAYERS, PATTERNS, bf16, offsets, random_sizes

# the new-process checks import the case helpers from here, whatever the working directory
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.gpu

# BF16 output rounding alone gives ~1.7e-3 relative RMS; a 2% perturbation gives ~2e-2.
BUDGET = 6e-3


def _problem(sizes, n, k, seed=0, leading_zero=False, pad=16):
    rows = sum(sizes) + pad  # rows past the last group end must stay untouched
    e = len(sizes)
    x = bf16(rows, k, seed=seed)
    w = bf16(e, n, k, seed=seed + 1, scale=0.05)
    g = bf16(rows, n, seed=seed + 2)
    return x, w, g, offsets(sizes, leading_zero=leading_zero)


def _check_rows(got, want, budget=BUDGET, poisoned=True):
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


def _check_dw(dw, want, budget=BUDGET):
    """dW within budget as a whole and expert by expert (a 2% error in one expert's dW is
    1/E of the whole: the per-expert check sees it)."""
    err = ref.rel_rms(dw, want)
    assert err < budget, f"relative RMS {err:.2e} over budget {budget:.0e}"
    for e in range(want.shape[0]):
        err = ref.rel_rms(dw[e], want[e])
        assert err < budget, f"expert {e}: relative RMS {err:.2e} over budget {budget:.0e}"


def _fwd(x, w, offs):
    y = poison_(torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16, device="cuda"))
    return cake_moe.grouped_gemm_fwd(x, w, offs, out=y)


def _dgrad(g, w, offs):
    dx = poison_(torch.empty(g.shape[0], w.shape[2], dtype=torch.bfloat16, device="cuda"))
    return cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)


def test_budget_catches_a_two_percent_perturbation():
    x, w, _, offs = _problem(PATTERNS["mixed"], 256, 512, pad=0)
    want = ref.fwd(x, w, offs)
    y = cake_moe.grouped_gemm_fwd(x, w, offs)
    assert ref.rel_rms(y, want) < BUDGET
    rms = y.float().square().mean().sqrt()
    noise = torch.randn_like(y, dtype=torch.float32) * 0.02 * rms  # a 2% (RMS) perturbation
    assert ref.rel_rms((y.float() + noise).to(torch.bfloat16), want) > BUDGET
    _check_rows(y, want, poisoned=False)
    one_row = y.clone()   # 2% on one row of one group only: the row check sees it
    one_row[5] = (one_row[5].float() * 1.02).to(torch.bfloat16)
    assert ref.rel_rms(one_row, want) < BUDGET
    with pytest.raises(AssertionError, match="a row's relative RMS"):
        _check_rows(one_row, want, poisoned=False)
    g = bf16(x.shape[0], 256, seed=3)
    want_dw = ref.wgrad(g, x, offs)
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs)
    _check_dw(dw, want_dw)
    dw[2] = (dw[2].float() * 1.02).to(torch.bfloat16)   # 2% on the one-row group's dW only
    assert ref.rel_rms(dw, want_dw) < BUDGET
    with pytest.raises(AssertionError, match="expert 2"):
        _check_dw(dw, want_dw)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("nk", [(256, 512), (200, 264), (72, 136)])
@pytest.mark.parametrize("leading_zero", [False, True])
def test_fwd_dgrad_patterns(pattern, nk, leading_zero):
    n, k = nk
    x, w, g, offs = _problem(PATTERNS[pattern], n, k, leading_zero=leading_zero)
    y = poison_(torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda"))
    cake_moe.grouped_gemm_fwd(x, w, offs, out=y)
    _check_rows(y, ref.fwd(x, w, offs, leading_zero))
    dx = poison_(torch.empty(x.shape[0], k, dtype=torch.bfloat16, device="cuda"))
    cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)
    _check_rows(dx, ref.dgrad(g, w, offs, leading_zero))


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("which", ["w13", "w2"])
def test_moe_layers(layer, which):
    h, i, e = layer
    n, k = (2 * i, h) if which == "w13" else (h, i)
    sizes = random_sizes(4096, e, seed=h + i)
    x, w, g, offs = _problem(sizes, n, k, seed=e)
    _check_rows(_fwd(x, w, offs), ref.fwd(x, w, offs))
    _check_rows(_dgrad(g, w, offs), ref.dgrad(g, w, offs))


def test_many_groups_and_one_row_groups():
    sizes = [1, 0, 2] * 400  # 1200 groups
    x, w, g, offs = _problem(sizes, 64, 128, seed=3)
    _check_rows(_fwd(x, w, offs), ref.fwd(x, w, offs))
    _check_rows(_dgrad(g, w, offs), ref.dgrad(g, w, offs))


def test_sum_m_zero_and_no_rows():
    x = torch.empty(0, 64, dtype=torch.bfloat16, device="cuda")
    w = bf16(3, 32, 64)
    offs = torch.zeros(3, dtype=torch.int32, device="cuda")
    assert cake_moe.grouped_gemm_fwd(x, w, offs).shape == (0, 32)


def _replayed(launch) -> torch.Tensor:
    """The output of `launch` captured in a CUDA graph and replayed into a poisoned buffer."""
    launch.launch()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.launch()
    poison_(launch.out)
    graph.replay()
    torch.cuda.synchronize()
    return launch.out


def _on_side_stream(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn()
    torch.cuda.current_stream().wait_stream(side)
    return out


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def test_det_bitwise_repeatable_streams_graphs_processes():
    sizes = random_sizes(6000, 8, seed=11)
    x, w, g, offs = _problem(sizes, 512, 1024, seed=5, pad=0)
    y0 = cake_moe.grouped_gemm_fwd(x, w, offs)
    d0 = cake_moe.grouped_gemm_dgrad(g, w, offs)
    w0 = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    for _ in range(3):   # each repeat into a poisoned output of its own (no freed block of y0's bits)
        assert torch.equal(_fwd(x, w, offs), y0)
        assert torch.equal(_dgrad(g, w, offs), d0)
        dw = poison_(torch.empty_like(w0))
        assert torch.equal(cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw, variant="det"), w0)
    assert torch.equal(_on_side_stream(lambda: _fwd(x, w, offs)), y0)
    assert torch.equal(_replayed(cake_moe.prepare_grouped_gemm_fwd(x, w, offs)), y0)
    code = (
        f"import torch, cake_moe, hashlib, sys; sys.path.insert(0, {TESTS_DIR!r});"
        "from grouped_gemm_cases import bf16, offsets, random_sizes;"
        "s = random_sizes(6000, 8, seed=11); r = sum(s); o = offsets(s);"
        "x = bf16(r, 1024, seed=5); w = bf16(8, 512, 1024, seed=6, scale=0.05); g = bf16(r, 512, seed=7);"
        "h = lambda t: hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest();"
        "print(h(cake_moe.grouped_gemm_fwd(x, w, o)), h(cake_moe.grouped_gemm_dgrad(g, w, o)),"
        " h(cake_moe.grouped_gemm_wgrad(g, x, o, variant='det')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [_digest(y0), _digest(d0), _digest(w0)]


def _warm_and_capture(launch, replay: bool):
    """Run ``launch`` once (its kernels load) and, with ``replay``, capture another run: the
    graph to replay, or None for eager launches."""
    launch.launch()
    if not replay:
        return None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.launch()
    return graph


def _launch_without_allocating(launch, graph) -> None:
    """One launch (or replay of ``graph``), checked to allocate nothing."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    graph.replay() if graph is not None else launch.launch()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "launch() allocated"


@pytest.mark.parametrize("op", ["fwd", "dgrad", "wgrad_det", "wgrad_fast", "wgrad_det_c2"])
@pytest.mark.parametrize("replay", [False, True], ids=["eager", "graph"])
def test_prepared_launch_follows_new_offsets_without_allocating(op, replay):
    """A prepared launch, called again or captured once and replayed, reads the offsets and
    values now in its bound tensors, allocating nothing: every op, the wgrad's splitting form
    (det and fast) and its pair form, over group patterns that empty and refill groups."""
    x, w, g, offs = _problem([100, 200, 300], 128, 256, seed=9)
    if op == "fwd":
        launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs)
    elif op == "dgrad":
        launch = cake_moe.prepare_grouped_gemm_dgrad(g, w, offs)
    else:
        variant = op.split("_")[1]
        launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, form="gg_sm90_" + op)
        assert launch.form == "gg_sm90_" + op
    graph = _warm_and_capture(launch, replay)
    for sizes in ([600, 0, 0], [0, 1, 599], [5, 5, 5], [0, 0, 0]):
        offs.copy_(offsets(sizes))
        x.copy_(bf16(*x.shape, seed=sum(sizes[:2])))
        g.copy_(bf16(*g.shape, seed=sum(sizes[:2]) + 1))
        poison_(launch.out)
        _launch_without_allocating(launch, graph)
        if op == "fwd":
            _check_rows(launch.out, ref.fwd(x, w, offs))
        elif op == "dgrad":
            _check_rows(launch.out, ref.dgrad(g, w, offs))
        else:
            assert not launch.out.isnan().any(), (sizes, "a dW element was not written")
            _check_dw(launch.out, ref.wgrad(g, x, offs))
            for e, size in enumerate(sizes):
                assert size or not launch.out[e].view(torch.int16).any(), (sizes, "an empty group's dW is not +0")


def _kept_plans() -> list:
    """The plans one-shot calls keep (not the pairs grouped_mm's backward keeps of them)."""
    from cake_moe.grouped_gemm import _kept_launches
    return [entry[0] for key, entry in _kept_launches._kept.items() if key[0] != "grads"]


def test_one_shot_calls_keep_their_launch_and_follow_the_tensors():
    """A one-shot call with the operands of an earlier one enqueues the launch that call prepared
    (the same plan object), which reads the offsets and values now in the tensors; another
    tensor, or another shape or strides at a kept address, prepares its own launch."""
    cake_moe.release()
    x, w, g, offs = _problem([100, 200, 300], 128, 256, seed=21)
    y = poison_(torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16, device="cuda"))
    _check_rows(cake_moe.grouped_gemm_fwd(x, w, offs, out=y), ref.fwd(x, w, offs))
    (plan,) = _kept_plans()
    for sizes in ([600, 0, 0], [0, 1, 599], [5, 5, 5]):
        offs.copy_(offsets(sizes))
        x.copy_(bf16(*x.shape, seed=sum(sizes[:2])))
        poison_(y)
        _check_rows(cake_moe.grouped_gemm_fwd(x, w, offs, out=y), ref.fwd(x, w, offs))
        assert _kept_plans() == [plan], "the same call prepared a new launch"
    # the same address with fewer rows, then with wider row strides: launches of their own
    x_short = x[:-16]
    y_short = poison_(torch.empty(x_short.shape[0], w.shape[1], dtype=torch.bfloat16, device="cuda"))
    _check_rows(cake_moe.grouped_gemm_fwd(x_short, w, offs, out=y_short), ref.fwd(x_short, w, offs))
    wide = bf16(x.shape[0], 2 * x.shape[1], seed=22)
    x_strided = wide[:, :x.shape[1]]
    assert x_strided.data_ptr() == wide.data_ptr()
    _check_rows(cake_moe.grouped_gemm_fwd(x_strided, w, offs), ref.fwd(x_strided, w, offs), poisoned=False)
    wide_rows = wide.view(2 * x.shape[0], x.shape[1])[: x.shape[0]]  # same address and shape, contiguous
    _check_rows(cake_moe.grouped_gemm_fwd(wide_rows, w, offs), ref.fwd(wide_rows, w, offs), poisoned=False)
    assert len(_kept_plans()) == 4
    # dgrad and wgrad keep theirs alike; a kept launch writes each call's fresh output (another
    # address while the last one lives); release() drops every kept launch
    dx = cake_moe.grouped_gemm_dgrad(g, w, offs)
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs)
    plans = _kept_plans()
    assert len(plans) == 6
    rows = int(offs[-1])  # the groups' rows (the rest of a fresh output is never written)
    for _ in range(2):
        dx2, dw2 = cake_moe.grouped_gemm_dgrad(g, w, offs), cake_moe.grouped_gemm_wgrad(g, x, offs)
        assert dx2.data_ptr() != dx.data_ptr() and dw2.data_ptr() != dw.data_ptr()
        assert torch.equal(dx2[:rows], dx[:rows]) and torch.equal(dw2, dw)
    assert _kept_plans() == plans
    _check_rows(dx, ref.dgrad(g, w, offs), poisoned=False)
    assert ref.rel_rms(dw, ref.wgrad(g, x, offs, False)) < BUDGET
    cake_moe.release()
    assert not _kept_plans()


def test_one_shot_calls_keep_nothing_for_copied_operands_or_when_switched_off(monkeypatch):
    """An operand the call copies first (an expanded w) leaves no launch behind, and neither does
    any call under CAKE_MOE_ONE_SHOT_CACHE=0; both give the kept path's bits."""
    cake_moe.release()
    x, w, _, offs = _problem([100, 200, 300], 128, 256, seed=23, pad=0)
    w_expanded = w[:1].expand(3, -1, -1)
    got = cake_moe.grouped_gemm_fwd(x, w_expanded, offs)
    assert not _kept_plans()
    assert torch.equal(got, cake_moe.grouped_gemm_fwd(x, w_expanded.contiguous(), offs))
    assert len(_kept_plans()) == 1
    cake_moe.release()
    monkeypatch.setenv("CAKE_MOE_ONE_SHOT_CACHE", "0")
    assert torch.equal(cake_moe.grouped_gemm_fwd(x, w_expanded.contiguous(), offs), got)
    assert not _kept_plans()


def test_autograd_steps_reuse_their_launches():
    """Eager grouped_mm steps on the same tensors run the fwd, dgrad and wgrad launches the first
    step prepared (into each step's new gradients): three kept launches, the same gradients."""
    cake_moe.release()
    x, w, g, offs = _problem([300, 0, 1, 700], 128, 256, seed=24, pad=0)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    grads = []
    for _ in range(3):
        cake_moe.grouped_mm(xl, wl, offs).backward(g)
        grads.append((xl.grad, wl.grad))
        xl.grad = wl.grad = None
    plans = _kept_plans()
    assert len(plans) == 3
    from cake_moe.grouped_gemm import _kept_launches
    (pair,) = [entry for key, entry in _kept_launches._kept.items() if key[0] == "grads"]
    assert [kept[0] for kept in pair] == plans[1:]   # the backward's dgrad and wgrad under one key
    cake_moe.grouped_mm(xl, wl, offs).backward(g)
    assert _kept_plans() == plans
    for dx, dw in grads[1:]:
        assert torch.equal(dx, grads[0][0]) and torch.equal(dw, grads[0][1])


def test_calls_never_make_the_host_wait():
    """Offsets are read on the device only: no call of the API (one-shot, prepared, autograd)
    synchronises with the host once warm."""
    x, w, g, offs = _problem([300, 0, 1, 700], 256, 512, seed=13)
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


@pytest.mark.parametrize("call,match", [
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x[:, :60], w[:, :, :60], o, out=y), "K must be a positive multiple of 8"),
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x, w[:, :, :64], o, out=y), "x has 128 columns but w has K=64"),
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x.float(), w, o, out=y), "x must have dtype"),
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x, w, o.long(), out=y), "offs must have dtype"),
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x, w, o[:-1], out=y), "entries"),
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x, w, o.cpu(), out=y), "offs is on cpu"),
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x, w, o, out=torch.empty(3, 3, dtype=torch.bfloat16, device="cuda")),
     "out must have shape"),
    (lambda x, w, o, y: cake_moe.grouped_gemm_fwd(x, w, o, out=x.view(-1)[:y.numel()].view(y.shape)), "out and x overlap"),
])
def test_bad_arguments_raise_before_any_launch(call, match):
    """Refused with the named error, and the poisoned output of the right shape not written."""
    x, w, _, offs = _problem([10, 20], 64, 128)
    y = poison_(torch.empty(x.shape[0], 64, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match=match):
        call(x, w, offs, y)
    torch.cuda.synchronize()
    assert y.isnan().all(), "a refused call wrote its output"


def test_operands_past_two_to_the_31_elements():
    """x and dx of 530000 x 4096 BF16 elements (past 2^31, inside max_grouped_rows): fwd, dgrad
    and det wgrad read and write them at 64-bit offsets. Checked on 512-row slices at both ends
    against the FP64 reference, and the second group's dW against an FP32 product."""
    k, n, half = 4096, 64, 265000
    rows = 2 * half
    assert rows * k > 2**31 and rows <= cake_moe.max_grouped_rows(n, k, 2)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.randn(rows, n, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(2, n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    offs = offsets([half, half])
    y = cake_moe.grouped_gemm_fwd(x, w, offs)
    dx = cake_moe.grouped_gemm_dgrad(g, w, offs)
    for e, (s, t) in enumerate([(0, 512), (rows - 512, rows)]):
        one = offsets([t - s])
        assert ref.rel_rms(y[s:t], ref.fwd(x[s:t], w[e:e + 1], one)) < BUDGET, f"fwd rows {s}..{t}"
        assert ref.rel_rms(dx[s:t], ref.dgrad(g[s:t], w[e:e + 1], one)) < BUDGET, f"dgrad rows {s}..{t}"
    del y, dx
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    want = (g[half:].float().T @ x[half:].float()).double()
    assert ref.rel_rms(dw[1], want) < BUDGET, "wgrad of the group past 2^31 elements"


_OVERLAPPING_GROUPS_CHECK = """
import torch, cake_moe
E, rows, guard = 1 << 22, (1 << 27) + (1 << 21), 1 << 16
offs = torch.zeros(E, dtype=torch.int32, device="cuda")
offs[0:8192:2] = rows      # groups 0, 2, .., 8190 each span every row: 2^32 + 2^26 tiles of 128 rows, twice that of 64
a = torch.randn(rows, 8, device="cuda").to(torch.bfloat16)
w = torch.randn(E, 8, 8, device="cuda").to(torch.bfloat16)
for prepare in (cake_moe.prepare_grouped_gemm_fwd, cake_moe.prepare_grouped_gemm_dgrad):
    buf = torch.full((guard + rows + guard, 8), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch = prepare(a, w, offs, out=buf[guard:guard + rows])
    launch.launch()
    torch.cuda.synchronize()
    written = int((~buf.isnan()).sum())
    assert written == 0, f"{launch.form} wrote {written} values"
    print(launch.form)
    del launch, buf
"""


@pytest.mark.parametrize("portable", [False, True])
def test_overlapping_groups_past_two_to_the_31_tiles_write_nothing(portable):
    """Malformed offsets whose groups overlap can add up to more tiles than 32 bits count (here
    2^32 + 2^26 of 128 rows, in 4096 groups that each span all 2^27 + 2^21 rows). The kernels
    run no tile then: a wrapped tile prefix decoded into negative row starts (on the code before,
    the native forward wrote 1.09e9 values and the portable one did not finish in 40 s).
    Nothing may be written, inside `out` or in the guard rows either side."""
    env = dict(os.environ, CAKE_MOE_GG_FORCE_PORTABLE="1" if portable else "0")
    out = subprocess.run([sys.executable, "-c", _OVERLAPPING_GROUPS_CHECK], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    forms = out.stdout.split()
    assert len(forms) == 2 and all(("portable" in f) == portable for f in forms), forms


def test_bounds_refused_before_launch():
    with pytest.raises(ValueError, match="rows exceed"):
        cake_moe.check_grouped_dims(7168, 2048, num_groups=8, max_rows=2**31)
    with pytest.raises(ValueError, match="multiple of 8"):
        cake_moe.check_grouped_dims(7164, 2048)
    assert cake_moe.max_grouped_rows(7168, 2048) > 2**28


def test_torch_library_opcheck():
    x, w, g, offs = _problem([64, 0, 128], 64, 128, pad=0)
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_fwd.default, (x, w, offs))
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_dgrad.default, (g, w, offs))


# --- weight gradient -------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("nk", [(256, 512), (200, 264)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_wgrad_patterns(pattern, nk, out_dtype):
    n, k = nk
    sizes = PATTERNS[pattern]
    x, w, g, offs = _problem(sizes, n, k)
    dw = poison_(torch.empty(len(sizes), n, k, dtype=out_dtype, device="cuda"))
    cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw, out_dtype=out_dtype)
    want = ref.wgrad(g, x, offs)
    _check_dw(dw, want)
    for e, size in enumerate(sizes):
        if size == 0:
            assert torch.equal(dw[e], torch.zeros_like(dw[e])), "an empty group's dW must be exactly zero"


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("which", ["w13", "w2"])
def test_wgrad_moe_layers(layer, which):
    h, i, e = layer
    n, k = (2 * i, h) if which == "w13" else (h, i)
    x, w, g, offs = _problem(random_sizes(4096, e, seed=h * 3 + i), n, k, seed=e + 1)
    _check_dw(cake_moe.grouped_gemm_wgrad(g, x, offs), ref.wgrad(g, x, offs))


def test_wgrad_det_repeatable_and_fast_within_budget():
    sizes = random_sizes(8192, 8, seed=21)
    x, w, g, offs = _problem(sizes, 512, 768, seed=7, pad=0)
    d0 = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    for _ in range(3):   # each repeat into a poisoned output of its own
        assert torch.equal(cake_moe.grouped_gemm_wgrad(g, x, offs, out=poison_(torch.empty_like(d0)), variant="det"), d0)
    assert torch.equal(_on_side_stream(lambda: cake_moe.grouped_gemm_wgrad(
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
    x, w, g, offs = _problem(sizes, 128, 256, seed=3, pad=0)
    x[240, 5] = float("inf")   # a row of the repeated band
    x[10, 7] = float("-inf")   # a row read once
    g[250, 9] = float("inf")   # a repeated row of G (its zeroed copy must not matter)
    g[310, 3] = float("nan")   # group 1
    got = cake_moe.grouped_gemm_wgrad(g, x, offs, variant=variant, out_dtype=torch.float32)
    want = ref.wgrad(g, x, offs)
    assert torch.equal(torch.isfinite(got).cpu(), torch.isfinite(want).cpu())
    assert (~torch.isfinite(want)).sum() > 0 and ref.rel_rms(got, want) < 1e-4


def test_prepared_wgrad_graph_replay_and_empty_rows():
    x, w, g, offs = _problem([50, 0, 70], 128, 256, pad=0)
    launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out_dtype=torch.float32)
    want = launch.launch().clone()
    assert torch.equal(_replayed(launch), want)
    empty = torch.empty(0, 128, dtype=torch.bfloat16, device="cuda")
    dw = cake_moe.grouped_gemm_wgrad(empty, torch.empty(0, 256, dtype=torch.bfloat16, device="cuda"),
                                     torch.zeros(3, dtype=torch.int32, device="cuda"))
    assert dw.shape == (3, 128, 256) and not dw.any()


def test_grouped_mm_autograd_and_compile():
    sizes = [100, 0, 37, 211]
    x, w, g, offs = _problem(sizes, 64, 128, pad=0)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = cake_moe.grouped_mm(xr, wr, offs)
    y.backward(g)
    assert ref.rel_rms(y, ref.fwd(x, w, offs)) < BUDGET
    assert ref.rel_rms(xr.grad, ref.dgrad(g, w, offs)) < BUDGET
    assert wr.grad.dtype == torch.bfloat16 and ref.rel_rms(wr.grad, ref.wgrad(g, x, offs)) < BUDGET

    class MoEMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w13 = torch.nn.Parameter(bf16(4, 256, 128, seed=3, scale=0.05))
            self.w2 = torch.nn.Parameter(bf16(4, 128, 128, seed=4, scale=0.05))

        def forward(self, t, o):
            h = cake_moe.grouped_mm(t, self.w13, o)
            gate, up = h.chunk(2, dim=-1)
            return cake_moe.grouped_mm((torch.nn.functional.silu(gate) * up).contiguous(), self.w2, o)

    model = MoEMLP().cuda()
    compiled = torch.compile(model, fullgraph=True)
    t = bf16(sum(sizes), 128, seed=8)
    out_eager = model(t, offs)
    out_comp = compiled(t, offs)
    assert ref.rel_rms(out_comp, out_eager.double()) < BUDGET
    out_comp.float().square().mean().backward()
    assert model.w13.grad is not None and torch.isfinite(model.w13.grad.float()).all()


@pytest.mark.parametrize("call", ["function", "op"])
def test_grouped_mm_zeroes_the_rows_no_group_covers(monkeypatch, call):
    """grouped_mm's y and x.grad are exact zeros in the rows past the last group end, even where
    the allocator hands back NaN blocks (torch.empty poisoned here), step after step: from the
    second step on the one-shot calls run the launches the first kept, pointed at each step's
    fresh outputs, the zeroing kernel included; the groups' rows keep the plain GEMMs' bits."""
    cake_moe.release()
    sizes = [100, 0, 37, 211]
    x, w, g, offs = _problem(sizes, 64, 128, seed=31, pad=40)
    end = sum(sizes)
    want_y, want_dx = cake_moe.grouped_gemm_fwd(x, w, offs), cake_moe.grouped_gemm_dgrad(g, w, offs)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison_(empty(*a, **k)))
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    for step in range(3):
        xr.grad = wr.grad = None
        y = (cake_moe.grouped_mm(xr, wr, offs) if call == "function"
             else torch.ops.cake_moe.grouped_mm(xr, wr, offs, "det"))
        y.backward(g)
        for got, want in ((y.detach(), want_y), (xr.grad, want_dx)):
            assert not got[end:].view(torch.int16).any(), (step, "a row past the last group end is not +0")
            assert torch.equal(got[:end], want[:end]), step
        if step == 0:
            plans = _kept_plans()
        assert _kept_plans() == plans, "a later step prepared a launch of its own"
    assert cake_moe.grouped_gemm_dgrad(g, w, offs)[end:].isnan().all()   # the direct op leaves them
    cake_moe.release()


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("form", ["", "gg_portable"])
@pytest.mark.parametrize("leading_zero", [False, True])
@pytest.mark.parametrize("replay", [False, True], ids=["eager", "graph"])
def test_prepared_zero_unrouted_rows_follows_new_offsets(op, form, leading_zero, replay):
    """zero_unrouted_rows=True: every launch (eager or graph-replayed) zeroes the rows past the
    current last end (offs' last entry in both conventions), clamped into the rows, before the
    GEMM (malformed offsets that give a group rows past a smaller last end keep its values),
    allocating nothing and writing nothing outside the output (guard rows either side); no
    group zeroes every row; rows before an m_indptr's nonzero first start are left alone."""
    x, w, g, _ = _problem([100, 200, 300], 128, 256, seed=33, pad=24)
    a, prepare = (x, cake_moe.prepare_grouped_gemm_fwd) if op == "fwd" else (g, cake_moe.prepare_grouped_gemm_dgrad)
    name = f"{form}_{op}" if form else ""
    rows, cols, guard = a.shape[0], w.shape[1 if op == "fwd" else 2], 8
    buf = poison_(torch.empty(rows + 2 * guard, cols, dtype=torch.bfloat16, device="cuda"))
    offs = offsets([100, 200, 300], leading_zero=leading_zero)
    launch = prepare(a, w, offs, buf[guard:guard + rows], form=name, zero_unrouted_rows=True)
    plain = prepare(a, w, offs, form=name)
    graph = _warm_and_capture(launch, replay)
    cases = [[100, 300, 600], [600, 600, 600], [0, 0, 0], [100, 400, 250], [50, 60, -5], [10, 20, rows + 99]]
    for ends in cases + ([[40, 100, 300, 600]] if leading_zero else []):   # the last: rows 0-39 in no group
        offs.copy_(torch.tensor(ends if len(ends) == offs.numel() else [0, *ends], dtype=torch.int32))
        poison_(buf)
        _launch_without_allocating(launch, graph)
        assert buf[:guard].isnan().all() and buf[guard + rows:].isnan().all(), (ends, "wrote outside the output")
        poison_(plain.out)
        want = plain.launch()
        covered = torch.zeros(rows, dtype=torch.bool, device="cuda")
        for start, stop in ref.group_bounds(offs, leading_zero, rows=rows):
            covered[start:stop] = True
        zero_from = min(max(ends[-1], 0), rows)
        assert torch.equal(launch.out[covered], want[covered]), ends
        tail = ~covered & (torch.arange(rows, device="cuda") >= zero_from)
        assert not launch.out[tail].view(torch.int16).any(), (ends, "an uncovered row past the last end is not +0")
        assert launch.out[~covered & ~tail].isnan().all(), (ends, "a row before the last end was zeroed")
    none = prepare(a, w[:0], offs[:int(leading_zero)], form=name, zero_unrouted_rows=True)
    poison_(none.out)
    assert not none.launch().view(torch.int16).any(), "no group: every row is +0"


def test_eager_grouped_mm_gives_the_ops_bits():
    """Eager grouped_mm (the autograd Function) and the torch.library op that compiled code
    runs give the same bits: output, x.grad and (det) w.grad."""
    x, w, g, offs = _problem([300, 0, 1, 700], 256, 512, seed=17, pad=0)
    results, names = [], []
    for call in (cake_moe.grouped_mm, lambda *a: torch.ops.cake_moe.grouped_mm(*a, "det")):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = call(xr, wr, offs)
        y.backward(g)
        results.append((y.detach(), xr.grad, wr.grad))
        names.append(type(y.grad_fn).__name__)
    assert names[0] == "GroupedMMBackward", "eager grouped_mm must run the autograd Function"
    for eager, op, what in zip(*results, ("output", "x.grad", "w.grad")):
        assert torch.equal(eager, op), f"eager grouped_mm and the op differ in {what}"
    assert ref.rel_rms(results[0][2], ref.wgrad(g, x.detach(), offs)) < BUDGET


_STRIDED_CHECK = """
import torch, cake_moe
from grouped_gemm_cases import bf16, offsets
sizes = [100, 0, 37, 211]
rows = sum(sizes) + 16
x, w, g = bf16(rows, 128), bf16(4, 64, 128, seed=1, scale=0.05), bf16(rows, 64, seed=2)
o = offsets(sizes)
xb, wb, gb = torch.cat([x, x[:, :32]], 1), torch.cat([w, w[:, :16]], 1), torch.cat([g, g[:, :8]], 1)
xs, ws, gs = xb[:, :128], wb[:, :64], gb[:, :64]          # rows 160 / 64-row experts 80 rows / rows 72 apart


def nan(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float('nan'), dtype=dtype, device='cuda')


def same(a, b):
    return torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                       b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32))


forms = set()
for op, strided, packed, shape, dtype in (
        ('fwd', (xs, ws, o), (x, w, o), (rows, 64), torch.bfloat16),
        ('dgrad', (gs, ws, o), (g, w, o), (rows, 128), torch.bfloat16),
        ('wgrad', (gs, xs, o), (g, x, o), (4, 64, 128), torch.bfloat16),
        ('wgrad', (gs, xs, o), (g, x, o), (4, 64, 128), torch.float32)):
    prep = getattr(cake_moe, 'prepare_grouped_gemm_' + op)
    kw = dict(out_dtype=dtype) if op == 'wgrad' else {}
    launch = prep(*strided, out=nan(*shape, dtype=dtype), **kw)     # bound in place, no copy
    forms.add(launch.form)
    want = prep(*packed, out=nan(*shape, dtype=dtype), **kw).launch()
    assert same(launch.launch(), want), op
    written = slice(None) if op == 'wgrad' else slice(0, sum(sizes))   # one-shot outputs start unset
    assert same(getattr(cake_moe, 'grouped_gemm_' + op)(*strided, **kw)[written], want[written]), op
launch = cake_moe.prepare_grouped_gemm_fwd(xs, ws, o, out=nan(rows, 64))
before = launch.launch().clone()
xb.copy_(torch.roll(xb, 1, 0))                                     # new values in the bound buffer
launch.out.fill_(float('nan'))
launch.launch()
assert same(launch.out, cake_moe.grouped_gemm_fwd(xs.contiguous(), w, o, out=nan(rows, 64)))
assert not same(launch.out, before)
print(sorted(forms))
"""


@pytest.mark.parametrize("portable", [False, True])
def test_row_strided_operands_give_the_bits_of_their_copies(portable):
    """Operands whose rows (and experts) start 16-byte multiples apart are read in place by
    the native and the portable forms, prepared or one-shot, with exactly the bits of their
    contiguous copies; a prepared launch follows new values written into the strided buffers."""
    code = f"import sys; sys.path.insert(0, {TESTS_DIR!r})\n" + _STRIDED_CHECK
    env = dict(os.environ, CAKE_MOE_GG_FORCE_PORTABLE="1" if portable else "0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    forms = out.stdout.strip()
    assert ("gg_portable" in forms) == portable and ("gg_sm90" in forms) != portable, forms


def test_out_forms_under_torch_compile():
    """out= in compiled code (the *_out ops): eager bits, untouched padding rows, opcheck."""
    x, w, g, offs = _problem([100, 0, 37, 211], 64, 128)

    def step(x, w, g, offs, y, dx, dw):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=y)
        cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)
        cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw)
        return dw

    def outs():
        return (poison_(torch.empty(x.shape[0], 64, dtype=torch.bfloat16, device="cuda")),
                poison_(torch.empty(x.shape[0], 128, dtype=torch.bfloat16, device="cuda")),
                poison_(torch.empty(4, 64, 128, dtype=torch.bfloat16, device="cuda")))

    eager, compiled = outs(), outs()
    step(x, w, g, offs, *eager)
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True)(x, w, g, offs, *compiled)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))    # NaN padding rows included
    _check_rows(compiled[0], ref.fwd(x, w, offs))
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_fwd_out.default, (x, w, offs, compiled[0]))


def test_portable_forms_on_this_gpu():
    """The mma.sync forms that serve arches without a native form, run here on sm_90a."""
    code = f"import sys; sys.path.insert(0, {TESTS_DIR!r})\n" + """
import torch, cake_moe
from grouped_gemm_cases import PATTERNS, bf16, offsets
from cake_moe.reference import grouped_gemm as ref
worst = 0.0
for name, sizes in PATTERNS.items():
    for n, k in ((256, 512), (200, 264)):
        rows = sum(sizes) + 8
        x, w, g = bf16(rows, k), bf16(len(sizes), n, k, seed=1, scale=0.05), bf16(rows, n, seed=2)
        o = offsets(sizes)
        y = torch.full((rows, n), float('nan'), dtype=torch.bfloat16, device='cuda')
        launch = cake_moe.prepare_grouped_gemm_fwd(x, w, o, out=y)
        assert launch.form == 'gg_portable_fwd', launch.form
        launch.launch()
        assert y[sum(sizes):].isnan().all()
        dw32 = cake_moe.grouped_gemm_wgrad(g, x, o, out_dtype=torch.float32)
        worst = max(worst, ref.rel_rms(y, ref.fwd(x, w, o)),
                    ref.rel_rms(cake_moe.grouped_gemm_dgrad(g, w, o), ref.dgrad(g, w, o)),
                    ref.rel_rms(cake_moe.grouped_gemm_wgrad(g, x, o), ref.wgrad(g, x, o)),
                    ref.rel_rms(dw32, ref.wgrad(g, x, o)) * 50)  # FP32 output: 50x tighter
print(worst)
"""
    env = dict(__import__("os").environ, CAKE_MOE_GG_FORCE_PORTABLE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip()) < BUDGET


@pytest.mark.parametrize("variant", ["det", "fast"])
def test_wgrad_default_form_by_rows_per_group(variant):
    """The default wgrad takes the cluster-pair form when groups average at most 512 rows and the
    output is bf16; longer groups and FP32 outputs take the splitting form. Both give the
    reference's answer. Only the splitting form holds a split-K workspace (also when named on
    short groups); the pair form never splits and gets none."""
    n, k = 256, 512
    for sizes, pair in (([300, 0, 700, 500], True), ([2048, 0, 1500, 2600], False)):
        x, w, g, offs = _problem(sizes, n, k, seed=5, pad=0)
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


def test_wgrad_det_bits_do_not_depend_on_the_workspace_size():
    """A caller's workspace larger than the wgrad needs splits the groups as the default one
    does (the kernel is told the size it needs), so its det bits are the one-shot call's: a
    captured training step with a buffer of its own matches the eager step. Groups of 32768
    rows split along the rows, where the slots that fit would set the chunk length. A
    workspace that overlaps an operand or the output is refused."""
    x, w, g, offs = _problem([32768, 0, 32768], 2048, 4096, seed=9, pad=0)
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


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("tile", SM90_TILES)
def test_every_sm90_tile_form(op, tile):
    x, w, g, offs = _problem(PATTERNS["ragged6"], 200, 264, seed=4)
    if op == "fwd":
        launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs, out=poison_(torch.empty(x.shape[0], 200, dtype=torch.bfloat16,
                                                                                       device="cuda")),
                                                   form=f"gg_sm90_fwd_{tile}")
        want = ref.fwd(x, w, offs)
    else:
        launch = cake_moe.prepare_grouped_gemm_dgrad(g, w, offs, out=poison_(torch.empty(x.shape[0], 264, dtype=torch.bfloat16,
                                                                                         device="cuda")),
                                                     form=f"gg_sm90_dgrad_{tile}")
        want = ref.dgrad(g, w, offs)
    assert launch.form == f"gg_sm90_{op}_{tile}"
    _check_rows(launch.launch(), want)
    with pytest.raises(ValueError, match="not a grouped GEMM fwd form of this build"):
        cake_moe.prepare_grouped_gemm_fwd(x, w, offs, form="gg_sm90_fwd_32x32")


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
def test_a_groups_rows_do_not_depend_on_the_other_groups(op):
    """Batch invariance: a group's output rows are the same bits whatever the other groups hold
    and whichever tile form the heuristic then picks (every sm_90a fwd / dgrad form takes each
    output's k16 steps in order). The wgrad is not covered: how it splits a group's rows over
    units depends on the whole problem."""
    n, k, first = 1536, 2048, 300
    w = bf16(16, n, k, seed=2, scale=0.05)
    a_all = bf16(65536, k if op == "fwd" else n, seed=1)
    rows, forms = [], set()
    for total in (512, 4096, 16384, 65536):
        offs = offsets([first] + random_sizes(total - first, 15, seed=total))
        prepare = cake_moe.prepare_grouped_gemm_fwd if op == "fwd" else cake_moe.prepare_grouped_gemm_dgrad
        launch = prepare(a_all[:total], w, offs)
        forms.add(launch.form)
        rows.append(launch.launch()[:first].clone())
    assert len(forms) >= 2, f"the totals should span tile forms: {forms}"
    assert all(torch.equal(r, rows[0]) for r in rows[1:]), f"{op}: group 0's rows changed with the others ({forms})"
    want = (ref.fwd if op == "fwd" else ref.dgrad)(a_all[:first], w[:1], offsets([first]))
    _check_rows(rows[0], want, poisoned=False)


def _split_tail_sizes(layout: str, n_out: int) -> list[int]:
    """Group sizes whose 128x256 tiles put the split tail to work on this GPU: all in one wave
    of at most half the SMs ("one_wave"), or whole waves and then 1..n_tiles tiles
    ("short_last_wave"); five groups with ragged last tiles (one of one row)."""
    if layout == "one_wave":
        return PATTERNS["mixed"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n_tiles = -(-n_out // 256)
    m_tiles = -(-(sms + 1) // n_tiles)  # tiles in [sms + 1, sms + n_tiles]: a short last wave
    per = [m_tiles // 5 + (1 if i < m_tiles % 5 else 0) for i in range(5)]
    return [128 * (m - 1) + 1 + 31 * i for i, m in enumerate(per)]  # last tiles of 1..125 rows


def _split_and_whole(monkeypatch, prepare, *args, **kwargs):
    """(split, whole): launches of the same problem with the split tail on (the default) and
    off (CAKE_MOE_GG_SPLIT_TAIL=0, read when a launch is prepared)."""
    split = prepare(*args, **kwargs)
    monkeypatch.setenv("CAKE_MOE_GG_SPLIT_TAIL", "0")
    whole = prepare(*args, **kwargs)
    monkeypatch.delenv("CAKE_MOE_GG_SPLIT_TAIL")
    return split, whole


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("layout,n_out", [("one_wave", 512), ("short_last_wave", 512), ("one_wave", 200),
                                          ("short_last_wave", 200)])
def test_split_tail_gives_the_whole_tiles_bits(monkeypatch, op, layout, n_out):
    """The 128x256 form with its split tail (a last wave of at most half the grid run as N
    halves) gives the bits of whole tiles, inside the budget, with rows past the last group
    untouched; the sizes make the split happen on this GPU (n_out 200: a half partly past Nout)."""
    sizes = _split_tail_sizes(layout, n_out)
    n, k = (n_out, 264) if op == "fwd" else (264, n_out)
    x, w, g, offs = _problem(sizes, n, k, seed=7)
    a, prepare, want = ((x, cake_moe.prepare_grouped_gemm_fwd, ref.fwd(x, w, offs)) if op == "fwd" else
                        (g, cake_moe.prepare_grouped_gemm_dgrad, ref.dgrad(g, w, offs)))
    split, whole = _split_and_whole(monkeypatch, prepare, a, w, offs, form=f"gg_sm90_{op}_128x256")
    for launch in (split, whole):
        poison_(launch.out)  # rows past the last group must stay poisoned
    got = split.launch()
    _check_rows(got, want)
    assert torch.equal(got.view(torch.int16), whole.launch().view(torch.int16)), "the split tail changed the bits"


def test_split_tail_halves_a_short_wave(monkeypatch):
    """The split actually runs: 20 tiles of 128x256 over a long K (one short wave) as 40 halves
    end in well under the time of whole tiles (no split gives 1.0). Timed round-robin, so clock
    drift falls on both alike. Not ~0.5: with 20-40 CTAs busy each SM streams its operands
    alone, and a half reads 2/3 of a whole tile's bytes (0.803-0.805 in five timings on the H200:
    64.4 against 80.2 us)."""
    from cake_moe.bench import timing
    x, w, _, offs = _problem(PATTERNS["mixed"], 512, 8192, seed=8)
    split, whole = _split_and_whole(monkeypatch, cake_moe.prepare_grouped_gemm_fwd, x, w, offs,
                                    form="gg_sm90_fwd_128x256")
    ms = timing.time_interleaved({"split": split.launch, "whole": whole.launch}, rounds=6)
    ratio = ms["split"] / ms["whole"]
    assert ratio < 0.9, f"split / whole tiles time {ratio:.2f} ({ms}): the last wave was not split"


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
    x, w, g, offs = _problem(sizes, n, k, seed=11)
    dw = poison_(torch.empty(len(sizes), n, k, dtype=torch.bfloat16, device="cuda"))
    launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out=dw, variant=variant,
                                                 form=f"gg_sm90_wgrad_{variant}_c2")
    assert launch.form == f"gg_sm90_wgrad_{variant}_c2"
    launch.launch()
    want = ref.wgrad(g, x, offs)
    assert not dw.isnan().any(), "a dW element was not written"
    _check_dw(dw, want)
    for e, size in enumerate(sizes):
        if size == 0:
            assert torch.equal(dw[e], torch.zeros_like(dw[e])), "an empty group's dW must be exactly zero"
    if max(sizes) < 2048:
        unpaired = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, variant=variant, form=f"gg_sm90_wgrad_{variant}")
        assert torch.equal(dw, unpaired.launch())
    with pytest.raises(ValueError, match="bf16 only"):
        cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out_dtype=torch.float32, variant=variant,
                                            form=f"gg_sm90_wgrad_{variant}_c2")


# --- randomized sweep ------------------------------------------------------------------------

def _mixed_sizes(r, groups: int) -> list[int]:
    """Group sizes from a mix of empty, one-to-three-row, short and long groups (past 1024 groups
    only empty and one-to-three-row ones), at most ~24k rows in all."""
    if groups > 1024:
        return [r.choice([0, 0, 1, 2, 3]) for _ in range(groups)]
    sizes = [r.choice([0, r.randint(1, 3), r.randint(1, 300), r.randint(1, 300), r.randint(300, 3000)])
             for _ in range(groups)]
    while sum(sizes) > 24000:
        sizes = [s // 2 for s in sizes]
    return sizes


def _random_forms(r) -> dict[str, str]:
    fwd_dgrad = [""] * 3 + [f"gg_sm90_{{op}}_{t}" for t in SM90_TILES] + ["gg_portable_{op}"]
    return {op: r.choice(fwd_dgrad).format(op=op) for op in ("fwd", "dgrad")}


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_problems(seed):
    """Seeded random problems (group counts 1..64 or past 1024, N and K any multiples of 8 up to
    1280, empty / tiny / long groups, both offset conventions) through fwd, dgrad and wgrad on a
    random form of each (the default, every sm_90a tile, the pair wgrad, the portable forms),
    against the FP64 reference: the budget, rows past the last group untouched, empty groups'
    dW exactly zero, and a second launch giving the same bits. The draw is in the failure
    message."""
    r = random.Random(seed)
    groups = r.randint(1025, 1300) if r.random() < 0.1 else int(round(2 ** r.uniform(0, 6)))
    most = 16 if groups > 1024 else 160  # dW and its FP64 reference are [E, N, K]
    n, k = 8 * r.randint(1, most), 8 * r.randint(1, most)
    sizes, lz = _mixed_sizes(r, groups), r.random() < 0.5
    forms = _random_forms(r)
    variant, f32 = r.choice(["det", "fast"]), r.random() < 0.3
    wforms = ["", f"gg_sm90_wgrad_{variant}", "gg_portable_wgrad"] + ([] if f32 else [f"gg_sm90_wgrad_{variant}_c2"])
    forms["wgrad"] = r.choice(wforms)
    desc = f"E={groups} N={n} K={k} rows={sum(sizes)} leading_zero={lz} {forms} variant={variant} fp32={f32}"
    x, w, g, offs = _problem(sizes, n, k, seed=seed, leading_zero=lz, pad=r.choice([0, 1, 16]))
    try:
        for op, a, cols, want in (("fwd", x, n, ref.fwd(x, w, offs, lz)), ("dgrad", g, k, ref.dgrad(g, w, offs, lz))):
            prepare = cake_moe.prepare_grouped_gemm_fwd if op == "fwd" else cake_moe.prepare_grouped_gemm_dgrad
            out = poison_(torch.empty(a.shape[0], cols, dtype=torch.bfloat16, device="cuda"))
            launch = prepare(a, w, offs, out=out, form=forms[op])
            first = launch.launch().clone()
            _check_rows(first, want)
            poison_(out)
            again = launch.launch().view(torch.int16)  # NaN padding rows included
            assert torch.equal(again, first.view(torch.int16)), f"{op}: a second launch changed the bits"
        dtype = torch.float32 if f32 else torch.bfloat16
        dw = poison_(torch.empty(groups, n, k, dtype=dtype, device="cuda"))
        launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out=dw, out_dtype=dtype, num_groups=groups,
                                                     variant=variant, form=forms["wgrad"])
        got = launch.launch().clone()
        assert not got.isnan().any(), "a dW element was not written"
        err = ref.rel_rms(got, ref.wgrad(g, x, offs, lz))
        assert err < BUDGET / (50 if f32 else 1), f"wgrad relative RMS {err:.2e}"
        empty = torch.tensor(sizes, device="cuda") == 0
        assert not got[empty].view(torch.int16 if not f32 else torch.int32).any(), "an empty group's dW is not +0"
        poison_(dw)
        again = launch.launch()
        assert not again.isnan().any(), "a second wgrad launch left a dW element unwritten"
        assert variant == "fast" or torch.equal(again, got), "wgrad det: a second launch changed the bits"
    except AssertionError as err:
        raise AssertionError(f"{desc}: {err}") from None
