"""Per-request token timing for the benches: time to first token and inter-token latency.

A round commits several tokens of a request at once; as the gateway's metrics do, the gap
since the request's previous tokens is spread evenly over the tokens of the round, so a
speculative round of 3 tokens after 30 ms counts as three 10 ms inter-token latencies.

torch is imported by the clocks that read the device, not by the module: the load clients of ``tandem bench-serve``
(bench/serve_load.py, a process each) take ``percentile`` from here and never load torch.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

T = TypeVar("T")


def graph_replay_ms(record: Callable[[], T], iters: int) -> tuple[float, T]:
    """The GPU probes' clock: ``record`` run 3 times eagerly on a side stream (kernels compiled, memory pooled), then
    captured in one CUDA graph, replayed 10 times untimed and ``iters`` times between CUDA events -> (ms per replay,
    what ``record`` returned under capture: its outputs, written by every replay)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            record()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = record()
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters, out


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class TokenClock:
    """Arrival, first-token and per-token times of the requests of one run (seconds, perf_counter)."""

    arrival: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)

    def arrive(self, request_id: str, at: float | None = None) -> None:
        self.arrival[request_id] = time.perf_counter() if at is None else at

    def tokens(self, request_id: str, n: int, now: float) -> None:
        if n == 0:
            return
        prev = self.last.get(request_id)
        if prev is None:
            self.ttft.append(now - self.arrival[request_id])
        else:
            self.itl.extend([(now - prev) / n] * n)
        self.last[request_id] = now

    def summary(self) -> dict:
        ms = 1e3
        return {"ttft_ms_p50": _round(percentile(self.ttft, 50), ms), "ttft_ms_p99": _round(percentile(self.ttft, 99), ms),
                "itl_ms_p50": _round(percentile(self.itl, 50), ms), "itl_ms_p99": _round(percentile(self.itl, 99), ms)}


def _round(x: float | None, scale: float) -> float | None:
    return None if x is None else round(x * scale, 3)


def now_synced() -> float:
    """perf_counter after the device has finished its queued work (the tokens really exist)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def peak_memory_mib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None


def reset_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


class PhaseTimer:
    """Wall time of named phases of a round, without adding host syncs: CUDA events on the GPU
    (read once at the end), perf_counter on the CPU. Wrap callables with ``wrap``."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.marks: dict[str, list] = {}

    def _mark(self):
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = self._mark()
            try:
                return fn(*args, **kwargs)
            finally:
                self.marks.setdefault(name, []).append((start, self._mark()))
        return timed

    def total_ms(self, name: str) -> float:
        pairs = self.marks.get(name, [])
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) for a, b in pairs)
        return sum(b - a for a, b in pairs) * 1e3

    def count(self, name: str) -> int:
        return len(self.marks.get(name, []))


class GcClock:
    """Python's garbage collections while it is entered (``with GcClock() as gc_clock``): how many of each
    generation and the milliseconds spent in them. A full (generation 2) collection walks every tracked object of
    the process, the loaded model's, tokenizer's and datasets' too (bench/RESULTS.md: 140-260 ms on a 2-core CPU)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.ms = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.ms += (time.perf_counter() - self._start) * 1e3

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"gc_collections": sum(self.count), "gc_full": self.count[2], "gc_ms": round(self.ms, 2)}


class CompileClock:
    """Kernels built while it is entered (``with CompileClock() as compiles``): Triton JIT compiles (a kernel's first
    call with a new specialization: its constexprs, its dtypes, which integer arguments equal 1 or divide by 16; a
    compile found in Triton's disk cache counts too, it still takes milliseconds) with the milliseconds they took,
    and CUDA graphs captured (``engine.graphs.captured``). Inside a bench case's timed passes either means its
    warm-up missed a path the case runs."""

    def __init__(self) -> None:
        self.compiles = 0
        self.ms = 0.0
        self.graphs = 0
        self._start = 0.0
        self._graphs0 = 0
        self.kernels: set[str] = set()  # the compiled kernels' names

    def _before(self, **_) -> None:  # triton.knobs.runtime.jit_cache_hook: falsy, so the compile goes on
        self._start = time.perf_counter()

    def _after(self, fn=None, **_) -> None:  # jit_post_compile_hook
        self.compiles += 1
        self.kernels.add(getattr(fn, "name", "?"))
        self.ms += (time.perf_counter() - self._start) * 1e3

    def __enter__(self) -> "CompileClock":
        from triton import knobs

        from engine.graphs import captured

        if (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) != (None, None):
            raise RuntimeError("CompileClock: Triton's JIT hooks are taken by someone else")
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = self._before, self._after
        self._graphs0 = captured()
        return self

    def __exit__(self, *exc) -> None:
        from triton import knobs

        from engine.graphs import captured

        knobs.runtime.jit_cache_hook = knobs.runtime.jit_post_compile_hook = None  # free, as __enter__ found them
        self.graphs = captured() - self._graphs0

    def summary(self) -> dict:
        return {"jit_compiles": self.compiles, "jit_ms": round(self.ms, 1), "jit_kernels": sorted(self.kernels),
                "graphs_captured": self.graphs}
