"""Issue 23 deliverable 3: are the bs 64 gaps to plain between engines, or between instances of one engine?

On a staged GPU machine (bench/device/env.sh sourced): ``python3 bench/device/instances.py [INSTANCES] [SECONDS]
[BATCH] [TOKENS]``. Runs the bench's bs 64 case (HumanEval's first BATCH = 64 prompts, greedy, TOKENS = 128
tokens, waves; `tandem bench`'s engine defaults) INSTANCES times for each engine (none, ngram, auto), alternating
(none 1, ngram 1, auto 1, none 2, ...).
Each run is ``bench.run.run_case``: a decoder of its own, built, captured and warmed up as the bench does, then
timed for SECONDS of passes. Prints each instance's median pass (tokens/s) and, per engine, the median of its
instances' medians and its ratio to plain's; the spread between instances of one engine is the noise a ratio of
two single instances carries."""

from __future__ import annotations

import json
import statistics
import sys

from bench.datasets import held_out_prompts
from bench.run import BenchCase, run_case
from engine.models.loader import load_model, model_source
from rpc.settings import EngineSettings

ENGINES = ("none", "ngram", "auto")


def main() -> None:
    instances = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    settings = EngineSettings()  # cuda where there is one
    config = settings.engine_config()
    model = load_model(model_source(settings.model), device=config.device, dtype=config.torch_dtype)
    prompts = held_out_prompts("humaneval", model.tokenizer, batch)
    medians: dict[str, list[float]] = {e: [] for e in ENGINES}
    for i in range(instances):
        for draft in ENGINES:
            row = run_case(model, config, BenchCase(draft, batch, 0.0), prompts, tokens, 0, min_seconds=seconds)
            medians[draft].append(row["tokens_per_s_pass_median"])
            print(json.dumps({"instance": i + 1, "draft": draft, "chosen_k": row["chosen_k"],
                              "passes": row["passes"], "tokens_per_s_pass_median": row["tokens_per_s_pass_median"],
                              "ttft_ms_p50": row["ttft_ms_p50"], "itl_ms_p50": row["itl_ms_p50"]}), flush=True)
    plain = statistics.median(medians["none"])
    for draft, ms in medians.items():
        m = statistics.median(ms)
        print(f"{draft}: instances {', '.join(f'{x:.0f}' for x in ms)} tokens/s (spread {max(ms) / min(ms):.3f}x); "
              f"median {m:.0f}, {m / plain:.3f}x plain's median")


if __name__ == "__main__":
    main()
