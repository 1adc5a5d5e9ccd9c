"""Run by test_concurrency_gpu.py in a fresh interpreter (so that the threads' first calls also
race to load the kernels): several threads, each on a CUDA stream of its own, start together and
repeat one operator (grouped GEMM fwd / dgrad / det wgrad one-shot calls, the wgrad on short
groups and on long ones, which it splits over a per-stream workspace; a family-B plan of their
own) on one of two input sets of the same shapes (a swap between the sets would show; threads
of the same set share the kept launches). After the threads, each (operator, set) runs once on
the default stream on the launches they kept, then with the one-shot cache off (every call
checks and binds anew: the reference). Prints one JSON object:
{"wgrad_forms": {op: form}, "threaded": {op: [[digest, ...] per set]},
"serial": {op: [digest per set]}, "kept": {op: [digest per set]}, "finite": {op: bool}}.

    python tests/concurrency_worker.py THREADS REPEATS
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cake_moe  # noqa: E402
from grouped_gemm_cases import bf16, offsets, random_sizes  # noqa: E402
from mxfp4_moe_cases import GENERAL, Layer, make_case  # noqa: E402

OPS = ("fwd", "dgrad", "wgrad", "wgrad_split", "moe")
SETS = 2


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def grouped_runs(s: int) -> tuple[dict[str, Callable[[], torch.Tensor]], Callable[[], dict[str, str]]]:
    """The grouped-GEMM one-shot calls of input set ``s`` (same shapes and groups in every set),
    and the forms its two wgrad calls take."""
    sizes = random_sizes(3000, 8, seed=5)  # ragged, some groups small
    seed = 10 * s
    x = bf16(sum(sizes), 384, seed=seed + 1)
    w = bf16(len(sizes), 512, 384, seed=seed + 2, scale=0.05)
    g = bf16(sum(sizes), 512, seed=seed + 3)
    offs = offsets(sizes)
    # groups of ~1500 rows: the det wgrad splits them over a per-stream workspace (groups of at
    # most 512 rows on average take the cluster-pair form, which needs none)
    long_sizes = random_sizes(12000, 8, seed=6)
    xl, gl, offs_l = bf16(12000, 256, seed=seed + 4), bf16(12000, 256, seed=seed + 5), offsets(long_sizes)
    runs = {
        "fwd": lambda: cake_moe.grouped_gemm_fwd(x, w, offs),
        "dgrad": lambda: cake_moe.grouped_gemm_dgrad(g, w, offs),
        "wgrad": lambda: cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det"),
        "wgrad_split": lambda: cake_moe.grouped_gemm_wgrad(gl, xl, offs_l, variant="det"),
    }
    return runs, lambda: {op: cake_moe.prepare_grouped_gemm_wgrad(*a, variant="det").form
                          for op, a in (("wgrad", (g, x, offs)), ("wgrad_split", (gl, xl, offs_l)))}


def main(threads: int, repeats: int) -> None:
    sets = [grouped_runs(s) for s in range(SETS)]
    runs = [r for r, _ in sets]
    layer = Layer(GENERAL["h512_e40_k5"], seed=7)  # host-only until plan(): no kernel loaded yet
    cases = [make_case(layer.geom, 129, "zipf", seed=8 + 10 * s) for s in range(SETS)]
    for s in range(SETS):
        runs[s]["moe"] = lambda c=cases[s]: moe_run(layer, c)

    def serial() -> dict[str, list[str]]:
        return {op: [digest(runs[s][op]()) for s in range(SETS)] for op in OPS}

    results: dict[str, list[list[torch.Tensor]]] = {op: [[] for _ in range(SETS)] for op in OPS}
    lock = threading.Lock()
    start = threading.Barrier(threads, timeout=300)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        op, s = OPS[i % len(OPS)], (i // len(OPS)) % SETS
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                start.wait()
                if op == "moe":   # a plan of this thread's own, run repeatedly
                    plan, out = layer.plan(cases[s])
                    mine = []
                    for _ in range(repeats):
                        out.fill_(float("nan"))
                        plan.run()
                        mine.append(out.clone())
                else:
                    mine = [runs[s][op]() for _ in range(repeats)]
            stream.synchronize()
            with lock:
                results[op][s].extend(mine)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            start.abort()   # the others stop waiting for this thread

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    torch.cuda.synchronize()
    kept = serial()
    os.environ["CAKE_MOE_ONE_SHOT_CACHE"] = "0"   # the reference: every call checks and binds anew
    fresh = serial()
    finite = {op: all(bool(torch.isfinite(t.float()).all()) and bool(t.ne(0).any())
                      for t in (runs[s][op]() for s in range(SETS))) for op in OPS}
    print(json.dumps({
        "wgrad_forms": sets[0][1](),
        "threaded": {op: [[digest(t) for t in per_set] for per_set in results[op]] for op in OPS},
        "serial": fresh,
        "kept": kept,
        "finite": finite,
    }))


def moe_run(layer: Layer, case) -> torch.Tensor:
    """A fresh plan (its own workspace and output) run once."""
    plan, out = layer.plan(case)
    out.fill_(float("nan"))
    plan.run()
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
