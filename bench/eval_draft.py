"""How well drafters agree with the target: acceptance per round, on held-out prompts, in one process.

Measures, per case (drafter, dataset, temperature, k), on the same prompts and seeds:

- ``acceptance_length`` (τ): committed tokens per round, i.e. the mean of ``accepted + 1``
  over the rounds **in which the drafter proposed at least one token** (``rounds``). It lies
  in [1, k + 1]. Rounds without drafts (an n-gram drafter that finds no match, the last
  round of a request with room for only one token) are left out: they measure nothing about
  the drafter. ``bench/run.py`` divides by every round instead; that number is kept as
  ``acceptance_length_all_rounds`` (over ``rounds_total``) so both can be compared.
- ``accepted_per_draft``: the acceptance rate, accepted / drafted draft tokens (a drafter
  may propose fewer than k tokens in a round; ``drafts_per_round`` is the mean proposed).
- ``accepted_histogram[j]``: rounds with drafts in which exactly j drafts were accepted.

"accepted + 1" counts the recovered or bonus token of the round even where a stop rule
(EOS) cut the round's tokens short; ``tokens`` are the output tokens actually committed.

Prompts are held out from anything a drafter may be trained on (``bench.datasets.held_out_prompts``, as
``tandem bench`` takes them): ShareGPT conversations with index >= 16000, first user turn under 2,000
characters, one user message through the model's chat template; HumanEval prompts as raw text, no template.
Every request gets ``seed + prompt index`` as its seed, whatever the drafter, temperature or k, so sampled
cases reproduce exactly and drafters are compared on the same random streams.

The target and its KV cache are built once; each drafter is built once and reused across
its cases (drafters keep per-request state keyed by request id; the decoder releases it
when a request finishes, and ``run_case`` releases whatever an interrupted case left).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from engine.config import EngineConfig, SamplingParams
from engine.drafters import Drafter
from engine.request import RequestOutput
from engine.runner import ModelRunner
from engine.spec import SpecDecoder
from engine.tokenizer import Tokenizer


ACCEPTANCE_DEFINITION = (
    "acceptance length = mean over rounds that had drafts of (accepted + 1), i.e. tokens committed per "
    "drafting round, in [1, k+1]; accepted per draft = accepted / drafted draft tokens")


@dataclass(frozen=True)
class EvalCase:
    drafter: str      # the --draft text, as given
    dataset: str
    temperature: float
    k: int


@dataclass
class _Tally:
    k: int
    rounds: int = 0          # rounds with drafts
    rounds_total: int = 0
    accepted: int = 0
    drafted: int = 0
    tokens: int = 0
    histogram: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.histogram = [0] * (self.k + 1)

    def add(self, o: RequestOutput) -> None:
        """One request's part of one round."""
        self.rounds_total += 1
        self.tokens += len(o.new_token_ids)
        if o.round_drafted > 0:
            self.rounds += 1
            self.accepted += o.round_accepted
            self.drafted += o.round_drafted
            self.histogram[o.round_accepted] += 1


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def run_case(runner: ModelRunner, tokenizer: Tokenizer, config: EngineConfig, drafter: Drafter,
             case: EvalCase, prompts: Sequence[Sequence[int]], *, max_tokens: int, batch_size: int,
             seed: int = 0, ignore_eos: bool = False) -> dict:
    """Run every prompt through one (drafter, temperature, k) and return the case's row.

    ``runner`` (the target with its KV cache) and ``drafter`` are shared across cases; the
    row has no environment block (the caller adds it). ``config.max_k`` must be >= ``case.k``.
    """
    if not 1 <= case.k <= config.max_k:
        raise ValueError(f"k: {case.k} must be in [1, max_k={config.max_k}]")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    decoder = SpecDecoder(runner, tokenizer, dataclasses.replace(config, k=case.k), drafter)
    tally = _Tally(case.k)
    tag = f"eval-draft/{case.drafter}/{case.dataset}/t{case.temperature:g}/k{case.k}"
    ids: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            for i in range(start, min(start + batch_size, len(prompts))):
                params = SamplingParams(temperature=case.temperature, max_tokens=max_tokens, ignore_eos=ignore_eos,
                                        seed=seed + i, k=case.k)
                ids.append(decoder.add_request(list(prompts[i]), params, request_id=f"{tag}#{i}"))
            while decoder.has_unfinished():
                for o in decoder.step():
                    tally.add(o)
    finally:  # an interrupted case must not leave KV or drafter state behind for the next one
        for rid in ids:
            decoder.abort(rid)
            drafter.release(rid)
    return {
        "drafter": case.drafter, "dataset": case.dataset, "temperature": case.temperature, "k": case.k,
        "acceptance_length": _ratio(tally.accepted + tally.rounds, tally.rounds),
        "accepted_per_draft": _ratio(tally.accepted, tally.drafted),
        "rounds": tally.rounds, "rounds_total": tally.rounds_total,
        "acceptance_length_all_rounds": _ratio(tally.accepted + tally.rounds_total, tally.rounds_total),
        "accepted": tally.accepted, "drafted": tally.drafted,
        "drafts_per_round": _ratio(tally.drafted, tally.rounds),
        "accepted_histogram": tally.histogram,
        "tokens": tally.tokens, "num_prompts": len(prompts), "max_tokens": max_tokens, "batch_size": batch_size,
        "seed": seed, "ignore_eos": ignore_eos,
    }


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def markdown(rows: Sequence[dict]) -> str:
    """Rows: drafter × dataset (in first-seen order); columns: (temperature, k), sorted.

    A cell is ``acceptance_length (accepted_per_draft)``; ``–`` where the case did not run
    or the drafter never proposed anything.
    """
    cols = sorted({(r["temperature"], r["k"]) for r in rows})
    keys = list(dict.fromkeys((r["drafter"], r["dataset"]) for r in rows))
    cell = {(r["drafter"], r["dataset"], r["temperature"], r["k"]): r for r in rows}
    head = ["drafter", "dataset"] + [f"T={t:g} k={k}" for t, k in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * len(cols)]
    for d, ds in keys:
        cells = []
        for t, k in cols:
            r = cell.get((d, ds, t, k))
            cells.append("–" if r is None else
                         f"{_fmt(r['acceptance_length'], '.2f')} ({_fmt(r['accepted_per_draft'], '.2f')})")
        lines.append("| " + " | ".join([d, ds] + cells) + " |")
    return "\n".join(lines)


def report(rows: Sequence[dict], env: dict) -> str:
    """The markdown written beside the JSON: what ran where, the definition, the table."""
    r0 = rows[0] if rows else {}
    where = env.get("gpu") or env.get("cpu")
    return "\n".join([
        f"Drafter acceptance: {env.get('model')} on {where} ({env.get('device')}, {env.get('dtype')}), "
        f"commit {env.get('commit')}, {r0.get('num_prompts')} prompts per dataset, up to {r0.get('max_tokens')} "
        f"new tokens{' (EOS ignored)' if r0.get('ignore_eos') else ''}, seed {r0.get('seed')} + prompt index.",
        "",
        f"    {env.get('command')}",
        "",
        f"Cells: acceptance length τ (accepted per draft). {ACCEPTANCE_DEFINITION}.",
        "",
        markdown(rows),
        "",
    ])
