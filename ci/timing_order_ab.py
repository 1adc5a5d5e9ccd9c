"""Do the order of the timed callables and a settling run before each one's samples move the
grouped-GEMM benchmark's ratios? Runs the grid's rows (`cake-moe bench grouped-gemm` as it is,
no sweep) under each timing configuration in turn, ``--pairs`` times: ORDER[:SETTLE_MS], ORDER
`rotate` (each callable always after the same one: ours after torch's) or `balanced`
(`timing.balanced_orders`), SETTLE_MS as `timing.time_interleaved`'s ``settle_ms``. Prints the
geomean over torch._grouped_mm per op, configuration and run.

usage: python ci/timing_order_ab.py [--tokens T ...] [--ops fwd,dgrad,wgrad] [--pairs 2]
       [--configs rotate,balanced,balanced:50] [--json PATH]
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
    ap.add_argument("--pairs", type=int, default=2, help="runs of every configuration, alternated")
    ap.add_argument("--configs", default="rotate,balanced")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    plain = timing.time_interleaved
    configs = args.configs.split(",")
    runs = []
    for _ in range(args.pairs):
        for config in configs:
            order, _, settle = config.partition(":")
            timing.time_interleaved = functools.partial(plain, order=order, settle_ms=float(settle or 0))
            rows = b.run(tuple(args.ops.split(",")), tokens=args.tokens)
            runs.append({"config": config, "rows": rows})
    timing.time_interleaved = plain
    for config in configs:
        for op in args.ops.split(","):
            geos = []
            for run in (r for r in runs if r["config"] == config):
                rs = [r["speedup_vs_torch"] for r in run["rows"] if r["op"] == op]
                geos.append(math.exp(sum(map(math.log, rs)) / len(rs)))
            print(f"{config:12} {op:5} geomean over torch per run: " + ", ".join(f"x{g:.3f}" for g in geos))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": timing.gpu_name(), "runs": runs}, fh, indent=1)


if __name__ == "__main__":
    main()
