"""engine/rounds/tree.py ``tree_rejection_sample``: sampled rows verifying a tree of drafts.

Checked as the chain's rejection sampler is (tests/engine/test_rejection_sampler.py): tables (a chain-shaped tree is
``rejection_sample`` with one-hot drafts coin for coin; a one-hot target walks the tree as greedy acceptance), a
reference written node by node that it equals exactly, batch independence, and convergence: every committed token,
given the tokens committed before it, is distributed as the target's distribution after them, with a check that
fails plausible mistakes on the same coins.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.rounds.tree import DraftTree, TreeTensors, tree_greedy_verify, tree_rejection_sample
from engine.sampling import rejection_sample
from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID as P

V = 5  # a small vocabulary: siblings cover much of the target's mass, every path is reached often


def _nodes(tree: DraftTree, rows: int, rng: random.Random, holes: float = 0.05) -> torch.Tensor:
    """[rows, N] node tokens: siblings distinct (a drafter's top-b), a few placeholders."""
    out = []
    for _ in range(rows):
        nodes = []
        for d, (start, end) in enumerate(tree.levels):
            for _ in range(start, end, tree.branching[d]):
                nodes += rng.sample(range(V), tree.branching[d])
        out.append([P if rng.random() < holes else x for x in nodes])
    return torch.tensor(out)


class Target:
    """A seeded distribution over the next token for every prefix of up to ``depth`` tokens."""

    def __init__(self, depth: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        count = sum(V ** n for n in range(depth + 1))
        self.table = torch.softmax(torch.randn(count, V, generator=g) * 0.8, dim=-1)
        self.table[3, 4] = 0.0  # a token the target never picks after some prefix
        self.table = self.table / self.table.sum(-1, keepdim=True)

    def code(self, prefix: tuple[int, ...]) -> int:
        return sum(V ** n for n in range(len(prefix))) + sum(x * V ** i for i, x in enumerate(reversed(prefix)))

    def after(self, prefix: tuple[int, ...]) -> torch.Tensor:
        return self.table[self.code(prefix)]

    def top_tree(self, tree: DraftTree) -> list[int]:
        """[N] the tree a perfect drafter would draft: under each node the target's own likeliest tokens there."""
        nodes, prefixes = [], [()]
        for d, (start, end) in enumerate(tree.levels):
            for i in range(start, end, tree.branching[d]):
                parent = prefixes[tree.parents[i]]
                for x in self.after(parent).argsort(descending=True)[: tree.branching[d]].tolist():
                    nodes.append(x)
                    prefixes.append(parent + (x,))
        return nodes

    def probs(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """[R, N + 1, V]: the distribution after the root and after each node's path (a placeholder: as token 0)."""
        safe = nodes.clamp(min=0).tolist()
        codes = []
        for row in safe:
            prefixes = [()]
            for i in range(1, tree.nodes + 1):
                prefixes.append(prefixes[tree.parents[i]] + (row[i - 1],))
            codes.append([self.code(p) for p in prefixes])
        return self.table[torch.tensor(codes)]


def _coins(rows: int, tree: DraftTree, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(rows, tree.nodes, generator=g), torch.empty(rows, V).exponential_(generator=g)


def test_a_chain_shaped_tree_is_rejection_sampling_of_one_hot_drafts():
    tree = DraftTree((1, 1, 1))
    g = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, V, (4000, 3), generator=g)
    drafts[torch.rand(4000, 3, generator=g) < 0.05] = P
    num_draft = torch.randint(0, 4, (4000,), generator=g)
    probs = torch.softmax(torch.randn(4000, 4, V, generator=g), dim=-1)
    uniforms, noise = _coins(4000, tree, 1)
    committed, accepted, path = tree_rejection_sample(drafts, num_draft, probs, uniforms, noise,
                                                      TreeTensors(tree, "cpu"))
    # the engine's chain caps a one-hot row at its leading real drafts (round_graph.py ``verify``)
    real = torch.minimum(num_draft, (drafts >= 0).long().cumprod(dim=1).sum(dim=1))
    want_committed, want_accepted = rejection_sample(drafts, real, probs, None, uniforms, noise)
    assert torch.equal(committed, want_committed) and torch.equal(accepted, want_accepted)
    assert torch.equal(path, torch.arange(4).expand(4000, 4))
    assert set(accepted.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("shape", [(2, 2, 1), (3, 1), (1, 1, 1, 1), (4,)])
def test_a_one_hot_target_walks_the_tree_as_greedy_acceptance(shape):
    tree = DraftTree(shape)
    rng = random.Random(len(shape))
    nodes = _nodes(tree, 2000, rng)
    num_draft = torch.tensor([rng.randint(0, tree.depth) for _ in range(2000)])
    argmax = torch.tensor([[rng.randrange(V) for _ in range(tree.nodes + 1)] for _ in range(2000)])
    probs = torch.nn.functional.one_hot(argmax, V).float()
    t = TreeTensors(tree, "cpu")
    got = tree_rejection_sample(nodes, num_draft, probs, *_coins(2000, tree, 2), t)
    want = tree_greedy_verify(nodes, num_draft, argmax, t)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[1].max() == tree.depth


def _reference(nodes, num_draft, probs, uniforms, noise, tree: DraftTree, mutant: str | None = None):
    """The walk written node by node for one row at a time, with optional deliberate mistakes."""
    committed, accepted, paths = [], [], []
    for r in range(nodes.shape[0]):
        cur, out, path, removed = 0, [], [0], []
        for d in range(tree.depth):
            if d >= int(num_draft[r]):
                break
            p, left, hit = probs[r, cur], 1.0, None
            children = [i for i in range(*tree.levels[d]) if tree.parents[i] == cur and int(nodes[r, i - 1]) >= 0]
            for c in children:
                pc = float(p[int(nodes[r, c - 1])])
                if float(uniforms[r, c - 1]) * (1.0 if mutant == "accept_if_u_below_p" else left) < pc:
                    hit = c
                    break
                removed.append(int(nodes[r, c - 1]))
                left -= pc
            if hit is None:
                break
            removed = []
            cur = hit
            out.append(int(nodes[r, cur - 1]))
            path.append(cur)
        residual = probs[r, cur].clone()
        if mutant != "recover_from_p":
            residual[removed] = 0.0
        if residual.sum() <= 0:
            residual = probs[r, cur]
        a = len(out)
        committed.append(out + [int((residual / noise[r]).argmax())] + [P] * (tree.depth - a))
        accepted.append(a)
        paths.append(path + list(tree.first_path[a:]))
    return torch.tensor(committed), torch.tensor(accepted), torch.tensor(paths)


def test_the_walk_equals_a_node_by_node_reference():
    tree = DraftTree((2, 2, 1))
    rng = random.Random(7)
    nodes = _nodes(tree, 3000, rng)
    num_draft = torch.tensor([rng.randint(0, 3) for _ in range(3000)])
    probs = Target(3, 11).probs(tree, nodes)
    coins = _coins(3000, tree, 3)
    got = tree_rejection_sample(nodes, num_draft, probs, *coins, TreeTensors(tree, "cpu"))
    want = _reference(nodes, num_draft, probs, *coins, tree)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_rows_outcome_does_not_depend_on_the_batch():
    tree = DraftTree((3, 1))
    rng = random.Random(8)
    nodes = _nodes(tree, 512, rng)
    num_draft = torch.full((512,), 2)
    probs = Target(2, 12).probs(tree, nodes)
    uniforms, noise = _coins(512, tree, 4)
    t = TreeTensors(tree, "cpu")
    whole = tree_rejection_sample(nodes, num_draft, probs, uniforms, noise, t)
    pick = torch.randperm(512, generator=torch.Generator().manual_seed(0))[:100]
    part = tree_rejection_sample(nodes[pick], num_draft[pick], probs[pick], uniforms[pick], noise[pick], t)
    assert all(torch.equal(a[pick], b) for a, b in zip(whole, part))


def _tv(tokens: list[int], want: torch.Tensor) -> tuple[float, float]:
    """TV of the tokens' frequencies from ``want``, and the tolerance: 0.01, or 2.5x the TV sampling noise alone
    gives where len(tokens) cannot resolve 0.01 (E|p_hat - p| ~ sqrt(2 p (1 - p) / (pi n)) per token)."""
    want = want.double()
    got = torch.bincount(torch.tensor(tokens), minlength=V).double() / len(tokens)
    expected = 0.5 * torch.sqrt(2 * want * (1 - want) / (math.pi * len(tokens))).sum().item()
    return 0.5 * (got - want).abs().sum().item(), max(0.01, 2.5 * expected)


def _conditional_tvs(committed, accepted, target: Target, min_rows: int = 2000):
    """Per position j, (j, prefix, rows, TV, tolerance): for each prefix of j committed tokens that at least
    ``min_rows`` rows reached, their token at j against the target's distribution after it; and (prefix None) every
    row reaching j against the mean of those distributions over the rows (whether a row reaches j depends on its
    tokens before j only)."""
    out = []
    for j in range(committed.shape[1]):
        reach = accepted >= j
        groups: dict[tuple[int, ...], list[int]] = {}
        for prefix, token in zip(committed[reach, :j].tolist(), committed[reach, j].tolist()):
            groups.setdefault(tuple(prefix), []).append(token)
        for prefix, tokens in groups.items():
            if len(tokens) >= min_rows:
                out.append((j, prefix, len(tokens), *_tv(tokens, target.after(prefix))))
        tokens = committed[reach, j].tolist()
        mixture = sum(target.after(prefix) * len(t) for prefix, t in groups.items()) / len(tokens)
        out.append((j, None, len(tokens), *_tv(tokens, mixture)))
    return out


def _sample_batch(shape, rows: int, seed: int, sampler=None):
    """Rows over two trees of candidates: even rows the target's own likeliest tokens, odd rows random ones with a
    placeholder. A drafter's candidates depend on the context, so the output is checked given them (``_by_layout``)."""
    tree = DraftTree(shape)
    rng = random.Random(seed)
    target = Target(tree.depth, seed)
    layouts = torch.stack([torch.tensor(target.top_tree(tree)), _nodes(tree, 1, rng, holes=0.0)[0]])
    layouts[1, 0] = P
    nodes = layouts[torch.arange(rows) % 2]
    num_draft = torch.tensor([rng.choice([tree.depth, tree.depth, 1, 0]) for _ in range(rows)])
    probs = target.probs(tree, nodes)
    coins = _coins(rows, tree, seed + 1)
    if sampler is None:
        out = tree_rejection_sample(nodes, num_draft, probs, *coins, TreeTensors(tree, "cpu"))
    else:
        out = sampler(nodes, num_draft, probs, *coins, tree)
    return out, num_draft, target, nodes


def _by_layout(committed, accepted, target: Target):
    """``_conditional_tvs`` of each layout's rows (``_sample_batch``)."""
    return [x for layout in (0, 1) for x in _conditional_tvs(committed[layout::2], accepted[layout::2], target)]


@pytest.mark.parametrize("shape", [(2, 2, 1), (3, 1), (4, 1)])
def test_committed_tokens_follow_the_target(shape):
    (committed, accepted, _), num_draft, target, nodes = _sample_batch(shape, 60_000, sum(shape))
    assert (accepted <= num_draft).all()
    k1 = committed.shape[1]
    live = torch.arange(k1)[None, :] <= accepted[:, None]
    assert (committed[live] >= 0).all() and (committed[~live] == P).all()
    assert not ((committed[:, 0] == 2) & (committed[:, 1] == 4)).any()  # p(4 | 2) is 0 (``Target``)
    report = _by_layout(committed, accepted, target)
    assert [j for j, prefix, *_ in report if prefix is None] == list(range(len(shape) + 1)) * 2
    assert {0, 1} <= {j for j, prefix, *_ in report if prefix is not None}, report  # by prefix past the root too
    for j, prefix, n, tv, tol in report:
        assert tv < tol, f"position {j} after {prefix}: TV {tv:.4f} >= {tol:.4f} over {n} rows"
    first = (accepted >= 1).double().mean().item()
    assert first > 0.3
    # the tree pays: the rows of the target's own likeliest candidates accept at depth 1 with the p of all the root's
    # children (within 4 sigma), more than its first child's alone
    top = (torch.arange(len(nodes)) % 2 == 0) & (num_draft >= 1)
    p_root = target.after(())[nodes[0, : shape[0]]]
    got, want = (accepted[top] >= 1).double().mean().item(), p_root.sum().item()
    assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / int(top.sum())) and want > p_root[0].item() + 0.05


@pytest.mark.parametrize("mutant", ["recover_from_p", "accept_if_u_below_p"])
def test_the_check_catches_wrong_samplers(mutant):
    """The reference passes the convergence check; each mutant, on the same coins, fails it."""
    def run(m):
        return _sample_batch((3, 1), 20_000, 5, lambda *a: _reference(*a, mutant=m))

    (committed, accepted, _), _, target, _ = run(None)
    assert all(tv < tol for _, _, _, tv, tol in _by_layout(committed, accepted, target))
    (committed, accepted, _), _, target, _ = run(mutant)
    worst = max(tv - tol for _, _, _, tv, tol in _by_layout(committed, accepted, target))
    assert worst > 0, mutant
