"""One family-B layer (a contract layout, or ``layer --layer E,K,H,I`` with its rank), planned
once and run a few times.

Two uses:
- the target for Nsight Compute / Systems (e.g. ``ncu -k regex:gemm1 -s 1 -c 1 python ci/profile_moe.py ep8 4096``);
- ``--kernel-times``: the device time of each of the layer's kernels, from the torch profiler
  (CUPTI), averaged over the runs, for several token counts in one call;
- ``--timeline``: when each kernel of one run (the last of ``--runs``) starts and ends;
- ``--local-experts N``: every token routes to the same N local experts (the rest of its top_k
  remote), N = 1..6 in turn when N is 0; each count's runs rotate over several disjoint expert
  sets so that the weights come from DRAM. With ``--kernel-times``: how a GEMM's time grows with
  its CTA count (96 GEMM1 CTAs per expert in ``n8_narrow`` at ep8).

usage: python ci/profile_moe.py LAYOUT T [T ...] [--tile TILE] [--tile-sync on|off] [--runs N]
       [--kernel-times | --timeline [--rotate N [--per-routing]]] [--local-experts N]
       (LAYOUT: ep8, tp8, or layer with --layer E,K,H,I [--rank-experts L --expert-offset O | --shard S]:
       ci/layer_args.py)
"""
import argparse

import torch

from cake_moe.bench import mxfp4_moe as b

import layer_args  # (ci/: LAYOUT and --layer)


def cuda_events(plan, runs: int) -> list:
    """The CUDA kernel events of ``runs`` runs of one plan, or of a list of plans run in turn
    (as the benchmark does, so that the weights come from DRAM)."""
    from torch.profiler import ProfilerActivity, profile
    plans = plan if isinstance(plan, list) else [plan]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(runs):
            plans[i % len(plans)].run()
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def kernel_times(plan, runs: int) -> list[tuple[str, float]]:
    """(kernel name, mean device microseconds per run) of the launches of `runs` runs."""
    totals: dict[str, float] = {}
    for event in cuda_events(plan, runs):
        totals[event.name] = totals.get(event.name, 0.0) + event.time_range.elapsed_us()
    return sorted(((name, us / runs) for name, us in totals.items()), key=lambda kv: -kv[1])


def timelines(plan, runs: int, last: int = 1) -> list[list[tuple[str, float, float]]]:
    """Per run, (kernel name, start, end) in microseconds from the run's first kernel, of the
    last `last` of `runs` back-to-back runs: shows the gaps and the dependent-launch overlaps
    between kernels (with plans run in turn, one run per plan when `last` is their count)."""
    events = sorted((e.time_range.start, e.time_range.end, e.name) for e in cuda_events(plan, runs))
    per = len(events) // runs  # the launches of one run: five, or seven with the routing over several CTAs
    out = []
    for r in range(runs - last, runs):
        run = events[r * per:(r + 1) * per]
        out.append([(name, start - run[0][0], end - run[0][0]) for start, end, name in run])
    return out


def timeline(plan, runs: int) -> list[tuple[str, float, float]]:
    """The kernels of the last of `runs` runs (timelines)."""
    return timelines(plan, runs)[0]


def short_name(kernel: str) -> str:
    return kernel.replace("cake_mxfp4_moe_", "").replace("cake_moe_", "").replace("cake_", "")


def local_expert_count(ids: torch.Tensor, offset: int, l: int) -> int:
    """Distinct local experts among a routing's ids."""
    return int(ids[(ids >= offset) & (ids < offset + l)].unique().numel())


def local_expert_ids(t: int, experts: list[int], gen: torch.Generator, runner) -> torch.Tensor:
    """[t, top_k] ids: every token routes to `experts` (global ids of local experts) and fills
    the rest of its top_k with distinct remote experts."""
    l, offset = runner.num_local_experts, runner.local_expert_offset
    remote = torch.tensor([e for e in range(runner.num_experts) if not offset <= e < offset + l], device="cuda")
    rows = []
    for _ in range(t):
        pick = remote[torch.randperm(remote.numel(), device="cuda", generator=gen)[:runner.top_k - len(experts)]]
        rows.append(torch.cat([torch.tensor(experts, device="cuda"), pick]))
    return torch.stack(rows).to(torch.int32).contiguous()


def scan_local_experts(args, runner, prepared, beta, lbeta, gen, l: int, offset: int) -> None:
    """GEMM kernel times against the number of local experts hit (see the module doc)."""
    counts = [args.local_experts] if args.local_experts > 0 else list(range(1, 7))
    for t in args.tokens:
        for n in counts:
            sets = [list(range(offset + s, offset + s + n)) for s in range(0, l - n + 1, n)][:8]
            plans = []
            for experts in sets:
                x, x_sf, _, w = b.runner_inputs(t, runner, gen)
                ids = local_expert_ids(t, experts, gen, runner)
                out = torch.empty(t, runner.hidden_size, dtype=torch.bfloat16, device="cuda")
                ws = torch.empty(runner.get_workspace_size(t), dtype=torch.uint8, device="cuda")
                plans.append(runner.plan(x, x_sf, ids, w, prepared, beta=beta, linear_beta=lbeta, workspace=ws,
                                         output=out, tile=args.tile, tile_sync=args.tile_sync))
            rows = kernel_times(plans, max(args.runs, 4 * len(plans)))
            total = sum(us for _, us in rows)
            gemms = "  ".join(f"{name.split('_gemm')[1][:1]}:{us:6.1f}" for name, us in rows if "_gemm" in name)
            print(f"{args.layout} T={t} local experts {n} ({plans[0].decision.tile}): {total:6.1f} us of kernels; "
                  f"GEMM1/GEMM2 us {gemms}")


def main() -> None:
    ap = argparse.ArgumentParser()
    layer_args.add(ap)
    ap.add_argument("tokens", type=int, nargs="+")
    ap.add_argument("--tile", default=None)
    ap.add_argument("--tile-sync", choices=("on", "off"), default=None,
                    help="force the per-tile GEMM1 -> GEMM2 sync on or off (default: the table's)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kernel-times", action="store_true")
    ap.add_argument("--timeline", action="store_true", help="start/end of each kernel of one run")
    ap.add_argument("--per-routing", action="store_true",
                    help="with --timeline --rotate N: the last run of each routing, with its local expert count")
    ap.add_argument("--rotate", type=int, default=1,
                    help="with --timeline: plan N routings and run them in turn (weights from DRAM)")
    ap.add_argument("--local-experts", type=int, default=None, help="route every token to N local experts (0: 1..6)")
    ap.add_argument("--gemm-tiles", default=None,
                    help="experiment: bind these GEMM1,GEMM2 forms (same BN) whatever the decision table says")
    args = ap.parse_args()
    args.tile_sync = None if args.tile_sync is None else args.tile_sync == "on"
    spec = layer_args.spec(ap, args)
    args.layout = b.layer_of(spec).name   # (the printed name)

    if args.gemm_tiles:
        from cake_moe.mxfp4_moe import _decide
        forced = tuple(args.gemm_tiles.split(","))
        _decide.gemm_tiles = lambda *_a, **_k: forced
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = b.rank_layer(spec, gen)
    l, offset, runner, prepared, beta, lbeta = r.local, r.offset, r.runner, r.prepared, r.beta, r.linear_beta
    if args.local_experts is not None:
        scan_local_experts(args, runner, prepared, beta, lbeta, gen, l, offset)
        return
    for t in args.tokens:
        plans, local = [], []
        for _ in range(args.rotate if args.timeline else 1):
            x, x_sf, ids, w = b.runner_inputs(t, runner, gen)
            local.append(local_expert_count(ids, offset, l))
            out = torch.empty(t, runner.hidden_size, dtype=torch.bfloat16, device="cuda")
            ws = torch.empty(runner.get_workspace_size(t), dtype=torch.uint8, device="cuda")
            plans.append(runner.plan(x, x_sf, ids, w, prepared, beta=beta, linear_beta=lbeta, workspace=ws,
                                     output=out, tile=args.tile, tile_sync=args.tile_sync))
        plan = plans[0]
        if args.timeline:
            print(f"{args.layout} T={t} ({plan.decision.tile}): one run of {len(plans)} routing(s) in turn, "
                  f"microseconds from its first kernel")
            if args.per_routing:
                runs = max(args.runs, 2 * len(plans))
                for i, run in enumerate(timelines(plans, runs, last=len(plans))):
                    r = (runs - len(plans) + i) % len(plans)
                    print(f"  routing {r} ({local[r]} local experts), end "
                          f"{run[-1][2]:5.1f}: " + " | ".join(f"{short_name(name)} {start:.1f}-{end:.1f}"
                                                             for name, start, end in run))
                continue
            for name, start, end in timeline(plans, max(args.runs, 2 * len(plans))):
                print(f"  {start:8.1f} .. {end:8.1f} ({end - start:6.1f})  {name}")
            continue
        if not args.kernel_times:
            for _ in range(args.runs):
                plan.run()
            torch.cuda.synchronize()
            print(plan)
            continue
        rows = kernel_times(plan, args.runs)
        total = sum(us for _, us in rows)
        print(f"{args.layout} T={t} ({plan.decision.tile}): {total:.1f} us of kernels per run")
        for name, us in rows:
            print(f"  {us:9.1f} us  {100 * us / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
