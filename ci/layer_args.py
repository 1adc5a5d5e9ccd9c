"""The layer options of the family-B tools in ci/: LAYOUT (ep8, tp8, or ``layer`` with
``--layer E,K,H,I`` and its rank: ``--rank-experts L --expert-offset O`` or ``--shard S``, as
`cake-moe decide --layer` takes them; the rank's expert count is named ``--rank-experts`` here
because ``--local-experts`` is a routing option of ci/profile_moe.py)."""
import argparse

from cake_moe import cli
from cake_moe.bench import mxfp4_moe as b


def add(ap: argparse.ArgumentParser) -> None:
    """LAYOUT and the --layer options."""
    ap.add_argument("layout", choices=sorted(b.LAYOUTS) + ["layer"], help="a contract layout, or layer (--layer)")
    ap.add_argument("--layer", type=cli._layer_dims, default=None, metavar="E,K,H,I",
                    help="LAYOUT layer: experts, top_k, hidden and intermediate size")
    ap.add_argument("--rank-experts", type=int, default=None, help="--layer: this rank's experts")
    ap.add_argument("--expert-offset", type=int, default=None, help="--layer: the first local expert's id")
    ap.add_argument("--shard", type=int, default=None, help="--layer: this rank's intermediate shard")


def spec(ap: argparse.ArgumentParser, args: argparse.Namespace) -> "str | b.Layer":
    """The layer the options name (b.rank_layer's argument); exits through ``ap.error`` when
    LAYOUT and --layer disagree."""
    if (args.layout == "layer") != (args.layer is not None):
        ap.error("LAYOUT layer goes with --layer E,K,H,I (and a contract layout without it)")
    if args.layer is None:
        if b.rank_args(args.rank_experts, args.expert_offset, args.shard):
            ap.error("--rank-experts, --expert-offset and --shard describe a --layer's rank")
        return args.layout
    return b.other_layer(args.layer, b.rank_args(args.rank_experts, args.expert_offset, args.shard))
