"""Uniform steps through captured CUDA graphs (engine/graphs.py) on the GPU: plain decode and verify.

In float32 with the torch attention on both sides, the captured path must decode exactly
what the eager paged path decodes; a replay must agree with running the same bucket
uncaptured (to float32 rounding: cuBLAS may pick other kernels under capture); and speculative
decoding whose verifies (k + 1 tokens, with the aux features for EAGLE) and drafter steps go
through the graphs must still equal plain greedy decoding.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import SamplingParams
from engine.runner import Chunk
from tests.conftest import make_decoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)
TEXTS = ["Hi!", "List the first ten prime numbers, separated by commas.",
         "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
         "Summarize the plot of Romeo and Juliet in five bullet points.",
         "Explain recursion to a child.", "What is the capital of Australia? Answer in one sentence."]


@pytest.fixture(scope="module")
def prompts(f32):
    return [f32.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]


def _decoder(model, draft, k, graphs, fused=False):
    return make_decoder(model, draft, k=k, device="cuda", dtype="float32", attention="torch", cuda_graphs=graphs,
                        fused_rounds=fused)


def test_captured_plain_decode_equals_eager(f32, prompts):
    eager = _decoder(f32, "none", 0, False).generate(prompts, GREEDY)
    dec = _decoder(f32, "none", 0, True)
    got = dec.generate(prompts, GREEDY)
    assert dec.target.graphs.num_captured >= 1
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in eager]
    one = dec.generate(prompts[:1], GREEDY)  # batch bucket 1
    assert one[0].new_token_ids == eager[0].new_token_ids


def test_replay_agrees_with_the_uncaptured_bucket(f32):
    dec = _decoder(f32, "none", 0, True)
    r = dec.target
    r.run([Chunk("a", list(range(50, 90))), Chunk("b", list(range(7, 12)))])
    got = r.run([Chunk("a", [11]), Chunk("b", [12])]).logits
    (bucket,) = r.graphs._buckets.values()
    assert bucket.graph is not None
    with torch.inference_mode():
        r.graphs._forward(bucket)  # the same kernels, launched one by one, on the same buffers
    want = bucket.logits[:2]
    assert torch.allclose(got, want, atol=1e-3, rtol=1e-4), (got - want).abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("draft", ["layerskip:4", "ngram", "auto"])
def test_speculative_with_graphs_equals_plain_greedy(f32, prompts, draft):
    plain = _decoder(f32, "none", 0, False).generate(prompts, GREEDY)
    spec = _decoder(f32, draft, 4, True).generate(prompts, GREEDY)
    assert [o.new_token_ids for o in spec] == [o.new_token_ids for o in plain]


@pytest.mark.parametrize("draft", ["layerskip:4", "auto"])
def test_rows_padded_to_one_draft_count_replay_the_verify_graph(f32, prompts, draft):
    """Eager rounds whose rows draft different counts (per-request k 0..4; a drafter service's drafts arrive so)
    are padded to one, replay the step graph of q_len k + 1 (with the head's features for EAGLE) and still equal
    plain greedy decoding."""
    import dataclasses

    plain = _decoder(f32, "none", 0, False).generate(prompts, GREEDY)
    dec = _decoder(f32, draft, 4, True)
    params = [dataclasses.replace(GREEDY, k=k) for k in (0, 1, 3, 4, 2, 4)]
    spec = dec.generate(prompts, params)
    assert [o.new_token_ids for o in spec] == [o.new_token_ids for o in plain]
    assert dec.eager.padded_rounds > 0
    assert any(key[1] == 5 for key in dec.target.graphs._buckets), "no verify graph of q_len 5 was replayed"


@pytest.mark.parametrize("draft,k", [("none", 0), ("auto", 4), ("layerskip:6", 3), ("ngram", 4)])
def test_fused_rounds_captured_equal_plain_greedy(f32, prompts, draft, k):
    """One graph per round (verify, accept, the drafter's catch-up and next drafts: the EAGLE head, or a draft
    LM, here the layer-skip one, or the n-gram lookup on the device), replayed."""
    plain = _decoder(f32, "none", 0, False).generate(prompts, GREEDY)
    dec = _decoder(f32, draft, k, True, fused=True)
    got = dec.generate(prompts, GREEDY)
    assert dec.fused.store.num_captured >= 1
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    if k:
        eager = _decoder(f32, draft, k, False).generate(prompts, GREEDY)
        # the drafts made inside the graph are the eager drafter's, up to float32 near-ties
        assert abs(sum(o.accepted for o in got) - sum(o.accepted for o in eager)) <= 2


@pytest.mark.parametrize("draft,k", [("none", 0), ("auto", 4), ("ngram", 4)])
def test_rounds_launched_ahead_equal_plain_greedy(f32, prompts, draft, k):
    """With graphs the next fused round is launched before the host reads this one (``pipeline_max_batch``, 64 by
    default), its inputs chained on the GPU, its output copied to pinned memory. Rows leave at different rounds
    (max_tokens, EOS) and leave the chain (the live rows' buffers compacted on the GPU, into a smaller bucket's
    graph where one is captured), then one request runs alone: greedy output equals plain decoding, and
    pipelining off decodes the same."""
    params = [SamplingParams(max_tokens=16 + 9 * i, ignore_eos=i % 2 == 0) for i in range(len(prompts))]
    plain = _decoder(f32, "none", 0, False).generate(prompts, params)
    dec = _decoder(f32, draft, k, True, fused=True)
    # plain: 4 tokens a round; speculative: two rounds a replay (from 16 rows: these take one)
    assert dec.fused.store.pipeline_rows == 64 and dec.fused.store.steps == (4 if k == 0 else 2)
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    alone = dec.generate(prompts[1:2], params[-1])
    assert alone[0].new_token_ids == _decoder(f32, "none", 0, False).generate(prompts[1:2], params[-1])[0].new_token_ids
    assert dec.fused.rounds_ahead > dec.fused.rounds // 3
    assert dec.fused.compacted >= 1
    off = make_decoder(f32, draft, k=k, device="cuda", dtype="float32", attention="torch", pipeline_max_batch=0)
    assert [o.new_token_ids for o in off.generate(prompts, params)] == [o.new_token_ids for o in plain]
    assert off.fused.rounds_ahead == 0


@pytest.mark.parametrize("draft", ["auto", "ngram"])
@pytest.mark.parametrize("pipeline", [64, 0])
def test_captured_replays_of_two_rounds_equal_plain_greedy(f32, prompts, draft, pipeline):
    """``spec_rounds`` 2: each captured greedy replay runs two whole rounds, the second on the first's drafts, with
    the next replay launched ahead or not; rows end at different rounds (max_tokens, EOS), inside a replay too."""
    params = [SamplingParams(max_tokens=16 + 9 * i, ignore_eos=i % 2 == 0) for i in range(len(prompts))]
    plain = _decoder(f32, "none", 0, False).generate(prompts, params)
    dec = make_decoder(f32, draft, k=4, device="cuda", dtype="float32", attention="torch", pipeline_max_batch=pipeline,
                       spec_rounds=2, spec_rounds_min_batch=1)
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    assert dec.fused.store.num_captured >= 1 and all(g.steps == 2 for g in dec.fused.store.graphs.values())
    assert max(o.rounds for o in got) > 1.5 * dec.fused.rounds  # (one graph read every two rounds)
    if pipeline:
        assert dec.fused.rounds_ahead > dec.fused.rounds // 3


def test_captured_prompt_buckets_take_a_round_of_new_prompts_without_a_capture(f32, prompts):
    """SpecDecoder.capture_prefills builds the prefill graph of every whole-prompt length up front; a round of
    several new prompts then runs each through its graph (engine/runner.py) and captures nothing, and greedy
    output equals the engine without graphs."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    want = _decoder(f32, "none", 0, False).generate(prompts, params)
    dec = _decoder(f32, "none", 0, True, fused=True)
    n = dec.capture_prefills()
    assert n == dec.target.prefill_graphs.num_captured >= 4
    got = dec.generate(prompts, params)
    assert dec.target.prefill_graphs.num_captured == n
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]


def test_the_heads_first_drafts_run_in_its_own_captured_graphs(f32, prompts):
    """Before a request's first fused round the EAGLE head catches up over its prompt and drafts eagerly
    (``EagleDrafter.propose``); those forwards take a feature row per token and run in the head's own
    captured prefill and step graphs (``SpecDecoder.capture_prefills`` captures its prompt buckets up
    front). Greedy output equals plain greedy decoding, no prefill graph is captured while serving, and the
    drafts are the eager drafter's (acceptance within float32 near-ties)."""
    plain = _decoder(f32, "none", 0, False).generate(prompts, GREEDY)
    dec = _decoder(f32, "auto", 4, True, fused=True)
    dec.capture_prefills()
    head = dec.drafter.runner
    captured = head.prefill_graphs.num_captured
    assert captured >= 4
    got = dec.generate(prompts, GREEDY)
    assert head.prefill_graphs.num_captured == captured and head.graphs.num_captured >= 1
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in plain]
    eager = _decoder(f32, "auto", 4, False).generate(prompts, GREEDY)
    assert abs(sum(o.accepted for o in got) - sum(o.accepted for o in eager)) <= 2


def test_the_drafter_service_warm_up_captures_the_heads_prompt_graphs(f32):
    """drafter_svc's warm-up captures the head's prompt catch-up graphs before requests; a split drafter's
    catch-up over a new prompt then replays one instead of capturing it."""
    from drafter_svc.main import warm_up
    from drafter_svc.service import DraftItem, DrafterEngine
    from engine.config import EngineConfig
    from engine.drafters import DraftSpec, build_drafter

    config = EngineConfig(device="cuda", dtype="float32", attention="torch", kv_cache_tokens=8192, k=4)
    engine = DrafterEngine(build_drafter(DraftSpec.parse("auto"), f32, config), f32.config.vocab_size, 8)
    warm_up(engine)
    pg = engine.drafter.runner.prefill_graphs
    captured = pg.num_captured
    assert captured >= 4
    prompt = list(range(100, 160))
    feats = torch.randn(len(prompt) - 1, engine.feature_size, device="cuda")
    [d] = engine.draft([DraftItem("r", 0, prompt, 4, GREEDY, feats, 0)])
    assert len(d.tokens) == 4 and pg.num_captured == captured


def test_a_servers_round_graphs_are_captured_before_requests_arrive(f32):
    """``capture_rounds`` (the co-located verifier's warm-up) builds the round graphs of every batch size the
    batch policy uses; requests arriving and leaving at sizes 1 .. 16 then capture nothing new."""
    dec = make_decoder(f32, "auto", k=4, max_batch_size=16, device="cuda", dtype="float32", attention="torch",
                       spec_max_batch=3)
    built = dec.capture_rounds()
    assert built == len(dec.fused.store.graphs) + len(dec.fused_plain.store.graphs) > 0
    before = dec.fused.store.num_captured + dec.fused_plain.store.num_captured
    prompts = [f32.tokenizer.encode(t) for t in ("def f(x):", "Hello", "import os", "The sky", "x = 1")]
    for n in (1, 3, 5, 16):  # the speculative graph's sizes, then the plain graph's
        dec.generate([prompts[i % len(prompts)] for i in range(n)],
                     SamplingParams(max_tokens=24, ignore_eos=True))
    assert dec.fused.store.num_captured + dec.fused_plain.store.num_captured == before


def test_n_gram_requests_demoted_by_load_speculate_again_on_the_graphs(f32, prompts):
    """On captured graphs with rounds launched ahead: six n-gram requests weigh 30 against ``spec_max_batch`` 15 and
    decode plainly; once four short ones finished the two left weigh 10 (room for one more) and enter the speculative
    graph (the lookup catches up from their tokens); every request decodes what plain greedy decoding does and no KV
    block is left."""
    params = [SamplingParams(max_tokens=64 if i < 2 else 12, ignore_eos=True) for i in range(len(prompts))]
    want = _decoder(f32, "none", 0, False).generate(prompts, params)
    dec = make_decoder(f32, "ngram", k=4, device="cuda", dtype="float32", attention="torch", spec_max_batch=15)
    assert dec.scheduler.rejoins and dec.fused_plain is not None
    free = dec.target.allocator.free_blocks
    got = dec.generate(prompts, params)
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
    assert dec.scheduler.rows["demoted"] > 0 and dec.scheduler.rows["entered"] >= 2, dec.scheduler.rows
    assert all(o.drafted > 0 for o in got[:2]) and not any(o.drafted for o in got[2:])
    assert dec.target.allocator.free_blocks == free and not dec.requests
