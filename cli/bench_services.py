"""``tandem bench-services``: per-round cost of split vs co-located serving, with and without early drafts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-services", help="measure the per-round cost of split vs co-located serving",
        description="Start the real stack for each configuration (co-located; split with the verifier calling its "
                    "drafter (--direct-draft); split with early drafts; split "
                    "without), run waves of concurrent greedy requests (held-out ShareGPT prompts, index >= 16000) and "
                    "report per-round times from the gateway's own metrics. Writes bench/results/<name>.json.")
    p.add_argument("--name", required=True, help="results name (bench/results/NAME.json)")
    p.add_argument("--draft", default="ngram", help="drafter for every configuration (default ngram)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round (default 4)")
    p.add_argument("--batch-sizes", default="1,32", help="comma-separated (default 1,32)")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (EOS ignored; default 64)")
    p.add_argument("--waves", type=int, default=2, help="batches per batch size (default 2)")
    p.add_argument("--device", help="cpu or cuda[:N] for the verifier and the drafter (default cuda when present)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights and KV dtype (default float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--modes", type=lambda v: [m for m in v.split(",") if m],
                   default=["colocated", "split-direct", "split-early", "split"],
                   help="comma-separated configurations, run in turn (default all): colocated, split-direct (the "
                        "verifier calls its drafter), split-early (the gateway runs the rounds, early drafts on), "
                        "split (early drafts off)")
    p.add_argument("--out-dir", default="bench/results", help="where the results go (default bench/results)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bench.datasets import sharegpt
    from bench.run import environment
    from bench.services import ServiceCase, markdown, run_case

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    prompts = [c.first_user_text for c in sharegpt(split="eval", limit=400)
               if c.first_user_text and len(c.first_user_text) < 1500][: max(sizes) * args.waves]
    env = environment()
    rows = []
    cases = {"colocated": ServiceCase("colocated", False), "split-direct": ServiceCase("split-direct", False),
             "split-early": ServiceCase("split", True), "split": ServiceCase("split", False)}
    unknown = [m for m in args.modes if m not in cases]
    if unknown:
        raise ValueError(f"--modes: unknown {', '.join(unknown)} (choose from {', '.join(cases)})")
    for case in (cases[m] for m in args.modes):
        for row in run_case(case, args.draft, args.k, sizes, prompts, args.max_tokens, args.device, args.dtype,
                            args.waves):
            row.update(env)
            print(json.dumps({k: row.get(k) for k in ("mode", "early_draft", "batch_size", "round_ms", "draft_call_ms",
                                                      "drafter_work_ms", "tokens_per_s")}),
                  flush=True)
            rows.append(row)
    out = Path(args.out_dir) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{env['gpu'] or env['cpu']}, commit {env['commit']}: {env['command']}\n\n{markdown(rows)}\n\nwrote {out}")
    return 0
