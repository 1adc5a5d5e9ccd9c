"""Interleaved timing of grouped-GEMM forms against torch._grouped_mm on the benchmark grid.

Each row's callables (torch's peer and every named form) are timed in interleaved rounds
(`timing.time_interleaved`), so clock and power drift during the run falls on all of them alike.

usage: python ci/ab_forms.py OP FORM[,FORM...] [--rounds R] [--json PATH] [--tokens T ...] [--seed S]
       [--layers H,I,E ...] [--order balanced|rotate]
  OP: fwd, dgrad or wgrad (det); FORM: as `prepare_grouped_gemm_*(form=...)` takes it, optionally
  prefixed with NAME=VALUE: to prepare it with that environment variable set (a switch read when
  a launch is prepared, e.g. CAKE_MOE_GG_SPLIT_TAIL=0:gg_sm90_fwd_128x256).
  --tokens / --seed: the grid's layers at other token counts / other group draws, as
  `cake-moe bench grouped-gemm` takes them (a tile rule for small T is checked this way).
  --layers: other layers' rows in place of the grid's layers, as the benchmark's --layers.
  --order: the rounds' orders (`timing.time_interleaved`); --rounds defaults to one full design.
"""
import argparse
import json
import math
import os

from cake_moe.bench import grouped_gemm as b
from cake_moe.bench import timing
from cake_moe.cli import _gg_layer


def prepared(make, entry: str):
    """The launch of one FORM entry: `make(form)`, under the entry's NAME=VALUE: prefix if any."""
    env, sep, form = entry.rpartition(":") if "=" in entry.split(":")[0] else ("", "", entry)
    if not sep:
        return make(form)
    name, _, value = env.partition("=")
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return make(form)
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=("fwd", "dgrad", "wgrad"))
    ap.add_argument("forms", help="comma list; an empty entry is the default choice")
    ap.add_argument("--rounds", type=int, default=None, help="default: one balanced design (timing.balanced_orders)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tokens", type=int, nargs="+", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=_gg_layer, nargs="+", default=None, metavar="H,I,E")
    ap.add_argument("--order", choices=("balanced", "rotate"), default="balanced")
    args = ap.parse_args()
    forms = args.forms.split(",")
    rows, logs = [], {f or "default": [] for f in forms}
    for (h, i, e, which, n, k, t, kind), (_, offs, x, w, g) in b.cases(args.tokens, args.seed, args.layers):
        make, peer = b.op_callables(args.op, x, w, g, offs)
        fns = {"torch": peer, **{f or "default": prepared(make, f).launch for f in forms}}
        med = timing.time_interleaved(fns, rounds=args.rounds, order=args.order)
        names = list(fns)
        row = {"op": args.op, "layer": [h, i, e], "weight": which, "N": n, "K": k, "E": e, "T": t, "groups": kind,
               "ms": med}
        rows.append(row)
        ratios = {name: med["torch"] / med[name] for name in names[1:]}
        for name, v in ratios.items():
            logs[name].append(math.log(v))
        print(f"{args.op:5} N={n:5} K={k:5} E={e:3} T={t:6} {kind:6} torch {med['torch'] * 1e3:8.1f} us  " +
              "  ".join(f"{name} x{v:.3f}" for name, v in ratios.items()), flush=True)
        del x, w, g
    print("geomean over torch: " + ", ".join(f"{name} x{math.exp(sum(v) / len(v)):.3f}" for name, v in logs.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": timing.gpu_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
