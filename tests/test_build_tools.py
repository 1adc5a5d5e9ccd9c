"""The kernel build's compile wrapper (tools/nvcc_checked.py) on a stand-in compiler."""
from __future__ import annotations

import pathlib
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
