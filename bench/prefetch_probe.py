"""Do a decode forward's projections wait on DRAM? ``python -m bench.prefetch_probe``.

``bench.gemv_probe`` times a projection with its weights hot in L2 (the same weights 30 times); a model's
30 layers (~213 MB of bf16 weights for SmolLM2) do not fit the H100's 50 MB L2, so in a forward every
projection reads its weights from DRAM. This times SmolLM2's four projections per layer (q/k/v, o,
gate/up, down) over 30 layers of distinct weights at 1 to 5 rows, captured in one CUDA graph, against the
same with an L2 prefetch of layer i + ``ahead`` issued on a second stream when layer i starts
(``kernels.l2_prefetch``: a few programs, each issuing ``prefetch.global.L2`` over its share of the
layer's weight lines; the main stream never waits on it). Prints µs per forward and per projection.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bench.timing import graph_replay_ms

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # q/k/v, o, gate/up, down: (N, K)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,5", help="row counts, comma separated")
    p.add_argument("--ahead", default="0,1,2", help="layers prefetched ahead (0: no prefetch), comma separated")
    p.add_argument("--programs", default="16", help="programs of each prefetch launch, comma separated")
    p.add_argument("--modes", default="prefetch,load", help="kernels.l2_prefetch modes, comma separated")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--iters", type=int, default=200, help="graph replays timed")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    from kernels.l2_prefetch import l2_prefetch

    torch.manual_seed(0)
    sizes = [n * k for n, k in SHAPES]
    flat = [torch.randn(sum(sizes), device="cuda").div_(24).to(torch.bfloat16) for _ in range(args.layers)]
    weights = [[w.view(n, k) for w, (n, k) in zip(buf.split(sizes), SHAPES)] for buf in flat]
    out = []
    aheads = [a for a in map(int, args.ahead.split(",")) if a > 0]
    variants = [(0, "none", 0)] + [(a, mode, int(n)) for a in aheads for mode in args.modes.split(",")
                                   for n in args.programs.split(",")]
    for rows in map(int, args.rows.split(",")):
        x0 = torch.randn(rows, 576, device="cuda").to(torch.bfloat16)
        for ahead, mode, programs in variants:
            side = torch.cuda.Stream()

            def forward() -> torch.Tensor:
                x = x0
                main = torch.cuda.current_stream()
                if ahead:
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        for j in range(min(ahead, args.layers)):
                            l2_prefetch(flat[j], programs, mode)
                for i, (wqkv, wo, wgu, wd) in enumerate(weights):
                    if ahead and i + ahead < args.layers:
                        side.wait_stream(main)  # layer i has started: fetch layer i + ahead beside it
                        with torch.cuda.stream(side):
                            l2_prefetch(flat[i + ahead], programs, mode)
                    h = F.linear(x, wqkv)[:, :576]
                    h = F.linear(h, wo)
                    h = F.linear(h, wgu)[:, :1536]
                    x = F.linear(h, wd)
                if ahead:
                    main.wait_stream(side)
                return x

            want = forward()
            ms, got = graph_replay_ms(forward, args.iters)
            assert torch.equal(got, want), "the replayed forward differs from the eager one"
            us = ms * 1e3
            per = us / (4 * args.layers)
            out.append({"rows": rows, "ahead": ahead, "mode": mode, "programs": programs,
                        "us_per_forward": round(us, 1), "us_per_projection": round(per, 2)})
            print(f"rows {rows}  ahead {ahead}  {mode:8s} {programs:3d} programs  {us:7.1f} us a forward, "
                  f"{per:5.2f} us a projection", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
