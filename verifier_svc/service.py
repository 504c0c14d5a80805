"""The verifier's engine side, free of gRPC: batches in, per-item results out.

A bad item (unknown request, malformed drafts, no room) becomes that item's exception;
the other items of the batch still run their round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.config import SamplingParams
from engine.request import RequestOutput
from engine.spec import CapacityError, RoundItem, SpecDecoder

Result = RequestOutput | Exception


@dataclass(frozen=True)
class PrefillItem:
    request_id: str
    prompt: list[int]
    output: list[int]
    params: SamplingParams


def _fill(n: int, ran: Sequence[int], outputs: Sequence[RequestOutput], errors: dict[int, Exception]) -> list[Result]:
    results: list[Result] = [errors.get(i) for i in range(n)]  # type: ignore[misc]
    for i, o in zip(ran, outputs):
        results[i] = o
    return results


class VerifierEngine:
    def __init__(self, decoder: SpecDecoder) -> None:
        self.decoder = decoder

    @property
    def can_step(self) -> bool:
        return self.decoder.drafter is not None

    def _unique_running(self, ids: Sequence[str]) -> tuple[list[int], dict[int, Exception]]:
        ok, errors, seen = [], {}, set()
        for i, rid in enumerate(ids):
            if rid in seen:
                errors[i] = ValueError(f"request_id: {rid!r} appears twice in one batch")
            elif rid not in self.decoder.requests:
                errors[i] = KeyError(f"request_id: {rid!r} is not running here")
            else:
                ok.append(i)
            seen.add(rid)
        return ok, errors

    def prefill(self, items: Sequence[PrefillItem | Exception]) -> list[Result]:
        started, errors = [], {}
        for i, it in enumerate(items):
            if isinstance(it, Exception):
                errors[i] = it
                continue
            try:
                self.decoder.start(it.prompt, it.params, it.request_id, it.output)
                started.append(i)
            except (ValueError, CapacityError) as exc:
                errors[i] = exc
        outputs = self.decoder.run_round([RoundItem(items[i].request_id) for i in started]) if started else []
        return _fill(len(items), started, outputs, errors)

    def verify(self, items: Sequence[RoundItem | Exception]) -> list[Result]:
        ids = [it.request_id if isinstance(it, RoundItem) else None for it in items]
        ok, errors = self._unique_running([i or "" for i in ids])
        for i, it in enumerate(items):
            if isinstance(it, Exception):
                errors[i] = it
        ok = [i for i in ok if i not in errors]
        for i in list(ok):
            r = self.decoder.requests[ids[i]]
            if len(items[i].drafts) > self.decoder.draft_len(r, self.decoder.config.max_k):
                errors[i] = ValueError(f"draft_tokens: {len(items[i].drafts)} drafts exceed what "
                                       f"{ids[i]} may take this round")
                ok.remove(i)
        outputs = self.decoder.run_round([items[i] for i in ok]) if ok else []
        return _fill(len(items), ok, outputs, errors)

    def step(self, ids: Sequence[str], ks: Sequence[int]) -> list[Result]:
        """Co-located round: the embedded drafter proposes, the target verifies, one call."""
        ok, errors = self._unique_running(ids)
        reqs = [self.decoder.requests[ids[i]] for i in ok]
        items = self.decoder.propose(reqs, [self.decoder.draft_len(r, ks[i]) for r, i in zip(reqs, ok)])
        outputs = self.decoder.run_round(items) if items else []
        return _fill(len(ids), ok, outputs, errors)

    def release(self, ids: Sequence[str]) -> int:
        return sum(self.decoder.abort(rid) for rid in ids)

    def stats(self) -> dict[str, int]:
        alloc = self.decoder.target.allocator
        return {"running": len(self.decoder.requests), "kv_blocks_used": alloc.num_blocks - alloc.free_blocks,
                "kv_blocks_total": alloc.num_blocks}
