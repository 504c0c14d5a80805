"""Mixed prefill and decode: a per-round token budget, prompts prefilled in chunks next to running streams."""

from __future__ import annotations

import pytest

from engine.config import SamplingParams
from tests.conftest import make_decoder

TEXTS = ["Write a long story about a lighthouse keeper who finds a message in a bottle. " * 3,
         "Hi!", "Explain in detail how a bicycle gear system works, with examples. " * 2, "Name a color."]
BUDGET = 32


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


@pytest.mark.parametrize("draft", ["ngram", "auto"])
def test_chunked_prefill_keeps_greedy_output(smollm, prompts, draft):
    assert max(len(p) for p in prompts) > 2 * BUDGET  # some prompts take several rounds to prefill
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    want = make_decoder(smollm, "none").generate(prompts, params)
    got = make_decoder(smollm, draft, k=3, max_round_tokens=BUDGET).generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]


def test_chunked_prefill_keeps_seeded_sampled_output(smollm, prompts):
    params = [SamplingParams(max_tokens=16, temperature=0.9, top_k=50, seed=10 + i) for i in range(len(prompts))]
    whole = make_decoder(smollm, "ngram", k=3).generate(prompts, params)
    chunked = make_decoder(smollm, "ngram", k=3, max_round_tokens=BUDGET).generate(prompts, params)
    assert [o.new_token_ids for o in chunked] == [o.new_token_ids for o in whole]


def test_arrivals_do_not_stall_running_streams(smollm, prompts):
    dec = make_decoder(smollm, "ngram", k=2, max_round_tokens=BUDGET)
    sizes = []
    run = dec.target.run
    dec.target.run = lambda chunks, **kw: (sizes.append(sum(len(c.token_ids) for c in chunks)), run(chunks, **kw))[1]
    short = dec.add_request(prompts[3], SamplingParams(max_tokens=40, ignore_eos=True))
    while not dec.requests.get(short) or dec.unseen(dec.requests[short]) > 1:
        dec.step()
    sizes.clear()
    long_id = dec.add_request(prompts[0], SamplingParams(max_tokens=4, ignore_eos=True))
    rounds_to_first_token = 0
    while True:
        outs = {o.request_id: o for o in dec.step()}
        assert short in outs  # the running stream commits tokens in every round
        rounds_to_first_token += 1
        if long_id in outs:
            break
    assert rounds_to_first_token >= len(prompts[0]) // BUDGET  # the long prompt really went in chunks
    assert max(sizes) <= BUDGET  # no forward over the budget (drafts included)
