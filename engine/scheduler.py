"""The scheduler: who runs, with how many tokens, on which executor, and why.

It owns the requests' lifecycle bookkeeping: the waiting queue, the running requests (in arrival order)
and the KV blocks reserved for each (a request is admitted only when its worst case fits), new requests'
validation, the round-token budget (``plan_round``: running streams first, prompts chunked into what is
left), the batch policy (by cost, engine/policy.py, else ``spec_max_batch``: when a round should not speculate,
every running request is *demoted* to plain decoding to its end; where only a drafter outside the graph does not
pay and the fast path has a ``local`` drafter, they draft with that one to their end instead) and the routing of a
round's rows to the executors (``route``, then ``settle`` once the drafter's drafts are in), each row with its
``Reason``. It counts the *exits* (a decoding request
running eagerly although the decoder has a fast path) by reason in ``fast_path_exits`` and logs each
request's first exit of each reason at DEBUG (logger ``tandem.engine``).

It runs no model and holds no tensors: it reads the fast path's graphs (``fits``, their k) and state (which
requests have their next drafts) to route, and the decoder (engine/spec.py) runs the executors.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import random
from collections import deque
from typing import TYPE_CHECKING, Sequence

from engine.config import EngineConfig, SamplingParams, check_k
from engine.policy import spec_load
from engine.request import Request
from engine.rounds.base import Path, Reason, RoundItem, RoundPlan, RoutedRow
from engine.rounds.fast_path import FastPath

if TYPE_CHECKING:
    from engine.runner import ModelRunner
    from engine.tokenizer import Tokenizer

log = logging.getLogger("tandem.engine")


class CapacityError(RuntimeError):
    """The KV cache or the batch cannot take this request now (overload, not bad input)."""


class Scheduler:
    def __init__(self, target: "ModelRunner", tokenizer: "Tokenizer", config: EngineConfig, max_context: int,
                 fast: FastPath, primes: bool = False, weight: int = 1, rejoins: bool = False) -> None:
        """``primes``: the embedded drafter primes (``Drafter.primes``): a request's first round after its prefill
        verifies no drafts on every path (on a graph it enters primed; an eager round takes none: the rounds agree).
        ``weight``: what a greedy request weighs against ``spec_max_batch`` (the drafter's ``batch_weight``).
        ``rejoins``: the embedded drafter catches up on a request from its tokens alone (n-gram lookup, a draft model;
        not EAGLE, which saw no features of the tokens decoded plainly): requests the load rule demoted may rejoin."""
        self.target, self.tokenizer, self.config, self.max_context = target, tokenizer, config, max_context
        self.fast, self.primes, self.weight, self.rejoins = fast, primes, weight, rejoins
        self.waiting: deque[Request] = deque()
        self.requests: dict[str, Request] = {}  # running, in arrival order
        self.demoted: set[str] = set()  # the batch policy's: requests decoding plainly (to their end unless rejoins)
        self.local: set[str] = set()  # the guard's, with a local drafter: requests drafting with it to their end
        self.fast_path_exits: collections.Counter[str] = collections.Counter()  # rows of rounds, by Reason value
        self.rows: collections.Counter[str] = collections.Counter()  # every row of every round, by Reason value
        self._exits_logged: dict[str, set[Reason]] = {}
        self._ids = itertools.count()
        self._reserved_blocks = 0
        self.held = 0  # rounds the queue's head has been held back to gather arrivals (``admit``)

    # ------------------------------------------------------------------ admission
    def _blocks_needed(self, r: Request) -> int:
        # the replay in flight and one launched ahead write up to two spans past a row's committed length
        # (engine/rounds/fused.py: a span is k + 1 entries a speculative round, spec_rounds of them a replay)
        cfg = self.config
        worst = (min(len(r.prompt_ids) + r.params.max_tokens, self.max_context)
                 + 2 * max(cfg.spec_round_count * (cfg.max_k + 1), cfg.plain_round_steps))
        return self.target.allocator.blocks_for(worst)

    def create(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None,
               output_ids: Sequence[int]) -> Request:
        """Validate a new request; bad input raises ValueError naming the field."""
        prompt_ids = list(prompt_ids)
        vocab = self.target.vocab_size
        if not prompt_ids:
            raise ValueError("prompt: must not be empty")
        for name, ids in (("prompt", prompt_ids), ("output", output_ids)):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(f"{name}: token id {bad} is outside the vocabulary [0, {vocab})")
        if len(prompt_ids) + len(output_ids) >= self.max_context:
            raise ValueError(f"prompt: {len(prompt_ids)} tokens leave no room in the context of {self.max_context}")
        if params.k is not None:
            check_k(params.k, self.config.max_k)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests or any(r.request_id == request_id for r in self.waiting):
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if params.seed is None:
            params = dataclasses.replace(params, seed=random.getrandbits(63))
        r = Request.create(request_id, prompt_ids, params, self.tokenizer, self.max_context)
        if self._blocks_needed(r) > self.target.allocator.num_blocks:
            raise ValueError(f"max_tokens: prompt ({len(prompt_ids)}) + max_tokens ({params.max_tokens}) "
                             f"does not fit the KV cache ({self.target.capacity_tokens} tokens)")
        if output_ids:
            r.resume(list(output_ids))
            if r.room() == 0:
                raise ValueError(f"output: {len(output_ids)} tokens already reach max_tokens or the context")
        return r

    def start(self, r: Request) -> None:
        """Admit ``r`` now, or raise CapacityError."""
        if len(self.requests) >= self.config.max_batch_size:
            raise CapacityError(f"batch full ({self.config.max_batch_size} requests)")
        self._reserve(r)

    def _reserve(self, r: Request) -> None:
        need = self._blocks_needed(r)
        if self._reserved_blocks + need > self.target.allocator.num_blocks:
            raise CapacityError(f"KV cache full: {r.request_id} needs {need} blocks")
        self._reserved_blocks += need
        self.requests[r.request_id] = r

    def admit(self) -> None:
        """Queued requests, in order, while the batch and the KV cache take them. With ``admit_group`` N > 1, while
        ``admit_group_min_batch`` requests or more run, they wait until N of them can start together or the first
        has been held N - 1 rounds: their prefills then share one eager round and their first drafts another."""
        group = self.config.admit_group
        if group > 1 and self.waiting and len(self.requests) >= self.config.admit_group_min_batch:
            free = self.config.max_batch_size - len(self.requests)
            if 0 < min(free, len(self.waiting)) < group and self.held < group - 1:
                self.held += 1
                return
        self.held = 0
        while self.waiting and len(self.requests) < self.config.max_batch_size:
            try:
                self._reserve(self.waiting[0])
            except CapacityError:
                break
            self.waiting.popleft()

    def unqueue(self, request_id: str) -> bool:
        """Drop a queued request (it holds nothing yet)."""
        for r in self.waiting:
            if r.request_id == request_id:
                self.waiting.remove(r)
                return True
        return False

    def release(self, r: Request) -> None:
        """A running request is done: its reservation goes back (the decoder frees its KV and drafter state)."""
        del self.requests[r.request_id]
        self.demoted.discard(r.request_id)
        self.local.discard(r.request_id)
        self._exits_logged.pop(r.request_id, None)
        self._reserved_blocks -= self._blocks_needed(r)

    # ------------------------------------------------------------------ the round's rows
    def draft_len(self, r: Request, k: int | None = None) -> int:
        """Draft tokens this request may take this round: its k, capped by the room left."""
        if r.request_id in self.demoted:
            return 0
        if k is None:
            k = self.config.k if r.params.k is None else r.params.k
        return max(0, min(k, self.config.max_k, r.room() - 1))

    def unseen(self, r: Request) -> int:
        """Tokens of ``r`` not yet run through the target: 1 once prefilled (the newest token)."""
        return len(r.token_ids) - self.target.length(r.request_id)

    def plan_round(self, reqs: Sequence[Request]) -> tuple[list[Request], list[int], list[int | None]]:
        """Who runs this round, with how many drafts and (for prefills) how many prompt tokens.

        Without ``max_round_tokens`` every request runs whole. With it, requests already decoding
        go first (their 1 + k tokens each: arrivals never stall running streams), then prefills in
        arrival order take what is left of the budget, chunk by chunk; the first prefill in line
        always gets at least one KV block's worth so it cannot starve.
        """
        budget = self.config.max_round_tokens
        if budget is None:
            return list(reqs), [self.draft_len(r) for r in reqs], [None] * len(reqs)
        decoding = [r for r in reqs if self.unseen(r) == 1]
        prefilling = [r for r in reqs if self.unseen(r) > 1]
        run, ks, chunks = [], [], []
        for r in decoding:
            run.append(r)
            ks.append(self.draft_len(r))
            chunks.append(None)
        left = budget - sum(1 + k for k in ks)
        for i, r in enumerate(prefilling):
            room = max(left, self.config.kv_block_size if i == 0 else 0)
            k = self.draft_len(r)  # the last chunk takes the request's usual drafts: the output never
            whole = self.unseen(r) + k <= room  # depends on the budget
            n = self.unseen(r) if whole else min(self.unseen(r) - 1, room)
            if n <= 0:
                break
            run.append(r)
            ks.append(k if whole else 0)
            chunks.append(None if whole else n)
            left -= n + ks[-1]
        return run, ks, chunks

    def apply_batch_policy(self) -> list[str]:
        """With a batch policy: when a round of these requests should not speculate (by default their ``spec_load``, a
        sampled request counting twice and each its drafter's ``batch_weight``, is above ``spec_max_batch``, or, with
        a drafter outside the graph, its rounds at this size were measured not to pay: engine/policy.py ``SpecGuard``;
        with ``--spec-policy cost`` the cost rule, engine/policy.py, and where its sizes were not timed more than
        ``spec_max_batch`` requests run), every running request decodes plainly: to its end, unless the drafter
        ``rejoins`` and the load rule decided (``_rejoin``: they enter the speculative graph as new requests do; the
        cost rule's figures for them would stop moving); where only the guard says no and the fast path has a local
        drafter, the requests not yet with it draft with it to their end instead (``local``). Returns the requests
        demoted or moved now (their outside drafter's state is to be released)."""
        policy, n = self.fast.policy, len(self.requests)
        if self.fast.fused_plain is None or not n:
            return []
        if policy is None:
            guard, limit = self.fast.guard, self.config.spec_max_batch  # guard: a drafter outside the graph
            # (n above the limit is over it whatever the load: every request weighs at least 1)
            load = spec_load((r.params.greedy for r in self.requests.values()), self.weight)
            if n <= limit and load <= limit:
                if guard is None or guard.speculate(n, clean=not self.demoted and not self.local):
                    self._rejoin(load, limit)
                    return []
                if self.fast.local is not None:
                    moved = [rid for rid in self.requests if rid not in self.demoted and rid not in self.local]
                    if moved:
                        log.debug("the outside drafter's rounds of %d rows do not pay: %d requests draft with %s",
                                  n, len(moved), self.fast.local.name)
                    self.local.update(moved)
                    return moved
        elif policy.speculate(n, [policy.request_tau(r.accepted, r.drafted) for rid, r in self.requests.items()
                                  if rid not in self.demoted]):
            return []
        demoted = [rid for rid in self.requests if rid not in self.demoted]
        self.demoted.update(demoted)
        return demoted

    def _rejoin(self, load: int, limit: int) -> None:
        """The load rule says speculate: its demoted requests rejoin (``rejoins``) once one more greedy arrival would
        not demote them again (a served load stepping about the limit must not move them to and fro, each move
        dropping a round launched ahead)."""
        if self.rejoins and self.demoted and load + self.weight <= limit:
            log.debug("batch policy: %d requests within spec_max_batch again: they speculate", len(self.demoted))
            self.demoted.clear()

    # ------------------------------------------------------------------ routing
    def route(self, reqs: Sequence[Request], ks: Sequence[int | None] | None = None,
              chunks: Sequence[int | None] | None = None) -> RoundPlan:
        """Each row's executor before the drafter runs (``ks``: each request's k, None its own, capped by
        ``draft_len``; ``chunks``: prefill chunks as from ``plan_round``). Rows that enter the speculative graph
        this round are ``entering`` until ``settle``."""
        rows = [self._route(r, self.draft_len(r, k), c)
                for r, k, c in zip(reqs, ks or [None] * len(reqs), chunks or [None] * len(reqs))]
        return RoundPlan(*(tuple(row for row in rows if row.path is p)
                           for p in (Path.FUSED, Path.FUSED_PLAIN, Path.EAGER, Path.ENTERING)))

    def _route(self, r: Request, k: int, chunk: int | None) -> RoutedRow:
        def eager(reason: Reason) -> RoutedRow:
            return RoutedRow(r, Path.EAGER, reason, k, k, chunk)

        fast, fused, fused_plain = self.fast, self.fast.fused, self.fast.fused_plain
        if chunk is not None or self.unseen(r) != 1:
            return eager(Reason.PREFILL)
        if not self.config.use_fused_rounds:
            if self.primes and r.rounds == 1:  # its first round after the prefill (as a graph's entering row)
                return RoutedRow(r, Path.EAGER, Reason.FUSED_OFF, 0, 0, chunk)
            return eager(Reason.FUSED_OFF)
        committed = len(r.token_ids)
        if r.request_id in self.demoted:
            fits = fused_plain.fits(committed)
            return RoutedRow(r, Path.FUSED_PLAIN, Reason.DEMOTED, 0, 0) if fits else eager(Reason.CONTEXT_FULL)
        if k == 0 and fused_plain is not None and r.request_id not in fast.next_drafts and fused_plain.fits(committed):
            return RoutedRow(r, Path.FUSED_PLAIN, Reason.NO_DRAFTS, 0, 0)
        if fused is None or (fast.local is not None and r.request_id not in self.local):
            return eager(Reason.DRAFTER_WITHOUT_GRAPH)
        if not fused.fits(committed):
            return eager(Reason.CONTEXT_FULL)
        num_draft = min(k, fused.k)  # the graph verifies the first k of its drafts; a k above its own is capped
        if fused.k == 0:
            return RoutedRow(r, Path.FUSED, Reason.ON_GRAPH, k, num_draft)
        nxt = fast.next_drafts.get(r.request_id)
        if nxt is not None:  # (it entered without drafts and that round has not run: it verifies none, as it would)
            return RoutedRow(r, Path.FUSED, Reason.ON_GRAPH, k, num_draft if nxt.drafts else 0)
        return RoutedRow(r, Path.ENTERING, Reason.FIRST_DRAFTS, k, num_draft)

    def wants(self, plan: RoundPlan) -> tuple[list[Request], list[int]]:
        """The drafts the drafter makes this round: an eager row's k; an entering row's the graph's k (or its
        own, when larger: it takes those if it runs eagerly after all), none where the graph's drafter is primed
        for it instead (``primed``)."""
        graph_k = self.fast.fused.k if self.fast.fused is not None else 0
        primes = self._graph_primes
        return ([row.request for row in plan.off_graph],
                [row.k if row.path is Path.EAGER else 0 if primes else max(row.k, graph_k)
                 for row in plan.off_graph])

    @property
    def _graph_primes(self) -> bool:
        """Whether the speculative graph's drafter (the embedded one, or the local one beside a drafter outside the
        graph) primes its entering rows instead of drafting for them (``Drafter.primes``)."""
        fused = self.fast.fused
        return fused is not None and fused.drafter is not None and fused.drafter.primes

    def primed(self, plan: RoundPlan) -> list[Request]:
        """The entering rows whose graph drafter makes their first drafts in the round itself: it is caught up on
        their committed tokens now (``Drafter.prime``: no drafts, no wait on the GPU) and they enter the graph
        verifying no drafts this round; the round drafts their first k."""
        return [row.request for row in plan.entering] if self._graph_primes else []

    def settle(self, plan: RoundPlan, items: Sequence[RoundItem]) -> RoundPlan:
        """The plan once the drafter's drafts (``items``, in ``plan.off_graph`` order) are in: an entering row
        with the graph's k first drafts (and their q when it samples), or none where the graph's drafter was primed
        for it (``primed``), whose drafter can go on in a graph from here, joins the speculative graph (verifying
        its ``num_draft`` of them; none without drafts); the rest run eagerly with their own k. Counts the rows by
        reason and logs the exits."""
        fused, eager = list(plan.fused), []
        for row, it in zip(plan.off_graph, items):
            if row.path is Path.EAGER:
                eager.append(dataclasses.replace(row, item=dataclasses.replace(it, prefill_chunk=row.prefill_chunk)))
            elif self._takes(row.request, it):
                fused.append(dataclasses.replace(row, path=Path.FUSED, reason=Reason.ENTERED,
                                                 num_draft=row.num_draft if it.drafts else 0,
                                                 item=_first(it, self.fast.fused.k)))
            else:
                eager.append(dataclasses.replace(row, path=Path.EAGER, reason=Reason.DRAFTER_NOT_READY,
                                                 num_draft=row.k, item=_first(it, row.k)))
        # the next round launched now unless both graphs run: rows running eagerly beside it (prefills) join its
        # chain later (FusedRounds.run: a plain graph's the round after, a speculative graph's once the drafter
        # made their first drafts). Requests waiting to be admitted do not stop it either: their prefill runs
        # beside the round launched ahead
        ahead = not (fused and plan.fused_plain)
        settled = RoundPlan(tuple(fused), plan.fused_plain, tuple(eager), (), ahead)
        self._count_rows(settled)
        return settled

    def _takes(self, r: Request, item: RoundItem) -> bool:
        fused = self.fast.fused
        drafter = fused.drafter  # the embedded drafter, or the local one beside a drafter outside the graph
        one_hot = drafter.deterministic  # fewer than k drafts is all it has to say, and no q crosses
        if self._graph_primes:  # (no drafts: the round makes them)
            return drafter.graph_ready(r.request_id, len(r.token_ids))
        return ((len(item.drafts) >= fused.k or one_hot) and (r.params.greedy or item.probs is not None or one_hot)
                and drafter.graph_ready(r.request_id, len(r.token_ids)))

    def _count_rows(self, plan: RoundPlan) -> None:
        self.rows.update(row.reason.value for rows in (plan.fused, plan.fused_plain, plan.eager) for row in rows)
        for row in plan.exits:
            self.fast_path_exits[row.reason.value] += 1
            seen = self._exits_logged.setdefault(row.request_id, set())
            if row.reason not in seen:
                seen.add(row.reason)
                log.debug("request %s leaves the fast path: %s", row.request_id, row.reason.value)


def _first(item: RoundItem, n: int) -> RoundItem:
    """The item with its first n drafts (and their q)."""
    return RoundItem(item.request_id, list(item.drafts)[:n], None if item.probs is None else item.probs[:n])
