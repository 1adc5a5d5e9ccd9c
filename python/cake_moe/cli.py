"""The ``cake-moe`` command: ``info``, ``demo`` (the main job), ``decide`` and ``bench``."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from . import __version__, _runtime

if TYPE_CHECKING:
    from .bench.mxfp4_moe import Layer
    from .mxfp4_moe import CakeMxfp4MoEWrapper


def _device_line() -> tuple[str, bool]:
    ok, version, why = _runtime.driver_status()
    if not ok:
        return f"no GPU: {why}", False
    n = _runtime.ext().device_count()
    if n == 0:
        return "no CUDA device", False
    arch = _runtime.ext().device_arch(0)
    served = arch in _runtime.built_arches()
    name = _runtime.ext().device_name(0)
    sms = _runtime.ext().device_sm_count(0)
    dram = _runtime.ext().device_dram_bytes_per_s(0)  # 0 where the driver does not report it
    memory = f", {dram / 1e12:.2f} TB/s peak DRAM" if dram > 0 else ""
    if _runtime.ext().device_narrow_memory(0):  # the form choices' narrow-memory rules apply
        per_sm = _runtime.ext().narrow_memory_bytes_per_sm_s / 1e9
        memory += f" (under {per_sm:.0f} GB/s per SM: narrow-memory form choices)"
    return (f"cuda:0 {name} (sm_{arch}, {sms} SMs{memory}), driver {version // 1000}.{version % 1000 // 10}: "
            f"{'served by this build' if served else 'NOT served by this build'}"), served


def cmd_info(_args) -> int:
    m = _runtime.manifest()
    print(f"cake-moe {__version__} (extension {_runtime.ext().__version__}), built with nvcc {m.get('nvcc', '?')}")
    print(f"arches: {', '.join('sm_' + a for a in m['archs'])}")
    print(f"device: {_device_line()[0]}")
    bad = 0
    print(f"{'form':24} {'family':13}" + " ".join(f"{'sm_' + a:>22}" for a in m["archs"]))
    for form in m["forms"]:
        cells = []
        for arch in m["archs"]:
            info = form["arches"].get(arch)
            if info is None:  # not compiled for this arch (e.g. an sm_90a-only native form)
                cells.append(f"{'-':>22}")
                continue
            ok = _runtime.ext().verify_image(form["name"], arch)
            bad += not ok
            tag = info["kind"] + ("+validated" if info["validated"] else "")
            cells.append(f"{tag + (' sha-ok' if ok else ' SHA-BAD'):>22}")
        print(f"{form['name']:24} {form['family']:13}" + " ".join(cells))
    n = sum(len(f["arches"]) for f in m["forms"])
    print(f"{len(m['forms'])} forms, {n} images, {n - bad} checksums verified, {bad} failed")
    return 1 if bad else 0


DECIDE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096, 16384)


def _decision_line(w: CakeMxfp4MoEWrapper, t: int) -> str:
    """One token count's row of ``cake-moe decide``."""
    from .mxfp4_moe._decide import routes_per_expert
    d = w.decide(t)
    if not d.supported:
        return f"{t:>6} refused: {d.reason}"
    tile = d.tile + (f" or {d.alt_tile}" if d.alt_tile else "")
    gemms = ", ".join(f.removeprefix("mxfp4_moe_") for f in d.forms if f.startswith("mxfp4_moe_gemm"))
    mib = w.get_workspace_size(t) / 2**20
    return (f"{t:>6} {routes_per_expert(t, w.top_k, w.num_experts):>8.3g}  {d.path:8} {tile:18} "
            f"{'yes' if d.tile_sync else 'no':5} {mib:>6.1f} MiB  {gemms}")


def _decide_grouped_gemm(args) -> int:
    """Family A's default sm_90a forms for a layer (``--grouped-gemm H,I,E``): per routed-row count
    and weight, the fwd / dgrad / det wgrad forms the host would bind, the group sizes taken as
    the row count over E (the choice sees nothing else). Host only: no kernel runs."""
    import torch

    from .bench.grouped_gemm import TOKENS, weight_nk
    ext = _runtime.ext()
    on_device = torch.cuda.is_available()
    device = torch.cuda.current_device() if on_device else None
    sms = ext.device_sm_count(device) if on_device else 132
    narrow = (ext.device_narrow_memory(device) if on_device else False) if args.narrow_memory == "device" \
        else args.narrow_memory == "yes"
    h, i, e = args.grouped_gemm
    src = "the current device's" if on_device else "an H200's: no CUDA device"
    print(f"grouped GEMM (H, I, E) = ({h}, {i}, {e}): sm_90a forms with {sms} SMs ({src}), narrow memory "
          f"{'yes' if narrow else 'no'} ({src if args.narrow_memory == 'device' else '--narrow-memory'})")
    print(f"{'T':>7} {'rows/E':>7} {'weight':6} {'N':>6} {'K':>6}  {'fwd':24} {'dgrad':24} wgrad (det, bf16)")
    for t in args.tokens or TOKENS:
        for which in ("w13", "w2"):
            n, k = weight_nk(h, i, which)
            forms = [ext.grouped_gemm_sm90_default_form(op, 0, e, n, k, t, False, sms, narrow) for op in (0, 1, 2)]
            print(f"{t:>7} {t // e:>7} {which:6} {n:>6} {k:>6}  {forms[0]:24} {forms[1]:24} {forms[2]}")
    return 0


def cmd_decide(args) -> int:
    """Family B's decisions (the contract layouts, or ``--layer``): per token count, the path,
    the tile forms (with the one the device may take instead from the call's route counts), the
    per-tile sync, the workspace and the GEMM kernels ``plan()`` binds. Host only: no kernel runs.
    With ``--grouped-gemm``, family A's default forms instead."""
    import torch

    if args.grouped_gemm is not None:
        if args.layer is not None or any(v is not None for v in (args.local_experts, args.expert_offset, args.shard)):
            print("cake-moe decide: --grouped-gemm takes no family-B --layer or rank", file=sys.stderr)
            return 2
        return _decide_grouped_gemm(args)
    from .bench.mxfp4_moe import layer_of
    from .mxfp4_moe import CakeMxfp4MoEWrapper
    narrow = {"device": None, "yes": True, "no": False}[args.narrow_memory]
    layers = _family_b_layers(args, "decide")
    if layers is None:
        return 2
    try:
        wrappers = {("layer" if args.layer is not None else spec.name):
                    CakeMxfp4MoEWrapper(*spec.dims, **spec.rank, narrow_memory=narrow)
                    for spec in map(layer_of, layers)}
    except ValueError as err:
        print(f"cake-moe decide: {err}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device: a host-only wrapper's decisions (sm_90a, 132 SMs, an H200's unless --narrow-memory yes)")
    for name, w in wrappers.items():
        print(f"{name}: {w!r}")
        print(f"{'T':>6} {'T*k/E':>8}  {'path':8} {'tile':18} {'sync':5} {'workspace':>10}  GEMM kernels")
        for t in args.tokens or DECIDE_TOKENS:
            print(_decision_line(w, t))
    return 0


def _family_b_layers(args, cmd: str) -> tuple[str | Layer, ...] | None:
    """The family-B layers a command runs: ``--layer E,K,H,I`` with its rank options (a
    bench.mxfp4_moe.Layer), else the contract layouts of ``--layouts`` by name; None (after
    saying why) for rank options without a layer."""
    from .bench.mxfp4_moe import other_layer, rank_args
    rank = rank_args(args.local_experts, args.expert_offset, args.shard)
    if args.layer is None:
        if rank:
            print(f"cake-moe {cmd}: --local-experts, --expert-offset and --shard describe a --layer's rank",
                  file=sys.stderr)
            return None
        return tuple(args.layouts)
    return (other_layer(args.layer, rank),)


def cmd_demo(args) -> int:
    from . import demo
    return demo.main(tokens=args.tokens)


def cmd_bench(args) -> int:
    import torch
    layers = _family_b_layers(args, "bench")   # the arguments first: they need no GPU
    if layers is None:
        return 2
    if args.what != "mxfp4-moe" and args.layer is not None:
        print("cake-moe bench: --layer is mxfp4-moe's (grouped-gemm takes --layers H,I,E ...)", file=sys.stderr)
        return 2
    if args.what == "mxfp4-moe" and args.layer is not None:   # what the wrapper refuses
        from .bench.mxfp4_moe import layer_of
        from .mxfp4_moe import CakeMxfp4MoEWrapper
        spec = layer_of(layers[0])
        try:
            CakeMxfp4MoEWrapper(*spec.dims, **spec.rank)   # (a host-only wrapper without a GPU)
        except ValueError as err:
            print(f"cake-moe bench: --layer: {err}", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("cake-moe bench needs a CUDA GPU (none visible)")
        return 2
    why = _runtime.unserved_reason(torch.cuda.current_device())
    if why:
        print(f"cake-moe bench: {why}")
        return 2
    if args.what == "mxfp4-moe" and args.tiles:   # before any weights are made
        from .bench import mxfp4_moe as bench_moe
        from .mxfp4_moe import _decide
        for spec in (t for t in args.tiles.split(",") if t):
            try:
                form, _ = bench_moe._variant(spec)
            except ValueError as err:
                print(f"cake-moe bench: --tiles: {err}")
                return 2
            if form is not None and form not in _decide.TILES:
                print(f"cake-moe bench: --tiles: {spec!r} names no tile form (one of {', '.join(_decide.TILES)}, "
                      "or sync / nosync / FORM+sync / FORM+nosync)")
                return 2
    if args.what == "formats":
        from .bench import formats as bench_formats
        bench_formats.main(args.out)
    elif args.what == "grouped-gemm":
        from .bench import grouped_gemm as bench_gg
        bench_gg.main(args.out, ops=tuple(args.ops.split(",")), sweep=args.sweep,
                      tokens=tuple(args.tokens) if args.tokens else None, seed=args.seed,
                      rotate=not args.no_rotate, layers=args.layers)
    elif args.what == "mxfp4-moe":
        from .bench import mxfp4_moe as bench_moe
        bench_moe.main(args.out, tokens=tuple(args.tokens or bench_moe.TOKENS), layouts=layers,
                       tiles=tuple(t for t in args.tiles.split(",") if t))
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def _ops(text: str) -> str:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in ("fwd", "dgrad", "wgrad") for n in names):
        raise argparse.ArgumentTypeError(f"expected a comma list of fwd, dgrad, wgrad; got {text!r}")
    return ",".join(names)


def _out_prefix(text: str) -> str:
    import os
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder of {text!r} does not exist")
    return text


def _ints(text: str, count: int, names: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != count:
        raise argparse.ArgumentTypeError(f"expected {names} ({count} ints), got {text!r}")
    return dims


def _layer_dims(text: str) -> tuple[int, int, int, int]:
    e, k, h, i = _ints(text, 4, "E,K,H,I")
    return e, k, h, i


def _gg_layer(text: str) -> tuple[int, int, int]:
    h, i, e = _ints(text, 3, "H,I,E")
    if min(h, i, e) < 1 or h % 8 or i % 8:
        raise argparse.ArgumentTypeError(f"expected H,I,E positive, H and I multiples of 8, got {text!r}")
    return h, i, e


def _layouts(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or any(n not in ("ep8", "tp8") for n in names):
        raise argparse.ArgumentTypeError(f"expected a comma list of ep8, tp8; got {text!r}")
    return names


def _add_layer_arguments(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--layer E,K,H,I`` and its rank (decide, bench mxfp4-moe)."""
    parser.add_argument("--layer", type=_layer_dims, default=None, metavar="E,K,H,I",
                        help=f"{what}another layer instead of the contract layouts: experts, top_k, hidden and "
                             "intermediate size")
    parser.add_argument("--local-experts", type=_positive, default=None,
                        help="--layer: this rank's experts (expert parallel)")
    parser.add_argument("--expert-offset", type=int, default=None, help="--layer: the first local expert's id")
    parser.add_argument("--shard", type=_positive, default=None,
                        help="--layer: this rank's intermediate shard (MoE TP)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cake-moe", description="AOT-compiled MoE expert-layer kernels")
    p.add_argument("--version", action="version", version=f"cake-moe {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="build, forms, checksums and the current device").set_defaults(fn=cmd_info)
    d = sub.add_parser("demo", help="run the default MoE layer pieces on the GPU, check and time them")
    d.add_argument("--tokens", type=_positive, default=None,
                   help="token count of the format and grouped_mm steps (default 4096 on GPU, 64 on CPU); the "
                        "MXFP4 MoE step is always a decode step of 8 tokens")
    d.set_defaults(fn=cmd_demo)
    c = sub.add_parser("decide", help="the MXFP4 MoE layer's kernel forms per token count (host only)")
    c.add_argument("--layouts", default="ep8,tp8", type=_layouts, help="comma list of ep8,tp8")
    c.add_argument("--tokens", type=_positive, nargs="+", default=None,
                   help=f"token counts (default {' '.join(map(str, DECIDE_TOKENS))})")
    _add_layer_arguments(c)
    c.add_argument("--grouped-gemm", type=_gg_layer, default=None, metavar="H,I,E",
                   help="family A instead: the default sm_90a forms of this layer's w13 and w2 fwd / dgrad / wgrad "
                        "at --tokens routed rows (default the grid's 4096 16384 65536)")
    c.add_argument("--narrow-memory", choices=("device", "yes", "no"), default="device",
                   help="the decisions of a part with narrow DRAM bandwidth per SM (an H100 SXM: yes) or not "
                        "(an H200: no); device (default) reads the current device, an H200's without one")
    c.set_defaults(fn=cmd_decide)
    b = sub.add_parser("bench", help="benchmarks against their anchors, JSON + markdown")
    b.add_argument("what", choices=["formats", "grouped-gemm", "mxfp4-moe"])
    b.add_argument("--ops", default="fwd,dgrad,wgrad", type=_ops, help="grouped-gemm: comma list of fwd,dgrad,wgrad")
    b.add_argument("--out", default=None, type=_out_prefix, help="output prefix for .json/.md (its folder must exist)")
    b.add_argument("--sweep", action="store_true", help="grouped-gemm: also time every sm_90a tile")
    b.add_argument("--tokens", type=_positive, nargs="+", default=None,
                   help="token counts: mxfp4-moe (default 1 4 16 64 256 1024 4096 16384); grouped-gemm: "
                        "the grid's layers at these T instead of the PERF.md grid")
    b.add_argument("--seed", type=int, default=0,
                   help="grouped-gemm: draw other group sizes (0: the published grid's)")
    b.add_argument("--layers", type=_gg_layer, nargs="+", default=None, metavar="H,I,E",
                   help="grouped-gemm: these layers (hidden, intermediate size, experts; w13 and w2 rows at --tokens, "
                        "default the grid's) instead of the grid's")
    b.add_argument("--no-rotate", action="store_true",
                   help="grouped-gemm: time every row on one input set (operands that fit may stay in the L2)")
    b.add_argument("--layouts", default="ep8,tp8", type=_layouts, help="mxfp4-moe: comma list of ep8,tp8")
    _add_layer_arguments(b, "mxfp4-moe: ")
    b.add_argument("--tiles", default="", help="mxfp4-moe: also time these tile forms (comma list, e.g. n64,wg128; "
                   "sync / nosync or form+sync: the per-tile GEMM1 -> GEMM2 sync forced on / off)")
    b.set_defaults(fn=cmd_bench)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ImportError as e:    # no compiled extension: say so in one line, not a traceback
        if "cake_moe._ext" not in str(e):
            raise
        print(f"cake-moe {args.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
