"""Device time of grouped_mm's zeroing of the rows past the last group end: the fwd and dgrad
prepared launches with and without ``zero_unrouted_rows``, timed in interleaved rounds in one
process on the grid's layers (random imbalanced groups covering every row, so the zeroing
kernel finds no row to write: its cost is one launch whose CTAs read one offset and exit), and
once with 5% of the rows past the last end. Prints a markdown table; the bench/results file takes it.

    python ci/unrouted_rows_cost.py [--tokens 4096 16384] [--seed 1]
"""
import argparse

import torch

import cake_moe
from cake_moe.bench import grouped_gemm as bench
from cake_moe.bench import timing


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    print("| layer | op | T | rows past the end | plain us | zeroing us | ratio |")
    print("|---|---|---|---|---|---|---|")
    for (h, i, e), which in [(layer, w) for layer in bench.LAYERS for w in ("w13", "w2")]:
        n, k = bench.weight_nk(h, i, which)
        for t in args.tokens:
            for tail in (0, t // 20):
                gen = torch.Generator().manual_seed(args.seed * 1000 + t)
                cut = torch.sort(torch.randint(0, t - tail + 1, (e - 1,), generator=gen)).values
                ends = torch.cat([cut, torch.tensor([t - tail])]).to(torch.int32).cuda()
                x = torch.randn(t, k, device="cuda").bfloat16()
                g = torch.randn(t, n, device="cuda").bfloat16()
                w = (torch.randn(e, n, k, device="cuda") * 0.05).bfloat16()
                for op, a, prepare in (("fwd", x, cake_moe.prepare_grouped_gemm_fwd),
                                       ("dgrad", g, cake_moe.prepare_grouped_gemm_dgrad)):
                    plain = prepare(a, w, ends)
                    zeroing = prepare(a, w, ends, zero_unrouted_rows=True)
                    ms = timing.time_interleaved({"plain": plain.launch, "zeroing": zeroing.launch})
                    print(f"| {h},{i},{e} {which} | {op} | {t} | {tail} | {ms['plain'] * 1e3:.1f} | "
                          f"{ms['zeroing'] * 1e3:.1f} | {ms['zeroing'] / ms['plain']:.3f} |")


if __name__ == "__main__":
    main()
