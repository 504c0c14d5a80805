"""A tree of drafts: its shape, and the pure functions a fused round verifies it with (engine/rounds/round_graph.py).

A *draft tree* of branching ``(b_1, .., b_D)`` holds, under t0 (the root, position 0), ``b_1`` candidates for the
first draft, ``b_2`` under each of those for the second, and so on: N = b_1 + b_1 b_2 + .. nodes, depth D. Nodes are
numbered 1 .. N by depth, a node's children next to each other, siblings in the drafter's order (its best first);
so the *first path* (each node's first child, from the root) is the chain a drafter drafting one token a step makes.

A round verifies t0 and every node in one forward: node i sits at position L + depth(i), its KV at index L + i, and
attends to the committed tokens, the root and its own ancestors (``ancestor_bits``). Greedy acceptance walks down
from the root, at each depth to the child that equals the target's argmax at its parent (siblings are distinct
tokens: at most one does), for at most ``num_draft`` depths; the round commits the accepted nodes' tokens and the
target's token at the last of them (recovered, or bonus at depth D), as a chain's round does. Its *path* (the
positions of the root and the accepted nodes) says which KV entries and features the committed tokens own:
``move_kv`` moves the accepted nodes' K/V (``path_slots``) to the committed positions L + 1 .. L + a. On CUDA
``accept_tree`` is one launch (kernels/tree_accept.py).

A sampled row walks down the tree too (``tree_rejection_sample``): at each node it tests the node's children in the
drafter's order, each against what is left of the target's distribution there once the siblings before it were
rejected, and takes the first accepted; if none is, it draws the recovered token from that remainder. That is one
draw from the target's distribution, split into steps: a node is accepted exactly when the draw is its token, so the
output is the target's in distribution whatever the tree holds (the candidates need only not depend on the round's
coins). A chain (every b 1) is ``rejection_sample`` with one-hot drafts, coin for coin.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from engine.config import check_tree
from engine.models import ops
from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID
from engine.sampling.sampler import sample_from_probs


@dataclass(frozen=True)
class DraftTree:
    branching: tuple[int, ...]  # children under each node, by depth (1, 1, 1, 1: a chain of 4)

    def __post_init__(self) -> None:
        check_tree(self.branching, len(self.branching))

    @property
    def depth(self) -> int:
        return len(self.branching)

    @cached_property
    def levels(self) -> tuple[tuple[int, int], ...]:
        """Each depth's nodes as a range of positions [start, end) (the root is position 0)."""
        out, start, width = [], 1, 1
        for b in self.branching:
            width *= b
            out.append((start, start + width))
            start += width
        return tuple(out)

    @property
    def nodes(self) -> int:
        return self.levels[-1][1] - 1

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """[N + 1] each position's parent position (the root's: 0)."""
        out = [0]
        for d, (start, end) in enumerate(self.levels):
            above = self.levels[d - 1][0] if d else 0
            out += [above + (i - start) // self.branching[d] for i in range(start, end)]
        return tuple(out)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """[N + 1] each position's depth (the root's: 0)."""
        return (0,) + tuple(d + 1 for d, (s, e) in enumerate(self.levels) for _ in range(s, e))

    @cached_property
    def first_children(self) -> tuple[int, ...]:
        """[N + 1] each position's first child's position (a leaf's: 0); its children are the b positions from it."""
        out = [0] * (self.nodes + 1)
        for i in reversed(range(1, self.nodes + 1)):
            out[self.parents[i]] = i
        return tuple(out)

    @property
    def first_path(self) -> tuple[int, ...]:
        """[D] the first path's node positions, depth 1 .. D: each depth's first node (the first child of the first)."""
        return tuple(start for start, _ in self.levels)

    @cached_property
    def ancestor_bits(self) -> tuple[int, ...]:
        """[N + 1] the positions each position attends to among the round's own (itself, its ancestors, the root),
        as bits."""
        out = [1]
        for i in range(1, self.nodes + 1):
            out.append(out[self.parents[i]] | (1 << i))
        return tuple(out)

    def ancestor_mask(self, device: torch.device | str) -> torch.Tensor:
        """[N + 1] int64 ``ancestor_bits`` (what StaticAttention's ``tree`` takes)."""
        return torch.tensor(self.ancestor_bits, dtype=torch.long, device=device)

    def place_chain(self, drafts: list[int]) -> list[int]:
        """A chain's drafts (at most D) as the tree's N tokens: on the first path, placeholders elsewhere."""
        out = [PLACEHOLDER_TOKEN_ID] * self.nodes
        for pos, d in zip(self.first_path, drafts):
            out[pos - 1] = d
        return out


class TreeTensors:
    """A tree's shape as device tensors, for the round's graph."""

    def __init__(self, tree: DraftTree, device: torch.device | str) -> None:
        self.tree = tree
        self.parents = torch.tensor(tree.parents, dtype=torch.long, device=device)       # [N + 1]
        self.depths = torch.tensor(tree.depths, dtype=torch.long, device=device)         # [N + 1]
        self.ancestors = tree.ancestor_mask(device)                                      # [N + 1]
        self.first_path = torch.tensor((0,) + tree.first_path, dtype=torch.long, device=device)  # [D + 1]
        self.first_child = torch.tensor(tree.first_children, dtype=torch.long, device=device)  # [N + 1]
        self.branching = torch.tensor(tree.branching, dtype=torch.long, device=device)         # [D]


def tree_greedy_verify(
    nodes: torch.Tensor,          # [R, N] int64: each row's node tokens (placeholders never accepted)
    num_draft: torch.Tensor,      # [R] int64: the depths a row may accept, <= D
    target_argmax: torch.Tensor,  # [R, N + 1] int64: the target's token after the root (0) and each node
    t: TreeTensors,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # committed [R, D + 1], num_accepted [R], path [R, D + 1]
    """Greedy acceptance down the tree: committed (accepted nodes' tokens, then the target's token at the last:
    recovered or bonus; placeholders after), how many nodes it accepted, and the path: the positions of the root
    and the accepted nodes (past them, the first path's, whose entries nothing reads)."""
    tree = t.tree
    r = nodes.shape[0]
    cur = torch.zeros(r, dtype=torch.long, device=nodes.device)        # the position accepted so far, per row
    alive = torch.ones(r, dtype=torch.bool, device=nodes.device)
    path, tokens = [cur], []
    for d, (start, end) in enumerate(tree.levels):
        want = target_argmax.gather(1, cur[:, None])                    # [R, 1] the target's token after cur
        cand = nodes[:, start - 1:end - 1]                              # [R, W] this depth's nodes
        ok = (cand == want) & (t.parents[start:end][None, :] == cur[:, None]) & (alive & (d < num_draft))[:, None]
        hit = ok.any(dim=1)
        nxt = start + ok.long().argmax(dim=1)                           # the matching node's position
        alive = alive & hit
        cur = torch.where(alive, nxt, cur)
        path.append(torch.where(alive, nxt, t.first_path[d + 1].expand(r)))
        tokens.append(torch.where(alive, want[:, 0], PLACEHOLDER_TOKEN_ID))
    accepted = torch.stack(tokens, dim=1).ge(0).long().sum(dim=1)      # [R] nodes accepted (a prefix)
    final = target_argmax.gather(1, cur[:, None])                       # [R, 1] recovered or bonus
    committed = torch.cat([torch.stack(tokens, dim=1), torch.full_like(final, PLACEHOLDER_TOKEN_ID)], dim=1)
    committed.scatter_(1, accepted[:, None], final)
    return committed, accepted, torch.stack(path, dim=1)


def tree_rejection_sample(
    nodes: torch.Tensor,         # [R, N] int64: each row's node tokens (placeholders never accepted)
    num_draft: torch.Tensor,     # [R] int64: the depths a row may accept, <= D
    target_probs: torch.Tensor,  # [R, N + 1, V] float32: the target's distribution after the root (0) and each node
    uniforms: torch.Tensor,      # [R, N] float32 in [0, 1): node i's acceptance coin in column i - 1
    noise: torch.Tensor,         # [R, V] float32 Exponential(1): the recovered / bonus draw
    t: TreeTensors,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # committed [R, D + 1], num_accepted [R], path [R, D + 1]
    """Lossless sampling down the tree (the module's docstring): at the node reached, its children in order, child c
    is accepted when u_c * left < p(c), left = 1 less the p of the siblings rejected before it (subtracted one by
    one); where none is, the recovered token is drawn from p without the rejected siblings (their tokens zeroed), and
    past the last depth a row may accept, the bonus token from p itself. Returns what ``tree_greedy_verify``
    returns. On CUDA at inference one launch (``kernels.tree_sample_accept``, the same contract, bit for bit)."""
    if ops.use_kernels(target_probs):
        from kernels.tree_sample_accept import tree_sample_accept

        return tree_sample_accept(nodes, num_draft, target_probs, uniforms, noise, t.first_child, t.branching,
                                  t.first_path, max(t.tree.branching))
    tree = t.tree
    r, dev = nodes.shape[0], nodes.device
    rows = torch.arange(r, device=dev)
    cur = torch.zeros(r, dtype=torch.long, device=dev)                 # the position accepted so far, per row
    alive = torch.ones(r, dtype=torch.bool, device=dev)
    removed = torch.full((r, max(tree.branching)), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=dev)
    path, tokens = [cur], []
    for d, b in enumerate(tree.branching):
        live = alive & (d < num_draft)                                   # [R] rows testing this depth
        pos = t.first_child[cur][:, None] + torch.arange(b, device=dev)[None, :]  # [R, b] cur's children
        cand = nodes.gather(1, pos - 1)                                  # [R, b] their tokens
        valid = (cand >= 0) & live[:, None]
        pc = target_probs[rows, cur].gather(1, cand.clamp(min=0)) * valid  # [R, b] p(c) (0: not tested)
        u = uniforms.gather(1, pos - 1)
        left, hit = torch.ones(r, device=dev), torch.zeros(r, dtype=torch.bool, device=dev)
        pick = torch.zeros(r, dtype=torch.long, device=dev)
        for c in range(b):                                               # siblings in order
            ok = valid[:, c] & ~hit & (u[:, c] * left < pc[:, c])
            pick, hit = torch.where(ok, c, pick), hit | ok
            left = torch.where(hit, left, left - pc[:, c])
        removed[:, :b] = torch.where((live & ~hit)[:, None] & valid, cand, removed[:, :b])  # a row stopping here
        alive = live & hit
        nxt = pos.gather(1, pick[:, None])[:, 0]
        cur = torch.where(alive, nxt, cur)
        path.append(torch.where(alive, nxt, t.first_path[d + 1].expand(r)))
        tokens.append(torch.where(alive, cand.gather(1, pick[:, None])[:, 0], PLACEHOLDER_TOKEN_ID))
    accepted = torch.stack(tokens, dim=1).ge(0).long().sum(dim=1)      # [R] nodes accepted (a prefix)
    p = target_probs[rows, cur]                                        # [R, V] at the last accepted (or root)
    gone = torch.zeros_like(p).scatter_add_(1, removed.clamp(min=0), removed.ge(0).to(p.dtype))
    residual = torch.where(gone > 0, 0.0, p)
    residual = torch.where(residual.sum(dim=1, keepdim=True) <= 0, p, residual)  # p == the siblings up to rounding
    final = sample_from_probs(residual, noise)                         # [R] recovered or bonus
    committed = torch.cat([torch.stack(tokens, dim=1),
                           torch.full_like(final[:, None], PLACEHOLDER_TOKEN_ID)], dim=1)
    committed.scatter_(1, accepted[:, None], final[:, None])
    return committed, accepted, torch.stack(path, dim=1)


def path_slots(
    block_table: torch.Tensor,  # [R, M] int64
    kv_lens: torch.Tensor,      # [R] int64: L + N + 1 (a padding row: exactly N + 1)
    path: torch.Tensor,         # [R, D + 1] int64: the root's and the accepted nodes' positions (then any)
    nodes: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # src, dst [R * D] int64 cache slots
    """The slots each row's accepted nodes' K/V move between: index L + path[i] to the committed index L + i,
    i = 1 .. D (past the accepted ones the entries move too: nothing reads them; a padding row's stay put)."""
    bs = block_size
    base = kv_lens - nodes - 1                                              # [R] L
    live = (kv_lens > nodes + 1)[:, None]
    depth = torch.arange(1, path.shape[1], device=path.device)[None, :]      # [1, D]
    src_pos = base[:, None] + torch.where(live, path[:, 1:], depth)         # [R, D]
    dst_pos = base[:, None] + depth
    src = (block_table.gather(1, src_pos // bs) * bs + src_pos % bs).reshape(-1)
    dst = (block_table.gather(1, dst_pos // bs) * bs + dst_pos % bs).reshape(-1)
    return src, dst


def move_kv(k_cache: torch.Tensor,  # [layers, blocks, block_size, Hkv, D] written in place
            v_cache: torch.Tensor,  # the same
            src: torch.Tensor,      # [S] int64 slots
            dst: torch.Tensor,      # [S] int64 slots (distinct)
            ) -> None:
    """Every layer's K/V at slots ``src`` copied to ``dst`` (read first: the two may overlap)."""
    for cache in (k_cache, v_cache):
        flat = cache.view(cache.shape[0], -1, *cache.shape[3:])            # [layers, slots, Hkv, D]
        flat.index_copy_(1, dst, flat.index_select(1, src))


def accept_tree(
    nodes: torch.Tensor,          # [R, N] int64
    num_draft: torch.Tensor,      # [R] int64
    target_argmax: torch.Tensor,  # [R, N + 1] int64
    t: TreeTensors,
    block_table: torch.Tensor,    # [R, M] int64
    kv_lens: torch.Tensor,        # [R] int64: L + N + 1
    block_size: int,
) -> tuple[torch.Tensor, ...]:    # committed [R, D + 1], accepted [R], path [R, D + 1], src, dst [R * D]
    """``tree_greedy_verify`` and ``path_slots``: on CUDA at inference one launch (``kernels.tree_accept``, the same
    contract), else these torch steps (about fifty launches on a GPU)."""
    if ops.use_kernels(target_argmax):
        from kernels.tree_accept import tree_accept

        return tree_accept(nodes, num_draft, target_argmax, t.parents, t.depths, t.first_path, block_table, kv_lens,
                           block_size)
    committed, accepted, path = tree_greedy_verify(nodes, num_draft, target_argmax, t)
    return (committed, accepted, path, *path_slots(block_table, kv_lens, path, t.tree.nodes, block_size))
