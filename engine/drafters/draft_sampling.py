"""How a model-based drafter turns its logits into draft tokens and the q it sends along.

Greedy requests draft the argmax. Sampled requests draw from q = the drafter's distribution
shaped by the request's temperature / top-k / top-p; with ``top_m`` set, q is first cut to its
m most likely tokens and renormalized, so the drafter samples from exactly the distribution
that crosses the wire (which keeps verification lossless). A request's draft noise is its
``Stream.DRAFT`` (engine/sampling/coins.py): round n's step j reads the row at the request's
draw number n, columns j*V .. (j+1)*V. A round advances the draw number by one however many
steps it drafted (``end_round``), so the eager drafter and a fused round (which draws all k
steps' noise before it knows how many drafts the round keeps) read the same numbers, and a
seeded request decodes the same tokens on both paths.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from engine.config import SamplingParams
from engine.drafters.base import DraftRequest
from engine.models import ops
from engine.sampling import RowParams, coins, probs_from_logits, sample_from_probs
from engine.upload import upload


class DraftSampler:
    def __init__(self, target_vocab: int, top_m: int = 0) -> None:
        self.target_vocab = target_vocab
        self.top_m = top_m
        self._draws: dict[str, int] = {}  # each sampled request's draw number (rounds drafted)

    def release(self, request_id: str) -> None:
        self._draws.pop(request_id, None)

    def draw_number(self, request_id: str) -> int:
        return self._draws.get(request_id, 0)

    def end_round(self, rows: Iterable[tuple[str, SamplingParams]]) -> None:
        """(request_id, params) of the round's requests: each sampled one drafts its next round from its next
        draw number."""
        for rid, params in rows:
            if not params.greedy:
                self._draws[rid] = self.draw_number(rid) + 1

    def fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [N, V_draft] -> [N, V_target] (cut padding rows, or -inf for ids the drafter lacks)."""
        v = logits.shape[-1]
        if v > self.target_vocab:
            return logits[:, : self.target_vocab]
        if v < self.target_vocab:
            return torch.nn.functional.pad(logits, (0, self.target_vocab - v), value=float("-inf"))
        return logits

    def rewind(self, request_ids: Iterable[str]) -> None:
        """Undo one ``end_round`` of these sampled requests (a round drafted for them was dropped unread)."""
        for rid in request_ids:
            self._draws[rid] = self.draw_number(rid) - 1

    def pick(self, logits: torch.Tensor, reqs: Sequence[DraftRequest], step: int
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits: [N, V] one row per request, at draft step ``step`` of the round -> tokens [N], q [N, V]
        (None when every request is greedy)."""
        logits = self.fit_vocab(logits)
        tokens = ops.argmax(logits)
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if not sampled:
            return tokens, None
        dev = logits.device
        params = [reqs[i].params for i in sampled]
        p = RowParams.of(params, dev)
        rows = upload(sampled, dev)  # (a list index would copy it with a stream sync)
        filtered = any(x.filters for x in params)  # known here: no look on the device
        q_rows = probs_from_logits(logits[rows], p.temperature, p.top_k, p.top_p, filtered)
        if self.top_m:
            q_rows = keep_top_m(q_rows, self.top_m)
        v = q_rows.shape[-1]
        noise = coins.draw([p.seed for p in params], [self.draw_number(reqs[i].request_id) for i in sampled], v,
                           coins.Stream.DRAFT, dev, col0=step * v, exponential=True)
        tokens[rows] = sample_from_probs(q_rows, noise)
        q = torch.zeros_like(logits)
        q[rows] = q_rows
        return tokens, q


def keep_top_m(q: torch.Tensor, m: int) -> torch.Tensor:
    """q [N, V] -> the same rows restricted to their m most likely tokens, renormalized."""
    if m >= q.shape[-1]:
        return q
    values, ids = q.topk(m, dim=-1)
    return torch.zeros_like(q).scatter_(-1, ids, values / values.sum(-1, keepdim=True))


def pick_in_graph(
    logits: torch.Tensor,       # [R, V] float32 drafter logits (target vocabulary)
    greedy: torch.Tensor,       # [R] bool: rows that draft their argmax
    temperature: torch.Tensor,  # [R] float32 (> 0 on every row; greedy rows ignore it)
    top_k: torch.Tensor,        # [R] int64
    top_p: torch.Tensor,        # [R] float32
    noise: torch.Tensor,        # [R, V] float32 Exponential(1), drawn outside the graph
    filtered: bool,
    top_m: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [R] int64, q [R, V] float32
    """``DraftSampler.pick`` with fixed shapes, for every row at once: the same q and the same
    exponential race, so a request drafts the same tokens from the same stream in a graph."""
    q = probs_from_logits(logits, temperature, top_k, top_p, filtered)
    if top_m:
        q = keep_top_m(q, top_m)
    return torch.where(greedy, ops.argmax(logits), sample_from_probs(q, noise)), q
