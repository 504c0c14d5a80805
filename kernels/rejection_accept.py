"""Lossless rejection sampling of a round in one launch (and a memset): accept, then recover or bonus.

Same contract as ``engine.sampling.rejection.rejection_sample`` (tests check the kernel, the reference
below and the engine's torch steps against each other, bit for bit). Row b:

- *accepted*: draft j (j < ``num_draft[b]``) is accepted when ``u_j * q(d_j) < p_j(d_j)`` (u < p/q without
  dividing; q = 1 for one-hot drafts, ``draft_probs`` None); ``n`` = the all-accepted prefix;
- at position n it draws one token by the exponential race ``argmax(dist / noise)``: from the *residual*
  ``max(0, p_n - q_n)`` (one-hot drafts: p_n with the draft's token zeroed) when a draft was rejected there
  (*recovered*), or from p_n itself when every draft was accepted (n == num_draft, or n == K: *bonus*) or the
  residual vanished (p == q up to rounding);
- writes the accepted drafts, the drawn token at index n, then ``PLACEHOLDER_TOKEN_ID``, and n.

The torch steps build residuals and distributions for every position, [B, K+1, V] each, in about twenty
launches. Here each program takes ``BLOCK`` columns of a row, decides the row's acceptance itself (K gathers),
races the residual and p over its columns at the one position n, and stores its best (score, first index)
of each and whether any residual entry was positive; the row's last program (an acq_rel ticket per row, as in
``kernels.argmax_rows``) merges them and writes the row. Divisions are IEEE round-to-nearest (``div_rn``), ties
go to the lowest index, as torch's argmax; NaN is outside the contract. Reference: ``rejection_accept_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import PLACEHOLDER_TOKEN_ID, accepted_prefix, check_launchable, check_tensor, pow2_at_least
from kernels.greedy_accept import accepted_prefix_reference

BLOCK = 2048  # vocabulary columns per program


def rejection_accept_reference(
    draft_token_ids: torch.Tensor,      # [B, K] int64, PLACEHOLDER_TOKEN_ID past num_draft
    num_draft: torch.Tensor,            # [B] int64
    target_probs: torch.Tensor,         # [B, K+1, V] float32
    draft_probs: torch.Tensor | None,   # [B, K, V] float32; None: one-hot drafts
    uniforms: torch.Tensor,             # [B, K] float32 in [0, 1)
    noise: torch.Tensor,                # [B, V] float32, Exponential(1)
) -> tuple[torch.Tensor, torch.Tensor]:  # output ids [B, K+1] int64, num_accepted [B] int64
    b, k = draft_token_ids.shape
    ids = draft_token_ids.clamp(min=0)
    p_draft = target_probs[:, :k].gather(-1, ids[..., None])[..., 0]
    q_draft = torch.ones_like(p_draft) if draft_probs is None else draft_probs.gather(-1, ids[..., None])[..., 0]
    n = accepted_prefix_reference(uniforms * q_draft < p_draft, num_draft)
    rows = torch.arange(b, device=n.device)
    p = target_probs[rows, n]                                                   # [B, V] at position n
    at = n.clamp(max=max(k - 1, 0))
    if k == 0:
        residual = torch.zeros_like(p)
    elif draft_probs is None:
        residual = p.scatter(1, ids[rows, at][:, None], 0.0)
    else:
        residual = (p - draft_probs[rows, at]).clamp(min=0.0)
    use_p = (n >= num_draft) | (n >= k) | ~(residual > 0).any(-1)               # bonus, or a vanished residual
    final = (torch.where(use_p[:, None], p, residual) / noise).argmax(-1)
    cols = torch.arange(k + 1, device=n.device)[None, :]
    drafts = torch.cat([draft_token_ids, torch.full_like(n[:, None], PLACEHOLDER_TOKEN_ID)], dim=1)
    out = torch.where(cols < n[:, None], drafts, torch.where(cols == n[:, None], final[:, None], PLACEHOLDER_TOKEN_ID))
    return out, n


@triton.jit
def _best(score, cols):
    # one block of the exponential race: its best score and that score's first column
    top = tl.max(score, axis=0)
    return top, tl.min(tl.where(score == top, cols, 2147483647), axis=0).to(tl.int64)


@triton.jit
def race_partial(val_ptr, idx_ptr, part, p, r, e, cols, live):
    # one program's columns of a row: the exponential race over the residual r and over p (best score, first
    # column), and whether any residual entry is positive, stored as partial ``part``; then a barrier, so they are
    # stored before the program's ticket releases them
    r_best, r_idx = _best(tl.where(live, tl.math.div_rn(r, e), float("-inf")), cols)
    p_best, p_idx = _best(tl.where(live, tl.math.div_rn(p, e), float("-inf")), cols)
    any_r = tl.max(tl.where(live & (r > 0.0), 1.0, 0.0), axis=0)
    tl.store(val_ptr + part * 3, r_best)
    tl.store(val_ptr + part * 3 + 1, p_best)
    tl.store(val_ptr + part * 3 + 2, any_r)
    tl.store(idx_ptr + part * 2, r_idx)
    tl.store(idx_ptr + part * 2 + 1, p_idx)
    tl.debug_barrier()


@triton.jit
def race_winners(val_ptr, idx_ptr, row, chunks, V, NB: tl.constexpr):
    # the row's last program: its partials merged -> the residual's draw, p's draw, whether the residual vanished
    c = tl.arange(0, NB)
    mine = c < chunks
    base = row * NB + c
    r_vals = tl.load(val_ptr + base * 3, mask=mine, other=float("-inf"), cache_modifier=".cg")
    p_vals = tl.load(val_ptr + base * 3 + 1, mask=mine, other=float("-inf"), cache_modifier=".cg")
    any_vals = tl.load(val_ptr + base * 3 + 2, mask=mine, other=0.0, cache_modifier=".cg")
    r_idxs = tl.load(idx_ptr + base * 2, mask=mine, other=V, cache_modifier=".cg")
    p_idxs = tl.load(idx_ptr + base * 2 + 1, mask=mine, other=V, cache_modifier=".cg")
    r_final = tl.min(tl.where((r_vals == tl.max(r_vals, axis=0)) & mine, r_idxs, V), axis=0)
    p_final = tl.min(tl.where((p_vals == tl.max(p_vals, axis=0)) & mine, p_idxs, V), axis=0)
    return r_final, p_final, tl.max(any_vals, axis=0) == 0.0


@triton.jit
def _rejection_accept_kernel(
    draft_ptr,      # [B, K] int64, row stride stride_d
    num_draft_ptr,  # [B] int64, stride stride_n
    p_ptr,          # [B, K+1, V] float32, strides stride_pb, stride_pk (columns contiguous)
    q_ptr,          # [B, K, V] float32, strides stride_qb, stride_qk (columns contiguous; unused without HAS_Q)
    u_ptr,          # [B, K] float32, row stride stride_u
    noise_ptr,      # [B, V] float32, row stride stride_e (columns contiguous)
    val_ptr,        # [B, NB, 3] float32 scratch: each program's best residual score, best p score, any residual > 0
    idx_ptr,        # [B, NB, 2] int64 scratch: their first indices
    ticket_ptr,     # [B] int32, zero before the launch
    out_ptr,        # [B, K+1] int64
    num_accepted_ptr,  # [B] int64
    K, V, chunks,
    stride_d, stride_n, stride_pb, stride_pk, stride_qb, stride_qk, stride_u, stride_e,
    HAS_Q: tl.constexpr,
    PLACEHOLDER: tl.constexpr,
    BLOCK_K: tl.constexpr,  # power of two >= K + 1
    BLOCK: tl.constexpr,
    NB: tl.constexpr,       # power of two >= chunks
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    # acceptance (every program of the row decides it the same way): u * q(d_j) < p_j(d_j) on the prefix
    j = tl.arange(0, BLOCK_K)
    in_draft = j < K
    draft = tl.load(draft_ptr + row * stride_d + j, mask=in_draft, other=PLACEHOLDER)
    ids = tl.maximum(draft, 0)
    num_draft = tl.load(num_draft_ptr + row * stride_n)
    p_d = tl.load(p_ptr + row * stride_pb + j * stride_pk + ids, mask=in_draft, other=0.0)
    if HAS_Q:
        q_d = tl.load(q_ptr + row * stride_qb + j * stride_qk + ids, mask=in_draft, other=1.0)
    else:
        q_d = tl.full((BLOCK_K,), 1.0, tl.float32)
    u = tl.load(u_ptr + row * stride_u + j, mask=in_draft, other=1.0)
    n = accepted_prefix(in_draft & (j < num_draft) & (u * q_d < p_d), j, BLOCK_K)
    bonus = (n >= num_draft) | (n >= K)
    # this program's columns at position n: the residual's race and p's race
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    live = cols < V
    p = tl.load(p_ptr + row * stride_pb + n * stride_pk + cols, mask=live, other=0.0)
    e = tl.load(noise_ptr + row * stride_e + cols, mask=live, other=1.0)
    if HAS_Q:
        q = tl.load(q_ptr + row * stride_qb + n * stride_qk + cols, mask=live & ~bonus, other=0.0)
        r = tl.maximum(p - q, 0.0)
    else:
        d_n = tl.sum(tl.where(j == n, ids, 0), axis=0)  # the draft's token at position n (one-hot q)
        r = tl.where(cols == d_n, 0.0, p)
    race_partial(val_ptr, idx_ptr, row * NB + chunk, p, r, e, cols, live)
    if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == chunks - 1:  # the row's last program merges
        r_final, p_final, vanished = race_winners(val_ptr, idx_ptr, row, chunks, V, NB)
        final = tl.where(bonus | vanished, p_final, r_final)
        in_out = j < K + 1
        out = tl.where(j < n, draft, tl.where(j == n, final, PLACEHOLDER))
        tl.store(out_ptr + row * (K + 1) + j, out, mask=in_out)
        tl.store(num_accepted_ptr + row, n)


def rejection_accept(
    draft_token_ids: torch.Tensor,      # [B, K] int64, padded with PLACEHOLDER_TOKEN_ID; rows may be strided
    num_draft: torch.Tensor,            # [B] int64, may be strided (a column of the round's inputs)
    target_probs: torch.Tensor,         # [B, K+1, V] float32 (columns contiguous)
    draft_probs: torch.Tensor | None,   # [B, K, V] float32 (columns contiguous); None: one-hot drafts
    uniforms: torch.Tensor,             # [B, K] float32 in [0, 1)
    noise: torch.Tensor,                # [B, V] float32, Exponential(1) (columns contiguous)
) -> tuple[torch.Tensor, torch.Tensor]:  # output ids [B, K+1] int64, num_accepted [B] int64
    check_tensor("draft_token_ids", draft_token_ids, torch.int64, (None, None))
    b, k = draft_token_ids.shape
    dev = draft_token_ids.device
    check_tensor("num_draft", num_draft, torch.int64, (b,), dev)
    check_tensor("target_probs", target_probs, torch.float32, (b, k + 1, None), dev)
    v = target_probs.shape[2]
    if v < 1:
        raise ValueError(f"target_probs must have at least one vocabulary entry, got {list(target_probs.shape)}")
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, torch.float32, (b, k, v), dev)
    check_tensor("uniforms", uniforms, torch.float32, (b, k), dev)
    check_tensor("noise", noise, torch.float32, (b, v), dev)
    check_launchable(_rejection_accept_kernel, dev)
    out = torch.empty((b, k + 1), dtype=torch.int64, device=dev)
    num_accepted = torch.empty((b,), dtype=torch.int64, device=dev)
    if not b:
        return out, num_accepted
    if k > 1 and draft_token_ids.stride(1) != 1:
        draft_token_ids = draft_token_ids.contiguous()
    if k > 1 and uniforms.stride(1) != 1:
        uniforms = uniforms.contiguous()
    if v > 1 and target_probs.stride(2) != 1:
        target_probs = target_probs.contiguous()
    if draft_probs is not None and v > 1 and draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()
    if v > 1 and noise.stride(1) != 1:
        noise = noise.contiguous()
    q = target_probs if draft_probs is None else draft_probs
    chunks = triton.cdiv(v, BLOCK)
    nb = pow2_at_least(chunks)
    val = torch.empty((b, nb, 3), dtype=torch.float32, device=dev)
    idx = torch.empty((b, nb, 2), dtype=torch.int64, device=dev)
    ticket = torch.zeros((b,), dtype=torch.int32, device=dev)
    _rejection_accept_kernel[(b, chunks)](
        draft_token_ids, num_draft, target_probs, q, uniforms, noise, val, idx, ticket, out, num_accepted,
        k, v, chunks, draft_token_ids.stride(0), num_draft.stride(0), target_probs.stride(0), target_probs.stride(1),
        q.stride(0), q.stride(1), uniforms.stride(0), noise.stride(0),
        HAS_Q=draft_probs is not None, PLACEHOLDER=PLACEHOLDER_TOKEN_ID, BLOCK_K=pow2_at_least(k + 1), BLOCK=BLOCK,
        NB=nb)
    return out, num_accepted
