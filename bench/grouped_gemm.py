"""Family A benchmark entry point: ``python bench/grouped_gemm.py [ARGS]`` is
``cake-moe bench grouped-gemm [ARGS]`` (the same flags: --out, --ops, --sweep, --tokens, --seed,
--layers, --no-rotate)."""
import sys

from cake_moe.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "grouped-gemm", *sys.argv[1:]]))
