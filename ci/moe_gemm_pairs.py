"""Family B: time the layer with each (GEMM1, GEMM2) form pair of one token-tile size, on the
same inputs, in interleaved rounds in one process (their orders from `timing.balanced_orders`;
the pairs the decision table does not bind together included), and check each pair's output
against the table's own plan.

    python ci/moe_gemm_pairs.py ep8 1 2 --pairs n8_narrow/n8_narrow,n8_narrow/n8 --rounds 4
    python ci/moe_gemm_pairs.py tp8 1 2 4 --env CAKE_MOE_UNIT_QUEUE=0

`--env NAME=VALUE[,NAME=VALUE...]` (repeatable) adds the table's pair planned with those
environment variables set (the host reads its switches at plan time), for same-build
comparisons of a switch. `--tiles A,B` adds plans with the tile form forced (`plan(tile=)`: one
pair, no device choice between two), e.g. the cost of that choice:

    python ci/moe_gemm_pairs.py tp8 4096 16384 --tiles wg96x4,wg160x3 --rotations 1

`--alts A+B,...` adds plans whose decision names sm_90a forms A and B as its two forms (both
pairs bound; the routing kernel chooses between them, or lists each expert's last tile on the
narrower, as for the table's own two), e.g. a second form the table does not offer:

    python ci/moe_gemm_pairs.py ep8 6144 8192 --alts wg128x4+wg160x3,wg160x3+wg32x4 --rotations 1

A pair is GEMM1_SUFFIX/GEMM2_SUFFIX (see `_decide.gemm_tiles`); both must share a block_n. A
pair or a `--tiles` form may end in `+sync` or `+nosync`: the per-tile GEMM1 -> GEMM2 sync forced
on or off (else the table's rule for it). LAYOUT is ep8, tp8 or `layer` with `--layer E,K,H,I`
and its rank (ci/layer_args.py), e.g. a small-intermediate layer's GEMM2 forms at decode:

    python ci/moe_gemm_pairs.py layer 1 2 --layer 128,8,2048,768 --pairs n8_narrow/n8_narrow+nosync

Rows
use the benchmark's inputs and weights (`cake_moe.bench.mxfp4_moe`), eight routings rotated
(`--rotations`), timed as the benchmark times its rows (one CUDA graph up to T = 1024, eager
launches beyond; `--graph`: one graph at every T, whose rounds spread less; past T = 1024 a
graph of 8 calls replayed 5 times per round), and report time, the fraction of the copy
bandwidth measured in the same run, the relative difference to the table's plan (different
K splits sum in another order: a few 1e-3 at most, much more means a broken pair; the sm_90a
wgmma forms give the same bits), and the tile forms the routings ran (``plan.last_tile()``:
one of a decision's two forms, or both, the width per expert).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

import torch

from cake_moe.bench import mxfp4_moe as bench
from cake_moe.bench import timing
from cake_moe.mxfp4_moe import _decide, _tile_cost

import layer_args  # (ci/: LAYOUT and --layer)


def _routed_experts(ids: torch.Tensor, offset: int, l: int) -> int:
    local = ids.long() - offset
    return local[(local >= 0) & (local < l)].unique().numel()


def _gemm_forms(forms: str) -> str:
    """The GEMM launches a plan binds, by form suffix (two pairs bound: four)."""
    return ",".join(f.removeprefix("mxfp4_moe_") for f in forms.split(", ") if f.startswith("mxfp4_moe_gemm"))


def _relative_diff(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """||got - ref|| / ||ref|| over all rotations, one output at a time (a cat in FP64 of eight
    T = 8192 outputs would take GBs), NaN where an output holds a non-finite value."""
    num = den = 0.0
    for g, r in zip(got, ref):
        if not torch.isfinite(g).all():
            return float("nan")
        num += float((g.float() - r.float()).square().sum())
        den += float(r.float().square().sum())
    return (num / den) ** 0.5


def _synced(text: str) -> tuple[str, bool | None]:
    """A pair or tile form with its sync suffix, read as the benchmark reads its ``--tiles``
    entries (`bench._variant`): ``X+sync`` -> (X, True), ``X+nosync`` -> (X, False), ``X`` ->
    (X, None: the table's rule)."""
    try:
        form, sync = bench._variant(text)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if form is None:
        raise SystemExit(f"{text!r}: name a GEMM pair or a tile form")
    return form, sync


def _two_forms(runner, tile: str, alt: str):
    """A stand-in for ``runner.decide`` whose decisions name ``tile`` and ``alt`` as their two
    sm_90a forms (the GEMM kernels of both in the decision's order), the rest the table's."""
    if tile not in _decide.SM90_TILES or alt not in _decide.SM90_TILES or tile == alt:
        raise SystemExit(f"--alts {tile}+{alt}: two different sm_90a forms of {_decide.SM90_TILES}")
    table = type(runner).decide

    def decide(num_tokens, **kw):
        d = table(runner, num_tokens, **kw)
        (g1, g2), (a1, a2) = (_decide.gemm_forms(f, runner.hidden_size, runner.intermediate_shard,
                                                    routes=num_tokens * runner.top_k)
                              for f in (tile, alt))
        forms = (_decide.DEQUANT_FORM, _decide.ROUTE_FORM, g1, a1, g2, a2, _decide.FINALIZE_FORM)
        return dataclasses.replace(d, reason=f"forced: {tile} or {alt}, as the device finds cheaper", path="forced",
                                   block_n=_tile_cost.BLOCK_N_OF[tile], tile=tile, alt_tile=alt, forms=forms,
                                   tile_sync=False)
    return decide


def main() -> None:
    ap = argparse.ArgumentParser()
    layer_args.add(ap)
    ap.add_argument("tokens", type=int, nargs="+")
    ap.add_argument("--pairs", default="", help="comma list of GEMM1/GEMM2 form suffixes")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE[,NAME=VALUE...]: the table's pair planned with them set")
    ap.add_argument("--tiles", default="", help="comma list of tile forms, each planned forced")
    ap.add_argument("--alts", default="", help="comma list of A+B: sm_90a forms planned as a decision's two forms")
    ap.add_argument("--rounds", type=int, default=None, help="default: one balanced design, at least 4 rounds")
    ap.add_argument("--rotations", type=int, default=bench.ROTATIONS, help="routings per variant (one graph)")
    ap.add_argument("--graph", action="store_true",
                    help=f"time every row graph-replayed (the benchmark graphs T <= {bench.GRAPH_MAX_T} "
                         "only): tighter rounds for same-process comparisons at large T")
    args = ap.parse_args()
    spec = layer_args.spec(ap, args)
    # (kind or GEMM1 suffix, value or GEMM2 suffix, sync: None for the table's rule)
    pairs = [(*form.split("/"), sync) for form, sync in map(_synced, filter(None, args.pairs.split(",")))]
    pairs += [("table", env, None) for env in args.env]
    pairs += [("tile", *_synced(tile)) for tile in args.tiles.split(",") if tile]
    pairs += [("alts", alts, None) for alts in args.alts.split(",") if alts]
    copy_bw = timing.copy_bandwidth(1 << 30)
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = bench.rank_layer(spec, gen)
    l, offset, i_shard = r.local, r.offset, r.i_shard
    runner, prepared, beta, lbeta = r.runner, r.prepared, r.beta, r.linear_beta
    h = runner.hidden_size
    name_of_layer = bench.layer_of(spec).name
    table_tiles = _decide.gemm_tiles
    print(f"copy {copy_bw / 1e12:.2f} TB/s", flush=True)
    for t in args.tokens:
        inputs = [bench.runner_inputs(t, runner, gen) for _ in range(args.rotations)]
        experts = statistics.mean(_routed_experts(ids, offset, l) for _, _, ids, _ in inputs)
        nbytes = experts * bench.expert_bytes(i_shard, h)
        calls, outs, bound = {}, {}, {}
        for pair in [("table", "", None)] + pairs:
            _decide.gemm_tiles = (table_tiles if pair[0] in ("table", "tile", "alts")
                                  else (lambda *_a, p=pair, **_k: p[:2]))
            if pair[0] == "alts":
                runner.decide = _two_forms(runner, *pair[1].split("+"))
            env = dict(kv.split("=", 1) for kv in pair[1].split(",")) if pair[0] == "table" and pair[1] else {}
            saved = {name: os.environ.get(name) for name in env}
            os.environ.update(env)
            bound[pair], outs[pair] = [], []
            for x, x_sf, ids, w in inputs:
                out = torch.full((t, h), float("nan"), dtype=torch.bfloat16, device="cuda")
                ws = torch.empty(runner.get_workspace_size(t), dtype=torch.uint8, device="cuda")
                # a forced pair binds no second form: it is planned at the table's tile, forced
                tile = pair[1] if pair[0] == "tile" else None if pair[0] in ("table", "alts") else runner.decide(t).tile
                bound[pair].append(runner.plan(x, x_sf, ids, w, prepared, beta=beta, linear_beta=lbeta,
                                               workspace=ws, output=out, tile=tile, tile_sync=pair[2]))
                outs[pair].append(out)
            calls[pair] = timing.cycling([plan.run for plan in bound[pair]])
            vars(runner).pop("decide", None)
            for name, value in saved.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
        _decide.gemm_tiles = table_tiles
        times = {pair: [] for pair in calls}
        names = list(calls)
        for round_order in timing.round_orders(len(names), args.rounds):
            for pair in (names[i] for i in round_order):
                n = 48 if len(inputs) > 1 else 20
                if args.graph and t > bench.GRAPH_MAX_T:  # ~1000 layer calls per timing would take minutes
                    times[pair].append(timing.time_graph(calls[pair], calls=max(8, len(inputs)), reps=5))
                elif args.graph:
                    times[pair].append(timing.time_graph(calls[pair], calls=n, reps=20))
                else:
                    times[pair].append(bench._time(calls[pair], t, n))
        torch.cuda.synchronize()
        for pair, ts in times.items():
            ms = statistics.median(ts)
            diff = _relative_diff(outs[pair], outs[("table", "", None)])
            d = runner.decide(t)
            table = ("/".join(table_tiles(d.tile, h, i_shard, routes=t * runner.top_k))
                     + (f" or {d.alt_tile}" if d.alt_tile else "") + ("+sync" if d.tile_sync else ""))
            name = (f"table {table}" + (f" {pair[1]}" if pair[1] else "") if pair[0] == "table" else
                    f"tile {pair[1]}" if pair[0] == "tile" else f"forms {pair[1]}" if pair[0] == "alts"
                    else "/".join(pair[:2]))
            name += {None: "", True: "+sync", False: "+nosync"}[pair[2]]
            print(f"{name_of_layer} T={t:3} {name:28} {ms * 1e3:8.1f} us  {nbytes / (ms * 1e-3) / copy_bw:.4f} of copy"
                  f"  rounds {' '.join(f'{x * 1e3:.1f}' for x in ts)}  diff {diff:.2e}"
                  f"  ran {','.join(sorted({plan.last_tile() for plan in bound[pair]}))}"
                  f"  bound {_gemm_forms(bound[pair][0].forms)}", flush=True)
        del calls, outs, bound, inputs  # free this T's workspaces before the next T's


if __name__ == "__main__":
    main()
