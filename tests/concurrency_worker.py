"""Run by test_concurrency_gpu.py in a fresh interpreter (so that the threads' first calls also
race to load the kernels): several threads, each on a CUDA stream of its own, start together and
repeat one operator (grouped GEMM fwd / dgrad / det wgrad one-shot calls, the wgrad on short
groups and on long ones, which it splits over a per-stream workspace; a family-B plan of their
own); then the main thread runs each operator once on the default stream. Prints one JSON
object: {"wgrad_forms": {op: form}, "threaded": {op: [digest, ...]}, "serial": {op: digest},
"finite": {op: bool}}.

    python tests/concurrency_worker.py THREADS REPEATS
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cake_moe  # noqa: E402
from grouped_gemm_cases import bf16, offsets, random_sizes  # noqa: E402
from mxfp4_moe_cases import GENERAL, Layer, make_case  # noqa: E402

OPS = ("fwd", "dgrad", "wgrad", "wgrad_split", "moe")


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def main(threads: int, repeats: int) -> None:
    sizes = random_sizes(3000, 8, seed=5)  # ragged, some groups small
    x = bf16(sum(sizes), 384, seed=1)
    w = bf16(len(sizes), 512, 384, seed=2, scale=0.05)
    g = bf16(sum(sizes), 512, seed=3)
    offs = offsets(sizes)
    # groups of ~1500 rows: the det wgrad splits them over a per-stream workspace (groups of at
    # most 512 rows on average take the cluster-pair form, which needs none)
    long_sizes = random_sizes(12000, 8, seed=6)
    xl, gl, offs_l = bf16(12000, 256, seed=4), bf16(12000, 256, seed=5), offsets(long_sizes)
    layer = Layer(GENERAL["h512_e40_k5"], seed=7)  # host-only until plan(): no kernel loaded yet
    case = make_case(layer.geom, 129, "zipf", seed=8)
    torch.cuda.synchronize()

    def moe_run() -> torch.Tensor:  # a plan per call site: its own workspace and output
        plan, out = layer.plan(case)
        plan.run()
        return out

    runs = {
        "fwd": lambda: cake_moe.grouped_gemm_fwd(x, w, offs),
        "dgrad": lambda: cake_moe.grouped_gemm_dgrad(g, w, offs),
        "wgrad": lambda: cake_moe.grouped_gemm_wgrad(g, x, offs, variant="det"),
        "wgrad_split": lambda: cake_moe.grouped_gemm_wgrad(gl, xl, offs_l, variant="det"),
    }
    results: dict[str, list[torch.Tensor]] = {op: [] for op in OPS}
    lock = threading.Lock()
    start = threading.Barrier(threads, timeout=300)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        op = OPS[i % len(OPS)]
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                start.wait()
                if op == "moe":
                    plan, out = layer.plan(case)
                    mine = []
                    for _ in range(repeats):
                        out.fill_(float("nan"))
                        plan.run()
                        mine.append(out.clone())
                else:
                    mine = [runs[op]() for _ in range(repeats)]
            stream.synchronize()
            with lock:
                results[op].extend(mine)
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
    serial = {op: (moe_run() if op == "moe" else runs[op]()) for op in OPS}
    torch.cuda.synchronize()
    forms = {op: cake_moe.prepare_grouped_gemm_wgrad(*a, variant="det").form
             for op, a in (("wgrad", (g, x, offs)), ("wgrad_split", (gl, xl, offs_l)))}
    print(json.dumps({
        "wgrad_forms": forms,
        "threaded": {op: [digest(t) for t in results[op]] for op in OPS},
        "serial": {op: digest(t) for op, t in serial.items()},
        "finite": {op: bool(torch.isfinite(t.float()).all()) and bool(t.ne(0).any()) for op, t in serial.items()},
    }))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
