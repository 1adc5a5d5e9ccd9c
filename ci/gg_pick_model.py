"""What a device-side choice between two grouped-GEMM tile forms would gain, from a benchmark run
made with ``--sweep`` (every sm_90a tile timed on every row, the group sizes recorded).

For each fwd / dgrad row: the host's tile (the rule of heuristics_sm90.hpp, mirrored below: keep
the two in step), the runner-up by the host's modelled cost, and, where the runner-up's cost is
within ``--ratio`` of the chosen one's, the form of the two whose cost is lower on the row's
actual sizes (the choice both kernels of a pair would make on the device). The paired row's time
is that form's measured time plus ``--launch-us`` (the kernel of the pair that does not run still
launches and exits). Prints the geomean over torch._grouped_mm both ways and the rows that move
by more than 3%.

usage: python ci/gg_pick_model.py bench/results/<run>_sweep.json [--launch-us 1.0] [--ratio 1.1]
       [--narrow-memory] [--rule-before] [--sms 132]
Runs on the CPU.
"""
import argparse
import json
import math

TILES = [(128, 128), (128, 256), (64, 128), (128, 192)]
MANY_WAVES = 30   # kSm90ManyWaves


def wave_cost(bm: int, bn: int, narrow: bool) -> float:
    """A wave of this tile against a wave of 128x128 tiles (sm90_wave_width x sm90_wave_per_flop)."""
    if bm == 64:
        return 0.8
    per_flop = {256: 0.85 if narrow else 0.93, 192: 0.80 if narrow else 0.87}.get(bn, 1.0)
    return bn / 128.0 * per_flop


def geomean(values: list) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def waves(m_tiles: float, n_out: int, bn: int, sms: int) -> int:
    return math.ceil(m_tiles * ((n_out + bn - 1) // bn) / sms)


class HostRule:
    """choose_sm90_tile for one row: the host knows the row count and the group count only."""

    def __init__(self, rows: int, groups: int, n_out: int, dgrad: bool, narrow: bool, sms: int,
                 before: bool = False, clause_wide: bool = False):
        self.rows, self.groups, self.n_out, self.dgrad, self.sms = rows, groups, n_out, dgrad, sms
        self.per_group = rows // groups
        self.small = self.per_group < 48
        self.narrow = narrow and not self.small
        self.margin_192 = 0.9 if self.per_group < 300 else 0.85
        # the fwd chooses 128x256 by the wave cost as the dgrad does where memory is narrow and
        # 128x128 takes many waves (kSm90ManyWaves); clause_wide: the same where it is wide too
        # (a question put to the wide-memory sweeps, not the host's rule)
        many = not before and self.cost(TILES[0]) >= MANY_WAVES
        self.by_cost = dgrad or (many and (self.narrow or (clause_wide and not self.small)))

    def cost(self, t) -> float:
        m_tiles = self.rows / t[0] + 0.5 * self.groups
        if self.small:
            m_tiles = max(m_tiles, self.groups)
        return waves(m_tiles, self.n_out, t[1], self.sms) * wave_cost(t[0], t[1], self.narrow)

    def weighed(self, t, cost: float) -> float:
        """A cost as the rule weighs it: 128x192 must win by its margin."""
        return cost / self.margin_192 if t == (128, 192) and not self.small else cost

    def choose(self):
        if self.small:
            return TILES[3] if self.cost(TILES[3]) < self.cost(TILES[2]) else TILES[2]
        best = TILES[0]
        wide_rows = 1024 if self.narrow else 2048
        wide = self.cost(TILES[1]) < self.cost(best) if self.by_cost else (self.per_group >= wide_rows and self.n_out >= 512)
        if wide:
            best = TILES[1]
        if self.per_group < 1024 and self.cost(TILES[3]) < self.margin_192 * self.cost(best):
            best = TILES[3]
        return best

    def runner_up(self, chosen):
        # where the fwd takes 128x256 by group size, not by cost (choose), it is no runner-up
        others = [t for t in TILES if t != chosen and (self.by_cost or t != (128, 256))]
        return min(others, key=lambda t: self.weighed(t, self.cost(t)))

    def device_cost(self, t, sizes) -> float:
        m_tiles = sum((s + t[0] - 1) // t[0] for s in sizes)
        return self.weighed(t, waves(m_tiles, self.n_out, t[1], self.sms) * wave_cost(t[0], t[1], self.narrow))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--launch-us", type=float, default=1.0)
    ap.add_argument("--ratio", type=float, default=1.1)
    ap.add_argument("--narrow-memory", action="store_true", help="the H100's constants")
    ap.add_argument("--rule-before", action="store_true", help="the rule of runs made before kSm90ManyWaves")
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args()
    data = json.load(open(args.results))
    rows = data["rows"] if isinstance(data, dict) else data
    name = "{}x{}".format
    for op in ("fwd", "dgrad"):
        before, after = [], []
        for r in rows:
            if r["op"] != op or not r.get("tiles_ms"):
                continue
            n_out = r["N"] if op == "fwd" else r["K"]
            rule = HostRule(sum(r["sizes"]), len(r["sizes"]), n_out, op == "dgrad", args.narrow_memory, args.sms,
                            args.rule_before)
            chosen = rule.choose()
            if not r["form"].endswith(name(*chosen)):
                raise SystemExit(f"the mirrored rule chose {name(*chosen)} where the run chose {r['form']}: "
                                 "check --narrow-memory and --sms against the run's GPU")
            alt = rule.runner_up(chosen)
            t_chosen = r["tiles_ms"][name(*chosen)]
            t_paired, picked = t_chosen, None
            if rule.weighed(alt, rule.cost(alt)) <= args.ratio * rule.weighed(chosen, rule.cost(chosen)):
                picked = min((chosen, alt), key=lambda t: rule.device_cost(t, r["sizes"]))
                t_paired = r["tiles_ms"][name(*picked)] + args.launch_us / 1000.0
            before.append(r["torch_ms"] / t_chosen)
            after.append(r["torch_ms"] / t_paired)
            if abs(after[-1] / before[-1] - 1) > 0.03:
                print(f"  {op:5} {str(r['layer']):16} {r['weight']:3} T={r['T']:6} {name(*chosen):>7} "
                      f"-> {name(*picked) if picked else '-':>7}: x{before[-1]:.2f} -> x{after[-1]:.2f}")
        if before:
            print(f"{op}: {len(before)} rows, host tile x{geomean(before):.3f}, paired x{geomean(after):.3f}; "
                  f"worst x{min(before):.2f} -> x{min(after):.2f}")


if __name__ == "__main__":
    main()
