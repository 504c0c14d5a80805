"""Greedy acceptance down a draft tree, and the KV slots its accepted path moves between, in one launch.

Same contract as ``engine.rounds.tree.tree_greedy_verify`` followed by ``engine.rounds.tree.path_slots`` (tests check
the kernel against them). Row b's tree has N nodes at positions 1 .. N (the root, t0, at 0); ``parents`` and
``depths`` give each position's parent and depth. From the root, at each depth d <= ``num_draft[b]`` the row accepts
the child of its last accepted position whose token equals the target's argmax there (siblings are distinct: at most
one does), and stops at the first depth with none. Outputs: the committed tokens (accepted nodes' tokens, the
target's token at the last accepted position, placeholders), the count, the path (the root and the accepted nodes'
positions, then the first path's) and, for i = 1 .. D, the cache slots of positions L + path[i] (source) and L + i
(destination), L = kv_lens[b] - N - 1; a padding row (kv_lens[b] = N + 1) gets source = destination.
One program per row; the row's N + 1 positions fit in one block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import PLACEHOLDER_TOKEN_ID, check_launchable, check_tensor, pow2_at_least


@triton.jit
def _tree_accept_kernel(
    nodes_ptr,        # [B, N] int64, row stride stride_t
    num_draft_ptr,    # [B] int64, stride stride_n
    argmax_ptr,       # [B, N+1] int64 contiguous
    parents_ptr,      # [N+1] int64
    depths_ptr,       # [N+1] int64
    first_ptr,        # [D+1] int64: the first path's positions (0 first)
    table_ptr,        # [B, M] int64 contiguous
    lens_ptr,         # [B] int64
    committed_ptr,    # [B, D+1] int64
    accepted_ptr,     # [B] int64
    path_ptr,         # [B, D+1] int64
    src_ptr,          # [B, D] int64
    dst_ptr,          # [B, D] int64
    N, M, stride_t, stride_n,
    D: tl.constexpr, BS: tl.constexpr, PLACEHOLDER: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, BLOCK)
    live_p = pos <= N
    tok = tl.load(nodes_ptr + row * stride_t + pos - 1, mask=(pos >= 1) & live_p, other=PLACEHOLDER)
    par = tl.load(parents_ptr + pos, mask=live_p, other=-1)
    dep = tl.load(depths_ptr + pos, mask=live_p, other=-1)
    arg = tl.load(argmax_ptr + row * (N + 1) + pos, mask=live_p, other=PLACEHOLDER)
    nd = tl.load(num_draft_ptr + row * stride_n)
    dcol = tl.arange(0, BLOCK_D)
    first = tl.load(first_ptr + dcol, mask=dcol <= D, other=0)
    cur = nd * 0                        # the position accepted so far (int64 0)
    alive = nd >= 0                     # (True)
    count = nd * 0
    tokens = tl.full((BLOCK_D,), PLACEHOLDER, tl.int64)
    path = first
    for d in tl.static_range(1, D + 1):
        want = tl.sum(tl.where(pos == cur, arg, 0), axis=0)          # the target's token after cur
        ok = (dep == d) & (par == cur) & (tok == want) & (nd >= d) & alive
        hit = tl.max(ok.to(tl.int32), axis=0) > 0
        nxt = tl.min(tl.where(ok, pos, BLOCK), axis=0).to(tl.int64)
        alive = alive & hit
        cur = tl.where(alive, nxt, cur)
        count += alive.to(tl.int64)
        tokens = tl.where((dcol == d - 1) & alive, want, tokens)
        path = tl.where((dcol == d) & alive, nxt, path)
    final = tl.sum(tl.where(pos == cur, arg, 0), axis=0)
    out = tl.where(dcol < count, tokens, tl.where(dcol == count, final, PLACEHOLDER))
    tl.store(committed_ptr + row * (D + 1) + dcol, out, mask=dcol <= D)
    tl.store(accepted_ptr + row, count)
    tl.store(path_ptr + row * (D + 1) + dcol, path, mask=dcol <= D)
    # the slots the accepted path's KV moves between: L + path[i] -> L + i, i = 1 .. D
    kv = tl.load(lens_ptr + row)
    base = kv - N - 1
    i = dcol + 1
    live_i = i <= D
    src_path = tl.sum(tl.where(dcol[None, :] == i[:, None], path[None, :], 0), axis=1)  # path[i], from registers
    src_pos = base + tl.where(kv > N + 1, src_path, i)
    dst_pos = base + i
    src_blk = tl.load(table_ptr + row * M + src_pos // BS, mask=live_i, other=0)
    dst_blk = tl.load(table_ptr + row * M + dst_pos // BS, mask=live_i, other=0)
    tl.store(src_ptr + row * D + dcol, src_blk * BS + src_pos % BS, mask=live_i)
    tl.store(dst_ptr + row * D + dcol, dst_blk * BS + dst_pos % BS, mask=live_i)


def tree_accept(
    nodes: torch.Tensor,          # [B, N] int64 (rows may be strided: a view of the round's inputs)
    num_draft: torch.Tensor,      # [B] int64, may be strided
    target_argmax: torch.Tensor,  # [B, N+1] int64
    parents: torch.Tensor,        # [N+1] int64
    depths: torch.Tensor,         # [N+1] int64
    first_path: torch.Tensor,     # [D+1] int64
    block_table: torch.Tensor,    # [B, M] int64
    kv_lens: torch.Tensor,        # [B] int64
    block_size: int,
) -> tuple[torch.Tensor, ...]:    # committed [B, D+1], accepted [B], path [B, D+1], src [B*D], dst [B*D]
    check_tensor("nodes", nodes, torch.int64, (None, None))
    b, n = nodes.shape
    dev = nodes.device
    check_tensor("num_draft", num_draft, torch.int64, (b,), dev)
    check_tensor("target_argmax", target_argmax, torch.int64, (b, n + 1), dev)
    check_tensor("parents", parents, torch.int64, (n + 1,), dev)
    check_tensor("depths", depths, torch.int64, (n + 1,), dev)
    check_tensor("first_path", first_path, torch.int64, (None,), dev)
    check_tensor("block_table", block_table, torch.int64, (b, None), dev)
    check_tensor("kv_lens", kv_lens, torch.int64, (b,), dev)
    check_launchable(_tree_accept_kernel, dev)
    d = first_path.shape[0] - 1
    committed = torch.empty((b, d + 1), dtype=torch.int64, device=dev)
    accepted = torch.empty((b,), dtype=torch.int64, device=dev)
    path = torch.empty((b, d + 1), dtype=torch.int64, device=dev)
    src = torch.empty((b * d,), dtype=torch.int64, device=dev)
    dst = torch.empty((b * d,), dtype=torch.int64, device=dev)
    if b:
        if nodes.stride(1) != 1:
            nodes = nodes.contiguous()
        _tree_accept_kernel[(b,)](
            nodes, num_draft, target_argmax.contiguous(), parents, depths, first_path, block_table.contiguous(),
            kv_lens, committed, accepted, path, src, dst, n, block_table.shape[1], nodes.stride(0),
            num_draft.stride(0), D=d, BS=block_size, PLACEHOLDER=PLACEHOLDER_TOKEN_ID, BLOCK=pow2_at_least(n + 1),
            BLOCK_D=pow2_at_least(d + 1))
    return committed, accepted, path, src, dst
