"""How a model-based drafter turns its logits into draft tokens and the q it sends along.

Greedy requests draft the argmax. Sampled requests draw from q = the drafter's distribution
shaped by the request's temperature / top-k / top-p; with ``top_m`` set, q is first cut to its
m most likely tokens and renormalized, so the drafter samples from exactly the distribution
that crosses the wire (which keeps verification lossless). Each request has its own random
stream, derived from its seed.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.drafters.base import DraftRequest, draft_seed
from engine.sampling import probs_from_logits, sample_from_probs


class DraftSampler:
    def __init__(self, target_vocab: int, top_m: int = 0) -> None:
        self.target_vocab = target_vocab
        self.top_m = top_m
        self._generators: dict[str, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [N, V_draft] -> [N, V_target] (cut padding rows, or -inf for ids the drafter lacks)."""
        v = logits.shape[-1]
        if v > self.target_vocab:
            return logits[:, : self.target_vocab]
        if v < self.target_vocab:
            return torch.nn.functional.pad(logits, (0, self.target_vocab - v), value=float("-inf"))
        return logits

    def pick(self, logits: torch.Tensor, reqs: Sequence[DraftRequest]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits: [N, V] one row per request -> tokens [N], q [N, V] (None when every request is greedy)."""
        logits = self.fit_vocab(logits)
        tokens = logits.argmax(dim=-1)
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if not sampled:
            return tokens, None
        dev = logits.device
        params = [reqs[i].params for i in sampled]
        q_rows = probs_from_logits(
            logits[sampled],
            torch.tensor([p.temperature for p in params], device=dev),
            torch.tensor([p.top_k for p in params], device=dev),
            torch.tensor([p.top_p for p in params], device=dev))
        if self.top_m:
            q_rows = keep_top_m(q_rows, self.top_m)
        for row, i in enumerate(sampled):
            gen = self._generators.get(reqs[i].request_id)
            if gen is None:
                gen = torch.Generator(device=dev).manual_seed(draft_seed(reqs[i].params.seed))
                self._generators[reqs[i].request_id] = gen
            noise = torch.empty(q_rows.shape[-1], device=dev).exponential_(generator=gen)
            tokens[i] = sample_from_probs(q_rows[row], noise)
        q = torch.zeros_like(logits)
        q[sampled] = q_rows
        return tokens, q


def keep_top_m(q: torch.Tensor, m: int) -> torch.Tensor:
    """q [N, V] -> the same rows restricted to their m most likely tokens, renormalized."""
    if m >= q.shape[-1]:
        return q
    values, ids = q.topk(m, dim=-1)
    return torch.zeros_like(q).scatter_(-1, ids, values / values.sum(-1, keepdim=True))
