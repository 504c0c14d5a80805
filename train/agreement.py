"""Where an EAGLE head loses acceptance: teacher-forced agreement vs serving acceptance, same prompts.

    python -m train.agreement DIR [--prompts N] [--max-tokens T] [--device D]

The target answers N held-out ShareGPT prompts (index >= 16000) greedily. On those answers the
head's top-1 agreement with the target is measured teacher-forced, per unroll step (exactly the
training objective's statistic), and then the real speculative decoder (k = 4, greedy) is run
on the same prompts: its conditional acceptance per draft position. Equal numbers mean no
train/serve gap; an agreement here far below the one on training batches means the head does
not generalize (more data, not more steps).

It also breaks the first draft position's agreement down by how sure the target itself is
(its top-1 probability): where the target's own distribution is flat, matching its argmax takes
nearly the target's own computation, which bounds what a small head can reach.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.datasets import held_out_prompts
from bench.eval_draft import EvalCase, run_case
from engine.assets import default_model_path
from engine.config import EngineConfig
from engine.drafters.eagle import EagleDrafter
from engine.models.eagle import load_eagle
from engine.models.loader import load_model
from engine.runner import ModelRunner
from train import corpus
from train.dense import UnrolledAttention
from train.objectives import Batch, Teacher, _positions, eagle_loss, entry_teacher_rows, teacher

CONFIDENCE_BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)


@torch.no_grad()
def agreement_by_confidence(head, batch: Batch, t: Teacher) -> list[dict]:
    """First draft position, teacher-forced: per bin of the target's top-1 probability, the share of
    positions in it and the head's top-1 agreement with the target's argmax there."""
    b, s = batch.tokens.shape
    feats = head.fuse_features(t.aux[:, :-1]).reshape(b * (s - 1), -1)
    out = head(batch.tokens[:, 1:].reshape(-1), _positions(b, s - 1, batch.tokens.device), UnrolledAttention(b), feats)
    sel = batch.mask[:, 1:]
    teach = t.logits[entry_teacher_rows(batch.mask)[sel]]                  # [N, V]
    agree = (head.compute_logits(out.view(b, s - 1, -1)[sel]).argmax(-1) == teach.argmax(-1)).float()
    top1 = teach.float().softmax(-1).max(-1).values
    rows = []
    for lo, hi in zip(CONFIDENCE_BINS, CONFIDENCE_BINS[1:]):
        m = (top1 >= lo) & ((top1 < hi) if hi < 1.0 else (top1 <= hi))
        rows.append({"target_top1": f"[{lo:.1f}, {hi:.1f}{')' if hi < 1.0 else ']'}",
                     "share": round(m.float().mean().item(), 3),
                     "agreement": round(agree[m].mean().item(), 3) if m.any() else None})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("head", type=Path, help="EAGLE head directory")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    target = load_model(default_model_path(), device=args.device, dtype=dtype)
    tok, n = target.tokenizer, args.prompts
    prompts = held_out_prompts("sharegpt", tok, n)
    answers = corpus.generate(target.model, prompts, tok.eos_token_ids, args.max_tokens, 0.0, batch_size=n, seed=0)
    seqs = [list(q) + a for q, a in zip(prompts, answers)]
    tokens = torch.zeros(n, max(map(len, seqs)), dtype=torch.long)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    for i, (q, s) in enumerate(zip(prompts, seqs)):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, len(q) - 1: len(s) - 1] = True
    batch = Batch(tokens.to(args.device), mask.to(args.device))
    head = load_eagle(args.head, target.model, args.device, dtype)
    with torch.no_grad():
        taught = teacher(target.model, batch, head.eagle.aux_layers)
        _, stats = eagle_loss(head, batch, taught, unroll=4)
    print("teacher-forced agreement per draft position:", " ".join(f"{a:.3f}" for a in stats.agree))
    print("first draft position by the target's own top-1 probability:")
    for row in agreement_by_confidence(head, batch, taught):
        print(f"  target top-1 {row['target_top1']:11s} share {row['share']:.3f}  agreement {row['agreement']}")
    cfg = EngineConfig(device=args.device, dtype=str(dtype).removeprefix("torch."), attention="torch",
                       kv_cache_tokens=1 << 15, k=4, max_k=8)
    row = run_case(ModelRunner(target.model, cfg), tok, cfg, EagleDrafter("eagle", head, cfg),
                   EvalCase("eagle", "sharegpt", 0.0, 4), prompts, max_tokens=args.max_tokens, batch_size=n)
    h = row["accepted_histogram"]
    cond = [sum(h[j:]) / max(sum(h[j - 1:]), 1) for j in range(1, len(h))]
    print("serving acceptance per draft position (given the ones before):", " ".join(f"{c:.3f}" for c in cond))
    print(f"serving acceptance length: {row['acceptance_length']:.3f}")


if __name__ == "__main__":
    main()
