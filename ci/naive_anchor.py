"""How the naive PyTorch layer of the family-B benchmark is timed, against PERF.md's anchor.

PERF.md anchors the "x30 at T = 1" target on a naive layer measured at the family-C geometry
(H=3584, I=384, E=896, top_k=16): 774 us at T = 1, 20.1 ms at T = 16384. This script times
`cake_moe.bench.mxfp4_moe.naive_layer` at that geometry three ways, so that the benchmark's
naive figure can be read against the anchor:

- graph:  CUDA-graph replay of many calls (what `cake-moe bench mxfp4-moe` reports);
- queued: eager calls back to back with the host running ahead (device time of eager calls);
- wall:   one eager call at a time, host clock from the call to the GPU's completion.

Then, at the family-B layouts and T = 1, the same three for the naive layer and for our
``plan.run()`` on the same inputs. Output: a markdown table on stdout (and ``--json``).
usage: python ci/naive_anchor.py [--json PATH]
"""
import argparse
import json

import torch

from cake_moe.bench import mxfp4_moe as b
from cake_moe.bench import timing

FAMILY_C = {"h": 3584, "i": 384, "e": 896, "k": 16}
ANCHOR_US = {1: 774.0, 16384: 20100.0}


def three_ways(fn, t: int) -> dict[str, float]:
    small = t <= b.GRAPH_MAX_T
    return {"graph_us": timing.time_graph(fn, calls=32, reps=10) * 1e3 if small else float("nan"),
            "queued_us": timing.time_cuda(fn, warmup=2, iters=8 if small else 2, reps=10) * 1e3,
            "wall_us": timing.time_wall(fn, reps=30 if small else 5) * 1e3}


def family_c(gen: torch.Generator) -> list[dict]:
    g = FAMILY_C
    w13 = (0.02 * torch.randn(g["e"], 2 * g["i"], g["h"], device="cuda", generator=gen)).to(torch.bfloat16)
    w2 = (0.02 * torch.randn(g["e"], g["h"], g["i"], device="cuda", generator=gen)).to(torch.bfloat16)
    beta, lbeta = b.random_situ(g["e"], gen)
    rows = []
    for t in ANCHOR_US:
        calls = []
        for _ in range(b.ROTATIONS if t <= b.ROTATE_MAX_T else 1):
            x, x_sf, ids, w = b.random_inputs(t, g["e"], 0, gen, h=g["h"], e=g["e"], k=g["k"])
            calls.append(lambda a=(x, x_sf, ids, w): b.naive_layer(*a, w13, w2, beta, lbeta, num_experts=g["e"],
                                                                    offset=0))
        rows.append({"geometry": "family C (PERF.md anchor)", "who": "naive", "T": t, **three_ways(timing.cycling(calls), t),
                     "anchor_us": ANCHOR_US[t]})
    return rows  # (its 7.4 GB of weights go with this frame)


def family_b(gen: torch.Generator) -> list[dict]:
    rows = []
    for layout in b.LAYOUTS:
        r = b.rank_layer(layout, gen, with_bf16=True)
        plans, naive, *_ = b._bind(1, r.runner, r.prepared, r.bank16, r.beta, r.linear_beta, gen, r.local, r.offset)
        for who, fns in (("ours", [p.run for p in plans]), ("naive", naive)):
            rows.append({"geometry": f"family B {layout}", "who": who, "T": 1, **three_ways(timing.cycling(fns), 1)})
        del r, plans, naive
        torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    out = [f"GPU: {timing.gpu_name()}", "",
           "| geometry | layer | T | graph replay (us) | eager, queued (us) | eager, one call (us) | PERF.md anchor (us) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        anchor = f"{r['anchor_us']:.0f}" if "anchor_us" in r else "-"
        out.append(f"| {r['geometry']} | {r['who']} | {r['T']} | {r['graph_us']:.1f} | {r['queued_us']:.1f} | "
                   f"{r['wall_us']:.1f} | {anchor} |")
    for layout in b.LAYOUTS:
        pair = {r["who"]: r for r in rows if r["geometry"] == f"family B {layout}"}
        if len(pair) == 2:
            o, n = pair["ours"], pair["naive"]
            out.append(f"\n{layout} T = 1, naive / ours: graph x{n['graph_us'] / o['graph_us']:.1f}, queued "
                       f"x{n['queued_us'] / o['queued_us']:.1f}, one eager call x{n['wall_us'] / o['wall_us']:.1f}, "
                       f"eager naive call over our graph replay x{n['wall_us'] / o['graph_us']:.1f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = family_c(gen)
    torch.cuda.empty_cache()
    rows += family_b(gen)
    print(markdown(rows), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
