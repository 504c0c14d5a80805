"""How full the fused rounds' rows are under continuous admission: ``python -m bench.occupancy``.

A speculative request takes as many rounds as its acceptance gives it, so under continuous admission the rows of a
fused replay empty as requests finish: for a round or two while an arrival is prefilled before it joins the chain,
for the rounds a replay of several runs past a row's max_tokens, and after the last arrival, while the requests
still running drain one by one (plain requests of one length finish together instead). This runs the same engine as
``tandem bench --admission continuous`` (fused rounds, rounds launched ahead, ``--spec-rounds``; on a CPU the graphs
are built but not captured: the rows follow the GPU's rules, the acceptance is float32's) and reports, per fused
replay, how many rows it held:

- ``steady``: the replays before the last arrival: how many, and their rows' mean over the batch size;
- ``drain``: the replays after it, the same;
- ``row_rounds`` (rows x rounds carried; a plain round of several steps: rows x steps), ``past_end`` (of them,
  rounds past a row's max_tokens), ``request_rounds`` (the rounds the requests committed tokens in) and
  ``eager_rounds`` (of those, rounds outside a replay: each request's prefill, and a drafter's first drafts where it
  makes them eagerly).
"""

from __future__ import annotations

import argparse
import json

from bench.datasets import held_out_prompts
from engine.config import EngineConfig, SamplingParams
from engine.factory import decoder_for


def occupancy(model, config: EngineConfig, draft: str, prompts: list[list[int]], batch_size: int,
              max_tokens: int) -> dict:
    """Greedy requests admitted continuously (each next one as one finishes), EOS ignored -> the report above."""
    dec = decoder_for(model, config, draft)
    graphs = [g for g in (dec.fused, dec.fused_plain) if g is not None]  # speculative, and plain (demoted rows)
    if not graphs:
        raise ValueError("no fused rounds: they need the engine's graphs (cuda_graphs and fused_rounds on)")
    replays: list[tuple[int, bool]] = []  # (rows, after the last arrival)
    carried = 0  # request rounds the replays committed tokens in (a plain round of several steps: one)
    taken, drained = 0, False

    def counted(run):
        def wrapped(rows, ahead=False):
            nonlocal carried
            replays.append((len(rows), drained))
            results = run(rows, ahead)
            carried += sum(len(r.rounds) or 1 for r in results if r is not None)
            return results
        return wrapped

    for g in graphs:
        g.run = counted(g.run)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

    def admit(n: int) -> None:
        nonlocal taken, drained
        for j in range(taken, min(taken + n, len(prompts))):
            dec.add_request(list(prompts[j]), params, request_id=f"occupancy-{j}")
        taken = min(taken + n, len(prompts))
        drained = taken == len(prompts)

    admit(batch_size)
    request_rounds = 0
    while dec.has_unfinished():
        for out in dec.step():
            if out.finished:
                request_rounds += out.rounds
                admit(1)

    row_rounds, past_end = sum(g.row_rounds for g in graphs), sum(g.past_end for g in graphs)

    def share(part: list[int]) -> dict:
        return {"replays": len(part), "rows_mean": round(sum(part) / len(part), 3) if part else None,
                "full": round(sum(part) / (len(part) * batch_size), 3) if part else None}

    return {"draft": draft, "batch_size": batch_size, "prompts": len(prompts), "max_tokens": max_tokens,
            "steady": share([r for r, d in replays if not d]), "drain": share([r for r, d in replays if d]),
            "row_rounds": row_rounds, "past_end": past_end, "request_rounds": request_rounds,
            "eager_rounds": request_rounds - carried}


def main(argv: list[str] | None = None) -> int:
    from engine.assets import default_model_path
    from engine.models.loader import load_model

    p = argparse.ArgumentParser(prog="python -m bench.occupancy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", default="auto", help="the drafter (as tandem bench's --drafts; none: plain decoding)")
    p.add_argument("--dataset", default="humaneval", choices=("humaneval", "sharegpt"), help="held-out prompts")
    p.add_argument("--num-prompts", type=int, default=160)
    p.add_argument("--batch-size", type=int, default=16, help="requests running at once")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--spec-rounds", type=int, default=2, help="speculative rounds a replay at 16 rows or more")
    p.add_argument("--spec-max-batch", type=int, default=16, help="the load limit on speculation (the serving default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--attention", default="auto", choices=("auto", "torch", "flashinfer"),
                   help="the prompts' attention backend (as tandem bench's)")
    p.add_argument("--model", default=None, help="GGUF (default: the packaged SmolLM2)")
    args = p.parse_args(argv)
    config = EngineConfig(device=args.device, dtype="float32" if args.device == "cpu" else "bfloat16",
                          attention=args.attention, kv_cache_tokens=65536, max_batch_size=max(64, args.batch_size),
                          k=0 if args.draft == "none" else args.k, cuda_graphs=True, fused_rounds=True,
                          spec_max_batch=args.spec_max_batch, pipeline_max_batch=64, spec_rounds=args.spec_rounds)
    model = load_model(args.model or default_model_path(quiet=True), device=args.device, dtype=config.torch_dtype,
                       progress=False)
    prompts = held_out_prompts(args.dataset, model.tokenizer, args.num_prompts)
    print(json.dumps(occupancy(model, config, args.draft, prompts, args.batch_size, args.max_tokens)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
