"""GPU tests on a machine with two CUDA devices: every operator runs on the device of its tensors
(or of its wrapper), whichever device is current, gives there the bits it gives on device 0, and
refuses tensors spread over two devices. Skipped (not run) with fewer than two GPUs."""
from __future__ import annotations

import pytest
import torch

import cake_moe

from .conftest import poison_
from .grouped_gemm_cases import bf16, offsets
from .mxfp4_moe_cases import GENERAL, Layer, make_case, random_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs two CUDA GPUs: not run here"),
]

D0, D1 = torch.device("cuda", 0), torch.device("cuda", 1)
SIZES = [300, 0, 1, 700, 129]  # ragged, with an empty and a one-row group
N, K = 384, 256


def _grouped_inputs(device):
    rows = sum(SIZES) + 8  # rows past the last group end
    x = bf16(rows, K, seed=1, device=device)
    w = bf16(len(SIZES), N, K, seed=2, device=device, scale=0.05)
    g = bf16(rows, N, seed=3, device=device)
    return x, w, g, offsets(SIZES, device=device)


def _run_op(op: str, device):
    x, w, g, offs = _grouped_inputs(device)
    if op == "fwd":
        out = poison_(torch.empty(x.shape[0], N, dtype=torch.bfloat16, device=device))
        return cake_moe.grouped_gemm_fwd(x, w, offs, out=out)
    if op == "dgrad":
        out = poison_(torch.empty(g.shape[0], K, dtype=torch.bfloat16, device=device))
        return cake_moe.grouped_gemm_dgrad(g, w, offs, out=out)
    out = poison_(torch.empty(len(SIZES), N, K, dtype=torch.bfloat16, device=device))
    return cake_moe.grouped_gemm_wgrad(g, x, offs, out=out, variant="det")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN poison included) of tensors on any devices."""
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


@pytest.mark.parametrize("op", ["fwd", "dgrad", "wgrad"])
def test_grouped_gemm_runs_on_its_tensors_device(op):
    """Device 1's tensors with device 0 current, and device 0's with device 1 current: each call
    runs where its tensors are and gives device 0's bits."""
    torch.cuda.set_device(D0)
    want = _run_op(op, D0)
    got = _run_op(op, D1)
    with torch.cuda.device(D1):
        again = _run_op(op, D0)
    torch.cuda.synchronize(D0)
    torch.cuda.synchronize(D1)
    assert got.device == D1 and again.device == D0
    assert _same(got, want), f"{op} on cuda:1 differs from cuda:0"
    assert _same(again, want), f"{op} on cuda:0 with cuda:1 current differs"


def test_prepared_launch_and_graph_on_the_second_device():
    """A launch prepared on device 1 follows new values in its bound tensors, eagerly and in a
    graph captured there, while device 0 stays current."""
    torch.cuda.set_device(D0)
    x, w, _, offs = _grouped_inputs(D1)
    out = poison_(torch.empty(x.shape[0], N, dtype=torch.bfloat16, device=D1))
    launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs, out)
    launch.launch()
    with torch.cuda.device(D1):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch.launch()
    x.copy_(bf16(*x.shape, seed=7, device=D1))
    x0, w0, _, offs0 = _grouped_inputs(D0)
    want = poison_(torch.empty(x.shape[0], N, dtype=torch.bfloat16, device=D0))
    cake_moe.grouped_gemm_fwd(x.to(D0), w0, offs0, out=want)
    poison_(out)
    launch.launch()                                  # eagerly, device 0 current
    torch.cuda.synchronize(D1)
    assert _same(out, want), "an eager launch on cuda:1 differs from an eager call on cuda:0"
    poison_(out)
    with torch.cuda.device(D1):
        graph.replay()
    torch.cuda.synchronize(D1)
    assert _same(out, want), "graph replay on cuda:1 differs from an eager call on cuda:0"


def test_capture_on_the_second_device_is_seen_from_the_first():
    """A capture on device 1's stream is a capture for a wgrad on device 1's tensors while
    device 0 is current: the one-shot call keeps no launch and takes a workspace of its own
    (not the eager per-stream one), and the replay gives the eager bits."""
    x, _, g, offs = _grouped_inputs(D1)
    want = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
    with torch.cuda.device(D1):
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=side):
            assert cake_moe._runtime.capturing(D1)
            with torch.cuda.device(D0):
                assert cake_moe._runtime.capturing(D1) and not cake_moe._runtime.capturing(D0)
                kept = len(cake_moe.grouped_gemm._kept_launches._kept)
                dw = cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det")
                assert len(cake_moe.grouped_gemm._kept_launches._kept) == kept, "a launch kept during capture"
    poison_(dw)
    with torch.cuda.device(D1):
        graph.replay()
    torch.cuda.synchronize(D1)
    assert torch.equal(dw, want)


def test_autograd_step_on_the_second_device():
    """An autograd step on device 1's tensors with device 0 current (the backward runs on
    autograd's thread for that device): y, x.grad and w.grad give device 0's bits (rows past the
    last group end included: grouped_mm zeroes them)."""
    torch.cuda.set_device(D0)
    grads = []
    for dev in (D0, D1):
        x, w, g, offs = _grouped_inputs(dev)
        x.requires_grad_(True)
        w.requires_grad_(True)
        y = cake_moe.grouped_mm(x, w, offs, variant="det")
        y.backward(g)
        grads.append((y.detach(), x.grad, w.grad))
    for a, b, name in zip(grads[0], grads[1], ("y", "x.grad", "w.grad")):
        assert b.device == D1 and _same(a, b), f"{name} on cuda:1 differs from cuda:0"


def test_formats_on_the_second_device():
    torch.cuda.set_device(D0)
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    q0, s0 = cake_moe.formats.mxfp8_quantize(x.to(D0))
    q1, s1 = cake_moe.formats.mxfp8_quantize(x.to(D1))
    assert q1.device == D1 and _same(q0, q1) and _same(s0, s1)
    assert _same(cake_moe.formats.mxfp8_dequantize(q1, s1), cake_moe.formats.mxfp8_dequantize(q0, s0))


def _moe_run(geom, case, bank, device, *, capture: bool = False) -> torch.Tensor:
    """The layer on ``device`` (its wrapper, prepared weights, workspace and output there), eagerly
    or replayed from a graph captured on that device."""
    layer = Layer(geom, device=device, bank={k: v.to(device) for k, v in bank.items()})
    if not capture:
        return layer.run(case.to(device))
    plan, out = layer.plan(case.to(device))
    plan.run()
    with torch.cuda.device(device):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan.run()
    poison_(out)
    with torch.cuda.device(device):
        graph.replay()
    torch.cuda.synchronize(device)
    return out


@pytest.mark.parametrize("name, t", [("h384_ep_k8", 1), ("h512_e40_k5", 129), ("h256_tp_k4", 1025)])
def test_mxfp4_moe_on_the_second_device(name, t):
    """A wrapper made for device 1 plans and runs there (eagerly and graph-replayed) with device
    0 current, and gives device 0's bits."""
    torch.cuda.set_device(D0)
    geom = GENERAL[name]
    bank = {k: v.cpu() for k, v in random_weights(geom, seed=3, device=D0).items()}
    case = make_case(geom, t, "zipf", seed=4, device=D0).to("cpu")
    want = _moe_run(geom, case, bank, D0)
    assert not want.isnan().any()
    assert _same(_moe_run(geom, case, bank, D1), want), "the layer on cuda:1 differs from cuda:0"
    assert _same(_moe_run(geom, case, bank, D1, capture=True), want), "graph replay on cuda:1 differs"


def test_tensors_on_two_devices_are_refused():
    x, w, g, offs = _grouped_inputs(D0)
    other = r"is on cuda:1, expected cuda:0"
    with pytest.raises(ValueError, match="w " + other):
        cake_moe.grouped_gemm_fwd(x, w.to(D1), offs)
    with pytest.raises(ValueError, match="x " + other):
        cake_moe.grouped_gemm_wgrad(g, x.to(D1), offs)
    with pytest.raises(ValueError, match="out " + other):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=torch.empty(x.shape[0], N, dtype=torch.bfloat16, device=D1))

    layer = Layer(GENERAL["h256_e8_k2"], seed=3, device=D1)
    case = make_case(layer.geom, 4, seed=5, device=D0)  # the activations and routes on the other device
    with pytest.raises(ValueError, match="wrapper's device"):
        layer.plan(case)
