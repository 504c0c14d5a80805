"""Prompt lookup inside a fused round (engine/rounds/fused.py): the n-gram match on the device.

The requests' committed tokens live on the device in a ``TokenHistory`` (one row per request, token p in column
p), written by the host when a request is drafted for eagerly (``NgramDrafter.propose``) and by each fused round
itself, which appends its committed tokens before it looks up the next drafts. ``lookup_drafts`` is the host
drafter's ``NgramDrafter.lookup`` over tensors, every row at once, in a fixed shape a CUDA graph can hold: the
most recent earlier occurrence of the longest suffix of n tokens (n from ``max_n`` down to ``min_n``) that occurs
earlier, and the up to k tokens that followed it. Positions past what is known are ``PLACEHOLDER_TOKEN_ID``: the
round verifies only a row's leading real drafts, exactly as the eager round verifies the shorter list the host
drafter returns, so the output and the acceptance are the same on both paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from engine.config import SamplingParams
from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID

if TYPE_CHECKING:
    from engine.drafters.ngram import NgramDrafter


class TokenHistory:
    """Committed tokens of up to ``slots`` requests on the device, one row each (a last row for padding rows)."""

    def __init__(self, slots: int, width: int, device: torch.device | str) -> None:
        self.width, self.scratch = width, slots
        self.tokens = torch.zeros(slots + 1, width, dtype=torch.long, device=device)  # [S + 1, W]
        self._free = list(range(slots - 1, -1, -1))
        self._slot: dict[str, int] = {}
        self._known: dict[str, int] = {}  # tokens of the request the row holds (positions 0 .. known - 1)

    def write(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Host: the request's committed tokens (only those not there yet are copied). A request that does not fit
        (no free row, or longer than a row) is not held: it drafts on the host only."""
        n = len(token_ids)
        slot = self._slot.get(request_id)
        if slot is None:
            if not self._free or n > self.width:
                return
            slot = self._slot[request_id] = self._free.pop()
            self._known[request_id] = 0
        known = self._known[request_id]
        if n > self.width:
            self.release(request_id)
            return
        if n < known:  # its tokens were rolled back: write them all again
            known = 0
        if known < n:
            self.tokens[slot, known:n].copy_(torch.tensor(token_ids[known:n], dtype=torch.long), non_blocking=True)
        self._known[request_id] = n

    def holds(self, request_id: str, committed: int) -> bool:
        return self._known.get(request_id) == committed

    def slot(self, request_id: str) -> int:
        return self._slot.get(request_id, self.scratch)

    def committed(self, request_id: str, length: int) -> None:
        """After a fused round: the round wrote the request's tokens through ``length``."""
        if request_id in self._known:
            self._known[request_id] = length

    def release(self, request_id: str) -> None:
        slot = self._slot.pop(request_id, None)
        self._known.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)


def lookup_drafts(
    history: torch.Tensor,       # [S + 1, W] long: every request's tokens (written here: the round's committed)
    slots: torch.Tensor,         # [R] long: each row's row of ``history``
    committed: torch.Tensor,     # [R, k + 1] long: this round's committed tokens, placeholders past num_accepted
    num_accepted: torch.Tensor,  # [R] long
    lengths: torch.Tensor,       # [R] long: L, each row's committed tokens before this round's t0 (at position L)
    k: int, max_n: int, min_n: int,
) -> torch.Tensor:               # [R, k] long: the next drafts, PLACEHOLDER_TOKEN_ID past what the match gives
    rows, width = slots.shape[0], history.shape[1]
    device = history.device
    offsets = torch.arange(k + 1, device=device)
    positions = (lengths[:, None] + 1 + offsets[None, :]).clamp(max=width - 1)      # [R, k + 1] L + 1 .. L + k + 1
    history.index_put_((slots[:, None].expand(rows, k + 1), positions), committed)
    h = history.index_select(0, slots)                                                 # [R, W]
    known = lengths + num_accepted + 2                                                 # [R] tokens now committed
    start = torch.full_like(known, -1)                                                 # [R] first continuation token
    cols = torch.arange(width, device=device)
    for n in range(min_n, max_n + 1):  # a longer match overrides a shorter one
        if n >= width:
            break
        tail = (known[:, None] - n + torch.arange(n, device=device)[None, :]).clamp(min=0)  # [R, n]
        suffix = h.gather(1, tail)
        windows = width - n + 1
        hit = h[:, :windows] == suffix[:, :1]                                          # [R, W - n + 1]
        for i in range(1, n):
            hit &= h[:, i: windows + i] == suffix[:, i: i + 1]
        j = cols[:windows]
        hit &= j[None, :] <= (known - 1 - n)[:, None]                                  # earlier than the suffix itself
        last = torch.where(hit, j[None, :], -1).amax(dim=1)                            # [R] the most recent match
        start = torch.where(last >= 0, last + n, start)
    idx = start[:, None] + offsets[None, :k]                                           # [R, k]
    real = (start[:, None] >= 0) & (idx < known[:, None])
    return torch.where(real, h.gather(1, idx.clamp(0, width - 1)), PLACEHOLDER_TOKEN_ID)


class NgramProgram:
    """The n-gram drafter's part of a fused round for one bucket of ``rows`` rows (engine/drafters/base.py's
    ``DraftProgram``): no KV and no randomness of its own, only the history rows its rows read."""

    allocator = None  # no KV blocks of its own
    rounds = 1  # whole rounds a replay drafts for (a history row holds a whole context: nothing to grow)

    def __init__(self, drafter: "NgramDrafter", rows: int, k: int) -> None:
        self.history, self.k, self.rows = drafter.history, k, rows
        self.max_n, self.min_n = drafter.max_n, drafter.min_n
        self.slots = torch.full((rows,), self.history.scratch, dtype=torch.long, device=self.history.tokens.device)

    def load(self, rows: Sequence[tuple[str, int, SamplingParams]], chained: bool = False) -> None:
        slots = [self.history.slot(rid) for rid, _, _ in rows] + [self.history.scratch] * (self.rows - len(rows))
        self.slots.copy_(torch.tensor(slots, dtype=torch.long), non_blocking=True)

    def rewind(self, request_ids: Sequence[str]) -> None:
        pass  # deterministic: no draws to give back

    def grow(self, rows: Sequence[tuple[str, int, SamplingParams]]) -> None:
        pass  # a history row holds a whole context

    def commit(self, request_id: str, length: int, keep_blocks: bool = False) -> None:
        self.history.committed(request_id, length)

    def draft(self, committed: torch.Tensor, num_accepted: torch.Tensor, aux: torch.Tensor | None,
              kv_lens: torch.Tensor, sampling=None) -> tuple[torch.Tensor, None]:
        lengths = kv_lens - (self.k + 1)
        return lookup_drafts(self.history.tokens, self.slots, committed, num_accepted, lengths, self.k,
                             self.max_n, self.min_n), None
