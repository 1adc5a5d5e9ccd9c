"""Where a kernel's warps stall, by SASS line and by opcode, from Nsight Compute's source page.

    ncu -k regex:NAME -s 1 -c 1 --section WarpStateStats --section SourceCounters -o REP python ...
    ncu --import REP.ncu-rep --page source --csv --print-source sass > REP.csv
    python ci/ncu_stalls.py REP.csv

Prints the share of all warp-stall samples per opcode and the top SASS lines, and the share of
the samples between the kernel's first and last HGMMA (the wgmma mainloop) and from its first
to its last STG (the store epilogue), when it has those instructions.
"""
import csv
import sys


def load(path: str) -> list[tuple[float, str]]:
    rows = list(csv.reader(open(path, errors="replace")))
    head = next(i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r))
    samples = next(i for i, c in enumerate(rows[head]) if "Warp Stall Sampling (All" in c)
    source = next(i for i, c in enumerate(rows[head]) if c.strip() == "Source")
    lines = []
    for r in rows[head + 1:]:
        try:
            lines.append((float(r[samples].replace(",", "") or 0), r[source].strip()))
        except (ValueError, IndexError):
            continue
    return lines


def opcode(src: str) -> str:
    words = src.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main(path: str) -> None:
    lines = load(path)
    total = sum(n for n, _ in lines) or 1.0
    print(f"{len(lines)} SASS lines, {total:.0f} stall samples")
    by_op: dict[str, float] = {}
    for n, src in lines:
        by_op[opcode(src)] = by_op.get(opcode(src), 0.0) + n
    for op, n in sorted(by_op.items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {op:12s} {100 * n / total:5.1f}%")
    for name, op in (("mainloop (first .. last HGMMA)", "HGMMA"), ("epilogue (first .. last STG)", "STG")):
        at = [i for i, (_, src) in enumerate(lines) if opcode(src) == op]
        if at:
            share = sum(n for n, _ in lines[at[0]:at[-1] + 1]) / total
            print(f"{name}: {100 * share:.1f}% of the samples over {at[-1] - at[0] + 1} lines")
    for n, src in sorted(lines, key=lambda d: -d[0])[:20]:
        print(f"{100 * n / total:5.1f}%  {src[:90]}")


if __name__ == "__main__":
    main(sys.argv[1])
