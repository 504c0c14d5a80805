"""Per-row sampling parameters as one tensor: what every round reads (the eager round's verify, a fused round's
graph, a drafter's picks), packed in one place.

A row is ``(greedy, temperature, top_k, top_p)`` in float32, so a batch's parameters cross to the device in
one copy and a graph unpacks them on the device (``RowParams.unpack``: no host sync). A greedy request and
a padding row are ``GREEDY_ROW``: temperature 1 keeps the softmax every sampled path computes finite on rows
whose result is then unused, and its filters are off. top_k crosses as a float: exact up to 2**24, and any
larger value still exceeds every vocabulary, which is what it means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.config import SamplingParams

GREEDY_ROW = (1.0, 1.0, 0.0, 1.0)  # greedy, temperature 1 (finite, unused), top_k off, top_p off


def pack_rows(params: Sequence[SamplingParams], rows: int | None = None) -> torch.Tensor:
    """[rows, 4] float32 on the host, one row per request (greedy requests ``GREEDY_ROW``); rows past
    ``len(params)`` (``rows`` None: none) are greedy padding."""
    table = [GREEDY_ROW if p.greedy else (0.0, p.temperature, float(p.top_k), p.top_p) for p in params]
    table += [GREEDY_ROW] * ((rows if rows is not None else len(params)) - len(params))
    return torch.tensor(table, dtype=torch.float32).view(-1, 4)


@dataclass(frozen=True)
class RowParams:
    """The packed rows as the tensors ``probs_from_logits`` and the pickers read."""

    greedy: torch.Tensor       # [R] bool
    temperature: torch.Tensor  # [R] float32, 1 on greedy rows
    top_k: torch.Tensor        # [R] int64, 0 = off
    top_p: torch.Tensor        # [R] float32, 1 = off

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> "RowParams":
        """[R, 4] packed rows (on any device, inside a graph too) -> their tensors."""
        return cls(packed[:, 0] > 0.5, packed[:, 1], packed[:, 2].long(), packed[:, 3])

    @classmethod
    def of(cls, params: Sequence[SamplingParams], device: torch.device) -> "RowParams":
        """The rows of these requests on ``device``: one packed copy."""
        return cls.unpack(pack_rows(params).to(device, non_blocking=True))

    def repeat(self, n: int) -> "RowParams":
        """Every row n times in a row (one per position of a request's verify)."""
        return RowParams(*(t.repeat_interleave(n) for t in (self.greedy, self.temperature, self.top_k, self.top_p)))
