"""SpecDecoder: speculative rounds for a batch of requests, in one process; the façade over the round's parts.

Invariant: the target's KV holds every committed token of a request except the ones not yet
run through it (after a round: exactly the last, the recovered/bonus token). A round sends
per request ``[unseen committed tokens] + drafts`` through the target, so a new request's
prefill is simply its first round (its unseen tokens are the whole prompt).

The parts (engine/README.md draws a round):
- the scheduler (engine/scheduler.py): admission and KV reservation, the token budget, the batch
  policy, and which executor runs each row of a round, and why (a ``RoundPlan``);
- the executors, each taking its rows and returning one ``RowResult`` per row: the eager round
  (engine/rounds/eager.py) and the fast path's graphs (engine/rounds/fast_path.py, fused.py);
- this class: it asks the drafter for the drafts a round needs, runs the executors and commits
  their results to the requests in one place (``_commit``), finishing requests there.

Two ways in: ``add_request`` + ``step`` queue and schedule in-process (the CLI, the tests);
``start`` + ``run_round`` let a caller that does its own scheduling (the verifier service)
drive exact batches (``decode_round``: the same with the embedded drafter, co-located ``Step``).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Sequence

from engine.config import EngineConfig, SamplingParams
from engine.drafters.base import Drafter, DraftRequest
from engine.request import FinishReason, Request, RequestOutput
from engine.rounds.base import Reason, RoundItem, RoundPlan, RoutedRow, RowResult
from engine.rounds.eager import EagerRound
from engine.rounds.fast_path import FastPath
from engine.rounds.fused import FusedRounds
from engine.rounds.graph_sampling import Mode
from engine.runner import ModelRunner
from engine.scheduler import CapacityError, Scheduler
from engine.tokenizer import Tokenizer

__all__ = ["CapacityError", "RoundItem", "SpecDecoder"]


class SpecDecoder:
    def __init__(self, target: ModelRunner, tokenizer: Tokenizer, config: EngineConfig,
                 drafter: Drafter | None = None, local: Drafter | None = None) -> None:
        """``local``: a drafter that drafts inside the round's graph (n-gram), for a ``drafter`` outside it (a drafter
        service's): the requests whose rounds with ``drafter`` were measured not to pay draft with it instead."""
        self.target = target
        self.tokenizer = tokenizer
        self.config = config
        self.drafter = drafter
        # target layers a feature-fed drafter (EAGLE) drafts from; captured in every round's forward
        self.feature_layers: tuple[int, ...] = tuple(drafter.target_features) if drafter is not None else ()
        self.max_context = min(config.max_context or target.model.config.max_position,
                               target.model.config.max_position)
        self.fast = FastPath(target, drafter, config, self.max_context, local)
        self.eager = EagerRound(target, k=config.k)
        self.scheduler = Scheduler(target, tokenizer, config, self.max_context, self.fast,
                                   primes=drafter is not None and drafter.graph_rounds and drafter.primes,
                                   weight=drafter.batch_weight if drafter is not None else 1,
                                   rejoins=(drafter is not None and drafter.graph_rounds and not drafter.target_features
                                            and local is None))

    # ------------------------------------------------------------------ the parts, as callers know them
    @property
    def requests(self) -> dict[str, Request]:
        """Running requests, in arrival order."""
        return self.scheduler.requests

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def running(self) -> list[Request]:
        return list(self.requests.values())

    @property
    def fused(self) -> FusedRounds | None:
        """The speculative graph (plain decoding with no drafter or k 0); None with fused rounds off."""
        return self.fast.fused

    @property
    def fused_plain(self) -> FusedRounds | None:
        """The plain graph of the requests the batch policy demoted (``spec_max_batch``); None without it."""
        return self.fast.fused_plain

    @property
    def fast_path_exits(self) -> collections.Counter[str]:
        """Rows of rounds that ran eagerly although the decoder has a fast path, by ``Reason`` value."""
        return self.scheduler.fast_path_exits

    def draft_len(self, r: Request, k: int | None = None) -> int:
        """Draft tokens this request may take this round: its k, capped by the room left."""
        return self.scheduler.draft_len(r, k)

    def unseen(self, r: Request) -> int:
        """Tokens of ``r`` not yet run through the target: 1 once prefilled (the newest token)."""
        return self.scheduler.unseen(r)

    def plan_round(self, reqs: Sequence[Request]) -> tuple[list[Request], list[int], list[int | None]]:
        """Who runs this round, with how many drafts and (prefills) prompt tokens (``Scheduler.plan_round``)."""
        return self.scheduler.plan_round(reqs)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.requests)

    # ------------------------------------------------------------------ admission
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams,
                    request_id: str | None = None, output_ids: Sequence[int] = ()) -> str:
        """Queue a request for ``step`` (``output_ids``: output already committed elsewhere, as in ``start``)."""
        r = self.scheduler.create(prompt_ids, params, request_id, output_ids)
        self.waiting.append(r)
        return r.request_id

    def start(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str,
              output_ids: Sequence[int] = ()) -> Request:
        """Admit a request now (its first ``run_round`` is its prefill), or raise CapacityError.

        ``output_ids``: output already committed elsewhere (a request moved from a lost verifier).
        """
        r = self.scheduler.create(prompt_ids, params, request_id, output_ids)
        self.scheduler.start(r)
        return r

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its KV (target and drafter)."""
        if self.scheduler.unqueue(request_id):
            return True
        r = self.requests.get(request_id)
        if r is None:
            return False
        r.finish_reason = FinishReason.ABORT
        self._finish(r)
        return True

    def _finish(self, r: Request) -> None:
        """Every piece of a finished request's state goes: reservation, next drafts, target and drafter KV."""
        self.scheduler.release(r)
        self.fast.forget(r.request_id)
        self.target.free(r.request_id)
        if self.drafter is not None:
            self.drafter.release(r.request_id)
        if self.fast.local is not None:
            self.fast.local.release(r.request_id)

    # ------------------------------------------------------------------ the round
    def step(self) -> list[RequestOutput]:
        """Admit queued requests, then run one round for the running requests the token budget admits."""
        self.scheduler.admit()
        self._batch_policy()
        reqs, ks, chunks = self.plan_round(self.running)
        return self.decode_round(reqs, ks, chunks) if reqs else []

    def _batch_policy(self) -> None:
        for rid in self.scheduler.apply_batch_policy():  # the embedded drafter sees none of them again
            self.fast.forget(rid)
            self.drafter.release(rid)
            self.requests[rid].features.take()
            if self.fast.local is not None and rid in self.scheduler.demoted:
                self.fast.local.release(rid)

    def decode_round(self, reqs: Sequence[Request], ks: Sequence[int | None] | None = None,
                     chunks: Sequence[int | None] | None = None) -> list[RequestOutput]:
        """One round for these running requests, drafting with the embedded drafter: rows on the fast path in
        one graph round, the others (prefill chunks, a request's first drafts, ...: the ``Reason`` of each row)
        in an eager round beside it. ``ks``: each request's k (None: its own), capped by ``draft_len``;
        ``chunks``: prefill chunks as from ``plan_round`` (None: run whole). Returns the outputs in the order
        of ``reqs`` (partial prefills have none)."""
        start = time.perf_counter()
        self._batch_policy()
        plan = self.scheduler.route(reqs, ks, chunks)
        self.fast.expect(plan)  # a round launched ahead for other rows gives back the KV blocks it held
        for row in plan.off_graph:  # not on the speculative graph this round: its drafter state there is stale
            self.fast.forget(row.request_id)
        self.prime(self.scheduler.primed(plan))
        plan = self.scheduler.settle(plan, self.propose(*self.scheduler.wants(plan)))
        # the eager rows (prefills above all) are queued first and read last: the graph's next round, launched
        # ahead below, queues behind them, so reading them does not wait for it (the GPU goes on meanwhile)
        eager = _requests(plan.eager)
        launched = self.eager.launch(eager, [row.item for row in plan.eager], self.feature_layers) if eager else None
        outputs = []
        for graph, rows in ((self.fused, plan.fused), (self.fused_plain, plan.fused_plain)):
            if rows:
                outputs += self._commit(_requests(rows), self.fast.run(graph, rows, plan.launch_ahead))
        if launched is not None:
            outputs += self._commit(eager, self.eager.finish(launched))
        if (self.fast.policy is not None and not plan.eager and bool(plan.fused) != bool(plan.fused_plain)
                and all(row.reason is not Reason.ENTERED for row in plan.fused)):  # steady rounds only
            self._observe(plan, outputs, time.perf_counter() - start)
        if self.fast.guard is not None:
            self._guard(plan, outputs, time.perf_counter() - start)
        by_id = {o.request_id: o for o in outputs}
        return [by_id[r.request_id] for r in reqs if r.request_id in by_id]

    def _observe(self, plan: RoundPlan, outputs: Sequence[RequestOutput], seconds: float) -> None:
        """A round on one graph: its cost (and, speculative, its acceptance) for the batch policy."""
        policy, speculative = self.fast.policy, bool(plan.fused)
        rows = len(plan.fused or plan.fused_plain)
        graph = self.fused if speculative else self.fused_plain  # a plain token's cost, a speculative round's
        steps = graph.store.steps_for(rows, Mode.of([r.request.params for r in plan.fused or plan.fused_plain]))
        policy.observe(speculative, rows, seconds * 1e3 / steps)
        if speculative and outputs:
            policy.accepted(sum(o.round_accepted + steps for o in outputs) / len(outputs) / steps)

    def _guard(self, plan: RoundPlan, outputs: Sequence[RequestOutput], seconds: float) -> None:
        """A round all of whose rows asked the drafter (some got drafts), or all on the plain graph: its cost for the
        guard (engine/policy.py ``SpecGuard``); a round with a prefill or one beside the plain graph says nothing."""
        eager = plan.eager
        if (eager and not plan.fused_plain and len(outputs) == len(eager) and any(row.item.drafts for row in eager)
                and all(row.reason is Reason.DRAFTER_WITHOUT_GRAPH for row in eager)):
            tokens = sum(o.round_accepted + 1 for o in outputs) / len(outputs)
            self.fast.guard.observe(True, len(outputs), seconds * 1e3, tokens)
        elif plan.fused_plain and not plan.eager and not plan.fused:
            rows = len(plan.fused_plain)
            self.fast.guard.observe(False, rows, seconds * 1e3, self.fused_plain.store.steps_for(rows))

    def prime(self, reqs: Sequence[Request]) -> None:
        """The graph's drafter caught up on these requests entering the speculative graph (``Scheduler.primed``)."""
        if reqs:
            self.fused.drafter.prime([self._draft_request(r, self.fused.k) for r in reqs])

    def _draft_request(self, r: Request, k: int) -> DraftRequest:
        start, feats = r.features.take()  # (a drafter that reads none drops them)
        return DraftRequest(r.request_id, r.token_ids, k, r.params, features=feats, features_start=start)

    def propose(self, reqs: Sequence[Request], ks: Sequence[int]) -> list[RoundItem]:
        """Drafts from the embedded drafter, or the local one for the requests drafting with it (none where k == 0
        or there is no drafter)."""
        chosen = [i for i, k in enumerate(ks) if k > 0] if self.drafter is not None else []
        items = [RoundItem(r.request_id) for r in reqs]
        local, mine = self.fast.local, self.scheduler.local
        for drafter, rows in ((self.drafter, [i for i in chosen if reqs[i].request_id not in mine]),
                              (local, [i for i in chosen if reqs[i].request_id in mine])):
            if not rows:
                continue
            proposal = drafter.propose([self._draft_request(reqs[i], ks[i]) for i in rows])
            for j, i in enumerate(rows):
                drafts = proposal.token_ids[j][: ks[i]]
                probs = None if proposal.probs is None else proposal.probs[j, : len(drafts)]
                items[i] = RoundItem(reqs[i].request_id, drafts, probs)
        return items

    def run_round(self, items: Sequence[RoundItem], feature_layers: Sequence[int] | None = None
                  ) -> list[RequestOutput]:
        """One target forward + verification for these requests (each at most once), drafts given.

        ``feature_layers``: capture these target layers' outputs for a feature-fed drafter
        (default: what the embedded drafter declares); each request queues the features of its
        newly verified positions (``Request.features``). Partial prefills (``prefill_chunk``)
        only extend their KV and produce no output.
        """
        layers = self.feature_layers if feature_layers is None else tuple(feature_layers)
        self.fast.drop_ahead()  # a caller doing its own scheduling (the verifier service)
        reqs = []
        for it in items:
            r = self.requests.get(it.request_id)
            if r is None:
                raise KeyError(f"request_id: {it.request_id!r} is not running")
            if len(it.drafts) > self.draft_len(r, self.config.max_k):
                raise ValueError(f"draft_tokens: {len(it.drafts)} drafts exceed what {it.request_id} may take")
            reqs.append(r)
        return self._commit(reqs, self.eager.run(reqs, items, layers))

    def _commit(self, reqs: Sequence[Request], results: Sequence[RowResult | None]) -> list[RequestOutput]:
        """The one place a round's results reach the requests: round stats, the committed tokens (stop rules
        applied), the output; a request that finished is finished here. None: a partial prefill, no output."""
        outputs = []
        for r, res in zip(reqs, results):
            if res is None:
                continue
            kept, delta = r.commit(res.committed)
            rounds, accepted, drafted = res.counts(len(kept))
            r.rounds += rounds
            r.accepted += accepted
            r.drafted += drafted
            outputs.append(r.output(kept, delta, accepted, drafted, rounds))
            if r.finished:
                self._finish(r)
        return outputs

    def capture_rounds(self, max_batch: int | None = None, modes: Sequence[Mode] | None = None) -> int:
        """On a GPU: capture the round graphs of every batch size a server will run (``FastPath.capture``), before
        requests arrive; returns how many were built (0 without fused rounds). ``max_batch`` (default the
        engine's) and ``modes`` (default all three: greedy, sampled, filtered): only those a caller will run (a
        benchmark's). A drafter that drafts outside the graphs (a drafter service's,
        verifier_svc/remote_drafter.py): the target's verify steps its eager rounds replay (k + 1 tokens a row,
        with the features it reads), up to the batch sizes that speculate."""
        max_batch = max_batch or self.config.max_batch_size
        n = self.fast.capture(max_batch, self.config.spec_max_batch, modes, self.scheduler.weight)
        graphs, d, k = self.target.graphs, self.drafter, self.config.k
        if graphs is not None and graphs.capture and d is not None and not d.graph_rounds and k:
            spec_max = self.config.spec_max_batch
            n += graphs.capture_all((k + 1,), self.feature_layers,
                                    max_rows=max_batch if spec_max is None else min(spec_max, max_batch))
        return n

    def capture_prefills(self) -> int:
        """On a GPU: capture the target's prefill graph of every whole-prompt length now (with the features the
        drafter reads), and the drafter's own for its catch-up over a prompt, before requests arrive; returns
        the prefill graphs captured (0 without graphs)."""
        n = self.target.capture_prefills(self.feature_layers)
        for d in (self.drafter, self.fast.local):
            if d is not None:
                n += d.capture_prefills()
        return n

    # ------------------------------------------------------------------ convenience
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
                 ) -> list[RequestOutput]:
        """Run prompts to completion; returns one final output per prompt (all tokens, all text)."""
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        text: dict[str, str] = {i: "" for i in ids}
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for o in self.step():
                tokens[o.request_id] += o.new_token_ids
                text[o.request_id] += o.text_delta
                if o.finished:
                    final[o.request_id] = o
        return [dataclasses.replace(final[i], new_token_ids=tokens[i], text_delta=text[i]) for i in ids]


def _requests(rows: Sequence[RoutedRow]) -> list[Request]:
    return [row.request for row in rows]
