"""Family B benchmark entry point: ``python bench/mxfp4_moe.py [ARGS]`` is
``cake-moe bench mxfp4-moe [ARGS]`` (the same flags: --out, --tokens, --layouts, --tiles, or
--layer E,K,H,I [--local-experts L --expert-offset O | --shard S] for another layer)."""
import sys

from cake_moe.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "mxfp4-moe", *sys.argv[1:]]))
