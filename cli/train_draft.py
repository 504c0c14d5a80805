"""``tandem train-draft``: distil a drafter (EAGLE head or small LM) from the target's own answers."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train-draft", help="train a drafter (EAGLE head or small draft LM) on the target's own answers",
        description="1) the target answers ShareGPT prompts (index < 15800; [15800, 16000) is held out for the "
                    "acceptance checks; >= 16000 is never read), greedily and at temperature 0.7; "
                    "2) the drafter learns the target's full next-token distributions on those sequences "
                    "(cross-entropy against the target's probabilities); every --eval-every steps the real "
                    "speculative decoder measures the mean acceptance length (committed tokens per round, "
                    "greedy, k=--k) on held-out prompts; 3) the drafter is saved: --kind eagle as "
                    "safetensors + config.json (load with --draft DIR), --kind lm in Hugging Face Llama format "
                    "(also loadable by transformers, e.g. as assistant_model).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--kind", choices=["eagle", "lm"], default="eagle",
                   help="eagle: one decoder layer on the target's low/middle/high features, reusing its "
                        "embeddings and LM head; lm: a small Llama sliced from the target")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--model", metavar="PATH", help="target (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", help="cpu or cuda[:N] (default: cuda when present)")
    g = p.add_argument_group("corpus")
    g.add_argument("--num-prompts", type=int, default=3000, help="training prompts answered by the target")
    g.add_argument("--max-prompt-tokens", type=int, default=384, help="longer prompts are skipped")
    g.add_argument("--max-new-tokens", type=int, default=320, help="response length cap")
    g.add_argument("--gen-batch-size", type=int, default=256, help="prompts answered per batch")
    g.add_argument("--sampled-fraction", type=float, default=0.5, help="share of answers sampled at T=0.7")
    g.add_argument("--generator", choices=["dense", "engine"], default="dense",
                   help="how the target answers: dense (padded batches, one dense KV cache; the measured "
                        "default) or engine (the serving engine: paged KV, continuous batching, CUDA graphs)")
    g.add_argument("--corpus", type=Path, help="corpus cache (.npz): loaded when it exists, else written after generation")
    g.add_argument("--answers-weight", type=int, default=1,
                   help="times each of the target's own answers is seen per pass, next to one time each reply")
    g.add_argument("--replies", type=int, default=0,
                   help="also learn on this many ShareGPT first replies as written (index < 15800), "
                        "with the target's distributions as the teacher: more data at no generation cost")
    g.add_argument("--replies-cache", type=Path,
                   help="replies cache (.npz): loaded when it exists, else written after tokenizing")
    g = p.add_argument_group("drafter")
    g.add_argument("--layers", type=int, default=4, help="lm: decoder layers")
    g.add_argument("--init", choices=["slice", "scratch"], default="slice",
                   help="lm: copy the target's first --layers layers, embeddings and norm, or start at random")
    g.add_argument("--resume", type=Path, metavar="DIR", help="eagle: continue training a head saved earlier")
    g.add_argument("--unroll", type=int, default=3, help="eagle: training-time unroll steps")
    g = p.add_argument_group("training")
    g.add_argument("--time-budget", type=float, default=300.0, help="seconds of training")
    g.add_argument("--max-steps", type=int, default=100_000)
    g.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per batch")
    g.add_argument("--max-len", type=int, default=768, help="sequences are cut to this many tokens")
    g.add_argument("--lr", type=float, help="peak learning rate (default: 5e-4 eagle, 3e-4 lm)")
    g.add_argument("--eval-every", type=int, default=500, help="steps between held-out acceptance checks")
    g.add_argument("--val-prompts", type=int, default=32, help="held-out prompts per check (0: no checks)")
    g.add_argument("--k", type=int, default=4, help="draft length of the acceptance checks")
    g.add_argument("--hard-weight", type=float, default=0.25,
                   help="weight of the cross-entropy against the target's argmax, next to the one against its "
                        "full distribution (greedy verification accepts exactly the argmax)")
    g.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from engine.assets import default_model_path
    from engine.config import EngineConfig
    from engine.factory import default_device, default_dtype
    from engine.models.loader import load_model
    from train import corpus
    from train.pipeline import DraftTrainSpec
    from train.pipeline import run as train_run
    from train.trainer import TrainConfig

    for name in ("num_prompts", "max_new_tokens", "gen_batch_size", "layers", "unroll", "batch_tokens", "max_len",
                 "k", "answers_weight"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    for name in ("corpus", "replies_cache"):
        path = getattr(args, name)
        if path is not None and path.suffix != ".npz":
            raise ValueError(f"--{name.replace('_', '-')}: must name a .npz file, got {path}")
    if args.replies < 0:
        raise ValueError(f"--replies: must be >= 0, got {args.replies}")
    if args.resume is not None and (args.kind != "eagle" or not (args.resume / "config.json").is_file()):
        raise ValueError(f"--resume: needs --kind eagle and a head directory (config.json inside), got {args.resume}")
    if args.hard_weight < 0:
        raise ValueError(f"--hard-weight: must be >= 0, got {args.hard_weight}")
    if args.time_budget <= 0:
        raise ValueError(f"--time-budget: must be > 0, got {args.time_budget}")
    device = args.device or default_device()
    torch.manual_seed(args.seed)
    target = load_model(args.model or default_model_path(), device=device, dtype=getattr(torch, default_dtype(device)))
    if args.kind == "lm" and not 1 <= args.layers < target.config.num_layers:
        raise ValueError(f"--layers: must be in [1, {target.config.num_layers}), got {args.layers}")
    tok = target.tokenizer
    if args.corpus is not None and args.corpus.is_file():
        samples = corpus.load(args.corpus)
        print(f"train-draft: corpus {args.corpus}: {len(samples)} sequences", file=sys.stderr)
    else:
        start = time.monotonic()
        samples = corpus.build(target.model, tok, args.num_prompts, args.max_prompt_tokens, args.max_new_tokens,
                               args.gen_batch_size, args.seed, args.sampled_fraction, args.generator)
        new = sum(len(s.tokens) - s.prompt_len for s in samples)
        took = time.monotonic() - start
        print(f"train-draft: the target answered {len(samples)} prompts ({new} new tokens) in {took:.1f} s "
              f"with the {args.generator} generator ({new / max(took, 1e-9):.0f} tokens/s, prompt reading "
              "included)", file=sys.stderr)
        if args.corpus is not None:
            corpus.save(samples, args.corpus)
    samples = samples * args.answers_weight
    if args.replies:
        if args.replies_cache is not None and args.replies_cache.is_file():
            replies = corpus.load(args.replies_cache)[: args.replies]
        else:
            replies = corpus.replies(tok, args.replies, args.max_prompt_tokens, args.max_len)
            if args.replies_cache is not None:
                corpus.save(replies, args.replies_cache)
        print(f"train-draft: {len(replies)} ShareGPT replies as written, "
              f"{sum(len(r.tokens) for r in replies)} tokens", file=sys.stderr)
        samples = samples + replies
    val = corpus.chat_prompts(tok, corpus.VAL_START, corpus.SHAREGPT_EVAL_START, args.val_prompts,
                              args.max_prompt_tokens) if args.val_prompts else []
    engine = EngineConfig(device=device, dtype=default_dtype(device), attention="torch", kv_cache_tokens=1 << 16,
                          k=args.k, max_k=max(8, args.k))
    cfg = TrainConfig(lr=args.lr or (5e-4 if args.kind == "eagle" else 3e-4), time_budget_s=args.time_budget,
                      max_steps=args.max_steps, batch_tokens=args.batch_tokens, max_len=args.max_len,
                      eval_every=args.eval_every, seed=args.seed)
    spec = DraftTrainSpec(kind=args.kind, out=args.out, layers=args.layers, init=args.init, unroll=args.unroll,
                          hard_weight=args.hard_weight, resume=args.resume)
    report = train_run(target, spec, samples, cfg, val, engine, log=lambda m: print(m, file=sys.stderr))
    summary = {k: v for k, v in report.items() if k not in ("history", "train_config")}
    print(json.dumps(summary, indent=2))
    return 0
