"""Lossless rejection sampling down a draft tree in one launch (and a memset): the walk, then recover or bonus.

Same contract as ``engine.rounds.tree.tree_rejection_sample`` (tests check the kernel against it, bit for bit). Row
b's tree has N nodes at positions 1 .. N (the root, t0, at 0); a position's children are the ``branching[d]``
positions from ``first_child`` of it. From the root, at each depth d < ``num_draft[b]``: the children of the position
reached, in order (placeholders skipped), child c accepted when ``u_c * left < p(c)``, ``left`` = 1 less the p of
the siblings rejected before it, subtracted one by one; the walk stops at the first depth where none is. Then one
token by the exponential race ``argmax(dist / noise)`` at the last position reached: ``dist`` is p there without the
tokens of the siblings rejected at the stop (*recovered*), or p itself past the depths the row may accept (*bonus*)
or where that residual vanished. Outputs: the committed tokens (accepted nodes', the drawn one, placeholders), the
count and the path (the root and the accepted nodes' positions, then the first path's).

Each program takes ``BLOCK`` columns of a row, walks the row's tree itself (a few scalar loads a sibling), races its
columns of the residual and of p, and stores its best (score, first index) of each and whether any residual entry
was positive; the row's last program (an acq_rel ticket, as in ``kernels.rejection_accept``) merges them and writes
the row. Divisions are IEEE round-to-nearest (``div_rn``), ties go to the lowest index; NaN is outside the contract.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import PLACEHOLDER_TOKEN_ID, check_int, check_launchable, check_tensor, pow2_at_least
from kernels.rejection_accept import race_partial, race_winners

BLOCK = 2048  # vocabulary columns per program


@triton.jit
def _tree_sample_kernel(
    nodes_ptr,      # [B, N] int64, row stride stride_t (columns contiguous)
    num_draft_ptr,  # [B] int64, stride stride_n
    p_ptr,          # [B, N+1, V] float32, strides stride_pb, stride_pk (columns contiguous)
    u_ptr,          # [B, N] float32, row stride stride_u (columns contiguous)
    noise_ptr,      # [B, V] float32, row stride stride_e (columns contiguous)
    child_ptr,      # [N+1] int64: each position's first child (a leaf's 0)
    branch_ptr,     # [D] int64: children a node, by depth
    first_ptr,      # [D+1] int64: the first path's positions (0 first)
    val_ptr,        # [B, NB, 3] float32 scratch: each program's best residual score, best p score, any residual > 0
    idx_ptr,        # [B, NB, 2] int64 scratch: their first indices
    ticket_ptr,     # [B] int32, zero before the launch
    committed_ptr,  # [B, D+1] int64
    accepted_ptr,   # [B] int64
    path_ptr,       # [B, D+1] int64
    N, V, chunks,
    stride_t, stride_n, stride_pb, stride_pk, stride_u, stride_e,
    D: tl.constexpr, BMAX: tl.constexpr, PLACEHOLDER: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    pos = tl.arange(0, BLOCK_N)
    tok = tl.load(nodes_ptr + row * stride_t + pos - 1, mask=(pos >= 1) & (pos <= N), other=PLACEHOLDER)
    kids = tl.load(child_ptr + pos, mask=pos <= N, other=0)
    nd = tl.load(num_draft_ptr + row * stride_n)
    dcol = tl.arange(0, BLOCK_D)
    bcol = tl.arange(0, BLOCK_B)
    path = tl.load(first_ptr + dcol, mask=dcol <= D, other=0)
    cur = nd * 0                        # the position reached (int64 0)
    alive = nd >= 0                     # (True)
    count = nd * 0
    tokens = tl.full((BLOCK_D,), PLACEHOLDER, tl.int64)
    removed = tl.full((BLOCK_B,), PLACEHOLDER, tl.int64)
    for d in tl.static_range(D):
        b = tl.load(branch_ptr + d)
        live = alive & (nd > d)
        first = tl.sum(tl.where(pos == cur, kids, 0), axis=0)
        left = 1.0
        hit = nd < 0                    # (False)
        pick = cur
        pick_tok = nd * 0
        tested = tl.full((BLOCK_B,), PLACEHOLDER, tl.int64)
        for s in tl.static_range(BMAX):
            at = first + s
            cand = tl.sum(tl.where(pos == at, tok, 0), axis=0)
            valid = live & (s < b) & (cand >= 0)
            pc = tl.load(p_ptr + row * stride_pb + cur * stride_pk + tl.maximum(cand, 0), mask=valid, other=0.0)
            u = tl.load(u_ptr + row * stride_u + at - 1, mask=valid, other=1.0)
            ok = valid & ~hit & (u * left < pc)
            pick = tl.where(ok, at, pick)
            pick_tok = tl.where(ok, cand, pick_tok)
            hit = hit | ok
            left = tl.where(hit, left, left - pc)
            tested = tl.where((bcol == s) & valid, cand, tested)
        removed = tl.where(live & ~hit, tested, removed)  # a row stopping here: its tested siblings leave p
        alive = live & hit
        cur = tl.where(alive, pick, cur)
        count += alive.to(tl.int64)
        tokens = tl.where((dcol == d) & alive, pick_tok, tokens)
        path = tl.where((dcol == d + 1) & alive, pick, path)
    # this program's columns at the position reached: the residual's race and p's race
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < V
    p = tl.load(p_ptr + row * stride_pb + cur * stride_pk + cols, mask=inside, other=0.0)
    e = tl.load(noise_ptr + row * stride_e + cols, mask=inside, other=1.0)
    gone = tl.max((cols[:, None] == removed[None, :]).to(tl.int32), axis=1) > 0
    r = tl.where(gone, 0.0, p)
    race_partial(val_ptr, idx_ptr, row * NB + chunk, p, r, e, cols, inside)
    if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == chunks - 1:  # the row's last program merges
        r_final, p_final, vanished = race_winners(val_ptr, idx_ptr, row, chunks, V, NB)
        final = tl.where(vanished, p_final, r_final)
        out = tl.where(dcol < count, tokens, tl.where(dcol == count, final, PLACEHOLDER))
        tl.store(committed_ptr + row * (D + 1) + dcol, out, mask=dcol <= D)
        tl.store(accepted_ptr + row, count)
        tl.store(path_ptr + row * (D + 1) + dcol, path, mask=dcol <= D)


def tree_sample_accept(
    nodes: torch.Tensor,         # [B, N] int64 (rows may be strided: a view of the round's inputs)
    num_draft: torch.Tensor,     # [B] int64, may be strided
    target_probs: torch.Tensor,  # [B, N+1, V] float32
    uniforms: torch.Tensor,      # [B, N] float32 in [0, 1)
    noise: torch.Tensor,         # [B, V] float32, Exponential(1)
    first_child: torch.Tensor,   # [N+1] int64
    branching: torch.Tensor,     # [D] int64
    first_path: torch.Tensor,    # [D+1] int64
    max_children: int,           # max(branching), known on the host (no read of the device in a graph's capture)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # committed [B, D+1], accepted [B], path [B, D+1]
    check_tensor("nodes", nodes, torch.int64, (None, None))
    b, n = nodes.shape
    dev = nodes.device
    check_tensor("num_draft", num_draft, torch.int64, (b,), dev)
    check_tensor("target_probs", target_probs, torch.float32, (b, n + 1, None), dev)
    v = target_probs.shape[2]
    if v < 1:
        raise ValueError(f"target_probs must have at least one vocabulary entry, got {list(target_probs.shape)}")
    check_tensor("uniforms", uniforms, torch.float32, (b, n), dev)
    check_tensor("noise", noise, torch.float32, (b, v), dev)
    check_tensor("first_child", first_child, torch.int64, (n + 1,), dev)
    check_tensor("branching", branching, torch.int64, (None,), dev)
    d = branching.shape[0]
    check_tensor("first_path", first_path, torch.int64, (d + 1,), dev)
    bmax = check_int("max_children", max_children, 1)
    check_launchable(_tree_sample_kernel, dev)
    committed = torch.empty((b, d + 1), dtype=torch.int64, device=dev)
    accepted = torch.empty((b,), dtype=torch.int64, device=dev)
    path = torch.empty((b, d + 1), dtype=torch.int64, device=dev)
    if not b:
        return committed, accepted, path
    nodes, uniforms = (x if x.stride(1) == 1 else x.contiguous() for x in (nodes, uniforms))
    target_probs = target_probs if target_probs.stride(2) == 1 else target_probs.contiguous()
    noise = noise if noise.stride(1) == 1 else noise.contiguous()
    chunks = triton.cdiv(v, BLOCK)
    nb = pow2_at_least(chunks)
    val = torch.empty((b, nb, 3), dtype=torch.float32, device=dev)
    idx = torch.empty((b, nb, 2), dtype=torch.int64, device=dev)
    ticket = torch.zeros((b,), dtype=torch.int32, device=dev)
    _tree_sample_kernel[(b, chunks)](
        nodes, num_draft, target_probs, uniforms, noise, first_child, branching, first_path, val, idx, ticket,
        committed, accepted, path, n, v, chunks, nodes.stride(0), num_draft.stride(0), target_probs.stride(0),
        target_probs.stride(1), uniforms.stride(0), noise.stride(0),
        D=d, BMAX=bmax, PLACEHOLDER=PLACEHOLDER_TOKEN_ID, BLOCK_N=pow2_at_least(n + 1), BLOCK_D=pow2_at_least(d + 1),
        BLOCK_B=pow2_at_least(bmax), BLOCK=BLOCK, NB=nb)
    return committed, accepted, path
