"""Tokens a round would commit if the EAGLE head proposed a tree, not a chain: ``python -m bench.tree_probe``.

No tree is built or verified: it measures what one would accept. For each prompt the target decodes
``--max-tokens`` greedily (the truth) and runs once over prompt and output for its features; then from every
committed length c the head drafts ``--depth`` steps along the truth (each step fed the target's token, whatever the
head picked; never past the output's last token but one, as the engine's rounds) and records the rank of the
target's next token in the head's logits at each depth (0: its argmax). The drafting rounds start where the engine's
do: after the prompt's first output token and one round without drafts (the head primes on the prompt).

A greedy tree verify accepts the longest path of the tree that the target's own tokens follow. In a tree that keeps
the head's top ``b_j`` tokens at depth j under every kept node, that is depth j while the truth's rank at every
depth up to j is below its ``b``. From the ranks each ``--shapes`` entry's rounds are replayed over every output
(a round from where the one before committed; the chain of k drafts is the shape 1,1,..,1): tokens per round (τ)
and the tree's nodes (a row's verify runs them all, plus its last committed token).

With ``--temperature`` T > 0 the truth is the target's own sampled output at T (seeded per prompt). A sampled row
verifying a tree of the head's top tokens (``tree_rejection_sample``, engine/rounds/tree.py) accepts a node exactly
when the target's own draw at its parent is that node: so its rounds are the same replay over the sampled truth's
ranks, and τ is exact in distribution. (A chain of drafts *sampled* from the head's q is verified against q and
accepts differently: its τ is the engine's, ``tandem bench --temperatures T``.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Sequence

import torch

from engine.config import EngineConfig, SamplingParams
from engine.drafters.base import DraftRequest


def tree_nodes(shape: Sequence[int]) -> int:
    """Nodes of a tree keeping ``shape[j]`` children under every node of depth j."""
    nodes, width = 0, 1
    for b in shape:
        width *= b
        nodes += width
    return nodes


def replay(ranks: Sequence[Sequence[int]], shape: Sequence[int]) -> list[int]:
    """The tokens each round commits, in order, for a request whose round from offset i (into ``ranks``) has the
    truth's ranks ``ranks[i]`` (depth 1, 2, ..): its accepted drafts and the target's own next token."""
    rounds, i = [], 0
    while i < len(ranks):
        r, a = ranks[i], 0
        while a < len(shape) and a < len(r) and r[a] < shape[a]:
            a += 1
        rounds.append(a + 1)
        i += a + 1
    return rounds


def truth_ranks(model, drafter, prompts: Sequence[Sequence[int]], max_tokens: int, depth: int,
                temperature: float = 0.0, seed: int = 0) -> list[list[list[int]]]:
    """Per prompt, per committed offset (2 .. max_tokens - 1 output tokens committed: the engine's drafting
    rounds), the rank of the target's next tokens in the head's logits at depths 1 .. depth (fewer near the end:
    none from the last offset), the head fed the truth. The drafter is the probe's own: its picks are forced."""
    from engine.runner import Chunk, ModelRunner
    from engine.spec import SpecDecoder

    config = dataclasses.replace(drafter.runner.config, k=0)
    target = ModelRunner(model.model, config)
    plain = SpecDecoder(target, model.tokenizer, config, None)
    outs = plain.generate([list(p) for p in prompts],
                          [SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True,
                                          seed=None if temperature == 0 else seed + i) for i in range(len(prompts))])
    seqs = [list(p) + list(o.new_token_ids) for p, o in zip(prompts, outs)]
    feats = []
    for i, seq in enumerate(seqs):
        out = target.run([Chunk(f"truth-{i}", seq)], aux_layers=drafter.target_features)
        feats.append(out.aux)
        target.free(f"truth-{i}")
    ranks: list[list[list[int]]] = [[] for _ in prompts]
    want: dict[str, tuple[int, list[int]]] = {}  # request id -> (its prompt, the truth's next tokens this call)

    def forced(logits: torch.Tensor, requests: Sequence[DraftRequest], step: int):
        truth = torch.tensor([want[r.request_id][1][step] for r in requests], device=logits.device)
        rank = (logits > logits.gather(1, truth[:, None])).sum(dim=1).tolist()
        for r, n in zip(requests, rank):
            ranks[want[r.request_id][0]][-1].append(n)
        return truth, None

    drafter.sampler.pick = forced
    greedy = SamplingParams(temperature=0.0)
    handed = [0] * len(prompts)  # features handed to the head so far, per prompt
    for offset in range(2, max_tokens):
        requests = []
        for i, (p, seq) in enumerate(zip(prompts, seqs)):
            c = len(p) + offset  # committed tokens: the prompt and ``offset`` outputs
            k = min(depth, len(seq) - c - 1)  # the round's own token fills the room its drafts leave
            ranks[i].append([])
            if k < 1:
                continue
            rid = f"probe-{i}"
            want[rid] = i, seq[c: c + k]
            requests.append(DraftRequest(rid, seq[:c], k, greedy, feats[i][handed[i]: c - 1], handed[i]))
            handed[i] = c - 1
        if requests:
            drafter.propose(requests)
    for i in range(len(prompts)):
        drafter.release(f"probe-{i}")
    return ranks


def main() -> None:
    from bench.datasets import held_out_prompts
    from engine.drafters import DraftSpec, build_drafter
    from engine.models.loader import load_model, model_source

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="humaneval", help="humaneval or sharegpt (held out; default humaneval)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--depth", type=int, default=6, help="draft steps along the truth from every position (default 6)")
    p.add_argument("--shapes", default="1111,111111,2111,2211,3211,2221,4221,3311",
                   help="tree shapes to replay, comma separated: a digit per depth, children kept per node")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the truth's temperature (default 0: greedy); > 0: sampled rows verifying the tree")
    p.add_argument("--seed", type=int, default=0, help="prompt i's truth is sampled with seed + i (default 0)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    shapes = [[int(c) for c in s] for s in args.shapes.split(",")]
    if any(len(s) > args.depth or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes: each at most --depth ({args.depth}) digits, each >= 1")
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = load_model(model_source(None), device=args.device, dtype=dtype)
    config = EngineConfig(device=args.device, dtype="float32" if args.device == "cpu" else "bfloat16",
                          kv_cache_tokens=args.num_prompts * (2048 + args.max_tokens), k=args.depth,
                          max_k=max(8, args.depth), max_batch_size=max(64, args.num_prompts))
    drafter = build_drafter(DraftSpec.parse("auto"), model, config)
    prompts = held_out_prompts(args.dataset, model.tokenizer, args.num_prompts)
    ranks = truth_ranks(model, drafter, prompts, args.max_tokens, args.depth, args.temperature, args.seed)
    rows = []
    for shape in shapes:
        per = [replay(r, shape) for r in ranks]
        tokens, rounds = sum(map(sum, per)), sum(map(len, per))
        rows.append({"dataset": args.dataset, "shape": "".join(map(str, shape)), "nodes": tree_nodes(shape),
                     "tau": round(tokens / rounds, 3), "rounds": rounds, "prompts": len(prompts),
                     "temperature": args.temperature,
                     "max_tokens": args.max_tokens, "device": args.device})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
