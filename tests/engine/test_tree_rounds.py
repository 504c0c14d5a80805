"""Fused rounds that verify a tree of drafts (``spec_tree``, engine/rounds/tree.py), run eagerly on the CPU.

Greedy rounds verify and draft the whole tree; they must decode exactly the target's plain greedy output, with rounds
launched ahead, several rounds a replay and requests joining between rounds, and commit more tokens a round than a
chain of the same depth (the tree's first path is the chain). Sampled rows walk the same tree
(``tree_rejection_sample``, whose distribution tests/engine/test_tree_sampling.py checks): near temperature 0 they
commit what greedy rows commit, round by round.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import SamplingParams
from tests.conftest import make_decoder
from tests.engine.test_fused_round import PARAMS, TEXTS  # the fused rounds' four prompts and their lengths

TREE = (2, 2, 1, 1)


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


@pytest.fixture(scope="module")
def plain(smollm, prompts):
    return make_decoder(smollm, "none", k=0, cuda_graphs=False).generate(prompts, PARAMS)


def _fused(smollm, draft="auto", k=4, **kw):
    return make_decoder(smollm, draft, k=k, cuda_graphs=True, fused_rounds=True, **kw)


@pytest.mark.parametrize("draft,kw", [("auto", {}), ("auto", dict(pipeline_max_batch=8)),
                                      ("auto", dict(pipeline_max_batch=8, spec_rounds=2, spec_rounds_min_batch=1)),
                                      ("layerskip:6", {})])
def test_tree_rounds_decode_the_targets_greedy_output(smollm, prompts, plain, draft, kw):
    dec = _fused(smollm, draft, spec_tree=TREE, **kw)
    assert dec.fused.tree is not None and dec.fused.width == 14
    got = dec.generate(prompts, PARAMS)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    assert dec.fused.rounds > 0 and sum(o.accepted for o in got) > 0
    if kw.get("pipeline_max_batch"):
        assert dec.fused.rounds_ahead > 0


@pytest.mark.parametrize("tree", [(3, 1), (2, 1, 1)])
def test_shallow_wide_trees_decode_the_targets_greedy_output(smollm, prompts, plain, tree):
    """Trees wide at the top and short (k their depth): fewer draft steps a round than the chain of k 4."""
    dec = _fused(smollm, k=len(tree), spec_tree=tree, pipeline_max_batch=8)
    got = dec.generate(prompts, PARAMS)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    assert dec.fused.width == {(3, 1): 6, (2, 1, 1): 6}[tree] and sum(o.accepted for o in got) > 0


def test_a_tree_commits_more_tokens_a_round_than_its_first_path(smollm, prompts, plain):
    chain = _fused(smollm).generate(prompts, PARAMS)
    tree = _fused(smollm, spec_tree=TREE).generate(prompts, PARAMS)
    assert [o.new_token_ids for o in tree] == [o.new_token_ids for o in chain] == [o.new_token_ids for o in plain]
    per_round = [sum(o.accepted + o.rounds for o in out) / sum(o.rounds for o in out) for out in (chain, tree)]
    assert per_round[1] > per_round[0], per_round


def test_requests_join_tree_rounds_beside_sampled_ones(smollm, prompts):
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=7)

    def run(**kw):
        dec = _fused(smollm, pipeline_max_batch=8, **kw)
        first = dec.add_request(prompts[0], greedy)
        tokens = {first: []}
        for step in range(60):
            if step == 3:  # a greedy and a sampled request arrive while the first is on the fast path
                tokens[dec.add_request(prompts[1], greedy)] = []
                tokens[dec.add_request(prompts[0], sampled)] = []
            for o in dec.step():
                tokens[o.request_id] += o.new_token_ids
            if not dec.has_unfinished():
                break
        return list(tokens.values())

    want = make_decoder(smollm, "none", k=0, cuda_graphs=False).generate(prompts[:2], greedy)
    tree = run(spec_tree=TREE)
    assert tree[:2] == [o.new_token_ids for o in want] and len(tree[2]) == 24
    assert run(spec_tree=TREE) == tree  # the sampled request's coins are its seed's, whatever joined when


def test_sampled_rows_walk_the_tree(smollm, prompts, plain):
    """Near temperature 0 the target's distribution is all but one-hot: a sampled row walking the tree commits what a
    greedy row does, as many tokens a round, which is more than a sampled chain of the same depth commits."""
    cold = [dataclasses.replace(p, temperature=1e-3, seed=3 + i) for i, p in enumerate(PARAMS)]
    greedy = _fused(smollm, spec_tree=TREE).generate(prompts, PARAMS)
    tree = _fused(smollm, spec_tree=TREE).generate(prompts, cold)
    chain = _fused(smollm).generate(prompts, cold)
    assert [o.new_token_ids for o in tree] == [o.new_token_ids for o in greedy] == [o.new_token_ids for o in plain]
    assert [(o.accepted, o.rounds) for o in tree] == [(o.accepted, o.rounds) for o in greedy]
    assert sum(o.accepted for o in tree) > sum(o.accepted for o in chain)


def test_a_tree_needs_a_drafter_that_drafts_trees(smollm):
    with pytest.raises(ValueError, match="spec_tree"):
        _fused(smollm, "ngram", spec_tree=TREE)


@pytest.mark.parametrize("k", [4, 1, 0])
def test_a_requests_own_k_at_a_shallow_tree(smollm, prompts, plain, k):
    """A request's own k against a verifier whose tree is 3,1 (k 2): a gateway's default k 4 verifies the whole tree,
    k 1 its first depth, k 0 decodes plainly; the output is the target's greedy output each way."""
    dec = _fused(smollm, k=2, spec_tree=(3, 1), pipeline_max_batch=8)
    got = dec.generate(prompts, [dataclasses.replace(p, k=k) for p in PARAMS])
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    accepted, rounds = sum(o.accepted for o in got), sum(o.rounds for o in got)
    if k == 4:  # as a request with no k of its own: the tree's depths
        default = _fused(smollm, k=2, spec_tree=(3, 1), pipeline_max_batch=8).generate(prompts, PARAMS)
        assert [(o.accepted, o.rounds) for o in got] == [(o.accepted, o.rounds) for o in default]
    assert (accepted > 0) if k == 4 else (0 < accepted <= rounds) if k == 1 else accepted == 0, (accepted, rounds)
