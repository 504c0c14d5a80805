"""The batch policy by cost (engine/policy.py): the rule on given figures, and the decoder following it.

The rule itself is arithmetic over timed figures (a GPU times them at capture); here the figures are given, so
the decisions are exact, and the decoder's output stays the target's whatever the policy chooses.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.drafters.ngram import NgramDrafter
from engine.factory import decoder_for
from engine.policy import GUARD_PROBE_S, GUARD_ROUNDS, MARGIN, PRIOR_TAU, SpecGuard, SpecPolicy, spec_load
from engine.spec import SpecDecoder
from tests.conftest import eager_outputs, make_decoder

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def _timed() -> SpecPolicy:
    p = SpecPolicy(4, BUCKETS, fallback_max_batch=3)
    # a speculative round costs 1.3x plain at 1-4 rows, 1.95x at 16, 2.6x at 64 (GPU time)
    p.timed({b: 1.0 + 0.3 * (b <= 4) + 0.95 * (b == 16) + 1.6 * (b >= 32) for b in BUCKETS},
            {b: 1.0 for b in BUCKETS})
    return p


def test_speculate_where_the_expected_tokens_beat_the_cost():
    p = _timed()
    assert p.speculate(4, [None] * 4) and p.chosen[4] == 4          # prior 2.0 tokens vs 1.3x the cost
    assert not p.speculate(16, [None] * 16) and p.chosen[16] == 0   # 2.0 tokens vs 1.95x * 1.05
    assert p.speculate(16, [2.2] * 16)                              # these requests accept more
    assert not p.speculate(64, [2.2] * 64) and p.last_k == 0
    assert not p.speculate(1, [1.2])                                # n-gram rows that rarely match


def test_host_time_learned_from_rounds_narrows_the_gap():
    p = _timed()
    assert not p.speculate(16, [2.0] * 16)
    for _ in range(50):  # rounds of 16 rows take 3 ms on the host beside the GPU's time, on either graph
        p.observe(False, 16, 4.0)
        p.observe(True, 16, 4.95)
    assert abs(p.host_ms[False][16] - 3.0) < 1e-6 and abs(p.host(True, 16) - 3.0) < 1e-6
    assert p.speculate(16, [2.0] * 16)  # 2.0 * 4.0 >= 1.05 * 4.95


def test_a_graph_not_run_yet_takes_the_others_host_share():
    p = _timed()
    p.observe(True, 16, 1.95 + 3.9)  # 3.9 ms of host beside the speculative graph's 1.95 ms
    assert abs(p.host(False, 16) - 3.9) < 1e-6
    p.observe(False, 16, 1.0 + 2.0)
    assert abs(p.host(False, 16) - 2.0) < 1e-6 and abs(p.host(True, 16) - 3.9) < 1e-6  # each its own once learned
    assert p.host(True, 4) == p.host(False, 4) == 0.0  # nothing learned at 4 rows


def test_untimed_sizes_follow_spec_max_batch_and_learn_nothing():
    p = SpecPolicy(4, BUCKETS, fallback_max_batch=3)
    assert p.speculate(3, [None] * 3) and not p.speculate(4, [None] * 4)
    p.observe(True, 2, 5.0)
    assert p.host_ms == {True: {}, False: {}}


def test_acceptance_estimates():
    p = SpecPolicy(4, BUCKETS, fallback_max_batch=3)
    assert p.request_tau(accepted=0, drafted=0) is None            # not drafted yet: the prior
    assert p.request_tau(accepted=0, drafted=4 * 15) is None       # 15 unlucky first rounds do not count yet
    assert p.request_tau(accepted=0, drafted=4 * 16) == (2 * PRIOR_TAU + 16 * 1.0) / 18
    assert p.request_tau(accepted=0, drafted=4 * 40) < 1.05         # 40 rounds of nothing accepted
    assert abs(p.request_tau(accepted=3 * 400, drafted=4 * 400) - 4.0) < 0.01  # its own, after many rounds
    for _ in range(200):
        p.accepted(3.0)
    assert abs(p.tau - 3.0) < 0.01 and MARGIN > 1.0


def test_the_cost_policy_is_opt_in(smollm):
    assert make_decoder(smollm, "ngram", k=4, cuda_graphs=True, fused_rounds=True, spec_max_batch=3).fast.policy is None


def test_the_decoder_demotes_when_the_policy_says_plain_and_decodes_the_same(smollm):
    """A decoder with fused rounds and a batch policy, its graphs' figures given as a GPU would time them: rounds of
    4 requests do not pay, so all four are demoted to the plain graph at once; the output is plain greedy."""
    prompts = [smollm.tokenizer.encode(t) for t in ("One two three", "Red green blue", "A B C D", "x y z")]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    plain = eager_outputs(smollm, "none", 0, prompts, params)
    dec = make_decoder(smollm, "ngram", k=4, cuda_graphs=True, fused_rounds=True, spec_max_batch=8,
                       spec_policy="cost")
    policy = dec.fast.policy
    assert policy is not None
    policy.timed({b: 1.0 + 2.0 * (b >= 4) for b in BUCKETS}, {b: 1.0 for b in BUCKETS})
    policy.observe = lambda *args: None  # the CPU's round times would teach it host times a GPU never has
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    assert policy.chosen[4] == 0 and all(o.drafted == 0 for o in got)  # the fallback (8) would have speculated
    [one] = dec.generate(prompts[:1], params)  # alone, a round pays: it speculates
    assert policy.chosen[1] == 4 and one.drafted > 0 and one.new_token_ids == plain[0].new_token_ids


def test_the_default_rule_counts_a_sampled_request_twice(smollm):
    """The max-batch rule (``spec_max_batch`` 4) with the EAGLE head: four greedy requests speculate, two greedy and
    two sampled (load 6) are all demoted at once, two sampled (load 4) speculate; greedy output stays the target's
    either way."""
    prompts = [smollm.tokenizer.encode(t) for t in ("One two three", "Red green blue", "A B C D", "x y z")]
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    sampled = SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8, seed=3)
    plain = eager_outputs(smollm, "none", 0, prompts, greedy)
    assert spec_load([True, False, True]) == 4 and spec_load([]) == 0
    dec = make_decoder(smollm, "auto", k=4, cuda_graphs=True, fused_rounds=True, spec_max_batch=4)
    got = dec.generate(prompts, greedy)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain] and sum(o.drafted for o in got) > 0
    got = dec.generate(prompts, [greedy, greedy, sampled, sampled])
    assert [o.new_token_ids for o in got[:2]] == [o.new_token_ids for o in plain[:2]]
    assert all(o.drafted == 0 for o in got)
    got = dec.generate(prompts[2:], sampled)
    assert sum(o.drafted for o in got) > 0 and not dec.scheduler.demoted


def test_a_request_drafting_n_grams_weighs_five(smollm):
    """The n-gram lookup's ``batch_weight`` 5 (its rounds pay for a fifth as many rows): with ``spec_max_batch`` 10 two
    greedy requests speculate, four (load 20) decode plainly; the EAGLE head weighs 1."""
    prompts = [smollm.tokenizer.encode(t) for t in ("One two three", "Red green blue", "A B C D", "x y z")]
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    plain = eager_outputs(smollm, "none", 0, prompts, greedy)
    assert spec_load([True, False], 2) == 6
    dec = make_decoder(smollm, "ngram", k=4, cuda_graphs=True, fused_rounds=True, spec_max_batch=10)
    assert dec.scheduler.weight == 5 and make_decoder(smollm, "auto", k=4).scheduler.weight == 1
    got = dec.generate(prompts[:2], greedy)
    assert sum(o.drafted for o in got) > 0 and not dec.scheduler.demoted
    got = dec.generate(prompts, greedy)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    assert all(o.drafted == 0 for o in got) and dec.scheduler.rows["demoted"] > 0


@pytest.mark.parametrize("pipeline", [0, 8])
def test_requests_demoted_by_load_speculate_again_once_it_falls_where_the_drafter_catches_up_from_tokens(smollm,
                                                                                                        pipeline):
    """Four n-gram requests weigh 20 against ``spec_max_batch`` 15: all decode plainly. Once the first short one
    finished the three left weigh 15, within the limit but with no room for one more: they stay plain (a load stepping
    between the limit and one over it must not move them to and fro). Once the second finished the two left weigh
    10 and speculate again (the lookup catches up from their tokens: they enter the speculative graph as new
    requests do). Output plain greedy, with rounds launched ahead or not, and no KV block left behind. So with a
    layer-skip draft model (weighing 1, against a limit of 3; it primes its KV over their tokens). The EAGLE head saw
    no features of the tokens decoded plainly: its requests stay demoted to their end."""
    prompts = [smollm.tokenizer.encode(t) for t in ("1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2", "a b c d a b c d a b c d a",
                                                    "x y z x y z x y z x", "one two one two one two")]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (40, 40, 6, 14)]
    plain = eager_outputs(smollm, "none", 0, prompts, params)
    for draft, limit, rejoins in (("ngram", 15, True), ("layerskip:4", 3, True), ("auto", 3, False)):
        dec = make_decoder(smollm, draft, k=4, cuda_graphs=True, fused_rounds=True, spec_max_batch=limit,
                           pipeline_max_batch=pipeline)
        assert dec.scheduler.rejoins is rejoins
        free = dec.target.allocator.free_blocks
        ids = [dec.add_request(p, sp) for p, sp in zip(prompts, params)]
        tokens, last = {rid: [] for rid in ids}, {}
        while dec.has_unfinished():
            crowded = len(dec.requests) + len(dec.waiting) >= 3
            for o in dec.step():
                tokens[o.request_id] += o.new_token_ids
                last[o.request_id] = o
                assert not (crowded and o.drafted), (draft, o)  # no drafts while three or more run
        assert [tokens[rid] for rid in ids] == [o.new_token_ids for o in plain], draft
        assert dec.scheduler.rows["demoted"] > 0, draft
        assert [last[rid].drafted > 0 for rid in ids] == [rejoins, rejoins, False, False], draft
        assert dec.target.allocator.free_blocks == free and not dec.requests


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_guard_measures_then_stops_rounds_that_do_not_pay_and_measures_again():
    """A drafter outside the graph: rounds of 4.2 ms committing 2.6 tokens a row against a 1 ms plain token (the split
    at one request on an H200) do not pay; 2.6 tokens for 2.0 ms do. Until it has seen GUARD_ROUNDS speculative
    rounds of a bucket, or before a plain token's cost is known, the bucket speculates (it is measuring)."""
    clock = _Clock()
    g = SpecGuard(BUCKETS, clock)
    assert g.speculate(1)                          # nothing known
    for _ in range(GUARD_ROUNDS):
        g.observe(True, 1, 4.2, 2.6)
    assert g.speculate(1)                          # no plain cost yet
    g.timed({b: 1.0 for b in BUCKETS})
    assert not g.speculate(1) and not g.last
    assert not g.speculate(8)                      # not measured, but a smaller bucket does not pay
    for _ in range(50):                            # plain rounds of 4 steps at 3.2 ms: a token 0.8 ms
        g.observe(False, 1, 3.2, 4)
    assert abs(g.plain_ms[1] - 0.8) < 1e-3 and not g.speculate(1)
    clock.now = GUARD_PROBE_S + 1                  # time to measure again, but requests decode plainly beside:
    assert not g.speculate(1, clean=False)         # new ones' rounds would mix both graphs; the verdict holds
    assert g.speculate(1, clean=True) and g.speculate(8)  # a lull: measure again, every bucket
    for _ in range(GUARD_ROUNDS):
        assert g.speculate(1)
        g.observe(True, 1, 1.9, 2.6)               # the drafter got faster: 2.6 * 0.8 >= 1.05 * 1.9
    assert g.speculate(1)
    g.observe(True, 1, 3.0, 2.6)                   # a slow round moves the mean: 2.6 * 0.8 < 1.05 * 2.12
    assert not g.speculate(1)


def test_the_decoder_stops_a_drafter_outside_the_graph_where_it_does_not_pay(smollm):
    """A decoder whose drafter drafts on the host (outside the graph, as a drafter service's): given a plain token
    that costs next to nothing, the guard demotes the requests once it has measured their speculative rounds, and the
    output stays plain greedy; given a dear plain token they speculate to the end."""
    prompts = [smollm.tokenizer.encode(t) for t in ("1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2", "a b c d a b c d a b c d a")]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    plain = eager_outputs(smollm, "none", 0, prompts, params)
    config = EngineConfig(kv_cache_tokens=8192, k=4, max_k=8, max_batch_size=8, cuda_graphs=True, fused_rounds=True,
                          spec_max_batch=10)  # two n-gram requests weigh 10
    cost = dataclasses.replace(config, spec_policy="cost")  # the cost rule times a speculative graph: there is none
    assert decoder_for(smollm, cost, NgramDrafter()).fast.guard is not None
    drafted = {}
    for plain_ms in (1e-6, 1e6):
        dec = decoder_for(smollm, config, NgramDrafter())
        assert dec.fused is None and dec.fast.guard is not None and dec.fast.policy is None
        dec.fast.guard.timed({b: plain_ms for b in BUCKETS})
        got = dec.generate(prompts, params)
        assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
        assert all(o.drafted > 0 for o in got)     # every request speculated while the guard measured
        spent, tokens, rounds = dec.fast.guard.spec[2]
        assert rounds >= GUARD_ROUNDS and tokens / rounds >= 1.0
        drafted[plain_ms] = [o.drafted for o in got]
    # demoted after the rounds it measured (a round's 4 drafts each), against drafting to the end
    assert all(d <= 4 * (GUARD_ROUNDS + 1) for d in drafted[1e-6])
    assert all(d > 4 * (GUARD_ROUNDS + 1) for d in drafted[1e6])


def _one_then_another(dec: SpecDecoder, prompts, params: SamplingParams):
    """A plain token that costs next to nothing (the CPU's plain rounds would teach the guard a cost a GPU never
    has); the first prompt's request runs until the guard has measured its rounds, then the second arrives and both
    run to the end. Returns their ids, every token of each and each one's last output."""
    guard = dec.fast.guard
    guard.timed({b: 1e-6 for b in BUCKETS})
    observe = guard.observe
    guard.observe = lambda speculative, *args: observe(speculative, *args) if speculative else None
    first = dec.add_request(prompts[0], params)
    tokens = {first: []}
    for _ in range(GUARD_ROUNDS + 2):
        for o in dec.step():
            tokens[o.request_id] += o.new_token_ids
    checked = (set(dec.scheduler.demoted), set(dec.scheduler.local))
    second = dec.add_request(prompts[1], params)
    tokens[second], last = [], {}
    while dec.has_unfinished():
        for o in dec.step():
            tokens[o.request_id] += o.new_token_ids
            last[o.request_id] = o
    return first, second, tokens, last, checked


def test_a_request_arriving_beside_plain_ones_takes_the_smaller_buckets_verdict(smollm):
    """Requests arrive one by one: the first speculates until the guard has measured rounds of one row not to pay,
    then decodes plainly; the second arrives beside it (two rows, a bucket never measured, whose rounds would mix the
    plain graph and the drafter's) and decodes plainly from its first round. Output stays plain greedy."""
    prompts = [smollm.tokenizer.encode(t) for t in ("1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2", "a b c d a b c d a b c d a")]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    plain = eager_outputs(smollm, "none", 0, prompts, params)
    config = EngineConfig(kv_cache_tokens=8192, k=4, max_k=8, max_batch_size=8, cuda_graphs=True, fused_rounds=True,
                          spec_max_batch=10)  # two n-gram requests weigh 10
    dec = decoder_for(smollm, config, NgramDrafter())
    first, second, tokens, last, (demoted, _) = _one_then_another(dec, prompts, params)
    assert demoted == {first} and dec.fast.guard.chosen[1] is False
    assert [tokens[first], tokens[second]] == [o.new_token_ids for o in plain]
    assert last[second].drafted == 0 and not dec.fast.guard.chosen[2]


def test_requests_whose_outside_drafter_does_not_pay_draft_with_the_local_one(smollm):
    """A drafter outside the graph (a host n-gram, as a drafter service's) beside a local one drafting in the graph:
    once the guard has measured the outside drafter's rounds not to pay, the running requests and those arriving
    after them draft with the local drafter in the speculative graph (not plainly) to their end, the outside
    drafter's state released; output stays plain greedy."""
    from engine.drafters.ngram_graph import TokenHistory

    prompts = [smollm.tokenizer.encode(t) for t in ("1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2", "a b c d a b c d a b c d a")]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    plain = eager_outputs(smollm, "none", 0, prompts, params)
    config = EngineConfig(kv_cache_tokens=8192, k=4, max_k=8, max_batch_size=8, cuda_graphs=True, fused_rounds=True,
                          spec_max_batch=10, max_context=1024)  # two n-gram requests weigh 10
    outside, local = NgramDrafter(), NgramDrafter(history=TokenHistory(8, 1024, "cpu"))
    released = []
    release = outside.release
    outside.release = lambda rid: (released.append(rid), release(rid))
    dec = decoder_for(smollm, config, outside, local=local)
    assert dec.fast.local is local and dec.fused.k == 4 and dec.fast.guard is not None
    first, second, tokens, last, (demoted, moved) = _one_then_another(dec, prompts, params)
    assert moved == {first} and not demoted and first in released
    assert [tokens[first], tokens[second]] == [o.new_token_ids for o in plain]
    assert last[second].drafted > 0 and last[first].drafted > 4 * (GUARD_ROUNDS + 1)  # drafting went on, locally
    assert dec.scheduler.rows["on_graph"] > 0 and dec.scheduler.rows["demoted"] == 0
    assert local.history._slot == {} and not dec.requests  # every request's history row went back
