"""``tandem eval-draft``: acceptance length and rate of drafters on held-out ShareGPT / HumanEval prompts."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from cli.options import add_engine_args, engine_settings

DEFAULT_DRAFTS = ("ngram", "layerskip:4")
DATASETS = ("sharegpt", "humaneval")  # bench.datasets.DATASETS (not imported: `--help` stays light)
MAX_K = 32  # EngineConfig.max_k's ceiling

DESCRIPTION = """\
Measure how well each drafter agrees with the target, as acceptance per round, on held-out
prompts. Every combination of --draft x --dataset x --temperature x --k runs on the same
prompts with the same per-prompt seeds; the target is loaded once and each drafter is built
once and reused across its cases.

  acceptance length  tokens committed per round = mean of (accepted + 1) over the rounds in
                     which the drafter proposed at least one token; in [1, k+1]. (`tandem
                     bench` divides by every round; that number is in the JSON too, as
                     acceptance_length_all_rounds.)
  accepted per draft the acceptance rate: accepted / drafted draft tokens.

Prompts: ShareGPT conversations with index >= 16000 (never used for training), first user
turn under 2,000 characters, through the model's chat template; HumanEval prompts as raw
text. Prompt i of a dataset is decoded with seed --seed + i in every case, so sampled
(temperature > 0) numbers reproduce exactly and drafters meet the same random streams.

Writes a JSON list of rows (drafter, dataset, temperature, k, acceptance_length,
accepted_per_draft, rounds, tokens, num_prompts, max_tokens, ..., environment: commit,
device, dtype, gpu, torch, command) to --out, the same table as markdown beside it (.md),
and prints the table: one row per drafter x dataset, one column per (temperature, k), cells
"acceptance length (accepted per draft)".
"""

EPILOG = """\
examples:
  tandem eval-draft --device cuda --name h100
  tandem eval-draft --draft ngram --draft layerskip:8 --draft /models/draft.gguf --k 4 --temperature 0
"""


def _arg_error(fn):
    """argparse shows only ArgumentTypeError messages; the engine raises ValueError naming the field."""
    def wrapped(text: str):
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return wrapped


@_arg_error
def _draft(text: str) -> str:
    from engine.drafters import DraftSpec

    if DraftSpec.parse(text).kind == "none":
        raise ValueError("'none' is plain decoding: there is no drafter to evaluate")
    return text.strip()


@_arg_error
def _datasets(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    for name in names:
        if name not in DATASETS:
            raise ValueError(f"unknown dataset {name!r} (choose from {', '.join(DATASETS)})")
    if not names:
        raise ValueError("no dataset given")
    return names


@_arg_error
def _ks(text: str) -> list[int]:
    ks = [int(x) for x in text.split(",") if x.strip()]
    if not ks:
        raise ValueError("no k given")
    for k in ks:
        if not 1 <= k <= MAX_K:
            raise ValueError(f"k must be in [1, {MAX_K}], got {k}")
    return ks


@_arg_error
def _temperatures(text: str) -> list[float]:
    ts = [float(x) for x in text.split(",") if x.strip()]
    if not ts:
        raise ValueError("no temperature given")
    for t in ts:
        if not t >= 0:
            raise ValueError(f"temperature must be >= 0, got {t}")
    return ts


@_arg_error
def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise ValueError(f"must be >= 1, got {n}")
    return n


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval-draft", help="acceptance length and rate of drafters on held-out ShareGPT / HumanEval prompts",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("evaluation grid")
    g.add_argument("--draft", action="append", type=_draft, metavar="SPEC",
                   help="a drafter to evaluate, repeatable: ngram[:N], layerskip:N, a draft model PATH, or any "
                        f"other spec the drafter registry knows (default: {' and '.join(DEFAULT_DRAFTS)})")
    g.add_argument("--dataset", action="extend", type=_datasets, metavar="NAME",
                   help=f"repeatable (or comma-separated): {', '.join(DATASETS)} (default: both)")
    g.add_argument("--k", type=_ks, default=[2, 4, 6], metavar="K[,K...]",
                   help=f"draft lengths, comma-separated, each in [1, {MAX_K}] (default 2,4,6)")
    g.add_argument("--temperature", type=_temperatures, default=[0.0, 0.7], metavar="T[,T...]",
                   help="temperatures, comma-separated; 0 = greedy (default 0,0.7)")
    g.add_argument("--num-prompts", type=_positive, default=64, help="prompts per dataset (default 64)")
    g.add_argument("--max-tokens", type=_positive, default=128, help="new tokens per prompt at most (default 128)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="keep decoding past the end-of-sequence token (default: a request ends at EOS)")
    g.add_argument("--batch-size", type=_positive, default=32,
                   help="prompts decoded together (default 32; raises --max-batch-size to match)")
    g.add_argument("--seed", type=int, default=0, help="prompt i is decoded with seed SEED + i (default 0)")
    o = p.add_argument_group("output")
    o.add_argument("--name", help="results name: --out defaults to bench/results/eval-draft-NAME.json "
                                  "(default NAME: DEVICE-DTYPE, e.g. cuda-bfloat16)")
    o.add_argument("--out", metavar="PATH", help="the JSON file; the markdown goes beside it with .md")
    add_engine_args(p, draft=False, k=False)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from bench.datasets import held_out_prompts
    from bench.eval_draft import EvalCase, report, run_case
    from bench.run import environment
    from engine.drafters import DraftSpec, build_drafter
    from engine.models.loader import load_model, model_source
    from engine.runner import ModelRunner

    drafts = list(dict.fromkeys(args.draft or DEFAULT_DRAFTS))
    datasets = list(dict.fromkeys(args.dataset or DATASETS))
    ks = list(dict.fromkeys(args.k))
    temperatures = list(dict.fromkeys(args.temperature))
    settings = engine_settings(args, k=max(ks))
    config = settings.engine_config()
    # every round speculates here, whatever the batch: acceptance is what is measured
    config = dataclasses.replace(config, max_batch_size=max(config.max_batch_size, args.batch_size), spec_max_batch=None)
    out = Path(args.out) if args.out else \
        Path("bench/results") / f"eval-draft-{args.name or f'{config.device}-{config.dtype}'.replace(':', '')}.json"

    path = model_source(settings.model)
    model = load_model(path, device=config.device, dtype=config.torch_dtype)
    runner = ModelRunner(model.model, config)  # the target's KV cache, shared by every case
    prompts = {ds: held_out_prompts(ds, model.tokenizer, args.num_prompts) for ds in datasets}
    for ds, ps in prompts.items():
        if not ps:
            raise ValueError(f"dataset: {ds} has no prompts")
    env = {**environment(), "device": config.device, "dtype": config.dtype,
           "attention": config.attention_backend, "model": path.name if isinstance(path, Path) else path}

    cases = [EvalCase(d, ds, t, k) for d in drafts for ds in datasets for t in temperatures for k in ks]
    rows: list[dict] = []
    with tqdm(total=len(cases), desc="eval-draft", unit="case", file=sys.stderr) as bar:
        for draft in drafts:
            drafter = build_drafter(DraftSpec.parse(draft), model, config)  # once per run, reused by its cases
            if drafter is None:
                raise ValueError(f"draft: {draft!r} builds no drafter")
            for case in (c for c in cases if c.drafter == draft):
                bar.set_postfix_str(f"{case.drafter} {case.dataset} T={case.temperature:g} k={case.k}")
                row = run_case(runner, model.tokenizer, config, drafter, case, prompts[case.dataset],
                               max_tokens=args.max_tokens, batch_size=args.batch_size, seed=args.seed,
                               ignore_eos=args.ignore_eos)
                rows.append({**row, "environment": env})
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(rows, indent=1) + "\n")  # after every case: an interrupted run keeps its rows
                bar.update()
            del drafter  # its KV cache goes before the next drafter builds its own

    text = report(rows, env)
    out.with_suffix(".md").write_text(text)
    print("\n" + text)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0
