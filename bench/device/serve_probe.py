"""Where a served round's time goes, without gRPC (an experiment for issue 21; device recipe, GPU only).

Builds the verifier's engine as ``tandem verifier --draft auto`` does (verifier_svc.main: build_engine, warm_up) and
drives the same prompts at a fixed concurrency, each stream sending its next prompt as soon as its last finishes,
three ways in turn (ABBA over REPS):

  step:  decoder.step() in a loop on this thread (as ``tandem bench --admission continuous``);
  loop:  the verifier's RoundLoop on its engine thread, outcomes handed to this thread through a queue.Queue;
  aio:   the RoundLoop with outcomes handed to an asyncio loop by call_soon_threadsafe (as the Serve servicer does);
  parts: step's loop with the round's parts timed (the scheduler's admit, route, settle; the drafter; the fast path's
         and the eager round's run, of it the target's forward; the commit; a request's creation): one more JSON
         line with each part's mean ms over the steps that ran a prefill and over those that did not;
  stagger: parts with the first requests arriving one a step, so that each later one prefills alone (as served).

Prints one JSON line per run: tokens/s, rounds, ms a round. Usage (after bench/device/env.sh):
  python3 bench/device/serve_probe.py [--concurrency 64] [--num-prompts 1024] [--modes step,loop,aio,aio,loop,step]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.datasets import held_out_prompts  # noqa: E402
from engine.config import SamplingParams  # noqa: E402
from verifier_svc.serving import Admit, Outcome, RoundLoop  # noqa: E402


def _params(i: int, max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=i)


def _add(dec, prompts, todo, n: int, max_tokens: int) -> None:
    """The next n prompts of ``todo`` (an iterator of indices) queued."""
    for j in itertools.islice(todo, n):
        dec.add_request(list(prompts[j]), _params(j, max_tokens), request_id=f"p-{j}")


def _take(dec, outs, prompts, todo, max_tokens: int) -> int:
    """A step's tokens; each request that finished sends its stream's next prompt."""
    tokens = 0
    for o in outs:
        tokens += len(o.new_token_ids)
        if o.finished:
            _add(dec, prompts, todo, 1, max_tokens)
    return tokens


def run_step(dec, prompts, c, max_tokens):
    todo = iter(range(len(prompts)))
    tokens = rounds = 0
    _add(dec, prompts, todo, c, max_tokens)
    while dec.has_unfinished():
        tokens += _take(dec, dec.step(), prompts, todo, max_tokens)
        rounds += 1
    return tokens, rounds


def run_parts(dec, prompts, c, max_tokens, stagger=False):
    """step's loop, every part of a round timed; prints the means by whether a step ran a prefill. ``stagger``: the
    first ``c`` requests arrive one a step (their ends stay apart: each later arrival prefills alone, as served)."""
    spent: dict[str, float] = {}

    def timed(obj, name: str, label: str | None = None) -> None:
        fn = getattr(obj, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = label or name
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
        setattr(obj, name, wrapper)

    sch = dec.scheduler
    parts = ((sch, "admit", None), (sch, "route", None), (sch, "settle", None), (dec, "propose", None),
             (dec.fast, "run", "fast.run"), (dec.fast, "expect", "fast.expect"), (dec.eager, "run", "eager.run"),
             (dec.target, "run", "target.run"), (dec, "_commit", "commit"), (dec, "add_request", "add_request"))
    for obj, name, label in parts:
        timed(obj, name, label)
    sums = {True: {}, False: {}}
    counts = {True: 0, False: 0}
    todo = iter(range(len(prompts)))
    tokens = rounds = 0
    late = c - 1 if stagger else 0
    try:
        _add(dec, prompts, todo, c - late, max_tokens)
        while dec.has_unfinished():
            before = sch.rows["prefill"]
            spent.clear()
            t = time.perf_counter()
            outs = dec.step()
            spent["step"] = time.perf_counter() - t
            rounds += 1
            tokens += _take(dec, outs, prompts, todo, max_tokens)
            if late:  # the first c requests, one a step
                late -= 1
                _add(dec, prompts, todo, 1, max_tokens)
            prefill = sch.rows["prefill"] > before
            counts[prefill] += 1
            for key, v in spent.items():
                sums[prefill][key] = sums[prefill].get(key, 0.0) + v
    finally:  # the methods as they were: a later mode runs untimed (and a second parts run is not timed twice)
        for obj, name, _ in parts:
            delattr(obj, name)
    print(json.dumps({f"{'prefill' if p else 'no_prefill'}": {
        "steps": counts[p], **{k: round(v / max(counts[p], 1) * 1e3, 3) for k, v in sorted(sums[p].items())}}
        for p in (True, False)}), flush=True)
    return tokens, rounds


class _Streams:
    """``c`` streams over the prompts through a RoundLoop session: each finished request admits the next prompt."""

    def __init__(self, rl: RoundLoop, session, prompts, c: int, max_tokens: int) -> None:
        self.rl, self.session, self.prompts, self.max_tokens = rl, session, prompts, max_tokens
        self.todo = iter(range(len(prompts)))
        self.left, self.tokens = len(prompts), 0
        self._admit(c)

    def _admit(self, n: int) -> None:
        admits = [Admit(j, list(self.prompts[j]), [], _params(j, self.max_tokens))
                  for j in itertools.islice(self.todo, n)]
        if admits:
            self.rl.control(self.session, admits)

    def take(self, item) -> bool:
        """One outcome in; whether requests are left."""
        if not isinstance(item, Outcome):
            raise RuntimeError(f"refused: {item}")
        self.tokens += int(item.counts.sum())
        done = sum(f is not None for f in item.finish)
        self.left -= done
        self._admit(done)
        return self.left > 0


def run_loop(rl: RoundLoop, prompts, c, max_tokens):
    q: queue.Queue = queue.Queue()
    session = rl.open(q.put)
    r0 = rl.rounds
    streams = _Streams(rl, session, prompts, c, max_tokens)
    while streams.take(q.get()):
        pass
    rl.control(session, close=True)
    return streams.tokens, rl.rounds - r0


def run_aio(rl: RoundLoop, prompts, c, max_tokens):
    async def main():
        q: asyncio.Queue = asyncio.Queue()
        aloop = asyncio.get_running_loop()
        session = rl.open(lambda item: aloop.call_soon_threadsafe(q.put_nowait, item))
        streams = _Streams(rl, session, prompts, c, max_tokens)
        while streams.take(await q.get()):
            pass
        rl.control(session, close=True)
        return streams.tokens

    r0 = rl.rounds
    tokens = asyncio.run(main())
    return tokens, rl.rounds - r0


def main() -> int:
    from engine.factory import build_engine
    from verifier_svc.main import warm_up
    from verifier_svc.service import VerifierEngine
    from verifier_svc.settings import VerifierSettings

    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--modes", default="step,loop,aio,aio,loop,step")
    args = ap.parse_args()
    settings = VerifierSettings(draft="auto", max_batch_size=args.concurrency)
    built = build_engine(settings.model, settings.draft, settings.engine_config(), progress=False)
    engine = VerifierEngine(built.decoder, settings.lease_s)
    warm_up(engine)
    dec = engine.decoder
    pool = held_out_prompts("humaneval", built.target.tokenizer, args.num_prompts)
    prompts = [pool[i % len(pool)] for i in range(args.num_prompts)]
    rl = RoundLoop(dec, ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifier-engine"))
    runs = {"step": lambda: run_step(dec, prompts, args.concurrency, args.max_tokens),
            "loop": lambda: run_loop(rl, prompts, args.concurrency, args.max_tokens),
            "aio": lambda: run_aio(rl, prompts, args.concurrency, args.max_tokens),
            "parts": lambda: run_parts(dec, prompts, args.concurrency, args.max_tokens),
            "stagger": lambda: run_parts(dec, prompts, args.concurrency, args.max_tokens, stagger=True)}
    run_step(dec, prompts[: 2 * args.concurrency], args.concurrency, args.max_tokens)  # warm-up
    for mode in args.modes.split(","):
        t = time.perf_counter()
        tokens, rounds = runs[mode]()
        dt = time.perf_counter() - t
        print(json.dumps({"mode": mode, "concurrency": args.concurrency, "tokens": tokens, "rounds": rounds,
                          "tokens_per_s": round(tokens / dt, 1), "ms_per_round": round(dt / rounds * 1e3, 3)}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
