"""Family A benchmark: our grouped GEMM against torch._grouped_mm and a dense cuBLAS mm of the
same total size, side by side in one run (PERF.md grid).

Rows: (H, I, E) layers x {w13 [E, 2I, H], w2 [E, H, I]} x T, random imbalanced groups, plus a
Zipf-skewed row and a row with empty groups. Ops: fwd, dgrad, wgrad (det, bf16 output; torch's
wgrad is the ragged-K grouped mm its autograd runs). Each callable cycles over copies of its
inputs where they span less than ``ROTATE_BYTES`` (the "input sets" column), so no row times
operands left in the L2 by the call before.
"""
from __future__ import annotations

import datetime
import functools
import math

import torch

from .. import grouped_gemm as gg
from . import timing

LAYERS = [(2048, 768, 16), (2048, 1536, 8), (4096, 2048, 9), (7168, 2048, 8)]
TOKENS = [4096, 16384, 65536]


def _sizes(total: int, e: int, kind: str, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    if kind == "zipf":
        w = 1.0 / torch.arange(1, e + 1, dtype=torch.float64) ** 1.2
    elif kind == "empty":
        w = torch.rand(e, generator=g, dtype=torch.float64)
        w[::3] = 0.0
    else:
        w = torch.rand(e, generator=g, dtype=torch.float64) + 0.25
    s = (w / w.sum() * total).floor().long()
    s[int(torch.argmax(w))] += total - int(s.sum())
    return s.tolist()


def weight_nk(h: int, i: int, which: str) -> tuple[int, int]:
    """(N, K) of a layer's weight: w13 [E, 2I, H], w2 [E, H, I]."""
    return (2 * i, h) if which == "w13" else (h, i)


def _rows(tokens=None, layers=None):
    """The PERF.md grid; with ``tokens``, its layers' random-group rows at those token counts
    instead (an off-grid check: the grid starts at T = 4096); with ``layers`` ((H, I, E) each),
    those layers' random-group rows instead of the grid's layers."""
    for h, i, e in layers or LAYERS:
        for which in ("w13", "w2"):
            n, k = weight_nk(h, i, which)
            for t in tokens or TOKENS:
                yield (h, i, e, which, n, k, t, "random")
    if not tokens and not layers:
        yield (2048, 1536, 8, "w13", 3072, 2048, 16384, "zipf")
        yield (4096, 2048, 9, "w2", 4096, 2048, 16384, "empty")


def case_seed(row: int, seed: int = 0) -> int:
    """The group-size seed of a row (its index in ``_rows``) in draw ``seed`` (0: the grid's)."""
    return row + 1000 * seed


def cases(tokens=None, seed: int = 0, layers=None):
    """Each row of ``_rows(tokens, layers)`` with its inputs ``(sizes, offs, x, w, g)`` in draw
    ``seed``: what the benchmark and ``ci/ab_forms.py`` time."""
    for idx, row in enumerate(_rows(tokens, layers)):
        h, i, e, which, n, k, t, kind = row
        yield row, _case(n, k, e, t, kind, case_seed(idx, seed))


def _case(n, k, e, t, kind, seed):
    sizes = _sizes(t, e, kind, seed)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    g = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    return sizes, offs, x, w, g


SM90_TILES = ("128x128", "128x256", "64x128", "128x192")

# PERF.md: rotate input buffers where a working set fits in the L2 (60 MB), so that a timed call
# reads its operands as a layer in a model does (the previous layers have evicted them).
# Copies of the inputs are cycled until they span ROTATE_BYTES; inputs of that size or more
# run on one set (a second copy would double a multi-GB row for no change in what is read).
L2_BYTES = 60 << 20
ROTATE_BYTES = 4 * L2_BYTES
MAX_COPIES = 8


def rotation_copies(input_bytes: int) -> int:
    """How many copies of inputs of ``input_bytes`` the timed callables cycle through."""
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(1, input_bytes))))


def op_inputs(op: str, x, w, g) -> tuple:
    """The tensors one op reads (the offsets aside): fwd x and w, dgrad g and w, wgrad g and x."""
    return {"fwd": (x, w), "dgrad": (g, w), "wgrad": (g, x)}[op]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def op_callables(op: str, x, w, g, offs):
    """``(make, peer)`` for one op on one case: ``make(form)`` prepares our launch of a form by
    name ("" = the default choice; wgrad: det), ``peer`` calls torch._grouped_mm on the same
    product (None when this torch has none)."""
    if op == "fwd":
        make = lambda f: gg.prepare_grouped_gemm_fwd(x, w, offs, form=f)  # noqa: E731
        operands = (x, w.transpose(-2, -1))
    elif op == "dgrad":
        make = lambda f: gg.prepare_grouped_gemm_dgrad(g, w, offs, form=f)  # noqa: E731
        operands = (g, w)
    elif op == "wgrad":
        make = lambda f: gg.prepare_grouped_gemm_wgrad(g, x, offs, variant="det", form=f)  # noqa: E731
        operands = (g.t(), x)
    else:
        raise ValueError(f"op must be fwd, dgrad or wgrad, got {op!r}")
    mm = timing.torch_grouped_mm()
    return make, (None if mm is None else functools.partial(mm, *operands, offs=offs))


def _sweep_fns(op, makes: list) -> dict:
    """Every sm_90a tile of fwd/dgrad, keyed "tile:<BMxBN>" (tuning data for heuristics_sm90.hpp),
    each cycling over the input copies of ``makes`` as the default form does."""
    out = {}
    for tile in SM90_TILES:
        try:
            out[f"tile:{tile}"] = timing.cycling([make(f"gg_sm90_{op}_{tile}").launch for make in makes])
        except (ValueError, NotImplementedError):
            pass
    return out


def _copies_of(tensors: tuple, n: int, read: tuple | None = None) -> list[tuple]:
    """``tensors`` and ``n - 1`` copies of them: clones (same values, other addresses) of the
    tensors in ``read`` (default: all), the others shared."""
    cloned = [any(t is r for r in read) for t in tensors] if read is not None else [True] * len(tensors)
    return [tensors] + [tuple(t.clone() if c else t for t, c in zip(tensors, cloned)) for _ in range(n - 1)]


def _time_op(op, x, w, g, offs, dense, copies: int, sweep: bool):
    """``(ms per callable, our form)`` of one op on ``copies`` input sets, or None where the build
    has no form for it. Its input copies and launches go with its return."""
    sets = _copies_of((x, w, g), copies, op_inputs(op, x, w, g))
    pairs = [op_callables(op, xs, ws, gs, offs) for xs, ws, gs in sets]
    try:
        launches = [make("") for make, _ in pairs]
    except NotImplementedError as err:
        print(f"{op} skipped: {err}")
        return None
    # ours, the peers and the swept tiles timed in interleaved rounds (see timing.time_interleaved)
    fns = {"ours": timing.cycling([launch.launch for launch in launches]), "dense": dense}
    if pairs[0][1]:
        fns["torch"] = timing.cycling([peer for _, peer in pairs])
    if sweep and op != "wgrad":
        fns.update(_sweep_fns(op, [make for make, _ in pairs]))
    return timing.time_interleaved(fns), launches[0].form


def run(ops=("fwd", "dgrad", "wgrad"), sweep: bool = False, tokens=None, seed: int = 0,
        rotate: bool = True, layers=None) -> list[dict]:
    """``seed`` offsets every row's group-size draw (0: the published grid's group sizes);
    ``rotate=False`` times every row on one input set; ``layers``: see ``_rows``."""
    copies_for = rotation_copies if rotate else (lambda nbytes: 1)
    out = []
    for (h, i, e, which, n, k, t, kind), (sizes, offs, x, w, g) in cases(tokens, seed, layers):
        flops = 2.0 * t * n * k
        dense_a = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        dense_b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        dense_sets = _copies_of((dense_a, dense_b), copies_for(_nbytes((dense_a, dense_b))))
        dense = timing.cycling([functools.partial(torch.mm, a, b.T) for a, b in dense_sets])
        for op in ops:
            copies = copies_for(_nbytes(op_inputs(op, x, w, g)))
            timed = _time_op(op, x, w, g, offs, dense, copies, sweep)
            if timed is None:
                continue
            ms, form = timed
            ours_ms, dense_ms, peer_ms = ms["ours"], ms["dense"], ms.get("torch", float("nan"))
            tiles = {key[len("tile:"):]: v for key, v in ms.items() if key.startswith("tile:")}
            out.append({
                "op": op, "layer": [h, i, e], "weight": which, "N": n, "K": k, "T": t, "groups": kind,
                "form": form, "ours_ms": ours_ms, "torch_ms": peer_ms, "dense_ms": dense_ms,
                "ours_TFLOPs": flops / ours_ms / 1e9, "torch_TFLOPs": flops / peer_ms / 1e9,
                "dense_TFLOPs": flops / dense_ms / 1e9, "speedup_vs_torch": peer_ms / ours_ms,
                "fraction_of_dense": dense_ms / ours_ms, "rows_per_expert": t / e, "flops": flops,
                "input_copies": copies, "dense_input_copies": len(dense_sets),
                "gpu": timing.gpu_name(), "date": datetime.date.today().isoformat(), "seed": seed, "sizes": sizes,
                "tiles_ms": tiles, "best_tile_speedup": (peer_ms / min(tiles.values())) if tiles else None,
            })
            r = out[-1]
            print(f"{op:5} {h:5} {i:5} {e:3} {which:3} T={t:6} {kind:6} {r['form']:22} ours {r['ours_TFLOPs']:6.1f} "
                  f"torch {r['torch_TFLOPs']:6.1f} dense {r['dense_TFLOPs']:6.1f} x{r['speedup_vs_torch']:.2f} "
                  f"({copies} input sets)", flush=True)
        del x, w, g, dense_a, dense_b, dense_sets, dense
    return out


def summary(rows: list[dict]) -> str:
    lines = []
    for op in ("fwd", "dgrad", "wgrad"):
        rs = [r for r in rows if r["op"] == op and math.isfinite(r["speedup_vs_torch"])]
        if not rs:
            continue
        geo = math.exp(sum(math.log(r["speedup_vs_torch"]) for r in rs) / len(rs))
        worst = min(rs, key=lambda r: r["speedup_vs_torch"])
        big = [r["fraction_of_dense"] for r in rs if r["rows_per_expert"] >= 4096]
        best = [r["best_tile_speedup"] for r in rs if r.get("best_tile_speedup")]
        oracle = (f"; best tile per row would give x{math.exp(sum(map(math.log, best)) / len(best)):.3f}"
                  if best else "")
        # what the geomean would be if every row ran as fast as one dense cuBLAS mm of its total
        # size (or as fast as it does, where it is faster): how much room the grid leaves
        at_dense = [r["torch_ms"] / min(r["ours_ms"], r["dense_ms"]) for r in rs
                    if math.isfinite(r.get("dense_ms", math.nan))]
        oracle += (f"; at dense cuBLAS speed on every row x{math.exp(sum(map(math.log, at_dense)) / len(at_dense)):.3f}"
                   if at_dense else "")
        lines.append(f"{op}: geomean x{geo:.3f} over torch._grouped_mm ({len(rs)} rows){oracle}, worst x"
                     f"{worst['speedup_vs_torch']:.2f} ({worst['layer']} {worst['weight']} T={worst['T']} "
                     f"{worst['groups']}); >=4096 rows/expert: " +
                     (f"{min(big):.2f}-{max(big):.2f} of dense cuBLAS" if big else "no such rows"))
        per_form = sweep_geomeans(rs)
        if per_form:
            lines.append(f"{op} sweep, geomean over torch per form (rows where it ran): " +
                         ", ".join(f"{k} x{v[0]:.3f} ({v[1]} rows)" for k, v in per_form.items()))
    return "\n".join(lines)


def sweep_geomeans(rows: list[dict]) -> dict[str, tuple[float, int]]:
    """Per swept form: the geomean of torch time / form time over the rows where it ran, and
    their count (a form that runs on every row is a candidate default)."""
    logs: dict[str, list[float]] = {}
    for r in rows:
        for key, ms in (r.get("tiles_ms") or {}).items():
            if ms and math.isfinite(r["torch_ms"]):
                logs.setdefault(key, []).append(math.log(r["torch_ms"] / ms))
    return {k: (math.exp(sum(v) / len(v)), len(v)) for k, v in logs.items()}


def markdown(rows: list[dict]) -> str:
    lines = ["| op | H, I, E | weight | T | groups | form | ours TF/s | torch TF/s | dense TF/s | vs torch | of dense "
             "| input sets |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {', '.join(map(str, r['layer']))} | {r['weight']} | {r['T']} | {r['groups']} | "
                     f"{r['form']} | {r['ours_TFLOPs']:.0f} | {r['torch_TFLOPs']:.0f} | {r['dense_TFLOPs']:.0f} | "
                     f"{r['speedup_vs_torch']:.2f} | {r['fraction_of_dense']:.2f} | {r.get('input_copies', 1)} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> bool:
    """TFLOP/s per row and op; False when matplotlib is missing (nothing drawn for no rows)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ops = [op for op in ("fwd", "dgrad", "wgrad") if any(r["op"] == op for r in rows)]
    if not ops:
        return True
    fig, axes = plt.subplots(len(ops), 1, figsize=(14, 4 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        rs = [r for r in rows if r["op"] == op]
        xs = range(len(rs))
        for key, label in (("ours_TFLOPs", "cake-moe"), ("torch_TFLOPs", "torch._grouped_mm"),
                           ("dense_TFLOPs", "cuBLAS dense")):
            ax.plot(xs, [r[key] for r in rs], marker="o", label=label)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{r['layer'][0]}/{r['layer'][1]}/{r['layer'][2]} {r['weight']}\nT={r['T']} {r['groups']}"
                            for r in rs], rotation=90, fontsize=6)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"grouped GEMM {op} ({rows[0]['gpu']}, {rows[0]['date']})")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(out_prefix: str | None = None, ops=("fwd", "dgrad", "wgrad"), sweep: bool = False,
         tokens=None, seed: int = 0, rotate: bool = True, layers=None) -> list[dict]:
    rows = run(ops, sweep, tokens, seed, rotate, layers)
    timing.publish(rows, markdown(rows), summary(rows), out_prefix, plot)
    return rows
