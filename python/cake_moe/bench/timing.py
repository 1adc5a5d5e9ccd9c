"""CUDA-event timing and the copy-bandwidth ceiling, shared by every benchmark."""
from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable

import torch


def torch_grouped_mm() -> Callable[..., torch.Tensor] | None:
    """``torch._grouped_mm``, the peer the benchmarks and the demo time, or None where this torch
    has none (older releases): they then say so instead of timing it."""
    return getattr(torch, "_grouped_mm", None)


def cycling(fns: list[Callable[[], object]]) -> Callable[[], object]:
    """One callable that calls ``fns`` in turn, each call the next one's (input sets or routings
    rotated through a timed loop, so no call reads what the call before left in the L2)."""
    if len(fns) == 1:
        return fns[0]
    it = itertools.cycle(fns)
    return lambda: next(it)()


def time_cuda(fn: Callable[[], object], *, warmup: int = 3, iters: int = 10, reps: int = 20) -> float:
    """Median over ``reps`` of the mean milliseconds per call of ``fn()`` run ``iters`` times
    back to back between two CUDA events.

    A short GPU spin before the first event lets the host queue the calls ahead of the GPU, so
    the figure is device time, not Python launch overhead. For work of a few microseconds use
    CUDA-graph replay instead (see ``time_graph``).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)  # ~0.1 ms: time for the host to run ahead
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` callables in which each one directly follows every other equally often (a
    Williams design: ``n`` orders for even ``n``, ``2n`` for odd). A rotation keeps the cyclic
    order, so each callable always runs after the same one; what ran before can carry over (on
    the H200, of three launches of one dgrad kernel at T = 65536 timed in rotation, the one
    after torch's was the fastest in 8 runs of 8, by 2-7%)."""
    if n <= 1:
        return [list(range(n))]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    orders = [[(v + r) % n for v in first] for r in range(n)]
    return orders if n % 2 == 0 else orders + [o[::-1] for o in orders]


def time_interleaved(fns: dict[str, Callable[[], object]], *, rounds: int | None = None, iters: int = 3,
                     reps: int = 5, timer: Callable[..., float] = time_cuda,
                     order: str = "balanced") -> dict[str, float]:
    """Median milliseconds per call of each of ``fns``, timed in rounds that each call every
    callable once, so clock and power drift during a run falls on every callable alike: timing
    one after the other biases a ratio (at large sizes the later one ran up to 16% slower on the
    H200). ``order="balanced"`` (default) takes the rounds' orders from ``balanced_orders``
    (``rounds`` default: one full design, at least 4), so no callable always follows the same
    one; ``"rotate"`` starts each round one callable later. ``reps`` timed samples per callable
    and round, of ``iters`` back-to-back calls each: the median of the rounds' medians."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_order in round_orders(len(names), rounds, order):
        for idx in round_order:
            times[names[idx]].append(timer(fns[names[idx]], iters=iters, reps=reps))
    return {name: statistics.median(v) for name, v in times.items()}


def round_orders(n: int, rounds: int | None = None, order: str = "balanced") -> list[list[int]]:
    """The order of ``n`` callables in each of ``rounds`` interleaved rounds (time_interleaved):
    ``balanced`` cycles through ``balanced_orders`` (``rounds`` default: one full design, at
    least 4), ``rotate`` starts each round one callable later (default 4 rounds)."""
    if order == "balanced":
        orders = balanced_orders(n)
    elif order == "rotate":
        orders = [list(range(r, n)) + list(range(r)) for r in range(max(n, 1))]
    else:
        raise ValueError(f"order must be 'balanced' or 'rotate', got {order!r}")
    if rounds is None:
        rounds = max(4, len(orders)) if order == "balanced" else 4
    return [orders[r % len(orders)] for r in range(rounds)]


def time_graph(fn: Callable[[], object], *, calls: int = 50, reps: int = 20) -> float:
    """Median milliseconds per call of ``fn()`` captured ``calls`` times in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def time_wall(fn: Callable[[], object], *, warmup: int = 3, reps: int = 30) -> float:
    """Median host-clock milliseconds of one call of ``fn()``, from the call to the GPU's
    completion (synchronised before and after): what one eager call costs its caller, launch
    overhead included."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30, device: str = "cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)


def _strict(v):
    """JSON has no NaN or infinity: a figure a row does not measure (e.g. T > 64's eager naive
    call) is written as null, at any depth."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _strict(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_strict(x) for x in v]
    return v


def write_results(prefix: str, rows: list[dict], markdown: str, footer: str = "") -> None:
    """``prefix.json`` (one record per row) and ``prefix.md`` (GPU and date, the table, notes)."""
    import datetime
    import json
    with open(prefix + ".json", "w") as f:
        json.dump(_strict(rows), f, indent=1, allow_nan=False)
    with open(prefix + ".md", "w") as f:
        f.write(f"GPU: {gpu_name()}, {datetime.date.today().isoformat()}\n\n{markdown}\n")
        if footer:
            f.write(f"\n{footer}\n")


def publish(rows: list[dict], markdown: str, summary: str, out_prefix: str | None, plot) -> None:
    """Print a benchmark's table and summary; with ``out_prefix``, write ``.json`` / ``.md``
    (``write_results``) and ``plot(rows, out_prefix + ".png")``."""
    print(markdown)
    print(summary)
    if out_prefix:
        write_results(out_prefix, rows, markdown, summary)
        if plot(rows, out_prefix + ".png") is False:
            print("no PNG: matplotlib is not installed (pip install .[bench])")


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
