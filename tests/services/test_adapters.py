"""The engine sides of the drafter and verifier services, without gRPC, on the real SmolLM2."""

from __future__ import annotations

import pytest
import torch

from drafter_svc.service import DrafterEngine, DraftItem, ResyncNeeded
from engine.config import EngineConfig, SamplingParams
from engine.drafters import DraftSpec, build_drafter
from engine.drafters.ngram import NgramDrafter
from engine.spec import CapacityError, RoundItem
from rpc import convert
from tests.conftest import make_decoder
from verifier_svc.service import PrefillItem, VerifierEngine

GREEDY = SamplingParams(max_tokens=24, ignore_eos=True, seed=1)


def test_drafter_history_append_rollback_and_resync():
    eng = DrafterEngine(NgramDrafter(max_n=2), vocab_size=100, max_k=4)
    assert eng.capture_prefills() == 0  # n-gram: no graphs to capture at warm-up
    [r] = eng.draft([DraftItem("a", 0, [5, 6, 7, 5, 6], 2, GREEDY)])
    assert r.tokens == [7, 5] and r.probs is None
    [r] = eng.draft([DraftItem("a", 5, [9], 2, GREEDY)])           # append
    assert eng.histories["a"] == [5, 6, 7, 5, 6, 9]
    [r] = eng.draft([DraftItem("a", 3, [1, 2], 2, GREEDY)])        # roll back speculative history
    assert eng.histories["a"] == [5, 6, 7, 1, 2]
    [r] = eng.draft([DraftItem("b", 4, [1], 2, GREEDY)])           # never seen: history lost
    assert isinstance(r, ResyncNeeded)
    results = eng.draft([DraftItem("a", 5, [3], 9, GREEDY), DraftItem("c", 0, [1, 200], 2, GREEDY),
                         DraftItem("d", 0, [1, 2, 1], 1, GREEDY), DraftItem("d", 3, [2], 1, GREEDY)])
    assert [type(r).__name__ for r in results] == ["ValueError", "ValueError", "Draft", "ValueError"]
    assert "k:" in str(results[0]) and "tokens:" in str(results[1]) and "twice" in str(results[3])
    assert eng.release(["a", "d", "zzz"]) == 2 and not eng.histories


def test_sampled_drafts_come_from_the_top_m_distribution_they_send(smollm):
    config = EngineConfig(kv_cache_tokens=2048, draft_top_m=8)
    eng = DrafterEngine(build_drafter(DraftSpec.parse("layerskip:4"), smollm, config), smollm.config.vocab_size, 8)
    prompt = smollm.tokenizer.encode_chat([{"role": "user", "content": "Write a poem about autumn."}])
    sampled = SamplingParams(temperature=1.0, seed=3)
    r_s, r_g = eng.draft([DraftItem("s", 0, prompt, 4, sampled), DraftItem("g", 0, prompt, 4, GREEDY)])
    assert r_g.probs is None and len(r_g.tokens) == 4
    q = r_s.probs
    assert q.shape == (4, smollm.config.vocab_size)
    assert ((q > 0).sum(-1) <= 8).all() and torch.allclose(q.sum(-1), torch.ones(4))
    assert all(q[i, t] > 0 for i, t in enumerate(r_s.tokens))
    # across the wire and back: the same dense distribution, validated
    wire = convert.draft_probs_to_pb(q, 8)
    torch.testing.assert_close(convert.draft_probs_from_pb(wire, r_s.tokens, smollm.config.vocab_size), q)
    # greedy drafts equal the in-process layer-skip drafter's
    skip = make_decoder(smollm, "layerskip:4", k=4).drafter
    from engine.drafters.base import DraftRequest

    assert skip.propose([DraftRequest("x", prompt, 4, GREEDY)]).token_ids[0] == r_g.tokens


def test_verifier_rounds_with_external_drafts_equal_plain(smollm):
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}])
               for t in ("Count to five.", "Name two oceans.")]
    ref = [o.new_token_ids for o in make_decoder(smollm, "none").generate(prompts, GREEDY)]
    eng = VerifierEngine(make_decoder(smollm, "none", k=3))
    outs = eng.prefill([PrefillItem("a", prompts[0], [], GREEDY), PrefillItem("b", prompts[1], [], GREEDY)])
    got = {"a": list(outs[0].new_token_ids), "b": list(outs[1].new_token_ids)}
    while eng.decoder.requests:
        items = []
        for rid, i in (("a", 0), ("b", 1)):
            if rid in eng.decoder.requests:
                n = len(got[rid])
                # drafts: the right answer for "a" (all accepted), a wrong one for "b" (rejected)
                drafts = ref[i][n:n + 3] if rid == "a" else [0, 0]
                r = eng.decoder.requests[rid]
                items.append(RoundItem(rid, drafts[: eng.decoder.draft_len(r, 3)]))
        for it, o in zip(items, eng.verify(items)):
            got[it.request_id] += o.new_token_ids
    assert got["a"] == ref[0] and got["b"] == ref[1]


def test_verifier_item_errors_leave_the_batch_running(smollm):
    eng = VerifierEngine(make_decoder(smollm, "none", k=2, max_batch_size=2))
    p = smollm.tokenizer.encode("Hello there")
    res = eng.prefill([PrefillItem("a", p, [], GREEDY), PrefillItem("b", [], [], GREEDY),
                       PrefillItem("a", p, [], GREEDY)])
    assert not isinstance(res[0], Exception)
    assert isinstance(res[1], ValueError) and str(res[1]).startswith("prompt:")
    assert isinstance(res[2], ValueError) and "already in use" in str(res[2])
    res = eng.verify([RoundItem("a", [1, 2]), RoundItem("nope", []), RoundItem("a", []),
                      RoundItem("a", list(range(9)))])
    assert not isinstance(res[0], Exception)
    assert isinstance(res[1], KeyError) and isinstance(res[2], ValueError)
    assert eng.prefill([PrefillItem("c", p, [], GREEDY)])[0].__class__ is not CapacityError
    assert isinstance(eng.prefill([PrefillItem("d", p, [], GREEDY)])[0], CapacityError)  # batch of 2 is full
    assert eng.release(["a", "c", "zzz"]) == 2
    assert eng.stats() == {"running": 0, "kv_blocks_used": 0, "kv_blocks_total": eng.stats()["kv_blocks_total"]}


def test_reprefill_with_committed_output_continues_exactly(smollm):
    """A request moved to another verifier (prompt + output so far) continues with the same tokens."""
    prompt = smollm.tokenizer.encode_chat([{"role": "user", "content": "Describe a forest."}])
    ref = make_decoder(smollm, "none").generate([prompt], GREEDY)[0]
    eng = VerifierEngine(make_decoder(smollm, "ngram", k=3))
    done = ref.new_token_ids[:10]
    [o] = eng.prefill([PrefillItem("r", prompt, done, GREEDY)])
    out = done + o.new_token_ids
    while "r" in eng.decoder.requests:
        [o] = eng.step(["r"], [3])
        out += o.new_token_ids
    assert out == ref.new_token_ids
    assert o.text_delta == "" or ref.text_delta.endswith(o.text_delta)


def _colocated(decoder, prompts, params, ks) -> dict[str, list[int]]:
    """Prefill then Step every request to its end; outputs must follow the items (stepped in reverse order)."""
    eng = VerifierEngine(decoder)
    ids = list(ks)
    outs = eng.prefill([PrefillItem(i, p, [], sp) for i, p, sp in zip(ids, prompts, params)])
    got = {i: list(o.new_token_ids) for i, o in zip(ids, outs)}
    while eng.decoder.requests:
        run = [i for i in ids if i in eng.decoder.requests][::-1]
        for rid, o in zip(run, eng.step(run, [ks[i] for i in run])):
            assert o.request_id == rid
            got[rid] += o.new_token_ids
    return got


def test_colocated_step_runs_fused_rounds(smollm):
    """Step (co-located serving) takes the fast path of ``tandem generate``: after a request's first drafts its
    rounds are fused, also those of a k below the graph's (b). Greedy output is the plain one, seeded sampled
    output the eager engine's (a prefill round carries no drafts here, so it is not generate's)."""
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}])
               for t in ("Count to five.", "Name two oceans.", "Say hi.")]
    sampled = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=5)
    params, ks = [GREEDY, GREEDY, sampled], {"a": None, "b": 2, "c": None}
    ref = [o.new_token_ids for o in make_decoder(smollm, "none").generate(prompts[:2], GREEDY)]
    eager = _colocated(make_decoder(smollm, "layerskip:4", k=4, fused_rounds=False), prompts, params, ks)
    decoder = make_decoder(smollm, "layerskip:4", k=4, fused_rounds=True)
    got = _colocated(decoder, prompts, params, ks)
    assert [got["a"], got["b"]] == ref and got["c"] == eager["c"]
    assert decoder.fused.rounds >= 8  # a and c: 24 tokens each in rounds of up to 5


def test_colocated_step_picks_up_the_round_launched_ahead(smollm):
    """With rounds launched ahead (``pipeline_max_batch``) a Step of the same requests reads the round launched at
    the end of the Step before; output equals Step without it (greedy and seeded sampled), here with a draft LM
    (layer-skip) drafting inside the round."""
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in ("Count to five.", "Say hi.")]
    params = [GREEDY, SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=5)]
    ks = {"a": None, "c": None}
    want = _colocated(make_decoder(smollm, "layerskip:4", k=4, fused_rounds=True), prompts, params, ks)
    decoder = make_decoder(smollm, "layerskip:4", k=4, fused_rounds=True, pipeline_max_batch=8)
    assert _colocated(decoder, prompts, params, ks) == want
    assert decoder.fused.rounds_ahead > 0


def test_fast_path_exits_are_exported_by_reason(smollm):
    """Co-located Step with a drafter that cannot draft inside a graph (an n-gram drafter with no device token
    history) while fused rounds are on: every decoding round is an exit, exported as
    tandem_fast_path_exits_total{reason} (every exit reason, 0 where none), read from the engine's counts at the
    scrape."""
    from prometheus_client import CollectorRegistry, generate_latest

    from engine.config import EngineConfig
    from engine.drafters.ngram import NgramDrafter
    from engine.factory import decoder_for
    from rpc.metrics import engine_counter

    config = EngineConfig(kv_cache_tokens=8192, k=3, max_k=8, cuda_graphs=True, fused_rounds=True)
    host_only = NgramDrafter()  # no token history on the device: it drafts on the host only
    eng = VerifierEngine(decoder_for(smollm, config, host_only))
    registry = CollectorRegistry()
    engine_counter("tandem_fast_path_exits", "exits", "reason", eng.fast_path_exits, registry)
    prompt = smollm.tokenizer.encode_chat([{"role": "user", "content": "Count to five."}])
    eng.prefill([PrefillItem("a", prompt, [], GREEDY)])  # a prefill is no exit
    for _ in range(3):
        eng.step(["a"], [None])
    text = generate_latest(registry).decode()
    assert 'tandem_fast_path_exits_total{reason="drafter_without_graph"} 3.0' in text
    assert 'tandem_fast_path_exits_total{reason="context_full"} 0.0' in text
    assert 'tandem_fast_path_exits_total{reason="drafter_not_ready"} 0.0' in text


@pytest.mark.parametrize("ids, probs, drafts, message", [
    ([[1, 2]], [[0.5, 0.5]], [1, 2], "must both be"),
    ([[1, 2]], [[0.7, 0.7]], [1], "distribution"),
    ([[1, 99]], [[0.5, 0.5]], [1], "token ids"),
    ([[1, 2]], [[1.0, 0.0]], [2], "no probability"),
])
def test_draft_distribution_is_validated(ids, probs, drafts, message):
    from protos.tandem.v1 import common_pb2
    from rpc import tensors

    pb = common_pb2.DraftDistribution(ids=tensors.encode(ids, "int32"), probs=tensors.encode(probs, "float32"))
    with pytest.raises(ValueError, match=message):
        convert.draft_probs_from_pb(pb, drafts, vocab=50)


def test_drafter_service_sizes_its_kv_without_a_setting(smollm_path):
    """Regression: a model-based drafter service started with no kv_cache_tokens (seen on the GPU)."""
    from drafter_svc.main import build
    from drafter_svc.settings import DrafterSettings
    from engine.kv_cache import default_kv_tokens

    settings = DrafterSettings(model=str(smollm_path), draft="layerskip:2", device="cpu")
    eng = build(settings, settings.engine_config())
    runner = eng.drafter.runner
    want = default_kv_tokens(2, 3, 64, torch.float32, "cpu")
    assert runner.capacity_tokens == -(-want // 16) * 16 and runner.cache.k.shape[0] == 2
    [r] = eng.draft([DraftItem("a", 0, [1, 2, 3], 2, GREEDY)])
    assert len(r.tokens) == 2


def test_split_rounds_carry_target_features_to_an_eagle_drafter(smollm):
    """Verifier and drafter engines as the split services run them: the verifier returns the features of the
    positions it verified (cut to a window), the drafter drafts from them; output stays plain greedy."""
    prompt = smollm.tokenizer.encode_chat([{"role": "user", "content": "Explain how rain forms."}])
    ref = make_decoder(smollm, "none").generate([prompt], GREEDY)[0].new_token_ids
    config = EngineConfig(kv_cache_tokens=4096, k=3)
    drafter = DrafterEngine(build_drafter(DraftSpec.parse("auto"), smollm, config), smollm.config.vocab_size, 8)
    layers, window = drafter.feature_layers, 16
    assert layers and drafter.feature_size == len(layers) * smollm.config.hidden_size
    eng = VerifierEngine(make_decoder(smollm, "none", k=3))
    with pytest.raises(ValueError, match="^feature_layers:"):
        eng.verify([], feature_layers=[0, 99])
    [o] = eng.prefill([PrefillItem("r", prompt, [], GREEDY)], layers, window)
    assert o.features.shape == (window, drafter.feature_size) and o.features_start == len(prompt) - window
    tokens, sent, accepted = prompt + o.new_token_ids, 0, 0
    feats = (o.features_start, o.features)
    while "r" in eng.decoder.requests:
        [d] = drafter.draft([DraftItem("r", sent, tokens[sent:], 3, GREEDY, feats[1], feats[0])])
        sent = len(tokens)
        r = eng.decoder.requests["r"]
        [o] = eng.verify([RoundItem("r", d.tokens[: eng.decoder.draft_len(r, 3)])], layers, window)
        tokens += o.new_token_ids
        accepted += o.round_accepted
        if o.features is not None:  # the positions verified this round: the unseen token + accepted drafts
            assert o.features_start == sent - 1 and o.features.shape[0] == o.round_accepted + 1
            feats = (o.features_start, o.features)
    assert tokens[len(prompt):] == ref and accepted > 0
