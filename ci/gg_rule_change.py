"""What the fwd / dgrad tile rule's many-wave clause (kSm90ManyWaves in heuristics_sm90.hpp,
mirrored in gg_pick_model.py) changes on benchmark runs made with ``--sweep`` (every sm_90a tile
timed on every row): per run, the geomean speed-up over torch._grouped_mm of the tiles the rule
chose before it and now, and each row whose tile changed, with the measured time ratio.

usage: python ci/gg_rule_change.py bench/results/<run>_sweep.json ... [--narrow-memory] [--sms 132]
       [--clause-wide]  (the wide-memory rule as it is against the clause added to it as well)
Runs on the CPU.
"""
import argparse
import json

from gg_pick_model import HostRule, geomean


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--narrow-memory", action="store_true", help="the H100's constants")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--clause-wide", action="store_true",
                    help="on wide-memory runs: the rule now against the rule with the clause added")
    args = ap.parse_args()
    if args.clause_wide and args.narrow_memory:
        raise SystemExit("--clause-wide asks about wide-memory runs: leave out --narrow-memory")
    name = "{}x{}".format
    # the two rules compared: before = the rule of the runs (without the many-wave clauses), now =
    # with them; under --clause-wide, the wide rule as it stands against it with the fwd clause added
    rules = {True: {"before": not args.clause_wide}, False: {"clause_wide": args.clause_wide}}
    for path in args.results:
        data = json.load(open(path))
        rows = [r for r in (data["rows"] if isinstance(data, dict) else data)
                if r["op"] in ("fwd", "dgrad") and r.get("tiles_ms")]
        speedups: dict = {False: [], True: []}
        for r in rows:
            n_out = r["N"] if r["op"] == "fwd" else r["K"]
            tile = {before: name(*HostRule(sum(r["sizes"]), len(r["sizes"]), n_out, r["op"] == "dgrad",
                                           args.narrow_memory, args.sms, **kw).choose())
                    for before, kw in rules.items()}
            for before, t in tile.items():
                speedups[before].append(r["torch_ms"] / r["tiles_ms"][t])
            if tile[True] != tile[False]:
                print(f"  {r['op']:5} {str(r['layer']):17} {r['weight']:3} T={r['T']:6} {tile[True]:>7} -> "
                      f"{tile[False]:>7}: x{r['tiles_ms'][tile[True]] / r['tiles_ms'][tile[False]]:.3f}")
        if rows:
            print(f"{path.rsplit('/', 1)[-1]}: {len(rows)} rows, before x{geomean(speedups[True]):.3f}, "
                  f"now x{geomean(speedups[False]):.3f}")


if __name__ == "__main__":
    main()
