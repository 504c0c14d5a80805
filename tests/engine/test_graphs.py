"""The static, graph-shaped step path (engine/graphs.py) against the paged eager path.

On the CPU the buckets run eagerly (no capture), so these tests check everything a CUDA graph
would hold: the static attention layout, padding rows, bucket choice, buffer reuse. The
captured graphs themselves are checked on the GPU (tests/gpu/test_gpu_graphs.py).
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, SamplingParams
from engine.graphs import PAD_SEQ
from engine.prefill_graphs import OWN_KEYS
from engine.runner import Chunk, ModelRunner
from tests.conftest import make_decoder


# float32 rounding of two attention layouts (whole padded pages vs each row's keys) grows through 30
# layers to ~1e-3 on logits of ~30 where a row has only a few tokens of context (SmolLM2's first
# positions carry very large activations); a wrong mask, slot or position moves them by whole units
LOGIT_TOL = dict(atol=3e-3, rtol=1e-4)


def _runner(smollm, graphs: bool, **kw) -> ModelRunner:
    cfg = EngineConfig(kv_cache_tokens=4096, max_batch_size=8, max_context=1024, cuda_graphs=graphs, **kw)
    return ModelRunner(smollm.model, cfg)


def test_decode_steps_match_the_paged_path_with_padding_rows_and_two_context_buckets(smollm):
    eager, static = _runner(smollm, False), _runner(smollm, True)
    assert static.graphs.batch_buckets == (1, 2, 4, 8) and static.graphs.context_buckets == (512, 1024)
    prompts = {"a": list(range(100, 120)), "b": list(range(300, 305)), "c": list(range(1000, 1000 + 530))}
    for r in (eager, static):
        r.run([Chunk(s, ids) for s, ids in prompts.items()])
    nxt = {s: 7 for s in prompts}
    for step in range(3):
        for seqs in (["a", "b", "c"], ["b"]):  # 3 rows -> bucket 4 (one padding row); 1 row; c needs ctx 1024
            chunks = [Chunk(s, [nxt[s]]) for s in seqs]
            want = eager.run(chunks)
            got = static.run(chunks)
            torch.testing.assert_close(got.logits, want.logits, **LOGIT_TOL)
            assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
            assert torch.allclose(got.hidden, want.hidden, atol=2e-4, rtol=1e-4)
            for s, t in zip(seqs, want.logits.argmax(-1).tolist()):
                nxt[s] = t
    assert {(4, 1, 1024, (), 0), (1, 1, 512, (), 0)} <= set(static.graphs._buckets)


def test_verify_steps_with_aux_features_match_the_paged_path(smollm):
    """q_len = k + 1 tokens per row, all logits and the EAGLE aux features: the target's verify."""
    eager, static = _runner(smollm, False), _runner(smollm, True)
    aux = (1, 14, 26)
    for r in (eager, static):
        r.run([Chunk("a", list(range(100, 140))), Chunk("b", list(range(7, 19))), Chunk("c", [3, 4])])
    for drafts in ([[5, 6, 7, 8, 9], [1, 2, 3, 4, 5], [9, 8, 7, 6, 5]], [[11, 12, 13, 14, 15], [6, 6, 6, 6, 6]]):
        chunks = [Chunk(s, d, num_logits=len(d)) for s, d in zip("abc", drafts)]
        want = eager.run(chunks, aux_layers=aux)
        got = static.run(chunks, aux_layers=aux)
        torch.testing.assert_close(got.logits, want.logits, **LOGIT_TOL)
        assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
        torch.testing.assert_close(got.aux, want.aux, atol=1e-2, rtol=1e-3)  # residual stream: large values
        for r in (eager, static):  # roll back two of the five, as a partly rejected verify would
            for s in "abc"[: len(drafts)]:
                r.truncate(s, r.length(s) - 2)
    assert (4, 5, 512, aux, 0) in static.graphs._buckets and (2, 5, 512, aux, 0) in static.graphs._buckets


def test_steps_the_buckets_do_not_hold_take_the_paged_path(smollm):
    r = _runner(smollm, True)
    r.run([Chunk("x", list(range(10))), Chunk("y", list(range(4)))])  # a prefill: logits of the last only
    assert r.graphs._buckets == {}
    out = r.run([Chunk("x", [5, 6, 7], num_logits=3), Chunk("y", [1], num_logits=1)])  # ragged q_lens
    assert r.graphs._buckets == {} and out.logits.shape[0] == 4
    out = r.run([Chunk("x", list(range(10)), num_logits=10)])  # q_len above max_k + 1
    assert r.graphs._buckets == {} and out.logits.shape[0] == 10
    out = r.run([Chunk("x", [9])])
    assert list(r.graphs._buckets) == [(1, 1, 512, (), 0)] and out.logits.shape[0] == 1


def test_a_lone_prefill_runs_padded_in_a_prefill_bucket_and_matches_the_paged_path(smollm):
    """engine/prefill_graphs.py: one sequence's long chunk padded to a bucket (its padding keys never seen),
    the last num_logits rows through the LM head, every token's aux; the KV it leaves decodes on identically."""
    eager, static = _runner(smollm, False), _runner(smollm, True)
    aux = (1, 14)
    cases = [("a", 0, list(range(100, 105)), 1), ("b", 0, list(range(7, 47)), 1), ("c", 0, list(range(900, 1430)), 1),
             ("d", 0, list(range(200, 220)), 0), ("d", 20, list(range(300, 330)), 3)]  # a prompt in two chunks
    for seq, start, ids, num_logits in cases:
        assert static.length(seq) == start
        want = eager.run([Chunk(seq, ids, num_logits)], aux_layers=aux)
        got = static.run([Chunk(seq, ids, num_logits)], aux_layers=aux)
        assert got.logits.shape == want.logits.shape == (num_logits, smollm.config.vocab_size)
        torch.testing.assert_close(got.logits, want.logits, **LOGIT_TOL)
        assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
        torch.testing.assert_close(got.aux, want.aux, atol=1e-2, rtol=1e-3)
        assert static.length(seq) == eager.length(seq) == start + len(ids)
    # whole prompts attend to their own keys alone (OWN_KEYS); d's second chunk, from position 20, to the cache's
    assert set(static.prefill_graphs._buckets) == {(1, 32, OWN_KEYS, aux, 0), (1, 64, OWN_KEYS, aux, 0),
                                                   (1, 1024, OWN_KEYS, aux, 0), (1, 32, 512, aux, 0)}
    for seq in "abcd":  # the padding wrote no key a later query sees
        want, got = eager.run([Chunk(seq, [5])]), static.run([Chunk(seq, [5])])
        torch.testing.assert_close(got.logits, want.logits, **LOGIT_TOL)
    assert static.prefill_graphs.bucket_for(600, 400, 1, ()) is None  # padded to 512 it would pass the context
    assert static.prefill_graphs.bucket_for(0, 40, 10, ()) is None     # more logits than a bucket keeps


def test_a_round_of_prompts_and_decode_rows_packs_the_prompts_into_prefill_graphs(smollm, monkeypatch):
    """engine/runner.py: a round's prompt chunks packed by length into prefill-graph replays (``PrefillGraphs.pack``, at
    most MAX_GRAPH_PREFILLS replays), the decode rows as one step beside them, the outputs copied out in chunk
    order; a chunk further into its prompt packed beside whole prompts; more replays than that: one batch."""
    import engine.runner

    eager, static = _runner(smollm, False), _runner(smollm, True)
    aux = (1, 14)
    for r in (eager, static):  # two sequences already decoding
        r.run([Chunk("a", list(range(10, 30)))], aux_layers=aux)
        r.run([Chunk("b", list(range(40, 47)))], aux_layers=aux)
    round_ = [Chunk("a", [5, 6, 7], num_logits=3), Chunk("p", list(range(100, 140))),  # a verify row, a prompt
              Chunk("b", [8, 9, 10], num_logits=3), Chunk("q", list(range(300, 380)), num_logits=0),  # a chunk
              Chunk("s", list(range(500, 506)), num_logits=2),
              Chunk("r", list(range(200, 245)), num_logits=2)]
    want = eager.run(round_, aux_layers=aux)
    got = static.run(round_, aux_layers=aux)
    assert got.logits.shape == want.logits.shape == (11, smollm.config.vocab_size)
    torch.testing.assert_close(got.logits, want.logits, **LOGIT_TOL)
    assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
    torch.testing.assert_close(got.hidden, want.hidden, atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(got.aux, want.aux, atol=1e-2, rtol=1e-3)
    # the two lone prompts before (20 and 7 tokens: one row of 32), then the round's four prompts in one replay:
    # four rows of 128 tokens (the longest, q, has 80)
    assert {key[:2] for key in static.prefill_graphs._buckets} == {(1, 32), (4, 128)}
    assert {key[1] for key in static.graphs._buckets} == {3}  # the two verify rows: one uniform step
    # q's second chunk (from position 80) packed beside three new prompts, and the tokens after each
    more = [Chunk("q", list(range(380, 420)), num_logits=1)] + [Chunk(f"n{i}", list(range(i, i + 9 + 7 * i)))
                                                                for i in range(3)]
    torch.testing.assert_close(static.run(more).logits, eager.run(more).logits, **LOGIT_TOL)
    assert (4, 64, 512, (), 0) in static.prefill_graphs._buckets
    nxt = [Chunk(s, [4]) for s in ["a", "b", "p", "q", "s", "r", "n0", "n1", "n2"]]
    torch.testing.assert_close(static.run(nxt).logits, eager.run(nxt).logits, **LOGIT_TOL)
    # nine prompts: a replay of 8 rows and one of 1 (two replays), equal to eager
    nine = [Chunk(f"m{i}", list(range(50 + i, 80 + 3 * i))) for i in range(9)]
    torch.testing.assert_close(static.run(nine).logits, eager.run(nine).logits, **LOGIT_TOL)
    assert (8, 64, OWN_KEYS, (), 0) in static.prefill_graphs._buckets  # whole prompts: their own keys
    # more replays than MAX_GRAPH_PREFILLS: one eager batch, no prefill graph runs
    monkeypatch.setattr(engine.runner, "MAX_GRAPH_PREFILLS", 1)
    monkeypatch.setattr(static.prefill_graphs, "run", None)
    two = [Chunk("t", list(range(60, 960)))] + [Chunk(f"t{i}", list(range(60, 90 + i))) for i in range(8)]  # 2 replays
    torch.testing.assert_close(static.run(two).logits, eager.run(two).logits, **LOGIT_TOL)


def test_prompts_pack_into_the_replays_that_cost_least(smollm):
    """``PrefillGraphs.pack``: many short prompts share one replay, a long one does not pad them to its length, a
    chunk no bucket takes is left out, and the packing's cost (REPLAY_TOKENS a replay + its rows x padded length)
    is the least of every way to cut the chunks, by length, into runs (all of them enumerated)."""
    import itertools
    import random

    from engine.prefill_graphs import PREFILL_MAX_TOKENS, PREFILL_ROWS, REPLAY_TOKENS

    pg = _runner(smollm, True).prefill_graphs  # a context of 1,024
    most = PREFILL_ROWS[-1]

    def cost(groups):
        return sum(REPLAY_TOKENS + key[0] * key[1] for key, _ in groups)

    short = [(0, 20 + i, 1) for i in range(4 * most)]  # 20 .. tokens: full replays of the most rows, by length
    got = pg.pack(short, ())
    assert [m for _, m in got] == [list(range(i, i + most)) for i in range(0, 4 * most, most)]
    assert all(key[0] == most for key, _ in got)
    # short prompts and one of 500 tokens: it does not pad them to its length (it goes alone)
    mixed = [(0, 30, 1)] * 3 + [(0, 500, 1)] + [(0, 40, 1)] * 3
    assert [(key[:2], sorted(m)) for key, m in pg.pack(mixed, ())] == [((8, 64), [0, 1, 2, 4, 5, 6]), ((1, 512), [3])]
    # too short (1 token: a step's), too long for the context, more logits than a bucket keeps: in no replay
    odd = [(0, 1, 1), (0, 3000, 1), (0, 40, 40), (100, 40, 1), (0, 40, 1)]
    assert [(key[:3], m) for key, m in pg.pack(odd, ())] == [((2, 64, 512), [3, 4])]  # one chunk further in: a context
    rng = random.Random(0)
    for _ in range(30):
        rows = [(rng.choice([0, 0, 0, 200]), rng.choice([5, 30, 60, 120, 200, 400, 700, 900]), 1)
                for _ in range(rng.randint(1, 7))]
        got = pg.pack(rows, ())
        alone = [i for i, row in enumerate(rows) if pg.group_for([row], ()) is not None]  # (a start of 200 + 1,024)
        assert sorted(i for _, m in got for i in m) == alone
        assert all(key == pg.group_for([rows[i] for i in m], ()) and key[0] * key[1] <= PREFILL_MAX_TOKENS
                   for key, m in got)
        if not alone:
            assert got == []
            continue
        order = sorted(alone, key=lambda i: rows[i][1])
        least = None
        for cuts in itertools.product([False, True], repeat=len(order) - 1):  # every way to cut the runs
            runs, run = [], [order[0]]
            for i, cut in zip(order[1:], cuts):
                if cut:
                    runs.append(run)
                    run = []
                run.append(i)
            runs.append(run)
            keys = [pg.group_for([rows[i] for i in r], ()) for r in runs]
            if None not in keys:
                c = cost(list(zip(keys, runs)))
                least = c if least is None else min(least, c)
        assert cost(got) == least


def test_the_scratch_block_is_reserved_and_returned_outputs_survive_the_next_step(smollm):
    r = _runner(smollm, True)
    assert PAD_SEQ in r.allocator and r.allocator.length(PAD_SEQ) == 1
    r.run([Chunk("x", list(range(10))), Chunk("y", list(range(20)))])
    first = r.run([Chunk("x", [1])]).logits
    kept = first.clone()
    r.run([Chunk("x", [2])])
    assert torch.equal(first, kept)  # not a view of the bucket's buffer


@pytest.mark.parametrize("draft,k", [("none", 0), ("ngram", 4), ("layerskip:4", 3), ("auto", 4)])
def test_generation_is_identical_with_and_without_the_static_path(smollm, draft, k):
    tok = smollm.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": t}])
               for t in ("List three colors.", "What is 2 + 2? Explain.", "Write a haiku about the sea.")]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    want = make_decoder(smollm, draft, k=k, cuda_graphs=False).generate(prompts, params)
    dec = make_decoder(smollm, draft, k=k, cuda_graphs=True, fused_rounds=False)  # step by step (fused: test_fused_round)
    got = dec.generate(prompts, params)
    if draft != "ngram":  # plain decode steps, and the uniform verifies of a drafter that always drafts k
        assert {key[1] for key in dec.target.graphs._buckets} >= {k + 1}
    assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
