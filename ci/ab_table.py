"""Markdown table of two columns of `ci/ab_forms.py` output: one build's (or form's) ratio over
torch._grouped_mm against another's, per grid row and pass, and their quotient.

    python ci/ab_table.py LOG_A[:FORM] LOG_B[:FORM] [--labels A,B]

LOG: the text `ab_forms.py` printed (any number of passes; `ci/ab.sh` keeps it as
$OUT/ab_<label>.log); FORM: the column to read ("default" unless given, e.g.
`ab_split.log:gg_sm90_wgrad_det`). Both logs must hold the same grid. Rows list the first
pass's torch time of LOG_A, each pass's ratio, and B / A of the ratios' means.
"""
import argparse
import math
import re

ROW = re.compile(r"(\w+)\s+N=\s*(\d+) K=\s*(\d+) E=\s*(\d+) T=\s*(\d+) (\w+)\s+torch\s+([\d.]+) us(.*)")
RATIO = re.compile(r"(\S+) x([\d.]+)")


def passes(path: str, form: str) -> list[dict]:
    """[{row key: (torch us, ratio of `form`)}] per pass; a pass ends at its geomean line."""
    out, cur = [], {}
    with open(path) as fh:
        for line in fh:
            m = ROW.match(line.strip())
            if m:
                ratios = dict((name, float(v)) for name, v in RATIO.findall(m.group(8)))
                if form not in ratios:
                    raise SystemExit(f"{path}: no column '{form}' in: {line.strip()}")
                cur[m.groups()[1:6]] = (float(m.group(7)), ratios[form])
            elif line.startswith("geomean") and cur:
                out.append(cur)
                cur = {}
    if cur:
        out.append(cur)
    if not out:
        raise SystemExit(f"{path}: no ab_forms rows")
    return out


def split_arg(arg: str) -> tuple[str, str]:
    path, _, form = arg.partition(":")
    return path, form or "default"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--labels", default="A,B")
    args = ap.parse_args()
    la, lb = args.labels.split(",")
    pa, pb = passes(*split_arg(args.a)), passes(*split_arg(args.b))
    print(f"| N | K | E | T | groups | rows / group | torch us | {la} x | {lb} x | {lb} / {la} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    logs = {la: [], lb: []}
    for key in pa[0]:
        ra = [p[key][1] for p in pa if key in p]
        rb = [p[key][1] for p in pb if key in p]
        if not rb:
            raise SystemExit(f"{args.b}: no row {key}")
        logs[la] += [math.log(v) for v in ra]
        logs[lb] += [math.log(v) for v in rb]
        n, k, e, t, kind = key
        q = (sum(rb) / len(rb)) / (sum(ra) / len(ra))
        print(f"| {n} | {k} | {e} | {t} | {kind} | {int(t) // int(e)} | {pa[0][key][0]:.1f} | "
              f"{', '.join(f'{v:.3f}' for v in ra)} | {', '.join(f'{v:.3f}' for v in rb)} | {q:.3f} |")
    print()
    print("geomean over torch (all passes): " +
          ", ".join(f"{name} x{math.exp(sum(v) / len(v)):.3f}" for name, v in logs.items()))


if __name__ == "__main__":
    main()
