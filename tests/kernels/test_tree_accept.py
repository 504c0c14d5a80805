"""kernels/tree_accept.py against the torch steps it replaces (engine.rounds.tree: tree_greedy_verify, path_slots)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.rounds.tree import DraftTree, TreeTensors, path_slots, tree_greedy_verify
from kernels.tree_accept import tree_accept


@pytest.mark.parametrize("shape", [(2, 2, 1, 1), (3, 2, 1, 1), (1, 1, 1, 1), (4, 1), (2, 2, 2, 2, 2)])
def test_tree_accept_matches_the_torch_steps(shape):
    tree = DraftTree(shape)
    t = TreeTensors(tree, "cpu")
    n, bs, rows = tree.nodes, 4, 40
    rng = random.Random(sum(shape))
    nodes = []
    for _ in range(rows):  # siblings distinct, a vocabulary of 3: matches at every depth
        row = []
        for d, (start, end) in enumerate(tree.levels):
            for _ in range(start, end, shape[d]):
                row += rng.sample(range(max(3, shape[d])), shape[d])
        nodes.append([-1 if rng.random() < 0.05 else x for x in row])
    nodes = torch.tensor(nodes)
    argmax = torch.tensor([[rng.randrange(3) for _ in range(n + 1)] for _ in range(rows)])
    num_draft = torch.tensor([rng.randint(0, tree.depth) for _ in range(rows)])
    lengths = [rng.randint(0, 60) for _ in range(rows - 2)]
    lens = torch.tensor([length + n + 1 for length in lengths] + [n + 1, n + 1])  # two padding rows
    blocks = -(-(int(lens.max()) + 1) // bs)
    table = torch.stack([torch.randperm(200)[:blocks] for _ in range(rows)])
    inputs = torch.cat([torch.zeros(rows, 1, dtype=torch.long), nodes, num_draft[:, None]], dim=1)  # strided views
    got = tree_accept(inputs[:, 1:n + 1], inputs[:, n + 1], argmax, t.parents, t.depths, t.first_path, table, lens, bs)
    committed, accepted, path = tree_greedy_verify(nodes, num_draft, argmax, t)
    want = (committed, accepted, path, *path_slots(table, lens, path, n, bs))
    for name, a, b in zip(("committed", "accepted", "path", "src", "dst"), got, want):
        assert torch.equal(a, b), name
    assert accepted.max() >= 2


def test_bad_arguments_are_named():
    t = TreeTensors(DraftTree((2, 1)), "cpu")
    nodes, argmax = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long)
    table, lens = torch.zeros(2, 3, dtype=torch.long), torch.full((2,), 5)
    with pytest.raises(ValueError, match="target_argmax"):
        tree_accept(nodes, torch.zeros(2, dtype=torch.long), argmax[:, :4], t.parents, t.depths, t.first_path, table,
                    lens, 16)
    with pytest.raises(ValueError, match="num_draft"):
        tree_accept(nodes, torch.zeros(3, dtype=torch.long), argmax, t.parents, t.depths, t.first_path, table, lens, 16)
