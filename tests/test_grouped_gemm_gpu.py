"""GPU tests of family A (ragged BF16 grouped GEMM) against the FP64 reference (SPEC §6, §11):
fwd and dgrad over every form, the budgets, bounds and refusals, and the randomized sweep."""
from __future__ import annotations

import random

import pytest
import torch

import cake_moe
from cake_moe.reference import grouped_gemm as ref
from cake_moe.bench.grouped_gemm import SM90_TILES  # every sm_90a fwd/dgrad tile form

from .conftest import RANDOM_SEEDS, poison_
from .fresh_interpreter import run_python
from .grouped_gemm_cases import LAYERS, PATTERNS, bf16, offsets, random_sizes
from .grouped_gemm_checks import BUDGET, check_dw, check_rows, dgrad_poisoned, fwd_poisoned, problem

pytestmark = pytest.mark.gpu


def test_budget_catches_a_two_percent_perturbation():
    x, w, _, offs = problem(PATTERNS["mixed"], 256, 512, pad=0)
    want = ref.fwd(x, w, offs)
    y = cake_moe.grouped_gemm_fwd(x, w, offs)
    assert ref.rel_rms(y, want) < BUDGET
    rms = y.float().square().mean().sqrt()
    noise = torch.randn_like(y, dtype=torch.float32) * 0.02 * rms  # a 2% (RMS) perturbation
    assert ref.rel_rms((y.float() + noise).to(torch.bfloat16), want) > BUDGET
    check_rows(y, want, poisoned=False)
    one_row = y.clone()   # 2% on one row of one group only: the row check sees it
    one_row[5] = (one_row[5].float() * 1.02).to(torch.bfloat16)
    assert ref.rel_rms(one_row, want) < BUDGET
    with pytest.raises(AssertionError, match="a row's relative RMS"):
        check_rows(one_row, want, poisoned=False)
    g = bf16(x.shape[0], 256, seed=3)
    want_dw = ref.wgrad(g, x, offs)
    dw = cake_moe.grouped_gemm_wgrad(g, x, offs)
    check_dw(dw, want_dw)
    dw[2] = (dw[2].float() * 1.02).to(torch.bfloat16)   # 2% on the one-row group's dW only
    assert ref.rel_rms(dw, want_dw) < BUDGET
    with pytest.raises(AssertionError, match="expert 2"):
        check_dw(dw, want_dw)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("nk", [(256, 512), (200, 264), (72, 136)])
@pytest.mark.parametrize("leading_zero", [False, True])
def test_fwd_dgrad_patterns(pattern, nk, leading_zero):
    n, k = nk
    x, w, g, offs = problem(PATTERNS[pattern], n, k, leading_zero=leading_zero)
    y = poison_(torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda"))
    cake_moe.grouped_gemm_fwd(x, w, offs, out=y)
    check_rows(y, ref.fwd(x, w, offs, leading_zero))
    dx = poison_(torch.empty(x.shape[0], k, dtype=torch.bfloat16, device="cuda"))
    cake_moe.grouped_gemm_dgrad(g, w, offs, out=dx)
    check_rows(dx, ref.dgrad(g, w, offs, leading_zero))


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("which", ["w13", "w2"])
def test_moe_layers(layer, which):
    h, i, e = layer
    n, k = (2 * i, h) if which == "w13" else (h, i)
    sizes = random_sizes(4096, e, seed=h + i)
    x, w, g, offs = problem(sizes, n, k, seed=e)
    check_rows(fwd_poisoned(x, w, offs), ref.fwd(x, w, offs))
    check_rows(dgrad_poisoned(g, w, offs), ref.dgrad(g, w, offs))


def test_many_groups_and_one_row_groups():
    sizes = [1, 0, 2] * 400  # 1200 groups
    x, w, g, offs = problem(sizes, 64, 128, seed=3)
    check_rows(fwd_poisoned(x, w, offs), ref.fwd(x, w, offs))
    check_rows(dgrad_poisoned(g, w, offs), ref.dgrad(g, w, offs))


def test_sum_m_zero_and_no_rows():
    """No rows at all (sum_m = 0), and rows that no group holds (every offset 0): fwd and dgrad
    run, one-shot and prepared, and write nothing."""
    w = bf16(3, 32, 64)
    offs = torch.zeros(3, dtype=torch.int32, device="cuda")
    assert cake_moe.grouped_gemm_fwd(torch.empty(0, 64, dtype=torch.bfloat16, device="cuda"), w, offs).shape == (0, 32)
    assert cake_moe.grouped_gemm_dgrad(torch.empty(0, 32, dtype=torch.bfloat16, device="cuda"), w, offs).shape == (0, 64)
    x, g = bf16(5, 64, seed=1), bf16(5, 32, seed=2)
    y = poison_(torch.empty(5, 32, dtype=torch.bfloat16, device="cuda"))
    dx = poison_(torch.empty(5, 64, dtype=torch.bfloat16, device="cuda"))
    cake_moe.grouped_gemm_fwd(x, w, offs, out=y)
    cake_moe.prepare_grouped_gemm_dgrad(g, w, offs, out=dx).launch()
    torch.cuda.synchronize()
    assert y.isnan().all() and dx.isnan().all(), "a row in no group was written"


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
    x, w, _, offs = problem([10, 20], 64, 128)
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
    printed = run_python(_OVERLAPPING_GROUPS_CHECK, timeout=300,
                         CAKE_MOE_GG_FORCE_PORTABLE="1" if portable else "0")
    forms = printed.split()
    assert len(forms) == 2 and all(("portable" in f) == portable for f in forms), forms


def test_bounds_refused_before_launch():
    with pytest.raises(ValueError, match="rows exceed"):
        cake_moe.check_grouped_dims(7168, 2048, num_groups=8, max_rows=2**31)
    with pytest.raises(ValueError, match="multiple of 8"):
        cake_moe.check_grouped_dims(7164, 2048)
    assert cake_moe.max_grouped_rows(7168, 2048) > 2**28


def test_torch_library_opcheck():
    x, w, g, offs = problem([64, 0, 128], 64, 128, pad=0)
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_fwd.default, (x, w, offs))
    torch.library.opcheck(torch.ops.cake_moe.grouped_gemm_dgrad.default, (g, w, offs))


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
    forms = run_python(_STRIDED_CHECK, CAKE_MOE_GG_FORCE_PORTABLE="1" if portable else "0").strip()
    assert ("gg_portable" in forms) == portable and ("gg_sm90" in forms) != portable, forms


def test_portable_forms_on_this_gpu():
    """The mma.sync forms that serve arches without a native form, run here on sm_90a."""
    code = """
import torch, cake_moe
from grouped_gemm_cases import PATTERNS, bf16, offsets
from cake_moe.reference import grouped_gemm as ref
import os, sys, grouped_gemm_cases
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(grouped_gemm_cases.__file__))))
from tests.grouped_gemm_checks import BUDGET, check_dw, check_rows
for name, sizes in PATTERNS.items():
    for n, k in ((256, 512), (200, 264)):
        rows = sum(sizes) + 8
        x, w, g = bf16(rows, k), bf16(len(sizes), n, k, seed=1, scale=0.05), bf16(rows, n, seed=2)
        o = offsets(sizes)
        y = torch.full((rows, n), float('nan'), dtype=torch.bfloat16, device='cuda')
        launch = cake_moe.prepare_grouped_gemm_fwd(x, w, o, out=y)
        assert launch.form == 'gg_portable_fwd', launch.form
        launch.launch()
        check_rows(y, ref.fwd(x, w, o))
        dx = torch.full((rows, k), float('nan'), dtype=torch.bfloat16, device='cuda')
        check_rows(cake_moe.grouped_gemm_dgrad(g, w, o, out=dx), ref.dgrad(g, w, o))
        want = ref.wgrad(g, x, o)
        check_dw(cake_moe.grouped_gemm_wgrad(g, x, o), want)
        check_dw(cake_moe.grouped_gemm_wgrad(g, x, o, out_dtype=torch.float32), want, BUDGET / 50)
print('ok')
"""
    assert run_python(code, CAKE_MOE_GG_FORCE_PORTABLE="1").strip().splitlines()[-1] == "ok"


@pytest.mark.parametrize("op", ["fwd", "dgrad"])
@pytest.mark.parametrize("tile", SM90_TILES)
def test_every_sm90_tile_form(op, tile):
    x, w, g, offs = problem(PATTERNS["ragged6"], 200, 264, seed=4)
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
    check_rows(launch.launch(), want)
    with pytest.raises(ValueError, match="not a grouped GEMM fwd form of this build"):
        cake_moe.prepare_grouped_gemm_fwd(x, w, offs, form="gg_sm90_fwd_32x32")


def test_tile_choice_follows_the_memory_bandwidth():
    """The default fwd tile of 16384 rows in 9 groups, N = 4096 (the grid's (4096, 2048, 9) w2 row):
    128x256 where DRAM bandwidth per SM is narrow (an H100, where it was 5-13% faster), 128x128
    otherwise (an H200); the same of 16384 rows in 32 groups. The bandwidth the driver reports
    must be a real part's."""
    ext = cake_moe._runtime.ext()
    device = torch.cuda.current_device()
    bandwidth, sms = ext.device_dram_bytes_per_s(device), ext.device_sm_count(device)
    assert 1e12 < bandwidth < 2e13, bandwidth
    narrow = bandwidth < ext.narrow_memory_bytes_per_sm_s * sms
    assert ext.device_narrow_memory(device) == narrow
    x, w, _, offs = problem([16384 // 9] * 9, 4096, 64, pad=16384 % 9)
    launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs)
    assert launch.form == ("gg_sm90_fwd_128x256" if narrow else "gg_sm90_fwd_128x128"), (launch.form, bandwidth)
    check_rows(launch.launch(), ref.fwd(x, w, offs), poisoned=False)
    # 512 rows in each of 32 groups: 35 waves of 128x128 tiles, so where memory is narrow the fwd
    # chooses by the wave cost (kSm90ManyWaves), not 128x192 as with fewer waves
    x, w, _, offs = problem([512] * 32, 4096, 64, pad=0)
    launch = cake_moe.prepare_grouped_gemm_fwd(x, w, offs)
    assert launch.form == ("gg_sm90_fwd_128x256" if narrow else "gg_sm90_fwd_128x128"), (launch.form, bandwidth)
    check_rows(launch.launch(), ref.fwd(x, w, offs), poisoned=False)


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
    check_rows(rows[0], want, poisoned=False)


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
    x, w, g, offs = problem(sizes, n, k, seed=7)
    a, prepare, want = ((x, cake_moe.prepare_grouped_gemm_fwd, ref.fwd(x, w, offs)) if op == "fwd" else
                        (g, cake_moe.prepare_grouped_gemm_dgrad, ref.dgrad(g, w, offs)))
    split, whole = _split_and_whole(monkeypatch, prepare, a, w, offs, form=f"gg_sm90_{op}_128x256")
    for launch in (split, whole):
        poison_(launch.out)  # rows past the last group must stay poisoned
    got = split.launch()
    check_rows(got, want)
    assert torch.equal(got.view(torch.int16), whole.launch().view(torch.int16)), "the split tail changed the bits"


def test_split_tail_halves_a_short_wave(monkeypatch):
    """The split actually runs: 20 tiles of 128x256 over a long K (one short wave) as 40 halves
    end in well under the time of whole tiles (no split gives 1.0). Timed round-robin, so clock
    drift falls on both alike. Not ~0.5: with 20-40 CTAs busy each SM streams its operands
    alone, and a half reads 2/3 of a whole tile's bytes (0.803-0.805 in five timings on the H200:
    64.4 against 80.2 us)."""
    from cake_moe.bench import timing
    x, w, _, offs = problem(PATTERNS["mixed"], 512, 8192, seed=8)
    split, whole = _split_and_whole(monkeypatch, cake_moe.prepare_grouped_gemm_fwd, x, w, offs,
                                    form="gg_sm90_fwd_128x256")
    ms = timing.time_interleaved({"split": split.launch, "whole": whole.launch}, rounds=6)
    ratio = ms["split"] / ms["whole"]
    assert ratio < 0.9, f"split / whole tiles time {ratio:.2f} ({ms}): the last wave was not split"


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
    x, w, g, offs = problem(sizes, n, k, seed=seed, leading_zero=lz, pad=r.choice([0, 1, 16]))
    try:
        for op, a, cols, want in (("fwd", x, n, ref.fwd(x, w, offs, lz)), ("dgrad", g, k, ref.dgrad(g, w, offs, lz))):
            prepare = cake_moe.prepare_grouped_gemm_fwd if op == "fwd" else cake_moe.prepare_grouped_gemm_dgrad
            out = poison_(torch.empty(a.shape[0], cols, dtype=torch.bfloat16, device="cuda"))
            launch = prepare(a, w, offs, out=out, form=forms[op])
            first = launch.launch().clone()
            check_rows(first, want)
            poison_(out)
            again = launch.launch().view(torch.int16)  # NaN padding rows included
            assert torch.equal(again, first.view(torch.int16)), f"{op}: a second launch changed the bits"
        dtype = torch.float32 if f32 else torch.bfloat16
        dw = poison_(torch.empty(groups, n, k, dtype=dtype, device="cuda"))
        launch = cake_moe.prepare_grouped_gemm_wgrad(g, x, offs, out=dw, out_dtype=dtype, num_groups=groups,
                                                     variant=variant, form=forms["wgrad"])
        got = launch.launch().clone()
        assert not got.isnan().any(), "a dW element was not written"
        check_dw(got, ref.wgrad(g, x, offs, lz), BUDGET / (50 if f32 else 1))
        empty = torch.tensor(sizes, device="cuda") == 0
        assert not got[empty].view(torch.int16 if not f32 else torch.int32).any(), "an empty group's dW is not +0"
        poison_(dw)
        again = launch.launch()
        assert not again.isnan().any(), "a second wgrad launch left a dW element unwritten"
        assert variant == "fast" or torch.equal(again, got), "wgrad det: a second launch changed the bits"
    except AssertionError as err:
        raise AssertionError(f"{desc}: {err}") from None
