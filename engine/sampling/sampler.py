"""Turning logits into a distribution and drawing from it.

The same ``probs_from_logits`` is applied to the target's and the drafter's logits, so
temperature, top-k and top-p shape both distributions identically; rejection sampling then
keeps the output distributed exactly as the (filtered) target distribution.
"""

from __future__ import annotations

import torch

from engine.models import ops


def probs_from_logits(
    logits: torch.Tensor,       # [N, V] float32
    temperature: torch.Tensor,  # [N] float32, > 0
    top_k: torch.Tensor,        # [N] int64, 0 = off
    top_p: torch.Tensor,        # [N] float32 in (0, 1], 1 = off
    filtered: bool | None = None,  # whether any row filters (top-k / top-p); None: look (a host sync)
) -> torch.Tensor:              # [N, V] float32, rows sum to 1
    """``filtered`` is the caller's when the shapes must not depend on the data (inside a CUDA graph):
    False takes the plain softmax (every row must have its filters off), True the filtering path,
    which leaves a row with top_k 0 and top_p 1 exactly as the softmax would (up to rounding). On the CPU (no
    graph) only the rows that filter take that path."""
    logits = logits.float() / temperature.unsqueeze(-1)
    use_k = top_k > 0
    use_p = top_p < 1.0
    if filtered is None:
        filtered = bool((use_k | use_p).any())
    if not filtered:
        return torch.softmax(logits, dim=-1)
    if logits.is_cpu:
        # no graph here, so the shapes may follow the data: only the rows that filter pay for the sort (over the
        # whole vocabulary it is most of a sampled round's time on a CPU), the others take the plain softmax; where
        # each of them has a top k, a top-k pick of the largest stands in for the sort
        rows = (use_k | use_p).nonzero().squeeze(-1)
        if not rows.numel():  # the caller said filtered, but no row filters
            return torch.softmax(logits, dim=-1)
        k, width = top_k[rows], None
        if bool(use_k[rows].all()):
            width = min(int(k.max()), logits.shape[-1])
        if rows.numel() == logits.shape[0]:  # every row filters: no softmax to overwrite
            return _filter(logits, top_k, top_p, use_k, use_p, width)
        probs = torch.softmax(logits, dim=-1)
        probs[rows] = _filter(logits[rows], k, top_p[rows], use_k[rows], use_p[rows], width)
        return probs
    return _filter(logits, top_k, top_p, use_k, use_p)


def _filter(
    logits: torch.Tensor,  # [N, V] float32, divided by the temperature
    top_k: torch.Tensor,   # [N] int64, 0 = off
    top_p: torch.Tensor,   # [N] float32 in (0, 1], 1 = off
    use_k: torch.Tensor,   # [N] bool: top_k > 0
    use_p: torch.Tensor,   # [N] bool: top_p < 1
    width: int | None = None,  # every row's top_k is at most this: only the largest ``width`` are ranked
) -> torch.Tensor:         # [N, V] float32, rows sum to 1
    """The sorting path: top-k, then the nucleus of the renormalized top k; shapes independent of the data (but
    ``width``'s: the CPU's)."""
    vocab = logits.shape[-1]
    if width is None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
    else:
        sorted_logits, order = logits.topk(width, dim=-1)
    rank = torch.arange(sorted_logits.shape[-1], device=logits.device)
    k = torch.where(use_k, top_k, torch.full_like(top_k, vocab))
    drop = rank.unsqueeze(0) >= k.unsqueeze(-1)                         # beyond the top k
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs            # exclusive cumulative sum
    # the nucleus is already full; rows with top_p off (== 1) must drop nothing, even where the
    # float32 cumulative mass before a tiny tail token rounds up to 1.0
    drop = (mass_before >= top_p.unsqueeze(-1)) & use_p.unsqueeze(-1)
    drop[:, 0] = False                                                  # always keep the top token
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return sorted_probs.new_zeros(logits.shape).scatter_(-1, order, sorted_probs)


def sample_from_probs(
    probs: torch.Tensor,  # [..., V] float32 (need not be normalized)
    noise: torch.Tensor,  # [..., V] float32, i.i.d. Exponential(1)
) -> torch.Tensor:        # [...] int64
    """argmax(probs / noise): an exact draw from probs / probs.sum() (exponential race)."""
    return ops.argmax(probs, noise)
