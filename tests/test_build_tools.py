"""Build and experiment tools: the kernel build's compile wrapper (tools/nvcc_checked.py) on a
stand-in compiler, the bound-experiment trees (ci/bound_tree.py), the tile tables that must agree,
and the tests ci/gpu.sh deselects."""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "nvcc_checked.py"

# prints what ptxas -v prints for one function, plus `extra`, and writes the -o file
FAKE_NVCC = """
import sys
args = sys.argv[1:]
assert "-Xptxas=-v" in args, "the wrapper must turn ptxas's report on"
open(args[args.index("-o") + 1], "w").write("image")
print("ptxas info    : Compiling entry function 'k' for 'sm_90a'")
print("ptxas info    : Used 168 registers, used 16 barriers")
print("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
print({extra!r})
sys.exit({rc})
"""


def _run(tmp_path, extra, rc=0):
    fake = tmp_path / "fake_nvcc.py"
    fake.write_text(FAKE_NVCC.format(extra=extra, rc=rc))
    out = tmp_path / "k.fatbin"
    proc = subprocess.run([sys.executable, str(TOOL), sys.executable, str(fake), "-o", str(out)],
                          capture_output=True, text=True)
    return proc, out


def test_clean_compile_passes_and_keeps_the_image_quietly(tmp_path):
    proc, out = _run(tmp_path, "ptxas warning : Registers are spilled to local memory")
    assert proc.returncode == 0 and out.exists()
    assert "Registers are spilled" in proc.stdout  # warnings still shown
    assert "Used 168 registers" not in proc.stdout  # per-function info lines are not


def test_serialized_wgmma_fails_the_build_and_removes_the_image(tmp_path):
    line = ("ptxas info    : (C7519) Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized due to program dependence on compiler-inserted WG.AR in divergent path")
    proc, out = _run(tmp_path, line)
    assert proc.returncode == 1 and not out.exists()
    assert "C7519" in proc.stdout and "performance loss" in proc.stderr


def test_compiler_failure_is_passed_through(tmp_path):
    proc, _ = _run(tmp_path, "error: something", rc=3)
    assert proc.returncode == 3 and "error: something" in proc.stdout


def test_output_path_is_the_named_file_only():
    import importlib.util
    spec = importlib.util.spec_from_file_location("nvcc_checked", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod._output_path(["-odir", "d", "-o", "k.fatbin"]) == "k.fatbin"   # -odir is a directory
    assert mod._output_path(["--output-file=k.cubin"]) == "k.cubin"
    assert mod._output_path(["-odir", "d"]) is None


def _bound_tree():
    import importlib.util
    path = pathlib.Path(__file__).resolve().parents[1] / "ci" / "bound_tree.py"
    spec = importlib.util.spec_from_file_location("bound_tree", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bound_tree_empties_only_the_marked_statements():
    src = ("  if (ok)\n"
           "    store(x);  // bound: store\n"
           "  mma(a, b);  // bound: mma\n"
           "  keep(y);  // a comment\n")
    text, n = _bound_tree().drop_marked(src, {"store"})
    assert n == 1
    # the `if` now guards an empty statement, not the line after it
    assert text == ("  if (ok)\n"
                    "    ;  // bound: dropped store\n"
                    "  mma(a, b);  // bound: mma\n"
                    "  keep(y);  // a comment\n")
    assert _bound_tree().drop_marked(src, {"mma", "store"})[1] == 2


def test_grouped_gemm_kernels_carry_the_bound_marks():
    kernels = pathlib.Path(__file__).resolve().parents[1] / "cpp" / "kernels" / "grouped_gemm"
    tool = _bound_tree()
    # a kernel and the epilogue header it includes
    for names in (("sm90_bf16_grouped_gemm.cuh",), ("sm90_bf16_grouped_gemm_wgrad.cuh", "sm90_wgrad_epilogue.cuh")):
        text = "".join((kernels / name).read_text() for name in names)
        for mark in ("mma", "store"):
            assert tool.drop_marked(text, {mark})[1] >= 1, (names, mark)


def test_sm90_tile_lists_agree():
    """The sm_90a fwd/dgrad tiles are named in three layers: the compiled forms (forms.py), the
    host's tile choice (heuristics_sm90.hpp, which also resolves `form=` names) and the Python
    tile list the sweep, the sanitizer run and the GPU tests walk. A tile missing from one of
    them would be built but never chosen, refused by name, or never tested."""
    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "cpp" / "kernels"))
    try:
        import forms
    finally:
        sys.path.pop(0)
    from cake_moe.bench.grouped_gemm import SM90_TILES

    built = set(forms.SM90_GG_TILES)
    header = (root / "cpp" / "host" / "grouped_gemm" / "heuristics_sm90.hpp").read_text()
    table = re.search(r"kSm90Tiles\[\]\s*=\s*\{(.*?)\};", header, re.S).group(1)
    host = {(int(bm), int(bn), int(st), split == "true")
            for bm, bn, st, split in re.findall(r"\{(\d+),\s*(\d+),\s*(\d+)(?:,\s*(true|false))?\}", table)}
    assert host == built
    assert sorted(SM90_TILES) == sorted(f"{bm}x{bn}" for bm, bn, _, _ in built)


def test_mxfp4_moe_tile_lists_agree():
    """Family B's GEMM tile forms are named in three layers too: the compiled forms (forms.py),
    the host's table that binds a form by name (tilings.cpp `tiling_for`) and the Python
    decision table (`_decide`: the tiles it or a caller's `tile=` can name, the short-K and
    resident-rows GEMM2 forms derived from them). They must list the same forms."""
    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "cpp" / "kernels"))
    try:
        import forms
    finally:
        sys.path.pop(0)
    from cake_moe.mxfp4_moe import _decide, _tile_cost

    built = {t[0] for t in forms.MXFP4_MOE_TILINGS + forms.MXFP4_MOE_SM90_TILINGS}
    source = (root / "cpp" / "host" / "mxfp4_moe" / "tilings.cpp").read_text()
    table = re.search(r"kTilings\s*=\s*\{(.*?)\};", source, re.S).group(1)
    host = set(re.findall(r'info<\w+>\("(\w+)"', table))
    python = set(_decide.TILES) | {"n8_shortk", "n8_shortk2"} | {f"{t}_rb" for t in _decide.RESIDENT_TILES}
    assert host == built
    assert python == built
    # the forms compiled as GEMM2 only are the ones the host refuses as GEMM1
    gemm2_only = {t[0] for t in forms.MXFP4_MOE_TILINGS + forms.MXFP4_MOE_SM90_TILINGS if len(t) > 4 and t[4] == (2,)}
    host_gemm2_only = set(re.findall(r'info<\w+>\("(\w+)", \w+, true\)', table)) | {h for h in host if h.endswith("_rb")}
    assert host_gemm2_only == gemm2_only and "n8_shortk2" in gemm2_only
    assert set(_decide.SM90_TILES) == {t[0] for t in forms.MXFP4_MOE_SM90_TILINGS if not t[0].endswith("_rb")}
    # and the token rows per tile the decision table counts are the forms' BN
    bn_built = {t[0]: t[1] for t in forms.MXFP4_MOE_TILINGS + forms.MXFP4_MOE_SM90_TILINGS}
    assert {t: bn_built[t] for t in _tile_cost.BLOCK_N_OF} == _tile_cost.BLOCK_N_OF


def test_ab_table_reads_two_logs_and_rejects_a_missing_column(tmp_path):
    """ci/ab_table.py: per-row ratios of two ab_forms logs over passes, and their quotient."""
    tool = pathlib.Path(__file__).resolve().parents[1] / "ci" / "ab_table.py"
    row = "wgrad N= 1536 K= 2048 E=16 T=  4096 random torch     77.3 us  default x{a}  gg_x x{b}\n"
    log = tmp_path / "a.log"
    log.write_text(row.format(a="1.200", b="1.300") + "geomean over torch: default x1.200\n" +
                   row.format(a="1.100", b="1.300") + "geomean over torch: default x1.100\n")
    out = subprocess.run([sys.executable, str(tool), str(log), f"{log}:gg_x", "--labels", "one,two"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "| 1536 | 2048 | 16 | 4096 | random | 256 | 77.3 | 1.200, 1.100 | 1.300, 1.300 | 1.130 |" in out.stdout
    bad = subprocess.run([sys.executable, str(tool), str(log), f"{log}:nope"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no column 'nope'" in bad.stderr


def test_ab_kernel_times_tabulates_builds_against_their_base(tmp_path):
    """ci/ab_kernel_times.py: family-B kernel times of ab.sh logs per (layout, T, kernel), each
    build's change against the mean of the base builds, small kernels left out, bad labels refused."""
    tool = pathlib.Path(__file__).resolve().parents[1] / "ci" / "ab_kernel_times.py"
    log = ("some warning line\n"
           "tp8 T=4096 (wg96x4): {total} us of kernels per run\n"
           "     {g1} us   52.8%  cake_mxfp4_moe_gemm1_wg96x4\n"
           "       7.5 us    0.2%  cake_moe_route_count\n"
           "dumped x\n"
           "     999.0 us   99.0%  stray_kernel_outside_a_case\n")
    for label, total, g1 in (("main", 3000.0, 1600.0), ("main_2", 3020.0, 1620.0), ("new", 2980.0, 1566.0)):
        (tmp_path / f"ab_{label}.log").write_text(log.format(total=total, g1=g1))
    run = [sys.executable, str(tool), str(tmp_path)]
    out = subprocess.run(run + ["main", "main_2", "new", "--base", "main,main_2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "| case | kernel | main | main_2 | new | new vs base |"
    assert "| tp8 4096 | gemm1_wg96x4 | 1600.0 | 1620.0 | 1566.0 | -2.7% |" in lines
    assert "| tp8 4096 | all kernels | 3000.0 | 3020.0 | 2980.0 | -1.0% |" in lines
    assert not any("route_count" in line or "stray" in line for line in lines)
    missing = subprocess.run(run + ["main", "nope"], capture_output=True, text=True)
    assert missing.returncode != 0 and "ab_nope.log: no such log" in missing.stderr
    bad_base = subprocess.run(run + ["main", "new", "--base", "old"], capture_output=True, text=True)
    assert bad_base.returncode != 0 and "--base old: not among the labels" in bad_base.stderr


def test_tile_rule_mirror_chooses_what_the_recorded_runs_chose():
    """ci/gg_pick_model.py mirrors heuristics_sm90.hpp's fwd / dgrad tile choice (it stops where a
    run chose otherwise): on the H100 layers sweep of 7722882 with the many-wave clause, on
    ee4a31b's (made before it) only with --rule-before. ci/gg_rule_change.py finds the eight rows
    the clause changes on ee4a31b's sweep and none on the grid's (c3216f4)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    results = root / "bench" / "results"
    after = results / "2026-12-06_h100_grouped_gemm_layers_fwd_sweep_seed1_7722882.json"
    before = results / "2026-12-06_h100_grouped_gemm_layers_sweep_ee4a31b.json"
    grid = results / "2026-12-05_h100_grouped_gemm_sweep_c3216f4.json"
    # the sdist leaves bench/results out but these (pyproject.toml, sdist.include)
    sdist_rules = (root / "pyproject.toml").read_text()
    assert all(f'"bench/results/{run.name}"' in sdist_rules for run in (after, before, grid))

    def tool(name, *args):
        return subprocess.run([sys.executable, str(root / "ci" / name), *map(str, args), "--narrow-memory"],
                              capture_output=True, text=True)

    assert tool("gg_pick_model.py", after).returncode == 0
    assert tool("gg_pick_model.py", before, "--rule-before").returncode == 0
    mismatch = tool("gg_pick_model.py", before)
    assert mismatch.returncode != 0 and "the mirrored rule chose 128x256" in mismatch.stderr
    out = tool("gg_rule_change.py", before, grid)
    assert out.returncode == 0, out.stderr
    changed = [line for line in out.stdout.splitlines() if "->" in line]
    assert len(changed) == 8 and all(line.split()[0] == "fwd" and "128x192 -> 128x256" in line for line in changed)
    assert "c3216f4.json: 52 rows, before x1.144, now x1.144" in out.stdout


def test_tile_rule_mirror_matches_the_host_rule():
    """ci/gg_pick_model.py's HostRule chooses the tile the extension's default choice binds
    (heuristics_sm90.hpp, through ``grouped_gemm_sm90_default_form``) on random sizes, fwd and
    dgrad, narrow memory or not, three SM counts: the tools that replay the rule on recorded runs
    replay the one that ships."""
    import importlib.util
    import random

    from cake_moe import _runtime
    path = pathlib.Path(__file__).resolve().parents[1] / "ci" / "gg_pick_model.py"
    spec = importlib.util.spec_from_file_location("gg_pick_model", path)
    mirror = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mirror)
    ext = _runtime.ext()
    rng = random.Random(87)
    for _ in range(3000):
        rows, groups = rng.randint(1, 1 << rng.randint(4, 20)), rng.randint(1, 300)
        n, k = 8 * rng.randint(1, 2048), 8 * rng.randint(1, 2048)
        op, narrow, sms = rng.choice((0, 1)), rng.random() < 0.5, rng.choice((132, 114, 78))
        want = mirror.HostRule(rows, groups, n if op == 0 else k, op == 1, narrow, sms).choose()
        got = ext.grouped_gemm_sm90_default_form(op, 0, groups, n, k, rows, False, sms, narrow)
        assert got == "gg_sm90_{}_{}x{}".format("fwd" if op == 0 else "dgrad", *want), (rows, groups, n, k, op, narrow, sms)


def test_gpu_script_deselects_tests_that_exist():
    """Every test ci/gpu.sh deselects is a test function of the module it names (a test moved to
    another module would otherwise run on the device, or a typo deselect nothing)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    ids = re.findall(r'--deselect\s+"([^"]+)"', (root / "ci" / "gpu.sh").read_text())
    assert ids, "ci/gpu.sh deselects nothing: update this test"
    for node_id in ids:
        path, _, name = node_id.partition("::")
        module = root / path
        assert module.is_file(), f"{node_id}: no module {path}"
        defined = {n.name for n in ast.parse(module.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert name.split("[")[0] in defined, f"{node_id}: {path} defines no such test"


def test_buildable_arches_agree():
    """The runtime's list of arches a build may name (its rebuild hint for an unserved device)
    is the build's own list (forms.py ALL_ARCHES, which CAKE_MOE_CUDA_ARCHS is checked against)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "cpp" / "kernels"))
    try:
        import forms
    finally:
        sys.path.pop(0)
    from cake_moe import _runtime
    assert _runtime.BUILDABLE_ARCHES == tuple(forms.ALL_ARCHES)
