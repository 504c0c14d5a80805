"""engine/rounds/tree.py: a draft tree's shape, greedy acceptance down it, and its accepted path's KV moved."""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.rounds.tree import DraftTree, TreeTensors, move_kv, path_slots, tree_greedy_verify
from engine.sampling import greedy_verify
from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID as P


def test_a_trees_shape():
    t = DraftTree((2, 2, 1))
    assert t.nodes == 10 and t.depth == 3 and t.levels == ((1, 3), (3, 7), (7, 11))
    assert t.parents == (0, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6)
    assert t.depths == (0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
    assert t.first_path == (1, 3, 7) and t.first_children == (1, 3, 5, 7, 8, 9, 10, 0, 0, 0, 0)
    assert t.ancestor_bits[7] == 0b10001011  # node 7: itself, 3, 1 and the root
    assert t.place_chain([11, 12]) == [11, P, 12, P, P, P, P, P, P, P]
    chain = DraftTree((1, 1, 1, 1))
    assert chain.first_path == (1, 2, 3, 4) and chain.ancestor_bits == (1, 3, 7, 15, 31)
    assert DraftTree((3, 2, 1, 1)).nodes == 21
    for bad in ((2, 0), ("a",), ()):
        with pytest.raises(ValueError, match="spec_tree"):
            DraftTree(bad)
    with pytest.raises(ValueError, match="at most 62"):
        DraftTree((4, 4, 4))
    with pytest.raises(ValueError, match=r"spec_tree: must have k = 4 depths .*set k to 3 \(--k 3\)"):
        EngineConfig(k=4, spec_tree=(2, 2, 1), cuda_graphs=True)
    with pytest.raises(ValueError, match="spec_tree: needs fused rounds"):  # a CPU's default: no graphs, no tree
        EngineConfig(k=4, spec_tree=(2, 2, 1, 1))


def test_a_plain_case_of_a_tree_config_drops_the_tree():
    """A benchmark's plain case (k 0) built from a config with a tree: no tree, not "spec_tree: must have k = 0"."""
    cfg = EngineConfig(k=4, spec_tree=(2, 2, 1, 1), cuda_graphs=True, max_batch_size=4)
    plain, spec = cfg.for_draft("none", max_batch_size=16), cfg.for_draft("auto")
    assert (plain.k, plain.spec_tree, plain.max_batch_size) == (0, None, 16)
    assert (spec.k, spec.spec_tree, spec.max_batch_size) == (4, (2, 2, 1, 1), 4)


def _walk(tree: DraftTree, nodes: list[int], num_draft: int, argmax: list[int]) -> tuple[list[int], int, list[int]]:
    """Greedy acceptance by hand: from the root, the child whose token is the target's argmax at its parent."""
    cur, committed, path = 0, [], [0]
    for d in range(min(num_draft, tree.depth)):
        start, end = tree.levels[d]
        hit = [i for i in range(start, end) if tree.parents[i] == cur and nodes[i - 1] == argmax[cur]]
        if not hit:
            break
        cur = hit[0]
        committed.append(nodes[cur - 1])
        path.append(cur)
    a = len(committed)
    path += list(tree.first_path[a:])
    return committed + [argmax[cur]] + [P] * (tree.depth - a), a, path


@pytest.mark.parametrize("shape", [(2, 2, 1), (3, 2, 1, 1), (1, 1, 1, 1), (2, 1)])
def test_greedy_acceptance_walks_down_the_tree(shape):
    tree = DraftTree(shape)
    t = TreeTensors(tree, "cpu")
    rng = random.Random(sum(shape))
    rows = []
    for _ in range(1000):  # a vocabulary of 3: matches at every depth are common
        nodes = []
        for d, (start, end) in enumerate(tree.levels):  # siblings are distinct tokens (a drafter's top-b)
            for p in range(start, end, shape[d]):
                nodes += rng.sample(range(3), shape[d])
        nodes = [P if rng.random() < 0.05 else x for x in nodes]
        rows.append((nodes, rng.randint(0, tree.depth), [rng.randrange(3) for _ in range(tree.nodes + 1)]))
    nodes, num_draft, argmax = (torch.tensor([r[i] for r in rows]) for i in range(3))
    committed, accepted, path = tree_greedy_verify(nodes, num_draft, argmax, t)
    for i, row in enumerate(rows):
        want = _walk(tree, *row)
        assert (committed[i].tolist(), int(accepted[i]), path[i].tolist()) == want
    assert accepted.max() == tree.depth and accepted.min() == 0  # every depth reached somewhere


def test_a_chain_shaped_tree_accepts_as_greedy_verify():
    tree = DraftTree((1, 1, 1, 1))
    g = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, 3, (64, 4), generator=g)
    argmax = torch.randint(0, 3, (64, 5), generator=g)
    num_draft = torch.randint(0, 5, (64,), generator=g)
    committed, accepted, path = tree_greedy_verify(drafts, num_draft, argmax, TreeTensors(tree, "cpu"))
    want_committed, want_accepted = greedy_verify(drafts, num_draft, argmax)
    assert torch.equal(committed, want_committed) and torch.equal(accepted, want_accepted)
    assert torch.equal(path, torch.arange(5).expand(64, 5))


def test_the_accepted_paths_kv_moves_to_the_committed_positions():
    tree = DraftTree((2, 2, 1))
    n, bs, layers = tree.nodes, 4, 2
    k_cache = torch.randn(layers, 16, bs, 3, 8)
    v_cache = torch.randn(layers, 16, bs, 3, 8)
    table = torch.tensor([[5, 2, 9, 7, 0], [3, 11, 4, 0, 0], [0, 0, 0, 0, 0]])  # row 2: padding (scratch)
    lens = torch.tensor([6 + n + 1, 2 + n + 1, n + 1])                           # L = 6, 2; padding: N + 1
    path = torch.tensor([[0, 2, 6, 10], [0, 1, 3, 7], [0, 2, 5, 9]])             # row 1: the first path
    before_k, before_v = k_cache.clone(), v_cache.clone()

    def slot(row, pos):
        return int(table[row, pos // bs]) * bs + pos % bs

    move_kv(k_cache, v_cache, *path_slots(table, lens, path, n, bs))
    for row, length in ((0, 6), (1, 2)):
        for i in range(1, 4):
            s, d = slot(row, length + int(path[row, i])), slot(row, length + i)
            for cache, before in ((k_cache, before_k), (v_cache, before_v)):
                flat, old = cache.view(layers, -1, 3, 8), before.view(layers, -1, 3, 8)
                assert torch.equal(flat[:, d], old[:, s])
        for p in range(length + 1):  # the committed tokens' entries (and t0's) stay
            d = slot(row, p)
            assert torch.equal(k_cache.view(layers, -1, 3, 8)[:, d], before_k.view(layers, -1, 3, 8)[:, d])
    assert torch.equal(k_cache[:, 0], before_k[:, 0])  # the padding row moved nothing
