"""CPU tests of family A's host side: validation, bounds, variant resolution, the CPU path."""
from __future__ import annotations

import pytest
import torch

import cake_moe
from cake_moe import _config, _runtime
from cake_moe.reference import grouped_gemm as ref

from .grouped_gemm_cases import bf16, offsets


def _cpu_problem(sizes, n=32, k=64):
    rows = sum(sizes) + 4
    return (bf16(rows, k, device="cpu"), bf16(len(sizes), n, k, seed=1, device="cpu"),
            bf16(rows, n, seed=2, device="cpu"), offsets(sizes, device="cpu"))


def test_reference_groups_and_conventions():
    assert ref.group_bounds(torch.tensor([3, 3, 8])) == [(0, 3), (3, 3), (3, 8)]
    assert ref.group_bounds(torch.tensor([0, 3, 3, 8]), leading_zero=True) == [(0, 3), (3, 3), (3, 8)]
    # malformed offsets clamp as the kernels' ragged_group_rows does (group_rows.cuh)
    assert ref.group_bounds(torch.tensor([-2, 5, 8, 12, 4]), leading_zero=True, rows=10) == \
        [(0, 5), (5, 8), (8, 10), (10, 10)]
    x, w, g, offs = _cpu_problem([3, 0, 5])
    bad = torch.tensor([-2, 5, 8], dtype=torch.int32)          # ends: group 0 empty, group 1 from row 0
    y = cake_moe.grouped_gemm_fwd(x, w, bad)
    assert torch.equal(y[:5], (x[:5].double() @ w[1].double().T).to(torch.bfloat16))
    assert torch.equal(y[5:8], (x[5:8].double() @ w[2].double().T).to(torch.bfloat16))
    x, w, g, offs = _cpu_problem([3, 0, 5])
    y = ref.fwd(x, w, offs)
    assert y[8:].isnan().all() and torch.isfinite(y[:8]).all()
    assert torch.allclose(y[3:8], x[3:8].double() @ w[2].double().T)
    # dgrad and wgrad against products written out here (the CPU path runs these references, so
    # its tests compare with them; this is their independent check)
    dx = ref.dgrad(g, w, offs)
    assert dx[8:].isnan().all()
    assert torch.allclose(dx[:3], g[:3].double() @ w[0].double()) and torch.allclose(dx[3:8], g[3:8].double() @ w[2].double())
    dw = ref.wgrad(g, x, offs)
    assert torch.equal(dw[1], torch.zeros_like(dw[1]))
    assert torch.allclose(dw[0], g[:3].double().T @ x[:3].double())
    assert torch.allclose(dw[2], g[3:8].double().T @ x[3:8].double())


def test_cpu_path_matches_reference_and_leaves_padding():
    x, w, g, offs = _cpu_problem([2, 5, 0, 1])
    out = torch.full((x.shape[0], w.shape[1]), 7.0, dtype=torch.bfloat16)
    cake_moe.grouped_gemm_fwd(x, w, offs, out=out)
    assert (out[8:] == 7.0).all()
    assert ref.rel_rms(out[:8], ref.fwd(x, w, offs)[:8]) < 6e-3
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs, out_dtype=torch.float32)
    assert dw.dtype == torch.float32 and ref.rel_rms(dw, ref.wgrad(g, x, offs)) < 1e-5
    mi = offsets([2, 5, 0, 1], device="cpu", leading_zero=True)
    assert torch.equal(cake_moe.grouped_mm_bf16(x, w, mi)[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])


def test_cpu_path_writes_non_finite_results_and_only_the_groups_rows():
    """The CPU path writes each group's rows whatever their values: NaN and Inf inputs give
    NaN / Inf like torch._grouped_mm, rows past the last group stay as they were."""
    x, w, g, offs = _cpu_problem([2, 5, 0, 1])
    x[0, 0], x[1, 0] = float("nan"), float("inf")
    out = torch.full((x.shape[0], w.shape[1]), 7.0, dtype=torch.bfloat16)
    cake_moe.grouped_gemm_fwd(x, w, offs, out=out)
    assert out[0].isnan().all() and not torch.isfinite(out[1]).any() and torch.isfinite(out[2:8]).all()
    assert (out[8:] == 7.0).all()
    g[0, 0] = float("nan")
    dw = torch.full((w.shape[0], w.shape[1], w.shape[2]), 5.0, dtype=torch.bfloat16)
    cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw)
    assert dw[0].isnan().any() and torch.equal(dw[2], torch.zeros_like(dw[2])) and torch.isfinite(dw[3]).all()


def test_cpu_calls_keep_no_launch():
    """One-shot calls keep their prepared launches for CUDA operands only: the CPU path (the
    reference) leaves nothing behind, whatever it is called with."""
    from cake_moe.grouped_gemm import _kept_launches
    cake_moe.release()
    x, w, g, offs = _cpu_problem([2, 5, 0, 1])
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
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("CAKE_MOE_ONE_SHOT_CACHE", raising=False)
    monkeypatch.delenv("CAKE_MOE_GG_SPLIT_TAIL", raising=False)
    cake_moe.release()
    yield prepared, stream
    cake_moe.release()


def test_one_shot_keying_with_launches_stood_in(launches_stood_in, monkeypatch):
    """The one-shot cache's keying, on the CPU (launches stood in). The same operands find the
    kept launch (a fresh output each call); another stride at the same address, another dtype,
    an ``out``, another stream (wgrad), a prepare-time switch or the cache switch prepare anew."""
    from cake_moe.grouped_gemm import _kept_launches
    prepared, stream = launches_stood_in
    x, w, g, offs = _cpu_problem([2, 5, 0, 1])
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


def test_a_large_models_step_keeps_every_launch(launches_stood_in):
    """A training step of a deep MoE model (here 64 layers, each with a w13 and a w2 grouped_mm)
    keeps every one of its launches (fwd, dgrad, wgrad and the backward's pair: 8 a layer):
    the next step prepares nothing. (A cache that cleared itself at 256 entries prepared
    everything again every step.) Each layer's activations and gradients are fixed tensors
    here, as the CUDA caching allocator's blocks are from step to step."""
    prepared, _ = launches_stood_in
    x, w13, g13, offs = _cpu_problem([2, 5, 0, 1])
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


def test_check_grouped_dims():
    cake_moe.check_grouped_dims(7168, 2048, num_groups=8, max_rows=65536)
    for bad in ((7167, 2048), (0, 64), (64, -8)):
        with pytest.raises(ValueError, match="multiple of 8"):
            cake_moe.check_grouped_dims(*bad)
    cake_moe.check_grouped_dims(2**31 - 256, 8)
    assert cake_moe.max_grouped_rows(8, 8, 1) == 2**31 - 256   # a group's rows round up to tiles in 32 bits
    with pytest.raises(ValueError, match="rows exceed"):
        cake_moe.check_grouped_dims(8, 8, num_groups=1, max_rows=2**31 - 255)
    for bad in ((2**31 - 248, 8), (8, 2**31 - 8)):
        with pytest.raises(ValueError, match="32-bit column"):
            cake_moe.check_grouped_dims(*bad)
    limit = cake_moe.max_grouped_rows(4096, 4096, 16)
    cake_moe.check_grouped_dims(4096, 4096, num_groups=16, max_rows=limit)
    with pytest.raises(ValueError, match="exceed"):
        cake_moe.check_grouped_dims(4096, 4096, num_groups=16, max_rows=limit + 1)
    with pytest.raises(ValueError, match="max_rows must be >= 0"):
        cake_moe.check_grouped_dims(8, 8, max_rows=-1)
    # max_grouped_rows checks its arguments as check_grouped_dims does
    for args, match in (((0, 0), "multiple of 8"), ((7, 7), "multiple of 8"), ((-8, 8), "multiple of 8"),
                        (("8", 8), "N must be an integer"), ((8, 8, -5), "num_groups must be in"),
                        ((8, 2**31 - 8), "32-bit column")):
        with pytest.raises(ValueError, match=match):
            cake_moe.max_grouped_rows(*args)
    x, g = torch.randn(6, 16, dtype=torch.bfloat16), torch.randn(6, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="num_groups must be in"):
        cake_moe.grouped_gemm_wgrad(g, x, torch.tensor([2, 6], dtype=torch.int32), num_groups=-1)


def test_max_grouped_rows_keeps_the_tile_total_under_the_device_cap():
    """The device schedulers run nothing once fwd / dgrad tiles reach 2^31 - 2^20 (scheduler.cuh
    kTileCap): no problem max_grouped_rows admits may get there, in the smallest tiles (64) with
    every group adding a partial tile."""
    from cake_moe.grouped_gemm._checks import _MAX_TILES
    assert _MAX_TILES == 2**31 - 2**20
    for n, k, e in ((8, 8, 1), (64, 4096, 2), (7168, 2048, 8), (4096, 4096, 16), (8, 8, 2**20),
                    (2**20, 64, 1000), (200, 264, 1200)):
        rows = cake_moe.max_grouped_rows(n, k, e)
        tiles = (-(-rows // 64) + e) * -(-max(n, k) // 64)
        assert tiles < _MAX_TILES, (n, k, e, rows, tiles)


def test_integer_arguments_take_numpy_integers_and_refuse_floats():
    np = pytest.importorskip("numpy")
    cake_moe.check_grouped_dims(np.int64(4096), np.int32(2048), num_groups=np.int64(8), max_rows=np.int64(65536))
    for kw in (dict(n=4096.0, k=2048), dict(n=4096, k=2048, num_groups=2.7), dict(n=8, k=8, max_rows=1.5),
               dict(n=True, k=8)):
        with pytest.raises(ValueError, match="must be an integer"):
            cake_moe.check_grouped_dims(**kw)
    x, g = torch.randn(6, 16, dtype=torch.bfloat16), torch.randn(6, 8, dtype=torch.bfloat16)
    offs = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="num_groups must be an integer"):
        cake_moe.grouped_gemm_wgrad(g, x, offs, num_groups=2.7)
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs, num_groups=np.int64(2))
    assert torch.equal(dw, cake_moe.grouped_gemm_wgrad(g, x, offs, num_groups=2))


_BYTES = torch.zeros(1 << 16, dtype=torch.uint8)


def _aligned_bytes(n: int) -> torch.Tensor:
    """n bytes at the start of one 256-byte aligned buffer (calls share it, so they overlap)."""
    start = -_BYTES.data_ptr() % 256
    return _BYTES[start:start + n]


@pytest.mark.parametrize("call,match", [
    (lambda x, w, g, o: cake_moe.grouped_gemm_fwd(x[:, :60].contiguous(), w, o), "K="),
    (lambda x, w, g, o: cake_moe.grouped_gemm_fwd(x, w, o.to(torch.int64)), "dtype"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_fwd(x, w, o[:2]), "entries"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_dgrad(x, w, o), "columns"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_wgrad(g, x[:-1], o), "same rows"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_wgrad(g, x, o, out_dtype=torch.float16), "out_dtype"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_wgrad(g, x, o, num_groups=7), "entries"),
    (lambda x, w, g, o: cake_moe.grouped_mm_bf16(x, w, o), "m_indptr"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_wgrad(g, x, [2, 7, 8]), "offs must be a torch.Tensor"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_fwd(x, w, [2, 7, 8]), "offs must be a torch.Tensor"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_dgrad(g, None, o), "w must be a torch.Tensor"),
    (lambda x, w, g, o: cake_moe.grouped_mm([1.0], w, o), "x must be a torch.Tensor"),
    (lambda x, w, g, o: cake_moe.grouped_mm_bf16(x, None, o), "b must be a torch.Tensor"),
    (lambda x, w, g, o: cake_moe.grouped_mm_bf16(x, w[0], o), "3-D"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_fwd(x.t(), w, o), "x must have a unit stride along its last axis"),
    (lambda x, w, g, o: cake_moe.grouped_gemm_fwd(x, w, o, out=x[:, :32]), "contiguous"),
    # the CPU path refuses what the GPU build would
    (lambda x, w, g, o: cake_moe.prepare_grouped_gemm_fwd(x, w, o, form=123), "form must be a str"),
    (lambda x, w, g, o: cake_moe.prepare_grouped_gemm_fwd(x, w, o, form="bogus"), "not a grouped GEMM fwd form"),
    (lambda x, w, g, o: cake_moe.prepare_grouped_gemm_dgrad(g, w, o, form="gg_portable_fwd"), "dgrad form"),
    (lambda x, w, g, o: cake_moe.prepare_grouped_gemm_wgrad(g, x, o, form="gg_sm90_fwd_128x128"), "wgrad form"),
    (lambda x, w, g, o: cake_moe.prepare_grouped_gemm_wgrad(g, x, o, workspace="abc"), "workspace must be a"),
    (lambda x, w, g, o: cake_moe.prepare_grouped_gemm_wgrad(g, x, o, workspace=torch.zeros(16)), "workspace must have"),
    (lambda x, w, g, o: cake_moe.prepare_grouped_gemm_wgrad(g, x, o, out=_aligned_bytes(2 * 3 * 32 * 64).view(
        torch.bfloat16).view(3, 32, 64), workspace=_aligned_bytes(256)), "overlap"),
])
def test_bad_arguments(call, match):
    x, w, g, offs = _cpu_problem([2, 5, 1])
    with pytest.raises(ValueError, match=match):
        call(x, w, g, offs)


def test_named_forms_run_the_reference_on_the_cpu():
    """A form this build has (for its op) is accepted on the CPU, where the reference runs."""
    x, w, g, offs = _cpu_problem([2, 5, 1])
    want = cake_moe.prepare_grouped_gemm_fwd(x, w, offs).launch()
    built = {f["name"] for f in _runtime.manifest()["forms"]}
    for form in sorted({"gg_portable_fwd", "gg_sm90_fwd_128x128"} & built):
        launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs, form=form)
        assert launch.form == "cpu-reference" and torch.equal(launch.launch()[:8], want[:8])
    assert cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, form="gg_portable_wgrad").form == "cpu-reference"


def test_variant_resolution():
    try:
        assert _config.grouped_gemm_variant() == "det"
        cake_moe.configure(grouped_gemm_variant="fast")
        assert _config.grouped_gemm_variant() == "fast"
        torch.use_deterministic_algorithms(True)
        assert _config.grouped_gemm_variant() == "det"  # forced, logged once
        with pytest.raises(ValueError, match="deterministic"):
            _config.grouped_gemm_variant("fast")
        with pytest.raises(ValueError, match="conflicts"):
            cake_moe.configure(grouped_gemm_variant="fast")
        with pytest.raises(ValueError, match="'det' or 'fast'"):
            cake_moe.configure(grouped_gemm_variant="quick")
    finally:
        torch.use_deterministic_algorithms(False)
        cake_moe.configure(grouped_gemm_variant=None)


def test_backward_under_deterministic_mode_enabled_after_the_forward():
    """A forward run with 'fast' whose backward comes after torch.use_deterministic_algorithms
    (True): the backward runs 'det' (forced, as for the configured variant) rather than raise."""
    x, w, g, offs = _cpu_problem([3, 4, 1], n=16, k=32)
    x, w = x[:8].clone().requires_grad_(), w.clone().requires_grad_()
    try:
        cake_moe.configure(grouped_gemm_variant="fast")
        y = cake_moe.grouped_mm(x, w, offs)
        torch.use_deterministic_algorithms(True)
        y.backward(g[:8])
    finally:
        torch.use_deterministic_algorithms(False)
        cake_moe.configure(grouped_gemm_variant=None)
    assert ref.rel_rms(w.grad, ref.wgrad(g[:8], x.detach(), offs)) < 6e-3
    assert _config.inherited_variant("fast") == "fast" and _config.inherited_variant("det") == "det"


def test_fake_tensors_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(100, 64, dtype=torch.bfloat16)
        w = torch.empty(4, 32, 64, dtype=torch.bfloat16)
        offs = torch.empty(4, dtype=torch.int32)
        assert torch.ops.cake_moe.grouped_gemm_fwd(x, w, offs).shape == (100, 32)
        assert torch.ops.cake_moe.grouped_gemm_dgrad(torch.empty(100, 32, dtype=torch.bfloat16), w, offs).shape == (100, 64)
        dw = torch.ops.cake_moe.grouped_gemm_wgrad(torch.empty(100, 32, dtype=torch.bfloat16), x, offs, 4,
                                                   torch.float32, "det")
        assert dw.shape == (4, 32, 64) and dw.dtype == torch.float32


def test_autograd_on_cpu_matches_reference():
    x, w, g, offs = _cpu_problem([3, 4, 1], n=16, k=32)
    rows = 8
    x = x[:rows].clone().requires_grad_()
    w = w.clone().requires_grad_()
    y = cake_moe.grouped_mm(x, w, offs)
    y.backward(g[:rows])
    assert ref.rel_rms(x.grad, ref.dgrad(g[:rows], w.detach(), offs)) < 6e-3
    assert w.grad.dtype == torch.bfloat16
    assert ref.rel_rms(w.grad, ref.wgrad(g[:rows], x.detach(), offs)) < 6e-3


def _nan_empty(monkeypatch):
    """torch.empty hands back NaN-filled floating tensors (as a caching allocator may hand back
    the blocks of freed activations), so that a row left unwritten shows."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(torch, "empty", poisoned)


@pytest.mark.parametrize("via_op", [False, True])
def test_grouped_mm_zeroes_the_rows_no_group_covers(monkeypatch, via_op):
    """grouped_mm's y and x.grad are exact zeros in the rows past the last group end (no expert
    reads them: their gradient is zero); the direct ops leave a fresh output's rows there as
    allocated, and zero them on request."""
    x, w, g, offs = _cpu_problem([3, 0, 5], n=16, k=32)       # rows 8.. are in no group
    _nan_empty(monkeypatch)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = torch.ops.cake_moe.grouped_mm(xr, wr, offs, "det") if via_op else cake_moe.grouped_mm(xr, wr, offs)
    y.backward(g)
    for t in (y.detach(), xr.grad):
        assert torch.equal(t[8:], torch.zeros_like(t[8:])) and torch.isfinite(t[:8]).all()
    assert torch.equal(xr.grad[:8], cake_moe.grouped_gemm_dgrad(g, w, offs)[:8])
    assert cake_moe.grouped_gemm_dgrad(g, w, offs)[8:].isnan().all()      # as allocated
    assert torch.ops.cake_moe.grouped_gemm_dgrad(g, w, offs, True)[8:].eq(0).all()


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("leading_zero", [False, True])
def test_zero_unrouted_rows_on_request(op, leading_zero):
    """prepare_*(zero_unrouted_rows=True) zeroes the rows past the last group end (offs' last
    entry in both conventions, clamped into the rows; all of them with no group) at every
    launch, into a caller's out too, and leaves the groups' rows to the GEMM; rows before the
    first start of an m_indptr that does not begin at 0 (malformed) are left alone."""
    x, w, g, _ = _cpu_problem([3, 0, 5], n=16, k=32)
    offs = offsets([3, 0, 5], device="cpu", leading_zero=leading_zero)
    a, cols = (x, w.shape[1]) if op == "fwd" else (g, w.shape[2])
    prepare = getattr(cake_moe, f"prepare_grouped_gemm_{op}")
    out = torch.full((a.shape[0], cols), float("nan"), dtype=torch.bfloat16)
    launch = prepare(a, w, offs, out, zero_unrouted_rows=True)
    plain = prepare(a, w, offs)
    assert torch.equal(launch.launch()[:8], plain.launch()[:8]) and out[8:].eq(0).all()
    cases = [((-1, 6), 6), ((-1, -3), 0), ((-1, 99), a.shape[0])]   # (index, value), first zeroed row
    if leading_zero:
        cases.append(((0, 2), 8))                                     # rows 0-1 in no group, left alone
    for (index, value), zero_from in cases:                           # new offsets, read at each launch
        out.fill_(float("nan"))
        offs.copy_(offsets([3, 0, 5], device="cpu", leading_zero=leading_zero))
        offs[index] = value
        launch.launch()
        want = plain.launch()
        covered = torch.zeros(a.shape[0], dtype=torch.bool)
        for start, end in ref.group_bounds(offs, leading_zero, rows=a.shape[0]):
            covered[start:end] = True
        assert torch.equal(out[covered], want[covered])
        assert out[zero_from:][~covered[zero_from:]].eq(0).all()
        assert out[:zero_from][~covered[:zero_from]].isnan().all()
    assert not leading_zero or out[:2].isnan().all()
    empty = prepare(a, w[:0], torch.zeros(int(leading_zero), dtype=torch.int32), zero_unrouted_rows=True)
    empty.out.fill_(float("nan"))
    assert empty.launch().eq(0).all()
    with pytest.raises(ValueError, match="zero_unrouted_rows must be True or False"):
        prepare(a, w, offs, zero_unrouted_rows=1)


def test_opcheck_of_the_zeroing_ops():
    """The dgrad op with zero_unrouted_rows and the grouped_mm op (its autograd included) pass
    opcheck with rows past the last group end: those rows are defined (zero) there."""
    x, w, g, offs = _cpu_problem([3, 0, 5], n=16, k=32)
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_dgrad.default, (g, w, offs, True))
    torch.library.opcheck(torch.ops.cake_moe.grouped_mm.default,
                          (x.clone().requires_grad_(), w.clone().requires_grad_(), offs, "det"))


def test_only_grouped_mm_is_differentiable_and_only_once():
    """The CPU path behaves as the kernels: the direct ops' results carry no autograd graph, and
    grouped_mm's backward cannot be differentiated again (an error, not second-order gradients
    silently missing on the GPU)."""
    x, w, g, offs = _cpu_problem([3, 0, 5], n=16, k=32)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    assert not cake_moe.grouped_gemm_fwd(xr, wr, offs).requires_grad
    assert not cake_moe.grouped_gemm_wgrad(g, xr, offs).requires_grad
    # the ops (compiled code's path) alike, called directly and compiled
    ops = torch.ops.cake_moe
    assert not ops.grouped_gemm_fwd(xr, wr, offs).requires_grad
    assert not ops.grouped_gemm_dgrad(g, wr, offs).requires_grad
    assert not ops.grouped_gemm_wgrad(g, xr, offs, 3, torch.bfloat16, "det").requires_grad
    compiled = torch.compile(lambda a, b: cake_moe.grouped_gemm_fwd(a, b, offs), fullgraph=True, backend="aot_eager")
    y = compiled(xr, wr)
    assert not y.requires_grad and torch.equal(y[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])  # the groups' rows
    for call in (cake_moe.grouped_mm, lambda *a: torch.ops.cake_moe.grouped_mm(*a, "det")):
        y = call(xr, wr, offs)
        (gx,) = torch.autograd.grad(y.float().sum(), xr, create_graph=True)
        assert torch.equal(gx, torch.autograd.grad(call(xr, wr, offs).float().sum(), xr)[0])
        with pytest.raises(RuntimeError, match="double backward is not supported"):
            (gx.float().square().sum() + 0 * y.float().sum()).backward()


def test_refusals_say_what_to_do_with_a_transposed_operand():
    x, w, g, offs = _cpu_problem([3, 0, 5], n=16, k=32)
    with pytest.raises(ValueError, match=r"unit stride along its last axis.*\.contiguous\(\)"):
        cake_moe.grouped_mm(x, w.transpose(1, 2).contiguous().transpose(1, 2), offs)


def test_eager_grouped_mm_is_the_function_with_the_ops_results():
    """Eager grouped_mm runs the autograd Function (not the torch.library op and its dispatch)
    and gives the op's results and gradients."""
    x, w, g, offs = _cpu_problem([3, 0, 5], n=16, k=32)
    x, g = x[:8], g[:8]
    grads = []
    for call in (cake_moe.grouped_mm, lambda *a: torch.ops.cake_moe.grouped_mm(*a, "det")):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = call(xr, wr, offs)
        y.backward(g)
        grads.append((y.detach(), xr.grad, wr.grad, type(y.grad_fn).__name__))
    (y0, dx0, dw0, fn0), (y1, dx1, dw1, _) = grads
    assert fn0 == "GroupedMMBackward"
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1) and torch.equal(dw0, dw1)


def test_row_strided_operands():
    """x, g and w need contiguous rows only (SPEC §6): column slices and slices of the experts'
    rows are read in place, by one-shot calls and prepared launches alike, with the results of
    their contiguous copies; strides the kernels cannot read (an expanded w) and starts that are
    not 16-byte aligned are copied first by one-shot calls and refused by prepared launches."""
    x, w, g, offs = _cpu_problem([3, 0, 5], n=32, k=64)
    xs = torch.cat([x, x[:, :16]], dim=1)[:, :64]            # rows 80 elements apart
    ws = torch.cat([w, w[:, :8]], dim=1)[:, :32]              # experts 40 rows apart
    gs = torch.cat([g, g[:, :8]], dim=1)[:, :32]
    assert not (xs.is_contiguous() or ws.is_contiguous() or gs.is_contiguous())
    assert torch.equal(cake_moe.grouped_gemm_fwd(xs, ws, offs)[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])
    assert torch.equal(cake_moe.grouped_gemm_dgrad(gs, ws, offs)[:8], cake_moe.grouped_gemm_dgrad(g, w, offs)[:8])
    assert torch.equal(cake_moe.grouped_gemm_wgrad(gs, xs, offs), cake_moe.grouped_gemm_wgrad(g, x, offs))
    assert torch.equal(cake_moe.prepare_grouped_gemm_fwd(xs, ws, offs).launch()[:8],
                       cake_moe.grouped_gemm_fwd(x, w, offs)[:8])
    w_one = w[:1].expand(3, -1, -1)                            # experts 0 elements apart
    assert torch.equal(cake_moe.grouped_gemm_fwd(x, w_one, offs)[:8],
                       cake_moe.grouped_gemm_fwd(x, w_one.contiguous(), offs)[:8])
    with pytest.raises(ValueError, match="w must have contiguous rows"):
        cake_moe.prepare_grouped_gemm_fwd(x, w_one, offs)
    with pytest.raises(ValueError, match="x must have contiguous rows"):
        cake_moe.prepare_grouped_gemm_wgrad(g, torch.cat([x, x[:, :4]], dim=1)[:, :64], offs)   # 68 apart
    wide = torch.cat([x[:, :1], x, x[:, :15]], dim=1)          # rows 80 elements apart, x from column 1
    xm, gm = wide[:, 1:65], torch.cat([g[:, :1], g, g[:, :15]], dim=1)[:, 1:33]
    assert xm.data_ptr() % 16 and torch.equal(xm, x)           # a start 2 bytes past 16-byte alignment
    assert torch.equal(cake_moe.grouped_gemm_fwd(xm, w, offs)[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])
    assert torch.equal(cake_moe.grouped_gemm_dgrad(gm, w, offs)[:8], cake_moe.grouped_gemm_dgrad(g, w, offs)[:8])
    assert torch.equal(cake_moe.grouped_gemm_wgrad(gm, xm, offs), cake_moe.grouped_gemm_wgrad(g, x, offs))
    with pytest.raises(ValueError, match="x must be 16-byte aligned"):
        cake_moe.prepare_grouped_gemm_fwd(xm, w, offs)


def test_inputs_may_share_memory_outputs_may_not():
    x, w, g, offs = _cpu_problem([3, 0, 5], n=64, k=64)
    dw = cake_moe.grouped_gemm_wgrad(x, x, offs, out_dtype=torch.float32)      # X^T X per group
    assert ref.rel_rms(dw, ref.wgrad(x, x, offs)) < 1e-5
    buf = torch.zeros(x.numel() * 2, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out and x overlap"):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=x.view(-1)[:x.shape[0] * 64].view(-1, 64))
    out = buf[:x.shape[0] * 64].view(-1, 64)
    cake_moe.grouped_gemm_fwd(x, w, offs, out=out)                             # next to x, not over it
    assert torch.equal(out[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])


def test_top_level_exports():
    for name in cake_moe.grouped_gemm.__all__:
        assert getattr(cake_moe, name) is getattr(cake_moe.grouped_gemm, name), name


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_moe_mlp_gives_the_eager_bits(backend):
    """torch.compile(fullgraph=True) of an MoE MLP on grouped_mm (the op, its registered backward
    through the dgrad and wgrad ops) gives eager grouped_mm's output and gradients to the bit,
    on the CPU path."""
    sizes = [5, 0, 9, 2]
    x, w13, g, offs = _cpu_problem(sizes, n=64, k=32)
    w2 = bf16(len(sizes), 32, 32, seed=4, device="cpu")

    def mlp(t, a, b):   # (no elementwise op between the GEMMs: inductor would fuse its roundings)
        gate, _ = cake_moe.grouped_mm(t, a, offs).chunk(2, dim=-1)
        return cake_moe.grouped_mm(gate.contiguous(), b, offs)

    results = []
    for fn in (mlp, torch.compile(mlp, fullgraph=True, backend=backend)):
        t, a, b = (v.clone().requires_grad_() for v in (x, w13, w2))
        y = fn(t, a, b)
        y.backward(g[:, :32])
        results.append((y[:sum(sizes)], t.grad, a.grad, b.grad))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


def test_out_forms_under_torch_compile():
    """out= inside torch.compile(fullgraph=True) runs the out ops: the caller's tensors are
    written, rows past the last group end stay untouched, and the bits are the eager ones."""
    x, w, g, offs = _cpu_problem([3, 0, 5], n=32, k=64)

    def step(x, w, g, offs, y, dx, dw):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=y)
        cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)
        cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw, out_dtype=torch.float32)
        return y.sum() + dx.sum() + dw.sum()

    def outs():
        return (torch.full((x.shape[0], 32), 5.0, dtype=torch.bfloat16),
                torch.full((x.shape[0], 64), 5.0, dtype=torch.bfloat16), torch.full((3, 32, 64), 5.0))

    eager, compiled = outs(), outs()
    step(x, w, g, offs, *eager)
    torch.compile(step, fullgraph=True, backend="aot_eager")(x, w, g, offs, *compiled)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert (compiled[0][8:] == 5.0).all() and (compiled[1][8:] == 5.0).all()
    for name, args in (("grouped_gemm_fwd_out", (x, w, offs, compiled[0])),
                       ("grouped_gemm_dgrad_out", (g, w, offs, compiled[1])),
                       ("grouped_gemm_wgrad_out", (g, x, offs, 3, "det", compiled[2]))):
        torch.library.opcheck(getattr(torch.ops.cake_moe, name).default, args)
        version = args[-1]._version   # an in-place write, as autograd's saved-tensor checks see it
        getattr(torch.ops.cake_moe, name)(*args)
        assert args[-1]._version > version
    # a bad out= is the eager ValueError in compiled code too (not an error of the tracer)
    with pytest.raises(ValueError, match="out must be a torch.Tensor"):
        torch.compile(lambda *a: cake_moe.grouped_gemm_wgrad(*a, out=[1]), backend="aot_eager")(g, x, offs)
