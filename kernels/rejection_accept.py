"""Lossless rejection sampling's two per-row steps, each in one launch.

``rejection_accept``: the accept/reject decision given the per-position probabilities of
each draft token: draft j of row b is accepted when ``uniforms * q_draft < p_draft``
(u < p/q without dividing), and a row accepts the all-accepted prefix of its ``num_draft``
drafts. Reference: ``rejection_accept_reference``, the same lines as
``engine.sampling.rejection.rejection_sample``.

``sample_final``: the recovered/bonus token of each row by the exponential race
``argmax(dist / noise)`` over the vocabulary of the row's chosen position (in
``rejection_sample`` the position is ``num_accepted``), looping over the vocabulary in
blocks. Reference: ``sample_final_reference`` (as ``engine.sampling.sampler.sample_from_probs``);
the division is IEEE round-to-nearest (``div_rn``), so the winner is the same as torch's,
ties going to the lowest index. Rows with a NaN score (0 / 0) are outside the contract.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import accepted_prefix, check_launchable, check_tensor, pow2_at_least
from kernels.greedy_accept import accepted_prefix_reference

MAX_BLOCK_V = 1024  # vocabulary entries one program scores per loop iteration


def rejection_accept_reference(
    p_draft: torch.Tensor,   # [B, K] float32
    q_draft: torch.Tensor,   # [B, K] float32
    uniforms: torch.Tensor,  # [B, K] float32
    num_draft: torch.Tensor,  # [B] int64
) -> torch.Tensor:           # num_accepted [B] int64
    return accepted_prefix_reference(uniforms * q_draft < p_draft, num_draft)


def sample_final_reference(
    dist: torch.Tensor,      # [B, N, V] float32
    position: torch.Tensor,  # [B] int64 in [0, N)
    noise: torch.Tensor,     # [B, V] float32
) -> torch.Tensor:           # [B] int64
    rows = torch.arange(dist.shape[0], device=dist.device)
    return (dist[rows, position] / noise).argmax(dim=-1)  # the exponential race of engine's sample_from_probs


@triton.jit
def _rejection_accept_kernel(
    p_ptr,             # [B, K] float32
    q_ptr,             # [B, K] float32
    u_ptr,             # [B, K] float32
    num_draft_ptr,     # [B] int64
    num_accepted_ptr,  # [B] int64
    K,
    BLOCK: tl.constexpr,  # power of two >= K + 1
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    in_draft = cols < K
    p = tl.load(p_ptr + row * K + cols, mask=in_draft, other=0.0)
    q = tl.load(q_ptr + row * K + cols, mask=in_draft, other=1.0)
    u = tl.load(u_ptr + row * K + cols, mask=in_draft, other=1.0)
    num_draft = tl.load(num_draft_ptr + row)
    ok = in_draft & (cols < num_draft) & (u * q < p)
    tl.store(num_accepted_ptr + row, accepted_prefix(ok, cols, BLOCK))


@triton.jit
def _sample_final_kernel(
    dist_ptr,      # [B, N, V] float32 (strided)
    position_ptr,  # [B] int64
    noise_ptr,     # [B, V] float32 (strided)
    out_ptr,       # [B] int64
    N,
    stride_db, stride_dn, stride_dv, stride_nb, stride_nv,
    V: tl.constexpr,  # the vocabulary: fixed per model, a compile-time loop bound
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.minimum(tl.maximum(tl.load(position_ptr + row), 0), N - 1)  # clamped: never read outside dist
    dist_row = dist_ptr + row * stride_db + pos * stride_dn
    noise_row = noise_ptr + row * stride_nb
    lanes = tl.arange(0, BLOCK_V)
    # per lane: the best score so far and its index; a later block wins only when strictly better
    best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_idx = tl.zeros((BLOCK_V,), tl.int64)
    for start in range(0, V, BLOCK_V):
        cols = start + lanes
        m = cols < V
        d = tl.load(dist_row + cols * stride_dv, mask=m, other=0.0)
        e = tl.load(noise_row + cols * stride_nv, mask=m, other=1.0)
        score = tl.where(m, tl.math.div_rn(d, e), float("-inf"))
        better = score > best
        best = tl.where(better, score, best)
        best_idx = tl.where(better, cols, best_idx)
    top = tl.max(best, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best == top, best_idx, V), axis=0))


def _check_draft_rows(p_draft, q_draft, uniforms, num_draft) -> tuple[int, int, torch.device]:
    check_tensor("p_draft", p_draft, torch.float32, (None, None))
    b, k = p_draft.shape
    dev = p_draft.device
    check_tensor("q_draft", q_draft, torch.float32, (b, k), dev)
    check_tensor("uniforms", uniforms, torch.float32, (b, k), dev)
    check_tensor("num_draft", num_draft, torch.int64, (b,), dev)
    return b, k, dev


def rejection_accept(
    p_draft: torch.Tensor,   # [B, K] float32: target probability of each draft token
    q_draft: torch.Tensor,   # [B, K] float32: draft probability of each draft token (1.0 if one-hot)
    uniforms: torch.Tensor,  # [B, K] float32 in [0, 1)
    num_draft: torch.Tensor,  # [B] int64
) -> torch.Tensor:           # num_accepted [B] int64
    b, k, dev = _check_draft_rows(p_draft, q_draft, uniforms, num_draft)
    check_launchable(_rejection_accept_kernel, dev)
    num_accepted = torch.empty((b,), dtype=torch.int64, device=dev)
    if b:
        _rejection_accept_kernel[(b,)](
            p_draft.contiguous(), q_draft.contiguous(), uniforms.contiguous(), num_draft.contiguous(),
            num_accepted, k, BLOCK=pow2_at_least(k + 1))
    return num_accepted


def sample_final(
    dist: torch.Tensor,      # [B, N, V] float32, need not be normalized (e.g. [B, K+1, V] residuals)
    position: torch.Tensor,  # [B] int64: the position to draw from in each row, in [0, N)
    noise: torch.Tensor,     # [B, V] float32, i.i.d. Exponential(1)
) -> torch.Tensor:           # [B] int64
    check_tensor("dist", dist, torch.float32, (None, None, None))
    b, n, v = dist.shape
    dev = dist.device
    if n < 1 or v < 1:
        raise ValueError(f"dist must have at least one position and one vocabulary entry, got {list(dist.shape)}")
    check_tensor("position", position, torch.int64, (b,), dev)
    check_tensor("noise", noise, torch.float32, (b, v), dev)
    check_launchable(_sample_final_kernel, dev)
    out = torch.empty((b,), dtype=torch.int64, device=dev)
    if b:
        _sample_final_kernel[(b,)](
            dist, position.contiguous(), noise, out, n, *dist.stride(), *noise.stride(),
            V=v, BLOCK_V=min(MAX_BLOCK_V, pow2_at_least(v)))
    return out
