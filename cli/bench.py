"""``tandem bench``: Tandem plain vs speculative vs transformers on the same weights, and latency under load."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from cli.options import add_engine_args, engine_settings

HF_ENGINES = ("hf-eager", "hf-static-compile", "hf-prompt-lookup")  # bench.hf.HF_ENGINES (--help stays light)
VLLM_ENGINES = ("vllm", "vllm-ngram", "vllm-ngram-gpu")  # bench.peers.vllm.VLLM_ENGINES
# HBM bandwidth (GB/s) of known GPUs, for the bandwidth floor of one forward (weights read once)
BANDWIDTH_GBS = {"H100": 3350, "H200": 4800, "A100": 2039}

DESCRIPTION = """\
Every (dataset, temperature, batch size) runs Tandem plain decoding (--drafts none), Tandem
speculative decoding (each other --drafts entry, in one process; --drafts '' for none) and the
baselines (--baselines) on the same weights and prompts, EOS ignored: transformers (hf-*) in this
process, and vLLM (vllm = plain, vllm-ngram / vllm-ngram-gpu = its n-gram speculation on the host /
on the GPU) each in its own process, before Tandem takes GPU memory, from $TANDEM_PEER_PYTHONPATH
(bench/device/PEERS.md) on a Hugging Face export of the same weights (vLLM's dummy weights for a
synthetic: model, whose acceptance means nothing). It reports tokens/s, acceptance
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
    bad = [n for n in names if n not in HF_ENGINES + VLLM_ENGINES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown baseline {bad[0]!r} (choose from "
                                         f"{', '.join(HF_ENGINES + VLLM_ENGINES)}, or none)")
    return names


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure plain vs speculative decoding vs transformers on ShareGPT / HumanEval",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="results name (bench/results/NAME.json, .md, .png)")
    p.add_argument("--dataset", type=_csv(str), default=["sharegpt", "humaneval"],
                   help="sharegpt (held out from drafter training: index >= 16000),humaneval (default both)")
    p.add_argument("--num-prompts", type=int, default=16, help="prompts per dataset (default 16)")
    p.add_argument("--batch-sizes", type=_csv(int), default=[1, 4, 16, 64], help="comma-separated (default 1,4,16,64)")
    p.add_argument("--drafts", type=_csv(str), default=["none", "auto", "ngram"],
                   help="comma-separated drafter specs; none = Tandem plain decoding; '' = no Tandem rows "
                        "(default none,auto,ngram)")
    p.add_argument("--baselines", type=_baselines, default=list(HF_ENGINES),
                   help=f"comma-separated, or none: transformers ({', '.join(HF_ENGINES)}) and vLLM "
                        f"({', '.join(VLLM_ENGINES)}) (default {','.join(HF_ENGINES)})")
    p.add_argument("--vllm-prompt-lookup", type=_csv(int), default=[1, 3], metavar="MIN,MAX",
                   help="vLLM n-gram sizes (default 1,3: what Tandem's ngram drafter matches)")
    p.add_argument("--temperatures", type=_csv(float), default=[0.0, 0.7], help="comma-separated (default 0,0.7)")
    p.add_argument("--request-k", type=int, metavar="N",
                   help="the k every request asks for (its own SamplingParams.k) while the engine runs --k (default: "
                        "the engine's): a per-request k other than the graph's, on the fast path")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (EOS ignored; default 128)")
    p.add_argument("--min-seconds", type=float, default=0.0, metavar="S",
                   help="run each Tandem case's prompts again (the same waves and seeds) until S seconds have passed, "
                        "tokens/s over all passes: a case of 64 prompts at batch 64 is one wave of about 0.2 s on a "
                        "GPU, and one run of it spreads by +-10%% (default 0: one pass)")
    p.add_argument("--admission", type=_csv(str), default=["waves"],
                   help="how Tandem's prompts arrive, comma-separated: waves (batch-size prompts together, the next "
                        "wave when all finished) or continuous (the next prompt as soon as one finishes, as a "
                        "server's batch refills; batch size = requests in flight) (default waves)")
    p.add_argument("--arrival-rate", type=float, help="also run a Poisson arrival load at this many requests/s")
    p.add_argument("--round-token-budgets", type=_csv(int), default=[0, 256],
                   help="under load: per-forward token budgets to compare, 0 = none (default 0,256)")
    p.add_argument("--memory-bandwidth-gbs", type=float,
                   help="for the bandwidth floor of a forward (default: known for H100/H200/A100)")
    p.add_argument("--seed", type=int, default=0,
                   help="request i samples with seed SEED + i (and Poisson arrivals draw from SEED); default 0")
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
    from bench.datasets import held_out_prompts
    from bench.run import add_speedups, environment, markdown
    from engine.models.loader import load_model, model_source

    for name in ("num_prompts", "max_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1")
    if args.min_seconds < 0:
        raise ValueError("--min-seconds: must be >= 0")
    if args.arrival_rate is not None and args.arrival_rate <= 0:
        raise ValueError("--arrival-rate: must be > 0 requests/s")
    bad = [a for a in args.admission if a not in ("waves", "continuous")]
    if bad or not args.admission:
        raise ValueError(f"--admission: waves or continuous, got {','.join(bad) or 'nothing'}")
    if len(args.vllm_prompt_lookup) != 2 or not 1 <= args.vllm_prompt_lookup[0] <= args.vllm_prompt_lookup[1]:
        raise ValueError("--vllm-prompt-lookup: expected MIN,MAX with 1 <= MIN <= MAX")
    settings = engine_settings(args)
    config = settings.engine_config()
    path = model_source(settings.model)  # a synthetic: spec stays text
    meta = load_model(path, load_weights=False, progress=False)  # the tokenizer: prompts before any GPU memory
    hf_names = [b for b in args.baselines if b in HF_ENGINES]
    if hf_names and meta.synthetic:
        raise ValueError("--baselines: transformers needs real weights; pass --baselines none (or vLLM's) with a "
                         "synthetic: model")
    prompts = {ds: held_out_prompts(ds, meta.tokenizer, args.num_prompts) for ds in args.dataset}
    for ds, got in prompts.items():  # a dataset smaller than asked for: said here (the rows record num_prompts)
        if len(got) < args.num_prompts:
            print(f"bench: --num-prompts {args.num_prompts}: {ds} has {len(got)} prompts; each run takes those",
                  file=sys.stderr)
    env = {**environment(), "device": config.device, "dtype": config.dtype,
           "model": str(path) if meta.synthetic else Path(path).name, "synthetic": meta.synthetic}
    out = Path(args.out_dir) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, load_rows = [], []

    def keep(row: dict, *keys: str) -> None:  # each row saved as it comes: a run cut short keeps what it measured
        (load_rows if row.get("scenario") == "poisson" else rows).append(row)
        out.write_text(json.dumps(rows + load_rows, indent=1) + "\n")
        print(json.dumps({k: row.get(k) for k in ("engine", "dataset", "batch_size", "temperature", *keys)}),
              flush=True)

    _vllm_rows(args, settings.k, str(path), prompts, env, keep)
    if args.drafts or hf_names:
        env.update(_tandem_rows(args, config, path, prompts, env, hf_names, keep))
    add_speedups(rows)
    out.write_text(json.dumps(rows + load_rows, indent=1) + "\n")
    where = f"{env['gpu'] or env['cpu']} ({config.device}, {config.dtype}), commit {env['commit']}"
    text = f"{where}: `{env['command']}`\n\n{markdown(rows)}\n"
    for r in rows:
        if "error" in r:
            text += f"\n{r['engine']} failed: {r['error']}\n"
    if meta.synthetic:
        text += ("\nRandom weights (a synthetic: model): tokens/s and step costs are meaningful, acceptance lengths "
                 "are not.\n")
    if env.get("bandwidth_floor_ms"):
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


def _vllm_rows(args, k: int, model: str, prompts: dict, env: dict, keep) -> None:
    """Each vLLM baseline in its own process over every case (bench.peers.vllm)."""
    names = [b for b in args.baselines if b in VLLM_ENGINES]
    if not names:
        return
    from bench.peers.vllm import run_vllm

    cases = [{"dataset": ds, "batch_size": bs, "temperature": t}
             for ds in args.dataset for t in args.temperatures for bs in args.batch_sizes]
    for name in names:
        for row in run_vllm(name, model, prompts, cases, max_tokens=args.max_tokens, k=k, seed=args.seed,
                            prompt_lookup=tuple(args.vllm_prompt_lookup)):
            row.update(**env)
            keep(row, "tokens_per_s", "acceptance_length", "error")


def _tandem_rows(args, config, path, prompts: dict, env: dict, hf_names: list[str], keep) -> dict:
    """Tandem's rows (each --drafts entry) and the transformers baselines, in this process; returns the
    bandwidth floor of the loaded model for the report."""
    from bench.load import run_load
    from bench.run import BenchCase, run_case
    from engine.models.loader import load_model

    model = load_model(path, device=config.device, dtype=config.torch_dtype)
    floor = _floor(model.model, env["gpu"], args.memory_bandwidth_gbs)
    env = {**env, **floor}
    hf = None
    if hf_names:
        from bench.hf import load_hf

        hf = load_hf(path, config.device, config.torch_dtype)
    for dataset, ps in prompts.items():
        for temperature in args.temperatures:
            for bs in args.batch_sizes:
                for admission, draft in itertools.product(args.admission, args.drafts):
                    row = run_case(model, config, BenchCase(draft, bs, temperature, admission), ps, args.max_tokens,
                                   args.seed, args.request_k, args.min_seconds)
                    keep({**row, "dataset": dataset, **env}, "tokens_per_s", "acceptance_length")
                for name in hf_names:
                    from bench.hf import run_hf_case

                    pad = min(model.tokenizer.eos_token_ids)
                    row = run_hf_case(hf, name, ps, bs, temperature, args.max_tokens, args.seed, pad)
                    if row is not None:
                        keep({**row, "dataset": dataset, **env}, "tokens_per_s", "acceptance_length")
        if args.arrival_rate:
            for draft in args.drafts:
                for budget in args.round_token_budgets:
                    row = run_load(model, config, draft, ps, args.arrival_rate, args.max_tokens, 0.0, args.seed,
                                   budget or None)
                    keep({**row, "dataset": dataset, **env}, "max_round_tokens", "ttft_ms_p50", "itl_ms_p99")
    return floor
