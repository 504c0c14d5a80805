"""Greedy verification in one launch: accept while the draft equals the target's argmax.

Same contract as ``engine.sampling.rejection.greedy_verify`` (tests check both against
``greedy_accept_reference``): row b accepts the longest prefix of its ``num_draft[b]``
drafts that match ``target_argmax``, then takes the target's token at index
``num_accepted[b]`` (the recovered token, or the bonus token when every draft matched).
One program per row; the row's K+1 positions fit in one block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import PLACEHOLDER_TOKEN_ID, accepted_prefix, check_launchable, check_tensor, pow2_at_least


def accepted_prefix_reference(accept: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    """accept [B, K] bool, num_draft [B] int64 -> length of the all-accepted prefix, capped at num_draft [B]."""
    valid = torch.arange(accept.shape[1], device=accept.device).unsqueeze(0) < num_draft.unsqueeze(1)
    return (accept & valid).long().cumprod(dim=1).sum(dim=1)


def greedy_accept_reference(
    draft_token_ids: torch.Tensor,  # [B, K] int64
    num_draft: torch.Tensor,        # [B] int64
    target_argmax: torch.Tensor,    # [B, K+1] int64
) -> tuple[torch.Tensor, torch.Tensor]:  # output ids [B, K+1], num_accepted [B]
    b, k = draft_token_ids.shape
    n = accepted_prefix_reference(draft_token_ids == target_argmax[:, :k], num_draft)
    cols = torch.arange(k + 1, device=n.device).unsqueeze(0)
    drafts = torch.cat([draft_token_ids, draft_token_ids.new_full((b, 1), PLACEHOLDER_TOKEN_ID)], dim=1)
    final = target_argmax.gather(1, n.unsqueeze(1))
    out = torch.where(cols < n.unsqueeze(1), drafts, torch.where(cols == n.unsqueeze(1), final, PLACEHOLDER_TOKEN_ID))
    return out, n


@triton.jit
def _greedy_accept_kernel(
    draft_ptr,         # [B, K] int64, row stride stride_d
    num_draft_ptr,     # [B] int64, stride stride_n
    target_ptr,        # [B, K+1] int64
    out_ptr,           # [B, K+1] int64
    num_accepted_ptr,  # [B] int64
    K, stride_d, stride_n,
    PLACEHOLDER: tl.constexpr,
    BLOCK: tl.constexpr,  # power of two >= K + 1
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    in_draft = cols < K
    in_out = cols < K + 1
    draft = tl.load(draft_ptr + row * stride_d + cols, mask=in_draft, other=PLACEHOLDER)
    target = tl.load(target_ptr + row * (K + 1) + cols, mask=in_out, other=PLACEHOLDER)
    num_draft = tl.load(num_draft_ptr + row * stride_n)
    ok = in_draft & (cols < num_draft) & (draft == target)
    n = accepted_prefix(ok, cols, BLOCK)
    # accepted drafts, the target's token at index n (recovered or bonus), then placeholders
    out = tl.where(cols < n, draft, tl.where(cols == n, target, PLACEHOLDER))
    tl.store(out_ptr + row * (K + 1) + cols, out, mask=in_out)
    tl.store(num_accepted_ptr + row, n)


def greedy_accept(
    draft_token_ids: torch.Tensor,  # [B, K] int64, padded with PLACEHOLDER_TOKEN_ID; rows may be strided
    num_draft: torch.Tensor,        # [B] int64, may be strided (e.g. a column of the round's inputs)
    target_argmax: torch.Tensor,    # [B, K+1] int64: the target's greedy token at each position
) -> tuple[torch.Tensor, torch.Tensor]:  # output ids [B, K+1] int64, num_accepted [B] int64
    check_tensor("draft_token_ids", draft_token_ids, torch.int64, (None, None))
    b, k = draft_token_ids.shape
    dev = draft_token_ids.device
    check_tensor("num_draft", num_draft, torch.int64, (b,), dev)
    check_tensor("target_argmax", target_argmax, torch.int64, (b, k + 1), dev)
    check_launchable(_greedy_accept_kernel, dev)
    out = torch.empty((b, k + 1), dtype=torch.int64, device=dev)
    num_accepted = torch.empty((b,), dtype=torch.int64, device=dev)
    if b:
        if k > 1 and draft_token_ids.stride(1) != 1:
            draft_token_ids = draft_token_ids.contiguous()
        _greedy_accept_kernel[(b,)](
            draft_token_ids, num_draft, target_argmax.contiguous(), out, num_accepted,
            k, draft_token_ids.stride(0), num_draft.stride(0), PLACEHOLDER=PLACEHOLDER_TOKEN_ID,
            BLOCK=pow2_at_least(k + 1))
    return out, num_accepted
