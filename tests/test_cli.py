"""CPU tests of the ``cake-moe`` command line and of the family-B benchmark's report (its target
verdicts decide what the docs claim, so they are tested on synthetic rows)."""
from __future__ import annotations

import math

import pytest
import torch

from cake_moe import cli
from cake_moe.bench import mxfp4_moe as bench_moe
from cake_moe.mxfp4_moe import _decide


def test_bench_refuses_unknown_layouts():
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "mxfp4-moe", "--layouts", "ep8,ep9"])
    assert e.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_without_a_gpu_says_so(capsys):
    assert cli.main(["bench", "mxfp4-moe", "--tiles", "n64,wg128"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


@pytest.mark.parametrize("script,what", [("grouped_gemm.py", "grouped-gemm"), ("mxfp4_moe.py", "mxfp4-moe")])
def test_bench_scripts_are_the_cli_command(monkeypatch, script, what):
    """``python bench/SCRIPT.py ARGS`` is ``cake-moe bench WHAT ARGS`` (its exit status too)."""
    import runpy
    import sys
    from pathlib import Path
    calls = []
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or 3)
    monkeypatch.setattr(sys, "argv", [script, "--seed", "5"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / script), run_name="__main__")
    assert calls == [["bench", what, "--seed", "5"]] and e.value.code == 3


@pytest.mark.parametrize("argv", [["bench", "grouped-gemm", "--ops", "fwd,foo"],
                                  ["bench", "grouped-gemm", "--tokens", "0"],
                                  ["bench", "formats", "--out", "/no/such/folder/x"],
                                  ["demo", "--tokens", "-3"]])
def test_bad_arguments_are_refused_before_any_work(argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_demo_help_says_what_tokens_sets(capsys):
    from cake_moe import demo
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "format and grouped_mm steps" in text and f"decode step of {demo.MOE_T} tokens" in text


def test_demo_budget_sees_nan():
    from cake_moe import demo
    assert demo._grouped_ok((1e-3, 2e-3, 3e-3))
    assert not demo._grouped_ok((1e-3, float("nan"), 1e-3)) and not demo._grouped_ok((1e-3, 7e-3, 1e-3))


def test_results_json_is_strict(tmp_path):
    """A figure a row does not measure (NaN) is written as null: the file parses as strict JSON."""
    import json
    from cake_moe.bench import timing
    prefix = str(tmp_path / "r")
    timing.write_results(prefix, [{"T": 1, "naive_eager_us": 5.0},
                                  {"T": 128, "naive_eager_us": math.nan, "tiles_ms": {"a": math.inf, "b": 1.0}}],
                         "| t |")
    text = open(prefix + ".json").read()
    rows = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert rows[1]["naive_eager_us"] is None and rows[0]["naive_eager_us"] == 5.0
    assert rows[1]["tiles_ms"] == {"a": None, "b": 1.0}


def test_info_without_the_extension_says_so_in_one_line(monkeypatch, capsys):
    from cake_moe import _runtime
    monkeypatch.setattr(_runtime, "_ext", None)
    monkeypatch.setattr(_runtime, "_EXT_IMPORT_ERROR", ImportError("stand-in"))
    _runtime.manifest.cache_clear()
    try:
        assert cli.main(["info"]) == 2
    finally:
        _runtime.manifest.cache_clear()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiled extension (cake_moe._ext)" in err and "pip install ." in err



@pytest.mark.parametrize("dram,shown", [(4.81e12, ", 4.81 TB/s peak DRAM)"),
                                        (3.35e12, ", 3.35 TB/s peak DRAM (under 30 GB/s per SM: narrow-memory form "
                                                  "choices))"),
                                        (0.0, " SMs)")])
def test_info_device_line_names_the_dram_bandwidth_when_reported(monkeypatch, dram, shown):
    """The device line of ``cake-moe info`` gives the peak DRAM bandwidth the form choices read,
    says where they take their narrow-memory rules, and leaves it out where the driver reports
    none (0)."""
    from types import SimpleNamespace

    from cake_moe import _runtime
    ext = SimpleNamespace(device_count=lambda: 1, device_arch=lambda d: "90a", device_name=lambda d: "Stand-in",
                          device_sm_count=lambda d: 132, device_dram_bytes_per_s=lambda d: dram,
                          device_narrow_memory=lambda d: 0 < dram < 30e9 * 132, narrow_memory_bytes_per_sm_s=30e9)
    monkeypatch.setattr(_runtime, "driver_status", lambda: (True, 13000, ""))
    monkeypatch.setattr(_runtime, "ext", lambda: ext)
    monkeypatch.setattr(_runtime, "built_arches", lambda: ["90a"])
    line, served = cli._device_line()
    assert served and line.startswith("cuda:0 Stand-in (sm_90a, 132 SMs") and shown in line, line
    assert ("TB/s" in line) == (dram > 0), line

def _row(layout, t, path, tile, us, frac, tflops, speedup, peer=None):
    return {"layout": layout, "T": t, "path": path, "tile": tile, "ours_us": us, "naive_us": us * speedup,
            "speedup": speedup, "routed_experts": 1.0, "bytes": 1e6, "eff_bw_frac": frac, "tflops": tflops,
            "peer_us_perf_md": peer, "naive_rel_diff": 0.027,
            # decode rows also time one eager naive call (here 4x the graph-replayed naive)
            "naive_eager_us": us * speedup * 4 if t <= 64 else math.nan,
            "speedup_eager_naive": speedup * 4 if t <= 64 else math.nan}


def test_summary_verdicts_ignore_forced_rows():
    rows = [
        _row("tp8", 1, "decode", "n8_narrow", 50.0, 0.55, 5, 31.0, peer=83),
        _row("tp8", 16, "decode", "n8", 350.0, 0.69, 12, 4.0, peer=405),
        _row("tp8", 64, "decode", "n8", 900.0, 0.71, 18, 4.0, peer=1040),
        _row("tp8", 64, "forced", "n32", 5000.0, 0.10, 3, 1.0, peer=1040),   # must not count
        _row("tp8", 16384, "prefill", "wg128", 16000.0, 0.06, 610, 4.5, peer=12970),
    ]
    s = bench_moe.summary(rows)
    assert "decode bandwidth >= 0.70 of copy (8 <= T <= 64): MISSED at tp8 T=16 (1 of 2 rows)" in s
    assert "decode bandwidth >= 0.50 of copy (T <= 4): met (1 rows)" in s
    assert "prefill >= 600 TFLOP/s (T >= 4096): met (1 rows)" in s
    assert "vs naive >= 30x (T = 1): met" in s and "vs naive >= 4x (T = 16384): met" in s
    assert "vs naive called eagerly as PERF.md's anchor was >= 30x (T = 1): met (1 rows)" in s
    assert "faster than the PERF.md peer (tp8): MISSED at tp8 T=16384 (1 of 4 rows)" in s
    assert "rows of other layers" not in s


def test_summary_says_the_targets_are_the_contracts_for_other_layers():
    other = dict(_row("E64 k4 H1024 I512", 1, "decode", "n8_narrow", 20.0, 0.3, 1, 6.0), shape=[1024, 512, 64, 4])
    contract = dict(_row("tp8", 1, "decode", "n8_narrow", 40.0, 0.5, 5, 6.0, peer=83),
                    shape=[bench_moe.H, bench_moe.I, bench_moe.E, bench_moe.TOP_K])
    s = bench_moe.summary([contract, other])
    assert "rows of other layers (E64 k4 H1024 I512): PERF.md set these targets for the contract geometry" in s
    assert "rows of other layers" not in bench_moe.summary([contract])


def test_markdown_has_one_line_per_row_with_its_tile():
    rows = [_row("ep8", 4096, "prefill", "wg128", 4767.0, 0.19, 323, 4.0),
            dict(_row("ep8", 4096, "forced", "wg128", 0, 0, 0, 1), skipped="tile 'wg128' is an sm_90a form")]
    md = bench_moe.markdown(rows).splitlines()
    assert len(md) == 2 + len(rows)
    assert md[2].startswith("| ep8 | 4096 | prefill | wg128 | 4767.0 |")
    assert "not run: tile 'wg128' is an sm_90a form" in md[3]
    assert "| 4.0 | - | - |" in md[2]  # no eager naive call timed at prefill rows
    decode = bench_moe.markdown([_row("tp8", 1, "decode", "n8_narrow", 40.0, 0.5, 5, 6.0)]).splitlines()[2]
    assert "| 240.0 | 6.0 | 960.0 | 24.0 |" in decode
    assert all(line.count("|") == md[0].count("|") for line in md[1:])


def test_grouped_gemm_summary_per_form_geomeans():
    """The family-A sweep report: the geomean over torch of every swept form, on its own rows."""
    from cake_moe.bench import grouped_gemm as bench_gg

    def row(t, ours, torch_ms, dense_ms, tiles):
        return {"op": "wgrad", "layer": [2048, 768, 16], "weight": "w13", "T": t, "groups": "random",
                "form": "gg_sm90_wgrad_det", "ours_ms": ours, "torch_ms": torch_ms, "dense_ms": dense_ms,
                "speedup_vs_torch": torch_ms / ours,
                "fraction_of_dense": 0.9, "rows_per_expert": t / 16, "tiles_ms": tiles,
                "best_tile_speedup": torch_ms / min(tiles.values())}

    rows = [row(4096, 1.0, 1.0, 0.5, {"128x256": 1.0, "128x256_c2": 0.5}),
            row(65536, 2.0, 1.0, 4.0, {"128x256": 2.0, "128x256_c2": 1.0})]
    geo = bench_gg.sweep_geomeans(rows)
    assert geo["128x256"][0] == pytest.approx(0.5 ** 0.5) and geo["128x256"][1] == 2
    assert geo["128x256_c2"][0] == pytest.approx(2.0 ** 0.5) and geo["128x256_c2"][1] == 2
    s = bench_gg.summary(rows)
    # the dense reference takes the faster of ours and dense per row: 1 / 0.5 and 1 / 2
    assert "at dense cuBLAS speed on every row x1.000" in s
    assert ("wgrad sweep, geomean over torch per form (rows where it ran): 128x256 x0.707 (2 rows), "
            "128x256_c2 x1.414 (2 rows)") in s


def test_balanced_orders_put_every_callable_after_every_other_equally_often():
    from cake_moe.bench import timing
    for n in range(1, 9):
        orders = timing.balanced_orders(n)
        assert len(orders) == (n if n % 2 == 0 or n == 1 else 2 * n)
        assert all(sorted(o) == list(range(n)) for o in orders)
        follows = {}
        for o in orders:
            for a, b in zip(o, o[1:]):
                follows[(a, b)] = follows.get((a, b), 0) + 1
        assert len(follows) == n * (n - 1), f"n={n}: some callable never follows another"
        assert len(set(follows.values())) <= 1, f"n={n}: uneven {follows}"


def _fake_timer(fake: dict, calls: list):
    def timer(fn, iters, reps):
        calls.append(fn())
        return fake[calls[-1]].pop(0)
    return timer


def test_interleaved_timing_balances_its_rounds_and_takes_medians():
    from cake_moe.bench import timing
    calls = []
    fake = {"a": [5.0, 1.0, 2.0, 2.0, 9.0, 1.5], "b": [3.0, 9.0, 4.0, 4.0, 3.5, 8.0], "c": [7.0] * 6}
    ms = timing.time_interleaved({k: (lambda k=k: k) for k in "abc"}, timer=_fake_timer(fake, calls))
    want = ["abc"[i] for o in timing.balanced_orders(3) for i in o]
    assert len(calls) == 18 and calls == want, "one full balanced design of rounds by default (six for three)"
    assert ms == {"a": 2.0, "b": 4.0, "c": 7.0}


def test_interleaved_timing_rotates_on_request():
    from cake_moe.bench import timing
    calls = []
    fake = {"a": [5.0, 1.0, 2.0], "b": [3.0, 9.0, 4.0], "c": [7.0, 7.0, 8.0]}
    ms = timing.time_interleaved({k: (lambda k=k: k) for k in "abc"}, rounds=3, timer=_fake_timer(fake, calls),
                                 order="rotate")
    assert calls == list("abc" "bca" "cab"), "each round starts one callable later"
    assert ms == {"a": 2.0, "b": 4.0, "c": 7.0}
    with pytest.raises(ValueError, match="order"):
        timing.time_interleaved({"a": lambda: "a"}, order="shuffled")


def test_round_orders_default_to_one_balanced_design_or_four_rotations():
    """timing.round_orders, which time_interleaved and ci/moe_gemm_pairs.py both take their
    rounds from: one full design by default (at least 4 rounds), cycling when asked for more."""
    from cake_moe.bench import timing
    assert timing.round_orders(3) == timing.balanced_orders(3) and len(timing.round_orders(3)) == 6
    assert timing.round_orders(2) == timing.balanced_orders(2) * 2   # at least 4 rounds
    assert timing.round_orders(3, rounds=8) == (timing.balanced_orders(3) * 2)[:8]
    assert timing.round_orders(3, order="rotate") == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_grouped_gemm_bench_rotates_inputs_that_fit_in_l2():
    """PERF.md: inputs that fit in the L2 are cycled over copies spanning ROTATE_BYTES (at most
    MAX_COPIES); larger inputs run on one set; each op names the tensors it reads."""
    from cake_moe.bench import grouped_gemm as bench_gg
    from cake_moe.bench import timing
    mb = 1 << 20
    assert bench_gg.ROTATE_BYTES >= 2 * bench_gg.L2_BYTES
    assert bench_gg.rotation_copies(bench_gg.ROTATE_BYTES) == 1
    assert bench_gg.rotation_copies(10 * bench_gg.ROTATE_BYTES) == 1
    assert bench_gg.rotation_copies(bench_gg.ROTATE_BYTES // 2) == 2
    assert bench_gg.rotation_copies(bench_gg.ROTATE_BYTES // 2 - 1) == 3, "the copies span at least ROTATE_BYTES"
    assert bench_gg.rotation_copies(1 * mb) == bench_gg.MAX_COPIES
    assert bench_gg.rotation_copies(0) == bench_gg.MAX_COPIES
    x, w, g = object(), object(), object()
    assert bench_gg.op_inputs("fwd", x, w, g) == (x, w)
    assert bench_gg.op_inputs("dgrad", x, w, g) == (g, w)
    assert bench_gg.op_inputs("wgrad", x, w, g) == (g, x)
    seen = []
    fn = timing.cycling([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        fn()
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    single = lambda: None  # noqa: E731
    assert timing.cycling([single]) is single
    import torch
    a, b, c = torch.arange(4.0), torch.ones(3), torch.zeros(2)
    sets = bench_gg._copies_of((a, b, c), 3, read=(a, c))
    assert len(sets) == 3 and sets[0] == (a, b, c)
    for s in sets[1:]:
        assert s[1] is b, "a tensor the op does not read is shared, not cloned"
        assert s[0] is not a and s[2] is not c and torch.equal(s[0], a) and torch.equal(s[2], c)
        assert s[0].data_ptr() != a.data_ptr()
    assert all(t is not u for t, u in zip(bench_gg._copies_of((a, b), 2)[1], (a, b))), "default: every tensor cloned"


def test_grouped_gemm_bench_refuses_an_unknown_op():
    from cake_moe.bench import grouped_gemm as bench_gg
    with pytest.raises(ValueError, match="op must be"):
        bench_gg.op_callables("bwd", None, None, None, None)


def test_mxfp4_moe_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [_row(layout, t, "decode", "n8", 40.0 * t, 0.6, 10.0 * t, 6.0, peer=50.0 * t if layout == "tp8" else None)
            for layout in ("ep8", "tp8") for t in (1, 4, 16)]
    rows.append(dict(_row("tp8", 4, "forced", "n64", 1.0, 0.1, 1.0, 1.0), gpu="G", date="D"))
    for r in rows:
        r.update(gpu="NVIDIA H200", date="2026-12-01")
    path = tmp_path / "grid.png"
    assert bench_moe.plot(rows, str(path)) and path.stat().st_size > 10_000


def test_rank_layer_draws_the_bank_then_the_situ_parameters(monkeypatch):
    """bench.rank_layer, which every timing tool starts from: random_bank then random_situ from
    one generator (the same seed draws the same layer in every tool), the bank prepared and,
    on request, dequantized to BF16 for the naive layer; the wrapper of the layout (here a small
    geometry on the CPU)."""
    from cake_moe.mxfp4_moe import prepare_cake_mxfp4_weights
    small = {"E": 8, "TOP_K": 2, "H": 256, "I": 256,
             "LAYOUTS": {"ep": {"num_local_experts": 2, "local_expert_offset": 4}, "tp": {"intermediate_shard": 128}}}
    for name, value in small.items():
        monkeypatch.setattr(bench_moe, name, value)
    for layout, (l, offset, i_shard) in {"ep": (2, 4, 256), "tp": (8, 0, 128)}.items():
        got = bench_moe.rank_layer(layout, torch.Generator().manual_seed(3), with_bf16=True)
        gen = torch.Generator().manual_seed(3)
        bank = bench_moe.random_bank(l, i_shard, gen, h=256)
        beta, linear_beta = bench_moe.random_situ(l, gen)
        assert (got.local, got.offset, got.i_shard) == (l, offset, i_shard)
        assert torch.equal(got.beta, beta) and torch.equal(got.linear_beta, linear_beta)
        want = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
        assert got.prepared.keys() == want.keys()
        for key, value in want.items():
            assert torch.equal(got.prepared[key], value) if isinstance(value, torch.Tensor) else got.prepared[key] == value, key
        assert torch.equal(got.bank16[0], bench_moe.dequantize_bf16(bank["w1"], bank["w1_scale"]))
        assert torch.equal(got.bank16[1], bench_moe.dequantize_bf16(bank["w2"], bank["w2_scale"]))
        r = got.runner
        assert (r.num_experts, r.top_k, r.hidden_size, r.num_local_experts, r.intermediate_shard) == (8, 2, 256, l, i_shard)
        assert r.device.type == "cpu"
    assert bench_moe.rank_layer("ep", torch.Generator().manual_seed(3)).bank16 is None


def test_other_layers_are_named_after_their_geometry_and_rank(monkeypatch):
    """``--layer``'s Layer: named after its geometry and rank; a contract layout by name is the
    contract geometry with that layout's rank; rank_layer builds either the same way."""
    ep = bench_moe.other_layer((256, 8, 7168, 2048), {"num_local_experts": 32, "local_expert_offset": 64})
    assert ep.name == "E256 k8 H7168 I2048 L32@64" and ep.dims == (256, 8, 7168, 2048)
    assert bench_moe.other_layer((256, 8, 7168, 2048), {"intermediate_shard": 256}).name == "E256 k8 H7168 I2048 /256"
    assert bench_moe.other_layer((64, 4, 1024, 512), {}).name == "E64 k4 H1024 I512"
    assert bench_moe.rank_args(32, 64) == {"num_local_experts": 32, "local_expert_offset": 64}
    assert bench_moe.rank_args(shard=256) == {"intermediate_shard": 256} and bench_moe.rank_args() == {}
    assert bench_moe.layer_of(ep) is ep
    tp8 = bench_moe.layer_of("tp8")
    assert (tp8.name, tp8.dims, tp8.rank) == ("tp8", (bench_moe.E, bench_moe.TOP_K, bench_moe.H, bench_moe.I),
                                              bench_moe.LAYOUTS["tp8"])
    small = bench_moe.other_layer((8, 2, 256, 256), {"num_local_experts": 2, "local_expert_offset": 4})
    got = bench_moe.rank_layer(small, torch.Generator().manual_seed(3))
    monkeypatch.setattr(bench_moe, "LAYOUTS", {"ep": dict(small.rank)})
    for name, value in zip(("E", "TOP_K", "H", "I"), small.dims):
        monkeypatch.setattr(bench_moe, name, value)
    want = bench_moe.rank_layer("ep", torch.Generator().manual_seed(3))
    assert (got.local, got.offset, got.i_shard) == (want.local, want.offset, want.i_shard) == (2, 4, 256)
    assert torch.equal(got.beta, want.beta) and torch.equal(got.prepared["w1"], want.prepared["w1"])
    assert repr(got.runner) == repr(want.runner)


def test_bench_takes_another_layer_and_refuses_before_any_work(capsys):
    """``cake-moe bench mxfp4-moe --layer E,K,H,I`` with a rank: what the wrapper refuses, a rank
    without a layer and --layer on another benchmark exit 2 with the reason, GPU or not."""
    assert cli.main(["bench", "mxfp4-moe", "--layer", "256,8,7168,2048", "--shard", "100"]) == 2
    assert "--layer: intermediate_shard must be a multiple of 128" in capsys.readouterr().err
    assert cli.main(["bench", "mxfp4-moe", "--local-experts", "3"]) == 2
    assert "describe a --layer's rank" in capsys.readouterr().err
    assert cli.main(["bench", "grouped-gemm", "--layer", "256,8,7168,2048"]) == 2
    assert "--layer is mxfp4-moe's" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "mxfp4-moe", "--layer", "256,8,7168"])
    assert e.value.code == 2 and "expected E,K,H,I" in capsys.readouterr().err


def _ci_module(name: str):
    """A tool of ci/ imported as its scripts run (ci/ first on the path)."""
    import importlib
    import pathlib
    import sys
    ci = str(pathlib.Path(__file__).resolve().parents[1] / "ci")
    sys.path.insert(0, ci)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(ci)


def test_ci_family_b_tools_take_the_benchmarks_layers(capsys):
    """ci/layer_args.py (LAYOUT and --layer for ci/profile_moe.py and ci/moe_gemm_pairs.py): a
    contract layout by name, another layer as the benchmark names it, and the two mixed up
    refused; the pairs tool's +sync / +nosync suffixes."""
    import argparse
    layer_args = _ci_module("layer_args")

    def spec(*argv):
        ap = argparse.ArgumentParser()
        layer_args.add(ap)
        return layer_args.spec(ap, ap.parse_args(list(argv)))
    assert spec("ep8") == "ep8"
    assert spec("layer", "--layer", "128,8,2048,768") == bench_moe.other_layer((128, 8, 2048, 768), {})
    ep = spec("layer", "--layer", "256,8,7168,2048", "--rank-experts", "32", "--expert-offset", "64")
    assert ep.name == "E256 k8 H7168 I2048 L32@64"
    assert spec("layer", "--layer", "256,8,7168,2048", "--shard", "256").name == "E256 k8 H7168 I2048 /256"
    for argv, why in ((("layer",), "LAYOUT layer goes with --layer"),
                      (("tp8", "--layer", "8,2,256,256"), "LAYOUT layer"),
                      (("ep8", "--shard", "128"), "describe a --layer's rank")):
        with pytest.raises(SystemExit):
            spec(*argv)
        assert why in capsys.readouterr().err
    pairs = _ci_module("moe_gemm_pairs")
    assert pairs._synced("n8_narrow/n8+nosync") == ("n8_narrow/n8", False)
    assert pairs._synced("n8+sync") == ("n8", True) and pairs._synced("n8_narrow/n8") == ("n8_narrow/n8", None)
    with pytest.raises(SystemExit):
        pairs._synced("n8+fast")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_of_another_layer_without_a_gpu_says_so(capsys):
    assert cli.main(["bench", "mxfp4-moe", "--layer", "256,8,7168,2048", "--local-experts", "32"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_grouped_gemm_rows_are_the_grid_or_its_layers_at_other_token_counts():
    from cake_moe.bench import grouped_gemm as bench_gg
    grid = list(bench_gg._rows())
    assert len(grid) == len(bench_gg.LAYERS) * 2 * len(bench_gg.TOKENS) + 2   # + the zipf and empty rows
    assert {r[-1] for r in grid} == {"random", "zipf", "empty"}
    off = list(bench_gg._rows((256, 1024)))
    assert len(off) == len(bench_gg.LAYERS) * 2 * 2
    assert {r[6] for r in off} == {256, 1024} and {r[-1] for r in off} == {"random"}
    assert [r[:6] for r in off[::2]] == [r[:6] for r in grid if r[-1] == "random"][::len(bench_gg.TOKENS)]


def test_grouped_gemm_rows_of_other_layers(capsys):
    """``--layers H,I,E ...``: those layers' w13 and w2 rows at the grid's T (or --tokens), no
    grid layer and no zipf or empty row; a malformed layer exits 2 with the reason."""
    from cake_moe.bench import grouped_gemm as bench_gg
    rows = list(bench_gg._rows(layers=[(2048, 768, 128), (7168, 2048, 32)]))
    assert len(rows) == 2 * 2 * len(bench_gg.TOKENS) and {r[-1] for r in rows} == {"random"}
    assert {r[:3] for r in rows} == {(2048, 768, 128), (7168, 2048, 32)}
    assert {(r[3], r[4], r[5]) for r in rows if r[:3] == (2048, 768, 128)} == {("w13", 1536, 2048), ("w2", 2048, 768)}
    assert {r[6] for r in bench_gg._rows((512,), [(2048, 768, 128)])} == {512}
    for bad, why in (("2048,768", "expected H,I,E (3 ints)"), ("2048,764,128", "multiples of 8"),
                     ("2048,768,0", "positive")):
        with pytest.raises(SystemExit) as e:
            cli.main(["bench", "grouped-gemm", "--layers", bad])
        assert e.value.code == 2 and why in capsys.readouterr().err


def test_grouped_gemm_group_draws_keep_the_grids_and_differ_by_seed():
    """Draw 0 is the published grid's (each row seeded by its index); other draws differ."""
    from cake_moe.bench import grouped_gemm as bench_gg
    assert [bench_gg.case_seed(i) for i in range(3)] == [0, 1, 2]
    grid = bench_gg._sizes(4096, 16, "random", bench_gg.case_seed(0))
    other = bench_gg._sizes(4096, 16, "random", bench_gg.case_seed(0, seed=1))
    assert sum(grid) == sum(other) == 4096 and grid != other


@pytest.mark.parametrize("narrow,want", [("no", {8: "n8", 320: "n8", 512: "n8"}),
                                         ("yes", {8: "n8_narrow4", 320: "n8", 512: "wg32x4 or wg64x4"})])
def test_decide_prints_the_decision_table(capsys, narrow, want):
    """``cake-moe decide`` prints, per token count, the tile forms plan() would bind (host only),
    with an H200's or a narrow-memory part's decisions as asked."""
    assert cli.main(["decide", "--layouts", "tp8", "--tokens", "8", "320", "512", "--narrow-memory", narrow]) == 0
    out = capsys.readouterr().out
    assert f"narrow_memory={narrow == 'yes'}" in out and "intermediate_shard=384" in out
    rows = {int(line.split()[0]): line for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert sorted(rows) == [8, 320, 512]
    for t, tile in want.items():
        assert f"  {tile} " in rows[t], rows[t]
        assert ("gemm2_n8_shortk" in rows[t]) == (tile != "wg32x4 or wg64x4"), rows[t]   # tp8: K = 384
    assert f"{_decide.routes_per_expert(512, 16, 896):.3g}" in rows[512]


def test_decide_prints_the_grouped_gemm_forms(capsys):
    """``cake-moe decide --grouped-gemm H,I,E``: per routed-row count and weight, the default
    sm_90a fwd / dgrad / wgrad forms (host only); narrow memory takes 128x256 for a fwd of many
    waves (kSm90ManyWaves) where an H200 keeps 128x128, and groups of at most 512 rows take the
    wgrad's CTA pairs. A family-B --layer with it exits 2."""
    rows = {}
    for narrow in ("yes", "no"):
        assert cli.main(["decide", "--grouped-gemm", "7168,2048,32", "--tokens", "16384", "--narrow-memory",
                         narrow]) == 0
        out = capsys.readouterr().out
        assert f"narrow memory {narrow}" in out
        rows[narrow] = {line.split()[2]: line.split() for line in out.splitlines() if line.strip().startswith("16384")}
    assert set(rows["yes"]) == {"w13", "w2"}
    assert rows["yes"]["w13"][3:] == ["4096", "7168", "gg_sm90_fwd_128x256", "gg_sm90_dgrad_128x256",
                                      "gg_sm90_wgrad_det_c2"]
    assert rows["no"]["w13"][5] == "gg_sm90_fwd_128x128"
    assert cli.main(["decide", "--grouped-gemm", "7168,2048,32", "--layer", "256,8,7168,2048"]) == 2
    assert "takes no family-B --layer" in capsys.readouterr().err


def test_decide_refuses_an_unknown_layout(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["decide", "--layouts", "ep4"])
    assert e.value.code == 2 and "expected a comma list of ep8, tp8" in capsys.readouterr().err


def test_decide_takes_another_layer(capsys):
    """``--layer E,K,H,I`` with a rank (``--local-experts`` / ``--expert-offset`` or ``--shard``)
    replaces the contract layouts; what the wrapper refuses, and a rank without a layer, exit 2
    with the reason."""
    assert cli.main(["decide", "--layer", "256,8,7168,2048", "--local-experts", "32", "--expert-offset", "64",
                     "--tokens", "1", "4096", "--narrow-memory", "no"]) == 0
    out = capsys.readouterr().out
    assert "num_local_experts=32, local_expert_offset=64" in out and "ep8" not in out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 2 and "n8_narrow" in rows[0] and "prefill" in rows[1], rows
    assert f"{_decide.routes_per_expert(4096, 8, 256):.3g}" in rows[1]
    assert cli.main(["decide", "--layer", "8,2,7168,128", "--tokens", "4", "5000000", "--narrow-memory", "no"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert "n8_narrow" in rows[0] and rows[1].startswith("5000000 refused: T = 5000000"), rows   # T x H >= 2^35
    assert cli.main(["decide", "--layer", "256,8,7168,2048", "--shard", "100"]) == 2
    assert "intermediate_shard must be a multiple of 128" in capsys.readouterr().err
    assert cli.main(["decide", "--shard", "256"]) == 2
    assert "describe a --layer's rank" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["decide", "--layer", "1,2,3"])
    assert e.value.code == 2 and "expected E,K,H,I" in capsys.readouterr().err

