"""How a model-based drafter turns its logits into draft tokens and the q it sends along.

Greedy requests draft the argmax. Sampled requests draw from q = the drafter's distribution
shaped by the request's temperature / top-k / top-p; with ``top_m`` set, q is first cut to its
m most likely tokens and renormalized, so the drafter samples from exactly the distribution
that crosses the wire (which keeps verification lossless). Each request has its own random
stream, derived from its seed. A drafter may hold that stream to a fixed number of draws per
round (``skip``): a fused round draws the next round's noise before it knows how many drafts
that round will keep, so the eager drafter draws (or skips) as many, and a seeded request
decodes the same tokens on both paths.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.drafters.base import DraftRequest, draft_seed
from engine.sampling import probs_from_logits, sample_from_probs


class DraftSampler:
    def __init__(self, target_vocab: int, top_m: int = 0, device: torch.device | str = "cpu",
                 draws_per_round: int = 0) -> None:
        """draws_per_round: noise rows a sampled request's stream advances by each round (``skip``); a fused
        round draws k (the engine's k) for the next round; 0: as many as drafted."""
        self.target_vocab = target_vocab
        self.top_m = top_m
        self.draws_per_round = draws_per_round
        self._generators: dict[str, torch.Generator] = {}
        self._device = torch.device(device)  # where the drafter's logits, and so its streams, live

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def generator(self, request_id: str, seed: int) -> torch.Generator:
        """The request's drafting stream (derived from its seed), created on first use."""
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self._device).manual_seed(draft_seed(seed))
            self._generators[request_id] = gen
        return gen

    def skip(self, reqs: Sequence[DraftRequest], drawn: Sequence[int]) -> None:
        """Advance each sampled request's stream to ``draws_per_round`` noise rows this round (``drawn``: rows
        already drawn for it)."""
        for r, n in zip(reqs, drawn):
            if not r.params.greedy and n < self.draws_per_round:
                gen = self.generator(r.request_id, r.params.seed)
                torch.empty(self.draws_per_round - n, self.target_vocab, device=self._device).exponential_(
                    generator=gen)

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
            gen = self.generator(reqs[i].request_id, reqs[i].params.seed)
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
    return torch.where(greedy, logits.argmax(dim=-1), sample_from_probs(q, noise)), q
