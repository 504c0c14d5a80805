"""The co-located fast path: its graph executors and the state a request keeps on it between rounds.

Two graph executors (engine/rounds/fused.py), each built when fused rounds are on:
- ``fused``, the *speculative graph*: k drafts a row, of which each row verifies its ``num_draft``; with no
  drafter (or k 0) it decodes plainly. A drafter that cannot draft inside a graph (n-gram) gets none.
- ``fused_plain``, the *plain graph* (k 0, no drafter), built when the batch policy is on
  (``spec_max_batch``): the requests it demotes decode in it to their end.
A drafter outside the graph (a drafter service's, verifier_svc/remote_drafter.py) drafts for eager rounds; with a
``local`` drafter that drafts in a graph (n-gram), the speculative graph is that drafter's, and the requests the
guard (engine/policy.py ``SpecGuard``) finds the outside drafter's rounds not to pay for draft there instead, to
their end (``Scheduler.local``).
Between rounds each request on the speculative graph keeps the k drafts (and, sampled, their q) its last
round drafted (``next_drafts``): the next round verifies them. Everything else a row needs lives in the
target's and the drafter's KV caches.

``run`` takes a graph and its rows of the ``RoundPlan`` and returns one ``RowResult`` per row; the decoder
commits them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from engine.policy import SpecGuard, SpecPolicy, spec_load
from engine.rounds.base import RoundPlan, RoutedRow, RowResult
from engine.rounds.fused import FusedRounds, FusedRow
from engine.rounds.graph_sampling import Mode
from engine.rounds.tree import DraftTree

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.drafters.base import Drafter
    from engine.runner import ModelRunner


@dataclass(frozen=True)
class NextDrafts:
    drafts: list[int]           # the k drafts the speculative graph made for the request's next round
    q: torch.Tensor | None      # [k, V] their q (sampled requests), on the device


class FastPath:
    def __init__(self, target: "ModelRunner", drafter: "Drafter | None", config: "EngineConfig",
                 max_context: int, local: "Drafter | None" = None) -> None:
        self.fused: FusedRounds | None = None
        self.fused_plain: FusedRounds | None = None
        self.next_drafts: dict[str, NextDrafts] = {}
        self.policy: SpecPolicy | None = None  # speculate or not, per round, by cost (engine/policy.py)
        self.guard: SpecGuard | None = None  # the default rule's check on a drafter outside the graph (policy.py)
        self.local: "Drafter | None" = None  # the speculative graph's drafter where ``drafter`` is outside it
        if not config.use_fused_rounds:
            return

        def graph(k: int, d: "Drafter | None") -> FusedRounds:
            tree = DraftTree(config.spec_tree) if k and config.spec_tree is not None else None
            return FusedRounds(target, d, k, config.max_batch_size, max_context,
                               capture=target.device.type == "cuda", pipeline_rows=config.pipeline_rows,
                               steps=config.spec_round_count if k else config.plain_round_steps,
                               steps_from=config.spec_rounds_min_batch if k else config.plain_steps_min_batch,
                               tree=tree)

        outside = drafter is not None and config.k and not drafter.graph_rounds
        if not outside:
            self.fused = graph(config.k if drafter is not None else 0, drafter if config.k else None)
        elif local is not None and local.graph_rounds and config.spec_max_batch is not None:
            self.local = local
            self.fused = graph(config.k, local)
        if drafter is not None and config.k and config.spec_max_batch is not None:
            self.fused_plain = graph(0, None)
        if (not outside and self.fused is not None and self.fused.k and self.fused_plain is not None
                and config.spec_policy == "cost"):
            self.policy = SpecPolicy(self.fused.k, self.fused.store.batch_buckets, config.spec_max_batch)
        if outside and self.fused_plain is not None:  # (the cost rule needs the drafter's graph to time)
            self.guard = SpecGuard(self.fused_plain.store.batch_buckets)

    @property
    def graphs(self) -> list[FusedRounds]:
        return [g for g in (self.fused, self.fused_plain) if g is not None]

    def capture(self, max_batch: int, spec_max_batch: int | None, modes: Sequence[Mode] | None = None,
                weight: int = 1) -> int:
        """Build (capture) the round graphs a server's batches will take, before requests arrive. With the cost
        policy (a drafter drafting in the graph and a batch policy): both graphs at every size, then each bucket's
        replay timed for the policy. Else the speculative graph for rounds of up to ``spec_max_batch`` rows (every
        size where there is no batch policy), the plain graph for every size where a load can pass the limit (the
        requests the policy demotes decode plainly as their batch shrinks too, to their end or until the load
        allows; a greedy request weighs ``weight``, a sampled one ``policy.SAMPLED_LOAD`` times that: 16 sampled ones
        pass a limit of 16; with a drafter outside the graph, each bucket's replay timed for the guard)."""
        n, kw = 0, {} if modes is None else {"modes": tuple(modes)}
        spec, plain = (g.store if g is not None else None for g in (self.fused, self.fused_plain))
        if self.policy is not None:  # both graphs at every size, each timed: what the cost rule compares
            n += spec.capture_buckets(max_batch, **kw) + plain.capture_buckets(max_batch, **kw)
            self.policy.timed(spec.replay_ms(), plain.replay_ms())
            return n
        if spec is not None:
            n += spec.capture_buckets(max_batch if plain is None else min(spec_max_batch, max_batch), **kw)
        # a load past the limit decodes plainly: more requests than it, or fewer that sample (each weighs more)
        heaviest = spec_load([modes is not None and set(modes) == {Mode.GREEDY}] * max_batch, weight)
        if plain is not None and (spec_max_batch < heaviest or self.guard is not None):
            n += plain.capture_buckets(max_batch, **kw)
        if self.guard is not None:  # what a plain token costs, against the drafter's rounds measured later
            self.guard.timed(plain.replay_ms())
        return n

    def expect(self, plan: RoundPlan) -> None:
        """Before the drafter runs for a round: a round launched ahead for other rows than those about to run on
        its graph (besides rows that finished) is dropped; rows arriving off the graphs leave it be."""
        for g, rows in ((self.fused, plan.fused), (self.fused_plain, plan.fused_plain)):
            if g is not None:
                g.expect(tuple(row.request_id for row in rows))

    def drop_ahead(self) -> None:
        """A caller is about to run rounds of its own (the verifier service's Prefill and Verify)."""
        for g in self.graphs:
            g.expect(())

    def forget(self, request_id: str) -> None:
        """The request leaves the speculative graph (or finishes): its next drafts are stale."""
        self.next_drafts.pop(request_id, None)

    def run(self, graph: FusedRounds, rows: Sequence[RoutedRow], ahead: bool = False) -> list[RowResult | None]:
        """One round of ``graph`` for these rows: a row entering verifies the drafts it carries (``item``), any
        other the next drafts its last round left. ``ahead``: the same rows are expected back next round
        (``FusedRounds.run``). None: a row that joins the chain of rounds launched ahead (it runs next round)."""
        fused_rows = []
        for row in rows:
            r = row.request
            if row.item is not None:
                drafts, q = list(row.item.drafts), row.item.probs
            else:
                nxt = self.next_drafts.get(r.request_id)
                drafts, q = (nxt.drafts, nxt.q) if nxt is not None else ([], None)
            fused_rows.append(FusedRow(r.request_id, r.token_ids, drafts, r.params, row.num_draft, q, r.draws,
                                       r.room(), min(row.k, graph.k)))
        results = graph.run(fused_rows, ahead)
        for row, fused_row, res in zip(rows, fused_rows, results):
            if res is None:  # it joins the chain of rounds launched ahead: it runs from the next round, verifying
                if graph.k:  # the drafts it carries now (where that round is dropped, the host's launch does)
                    self.next_drafts[row.request_id] = NextDrafts(list(fused_row.drafts), fused_row.q)
                continue
            if not row.request.params.greedy:  # a draw a forward: a plain round's, one a token
                row.request.draws += 1 if graph.k else len(res.committed)
            if graph.k:
                self.next_drafts[row.request_id] = NextDrafts(res.next_drafts, res.next_q)
        return results
