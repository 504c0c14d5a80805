"""Tokens a round that draft trees commit in the engine itself: ``python -m bench.tree_acceptance`` (any device).

Each tree of ``--trees`` (``chain``: the head's chain of k 4; ``chain:K`` of k K; a tree at k its depth) decodes the
same held-out prompts through fused rounds (on a CPU run eagerly, as the tests run them) with the default drafter,
and one JSON line reports its rounds, tokens a round (tau) and, greedy, whether every output equals the first
configuration's (greedy output must not change). ``--temperature``: sampled, prompt i with seed ``--seed`` + i (a
chain's sampled drafts verified against their q; a tree's rows walk it, ``tree_rejection_sample``).
Tokens a round only: a CPU's time says nothing of a GPU's (``tandem bench --spec-tree`` measures that).
"""

from __future__ import annotations

import argparse
import json
import time

from bench.datasets import held_out_prompts
from engine.assets import default_model_path
from engine.config import EngineConfig, SamplingParams
from engine.factory import decoder_for
from engine.models.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="humaneval", choices=("humaneval", "sharegpt"))
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--trees", default="chain 2,1,1,1 2,2,1,1 3,2,1,1", help="space-separated: chain or B1,..,Bk")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    ap.add_argument("--seed", type=int, default=0, help="sampled: prompt i's seed is this + i (default 0)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    import torch

    loaded = load_model(default_model_path(quiet=True), device=args.device, dtype=getattr(torch, dtype),
                        progress=False)
    prompts = held_out_prompts(args.dataset, loaded.tokenizer, args.num_prompts)
    t = args.temperature
    params = [SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=t,
                             seed=args.seed + i if t else None) for i in range(len(prompts))]
    first = None
    for spec in args.trees.split():
        chain = spec.split(":")
        tree = None if chain[0] == "chain" else tuple(int(x) for x in spec.split(","))
        k = len(tree) if tree else int(chain[1]) if len(chain) > 1 else 4
        config = EngineConfig(device=args.device, dtype=dtype, attention="torch", cuda_graphs=True, fused_rounds=True,
                              k=k, spec_tree=tree, kv_cache_tokens=args.num_prompts * 1024 + 4096)
        t0 = time.perf_counter()
        out = decoder_for(loaded, config, "auto").generate(prompts, params)
        tokens = [o.new_token_ids for o in out]
        first = tokens if first is None else first
        rounds = sum(o.rounds for o in out)
        print(json.dumps({"dataset": args.dataset, "tree": spec, "k": k, "temperature": t, "prompts": len(prompts),
                          "rounds": rounds, "tokens_per_round": round(sum(len(x) for x in tokens) / rounds, 3),
                          "same_output": tokens == first if not t else None,
                          "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
