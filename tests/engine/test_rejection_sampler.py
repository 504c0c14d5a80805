"""Greedy verification and lossless rejection sampling (in the style of vLLM's rejection sampler tests).

The statistical tests use context-independent target distributions p_j that differ per position
j, and drafts drawn independently per position. Then whether a row reaches output position j
(all of drafts 0..j-1 accepted) depends only on positions < j, so, conditioned on reaching it,
the token committed at position j -- an accepted draft, the recovered token or the bonus token --
must be distributed exactly as p_j. That is the lossless property, checked at every position.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.sampling import PLACEHOLDER_TOKEN_ID, greedy_verify, rejection_sample

P = PLACEHOLDER_TOKEN_ID
V = 10
B = 100_000
U_MAX = 1.0 - 2.0 ** -24  # the largest float32 below 1


def T(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


# ------------------------------------------------------------------------------------ greedy

GREEDY_CASES = {
    # name: (drafts, num_draft, target_argmax, expected output, expected num_accepted)
    "all_accepted_bonus": ([[5, 6, 7]], [3], [[5, 6, 7, 8]], [[5, 6, 7, 8]], [3]),
    "first_rejected": ([[5, 6, 7]], [3], [[1, 6, 7, 8]], [[1, P, P, P]], [0]),
    # position 2 matches again after the rejection at 1: only the prefix counts
    "middle_rejected": ([[5, 6, 7]], [3], [[5, 2, 7, 8]], [[5, 2, P, P]], [1]),
    "last_rejected": ([[5, 6, 7]], [3], [[5, 6, 3, 8]], [[5, 6, 3, P]], [2]),
    "num_draft_0": ([[P, P]], [0], [[4, 9, 9]], [[4, P, P]], [0]),
    "mixed_num_draft_placeholders": (
        [[3, 4, 5], [3, 4, P], [3, P, P], [P, P, P]],
        [3, 2, 1, 0],
        [[3, 4, 5, 6], [3, 4, 7, 8], [3, 9, 9, 9], [2, 2, 2, 2]],
        [[3, 4, 5, 6], [3, 4, 7, P], [3, 9, P, P], [2, P, P, P]],
        [3, 2, 1, 0],
    ),
    # stale ids past num_draft that happen to equal the target's choice are not drafts
    "num_draft_caps_matching_stale_ids": ([[3, 4, 5]], [1], [[3, 4, 5, 6]], [[3, 4, P, P]], [1]),
    "k1_accepted": ([[2]], [1], [[2, 3]], [[2, 3]], [1]),
    "k1_rejected": ([[2]], [1], [[1, 3]], [[1, P]], [0]),
    "k1_num_draft_0": ([[P]], [0], [[7, 3]], [[7, P]], [0]),
    "batch": (
        [[1, 2, 3, 4], [1, 2, 3, 4], [9, 9, 9, 9], [0, 0, P, P], [5, P, P, P], [0, 1, 2, 3]],
        [4, 4, 4, 2, 1, 4],
        [[1, 2, 3, 4, 0], [1, 2, 0, 4, 0], [8, 9, 9, 9, 9], [0, 0, 6, 6, 6], [4, 4, 4, 4, 4],
         [0, 1, 2, 9, 9]],
        [[1, 2, 3, 4, 0], [1, 2, 0, P, P], [8, P, P, P, P], [0, 0, 6, P, P], [4, P, P, P, P],
         [0, 1, 2, 9, P]],
        [4, 2, 0, 2, 0, 3],
    ),
}


@pytest.mark.parametrize("case", list(GREEDY_CASES), ids=list(GREEDY_CASES))
def test_greedy_table(case):
    drafts, num_draft, argmax, expected, expected_acc = GREEDY_CASES[case]
    out, acc = greedy_verify(T(drafts), T(num_draft), T(argmax))
    assert out.dtype == torch.long and acc.dtype == torch.long
    assert out.tolist() == expected
    assert acc.tolist() == expected_acc


def _one_hot(idx: torch.Tensor, vocab: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(idx, vocab).float()


def _random_greedy_batch(seed: int, b: int = 512, k: int = 4):
    g = torch.Generator().manual_seed(seed)
    argmax = torch.randint(0, V, (b, k + 1), generator=g)
    # each draft matches the target with probability 1/2, so acceptance lengths vary
    match = torch.rand(b, k, generator=g) < 0.5
    drafts = torch.where(match, argmax[:, :k], torch.randint(0, V, (b, k), generator=g))
    num_draft = torch.randint(0, k + 1, (b,), generator=g)
    drafts[torch.arange(k).unsqueeze(0) >= num_draft.unsqueeze(1)] = P
    return g, drafts, num_draft, argmax


@pytest.mark.parametrize("drafter", ["probabilistic", "deterministic"])
def test_one_hot_target_reduces_to_greedy(drafter):
    """With a one-hot target the sampled path must commit exactly what greedy would, for any coins."""
    g, drafts, num_draft, argmax = _random_greedy_batch(0)
    b, k = drafts.shape
    target = _one_hot(argmax)
    q = None
    if drafter == "probabilistic":
        q = torch.softmax(torch.randn(b, k, V, generator=g) * 3, -1)
        q[:64] = _one_hot(argmax[:64, :k])                   # a drafter sure of the target's token
        q[64:128] = _one_hot((argmax[64:128, :k] + 1) % V)   # a drafter sure of another token
    expected_out, expected_acc = greedy_verify(drafts, num_draft, argmax)
    assert 0 < expected_acc.float().mean() < k  # the batch is not degenerate
    coin_sets = [
        (torch.rand(b, k, generator=g), torch.empty(b, V).exponential_(generator=g)),
        (torch.zeros(b, k), torch.full((b, V), 1e-30)),
        (torch.full((b, k), U_MAX), torch.full((b, V), 1e30)),
    ]
    for uniforms, noise in coin_sets:
        out, acc = rejection_sample(drafts, num_draft, target, q, uniforms, noise)
        assert torch.equal(out, expected_out)
        assert torch.equal(acc, expected_acc)


# ------------------------------------------------------------------------------- determinism


def _close_case(b: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, V, generator=g) * 1.5, -1)
    q = 0.7 * p[:k] + 0.3 * torch.softmax(torch.randn(k, V, generator=g), -1)
    drafts = torch.stack([torch.multinomial(q[j], b, replacement=True, generator=g) for j in range(k)], 1)
    return drafts, torch.full((b,), k), p.expand(b, k + 1, V), q.expand(b, k, V)


def _coins(b: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, k, generator=g), torch.empty(b, V).exponential_(generator=g)


def test_seeded_determinism():
    drafts, num_draft, p, q = _close_case(2000, 3, seed=0)
    out1, acc1 = rejection_sample(drafts, num_draft, p, q, *_coins(2000, 3, seed=11))
    out2, acc2 = rejection_sample(drafts, num_draft, p, q, *_coins(2000, 3, seed=11))
    assert torch.equal(out1, out2) and torch.equal(acc1, acc2)
    out3, acc3 = rejection_sample(drafts, num_draft, p, q, *_coins(2000, 3, seed=12))
    # 2000 rows, each with a fresh accept/reject and recovered/bonus draw: identical is impossible
    assert not torch.equal(out1, out3)
    assert (out1 != out3).any(dim=1).float().mean() > 0.2
    assert not torch.equal(acc1, acc3)


def test_rows_are_independent_of_the_batch():
    drafts, num_draft, p, q = _close_case(64, 3, seed=1)
    num_draft = num_draft.clone()
    num_draft[::3] = 1
    drafts = drafts.clone()
    drafts[::3, 1:] = P
    uniforms, noise = _coins(64, 3, seed=2)
    out, acc = rejection_sample(drafts, num_draft, p, q, uniforms, noise)
    for i in range(0, 64, 7):
        s = slice(i, i + 1)
        o, a = rejection_sample(drafts[s], num_draft[s], p[s], q[s], uniforms[s], noise[s])
        assert torch.equal(o, out[s]) and torch.equal(a, acc[s])


# ------------------------------------------------------------------------ distribution checks


def _target(k: int, seed: int = 100) -> torch.Tensor:
    """Position-dependent targets p_j [k+1, V]: different shapes per position, some zeros."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, V, generator=g) * 1.5, -1)
    for j in range(k + 1):
        p[j, torch.randperm(V, generator=g)[: j % 3]] = 0.0  # filtered tokens (top-k-like)
    return p / p.sum(-1, keepdim=True)


def _drafter(kind: str, p: torch.Tensor, k: int, seed: int = 200):
    """(q [k, V] or None, the distribution r [k, V] the draft tokens are drawn from)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "close":
        q = 0.85 * p[:k] + 0.15 * torch.softmax(torch.randn(k, V, generator=g), -1)
    elif kind == "far":
        # nearly disjoint: 97% of q on the tokens where p_j is smallest
        q = torch.zeros(k, V)
        for j in range(k):
            low = p[j].argsort()[: V // 2]
            q[j, low] = torch.rand(V // 2, generator=g) + 0.5
            q[j] /= q[j].sum()
        q = 0.97 * q + 0.03 * p[:k]
    elif kind == "close_then_far":
        # far only at the last draft position, so that many rows reach it: the rejection and
        # the recovered draw are checked at full power deep in the row
        q = _drafter("close", p, k, seed)[0]
        q[k - 1] = _drafter("far", p, k, seed)[0][k - 1]
    elif kind == "uniform":
        q = torch.full((k, V), 1.0 / V)
    elif kind == "deterministic":
        # e.g. n-gram lookup: no q, the draft token is whatever the drafter proposes, often the
        # target's likely token, sometimes one the target has filtered out
        r = 0.5 * p[:k] + 0.5 * torch.softmax(torch.randn(k, V, generator=g) * 2, -1)
        return None, r
    else:
        raise ValueError(kind)
    return q, q


def _draw_drafts(r: torch.Tensor, b: int, g: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.multinomial(r[j], b, replacement=True, generator=g)
                        for j in range(r.shape[0])], 1)


def _run(p, q, r, k, seed, num_draft=None, b=B, sampler=None):
    """Build a batch of b rows that share p_j / q_j, draw drafts from r and the coins, sample."""
    g = torch.Generator().manual_seed(seed)
    drafts = _draw_drafts(r, b, g)
    if num_draft is None:
        num_draft = torch.full((b,), k)
    drafts[torch.arange(k).unsqueeze(0) >= num_draft.unsqueeze(1)] = P
    uniforms = torch.rand(b, k, generator=g)
    noise = torch.empty(b, V).exponential_(generator=g)
    args = (drafts, num_draft, p.expand(b, k + 1, V), None if q is None else q.expand(b, k, V),
            uniforms, noise)
    out, acc = (sampler or rejection_sample)(*args)
    return out, acc, args


def _tv(tokens: torch.Tensor, dist: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=V).double()
    return 0.5 * (counts / counts.sum() - dist.double()).abs().sum().item()


def _tolerance(dist: torch.Tensor, n: int) -> float:
    """0.01, or 2.5x the TV expected from sampling noise alone where n rows cannot resolve 0.01
    (E|p_hat - p| ~ sqrt(2 p (1 - p) / (pi n)) per token)."""
    d = dist.double()
    expected = 0.5 * torch.sqrt(2 * d * (1 - d) / (math.pi * n)).sum().item()
    return max(0.01, 2.5 * expected)


MIN_ROWS = 1000  # positions reached by fewer rows are not checked (reported in the message)


def _position_report(out, acc, p):
    """Per output position j: (rows reaching j, TV of their token at j from p_j, tolerance)."""
    report = []
    for j in range(p.shape[0]):
        reach = acc >= j
        n = int(reach.sum())
        if n < MIN_ROWS:
            report.append((j, n, None, None))
            continue
        tokens = out[reach, j]
        assert (tokens >= 0).all() and (tokens < V).all()
        report.append((j, n, _tv(tokens, p[j]), _tolerance(p[j], n)))
    return report


def _assert_lossless(out, acc, p, num_draft):
    # structure: num_accepted + 1 committed tokens, then placeholders
    b, k1 = out.shape
    assert ((acc >= 0) & (acc <= num_draft)).all()
    committed = torch.arange(k1).unsqueeze(0) <= acc.unsqueeze(1)
    assert (out[committed] >= 0).all() and (out[~committed] == P).all()
    # a token the target gives probability 0 is never committed
    pos = torch.arange(k1).expand(b, k1)
    assert (p[pos[committed], out[committed]] > 0).all()
    report = _position_report(out, acc, p)
    assert report[0][1] == b and report[0][3] == 0.01  # every row commits at position 0, at full power
    for j, n, tv, tol in report:
        if tv is not None:
            assert tv < tol, f"position {j}: TV {tv:.4f} >= {tol:.4f} over {n} rows; {report}"
    return report


def _acceptance(p_j, q_j, r_j):
    # P(accept at j) = sum_x min(p, q) when drafts ~ q; sum_x r(x) p(x) for deterministic drafts
    return (torch.minimum(p_j, q_j).sum() if q_j is not None else (r_j * p_j).sum()).item()


@pytest.mark.parametrize("kind, k", [(kind, k) for k in (1, 3) for kind in
                                     ("close", "far", "uniform", "deterministic")] + [("close_then_far", 3)])
def test_converges_to_target(kind, k):
    p = _target(k)
    q, r = _drafter(kind, p, k)
    out, acc, _ = _run(p, q, r, k, seed=1000 + k)
    _assert_lossless(out, acc, p, torch.full((B,), k))
    # acceptance: P(num_accepted >= j) = prod_{i<j} alpha_i, independently per position
    alphas = [_acceptance(p[j], None if q is None else q[j], r[j]) for j in range(k)]
    reach = 1.0
    for j in range(1, k + 1):
        reach *= alphas[j - 1]
        got = (acc >= j).double().mean().item()
        sd = math.sqrt(reach * (1 - reach) / B)
        assert abs(got - reach) < 4 * sd + 1e-4, f"P(accepted >= {j}) = {got:.4f}, expected {reach:.4f}"
    if k == 1:
        assert abs(acc.double().mean().item() - alphas[0]) < 0.006
    # the cases are what they claim: far drafts are mostly rejected, close ones mostly accepted
    assert {"close": alphas[0] > 0.8, "far": alphas[0] < 0.25, "close_then_far": alphas[-1] < 0.25,
            "uniform": 0.3 < alphas[0] < 0.8, "deterministic": 0.1 < alphas[0] < 0.5}[kind], alphas


def test_converges_with_mixed_num_draft():
    """num_draft 0..3 in one batch: the bonus token comes from p at position num_draft."""
    k = 3
    p = _target(k)
    q, r = _drafter("close", p, k)
    num_draft = torch.randint(0, k + 1, (B,), generator=torch.Generator().manual_seed(5))
    out, acc, _ = _run(p, q, r, k, seed=7, num_draft=num_draft)
    _assert_lossless(out, acc, p, num_draft)
    # plain decoding rows: one token from p_0, nothing accepted
    plain = num_draft == 0
    assert (acc[plain] == 0).all() and (out[plain, 1:] == P).all()
    assert _tv(out[plain, 0], p[0]) < _tolerance(p[0], int(plain.sum()))
    # bonus tokens, for each num_draft, are distributed as p_{num_draft}
    for nd in range(1, k + 1):
        bonus = (num_draft == nd) & (acc == nd)
        n = int(bonus.sum())
        assert n > 10_000
        assert _tv(out[bonus, nd], p[nd]) < _tolerance(p[nd], n)


# ----------------------------------------------------------------------------- power check


def _reference(drafts, num_draft, p, q, uniforms, noise, mutant=None):
    """Rejection sampling written position by position, with optional deliberate mistakes."""
    b, k = drafts.shape
    out = torch.full((b, k + 1), P, dtype=torch.long)
    acc = torch.zeros(b, dtype=torch.long)
    alive = torch.ones(b, dtype=torch.bool)
    for j in range(k + 1):
        bonus = alive & (num_draft == j)
        bonus_p = p[:, j - 1] if mutant == "bonus_from_previous_position" and j > 0 else p[:, j]
        out[bonus, j] = (bonus_p / noise).argmax(-1)[bonus]
        if j == k:
            break
        d = drafts[:, j].clamp(min=0)
        p_j = p[:, j]
        q_j = _one_hot(d) if q is None else q[:, j]
        p_d = p_j.gather(1, d[:, None])[:, 0]
        q_d = q_j.gather(1, d[:, None])[:, 0]
        ok = uniforms[:, j] < p_d if mutant == "accept_if_u_below_p" else uniforms[:, j] * q_d < p_d
        trying = alive & (num_draft > j)
        accepted, rejected = trying & ok, trying & ~ok
        residual = p_j if mutant == "recover_from_p" else (p_j - q_j).clamp(min=0.0)
        residual = torch.where(residual.sum(-1, keepdim=True) <= 0, p_j, residual)
        out[accepted, j] = drafts[accepted, j]
        out[rejected, j] = (residual / noise).argmax(-1)[rejected]
        acc += accepted.long()
        alive = accepted
    return out, acc


@pytest.mark.parametrize("kind", ["far", "deterministic"])
def test_reference_matches_engine(kind):
    # the mutants below are this reference with one change, so their failures mean something
    k = 3
    p = _target(k)
    q, r = _drafter(kind, p, k)
    num_draft = torch.randint(0, k + 1, (20_000,), generator=torch.Generator().manual_seed(3))
    out, acc, args = _run(p, q, r, k, seed=9, num_draft=num_draft, b=20_000)
    ref_out, ref_acc = _reference(*args)
    assert torch.equal(out, ref_out) and torch.equal(acc, ref_acc)


@pytest.mark.parametrize("mutant, position", [
    ("recover_from_p", 0),
    ("accept_if_u_below_p", 0),
    ("bonus_from_previous_position", 1),
])
def test_checks_catch_wrong_samplers(mutant, position):
    """The distribution check has teeth: plausible mistakes fail it on the far-drafter case."""
    k = 1
    p = _target(k)
    q, r = _drafter("far", p, k)
    # the correct reference passes ...
    out, acc, _ = _run(p, q, r, k, seed=1001, sampler=_reference)
    _assert_lossless(out, acc, p, torch.full((B,), k))
    # ... the mutant, on the same coins, does not
    wrong = lambda *a: _reference(*a, mutant=mutant)  # noqa: E731
    out, acc, _ = _run(p, q, r, k, seed=1001, sampler=wrong)
    j, n, tv, tol = _position_report(out, acc, p)[position]
    assert tv is not None and tv > 0.01 and tv > tol, (mutant, j, n, tv, tol)
    with pytest.raises(AssertionError):
        _assert_lossless(out, acc, p, torch.full((B,), k))


# ------------------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("k", [1, 3])
def test_p_equals_q_never_rejects(k):
    p = _target(k)
    b = 20_000
    g = torch.Generator().manual_seed(4)
    drafts = _draw_drafts(p[:k], b, g)
    uniforms = torch.rand(b, k, generator=g)
    uniforms[:100] = U_MAX  # the worst coins
    noise = torch.empty(b, V).exponential_(generator=g)
    target = p.expand(b, k + 1, V)
    out, acc = rejection_sample(drafts, torch.full((b,), k), target, target[:, :k].clone(), uniforms, noise)
    assert (acc == k).all()
    assert torch.equal(out[:, :k], drafts)
    assert (out[:, k] >= 0).all() and (out[:, k] < V).all()
    assert (p[k, out[:, k]] > 0).all()
    assert _tv(out[:, k], p[k]) < _tolerance(p[k], b)


def test_p_equals_q_one_hot_deterministic_draft():
    # deterministic drafts that the target is sure of: always accepted, bonus from p_K
    b, k = 1000, 2
    p = torch.stack([_one_hot(T([3]))[0], _one_hot(T([5]))[0], torch.full((V,), 1.0 / V)])
    drafts = T([[3, 5]]).expand(b, k)
    uniforms = torch.full((b, k), U_MAX)
    noise = torch.empty(b, V).exponential_(generator=torch.Generator().manual_seed(0))
    out, acc = rejection_sample(drafts, torch.full((b,), k), p.expand(b, k + 1, V), None, uniforms, noise)
    assert (acc == k).all() and torch.equal(out[:, :k], drafts)
    assert out[:, k].unique().numel() == V


def test_impossible_draft_tokens():
    """q(d) = 0: accepted when p(d) > 0 (p/q = inf); rejected when p(d) = 0 too."""
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.0, 0.2, 0.0, 0.8]])
    # row 0 drafts token 0 (q=0, p>0); row 1 drafts token 2 (q=0, p=0)
    drafts = T([[0], [2]])
    b = 2
    target = p.expand(b, 2, 4)
    draft_probs = q.expand(b, 1, 4)
    for u in (0.0, 0.5, U_MAX):
        for noise in (torch.ones(b, 4), torch.tensor([[1.0, 1.0, 1e-30, 1e-30]] * b)):
            out, acc = rejection_sample(drafts, T([1, 1]), target, draft_probs, torch.full((b, 1), u), noise)
            assert acc.tolist() == [1, 0]
            assert out[0, 0] == 0 and out[0, 1] >= 0   # accepted, then a bonus token
            # rejected: the recovered token comes from max(0, p - q) = [0.5, 0.3, 0, 0] / 0.8
            assert out[1, 0].item() in (0, 1) and out[1, 1] == P


def test_tokens_outside_q_support_come_only_from_recovery():
    """q gives no mass to tokens 0..2 that p covers: they can only be produced by the residual
    draw after a rejection, and the committed tokens must still be distributed as p."""
    p = _target(1)
    q = p[:1].clone()
    q[0, :3] = 0.0
    q /= q.sum()
    assert p[0, :3].sum() > 0.05
    out, acc, _ = _run(p, q, q, 1, seed=21)
    _assert_lossless(out, acc, p, torch.full((B,), 1))
    outside = out[:, 0] < 3
    assert outside.any() and (acc[outside] == 0).all()


@pytest.mark.parametrize("drafter", ["probabilistic", "deterministic"])
def test_placeholder_positions_are_never_read(drafter):
    """Anything past num_draft -- draft ids, q, target rows past the bonus, coins -- is ignored."""
    b, k = 4096, 4
    g = torch.Generator().manual_seed(8)
    target = torch.softmax(torch.randn(b, k + 1, V, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(b, k, V, generator=g) * 2, -1) if drafter == "probabilistic" else None
    # drafts are the target's argmax half the time so acceptance lengths vary
    top = target[:, :k].argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, top, torch.randint(0, V, (b, k), generator=g))
    num_draft = torch.randint(0, k + 1, (b,), generator=g)
    uniforms = torch.rand(b, k, generator=g)
    noise = torch.empty(b, V).exponential_(generator=g)
    past = torch.arange(k).unsqueeze(0) >= num_draft.unsqueeze(1)                # [b, k]
    past_bonus = torch.arange(k + 1).unsqueeze(0) > num_draft.unsqueeze(1)       # [b, k+1]

    clean = drafts.masked_fill(past, P)
    out, acc = rejection_sample(clean, num_draft, target, q, uniforms, noise)
    assert (acc <= num_draft).all() and (acc < num_draft).any() and (acc == num_draft).any()

    # the same rows with garbage wherever nothing should be read
    stale = torch.where(past, top, drafts)  # valid ids, even ones the target would accept
    garbage_target = target.clone()
    garbage_target[past_bonus] = _one_hot(torch.zeros(int(past_bonus.sum()), dtype=torch.long))
    garbage_q = None
    if q is not None:
        garbage_q = q.clone()
        garbage_q[past] = 0.0
    garbage_u = torch.where(past, torch.zeros_like(uniforms), uniforms)
    for ids in (clean, stale):
        out2, acc2 = rejection_sample(ids, num_draft, garbage_target, garbage_q, garbage_u, noise)
        assert torch.equal(out2, out) and torch.equal(acc2, acc)
    # and placeholders never appear among the committed tokens
    committed = torch.arange(k + 1).unsqueeze(0) <= acc.unsqueeze(1)
    assert (out[committed] >= 0).all() and (out[~committed] == P).all()
