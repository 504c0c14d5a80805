"""Launch configurations of kernels.norm_linear against the separate steps (norm kernel + cuBLAS), on a GPU.

``python -m bench.norm_linear_sweep [--rows 1,5,16]``: for SmolLM2-135M's three fused projections (q/k/v
and gate/up after add + RMSNorm, down after SwiGLU's gate) and each row count, the microseconds one launch
takes inside a CUDA graph of 50 (bfloat16), per configuration, beside the two-launch path it replaces.
"""

from __future__ import annotations

import argparse
import itertools

import torch

SHAPES = {"qkv": ("norm", 576, 960), "gate_up": ("norm", 576, 3072), "down": ("silu", 1536, 576)}
CONFIGS = ([dict(dot=True, block_n=bn, block_k=bk, num_warps=4)
            for bn, bk in itertools.product((16, 32, 64), (64, 128, 256))]
           + [dict(dot=False, block_n=bn, block_k=bk, num_warps=w)
              for bn, bk, w in itertools.product((16, 32, 64), (32, 64, 128), (1, 2, 4))])


def _time_us(fn, launches: int = 50, replays: int = 20) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (launches * replays)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,5,16")
    args = p.parse_args()
    from kernels.fused_norm import add_rmsnorm
    from kernels.norm_linear import add_norm_linear, silu_mul_linear
    from kernels.silu_mul import silu_mul

    torch.manual_seed(0)
    dt = torch.bfloat16
    for name, (kind, k, n) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dt)
        nw = torch.ones(k, device="cuda", dtype=dt)
        for m in (int(r) for r in args.rows.split(",")):
            if kind == "norm":
                x, d = torch.randn(m, k, device="cuda", dtype=dt), torch.randn(m, k, device="cuda", dtype=dt)
                base = lambda: torch.nn.functional.linear(add_rmsnorm(x, d, nw, 1e-5)[1], w)  # noqa: E731
                fused = lambda c: add_norm_linear(x, d, nw, 1e-5, w, None, c)  # noqa: E731
            else:
                x = torch.randn(m, 2 * k, device="cuda", dtype=dt)
                base = lambda: torch.nn.functional.linear(silu_mul(x), w)  # noqa: E731
                fused = lambda c: silu_mul_linear(x, w, c)  # noqa: E731
            cublas = _time_us(lambda: torch.nn.functional.linear(x[:, :k], w))
            results = sorted((_time_us(lambda c=c: fused(c)), c) for c in CONFIGS)
            print(f"{name:8s} rows {m:2d}: separate {_time_us(base):6.2f} us (cuBLAS alone {cublas:5.2f}); fused best "
                  + "; ".join(f"{t:5.2f} us {c}" for t, c in results[:3]) + f"; worst {results[-1][0]:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
