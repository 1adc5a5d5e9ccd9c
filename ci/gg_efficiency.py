"""Tile-level efficiency of a grouped-GEMM benchmark run: for each fwd / dgrad row, the tiles of
the form it ran, the fraction of the last wave that is busy and the fraction of tile rows that
are real rows (a group's last M tile is padded), next to the measured fraction of dense cuBLAS,
and what a last wave cut along N would give: where the last wave holds r <= SMs / 2 tiles of
BN = 256, each cut into two BN = 128 halves (no partial sums, so the bits stay), the kernel
takes F + 0.5 x (a 128x128 tile's time per FLOP over a 128x256 tile's) tile times instead of
F + 1 (the per-wave factors of heuristics_sm90.hpp); the geomean of those row gains closes the
table.

usage: python ci/gg_efficiency.py bench/results/<run>.json [--sms 132]
The group sizes are the ones the run recorded (older grid runs: the grid's, redrawn with the same
generator and seed per row); runs on the CPU.
"""
import argparse
import json
import math

from cake_moe.bench import grouped_gemm as b

# A 128x128 tile's time per FLOP over a 128x256 tile's (heuristics_sm90.hpp: 1.0 / 0.93).
HALF_TILE_PER_FLOP = 1.0 / 0.93


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args()
    cases = list(enumerate(b._rows()))
    print(f"{'op':5} {'N':>5} {'K':>5} {'E':>2} {'T':>6} {'tile':>7} {'tiles':>6} {'waves':>6} "
          f"{'last wave':>9} {'real rows':>9} {'product':>7} {'of dense':>8} {'N-split':>7}")
    data = json.load(open(args.results))
    split_gain = {"fwd": [], "dgrad": []}
    for r in data["rows"] if isinstance(data, dict) else data:
        if r["op"] not in ("fwd", "dgrad"):
            continue
        e, n, k, t = int(r["layer"][2]), r["N"], r["K"], r["T"]
        if "sizes" in r:  # recorded by the benchmark since 2026-12-04 (any --tokens / --seed)
            sizes = r["sizes"]
        else:  # older grid runs: redraw the grid's sizes
            idx, (_, _, _, _, n, k, t, kind) = next(
                c for c in cases if c[1][4:8] == (r["N"], r["K"], r["T"], r["groups"]) and c[1][2] == e)
            sizes = b._sizes(t, e, kind, idx)
        bm, bn = map(int, r["form"].rsplit("_", 1)[1].split("x"))
        n_out = n if r["op"] == "fwd" else k
        m_tiles = sum(math.ceil(s / bm) for s in sizes)
        tiles = m_tiles * math.ceil(n_out / bn)
        waves = tiles / args.sms
        busy = waves / math.ceil(waves)
        real = t / (m_tiles * bm)
        full, last = divmod(tiles, args.sms)
        gain = 1.0
        if bm == 128 and bn == 256 and 0 < 2 * last <= args.sms:
            gain = (full + 1) / (full + 0.5 * HALF_TILE_PER_FLOP)
        split_gain[r["op"]].append(gain)
        print(f"{r['op']:5} {n:5} {k:5} {e:2} {t:6} {bm}x{bn:<3} {tiles:6} {waves:6.2f} {busy:9.2f} "
              f"{real:9.2f} {busy * real:7.2f} {r['fraction_of_dense']:8.2f} {gain:7.3f}")
    for op, gains in split_gain.items():
        if gains:
            print(f"{op}: a last wave cut along N, modeled geomean gain x{math.prod(gains) ** (1 / len(gains)):.4f}")


if __name__ == "__main__":
    main()
