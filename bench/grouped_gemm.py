"""Family A benchmark entry point: ``python bench/grouped_gemm.py [--out PREFIX]``
(the same as ``cake-moe bench grouped-gemm``)."""
import argparse

from cake_moe.bench import grouped_gemm

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--ops", default="fwd,dgrad,wgrad")
    a = ap.parse_args()
    grouped_gemm.main(a.out, ops=tuple(a.ops.split(",")))
