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
  request's new aux features to ``propose`` (``DraftRequest.features``) exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from engine.config import SamplingParams


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


class Drafter(Protocol):
    name: str
    deterministic: bool
    target_features: tuple[int, ...]

    def propose(self, requests: Sequence[DraftRequest]) -> DraftProposal: ...

    def release(self, request_id: str) -> None: ...


def draft_seed(seed: int) -> int:
    """The drafter's random stream for a request: derived from, but independent of, the target's."""
    return (seed * 6364136223846793005 + 1442695040888963407) % (2**63)
