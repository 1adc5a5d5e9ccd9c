"""One family-A grouped GEMM (or torch's peer of it) on random imbalanced groups, launched a few
times: the target for Nsight Compute, e.g.

    ncu -k regex:wgrad -s 1 -c 1 --section SpeedOfLight python ci/profile_gg.py wgrad 4096 7168 8 65536
    ncu -s 1 -c 1 --section SpeedOfLight python ci/profile_gg.py wgrad 4096 7168 8 65536 --torch

usage: python ci/profile_gg.py {fwd,dgrad,wgrad} N K E T [--torch] [--form FORM] [--runs R]
(N, K: the weight [E, N, K]; T: total rows; groups as in `cake-moe bench grouped-gemm`.)
"""
import argparse

import torch

from cake_moe.bench import grouped_gemm as b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=("fwd", "dgrad", "wgrad"))
    ap.add_argument("n", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("e", type=int)
    ap.add_argument("t", type=int)
    ap.add_argument("--torch", action="store_true", help="run torch._grouped_mm's kernel instead of ours")
    ap.add_argument("--form", default=None, help="force a form by name")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    _, offs, x, w, g = b._case(args.n, args.k, args.e, args.t, "random", 0)
    make, peer = b.op_callables(args.op, x, w, g, offs)
    fn = peer if args.torch else make(args.form or "").launch
    for _ in range(args.runs):
        fn()
    torch.cuda.synchronize()
    print(f"{args.op} N={args.n} K={args.k} E={args.e} T={args.t} {'torch' if args.torch else 'ours'}: done")


if __name__ == "__main__":
    main()
