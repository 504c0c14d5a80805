"""SpecDecoder behaviour on the real SmolLM2: batching, per-request k, stop rules, aborts, bad input, seeds."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import SamplingParams
from engine.request import FinishReason
from tests.conftest import make_decoder

N = 24
GREEDY = SamplingParams(max_tokens=N, ignore_eos=True)
TEXTS = ["Name three fruits.", "What is 12 times 12?", "Write one sentence about the sea.",
         "Count from one to ten in words: one, two, three,", "Say hello in Spanish.", "What color is the sky?"]


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


@pytest.fixture(scope="module")
def reference(smollm, prompts):
    """Plain greedy decoding, batched, N tokens each (EOS ignored)."""
    return [o.new_token_ids for o in make_decoder(smollm, "none").generate(prompts, GREEDY)]


def run_all(decoder):
    tokens, final = {}, {}
    while decoder.has_unfinished():
        for o in decoder.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                final[o.request_id] = o
    return tokens, final


def test_requests_join_and_leave_between_rounds(smollm, prompts, reference):
    dec = make_decoder(smollm, "ngram", k=3)
    ids = [dec.add_request(p, GREEDY) for p in prompts[:3]]
    tokens: dict[str, list[int]] = {}
    for _ in range(2):
        for o in dec.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    lengths = [8, 16, N]
    ids += [dec.add_request(p, dataclasses.replace(GREEDY, max_tokens=m)) for p, m in zip(prompts[3:], lengths)]
    more, final = run_all(dec)
    for rid, extra in more.items():
        tokens.setdefault(rid, []).extend(extra)
    for i, rid in enumerate(ids):
        want = reference[i][: (lengths[i - 3] if i >= 3 else N)]
        assert tokens[rid] == want, f"request {i}"
        assert final[rid].finish_reason is FinishReason.LENGTH
    assert not dec.running and dec.target.allocator.free_blocks == dec.target.allocator.num_blocks


def test_per_request_k_in_one_batch(smollm, prompts, reference):
    dec = make_decoder(smollm, "layerskip:4", k=4)
    ks = [0, 1, 3, 4]
    outs = dec.generate(prompts[:4], [dataclasses.replace(GREEDY, k=k) for k in ks])
    for o, ref, k in zip(outs, reference, ks):
        assert o.new_token_ids == ref
        assert (o.drafted == 0) == (k == 0)
        assert o.drafted <= k * o.rounds
    assert outs[0].rounds == N  # k = 0 is plain decoding: one token per round


def test_padded_rounds_change_nothing(smollm, prompts, reference):
    """Rows with different draft counts padded to one (a uniform step that replays a graph on a GPU; forced on
    here): greedy output stays plain greedy's, sampled output and every row's drafted count stay what the
    unpadded round gives."""
    ks = [0, 1, 3, 4]
    greedy = [dataclasses.replace(GREEDY, k=k) for k in ks]
    sampled = [dataclasses.replace(g, temperature=0.8, top_p=0.95, seed=7 + i) for i, g in enumerate(greedy)]
    outs = {}
    for pad in (False, True):
        dec = make_decoder(smollm, "layerskip:4", k=4)
        dec.eager.pad = pad
        outs[pad] = [dec.generate(prompts[:4], params) for params in (greedy, sampled)]
        assert (dec.eager.padded_rounds > 0) == pad
    for o, ref in zip(outs[True][0], reference):
        assert o.new_token_ids == ref
    for padded, plain in zip(sum(outs[True], []), sum(outs[False], [])):
        assert (padded.new_token_ids, padded.drafted, padded.accepted) == (plain.new_token_ids, plain.drafted,
                                                                           plain.accepted)


def test_stops_at_eos(smollm):
    prompt = smollm.tokenizer.encode_chat(
        [{"role": "user", "content": "What is the capital of France? Answer in two sentences."}])
    [o] = make_decoder(smollm, "ngram").generate([prompt], SamplingParams(max_tokens=64))
    plain = make_decoder(smollm, "none").generate([prompt], SamplingParams(max_tokens=64))[0]
    assert o.finish_reason is FinishReason.STOP
    assert o.new_token_ids[-1] in smollm.tokenizer.eos_token_ids
    assert o.new_token_ids == plain.new_token_ids
    assert smollm.tokenizer.decode(o.new_token_ids, skip_special_tokens=True) == o.text_delta


def test_stop_string_cuts_text(smollm, prompts, reference):
    full = smollm.tokenizer.decode(reference[3], skip_special_tokens=True)
    stop = full[12:17]
    assert stop.strip() and full.find(stop) == 12
    [o] = make_decoder(smollm, "ngram", k=4).generate([prompts[3]], dataclasses.replace(GREEDY, stop=(stop,)))
    assert o.finish_reason is FinishReason.STOP
    assert o.text_delta == full[:12]
    assert o.new_token_ids == reference[3][: len(o.new_token_ids)] and len(o.new_token_ids) < N


def test_abort_frees_kv_in_target_and_drafter(smollm, prompts):
    dec = make_decoder(smollm, "layerskip:4", k=3)
    rid = dec.add_request(prompts[0], GREEDY)
    other = dec.add_request(prompts[1], GREEDY)
    dec.step()
    dec.step()
    draft_alloc = dec.drafter.runner.allocator
    assert rid in dec.target.allocator and rid in draft_alloc
    assert dec.abort(rid)
    assert rid not in dec.target.allocator and rid not in draft_alloc
    assert [r.request_id for r in dec.running] == [other]
    run_all(dec)
    assert dec.target.allocator.free_blocks == dec.target.allocator.num_blocks
    assert draft_alloc.free_blocks == draft_alloc.num_blocks
    assert not dec.abort("no-such-request")


@pytest.mark.parametrize("prompt, params, field", [
    ([], GREEDY, "prompt"),
    ([1, 2, 49152], GREEDY, "prompt"),
    ([1, -3], GREEDY, "prompt"),
    ([1] * 8192, GREEDY, "prompt"),
    ([1, 2, 3], dataclasses.replace(GREEDY, k=9), "k"),
    ([1, 2, 3], dataclasses.replace(GREEDY, max_tokens=8000), "max_tokens"),
])
def test_bad_requests_name_the_field(smollm, prompt, params, field):
    dec = make_decoder(smollm, "ngram", kv_cache_tokens=4096)
    good = dec.add_request([1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match=f"^{field}:"):
        dec.add_request(prompt, params)
    assert [r.request_id for r in dec.waiting] == [good]  # nothing else disturbed


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"max_tokens": 0}, "max_tokens"), ({"k": -1}, "k"), ({"stop": ("",)}, "stop"),
])
def test_sampling_params_validation(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("draft", ["ngram", "layerskip:4"])
def test_seeded_sampling_is_reproducible(smollm, prompts, draft):
    params = SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    alone = make_decoder(smollm, draft, k=3).generate([prompts[2]], params)[0].new_token_ids
    again = make_decoder(smollm, draft, k=3).generate([prompts[2]], params)[0].new_token_ids
    other_seed = make_decoder(smollm, draft, k=3).generate(
        [prompts[2]], dataclasses.replace(params, seed=99))[0].new_token_ids
    assert alone == again
    assert alone != other_seed
    assert len(alone) == 16


def test_resumed_output_ending_inside_a_character_streams_no_text_twice(smollm):
    """Output moved from a lost verifier may end inside a multi-byte character: the new verifier's text
    deltas continue exactly where the client's text stopped."""
    tok = smollm.tokenizer
    split = tok.encode("Hello 🦙 llama", add_special_tokens=False)
    first = tok.encode("Hello", add_special_tokens=False)
    cut = len(first) + 2  # " " + the first bytes of the emoji: a character still open
    assert tok.decode(split[:cut]).endswith("\ufffd")
    dec = make_decoder(smollm, "none")
    prompt = tok.encode_chat([{"role": "user", "content": "Say hello to a llama."}])
    r = dec.start(prompt, SamplingParams(max_tokens=40, ignore_eos=True), "moved", output_ids=split[:cut])
    from engine.tokenizer import IncrementalDecoder

    streamed = IncrementalDecoder(tok, skip_special_tokens=True)  # what the old verifier sent, token by token
    for t in split[:cut]:
        streamed.push([t])
    assert r.text == streamed.text and streamed.text.startswith("Hello")
    kept, delta = r.commit(split[cut:])  # the rest, as if the target had produced it
    assert streamed.text + delta == "Hello 🦙 llama"


def test_arrivals_gathered_start_together_and_decode_the_same(smollm, prompts, reference):
    # admit_group 3 while 2 or more run: a lone arrival waits (at most 2 rounds); three start in one round
    dec = make_decoder(smollm, "auto", k=4, cuda_graphs=True, fused_rounds=True, pipeline_max_batch=8,
                       admit_group=3, admit_group_min_batch=2)
    tokens: dict[str, list[int]] = {}

    def step() -> set[str]:
        out = dec.step()
        for o in out:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        return {o.request_id for o in out}

    ids = [dec.add_request(p, GREEDY) for p in prompts[:2]]
    step()
    step()
    ids.append(dec.add_request(prompts[2], GREEDY))
    assert ids[2] not in step() and dec.scheduler.held == 1  # one waiting of a group of 3: held
    ids += [dec.add_request(p, GREEDY) for p in prompts[3:5]]
    assert set(ids[2:5]) <= step() and not dec.waiting  # three: they start (and prefill) together
    ids.append(dec.add_request(prompts[5], GREEDY))
    first = [ids[5] in step() for _ in range(3)]
    assert first == [False, False, True]  # alone, it waits group - 1 rounds, then starts
    more, final = run_all(dec)
    for rid, extra in more.items():
        tokens.setdefault(rid, []).extend(extra)
    assert [tokens[rid] for rid in ids] == reference
    assert all(final[rid].finish_reason is FinishReason.LENGTH for rid in ids)


def test_arrivals_are_not_held_below_the_group_batch(smollm, prompts):
    dec = make_decoder(smollm, "none", k=0, admit_group=4, admit_group_min_batch=3)
    first = dec.add_request(prompts[0], GREEDY)
    dec.step()
    second = dec.add_request(prompts[1], GREEDY)  # one request runs, fewer than 3: no gathering
    assert {o.request_id for o in dec.step()} == {first, second} and dec.scheduler.held == 0
