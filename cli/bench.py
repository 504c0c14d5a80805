"""``tandem bench``: Tandem plain vs speculative vs transformers on the same weights, and latency under load."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.options import add_engine_args, engine_config

HF_ENGINES = ("hf-eager", "hf-static-compile", "hf-prompt-lookup")  # bench.hf.HF_ENGINES (--help stays light)
# HBM bandwidth (GB/s) of known GPUs, for the bandwidth floor of one forward (weights read once)
BANDWIDTH_GBS = {"H100": 3350, "H200": 4800, "A100": 2039}

DESCRIPTION = """\
Every (dataset, temperature, batch size) runs Tandem plain decoding (--drafts none), Tandem
speculative decoding (each other --drafts entry, in one process) and the transformers baselines
(--baselines) on the same weights and prompts, EOS ignored, and reports tokens/s, acceptance
length, speedup over Tandem plain, time to first token and inter-token latency (p50/p99; a round
of n tokens counts as n gaps of 1/n of its time), peak GPU memory and the time split of a round
(verify = the target forward, draft = the drafter, host = everything else). With
--arrival-rate, requests also arrive as a Poisson process and time to first token and
inter-token latency are measured per --round-token-budgets entry (0 = no budget: a prompt goes
whole into one forward; N = chunked prefill within N tokens per forward).

Writes bench/results/NAME.json (a list of rows), NAME.md (the tables) and NAME.png (needs
matplotlib; else `tandem bench-plot NAME.json` draws it where matplotlib is installed).
"""


def _csv(cast):
    return lambda text: [cast(x) for x in text.split(",") if x]


def _baselines(text: str) -> list[str]:
    names = [] if text == "none" else _csv(str)(text)
    bad = [n for n in names if n not in HF_ENGINES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown baseline {bad[0]!r} (choose from {', '.join(HF_ENGINES)}, or none)")
    return names


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure plain vs speculative decoding vs transformers on ShareGPT / HumanEval",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="results name (bench/results/NAME.json, .md, .png)")
    p.add_argument("--dataset", type=_csv(str), default=["sharegpt", "humaneval"],
                   help="sharegpt (index < 16000),humaneval (default both)")
    p.add_argument("--num-prompts", type=int, default=16, help="prompts per dataset (default 16)")
    p.add_argument("--batch-sizes", type=_csv(int), default=[1, 4, 16, 64], help="comma-separated (default 1,4,16,64)")
    p.add_argument("--drafts", type=_csv(str), default=["none", "auto", "ngram"],
                   help="comma-separated drafter specs; none = Tandem plain decoding (default none,auto,ngram)")
    p.add_argument("--baselines", type=_baselines, default=list(HF_ENGINES),
                   help=f"transformers configurations, comma-separated, or none (default {','.join(HF_ENGINES)})")
    p.add_argument("--temperatures", type=_csv(float), default=[0.0, 0.7], help="comma-separated (default 0,0.7)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (EOS ignored; default 128)")
    p.add_argument("--arrival-rate", type=float, help="also run a Poisson arrival load at this many requests/s")
    p.add_argument("--round-token-budgets", type=_csv(int), default=[0, 256],
                   help="under load: per-forward token budgets to compare, 0 = none (default 0,256)")
    p.add_argument("--memory-bandwidth-gbs", type=float,
                   help="for the bandwidth floor of a forward (default: known for H100/H200/A100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="bench/results", help="where the results go (default bench/results)")
    add_engine_args(p, draft=False)
    p.set_defaults(run=run)


def _floor(model, gpu: str | None, override: float | None) -> dict:
    """Weights read once per forward at the HBM bandwidth: the floor no forward can beat."""
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    bw = override or next((v for k, v in BANDWIDTH_GBS.items() if gpu and k in gpu), None)
    return {"weights_mib": round(weights / 2**20, 1),
            "bandwidth_floor_ms": round(weights / (bw * 1e9) * 1e3, 4) if bw else None}


def run(args: argparse.Namespace) -> int:
    from bench.load import markdown as load_markdown
    from bench.load import run_load
    from bench.run import BenchCase, add_speedups, dataset_prompts, environment, markdown, run_case
    from engine.models.loader import load_model, model_source
    from engine.models.synthetic import is_synthetic as model_is_synthetic

    for name in ("num_prompts", "max_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1")
    if args.arrival_rate is not None and args.arrival_rate <= 0:
        raise ValueError("--arrival-rate: must be > 0 requests/s")
    config = engine_config(args)
    path = model_source(args.model)  # a synthetic: spec stays text
    if args.baselines and model_is_synthetic(path):
        raise ValueError("--baselines: transformers needs real weights; pass --baselines none with a synthetic: model")
    model = load_model(path, device=config.device, dtype=config.torch_dtype)
    env = {**environment(), "device": config.device, "dtype": config.dtype, **_floor(model.model, environment()["gpu"],
                                                                                      args.memory_bandwidth_gbs)}
    hf = None
    if args.baselines:
        from bench.hf import load_hf

        hf = load_hf(path, config.device, config.torch_dtype)
    rows, load_rows = [], []
    for dataset in args.dataset:
        prompts = dataset_prompts(dataset, model.tokenizer, args.num_prompts)
        for temperature in args.temperatures:
            for bs in args.batch_sizes:
                cases = [("tandem", d) for d in args.drafts] + [("hf", b) for b in args.baselines]
                for kind, what in cases:
                    if kind == "tandem":
                        row = run_case(model, config, BenchCase(what, bs, temperature), prompts, args.max_tokens,
                                       args.seed)
                    else:
                        from bench.hf import run_hf_case

                        pad = min(model.tokenizer.eos_token_ids)
                        row = run_hf_case(hf, what, prompts, bs, temperature, args.max_tokens, args.seed, pad)
                        if row is None:
                            continue
                    row.update(dataset=dataset, **env)
                    print(json.dumps({k: row[k] for k in ("engine", "dataset", "batch_size", "temperature",
                                                          "tokens_per_s", "acceptance_length")}), flush=True)
                    rows.append(row)
        if args.arrival_rate:
            for draft in args.drafts:
                for budget in args.round_token_budgets:
                    row = run_load(model, config, draft, prompts, args.arrival_rate, args.max_tokens, 0.0, args.seed,
                                   budget or None)
                    row.update(dataset=dataset, **env)
                    print(json.dumps({k: row[k] for k in ("engine", "dataset", "max_round_tokens", "ttft_ms_p50",
                                                          "itl_ms_p99")}), flush=True)
                    load_rows.append(row)
    add_speedups(rows)
    out = Path(args.out_dir) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows + load_rows, indent=1) + "\n")
    where = f"{env['gpu'] or env['cpu']} ({config.device}, {config.dtype}), commit {env['commit']}"
    text = f"{where}: `{env['command']}`\n\n{markdown(rows)}\n"
    if env["bandwidth_floor_ms"]:
        text += (f"\nBandwidth floor of one forward: {env['bandwidth_floor_ms']} ms "
                 f"({env['weights_mib']} MiB of weights read once).\n")
    if load_rows:
        text += f"\nPoisson arrivals at {args.arrival_rate} requests/s:\n\n{load_markdown(load_rows)}\n"
    out.with_suffix(".md").write_text(text)
    print("\n" + text)
    try:
        from bench.plot import plot_file

        print(f"wrote {out}, {out.with_suffix('.md')} and {plot_file(out)}")
    except ImportError:
        print(f"wrote {out} and {out.with_suffix('.md')}; matplotlib is not installed here: "
              f"run `tandem bench-plot {out}` where it is")
    return 0
