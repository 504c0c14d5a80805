"""Verification of draft tokens: greedy matching and lossless rejection sampling.

Vocabulary: of a request's ``num_draft`` draft tokens the first ``num_accepted`` are
*accepted*; at the first rejection the target draws a *recovered* token from the normalized
residual max(0, p - q); when every draft is accepted it draws a *bonus* token from p at the
position after the last draft. Either way a round commits ``num_accepted + 1`` tokens.

Rows are padded to ``K`` drafts; positions past a row's drafts hold ``PLACEHOLDER_TOKEN_ID``.
The randomness comes in as tensors (``uniforms``, ``noise``) so these functions are pure and
the caller decides how coins are drawn (per-request generators, preallocated buffers).
"""

from __future__ import annotations

import torch

from engine.models import ops
from engine.sampling.sampler import sample_from_probs

PLACEHOLDER_TOKEN_ID = -1


def _num_accepted(accept: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    # accept: [B, K] bool -> length of the all-accepted prefix, capped by num_draft: [B]
    k = accept.shape[1]
    valid = torch.arange(k, device=accept.device).unsqueeze(0) < num_draft.unsqueeze(1)
    return (accept & valid).int().cumprod(dim=1).sum(dim=1).long()


def _assemble(draft_token_ids: torch.Tensor, num_accepted: torch.Tensor,
              final_token: torch.Tensor) -> torch.Tensor:
    # accepted drafts, then the recovered/bonus token at index num_accepted, then placeholders
    b, k = draft_token_ids.shape
    out = torch.full((b, k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=draft_token_ids.device)
    idx = torch.arange(k + 1, device=out.device).unsqueeze(0)
    out[:, :k] = torch.where(idx[:, :k] < num_accepted.unsqueeze(1), draft_token_ids, out[:, :k])
    out.scatter_(1, num_accepted.unsqueeze(1), final_token.unsqueeze(1))
    return out


def greedy_verify(
    draft_token_ids: torch.Tensor,  # [B, K] int64
    num_draft: torch.Tensor,        # [B] int64
    target_argmax: torch.Tensor,    # [B, K+1] int64: the target's greedy token at each position
) -> tuple[torch.Tensor, torch.Tensor]:  # output ids [B, K+1], num_accepted [B]
    """On CUDA at inference one launch (``kernels.greedy_accept``, the same contract), else these torch
    steps (about a dozen launches on a GPU)."""
    if ops.use_kernels(target_argmax):
        from kernels.greedy_accept import greedy_accept

        return greedy_accept(draft_token_ids, num_draft, target_argmax)
    accept = draft_token_ids == target_argmax[:, :-1]
    num_accepted = _num_accepted(accept, num_draft)
    final = target_argmax.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    return _assemble(draft_token_ids, num_accepted, final), num_accepted


def rejection_sample(
    draft_token_ids: torch.Tensor,      # [B, K] int64
    num_draft: torch.Tensor,            # [B] int64
    target_probs: torch.Tensor,         # [B, K+1, V] float32
    draft_probs: torch.Tensor | None,   # [B, K, V] float32; None: the drafts are one-hot (deterministic)
    uniforms: torch.Tensor,             # [B, K] float32 in [0, 1)
    noise: torch.Tensor,                # [B, V] float32, Exponential(1): one draw per row
) -> tuple[torch.Tensor, torch.Tensor]:  # output ids [B, K+1], num_accepted [B]
    """On CUDA at inference one launch (``kernels.rejection_accept``, the same contract, bit for bit), which
    races only the position each row draws at; else these torch steps over every position (about twenty
    launches on a GPU, [B, K+1, V] tensors in between)."""
    if ops.use_kernels(target_probs):
        from kernels.rejection_accept import rejection_accept

        return rejection_accept(draft_token_ids, num_draft, target_probs, draft_probs, uniforms, noise)
    b, k = draft_token_ids.shape
    safe_ids = draft_token_ids.clamp(min=0).unsqueeze(-1)                 # [B, K, 1]
    p_draft = target_probs[:, :k].gather(-1, safe_ids).squeeze(-1)        # p(d_j) [B, K]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
        residual = target_probs[:, :k].scatter(-1, safe_ids, 0.0)         # p with d_j removed
    else:
        q_draft = draft_probs.gather(-1, safe_ids).squeeze(-1)            # q(d_j) [B, K]
        residual = (target_probs[:, :k] - draft_probs).clamp(min=0.0)
    accept = uniforms * q_draft < p_draft                                 # u < p/q, without dividing
    num_accepted = _num_accepted(accept, num_draft)
    # a row whose residual vanished (p == q up to rounding) cannot reject; fall back to p
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, target_probs[:, :k], residual)
    # distribution to draw from at each position: residual where a draft was rejected,
    # p itself at the position right after the last draft (bonus)
    last = torch.arange(k + 1, device=num_draft.device).unsqueeze(0) == num_draft.unsqueeze(1)
    dist = torch.cat([residual, target_probs[:, k:]], dim=1)              # [B, K+1, V]
    dist = torch.where(last.unsqueeze(-1), target_probs, dist)
    at = num_accepted.view(b, 1, 1).expand(b, 1, dist.shape[-1])
    final = sample_from_probs(dist.gather(1, at).squeeze(1), noise)
    return _assemble(draft_token_ids, num_accepted, final), num_accepted
