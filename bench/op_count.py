"""How many ops a step launches: ``python -m bench.op_count [--batch N] [--step forward|rejection|chain]``.

A graph replay costs about one GPU kernel launch per op it holds, so at small model sizes
the op count, not the FLOPs, sets the time of a decode step. This runs the step's torch path on
the CPU under torch's profiler, counts the leaf aten ops by name, and estimates the kernels a GPU
would launch: each op in ``ONE_KERNEL`` counts once with whatever it calls, every other leaf op
counts once unless it is in ``FREE`` (views, strides, allocations, dtype no-ops). A rough count:
an op that only allocates below it (``where``, ``gather``, ``cat`` into a new tensor) is missed, and
an allocation (``resize_``) counts. Steps:

- ``forward``: one decode forward of the static (graph-shaped) path;
- ``rejection``: a round's sampled acceptance, ``rejection_sample``'s torch steps over SmolLM2's
  vocabulary (on CUDA: ``kernels.rejection_accept``, one launch and a memset);
- ``chain``: a round launched ahead building its inputs, ``engine.rounds.chained.chain``'s torch steps
  (on CUDA: ``kernels.next_inputs``, one launch).
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

ONE_KERNEL = {"aten::mm", "aten::addmm", "aten::mean", "aten::embedding", "aten::index", "aten::index_copy_",
              "aten::scaled_dot_product_attention", "aten::copy_"}
FREE = {"aten::t", "aten::transpose", "aten::reshape", "aten::split", "aten::split_with_sizes", "aten::expand",
        "aten::unsqueeze", "aten::slice", "aten::select", "aten::chunk", "aten::_unsafe_view", "aten::empty_like",
        "aten::alias", "aten::detach", "aten::as_strided", "aten::view", "aten::resolve_conj", "aten::empty", "aten::empty_strided",
        "aten::result_type", "aten::to", "aten::scalar_tensor"}  # no kernel (float32 on cpu: `to` is a no-op)
VOCAB = 49152  # SmolLM2's


def count(step: Callable[[], object]) -> tuple[Counter, Counter]:
    """Run ``step`` once under the profiler -> (leaf aten ops by name, estimated GPU kernel launches by name)."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
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
    return leaves, launching


def _forward(batch: int, k: int) -> Callable[[], object]:
    from engine.assets import default_model_path
    from engine.config import EngineConfig
    from engine.models.loader import load_model
    from engine.runner import Chunk, ModelRunner

    model = load_model(default_model_path(), device="cpu", progress=False)
    runner = ModelRunner(model.model, EngineConfig(kv_cache_tokens=4096, cuda_graphs=True))
    seqs = [f"s{i}" for i in range(batch)]
    runner.run([Chunk(s, list(range(1, 21))) for s in seqs])
    runner.run([Chunk(s, [5]) for s in seqs])  # builds the bucket
    (bucket,) = runner.graphs._buckets.values()
    return lambda: runner.graphs._forward(bucket)


def _rejection(batch: int, k: int) -> Callable[[], object]:
    from engine.sampling.rejection import rejection_sample

    g = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(batch, k + 1, VOCAB, generator=g), -1)
    draft = torch.softmax(torch.randn(batch, k, VOCAB, generator=g), -1)
    drafts = torch.randint(0, VOCAB, (batch, k), generator=g)
    args = (drafts, torch.full((batch,), k), target, draft, torch.rand(batch, k, generator=g),
            torch.empty(batch, VOCAB).exponential_(generator=g))
    return lambda: rejection_sample(*args)


def _chain(batch: int, k: int) -> Callable[[], object]:
    from engine.rounds.chained import chain

    inputs, kv_lens = torch.zeros(batch, k + 2, dtype=torch.long), torch.full((batch,), 100)
    committed, accepted = torch.zeros(batch, k + 1, dtype=torch.long), torch.zeros(batch, dtype=torch.long)
    drafts = torch.zeros(batch, k, dtype=torch.long) if k else None
    return lambda: chain(inputs, kv_lens, committed, accepted, drafts)


STEPS = {"forward": _forward, "rejection": _rejection, "chain": _chain}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1, help="rows in the step (default 1)")
    p.add_argument("--step", choices=sorted(STEPS), default="forward", help="what to count (default forward)")
    p.add_argument("--k", type=int, default=4, help="drafts per row, for rejection and chain (default 4)")
    args = p.parse_args()
    leaves, launching = count(STEPS[args.step](args.batch, args.k))
    print(f"{args.step}, batch {args.batch}: leaf aten ops {sum(leaves.values())}; "
          f"kernels a GPU would launch, about: {sum(launching.values())}")
    for name, n in sorted(launching.items(), key=lambda kv: -kv[1]):
        print(f"  {name:32s} {n}")


if __name__ == "__main__":
    main()
