"""The verifier's engine side, free of gRPC: batches in, per-item results out.

A bad item (unknown request, malformed drafts, no room) becomes that item's exception;
the other items of the batch still run their round.

``feature_layers`` (split mode with a feature-fed drafter such as an EAGLE head): each output
carries the target's features of the positions the call verified, at most the latest
``feature_window`` of them, for the gateway to hand to the drafter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from engine.config import SamplingParams
from engine.request import RequestOutput
from engine.rounds.base import EXITS
from engine.spec import CapacityError, RoundItem, SpecDecoder
from rpc.leases import Leases
from verifier_svc.serving import SERVE_PREFIX

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
    def __init__(self, decoder: SpecDecoder, lease_s: float = 300.0) -> None:
        self.decoder = decoder
        self.leases = Leases(lease_s)  # the per-request RPCs' requests; a Serve stream's end with the stream
        self.prefill_chunks = 0  # engine calls that ran a part of a Prefill's prompts (--max-round-tokens)

    @property
    def can_step(self) -> bool:
        return self.decoder.drafter is not None

    def check_feature_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        n = self.decoder.target.model.config.num_layers
        bad = [i for i in layers if not 0 <= i < n]
        if bad or len(set(layers)) != len(layers):
            raise ValueError(f"feature_layers: {list(layers)} must be distinct layer indices in [0, {n})")
        return tuple(sorted(layers))

    def _with_features(self, outputs: list[RequestOutput], window: int) -> list[RequestOutput]:
        """Hand each running request's newly verified features to its output (finished ones need none)."""
        out = []
        for o in outputs:
            r = self.decoder.requests.get(o.request_id)
            if r is not None:
                start, feats = r.features.take(window)
                if feats is not None:
                    o = dataclasses.replace(o, features=feats, features_start=start)
            out.append(o)
        return out

    def _round(self, items: Sequence[RoundItem], feature_layers: Sequence[int] | None, window: int
               ) -> list[RequestOutput]:
        if not items:
            return []
        outputs = self.decoder.run_round(items, feature_layers)
        return self._with_features(outputs, window) if feature_layers else outputs

    def _unique_running(self, ids: Sequence[str]) -> tuple[list[int], dict[int, Exception]]:
        ok, errors, seen = [], {}, set()
        for i, rid in enumerate(ids):
            if rid.startswith(SERVE_PREFIX):  # a Serve stream's: only its own stream reaches it
                errors[i] = KeyError(f"request_id: {rid!r} is not running here")
            elif rid in seen:
                errors[i] = ValueError(f"request_id: {rid!r} appears twice in one batch")
            elif rid not in self.decoder.requests:
                errors[i] = KeyError(f"request_id: {rid!r} is not running here")
            else:
                ok.append(i)
            seen.add(rid)
        return ok, errors

    def prefill(self, items: Sequence[PrefillItem | Exception], feature_layers: Sequence[int] = (),
                feature_window: int = 0) -> list[Result]:
        """Start requests. Without ``feature_layers`` an embedded drafter gets what it declares."""
        started, errors = self.start(items, feature_layers)
        return self.finish_prefill(items, started, errors, feature_layers, feature_window)

    @property
    def chunk_tokens(self) -> int | None:
        """A Prefill's prompt tokens per engine call (``--max-round-tokens``; None: the whole prompt in one)."""
        return self.decoder.config.max_round_tokens

    def prefill_chunk(self, request_ids: Sequence[str], feature_layers: Sequence[int] = ()) -> bool:
        """One engine call's share (``chunk_tokens`` in all, first come first) of those of these started requests'
        prompts that one call cannot finish: their KV and queued features grow, no output. Returns whether any is
        still that long (else ``finish_prefill`` runs the rest with the first tokens). A request released meanwhile
        is skipped."""
        layers = self.check_feature_layers(feature_layers) if feature_layers else None
        budget = self.chunk_tokens or 0
        pending = [(rid, left) for rid, left in self._prompt_left(request_ids) if left > budget]
        items = []
        for rid, left in pending:
            n = min(left, budget - sum(it.prefill_chunk for it in items))
            if n > 0:
                items.append(RoundItem(rid, prefill_chunk=n))
        if items:
            self.leases.renew(it.request_id for it in items)
            self.prefill_chunks += 1
            self.decoder.run_round(items, layers)
        return any(left > budget for _, left in self._prompt_left(request_ids))

    def _prompt_left(self, request_ids: Sequence[str]) -> list[tuple[str, int]]:
        """Each running one's prompt tokens not yet in the target's KV, but the last (it goes with the output)."""
        reqs = [self.decoder.requests.get(rid) for rid in request_ids]
        return [(r.request_id, self.decoder.unseen(r) - 1) for r in reqs if r is not None]

    def start(self, items: Sequence[PrefillItem | Exception], feature_layers: Sequence[int] = ()
              ) -> tuple[list[int], dict[int, Exception]]:
        """Admit the requests of a Prefill (nothing runs yet): the indices started, the errors by index."""
        if feature_layers:
            self.check_feature_layers(feature_layers)
        started, errors = [], {}
        for i, it in enumerate(items):
            if isinstance(it, Exception):
                errors[i] = it
                continue
            try:
                if not it.request_id or it.request_id.startswith(SERVE_PREFIX):
                    raise ValueError(f"request_id: {it.request_id!r} must be non-empty and not start with "
                                     f"{SERVE_PREFIX!r} (reserved for Serve streams)")
                self.decoder.start(it.prompt, it.params, it.request_id, it.output)
                started.append(i)
            except (ValueError, CapacityError) as exc:
                errors[i] = exc
        self.leases.renew(items[i].request_id for i in started)
        return started, errors

    def finish_prefill(self, items: Sequence[PrefillItem | Exception], started: Sequence[int],
                       errors: dict[int, Exception], feature_layers: Sequence[int] = (), feature_window: int = 0
                       ) -> list[Result]:
        """The started requests' (rest of their) prompts and first tokens; one released meanwhile is NOT_FOUND."""
        layers = self.check_feature_layers(feature_layers) if feature_layers else None
        errors = dict(errors)
        for i in started:
            if items[i].request_id not in self.decoder.requests:
                errors[i] = KeyError(f"request_id: {items[i].request_id!r} was released during its prefill")
        started = [i for i in started if i not in errors]
        outputs = self._round([RoundItem(items[i].request_id) for i in started], layers, feature_window)
        return self._done(_fill(len(items), started, outputs, errors))

    def verify(self, items: Sequence[RoundItem | Exception], feature_layers: Sequence[int] = (),
               feature_window: int = 0) -> list[Result]:
        """Verify external drafts; features only where asked for (never for an embedded drafter)."""
        layers = self.check_feature_layers(feature_layers)
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
        self.leases.renew(ids[i] for i in ok)
        outputs = self._round([items[i] for i in ok], layers, feature_window)
        return self._done(_fill(len(items), ok, outputs, errors))

    def step(self, ids: Sequence[str], ks: Sequence[int | None]) -> list[Result]:
        """Co-located round: the embedded drafter proposes, the target verifies, one call; requests already
        decoding go through the fused round (one graph, one host sync) as in ``tandem generate``."""
        ok, errors = self._unique_running(ids)
        reqs = [self.decoder.requests[ids[i]] for i in ok]
        self.leases.renew(ids[i] for i in ok)
        outputs = self.decoder.decode_round(reqs, [ks[i] for i in ok]) if reqs else []
        return self._done(_fill(len(ids), ok, outputs, errors))

    def release(self, ids: Sequence[str]) -> int:
        """Free these requests (a Serve stream's are freed by that stream alone)."""
        ids = [rid for rid in ids if not rid.startswith(SERVE_PREFIX)]
        self.leases.drop(ids)
        return sum(self.decoder.abort(rid) for rid in ids)

    def reap(self) -> int:
        """Free the requests no call has named for the lease period (their gateway is gone); returns how many."""
        gone = [rid for rid in self.leases.expired() if rid in self.decoder.requests]
        for rid in gone:
            self.decoder.abort(rid)
        return len(gone)

    def _done(self, results: list[Result]) -> list[Result]:
        """Finished requests hold nothing: their leases go."""
        self.leases.drop(r.request_id for r in results if isinstance(r, RequestOutput) and r.finished)
        return results

    def fast_path_exits(self) -> dict[str, int]:
        """Rows of co-located rounds that ran eagerly although the fast path exists, by reason (every exit reason,
        0 where none); safe to call from the metrics thread (a copy of the engine's counts, no GPU sync)."""
        counts = dict(self.decoder.fast_path_exits)
        return {reason.value: counts.get(reason.value, 0) for reason in EXITS}

    def rows(self) -> dict[str, int]:
        """Rows of every round so far by ``Reason`` value (on a graph, entering it, prefill, the exits)."""
        return dict(self.decoder.scheduler.rows)

    def fused_rounds(self) -> dict[str, int]:
        """Fused rounds so far (both graphs): run, of them launched ahead of the round before, and rounds launched
        ahead that were dropped unread (their rows changed) or launched without rows that had finished (compacted)."""
        graphs = [g for g in (self.decoder.fused, self.decoder.fused_plain) if g is not None]
        return {"run": sum(g.rounds for g in graphs), "launched_ahead": sum(g.rounds_ahead for g in graphs),
                "dropped": sum(g.dropped for g in graphs), "compacted": sum(g.compacted for g in graphs)}

    def stats(self) -> dict[str, int]:
        alloc = self.decoder.target.allocator
        return {"running": len(self.decoder.requests), "kv_blocks_used": alloc.num_blocks - alloc.free_blocks,
                "kv_blocks_total": alloc.num_blocks}
