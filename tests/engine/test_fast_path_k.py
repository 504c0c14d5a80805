"""No silent exits from the fast path (engine/scheduler.py, engine/rounds/), here run eagerly on the CPU.

A request whose k is not the speculative graph's rides the graph all the same: k below it verifies only its
first k drafts of the graph's (greedy and seeded sampled output unchanged, round for round the eager
engine's), k above it is capped at the graph's k (output unchanged, only speed), k 0 rides the plain graph
where there is one, else the speculative graph verifying no drafts. Every remaining reason a decoding request
runs an eager round is counted by reason (``SpecDecoder.fast_path_exits``) and logged once per request.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from engine.config import SamplingParams
from tests.conftest import make_decoder

TEXTS = ("List three colors.", "Write a Python function that returns the n-th Fibonacci number.")
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


@pytest.fixture(scope="module")
def plain(smollm, prompts):
    """The eager engine's plain greedy decoding: what every k must decode."""
    return [o.new_token_ids for o in make_decoder(smollm, "none", k=0, cuda_graphs=False).generate(prompts, GREEDY)]


def _fused(smollm, **kw):
    dec = make_decoder(smollm, "auto", k=4, cuda_graphs=True, fused_rounds=True, **kw)
    assert dec.fused is not None and dec.fused.k == 4
    return dec


@pytest.mark.parametrize("k", [2, 6])
def test_a_request_with_another_k_than_the_graph_stays_on_the_fast_path(smollm, prompts, plain, k):
    dec = _fused(smollm)
    ids = [dec.add_request(p, dataclasses.replace(GREEDY, k=k)) for p in prompts]
    tokens, drafted = {i: [] for i in ids}, {i: [] for i in ids}
    while dec.has_unfinished():
        for o in dec.step():
            tokens[o.request_id] += o.new_token_ids
            drafted[o.request_id].append(o.round_drafted)
    assert list(tokens.values()) == plain
    assert not dec.fast_path_exits  # prefill and the first drafts are the way in, not exits
    # after its prefill (eager, its own k) a request verifies its k of the graph's drafts, capped at the graph's
    assert all(max(d[1:]) == min(k, dec.fused.k) for d in drafted.values()), drafted
    assert dec.fused.rounds == max(len(d) for d in drafted.values()) - 1  # every round after the prefills
    assert sum(map(sum, drafted.values())) > 0


def test_a_seeded_sampled_request_with_a_smaller_k_decodes_what_the_eager_engine_decodes(smollm, prompts):
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=7, k=2),
              SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.1, seed=3, top_k=40, top_p=0.9, k=3)]
    want = make_decoder(smollm, "auto", k=4, cuda_graphs=False).generate(prompts, params)
    runs = []
    for _ in range(2):
        dec = _fused(smollm)
        runs.append(dec.generate(prompts, params))
        assert not dec.fast_path_exits and dec.fused.rounds > 0
    for got in runs:  # reproducible, and the eager engine's output, round for round
        assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
        assert [(o.rounds, o.accepted, o.drafted) for o in got] == [(o.rounds, o.accepted, o.drafted) for o in want]


@pytest.mark.parametrize("spec_max_batch", [None, 3])
def test_a_request_with_k_0_rides_a_graph(smollm, prompts, plain, spec_max_batch):
    """k 0 beside a k 4 request: the plain graph where the batch policy built one, else the speculative graph
    verifying no drafts."""
    dec = _fused(smollm, spec_max_batch=spec_max_batch)
    got = dec.generate(prompts, [dataclasses.replace(GREEDY, k=0), GREEDY])
    assert [o.new_token_ids for o in got] == plain and not dec.fast_path_exits
    assert got[0].drafted == 0 and got[0].rounds == GREEDY.max_tokens and got[1].accepted > 0
    on_plain = dec.fused_plain is not None and dec.fused_plain.rounds > 0
    assert on_plain == (spec_max_batch is not None)


def test_rounds_launched_ahead_carry_a_smaller_k_and_drop_when_it_changes(smollm, prompts, plain):
    """Launched ahead, a round verifies the k its row had; a caller (co-located Step) that changes a request's k
    between rounds gets a round of that k (the one launched ahead is dropped). Its first round after the prefill
    verifies none: the EAGLE head is primed and that round drafts."""
    dec = _fused(smollm, pipeline_max_batch=8)
    rid = dec.add_request(prompts[1], GREEDY)
    [o] = dec.step()  # admitted and prefilled
    r, tokens, rounds = dec.requests[rid], list(o.new_token_ids), 0
    while dec.has_unfinished():
        k = 2 if rounds < 6 or rounds % 3 else 3
        want = min(k, r.room() - 1) if rounds else 0
        [o] = dec.decode_round([r], [k])
        assert o.round_drafted == want
        tokens += o.new_token_ids
        rounds += 1
    assert tokens == plain[1]
    assert dec.fused.rounds_ahead > 0 and dec.fused.dropped > 0 and not dec.fast_path_exits


def test_an_exit_is_counted_by_reason_and_logged_once(smollm, prompts, caplog):
    """A request near the end of its context leaves the fast path (no room for a graph round): every eager round
    it then runs counts under context_full; the log says so once, at DEBUG."""
    prompt = prompts[1]
    ctx = len(prompt) + 30
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    want = make_decoder(smollm, "none", k=0, cuda_graphs=False, max_context=ctx).generate([prompt], params)
    dec = _fused(smollm, max_context=ctx)
    with caplog.at_level(logging.DEBUG, logger="tandem.engine"):
        [got] = dec.generate([prompt], params)
    assert got.new_token_ids == want[0].new_token_ids and dec.fused.rounds > 0
    assert set(dec.fast_path_exits) == {"context_full"} and dec.fast_path_exits["context_full"] >= 1
    logged = [rec for rec in caplog.records if rec.name == "tandem.engine" and "fast path" in rec.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.DEBUG and "context_full" in logged[0].getMessage()


def test_a_drafter_without_graph_rounds_is_an_exit(smollm, prompts, plain):
    from engine.config import EngineConfig
    from engine.drafters.ngram import NgramDrafter
    from engine.factory import decoder_for

    config = EngineConfig(kv_cache_tokens=8192, k=3, max_k=8, cuda_graphs=True, fused_rounds=True)
    host_only = NgramDrafter()  # no token history on the device: it drafts on the host only
    dec = decoder_for(smollm, config, host_only)
    assert dec.fused is None
    [got] = dec.generate(prompts[:1], GREEDY)
    assert got.new_token_ids == plain[0]
    assert dict(dec.fast_path_exits) == {"drafter_without_graph": got.rounds - 1}  # every round but its prefill


def test_the_plain_graphs_a_sampled_load_falls_to_are_built_up_front(smollm):
    """``capture_rounds`` builds the plain graph wherever a load can pass ``spec_max_batch``: four greedy requests
    never pass a limit of 4, four sampled ones (weighing 2 each) do, and decode plainly in graphs built before
    requests arrive (not captured mid-run)."""
    from engine.rounds.graph_sampling import Mode

    dec = _fused(smollm, max_batch_size=4, spec_max_batch=4)
    dec.capture_rounds(modes=[Mode.GREEDY])
    assert dec.fused.store.graphs and not dec.fused_plain.store.graphs
    dec.capture_rounds(modes=[Mode.SAMPLED])
    assert {rows for rows, _, _ in dec.fused_plain.store.graphs} == {1, 2, 4}
