"""Would a smaller draft vocabulary pay? ``python -m bench.draft_vocab_probe [--sizes 16384,32768]``.

An EAGLE head's draft step reads the whole LM head (49,152 x 576 bf16, ~23 µs on an H100, four times a round at
k = 4: ~90 µs of a ~1.28 ms round). Drafting from the N most frequent tokens only would read N / 49,152 of it
(EAGLE-3 and FR-Spec do this). Losslessness is untouched (drafts are only proposals); the question is how much
acceptance it costs. This
1. ranks the target's tokens by frequency in ShareGPT training text (conversations with index < 16,000, the
   first ``--train-conversations``),
2. prints how much of HumanEval's prompts and held-out ShareGPT text (index >= 16,000) the top N cover, and
3. runs eval-draft's cases (``bench.eval_draft``, greedy, k = 4) with the shipped head as it is, then with its
   logits outside the top N set to -inf (a patch of ``EagleHead.compute_logits``; nothing in the engine changes),
   on the same prompts.
CPU is enough (acceptance does not depend on the device); a probe, not an engine path.
"""

from __future__ import annotations

import argparse
import json
from unittest import mock

import torch


def token_ranks(tokenizer, conversations: int) -> torch.Tensor:
    from bench.datasets import sharegpt

    counts = torch.zeros(tokenizer.vocab_size, dtype=torch.long)
    for conv in sharegpt("train", limit=conversations):
        for _, text in conv.turns:
            ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
            counts += torch.bincount(ids, minlength=counts.numel())[: counts.numel()]
    return counts.argsort(descending=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16384", help="draft vocabulary sizes, comma separated")
    p.add_argument("--train-conversations", type=int, default=3000, help="ShareGPT training conversations counted")
    p.add_argument("--num-prompts", type=int, default=16, help="eval-draft prompts per dataset")
    p.add_argument("--max-tokens", type=int, default=64, help="eval-draft new tokens per prompt")
    args = p.parse_args()
    from bench.datasets import held_out_prompts, humaneval, sharegpt
    from bench.eval_draft import EvalCase, run_case
    from engine.assets import default_model_path
    from engine.config import EngineConfig
    from engine.drafters import DraftSpec, build_drafter
    from engine.models import eagle
    from engine.runner import ModelRunner
    from engine.models.loader import load_model

    tok = load_model(default_model_path(), "cpu", torch.float32, load_weights=False, progress=False).tokenizer
    order = token_ranks(tok, args.train_conversations)
    held_out = {"humaneval prompts": [i for pr in humaneval() for i in tok.encode(pr.prompt)],
                "sharegpt index >= 16000": [i for c in sharegpt("eval", limit=200) for _, t in c.turns
                                            for i in tok.encode(t)]}
    sizes = [int(n) for n in args.sizes.split(",")]
    for n in sizes:
        keep = torch.zeros(order.numel(), dtype=torch.bool)
        keep[order[:n]] = True
        cover = ", ".join(f"{name} {keep[torch.tensor(ids)].float().mean().item():.4f}"
                          for name, ids in held_out.items())
        print(f"top {n} tokens cover: {cover}", flush=True)
    # eval-draft's cases (tandem eval-draft --draft auto --k 4 --temperature 0, on the CPU), run here so the head's
    # logits can be masked in this process
    model = load_model(default_model_path(), "cpu", torch.float32, progress=False)
    config = EngineConfig(k=4, max_batch_size=args.num_prompts, spec_max_batch=None)
    runner = ModelRunner(model.model, config)
    drafter = build_drafter(DraftSpec.parse("auto"), model, config)
    prompts = {ds: held_out_prompts(ds, model.tokenizer, args.num_prompts) for ds in ("humaneval", "sharegpt")}
    full = eagle.EagleHead.compute_logits
    for n in [0] + sizes:
        print(f"== draft vocabulary: {'all' if n == 0 else f'top {n}'}", flush=True)
        keep = torch.zeros(order.numel(), dtype=torch.bool)
        keep[order[:n] if n else order] = True

        def masked(self, hidden, keep=keep):
            logits = full(self, hidden)
            return logits.masked_fill(~keep.to(logits.device), float("-inf"))

        with mock.patch.object(eagle.EagleHead, "compute_logits", masked):
            for ds, ps in prompts.items():
                row = run_case(runner, model.tokenizer, config, drafter, EvalCase("auto", ds, 0.0, 4), ps,
                               max_tokens=args.max_tokens, batch_size=args.num_prompts, seed=0)
                print(json.dumps({"vocabulary": n or "all", "dataset": ds, **{k: row.get(k) for k in
                                  ("acceptance_length", "accepted_per_draft")}}), flush=True)


if __name__ == "__main__":
    main()
