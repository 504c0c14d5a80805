"""kernels/tree_sample_accept.py against the torch steps it replaces (engine.rounds.tree.tree_rejection_sample), bit
for bit, under the Triton interpreter."""

from __future__ import annotations

import random

import pytest
import torch

from engine.rounds.tree import DraftTree, TreeTensors, tree_rejection_sample
from kernels.tree_sample_accept import tree_sample_accept

V = 5000  # three programs a row (BLOCK 2048): the merge of partials is exercised


def case(shape, rows: int, seed: int, vocab: int = V):
    """Rows whose nodes are mostly among the target's likeliest tokens at their parent (so walks go deep), some
    random, a few placeholders; num_draft 0 .. D."""
    tree = DraftTree(shape)
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    logits = torch.randn(rows, tree.nodes + 1, vocab, generator=g)
    top = torch.stack([torch.randperm(vocab, generator=g)[:8] for _ in range(rows * (tree.nodes + 1))])
    top = top.view(rows, tree.nodes + 1, 8)                               # each position's likeliest, best first
    logits.scatter_(2, top, torch.linspace(12, 5, 8).expand(rows, tree.nodes + 1, 8))
    probs = torch.softmax(logits, dim=-1)
    nodes = []
    for r in range(rows):
        row = []
        for d, (start, end) in enumerate(tree.levels):
            for i in range(start, end, shape[d]):
                parent = tree.parents[i]
                best = top[r, parent, :shape[d]].tolist()
                row += best if rng.random() < 0.8 else rng.sample(range(vocab), shape[d])
        nodes.append([-1 if rng.random() < 0.05 else x for x in row])
    num_draft = torch.tensor([rng.randint(0, tree.depth) for _ in range(rows)])
    uniforms = torch.rand(rows, tree.nodes, generator=g)
    noise = torch.empty(rows, vocab).exponential_(generator=g)
    return tree, torch.tensor(nodes), num_draft, probs, uniforms, noise


@pytest.mark.parametrize("shape", [(2, 2, 1, 1), (3, 1), (1, 1, 1, 1), (4, 2), (2, 1, 1)])
def test_tree_sample_accept_matches_the_torch_steps(shape):
    tree, nodes, num_draft, probs, uniforms, noise = case(shape, 24, sum(shape))
    t = TreeTensors(tree, "cpu")
    n = tree.nodes
    inputs = torch.cat([torch.zeros(24, 1, dtype=torch.long), nodes, num_draft[:, None]], dim=1)  # strided views
    got = tree_sample_accept(inputs[:, 1:n + 1], inputs[:, n + 1], probs, uniforms, noise, t.first_child,
                             t.branching, t.first_path, max(shape))
    want = tree_rejection_sample(nodes, num_draft, probs, uniforms, noise, t)
    for name, a, b in zip(("committed", "accepted", "path"), got, want):
        assert torch.equal(a, b), name
    assert want[1].max() >= min(2, tree.depth)  # walks went deep, so the cases test something


def test_tree_sample_accept_names_a_bad_argument():
    tree, nodes, num_draft, probs, uniforms, noise = case((2, 1), 2, 0)
    t = TreeTensors(tree, "cpu")
    with pytest.raises(ValueError, match="uniforms"):
        tree_sample_accept(nodes, num_draft, probs, uniforms[:, :2], noise, t.first_child, t.branching, t.first_path,
                           2)
    with pytest.raises(ValueError, match="max_children"):
        tree_sample_accept(nodes, num_draft, probs, uniforms, noise, t.first_child, t.branching, t.first_path, 0)
