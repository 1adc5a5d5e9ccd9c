"""Family B benchmark: the whole MXFP4 x MXFP8 SiTU MoE layer (``plan.run()``: routing, both
GEMMs, SiTU, requantization, finalize) at the contract geometry (H=7168, I=3072, E=896,
top_k=16; layouts ep8 and tp8) or another layer and rank (``--layer E,K,H,I`` with
``--local-experts`` / ``--expert-offset`` / ``--shard``: ``other_layer``), measured side by side
in one run against

- the device-to-device copy bandwidth: effective bandwidth = bytes of the weights + scales of
  the local experts that have at least one route, divided by the time (PERF.md decode target);
- effective TFLOP/s = 2 * local routes * (2*I_shard*H + H*I_shard) / time (prefill target);
- a naive PyTorch layer on the same inputs (PERF.md's anchor): BF16 weights dequantized once
  outside the timing, x dequantized to BF16, routes sorted by expert, ``torch._grouped_mm`` for
  FC1 and FC2, SiTU in FP32 with a plain BF16 intermediate, weighted ``index_add_`` finalize.
  It is timed like ours (graph replay / events); decode rows also time one eager call of it at a
  time (host clock, launch overhead included): that is how PERF.md's anchor was measured
  (``ci/naive_anchor.py``: this naive layer at the anchor's geometry takes 0.9 ms per eager call
  against the anchor's 774 us, and 0.19 ms in graph replay).

Inputs are random (weights as random MXFP4 codes with scale codes 118..124). Decode rows
(T <= 64) rotate several routings inside one CUDA graph so that the routed weights are not
served from the 60 MB L2; rows up to T = 1024 are timed as CUDA-graph replays of many calls,
larger ones with CUDA events around eager calls.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import math
from typing import TypedDict

import torch

from ..reference import formats as fmt
from ..reference import moe as ref
from . import timing

H, I, E, TOP_K = 7168, 3072, 896, 16


class LayoutArgs(TypedDict, total=False):
    """A contract layout's CakeMxfp4MoEWrapper keywords."""
    num_local_experts: int
    local_expert_offset: int
    intermediate_shard: int


LAYOUTS: dict[str, LayoutArgs] = {"ep8": {"num_local_experts": 112, "local_expert_offset": 336},
                                  "tp8": {"intermediate_shard": 384}}
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
ROTATE_MAX_T, ROTATIONS = 64, 8
GRAPH_MAX_T = 1024
W_SCALE_CODES = (118, 124)

# The triton_kernels peer on family B tp8 (PERF.md, H200, 2026-11-30: another run, for context only).
PEER_TP8_US = {1: 83, 4: 152, 16: 405, 64: 1040, 256: 1520, 1024: 2180, 4096: 4390, 16384: 12970}


def layout_dims(name: str) -> tuple[int, int, int]:
    """(local experts, first local id, intermediate shard) of a layout."""
    kw = LAYOUTS[name]
    return kw.get("num_local_experts", E), kw.get("local_expert_offset", 0), kw.get("intermediate_shard", I)


@dataclasses.dataclass(frozen=True)
class Layer:
    """A layer and one rank of it under a name: CakeMxfp4MoEWrapper's arguments."""
    name: str
    dims: tuple[int, int, int, int]   # num_experts, top_k, hidden_size, intermediate_size
    rank: LayoutArgs


def layer_of(layout: str | Layer) -> Layer:
    """A contract layout by name (ep8, tp8), or a Layer as it is."""
    return layout if isinstance(layout, Layer) else Layer(layout, (E, TOP_K, H, I), LAYOUTS[layout])


def rank_args(local_experts: int | None = None, expert_offset: int | None = None,
              shard: int | None = None) -> LayoutArgs:
    """The wrapper's rank keywords of the options given (None: not given)."""
    rank = LayoutArgs()
    if local_experts is not None:
        rank["num_local_experts"] = local_experts
    if expert_offset is not None:
        rank["local_expert_offset"] = expert_offset
    if shard is not None:
        rank["intermediate_shard"] = shard
    return rank


def other_layer(dims: tuple[int, int, int, int], rank: LayoutArgs) -> Layer:
    """Another layer than the contract's (``cake-moe bench mxfp4-moe --layer E,K,H,I`` with its
    rank), named after its geometry and rank: ``E256 k8 H7168 I2048 L32@64``, ``... /384``."""
    e, k, h, i = dims
    name = f"E{e} k{k} H{h} I{i}"
    if "num_local_experts" in rank or "local_expert_offset" in rank:
        name += f" L{rank.get('num_local_experts', e)}@{rank.get('local_expert_offset', 0)}"
    if "intermediate_shard" in rank:
        name += f" /{rank['intermediate_shard']}"
    return Layer(name, dims, rank)


def expert_bytes(i_shard: int, h: int = H) -> int:
    """Bytes of one expert's MXFP4 weights and scales (w1 [2I, H] and w2 [H, I])."""
    return 2 * i_shard * (h // 2 + h // 32) + h * (i_shard // 2 + i_shard // 32)


def random_bank(l: int, i_shard: int, gen: torch.Generator, h: int = H) -> dict[str, torch.Tensor]:
    """Canonical MXFP4 bank drawn as codes on the generator's device: uniform nibbles, scale
    codes 118..124."""
    def codes(*shape, lo=0, hi=255):
        return torch.randint(lo, hi + 1, shape, dtype=torch.uint8, device=gen.device, generator=gen)
    lo, hi = W_SCALE_CODES
    return {"w1": codes(l, 2 * i_shard, h // 2), "w1_scale": codes(l, 2 * i_shard, h // 32, lo=lo, hi=hi),
            "w2": codes(l, h, i_shard // 2), "w2_scale": codes(l, h, i_shard // 32, lo=lo, hi=hi)}


def dequantize_bf16(q: torch.Tensor, scale: torch.Tensor, chunk: int = 1 << 27) -> torch.Tensor:
    """MXFP4 [..., K/2] with scales [..., K/32] -> BF16 [..., K], exactly (E2M1 times a power of
    two is a BF16 value), in pure torch and in chunks of rows to bound the temporaries."""
    lut = fmt.e2m1_decode(torch.arange(16, device=q.device)).to(torch.bfloat16)
    k = q.shape[-1] * 2
    out = torch.empty(*q.shape[:-1], k, dtype=torch.bfloat16, device=q.device)
    qf, sf, of = q.reshape(-1, k // 2), scale.reshape(-1, k // 32), out.view(-1, k)
    step = max(1, chunk // k)
    for r in range(0, qf.shape[0], step):
        b = qf[r:r + step].long()
        v = torch.stack((lut[b & 15], lut[b >> 4]), dim=-1).view(b.shape[0], k // 32, 32)
        of[r:r + step] = (v * fmt.ue8m0_value(sf[r:r + step]).to(torch.bfloat16)[..., None]).view(b.shape[0], k)
    return out


def naive_layer(x, x_sf, topk_ids, topk_weights, w13, w2, beta, linear_beta, *, num_experts: int,
                offset: int) -> torch.Tensor:
    """The layer a PyTorch user would write (BF16 weights w13 [L, 2I, H], w2 [L, H, I]). It
    never synchronises with the host (non-local routes sort into a trailing group that the
    grouped GEMMs skip), so it can be captured in a CUDA graph like ours."""
    mm = timing.torch_grouped_mm()
    if mm is None:
        raise NotImplementedError("the naive layer needs torch._grouped_mm, which this torch lacks")
    t, h = x.shape
    l, i = w13.shape[0], w13.shape[1] // 2
    k = topk_ids.shape[1]
    xb = (x.float().view(t, h // 32, 32) * torch.exp2(x_sf.float() - 127.0)[..., None]).view(t, h).to(torch.bfloat16)
    ids = topk_ids.long()
    local = ids - offset
    valid = ((ids >= 0) & (ids < num_experts) & (local >= 0) & (local < l)).flatten()
    key = torch.where(valid, local.flatten(), l)
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(l + 1, dtype=torch.int32, device=x.device).index_add_(
        0, key, torch.ones_like(key, dtype=torch.int32))
    offs = counts[:l].cumsum(0).to(torch.int32)
    tok = order // k
    expert = key[order].clamp(max=l - 1)
    hid = mm(xb[tok], w13.transpose(-2, -1), offs=offs)
    act = ref.situ(hid[:, i:].float(), hid[:, :i].float(), beta[expert, None], linear_beta[expert, None])
    y = mm(act.to(torch.bfloat16), w2.transpose(-2, -1), offs=offs)
    keep = valid[order]
    wt = torch.where(keep, topk_weights.flatten()[order].float(), 0.0)
    contrib = torch.where(keep[:, None], y.float() * wt[:, None], 0.0)  # rows past the groups are garbage
    return torch.zeros(t, h, dtype=torch.float32, device=x.device).index_add_(0, tok, contrib).to(torch.bfloat16)


def random_inputs(t: int, l: int, offset: int, gen: torch.Generator, *, h: int = H, e: int = E, k: int = TOP_K):
    """x, x_sf (MXFP8 of random normal rows), topk_ids (distinct uniform experts over all E, one
    of them local) and FP32 softmax topk_weights, on the generator's device."""
    dev = gen.device
    xq, xsf = fmt.quantize_mx(torch.randn(t, h, device=dev, generator=gen), "mxfp8")
    keys = torch.rand(t, e, device=dev, generator=gen)
    keys[torch.arange(t, device=dev), offset + torch.randint(0, l, (t,), device=dev, generator=gen)] = 2.0
    ids = keys.topk(k, dim=1).indices.to(torch.int32).contiguous()
    weights = torch.randn(t, k, device=dev, generator=gen).softmax(dim=1).contiguous()
    return xq, xsf, ids, weights


def runner_inputs(t: int, runner, gen: torch.Generator):
    """random_inputs for T tokens of a wrapper's layer and rank."""
    return random_inputs(t, runner.num_local_experts, runner.local_expert_offset, gen, h=runner.hidden_size,
                         e=runner.num_experts, k=runner.top_k)


def random_situ(l: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert FP32 beta ~ U[3, 5] and linear_beta ~ U[20, 30] (defaults 4 and 25)."""
    beta = 3.0 + 2.0 * torch.rand(l, device=gen.device, generator=gen)
    return beta, 20.0 + 10.0 * torch.rand(l, device=gen.device, generator=gen)


@dataclasses.dataclass
class RankLayer:
    """One rank of a layer on the benchmark's random weights (rank_layer)."""
    local: int                 # local experts
    offset: int                # first local expert id
    i_shard: int               # intermediate shard
    runner: object             # CakeMxfp4MoEWrapper of the layout, on the generator's device
    prepared: object           # prepare_cake_mxfp4_weights of the bank
    beta: torch.Tensor         # per local expert SiTU beta, linear_beta (random_situ)
    linear_beta: torch.Tensor
    bank16: tuple | None       # (w13, w2) dequantized to BF16 for naive_layer, or None


def rank_layer(layout: str | Layer, gen: torch.Generator, *, with_bf16: bool = False) -> RankLayer:
    """The benchmark's layer of one rank (a contract layout by name, or a Layer): its wrapper,
    then random_bank and random_situ drawn from ``gen`` in that order (so every tool that starts
    from the same seed times the same layer), the bank prepared; ``with_bf16`` keeps the bank
    dequantized to BF16 for the naive layer."""
    from ..mxfp4_moe import CakeMxfp4MoEWrapper, prepare_cake_mxfp4_weights
    spec = layer_of(layout)
    runner = CakeMxfp4MoEWrapper(*spec.dims, **spec.rank, device=gen.device)   # (draws nothing)
    l, offset, i_shard = runner.num_local_experts, runner.local_expert_offset, runner.intermediate_shard
    bank = random_bank(l, i_shard, gen, h=runner.hidden_size)
    prepared = prepare_cake_mxfp4_weights(bank["w1"], bank["w1_scale"], bank["w2"], bank["w2_scale"])
    bank16 = ((dequantize_bf16(bank["w1"], bank["w1_scale"]), dequantize_bf16(bank["w2"], bank["w2_scale"]))
              if with_bf16 else None)
    del bank
    beta, linear_beta = random_situ(l, gen)
    return RankLayer(l, offset, i_shard, runner, prepared, beta, linear_beta, bank16)


def _time(fn, t: int, calls: int) -> float:
    if t <= GRAPH_MAX_T:
        return timing.time_graph(fn, calls=calls, reps=20)
    return timing.time_cuda(fn, warmup=2, iters=3, reps=20)


def _bind(t: int, runner, prepared, bank16, beta, lbeta, gen, l: int, offset: int, tile: str | None = None,
          tile_sync: bool | None = None):
    """Plans (and naive calls on the same inputs) for T tokens of the wrapper's layer: ROTATIONS
    routings for decode rows, one otherwise; with the mean routed-expert and local-route counts."""
    n = ROTATIONS if t <= ROTATE_MAX_T else 1
    w13, w2 = bank16 if bank16 is not None else (None, None)   # (a rank made without with_bf16: no naive layer)
    h, e = runner.hidden_size, runner.num_experts
    plans, naive, outs, experts, routes = [], [], [], 0, 0
    for _ in range(n):
        x, x_sf, ids, w = runner_inputs(t, runner, gen)
        out = torch.empty(t, h, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(runner.get_workspace_size(t), dtype=torch.uint8, device="cuda")  # one per plan
        plans.append(runner.plan(x, x_sf, ids, w, prepared,
                                 beta=beta, linear_beta=lbeta, workspace=ws, output=out, tile=tile,
                                 tile_sync=tile_sync))
        naive.append(functools.partial(naive_layer, x, x_sf, ids, w, w13, w2, beta, lbeta, num_experts=e,
                                       offset=offset))
        outs.append(out)
        local = ids.long() - offset
        local = local[(local >= 0) & (local < l)]
        experts += local.unique().numel()
        routes += local.numel()
    return plans, naive, outs, experts / n, routes / n


def _variant(spec: str | None) -> tuple[str | None, bool | None]:
    """A ``--tiles`` entry: a tile form, ``sync`` / ``nosync`` (the table's form with the per-tile
    GEMM1 -> GEMM2 sync forced on / off), or ``form+sync`` / ``form+nosync``."""
    if spec is None:
        return None, None
    form, _, sync = ("", "", spec) if spec in ("sync", "nosync") else spec.partition("+")
    if sync not in ("", "sync", "nosync"):
        raise ValueError(f"tile variant {spec!r}: the suffix must be +sync or +nosync")
    return form or None, {"": None, "sync": True, "nosync": False}[sync]


def _same_as_table(runner, t: int, variant: str) -> bool:
    tile, tile_sync = _variant(variant)
    d, table = runner.decide(t, tile=tile, tile_sync=tile_sync), runner.decide(t)
    return (d.tile, d.tile_sync) == (table.tile, table.tile_sync)


def _row(layout: str, t: int, runner, prepared, bank16, beta, lbeta, gen, copy_bw: float,
         variant: str | None = None) -> dict:
    """One row of the layer named ``layout`` (its geometry and rank are the wrapper's)."""
    l, offset, i_shard = runner.num_local_experts, runner.local_expert_offset, runner.intermediate_shard
    h = runner.hidden_size
    shape = [h, runner.intermediate_size, runner.num_experts, runner.top_k]
    tile, tile_sync = _variant(variant)
    d = runner.decide(t, tile=tile, tile_sync=tile_sync)
    if variant is not None and d.supported:
        d = dataclasses.replace(d, path="forced")
    row = {"op": "mxfp4_moe", "layout": layout, "shape": shape, "T": t, "path": getattr(d, "path", None),
           "block_n": getattr(d, "block_n", None), "tile": d.tile + ("+sync" if d.tile_sync else ""),
           "gpu": timing.gpu_name(), "date": datetime.date.today().isoformat()}
    if not d.supported:
        return dict(row, skipped=str(d.reason))
    plans, naive, outs, experts, routes = _bind(t, runner, prepared, bank16, beta, lbeta, gen, l, offset, tile,
                                                tile_sync)
    calls = 48 if len(plans) > 1 else 20
    ours_ms = _time(timing.cycling([p.run for p in plans]), t, calls)
    if d.alt_tile:  # the form the device chose (the same for every run of one routing)
        ran = sorted({p.last_tile() for p in plans})
        row["tile"] = "/".join(ran) + "*"
    naive_ms, naive_eager_ms, diff = float("nan"), float("nan"), None
    if timing.torch_grouped_mm() is not None:
        try:
            naive_ms = _time(timing.cycling(naive), t, calls)
        except RuntimeError:  # a torch whose grouped mm cannot be captured: time it eagerly
            naive_ms = timing.time_cuda(timing.cycling(naive), warmup=2, iters=3, reps=20)
        if t <= ROTATE_MAX_T:
            naive_eager_ms = timing.time_wall(timing.cycling(naive))
        plans[-1].run()
        want = naive[-1]().double()
        diff = float((outs[-1].double() - want).norm() / want.norm())
    nbytes = experts * expert_bytes(i_shard, h)
    flops = 2.0 * routes * (2 * i_shard * h + h * i_shard)
    peer = PEER_TP8_US.get(t) if layout == "tp8" and shape == [H, I, E, TOP_K] else None
    return dict(row, ours_us=ours_ms * 1e3, naive_us=naive_ms * 1e3, speedup=naive_ms / ours_ms,
                naive_eager_us=naive_eager_ms * 1e3, speedup_eager_naive=naive_eager_ms / ours_ms, bytes=nbytes,
                flops=flops, eff_bw_frac=nbytes / (ours_ms * 1e-3) / copy_bw, tflops=flops / ours_ms / 1e9,
                copy_TBps=copy_bw / 1e12, routed_experts=experts, local_routes=routes, naive_rel_diff=diff,
                peer_us_perf_md=peer)


def run(tokens=TOKENS, layouts: tuple[str | Layer, ...] = tuple(LAYOUTS), tiles: tuple[str, ...] = ()) -> list[dict]:
    """The grid over contract layouts (names) or other Layers; ``tiles``: variants also timed
    (forced) beside the decision table's own choice (see ``_variant``), on the same inputs as the
    table's row."""
    copy_bw = timing.copy_bandwidth(1 << 30)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for spec in map(layer_of, layouts):
        layout = spec.name
        rank = rank_layer(spec, gen, with_bf16=True)
        runner, prepared, bank16, beta, lbeta = rank.runner, rank.prepared, rank.bank16, rank.beta, rank.linear_beta
        del rank
        for t in tokens:
            inputs = gen.get_state()  # every variant of a row runs on the same routings and activations
            for tile in (None, *(x for x in tiles if not _same_as_table(runner, t, x))):
                gen.set_state(inputs)
                rows.append(_row(layout, t, runner, prepared, bank16, beta, lbeta, gen, copy_bw, tile))
                r = rows[-1]
                if "skipped" in r:
                    print(f"{layout} T={t:6} {r['tile']}: not run ({r['skipped']})", flush=True)
                    continue
                print(f"{layout} T={t:6} {str(r['path']):8} {r['tile']:9} ours {r['ours_us']:9.1f} us  naive "
                      f"{r['naive_us']:9.1f} us  x{r['speedup']:6.1f}  {r['eff_bw_frac']:5.2f} of copy  "
                      f"{r['tflops']:6.1f} TF/s", flush=True)
        del prepared, bank16
        torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| layout | T | path | tile | ours (us) | naive (us) | vs naive | naive eager call (us) | vs it "
             "| routed experts | eff. TB/s | of copy | TFLOP/s | peer (us, PERF.md) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['layout']} | {r['T']} | not run: {r['skipped']} |" + " |" * 11)
            continue
        peer = r.get("peer_us_perf_md")
        eager = r.get("naive_eager_us", float("nan"))
        eager_cells = (f"{eager:.1f} | {r['speedup_eager_naive']:.1f}" if math.isfinite(eager) else "- | -")
        lines.append(f"| {r['layout']} | {r['T']} | {r['path']} | {r['tile']} | {r['ours_us']:.1f} | {r['naive_us']:.1f} | "
                     f"{r['speedup']:.1f} | {eager_cells} | {r['routed_experts']:.1f} | "
                     f"{r['bytes'] / r['ours_us'] / 1e6:.2f} | "
                     f"{r['eff_bw_frac']:.2f} | {r['tflops']:.0f} | {peer if peer else '-'} |")
    if any(r.get("tile", "").endswith("*") for r in rows):
        lines += ["", "tile*: the form the routing kernel chose from the row's route counts, of the decision "
                  "table's two wgmma forms"]
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """The PERF.md family-B targets, row by row (the decision table's rows, not forced tiles)."""
    rs = [r for r in rows if "skipped" not in r and r["path"] != "forced"]
    out = []

    def verdict(name, sel, ok):
        got = [r for r in rs if sel(r)]
        if got:
            bad = [f"{r['layout']} T={r['T']}" for r in got if not ok(r)]
            out.append(f"{name}: met ({len(got)} rows)" if not bad else
                       f"{name}: MISSED at {', '.join(bad)} ({len(bad)} of {len(got)} rows)")

    verdict("decode bandwidth >= 0.70 of copy (8 <= T <= 64)", lambda r: 8 <= r["T"] <= 64,
            lambda r: r["eff_bw_frac"] >= 0.70)
    verdict("decode bandwidth >= 0.50 of copy (T <= 4)", lambda r: r["T"] <= 4, lambda r: r["eff_bw_frac"] >= 0.50)
    verdict("prefill >= 600 TFLOP/s (T >= 4096)", lambda r: r["T"] >= 4096, lambda r: r["tflops"] >= 600)
    verdict("vs naive >= 30x (T = 1)", lambda r: r["T"] == 1, lambda r: r["speedup"] >= 30)
    verdict("vs naive called eagerly as PERF.md's anchor was >= 30x (T = 1)",
            lambda r: r["T"] == 1 and math.isfinite(r.get("naive_eager_us", float("nan"))),
            lambda r: r["speedup_eager_naive"] >= 30)
    verdict("vs naive >= 4x (T = 16384)", lambda r: r["T"] == 16384, lambda r: r["speedup"] >= 4)
    verdict("faster than the PERF.md peer (tp8)", lambda r: r.get("peer_us_perf_md"),
            lambda r: r["ours_us"] < r["peer_us_perf_md"])
    verdict(">= 2x the PERF.md peer (tp8, T <= 4 or T >= 4096)",
            lambda r: r.get("peer_us_perf_md") and (r["T"] <= 4 or r["T"] >= 4096),
            lambda r: 2 * r["ours_us"] <= r["peer_us_perf_md"])
    diffs = [r["naive_rel_diff"] for r in rs if r.get("naive_rel_diff") is not None]
    if diffs:
        out.append(f"ours vs naive relative difference {min(diffs):.3f}-{max(diffs):.3f} (the naive layer keeps a "
                   "BF16 intermediate instead of MXFP8: a few percent is expected, much more means a broken row)")
    if any(not math.isfinite(r["naive_us"]) for r in rs):
        out.append("naive layer not timed (this torch has no torch._grouped_mm)")
    others = sorted({r["layout"] for r in rs if r.get("shape", [H, I, E, TOP_K]) != [H, I, E, TOP_K]})
    if others:
        out.append(f"rows of other layers ({', '.join(others)}): PERF.md set these targets for the contract "
                   "geometry; for another layer they are a yardstick, not a promise")
    return "\n".join(out)


def plot(rows: list[dict], path: str) -> bool:
    """Time, fraction of the copy bandwidth and TFLOP/s against T per layout (the decision
    table's rows), with the PERF.md targets drawn in; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rs = [r for r in rows if "skipped" not in r and r["path"] != "forced"]
    fig, (a_time, a_bw, a_tf) = plt.subplots(1, 3, figsize=(16, 4.5))
    for layout in sorted({r["layout"] for r in rs}):
        lr = sorted((r for r in rs if r["layout"] == layout), key=lambda r: r["T"])
        ts = [r["T"] for r in lr]
        a_time.plot(ts, [r["ours_us"] for r in lr], marker="o", label=f"cake-moe {layout}")
        a_time.plot(ts, [r["naive_us"] for r in lr], marker="x", linestyle=":", label=f"naive {layout}")
        peer = [(r["T"], r["peer_us_perf_md"]) for r in lr if r.get("peer_us_perf_md")]
        if peer:
            a_time.plot(*zip(*peer), marker="s", linestyle="--", label=f"peer {layout} (PERF.md)")
        a_bw.plot(ts, [r["eff_bw_frac"] for r in lr], marker="o", label=layout)
        a_tf.plot(ts, [r["tflops"] for r in lr], marker="o", label=layout)
    for value, label in ((0.70, "target from T = 8"), (0.50, "target T <= 4")):
        a_bw.axhline(value, color="grey", linestyle="--", linewidth=0.8, label=label)
    a_tf.axhline(600, color="grey", linestyle="--", linewidth=0.8, label="target T = 16384")
    for ax, ylabel, log_y in ((a_time, "us per layer", True), (a_bw, "routed weight bytes / time / copy bandwidth",
                                                               False), (a_tf, "effective TFLOP/s", False)):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log" if log_y else "linear")
        ax.set_xlabel("tokens T")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    if rs:
        shapes = sorted({tuple(r["shape"]) for r in rs if "shape" in r})
        what = "; ".join(f"H={h} I={i} E={e} top_k={k}" for h, i, e, k in shapes)
        fig.suptitle(f"MXFP4 x MXFP8 SiTU MoE, {what} ({rs[0]['gpu']}, {rs[0]['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(out_prefix: str | None = None, tokens=TOKENS, layouts: tuple[str | Layer, ...] = tuple(LAYOUTS),
         tiles: tuple[str, ...] = ()) -> list[dict]:
    rows = run(tokens, layouts, tiles)
    timing.publish(rows, markdown(rows), summary(rows), out_prefix, plot)
    return rows
