"""How many ops one decode forward launches: ``python -m bench.op_count [--batch N]``.

A graph replay costs about one GPU kernel launch per op it holds, so at small model sizes
the op count, not the FLOPs, sets the time of a decode step. This runs one decode step of
the static (graph-shaped) path on the CPU under torch's profiler and counts the leaf aten ops
by name, and estimates the kernels a GPU would launch: each op in ``ONE_KERNEL`` counts once
with whatever it calls, every other leaf op counts once unless it is in ``FREE`` (views,
strides, allocations, dtype no-ops).
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from engine.assets import default_model_path
from engine.config import EngineConfig
from engine.models.loader import load_model
from engine.runner import Chunk, ModelRunner

ONE_KERNEL = {"aten::mm", "aten::addmm", "aten::mean", "aten::embedding", "aten::index", "aten::index_copy_",
              "aten::scaled_dot_product_attention", "aten::copy_"}
FREE = {"aten::t", "aten::transpose", "aten::reshape", "aten::split", "aten::split_with_sizes", "aten::expand",
        "aten::unsqueeze", "aten::slice", "aten::select", "aten::chunk", "aten::_unsafe_view", "aten::empty_like",
        "aten::alias", "aten::detach", "aten::as_strided", "aten::view", "aten::resolve_conj", "aten::empty", "aten::empty_strided",
        "aten::result_type", "aten::to", "aten::scalar_tensor"}  # no kernel (float32 on cpu: `to` is a no-op)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1, help="sequences in the decode step (default 1)")
    args = p.parse_args()
    model = load_model(default_model_path(), device="cpu", progress=False)
    runner = ModelRunner(model.model, EngineConfig(kv_cache_tokens=4096, cuda_graphs=True))
    seqs = [f"s{i}" for i in range(args.batch)]
    runner.run([Chunk(s, list(range(1, 21))) for s in seqs])
    runner.run([Chunk(s, [5]) for s in seqs])  # builds the bucket
    (bucket,) = runner.graphs._buckets.values()
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.graphs._forward(bucket)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    leaves = Counter(e.name for e in events if not any(c.name.startswith("aten::") for c in e.cpu_children))
    launching: Counter = Counter()

    def walk(e) -> None:
        children = [c for c in e.cpu_children if c.name.startswith("aten::")]
        if e.name in ONE_KERNEL or (not children and e.name not in FREE):
            launching[e.name] += 1
            return
        for c in children:
            walk(c)

    for e in events:
        if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"):
            walk(e)
    print(f"leaf aten ops per decode forward: {sum(leaves.values())}; "
          f"kernels a GPU would launch, about: {sum(launching.values())}")
    for name, n in sorted(launching.items(), key=lambda kv: -kv[1]):
        print(f"  {name:32s} {n}")


if __name__ == "__main__":
    main()
