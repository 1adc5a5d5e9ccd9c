"""Markdown table of family-B kernel times from several builds: the logs `ci/ab.sh` keeps
($OUT/ab_<label>.log) of a command that ran `ci/profile_moe.py LAYOUT T ... --kernel-times`.

    python ci/ab_kernel_times.py DIR LABEL [LABEL ...] [--base LABEL[,LABEL]] [--min-us 50]

One row per (layout, T, kernel) and "all kernels" per (layout, T); one column per label. With
--base, one more column per other label: its change against the mean of the base labels (name
the baseline twice in ab.sh, e.g. main and main_2, and both here: their spread is the noise).
Kernels below --min-us in every build are left out (routing, dequantize).
"""
from __future__ import annotations

import argparse
import pathlib
import re

CASE = re.compile(r"^(\S+) T=(\d+) \([^)]*\): ([\d.]+) us of kernels per run")
KERNEL = re.compile(r"^\s+([\d.]+) us\s+[\d.]+%\s+(\S+)")
ALL = "all kernels"
PREFIX = "cake_mxfp4_moe_"


def kernel_times(path: pathlib.Path) -> dict[tuple[str, int, str], float]:
    """{(layout, T, kernel): us} of one log; a case printed twice keeps its last run."""
    out: dict[tuple[str, int, str], float] = {}
    case = None
    for line in path.read_text().splitlines():
        m = CASE.match(line)
        if m:
            case = (m.group(1), int(m.group(2)))
            out[(*case, ALL)] = float(m.group(3))
            continue
        m = KERNEL.match(line)
        if m and case is not None:
            out[(*case, m.group(2).removeprefix(PREFIX))] = float(m.group(1))
        elif line.strip() and not line.startswith(" "):
            case = None   # any other top-level line ends the case's kernel list
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=pathlib.Path)
    ap.add_argument("labels", nargs="+")
    ap.add_argument("--base", default=None, help="comma-separated labels whose mean the others are compared with")
    ap.add_argument("--min-us", type=float, default=50.0)
    args = ap.parse_args()
    runs = {}
    for label in args.labels:
        path = args.dir / f"ab_{label}.log"
        if not path.is_file():
            raise SystemExit(f"{path}: no such log (labels are the tree names ab.sh printed)")
        runs[label] = kernel_times(path)
        if not runs[label]:
            raise SystemExit(f"{path}: no `profile_moe.py --kernel-times` output")
    base = args.base.split(",") if args.base else []
    unknown = [b for b in base if b not in runs]
    if unknown:
        raise SystemExit(f"--base {','.join(unknown)}: not among the labels")
    others = [label for label in args.labels if label not in base]
    keys = sorted({k for r in runs.values() for k in r}, key=lambda k: (k[0], k[1], k[2] == ALL, k[2]))
    head = ["case", "kernel", *args.labels] + [f"{o} vs base" for o in others if base]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in keys:
        vals = [runs[label].get(key) for label in args.labels]
        if max((v for v in vals if v is not None), default=0.0) < args.min_us:
            continue
        cells = [f"{v:.1f}" if v is not None else "-" for v in vals]
        if base:
            ref = [runs[b][key] for b in base if key in runs[b]]
            mean = sum(ref) / len(ref) if ref else None
            for o in others:
                v = runs[o].get(key)
                cells.append(f"{100 * (v / mean - 1):+.1f}%" if v is not None and mean else "-")
        print(f"| {key[0]} {key[1]} | {key[2]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
