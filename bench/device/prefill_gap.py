"""Issue 23 deliverable 3: a bs 64 wave's prefill step, plain against each drafter decoding it plainly (chosen k 0).

On a staged GPU machine (bench/device/env.sh sourced): ``python3 bench/device/prefill_gap.py [WAVES]``. For each
engine (none, ngram, auto; the bench's defaults, HumanEval's first 64 prompts, greedy, 128 tokens) after the bench's
warm-up: WAVES waves, each step of a wave timed (CUDA synced); prints the first step's (the prefill's) median ms
and the later steps' median, and the host functions of one prefill step by cumulative time (cProfile)."""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

from bench.datasets import held_out_prompts
from bench.run import warm_up
from engine.config import SamplingParams
from engine.factory import decoder_for
from engine.models.loader import load_model, model_source
from engine.rounds.graph_sampling import Mode
from rpc.settings import EngineSettings


def main() -> None:
    waves = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    settings = EngineSettings(device="cuda", attention="torch")  # as the recorded bench cells ran
    config = settings.engine_config()
    model = load_model(model_source(settings.model), device=config.device, dtype=config.torch_dtype)
    prompts = held_out_prompts("humaneval", model.tokenizer, 64)
    params = [SamplingParams(max_tokens=128, ignore_eos=True, seed=i) for i in range(64)]
    for draft in ("none", "ngram", "auto"):
        cfg = config.for_draft(draft, max_batch_size=max(config.max_batch_size, 64))
        dec = decoder_for(model, cfg, draft)
        dec.capture_prefills()
        dec.capture_rounds(64, [Mode.GREEDY])
        warm_up(dec, prompts, params, 64)
        first, later = [], []
        for w in range(waves):
            for j in range(64):
                dec.add_request(list(prompts[j]), params[j], request_id=f"w{w}-{j}")
            step = 0
            while dec.has_unfinished():
                torch.cuda.synchronize()
                t = time.perf_counter()
                if w == waves - 1 and step == 0:
                    prof = cProfile.Profile()
                    prof.enable()
                    dec.step()
                    prof.disable()
                else:
                    dec.step()
                torch.cuda.synchronize()
                (first if step == 0 else later).append((time.perf_counter() - t) * 1e3)
                step += 1
        print(f"== {draft}: prefill step {statistics.median(first):.2f} ms (min {min(first):.2f}), later steps "
              f"{statistics.median(later):.3f} ms, steps a wave {len(later) // waves + 1}", flush=True)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(r"/(engine|bench)/", 22)
        print("\n".join(line for line in s.getvalue().splitlines() if "/engine/" in line or "/bench/" in line))
        del dec
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
