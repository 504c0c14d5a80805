"""What a prompt's prefill costs on the GPU (an experiment for issue 21; device recipe, GPU only).

Builds the verifier's engine as ``tandem verifier --draft auto`` does, captures its prefill graphs, then times
whole HumanEval prompts through ``ModelRunner.run`` (the prefill-graph replays a served round runs) for 1, 2, 4 and
8 prompts at once: the host's time to launch and the time to the GPU's end (synchronized), the mean of REPS; then
lists the kernels of one lone prompt's prefill by GPU time (torch.profiler). Prints JSON lines. Usage (after
bench/device/env.sh):  python3 bench/device/prefill_probe.py [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.datasets import held_out_prompts  # noqa: E402
from engine.runner import Chunk  # noqa: E402


def main() -> int:
    from engine.factory import build_engine
    from verifier_svc.settings import VerifierSettings

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    settings = VerifierSettings(draft="auto", max_batch_size=64)
    built = build_engine(settings.model, settings.draft, settings.engine_config(), progress=False)
    dec = built.decoder
    dec.capture_prefills()
    runner, aux = dec.target, dec.feature_layers
    pool = held_out_prompts("humaneval", built.target.tokenizer, 64)
    seqs = iter(range(10**9))

    def prefill(prompts) -> tuple[float, float]:
        ids = [f"s{next(seqs)}" for _ in prompts]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.run([Chunk(i, p, 1) for i, p in zip(ids, prompts)], aux_layers=aux)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        for i in ids:
            runner.free(i)
        return t1 - t0, t2 - t0

    lengths = sorted(len(p) for p in pool)
    print(json.dumps({"prompt_tokens": {"min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1]},
                      "aux_layers": list(aux), "buckets": dec.target.prefill_graphs.num_captured}), flush=True)
    for rows in (1, 2, 4, 8):
        for _ in range(3):
            prefill(pool[:rows])
        host = total = 0.0
        for rep in range(args.reps):
            h, t = prefill([pool[(rep * rows + j) % len(pool)] for j in range(rows)])
            host += h
            total += t
        print(json.dumps({"prompts": rows, "host_ms": round(host / args.reps * 1e3, 3),
                          "gpu_end_ms": round(total / args.reps * 1e3, 3)}), flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for rep in range(5):
            prefill([pool[rep]])
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
