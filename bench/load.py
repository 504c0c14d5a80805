"""Requests arriving as a Poisson process: time to first token and inter-token latency under load,
with and without a per-round token budget (chunked prefill mixed with the running streams' rounds)."""

from __future__ import annotations

import random
import time
from typing import Sequence

from bench.run import _timed_decoder, engine_name, round_split, warm_up
from bench.timing import CompileClock, TokenClock, now_synced, peak_memory_mib, reset_peak_memory
from engine.config import EngineConfig, SamplingParams
from engine.models.loader import LoadedModel


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each of n requests arrives (exponential gaps of mean 1/rate)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def run_load(model: LoadedModel, config: EngineConfig, draft: str, prompts: Sequence[Sequence[int]], rate: float,
             max_tokens: int, temperature: float, seed: int, max_round_tokens: int | None) -> dict:
    cfg = config.for_draft(draft, max_round_tokens=max_round_tokens)
    decoder, timer = _timed_decoder(model, cfg, draft)
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=seed + i)
              for i in range(len(prompts))]
    decoder.capture_prefills()  # warm-up: the prefill graph of every prompt length, then two requests, one joining
    warm_up(decoder, prompts, params, 2)
    timer.marks.clear()
    reset_peak_memory()
    arrivals = arrival_times(len(prompts), rate, seed)
    clock = TokenClock()
    tokens, nxt = 0, 0
    with CompileClock() as compiles:  # kernels built or graphs captured under load: a warm-up that missed one
        start = now_synced()
        while nxt < len(prompts) or decoder.has_unfinished():
            now = time.perf_counter() - start
            while nxt < len(prompts) and arrivals[nxt] <= now:
                clock.arrive(decoder.add_request(list(prompts[nxt]), params[nxt], request_id=f"load-{nxt}"),
                             start + arrivals[nxt])
                nxt += 1
            if not decoder.has_unfinished():
                time.sleep(max(0.0, arrivals[nxt] - (time.perf_counter() - start)))
                continue
            outs = decoder.step()
            t = time.perf_counter()
            for o in outs:
                clock.tokens(o.request_id, len(o.new_token_ids), t)
                tokens += len(o.new_token_ids)
        elapsed = now_synced() - start
    return {"engine": engine_name(draft), "scenario": "poisson", "draft": draft, "k": cfg.k,
            "arrival_rate": rate, "max_round_tokens": max_round_tokens, "batch_size": None,
            "temperature": temperature, "num_prompts": len(prompts), "max_tokens": max_tokens,
            "output_tokens": tokens, "elapsed_s": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed, 2),
            "acceptance_length": None, **clock.summary(), **compiles.summary(), "peak_memory_mib": peak_memory_mib(),
            **round_split(timer)}


def markdown(rows: Sequence[dict]) -> str:
    cols = ["engine", "dataset", "arrival_rate", "max_round_tokens", "tokens_per_s", "ttft_ms_p50", "ttft_ms_p99",
            "itl_ms_p50", "itl_ms_p99"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
