"""The Drafter protocol and the typed data that crosses it.

A drafter proposes up to ``k`` tokens per request given everything committed so far. It
keeps whatever per-request state it needs (its own KV cache, a random stream) and rolls
back its own rejected drafts itself: each call hands it the full committed sequence, and
anything it had drafted beyond the committed prefix is discarded.

Capabilities are declared as attributes, never inferred from names:
- ``deterministic``: drafts are one-hot (no distribution is sent); rejection sampling then
  treats q as one-hot, which stays lossless.
- ``target_features``: target layers whose outputs the drafter drafts from (an EAGLE head);
  empty for drafters that need only tokens. When set, whoever runs the target hands each
  request's new aux features to ``propose`` (``DraftRequest.features``) exactly once;
  ``feature_size`` is their width per position (0 when ``target_features`` is empty).
- ``graph_rounds``: the drafter can draft inside a fused round's graph (engine/rounds/fused.py):
  ``round_program(rows, k, max_blocks, sampled)`` returns its ``DraftProgram`` for one bucket (sampled:
  the round also carries sampled rows, which draft from q and return it), and
  ``graph_ready(request_id, committed)`` says whether a request it has just drafted for (through
  ``propose``) can go on in fused rounds from here.
- ``tree_rounds``: (with ``graph_rounds``) its ``round_program`` takes a ``DraftTree`` (engine/rounds/tree.py):
  greedy rounds draft a tree of candidates (``draft_tree``) instead of one chain.
- ``batch_weight``: what a greedy request drafting with it weighs against ``--spec-max-batch`` (engine/policy.py
  ``spec_load``): more where its rounds pay for fewer rows: 3 for the n-gram lookup (1.25-1.6 tokens a round
  against the EAGLE head's 2.1-2.6), 2 for a drafter service (its rounds cross two RPCs), else 1.
- ``primes``: (with ``graph_rounds``) ``prime(requests)`` catches the drafter's state up on each request's
  committed tokens without drafting and without waiting on the GPU; ``graph_ready`` then holds, and the request
  enters a fused round verifying no drafts: that round drafts its first k. A drafter without it makes a request's
  first drafts through ``propose``.

Every drafter has ``capture_prefills()``: it captures the graphs of its own catch-up over a prompt up
front (on a GPU; returns how many, 0 for a drafter with no graphs or where nothing is captured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from engine.config import SamplingParams

if TYPE_CHECKING:
    from engine.kv_cache import BlockAllocator


@dataclass(frozen=True)
class DraftRequest:
    request_id: str
    token_ids: Sequence[int]  # every committed token (prompt + output); the last is not yet verified-through
    k: int                    # drafts wanted, > 0
    params: SamplingParams    # seed already resolved; temperature/top-k/top-p shape q like p
    features: torch.Tensor | None = None  # [n, aux] target aux features of positions features_start ..
    features_start: int = 0                # .. features_start + n - 1, not handed over before


@dataclass(frozen=True)
class DraftProposal:
    token_ids: list[list[int]]   # per request, at most k tokens (fewer when the drafter has nothing to say)
    probs: torch.Tensor | None   # [B, K, V] q for each draft position (rows of greedy requests unused);
                                 # None when the drafter is deterministic


class DraftProgram(Protocol):
    """A drafter's part of a fused round for one bucket of ``rows`` rows and k drafts per row."""

    allocator: BlockAllocator | None  # the drafter's KV blocks (None: it keeps none, e.g. the n-gram lookup)
    rounds: int  # whole rounds one replay drafts for (a greedy speculative graph of several; set by its graph)

    def load(self, rows: Sequence[tuple[str, int, SamplingParams]], chained: bool = False) -> None:
        """Host, before the replay: rows of (request id, L = committed tokens before the last one, params);
        make room in the drafter's own KV for the round and fill its buffers (a sampled row's noise, from
        its own stream); further rows are padding. ``chained``: a round launched before the round in flight
        was read, L the largest it can be: every length it needs is derived on the device from the round
        before; the rest as for any round."""

    def rewind(self, request_ids: Sequence[str]) -> None:
        """Host: a round loaded for these sampled requests was dropped unread; their next round draws its
        noise at the draw number that one took."""

    def grow(self, rows: Sequence[tuple[str, int, SamplingParams]]) -> None:
        """Host: the drafter's KV lengths a round of these rows writes (``load`` does this too; a round launched
        ahead, read later, needs it again once the round before has been committed)."""

    def draft(self, committed: torch.Tensor, num_accepted: torch.Tensor, aux: torch.Tensor | None,
              kv_lens: torch.Tensor, sampling=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Inside the graph. committed: [R, k+1] this round's committed tokens (positions L+1 ..; past
        num_accepted [R] they are placeholders); aux: [R*(k+1), F] the verify's target features (positions
        L .. L+k); kv_lens: [R] L + k + 1; sampling: the round's ``RoundSampling`` (None: all greedy)
        -> the next round's drafts [R, k] int64 and, in sampling rounds, their q [R, k, V] float32."""

    def commit(self, request_id: str, length: int, keep_blocks: bool = False) -> None:
        """Host, after the round: the request now has ``length`` committed tokens; forget past them
        (``keep_blocks``: but keep the KV blocks, which a round launched ahead writes into)."""


class Drafter(Protocol):
    name: str
    deterministic: bool
    target_features: tuple[int, ...]
    feature_size: int
    graph_rounds: bool
    tree_rounds: bool
    primes: bool
    batch_weight: int

    def propose(self, requests: Sequence[DraftRequest]) -> DraftProposal: ...

    def prime(self, requests: Sequence[DraftRequest]) -> None: ...

    def release(self, request_id: str) -> None: ...

    def capture_prefills(self) -> int: ...


@dataclass
class FeatureQueue:
    """Target features of consecutive positions, waiting to be handed to a feature-fed drafter once."""

    start: int = 0
    features: torch.Tensor | None = None  # [n, F] for positions start .. start + n - 1

    def add(self, start: int, feats: torch.Tensor, limit: int = 0) -> None:
        """Append (or, after a gap, replace with) these; keep at most the latest ``limit`` positions (0: all)."""
        end = self.start + (0 if self.features is None else self.features.shape[0])
        if self.features is None or start != end:
            self.features, self.start = feats, start
        else:
            self.features = torch.cat([self.features, feats])
        self._cut(limit)

    def take(self, limit: int = 0) -> tuple[int, torch.Tensor | None]:
        """Hand the queued features over (at most the latest ``limit`` positions) and empty the queue."""
        self._cut(limit)
        out = (self.start, self.features)
        self.features = None
        return out

    def _cut(self, limit: int) -> None:
        if limit and self.features is not None and self.features.shape[0] > limit:
            self.start += self.features.shape[0] - limit
            self.features = self.features[-limit:]

