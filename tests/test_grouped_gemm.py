"""CPU tests of family A's host side: the reference, the CPU path, validation and bounds. The
kept and prepared launches are in test_grouped_gemm_launches.py, grouped_mm's autograd and
torch.compile in test_grouped_gemm_autograd.py."""
from __future__ import annotations

import pytest
import torch

import cake_moe
from cake_moe import _runtime
from cake_moe.reference import grouped_gemm as ref

from .grouped_gemm_cases import cpu_problem, offsets


def test_reference_groups_and_conventions():
    assert ref.group_bounds(torch.tensor([3, 3, 8])) == [(0, 3), (3, 3), (3, 8)]
    assert ref.group_bounds(torch.tensor([0, 3, 3, 8]), leading_zero=True) == [(0, 3), (3, 3), (3, 8)]
    # malformed offsets clamp as the kernels' ragged_group_rows does (group_rows.cuh)
    assert ref.group_bounds(torch.tensor([-2, 5, 8, 12, 4]), leading_zero=True, rows=10) == \
        [(0, 5), (5, 8), (8, 10), (10, 10)]
    x, w, g, offs = cpu_problem([3, 0, 5])
    bad = torch.tensor([-2, 5, 8], dtype=torch.int32)          # ends: group 0 empty, group 1 from row 0
    y = cake_moe.grouped_gemm_fwd(x, w, bad)
    assert torch.equal(y[:5], (x[:5].double() @ w[1].double().T).to(torch.bfloat16))
    assert torch.equal(y[5:8], (x[5:8].double() @ w[2].double().T).to(torch.bfloat16))
    x, w, g, offs = cpu_problem([3, 0, 5])
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
    x, w, g, offs = cpu_problem([2, 5, 0, 1])
    out = torch.full((x.shape[0], w.shape[1]), 7.0, dtype=torch.bfloat16)
    cake_moe.grouped_gemm_fwd(x, w, offs, out=out)
    assert (out[8:] == 7.0).all()
    assert torch.equal(out[:8], ref.fwd(x, w, offs)[:8].to(torch.bfloat16))   # the FP64 products, rounded once
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs, out_dtype=torch.float32)
    assert dw.dtype == torch.float32 and torch.equal(dw, ref.wgrad(g, x, offs).float())
    mi = offsets([2, 5, 0, 1], device="cpu", leading_zero=True)
    assert torch.equal(cake_moe.grouped_mm_bf16(x, w, mi)[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])


def test_cpu_path_writes_non_finite_results_and_only_the_groups_rows():
    """The CPU path writes each group's rows whatever their values: NaN and Inf inputs give
    NaN / Inf like torch._grouped_mm, rows past the last group stay as they were."""
    x, w, g, offs = cpu_problem([2, 5, 0, 1])
    x[0, 0], x[1, 0] = float("nan"), float("inf")
    out = torch.full((x.shape[0], w.shape[1]), 7.0, dtype=torch.bfloat16)
    cake_moe.grouped_gemm_fwd(x, w, offs, out=out)
    assert out[0].isnan().all() and not torch.isfinite(out[1]).any() and torch.isfinite(out[2:8]).all()
    assert (out[8:] == 7.0).all()
    g[0, 0] = float("nan")
    dw = torch.full((w.shape[0], w.shape[1], w.shape[2]), 5.0, dtype=torch.bfloat16)
    cake_moe.grouped_gemm_wgrad(g, x, offs, out=dw)
    assert dw[0].isnan().any() and torch.equal(dw[2], torch.zeros_like(dw[2])) and torch.isfinite(dw[3]).all()


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
    with pytest.raises(ValueError, match=r"exceed .* \(E=16\)"):
        cake_moe.check_grouped_dims(4096, 4096, num_groups=16, max_rows=limit + 1)
    # without num_groups the bound is E = 0's, and the message says so
    assert cake_moe.max_grouped_rows(4096, 4096) > limit
    cake_moe.check_grouped_dims(4096, 4096, max_rows=limit + 1)
    with pytest.raises(ValueError, match=r"no num_groups given, so E=0; each group lowers the bound by \d+ rows\)"):
        cake_moe.check_grouped_dims(4096, 4096, max_rows=cake_moe.max_grouped_rows(4096, 4096) + 1)
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
    x, w, g, offs = cpu_problem([2, 5, 1])
    with pytest.raises(ValueError, match=match):
        call(x, w, g, offs)


def test_named_forms_run_the_reference_on_the_cpu():
    """A form this build has (for its op) is accepted on the CPU, where the reference runs."""
    x, w, g, offs = cpu_problem([2, 5, 1])
    want = cake_moe.prepare_grouped_gemm_fwd(x, w, offs).launch()
    built = {f["name"] for f in _runtime.manifest()["forms"]}
    named = sorted({"gg_portable_fwd", "gg_sm90_fwd_128x128"} & built)
    assert named, "the build has neither form"
    for form in named:
        launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs, form=form)
        assert launch.form == "cpu-reference" and torch.equal(launch.launch()[:8], want[:8])
    assert cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, form="gg_portable_wgrad").form == "cpu-reference"


def test_refusals_say_what_to_do_with_a_transposed_operand():
    x, w, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    with pytest.raises(ValueError, match=r"unit stride along its last axis.*\.contiguous\(\)"):
        cake_moe.grouped_mm(x, w.transpose(1, 2).contiguous().transpose(1, 2), offs)


def test_row_strided_operands():
    """x, g and w need contiguous rows only (SPEC §6): column slices and slices of the experts'
    rows are read in place, by one-shot calls and prepared launches alike, with the results of
    their contiguous copies; strides the kernels cannot read (an expanded w) and starts that are
    not 16-byte aligned are copied first by one-shot calls and refused by prepared launches."""
    x, w, g, offs = cpu_problem([3, 0, 5], n=32, k=64)
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
    x, w, g, offs = cpu_problem([3, 0, 5], n=64, k=64)
    dw = cake_moe.grouped_gemm_wgrad(x, x, offs, out_dtype=torch.float32)      # X^T X per group
    assert torch.equal(dw, ref.wgrad(x, x, offs).float())
    buf = torch.zeros(x.numel() * 2, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out and x overlap"):
        cake_moe.grouped_gemm_fwd(x, w, offs, out=x.view(-1)[:x.shape[0] * 64].view(-1, 64))
    out = buf[:x.shape[0] * 64].view(-1, 64)
    cake_moe.grouped_gemm_fwd(x, w, offs, out=out)                             # next to x, not over it
    assert torch.equal(out[:8], cake_moe.grouped_gemm_fwd(x, w, offs)[:8])


@pytest.mark.parametrize("op", ["fwd", "dgrad", "wgrad"])
def test_out_over_an_operand_the_call_copies_is_refused(op):
    """An operand the kernels cannot read in place (here a column slice, 2-byte aligned) is
    copied before the call; an out= over the caller's tensor is still refused, and the operand
    is left as it was."""
    _, w, _, offs = cpu_problem([3, 0, 5], n=16, k=32)
    cols = 32 if op in ("fwd", "wgrad") else 16
    buf = torch.randn(8 * (cols + 1) + 16 * 32 * 3, dtype=torch.float32).to(torch.bfloat16)
    a = buf[:8 * (cols + 1)].view(8, cols + 1)[:, 1:]                        # rows 2 bytes off 16
    held = a.clone()
    other = torch.randn(8, 16 if op == "wgrad" else cols, dtype=torch.float32).to(torch.bfloat16)
    with pytest.raises(ValueError, match="out and (x|g) overlap"):
        if op == "fwd":
            cake_moe.grouped_gemm_fwd(a, w, offs, out=buf[:8 * 16].view(8, 16))
        elif op == "dgrad":
            cake_moe.grouped_gemm_dgrad(a, w, offs, out=buf[:8 * 32].view(8, 32))
        else:
            cake_moe.grouped_gemm_wgrad(other, a, offs, out=buf[:3 * 16 * 32].view(3, 16, 32))
    assert torch.equal(a, held)


def test_grouped_gemm_refuses_devices_it_does_not_run_on():
    x, w, g, offs = cpu_problem([3, 0, 5], n=16, k=32)
    with pytest.raises(ValueError, match="x is on meta: the grouped GEMM runs on CUDA devices"):
        cake_moe.grouped_gemm_fwd(x.to("meta"), w.to("meta"), offs.to("meta"))
    with pytest.raises(ValueError, match="g is on meta"):
        cake_moe.prepare_grouped_gemm_wgrad(g.to("meta"), x.to("meta"), offs.to("meta"))
    with pytest.raises(ValueError, match=r"w is on meta, expected cpu \(the device of x\)"):
        cake_moe.grouped_gemm_fwd(x, w.to("meta"), offs)


def test_grouped_mm_bf16_names_its_own_arguments():
    x, w, _, offs = cpu_problem([3, 0, 5], n=16, k=32)
    m_indptr = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="^a must have dtype torch.bfloat16"):
        cake_moe.grouped_mm_bf16(x.float(), w, m_indptr)
    with pytest.raises(ValueError, match="^m_indptr must have dtype torch.int32"):
        cake_moe.grouped_mm_bf16(x, w, m_indptr.long())
    with pytest.raises(ValueError, match="^a has 32 columns but b has K=16"):
        cake_moe.grouped_mm_bf16(x, w[:, :, :16].contiguous(), m_indptr)


def test_top_level_exports():
    for name in cake_moe.grouped_gemm.__all__:
        assert getattr(cake_moe, name) is getattr(cake_moe.grouped_gemm, name), name
