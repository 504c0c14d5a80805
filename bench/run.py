"""Throughput of plain vs speculative decoding over a prompt set, in one process.

One target is loaded once; each drafter gets its own decoder (and KV cache) over the same
weights. Every configuration is warmed up (CUDA context, flashinfer JIT) before timing.
Rows follow the bench contract: engine, batch_size, dataset, temperature, tokens_per_s,
acceptance_length, speedup_vs_plain, plus what is needed to reproduce the number.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from bench.timing import CompileClock, GcClock, PhaseTimer, TokenClock, now_synced, peak_memory_mib, reset_peak_memory
from engine.config import EngineConfig, SamplingParams
from engine.factory import decoder_for
from engine.heap import frozen_heap
from engine.policy import spec_load
from engine.rounds.graph_sampling import Mode
from engine.models.loader import LoadedModel
from engine.spec import SpecDecoder


@dataclass(frozen=True)
class BenchCase:
    draft: str
    batch_size: int
    temperature: float
    admission: str = "waves"  # waves: batch_size prompts arrive together, the next ones when all finished;
                              # continuous: the next prompt arrives as soon as one finishes (a server's batch)


def engine_name(draft: str) -> str:
    return "tandem-plain" if draft == "none" else f"tandem-spec-{draft}"


def environment() -> dict:
    commit = os.environ.get("TANDEM_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True).stdout.strip()
            commit += "-dirty" if dirty else ""
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"commit": commit, "gpu": gpu, "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__, "command": " ".join(["tandem", *sys.argv[1:]])}


def _timed_decoder(model: LoadedModel, config: EngineConfig, draft: str) -> tuple[SpecDecoder, PhaseTimer]:
    """A decoder whose drafter and target forward are timed per round (no extra host syncs)."""
    decoder = decoder_for(model, config, draft)
    timer = PhaseTimer(config.device.startswith("cuda"))
    decoder.target.run = timer.wrap("verify", decoder.target.run)
    if decoder.drafter is not None:
        decoder.drafter.propose = timer.wrap("draft", decoder.drafter.propose)
        if decoder.drafter.primes:  # (an arrival's catch-up without drafts: the drafter's time too)
            decoder.drafter.prime = timer.wrap("draft", decoder.drafter.prime)
    for fused in (decoder.fused, decoder.fused_plain):
        if fused is not None:
            fused.run = timer.wrap("fused", fused.run)
    decoder.step = timer.wrap("round", decoder.step)
    return decoder, timer


def round_split(timer: PhaseTimer) -> dict:
    """Mean ms per round: the target forward (verify), the drafter (draft), fused rounds (fused: verify and
    the next drafts in one graph, with their host-side preparation and read-back) and the rest on the host."""
    rounds = max(timer.count("round"), 1)
    total, verify, draft, fused = (timer.total_ms(p) / rounds for p in ("round", "verify", "draft", "fused"))
    return {"round_ms": round(total, 3), "verify_ms": round(verify, 3), "draft_ms": round(draft, 3),
            "fused_ms": round(fused, 3), "host_ms": round(total - verify - draft - fused, 3)}


def _chosen_k(decoder, k: int, batch_size: int, greedy: bool) -> int:
    """The k the batch policy chose for rounds of this batch size: by cost (engine/policy.py) the last time it ran
    one; by --spec-max-batch, 0 where the batch's load (a sampled request counts twice) is above it."""
    policy, limit = decoder.fast.policy, decoder.config.spec_max_batch
    if policy is None:  # the max-batch rule (or none)
        over = limit is not None and spec_load([greedy] * batch_size, decoder.scheduler.weight) > limit
        return 0 if decoder.fused_plain is not None and over else k
    return policy.chosen.get(policy.bucket(batch_size), k)


def _policy(decoder, batch_size: int) -> dict | None:
    """The batch policy's figures for rounds of this batch size at the end of the run (engine/policy.py)."""
    policy = decoder.fast.policy
    if policy is None:
        return None
    b = policy.bucket(batch_size)
    return {"bucket": b, "spec_ms": policy.spec_ms.get(b), "plain_ms": policy.plain_ms.get(b),
            "host_ms": policy.host_ms.get(b), "tau": round(policy.tau, 3)}


def run_case(model: LoadedModel, config: EngineConfig, case: BenchCase, prompts: Sequence[Sequence[int]],
             max_tokens: int, seed: int, request_k: int | None = None, min_seconds: float = 0.0) -> dict:
    """All prompts, ``case.batch_size`` at a time (``case.admission``: in waves arriving together, or each next one
    as soon as one finishes); EOS ignored. ``request_k``: the k each request asks for (SamplingParams.k; None: the
    engine's). ``min_seconds``: the prompts again, as they came the first time (same waves, same seeds), until this
    long has passed: a case of a fraction of a second reads one run's noise."""
    cfg = config.for_draft(case.draft, max_batch_size=max(config.max_batch_size, case.batch_size))
    decoder, timer = _timed_decoder(model, cfg, case.draft)
    params = [SamplingParams(temperature=case.temperature, max_tokens=max_tokens, ignore_eos=True, seed=seed + i,
                             k=request_k if case.draft != "none" else None) for i in range(len(prompts))]
    # warm-up: kernels compiled and the graphs of a full batch (and of every prompt length) captured before the
    # clock starts
    decoder.capture_prefills()
    # as a server does: the round graphs of every size this case runs captured (and timed, for the batch policy)
    decoder.capture_rounds(case.batch_size, [Mode.GREEDY if case.temperature == 0 else Mode.SAMPLED])
    warm_up(decoder, prompts, params, case.batch_size)
    timer.marks.clear()
    reset_peak_memory()
    clock = TokenClock()
    tokens = rounds = committed = passes = 0
    waves = case.admission == "waves"
    wave_rounds: list[list[int]] = []  # waves: each wave's requests' rounds
    queue = iter(())  # this pass's prompts not yet arrived

    def arrive(n: int, at: float) -> None:
        for j in itertools.islice(queue, n):
            clock.arrive(decoder.add_request(list(prompts[j]), params[j], request_id=f"bench-{passes}-{j}"), at)

    # as a server does after its warm-up (rpc/server.py), what is alive now (model, decoder, datasets) is kept out of
    # the collections inside the timed passes, which the gc columns count
    with frozen_heap() as frozen, GcClock() as gc_clock, CompileClock() as compiles:
        start = synced = now_synced()
        pass_rates: list[float] = []  # each pass's tokens / s: a pass's stall moves the mean, not the median
        while passes == 0 or synced - start < min_seconds:
            pass_start, pass_tokens = synced, tokens
            queue = iter(range(len(prompts)))
            while True:
                arrive(case.batch_size, now_synced())  # a wave, or (continuous) the first batch
                if not decoder.has_unfinished():
                    break
                wave_rounds.append([])
                while decoder.has_unfinished():
                    outs = decoder.step()
                    now = time.perf_counter()  # step() ended on the round's host sync: its tokens exist
                    for o in outs:
                        clock.tokens(o.request_id, len(o.new_token_ids), now)
                        tokens += len(o.new_token_ids)
                        if o.finished:
                            rounds += o.rounds
                            committed += o.accepted + o.rounds
                            wave_rounds[-1].append(o.rounds)
                            if not waves:
                                arrive(1, now)
            passes += 1
            synced = now_synced()
            pass_rates.append((tokens - pass_tokens) / (synced - pass_start))
        elapsed = synced - start
    fused = [f for f in (decoder.fused, decoder.fused_plain) if f is not None]
    row = {"engine": engine_name(case.draft), "draft": case.draft, "k": cfg.k, "request_k": request_k,
           "cuda_graphs": cfg.use_cuda_graphs,
            "fused_rounds": decoder.fused is not None, "spec_max_batch": cfg.spec_max_batch,
            "chosen_k": _chosen_k(decoder, cfg.k, case.batch_size, case.temperature == 0),
            "policy": _policy(decoder, case.batch_size),
            "pipeline_max_batch": cfg.pipeline_rows, "admit_group": cfg.admit_group,
            "spec_rounds": cfg.spec_round_count,
            "spec_tree": ",".join(map(str, decoder.fused.tree.branching)) if decoder.fused is not None
            and decoder.fused.tree is not None else None,
            # fused rounds read after being launched ahead, launched ahead but dropped unread (wasted), and launched
            # ahead without rows that had finished (compacted); rows that joined a chain of rounds launched ahead
            "rounds_ahead": sum(f.rounds_ahead for f in fused), "rounds_dropped": sum(f.dropped for f in fused),
            "rounds_compacted": sum(f.compacted for f in fused), "rows_joined": sum(f.joined for f in fused),
            "fused_rounds_run": sum(f.rounds for f in fused),
            # rows x rounds the fused replays carried, and of them rounds run for a row already at max_tokens (a
            # replay of several rounds): with the tokens, how full a speculative step's rows were
            "fused_row_rounds": sum(f.row_rounds for f in fused), "rounds_past_end": sum(f.past_end for f in fused),
            "batch_size": case.batch_size, "admission": case.admission,
            "temperature": case.temperature, "num_prompts": len(prompts), "max_tokens": max_tokens,
            "output_tokens": tokens, "elapsed_s": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 2), "acceptance_length": round(committed / rounds, 3),
            "passes": passes, "tokens_per_s_pass_median": round(statistics.median(pass_rates), 2),
            "wave_tail": wave_tail(wave_rounds) if waves else None,
            **clock.summary(), **gc_clock.summary(), "gc_frozen": frozen, **compiles.summary(),
            "peak_memory_mib": peak_memory_mib(), **round_split(timer)}
    # the decoder (KV caches, graph pools) holds cycles through its timed wrappers: free it before the next case
    del decoder, timer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def warm_up(decoder, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], batch_size: int) -> None:
    """A short run of the case's first batch (8 tokens a request, or the case's own max_tokens where fewer: nothing
    the case runs is left out) in which, once a request finishes, the next prompt arrives and joins the rows still
    running, as continuous admission and a server's arrivals do: its prefill and first round beside a running chain
    compile what they need (new kernel specializations for a one-row eager round) before the clock starts."""
    short = [dataclasses.replace(sp, max_tokens=min(8, sp.max_tokens)) for sp in params]
    n = min(batch_size, len(prompts))
    for j in range(n):
        decoder.add_request(list(prompts[j]), short[j], request_id=f"warm-up-{j}")
    joined = False
    while decoder.has_unfinished():
        outs = decoder.step()
        if not joined and any(o.finished for o in outs):
            j = n % len(prompts)
            decoder.add_request(list(prompts[j]), short[j], request_id="warm-up-joins")
            joined = True


def wave_tail(waves: Sequence[Sequence[int]]) -> float | None:
    """How much longer the waves ran than their requests' mean: the rounds of each wave's slowest request over the
    mean rounds of its requests, summed over the waves (1.0: every request took as many rounds as the others of its
    wave, as plain decoding's do; a wave of speculating requests waits for the one that accepted least)."""
    waves = [w for w in waves if w]
    mean = sum(sum(w) / len(w) for w in waves)
    return round(sum(max(w) for w in waves) / mean, 3) if mean else None


def add_speedups(rows: list[dict]) -> list[dict]:
    def key(r: dict) -> tuple:  # against plain decoding of the same prompts arriving the same way
        return r.get("batch_size"), r.get("temperature"), r.get("dataset"), r.get("admission", "waves")

    plain = {key(r): r for r in rows if r["engine"] == "tandem-plain"}
    for r in rows:
        base = plain.get(key(r))
        r["speedup_vs_plain"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3) if base else None
        if base and r.get("tokens_per_s_pass_median") and base.get("tokens_per_s_pass_median"):
            # the same by the median pass of each (--min-seconds repeats them): a stall in one pass cannot move it
            r["speedup_pass_median"] = round(r["tokens_per_s_pass_median"] / base["tokens_per_s_pass_median"], 3)
    return rows


def markdown(rows: list[dict]) -> str:
    cols = ["engine", "dataset", "batch_size", "admission", "temperature", "k", "chosen_k", "tokens_per_s",
            "acceptance_length", "wave_tail", "speedup_vs_plain", "speedup_pass_median", "ttft_ms_p50", "itl_ms_p50",
            "itl_ms_p99", "round_ms", "verify_ms", "draft_ms", "fused_ms", "host_ms", "gc_full", "gc_ms",
            "jit_compiles", "graphs_captured", "peak_memory_mib"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
