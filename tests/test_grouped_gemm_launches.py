"""CPU tests of family A's launches: the launches one-shot calls keep (prepared launches stood
in), and the prepared launches that zero the rows in no group."""
from __future__ import annotations

import pytest
import torch

import cake_moe
from cake_moe import _runtime
from cake_moe.reference import grouped_gemm as ref

from .grouped_gemm_cases import bf16, cpu_problem, offsets


def test_cpu_calls_keep_no_launch():
    """One-shot calls keep their prepared launches for CUDA operands only: the CPU path (the
    reference) leaves nothing behind, whatever it is called with."""
    from cake_moe.grouped_gemm import _kept_launches
    cake_moe.release()
    x, w, g, offs = cpu_problem([2, 5, 0, 1])
    for _ in range(2):
        cake_moe.grouped_gemm_fwd(x, w, offs)
        cake_moe.grouped_gemm_dgrad(g, w, offs)
        cake_moe.grouped_gemm_wgrad(g, x, offs)
    assert not _kept_launches._kept


class _NoKernel:
    def launch(self, stream):
        pass

    def launch_to(self, stream, out_ptr):
        pass


@pytest.fixture
def launches_stood_in(monkeypatch):
    """CPU tensors stand in for CUDA ones in one-shot calls, and each preparation is recorded
    (its op, in the returned list) and binds a launch that runs nothing. The current stream is
    ``stream[0]`` of the second value returned."""
    from cake_moe.grouped_gemm import _kept_launches, _ops
    prepared: list[str] = []

    def stand_in(op):
        def prepare(a, b, offs, out=None, *args, **kwargs):
            prepared.append(op)
            shape = ((offs.numel(), a.shape[1], b.shape[1]) if op == "wgrad"
                     else (a.shape[0], b.shape[1] if op == "fwd" else b.shape[2]))
            result = torch.empty(shape, dtype=a.dtype) if out is None else out
            return cake_moe.GroupedGemmLaunch(op, _NoKernel(), a.device, result, (a, b, offs, None))
        return prepare

    for op in ("fwd", "dgrad", "wgrad"):
        monkeypatch.setattr(_ops, f"prepare_grouped_gemm_{op}", stand_in(op))
    monkeypatch.setattr(_kept_launches, "_is_cuda", lambda t: isinstance(t, torch.Tensor))
    stream = [7]
    monkeypatch.setattr(_runtime, "stream_handle", lambda device: stream[0])
    monkeypatch.setattr(_runtime, "capturing", lambda device: False)
    monkeypatch.delenv("CAKE_MOE_ONE_SHOT_CACHE", raising=False)
    monkeypatch.delenv("CAKE_MOE_GG_SPLIT_TAIL", raising=False)
    cake_moe.release()
    yield prepared, stream
    cake_moe.release()


def test_one_shot_checks_out_against_the_callers_operand(launches_stood_in):
    """Where a one-shot call copies an operand (a column slice, 2 bytes off 16), an out= over
    the caller's tensor is refused before anything is prepared or kept (prepare() sees only
    the copy), on the path that keeps launches too."""
    prepared, _ = launches_stood_in
    _, w, _, offs = cpu_problem([3, 0, 5], n=16, k=32)
    buf = torch.randn(8 * 33 + 64, dtype=torch.float32).to(torch.bfloat16)
    x = buf[:8 * 33].view(8, 33)[:, 1:]
    with pytest.raises(ValueError, match="out and x overlap"):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=buf[:8 * 16].view(8, 16))
    assert prepared == []
    cake_moe.grouped_gemm_fwd(x, w, offs, out=torch.empty(8, 16, dtype=torch.bfloat16))   # elsewhere: prepared
    assert prepared == ["fwd"]


def test_one_shot_wgrad_checks_its_key_arguments_first(launches_stood_in):
    """num_groups and out_dtype go into the cache's key: an unhashable one is a ValueError, not
    a TypeError from the lookup."""
    _, w, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    x = torch.randn(g.shape[0], 32).to(torch.bfloat16)
    for kwargs, match in (({"num_groups": [3]}, "num_groups must be an integer"),
                          ({"out_dtype": []}, "out_dtype must be torch.bfloat16 or torch.float32")):
        with pytest.raises(ValueError, match=match):
            cake_moe.grouped_gemm_wgrad(g, x, offs, **kwargs)


def test_one_shot_keying_with_launches_stood_in(launches_stood_in, monkeypatch):
    """The one-shot cache's keying, on the CPU (launches stood in). The same operands find the
    kept launch (a fresh output each call); another stride at the same address, another dtype,
    an ``out``, another stream (wgrad), a prepare-time switch or the cache switch prepare anew."""
    from cake_moe.grouped_gemm import _kept_launches
    prepared, stream = launches_stood_in
    x, w, g, offs = cpu_problem([2, 5, 0, 1])
    ys = [cake_moe.grouped_gemm_fwd(x, w, offs) for _ in range(3)]
    assert prepared == ["fwd"] and len({y.data_ptr() for y in ys}) == 3
    wide = torch.cat([x, x], dim=1)
    cake_moe.grouped_gemm_fwd(wide[:, :x.shape[1]], w, offs)                # same address, row stride 2K
    cake_moe.grouped_gemm_fwd(wide[:, :x.shape[1]], w, offs)
    cake_moe.grouped_gemm_fwd(wide.view(-1, x.shape[1])[:x.shape[0]], w, offs)  # same address, contiguous
    cake_moe.grouped_gemm_fwd(x[:-1], w, offs)                                  # same address, fewer rows
    assert prepared == ["fwd"] * 4
    out = torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16)
    assert cake_moe.grouped_gemm_fwd(x, w, offs, out=out) is out
    assert cake_moe.grouped_gemm_fwd(x, w, offs, out=out) is out
    assert prepared == ["fwd"] * 5
    cake_moe.grouped_gemm_fwd(x, w.clone(), offs)                                  # the same values, new address
    cake_moe.grouped_gemm_fwd(x.view(torch.float16), w, offs)                      # same address, other dtype
    assert prepared == ["fwd"] * 7
    for _ in range(2):
        cake_moe.grouped_gemm_dgrad(g, w, offs)
        cake_moe.grouped_gemm_wgrad(g, x, offs)
    assert prepared[7:] == ["dgrad", "wgrad"]
    stream[0] = 8   # wgrad binds the stream's workspace: kept per stream
    cake_moe.grouped_gemm_wgrad(g, x, offs)
    cake_moe.grouped_gemm_dgrad(g, w, offs)
    assert prepared[9:] == ["wgrad"]
    # eager grouped_mm steps: the backward's pair of launches is kept under one key too
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    del prepared[:]
    grads = []
    for _ in range(3):
        cake_moe.grouped_mm(xl, wl, offs).backward(g)
        grads.append((xl.grad, wl.grad))
        xl.grad = wl.grad = None
    assert prepared == ["fwd", "dgrad", "wgrad"]
    assert sum(key[0] == "grads" for key in _kept_launches._kept) == 1
    assert all(dx.shape == x.shape and dw.shape == w.shape and dw.dtype == w.dtype for dx, dw in grads)
    assert len({dx.data_ptr() for dx, _ in grads[1:]}) == 2   # each step's own gradients
    stream[0] = 9
    cake_moe.grouped_mm(xl, wl, offs).backward(g)
    assert prepared == ["fwd", "dgrad", "wgrad", "wgrad"]     # wgrad's workspace is the stream's
    wl.requires_grad_(False)
    xl.grad = None
    cake_moe.grouped_mm(xl, wl, offs).backward(g)
    assert prepared[4:] == [] and xl.grad is not None           # dx alone: the kept dgrad
    monkeypatch.setenv("CAKE_MOE_GG_SPLIT_TAIL", "0")
    cake_moe.grouped_gemm_fwd(x, w, offs)
    cake_moe.grouped_gemm_fwd(x, w, offs)
    assert prepared == ["fwd", "dgrad", "wgrad", "wgrad", "fwd"]
    monkeypatch.setenv("CAKE_MOE_ONE_SHOT_CACHE", "0")
    kept = len(_kept_launches._kept)
    cake_moe.grouped_gemm_fwd(x, w, offs)
    cake_moe.grouped_gemm_fwd(x, w, offs)
    assert prepared[5:] == ["fwd", "fwd"] and len(_kept_launches._kept) == kept
    cake_moe.release()
    assert not _kept_launches._kept


def test_per_thread_default_stream_keys_the_wgrad_by_thread(launches_stood_in):
    """The per-thread default stream's handle (2, through torch.cuda.ExternalStream) is the same
    on every thread and a different stream on each: a one-shot wgrad kept per stream is kept
    per thread there (each thread's own workspace), while another handle is one stream for all."""
    import threading
    prepared, stream = launches_stood_in
    _, _, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    x = torch.randn(g.shape[0], 32).to(torch.bfloat16)

    def twice_on_another_thread():
        worker = threading.Thread(target=lambda: [cake_moe.grouped_gemm_wgrad(g, x, offs) for _ in range(2)])
        worker.start()
        worker.join()

    for handle, wgrads in ((2, ["wgrad", "wgrad"]), (7, ["wgrad"])):
        stream[0] = handle
        del prepared[:]
        cake_moe.grouped_gemm_wgrad(g, x, offs)
        cake_moe.grouped_gemm_wgrad(g, x, offs)
        twice_on_another_thread()
        assert prepared == wgrads, handle


def test_per_stream_workspaces_keep_the_last_eight_streams(launches_stood_in):
    """The one-shot wgrad's workspaces: one per stream, for the 8 streams of a device used last
    (a stream used again moves to the end); a workspace dropped, or replaced by a larger one, takes the
    kept launches and backward pairs that bind it along, and no other."""
    from cake_moe.grouped_gemm import _kept_launches
    _, stream = launches_stood_in
    cpu = torch.device("cpu")

    def on(handle: int, nbytes: int = 64) -> torch.Tensor:
        stream[0] = handle
        ws = _kept_launches._workspace(cpu, nbytes)
        assert ws is not None and ws.numel() >= nbytes and not ws.any()
        launch = (None, (1,), torch.bfloat16, cpu, ws)   # a kept wgrad launch's entry
        _kept_launches._kept[("wgrad", handle)] = launch
        _kept_launches._kept[("grads", handle)] = (None, launch)
        _kept_launches._kept[("fwd", handle)] = (None, (1,), torch.bfloat16, cpu, None)
        return ws

    def held() -> list[int]:
        return [key[1] for key in _kept_launches._workspaces]

    first = {h: on(h) for h in range(1, 9)}
    assert held() == list(range(1, 9))
    assert on(1) is first[1] and held() == [*range(2, 9), 1]   # the same one, now the most recent
    on(9)                                                       # stream 2's goes, with its launches
    assert held() == [*range(3, 9), 1, 9]
    kept = _kept_launches._kept
    assert ("wgrad", 2) not in kept and ("grads", 2) not in kept and ("fwd", 2) in kept
    assert all(("wgrad", h) in kept and ("grads", h) in kept for h in held())
    larger = on(3, 4096)                                        # replaced: its old launches go
    assert larger is not first[3] and held()[-1] == 3
    assert kept[("wgrad", 3)][4] is larger
    assert not any(e[4] is first[3] for entry in kept.values() for e in _kept_launches.launches_of(entry))
    assert _kept_launches._workspace(cpu, 0) is None and len(held()) == 8
    other = (0, 99, None)   # another device's workspace counts against its own device only
    _kept_launches._workspaces[other] = torch.zeros(1, dtype=torch.uint8)
    on(10)
    assert len(held()) == 9 and other in _kept_launches._workspaces and 4 not in held()


@pytest.mark.parametrize("let_go", ["release", "room"])
def test_a_launch_whose_workspace_is_let_go_meanwhile_is_not_kept(launches_stood_in, monkeypatch, let_go):
    """A one-shot wgrad whose stream's workspace is let go between its preparation taking it and
    its launch being kept (another thread's release(), or its calls on eight other streams
    making room) keeps nothing: kept, the launch would hold the dropped workspace past the
    per-device bound. Its stream's next call prepares again, on a fresh workspace, and keeps it."""
    from cake_moe.grouped_gemm import _kept_launches, _ops
    prepared, stream = launches_stood_in
    cpu = torch.device("cpu")
    meanwhile = [True]

    def prepare(g, x, offs, out=None, *args, **kwargs):
        prepared.append("wgrad")
        ws = _kept_launches._workspace(cpu, 64)
        if meanwhile[0]:
            meanwhile[0] = False
            if let_go == "release":
                cake_moe.release()
            else:
                here = stream[0]
                for other in range(100, 108):
                    stream[0] = other
                    _kept_launches._workspace(cpu, 64)
                stream[0] = here
        result = torch.empty((offs.numel(), g.shape[1], x.shape[1]), dtype=g.dtype)
        return cake_moe.GroupedGemmLaunch("wgrad", _NoKernel(), cpu, result, (g, x, offs, ws))

    monkeypatch.setattr(_ops, "prepare_grouped_gemm_wgrad", prepare)
    _, _, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    x = torch.randn(g.shape[0], 32).to(torch.bfloat16)
    cake_moe.grouped_gemm_wgrad(g, x, offs)
    held = list(_kept_launches._workspaces.values())
    assert not _kept_launches._kept and len(held) == (0 if let_go == "release" else 8)
    for _ in range(2):
        cake_moe.grouped_gemm_wgrad(g, x, offs)
    assert prepared == ["wgrad", "wgrad"]
    (entry,) = _kept_launches._kept.values()
    assert any(entry[4] is ws for ws in _kept_launches._workspaces.values())
    assert not any(entry[4] is ws for ws in held)


def test_a_large_models_step_keeps_every_launch(launches_stood_in):
    """A training step of a deep MoE model (here 64 layers, each with a w13 and a w2 grouped_mm)
    keeps every one of its launches (fwd, dgrad, wgrad and the backward's pair: 8 a layer):
    the next step prepares nothing. (A cache that cleared itself at 256 entries prepared
    everything again every step.) Each layer's activations and gradients are fixed tensors
    here, as the CUDA caching allocator's blocks are from step to step."""
    prepared, _ = launches_stood_in
    x, w13, g13, offs = cpu_problem([2, 5, 0, 1])
    w2 = bf16(len(offs), x.shape[1], w13.shape[1], device="cpu")   # [E, K, N]: h [rows, N] -> [rows, K]
    layers = [tuple(t.clone().requires_grad_(grad) for t, grad in
                    ((x, True), (w13, True), (g13, False), (g13, True), (w2, True), (x, False)))
              for _ in range(64)]

    def step():
        for x, w13, g13, h, w2, g2 in layers:
            cake_moe.grouped_mm(x, w13, offs).backward(g13)
            cake_moe.grouped_mm(h, w2, offs).backward(g2)

    step()
    assert len(prepared) == 64 * 2 * 3
    step()
    step()
    assert len(prepared) == 64 * 2 * 3


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("leading_zero", [False, True])
def test_zero_unrouted_rows_on_request(op, leading_zero):
    """prepare_*(zero_unrouted_rows=True) zeroes the rows in no group at every launch, into a
    caller's out too, and leaves the groups' rows to the GEMM: those past the last group end
    (offs' last entry in both conventions, clamped into the rows; all of them with no group) and
    those before an m_indptr's first entry where it is above 0 (malformed, or an [E] offsets
    tensor of E + 1 entries read as m_indptr: either way no group holds them). Rows between the
    groups that malformed offsets leave out stay untouched."""
    x, w, g, _ = cpu_problem([3, 0, 5], n=16, k=32)
    offs = offsets([3, 0, 5], device="cpu", leading_zero=leading_zero)
    a, cols = (x, w.shape[1]) if op == "fwd" else (g, w.shape[2])
    prepare = getattr(cake_moe, f"prepare_grouped_gemm_{op}")
    out = torch.full((a.shape[0], cols), float("nan"), dtype=torch.bfloat16)
    launch = prepare(a, w, offs, out, zero_unrouted_rows=True)
    plain = prepare(a, w, offs)
    assert torch.equal(launch.launch()[:8], plain.launch()[:8]) and out[8:].eq(0).all()
    cases = [((-1, 6), 0, 6), ((-1, -3), 0, 0), ((-1, 99), 0, a.shape[0])]   # (index, value), zeroed [0, head), [tail, rows)
    if leading_zero:
        cases += [((0, 2), 2, 8), ((0, 5), 5, 8)]     # m_indptr from row 2 / 5: the rows before it zeroed
    rows = torch.arange(a.shape[0])
    for (index, value), head, tail in cases:                           # new offsets, read at each launch
        out.fill_(float("nan"))
        offs.copy_(offsets([3, 0, 5], device="cpu", leading_zero=leading_zero))
        offs[index] = value
        launch.launch()
        want = plain.launch()
        covered = torch.zeros(a.shape[0], dtype=torch.bool)
        for start, end in ref.group_bounds(offs, leading_zero, rows=a.shape[0]):
            covered[start:end] = True
        outside = (rows < head) | (rows >= tail)
        assert torch.equal(out[covered], want[covered])
        assert out[~covered & outside].eq(0).all()
        assert out[~covered & ~outside].isnan().all()
    empty = prepare(a, w[:0], torch.zeros(int(leading_zero), dtype=torch.int32), zero_unrouted_rows=True)
    empty.out.fill_(float("nan"))
    assert empty.launch().eq(0).all()
    with pytest.raises(ValueError, match="zero_unrouted_rows must be True or False"):
        prepare(a, w, offs, zero_unrouted_rows=1)


def test_opcheck_of_the_zeroing_ops():
    """The dgrad op with zero_unrouted_rows and the grouped_mm op (its autograd included) pass
    opcheck with rows past the last group end: those rows are defined (zero) there."""
    x, w, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_dgrad.default, (g, w, offs, True))
    torch.library.opcheck(torch.ops.cake_moe.grouped_mm.default,
                          (x.clone().requires_grad_(), w.clone().requires_grad_(), offs, "det"))
