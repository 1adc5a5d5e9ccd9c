"""Bound-experiment source trees: a copy of the committed sources in which the kernel statements
marked `// bound: WHAT` become empty statements, to time what a kernel costs without them (every
wgmma, the output stores) against the unchanged build in one device call:

    python ci/bound_tree.py ab/nomma --drop mma
    python ci/bound_tree.py ab/nostore --drop store
    python ci/bound_tree.py ab/noload --drop load   # family B mma.sync GEMMs: no stage copies
    python ci/bound_tree.py ab/now --drop wload     # ... no TMA weight tiles (nor their waits)
    python ci/bound_tree.py ab/nob --drop bload     # ... no token-row copies
    bash ci/ab.sh ab/main ab/nomma ab/nostore -- python3 $PWD/ci/ab_forms.py wgrad ""

(ab/main: `git archive HEAD | tar -x -C ab/main`.) A bound build computes wrong results: time
it, never test it. On the H200 (2026-12-01) this showed the wgrad at T = 4096 running at x1.29
over torch with no wgmma at all against x1.04 as built: the path between work units, not the
tensor pipe, set its time (docs/grouped_gemm_experiments.md).

usage: python ci/bound_tree.py DEST --drop WHAT[,WHAT...] [--rev REV]
"""
import argparse
import io
import pathlib
import re
import subprocess
import sys
import tarfile

MARK = re.compile(r"^(\s*)(.*?);\s*//\s*bound:\s*([\w,]+)\s*$")


def drop_marked(text: str, drop: set[str]) -> tuple[str, int]:
    """The text with every statement marked for one of `drop` replaced by an empty statement
    (`;`, so that an `if` or loop around it keeps its meaning), and how many were replaced."""
    out, n = [], 0
    for line in text.splitlines(keepends=True):
        m = MARK.match(line.rstrip("\n"))
        if m and drop & set(m.group(3).split(",")):
            out.append(f"{m.group(1)};  // bound: dropped {m.group(3)}\n")
            n += 1
        else:
            out.append(line)
    return "".join(out), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dest")
    ap.add_argument("--drop", required=True, help="comma list of marks, e.g. mma or store")
    ap.add_argument("--rev", default="HEAD")
    args = ap.parse_args()
    drop = set(args.drop.split(","))
    dest = pathlib.Path(args.dest)
    if dest.exists() and any(dest.iterdir()):
        sys.exit(f"{dest} exists and is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", args.rev], check=True, capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(dest, filter="data")
    total = 0
    for path in sorted((dest / "cpp" / "kernels").rglob("*.cuh")):
        text, n = drop_marked(path.read_text(), drop)
        if n:
            path.write_text(text)
            print(f"{path.relative_to(dest)}: {n} statement(s) dropped")
            total += n
    if total == 0:
        sys.exit(f"no statement is marked `// bound: {args.drop}`")


if __name__ == "__main__":
    main()
