"""GPU time of the static attention launch alone: ``python -m bench.attention_probe``.

For each (rows, q_len, context[, capacity]) it builds a paged cache as the engine's buckets have it (every row
holding ``context`` keys; the split count from ``split_plan`` at the bucket's capacity, by default the context
itself), captures 30 launches (a forward's layers) in one CUDA graph and reports the time per launch (CUDA events
over the replays), and the registers and spills of each compiled kernel of ``kernels.static_attention``. Run it
in an older tree (``PYTHONPATH``) for an A/B of the kernel alone.
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.timing import graph_replay_ms


def probe(rows: int, q_len: int, context: int, iters: int, force_splits: int | None = None,
          capacity: int | None = None) -> dict:
    import kernels.static_attention as sa

    hq, hkv, d, bs = 9, 3, 64, 16
    blocks_per_row = max(-(-(context + q_len) // bs) + 1, -(-(capacity or 0) // bs))
    splits = sa.split_plan(rows, hkv, blocks_per_row * bs)
    splits = force_splits or splits
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    nb = rows * blocks_per_row + 1
    kc = torch.randn(nb, bs, hkv, d, device=dev, generator=g).to(dt)
    vc = torch.randn(nb, bs, hkv, d, device=dev, generator=g).to(dt)
    table = (torch.arange(rows * blocks_per_row, device=dev).view(rows, blocks_per_row) + 1)
    lens = torch.full((rows,), context + q_len, dtype=torch.long, device=dev)
    t = rows * q_len
    q = torch.randn(t, hq, d, device=dev, generator=g).to(dt)
    k = torch.randn(t, hkv, d, device=dev, generator=g).to(dt)
    v = torch.randn(t, hkv, d, device=dev, generator=g).to(dt)
    cos = torch.rand(t, 1, d // 2, device=dev, generator=g)
    sin = torch.rand(t, 1, d // 2, device=dev, generator=g)
    extra = {}
    if "tickets" in sa.static_attention.__code__.co_varnames:
        extra["tickets"] = torch.zeros(rows * hkv, dtype=torch.int32, device=dev)

    def launch():
        return sa.static_attention(q, k, v, cos, sin, kc, vc, table, lens, q_len, splits, **extra)

    want = launch()
    torch.cuda.synchronize()
    ms, outs = graph_replay_ms(lambda: [launch() for _ in range(30)], iters)
    assert torch.equal(outs[-1], want), "a replayed launch differs from the eager one"
    regs = {}
    for name in dir(sa):
        fn = getattr(sa, name)
        for cache in getattr(fn, "device_caches", {}).values():
            for compiled in cache[0].values():
                regs[name] = (getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None))
    return {"rows": rows, "q_len": q_len, "context": context, "capacity": blocks_per_row * bs, "splits": splits,
            "us_per_launch": round(ms * 1e3 / 30, 2), "regs_spills": regs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="1x1x256,1x5x256,4x1x256,4x5x256,1x1x1024,16x5x512",
                   help="rows x q_len x context[ x capacity: the bucket's tokens a row], comma separated")
    p.add_argument("--iters", type=int, default=50, help="graph replays timed (30 launches each)")
    p.add_argument("--split-chunk", type=int,
                   help="splits the in-launch merge loads at a time (a power of two; the kernel of commit ba21b71)")
    p.add_argument("--splits", default="plan",
                   help="split counts to time per case, comma separated: plan (split_plan's) or a number")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    if args.split_chunk:
        import kernels.static_attention as sa

        sa.SPLIT_CHUNK = args.split_chunk
    rows = []
    for case in args.cases.split(","):
        r, q, c, *cap = (int(x) for x in case.split("x"))
        for splits in args.splits.split(","):
            rows.append(probe(r, q, c, args.iters, None if splits == "plan" else int(splits), cap[0] if cap else None))
            print(json.dumps(rows[-1]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
