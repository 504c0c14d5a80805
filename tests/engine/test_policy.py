"""The batch policy by cost (engine/policy.py): the rule on given figures, and the decoder following it.

The rule itself is arithmetic over timed figures (a GPU times them at capture); here the figures are given, so
the decisions are exact, and the decoder's output stays the target's whatever the policy chooses.
"""

from __future__ import annotations

from engine.config import SamplingParams
from engine.policy import MARGIN, PRIOR_TAU, SpecPolicy, spec_load
from tests.conftest import make_decoder

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
    plain = make_decoder(smollm, "none", k=0).generate(prompts, params)
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
    """The max-batch rule (``spec_max_batch`` 4): four greedy requests speculate, two greedy and two sampled (load
    6) are all demoted at once, two sampled (load 4) speculate; greedy output stays the target's either way."""
    prompts = [smollm.tokenizer.encode(t) for t in ("One two three", "Red green blue", "A B C D", "x y z")]
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    sampled = SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8, seed=3)
    plain = make_decoder(smollm, "none", k=0).generate(prompts, greedy)
    assert spec_load([True, False, True]) == 4 and spec_load([]) == 0
    dec = make_decoder(smollm, "ngram", k=4, cuda_graphs=True, fused_rounds=True, spec_max_batch=4)
    got = dec.generate(prompts, greedy)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain] and sum(o.drafted for o in got) > 0
    got = dec.generate(prompts, [greedy, greedy, sampled, sampled])
    assert [o.new_token_ids for o in got[:2]] == [o.new_token_ids for o in plain[:2]]
    assert all(o.drafted == 0 for o in got)
    got = dec.generate(prompts[2:], sampled)
    assert sum(o.drafted for o in got) > 0 and not dec.scheduler.demoted
