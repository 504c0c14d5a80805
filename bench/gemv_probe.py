"""GPU time of a decode-sized projection alone: ``python -m bench.gemv_probe``.

A forward at batch 1 spends ~45 % of its GPU time in 120 projections of one to five rows (cuBLAS picks
``nvjet`` GEMM tiles of 8 x 64 for them: ~3.5-4 µs a launch on an H100, while the weights take ~0.3-1.2 µs
to read). This times, per SmolLM2 shape (q/k/v, o, gate/up, down) and row count, 30 launches captured in one
CUDA graph (a forward's layers; CUDA events over the replays), for:

- ``cublas``: ``F.linear`` (what the model runs);
- ``cublas-mv``: W @ x^T (cuBLAS's GEMV layout for one row);
- ``triton n<BN> k<BK> w<W>``: a CUDA-core GEMV here (each program ``BN`` output columns over all of K,
  ``BK`` at a time, every row of the batch), over a small grid of launch configurations.

Every variant's output is checked against ``F.linear`` (float32 accumulation; bfloat16 rounding apart) before
it is timed. A probe, not an engine path: nothing in the engine calls the kernel here.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bench.timing import graph_replay_ms

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # (N, K)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    # x [M, K], w [N, K], y [M, N], all contiguous; one program: BLOCK_N columns of every row
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    live_n = cols < N
    live_m = rows < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):  # unrolled: every load of the program issued at once
        kk = k0 + tl.arange(0, BLOCK_K)
        live_k = kk < K
        x = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=live_m[:, None] & live_k[None, :], other=0.0)
        w = tl.load(w_ptr + cols[:, None] * K + kk[None, :], mask=live_n[:, None] & live_k[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=live_m[:, None] & live_n[None, :])


def triton_gemv(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, warps: int) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, w, y, m, n, k, BLOCK_M=max(1, triton.next_power_of_2(m)),
                                             BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return y


def time_launches(fn: Callable[[], torch.Tensor], iters: int) -> float:
    """µs per launch: 30 launches in one captured graph (``bench.timing.graph_replay_ms``)."""
    ms, _ = graph_replay_ms(lambda: [fn() for _ in range(30)], iters)
    return ms * 1e3 / 30


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,5", help="row counts, comma separated")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {list(SHAPES)}")
    p.add_argument("--configs", default="4x128x2,8x128x4,8x256x4,16x64x4,16x128x4,32x64x4",
                   help="Triton launch configurations BNxBKxWARPS, comma separated")
    p.add_argument("--iters", type=int, default=100, help="graph replays timed (30 launches each)")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    torch.manual_seed(0)
    rows_out = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(torch.bfloat16)
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            want = F.linear(x.float(), w.float())
            variants: dict[str, Callable[[], torch.Tensor]] = {
                "cublas": lambda: F.linear(x, w), "cublas-mv": lambda: (w @ x.t()).t()}
            for c in args.configs.split(","):
                bn, bk, wp = map(int, c.split("x"))
                variants[f"triton n{bn} k{bk} w{wp}"] = (lambda bn=bn, bk=bk, wp=wp: triton_gemv(x, w, bn, bk, wp))
            for label, fn in variants.items():
                got = fn().float()
                err = (got - want).abs().max().item()
                us = time_launches(fn, args.iters)
                rows_out.append({"shape": name, "n": n, "k": k, "rows": m, "variant": label, "us": round(us, 2),
                                 "max_err": round(err, 4)})
                print(f"{name:8s} rows {m}  {label:22s} {us:6.2f} us  (max err {err:.4f})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
