"""Fused rounds launched ahead (engine/rounds/ahead.py, ``pipeline_max_batch``), here run eagerly on the CPU.

While the same requests keep running, the next round is launched before this one is read, its inputs
(last committed token, next drafts and their q, KV lengths) chained on the device, the coins and drafter
noise of the next draw number drawn. The output must stay exactly the eager engine's, round for round,
greedy and seeded sampled, whether the round launched ahead is used or dropped: rows finish (EOS,
max_tokens) and leave the chain, rows near their end verify fewer drafts in it, rows arrive beside it or
are aborted; and no KV block it held outlives it.
"""

from __future__ import annotations

import pytest

from engine.config import SamplingParams
from engine.graphs import PAD_SEQ
from engine.rounds.graph_sampling import Mode
from tests.conftest import eager_outputs, make_decoder

TEXTS = ("List three colors.", "What is 2 + 2? Explain.", "Write a haiku about the sea.")


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


def _pipelined(smollm, draft, k, **kw):
    dec = make_decoder(smollm, draft, k=k, cuda_graphs=True, fused_rounds=True, pipeline_max_batch=8, **kw)
    assert dec.fused is not None and dec.fused.store.pipeline_rows == 8
    return dec


def _step(dec, tokens, aborted) -> bool:
    """One step, each request's new tokens (but the aborted one's) added to ``tokens``; whether any is left."""
    for o in dec.step():
        if o.request_id != aborted:
            tokens[o.request_id] += o.new_token_ids
    return dec.has_unfinished()


def _allocators(dec):
    runner = getattr(dec.drafter, "runner", None)  # the n-gram drafter has no KV
    return [dec.target.allocator] + ([runner.allocator] if runner is not None else [])


@pytest.mark.parametrize("draft", ["auto", "ngram"])
@pytest.mark.parametrize("pipeline", [8, 0])
def test_two_rounds_a_replay_decode_what_the_eager_engine_decodes(smollm, prompts, draft, pipeline):
    """``spec_rounds`` 2: a greedy speculative graph runs two whole rounds a replay, the second on the first's
    drafts, with or without the next replay launched ahead. Rows end at different rounds (inside a replay too, and
    one by EOS): the same tokens and the same round counts as the eager engine, and no KV block left behind."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (13, 22)] + [SamplingParams(max_tokens=40)]
    want = eager_outputs(smollm, draft, 4, prompts, params)
    dec = make_decoder(smollm, draft, k=4, cuda_graphs=True, fused_rounds=True, pipeline_max_batch=pipeline,
                       spec_rounds=2, spec_rounds_min_batch=1)
    free = [a.free_blocks for a in _allocators(dec)]
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    assert [(o.rounds, o.accepted, o.drafted) for o in got] == [(o.rounds, o.accepted, o.drafted) for o in want]
    assert max(o.rounds for o in got) > 1.5 * dec.fused.rounds  # (one graph read every two rounds)
    # the rows' rounds the replays carried: each request's rounds but its eager first one or two (its prefill, the
    # head's first drafts), a round after its EOS inside a replay, and rounds a replay ran past its max_tokens
    f, rounds = dec.fused, sum(o.rounds for o in got)
    assert rounds - 2 * len(got) <= f.row_rounds - f.past_end <= rounds and f.row_rounds % 2 == 0
    if pipeline:
        assert dec.fused.rounds_ahead >= 1 and dec.fused.dropped == 0
    dec.fused.expect(())
    assert [a.free_blocks for a in _allocators(dec)] == free
    assert all(set(a._seqs) <= {PAD_SEQ} for a in _allocators(dec))


def test_each_output_says_how_many_rounds_its_replay_ran(smollm, prompts):
    """A step's output of a replay of two rounds says so (``round_count``: what the verifier reports for the
    gateway's round metrics and spans); a request's outputs add up to its rounds."""
    dec = make_decoder(smollm, "auto", k=4, cuda_graphs=True, fused_rounds=True, pipeline_max_batch=8, spec_rounds=2,
                       spec_rounds_min_batch=1)
    ids = [dec.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(prompts, (15, 24))]
    counts, last = {rid: [] for rid in ids}, {}
    while dec.has_unfinished():
        for o in dec.step():
            counts[o.request_id].append(o.round_count)
            last[o.request_id] = o
    assert all(2 in c for c in counts.values()) and all(set(c) <= {1, 2} for c in counts.values())
    assert [sum(counts[rid]) for rid in ids] == [last[rid].rounds for rid in ids]


@pytest.mark.parametrize("draft,k", [("none", 0), ("auto", 4)])
def test_rounds_launched_ahead_decode_what_the_eager_engine_decodes(smollm, prompts, draft, k):
    # rows leave at different rounds: near its end a row stops taking rounds ahead
    params = [SamplingParams(max_tokens=n + 3 * k, ignore_eos=True) for n in (12, 28, 16)]
    want = make_decoder(smollm, draft, k=k, cuda_graphs=False).generate(prompts, params)
    dec = _pipelined(smollm, draft, k)
    free = [a.free_blocks for a in _allocators(dec)]
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    assert [(o.rounds, o.accepted, o.drafted) for o in got] == [(o.rounds, o.accepted, o.drafted) for o in want]
    f = dec.fused
    # every round but the first was launched ahead (speculating: but the rows' entry into the graph and the last
    # row's final rounds, where it may finish and nothing would outlive them): rows near their end and the rounds
    # after one finished too
    assert f.rounds_ahead >= f.rounds - (1 if k == 0 else 4), (f.rounds, f.rounds_ahead)
    assert f.compacted >= 1 and f.dropped == 0  # rows left the chain as they finished, none thrown away
    dec.fused.expect(())
    assert [a.free_blocks for a in _allocators(dec)] == free  # nothing held past the requests
    assert all(set(a._seqs) <= {PAD_SEQ} for a in _allocators(dec))


def test_arrivals_and_an_abort_leave_the_round_launched_ahead_be(smollm, prompts):
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(max_tokens=28, ignore_eos=True, temperature=0.8, seed=7)
    want = make_decoder(smollm, "auto", k=4, cuda_graphs=False).generate(prompts[:2] + prompts[:1],
                                                                        [greedy, greedy, sampled])
    dec = _pipelined(smollm, "auto", 4)
    free = [a.free_blocks for a in _allocators(dec)]
    first = dec.add_request(prompts[0], greedy)
    tokens = {first: []}
    doomed = None
    for step in range(60):
        if step == 4:  # a greedy and a sampled request arrive while the first runs rounds ahead
            assert dec.fused.ahead.launch is not None and dec.fused.rounds_ahead >= 1
            tokens[dec.add_request(prompts[1], greedy)] = []
            tokens[dec.add_request(prompts[0], sampled)] = []
        if step == 12:  # a fourth comes and is aborted two rounds later
            doomed = dec.add_request(prompts[2], greedy)
        if step == 14:
            assert dec.abort(doomed)
        if not _step(dec, tokens, doomed):
            break
    assert list(tokens.values()) == [o.new_token_ids for o in want]
    # the arrivals' prefills ran beside the round launched ahead and the aborted row left the chain: nothing was
    # launched and then thrown away
    assert dec.fused.dropped == 0 and dec.fused.compacted >= 1
    dec.fused.expect(())
    assert [a.free_blocks for a in _allocators(dec)] == free


def test_sampled_rounds_launched_ahead_decode_what_the_eager_engine_decodes(smollm, prompts):
    """Seeded sampled rows (temperature alone; top-k and top-p) beside a greedy one: a round launched ahead draws
    the coins and drafter noise of the next draw number and verifies the q the round before left on the device."""
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=11),
              SamplingParams(max_tokens=30, ignore_eos=True),
              SamplingParams(max_tokens=27, ignore_eos=True, temperature=1.1, seed=5, top_k=40, top_p=0.9)]
    want = make_decoder(smollm, "auto", k=4, cuda_graphs=False).generate(prompts, params)
    dec = _pipelined(smollm, "auto", 4)
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    assert [(o.rounds, o.accepted, o.drafted) for o in got] == [(o.rounds, o.accepted, o.drafted) for o in want]
    assert dec.fused.rounds_ahead > dec.fused.rounds // 3


def test_blocks_a_round_launched_ahead_holds_stay_until_it_is_read_or_dropped(smollm, prompts):
    dec = _pipelined(smollm, "auto", 4)
    rid = dec.add_request(prompts[2], SamplingParams(max_tokens=64, ignore_eos=True))
    target = dec.target.allocator
    for _ in range(40):  # until the round in flight holds a block past the committed length
        dec.step()
        length = target.length(rid)
        if dec.fused.ahead.launch is not None and len(target.block_table(rid)) > target.blocks_for(length):
            break
    # it may commit every draft: its blocks cover what it writes
    assert len(target.block_table(rid)) > target.blocks_for(length)
    assert len(target.block_table(rid)) * target.block_size >= length + 4 + 1
    dec.fused.expect(())  # e.g. the request is about to run elsewhere
    assert len(target.block_table(rid)) == target.blocks_for(length) and dec.fused.ahead.launch is None
    for _ in range(3):  # and it goes on
        dec.step()
    assert target.length(rid) > length
    assert dec.abort(rid) and rid not in target


def _arrivals(extra: int):
    """Requests arriving one by one: greedy, temperature alone and top-k / top-p (``extra`` tokens more each)."""
    greedy = SamplingParams(max_tokens=20 + extra, ignore_eos=True)
    sampled = SamplingParams(max_tokens=22 + extra, ignore_eos=True, temperature=0.8, seed=3)
    filtered = SamplingParams(max_tokens=18 + extra, ignore_eos=True, temperature=1.1, seed=9, top_k=40, top_p=0.9)
    return greedy, [(0, greedy), (1, sampled), (2, greedy), (0, filtered), (1, greedy)]


def _run_arrivals(dec, graph, prompts, order, greedy, arrive, doomed_at, steps=120) -> list[list[int]]:
    """Steps the decoder while ``order``'s requests arrive at the steps in ``arrive`` and one more arrives at
    ``doomed_at`` and is aborted three rounds later, while it is in the chain -> each arrival's tokens."""
    ids, tokens, doomed = [], {}, None
    for step in range(steps):
        if step in arrive:
            i, params = order[len(ids)]
            ids.append(dec.add_request(prompts[i], params))
            tokens[ids[-1]] = []
        if step == doomed_at:
            doomed = dec.add_request(prompts[2], greedy)
        if step == doomed_at + 3:
            assert doomed in graph.ahead.launch.rows
            assert dec.abort(doomed)
        if not _step(dec, tokens, doomed):
            break
    return [tokens[i] for i in ids]


def _nothing_held(dec, graph, free) -> None:
    graph.expect(())
    assert [a.free_blocks for a in _allocators(dec)] == free
    assert all(set(a._seqs) <= {PAD_SEQ} for a in _allocators(dec))


@pytest.mark.parametrize("draft,k,spec_max_batch,steps,steps_from", [
    ("none", 0, None, 1, 1), ("auto", 4, 1, 1, 1), ("none", 0, None, 3, 1), ("auto", 4, 1, 2, 1),
    ("none", 0, None, 3, 2)])  # rounds of one row one step, of more three: rows go from one graph to the other
def test_arrivals_join_a_plain_chain_of_rounds_launched_ahead(smollm, prompts, draft, k, spec_max_batch, steps,
                                                              steps_from):
    """On a plain graph (no drafter, or requests the batch policy demoted) a request arriving does not break the
    chain: its prompt runs beside the round launched ahead, the round after holds it too (it joins), and every
    request decodes what the eager engine decodes, greedy and seeded sampled, arrivals and an abort among them;
    with rounds of one step and of several (``plain_steps``), and rows moving between the two."""
    greedy, order = _arrivals(0)
    want = eager_outputs(smollm, "none", 0, [prompts[i] for i, _ in order], [p for _, p in order])
    dec = _pipelined(smollm, draft, k, spec_max_batch=spec_max_batch, plain_steps=steps,
                     plain_steps_min_batch=steps_from)
    graph = dec.fused if dec.fused_plain is None else dec.fused_plain
    assert graph.store.steps_for(1) == (steps if steps_from == 1 else 1) and graph.store.steps_for(2) == steps
    free = [a.free_blocks for a in _allocators(dec)]
    # arrivals one at a time, two in a row, while rounds run launched ahead
    got = _run_arrivals(dec, graph, prompts, order, greedy, (0, 3, 4, 9, 10), 6, steps=80)
    assert got == [o.new_token_ids for o in want]
    # every arrival but the first joined the chain; no round was launched and then thrown away
    assert graph.joined >= 4 and graph.dropped == 0, (graph.joined, graph.dropped)
    assert graph.rounds_ahead >= graph.rounds - 2, (graph.rounds, graph.rounds_ahead)
    _nothing_held(dec, graph, free)


@pytest.mark.parametrize("draft,rounds", [("auto", 1), ("ngram", 1), ("auto", 2), ("ngram", 2)])
def test_arrivals_join_a_speculative_chain_of_rounds_launched_ahead(smollm, prompts, draft, rounds):
    """On the speculative graph a request arriving does not break the chain either: its prompt runs beside the round
    launched ahead, the drafter makes its first drafts the round after, and the round launched then holds it (it
    joins, verifying those drafts); greedy and seeded sampled (temperature alone, top-k / top-p) arrivals and an
    abort among them, every request decodes what the eager engine decodes. With ``spec_rounds`` 2 the greedy
    graphs run two rounds a replay (the sampled ones one): rows move between the two as sampled rows come and go."""
    greedy, order = _arrivals(4)
    want = eager_outputs(smollm, draft, 4, [prompts[i] for i, _ in order], [p for _, p in order])
    dec = _pipelined(smollm, draft, 4, spec_rounds=rounds, spec_rounds_min_batch=1)
    assert dec.fused.store.steps_for(1) == rounds and dec.fused.store.steps_for(1, Mode.SAMPLED) == 1
    free = [a.free_blocks for a in _allocators(dec)]
    got = _run_arrivals(dec, dec.fused, prompts, order, greedy, (0, 4, 5, 11, 12), 7)
    assert got == [o.new_token_ids for o in want]
    # every arrival but the first joined the chain; no round was launched and then thrown away
    assert dec.fused.joined >= 5 and dec.fused.dropped == 0, (dec.fused.joined, dec.fused.dropped)
    _nothing_held(dec, dec.fused, free)


@pytest.mark.parametrize("draft", ["auto", "ngram"])
def test_a_primed_drafter_makes_an_arrivals_first_drafts_in_the_round(smollm, prompts, draft):
    """The EAGLE head primes (``Drafter.primes``): an arrival's first round on the speculative graph verifies no
    drafts, the head caught up on its prompt beforehand without drafting, and that round drafts its first k;
    ``propose`` never runs. The n-gram lookup does not prime: its first drafts come from ``propose``. Either way the
    tokens and round counts are the eager engine's."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (12, 20, 16)]
    want = make_decoder(smollm, draft, k=4, cuda_graphs=False).generate(prompts, params)
    dec = _pipelined(smollm, draft, 4)
    calls = {"prime": 0, "propose": 0}  # requests past their prefill handed to each (a prefill round asks too)
    lens = {len(p) for p in prompts}
    for name in calls:
        if hasattr(dec.drafter, name):
            def counted(requests, _f=getattr(dec.drafter, name), _n=name):
                calls[_n] += sum(len(r.token_ids) not in lens for r in requests)
                return _f(requests)
            setattr(dec.drafter, name, counted)
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    assert [(o.rounds, o.accepted, o.drafted) for o in got] == [(o.rounds, o.accepted, o.drafted) for o in want]
    assert dec.scheduler.rows["entered"] == len(prompts)
    assert calls == ({"prime": 3, "propose": 0} if dec.drafter.primes else {"prime": 0, "propose": 3}), calls
