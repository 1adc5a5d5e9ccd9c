"""GPU tests of the format kernels: bit-identical to the CPU reference (SPEC §3, §11)."""
from __future__ import annotations

import pytest
import torch

from cake_moe import formats
from cake_moe.reference import formats as ref

from .conftest import host_never_waits, poison_
from .fresh_interpreter import run_python

pytestmark = pytest.mark.gpu

SHAPES = [(1, 32), (3, 64), (130, 96), (257, 512), (64, 7168)]


def _draw(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values over a wide dynamic range plus every edge case the rules single out."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    exps = torch.randint(-40, 40, (rows, 1), generator=g).float()
    if seed % 3 == 0:
        exps = torch.randint(-140, 120, (rows, 1), generator=g).float()  # subnormal .. huge scales
    x = x * torch.exp2(exps)
    flat = x.view(-1)
    n = flat.numel()
    picks = torch.randint(0, n, (max(1, n // 50),), generator=g)
    specials = torch.tensor([0.0, -0.0, 448.0, -448.0, 449.0, 6.0, -6.0, 7.0, 1e-40, -1e-42, 2.0 ** -133, 3.0e38],
                            dtype=torch.float32)
    flat[picks] = specials[torch.randint(0, len(specials), picks.shape, generator=g)]
    if rows > 2 and cols >= 32:
        x[1, :32] = 0.0                 # an all-zero block
        x[2, 3] = float("nan")          # a NaN block
        x[-1, -1] = float("inf")        # an infinite block
    return x.to(dtype)


def _equal_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu())


def _outputs_like(ref_q, ref_s, byte: int = 0xFF):
    """Outputs filled with `byte`: 0xFF is the NaN block's scale code, so the tests alternate it
    with another byte (an unwritten NaN-block scale then shows)."""
    q = torch.empty(ref_q.shape, dtype=ref_q.dtype, device="cuda")
    s = torch.empty(ref_s.shape, dtype=ref_s.dtype, device="cuda")
    q.view(torch.uint8).fill_(byte)
    s.view(torch.uint8).fill_(byte)
    return q, s


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("fmt,rule", [("mxfp8", "round_up"), ("mxfp8", "ocp_floor"), ("mxfp4", "round_up"),
                                      ("mxfp4", "ocp_floor"), ("nvfp4", None)])
def test_quantize_bit_identical(fmt, rule, swizzled, dtype, shape):
    for seed in range(6):
        x = _draw(*shape, dtype, seed)
        if fmt == "nvfp4":
            g = ref.nvfp4_global_scale(torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
            want = ref.quantize_nvfp4(x, g, swizzled=swizzled)
            out = _outputs_like(*want, 0xFF if seed % 2 else 0x5A)
            got = formats.nvfp4_quantize(x.cuda(), g.cuda(), swizzled=swizzled, out=out)
        else:
            want = ref.quantize_mx(x, fmt, scale_rule=rule, swizzled=swizzled)
            out = _outputs_like(*want, 0xFF if seed % 2 else 0x5A)
            fn = formats.mxfp8_quantize if fmt == "mxfp8" else formats.mxfp4_quantize
            got = fn(x.cuda(), swizzled=swizzled, scale_rule=rule, out=out)
        assert got[0] is out[0] and got[1] is out[1]
        assert _equal_bytes(got[1], want[1]), f"scales differ (seed {seed})"
        assert _equal_bytes(got[0], want[0]), f"elements differ (seed {seed})"


_UNWRITTEN = 12345.0   # the dequantize tests' fill: finite, so an unwritten NaN result shows


def _same_floats(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float().cpu(), b.float().cpu()
    both_nan = a.isnan() & b.isnan()
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | both_nan).all())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_dequantize_bit_identical_over_all_codes(fmt, swizzled, dtype, shape):
    rows, cols = shape
    g = torch.Generator().manual_seed(rows * 7 + cols)
    qcols = cols if fmt == "mxfp8" else cols // 2
    q = torch.randint(0, 256, (rows, qcols), generator=g, dtype=torch.uint8)  # every code, NaN included
    block = 16 if fmt == "nvfp4" else 32
    s = torch.randint(0, 256, (rows, cols // block), generator=g, dtype=torch.uint8)
    if fmt == "mxfp8":
        q = q.view(torch.float8_e4m3fn)
    if fmt == "nvfp4":
        s = s.view(torch.float8_e4m3fn)
    s_in = ref.swizzle_scales(s.view(torch.uint8)).view(s.dtype) if swizzled else s
    gs = torch.tensor([3.7])
    if fmt == "nvfp4":
        want = ref.dequantize_nvfp4(q, s_in, gs, swizzled=swizzled, dtype=dtype)
        out = torch.full(want.shape, _UNWRITTEN, dtype=dtype, device="cuda")
        got = formats.nvfp4_dequantize(q.cuda(), s_in.cuda(), gs.cuda(), swizzled=swizzled, dtype=dtype, out=out)
    else:
        want = ref.dequantize_mx(q, s_in, fmt, swizzled=swizzled, dtype=dtype)
        out = torch.full(want.shape, _UNWRITTEN, dtype=dtype, device="cuda")
        fn = formats.mxfp8_dequantize if fmt == "mxfp8" else formats.mxfp4_dequantize
        got = fn(q.cuda(), s_in.cuda(), swizzled=swizzled, dtype=dtype, out=out)
    assert got is out
    assert not (want == torch.tensor(_UNWRITTEN, dtype=dtype)).any()   # so the fill cannot pass for a result
    assert _same_floats(got, want)


def test_leading_dims_and_empty_inputs():
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16, device="cuda")
    q, s = formats.mxfp4_quantize(x)
    assert q.shape == (2, 3, 32) and s.shape == (6, 2)
    rq, rs = ref.quantize_mx(x.cpu(), "mxfp4")
    assert _equal_bytes(q, rq) and _equal_bytes(s, rs)
    q, s = formats.mxfp8_quantize(torch.empty(0, 64, dtype=torch.bfloat16, device="cuda"), swizzled=True)
    assert q.shape == (0, 64) and s.numel() == 0
    for fn in (formats.mxfp8_quantize, formats.mxfp4_quantize):   # no columns: no chunk divisor to build
        q, s = fn(torch.empty(4, 0, dtype=torch.bfloat16, device="cuda"), swizzled=True)
        assert q.shape == (4, 0) and s.numel() == 0
        q, s = fn(torch.empty(4, 0, dtype=torch.bfloat16, device="cuda"))
        assert q.shape == (4, 0) and s.numel() == 0


def test_swizzled_padding_is_written():
    x = torch.randn(5, 96, dtype=torch.bfloat16, device="cuda")  # 5 rows -> 128, 3 scale cols -> 4
    want = ref.quantize_mx(x.cpu(), "mxfp8", swizzled=True)
    out = _outputs_like(*want)
    formats.mxfp8_quantize(x, swizzled=True, out=out)
    assert _equal_bytes(out[1], want[1]) and int(out[1].cpu().sum()) == int(want[1].sum())


def test_side_stream_and_graph_replay_are_bitwise_equal():
    x = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    q0, s0 = formats.mxfp8_quantize(x, swizzled=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q1, s1 = formats.mxfp8_quantize(x, swizzled=True)
    torch.cuda.current_stream().wait_stream(side)
    out = (poison_(torch.empty_like(q0)), poison_(torch.empty_like(s0)))
    graph = torch.cuda.CUDAGraph()
    formats.mxfp8_quantize(x, swizzled=True, out=out)  # warm up (loads the kernel) outside capture
    poison_(out[0]), poison_(out[1])
    with torch.cuda.graph(graph):
        formats.mxfp8_quantize(x, swizzled=True, out=out)
    graph.replay()
    torch.cuda.synchronize()
    for q, s in ((q1, s1), out):
        assert _equal_bytes(q, q0) and _equal_bytes(s, s0)


def test_inputs_that_require_grad_and_every_nvfp4_global_scale_layout():
    """The kernels take addresses (no DLPack import): an input that requires grad, a global
    scale given as a 0-d tensor or a strided one-element view, and float8 / uint8 views of the
    same bytes all give the same bits."""
    x = torch.randn(128, 512, dtype=torch.float32, device="cuda")
    q0, s0 = formats.mxfp4_quantize(x)
    q1, s1 = formats.mxfp4_quantize(x.clone().requires_grad_())
    assert torch.equal(q1, q0) and torch.equal(s1, s0)
    g = ref.nvfp4_global_scale(x).cuda()
    nq, ns = formats.nvfp4_quantize(x, g)
    for g_view in (g.reshape(()), torch.stack([g[0], g[0] * 2])[::2]):
        q, s = formats.nvfp4_quantize(x, g_view)
        assert torch.equal(q, nq) and _equal_bytes(s, ns)
    y = formats.nvfp4_dequantize(nq, ns, g)
    assert torch.equal(formats.nvfp4_dequantize(nq, ns.view(torch.uint8), g.reshape(())), y)
    m8, m8s = formats.mxfp8_quantize(x)
    assert torch.equal(formats.mxfp8_dequantize(m8.view(torch.uint8), m8s), formats.mxfp8_dequantize(m8, m8s))


def test_opcheck_and_compile():
    x = torch.randn(64, 256, dtype=torch.bfloat16, device="cuda")
    g = ref.nvfp4_global_scale(x).cuda()
    torch.library.opcheck(torch.ops.cake_moe.mxfp8_quantize.default, (x, True, 0))
    torch.library.opcheck(torch.ops.cake_moe.nvfp4_quantize.default, (x, g, False))
    q, s = formats.mxfp4_quantize(x)
    torch.library.opcheck(torch.ops.cake_moe.mxfp4_dequantize.default, (q, s, False, torch.bfloat16))

    @torch.compile(fullgraph=True)
    def f(t):
        q, s = formats.mxfp8_quantize(t * 2)
        return formats.mxfp8_dequantize(q, s, dtype=torch.float32)

    want = ref.dequantize_mx(*ref.quantize_mx((x * 2).cpu(), "mxfp8"), "mxfp8")
    assert _same_floats(f(x), want)


def test_inputs_on_another_device_are_refused():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="global_scale"):
        formats.nvfp4_quantize(x, torch.ones(1))  # global scale left on the CPU


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_fp4_rounding_ties_and_neighbours(fmt):
    """Every E2M1 midpoint exactly (ties to even), both signs, and one FP32 ulp either side: each
    16-element block starts with 6.0 and holds nothing larger, so its scale is exactly 2^k
    (NVFP4 with global scale 1; MXFP4's 32-element blocks too) and x / scale is the tie itself.
    A last block [6, 7] checks saturation (its MXFP4 block scales by 2 instead)."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    vals = torch.cat([mids, torch.nextafter(mids, torch.tensor(10.0)), torch.nextafter(mids, torch.tensor(0.0))])
    vals = torch.cat([vals, -vals, torch.tensor([0.0, -0.0])])                     # 44 values
    tied = torch.cat([torch.cat([torch.tensor([6.0]), chunk, torch.zeros(15 - chunk.numel())])
                      for chunk in vals.split(15)])                               # 3 blocks of 16
    row = torch.cat([tied, torch.tensor([6.0]), torch.zeros(15), torch.tensor([6.0, 7.0]), torch.zeros(30)])
    assert row.numel() == 96 and (row[:64].abs().amax() == 6.0)
    ks = (-6, -3, 0, 5, 8) if fmt == "nvfp4" else (-20, -3, 0, 5, 40)   # 2^k exact in E4M3 for NVFP4
    x = torch.stack([row * 2.0 ** k for k in ks])
    if fmt == "nvfp4":
        g = torch.tensor([1.0])  # s = e4m3(amax / 6) = 2^k, elements x / s
        want = ref.quantize_nvfp4(x, g)
        got = formats.nvfp4_quantize(x.cuda(), g.cuda())
        scales = want[1].view(torch.uint8).reshape(len(ks), -1)[:, :4].float()
        assert torch.equal(scales, torch.tensor([[56.0 + 8 * k] * 4 for k in ks])), "a tied block's scale is not 2^k"
    else:
        want = ref.quantize_mx(x, "mxfp4")
        got = formats.mxfp4_quantize(x.cuda())
        codes = want[1].reshape(len(ks), -1)[:, :2].float()
        assert torch.equal(codes, torch.tensor([[127.0 + k] * 2 for k in ks])), "a tied block's scale is not 2^k"
    assert _equal_bytes(got[1], want[1]) and _equal_bytes(got[0], want[0])


def test_nvfp4_global_scales_over_the_fp32_range():
    """SPEC's order (x * q) / s and (e2m1 * s) / q bit for bit, for encode scales far from the
    usual 448 * 6 / amax (tiny and huge, so products underflow and overflow; the dequantizer's
    reciprocal path ends at 2^-100 and 2^100, and scales just inside and outside those ends
    that are not powers of two exercise its correction and its IEEE fallback), with the scale
    that tells the two groupings apart at an E2M1 decision point (2559.5962, block [3.826623,
    0.043756906, 0, ...]: FP32 input only, BF16 rounds it off the point) and the dequantize one
    (7, scale 2^-9, element 1.5)."""
    gen = torch.Generator().manual_seed(11)
    x = _draw(130, 512, torch.float32, seed=5)
    x[0, :16] = 0.0
    x[0, 0], x[0, 1] = 3.826623, 0.043756906
    scales = [2559.5962, 7.0, 2.0 ** -100, 2.0 ** 100, 3.0e38, 1.5e-45,
              1.37 * 2.0 ** -100, 1.73 * 2.0 ** 99, 1.37 * 2.0 ** -101, 1.73 * 2.0 ** 100]
    scales += (torch.rand(10, generator=gen) + 1).mul(torch.exp2(torch.randint(-60, 60, (10,), generator=gen))).tolist()
    dq = torch.randint(0, 256, (130, 256), generator=gen, dtype=torch.uint8)
    ds = torch.randint(0, 256, (130, 32), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for v in scales:
        g = torch.tensor([v], dtype=torch.float32)
        for dtype in (torch.bfloat16, torch.float32):
            xd = x.to(dtype)
            want = ref.quantize_nvfp4(xd, g)
            got = formats.nvfp4_quantize(xd.cuda(), g.cuda(), out=_outputs_like(*want, 0x5A))
            assert _equal_bytes(got[1], want[1]) and _equal_bytes(got[0], want[0]), f"quantize, q = {v}"
            want_d = ref.dequantize_nvfp4(dq, ds, g, dtype=dtype)
            out = torch.full(want_d.shape, _UNWRITTEN, dtype=dtype, device="cuda")
            got_d = formats.nvfp4_dequantize(dq.cuda(), ds.cuda(), g.cuda(), dtype=dtype, out=out)
            assert _same_floats(got_d, want_d), f"dequantize, q = {v}"


def test_nvfp4_block_scales_at_every_e4m3_decision_point():
    """s = e4m3((amax * q) / 6) where E4M3 rounding decides: each block's amax is 6x a midpoint
    of two consecutive E4M3 values (0 .. 448, and 464 where it saturates) or an FP32 ulp either
    side, so every scale code and every E4M3 tie is met after the division by 6 (the division's
    own correction is checked with exact rationals by ci/fp32_division_check.py); the elements
    then divide by every scale."""
    codes = torch.arange(0, 127, dtype=torch.uint8)
    grid = torch.cat([codes.view(torch.float8_e4m3fn).float(), torch.tensor([464.0])])
    mids = (grid[:-1] + grid[1:]) * 3.0                     # 6x the midpoints, exact in FP32
    amax = torch.cat([mids, torch.nextafter(mids, torch.tensor(1e9)), torch.nextafter(mids, torch.tensor(0.0))])
    gen = torch.Generator().manual_seed(3)
    for g in (1.0, 0.5, 2.0 ** 20, 3.0):
        x = (torch.rand(amax.numel(), 16, generator=gen) * 2 - 1) * (amax / g).unsqueeze(1)
        x[:, 0] = amax / g          # for q a power of two, amax * q is the point itself
        gt = torch.tensor([g])
        want = ref.quantize_nvfp4(x, gt)
        got = formats.nvfp4_quantize(x.cuda(), gt.cuda(), out=_outputs_like(*want, 0x5A))
        assert _equal_bytes(got[1], want[1]), f"scales differ (q = {g})"
        assert _equal_bytes(got[0], want[0]), f"elements differ (q = {g})"


def test_host_never_waits_catches_both_kinds_of_wait():
    """The check itself can fail: on a torch op that syncs, and on a wait torch does not report."""
    x = torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError, match="synchroniz"):
        with host_never_waits():
            x.sum().item()
    with pytest.raises(AssertionError, match="waited"):
        with host_never_waits():
            torch.cuda.set_sync_debug_mode(0)
            torch.cuda.current_stream().synchronize()


def test_calls_never_make_the_host_wait():
    x = _draw(257, 512, torch.bfloat16, seed=4).cuda()
    gs = torch.tensor([0.5], device="cuda")  # NVFP4's encode scale stays on the device

    def calls():
        for swizzled in (False, True):
            formats.mxfp8_dequantize(*formats.mxfp8_quantize(x, swizzled=swizzled), swizzled=swizzled)
            formats.mxfp4_dequantize(*formats.mxfp4_quantize(x, swizzled=swizzled), swizzled=swizzled)
            formats.nvfp4_dequantize(*formats.nvfp4_quantize(x, gs, swizzled=swizzled), gs, swizzled=swizzled)

    calls()
    with host_never_waits():
        calls()


def test_sync_check_debug_mode_runs():
    """CAKE_MOE_SYNC_CHECK=1 synchronises around every launch (but under graph capture); results
    are unchanged."""
    code = ("import torch, cake_moe; from cake_moe.reference import formats as ref;"
            "x = torch.randn(64, 256, device='cuda');"
            "q, s = cake_moe.formats.mxfp4_quantize(x); rq, rs = ref.quantize_mx(x.cpu(), 'mxfp4');"
            "assert torch.equal(q.cpu(), rq) and torch.equal(s.cpu(), rs);"
            # under graph capture the mode leaves the launches alone (a sync would end the capture)
            "g = torch.cuda.CUDAGraph(); q.zero_();"
            "exec('with torch.cuda.graph(g):\\n    cake_moe.formats.mxfp4_quantize(x, out=(q, s))');"
            "g.replay(); torch.cuda.synchronize(); assert torch.equal(q.cpu(), rq); print('ok')")
    assert run_python(code, CAKE_MOE_SYNC_CHECK="1").strip() == "ok"


def test_sync_check_tells_an_earlier_fault_from_the_form():
    """Under CAKE_MOE_SYNC_CHECK=1 a fault of torch's work queued before a cake form is reported as
    coming before that form, not from it. The GPU sleeps first so that the fault lands after the
    wrapper's own torch calls, at the form's synchronisation."""
    code = ("import torch, cake_moe;"
            "x = torch.randn(64, 256, device='cuda'); cake_moe.formats.mxfp4_quantize(x);"
            "torch.cuda.synchronize(); bad = torch.tensor([1 << 40], device='cuda');"
            "torch.cuda._sleep(200_000_000); x[bad];"
            "exec('try:\\n    cake_moe.formats.mxfp4_quantize(x)\\nexcept RuntimeError as e:\\n    print(e)')")
    message = run_python(code, CAKE_MOE_SYNC_CHECK="1")
    assert "queued before" in message and "mxfp4" in message, message
