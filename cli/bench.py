"""``tandem bench``: tokens/s and acceptance length of plain vs speculative decoding."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.options import add_engine_args, engine_config


def _csv(cast):
    return lambda text: [cast(x) for x in text.split(",") if x]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="measure plain vs speculative decoding on ShareGPT / HumanEval prompts",
        description="Run every (drafter, batch size, temperature) combination on the same prompts with "
                    "one loaded target, print a markdown table and write bench/results/<name>.json. "
                    "Numbers name the GPU, the command and the commit.")
    p.add_argument("--name", required=True, help="results file name (bench/results/<name>.json)")
    p.add_argument("--dataset", type=_csv(str), default=["sharegpt"], help="sharegpt,humaneval (default sharegpt)")
    p.add_argument("--num-prompts", type=int, default=16, help="prompts per dataset (default 16)")
    p.add_argument("--batch-sizes", type=_csv(int), default=[1], help="comma-separated (default 1)")
    p.add_argument("--drafts", type=_csv(str), default=["none", "ngram", "layerskip:4"],
                   help="comma-separated drafter specs; 'none' is plain decoding (default none,ngram,layerskip:4)")
    p.add_argument("--temperatures", type=_csv(float), default=[0.0], help="comma-separated (default 0)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (EOS ignored; default 128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="bench/results", help="where the JSON goes (default bench/results)")
    add_engine_args(p, draft=False)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bench.run import BenchCase, add_speedups, dataset_prompts, environment, markdown, run_case
    from engine.assets import default_model_path
    from engine.models.loader import load_model

    config = engine_config(args)
    model = load_model(args.model or default_model_path(), device=config.device, dtype=config.torch_dtype)
    env = environment()
    rows = []
    for dataset in args.dataset:
        prompts = dataset_prompts(dataset, model.tokenizer, args.num_prompts)
        for temperature in args.temperatures:
            for bs in args.batch_sizes:
                for draft in args.drafts:
                    row = run_case(model, config, BenchCase(draft, bs, temperature), prompts, args.max_tokens,
                                   args.seed)
                    row.update(dataset=dataset, device=config.device, dtype=config.dtype, **env)
                    print(json.dumps({k: row[k] for k in ("engine", "dataset", "batch_size", "temperature",
                                                          "tokens_per_s", "acceptance_length")}), flush=True)
                    rows.append(row)
    add_speedups(rows)
    out = Path(args.out_dir) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{env['gpu'] or env['cpu']}, commit {env['commit']}: {env['command']}\n")
    print(markdown(rows))
    print(f"\nwrote {out}")
    return 0
