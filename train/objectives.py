"""Distillation losses: the drafter's distribution against the target's, position by position.

Batches are right-padded ``tokens [B, S]`` with ``mask [B, S]`` true at positions p whose next
token x_{p+1} is a response token: there the target's distribution p(. | x_<=p) is the teacher.
The loss is the cross-entropy of the drafter's distribution against the target's full
distribution (KL up to the target's entropy, same gradient), optionally plus a weighted
cross-entropy against the target's argmax, the token greedy verification accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.eagle import EagleHead
from engine.models.llama import LlamaForCausalLM
from train.dense import CausalAttention, UnrolledAttention


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, S] long, right-padded
    mask: torch.Tensor    # [B, S] bool: positions whose next token is a response token


@dataclass
class Teacher:
    logits: torch.Tensor  # [N, V] float32 target logits at the masked positions (row-major order)
    aux: torch.Tensor | None  # [B, S, aux] target aux features (EAGLE only)


def _positions(b: int, s: int, device: torch.device) -> torch.Tensor:
    return torch.arange(s, device=device).repeat(b)


@torch.no_grad()
def teacher(target: LlamaForCausalLM, batch: Batch, aux_layers: tuple[int, ...] = ()) -> Teacher:
    b, s = batch.tokens.shape
    hidden, aux = target.forward_aux(batch.tokens.reshape(-1), _positions(b, s, batch.tokens.device),
                                     CausalAttention(b), aux_layers)
    logits = target.compute_logits(hidden.view(b, s, -1)[batch.mask])
    return Teacher(logits, None if aux is None else aux.view(b, s, -1))


def distill_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, hard_weight: float = 0.0) -> torch.Tensor:
    """Cross-entropy against the target's full distribution, plus ``hard_weight`` times the cross-entropy
    against its argmax (what greedy verification accepts). draft_logits, target_logits: [N, V] -> scalar."""
    logq = draft_logits.float().log_softmax(-1)
    loss = -(target_logits.float().softmax(-1) * logq).sum(-1).mean()
    if hard_weight:
        loss = loss - hard_weight * logq.gather(-1, target_logits.argmax(-1, keepdim=True)).mean()
    return loss


@dataclass
class StepStats:
    loss: float
    agree: list[float]  # top-1 agreement with the target per unroll step


def lm_loss(draft: LlamaForCausalLM, batch: Batch, t: Teacher, hard_weight: float = 0.0
            ) -> tuple[torch.Tensor, StepStats]:
    b, s = batch.tokens.shape
    hidden = draft(batch.tokens.reshape(-1), _positions(b, s, batch.tokens.device), CausalAttention(b))
    logits = draft.compute_logits(hidden.view(b, s, -1)[batch.mask])
    loss = distill_loss(logits, t.logits, hard_weight)
    agree = (logits.argmax(-1) == t.logits.argmax(-1)).float().mean().item()
    return loss, StepStats(loss.item(), [agree])


def entry_teacher_rows(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, S] (positions taught, row-major = the rows of ``Teacher.logits``) -> [B, S-1]: the teacher row
    of head entry i (token position i + 1), or -1 where that position is not taught."""
    row_of = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
    row_of[mask] = torch.arange(int(mask.sum()), device=mask.device)
    return row_of[:, 1:]


def eagle_loss(head: EagleHead, batch: Batch, t: Teacher, unroll: int = 3, decay: float = 0.8,
               hard_weight: float = 0.0) -> tuple[torch.Tensor, StepStats]:
    """Head entry i (token position p = i + 1) reads x_p and f_{p-1}; it predicts x_{p+1}, taught by
    the target's distribution at position p. Unroll step j replaces the target's feature with the
    head's own output from step j - 1 (what drafting token j + 1 sees at serving time)."""
    b, s = batch.tokens.shape
    dev = batch.tokens.device
    tokens = batch.tokens[:, 1:].reshape(-1)                       # entries 0 .. S-2
    positions = _positions(b, s - 1, dev)
    feats = head.fuse_features(t.aux[:, :-1]).reshape(b * (s - 1), -1)
    pos_mask = batch.mask[:, 1:]                                   # [B, S-1]
    entry_rows = entry_teacher_rows(batch.mask)
    attn = UnrolledAttention(b)
    total = torch.zeros((), device=dev)
    weight_sum = 0.0
    agree = []
    entry = torch.arange(s - 1, device=dev)[None, :].expand(b, -1)
    for j in range(unroll):
        out = head(tokens, positions, attn, feats)                 # [B*(S-1), H]
        sel = pos_mask & (entry >= j)
        if sel.any():
            logits = head.compute_logits(out.view(b, s - 1, -1)[sel])
            teach = t.logits[entry_rows[sel]]
            w = decay ** j
            total = total + w * distill_loss(logits, teach, hard_weight)
            weight_sum += w
            agree.append((logits.argmax(-1) == teach.argmax(-1)).float().mean().item())
        # next step: entry i reads the output of entry i - 1
        o = out.view(b, s - 1, -1)
        feats = torch.cat([torch.zeros_like(o[:, :1]), o[:, :-1]], dim=1).reshape(b * (s - 1), -1)
    loss = total / max(weight_sum, 1e-9)
    return loss, StepStats(loss.item(), agree)
