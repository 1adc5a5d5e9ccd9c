"""Does the order of the timed callables move the grouped-GEMM benchmark's ratios? Runs the
grid's rows (`cake-moe bench grouped-gemm` as it is, no sweep) under each order of
`timing.time_interleaved` in turn, ``--pairs`` times: `rotate` (each callable always after the
same one: ours after torch's) and `balanced` (`timing.balanced_orders`). Prints the geomean
over torch._grouped_mm per op, order and run.

usage: python ci/timing_order_ab.py [--tokens T ...] [--ops fwd,dgrad,wgrad] [--pairs 2] [--json PATH]
"""
import argparse
import functools
import json
import math

from cake_moe.bench import grouped_gemm as b
from cake_moe.bench import timing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[65536])
    ap.add_argument("--ops", default="fwd,dgrad,wgrad")
    ap.add_argument("--pairs", type=int, default=2, help="runs of each order, alternated")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    plain = timing.time_interleaved
    orders = ("rotate", "balanced")
    runs = []
    for _ in range(args.pairs):
        for order in orders:
            timing.time_interleaved = functools.partial(plain, order=order)
            rows = b.run(tuple(args.ops.split(",")), tokens=args.tokens)
            runs.append({"order": order, "rows": rows})
    timing.time_interleaved = plain
    for order in orders:
        for op in args.ops.split(","):
            geos = []
            for run in (r for r in runs if r["order"] == order):
                rs = [r["speedup_vs_torch"] for r in run["rows"] if r["op"] == op]
                geos.append(math.exp(sum(map(math.log, rs)) / len(rs)))
            print(f"{order:8} {op:5} geomean over torch per run: " + ", ".join(f"x{g:.3f}" for g in geos))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": timing.gpu_name(), "runs": runs}, fh, indent=1)


if __name__ == "__main__":
    main()
