"""The fast path (engine/rounds/fused.py): rounds as one graph each, here run eagerly on the CPU.

Fused rounds must decode exactly what the eager engine decodes: plain (k = 0) and with the default
EAGLE drafter, whose drafts inside the round must be the drafts the eager drafter makes (equal
acceptance counts, round by round), greedy and sampled: a seeded sampled request draws the same
coins from the same streams on both paths (rejection sampling in the graph, the head sampling its
drafts from q in the graph), with temperature alone and with top-k / top-p. Requests join and leave
between rounds, greedy and sampled rows share a round, a request near the end of its context leaves
the fast path, and aborted requests free their KV in the target and the head.
"""

from __future__ import annotations

import pytest

from engine.config import SamplingParams
from engine.rounds.graph_sampling import Mode
from engine.graphs import PAD_SEQ
from tests.conftest import make_decoder

TEXTS = ("List three colors.", "What is 2 + 2? Explain.", "Write a haiku about the sea.",
         "Write a Python function that returns the n-th Fibonacci number.")


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


def _fused(smollm, draft, k, **kw):
    dec = make_decoder(smollm, draft, k=k, cuda_graphs=True, fused_rounds=True, **kw)
    assert dec.fused is not None and dec.fused.k == k
    return dec


# different lengths, EOS honoured: rows leave the batch at different rounds
PARAMS = [SamplingParams(max_tokens=n, ignore_eos=i % 2 == 0) for i, n in enumerate((20, 33, 27, 40))]


@pytest.fixture(scope="module")
def plain(smollm, prompts):
    """The eager engine's plain greedy decoding of PARAMS: what every drafter's rounds must decode."""
    return make_decoder(smollm, "none", k=0, cuda_graphs=False).generate(prompts, PARAMS)


@pytest.mark.parametrize("draft,k", [("none", 0), ("auto", 4), ("layerskip:6", 3), ("ngram", 4)])
def test_fused_rounds_decode_what_the_eager_engine_decodes(smollm, prompts, plain, draft, k):
    params = PARAMS
    want = plain if k == 0 else make_decoder(smollm, draft, k=k, cuda_graphs=False).generate(prompts, params)
    dec = _fused(smollm, draft, k)
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    # the drafts made inside the round are the eager drafter's: same acceptance, round for round
    assert [(o.rounds, o.accepted, o.drafted) for o in got] == [(o.rounds, o.accepted, o.drafted) for o in want]
    assert dec.fused.store.graphs  # the rounds went through the fast path
    if k:
        assert sum(o.accepted for o in got) > 0
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]


def test_requests_join_between_fused_rounds_beside_sampled_ones(smollm, prompts):
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=7)
    want = make_decoder(smollm, "auto", k=4, cuda_graphs=False).generate(prompts[:2] + prompts[:1],
                                                                        [greedy, greedy, sampled])
    dec = _fused(smollm, "auto", 4)
    first = dec.add_request(prompts[0], greedy)
    tokens = {first: []}
    for step in range(40):
        if step == 3:  # a greedy and a sampled request arrive while the first is on the fast path
            tokens[dec.add_request(prompts[1], greedy)] = []
            tokens[dec.add_request(prompts[0], sampled)] = []
            assert first in dec.fast.next_drafts
        for o in dec.step():
            tokens[o.request_id] += o.new_token_ids
        if not dec.has_unfinished():
            break
    assert list(tokens.values()) == [o.new_token_ids for o in want]


@pytest.mark.parametrize("draft,k", [("none", 0), ("auto", 4), ("layerskip:6", 3), ("ngram", 4)])
def test_sampled_rounds_decode_what_the_eager_engine_decodes(smollm, prompts, draft, k):
    """Seeded sampled requests (temperature alone; top-k and top-p) beside a greedy one, in one batch. A draft LM
    samples its drafts as the head does (``pick_in_graph``): it takes the filtering round only."""
    params = [SamplingParams(max_tokens=21, ignore_eos=True, temperature=0.8, seed=11),
              SamplingParams(max_tokens=26, ignore_eos=True),
              SamplingParams(max_tokens=19, ignore_eos=True, temperature=1.1, seed=5),
              SamplingParams(max_tokens=23, ignore_eos=True, temperature=0.7, seed=3)]
    for filters in ({}, {"top_k": 40, "top_p": 0.9})[1 if draft.startswith("layerskip") else 0:]:
        ps = [p if p.greedy else SamplingParams(**{**p.__dict__, **filters}) for p in params]
        want = make_decoder(smollm, draft, k=k, cuda_graphs=False).generate(prompts, ps)
        dec = _fused(smollm, draft, k)
        got = dec.generate(prompts, ps)
        assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
        assert [(o.rounds, o.accepted, o.drafted) for o in got] == [(o.rounds, o.accepted, o.drafted) for o in want]
        assert {key[2] for key in dec.fused.store.graphs} >= {Mode.FILTERED if filters else Mode.SAMPLED}
    if draft == "auto":  # the trained head's sampled drafts were accepted in the graph (layer-skip's rarely are)
        assert sum(o.accepted for o in got[:1] + got[2:]) > 0


def test_a_request_near_the_end_of_its_context_leaves_the_fast_path(smollm, prompts):
    prompt = prompts[3]
    ctx = len(prompt) + 30
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    want = make_decoder(smollm, "none", k=0, cuda_graphs=False, max_context=ctx).generate([prompt], params)
    got = _fused(smollm, "auto", 4, max_context=ctx).generate([prompt], params)
    assert got[0].new_token_ids == want[0].new_token_ids and got[0].finish_reason.value == "length"
    assert len(got[0].new_token_ids) == ctx - len(prompt)


def test_abort_on_the_fast_path_frees_the_target_and_head_kv(smollm, prompts):
    dec = _fused(smollm, "auto", 4)
    target, head = dec.target.allocator, dec.drafter.runner.allocator
    free = target.free_blocks, head.free_blocks
    rid = dec.add_request(prompts[2], SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(4):
        dec.step()
    assert rid in dec.fast.next_drafts and target.length(rid) > 0 and head.length(rid) > 0
    assert dec.abort(rid) and rid not in dec.fast.next_drafts
    assert rid not in target and rid not in head and (target.free_blocks, head.free_blocks) == free
    assert PAD_SEQ in target and PAD_SEQ in head  # the scratch blocks stay reserved


def test_requests_of_a_batch_above_spec_max_batch_decode_plainly(smollm, prompts):
    """spec_max_batch 2 and three requests: all three decode plainly to their end through the plain graph (no
    drafts, the head's state released), greedy output the target's; a request that later runs alone speculates."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (6, 9)]
    params.append(SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=2))
    want = make_decoder(smollm, "none", k=0, cuda_graphs=False).generate(prompts[:2], params[:2])
    dec = _fused(smollm, "auto", 4, spec_max_batch=2)
    got = dec.generate(prompts[:3], params)
    assert [o.new_token_ids for o in got[:2]] == [o.new_token_ids for o in want]
    assert len(got[2].new_token_ids) == 12
    assert all(o.drafted == 0 for o in got) and dec.fused_plain.store.graphs and not dec.fused.store.graphs
    assert not dec.scheduler.demoted and set(dec.drafter.runner.allocator._seqs) <= {PAD_SEQ}  # no head state left behind
    alone = dec.generate(prompts[3:], SamplingParams(max_tokens=24, ignore_eos=True))
    assert alone[0].accepted > 0 and dec.fused.store.graphs
    assert make_decoder(smollm, "auto", k=4, cuda_graphs=True, fused_rounds=True).fused_plain is None  # default: off


@pytest.mark.parametrize("draft,k", [("auto", 4), ("layerskip:6", 3)])
def test_the_catch_up_carries_only_the_live_rows_past_the_attention(smollm, prompts, draft, k):
    """In a round the drafter's last layer runs its MLP on R rows in the catch-up (one live entry a row; all
    k + 1 entries write their K/V) and in each of the k - 1 draft steps, never on R * (k + 1). Layer-skip's
    last layer is also the target's layer 6, which the verify runs once on R * (k + 1) rows."""
    dec = _fused(smollm, draft, k)
    model = dec.drafter.head.layer if draft == "auto" else dec.drafter.runner.model.model.layers[-1]
    seen: list[int] = []
    hook = model.mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    compute, per_round = dec.fused.body.compute, []

    def counted(g):  # one round's graph body (a round that builds its graph runs it twice on the CPU)
        seen.clear()
        compute(g)
        rows = g.inputs.shape[0]
        per_round.append((seen.count(rows), seen.count(rows * (k + 1)), len(seen)))

    dec.fused.body.compute = counted
    try:
        dec.generate(prompts[:3], SamplingParams(max_tokens=12, ignore_eos=True))
    finally:
        hook.remove()
    verify = 0 if draft == "auto" else 1
    assert per_round and all(r == (k, verify, k + verify) for r in per_round), per_round


def test_plain_rounds_of_several_steps_decode_what_the_eager_engine_decodes(smollm, prompts, plain):
    """A plain graph's round of ``steps`` forwards (``plain_steps``) commits that many tokens a row: greedy (EOS
    honoured, rows ending inside a round), seeded sampled and filtered rows beside greedy ones (step s draws at
    the request's draw number + s, as one-token rounds would), a row at the end of its context; with and without
    rounds launched ahead."""
    steps = 3  # rows end inside a round at every offset of these lengths
    sampled = [SamplingParams(max_tokens=21, ignore_eos=True, temperature=0.8, seed=11),
               SamplingParams(max_tokens=26, ignore_eos=True),
               SamplingParams(max_tokens=19, ignore_eos=True, temperature=1.1, seed=5, top_k=40, top_p=0.9),
               SamplingParams(max_tokens=23, ignore_eos=True, temperature=0.7, seed=3)]
    want_sampled = make_decoder(smollm, "none", k=0, cuda_graphs=False).generate(prompts, sampled)
    for pipeline in (0, 8):
        dec = _fused(smollm, "none", 0, plain_steps=steps, plain_steps_min_batch=1, pipeline_max_batch=pipeline)
        assert dec.fused.store.steps_for(1) == steps
        got = dec.generate(prompts, PARAMS)
        assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
        for o, p in zip(got, PARAMS):  # the prefill's token, then steps a round
            if p.ignore_eos:
                assert o.rounds == 1 + -(-(p.max_tokens - 1) // steps) and o.accepted == o.drafted == 0
        got = dec.generate(prompts, sampled)
        assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want_sampled]
        assert (dec.fused.rounds_ahead > 0) == (pipeline > 0)
    prompt, ctx = prompts[3], len(prompts[3]) + 30  # the context's last tokens: rows leave the graph in time
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    want = make_decoder(smollm, "none", k=0, cuda_graphs=False, max_context=ctx).generate([prompt], params)
    got = _fused(smollm, "none", 0, plain_steps=steps, plain_steps_min_batch=1, max_context=ctx).generate([prompt],
                                                                                                           params)
    assert got[0].new_token_ids == want[0].new_token_ids and len(got[0].new_token_ids) == 30
