"""``tandem bench-serve``: what a user of the served system gets, from separate client processes."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path

from cli.options import add_engine_args, engine_settings

DESCRIPTION = """\
Starts each --servers entry in turn on this machine (Tandem's gateway over a co-located or split
stack; vLLM's OpenAI server plain or with n-gram speculation, from the staged peer) and drives
it with the same client: --client-processes processes streaming the same prompts (token ids),
EOS ignored, at each --concurrency (each stream sends its next prompt when its last ends) or,
with --rate, as Poisson arrivals. Reports tokens/s, time to first token and inter-token latency
(p50/p99), per-request acceptance length and the client processes' CPU use (near 100% would
mean the client, not the server, sets the number).

--in-process also runs Tandem's engine in this process on the same prompts (batch size =
concurrency, all arriving together): served_vs_in_process is a Tandem server's tokens/s over
that, the cost of the serving path as one number. Writes bench/results/NAME.json and NAME.md.
"""


def _csv(cast):
    return lambda text: [cast(x) for x in text.split(",") if x]


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: on or off")
    return text == "on"


def add_parser(sub) -> None:
    from bench.servers import SERVERS

    p = sub.add_parser("bench-serve", help="measure served tokens/s and latency through the gateway (and vLLM's server)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="results name (bench/results/NAME.json, .md)")
    p.add_argument("--servers", type=_csv(str), default=["tandem-colocated"],
                   help=f"comma-separated, run in turn: {', '.join(SERVERS)} (default tandem-colocated)")
    p.add_argument("--concurrency", type=_csv(int), default=[1, 8, 64], help="streams at once (default 1,8,64)")
    p.add_argument("--rate", type=float, help="Poisson arrivals at this many requests/s instead of fixed concurrency")
    p.add_argument("--dataset", default="humaneval", choices=["humaneval", "sharegpt"],
                   help="prompt set, held out from drafter training (default humaneval; sharegpt: index >= 16000)")
    p.add_argument("--num-prompts", type=int, default=0,
                   help="requests per run (default 0: 4 x concurrency, at least 16; prompts repeat if fewer)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per request (EOS ignored; default 128)")
    p.add_argument("--temperatures", type=_csv(float), default=[0.0], help="comma-separated (default 0)")
    p.add_argument("--client-processes", type=_csv(int), default=[2],
                   help="client processes, comma-separated: each load runs once per count (default 2)")
    p.add_argument("--drafter-device", help="the split stacks' drafter device (default --device), e.g. cuda:1")
    p.add_argument("--tracing", type=_csv(_on_off), default=[False],
                   help="Tandem's stacks with their spans exported over OTLP to a receiver this command runs (on) or "
                        "tracing off, comma-separated: a stack per setting, e.g. off,on for what tracing costs "
                        "(default off)")
    p.add_argument("--gateways", type=_csv(int), default=[1],
                   help="Tandem's gateway processes sharing its port, comma-separated: a stack per count, e.g. 1,2 "
                        "(tandem serve --gateways; default 1)")
    p.add_argument("--in-process", action="store_true", help="also run the in-process engine on the same prompts")
    p.add_argument("--seed", type=int, default=0,
                   help="request i samples with seed SEED + i (and Poisson arrivals draw from SEED); default 0")
    p.add_argument("--out-dir", default="bench/results", help="where the results go (default bench/results)")
    add_engine_args(p)
    p.set_defaults(run=run)


def _prompts(all_prompts: list[list[int]], n: int) -> list[list[int]]:
    return [all_prompts[i % len(all_prompts)] for i in range(n)]


def _in_process(args, settings, prompts_for, model_spec: str) -> list[dict]:
    import gc

    import torch

    from bench.run import BenchCase, run_case
    from engine.models.loader import load_model

    config = settings.engine_config()
    model = load_model(model_spec, device=config.device, dtype=config.torch_dtype)
    rows = []
    for t in args.temperatures:
        for c in args.concurrency:
            row = run_case(model, config, BenchCase(settings.draft, c, t), prompts_for(c), args.max_tokens, args.seed)
            rows.append({**row, "server": "in-process", "concurrency": c})
            print(json.dumps({k: rows[-1][k] for k in ("server", "concurrency", "temperature", "tokens_per_s")}),
                  flush=True)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def run(args: argparse.Namespace) -> int:
    from bench.datasets import held_out_prompts
    from bench.run import environment
    from bench.serve_load import Load, run_load
    from bench.servers import ServerOptions, start
    from engine.assets import default_model_path
    from engine.models.loader import load_model

    if min(args.client_processes) < 1 or args.max_tokens < 1 or min(args.concurrency) < 1 or min(args.gateways) < 1:
        raise ValueError("--client-processes, --max-tokens, --concurrency and --gateways: must be >= 1")
    settings = engine_settings(args)
    model_spec = settings.model or str(default_model_path())
    most = max(args.num_prompts or 0, 4 * max(args.concurrency), 16)
    tokenizer = load_model(model_spec, load_weights=False, progress=False).tokenizer
    pool = held_out_prompts(args.dataset, tokenizer, most)
    prompts_for = lambda c: _prompts(pool, args.num_prompts or max(16, 4 * c))  # noqa: E731
    env = environment()
    rows = _in_process(args, settings, prompts_for, model_spec) if args.in_process else []
    opts = ServerOptions(model=settings.model, draft=settings.draft, k=settings.k, max_batch=max(args.concurrency),
                         device=settings.device, drafter_device=args.drafter_device, dtype=settings.dtype,
                         attention=settings.attention,
                         max_model_len=max(len(p) for p in pool) + args.max_tokens + 64)
    runs = [(name, tracing, gateways) for name in args.servers
            for tracing in (args.tracing if name.startswith("tandem") else [False])
            for gateways in (args.gateways if name.startswith("tandem") else [1])]
    for name, tracing, gateways in runs:
        with start(name, dataclasses.replace(opts, tracing=tracing, gateways=gateways)) as served:
            def load(c: int, t: float, max_tokens: int, procs: int) -> Load:
                return Load(served.protocol, served.address, max_tokens, t, c, args.rate, procs, args.seed,
                            model_name=served.model_name, gateway=served.gateway)

            for t in args.temperatures:  # warm-up: every concurrency's batch sizes and sampling modes once
                for c in args.concurrency:
                    run_load(load(c, t, min(16, args.max_tokens), args.client_processes[0]), prompts_for(c)[:c])
            for t, c, procs in itertools.product(args.temperatures, args.concurrency, args.client_processes):
                print(f"measuring {name} at concurrency {c}, temperature {t}, {procs} client processes, tracing "
                      f"{'on' if served.tracing else 'off'}, {gateways} gateway processes", flush=True)
                before = served.counters() if served.counters else {}
                row = {**run_load(load(c, t, args.max_tokens, procs), prompts_for(c)), "server": name,
                       "draft": settings.draft if name.startswith("tandem") else None, "tracing": served.tracing,
                       "gateways": gateways}
                row.update(served.counters_during(before))
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k in _SHOWN or k.startswith(_COUNTER_KEYS)}),
                      flush=True)
    add_ratios(rows)
    for r in rows:
        r.update(dataset=args.dataset, **env)
    out = Path(args.out_dir) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    text = f"{env['gpu'] or env['cpu']}, commit {env['commit']}: `{env['command']}`\n\n{markdown(rows)}\n"
    out.with_suffix(".md").write_text(text)
    print("\n" + text + f"\nwrote {out} and {out.with_suffix('.md')}")
    return 0


_SHOWN = ("server", "tracing", "gateways", "concurrency", "temperature", "client_processes", "tokens_per_s", "completed",
          "client_cpu_pct")
# the verifier's counters over a load (bench/servers.py)
_COUNTER_KEYS = ("rows.", "fused.", "serve_s.", "serve_rounds.", "rows_per_round", "batch_mean", "engine_ms.", "cpu_s.",
                 "gateway_cpu_ms", "spans")


def add_ratios(rows: list[dict]) -> None:
    """served_vs_in_process for Tandem's servers; vs_vllm: each server's tokens/s over vLLM's plain server."""
    base = {(r["concurrency"], r["temperature"]): r["tokens_per_s"] for r in rows if r["server"] == "in-process"}
    vllm = {(r["concurrency"], r["temperature"]): r["tokens_per_s"] for r in rows if r["server"] == "vllm"}
    for r in rows:
        key = (r.get("concurrency"), r["temperature"])
        if r["server"].startswith("tandem") and base.get(key):
            r["served_vs_in_process"] = round(r["tokens_per_s"] / base[key], 3)
        if r["server"] != "in-process" and vllm.get(key):
            r["vs_vllm"] = round(r["tokens_per_s"] / vllm[key], 3)


def markdown(rows: list[dict]) -> str:
    cols = ["server", "tracing", "gateways", "concurrency", "temperature", "client_processes", "tokens_per_s",
            "served_vs_in_process", "vs_vllm", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
            "latency_ms_mean", "acceptance_length", "rows_per_round", "batch_mean", "gateway_cpu_ms_per_round",
            "completed", "requests", "client_cpu_pct"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
