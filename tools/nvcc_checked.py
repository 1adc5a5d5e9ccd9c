"""Run one nvcc kernel compile with ptxas's report on, and fail on what silently costs speed.

usage: python tools/nvcc_checked.py NVCC [ARGS ...]

ptxas reports some performance losses only as info lines under `-v`, and the build would pass
with them: "wgmma.mma_async instructions are serialized" (C7510/C7519/...: a wgmma pipeline
ptxas could not prove safe, e.g. wgmmas behind a divergent branch) costs a sm_90a GEMM 20% or
more. This wrapper adds `-Xptxas=-v`, prints ptxas's warnings and those lines (not its per-
function resource lines), removes the output and exits 1 when any such loss is reported.
"""
from __future__ import annotations

import os
import subprocess
import sys

# ptxas info lines that mark a silent slowdown: the whole-pipeline wgmma serialization
LOSS_MARKERS = ("Potential Performance Loss",)


def _output_path(args: list[str]) -> str | None:
    """The output file of `-o FILE`, `--output-file FILE` or `--output-file=FILE` (not a prefix
    match: nvcc's `-odir` names a directory)."""
    for i, a in enumerate(args):
        if a in ("-o", "--output-file") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--output-file="):
            return a.split("=", 1)[1]
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    proc = subprocess.run([*argv, "-Xptxas=-v"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    losses = []
    for line in proc.stdout.splitlines():
        if any(m in line for m in LOSS_MARKERS):
            losses.append(line)
            print(line)
        elif not line.startswith("ptxas info") and not line.lstrip().startswith(("0 bytes stack frame", "Compile time")):
            print(line)
    if proc.returncode != 0:
        return proc.returncode
    if losses:
        out = _output_path(argv)
        if out and os.path.exists(out):
            os.remove(out)
        print(f"nvcc_checked: {len(losses)} ptxas performance loss report(s) above: the kernel would "
              "build but run slow; restructure it (e.g. no divergent path around wgmmas)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
