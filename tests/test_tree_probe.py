"""bench.tree_probe: what a tree of the EAGLE head's candidates would accept, measured along the target's own
greedy output (the replay arithmetic by table; the ranks from the real model and head on the CPU, against the
engine's own rounds)."""

from __future__ import annotations

from bench.tree_probe import replay, tree_nodes


def test_tree_nodes_count_every_kept_child():
    assert tree_nodes([1, 1, 1, 1]) == 4
    assert tree_nodes([2, 2, 1, 1]) == 2 + 4 + 4 + 4
    assert tree_nodes([3, 2]) == 3 + 6


def test_replay_accepts_while_the_truths_rank_is_inside_the_tree():
    ranks = [[1, 0, 0, 0], [0, 0], [0], [3]]  # from each offset: the truth's rank at depth 1, 2, ..
    # the chain: offset 0 accepts nothing (the head's second choice was right), offset 1 both its drafts
    assert replay(ranks, [1, 1, 1, 1]) == [1, 3]
    # two children at depth 1: offset 0's second choice is in the tree, and the chain under it holds
    assert replay(ranks, [2, 1, 1, 1]) == [5]
    assert replay([[0, 2, 0], [0], [0], []], [1, 1, 1]) == [2, 2]  # depth 2's third choice: outside a chain
    assert replay([[0, 2, 0], [0], [0], []], [1, 3, 1]) == [4]


def test_a_chains_rounds_are_the_engines(smollm):
    """The shape 1,1,1,1 replayed from the probe's ranks commits, round by round, what the engine's own greedy rounds
    with the EAGLE head and k 4 commit on the same prompts; a wider tree never commits fewer tokens a round."""
    from bench.tree_probe import truth_ranks
    from engine.config import EngineConfig, SamplingParams
    from engine.drafters import DraftSpec, build_drafter
    from tests.conftest import make_decoder

    texts = ("Write a Python function that returns the sum of a list.", "List the planets of the solar system.")
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    config = EngineConfig(kv_cache_tokens=8192, k=6, max_k=8)
    ranks = truth_ranks(smollm, build_drafter(DraftSpec.parse("auto"), smollm, config), prompts, 48, 6)
    assert [len(r) for r in ranks] == [46, 46]  # offsets 2 .. 47
    assert all(len(depths) == min(6, 45 - i) and min(depths, default=0) >= 0
               for r in ranks for i, depths in enumerate(r))
    decoder = make_decoder(smollm, "auto", k=4)
    ids = [decoder.add_request(p, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)) for p in prompts]
    steps: dict[str, list[int]] = {i: [] for i in ids}
    while decoder.has_unfinished():
        for o in decoder.step():
            steps[o.request_id].append(len(o.new_token_ids))
    for rid, r in zip(ids, ranks):
        assert steps[rid][:2] == [1, 1]  # the prompt's token, then the round without drafts
        assert steps[rid][2:] == replay(r, [1, 1, 1, 1])
    chain = [replay(r, [1, 1, 1, 1]) for r in ranks]
    tree = [replay(r, [2, 2, 1, 1]) for r in ranks]
    assert sum(map(len, tree)) <= sum(map(len, chain))
